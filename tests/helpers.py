"""Small helpers shared by the tests (fixtures are in the conftest.py files).

Import as ``from tests.helpers import ...``: the tests are the ``tests``
package, imported from the repository root (see tests/__init__.py).
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from persist import PersistClient, PersistConfig
from persist.unreliable import Faults, UnreliableBlob, UnreliableConsensus
from persist.url import Location, open_location

REPO = Path(__file__).resolve().parents[1]
"""The repository root (subprocesses run there: ``python -m tests.chaos.bank``, ``python -m txns``)."""
README = REPO / "README.md"


def mem_url(prefix: str = "test") -> str:
    """A ``mem://`` URL no other test uses: a fresh, empty in-process store."""
    return f"mem://{prefix}-{uuid.uuid4().hex}"


def file_url(path: Path) -> str:
    """The ``file://`` URL of the absolute directory ``path``."""
    return f"file://{path}"


def faulty_client(url: str, faults: Faults, config: PersistConfig | None = None) -> PersistClient:
    """A client on ``url`` whose storage calls go through the fault-injecting wrappers of ``faults``
    (with no fault rates set they only count: ``faults.counters``)."""
    loc = open_location(url)
    return PersistClient(
        Location(url, UnreliableBlob(loc.blob, faults), UnreliableConsensus(loc.consensus, faults)), config
    )


class RecordingLock:
    """A committer's lock as one collaborator sees it: the same lock (``inner``), recording which threads took
    it, with ``before()`` called before each acquire."""

    def __init__(self, inner: Any, before: Callable[[], None] = lambda: None) -> None:
        self.inner = inner
        self.before = before
        self.takers: list[str] = []

    def __enter__(self) -> RecordingLock:
        self.before()
        self.inner.acquire()
        self.takers.append(threading.current_thread().name)
        return self

    def __exit__(self, *exc: object) -> None:
        self.inner.release()
