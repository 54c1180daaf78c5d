"""MERGE of a Spark DataFrame into a keyed table: upserts and deletes by key, joined and written by executors.

Protocol of :func:`merge` (one database transaction, strict serializable by
default, retried whole on a conflict):

1. On the driver, before any job: the table must be keyed
   (``InvalidUsage`` otherwise: use ``df.write`` / ``t.insert``), the
   DataFrame's columns must be the table's (by name; types as
   :func:`txns.spark.write.check_columns` accepts them; ``SchemaMismatch``)
   plus, if ``delete_column`` is given, that boolean column.
2. One small aggregate job: the least and greatest value of the first key
   column, the number of rows and of distinct keys, and the number of null
   keys (``InvalidPrimaryKey``), of nulls in ``delete_column`` and of nulls
   in non-nullable columns of the upserted rows (``SchemaMismatch``). When
   a key is given twice, a second job finds one (a ``groupBy`` of the key
   columns; ``DuplicateKey`` naming it). Nothing is written when either
   fails.
3. The transaction takes its read time ``read_ts`` and plans the table's
   snapshot there. Parts whose key bounds (``PartRef.lo``/``hi``: of the
   first key column) lie wholly outside the updates' range are not read
   (inline runs always are). Executors read the rest
   (:func:`txns.spark.read.read_plan`), consolidate (group by every column,
   keep a positive sum of diffs: a keyed table's row has multiplicity 1) and
   join it with the updates on the key columns (a left join of the updates,
   a sort-merge join: no side is broadcast, which would go through the
   driver).
4. Per update row, at most two changes: the existing row, retracted (diff
   -1) when the key is deleted or its new row differs; the new row, added
   (diff +1) when it is upserted and differs from the existing one (or there
   is none). The changes are cached on the executors, counted by sign (one
   aggregate job) and written as one batch by the executors
   (:func:`txns.spark.write.write_batch`, about one writing task per
   :data:`WRITE_TASK_ROWS` changes, so few parts): the bytes written are
   proportional to the changed rows, not to the table. Only part
   descriptors and counts reach the driver: its memory does not grow with
   the table nor with the updates.
5. ``EngineTxn.add_batch(..., read_table=True)`` records a read of the
   whole table and the commit validates it: a write to the table committed
   by another transaction after ``read_ts`` raises ``TransactionConflict``
   (the batch's parts are deleted). :func:`merge` then starts over (new read
   time, new join) up to ``retries`` more times, and raises the conflict
   after that (likewise when compaction retired a part the read was
   planned with). So the merge applies to exactly the state just below its
   commit time: the table keeps one row per key.

:func:`insert_keyed` is the keyed ``Transaction.insert(table, spark_df)``:
no key twice in the DataFrame and none already in the table at the
transaction's read time (``DuplicateKey`` naming one, nothing written); it
writes the rows with ``write_batch`` and adds the batch to the caller's
transaction, which commits it (and validates the read) as usual.
"""

from __future__ import annotations

import dataclasses
import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from persist import Batch, InvalidUsage, PartRetired, Schema, SchemaMismatch
from persist.manifest import PartRef, Run, bound_value, keep_parts
from txns.db.catalog import TableEntry, check_writable, data_schema
from txns.db.engine import EngineTxn
from txns.db.errors import DuplicateKey, InvalidPrimaryKey, TableExists, TableNotFound, TransactionConflict
from txns.db.keyed import describe_key
from txns.db.transaction import CommitInfo, Transaction
from txns.spark._common import check_url, col, partition_count, raise_from_spark, spark_struct, spark_type
from txns.spark.read import read_plan
from txns.spark.table_write import SINKS, SINKS_SCHEMA
from txns.spark.write import check_columns, write_batch

if TYPE_CHECKING:
    from collections.abc import Callable

    from pyspark.sql import Column, DataFrame

    from txns.db.database import Database

_PREFIX = "__txns_old_"
"""Prefix of the existing row's columns in the join (the updates keep their names)."""
_DEL = "__txns_delete"
_DIFF = "diff"
WRITE_TASK_ROWS = 1_000_000
"""The changes a merge writes are spread over about one writing task per this many rows (each task writes its parts)."""


