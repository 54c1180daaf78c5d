"""The database API end to end (txns.connect): on a local directory and on S3 (moto).

Every test checks values the code must get right: rows read back, their
schema, the timestamps chosen, what history says, and what time travel
returns at each commit.
"""

from __future__ import annotations

import datetime as dt
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from pathlib import Path

import pandas as pd
import polars as pl
import pyarrow as pa
import pyarrow.compute as pc
import pytest

import txns
from persist import PersistConfig, ReadTimeout
from tests.seaweedfs import DURABLE_KINDS
from txns.db import clock

ACCOUNTS = pa.schema([pa.field("account", pa.string(), nullable=False), pa.field("balance", pa.int64())])
ORDERS = pa.schema([("id", pa.int32()), ("item", pa.string()), ("price", pa.float64())])


def rows(table: pa.Table) -> Counter:
    """A table's rows as a multiset (order-free comparison)."""
    return Counter(tuple(sorted(r.items())) for r in table.to_pylist())


def balances(db: txns.Database, as_of: object = None) -> dict[str, int]:
    return {r["account"]: r["balance"] for r in db.table("accounts").to_arrow(as_of=as_of).to_pylist()}


@pytest.mark.parametrize("durable_url", DURABLE_KINDS, indirect=True)
def test_end_to_end(durable_url: str) -> None:
    db = txns.connect(durable_url)
    assert db.tables() == []
    accounts = db.create_table("accounts", ACCOUNTS)
    assert accounts.schema == ACCOUNTS
    before = clock.system_ms()
    with db.transaction(metadata={"job": "open"}) as t:
        t.create_table("orders", ORDERS)
        assert (
            t.insert(
                "orders", pa.table({"id": pa.array([1, 2], pa.int32()), "item": ["pen", "ink"], "price": [1.5, 2.0]})
            )
            == 2
        )
        assert t.insert("accounts", [{"account": "alice", "balance": 100}, {"account": "bob", "balance": 0}]) == 2
    after = clock.system_ms()
    opened = t.commit_info
    assert opened is not None and opened.ts is not None
    assert before <= clock.wall_ms(opened.ts) <= after  # the commit time tracks the wall clock
    assert opened.time == clock.to_datetime(opened.ts)
    assert opened.tables == {"accounts": {"added": 2, "retracted": 0}, "orders": {"added": 2, "retracted": 0}}
    assert opened.operations == ("create orders",)
    time.sleep(0.005)
    between = dt.datetime.now(dt.UTC)
    time.sleep(0.005)

    with db.transaction(metadata={"job": "transfer"}) as t:
        t.retract("accounts", [{"account": "alice", "balance": 100}, {"account": "bob", "balance": 0}])
        t.insert("accounts", pd.DataFrame({"account": ["alice", "bob"], "balance": [70, 30]}))
    moved = t.commit_info
    assert moved is not None and moved.ts is not None and moved.ts > opened.ts

    # latest, by timestamp, by wall-clock time
    assert balances(db) == {"alice": 70, "bob": 30}
    assert balances(db, opened.ts) == {"alice": 100, "bob": 0}
    assert balances(db, between) == {"alice": 100, "bob": 0}
    assert balances(db, moved.time + dt.timedelta(milliseconds=1)) == {"alice": 70, "bob": 30}
    # results carry the table's schema exactly
    assert db.table("accounts").to_arrow().schema == ACCOUNTS
    orders = db.table("orders").to_arrow()
    assert orders.schema == ORDERS and rows(orders) == rows(
        pa.table({"id": pa.array([1, 2], pa.int32()), "item": ["pen", "ink"], "price": [1.5, 2.0]})
    )
    # pandas and Polars out
    pdf = db.table("accounts").to_pandas()
    assert sorted(zip(pdf["account"], pdf["balance"], strict=True)) == [("alice", 70), ("bob", 30)]
    pldf = db.table("accounts").to_polars()
    assert isinstance(pldf, pl.DataFrame) and sorted(pldf.rows()) == [("alice", 70), ("bob", 30)]
    # projection and filter
    only = db.table("accounts").to_arrow(columns=["balance"], filter=pc.field("balance") > 50)
    assert only.column_names == ["balance"] and only.column("balance").to_pylist() == [70]
    scanned = pa.Table.from_batches(list(db.table("accounts").scan(columns=["account"], as_of=opened.ts)))
    assert sorted(scanned.column("account").to_pylist()) == ["alice", "bob"]
    # changes with ts and diff
    ch = db.table("accounts").changes(opened.ts)
    assert ch.column_names == ["account", "balance", "ts", "diff"]
    got = sorted((r["ts"], r["account"], r["balance"], r["diff"]) for r in ch.to_pylist())
    assert got == sorted(
        [
            (opened.ts, "alice", 100, 1),
            (opened.ts, "bob", 0, 1),
            (moved.ts, "alice", 100, -1),
            (moved.ts, "bob", 0, -1),
            (moved.ts, "alice", 70, 1),
            (moved.ts, "bob", 30, 1),
        ]
    )
    assert db.table("accounts").changes(moved.ts, moved.ts).num_rows == 0
    assert {r["diff"] for r in db.table("accounts").changes(moved.ts).to_pylist()} == {1, -1}

    # DDL: rename then drop; both versioned
    db.rename_table("orders", "purchases")
    assert db.tables() == ["accounts", "purchases"]
    assert db.tables(as_of=opened.ts) == ["accounts", "orders"]
    assert rows(db.table("purchases").to_arrow()) == rows(orders)
    dropped_before = db.latest()
    db.drop_table("purchases")
    assert db.tables() == ["accounts"]
    with pytest.raises(txns.TableNotFound, match="purchases"):
        db.table("purchases")
    # reading a dropped table as of before the drop still works
    assert rows(db.table("accounts").db.table("accounts").to_arrow()) == rows(
        pa.table({"account": ["alice", "bob"], "balance": [70, 30]})
    )
    old = txns.Table(db, "purchases")
    assert rows(old.to_arrow(as_of=dropped_before)) == rows(orders)

    # history: newest first, with what each commit did
    h = db.history()
    assert h.schema == txns.db.HISTORY_SCHEMA
    ops = h.column("operations").to_pylist()
    assert ops == [["drop purchases"], ["rename orders purchases"], [], ["create orders"], ["create accounts"]]
    assert h.column("ts").to_pylist()[2:4] == [moved.ts, opened.ts]
    assert h.column("rows_added").to_pylist()[2:4] == [2, 4]
    assert h.column("rows_retracted").to_pylist()[2:4] == [2, 0]
    assert list(h.column("metadata").to_pylist()[2:4]) == ['{"job": "transfer"}', '{"job": "open"}']
    assert h.column("txn_id").to_pylist()[3] == opened.txn_id
    assert h.column("time").to_pylist()[3] == opened.time
    assert db.history(limit=2).column("operations").to_pylist() == [["drop purchases"], ["rename orders purchases"]]
    acc_hist = db.history(table="accounts")
    assert acc_hist.column("ts").to_pylist() == [moved.ts, opened.ts, h.column("ts").to_pylist()[4]]
    assert acc_hist.column("tables").to_pylist()[1] == ["accounts", "orders"]

    # another connection (fresh caches) sees the same database
    db2 = txns.connect(durable_url, create=False)
    assert db2.root.txns_id == db.root.txns_id
    assert balances(db2) == {"alice": 70, "bob": 30}
    assert balances(db2, opened.ts) == {"alice": 100, "bob": 0}
    assert db2.history().equals(db.history())
    db2.close()
    db.close()


