"""Every Spark write path lands whole or not at all (issue 24).

For each path (append, overwrite, merge, the streaming sink, a DataFrame in
``db.transaction()``) a fault is injected between staging the data and
committing it: a job that fails part-way (Spark's ``raise_error`` in one
row, after other tasks wrote their parts), an exception just before the
commit, or a commit that landed but whose caller saw a failure (Spark then
calls the writer's ``abort``, as it does after a ``commit`` that raised).
Afterwards every commit in ``db.history()`` reads as one of the states the
writes allow (the old state or the whole new one, never a part of it, nor
retractions without their rows), and the latest read is the expected one.
The idle-handle test is the Spark form of the empty overwrite: a handle
idle past its lease while others appended, compacted and overwrote.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pytest

import txns
from persist import InvalidUsage, PersistConfig
from txns.spark.merge import _merge
from txns.spark.table_write import TableStreamWriter, TableWriter, stream_progress

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

pytestmark = pytest.mark.spark

ITEMS = pa.schema([("id", pa.int64()), ("item", pa.string())])
SPARK_ITEMS = "id long, item string"
ACCOUNTS = pa.schema([pa.field("account", pa.string(), nullable=False), ("balance", pa.int64())])
SPARK_ACCOUNTS = "account string, balance long"
FAULT_ID = 13
"""The row whose evaluation fails the job (``raise_error``)."""

State = list[tuple[Any, ...]]


@pytest.fixture
def db_url(tmp_path: Path) -> str:
    return f"file://{tmp_path}/db"


def items(lo: int, hi: int) -> State:
    return [(i, f"i{i}") for i in range(lo, hi)]


def frame(spark: SparkSession, data: State, schema: str = SPARK_ITEMS, *, fault: bool = False) -> DataFrame:
    """``data`` over 2 partitions; with ``fault``, evaluating row ``FAULT_ID`` fails its task."""
    from pyspark.sql import functions as F

    df = spark.createDataFrame(data, schema).repartition(2)
    if fault:
        bad = F.raise_error(F.lit("injected fault"))
        df = df.withColumn("item", F.when(F.col("id") == FAULT_ID, bad.cast("string")).otherwise(F.col("item")))
    return df


def read(db: txns.Database, table: str, ts: int | None = None) -> State:
    return sorted(tuple(r.values()) for r in db.table(table).to_arrow(ts).to_pylist())


def assert_each_commit_whole(url: str, table: str, allowed: list[State], latest: State) -> None:
    """Read ``table`` (with a fresh handle) at every commit of its history: each is an ``allowed`` state."""
    with txns.connect(url, create=False) as db:
        want = [sorted(s) for s in allowed]
        for ts in db.history(table).column("ts").to_pylist():
            got = read(db, table, ts)
            assert got in want, f"at {ts}: {got} is none of the states the writes allow"
        assert read(db, table) == sorted(latest)


def schema_of(spark: SparkSession, schema: str) -> Any:
    return spark.createDataFrame([], schema).schema


def arrow_rows(data: State, schema: pa.Schema) -> pa.RecordBatch:
    return pa.RecordBatch.from_pylist([dict(zip(schema.names, r, strict=True)) for r in data], schema=schema)


# ---- df.write append / overwrite ---------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["append", "overwrite"])
def test_batch_write_job_failing_part_way_commits_nothing(spark: SparkSession, db_url: str, mode: str) -> None:
    db = txns.connect(db_url)
    db.create_table("items", ITEMS)
    with db.transaction() as t:
        t.insert("items", [dict(zip(ITEMS.names, r, strict=True)) for r in items(0, 5)])
    before = len(db.history("items"))
    df = frame(spark, items(10, 20), fault=True)
    with pytest.raises(Exception, match="injected fault"):
        df.write.format("txns").option("url", db_url).mode(mode).save("items")
    assert len(db.history("items")) == before
    assert_each_commit_whole(db_url, "items", [[], items(0, 5)], items(0, 5))
    # the same write without the fault lands whole
    frame(spark, items(10, 20)).write.format("txns").option("url", db_url).mode(mode).save("items")
    new = items(10, 20) if mode == "overwrite" else items(0, 5) + items(10, 20)
    assert_each_commit_whole(db_url, "items", [[], items(0, 5), new], new)
    db.close()


@pytest.mark.parametrize("overwrite", [False, True])
def test_batch_commit_that_landed_survives_abort(spark: SparkSession, db_url: str, overwrite: bool) -> None:
    """Spark calls ``abort`` after a ``commit`` that raised (its reply lost: it may have landed): keep the parts."""
    db = txns.connect(db_url)
    db.create_table("items", ITEMS)
    with db.transaction() as t:
        t.insert("items", [dict(zip(ITEMS.names, r, strict=True)) for r in items(0, 3)])
    w = TableWriter({"url": db_url, "path": "items"}, schema_of(spark, SPARK_ITEMS), overwrite)
    msgs: list[Any] = [w.write(iter([arrow_rows(items(5, 8), ITEMS)])), w.write(iter([]))]
    w.commit(msgs)  # lands ...
    w.abort(msgs)  # ... and Spark, told it failed, aborts
    new = items(5, 8) if overwrite else items(0, 3) + items(5, 8)
    assert_each_commit_whole(db_url, "items", [[], items(0, 3), new], new)
    # an abort of a write that did not commit deletes its parts
    d = db.entry("items", db.latest()).data_id
    w2 = TableWriter({"url": db_url, "path": "items"}, schema_of(spark, SPARK_ITEMS), overwrite)
    m2 = w2.write(iter([arrow_rows(items(9, 10), ITEMS)]))
    root = Path(db_url.removeprefix("file://"))
    staged = {p["key"] for p in m2.parts}
    assert staged and all((root / "blob" / k).exists() for k in staged), d
    w2.abort([m2])
    assert not any((root / "blob" / k).exists() for k in staged)
    assert_each_commit_whole(db_url, "items", [[], items(0, 3), new], new)
    db.close()


def test_commit_refuses_a_message_that_is_not_its_parts(spark: SparkSession, db_url: str) -> None:
    from pyspark.sql.datasource import WriterCommitMessage

    db = txns.connect(db_url)
    db.create_table("items", ITEMS)
    w = TableWriter({"url": db_url, "path": "items"}, schema_of(spark, SPARK_ITEMS), True)
    m = w.write(iter([arrow_rows(items(0, 2), ITEMS)]))
    with pytest.raises(InvalidUsage, match="1 of 3 task"):
        w.commit([m, None, WriterCommitMessage()])
    assert len(db.history("items")) == 1  # the create only: no overwrite without its rows
    db.close()


def test_idle_handle_reads_a_spark_overwrite_whole(spark: SparkSession, db_url: str) -> None:
    """The empty overwrite of issue 24, through the data source (see tests/db/test_idle_handle_reads.py)."""
    idle = txns.connect(db_url, config=PersistConfig(reader_lease_s=0.2))
    idle.create_table("scratch", ACCOUNTS)
    idle.create_table("other", ACCOUNTS)
    with idle.transaction() as t:
        t.insert("scratch", [{"account": "old", "balance": 0}])
    assert read(idle, "scratch") == [("old", 0)]
    time.sleep(0.6)  # idle past its lease
    new = frame(spark, [("carol", 7)], SPARK_ACCOUNTS)
    new.write.format("txns").option("url", db_url).mode("append").save("scratch")
    with txns.connect(db_url, create=False) as busy:
        for i in range(18):  # (the busy handle's maintenance compacts the txns shard)
            with busy.transaction() as t:
                t.insert("other", [{"account": f"x{i}", "balance": i}])
    new.write.format("txns").option("url", db_url).mode("overwrite").save("scratch")
    assert read(idle, "scratch") == [("carol", 7)]
    assert_each_commit_whole(
        db_url, "scratch", [[], [("old", 0)], [("carol", 7), ("old", 0)], [("carol", 7)]], [("carol", 7)]
    )
    idle.close()


# ---- merge ---------------------------------------------------------------------------------------------


def test_merge_fault_before_commit_or_in_its_job_commits_nothing(spark: SparkSession, db_url: str) -> None:
    db = txns.connect(db_url)
    db.create_table("accounts", ACCOUNTS, primary_key=["account"])
    with db.transaction() as t:
        t.insert("accounts", [{"account": "a", "balance": 1}, {"account": "b", "balance": 2}])
    old = [("a", 1), ("b", 2)]
    updates = frame(spark, [("a", 10), ("c", 3)], SPARK_ACCOUNTS)

    def fault(t: Any, attempt: int) -> None:
        raise RuntimeError("injected fault before the commit")

    with pytest.raises(RuntimeError, match="injected fault"):
        _merge(db, "accounts", updates, before_commit=fault)
    from pyspark.sql import functions as F

    failing = updates.withColumn(
        "balance",
        F.when(F.col("account") == "c", F.raise_error(F.lit("injected fault")).cast("long")).otherwise(
            F.col("balance")
        ),
    )
    with pytest.raises(Exception, match="injected fault"):
        txns.spark.merge(db, "accounts", failing)
    assert_each_commit_whole(db_url, "accounts", [[], old], old)
    txns.spark.merge(db, "accounts", updates)
    new = [("a", 10), ("b", 2), ("c", 3)]
    assert_each_commit_whole(db_url, "accounts", [[], old, new], new)
    db.close()


# ---- t.insert(name, df) inside db.transaction() -----------------------------------------------------


def test_dataframe_in_transaction_lands_whole_or_not_at_all(spark: SparkSession, db_url: str) -> None:
    db = txns.connect(db_url)
    db.create_table("items", ITEMS)
    db.create_table("log", pa.schema([("what", pa.string())]))
    with pytest.raises(Exception, match="injected fault"), db.transaction() as t:
        t.insert("log", [{"what": "import"}])
        t.insert("items", frame(spark, items(10, 20), fault=True))  # its job fails part-way
    with pytest.raises(RuntimeError, match="injected fault"), db.transaction() as t:
        t.insert("items", frame(spark, items(10, 20)))  # staged ...
        t.insert("log", [{"what": "import"}])
        raise RuntimeError("injected fault after staging")  # ... never committed
    assert db.table("log").count() == 0
    with db.transaction() as t:
        t.insert("items", frame(spark, items(10, 20)))
        t.insert("log", [{"what": "import"}])
    assert_each_commit_whole(db_url, "items", [[], items(10, 20)], items(10, 20))
    assert_each_commit_whole(db_url, "log", [[], [("import",)]], [("import",)])
    db.close()


# ---- the streaming sink --------------------------------------------------------------------------------


def test_stream_batch_failing_part_way_commits_nothing(spark: SparkSession, db_url: str, tmp_path: Path) -> None:
    db = txns.connect(db_url)
    db.create_table("items", ITEMS)
    src = tmp_path / "in"
    src.mkdir()
    (src / "f0.json").write_text("".join(f'{{"id": {i}, "item": "i{i}"}}\n' for i in range(0, 5)))
    (src / "f1.json").write_text("".join(f'{{"id": {i}, "item": "i{i}"}}\n' for i in range(10, 20)))
    from pyspark.sql import functions as F

    stream = spark.readStream.schema(SPARK_ITEMS).option("maxFilesPerTrigger", 1).json(str(src))
    bad = F.raise_error(F.lit("injected fault")).cast("string")
    stream = stream.withColumn("item", F.when(F.col("id") == FAULT_ID, bad).otherwise(F.col("item")))
    q = (
        stream.writeStream.format("txns")
        .option("url", db_url)
        .option("checkpointLocation", str(tmp_path / "cp"))
        .trigger(availableNow=True)
        .start("items")
    )
    with pytest.raises(Exception, match="injected fault"):
        q.awaitTermination(300)
    assert_each_commit_whole(db_url, "items", [[], items(0, 5)], items(0, 5))
    db.close()


def test_stream_commit_that_landed_survives_abort(spark: SparkSession, db_url: str, tmp_path: Path) -> None:
    db = txns.connect(db_url)
    db.create_table("items", ITEMS)
    opts = {"url": db_url, "path": "items", "sinkId": "feed"}
    w = TableStreamWriter(opts, schema_of(spark, SPARK_ITEMS), False)
    m = w.write(iter([arrow_rows(items(0, 4), ITEMS)]))
    w.commit([m], 0)  # lands ...
    TableStreamWriter(opts, schema_of(spark, SPARK_ITEMS), False).abort([m], 0)  # ... then Spark aborts
    assert stream_progress(db, "feed") == 0
    assert_each_commit_whole(db_url, "items", [[], items(0, 4)], items(0, 4))
    # batch 1 fails before its commit: its abort deletes its parts
    m1 = w.write(iter([arrow_rows(items(7, 9), ITEMS)]))
    root = Path(db_url.removeprefix("file://"))
    w.abort([m1], 1)
    assert not any((root / "blob" / p["key"]).exists() for p in m1.parts)
    assert_each_commit_whole(db_url, "items", [[], items(0, 4)], items(0, 4))
    db.close()
