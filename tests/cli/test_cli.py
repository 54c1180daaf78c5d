"""The ``txns`` command: inspect, apply, compact, gc, errors, and the Spark demo end to end.

Operator commands run in-process through ``txns.cli.main(argv)`` on
``file://`` stores in ``tmp_path``; every value they report is checked
against what the test committed. The demo runs as a subprocess.
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pytest

from persist import PersistClient, PersistConfig, Schema, ShardId
from persist._internal.parts import encode_parquet
from tests.helpers import REPO
from txns import TxnsHandle
from txns.cli import main

SCHEMA = Schema(key=pa.schema([("k", pa.int64())]), val=pa.schema([("v", pa.string())]))


@dataclass
class Store:
    """A store (file:// or s3:// on moto) with a txns shard and two data shards d0, d1 (registered at 1).

    Committed: at 2, one row to each of d0 and d1 (applied); at 5, two rows to
    d1 (not applied). Batches are written as parts (no inline rows).
    """

    url: str
    client: PersistClient
    handle: TxnsHandle
    txns_id: str
    d0: str
    d1: str


def run(*argv: str) -> tuple[int, str, str]:
    """``txns ARGV`` in-process: (exit status, stdout, stderr)."""
    out, err = io.StringIO(), io.StringIO()
    code = main(list(argv), out=out, err=err)
    return code, out.getvalue(), err.getvalue()


def inspect_json(s: Store) -> dict:
    code, out, err = run("inspect", s.url, s.txns_id, "--json")
    assert code == 0, err
    return json.loads(out)


@pytest.fixture
def store(durable_url: str) -> Store:
    url = durable_url
    client = PersistClient.open(url, PersistConfig(inline_max_bytes=0))
    txns_id = str(ShardId.new())
    handle = TxnsHandle.open(client, txns_id)
    d0, d1 = str(ShardId.new()), str(ShardId.new())
    handle.register(1, {d0: SCHEMA, d1: SCHEMA})
    txn = handle.begin()
    txn.write(d0, (1,), ("a",), 1)
    txn.write(d1, (2,), ("b",), 1)
    txn.commit_at(handle, 2).apply(handle)
    txn = handle.begin()
    txn.write(d1, (3,), ("c",), 1)
    txn.write(d1, (4,), ("d",), 1)
    txn.commit_at(handle, 5)  # committed, not applied
    return Store(url, client, handle, txns_id, d0, d1)


def fresh_snapshot(s: Store, data_id: str, as_of: int) -> list:
    """Read through a new client and handle (nothing cached from the test's own)."""
    client = PersistClient.open(s.url)
    return TxnsHandle.open(client, s.txns_id).snapshot(data_id, as_of)


# ---- inspect ---------------------------------------------------------------------------


def test_inspect_json_reports_what_was_committed(store: Store) -> None:
    j = inspect_json(store)
    assert j["txns_id"] == store.txns_id
    assert j["url"] == store.url
    assert j["upper"] == 6  # the commit at 5 closed the txns shard up to 6
    assert 0 <= j["since"] <= 5
    rec = j["commits_shard"]  # the commit records, registered with the first commit (at 2)
    assert j["registered"] == {store.d0: {"register_ts": 1}, store.d1: {"register_ts": 1}, rec: {"register_ts": 2}}
    entries = [(e["data_id"], e["commit_ts"], e["rows"], e["applied"]) for e in j["entries"]]
    # the commit at 2 is applied (tidied only by a later commit); the one at 5 is not
    assert sorted(entries) == sorted(
        [(store.d0, 2, 1, True), (store.d1, 2, 1, True), (rec, 2, 1, True), (store.d1, 5, 2, False), (rec, 5, 1, False)]
    )
    assert all(e["parts"] == (0 if e["data_id"] == rec else 1) for e in j["entries"]), "records ride inline"
    assert j["unapplied"] == 2
    d0, d1 = j["data_shards"][store.d0], j["data_shards"][store.d1]
    assert (d0["physical_upper"], d0["logical_upper"], d0["since"], d0["rows"]) == (3, 6, 0, 1)
    assert (d1["physical_upper"], d1["logical_upper"], d1["rows"]) == (3, 6, 1)
    assert d0["registered"] and d0["register_ts"] == 1
    assert set(j) == {
        "url", "txns_id", "upper", "since", "registered", "commits_shard", "entries", "unapplied", "data_shards"
    }


def test_inspect_human(store: Store) -> None:
    code, out, err = run("inspect", store.url, store.txns_id)
    assert code == 0, err
    assert err == ""
    assert f"txns shard {store.txns_id}" in out
    assert "upper 6" in out
    assert "registered data shards 3" in out
    assert store.d0 in out and store.d1 in out and "(commit records)" in out
    assert "5 (2 unapplied, 3 applied awaiting tidy)" in out


def test_inspect_writes_nothing(store: Store) -> None:
    before = {sid: store.client.inspect(sid)["seqno"] for sid in (store.txns_id, store.d0, store.d1)}
    assert run("inspect", store.url, store.txns_id)[0] == 0
    after = {sid: store.client.inspect(sid)["seqno"] for sid in (store.txns_id, store.d0, store.d1)}
    assert after == before


def test_inspect_empty_txns_shard(file_url: str) -> None:
    url = file_url
    txns_id = str(ShardId.new())
    TxnsHandle.open(PersistClient.open(url), txns_id)
    code, out, err = run("inspect", url, txns_id, "--json")
    assert code == 0, err
    j = json.loads(out)
    assert (j["upper"], j["registered"], j["entries"], j["unapplied"]) == (0, {}, [], 0)


# ---- apply -----------------------------------------------------------------------------


def test_apply_applies_and_tidies(store: Store) -> None:
    code, out, err = run("apply", store.url, store.txns_id)
    assert code == 0, err
    # the data entry and its commit record
    assert "applied 2 entries (commit ts 5..5) to 2 data shards" in out
    assert "tidied 5 entries with a commit at ts 6" in out
    j = inspect_json(store)
    assert j["upper"] == 7
    assert j["entries"] == [] and j["unapplied"] == 0
    assert j["data_shards"][store.d1]["physical_upper"] > 5
    assert j["data_shards"][store.d1]["rows"] == 3
    assert j["data_shards"][store.d0]["physical_upper"] == 3  # nothing to apply there: still behind
    assert [u[0] for u in fresh_snapshot(store, store.d1, 6)] == [((2,), ("b",)), ((3,), ("c",)), ((4,), ("d",))]
    assert [u[0] for u in fresh_snapshot(store, store.d0, 6)] == [((1,), ("a",))]


def test_apply_twice_is_a_no_op(store: Store) -> None:
    assert run("apply", store.url, store.txns_id)[0] == 0
    code, out, err = run("apply", store.url, store.txns_id)
    assert code == 0, err
    assert "nothing to apply" in out and "nothing to tidy" in out
    assert inspect_json(store)["upper"] == 7  # no empty commit either


def test_apply_alongside_the_committer(store: Store) -> None:
    """The committer's handle keeps working after an operator applied and tidied behind its back."""
    assert run("apply", store.url, store.txns_id)[0] == 0
    txn = store.handle.begin()
    txn.write(store.d0, (9,), ("z",), 1)
    # the handle's cached upper (6) is stale: the commit retries higher
    with pytest.raises(Exception, match="upper is 7"):
        txn.commit_at(store.handle, 6)
    tidy = txn.commit_at(store.handle, 7).apply(store.handle)
    assert len(tidy) == 2, "the data entry and the commit record"
    assert [u[0] for u in fresh_snapshot(store, store.d0, 7)] == [((1,), ("a",)), ((9,), ("z",))]


# ---- compact ---------------------------------------------------------------------------


def test_compact(file_url: str) -> None:
    url = file_url
    # the writer never compacts, so batches pile up for the command to merge
    client = PersistClient.open(url, PersistConfig(compaction_enabled=False))
    txns_id, d = str(ShardId.new()), str(ShardId.new())
    handle = TxnsHandle.open(client, txns_id)
    handle.register(0, {d: SCHEMA})
    for i in range(1, 13):
        txn = handle.begin()
        txn.write(d, (i,), (str(i),), 1)
        txn.commit_at(handle, i).apply(handle)
    txn = handle.begin()
    txn.write(d, (100,), ("late",), 1)
    txn.commit_at(handle, 13)  # unapplied: compact_to must stop at it
    before = client.inspect(d)
    assert before["batches"] >= 12
    expected = fresh_snapshot(Store(url, client, handle, txns_id, d, d), d, 12)

    code, out, err = run("compact", url, txns_id)
    assert code == 0, err
    assert f"txns shard {txns_id}: critical since 13 (upper 14)" in out
    after = client.inspect(d)
    assert after["batches"] < before["batches"]
    assert f"data shard {d}: {before['batches']} -> {after['batches']} batches" in out
    crit = client.inspect(txns_id)["critical_readers"]["txns-critical-since"]["since"]
    assert crit == 13  # bounded by the unapplied write at 13 (times below it may merge)
    assert fresh_snapshot(Store(url, client, handle, txns_id, d, d), d, 12) == expected

    # once everything is applied, the since can move to upper - 1
    assert run("apply", url, txns_id)[0] == 0
    code, out, err = run("compact", url, txns_id)
    assert code == 0, err
    assert client.inspect(txns_id)["critical_readers"]["txns-critical-since"]["since"] == 14
    assert len(fresh_snapshot(Store(url, client, handle, txns_id, d, d), d, 14)) == 13


# ---- gc --------------------------------------------------------------------------------


def _leak_part(client: PersistClient, shard_id: str, age_s: float) -> str:
    """Write an unreferenced part into ``shard_id`` as if written ``age_s`` seconds ago."""
    ms = int((time.time() - age_s) * 1000)
    key = f"{shard_id}/parts/{ms:013d}-{uuid.uuid4().hex}"
    table = SCHEMA.arrow.empty_table()
    client.blob.set(key, encode_parquet(table))
    return key


def test_gc_deletes_leaked_keeps_referenced(store: Store) -> None:
    client = store.client
    old = _leak_part(client, store.d1, age_s=2 * 86400)
    young = _leak_part(client, store.d1, age_s=60)
    j = inspect_json(store)
    unapplied = [e for e in j["entries"] if not e["applied"] and e["data_id"] != j["commits_shard"]]
    assert len(unapplied) == 1
    referenced = set(client.blob.list_keys(f"{store.d1}/parts/")) - {old, young}
    assert referenced  # the parts of both commits to d1

    code, out, err = run("gc", store.url, store.txns_id)
    assert code == 0, err
    keys = set(client.blob.list_keys(f"{store.d1}/parts/"))
    assert old not in keys  # leaked and older than 24h: deleted
    assert young in keys  # leaked but young: might be a write in progress
    assert referenced <= keys
    assert f"data shard {store.d1}: deleted 0 retired parts, 1 leaked parts" in out
    assert "kept 1 parts of unapplied entries" in out

    # with no age threshold, only parts referenced somewhere survive; the
    # unapplied commit's part is referenced only by the txns shard
    code, out, err = run("gc", store.url, store.txns_id, "--older-than", "0")
    assert code == 0, err
    keys = set(client.blob.list_keys(f"{store.d1}/parts/"))
    assert young not in keys
    assert referenced <= keys
    assert run("apply", store.url, store.txns_id)[0] == 0
    assert [u[0] for u in fresh_snapshot(store, store.d1, 6)] == [((2,), ("b",)), ((3,), ("c",)), ((4,), ("d",))]


def test_gc_deletes_retired_parts_past_their_grace(file_url: str) -> None:
    """Parts retired by compaction are deleted once the grace period (300s by default) has passed."""
    url = file_url
    client = PersistClient.open(url, PersistConfig(inline_max_bytes=0, compaction_enabled=False))
    txns_id, d = str(ShardId.new()), str(ShardId.new())
    handle = TxnsHandle.open(client, txns_id)
    handle.register(0, {d: SCHEMA})
    for i in range(1, 6):
        txn = handle.begin()
        txn.write(d, (i,), (str(i),), 1)
        txn.commit_at(handle, i).apply(handle)
    # a compaction whose clock says it ran 400s ago: its retired parts are past the grace period
    past = PersistConfig(inline_max_bytes=0, clock_ms=lambda: int(time.time() * 1000) - 400_000)
    w = PersistClient.open(url, past).open_writer(d, SCHEMA)
    w.shard.fetch()
    assert w.compact() >= 1
    state = w.shard.fetch()
    retired = {k for k, _ in state.garbage}
    assert retired and retired <= set(client.blob.list_keys(f"{d}/parts/"))

    code, out, err = run("gc", url, txns_id)
    assert code == 0, err
    assert f"data shard {d}: deleted {len(retired)} retired parts, 0 leaked parts" in out
    assert client.inspect(d)["garbage_parts"] == 0
    assert not retired & set(client.blob.list_keys(f"{d}/parts/"))
    assert [u[0] for u in fresh_snapshot(Store(url, client, handle, txns_id, d, d), d, 5)] == [
        ((i,), (str(i),)) for i in range(1, 6)
    ]


# ---- errors ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["inspect", "nope", "s" + "0" * 32], "invalid location URL 'nope'"),
        (["apply", "ftp://x/y", "s" + "0" * 32], "unknown scheme 'ftp'"),
        (["inspect", "{store}", "not-an-id"], "invalid shard id 'not-an-id'"),
        (["inspect", "{store}", "s" + "0" * 32], "no txns shard s" + "0" * 32),
        (["gc", "{store}", "s" + "0" * 32], "no txns shard"),
        (["compact", "{missing}", "s" + "0" * 32], "does not exist"),
    ],
)
def test_errors_exit_2_with_one_line(tmp_path: Path, argv: list[str], message: str) -> None:
    PersistClient.open(f"file://{tmp_path / 'store'}")
    argv = [a.format(store=f"file://{tmp_path / 'store'}", missing=f"file://{tmp_path / 'missing'}") for a in argv]
    code, out, err = run(*argv)
    assert code == 2
    assert out == ""
    assert message in err
    assert err.count("\n") == 1 and err.startswith(f"txns {argv[0]}: ")
    assert not (tmp_path / "missing").exists()  # an operator command never creates a store


