"""Tests of txns.spark (marked spark: a local SparkSession)."""
