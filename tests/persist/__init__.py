"""Tests of persist: the storage backends and their kit (url, testing, unreliable), shards."""
