"""Compaction of a database's tables by name with Spark: ``txns.spark.compact_tables`` and ``txns compact --spark``."""

from __future__ import annotations

import io
import json
from collections import Counter
from pathlib import Path

import pyarrow as pa
import pytest

import txns
import txns.spark
from txns.cli import main
from txns.db.errors import TableNotFound

pytestmark = pytest.mark.spark

SCHEMA = pa.schema([("k", pa.int64()), ("v", pa.string())])


def rows(t: pa.Table) -> Counter:
    return Counter(tuple(r.values()) for r in t.to_pylist())


def churned(url: str) -> txns.Database:
    """A database with tables ``a`` and ``b``, each written by several transactions with retractions."""
    db = txns.connect(url, retention=__import__("datetime").timedelta(seconds=0))
    db.create_table("a", SCHEMA)
    db.create_table("b", SCHEMA)
    for i in range(6):
        with db.transaction() as t:
            t.insert("a", [{"k": j, "v": f"a{i}"} for j in range(i, i + 8)])
            t.insert("b", [{"k": i, "v": "b"}])
            if i:
                t.retract("a", [{"k": i - 1, "v": f"a{i - 1}"}])
    return db


def test_compact_tables_merges_the_named_tables_and_keeps_their_contents(spark, tmp_path: Path) -> None:
    db = churned(f"file://{tmp_path}/db")
    try:
        before = {n: rows(db.table(n).to_arrow()) for n in ("a", "b")}
        with pytest.raises(TableNotFound, match="nope"):
            txns.spark.compact_tables(spark, db, ["nope"])
        report = txns.spark.compact_tables(spark, db, ["a"])
        assert list(report) == ["a"]
        assert report["a"]["after"]["batches"] == 1 and report["a"]["after"]["parts"] >= 1, report  # written by Spark
        assert report["a"]["after"]["rows"] < report["a"]["before"]["rows"]  # retractions consolidated away
        # b was not asked for: its few rows stay inline (a Spark merge always writes parts)
        assert db.client.inspect(db.entry("b", db.latest()).data_id)["parts"] == 0
        assert {n: rows(db.table(n).to_arrow()) for n in ("a", "b")} == before
    finally:
        db.close()


def test_cli_compact_with_spark_takes_table_names(spark, tmp_path: Path) -> None:
    url = f"file://{tmp_path}/db"
    db = churned(url)
    before = rows(db.table("b").to_arrow())
    db.close()
    out, err = io.StringIO(), io.StringIO()
    assert main(["compact", url, "--spark", "--table", "b", "--json"], out, err) == 0, err.getvalue()
    report = json.loads(out.getvalue())
    assert list(report["tables"]) == ["b"]
    assert report["tables"]["b"]["batches"][1] == 1
    db = txns.connect(url, create=False)
    try:
        assert rows(db.table("b").to_arrow()) == before
    finally:
        db.close()
    bad = io.StringIO()
    assert main(["compact", url, "--table", "zzz"], io.StringIO(), bad) != 0
    assert "zzz" in bad.getvalue()