def test_every_input_kind_gives_the_same_rows(db: txns.Database) -> None:
    expected = pa.table({"id": pa.array([1, 2, 3], pa.int32()), "item": ["a", None, "c"], "price": [1.0, 2.5, None]})
    inputs: dict[str, object] = {
        "table": expected,
        "batch": expected.to_batches()[0],
        "reader": pa.RecordBatchReader.from_batches(expected.schema, expected.to_batches()),
        "pandas": expected.to_pandas(),
        "polars": pl.from_arrow(expected),
        "polars_lazy": pl.from_arrow(expected).lazy(),
        "dicts": expected.to_pylist(),
        "columns": {"id": [1, 2, 3], "item": ["a", None, "c"], "price": [1.0, 2.5, None]},
        "reordered": expected.select(["price", "id", "item"]),
        "int64_ids": expected.set_column(0, "id", pa.array([1, 2, 3], pa.int64())),
        "large_strings": expected.set_column(1, "item", pa.array(["a", None, "c"], pa.large_string())),
    }
    for kind, data in inputs.items():
        db.create_table(kind, ORDERS)
        with db.transaction() as t:
            assert t.insert(kind, data) == 3, kind
        got = db.table(kind).to_arrow()
        assert got.schema == ORDERS, kind
        assert rows(got) == rows(expected), kind


def test_tables_are_multisets(db: txns.Database) -> None:
    db.create_table("t", pa.schema([("k", pa.string())]))
    with db.transaction() as t:
        t.insert("t", [{"k": "a"}, {"k": "a"}, {"k": "b"}])
    with db.transaction() as t:
        t.retract("t", [{"k": "a"}])
        t.insert("t", [{"k": "a"}, {"k": "c"}])
        t.retract("t", [{"k": "a"}, {"k": "c"}])  # its own insert counts
    assert Counter(db.table("t").to_arrow().column("k").to_pylist()) == Counter({"a": 1, "b": 1})
    assert db.table("t").count() == 2
    with pytest.raises(txns.RowNotFound), db.transaction() as t:
        t.retract("t", [{"k": "a"}, {"k": "a"}])
    assert Counter(db.table("t").to_arrow().column("k").to_pylist()) == Counter({"a": 1, "b": 1})


