"""Validating a read-then-write transaction: did anything it read change since its read timestamp?

A transaction that read (``get``, ``read``, the checks of ``update``,
``upsert``, ``delete``, keyed ``insert`` and ``retract``) commits at a time
with no commit between its reads and its writes: at ``read_ts + 1`` in
logical terms, i.e. only while the txns upper is still ``read_ts + 1``
(``commit_at(expect_upper=read_ts + 1)``, at the hybrid time
``max(read_ts + 1, now)``). When another commit took that time, the
transaction may still commit *as if it had read at the new upper - 1*, if
nothing it read changed in between; :func:`conflict` decides that:

- per table it scanned: any commit that wrote the table in between;
- per key it read: a commit in between whose updates touch that key (the
  txns cache says which commits wrote the table; only those are read, with
  parts whose key bounds exclude the keys skipped, the key pushed into
  the Parquet reads);
- per table it read by name: the catalog entry of that name must be the
  same table (same data shard) at both times (a drop, rename or re-create
  in between changes what the name means).

Exact, never optimistic: what the txns cache cannot vouch for (times below
its since) counts as changed.

Invariants: a ``None`` answer means every read of the transaction returns the
same rows at ``hi`` as at ``lo - 1``; so the writes it computed are the ones
it would compute reading at ``hi``, and committing them right after ``hi``
is serializable.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

import pyarrow as pa

from txns.db.catalog import TableEntry
from txns.db.scan import read_changes

if TYPE_CHECKING:
    from persist import PersistClient, SnapshotPlan
    from txns.db.catalog import CatalogView
    from txns.handle import TxnsHandle

T = TypeVar("T")


class ConflictReads(Protocol):
    """What validation reads (:class:`txns.db.planner.ReadPlanner` has it): the txns cache, the catalog, plans."""

    @property
    def handle(self) -> TxnsHandle: ...

    @property
    def client(self) -> PersistClient: ...

    @property
    def catalog_id(self) -> str: ...

    def catalog(self, ts: int) -> CatalogView: ...

    def with_replan(self, entry: TableEntry, ts: int, read: Callable[[SnapshotPlan], T]) -> T: ...


ReadSet = Mapping[str, "set[tuple[Any, ...]] | None"]
"""What a transaction read: data shard id -> the primary keys read, or None (the whole table)."""


def conflict(db: ConflictReads, reads: ReadSet, names: Mapping[str, TableEntry], lo: int, hi: int) -> str | None:
    """Why the reads ``reads`` (of the tables ``names``, by name) may differ at ``hi`` from ``lo - 1``; None if not.

    ``lo..hi`` is the range of commit times in between (inclusive). The
    caller holds the database's lock (the txns cache is read).
    """
    if hi < lo:
        return None
    cache = db.handle.cache
    if lo < cache.since:
        return f"the commits since the read time are compacted away (read at {lo - 1}, txns since {cache.since})"
    by_id = {e.data_id: e for e in names.values()}
    catalog_writes = writes_in(cache, db.catalog_id, lo, hi)
    if catalog_writes and names:
        now = db.catalog(hi).tables
        for name, e in names.items():
            cur = now.get(name)
            if cur is None or cur.data_id != e.data_id:
                return f"table {name!r} was dropped, renamed or re-created by another transaction meanwhile"
    for data_id, keys in reads.items():
        times = writes_in(cache, data_id, lo, hi)
        if not times:
            continue
        entry = by_id.get(data_id)
        if keys is None or entry is None or entry.primary_key is None:
            name = entry.name if entry is not None else data_id
            return f"table {name!r}, which this transaction read, was written by another transaction meanwhile"
        if keys and _keys_written(db, entry, keys, lo, hi):
            return (
                f"a row of table {entry.name!r} that this transaction read was written by another transaction meanwhile"
            )
    return None


def writes_in(cache: Any, data_id: str, lo: int, hi: int) -> set[int]:
    """The commit times of the writes to ``data_id`` in ``[lo, hi]`` the txns cache knows (at or above its since)."""
    times = cache.writes.get(data_id, [])
    return set(times[bisect.bisect_left(times, lo) : bisect.bisect_right(times, hi)])


def _keys_written(db: ConflictReads, e: TableEntry, keys: set[tuple[Any, ...]], lo: int, hi: int) -> bool:
    """Whether a commit in ``[lo, hi]`` updated one of the primary ``keys`` of ``e``."""
    from txns.db.keyed import key_filter, prune_plan

    pk = list(e.primary_key or ())
    cfg = db.client.config

    def read(plan: SnapshotPlan) -> pa.Table:
        # every column: an update of a key retracts and adds rows that cancel in a key-only projection
        cols = list(e.schema.names)
        pruned = prune_plan(e, plan, keys)  # parts that cannot hold the keys: not read
        return read_changes(db.client.blob, pruned, lo, cols, cfg.retry_deadline_s, key_filter(e, keys))

    changes: pa.Table = db.with_replan(e, hi, read)
    if changes.num_rows == 0:
        return False
    cols = [changes.column(n).to_pylist() for n in pk]
    return any(tuple(k) in keys for k in zip(*cols, strict=True))


__all__ = ["ConflictReads", "ReadSet", "conflict", "writes_in"]
