"""Tests of the database layer (txns.db)."""
