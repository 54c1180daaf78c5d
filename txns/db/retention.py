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
import threading
from collections.abc import Callable, Sequence
from typing import Any, Protocol, TypeVar

from persist import InvalidUsage, PersistClient, SinceHandle, SnapshotPlan
from txns.db import clock
from txns.db.catalog import CATALOG_SCHEMA, CatalogView, TableEntry
from txns.db.errors import TableNotFound
from txns.db.root import RootRecord
from txns.db.scan import read_changes
from txns.db.skew import StorageClock
from txns.errors import TimestampUnavailable
from txns.handle import TxnsHandle

T = TypeVar("T")

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


APPLY_WAIT_S = 5.0
"""How long ``compact()`` waits for the background worker's apply and maintenance before its own."""
RETENTION_EVERY_MS = 60_000
"""How often (at most) a database moves a written table's retention hold along."""
AUTO_COMPACT_BYTES = 8 << 20
"""Tables up to this size are compacted whole when their hold moves (bigger ones by ``compact()``)."""
DROPPED_REPORT = "(dropped tables)"
"""The key of ``compact()``'s report on dropped tables retired ({"tombstoned": n, "forgotten": n})."""


class CatalogViews(Protocol):
    """What retention reads of the catalog (:class:`txns.db.catalog.Catalog`)."""

    @property
    def min_table_retention_ms(self) -> int | None: ...

    def at(self, ts: int) -> CatalogView: ...

    def forget_views(self) -> None: ...


class PlannedReads(Protocol):
    """What retention needs of the read planner (:class:`txns.db.planner.ReadPlanner`)."""

    def with_replan(self, entry: TableEntry, ts: int, read: Callable[[SnapshotPlan], T]) -> T: ...


