"""Compaction of a big data shard as a Spark job.

The same merge as in-process compaction (``WriteHandle.compact``), with the data never on the driver:

1. The driver reads the shard's state and picks the batches to merge (all
   of them, or what the size-tiered policy asks for up to ``max_bytes``),
   and the since ``s`` to merge at.
2. Executors read the input parts (size and CRC-32C checked), advance every
   time below ``s`` to ``s``; Spark sums ``diff`` per ``(key, val, ts)`` and
   drops zeros; executors write the result as new parts.
3. The driver replaces the inputs by the merged batch with one
   compare-and-set (``WriteHandle.apply_merged``). If another
   compaction changed those batches meanwhile, nothing changes and the new
   parts are deleted.

Reads at any ``as_of >= s`` are the same before and after (persist's state
invariant 3). The replaced parts are retired and deleted by writers after
``part_grace_s``. When every merged time is the same (all inputs at or below
the since), the output run is marked ``distinct_kv`` and snapshots of the
shard skip their shuffle.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from persist import HollowBatch, InvalidUsage, PersistClient, Run, Schema, ShardId
from persist.manifest import apply_rewrite
from txns.spark._common import (
    arrow_schema,
    check_url,
    col,
    plan_tasks,
    raise_from_spark,
    spark_struct,
    task_frame,
    task_tables,
)
from txns.spark.write import PART_ROWS, part_refs, write_tables

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from txns.db.database import Database


@dataclass(frozen=True)
class CompactionResult:
    """What :func:`compact` did: ``applied`` is False if another compaction won the race."""

    applied: bool
    batches_in: int
    rows_in: int
    rows_out: int
    parts_out: int
    since: int


def compact(
    spark: SparkSession,
    url: str,
    shard_id: str | ShardId,
    *,
    max_bytes: int | None = None,
    part_target_bytes: int | None = None,
) -> CompactionResult | None:
    """Merge batches of shard ``shard_id`` at ``url`` into one, with Spark executors doing the work.

    Without ``max_bytes``, every batch is merged; with it, the batches the
    size-tiered policy asks for (``ShardState.compaction_request``). Returns
    None if there is nothing to merge (fewer than two batches, or one that
    is already ``distinct_kv``). Output parts hold about
    ``part_target_bytes`` of Arrow data each (default: the config's). Raises
    InvalidUsage for a URL executors cannot reach or a shard without schema.
    """
    check_url(url)
    shard_id = str(ShardId.parse(str(shard_id)))
    client = PersistClient.open(url)
    state = client.shard(shard_id).fetch()
    if state.schema is None:
        raise InvalidUsage(f"shard {shard_id} has no schema (it was never written)")
    schema = Schema.from_text(state.schema)
    if max_bytes is None:
        inputs = list(state.batches)
        runs = [r for b in inputs for r in b.runs if r.rows]
        if len(inputs) < 2 and (not runs or (len(runs) == 1 and runs[0].distinct_kv)):
            return None
    else:
        inputs = state.compaction_request(max_bytes) or []
        if not inputs:
            return None
    since = state.since
    target = client.config.part_target_bytes if part_target_bytes is None else part_target_bytes
    merged_runs = _merge(spark, url, shard_id, schema, inputs, since, target)
    applied = client.open_writer(shard_id, schema).apply_merged(inputs, merged_runs, since)
    return CompactionResult(
        applied=applied,
        batches_in=len(inputs),
        rows_in=sum(b.rows for b in inputs),
        rows_out=sum(r.rows for r in merged_runs),
        parts_out=sum(len(r.parts) for r in merged_runs),
        since=since,
    )


def _merge(
    spark: SparkSession, url: str, shard_id: str, schema: Schema, inputs: list[HollowBatch], since: int, target: int
) -> tuple[Run, ...]:
    """Run the Spark job: read, advance to ``since``, consolidate, write. The merged run (or none)."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import LongType, StructField

    tasks = plan_tasks(r for b in inputs for r in b.runs if r.rows)
    if not tasks:
        return ()
    names = schema.key_names + schema.val_names
    struct = spark_struct(list(schema.key) + list(schema.val))
    struct.add(StructField("ts", LongType(), False))  # the uint64 bits, reinterpreted: grouped, never compared
    struct.add(StructField("diff", LongType(), False))
    read = functools.partial(_read_advanced, url, schema.to_text(), since, arrow_schema(struct), tasks)
    write = functools.partial(_write_merged, url, shard_id, schema.to_text(), target)
    df = task_frame(spark, len(tasks)).mapInArrow(read, struct)
    df = df.groupBy(*[col(n) for n in names], "ts").agg(F.sum("diff").alias("diff")).where(F.col("diff") != 0)
    try:
        rows = df.mapInArrow(write, PART_ROWS).collect()
    except Exception as e:
        raise_from_spark(e)
        raise
    if not rows:
        return ()
    refs = part_refs(rows)
    single_time = min(r["min_ts"] for r in rows) == max(r["max_ts"] for r in rows)
    return (Run(parts=refs, rows=sum(p.rows for p in refs), distinct_kv=single_time),)


def _read_advanced(
    url: str, schema_text: str, since: int, out: pa.Schema, tasks: list[bytes], batches: Iterator[pa.RecordBatch]
) -> Iterator[pa.RecordBatch]:
    """mapInArrow function: the tasks' rows with times advanced to ``since``, ``ts`` as int64 bits."""
    schema = Schema.from_text(schema_text)
    for table in task_tables(url, schema.arrow, tasks, batches):
        table = apply_rewrite(table, since)
        ts = table.column("ts").combine_chunks().view(pa.int64())
        table = table.set_column(table.column_names.index("ts"), "ts", ts)
        yield from table.select(out.names).cast(out).to_batches()


def _write_merged(
    url: str, shard_id: str, schema_text: str, target: int, batches: Iterator[pa.RecordBatch]
) -> Iterator[pa.RecordBatch]:
    """mapInArrow function: consolidated rows (``ts`` as int64 bits) into parts."""

    def tables() -> Iterator[pa.Table]:
        for b in batches:
            t = pa.Table.from_batches([b])
            ts = t.column("ts").combine_chunks().view(pa.uint64())
            yield t.set_column(t.column_names.index("ts"), "ts", ts)

    return write_tables(url, shard_id, schema_text, target, tables())


def compact_tables(
    spark: SparkSession, db: Database | str, tables: Sequence[str] | None = None
) -> dict[str, dict[str, Any]]:
    """Compact a database's tables by name (default: all, and its catalog) with Spark jobs.

    ``Database.compact`` with each merge a :func:`compact` job: retention
    first moves each table's since, then executors merge its batches, then
    its retired parts are collected (after their grace period and holds).
    ``db``: an open database or its URL. Returns ``Database.compact``'s
    report per table: batches, rows and parts before and after, and the since.
    """
    from txns.db.database import connect

    own = isinstance(db, str)
    database = connect(check_url(db), create=False) if isinstance(db, str) else db
    url = check_url(database.url)

    def merge(data_id: str) -> dict[str, Any]:
        client = database.client
        before = client.inspect(data_id)
        result = compact(spark, url, data_id)
        writer = database.handle.data_writer(data_id)
        writer.shard.fetch()
        writer.collect_garbage()
        after = client.inspect(data_id)
        return {
            "before": {k: before[k] for k in ("batches", "rows", "parts")},
            "after": {k: after[k] for k in ("batches", "rows", "parts")},
            "since": after["since"],
            "merged_all": result is None or result.applied,
        }

    try:
        return database.compact(tables, merge=merge)
    finally:
        if own:
            database.close()


__all__ = ["CompactionResult", "compact", "compact_tables"]