def test_exception_in_transaction_commits_nothing(db: txns.Database) -> None:
    db.create_table("a", pa.schema([("x", pa.int64())]))
    latest, history = db.latest(), db.history()
    with pytest.raises(RuntimeError, match="boom"), db.transaction() as t:
        t.create_table("b", pa.schema([("y", pa.int64())]))
        t.insert("a", [{"x": 1}])
        t.insert("b", [{"y": 2}])
        raise RuntimeError("boom")
    assert db.tables() == ["a"]
    assert db.table("a").to_arrow().num_rows == 0
    assert db.history().equals(history)
    assert db.latest() == latest  # not even time moved
    with pytest.raises(txns.TransactionClosed):
        t.insert("a", [{"x": 1}])


def test_timestamps_are_hybrid_and_increasing(db: txns.Database) -> None:
    db.create_table("t", pa.schema([("x", pa.int64())]))
    seen = []
    for i in range(20):  # many commits per millisecond take the counter
        with db.transaction() as t:
            t.insert("t", [{"x": i}])
        assert t.commit_info is not None and t.commit_info.ts is not None
        seen.append(t.commit_info.ts)
        assert abs(clock.wall_ms(seen[-1]) - clock.system_ms()) < 5_000
    assert seen == sorted(seen) and len(set(seen)) == 20
    for i, ts in enumerate(seen):
        assert sorted(db.table("t").to_arrow(as_of=ts).column("x").to_pylist()) == list(range(i + 1))


def test_a_clock_behind_the_upper_still_commits(db_url: str) -> None:
    """A process whose clock lags the txns upper commits at the upper (the counter), never waits."""
    ahead = txns.connect(  # (allowed its skew: the point is the commit of the other one)
        db_url,
        config=PersistConfig(clock_ms=lambda: int(time.time() * 1000) + 3_600_000),
        max_clock_skew=dt.timedelta(hours=2),
    )
    ahead.create_table("t", pa.schema([("x", pa.int64())]))
    behind = txns.connect(db_url)
    with behind.transaction() as t:
        t.insert("t", [{"x": 1}])
    assert t.commit_info is not None and t.commit_info.ts is not None
    assert clock.wall_ms(t.commit_info.ts) > clock.system_ms() + 3_000_000
    assert behind.table("t").to_arrow().column("x").to_pylist() == [1]


def test_latest_reads_never_wait_and_see_other_writers(db_url: str) -> None:
    cfg = PersistConfig(read_wait_s=30)
    a, b = txns.connect(db_url, config=cfg), txns.connect(db_url, config=cfg)
    a.create_table("t", pa.schema([("x", pa.int64())]))
    for i in range(5):
        with a.transaction() as t:
            t.insert("t", [{"x": i}])
        with pytest.MonkeyPatch.context() as mp:
            # a latest read catches up and reads below the frontier: it never waits for the upper to move
            mp.setattr(b.handle.cache, "update_gt", lambda *a, **k: pytest.fail("a latest read waited"))
            assert sorted(b.table("t").to_arrow().column("x").to_pylist()) == list(range(i + 1))


def test_future_reads_wait_bounded_then_fail(db_url: str) -> None:
    db = txns.connect(db_url, config=PersistConfig(read_wait_s=0.3))
    db.create_table("t", pa.schema([("x", pa.int64())]))
    future = dt.datetime.now(dt.UTC) + dt.timedelta(hours=1)
    with pytest.raises(ReadTimeout, match="future"):  # (bounded: raised at all, after read_wait_s)
        db.table("t").to_arrow(as_of=future)


def test_a_past_time_after_the_last_commit_reads_stably(db: txns.Database) -> None:
    db.create_table("t", pa.schema([("x", pa.int64())]))
    with db.transaction() as t:
        t.insert("t", [{"x": 1}])
    time.sleep(0.01)
    when = dt.datetime.now(dt.UTC)
    assert db.table("t").to_arrow(as_of=when).column("x").to_pylist() == [1]
    # the time was closed: a commit now lands after it, and the read does not change
    with db.transaction() as t:
        t.insert("t", [{"x": 2}])
    assert t.commit_info is not None and t.commit_info.ts is not None
    assert t.commit_info.ts > clock.ts_of_datetime(when)
    assert db.table("t").to_arrow(as_of=when).column("x").to_pylist() == [1]


