"""Tables into Polars (eager and lazy), pyarrow, DataFusion; the clear error without DuckDB."""

from __future__ import annotations

import re
import sys
from collections import Counter

import polars as pl
import pyarrow as pa
import pytest

import txns
from persist import InvalidUsage

SCHEMA = pa.schema([("y", pa.int64()), ("x", pa.int64())])


@pytest.fixture
def filled(db: txns.Database) -> txns.Database:
    db.create_table("t", SCHEMA)
    for i in range(4):
        with db.transaction() as t:
            t.insert("t", pa.table({"y": list(range(i * 10, i * 10 + 10)), "x": [i] * 10}, schema=SCHEMA))
    return db


def test_polars_lazy_pushes_down_and_matches_eager(filled: txns.Database) -> None:
    db = filled
    t = db.table("t")
    lf = t.to_polars(lazy=True)
    assert isinstance(lf, pl.LazyFrame)
    got = lf.filter(pl.col("y") >= 35).select("x").collect()
    assert got.to_dict(as_series=False) == {"x": [3] * 5}
    plan = lf.filter(pl.col("y") >= 35).select("x").explain()
    # Polars' own scan, the filter pushed into it (older Polars prints it as [(col("y")) >= (35)])
    assert "Parquet SCAN" in plan and 'SELECTION:col"y">=35' in re.sub(r"[\s\[\]()]", "", plan)
    with db.transaction() as tx:  # a retraction: the lazy frame over consolidated rows stays right
        tx.retract("t", [{"y": 0, "x": 0}])
    lazy = t.to_polars(lazy=True, columns=["y"]).collect()
    assert Counter(lazy["y"].to_list()) == Counter(t.to_polars(columns=["y"])["y"].to_list())
    assert lazy.height == 39
    with pytest.raises(InvalidUsage, match="lazy"):
        t.to_polars(lazy=True, filter=pa.compute.field("y") > 1)


def test_arrow_pycapsule_into_polars_pyarrow_and_datafusion(filled: txns.Database) -> None:
    db = filled
    t = db.table("t")
    assert pl.DataFrame(t).height == 40
    assert pa.table(t).schema == SCHEMA
    assert pa.schema(t) == SCHEMA  # __arrow_c_schema__
    datafusion = pytest.importorskip("datafusion")
    ctx = datafusion.SessionContext()
    ctx.register_dataset("t", t.to_dataset())
    assert ctx.sql("SELECT sum(x) AS s FROM t WHERE y >= 20").to_pydict() == {"s": [2 * 10 + 3 * 10]}
    df = ctx.from_arrow(t)
    assert df.count() == 40


def test_missing_duckdb_is_one_clear_error(db: txns.Database, monkeypatch: pytest.MonkeyPatch) -> None:
    import txns.duckdb

    monkeypatch.setitem(sys.modules, "duckdb", None)  # as if it were not installed: importing it fails
    with pytest.raises(ImportError, match=r"pip install 'txns\[duckdb\]'") as e:
        db.sql("SELECT 1")
    assert isinstance(e.value, txns.duckdb.EngineNotInstalled)
    with pytest.raises(txns.duckdb.EngineNotInstalled):
        txns.duckdb.connect(db)
