"""Compaction: merge adjacent batches into one, consolidated at the since.

Merging advances every update time below the shard's since to the since and
sums the diffs of equal ``(key, val, ts)``, dropping zeros. A read at any
``as_of >= since`` therefore sees the same result before and after (state
invariant 3). The merged batch replaces its inputs with one compare-and-set
that succeeds only if all inputs are still in the state, contiguous; if it
loses, the merged parts are deleted and nothing changed.

In-process compaction reads its inputs into memory, so it only merges up to
``compaction_max_bytes``; :mod:`txns.spark` compacts bigger shards.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.compute as pc

from persist._internal.parts import MissingPart, Run, consolidate, encode_inline, read_run, write_part
from persist._internal.state import HollowBatch, ShardState
from persist.config import PersistConfig
from persist.location import Blob

if TYPE_CHECKING:
    from persist._internal.machine import Machine


def merge_batches(
    blob: Blob,
    shard_id: str,
    schema: pa.Schema,
    inputs: list[HollowBatch],
    since: int,
    config: PersistConfig,
    inline_max_bytes: int | None = None,
) -> HollowBatch:
    """Read ``inputs``, consolidate them at ``since``, and write the result.

    ``inline_max_bytes`` overrides the config's inline threshold (the
    compacting writer's own, see :func:`write_runs`).
    """
    tables = [t for b in inputs for r in b.runs for t in read_run(blob, r, schema, config.retry_deadline_s)]
    table = pa.concat_tables(tables) if tables else schema.empty_table()
    merged = consolidate(table, advance_to=since)
    return HollowBatch(
        id=uuid.uuid4().hex,
        lower=inputs[0].lower,
        upper=inputs[-1].upper,
        since=since,
        runs=write_runs(blob, shard_id, merged, config, inline_max_bytes, distinct_kv=single_time(merged)),
    )


def single_time(table: pa.Table) -> bool:
    """Whether every row of ``table`` has the same ``ts``.

    A consolidated table with a single time has distinct ``(key, val)``s:
    its run can be marked ``distinct_kv``.
    """
    if table.num_rows == 0:
        return False
    mm = pc.min_max(table.column("ts")).as_py()
    return bool(mm["min"] == mm["max"])


def apply_merged(
    blob: Blob, machine: Machine, inputs: Sequence[HollowBatch], merged: HollowBatch, config: PersistConfig
) -> bool:
    """Replace the batches ``inputs`` by ``merged`` with one compare-and-set.

    True if it applied. False if the inputs are no longer all in the state
    (another compaction won): then ``merged``'s parts are deleted and the
    state is unchanged. ``merged`` must hold the inputs' updates consolidated
    at a since no later than the shard's.
    """
    ids = [b.id for b in inputs]
    merged_keys = {p.key for r in merged.runs for p in r.parts}

    def transition(s: ShardState) -> tuple[bool, bool]:
        # SUBTLE: after an indeterminate CAS the machine re-runs this on a
        # fresh state. If our merge already committed, its parts are live
        # (or retired with a grace period): report success so they are not
        # deleted below.
        if any(b.id == merged.id for b in s.batches) or any(k in merged_keys for k, _ in s.garbage):
            return True, False
        ok = s.apply_compaction(ids, merged, config.clock_ms())
        return ok, ok

    if machine.apply(transition):
        return True
    for k in merged_keys:
        blob.delete(k)
    return False


def write_runs(
    blob: Blob,
    shard_id: str,
    table: pa.Table,
    config: PersistConfig,
    inline_max_bytes: int | None = None,
    distinct_kv: bool = False,
) -> tuple[Run, ...]:
    """``table`` (sorted) as one run: inline if small, else parts of the target size.

    Small means at most ``inline_max_bytes`` (default: the config's). Pass
    ``distinct_kv`` only if no two rows share ``(key, val)`` and no diff is 0.
    """
    if table.num_rows == 0:
        return ()
    inline = encode_inline(table)
    limit = config.inline_max_bytes if inline_max_bytes is None else inline_max_bytes
    if len(inline) <= limit:
        return (Run(inline=inline, rows=table.num_rows, distinct_kv=distinct_kv),)
    per_row = max(1, table.nbytes // max(1, table.num_rows))
    step = max(1, config.part_target_bytes // per_row)
    refs = tuple(write_part(blob, shard_id, table.slice(i, step)) for i in range(0, table.num_rows, step))
    return (Run(parts=refs, rows=table.num_rows, distinct_kv=distinct_kv),)


__all__ = ["MissingPart", "apply_merged", "merge_batches", "single_time", "write_runs"]