def test_racing_creators_agree(db_url: str) -> None:
    dbs: list[txns.Database] = []
    errors: list[BaseException] = []

    def open_one() -> None:
        try:
            dbs.append(txns.connect(db_url))
        except BaseException as e:  # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=open_one) for _ in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert not errors
    assert len({d.root.txns_id for d in dbs}) == 1 and len({d.root.catalog_id for d in dbs}) == 1


def test_racing_create_table_one_wins(db_url: str) -> None:
    dbs = [txns.connect(db_url) for _ in range(3)]
    results: list[object] = []
    barrier = threading.Barrier(3)

    def create(db: txns.Database, i: int) -> None:
        barrier.wait()
        try:
            with db.transaction() as t:
                t.create_table("t", pa.schema([("who", pa.int64())]))
                t.insert("t", [{"who": i}])
            results.append(i)
        except txns.TableExists as e:
            results.append(e)

    threads = [threading.Thread(target=create, args=(db, i)) for i, db in enumerate(dbs)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    winners = [r for r in results if isinstance(r, int)]
    assert len(winners) == 1 and len(results) == 3
    assert txns.connect(db_url).table("t").to_arrow().column("who").to_pylist() == winners


def test_table_retention_and_database_retention_settings(db_url: str) -> None:
    db = txns.connect(db_url, retention=dt.timedelta(hours=2))
    assert db.retention == dt.timedelta(hours=2)
    t = db.create_table("t", pa.schema([("x", pa.int64())]), retention=dt.timedelta(minutes=5))
    assert t.retention == dt.timedelta(minutes=5)
    db.set_table_retention("t", None)
    assert t.retention == dt.timedelta(hours=2)
    db.set_retention(dt.timedelta(days=1))
    assert txns.connect(db_url).retention == dt.timedelta(days=1)
    assert db.history(limit=1).column("operations").to_pylist() == [["set retention t"]]


def test_reopen_in_another_process(db_url: str) -> None:
    db = txns.connect(db_url)
    db.create_table("t", pa.schema([("x", pa.int64())]))
    with db.transaction() as t:
        t.insert("t", [{"x": 41}, {"x": 1}])
    code = (
        "import sys, txns; db = txns.connect(sys.argv[1], create=False); "
        "print(sum(db.table('t').to_arrow().column('x').to_pylist()), db.history().num_rows)"
    )
    r = subprocess.run([sys.executable, "-c", code, db_url], capture_output=True, text=True, timeout=120, check=False)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["42", "2"]


def test_big_insert_spills_parts_and_scan_matches(db_url: str) -> None:
    """Inputs stream into parts (small part size here); scan reads part by part and agrees with to_arrow."""
    cfg = PersistConfig(part_target_bytes=64 << 10)
    db = txns.connect(db_url, config=cfg)
    db.create_table("t", pa.schema([("k", pa.int64()), ("s", pa.string())]))
    n = 50_000
    big = pa.table({"k": pa.array(range(n), pa.int64()), "s": pa.array([f"v{i % 97}" for i in range(n)])})
    with db.transaction() as t:
        t.insert("t", pa.RecordBatchReader.from_batches(big.schema, big.to_batches(max_chunksize=4096)))
    db._settle()  # (the commit is applied in the background)
    state = db.client.shard(db.entry("t", db.latest()).data_id).fetch()
    assert len(state.part_keys()) > 5
    # retract some rows in a second transaction (a second, smaller run)
    gone = big.slice(100, 300)
    with db.transaction() as t:
        t.retract("t", gone)
    from txns.db import scan as scan_mod

    tbl = db.table("t")
    e = db.entry("t", db.latest())
    plan = db.plan(e, db.latest())
    reader = scan_mod.PlanReader(db.client.blob, plan, ["k", "s"], None, 30.0)
    streamed = pa.Table.from_batches(list(scan_mod.scan(reader, in_memory_bytes=0)), schema=reader.out_schema)
    full = tbl.to_arrow()
    assert full.num_rows == n - 300
    assert rows(streamed) == rows(full)
    assert 100 not in set(full.column("k").to_pylist()) and 99 in set(full.column("k").to_pylist())
    # projection in the streamed path: a multiset projection
    reader = scan_mod.PlanReader(db.client.blob, plan, ["s"], pc.field("k") < 1000, 30.0)
    proj = pa.Table.from_batches(list(scan_mod.scan(reader, in_memory_bytes=0)), schema=reader.out_schema)
    assert Counter(proj.column("s").to_pylist()) == Counter(f"v{i % 97}" for i in range(1000) if not 100 <= i < 400)


def test_connect_names(tmp_path: Path) -> None:
    assert txns.connect is txns.db.connect
    db = txns.connect(f"mem://{uuid.uuid4().hex}")
    assert repr(db).startswith("Database('mem://")
    assert repr(db.create_table("x", pa.schema([("a", pa.int8())]))) == "Table('x')"
