"""The read cache: what a handle knows of the txns shard, kept current incrementally.

It follows the txns shard from its since: a snapshot at the since, then each
new batch once (inline batches cost no request; only the state is read).

Invariants:

- ``frontier`` is a txns upper: every txns update at a time below it has been
  processed, and none at or above it.
- ``frontier_reached`` is the highest ``frontier`` this cache has had. It
  only ever rises, so a thread may read it without the lock its handle is
  used under (a restart from a snapshot lowers ``frontier`` until it has
  read the shard again; ``frontier_reached`` never goes back).
- ``entries`` are the append entries present (added, not yet tidied) as of
  ``frontier``: the unapplied writes plus applied ones not yet retracted.
- ``writes[d]`` holds the commit time of every write to data shard ``d`` at
  or after ``since``. Every write below ``since`` is applied (the txns
  shard's since never passes an unapplied write; see ``TxnsHandle.compact_to``),
  so reads at ``as_of < since`` need no write times.
- With ``track_batches`` on, ``seen_batches`` maps the id of every batch
  added (committed) at a time in ``[tracked_from, frontier)`` to its commit
  time: nothing committed in that range is missing from it (a restart from a
  snapshot moves ``tracked_from`` up to the restart's frontier, as does
  trimming past ``TRACKED_BATCHES_MAX`` ids). Group commit
  (:mod:`txns.group_commit`) learns from it which queued transactions
  committed, without a look-up.
- A holding cache's leased reader holds the txns shard's since at or below
  ``frontier - 1``, so compaction never moves a time the cache has not read.
  A cache without a hold (``hold=False``: one-off uses such as the CLI, so
  that a killed process holds nothing) restarts from a fresh snapshot
  whenever the shard's since has reached its frontier. Either way the cache
  only ever reads batches whose times past its frontier compaction has not
  moved. A holding cache's lease lapses ``reader_lease_s`` after its last
  use (a killed process's hold with it); the cache then restarts likewise.
"""

from __future__ import annotations

import bisect
import contextlib
import enum
import logging
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc

from persist import ExternalError, LeaseExpired, PersistClient, ReadHandle, ReadTimeout, ShardState, replan
from persist.errors import aside
from persist.manifest import consolidate
from persist.shard import to_updates
from txns.entries import TXNS_SCHEMA, Entry

if TYPE_CHECKING:
    from txns.handle import DataSnapshot, TxnsHandle

log = logging.getLogger(__name__)

SMALL_BATCH_ROWS = 1024
"""A txns batch of at most this many rows is consolidated in Python when the cache reads it (cheaper than Arrow)."""
TRACKED_BATCHES_MAX = 200_000
"""``seen_batches`` keeps at most this many ids; trimming drops the oldest half."""


@dataclass
class Registration:
    """A data shard's registration: from ``register_ts`` until ``forget_ts`` (None: still)."""

    register_ts: int
    forget_ts: int | None = None

    def covers(self, ts: int) -> bool:
        return self.register_ts <= ts and (self.forget_ts is None or ts < self.forget_ts)


class ListenKind(enum.StrEnum):
    """What a listener does next (see :class:`ListenNext`)."""

    READ_DATA_TO = "read_data_to"  # read the data shard up to ``upper``: there are writes below it
    EMIT_PROGRESS = "emit_progress"  # no writes below ``upper``: emit it as progress without reading
    WAIT = "wait"  # wait for the txns shard to pass ``upper``


@dataclass(frozen=True)
class ListenNext:
    """What a listener of a data shard at ``ts`` should do next (see ``data_listen_next``)."""

    kind: ListenKind
    upper: int


