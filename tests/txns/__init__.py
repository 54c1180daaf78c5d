"""Tests of the txns core: handles, transactions, apply and tidy, exactly-once commits."""
