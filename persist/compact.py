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

import pyarrow as pa

from persist.config import PersistConfig
from persist.location import Blob
from persist.parts import MissingPart, Run, consolidate, encode_inline, read_run, write_part
from persist.state import HollowBatch


def merge_batches(
    blob: Blob, shard_id: str, schema: pa.Schema, inputs: list[HollowBatch], since: int, config: PersistConfig
) -> HollowBatch:
    """Read ``inputs``, consolidate them at ``since``, and write the result."""
    tables = [t for b in inputs for r in b.runs for t in read_run(blob, r, schema)]
    table = pa.concat_tables(tables) if tables else schema.empty_table()
    merged = consolidate(table, advance_to=since)
    return HollowBatch(
        id=uuid.uuid4().hex,
        lower=inputs[0].lower,
        upper=inputs[-1].upper,
        since=since,
        runs=write_runs(blob, shard_id, merged, config),
    )


def write_runs(blob: Blob, shard_id: str, table: pa.Table, config: PersistConfig) -> tuple[Run, ...]:
    """``table`` (sorted) as one run: inline if small, else parts of the target size."""
    if table.num_rows == 0:
        return ()
    inline = encode_inline(table)
    if len(inline) <= config.inline_max_bytes:
        return (Run(inline=inline, rows=table.num_rows),)
    per_row = max(1, table.nbytes // max(1, table.num_rows))
    step = max(1, config.part_target_bytes // per_row)
    refs = tuple(write_part(blob, shard_id, table.slice(i, step)) for i in range(0, table.num_rows, step))
    return (Run(parts=refs, rows=table.num_rows),)


__all__ = ["merge_batches", "write_runs", "MissingPart"]
