"""Fixtures of the txns tests (helpers are in tests/txns/model.py).

``store``: a fresh store. In memory, except in the suites of
:data:`tests.backends.TXNS_SUITES`, which run once per backend of
:data:`tests.backends.REMOTE_BACKENDS` (moto S3) too.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests import backends
from tests.txns.model import Store


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "txns_backend" in metafunc.fixturenames:
        params = backends.params_for(metafunc, backends.TXNS_SUITES, "mem")
        metafunc.parametrize("txns_backend", params)


@pytest.fixture
def store(request: pytest.FixtureRequest, tmp_path: Path, txns_backend: str) -> Iterator[Store]:
    """A fresh store whose clients count their storage calls (see :class:`tests.txns.model.Store`)."""
    s = Store() if txns_backend == "mem" else Store(url=backends.store_url(request, txns_backend, tmp_path / "store"))
    yield s
    s.close()
