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
from persist.parts import encode_parquet
from txns import TxnsHandle
from txns.cli import main

SCHEMA = Schema(key=pa.schema([("k", pa.int64())]), val=pa.schema([("v", pa.string())]))
REPO = Path(__file__).resolve().parent.parent


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


@pytest.fixture(params=["file", pytest.param("s3", marks=pytest.mark.s3)])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Store:
    if request.param == "file":
        url = f"file://{tmp_path / 'store'}"
    else:
        url = request.getfixturevalue("s3_url_factory")()
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
    assert j["registered"] == {store.d0: {"register_ts": 1}, store.d1: {"register_ts": 1}}
    entries = [(e["data_id"], e["commit_ts"], e["rows"], e["applied"]) for e in j["entries"]]
    # the commit at 2 is applied (tidied only by a later commit); the one at 5 is not
    assert sorted(entries) == sorted([(store.d0, 2, 1, True), (store.d1, 2, 1, True), (store.d1, 5, 2, False)])
    assert all(e["parts"] == 1 for e in j["entries"])
    assert j["unapplied"] == 1
    d0, d1 = j["data_shards"][store.d0], j["data_shards"][store.d1]
    assert (d0["physical_upper"], d0["logical_upper"], d0["since"], d0["rows"]) == (3, 6, 0, 1)
    assert (d1["physical_upper"], d1["logical_upper"], d1["rows"]) == (3, 6, 1)
    assert d0["registered"] and d0["register_ts"] == 1
    assert set(j) == {"url", "txns_id", "upper", "since", "registered", "entries", "unapplied", "data_shards"}


def test_inspect_human(store: Store) -> None:
    code, out, err = run("inspect", store.url, store.txns_id)
    assert code == 0, err
    assert err == ""
    assert f"txns shard {store.txns_id}" in out
    assert "upper 6" in out
    assert "registered data shards 2" in out
    assert store.d0 in out and store.d1 in out
    assert "3 (1 unapplied, 2 applied awaiting tidy)" in out


def test_inspect_writes_nothing(store: Store) -> None:
    before = {sid: store.client.inspect(sid)["seqno"] for sid in (store.txns_id, store.d0, store.d1)}
    assert run("inspect", store.url, store.txns_id)[0] == 0
    after = {sid: store.client.inspect(sid)["seqno"] for sid in (store.txns_id, store.d0, store.d1)}
    assert after == before


def test_inspect_empty_txns_shard(tmp_path: Path) -> None:
    url = f"file://{tmp_path / 'store'}"
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
    assert "applied 1 entries (commit ts 5..5) to 1 data shards" in out
    assert "tidied 3 entries with a commit at ts 6" in out
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
    assert len(tidy) == 1
    assert [u[0] for u in fresh_snapshot(store, store.d0, 7)] == [((1,), ("a",)), ((9,), ("z",))]


# ---- compact ---------------------------------------------------------------------------


def test_compact(tmp_path: Path) -> None:
    url = f"file://{tmp_path / 'store'}"
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
    unapplied = [e for e in j["entries"] if not e["applied"]]
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


def test_gc_deletes_retired_parts_past_their_grace(tmp_path: Path) -> None:
    """Parts retired by compaction are deleted once the grace period (300s by default) has passed."""
    url = f"file://{tmp_path / 'store'}"
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
    w.machine.fetch()
    assert w.compact() >= 1
    state = w.machine.fetch()
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


def test_usage_error_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, _ = run("frobnicate")
    assert code == 2
    assert "invalid choice" in capsys.readouterr().err


@pytest.mark.spark
@pytest.mark.timeout(300)
def test_compact_with_spark(tmp_path: Path) -> None:
    url = f"file://{tmp_path / 'store'}"
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


@pytest.mark.spark
@pytest.mark.timeout(300)
def test_demo_end_to_end(tmp_path: Path) -> None:
    demo_dir = tmp_path / "demo"
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable}
    r = subprocess.run(
        [sys.executable, "-m", "txns", "demo", "--dir", str(demo_dir), "--txns", "20"],
        check=False,
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=env,
        timeout=280,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    out = r.stdout
    assert "total = 100000 at all 22 timestamps" in out, out
    assert "Traceback" not in r.stderr
    assert "committed and applied 21 transactions" in out
    # the demo leaves a store the operator commands can read
    ids = json.loads((demo_dir / "demo.json").read_text())
    code, text, err = run("inspect", ids["url"], ids["txns_id"], "--json")
    assert code == 0, err
    j = json.loads(text)
    assert set(j["registered"]) == set(ids["tables"].values())
    assert j["unapplied"] == 0
    assert j["data_shards"][ids["tables"]["transfers"]]["rows"] == 20