@dataclass(frozen=True)
class MergeStats:
    """What one merge attempt read and wrote (for benchmarks and tests).

    ``parts_total``/``parts_read``: parts in the table's snapshot plan and
    those left after pruning by key bounds; ``bytes_total``: their sizes in
    the plan; ``added``/``retracted``: rows written with diff +1 / -1;
    ``parts_written``/``bytes_written``: the batch the merge wrote.
    """

    parts_total: int
    parts_read: int
    bytes_total: int
    added: int
    retracted: int
    parts_written: int
    bytes_written: int


def merge(
    db: Database,
    table: str,
    updates: DataFrame,
    *,
    delete_column: str | None = None,
    metadata: dict[str, Any] | None = None,
    retries: int = 3,
    sink: str | None = None,
    batch_id: int | None = None,
) -> CommitInfo:
    """Merge ``updates`` into keyed ``table``: upsert each row's key, or delete it; one commit.

    ``updates``: a Spark DataFrame with the table's columns (matched by
    name) and, if ``delete_column`` is given, a boolean column of that name
    whose true rows delete their key (their other columns are ignored and
    may be null). A key may appear once. Unchanged rows write nothing.
    ``updates`` is evaluated several times (checks, then the join of each
    attempt): it must give the same rows each time (cache a
    non-deterministic one first). The
    merge reads and writes on the executors and commits one transaction
    (``metadata`` goes into its history record); a concurrent write to the
    table makes it start over, at most ``retries`` more times, then raise
    ``TransactionConflict``. Returns the commit's ``CommitInfo`` (``ts``
    None when nothing changed; ``attempts`` how many tries it took).

    Raises, having written nothing: ``TableNotFound``; ``InvalidUsage`` for
    a table without a primary key; ``SchemaMismatch`` for missing,
    unexpected or unconvertible columns (or a null in a non-nullable column
    of an upserted row); ``InvalidPrimaryKey`` for a null key;
    ``DuplicateKey`` for a key given twice.

    ``sink`` and ``batch_id``: the merge of a streaming query's micro-batch
    (see :func:`merge_stream`), committed at most once per (sink, batch id):
    the sink's progress row in the system table ``txns_sinks`` is read and
    moved in the merge's own transaction, so a batch at or below it merges
    nothing (``ts`` None), and two processes merging one batch commit it
    once (the second conflicts, starts over and finds it done).
    """
    if (sink is None) != (batch_id is None):
        raise InvalidUsage("merge takes sink and batch_id together (a micro-batch of a stream), or neither")
    if sink is not None and (not isinstance(sink, str) or not sink):
        raise InvalidUsage(f"sink must be a non-empty name (unique to the query, kept across restarts), got {sink!r}")
    if batch_id is not None and (isinstance(batch_id, bool) or not isinstance(batch_id, int) or batch_id < 0):
        raise InvalidUsage(f"batch_id must be an int >= 0 (Spark's micro-batch id), got {batch_id!r}")
    progress = None if sink is None or batch_id is None else (sink, batch_id)
    info, _ = _merge(
        db, table, updates, delete_column=delete_column, metadata=metadata, retries=retries, progress=progress
    )
    return info


def merge_stream(
    db: Database | str, table: str, sink: str, *, delete_column: str | None = None, retries: int = 3
) -> Callable[[DataFrame, int], None]:
    """A ``foreachBatch`` function that merges each micro-batch into keyed ``table`` exactly once.

    ``df.writeStream.foreachBatch(txns.spark.merge_stream(url, "accounts", sink="accounts-feed"))
    .option("checkpointLocation", cp).start()``: each micro-batch is one
    :func:`merge` (upserts, and deletes with ``delete_column``) whose
    transaction also moves the sink's progress row, so a batch Spark
    replays after a crash merges nothing. ``sink``: a name unique to the
    query and kept across its restarts. ``db``: a database, or its URL (a
    URL when the function must travel: Spark Connect runs it on the
    server). A micro-batch must not give a key twice (``DuplicateKey``).
    """
    if not isinstance(sink, str) or not sink:
        raise InvalidUsage(f"sink must be a non-empty name (unique to the query, kept across restarts), got {sink!r}")
    if isinstance(db, str):
        check_url(db)

    def merge_batch(batch: DataFrame, batch_id: int) -> None:
        import txns

        d = txns.connect(db, create=False) if isinstance(db, str) else db
        try:
            merge(d, table, batch, delete_column=delete_column, retries=retries, sink=sink, batch_id=int(batch_id))
        finally:
            if isinstance(db, str):
                d.close()

    return merge_batch


