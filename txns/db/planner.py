"""The read planner: a table's snapshot at a time as a plan of parts, read without writing anything.

A table (the catalog and history too) is read as its data shard's batches
plus the committed batches not applied to it yet, taken from the txns
shard's log (:meth:`ReadPlanner.log_plan`), so a read never waits for the
background apply, repeats its work or writes anything. Where the txns
cache cannot vouch for that, the txns read protocol applies and fills as
before. A part found missing by a read is classified here, the one
classification every read of the database uses (:meth:`ReadPlanner.missing_part`).

Invariants:

- A plan at ``ts`` holds exactly the rows of the table at ``ts`` (see
  :meth:`ReadPlanner.log_plan` for why).
- The txns handle is used only under the handle lock it is given (the one
  every user of that handle in this process takes); part reads run outside it.
- The planner owns no state of its own: everything it knows comes from the
  txns cache and the data shards' cached states.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Collection
from typing import Any, TypeVar

from persist import CorruptObject, PartRetired, PersistClient, PersistError, ReadBelowSince, SnapshotPlan, replan
from txns.db import clock
from txns.db.catalog import CatalogView, TableEntry
from txns.db.retention import retention_of_ms
from txns.db.scan import PlanReader
from txns.db.validation import writes_in
from txns.handle import TxnsHandle

T = TypeVar("T")


class ReadPlanner:
    """Plans reads of data shards at a time, from the txns shard's log and the shards' states.

    ``catalog_at(ts)``: the catalog at ``ts`` (to name a table's retention
    and find a name's shard); ``default_retention_ms()``: the database's
    default retention now.
    """

    def __init__(
        self,
        client: PersistClient,
        handle: TxnsHandle,
        handle_lock: threading.RLock,
        catalog_id: str,
        catalog_at: Callable[[int], CatalogView],
        default_retention_ms: Callable[[], int],
    ) -> None:
        self.client = client
        self.handle = handle
        self._lock = handle_lock
        self.catalog_id = catalog_id
        self._catalog_at = catalog_at
        self._default_retention_ms = default_retention_ms

    def catalog(self, ts: int) -> CatalogView:
        """The catalog at ``ts`` (already resolved)."""
        return self._catalog_at(ts)

    def may_have_written(self, name: str, lo: int, hi: int, but: Collection[int] = ()) -> bool:
        """Whether a commit in ``[lo, hi]`` (other than at the times ``but``) may have written table ``name``.

        From the txns cache's write times (no request); True where it cannot
        tell (times below its since or past its frontier, a name it does not know).
        """
        e = self._catalog_at(hi).tables.get(name)
        if e is None:
            return True
        with self._lock:
            cache = self.handle.cache
            if lo < cache.since or hi >= cache.frontier:
                return True
            return bool(writes_in(cache, e.data_id, lo, hi).difference(but))

    def plan(self, entry: TableEntry, ts: int) -> SnapshotPlan:
        """A snapshot plan of ``entry``'s data shard at ``ts`` (see :meth:`log_plan`)."""
        with self._lock:
            try:
                plan = self.log_plan(entry.data_id, ts)
                if plan is not None:
                    return plan
                return self.handle.data_snapshot(entry.data_id, ts).plan()
            except ReadBelowSince as e:
                raise self.below(entry, ts, e.since) from None

    def with_replan(self, entry: TableEntry, ts: int, read: Callable[[SnapshotPlan], T]) -> T:
        """``read(plan)``, planned again if compaction retired a part in between (:func:`persist.replan`)."""
        return replan(lambda: self.read_checked(entry.data_id, lambda: read(self.plan(entry, ts))))

    def plan_reader(self, plan: SnapshotPlan, cols: list[str], filter: Any = None) -> PlanReader:
        """A reader of ``plan``'s columns ``cols`` (rows matching ``filter``, if given)."""
        return PlanReader(self.client.blob, plan, cols, filter, self.client.config.retry_deadline_s)

    def read_checked(self, data_id: str, read: Callable[[], T]) -> T:
        """``read()`` of a plan of ``data_id``; a part found missing is classified (:meth:`missing_part`)."""
        try:
            return read()
        except PartRetired as e:
            raise self.missing_part(data_id, e.key) from None

    def missing_part(self, data_id: str, key: str) -> PersistError:
        """The error for part ``key`` of ``data_id`` found missing by a read: lost data, or retired by compaction.

        ``CorruptObject`` when what a plan made now would read still names
        the part: the data shard's state read afresh (``ShardView.missing_part``),
        or a committed batch the shard has not applied yet (a txns entry at or
        above that state's upper, which no compaction can have retired). Else
        ``PartRetired``: compaction replaced the part after the read was
        planned, and planning again (from the state just read) finds its
        successor. The one classification every read of the database uses.
        """
        verdict = self.client.shard(data_id).missing_part(key)  # (reads the head: plans use it from now on)
        if not isinstance(verdict, PartRetired):
            return verdict
        upper = self.client.shard(data_id).state().upper
        with self._lock:
            pending = [e for e in self.handle.cache.entries if e.data_id == data_id and e.batch and e.ts >= upper]
        for entry in pending:
            if any(p.key == key for r in entry.decode_batch().runs for p in r.parts):
                return CorruptObject(key, "a part of a committed batch (not applied to its table yet) is missing")
        return verdict

    def below(self, entry: TableEntry, ts: int, since: int) -> ReadBelowSince:
        """The error for a read of ``entry`` at ``ts`` below its shard's ``since``, naming its retention."""
        try:  # the retention in force now (the entry may be from the catalog of long ago)
            entry = self._catalog_at(self.handle.cache.frontier - 1).by_data_id().get(entry.data_id, entry)
        except ReadBelowSince:
            pass
        ret = entry.retention_ms if entry.retention_ms is not None else self._default_retention_ms()
        return ReadBelowSince(
            f"table {entry.name!r}: as_of {clock.describe(ts)} is before its retained history "
            f"(retention {retention_of_ms(ret)}); the earliest readable time is {clock.describe(since)}",
            since,
        )

    def log_plan(self, data_id: str, ts: int) -> SnapshotPlan | None:
        """The snapshot of ``data_id`` at ``ts`` as a plan, read without writing anything.

        The data shard's batches, plus the batches committed to it at or
        below ``ts`` and not applied yet, taken from the txns shard's entries
        (a commit entry is the very batch an apply appends). So a read never
        waits for, nor repeats, the background apply, and never fills time.
        Exact (the rows of the table at ``ts``, nothing else) because:

        - any state of the data shard, however old, holds exactly the
          commits below its upper (txns invariant 2: a data upper past a
          commit time means that commit is applied), so a state whose upper
          is past ``ts`` is the snapshot, and otherwise the state plus the
          log's entries in ``[upper, ts]`` is, provided those entries are
          *every* write in that range;
        - the txns cache knows every write time at or above its since (and
          below its frontier, past ``ts``), so that proviso is checked
          against the cache's write times when the state's upper is at or
          above the cache's since; an entry tidied meanwhile was applied,
          so the state is read afresh (after the txns cache, which
          ``latest()`` and ``resolve()`` sync) and holds it;
        - SUBTLE: the cache does not know the writes below its since (they
          are all applied: txns invariant 3), and its since moves on while
          a cached data state may not: an idle handle's lease lapses and its
          cache restarts from a snapshot at the current since, and a live
          hold moves up with every commit. A cached state whose upper is
          below the cache's since may lack writes the cache cannot name, so
          it is never completed from the log: the state is read afresh
          first. A state read after the cache's since was observed holds
          every write below that since (they were applied before the since
          passed them), so no write lies in ``[upper, since)`` and the
          cache's times from the since on are all of them.

        None (the caller uses the txns read protocol, which applies and fills)
        when the cache cannot vouch for this.
        """
        cache = self.handle.cache
        if ts >= cache.frontier or not cache.registered_at(data_id, ts):
            return None
        w = self.handle.data_writer(data_id)
        state = w.shard.state()
        fresh = False
        if state.upper <= ts and state.upper < cache.since:
            state, fresh = w.shard.fetch(), True  # (the cache cannot name the writes in [upper, since))
        while True:
            if ts < state.since:
                raise ReadBelowSince(f"as_of {ts} is below shard {data_id}'s since {state.since}", state.since)
            runs = [r for b in state.batches if b.lower <= ts for r in b.runs if r.rows]
            if state.upper > ts or ts < cache.since:  # (the latter: a fresh state, holding every write <= ts)
                return SnapshotPlan(data_id, ts, tuple(runs), w.schema)
            due = writes_in(cache, data_id, state.upper, ts)
            pending = sorted(e for e in cache.entries if e.data_id == data_id and e.batch and state.upper <= e.ts <= ts)
            if {e.ts for e in pending} == due:
                # The state plus the log's entries from its upper on: entries at or
                # above its upper are not in it, and they are every write up to ts.
                runs += [r for e in pending for r in e.decode_batch().runs if r.rows]
                return SnapshotPlan(data_id, ts, tuple(runs), w.schema)
            if fresh:
                return None
            # Some writes in [upper, ts] were tidied from the log since this
            # state was cached: they are applied. Read the shard afresh (after
            # the cache, so whatever it applied since is in it).
            state, fresh = w.shard.fetch(), True


__all__ = ["ReadPlanner"]