class Maintenance:
    """One database object's retention holds, compaction and retirement of dropped tables.

    Owns the holds (``_holds``) and when each was last moved (``_held_at``),
    both under ``_hold_lock`` (the background worker and ``compact`` both
    move holds). Uses the database's txns handle only under the handle lock
    its caller holds; the worker passes its own handle.
    """

    def __init__(
        self,
        client: PersistClient,
        handle: TxnsHandle,
        handle_lock: threading.RLock,
        storage_clock: StorageClock,
        root: Callable[[], RootRecord],
        catalog: CatalogViews,
        reads: PlannedReads,
        url: str,
    ) -> None:
        self.client = client
        self.handle = handle
        self._lock = handle_lock
        self._storage_clock = storage_clock
        self._root = root
        self._catalog = catalog
        self._reads = reads
        self._url = url  # (redacted)
        self._holds = RetentionHolds(client)
        self._held_at: dict[str, int] = {}
        self._hold_lock = threading.Lock()

    def _retention_ms(self, entry: TableEntry) -> int:
        return entry.retention_ms if entry.retention_ms is not None else self._root().retention_ms

    def _hold(self, handle: TxnsHandle, data_id: str, retention_ms: int, latest: int) -> int:
        """Move ``data_id``'s retention hold to ``min(now - retention, latest)`` (readable there first).

        ``handle`` is the caller's own: the database's, or the background worker's (:meth:`after_apply`).
        """
        self._storage_clock.check("move a retention since")
        # (never past the storage's now - retention, whatever this client's clock says)
        target = min(clock.ts_of_ms(max(0, self._storage_clock.now_ms() - retention_ms)), latest)
        handle.unblock_read(data_id, latest)
        with self._hold_lock:
            held = self._holds.hold(data_id, target)
            self._held_at[data_id] = self.client.config.clock_ms()
        return held

    def _has_expired_history(
        self, handle: TxnsHandle, data_id: str, now_ms: int, created_ms: int | None = None
    ) -> bool:
        """Whether the shard (as cached: no request) stores updates older than any retention could keep.

        Judged against the shortest retention in use, so a table with nothing
        older than that costs no hold at all, nor do new tables: a table
        created (``created_ms``) within that retention has no older update,
        and an update's time is at least its batch's lower bound and its
        run's time rewrite (a committed batch is rewritten to its commit time).
        """
        shortest = self._root().retention_ms
        low = self._catalog.min_table_retention_ms
        if low is not None:
            shortest = min(shortest, low)
        if created_ms is not None and created_ms > now_ms - shortest:
            return False
        target = clock.ts_of_ms(max(0, now_ms - shortest))
        state = handle.data_writer(data_id).shard.state()
        if target <= state.since:
            with self._hold_lock:
                self._held_at[data_id] = now_ms
            return False
        for b in state.batches:
            for r in b.runs:
                if r.rows and max(b.lower, r.ts_rewrite if r.ts_rewrite is not None else 0) < target:
                    return True
        return False

    def after_apply(self, handle: TxnsHandle, ts: int, written: dict[str, int | None]) -> None:
        """On the background worker, after applying up to ``ts``: move the holds of the tables written.

        ``written``: data shard -> its table's creation time (wall-clock ms;
        None when unknown: a shard the applier lease's holder applied for another process).

        Each table at most once a minute, and only when it stores updates
        older than the shortest retention in use. Never takes the database's
        lock (see :mod:`txns.db.applier`).
        """
        now = self.client.config.clock_ms()
        with self._hold_lock:
            due = [d for d in sorted(written) if now - self._held_at.get(d, 0) >= RETENTION_EVERY_MS]
        due = [d for d in due if self._has_expired_history(handle, d, now, written[d])]
        if not due:
            return
        # the retentions in force at ts, read with the worker's handle
        by_id = CatalogView.from_updates(ts, handle.snapshot(self._root().catalog_id, ts)).by_data_id()
        for d in due:
            e = by_id.get(d)
            if e is None:
                continue
            before = handle.data_writer(d).shard.state().since
            if self._hold(handle, d, self._retention_ms(e), ts) > before:
                self._compact_small(handle, d)

    def _compact_small(self, handle: TxnsHandle, data_id: str) -> None:
        """After a hold moved: merge a small shard's batches at the new since (a big one waits for compact())."""
        w = handle.data_writer(data_id)
        state = w.shard.state()
        if len(state.batches) >= 2 and sum(b.size for b in state.batches) <= AUTO_COMPACT_BYTES:
            w.compact_all()

    def compact(
        self, latest: int, tables: Sequence[str] | None = None, merge: Callable[[str], dict[str, Any]] | None = None
    ) -> dict[str, dict[str, Any]]:
        """Apply retention to every table (and the catalog), then compact each one. Returns a report per table.

        Also retires dropped tables whose drop is older than the retained
        history (see :meth:`release_dropped`), reported under ``DROPPED_REPORT``.
        ``tables``: only these (by name; TableNotFound for an unknown one),
        and neither the catalog nor dropped tables. ``merge``: merges one
        data shard (by id) in place of the in-process ``compact_all`` and
        returns the same report (``txns.spark.compact_tables`` passes a
        Spark job). ``latest``: the latest time, read fresh by the caller.
        Under the handle lock.
        """
        report: dict[str, dict[str, Any]] = {}
        root = self._root()
        view = self._catalog.at(latest)
        longest = max([root.retention_ms, *(self._retention_ms(e) for e in view.tables.values())])
        if tables is not None:
            unknown = [n for n in tables if n not in view.tables]
            if unknown:
                raise TableNotFound(
                    f"no table(s) {unknown} in the database at {self._url!r}; tables: {sorted(view.tables)}"
                )
        chosen = sorted(view.tables.items()) if tables is None else [(n, view.tables[n]) for n in tables]
        targets = [(name, e.data_id, self._retention_ms(e)) for name, e in chosen]
        if tables is None and root.catalog_id in self.handle.cache.registered_now():
            targets.append(("(catalog)", root.catalog_id, longest))
        for name, d, ret in targets:
            since = self._hold(self.handle, d, ret, latest)
            r = self.handle.data_writer(d).compact_all() if merge is None else merge(d)
            r["hold"] = since
            report[name] = r
        self._catalog.forget_views()
        if tables is None:
            report[DROPPED_REPORT] = self.release_dropped()
        return report

    def release_dropped(self) -> dict[str, int]:
        """Retire the data shards no readable catalog names any more: dropped tables past their history.

        A data shard registered in the txns shard (user tables only) that no
        catalog row at or above the catalog's since mentions cannot be read
        by name at any time still readable: its table was dropped before the
        retained history (or it was never named: a crashed creator). Such a
        shard is tombstoned (its parts become garbage); once its garbage is
        deleted (after the part grace period, by a later ``compact``), it is
        forgotten by the txns shard, which then stops carrying it. Returns
        how many shards were tombstoned and forgotten by this call.
        """
        cache = self.handle.cache
        cache.sync()
        latest = cache.frontier - 1
        system = {self._root().catalog_id, self.handle.commits_id}
        candidates = sorted(set(cache.registered_now()) - system)
        out = {"tombstoned": 0, "forgotten": 0}
        if not candidates or latest < 0:
            return out
        named = self._catalog_data_ids(latest)
        gone = [d for d in candidates if d not in named]
        if not gone:
            return out
        self.handle.apply_le(latest, only=set(gone))  # (nothing is pending for a dropped table, normally)
        released = []
        for d in gone:
            if self.client.tombstone(d):
                out["tombstoned"] += 1
            w = self.handle.data_writer(d)
            w.shard.fetch()
            w.collect_garbage()
            if not w.shard.state().garbage:
                released.append(d)
        if released:
            self._forget(released)
            out["forgotten"] = len(released)
        return out

    def _catalog_data_ids(self, ts: int) -> set[str]:
        """Every data shard a catalog row at or above the catalog's since names (as of ``ts``)."""
        entry = TableEntry("(catalog)", self._root().catalog_id, CATALOG_SCHEMA.arrow, 0)

        def read(plan: Any) -> set[str]:
            t = read_changes(self.client.blob, plan, 0, ["data_id"], self.client.config.retry_deadline_s)
            return set(t.column("data_id").to_pylist())

        return self._reads.with_replan(entry, ts, read)

    def _forget(self, data_ids: list[str]) -> None:
        """Have the txns shard stop carrying ``data_ids`` (retired shards), at a time past the upper."""
        with self._lock:
            ts = max(self.handle.cache.frontier, clock.ts_of_ms(self.client.config.clock_ms()))
            while True:
                try:
                    self.handle.forget(ts, data_ids)
                    return
                except TimestampUnavailable as e:
                    ts = max(e.upper, clock.ts_of_ms(self.client.config.clock_ms()))


__all__ = [
    "APPLY_WAIT_S",
    "AUTO_COMPACT_BYTES",
    "DROPPED_REPORT",
    "MAX_RETENTION",
    "RETENTION_EVERY_MS",
    "RETENTION_READER",
    "Maintenance",
    "RetentionHolds",
    "check_retention",
    "retention_of_ms",
]