def test_data_shard_id_is_not_a_txns_shard(store: Store) -> None:
    code, _, err = run("inspect", store.url, store.d0)
    assert code == 2
    assert "is a data shard, not a txns shard" in err


@pytest.mark.s3
def test_missing_bucket_exit_2(moto_endpoint: str) -> None:
    url = f"s3://no-such-bucket-{uuid.uuid4().hex[:8]}/x?endpoint_url={moto_endpoint}&region=us-east-1"
    code, _, err = run("inspect", url, "s" + "0" * 32)
    assert code == 2
    assert "does not exist" in err and err.count("\n") == 1


def test_python_m_txns_bad_url_no_traceback() -> None:
    r = subprocess.run(
        [sys.executable, "-m", "txns", "inspect", "nope", "s" + "0" * 32],
        check=False,
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
    )
    assert r.returncode == 2
    assert "Traceback" not in r.stderr
    assert r.stderr.startswith("txns inspect: invalid location URL")


def test_usage_error_exit_2() -> None:
    code, out, err = run("frobnicate")
    assert code == 2 and out == ""
    assert "invalid choice" in err and err.startswith("usage: txns")


@pytest.mark.spark
@pytest.mark.timeout(300)
def test_compact_with_spark(tmp_path: Path, file_url: str) -> None:
    url = file_url
    client = PersistClient.open(url, PersistConfig(compaction_enabled=False))
    txns_id, d = str(ShardId.new()), str(ShardId.new())
    handle = TxnsHandle.open(client, txns_id)
    handle.register(0, {d: SCHEMA})
    for i in range(1, 6):
        txn = handle.begin()
        txn.write(d, (i,), (str(i),), 1)
        txn.commit_at(handle, i).apply(handle)
    assert client.inspect(d)["batches"] >= 5
    r = subprocess.run(
        [sys.executable, "-m", "txns", "compact", url, txns_id, "--spark"],
        check=False,
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=280,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"data shard {d}: " in r.stdout and "-> 1 batches, 5 -> 5 rows (spark" in r.stdout
    assert client.inspect(d)["batches"] == 1
    assert [u[0] for u in fresh_snapshot(Store(url, client, handle, txns_id, d, d), d, 5)] == [
        ((i,), (str(i),)) for i in range(1, 6)
    ]


# ---- the demo --------------------------------------------------------------------------


@pytest.mark.timeout(300)
def test_demo_end_to_end(tmp_path: Path) -> None:
    demo_dir = tmp_path / "demo"
    argv = [sys.executable, "-m", "txns", "demo", "--dir", str(demo_dir), "--txns", "12"]
    r = subprocess.run(argv, check=False, capture_output=True, text=True, cwd=tmp_path, timeout=280)
    assert r.returncode == 0, r.stdout + r.stderr
    out = r.stdout
    assert "Traceback" not in r.stderr
    assert "one transaction created the tables (create accounts, create transfers, create audit)" in out
    assert "committed 12 transfers" in out
    assert "total = 100000 at all 13 commits" in out, out
    assert "a time travel read by wall-clock time" in out
    assert "to 8 (the live ones)" in out
    assert "is before its retained history" in out and "6 transfers as of halfway" in out
    # the demo leaves a database the commands can read, by its URL alone
    url = f"file://{demo_dir}"
    code, text, err = run("tables", url, "--json")
    assert code == 0, err
    assert {t["name"]: t["rows"] for t in json.loads(text)["tables"]} == {"accounts": 8, "transfers": 12, "audit": 13}
    code, text, err = run("inspect", url, "--json")
    assert code == 0, err
    assert json.loads(text)["unapplied"] == 0
    # run again in the same directory: the same database, its tables replaced in one transaction
    r = subprocess.run([*argv[:-1], "3"], check=False, capture_output=True, text=True, cwd=tmp_path, timeout=280)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "drop accounts, create accounts" in r.stdout and "total = 100000 at all 4 commits" in r.stdout


@pytest.mark.spark
@pytest.mark.timeout(300)
def test_demo_with_spark(tmp_path: Path) -> None:
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable}
    argv = [sys.executable, "-m", "txns", "demo", "--dir", str(tmp_path / "demo"), "--txns", "4", "--spark"]
    r = subprocess.run(argv, check=False, capture_output=True, text=True, cwd=tmp_path, env=env, timeout=280)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "read as a Spark DataFrame too: the same" in r.stdout


