"""Reading a shard: leased readers (snapshots, listens) and critical since handles.

A reader holds back the shard's since with its own: compaction never
advances times past the since, so any ``as_of`` at or past the reader's since
reads exactly what was written (consolidated). A leased reader's hold lapses
if it does not heartbeat within its lease (every read heartbeats when a
quarter of the lease has passed); a critical reader's hold never lapses and
changes only by compare-and-downgrade on its opaque token (fencing).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from persist._internal.machine import Machine
from persist._internal.parts import consolidate
from persist._internal.state import ShardState
from persist.config import PersistConfig
from persist.errors import LeaseExpired, ReadBelowSince, ReadTimeout
from persist.location import Blob
from persist.manifest import SnapshotPlan, replan
from persist.schema import Schema, check_ts
from persist.shard import ShardView, plan_at, to_updates


@dataclass(frozen=True)
class Updates:
    """A listen event: updates ``((key, val), ts, diff)`` in time order."""

    updates: list[Any]


@dataclass(frozen=True)
class Progress:
    """A listen event: every update with a time below ``upper`` has been emitted."""

    upper: int


class ReadHandle:
    """Reads one shard and holds back its since. Open with ``PersistClient.open_leased_reader``.

    >>> import pyarrow as pa
    >>> from persist import PersistClient, Schema, ShardId
    >>> client = PersistClient.open("mem://doc-read")
    >>> schema = Schema(key=pa.schema([("k", pa.string())]), val=pa.schema([]))
    >>> sid = ShardId.new()
    >>> w = client.open_writer(sid, schema)
    >>> w.compare_and_append([((("a",), ()), 0, 1), ((("b",), ()), 1, 1)], 0, 2)
    >>> r = client.open_leased_reader(sid, schema)
    >>> r.snapshot_and_fetch(0)
    [((('a',), ()), 0, 1)]
    >>> r.snapshot_and_fetch(1)
    [((('a',), ()), 1, 1), ((('b',), ()), 1, 1)]
    """

    def __init__(
        self, blob: Blob, machine: Machine, schema: Schema, config: PersistConfig, reader_id: str, since: int
    ) -> None:
        self.blob, self.schema, self.config = blob, schema, config
        self._machine = machine
        self.shard = ShardView(blob, machine, config)
        self.shard_id = machine.shard_id
        self.reader_id = reader_id
        self._since = since
        self._heartbeat_ms = config.clock_ms()
        self._expired = False

    @property
    def since(self) -> int:
        """This reader's hold: reads at any ``as_of >= since`` are valid."""
        return self._since

    def fetch_recent_upper(self) -> int:
        """The shard's upper, read from storage now."""
        return self.shard.fetch().upper

    # ---- holds -----------------------------------------------------------------

    def _check_live(self, state: ShardState) -> None:
        if self._expired or self.reader_id not in state.leased:
            self._expired = True
            raise LeaseExpired(
                f"reader {self.reader_id} of shard {self.shard_id} has expired (lease "
                f"{self.config.reader_lease_s}s without heartbeat, or expire() called); open a new reader"
            )

    def heartbeat_due(self) -> bool:
        """Whether a quarter of the lease has passed since the last renewal (the lazy heartbeat rule)."""
        return self.config.clock_ms() - self._heartbeat_ms >= self.config.reader_lease_s * 250

    def heartbeat(self, force: bool = False) -> None:
        """Renew the lease (done by every read once a quarter of it has passed)."""
        now = self.config.clock_ms()
        if not force and not self.heartbeat_due():
            return
        lease_ms = int(self.config.reader_lease_s * 1000)

        def transition(s: ShardState) -> tuple[None, bool]:
            self._check_live(s)
            s.renew_leased_reader(self.reader_id, self.config.clock_ms(), lease_ms)
            return None, True

        self._machine.apply(transition)
        self._heartbeat_ms = now

    def downgrade_since(self, since: int) -> None:
        """Advance this reader's hold to ``since``, letting compaction advance times up to it.

        (The name follows persist's convention: the since frontier is
        "downgraded" as a capability while the time moves forward.)
        """
        check_ts(since, "since")
        lease_ms = int(self.config.reader_lease_s * 1000)

        def transition(s: ShardState) -> tuple[None, bool]:
            self._check_live(s)
            s.renew_leased_reader(self.reader_id, self.config.clock_ms(), lease_ms, since)
            return None, True

        self._machine.apply(transition)
        self._since = max(self._since, since)
        self._heartbeat_ms = self.config.clock_ms()

    def renewal(self, since: int) -> Callable[[ShardState], None]:
        """This reader's lease renewal and hold advance to ``since``, as a change to make inside
        another write to the same shard (``WriteHandle.compare_and_append(also=)``): a hold that
        moves with every commit, at no extra write. Call :meth:`renewed` once that write landed.

        A reader whose lease has lapsed is left out (its next own write raises ``LeaseExpired``).
        """
        check_ts(since, "since")
        lease_ms = int(self.config.reader_lease_s * 1000)

        def change(s: ShardState) -> None:
            if not self._expired and self.reader_id in s.leased:
                s.renew_leased_reader(self.reader_id, self.config.clock_ms(), lease_ms, since)

        return change

    def renewed(self, since: int) -> None:
        """Record that a write carrying :meth:`renewal` ``(since)`` landed."""
        if self.reader_id in self._machine.state().leased:
            self._since = max(self._since, since)
            self._heartbeat_ms = self.config.clock_ms()

    def expire(self) -> None:
        """Release this reader's hold now. The handle cannot be used after."""

        def transition(s: ShardState) -> tuple[None, bool]:
            return None, s.expire_leased_reader(self.reader_id)

        self._machine.apply(transition)
        self._expired = True

    # ---- snapshots -------------------------------------------------------------

    def _ready_state(self, as_of: int) -> ShardState:
        check_ts(as_of, "as_of")
        if as_of < self._since:
            raise ReadBelowSince(
                f"as_of {as_of} is below reader {self.reader_id}'s since {self._since} on shard "
                f"{self.shard_id}; compaction may have merged those times. Read at an as_of >= {self._since}",
                self._since,
            )
        self.heartbeat()
        state = self.shard.wait_for_upper(as_of, self.config.read_wait_s)
        self._check_live(state)
        return state

    def snapshot_plan(self, as_of: int) -> SnapshotPlan:
        """The runs a snapshot at ``as_of`` reads (for distributed readers such as Spark)."""
        return plan_at(self._ready_state(as_of), self.schema, as_of)

    def snapshot_tables(self, as_of: int) -> Iterator[pa.Table]:
        """The snapshot at ``as_of`` as Arrow tables, NOT consolidated, one part at a time.

        Memory stays bounded by the largest part. Every row has ``ts == as_of``.
        ``PartRetired`` if compaction retired a planned part meanwhile (read again).
        """
        return self.shard.read_plan(self.snapshot_plan(as_of))

    def snapshot_and_fetch(self, as_of: int) -> list[Any]:
        """The shard's contents at ``as_of``: consolidated ``((key, val), as_of, diff)``, sorted.

        Waits up to ``read_wait_s`` for the upper to pass ``as_of`` (then
        ReadTimeout); refuses ``as_of`` below the since (ReadBelowSince).
        """
        return replan(lambda: self.shard.fetch_plan(self.snapshot_plan(as_of)))

    def listen(self, as_of: int) -> Listen:
        """Updates with times past ``as_of``, in time order, with progress. See :class:`Listen`."""
        self._ready_state(as_of)
        return Listen(self, as_of)