def _merge(
    db: Database,
    table: str,
    updates: DataFrame,
    *,
    delete_column: str | None = None,
    metadata: dict[str, Any] | None = None,
    retries: int = 3,
    before_commit: Callable[[Transaction, int], None] | None = None,
    progress: tuple[str, int] | None = None,
) -> tuple[CommitInfo, MergeStats]:
    """:func:`merge`, also returning the stats of the attempt that committed.

    ``before_commit(t, attempt)`` (tests) runs after the batch is added,
    just before ``t.commit()``. ``progress``: (sink, batch id), see :func:`merge`.
    """
    _check_frame(updates, "merge")
    if isinstance(retries, bool) or not isinstance(retries, int) or retries < 0:
        raise InvalidUsage(f"retries must be an int >= 0 (how many times to start over on a conflict), got {retries!r}")
    if delete_column is not None and not isinstance(delete_column, str):
        raise InvalidUsage(f"delete_column must be a column name (str) or None, got {delete_column!r}")
    check_url(db.url)
    check_writable(table, "merge into")
    probe = db.transaction(metadata=metadata)
    try:
        _ = probe.read_ts  # (the table names as of now)
        e = _keyed_entry(EngineTxn(probe).entry(table), "merge into")
    finally:
        probe.abort()
    src = _conform(e, updates, delete_column)
    lo, hi = _check_updates(e, src, deleting=delete_column is not None)
    if progress is not None:
        metadata = {**(metadata or {}), "spark": {"mode": "merge", "sink": progress[0], "batch": progress[1]}}
    attempt = 0
    while True:
        attempt += 1
        t = db.transaction(metadata=metadata, isolation="strict_serializable")
        if progress is not None:
            EngineTxn(t).allow_system({SINKS})
        try:
            if progress is not None and _merged_already(t, *progress):
                return dataclasses.replace(t.commit(), attempts=attempt), MergeStats(0, 0, 0, 0, 0, 0, 0)
            stats = _merge_in(t, e, src, lo, hi, deleting=delete_column is not None)
            if progress is not None:
                t.upsert(SINKS, [{"sink": progress[0], "batch": progress[1]}])
            if before_commit is not None:
                before_commit(t, attempt)
            info = t.commit()
        except (TransactionConflict, TableExists) as x:  # (TableExists: two first batches created txns_sinks)
            t.abort()
            if attempt > retries:
                raise TransactionConflict(f"{x} (merge into {table!r}: {attempt} attempts)", attempts=attempt) from x
            continue
        except PartRetired:
            t.abort()  # (compaction retired a part the read was planned with: plan again)
            if attempt > retries:
                raise
            continue
        except BaseException:
            t.abort()
            raise
        return dataclasses.replace(info, attempts=attempt), stats


def _merged_already(t: Transaction, sink: str, batch_id: int) -> bool:
    """Whether ``sink``'s progress row (read in ``t``) is at or past ``batch_id`` (creates the table in ``t``)."""
    try:
        row = t.get(SINKS, sink)
    except TableNotFound:
        t.create_table(SINKS, SINKS_SCHEMA, primary_key=["sink"])
        return False
    return row is not None and int(row["batch"]) >= batch_id