# ---- database commands (a database found by its URL) ----------------------------------------


def _db_with_data(tmp_path: Path) -> tuple[str, int, int]:
    """A database with two tables; returns (url, ts of the first data commit, ts of the second)."""
    import txns as txns_pkg

    url = f"file://{tmp_path / 'db'}"
    code, out, err = run("init", url)
    assert code == 0, err
    assert "created a database at" in out
    db = txns_pkg.connect(url, create=False)
    db.create_table("accounts", pa.schema([("account", pa.string()), ("balance", pa.int64())]))
    with db.transaction(metadata={"job": "open"}) as t:
        t.create_table("audit", pa.schema([("event", pa.string())]))
        t.insert("accounts", [{"account": "alice", "balance": 100}, {"account": "bob", "balance": 5}])
        t.insert("audit", [{"event": "open"}])
    first = t.commit_info.ts
    with db.transaction() as t:
        t.retract("accounts", [{"account": "alice", "balance": 100}])
        t.insert("accounts", [{"account": "alice", "balance": 60}])
    second = t.commit_info.ts
    db.close()
    return url, first, second


def test_init_is_idempotent_and_json(tmp_path: Path) -> None:
    url = f"file://{tmp_path / 'db'}"
    code, out, err = run("init", url, "--json", "--retention-days", "2")
    assert code == 0, err
    j = json.loads(out)
    assert j["created"] is True and j["url"] == url and j["retention_s"] == 2 * 86400 and j["tables"] == []
    code, out, err = run("init", url)
    assert code == 0, err
    assert "already exists" in out and "nothing changed" in out
    code, out, _ = run("init", url, "--json")
    assert json.loads(out)["txns_id"] == j["txns_id"] and json.loads(out)["created"] is False


