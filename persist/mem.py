"""In-process backends for tests: ``mem://NAME``.

Every client that opens the same NAME in one process shares the same
storage, so tests can open several clients on one "store". Each operation
holds one lock, so compare-and-set is atomic and linearizable.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator

from persist.errors import InvalidUsage
from persist.location import Blob, CaSResult, Consensus, VersionedData, next_seqno


class MemBlob(Blob):
    """A dict behind a lock."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._data: dict[str, bytes] = {}

    def get(self, key: str) -> bytes | None:
        with self._lock:
            return self._data.get(key)

    def set(self, key: str, value: bytes) -> None:
        with self._lock:
            self._data[key] = bytes(value)

    def delete(self, key: str) -> None:
        with self._lock:
            self._data.pop(key, None)

    def list_keys(self, prefix: str) -> Iterator[str]:
        with self._lock:
            keys = [k for k in self._data if k.startswith(prefix)]
        return iter(keys)


class MemConsensus(Consensus):
    """A dict of version lists behind a lock."""

    lists_keys = True

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._data: dict[str, list[VersionedData]] = {}

    def head(self, key: str, hint: int | None = None) -> VersionedData | None:
        with self._lock:
            versions = self._data.get(key)
            return versions[-1] if versions else None

    def compare_and_set(self, key: str, expected: int | None, data: bytes) -> CaSResult:
        with self._lock:
            versions = self._data.setdefault(key, [])
            current = versions[-1].seqno if versions else None
            if current != expected:
                return CaSResult.MISMATCH
            versions.append(VersionedData(next_seqno(expected), bytes(data)))
            return CaSResult.COMMITTED

    def scan(self, key: str, from_seqno: int, limit: int) -> list[VersionedData]:
        with self._lock:
            versions = self._data.get(key, [])
            if limit <= 0 or not versions:
                return []
            # seqnos are consecutive from the first kept one
            start = max(0, from_seqno - versions[0].seqno)
            return versions[start : start + limit]

    def truncate(self, key: str, seqno: int) -> int:
        with self._lock:
            versions = self._data.get(key, [])
            if not versions or seqno > versions[-1].seqno:
                raise InvalidUsage(
                    f"cannot truncate {key!r} to seqno {seqno}: it would delete the "
                    f"latest version; truncate to at most the head seqno"
                )
            kept = [v for v in versions if v.seqno >= seqno]
            deleted = len(versions) - len(kept)
            self._data[key] = kept
            return deleted

    def list_keys(self) -> Iterator[str]:
        with self._lock:
            return iter([k for k, v in self._data.items() if v])


_STORES: dict[str, tuple[MemBlob, MemConsensus]] = {}
_STORES_LOCK = threading.Lock()


def open_mem(name: str) -> tuple[MemBlob, MemConsensus]:
    """The shared in-process store called ``name``, created on first use."""
    with _STORES_LOCK:
        if name not in _STORES:
            _STORES[name] = (MemBlob(), MemConsensus())
        return _STORES[name]
