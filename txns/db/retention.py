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

:func:`compact_all` merges every batch of a shard into one (when they fit
``compaction_max_bytes``), consolidated at the since: after many updates of
the same rows the stored row count falls back to the live rows plus the
changes still within retention. Bigger shards use the size-tiered policy
(and ``txns compact --spark``).
"""

from __future__ import annotations

import logging

from persist import PersistClient, SinceHandle
from persist._internal.merge import apply_merged, merge_batches
from persist.write import WriteHandle

log = logging.getLogger(__name__)

RETENTION_READER = "txns-db-retention"


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


def compact_all(writer: WriteHandle) -> dict:
    """Merge every batch of the writer's shard into one, consolidated at its since. Returns before/after counts."""
    state = writer.machine.fetch()
    before = {"batches": len(state.batches), "rows": sum(b.rows for b in state.batches), "parts": len(state.part_keys())}
    size = sum(b.size for b in state.batches)
    merged_all = False
    if len(state.batches) >= 2 or (state.batches and state.batches[0].since < state.since and state.batches[0].rows):
        if size <= writer.config.compaction_max_bytes:
            merged = merge_batches(
                writer.blob,
                writer.shard_id,
                writer.schema.arrow,
                list(state.batches),
                state.since,
                writer.config,
                writer.compaction_inline_max_bytes,
            )
            merged_all = apply_merged(writer.blob, writer.machine, list(state.batches), merged, writer.config)
        else:
            writer.compact(max_rounds=16)
    writer.collect_garbage()
    state = writer.machine.fetch()
    after = {"batches": len(state.batches), "rows": sum(b.rows for b in state.batches), "parts": len(state.part_keys())}
    return {"before": before, "after": after, "since": state.since, "merged_all": merged_all}


__all__ = ["RETENTION_READER", "RetentionHolds", "compact_all"]