def test_tables_show_history(tmp_path: Path) -> None:
    url, first, second = _db_with_data(tmp_path)
    code, out, err = run("tables", url, "--json")
    assert code == 0, err
    j = json.loads(out)
    assert [(t["name"], t["rows"]) for t in j["tables"]] == [("accounts", 2), ("audit", 1)]
    assert j["tables"][0]["columns"] == {"account": "string", "balance": "int64"}
    code, out, _ = run("tables", url)
    assert "accounts  2" in out and "account string, balance int64" in out

    code, out, err = run("show", url, "accounts", "--json")
    assert code == 0, err
    j = json.loads(out)
    assert sorted((r["account"], r["balance"]) for r in j["rows"]) == [("alice", 60), ("bob", 5)]
    assert j["total_rows"] == 2 and j["as_of"] >= second
    code, out, _ = run("show", url, "accounts", "--as-of", str(first), "--json")
    assert sorted((r["account"], r["balance"]) for r in json.loads(out)["rows"]) == [("alice", 100), ("bob", 5)]
    from txns.db import clock

    iso = clock.to_datetime(first).isoformat()
    code, out, err = run("show", url, "accounts", "--as-of", iso, "--limit", "1")
    assert code == 0, err
    assert "2 rows" in out and "... 1 more" in out

    code, out, err = run("history", url, "--json")
    assert code == 0, err
    commits = json.loads(out)["commits"]
    assert [c["ts"] for c in commits[:2]] == [second, first]
    assert commits[1]["metadata"] == {"job": "open"} and commits[1]["operations"] == ["create audit"]
    assert commits[1]["rows_added"] == 3 and commits[0]["rows_retracted"] == 1
    code, out, _ = run("history", url, "--table", "audit", "--json")
    assert [c["ts"] for c in json.loads(out)["commits"]] == [first]
    code, out, _ = run("history", url, "--limit", "1")
    assert str(second) in out and str(first) not in out


