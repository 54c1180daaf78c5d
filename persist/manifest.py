"""Where a shard's rows are, and how anyone reads them: runs, parts and snapshot plans (public).

A shard's data is a list of *runs*; a run is Parquet *parts* in blob storage
(each described by a :class:`PartRef`: key, size, CRC-32C, row count, key
bounds) and/or a few inline rows, with an optional time rewrite. A
:class:`SnapshotPlan` names the runs a snapshot at ``as_of`` reads. Plans and
runs are plain values (``to_json``/``from_json``), so a distributed engine
ships them to workers, which read them with :func:`read_run` from any process
that can open the location.

Invariants kept here:

- Nothing is decoded before its size and CRC-32C match the descriptor;
  a mismatch is ``CorruptObject`` and nothing of the part is returned.
- A part absent from blob storage is ``PartRetired`` (plan again), raised
  by these functions without looking at the shard's state. A caller that can
  look (a :class:`persist.ShardView`) turns it into ``CorruptObject`` when the
  current state still references the part: that part is lost, not retired.

>>> import pyarrow as pa
>>> from persist import PersistClient, Schema, ShardId
>>> client = PersistClient.open("mem://doc-manifest")
>>> schema = Schema(key=pa.schema([("k", pa.string())]), val=pa.schema([]))
>>> sid = ShardId.new()
>>> client.open_writer(sid, schema).compare_and_append([((("a",), ()), 0, 1)], 0, 2)
>>> plan = client.shard(sid).plan(schema, as_of=1)
>>> [t.num_rows for run in plan.runs for t in read_run(client.blob, run, schema.arrow)]
[1]
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TypeVar

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from persist._internal import parts as _parts
from persist._internal.codec import crc32c
from persist._internal.parts import (
    IMPLIED_COLUMNS,
    Bound,
    PartRef,
    Run,
    apply_rewrite,
    bound_value,
    bound_values,
    consolidate,
    decode_inline,
    keep_parts,
    part_key,
    part_written_ms,
    prune_runs,
    read_part_table,
)
from persist._internal.retry import backoff
from persist.errors import CorruptObject, PartRetired
from persist.location import Blob
from persist.schema import Schema

T = TypeVar("T")

REPLAN_ATTEMPTS = 5
"""How many times :func:`replan` plans and reads before giving up on a shard compacting that fast."""


def _retired(key: str) -> PartRetired:
    return PartRetired(f"part {key} was retired by compaction after this read was planned; plan the read again", key)


def read_run(blob: Blob, run: Run, schema: pa.Schema, retry_deadline_s: float = 30.0) -> Iterator[pa.Table]:
    """The tables of a run (one per part, plus one for inline rows), time-rewritten, every part checked.

    Raises ``PartRetired`` for a part that is gone from blob storage.
    """
    try:
        yield from _parts.read_run(blob, run, schema, retry_deadline_s)
    except _parts.MissingPart as e:
        raise _retired(e.key) from None


def fetch_part(blob: Blob, ref: PartRef, retry_deadline_s: float = 30.0) -> bytes:
    """The bytes of part ``ref``, after their size and CRC-32C matched its descriptor.

    ``PartRetired`` if the part is gone; ``CorruptObject`` if it does not match.
    """
    data = _parts.get_retrying(blob, ref.key, retry_deadline_s)
    if data is None:
        raise _retired(ref.key)
    _parts.check_part_bytes(ref, data)
    return data


@dataclass(frozen=True)
class SnapshotPlan:
    """What a snapshot at ``as_of`` reads: runs (parts and inline rows) of a shard with ``schema``.

    Read a run's parts with :func:`read_run` from any process that can open
    the location; keep rows with ``ts <= as_of`` and set their time to
    ``as_of`` (:func:`at_as_of`); the consolidated sum is the snapshot.
    """

    shard_id: str
    as_of: int
    runs: tuple[Run, ...]
    schema: Schema


def read_plan(blob: Blob, plan: SnapshotPlan, retry_deadline_s: float = 30.0) -> Iterator[pa.Table]:
    """The plan's rows as tables at ``plan.as_of`` (not consolidated), one part at a time."""
    for run in plan.runs:
        for t in read_run(blob, run, plan.schema.arrow, retry_deadline_s):
            yield at_as_of(t, plan.as_of)


def at_as_of(table: pa.Table, as_of: int) -> pa.Table:
    """Rows of ``table`` with ``ts <= as_of``, their time set to ``as_of`` (what a snapshot reads)."""
    table = table.filter(pc.less_equal(table.column("ts"), pa.scalar(as_of, pa.uint64())))
    idx = table.column_names.index("ts")
    return table.set_column(idx, "ts", pa.array([as_of] * table.num_rows, pa.uint64()))


