"""txns.spark.merge: MERGE of a Spark DataFrame into a keyed table, and the keyed insert of a DataFrame.

The reference is the Python API: the same upserts and deletes applied with
``t.upsert`` / ``t.delete`` to a twin table (and a dict model), compared with
``db.table(name).to_arrow()`` after each merge.
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pytest

import txns
from persist import InvalidUsage, PartRef, PersistConfig, Run, SchemaMismatch
from txns.db.errors import DuplicateKey, InvalidPrimaryKey, TableNotFound, TransactionConflict
from txns.db.transaction import Transaction
from txns.spark.merge import _merge, insert_keyed, merge, prune_range

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

pytestmark = pytest.mark.spark

ACCOUNTS = pa.schema([("account", pa.string()), ("balance", pa.int64()), ("note", pa.string())])
SPARK_ACCOUNTS = "account string, balance long, note string"
SPARK_ACCOUNTS_DEL = SPARK_ACCOUNTS + ", gone boolean"


def connect(tmp_path: Path) -> txns.Database:
    return txns.connect(f"file://{tmp_path}/db")


def rows_of(db: txns.Database, name: str, pk: list[str]) -> list[dict[str, Any]]:
    return sorted(db.table(name).to_arrow().to_pylist(), key=lambda r: tuple(r[k] for k in pk))


def model_rows(model: dict[Any, dict[str, Any]]) -> list[dict[str, Any]]:
    return [model[k] for k in sorted(model)]


def frame(spark: SparkSession, rows: list[dict[str, Any]], schema: str) -> DataFrame:
    names = [c.strip().split(" ")[0] for c in schema.split(",")]
    return spark.createDataFrame([tuple(r.get(n) for n in names) for r in rows], schema)


def accounts(db: txns.Database, name: str = "accounts", rows: list[dict[str, Any]] | None = None) -> None:
    db.create_table(name, ACCOUNTS, primary_key=["account"])
    if rows:
        with db.transaction() as t:
            t.upsert(name, rows)


# ---- against the Python API ------------------------------------------------------------------


def test_merges_match_python_upserts_and_deletes(spark: SparkSession, tmp_path: Path) -> None:
    db = connect(tmp_path)
    rnd = random.Random(7)
    start = [{"account": f"a{i:03d}", "balance": i, "note": None if i % 3 else f"n{i}"} for i in range(30)]
    accounts(db, "accounts", start)
    accounts(db, "twin", start)
    model = {r["account"]: r for r in start}
    for step in range(3):
        keys = rnd.sample([f"a{i:03d}" for i in range(45)], 20)  # existing and new keys
        upserts: list[dict[str, Any]] = []
        deletes: list[str] = []
        for k in keys:
            roll = rnd.random()
            if roll < 0.25:
                deletes.append(k)  # (some of them absent: nothing to delete)
            elif roll < 0.4 and k in model:
                upserts.append(dict(model[k]))  # unchanged: writes nothing
            else:
                upserts.append({"account": k, "balance": rnd.randrange(1000), "note": rnd.choice([None, f"s{step}"])})
        df_rows = [{**r, "gone": False} for r in upserts]
        df_rows += [{"account": k, "balance": None, "note": None, "gone": True} for k in deletes]
        before = db.history().num_rows
        info = merge(db, "accounts", frame(spark, df_rows, SPARK_ACCOUNTS_DEL), delete_column="gone")
        with db.transaction() as t:
            t.upsert("twin", upserts)
            t.delete("twin", deletes)
        expect_added = sum(1 for r in upserts if model.get(r["account"]) != r)
        expect_retracted = sum(1 for r in upserts if r["account"] in model and model[r["account"]] != r)
        expect_retracted += sum(1 for k in deletes if k in model)
        for r in upserts:
            model[r["account"]] = r
        for k in deletes:
            model.pop(k, None)
        assert info.ts is not None and info.attempts == 1
        assert info.tables["accounts"] == {"added": expect_added, "retracted": expect_retracted}
        assert db.history().num_rows == before + 2  # the merge is one commit
        got = rows_of(db, "accounts", ["account"])
        assert got == model_rows(model)
        assert got == rows_of(db, "twin", ["account"])
        assert db.table("accounts").changes(info.ts, info.ts + 1).num_rows == expect_added + expect_retracted


def test_compound_key_and_cast_columns(spark: SparkSession, tmp_path: Path) -> None:
    db = connect(tmp_path)
    schema = pa.schema([("region", pa.string()), ("id", pa.int32()), ("qty", pa.int64()), ("at", pa.date32())])
    db.create_table("stock", schema, primary_key=["region", "id"])
    import datetime as dt

    d0, d1 = dt.date(2026, 1, 1), dt.date(2026, 2, 1)
    with db.transaction() as t:
        t.upsert("stock", [{"region": r, "id": i, "qty": i, "at": d0} for r in ("eu", "us") for i in range(5)])
    # the same id in both regions: the compound key tells them apart; id given as a long (cast to int32)
    rows = [
        ("eu", 1, 100, d1, False),
        ("us", 1, 1, d0, False),  # unchanged
        ("us", 2, None, None, True),
        ("eu", 9, 9, d1, False),
        ("us", 9, None, None, True),  # absent: nothing
    ]
    df = spark.createDataFrame(rows, "region string, id long, qty long, at date, del boolean")
    info = merge(db, "stock", df, delete_column="del")
    assert info.tables["stock"] == {"added": 2, "retracted": 2}
    model = {(r, i): {"region": r, "id": i, "qty": i, "at": d0} for r in ("eu", "us") for i in range(5)}
    model[("eu", 1)] = {"region": "eu", "id": 1, "qty": 100, "at": d1}
    del model[("us", 2)]
    model[("eu", 9)] = {"region": "eu", "id": 9, "qty": 9, "at": d1}
    assert rows_of(db, "stock", ["region", "id"]) == model_rows(model)
    # a merge that changes nothing commits nothing
    again = merge(db, "stock", df.where("not del"), delete_column="del")
    assert again.ts is None and again.tables == {}


def test_merge_without_delete_column_and_empty_updates(spark: SparkSession, tmp_path: Path) -> None:
    db = connect(tmp_path)
    accounts(db, rows=[{"account": "a", "balance": 1, "note": None}])
    with db.transaction() as t:
        t.upsert("accounts", [{"account": "a", "balance": 3, "note": None}])
    db.compact()  # (the existing rows may come from one compacted, consolidated run)
    info = merge(db, "accounts", frame(spark, [{"account": "a", "balance": 2}, {"account": "b"}], SPARK_ACCOUNTS))
    assert info.tables["accounts"] == {"added": 2, "retracted": 1}
    assert rows_of(db, "accounts", ["account"]) == [
        {"account": "a", "balance": 2, "note": None},
        {"account": "b", "balance": None, "note": None},
    ]
    empty = merge(db, "accounts", spark.createDataFrame([], SPARK_ACCOUNTS))
    assert empty.ts is None
    accounts(db, "fresh")  # no rows yet: nothing to read, every row is new
    info = merge(db, "fresh", frame(spark, [{"account": "x", "balance": 1}], SPARK_ACCOUNTS))
    assert info.tables["fresh"] == {"added": 1, "retracted": 0}
    assert rows_of(db, "fresh", ["account"]) == [{"account": "x", "balance": 1, "note": None}]


# ---- pruning ---------------------------------------------------------------------------------


def test_prune_range_keeps_overlapping_unbounded_and_inline() -> None:
    def ref(lo: Any, hi: Any) -> PartRef:
        return PartRef(f"k{lo}-{hi}", 10, 100, 0, lo, hi)

    parts = (ref(0, 9), ref(10, 19), ref(20, 29), ref(None, None), ref("a", "b"))
    runs = (Run(parts=parts, rows=50), Run(inline=b"x", rows=1), Run(parts=(ref(30, 39),), rows=10))
    out = prune_range(runs, 12, 21)
    assert [p.key for p in out[0].parts] == ["k10-19", "k20-29", "kNone-None", "ka-b"]
    assert out[0].rows == 40 and out[1] == runs[1] and len(out) == 2
    assert prune_range(runs, None, None) == runs
    assert [p.key for r in prune_range(runs, 40, 50) for p in r.parts] == ["kNone-None", "ka-b"]


def test_merge_reads_only_the_parts_whose_bounds_overlap(spark: SparkSession, tmp_path: Path) -> None:
    db = txns.connect(f"file://{tmp_path}/db", config=PersistConfig(compaction_enabled=False))
    schema = pa.schema([("id", pa.int64()), ("v", pa.string())])
    db.create_table("t", schema, primary_key=["id"])
    for lo in (0, 100, 200):  # three commits of disjoint key ranges, written by executors as parts
        with db.transaction() as t:
            df = spark.range(lo, lo + 50, numPartitions=1).selectExpr("id", "cast(id as string) as v")
            assert insert_keyed(t, "t", df) == 50
    df = spark.createDataFrame(
        [(105, "x", False), (110, None, True), (160, "new", False)], "id long, v string, d boolean"
    )
    info, stats = _merge(db, "t", df, delete_column="d")
    assert stats.parts_total == 3 and stats.parts_read == 1
    assert (stats.added, stats.retracted) == (2, 2) and stats.parts_written >= 1 and stats.bytes_written > 0
    model = {i: str(i) for r in (0, 100, 200) for i in range(r, r + 50)}
    model[105], model[160] = "x", "new"
    del model[110]
    assert rows_of(db, "t", ["id"]) == [{"id": k, "v": model[k]} for k in sorted(model)]
    assert info.tables["t"] == {"added": 2, "retracted": 2}


# ---- concurrency -----------------------------------------------------------------------------


def test_concurrent_writer_makes_the_merge_start_over(spark: SparkSession, tmp_path: Path) -> None:
    db = connect(tmp_path)
    accounts(db, rows=[{"account": a, "balance": 10, "note": None} for a in "abc"])
    order: list[str] = []

    def writer(t: Transaction, attempt: int) -> None:
        if attempt == 1:  # between the merge's read and its commit, another transaction writes the table
            with db.transaction() as w:
                w.upsert(
                    "accounts",
                    [{"account": "a", "balance": 99, "note": "w"}, {"account": "d", "balance": 4, "note": None}],
                )
            order.append("writer")
        order.append(f"merge attempt {attempt}")

    rows: list[dict[str, Any]] = [
        {"account": "a", "balance": 11, "gone": False},
        {"account": "d", "balance": None, "gone": True},
        {"account": "e", "balance": 5, "gone": False},
    ]
    info, stats = _merge(
        db, "accounts", frame(spark, rows, SPARK_ACCOUNTS_DEL), delete_column="gone", before_commit=writer
    )
    assert order == ["writer", "merge attempt 1", "merge attempt 2"]
    assert info.attempts == 2
    # the writer committed first, then the merge (re-run on its result: d is deleted, a retracted as 99)
    assert (stats.added, stats.retracted) == (2, 2)
    assert rows_of(db, "accounts", ["account"]) == [
        {"account": "a", "balance": 11, "note": None},
        {"account": "b", "balance": 10, "note": None},
        {"account": "c", "balance": 10, "note": None},
        {"account": "e", "balance": 5, "note": None},
    ]
    assert info.read_ts is not None and info.ts is not None
    writer_ts = db.history()["ts"].to_pylist()[1]
    assert info.read_ts >= writer_ts and info.ts > writer_ts


def test_conflict_after_the_retries_raises_and_commits_nothing(spark: SparkSession, tmp_path: Path) -> None:
    db = connect(tmp_path)
    accounts(db, rows=[{"account": "a", "balance": 1, "note": None}])
    n = 0

    def writer(t: Transaction, attempt: int) -> None:
        nonlocal n
        n += 1
        with db.transaction() as w:
            w.upsert("accounts", [{"account": "a", "balance": 100 + n, "note": None}])

    with pytest.raises(TransactionConflict) as e:
        _merge(
            db,
            "accounts",
            frame(spark, [{"account": "a", "balance": 7}], SPARK_ACCOUNTS),
            retries=1,
            before_commit=writer,
        )
    assert e.value.attempts == 2 and n == 2
    assert rows_of(db, "accounts", ["account"]) == [{"account": "a", "balance": 102, "note": None}]
    assert db.history()["rows_added"].to_pylist()[:2] == [1, 1]  # the writers' commits only


# ---- errors: nothing written -----------------------------------------------------------------


def test_errors_write_nothing(spark: SparkSession, tmp_path: Path) -> None:
    db = connect(tmp_path)
    accounts(db, rows=[{"account": "a", "balance": 1, "note": None}])
    db.create_table("log", ACCOUNTS)
    before = db.history()
    ok = frame(spark, [{"account": "b", "balance": 2}], SPARK_ACCOUNTS)
    with pytest.raises(InvalidUsage, match=r"no primary key.*t\.insert"):
        merge(db, "log", ok)
    with pytest.raises(TableNotFound, match="nope"):
        merge(db, "nope", ok)
    dup = frame(
        spark, [{"account": "b", "balance": 2}, {"account": "c"}, {"account": "b", "balance": 3}], SPARK_ACCOUNTS
    )
    with pytest.raises(DuplicateKey, match=r"'account': 'b'.*more than once"):
        merge(db, "accounts", dup)
    with pytest.raises(InvalidPrimaryKey, match="'account' must not be null"):
        merge(db, "accounts", frame(spark, [{"account": None, "balance": 2}], SPARK_ACCOUNTS))
    with pytest.raises(SchemaMismatch, match="missing \\['note'\\]"):
        merge(db, "accounts", spark.createDataFrame([("b", 1)], "account string, balance long"))
    with pytest.raises(SchemaMismatch, match="unexpected \\['extra'\\]"):
        merge(db, "accounts", spark.createDataFrame([("b", 1, "x", 1)], SPARK_ACCOUNTS + ", extra int"))
    with pytest.raises(SchemaMismatch, match="'balance' has Spark type string"):
        merge(db, "accounts", spark.createDataFrame([("b", "1", "x")], "account string, balance string, note string"))
    with pytest.raises(SchemaMismatch, match="no column 'gone'"):
        merge(db, "accounts", ok, delete_column="gone")
    with pytest.raises(SchemaMismatch, match="must be boolean"):
        merge(
            db,
            "accounts",
            spark.createDataFrame([("b", 1, "x", 1)], SPARK_ACCOUNTS + ", gone int"),
            delete_column="gone",
        )
    with pytest.raises(InvalidUsage, match="Spark DataFrame"):
        merge(db, "accounts", [{"account": "b"}])  # type: ignore[arg-type]
    assert db.history().equals(before)
    assert rows_of(db, "accounts", ["account"]) == [{"account": "a", "balance": 1, "note": None}]


# ---- insert_keyed ----------------------------------------------------------------------------


def test_insert_keyed_refuses_existing_and_repeated_keys(spark: SparkSession, tmp_path: Path) -> None:
    db = connect(tmp_path)
    accounts(db, rows=[{"account": "a", "balance": 1, "note": None}])
    with db.transaction() as t:
        assert insert_keyed(t, "accounts", frame(spark, [{"account": "b", "balance": 2}], SPARK_ACCOUNTS)) == 1
    before = db.history()
    cases: list[tuple[list[dict[str, Any]], str]] = [
        ([{"account": "c"}, {"account": "a", "balance": 5}], "already has a row with key {'account': 'a'}"),
        ([{"account": "c"}, {"account": "c"}], "key {'account': 'c'} more than once"),
    ]
    for rows, pattern in cases:
        with pytest.raises(DuplicateKey, match=re.escape(pattern)), db.transaction() as t:
            insert_keyed(t, "accounts", frame(spark, rows, SPARK_ACCOUNTS))
    with db.transaction() as t:  # after a Python write by key in the same transaction: refused
        t.upsert("accounts", [{"account": "z", "balance": 0, "note": None}])
        with pytest.raises(InvalidUsage, match="already written by key"):
            insert_keyed(t, "accounts", frame(spark, [{"account": "y"}], SPARK_ACCOUNTS))
    assert db.history().num_rows == before.num_rows + 1
    assert [r["account"] for r in rows_of(db, "accounts", ["account"])] == ["a", "b", "z"]


def test_insert_keyed_after_truncate_and_into_a_new_table(spark: SparkSession, tmp_path: Path) -> None:
    db = connect(tmp_path)
    accounts(db, rows=[{"account": "a", "balance": 1, "note": None}])
    with db.transaction() as t:
        t.truncate("accounts")  # the committed "a" is gone for this transaction: inserting it again is fine
        assert insert_keyed(t, "accounts", frame(spark, [{"account": "a", "balance": 2}], SPARK_ACCOUNTS)) == 1
    assert rows_of(db, "accounts", ["account"]) == [{"account": "a", "balance": 2, "note": None}]


# ---- S3 --------------------------------------------------------------------------------------


@pytest.mark.s3
def test_merge_on_s3(spark: SparkSession, s3_url_factory: Callable[..., str]) -> None:
    db = txns.connect(s3_url_factory())
    accounts(db, rows=[{"account": f"a{i}", "balance": i, "note": None} for i in range(10)])
    rows = [{"account": "a1", "balance": 100, "gone": False}, {"account": "a2", "gone": True}]
    rows.append({"account": "b", "balance": 7, "gone": False})
    info = merge(db, "accounts", frame(spark, rows, SPARK_ACCOUNTS_DEL), delete_column="gone")
    assert info.tables["accounts"] == {"added": 2, "retracted": 2}
    model = {f"a{i}": {"account": f"a{i}", "balance": i, "note": None} for i in range(10)}
    model["a1"]["balance"] = 100
    del model["a2"]
    model["b"] = {"account": "b", "balance": 7, "note": None}
    assert rows_of(db, "accounts", ["account"]) == model_rows(model)