def test_db_errors_exit_2(tmp_path: Path) -> None:
    url, _, _ = _db_with_data(tmp_path)
    code, out, err = run("show", url, "nope")
    assert code == 2 and out == "" and "no table 'nope'" in err and err.count("\n") == 1
    code, _, err = run("show", url, "accounts", "--as-of", "yesterday")
    assert code == 2 and "neither a timestamp nor an ISO datetime" in err
    code, _, err = run("show", url, "accounts", "--limit", "-1")
    assert code == 2 and "--limit" in err
    missing = tmp_path / "missing"
    for argv in (["tables", f"file://{missing}"], ["history", f"file://{missing}"], ["show", f"file://{missing}", "t"]):
        code, out, err = run(*argv)
        assert code == 2 and "no database at" in err and "txns init" in err
    empty = tmp_path / "empty"
    empty.mkdir()
    for cmd in ("inspect", "apply", "compact", "gc"):
        code, _, err = run(cmd, f"file://{empty}")
        assert code == 2 and "no database at" in err, (cmd, err)
    assert not missing.exists() and sorted(p.name for p in empty.iterdir()) in ([], ["blob", "consensus"])
    code, _, err = run("tables", "file://relative/db")
    assert code == 2 and "file:///absolute/path" in err


def test_operator_commands_take_a_database_url(tmp_path: Path) -> None:
    url, _, _ = _db_with_data(tmp_path)
    code, out, err = run("inspect", url, "--json")
    assert code == 0, err
    j = json.loads(out)
    assert set(j["tables"]) == {"accounts", "audit"}
    assert set(j["tables"].values()) <= set(j["registered"])
    code, out, err = run("inspect", url)
    assert code == 0, err
    assert "(accounts)" in out and "(audit)" in out
    # the TXNS_ID form still works on the same store
    code, out2, err = run("inspect", url, j["txns_id"], "--json")
    assert code == 0, err
    assert "tables" not in json.loads(out2)
    code, out, err = run("apply", url, "--json")
    assert code == 0, err
    assert json.loads(out)["upper"] >= j["upper"]
    code, out, err = run("compact", url, "--json")
    assert code == 0, err
    tables = json.loads(out)["tables"]
    assert tables["accounts"]["rows"][1] <= tables["accounts"]["rows"][0]
    code, out, err = run("compact", url)
    assert code == 0, err
    assert "table accounts:" in out and "history kept from" in out
    code, out, err = run("gc", url, "--json")
    assert code == 0, err
    g = json.loads(out)
    assert any(s.get("table") == "accounts" for s in g.values())
    assert all("why_nothing_deleted" in s for s in g.values() if not s["retired"] and not s["leaked"])
    code, out, err = run("gc", url)
    assert code == 0, err
    assert "nothing deleted:" in out


def test_gc_says_why_it_deleted_nothing(tmp_path: Path) -> None:
    url, _, _ = _db_with_data(tmp_path)
    import txns as txns_pkg

    db = txns_pkg.connect(url, create=False)
    d = db.entry("accounts", db.latest()).data_id
    young = _leak_part(db.client, d, age_s=60)
    code, out, err = run("gc", url, "--json")
    assert code == 0, err
    entry = json.loads(out)[d]
    assert entry["leaked"] == 0
    assert "1 unreferenced part(s) are younger than --older-than 86400s" in entry["why_nothing_deleted"]
    assert young in set(db.client.blob.list_keys(f"{d}/parts/"))


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--version"]) == 0
    assert capsys.readouterr().out.strip().startswith("txns ")
