"""Spark writes to tables by name: ``df.write.format("txns")`` and ``t.insert(table, spark_df)``.

The reference is the Python API: the same rows inserted with ``t.insert``
into a twin table, compared with ``db.table(name).to_arrow()``. Bad input
must leave the database as it was: history unchanged and no part file left
under the table's data shard.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pytest

import txns
from persist import InvalidUsage, SchemaMismatch
from txns.db.errors import TableNotFound
from txns.spark.table_write import TableWriter

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

pytestmark = pytest.mark.spark

ORDERS = pa.schema([("id", pa.int64()), ("item", pa.string()), ("qty", pa.int32())])
SPARK_ORDERS = "id long, item string, qty int"


def rows(lo: int, hi: int, tag: str = "x") -> list[dict[str, Any]]:
    return [{"id": i, "item": f"{tag}{i}", "qty": i % 7} for i in range(lo, hi)]


def frame(spark: SparkSession, data: list[dict[str, Any]], schema: str = SPARK_ORDERS) -> DataFrame:
    names = [c.strip().split(" ")[0] for c in schema.split(",")]
    return spark.createDataFrame([tuple(r.get(n) for n in names) for r in data], schema).repartition(2)


def contents(db: txns.Database, name: str) -> list[dict[str, Any]]:
    return sorted(db.table(name).to_arrow().to_pylist(), key=lambda r: (r["id"], r["item"]))


def part_files(root: Path, data_id: str) -> set[str]:
    """Every stored file whose path names the data shard (its parts among them)."""
    return {str(p) for p in root.rglob("*") if p.is_file() and data_id in str(p)}


def save(df: DataFrame, url: str, table: str, mode: str = "append") -> None:
    df.write.format("txns").option("url", url).mode(mode).save(table)


@pytest.fixture
def db_url(tmp_path: Path) -> str:
    return f"file://{tmp_path}/db"


# ---- batch writes ----------------------------------------------------------------------------


def test_append_matches_python_inserts_one_commit_each(spark: SparkSession, db_url: str) -> None:
    db = txns.connect(db_url)
    db.create_table("orders", ORDERS)
    db.create_table("twin", ORDERS)
    writes: set[str] = set()
    for lo, hi in ((0, 40), (10, 20)):  # (10..20 again: a table without key keeps duplicates)
        before = len(db.history("orders"))
        save(frame(spark, rows(lo, hi)), db_url, "orders")
        with db.transaction() as t:
            t.insert("twin", rows(lo, hi))
        h = db.history("orders").to_pylist()
        assert len(h) == before + 1  # one atomic commit per write
        assert h[0]["rows_added"] == hi - lo and h[0]["rows_retracted"] == 0
        meta = json.loads(h[0]["metadata"])["spark"]
        write = meta.pop("write")  # (each write's own id: its abort looks for it)
        assert isinstance(write, str) and write not in writes
        writes.add(write)
        assert meta == {"mode": "append", "rows": hi - lo}
        assert contents(db, "orders") == contents(db, "twin")
    assert db.table("orders").count() == 40 + 10


def test_overwrite_replaces_contents_atomically(spark: SparkSession, db_url: str) -> None:
    db = txns.connect(db_url)
    db.create_table("orders", ORDERS)
    with db.transaction() as t:
        t.insert("orders", rows(0, 30, "old"))
    old_ts = db.latest()
    save(frame(spark, rows(100, 110, "new")), db_url, "orders", "overwrite")
    assert contents(db, "orders") == rows(100, 110, "new")
    h = db.history("orders").to_pylist()[0]
    assert (h["rows_added"], h["rows_retracted"]) == (10, 30)
    # one commit: no time at which the table was empty (the old rows are there right before it)
    assert contents(db, "orders") != [] and db.table("orders").count(as_of=h["ts"] - 1) == 30
    assert db.table("orders").count(as_of=old_ts) == 30
    # an empty overwrite empties the table
    save(frame(spark, []), db_url, "orders", "overwrite")
    assert contents(db, "orders") == []


def test_narrower_types_convert_and_other_modes_are_refused(spark: SparkSession, db_url: str) -> None:
    db = txns.connect(db_url)
    db.create_table("orders", ORDERS)
    save(frame(spark, rows(0, 5), "id int, item string, qty int"), db_url, "orders")  # int -> int64
    assert contents(db, "orders") == rows(0, 5)
    for mode in ("errorifexists", "ignore"):  # Spark refuses them for Python data sources
        with pytest.raises(Exception, match="UNSUPPORTED_DATA_SOURCE_SAVE_MODE"):
            save(frame(spark, rows(5, 6)), db_url, "orders", mode)
    assert db.table("orders").count() == 5


def _unchanged(db: txns.Database, root: Path, data_id: str, do: Callable[[], None], match: str) -> str:
    before_h = db.history().to_pylist()
    before_f = part_files(root, data_id)
    with pytest.raises(Exception, match=match) as info:
        do()
    assert db.history().to_pylist() == before_h
    assert part_files(root, data_id) == before_f
    return str(info.value)


def test_bad_input_writes_nothing(spark: SparkSession, db_url: str, tmp_path: Path) -> None:
    db = txns.connect(db_url)
    db.create_table("orders", ORDERS)
    db.create_table("accounts", pa.schema([("a", pa.string()), ("b", pa.int64())]), primary_key=["a"])
    d = db.entry("orders", db.latest()).data_id
    root = tmp_path / "db"
    good = frame(spark, rows(0, 5))
    msg = _unchanged(db, root, d, lambda: save(good, db_url, "nope"), "no table 'nope'")
    assert "create_table" in msg and "orders" in msg
    _unchanged(db, root, d, lambda: good.write.format("txns").mode("append").save("orders"), "needs the database URL")
    wrong = frame(spark, [{"id": 1, "thing": "a", "qty": 1}], "id long, thing string, qty int")
    msg = _unchanged(db, root, d, lambda: save(wrong, db_url, "orders"), "SchemaMismatch|do not match")
    assert "missing ['item']" in msg and "unexpected ['thing']" in msg
    keyed = frame(spark, [{"a": "k", "b": 1}], "a string, b long")
    _unchanged(db, root, d, lambda: save(keyed, db_url, "accounts"), r"txns\.spark\.merge")
    assert db.table("orders").count() == 0


def test_writer_checks_before_any_task(db_url: str, spark: SparkSession) -> None:
    """The constructor alone (as Spark's planning worker calls it) raises the typed errors."""
    db = txns.connect(db_url)
    db.create_table("orders", ORDERS)
    schema = frame(spark, rows(0, 1)).schema
    with pytest.raises(TableNotFound, match=r"create it first with db\.create_table"):
        TableWriter({"url": db_url, "path": "nope"}, schema, False)
    with pytest.raises(TableNotFound, match="no table 'nope'"):
        TableWriter({"url": db_url, "path": "nope"}, schema, True)  # overwrite of a missing table
    with pytest.raises(InvalidUsage, match="needs the database URL"):
        TableWriter({"path": "orders"}, schema, False)
    with pytest.raises(InvalidUsage, match="needs the table name"):
        TableWriter({"url": db_url}, schema, False)
    typed = frame(spark, [{"id": 1, "item": "a", "qty": "x"}], "id long, item string, qty string").schema
    with pytest.raises(SchemaMismatch, match="column 'qty' has Spark type string"):
        TableWriter({"url": db_url, "path": "orders"}, typed, False)
    diffed = frame(spark, [{"id": 1, "item": "a", "qty": 1, "diff": -1}], SPARK_ORDERS + ", diff long").schema
    with pytest.raises(SchemaMismatch, match="no column 'diff'"):
        TableWriter({"url": db_url, "path": "orders"}, diffed, False)
    with pytest.raises(InvalidUsage, match="in-memory"):
        TableWriter({"url": "mem://x", "path": "orders"}, schema, False)
    bad = frame(spark, [{"id": 1}], "id long").schema
    with pytest.raises(SchemaMismatch, match="missing"):
        TableWriter({"url": db_url, "path": "orders"}, bad, False)
    w = TableWriter({"URL": db_url, "Path": "orders"}, schema, True)  # options are case-insensitive
    assert w.target.table == "orders" and w.overwrite


def test_table_replaced_after_planning_fails_and_deletes_parts(
    spark: SparkSession, db_url: str, tmp_path: Path
) -> None:
    db = txns.connect(db_url)
    db.create_table("orders", ORDERS)
    df = frame(spark, rows(0, 8))
    w = TableWriter({"url": db_url, "path": "orders"}, df.schema, False)
    old = w.target.data_id
    msgs = [w.write(iter(b.to_batches())) for b in [pa.Table.from_pylist(rows(0, 4)), pa.Table.from_pylist(rows(4, 8))]]
    assert sum(m.rows for m in msgs) == 8 and part_files(tmp_path / "db", old)
    written = {p["key"] for m in msgs for p in m.parts}
    db.drop_table("orders")
    db.create_table("orders", ORDERS)
    with pytest.raises(TableNotFound, match="dropped or renamed"):
        w.commit(list(msgs))
    assert db.table("orders").count() == 0
    left = {f for f in part_files(tmp_path / "db", old) if any(k.rsplit("/", 1)[-1] in f for k in written)}
    assert not left


# ---- DataFrames in a transaction ------------------------------------------------------------------


def test_dataframes_and_python_rows_in_one_transaction(spark: SparkSession, db_url: str) -> None:
    db = txns.connect(db_url)
    db.create_table("orders", ORDERS)
    db.create_table("ledger", ORDERS)
    before = len(db.history())
    with db.transaction(metadata={"job": "import"}) as t:
        assert t.insert("orders", frame(spark, rows(0, 20))) == 20
        assert t.insert("ledger", frame(spark, rows(0, 3, "l"))) == 3
        assert t.insert("ledger", rows(3, 5, "p")) == 2  # Python rows mix in
        assert t.insert("orders", frame(spark, rows(20, 25))) == 5  # a second DataFrame into one table
    h = db.history().to_pylist()
    assert len(h) == before + 1 and h[0]["tables"] == ["ledger", "orders"] and h[0]["rows_added"] == 30
    assert contents(db, "orders") == rows(0, 25)
    assert contents(db, "ledger") == rows(0, 3, "l") + rows(3, 5, "p")
    with pytest.raises(InvalidUsage, match="written from a Spark DataFrame"), db.transaction() as t:
        t.insert("orders", frame(spark, rows(0, 1)))
        t.read("orders")  # not kept: cannot be read back here


def test_exception_inside_transaction_commits_nothing(spark: SparkSession, db_url: str, tmp_path: Path) -> None:
    db = txns.connect(db_url)
    db.create_table("orders", ORDERS)
    d = db.entry("orders", db.latest()).data_id
    before_h, before_f = db.history().to_pylist(), part_files(tmp_path / "db", d)
    with pytest.raises(RuntimeError, match="boom"), db.transaction() as t:
        t.insert("orders", frame(spark, rows(0, 50)))
        assert part_files(tmp_path / "db", d) - before_f  # the executors wrote parts
        raise RuntimeError("boom")
    assert db.history().to_pylist() == before_h
    assert db.table("orders").count() == 0
    assert part_files(tmp_path / "db", d) == before_f  # the abandoned transaction deleted them


def test_transaction_insert_bad_input(spark: SparkSession, db_url: str, tmp_path: Path) -> None:
    db = txns.connect(db_url)
    db.create_table("orders", ORDERS)
    with db.transaction() as t:
        with pytest.raises(SchemaMismatch, match="missing"):
            t.insert("orders", frame(spark, [{"id": 1}], "id long"))
        with pytest.raises(TableNotFound, match="no table 'nope'"):
            t.insert("nope", frame(spark, rows(0, 1)))
        t.insert("orders", rows(0, 2))  # the transaction is still usable
    assert contents(db, "orders") == rows(0, 2)
    mem = txns.connect("mem://txn-io-test")
    mem.create_table("orders", ORDERS)
    with pytest.raises(InvalidUsage, match="in-memory"), mem.transaction() as t:
        t.insert("orders", frame(spark, rows(0, 1)))
    assert mem.table("orders").count() == 0


# ---- S3 ----------------------------------------------------------------------------------------


@pytest.mark.s3
def test_append_and_overwrite_on_s3(spark: SparkSession, s3_url_factory: Callable[..., str]) -> None:
    url = s3_url_factory("db")
    db = txns.connect(url)
    db.create_table("orders", ORDERS)
    save(frame(spark, rows(0, 30)), url, "orders")
    with db.transaction() as t:
        t.insert("orders", frame(spark, rows(30, 35)))
    assert contents(db, "orders") == rows(0, 35)
    save(frame(spark, rows(7, 9)), url, "orders", "overwrite")
    assert contents(db, "orders") == rows(7, 9)


def test_overwrite_retries_a_conflict_with_the_same_parts(
    db_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A write racing the overwrite's truncate makes its commit conflict: it is rerun, parts reused, once."""
    from pyspark.sql.types import IntegerType, LongType, StringType, StructField, StructType

    from txns.db.transaction import Transaction
    from txns.spark.table_write import commit_batch, gather

    db = txns.connect(db_url)
    db.create_table("orders", ORDERS)
    with db.transaction() as t:
        t.insert("orders", rows(0, 5, "old"))
    schema = StructType(
        [StructField("id", LongType()), StructField("item", StringType()), StructField("qty", IntegerType())]
    )
    w = TableWriter({"url": db_url, "path": "orders"}, schema, True)
    msg = w.write(iter(pa.Table.from_pylist(rows(10, 13, "new"), ORDERS).to_batches()))
    batch, n = gather(w.target, [msg])
    other = txns.connect(db_url)
    truncate = Transaction.truncate
    calls: list[int] = []

    def racing_truncate(self: Transaction, table: str) -> int:
        calls.append(1)
        out = truncate(self, table)
        if len(calls) == 1:  # a concurrent append lands after this read, before the commit
            with other.transaction() as t2:
                t2.insert("orders", rows(99, 100, "racer"))
        return out

    monkeypatch.setattr(Transaction, "truncate", racing_truncate)
    commit_batch(w.target, batch, n, overwrite=True)
    assert len(calls) == 2  # the first attempt conflicted
    assert contents(db, "orders") == rows(10, 13, "new")  # the racer's row was truncated by the rerun
    assert len(db.history("orders")) == 4  # create, insert, racer, overwrite
