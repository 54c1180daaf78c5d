"""Tests of the txns command (txns.cli and the database commands)."""
