"""A transaction's cache of the committed rows its point reads found, by key: read-your-reads for keyed tables.

A keyed read (``get``, ``upsert``'s and ``delete``'s checks...) of a key the
transaction did not write looks the key up here first; what one filtered
read finds is added. Every entry is as committed at the transaction's read
time, which never changes once taken, so an entry never goes stale.

Invariants: at most :data:`KEY_CACHE_KEYS` keys are cached (when an
addition would pass it, the cache starts over empty: bounded memory, a
later read of an evicted key reads again); a key found absent is cached as
an empty list (it is absent at the read time).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from txns.db.keyed import Key

KEY_CACHE_KEYS = 100_000
"""Committed rows found by a transaction's point reads, cached for its later ones: at most this many keys."""

Rows = list[dict[str, Any]]


class KeyCache:
    """data shard id -> key -> the committed rows of that key at the transaction's read time."""

    def __init__(self) -> None:
        self._rows: dict[str, dict[Key, Rows]] = {}
        self._size = 0

    def lookup(self, data_id: str, keys: Sequence[Key]) -> tuple[dict[Key, Rows], list[Key]]:
        """The cached rows of ``keys`` of ``data_id``, and the keys not cached (in order)."""
        cache = self._rows.get(data_id, {})
        found = {k: cache[k] for k in keys if k in cache}
        return found, [k for k in keys if k not in found]

    def add(self, data_id: str, found: dict[Key, Rows]) -> None:
        """Cache ``found`` (rows read at the read time; every key asked, absent ones as ``[]``)."""
        if self._size + len(found) > KEY_CACHE_KEYS:
            self._rows, self._size = {}, 0  # (bounded: start over)
        if len(found) <= KEY_CACHE_KEYS:
            self._rows.setdefault(data_id, {}).update(found)
            self._size += len(found)


__all__ = ["KEY_CACHE_KEYS", "KeyCache"]
