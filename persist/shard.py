"""ShardView: one shard's metadata as this process follows it, read-only (public).

Layers above persist (txns, its database, Spark, the CLI) follow shards:
they read the since and upper, wait for the upper to pass a time, plan
snapshots and read the batches past a frontier. A ``ShardView`` gives them
exactly that and nothing more: it never changes the shard. Every change
goes through a handle (:class:`persist.WriteHandle`, :class:`persist.ReadHandle`,
:class:`persist.SinceHandle`), whose transitions are named methods of the
state (``persist._internal.state``).

Invariants kept here:

- ``state()`` costs no request; ``fetch()`` reads the head now. Both return
  immutable versions (a :class:`ShardState`) that only ever move forward in
  seqno for one view.
- A missing part is reported as ``CorruptObject`` only when a state read
  *after* the part went missing still references it; otherwise it is
  ``PartRetired`` (compaction replaced it: plan again). :meth:`missing_part`
  is the one place that decides.

>>> import pyarrow as pa
>>> from persist import PersistClient, Schema, ShardId
>>> client = PersistClient.open("mem://doc-shard")
>>> schema = Schema(key=pa.schema([("k", pa.string())]), val=pa.schema([]))
>>> sid = ShardId.new()
>>> client.open_writer(sid, schema).compare_and_append([((("a",), ()), 0, 1)], 0, 3)
>>> view = client.shard(sid)
>>> (view.fetch().since, view.state().upper)
(0, 3)
>>> view.fetch_plan(view.plan(schema, as_of=2))
[((('a',), ()), 2, 1)]
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import pyarrow as pa

from persist._internal.machine import Machine
from persist._internal.parts import consolidate
from persist._internal.state import HollowBatch, ShardState
from persist.config import PersistConfig
from persist.errors import CorruptObject, InvalidUsage, PartRetired, PersistError, ReadBelowSince, ReadTimeout
from persist.location import Blob
from persist.manifest import SnapshotPlan, read_plan, read_run, replan
from persist.schema import Schema

T = TypeVar("T")


class ShardView:
    """Read-only access to one shard's metadata. Get one with ``client.shard(id)`` or ``handle.shard``."""

    def __init__(self, blob: Blob, machine: Machine, config: PersistConfig) -> None:
        self._blob, self._machine, self._config = blob, machine, config
        self.shard_id = machine.shard_id

    # ---- the state -------------------------------------------------------------

    def state(self) -> ShardState:
        """The latest state this process has seen (read from storage only if it has seen none)."""
        return self._machine.state()

    def fetch(self) -> ShardState:
        """The state at the head of the shard's log, read now."""
        return self._machine.fetch()

    def wait_for(self, pred: Callable[[ShardState], bool], wait_s: float) -> ShardState | None:
        """A state satisfying ``pred`` (the cached one if it does), re-reading for up to ``wait_s``; else None."""
        return self._machine.wait_for(pred, wait_s)

    def wait_for_upper(self, as_of: int, wait_s: float) -> ShardState:
        """A state whose upper is past ``as_of``, or ``ReadTimeout`` after ``wait_s``."""
        state = self.wait_for(lambda s: s.upper > as_of, wait_s)
        if state is None:
            upper = self.state().upper
            raise ReadTimeout(
                f"shard {self.shard_id}: upper is {upper}, not past as_of {as_of} after "
                f"waiting {wait_s}s; read at an as_of below the upper or wait for writers",
                upper,
            )
        return state

    def truncate_old_versions(self) -> int:
        """Delete log versions older than the retention (``consensus_retention_s``). Returns how many."""
        return self._machine.truncate_old_versions()

    # ---- reads -----------------------------------------------------------------

    def plan(self, schema: Schema, as_of: int, state: ShardState | None = None) -> SnapshotPlan:
        """The runs a snapshot at ``as_of`` reads, from ``state`` (default: the cached one, fetched if behind).

        ``ReadBelowSince`` if ``as_of`` is below the since; ``ReadTimeout`` if
        the upper is not past ``as_of`` even on a fresh state.
        """
        if state is None:
            state = self.state()
            if state.upper <= as_of:
                state = self.fetch()
        if state.upper <= as_of:
            raise ReadTimeout(f"shard {self.shard_id}: upper {state.upper} is not past as_of {as_of}", state.upper)
        return plan_at(state, schema, as_of)

    def missing_part(self, key: str) -> PersistError:
        """The error for part ``key`` found missing.

        ``CorruptObject`` if a fresh state references it, else ``PartRetired``.
        """
        if key in self.fetch().part_keys():
            return CorruptObject(key, "a part the shard references is missing from blob storage")
        return PartRetired(
            f"part {key} of shard {self.shard_id} was retired by compaction more than "
            f"part_grace_s={self._config.part_grace_s}s after this read was planned; plan the read again",
            key,
        )

    def checked(self, tables: Iterator[pa.Table]) -> Iterator[pa.Table]:
        """``tables`` (a read of this shard's parts), a missing part classified by :meth:`missing_part`."""
        try:
            yield from tables
        except PartRetired as e:
            raise self.missing_part(e.key) from None

    def read_plan(self, plan: SnapshotPlan) -> Iterator[pa.Table]:
        """The plan's rows at its ``as_of`` (not consolidated), one part at a time; missing parts classified."""
        return self.checked(read_plan(self._blob, plan, self._config.retry_deadline_s))

    def read_batch(self, batch: HollowBatch, schema: pa.Schema) -> Iterator[pa.Table]:
        """The rows of one batch of the state (times as stored, rewritten), one part at a time."""
        for run in batch.runs:
            yield from self.checked(read_run(self._blob, run, schema, self._config.retry_deadline_s))

    def fetch_plan(self, plan: SnapshotPlan) -> list[Any]:
        """The plan's snapshot, consolidated, as ``((key, val), as_of, diff)`` tuples."""
        tables = list(self.read_plan(plan))
        table = pa.concat_tables(tables) if tables else plan.schema.arrow.empty_table()
        return to_updates(plan.schema, consolidate(table))

    def replan_from(self, state: ShardState, read: Callable[[ShardState], T]) -> T:
        """``read(state)``; each time it raises ``PartRetired``, ``read`` again on the latest state (:func:`replan`).

        SUBTLE: ``state`` may be a stale cached version naming parts that
        compaction retired and GC deleted since. The failed attempt's
        :meth:`missing_part` read the head (raising ``CorruptObject`` if that
        still named the part), so :meth:`state` is then a version that names
        the merged parts instead.
        """
        pending = [state]
        return replan(lambda: read(pending.pop() if pending else self.state()))


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


def to_updates(schema: Schema, table: pa.Table) -> list[Any]:
    """Rows of ``table`` as ``((key, val), ts, diff)`` tuples."""
    cols = {n: table.column(n).to_pylist() for n in table.column_names}
    keys = list(zip(*(cols[n] for n in schema.key_names), strict=True)) if schema.key_names else [()] * table.num_rows
    vals = list(zip(*(cols[n] for n in schema.val_names), strict=True)) if schema.val_names else [()] * table.num_rows
    return [((k, v), t, d) for k, v, t, d in zip(keys, vals, cols["ts"], cols["diff"], strict=True)]


__all__ = ["ShardState", "ShardView", "plan_at", "to_updates"]
