"""``db.sql`` and ``txns.duckdb.connect``: DuckDB over every table at one timestamp; DuckDB on a table variable."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pyarrow as pa
import pytest

import txns
import txns.duckdb
from persist import InvalidUsage
from tests import helpers

duckdb = pytest.importorskip("duckdb")

ACCOUNTS = pa.schema([("id", pa.string()), ("balance", pa.int64())])
TOTAL = 1000


def bank(db: txns.Database) -> None:
    db.create_table("a", ACCOUNTS)
    db.create_table("b", ACCOUNTS)
    with db.transaction() as t:
        t.insert("a", [{"id": "x", "balance": TOTAL}])
        t.insert("b", [{"id": "x", "balance": 0}])


def test_sql_joins_tables_at_one_time_and_as_of_the_past(db: txns.Database) -> None:
    bank(db)
    before = db.latest()
    with db.transaction() as t:  # a transfer of 300 from a to b, both tables in one commit
        t.retract("a", [{"id": "x", "balance": TOTAL}])
        t.insert("a", [{"id": "x", "balance": TOTAL - 300}])
        t.retract("b", [{"id": "x", "balance": 0}])
        t.insert("b", [{"id": "x", "balance": 300}])
    q = "SELECT a.balance AS a, b.balance AS b FROM a JOIN b USING (id)"
    assert db.sql(q).fetchall() == [(TOTAL - 300, 300)]
    assert db.sql(q, as_of=before).fetchall() == [(TOTAL, 0)]
    assert db.sql("SELECT sum(balance) AS s FROM A").fetchall() == [(TOTAL - 300,)]  # (case-insensitive)
    con = txns.duckdb.connect(db, as_of=before)
    assert sorted(r[0] for r in con.sql("SHOW TABLES").fetchall()) == ["a", "b"]
    assert con.sql("SELECT b.balance FROM b").fetchall() == [(0,)]
    assert db.sql("SELECT 42").fetchall() == [(42,)]  # no table named: plain DuckDB


def test_sql_refusals(db: txns.Database) -> None:
    bank(db)
    with pytest.raises(InvalidUsage, match="SQL string"):
        db.sql("  ")
    with pytest.raises(duckdb.ParserException):
        db.sql("SELEC nonsense FROM a")
    with pytest.raises(duckdb.CatalogException):
        db.sql("SELECT * FROM no_such_table")


def test_duckdb_on_a_table_variable_and_snapshot_tables(db: txns.Database) -> None:
    bank(db)
    a = db.table("a")
    assert duckdb.sql("SELECT balance FROM a").fetchall() == [(TOTAL,)]
    assert pa.table(a).to_pylist() == [{"id": "x", "balance": TOTAL}]
    with db.read() as r:
        pinned = r.table("b")
        with db.transaction() as t:
            t.insert("b", [{"id": "y", "balance": 5}])
        assert pa.table(pinned).num_rows == 1  # the read's time, not the latest
        assert duckdb.sql("SELECT count(*) FROM pinned").fetchall() == [(1,)]
    assert pa.table(db.table("b")).num_rows == 2


WRITER = textwrap.dedent(
    """
    import random, sys, time
    import txns
    db = txns.connect(sys.argv[1], create=False)
    deadline = time.monotonic() + float(sys.argv[2])
    n = 0
    while time.monotonic() < deadline:
        def move(t):
            a, b = t.get("a", "x")["balance"], t.get("b", "x")["balance"]
            k = random.randint(-a, b) if a or b else 0
            t.update("a", "x", {"balance": a + k})
            t.update("b", "x", {"balance": b - k})
        db.run(move)
        n += 1
    print(n)
    db.close()
    """
)


def test_every_join_sees_one_snapshot_while_another_process_commits(tmp_path: Path) -> None:
    url = helpers.file_url(tmp_path / "db")
    db = txns.connect(url)
    db.create_table("a", ACCOUNTS, primary_key=["id"])
    db.create_table("b", ACCOUNTS, primary_key=["id"])
    with db.transaction() as t:
        t.insert("a", [{"id": "x", "balance": TOTAL}])
        t.insert("b", [{"id": "x", "balance": 0}])
    writer = subprocess.Popen(
        [sys.executable, "-c", WRITER, url, "3"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        queries = 0
        while writer.poll() is None or queries < 3:
            got = db.sql("SELECT a.balance + b.balance AS total, a.balance AS a FROM a JOIN b USING (id)").fetchall()
            assert len(got) == 1 and got[0][0] == TOTAL, got  # the invariant holds in every snapshot
            queries += 1
            time.sleep(0.01)
        out, err = writer.communicate(timeout=60)
    finally:
        if writer.poll() is None:
            writer.kill()
            writer.wait()
        db.close()
    assert writer.returncode == 0, err
    print(f"{int(out)} transfers committed during {queries} queries")
    assert int(out) > 0 and queries >= 3  # (the writer committed transfers while the queries ran)


def test_views_read_direct_parts_with_duckdbs_parquet_reader(db: txns.Database) -> None:
    schema = pa.schema([("y", pa.int64()), ("x", pa.int64()), ("d", pa.duration("s"))])
    db.create_table("p", schema.remove(2))
    db.create_table("q", schema)  # (a duration: Parquet stores it as an integer, so Arrow reads this one)
    for i in range(4):
        with db.transaction() as t:
            ys = list(range(i * 10, i * 10 + 10))
            t.insert("p", pa.table({"y": ys, "x": ys}))
            t.insert("q", pa.table({"y": ys, "x": ys, "d": pa.array(ys, pa.duration("s"))}))
    with db.transaction() as t:  # a retraction in one part's range: that part is consolidated
        t.retract("p", [{"y": 5, "x": 5}])
        t.retract("q", pa.table({"y": [5], "x": [5], "d": pa.array([5], pa.duration("s"))}))
    con = txns.duckdb.connect(db)
    plan_p = "\n".join(r[1] for r in con.sql("EXPLAIN SELECT sum(x) FROM p WHERE y > 30").fetchall())
    plan_q = "\n".join(r[1] for r in con.sql("EXPLAIN SELECT sum(x) FROM q WHERE y > 30").fetchall())
    assert "PARQUET" in plan_p.upper() and "PARQUET" not in plan_q.upper()
    for name in ("p", "q"):
        want = sorted(db.table(name).to_arrow(columns=["y", "x"]).to_pylist(), key=lambda r: r["y"])
        got = con.sql(f"SELECT y, x FROM {name} ORDER BY y").fetchall()
        assert got == [(r["y"], r["x"]) for r in want] and len(got) == 39
        assert con.sql(f"SELECT sum(x) FROM {name} WHERE y < 10").fetchall() == [(sum(range(10)) - 5,)]
    assert con.sql("SELECT d FROM q WHERE y = 7").fetchall()[0][0].total_seconds() == 7
