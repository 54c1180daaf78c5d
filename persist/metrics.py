"""Process-wide counters of persist's maintenance: what garbage collection, truncation and lease expiry did.

Operators and tests ask "did GC actually run?": these counters say how many
retired parts this process deleted, consensus versions it truncated, and
leases its writes found lapsed and dropped. Read them with :func:`snapshot`
(a copy); a harness running many processes has each report its own and
sums them.

Invariants kept here:

- A counter only counts what happened: a part once its delete returned, the
  versions a ``truncate`` reported deleting, a lapsed lease once the version
  that dropped it was committed (a compare-and-set that lost its race counts
  nothing).
- Counters only grow (except :func:`reset`, for tests) and are safe to bump
  from any thread.

>>> from persist import metrics
>>> metrics.count(metrics.PARTS_DELETED, 0)
>>> sorted(metrics.snapshot())[:2]
['leaked_parts_deleted', 'parts_deleted']
"""

from __future__ import annotations

import threading

PARTS_DELETED = "parts_deleted"
"""Retired parts (replaced by compaction) deleted after their grace period."""
LEAKED_PARTS_DELETED = "leaked_parts_deleted"
"""Unreferenced parts deleted by ``PersistClient.gc_leaked``."""
VERSIONS_TRUNCATED = "versions_truncated"
"""Consensus versions deleted by truncation."""
READER_LEASES_LAPSED = "reader_leases_lapsed"
"""Leased readers dropped because their lease lapsed without a heartbeat."""
WRITER_LEASES_LAPSED = "writer_leases_lapsed"
"""Writer registrations dropped because their lease lapsed."""

NAMES = (PARTS_DELETED, LEAKED_PARTS_DELETED, VERSIONS_TRUNCATED, READER_LEASES_LAPSED, WRITER_LEASES_LAPSED)

_lock = threading.Lock()
_counts: dict[str, int] = dict.fromkeys(NAMES, 0)


def count(name: str, n: int = 1) -> None:
    """Add ``n`` to counter ``name`` (one of :data:`NAMES`)."""
    if name not in _counts:
        raise ValueError(f"unknown persist metric {name!r}; known: {', '.join(NAMES)}")
    if n:
        with _lock:
            _counts[name] += n


def snapshot() -> dict[str, int]:
    """A copy of every counter."""
    with _lock:
        return dict(_counts)


def reset() -> None:
    """Set every counter to 0 (for tests)."""
    with _lock:
        for k in _counts:
            _counts[k] = 0


__all__ = [
    "LEAKED_PARTS_DELETED",
    "NAMES",
    "PARTS_DELETED",
    "READER_LEASES_LAPSED",
    "VERSIONS_TRUNCATED",
    "WRITER_LEASES_LAPSED",
    "count",
    "reset",
    "snapshot",
]