class Listen:
    """Follows a shard from ``as_of``: updates at times past it, then progress.

    ``next(timeout_s)`` returns the events available now (waiting up to
    ``timeout_s`` for the upper to advance): zero or more ``Updates`` and a
    ``Progress(upper)`` after each batch, in time order. Iterating yields
    events forever. ``frontier`` is the upper of what was emitted so far.
    The reader must keep its since below ``frontier`` (do not downgrade it
    past ``frontier - 1``), or compaction may move times the listen has not
    emitted yet.
    """

    def __init__(self, reader: ReadHandle, as_of: int) -> None:
        self.reader = reader
        self.frontier = as_of + 1

    def next(self, timeout_s: float = 0.0) -> list[Updates | Progress]:
        r = self.reader
        r.heartbeat()
        try:
            state = r.shard.wait_for_upper(self.frontier, max(0.0, timeout_s))
        except ReadTimeout:
            return []

        def events(s: ShardState) -> list[Updates | Progress]:
            r._check_live(s)
            out, self.frontier = self._events(s)
            return out

        return r.shard.replan_from(state, events)

    def _events(self, state: ShardState) -> tuple[list[Updates | Progress], int]:
        """The events of ``state`` past the frontier, and the new frontier (not yet set)."""
        r = self.reader
        frontier = self.frontier
        events: list[Updates | Progress] = []
        for batch in state.batches:
            if batch.upper <= frontier:
                continue
            tables = list(r.shard.read_batch(batch, r.schema.arrow))
            if tables:
                t = pa.concat_tables(tables)
                lo = pa.scalar(frontier, pa.uint64())
                t = t.filter(pc.greater_equal(t.column("ts"), lo))
                t = consolidate(t)
                if t.num_rows:
                    t = t.sort_by([("ts", "ascending")])
                    events.append(Updates(to_updates(r.schema, t)))
            frontier = batch.upper
            events.append(Progress(batch.upper))
        return events, frontier

    def __iter__(self) -> Iterator[Updates | Progress]:
        while True:
            yield from self.next(timeout_s=self.reader.config.read_wait_s)


@dataclass(frozen=True)
class DowngradeResult:
    """Outcome of ``compare_and_downgrade_since``: ``ok``, and the since and opaque now held."""

    ok: bool
    since: int
    opaque: int


class SinceHandle:
    """A critical reader: a hold on the since that never expires, fenced by an opaque token.

    >>> from persist import PersistClient, ShardId
    >>> client = PersistClient.open("mem://doc-since")
    >>> h = client.open_critical_since(ShardId.new(), "controller", opaque=0)
    >>> h.compare_and_downgrade_since(0, 1, 5)
    DowngradeResult(ok=True, since=5, opaque=1)
    >>> h.compare_and_downgrade_since(0, 2, 9).ok
    False
    """

    def __init__(self, machine: Machine, reader_id: str, since: int, opaque: int) -> None:
        self._machine = machine
        self.shard_id = machine.shard_id
        self.reader_id = reader_id
        self.since = since
        self.opaque = opaque

    def compare_and_downgrade_since(self, expected_opaque: int, new_opaque: int, new_since: int) -> DowngradeResult:
        """If the held opaque is ``expected_opaque``: set it to ``new_opaque`` and advance the since.

        The since never goes backwards (a ``new_since`` below it keeps it).
        On a mismatch nothing changes and the result carries the actual opaque.
        """
        check_ts(new_since, "new_since")

        def transition(s: ShardState) -> tuple[DowngradeResult, bool]:
            ok, cur, changed = s.downgrade_critical_reader(self.reader_id, expected_opaque, new_opaque, new_since)
            return DowngradeResult(ok, cur.since, cur.opaque), changed

        # SUBTLE: a mismatch seen on a cached state may be stale; confirm on a fresh one.
        result = self._machine.apply(transition)
        if not result.ok:
            self._machine.fetch()
            result = self._machine.apply(transition)
        self.since, self.opaque = result.since, result.opaque
        return result
