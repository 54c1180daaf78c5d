"""Reading a shard: leased readers (snapshots, listens) and critical since handles.

A reader holds back the shard's since with its own: compaction never
advances times past the since, so any ``as_of`` at or past the reader's since
reads exactly what was written (consolidated). A leased reader's hold lapses
if it does not heartbeat within its lease (every read heartbeats when a
quarter of the lease has passed); a critical reader's hold never lapses and
changes only by compare-and-downgrade on its opaque token (fencing).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc

from persist.config import PersistConfig
from persist.errors import CorruptObject, InvalidUsage, LeaseExpired, ReadBelowSince, ReadTimeout
from persist.location import Blob
from persist._internal.machine import Machine
from persist._internal.parts import MissingPart, Run, consolidate, read_run
from persist.schema import Schema, check_ts
from persist._internal.state import CriticalReaderState, HollowBatch, LeasedReaderState, ShardState


class PartRetired(InvalidUsage):
    """A read planned against an old state found a part that compaction retired since. Read again."""


@dataclass(frozen=True)
class Updates:
    """A listen event: updates ``((key, val), ts, diff)`` in time order."""

    updates: list


@dataclass(frozen=True)
class Progress:
    """A listen event: every update with a time below ``upper`` has been emitted."""

    upper: int


@dataclass(frozen=True)
class SnapshotPlan:
    """What a snapshot at ``as_of`` must read: runs (parts and inline rows).

    Any process that can open the location can read a run's parts with
    :func:`persist._internal.parts.read_run`; keep rows with ``ts <= as_of`` and set
    their time to ``as_of``; the consolidated sum is the snapshot.
    """

    shard_id: str
    as_of: int
    runs: tuple[Run, ...]
    schema: Schema


def wait_for_upper(machine: Machine, as_of: int, wait_s: float) -> ShardState:
    """A state whose upper is past ``as_of``, or ReadTimeout after ``wait_s``."""
    state = machine.wait_for(lambda s: s.upper > as_of, wait_s)
    if state is None:
        upper = machine.state().upper
        raise ReadTimeout(
            f"shard {machine.shard_id}: upper is {upper}, not past as_of {as_of} after "
            f"waiting {wait_s}s; read at an as_of below the upper or wait for writers",
            upper,
        )
    return state


def batch_tables(
    blob: Blob, batch: HollowBatch, schema: pa.Schema, retry_deadline_s: float = 30.0
) -> Iterator[pa.Table]:
    for run in batch.runs:
        yield from read_run(blob, run, schema, retry_deadline_s)


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
        self.blob, self.machine, self.schema, self.config = blob, machine, schema, config
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
        return self.machine.fetch().upper

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
            r = s.leased[self.reader_id]
            s.leased[self.reader_id] = LeasedReaderState(r.since, self.config.clock_ms(), lease_ms)
            return None, True

        self.machine.apply(transition)
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
            r = s.leased[self.reader_id]
            new = max(r.since, since)
            s.leased[self.reader_id] = LeasedReaderState(new, self.config.clock_ms(), lease_ms)
            return None, True

        self.machine.apply(transition)
        self._since = max(self._since, since)
        self._heartbeat_ms = self.config.clock_ms()

    def expire(self) -> None:
        """Release this reader's hold now. The handle cannot be used after."""

        def transition(s: ShardState) -> tuple[None, bool]:
            return None, s.leased.pop(self.reader_id, None) is not None

        self.machine.apply(transition)
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
        state = wait_for_upper(self.machine, as_of, self.config.read_wait_s)
        self._check_live(state)
        return state

    def snapshot_plan(self, as_of: int) -> SnapshotPlan:
        """The runs a snapshot at ``as_of`` reads (for distributed readers such as Spark)."""
        return plan_at(self._ready_state(as_of), self.schema, as_of)

    def snapshot_tables(self, as_of: int) -> Iterator[pa.Table]:
        """The snapshot at ``as_of`` as Arrow tables, NOT consolidated, one part at a time.

        Memory stays bounded by the largest part. Every row has ``ts == as_of``.
        """
        plan = self.snapshot_plan(as_of)
        for run in plan.runs:
            for table in self._read_run_checked(run):
                yield at_as_of(table, as_of)

    def _read_run_checked(self, run: Run) -> Iterator[pa.Table]:
        try:
            yield from read_run(self.blob, run, self.schema.arrow, self.config.retry_deadline_s)
        except MissingPart as e:
            if e.key in self.machine.fetch().part_keys():
                raise CorruptObject(e.key, "a part the shard references is missing from blob storage") from None
            raise PartRetired(
                f"part {e.key} of shard {self.shard_id} was retired by compaction more than "
                f"part_grace_s={self.config.part_grace_s}s after this read was planned; run the read again"
            ) from None

    def snapshot_and_fetch(self, as_of: int) -> list:
        """The shard's contents at ``as_of``: consolidated ``((key, val), as_of, diff)``, sorted.

        Waits up to ``read_wait_s`` for the upper to pass ``as_of`` (then
        ReadTimeout); refuses ``as_of`` below the since (ReadBelowSince).
        """
        for attempt in range(3):
            try:
                tables = list(self.snapshot_tables(as_of))
                break
            except PartRetired:
                if attempt == 2:
                    raise
        table = pa.concat_tables(tables) if tables else self.schema.arrow.empty_table()
        return to_updates(self.schema, consolidate(table))

    def listen(self, as_of: int) -> Listen:
        """Updates with times past ``as_of``, in time order, with progress. See :class:`Listen`."""
        self._ready_state(as_of)
        return Listen(self, as_of)


