"""Fixtures of the database tests: a fresh database's URL, and the database.

The suites of :data:`tests.backends.DB_SUITES` run once per backend of
:data:`tests.backends.BACKENDS` (file and moto S3); the others on a local
directory.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

import txns
from tests import backends


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "db_backend" in metafunc.fixturenames:
        metafunc.parametrize("db_backend", backends.params_for(metafunc, backends.DB_SUITES, "file"))


@pytest.fixture
def db_url(request: pytest.FixtureRequest, tmp_path: Path, db_backend: str) -> str:
    """A fresh database's URL: the local directory ``tmp_path/db`` (not created yet: connecting creates it),
    or a fresh bucket on moto."""
    return backends.store_url(request, db_backend, tmp_path / "db")


@pytest.fixture
def db(db_url: str) -> Iterator[txns.Database]:
    """A new, empty database at ``db_url`` (closed after the test)."""
    d = txns.connect(db_url)
    yield d
    d.close()
