"""Retention: hold each data shard's since at ``now - retention`` so compaction can forget older history.

A persist shard's since is the minimum of its readers' holds; with no hold it
never moves, and compaction, which consolidates times only up to the since,
can then never cancel an update against its later retraction: a table
updated N times keeps N versions of its rows forever. The database registers
one critical since handle per data shard (reader id ``RETENTION_READER``)
and moves it to ``min(now - retention, latest readable time)``.

Invariants:

- The hold never passes the time the shard is physically readable at (the
  caller makes the shard readable at the latest time first), so a since
  never covers a time whose writes are not applied yet.
- Holds only move forward (persist's ``compare_and_downgrade_since``); a
  shorter retention takes effect at once, a longer one only for history
  written after the change.
- Reads below the since raise ``ReadBelowSince`` (the table layer names the
  earliest readable time).
- A retention is between 0 and ``MAX_RETENTION`` (checked when set), and a
  stored one always reads back as a ``timedelta`` (``retention_of_ms``).

``WriteHandle.compact_all`` (persist) merges every batch of a shard into one (when they fit
``compaction_max_bytes``), consolidated at the since: after many updates of
the same rows the stored row count falls back to the live rows plus the
changes still within retention. Bigger shards use the size-tiered policy
(and ``txns compact --spark``).
"""

from __future__ import annotations

import datetime as dt
import logging

from persist import InvalidUsage, PersistClient, SinceHandle

log = logging.getLogger(__name__)

RETENTION_READER = "txns-db-retention"


MAX_RETENTION = dt.timedelta(days=100 * 365)
"""The longest history retention a database or table accepts (100 years)."""
MAX_RETENTION_MS = MAX_RETENTION // dt.timedelta(milliseconds=1)


def check_retention(retention: object, what: str = "retention") -> int:
    """``retention`` (a ``timedelta`` from 0 to ``MAX_RETENTION``) as whole milliseconds, or InvalidUsage."""
    if isinstance(retention, dt.timedelta):
        if retention < dt.timedelta(0):
            raise InvalidUsage(f"{what} must not be negative, got {retention}")
        if retention > MAX_RETENTION:
            raise InvalidUsage(
                f"{what} must be at most {MAX_RETENTION.days} days (100 years), got {retention}; "
                f"pass timedelta(days={MAX_RETENTION.days}) to keep history that long"
            )
        return retention // dt.timedelta(milliseconds=1)
    raise InvalidUsage(f"{what} must be a datetime.timedelta (e.g. timedelta(days=7)), got {retention!r}")


def retention_of_ms(ms: int) -> dt.timedelta:
    """A stored retention (milliseconds) as a ``timedelta``; always readable (values past the bound read as it)."""
    return dt.timedelta(milliseconds=min(max(int(ms), 0), MAX_RETENTION_MS))


class RetentionHolds:
    """The database's critical since handles, one per data shard, opened on first use."""

    def __init__(self, client: PersistClient) -> None:
        self.client = client
        self._handles: dict[str, SinceHandle] = {}

    def hold(self, data_id: str, since: int) -> int:
        """Advance ``data_id``'s retention hold to ``since`` (never back); return the hold now."""
        h = self._handles.get(data_id)
        if h is None:
            h = self.client.open_critical_since(data_id, RETENTION_READER, 0)
            self._handles[data_id] = h
        if since <= h.since:
            return h.since
        res = h.compare_and_downgrade_since(h.opaque, h.opaque, since)
        if not res.ok:  # another process moved it (opaques never change here): take theirs and retry once
            res = h.compare_and_downgrade_since(res.opaque, res.opaque, since)
        return res.since


__all__ = ["MAX_RETENTION", "RETENTION_READER", "RetentionHolds", "check_retention", "retention_of_ms"]