def replan(read: Callable[[], T], attempts: int = REPLAN_ATTEMPTS) -> T:
    """``read()`` (which plans and reads), run again each time it raises ``PartRetired``.

    The one "plan, read, plan again if compaction retired a part" loop. A
    plan made from the current state cannot name a retired part for
    ``part_grace_s``, so a second attempt almost always succeeds; after
    ``attempts`` the last ``PartRetired`` is raised.
    """
    for attempt in range(1, attempts + 1):
        try:
            return read()
        except PartRetired:
            if attempt == attempts:
                raise
            backoff(attempt, base_s=0.001)
    raise AssertionError("unreachable")


FILE_CHUNK_BYTES = 1 << 20
"""How much of a file :func:`describe_file` reads at a time (for its CRC-32C, and of its first column)."""
FILE_BATCH_ROWS = 1 << 16
"""How many values of the first column :func:`describe_file` decodes at a time for the key bounds."""


def describe_file(key: str, path: str | os.PathLike[str]) -> PartRef:
    """The descriptor of a part written by someone else (Spark's Parquet writer) to the file ``path``, as ``key``.

    Rows from the footer; size and CRC-32C of the file (read
    :data:`FILE_CHUNK_BYTES` at a time); key bounds over the first column,
    exactly as persist's own writes compute them: for a signed integer
    column from the footer's statistics when every row group has them (a
    Parquet writer's integer minimum and maximum are the exact values), else
    by decoding the column :data:`FILE_BATCH_ROWS` values at a time (the
    least and greatest of each batch's least and greatest). Memory: a chunk
    and a batch, whatever the file's size.
    """
    size = crc = 0
    with open(path, "rb") as f:
        while chunk := f.read(FILE_CHUNK_BYTES):
            size += len(chunk)
            crc = crc32c(chunk, crc)
    parquet = pq.ParquetFile(path, buffer_size=FILE_CHUNK_BYTES)  # (a column chunk streamed, not read whole)
    first = parquet.schema_arrow.field(0)
    bounds = _footer_int_bounds(parquet.metadata, first.type)
    lo, hi = _decoded_bounds(parquet, first) if bounds is None else bounds
    return PartRef(key=key, rows=parquet.metadata.num_rows, size=size, crc=crc, lo=lo, hi=hi)


def _footer_int_bounds(meta: pq.FileMetaData, t: pa.DataType) -> tuple[Bound | None, Bound | None] | None:
    """Bounds of a signed integer first column from the row groups' statistics; None: not known there."""
    if not pa.types.is_signed_integer(t):
        return None
    lo: int | None = None
    hi: int | None = None
    for i in range(meta.num_row_groups):
        group = meta.row_group(i)
        if group.num_rows == 0:
            continue
        column = group.column(0)
        stats = column.statistics
        if column.physical_type not in ("INT32", "INT64") or stats is None or not stats.has_null_count:
            return None
        if stats.null_count:
            return None, None  # (a null: no bounds, as for persist's own parts)
        if not stats.has_min_max:
            return None
        lo = int(stats.min) if lo is None else min(lo, int(stats.min))
        hi = int(stats.max) if hi is None else max(hi, int(stats.max))
    return lo, hi


def _decoded_bounds(parquet: pq.ParquetFile, first: pa.Field) -> tuple[Bound | None, Bound | None]:
    """Bounds of the first column, decoded a batch at a time."""
    if not _parts.bounded_type(first.type) or parquet.metadata.num_row_groups == 0:
        return None, None  # (no row groups: pyarrow before 19 refuses to iterate such a file)
    ends: list[pa.Scalar] = []
    for batch in parquet.iter_batches(batch_size=FILE_BATCH_ROWS, columns=[first.name]):
        column = batch.column(0)
        if column.null_count:
            return None, None  # (a null: no bounds, as for persist's own parts)
        if len(column):
            try:
                mm = pc.min_max(column)
            except (pa.ArrowNotImplementedError, pa.ArrowInvalid, pa.ArrowTypeError):
                return None, None
            ends += [mm["min"], mm["max"]]
    return _parts.first_column_bounds(pa.table([pa.array(ends, first.type)], names=[first.name]))


__all__ = [
    "IMPLIED_COLUMNS",
    "REPLAN_ATTEMPTS",
    "CorruptObject",
    "PartRef",
    "PartRetired",
    "Run",
    "SnapshotPlan",
    "apply_rewrite",
    "at_as_of",
    "bound_value",
    "bound_values",
    "consolidate",
    "decode_inline",
    "describe_file",
    "fetch_part",
    "keep_parts",
    "part_key",
    "part_written_ms",
    "prune_runs",
    "read_part_table",
    "read_plan",
    "read_run",
    "replan",
]
