"""Isolation checking for transaction histories: :mod:`tests.isolation.checker` (an Elle-style list-append checker)."""