def _merge_in(t: Transaction, e0: TableEntry, src: DataFrame, lo: Any, hi: Any, *, deleting: bool) -> MergeStats:
    """One attempt: read at ``t``'s read time, join, write the changes, add them to ``t`` (not committed).

    ``e0``: the table as the updates were checked against; ``src`` the conformed updates.
    """
    from pyspark import StorageLevel
    from pyspark.sql import functions as F

    et = EngineTxn(t)
    db = et.db
    table = e0.name
    ts = t.read_ts  # (re-resolves the table names at the read time)
    e = _keyed_entry(et.entry(table), "merge into")
    if e.schema != e0.schema or e.primary_key != e0.primary_key:
        raise SchemaMismatch(
            f"table {table!r} was re-created with another schema or primary key while merging into it; "
            f"nothing was merged: check the DataFrame against the new table and merge again"
        )
    schema = data_schema(e.schema, e.primary_key)
    plan = db.plan(e, ts)
    runs = prune_range(plan.runs, lo, hi)
    old = _existing(src, db.url, plan.schema, runs, ts)
    assert e.primary_key is not None
    pk = list(e.primary_key)
    names = list(schema.key_names)
    others = [n for n in names if n not in pk]
    o = old.select(*[col(n).alias(_PREFIX + n) for n in names])
    on = [col(k) == col(_PREFIX + k) for k in pk]
    j = src.join(o.hint("merge"), on, "left")  # (never a broadcast: the driver holds no rows)
    there = col(_PREFIX + pk[0]).isNotNull()
    same = F.lit(True)
    for n in others:
        same = same & col(n).eqNullSafe(col(_PREFIX + n))
    dele = col(_DEL) if deleting else F.lit(False)
    retract = there & (dele | ~same)
    add = ~dele & (~there | ~same)
    fields = [F.col(_PREFIX + n).alias(n) for n in names]
    news = [col(n).alias(n) for n in names]
    out = F.array(
        F.when(retract, F.struct(*fields, F.lit(-1).cast("long").alias(_DIFF))),
        F.when(add, F.struct(*news, F.lit(1).cast("long").alias(_DIFF))),
    )
    changes = j.select(F.explode(out).alias("c")).where(F.col("c").isNotNull()).select("c.*")
    changes = changes.persist(StorageLevel.MEMORY_AND_DISK)
    try:
        added, retracted = _signed_counts(changes)
        # (the changes are few: fewer writing tasks, fewer and bigger parts; the join stays parallel)
        tasks = max(1, min(partition_count(changes), -(-(added + retracted) // WRITE_TASK_ROWS)))
        batch = (
            _write(changes.coalesce(tasks), db.url, e.data_id, schema)
            if added or retracted
            else Batch(
                shard_id=e.data_id, id=uuid.uuid4().hex, lower=0, upper=1, runs=(), schema_fingerprint=schema.to_text()
            )
        )
    finally:
        changes.unpersist()
    try:
        et.add_batch(table, batch, added=added, retracted=retracted, read_table=True)
    except BaseException:
        batch.delete(db.client.blob)
        raise
    written = [p for r in batch.runs for p in r.parts]
    return MergeStats(
        parts_total=sum(len(r.parts) for r in plan.runs),
        parts_read=sum(len(r.parts) for r in runs),
        bytes_total=sum(p.size for r in plan.runs for p in r.parts),
        added=added,
        retracted=retracted,
        parts_written=len(written),
        bytes_written=sum(p.size for p in written),
    )


def insert_keyed(t: Transaction, table: str, df: DataFrame) -> int:
    """Insert ``df``'s rows into keyed ``table`` in transaction ``t`` (not committed); return how many.

    The keyed insert rule, distributed: no key twice in ``df`` and none
    already in the table at ``t``'s read time (``DuplicateKey`` naming one;
    ``InvalidPrimaryKey`` for a null key; ``SchemaMismatch`` for wrong
    columns: nothing written). Executors write the rows; the batch joins
    ``t`` with a read of the whole table recorded (validated at commit). The
    table cannot then be read or written by key in ``t``, and a table ``t``
    already wrote by key (``upsert`` / ``delete`` / ``update`` / keyed
    ``insert``) or from a DataFrame is refused (``InvalidUsage``: use
    another transaction).
    """
    _check_frame(df, "insert")
    et = EngineTxn(t)
    e = _keyed_entry(et.entry(table), "insert_keyed into")
    db = et.db
    check_url(db.url)
    d = e.data_id
    et.check_rows_kept(e)
    if et.wrote_by_key(e):
        raise InvalidUsage(
            f"table {e.name!r} was already written by key in this transaction (upsert, delete, update or a "
            f"keyed insert of Arrow data); insert a Spark DataFrame into it in a transaction of its own. "
            f"Nothing was inserted"
        )
    src = _conform(e, df, None)
    lo, hi = _check_updates(e, src, deleting=False, verb="insert", nothing="Nothing was inserted")
    schema = data_schema(e.schema, e.primary_key)
    if lo is None:  # no rows
        return 0
    if et.reads_committed(e):
        ts = t.read_ts
        et.note_scan(e)  # (recorded even if it then raises: the caller saw the outcome)
        plan = db.plan(e, ts)
        runs = prune_range(plan.runs, lo, hi)
        if runs:
            assert e.primary_key is not None
            pk = list(e.primary_key)
            old = _existing(src, db.url, plan.schema, runs, ts)
            keys = src.select(*[col(k) for k in pk]).hint("merge")  # (no broadcast through the driver)
            hit = old.join(keys, pk, "left_semi").limit(1).collect()
            if hit:
                row = hit[0].asDict()
                k = tuple(row[n] for n in pk)
                raise DuplicateKey(
                    f"table {e.name!r} already has a row with key {describe_key(e, k)} (committed): {row!r}; "
                    f"merge it (txns.spark.merge) to replace it. Nothing was inserted"
                )
    batch = _write(src, db.url, d, schema)
    n = batch.rows
    try:
        et.add_batch(table, batch, added=n, retracted=0, read_table=True)
    except BaseException:
        batch.delete(db.client.blob)
        raise
    return n


# ---- pieces ---------------------------------------------------------------------------------


def prune_range(runs: tuple[Run, ...], lo: Any, hi: Any) -> tuple[Run, ...]:
    """``runs`` without the parts whose first-key bounds lie wholly outside ``[lo, hi]`` (bound values).

    ``lo``/``hi`` as :func:`persist.manifest.bound_value` gives them (None:
    unknown, nothing pruned on that side). A part bound of another kind
    keeps the part; inline rows are kept; a run left empty is dropped.
    """

    def outside(p: PartRef) -> bool:
        plo: Any = p.lo
        phi: Any = p.hi
        if hi is not None and plo is not None and type(plo) is type(hi) and plo > hi:
            return True
        return lo is not None and phi is not None and type(phi) is type(lo) and bool(phi < lo)

    return keep_parts(runs, lambda p: not outside(p))


def _check_frame(df: object, what: str) -> None:
    from pyspark.sql import DataFrame

    if not isinstance(df, DataFrame):
        raise InvalidUsage(f"{what} takes a Spark DataFrame (pyspark.sql.DataFrame), got {type(df).__name__}")


def _keyed_entry(e: TableEntry, what: str) -> TableEntry:
    if e.primary_key is None:
        raise InvalidUsage(
            f"table {e.name!r} has no primary key, so it cannot {what} by key; write a DataFrame into it "
            f"with df.write.format('txns')...save({e.name!r}) or t.insert({e.name!r}, df), or create a keyed "
            f"table (primary_key=[...])"
        )
    return e


def _conform(e: TableEntry, df: DataFrame, delete_column: str | None) -> DataFrame:
    """``df``'s table columns cast to the table's Spark types (plus ``_DEL``), or SchemaMismatch; no job."""
    from pyspark.sql.types import BooleanType, StructType

    schema = data_schema(e.schema, e.primary_key)
    fields = [f for f in df.schema.fields if f.name != delete_column]
    if delete_column is not None:
        have = df.schema.fieldNames()
        if delete_column not in have:
            raise SchemaMismatch(
                f"table {e.name!r}: the DataFrame has no column {delete_column!r} (delete_column); "
                f"its columns are {have}"
            )
        if delete_column in e.schema.names:
            raise SchemaMismatch(
                f"table {e.name!r}: delete_column {delete_column!r} is a column of the table; name the "
                f"delete flag column differently"
            )
        dt = df.schema[delete_column].dataType
        if not isinstance(dt, BooleanType):
            raise SchemaMismatch(
                f"table {e.name!r}: delete_column {delete_column!r} must be boolean (true: delete the key), "
                f"got {dt.simpleString()}"
            )
    if "diff" in [f.name for f in fields]:
        raise SchemaMismatch(
            f"table {e.name!r}: the DataFrame has a column 'diff', which the table does not; "
            f"its columns are {list(e.schema.names)}"
        )
    try:
        check_columns(StructType(fields), schema, e.data_id)
    except SchemaMismatch as x:
        raise SchemaMismatch(f"table {e.name!r}: {x}. Nothing was written") from None
    cols = [col(f.name).cast(spark_type(f)).alias(f.name) for f in schema.arrow if f.name in schema.key_names]
    if delete_column is not None:
        cols.append(col(delete_column).alias(_DEL))
    return df.select(*cols)


def _check_updates(
    e: TableEntry,
    src: DataFrame,
    *,
    deleting: bool,
    verb: str = "merge",
    nothing: str = "Nothing was merged",
) -> tuple[Any, Any]:
    """Check ``src`` (conformed) with two jobs; return the first key column's least and greatest bound values.

    (None, None) when ``src`` is empty.
    """
    from pyspark.sql import functions as F

    assert e.primary_key is not None
    pk = list(e.primary_key)
    first = pk[0]
    upsert: Column = ~col(_DEL) if deleting else F.lit(True)
    strict = [f.name for f in e.schema if not f.nullable and f.name not in pk]
    aggs: list[Column] = [
        F.count(F.lit(1)).alias("n"),
        F.min(col(first)).alias("lo"),
        F.max(col(first)).alias("hi"),
        F.count_distinct(*[col(k) for k in pk]).alias("distinct"),  # (rows with a null key not counted)
    ]
    for j, k in enumerate(pk):
        aggs.append(F.count(F.when(col(k).isNull(), 1)).alias(f"k{j}"))
    for j, c in enumerate(strict):
        aggs.append(F.count(F.when(upsert & col(c).isNull(), 1)).alias(f"s{j}"))
    if deleting:
        aggs.append(F.count(F.when(col(_DEL).isNull(), 1)).alias("d"))
    try:
        r = src.agg(*aggs).collect()[0]
    except Exception as x:
        raise_from_spark(x)
        raise
    for j, k in enumerate(pk):
        if r[f"k{j}"]:
            raise InvalidPrimaryKey(
                f"table {e.name!r}: primary key column {k!r} must not be null, but {r[f'k{j}']} row(s) of the "
                f"DataFrame are. {nothing}"
            )
    if deleting and r["d"]:
        raise SchemaMismatch(
            f"table {e.name!r}: the delete column has {r['d']} null(s); give true (delete) or false (upsert) "
            f"for every row. {nothing}"
        )
    for j, c in enumerate(strict):
        if r[f"s{j}"]:
            raise SchemaMismatch(
                f"table {e.name!r}: column {c!r} is not nullable, but {r[f's{j}']} row(s) to {verb} have a null "
                f"there. {nothing}"
            )
    if not r["n"]:
        return None, None
    dup = (
        []
        if r["distinct"] == r["n"]
        else src.groupBy(*[col(k) for k in pk]).count().where(F.col("count") > 1).limit(1).collect()
    )
    if dup:
        key = tuple(dup[0][n] for n in pk)
        raise DuplicateKey(
            f"table {e.name!r}: the DataFrame has key {describe_key(e, key)} more than once "
            f"({dup[0]['count']} rows); a keyed table holds one row per key. {nothing}"
        )
    typ = e.schema.field(first).type
    return _bound(r["lo"], typ), _bound(r["hi"], typ)


def _bound(value: Any, typ: pa.DataType) -> Any:
    """A Spark min/max of the first key column as a part bound value (None: not comparable)."""
    try:
        return bound_value(pa.scalar(value, typ))
    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError, OverflowError, TypeError):
        return None


def _existing(src: DataFrame, url: str, schema: Schema, runs: tuple[Run, ...], ts: int) -> DataFrame:
    """The table's rows at ``ts`` in ``runs`` (consolidated: positive multiplicity), without ``diff``."""
    from pyspark.sql import functions as F

    spark = src.sparkSession
    names = schema.key_names + schema.val_names
    if not runs:
        return spark.createDataFrame([], spark_struct(list(schema.key) + list(schema.val)))
    rows = read_plan(spark, url, schema, runs, ts)
    if not (len(runs) == 1 and runs[0].distinct_kv):  # (one compacted run is consolidated already)
        rows = rows.groupBy(*[col(n) for n in names]).agg(F.sum(_DIFF).alias(_DIFF))
    return rows.where(F.col(_DIFF) > 0).select(*[col(n) for n in names])


def _signed_counts(changes: DataFrame) -> tuple[int, int]:
    from pyspark.sql import functions as F

    try:
        r = changes.agg(
            F.count(F.when(F.col(_DIFF) > 0, 1)).alias("a"), F.count(F.when(F.col(_DIFF) < 0, 1)).alias("r")
        ).collect()[0]
    except Exception as x:
        raise_from_spark(x)
        raise
    return int(r["a"]), int(r["r"])


def _write(df: DataFrame, url: str, data_id: str, schema: Schema) -> Batch:
    return write_batch(df, url, data_id, schema)


__all__ = ["MergeStats", "insert_keyed", "merge", "prune_range"]
