"""Fixtures of the txns tests (helpers are in tests/txns/model.py)."""

from __future__ import annotations

import pytest

from tests.txns.model import Store


@pytest.fixture
def store() -> Store:
    """A fresh in-process store whose clients count their storage calls (see :class:`tests.txns.model.Store`)."""
    return Store()
