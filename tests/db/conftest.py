"""Fixtures of the database tests: a fresh database's URL on a local directory, and the database."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

import txns
from tests import helpers


@pytest.fixture
def db_url(tmp_path: Path) -> str:
    """A fresh database's URL: the local directory ``tmp_path/db`` (not created yet: connecting creates it)."""
    return helpers.file_url(tmp_path / "db")


@pytest.fixture
def db(db_url: str) -> Iterator[txns.Database]:
    """A new, empty database at ``db_url`` (closed after the test)."""
    d = txns.connect(db_url)
    yield d
    d.close()
