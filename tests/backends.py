"""The storage backends the behaviour suites run on, in one place (tests/db and tests/txns conftests).

``BACKENDS`` lists them as pytest params; :func:`store_url` makes a fresh,
empty store of one. To run the suites on one more S3-compatible store, add
its param here (with its marker) and a branch in :func:`store_url` that
asks for its URL (for SeaweedFS, tests/conftest.py's ``seaweedfs_endpoint``
and ``seaweedfs_bucket`` fixtures, a fresh prefix of its session bucket).

Only the suites where storage matters run on every backend
(``S3_SUITES``, by module name); the rest stay on their default store to
keep CI short.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from tests import helpers

REMOTE_BACKENDS = [pytest.param("s3", marks=pytest.mark.s3)]
"""The S3-compatible stores (moto over HTTP). Add another S3 server here."""
BACKENDS = ["file", *REMOTE_BACKENDS]
"""Every backend the database suites run on (file is the default of the other database suites)."""

DB_SUITES = frozenset(
    {"test_reads", "test_retention", "test_background", "test_keyed", "test_errors", "test_isolation"}
)
"""tests/db modules run on every backend of ``BACKENDS``."""

TXNS_SUITES = frozenset({"test_basic", "test_concurrency"})
"""tests/txns modules run in memory and on every backend of ``REMOTE_BACKENDS`` (the others in memory only)."""

DEFAULT_ONLY = frozenset(
    {
        # they test the anomaly checker's negative controls, not storage: once is enough
        "test_the_checker_catches_lost_updates_without_validation",
        "test_the_checker_catches_stale_reads_under_a_weakened_strict_level",
    }
)
"""Test functions of those suites that stay on the default backend (CI time)."""


def params_for(metafunc: pytest.Metafunc, suites: frozenset[str], default: str) -> list[object]:
    """The backend params of a test: ``default`` plus the others for a test of one of ``suites``."""
    module = metafunc.module.__name__.rsplit(".", 1)[-1]
    if module not in suites or metafunc.function.__name__ in DEFAULT_ONLY:
        return [default]
    return [default, *(b for b in BACKENDS if b != default)] if default in BACKENDS else [default, *REMOTE_BACKENDS]


def store_url(request: pytest.FixtureRequest, kind: str, directory: Path) -> str:
    """A fresh, empty store of backend ``kind``: ``file`` in ``directory``; ``s3`` a new moto bucket."""
    if kind == "file":
        return helpers.file_url(directory)
    if kind == "s3":
        factory: Callable[..., str] = request.getfixturevalue("s3_url_factory")
        return factory()
    raise ValueError(f"unknown test backend {kind!r}; add it to tests/backends.py")