class TxnsCache:
    """The txns shard as of ``frontier``. Obtain it with ``TxnsHandle.read_cache()``."""

    def __init__(
        self,
        client: PersistClient,
        txns_id: str,
        handle: TxnsHandle | None = None,
        hold: bool = True,
        reader: ReadHandle | None = None,
    ) -> None:
        self.client = client
        self.txns_id = txns_id
        self._handle = handle
        self.hold = hold
        self.reader: ReadHandle | None = None
        #: whether to record the batch ids of commits (``seen_batches``; see the module doc)
        self.track_batches = False
        self.seen_batches: dict[str, int] = {}
        self.tracked_from = 0
        self.frontier_reached = 0
        self._start(reader)

    def _start(self, reader: ReadHandle | None = None) -> None:
        """(Re)start from a snapshot at a new leased reader's since (``reader``: one just opened)."""
        if not self.hold:
            self._start_unheld()
            return
        client, txns_id = self.client, self.txns_id
        if reader is None:
            reader = client.open_leased_reader(txns_id, TXNS_SCHEMA)
        state = reader.shard.state()
        # SUBTLE: read the snapshot before resetting anything. A restart (our
        # lease lapsed) that failed after resetting would leave this cache
        # empty at its old frontier with a live reader, so it would never
        # restart: it would carry on as if no write were pending, and
        # compact_to would pass unapplied writes (lost writes). A failure
        # keeps the old, lapsed reader, so the next use restarts.
        try:
            snapshot = None
            if state.upper > reader.since:
                # (a shard whose batches hold no rows, as a new one: its snapshot is empty, without a read)
                snapshot = reader.snapshot_and_fetch(reader.since) if any(b.rows for b in state.batches) else []
        except BaseException:
            with contextlib.suppress(Exception):
                reader.expire()
            raise
        self.reader = reader
        self.shard = reader.shard
        self._reset(reader.since, state, snapshot)

    def _start_unheld(self) -> None:
        """Start from a snapshot at the shard's since, holding nothing."""
        self.shard = shard = self.client.shard(self.txns_id)

        def read() -> tuple[ShardState, list[Any] | None]:
            state = shard.fetch()
            if state.upper <= state.since:
                return state, None
            return state, shard.fetch_plan(shard.plan(TXNS_SCHEMA, state.since, state))

        state, snapshot = replan(read)
        self._reset(state.since, state, snapshot)

    def _reset(self, since: int, state: ShardState, snapshot: list[Any] | None) -> None:
        self.registrations: dict[str, list[Registration]] = defaultdict(list)
        self.entries: dict[Entry, int] = {}
        self.writes: dict[str, list[int]] = defaultdict(list)
        self.since = since
        self._held = self.since
        if snapshot is not None:
            for (key, val), _ts, diff in snapshot:
                self._process(Entry.from_kv(key, val), self.since, diff)
            # SUBTLE: the snapshot names only the writes still present at the since;
            # those below it that were tidied are not in it. A write time below the
            # since could then look like the latest one at some time (a hole before
            # it): keep only times at or above the since, which are all known.
            for w in self.writes.values():
                del w[: bisect.bisect_left(w, since)]
            self.frontier = self.since + 1
        else:
            self._moved(state.upper)
        # (commits before the snapshot's frontier may have been tidied away: not tracked)
        self.seen_batches = {}
        self.tracked_from = self.frontier
        self._absorb(self.shard.state())

    # ---- following the txns shard ----------------------------------------------

    def _process(self, e: Entry, at: int, diff: int) -> None:
        if e.is_registration:
            regs = self.registrations[e.data_id]
            if diff > 0:
                regs.append(Registration(e.ts))
            else:
                for r in regs:
                    if r.register_ts == e.ts and r.forget_ts is None:
                        r.forget_ts = at
                        break
            return
        n = self.entries.get(e, 0) + diff
        if n == 0:
            self.entries.pop(e, None)
        else:
            self.entries[e] = n
        if diff > 0:
            if self.track_batches and at >= self.tracked_from:
                self._track(e.decode_batch().id, e.ts)
            w = self.writes[e.data_id]
            if not w or w[-1] < e.ts:
                w.append(e.ts)
            elif e.ts not in w:
                bisect.insort(w, e.ts)

    def _track(self, batch_id: str, ts: int) -> None:
        self.seen_batches[batch_id] = ts
        if len(self.seen_batches) > TRACKED_BATCHES_MAX:
            keep = sorted(self.seen_batches.items(), key=lambda kv: kv[1])[TRACKED_BATCHES_MAX // 2 :]
            self.seen_batches = dict(keep)
            self.tracked_from = keep[0][1] + 1 if keep else self.frontier

    def start_tracking(self) -> None:
        """Turn ``track_batches`` on: from the current frontier, every committed batch id is recorded."""
        if not self.track_batches:
            self.track_batches = True
            self.seen_batches = {}
            self.tracked_from = self.frontier

    def committed_at(self, batch_ids: set[str], since_ts: int) -> int | None:
        """The commit time of any of ``batch_ids``, if committed in ``[since_ts, frontier)``.

        None when none of them was; raises LookupError when tracking does not
        cover ``since_ts`` (the caller then looks the transaction up).
        """
        if not self.track_batches or since_ts < self.tracked_from:
            raise LookupError(f"batches committed since {since_ts} are not tracked (from {self.tracked_from})")
        for b in batch_ids:
            ts = self.seen_batches.get(b)
            if ts is not None:
                return ts
        return None

    def _absorb(self, state: ShardState) -> None:
        """Process every batch of ``state`` past the frontier."""
        if self.reader is not None and self.reader.reader_id not in state.leased and state.seqno is not None:
            # SUBTLE: our lease lapsed, so compaction may have moved times we
            # have not read. Start over from a fresh snapshot.
            self._start()
            return
        if self.reader is None and state.since > self.since and state.since >= self.frontier:
            # Without a hold, compaction may pass our frontier: start over likewise.
            self._start()
            return
        def read(current: ShardState) -> ShardState:
            # (a retry reads on from the frontier: each batch is processed whole or not at all)
            self._read_batches(current)
            return current

        state = self.shard.replan_from(state, read)
        self._trim(state.since)

    def absorb_appended(self, updates: list[Any], lower: int, upper: int) -> None:
        """Catch up with ``updates``, which this process just appended over ``[lower, upper)``.

        The same as :meth:`sync_cached` (which reads the appended batch back
        and decodes it), without the decoding: when the frontier was
        ``lower`` and the state this process holds ends at ``upper``, the
        batch past the frontier holds exactly ``updates`` (a state that moved
        on since, or anything unusual, is absorbed as usual).
        """
        state = self.shard.state()
        if (
            self.frontier != lower
            or state.upper != upper
            or state.since >= upper
            or (self.reader is not None and self.reader.reader_id not in state.leased)
            or (self.reader is None and state.since > self.since)
        ):
            self._absorb(state)
            return
        self._process_updates(updates)
        self._moved(upper)
        self._trim(state.since)

    def _read_batches(self, state: ShardState) -> None:
        for batch in state.batches:
            if batch.upper <= self.frontier:
                continue
            tables = list(self.shard.read_batch(batch, TXNS_SCHEMA.arrow))
            if 0 < sum(t.num_rows for t in tables) <= SMALL_BATCH_ROWS:
                # A commit's batch (a few entries): consolidated in Python, without Arrow's
                # per-call cost, which every process following the shard pays for every commit.
                frontier = self.frontier
                self._process_updates(
                    u for t in tables for u in to_updates(TXNS_SCHEMA, t) if u[1] >= frontier
                )
            elif tables:
                t = pa.concat_tables(tables)
                t = t.filter(pc.greater_equal(t.column("ts"), pa.scalar(self.frontier, pa.uint64())))
                t = consolidate(t)
                if t.num_rows:
                    t = t.sort_by([("ts", "ascending")])
                    for (key, val), at, diff in to_updates(TXNS_SCHEMA, t):
                        self._process(Entry.from_kv(key, val), at, diff)
            self._moved(batch.upper)

    def _moved(self, frontier: int) -> None:
        """Every update below ``frontier`` is processed: the frontier (and ``frontier_reached``) moves there."""
        self.frontier = frontier
        if frontier > self.frontier_reached:
            self.frontier_reached = frontier

    def _process_updates(self, updates: Iterable[Any]) -> None:
        """Process ``((key, val), ts, diff)`` txns updates consolidated: diffs of equal ones summed, zeros
        dropped, in the order the Arrow path of :meth:`_read_batches` processes them (by time, then key and val)."""
        sums: dict[tuple[Any, ...], int] = {}
        for (key, val), at, diff in updates:
            k = (at, key, val)
            sums[k] = sums.get(k, 0) + diff
        for (at, key, val), diff in sorted(sums.items()):
            if diff:
                self._process(Entry.from_kv(key, val), at, diff)

    def _trim(self, shard_since: int) -> None:
        """Forget write times below the txns shard's since; move our hold up."""
        if shard_since > self.since:
            self.since = shard_since
            for w in self.writes.values():
                i = bisect.bisect_left(w, shard_since)
                if i:
                    del w[:i]
        # Move the hold (and renew the lease) lazily: it costs a write to the txns shard.
        # Best effort: catching up must not fail for it (a lapsed lease restarts the cache).
        if self.reader is not None and self.reader.heartbeat_due():
            try:
                # (housekeeping: a commit attempt that catches up here has not written by it)
                with aside():
                    self.advance_hold()
            except (ExternalError, LeaseExpired) as e:
                log.debug("renewing the txns cache's hold deferred: %s", e)

    def advance_hold(self) -> None:
        """Move this cache's hold up to ``frontier - 1`` (everything below it has been read)."""
        if self.reader is not None and self.frontier - 1 > self._held:
            self._held = self.frontier - 1
            self.reader.downgrade_since(self._held)
        elif self.reader is not None:
            self.reader.heartbeat(force=True)

    def hold_renewal(self) -> tuple[Callable[[ShardState], None], int] | None:
        """This cache's hold moved up to ``frontier - 1`` and its lease renewed, as a change for the
        caller's own write to the txns shard (a commit): the hold then keeps up with every commit at
        no extra write, so compaction can consolidate the txns shard's history as soon as it is
        applied. None without a hold. Call :meth:`hold_renewed` with the hold once the write landed.
        """
        if self.reader is None:
            return None
        hold = max(self._held, self.frontier - 1)
        return self.reader.renewal(hold), hold

    def hold_renewed(self, hold: int) -> None:
        if self.reader is not None:
            self._held = max(self._held, hold)
            self.reader.renewed(hold)

    def release(self) -> None:
        """Drop this cache's hold on the txns shard (if it has one)."""
        if self.reader is not None:
            self.reader.expire()

    def sync_cached(self) -> None:
        """Catch up with the state this process already holds (no storage request)."""
        self._absorb(self.shard.state())

    def sync(self) -> None:
        """Catch up with the txns shard as it is in storage now."""
        self._absorb(self.shard.fetch())

    def update_gt(self, ts: int, wait_s: float | None = None) -> None:
        """Catch up until the frontier is past ``ts``, waiting up to ``wait_s``; else ReadTimeout."""
        self._update(lambda: self.frontier > ts, ts + 1, wait_s)

    def update_ge(self, ts: int, wait_s: float | None = None) -> None:
        """Catch up until the frontier is at least ``ts``, waiting up to ``wait_s``; else ReadTimeout."""
        self._update(lambda: self.frontier >= ts, ts, wait_s)

    def _update(self, done: Callable[[], bool], want: int, wait_s: float | None) -> None:
        self.sync_cached()
        if done():
            return
        wait = self.client.config.read_wait_s if wait_s is None else wait_s
        # after absorbing a state the frontier is its upper
        state = self.shard.wait_for(lambda s: s.upper >= want, wait)
        self._absorb(state if state is not None else self.shard.state())
        if not done():
            raise ReadTimeout(
                f"txns shard {self.txns_id}: upper is {self.frontier}, not {want} after waiting {wait}s; "
                f"read below the txns upper, or commit (or advance) to a later time first",
                self.frontier,
            )

    # ---- questions ---------------------------------------------------------------

    def registered_at(self, data_id: str, ts: int) -> bool:
        return any(r.covers(ts) for r in self.registrations.get(data_id, ()))

    def registered_now(self) -> dict[str, Registration]:
        """Every data shard registered at the frontier, with its open registration."""
        out = {}
        for d, regs in self.registrations.items():
            for r in regs:
                if r.forget_ts is None:
                    out[d] = r
        return out

    def latest_write_le(self, data_id: str, ts: int) -> int | None:
        """The latest known write to ``data_id`` at or before ``ts`` (None: none at or after the since)."""
        w = self.writes.get(data_id, [])
        i = bisect.bisect_right(w, ts)
        return w[i - 1] if i else None

    def next_write_ge(self, data_id: str, ts: int) -> int | None:
        w = self.writes.get(data_id, [])
        i = bisect.bisect_left(w, ts)
        return w[i] if i < len(w) else None

    def entries_le(self, ts: int) -> list[Entry]:
        """Present append entries at or before ``ts``, in (ts, data_id) order."""
        return sorted(e for e in self.entries if e.ts <= ts)

    def present(self, e: Entry) -> bool:
        return self.entries.get(e, 0) > 0

    def data_listen_next(self, data_id: str, ts: int) -> ListenNext:
        """What a listener of ``data_id`` that has emitted everything below ``ts`` should do next."""
        if ts >= self.frontier:
            return ListenNext(ListenKind.WAIT, self.frontier)
        if ts < self.since:
            return ListenNext(ListenKind.READ_DATA_TO, self.since)
        w = self.next_write_ge(data_id, ts)
        if w is not None and w < self.frontier:
            return ListenNext(ListenKind.READ_DATA_TO, w + 1)
        return ListenNext(ListenKind.EMIT_PROGRESS, self.frontier)

    def data_snapshot(self, data_id: str, as_of: int) -> DataSnapshot:
        """A snapshot of ``data_id`` at ``as_of``, made readable (see ``TxnsHandle.snapshot``)."""
        if self._handle is None:
            raise RuntimeError("this cache has no handle to apply with; use TxnsHandle.read_cache()")
        return self._handle.data_snapshot(data_id, as_of)
