"""Snapshots of data shards as DataFrames, read by executors in parallel.

Protocol of :func:`snapshot`:

1. On the driver, the txns read protocol makes the data shard readable at
   ``as_of`` (its latest write at or before ``as_of`` applied, the empty time
   after it filled) and plans the read: the runs of every batch that starts
   at or before ``as_of`` (``TxnsHandle.data_snapshot(...).plan()``).
2. One Spark task per part (inline rows: grouped) reads it from blob storage
   in an executor, checking its size and CRC-32C against the descriptor
   before decoding (``persist.manifest.read_run``), and keeps the rows with
   ``ts <= as_of``.
3. Spark sums ``diff`` per ``(key, val)`` and drops zeros. When the plan is
   one run marked ``distinct_kv`` (a shard compacted into one batch with a
   single time), the rows are already consolidated and step 3 is skipped: no
   shuffle.

The DataFrame is lazy: its parts are read when an action runs. Planning
writes a part hold on the data shard (``PersistClient.hold_parts``, one
PUT) for ``valid_for_s`` (an hour by default): the parts it names stay
readable that long however far compaction goes meanwhile (compaction is not
blocked; only the deletion of the parts it retires waits). An action later
than that may fail asking to plan the read again.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.compute as pc

from persist import InvalidUsage, PersistClient, Run, Schema, ShardId, check_ts
from txns.handle import TxnsHandle
from txns.spark._common import (
    arrow_schema,
    check_url,
    col,
    plan_tasks,
    spark_struct,
    task_frame,
    task_tables,
    to_spark_arrow,
)

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

PLAN_VALID_S = 3600.0
"""How long a planned Spark read stays readable by default (its part hold)."""


def snapshot(
    spark: SparkSession,
    url: str,
    txns_id: str | ShardId,
    data_id: str | ShardId,
    as_of: int,
    expand: bool = False,
    *,
    handle: TxnsHandle | None = None,
    valid_for_s: float = PLAN_VALID_S,
) -> DataFrame:
    """Data shard ``data_id`` at ``as_of`` as a DataFrame, read through txns shard ``txns_id``.

    Columns: the shard's key and val fields, then ``diff`` (a long): one row
    per ``(key, val)`` with a non-zero sum of diffs. With ``expand=True``:
    no ``diff`` column and one row per unit of multiplicity; evaluating it
    fails (Spark's ``raise_error``, message naming the row) if a
    multiplicity is negative.

    Unsigned key/val fields widen (uint64 is decimal(20,0)). Raises
    ``InvalidUsage`` for a URL executors cannot reach (``mem://``, relative
    ``file://``), ``NotRegistered`` if the shard is not registered at
    ``as_of``, ``ReadBelowSince`` if compaction passed ``as_of``, and
    ``ReadTimeout`` if the txns shard has not reached ``as_of``. ``handle``:
    an open handle to reuse (its client's URL must be ``url``); without
    one, a handle is opened and released here. ``valid_for_s``: how long
    the DataFrame stays readable after planning (see the module doc).
    """
    check_url(url)
    check_ts(as_of, "as_of")
    data_id = str(ShardId.parse(str(data_id)))
    own = handle is None
    if handle is None:
        handle = TxnsHandle.open(PersistClient.open(url), txns_id)
    elif handle.client.url != url or handle.txns_id != str(txns_id):
        raise InvalidUsage("the handle given to snapshot() is for another location or txns shard")
    try:
        handle.client.hold_parts(data_id, valid_for_s)  # (before planning: see persist/_internal/holds.py)
        plan = handle.data_snapshot(data_id, as_of).plan()
    finally:
        if own:
            release(handle)
    df = read_plan(spark, url, plan.schema, plan.runs, as_of)
    if not (len(plan.runs) == 1 and plan.runs[0].distinct_kv):
        from pyspark.sql import functions as F

        names = plan.schema.key_names + plan.schema.val_names
        df = df.groupBy(*[col(n) for n in names]).agg(F.sum("diff").alias("diff")).where(F.col("diff") != 0)
    return expand_diffs(df, f"data shard {data_id} at {as_of}") if expand else df


def read_plan(spark: SparkSession, url: str, schema: Schema, runs: tuple[Run, ...], as_of: int) -> DataFrame:
    """The rows of ``runs`` with ``ts <= as_of``, as key, val and ``diff`` columns (not consolidated)."""
    from pyspark.sql.types import LongType, StructField

    struct = spark_struct(list(schema.key) + list(schema.val))
    struct.add(StructField("diff", LongType(), False))
    tasks = plan_tasks(runs)
    if not tasks:
        return spark.createDataFrame([], struct)
    fn = functools.partial(_read_at, url, schema.to_text(), as_of, arrow_schema(struct), tasks)
    return task_frame(spark, len(tasks)).mapInArrow(fn, struct)


def _read_at(
    url: str, schema_text: str, as_of: int, out: pa.Schema, tasks: list[bytes], batches: Iterator[pa.RecordBatch]
) -> Iterator[pa.RecordBatch]:
    """mapInArrow function of :func:`read_plan`: read tasks' rows at or before ``as_of``."""
    schema = Schema.from_text(schema_text)
    bound = pa.scalar(as_of, pa.uint64())
    for table in task_tables(url, schema.arrow, tasks, batches):
        table = table.filter(pc.less_equal(table.column("ts"), bound))
        if table.num_rows:
            yield from to_spark_arrow(table, out).to_batches()


def expand_diffs(df: DataFrame, what: str) -> DataFrame:
    """``df`` with one row per unit of positive ``diff`` and no ``diff`` column; negative ones fail."""
    from pyspark.sql import functions as F

    cols = [col(c) for c in df.columns if c != "diff"]
    msg = F.concat(
        F.lit(
            f"{what} has a negative multiplicity, so it cannot be expanded into rows (read it with "
            f"expand=False to see the diffs): "
        ),
        F.to_json(F.struct(*cols, "diff")),
    )
    checked = F.when(F.col("diff") < 0, F.raise_error(msg)).otherwise(F.col("diff"))
    ones = F.explode(F.sequence(F.lit(1).cast("long"), checked))
    return df.where(F.col("diff") != 0).select(*cols, ones.alias("_unit")).drop("_unit")


def release(handle: TxnsHandle) -> None:
    """Drop a handle's hold on the txns shard (its read cache's lease), best effort."""
    with contextlib.suppress(Exception):
        handle.close()