def plan_at(state: ShardState, schema: Schema, as_of: int) -> SnapshotPlan:
    """The plan of a snapshot at ``as_of`` from ``state`` (whose upper must be past it).

    Raises ReadBelowSince if ``as_of`` is below the shard's since.
    """
    if as_of < state.since:
        raise ReadBelowSince(
            f"as_of {as_of} is below shard {state.shard_id}'s since {state.since}; compaction has "
            f"merged those times. Read at an as_of >= {state.since}",
            state.since,
        )
    if state.upper <= as_of:
        raise InvalidUsage(f"shard {state.shard_id}: as_of {as_of} is not below the upper {state.upper}")
    runs = tuple(r for b in state.batches if b.lower <= as_of for r in b.runs if r.rows)
    return SnapshotPlan(state.shard_id, as_of, runs, schema)


def fetch_plan(blob: Blob, plan: SnapshotPlan, retry_deadline_s: float = 30.0) -> list:
    """Read a plan's parts and return the consolidated snapshot as update tuples."""
    tables = [at_as_of(t, plan.as_of) for run in plan.runs for t in read_run(blob, run, plan.schema.arrow, retry_deadline_s)]
    table = pa.concat_tables(tables) if tables else plan.schema.arrow.empty_table()
    return to_updates(plan.schema, consolidate(table))


def at_as_of(table: pa.Table, as_of: int) -> pa.Table:
    """Rows of ``table`` with ``ts <= as_of``, their time set to ``as_of``."""
    table = table.filter(pc.less_equal(table.column("ts"), pa.scalar(as_of, pa.uint64())))
    idx = table.column_names.index("ts")
    return table.set_column(idx, "ts", pa.array([as_of] * table.num_rows, pa.uint64()))


def to_updates(schema: Schema, table: pa.Table) -> list:
    """Rows of ``table`` as ``((key, val), ts, diff)`` tuples."""
    cols = {n: table.column(n).to_pylist() for n in table.column_names}
    keys = list(zip(*(cols[n] for n in schema.key_names), strict=True)) if schema.key_names else [()] * table.num_rows
    vals = list(zip(*(cols[n] for n in schema.val_names), strict=True)) if schema.val_names else [()] * table.num_rows
    return [((k, v), t, d) for k, v, t, d in zip(keys, vals, cols["ts"], cols["diff"], strict=True)]


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

    def next(self, timeout_s: float = 0.0) -> list:
        r = self.reader
        r.heartbeat()
        try:
            state = wait_for_upper(r.machine, self.frontier, max(0.0, timeout_s))
        except ReadTimeout:
            return []
        r._check_live(state)
        for attempt in range(3):
            try:
                events, self.frontier = self._events(state)
                return events
            except MissingPart as e:
                # SUBTLE: the state may be a stale cache whose parts compaction has
                # since retired and deleted. Re-read it; a part a fresh state still
                # references is really missing.
                state = r.machine.fetch()
                r._check_live(state)
                if e.key in state.part_keys():
                    raise CorruptObject(e.key, "a part the shard references is missing from blob storage") from None
                if attempt == 2:
                    raise InvalidUsage(
                        f"parts of shard {r.shard_id} kept being retired by compaction while this listen "
                        f"read them; call next() again"
                    ) from None
        raise AssertionError("unreachable")

    def _events(self, state: ShardState) -> tuple[list, int]:
        """The events of ``state`` past the frontier, and the new frontier (not yet set)."""
        r = self.reader
        frontier = self.frontier
        events: list = []
        for batch in state.batches:
            if batch.upper <= frontier:
                continue
            tables = [t for t in batch_tables(r.blob, batch, r.schema.arrow, r.config.retry_deadline_s)]
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

    def __iter__(self) -> Iterator:
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
        self.machine = machine
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
            cur = s.critical.get(self.reader_id)
            if cur is None:
                raise InvalidUsage(f"critical reader {self.reader_id} is not registered on shard {self.shard_id}")
            if cur.opaque != expected_opaque:
                return DowngradeResult(False, cur.since, cur.opaque), False
            since = max(cur.since, new_since)
            if since == cur.since and new_opaque == cur.opaque:
                return DowngradeResult(True, since, new_opaque), False
            s.critical[self.reader_id] = CriticalReaderState(since, new_opaque)
            return DowngradeResult(True, since, new_opaque), True

        # SUBTLE: a mismatch seen on a cached state may be stale; confirm on a fresh one.
        result = self.machine.apply(transition)
        if not result.ok:
            self.machine.fetch()
            result = self.machine.apply(transition)
        self.since, self.opaque = result.since, result.opaque
        return result
