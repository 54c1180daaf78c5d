"""Misuse that must be refused or made safe (issue 26): a transaction shared between threads, ``db.run``
with a function that commits itself or is async, out-of-range retentions, a part missing from storage."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

import txns
from persist import InvalidUsage
from tests import helpers
from txns.db import clock

SCHEMA = pa.schema([("x", pa.int64())])


# ---- 1. one transaction, committed from two threads ------------------------------------------------


def test_a_transaction_committed_from_two_threads_commits_once(tmp_path: Path) -> None:
    """Racing ``commit()`` calls: exactly one commits, the others are refused; nothing acknowledged is lost."""
    url = helpers.file_url(tmp_path / "db")
    db = txns.connect(url)
    db.create_table("t", SCHEMA)
    acknowledged: list[int] = []
    trials = 25
    for i in range(trials):
        t = db.transaction()
        t.insert("t", [{"x": i}])
        go = threading.Barrier(3)
        results: list[object] = []

        def commit(t: txns.Transaction = t, go: threading.Barrier = go, results: list[object] = results) -> None:
            go.wait()
            try:
                results.append(t.commit())
            except Exception as e:  # noqa: BLE001 - the outcome is what the test checks
                results.append(e)

        threads = [threading.Thread(target=commit) for _ in range(3)]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        infos = [r for r in results if isinstance(r, txns.CommitInfo)]
        refused = [r for r in results if not isinstance(r, txns.CommitInfo)]
        assert len(infos) == 1, results
        assert all(isinstance(r, txns.TransactionClosed) and "committed" in str(r) for r in refused), refused
        assert infos[0].ts is not None and t.commit_info == infos[0]
        acknowledged.append(infos[0].ts)
    db.close()
    fresh = txns.connect(url, create=False)
    try:
        assert sorted(fresh.table("t").to_arrow().column("x").to_pylist()) == list(range(trials))
        history = fresh.history("t")
        ops = history["operations"].to_pylist()
        committed = [ts for ts, o in zip(history["ts"].to_pylist(), ops, strict=True) if not o]
        assert sorted(committed) == sorted(acknowledged)
    finally:
        fresh.close()


# ---- 7. db.run with a function that commits itself, or is async --------------------------------------


def _only_table_t(db: txns.Database) -> None:
    assert db.tables() == ["t"] and db.table("t").count() == 0
    assert db.history()["operations"].to_pylist() == [["create t"]]


def test_run_refuses_a_function_that_commits_the_transaction_itself(db: txns.Database) -> None:
    db.create_table("t", SCHEMA)

    def commits(t: txns.Transaction) -> None:
        t.insert("t", [{"x": 1}])
        t.commit()

    def with_block(t: txns.Transaction) -> None:
        with t:
            t.insert("t", [{"x": 1}])

    for fn in (commits, with_block):
        with pytest.raises(InvalidUsage, match=r"run.*commits the transaction"):
            db.run(fn)
        _only_table_t(db)
    assert db.run(lambda t: t.insert("t", [{"x": 1}])).ts is not None  # (plain use still commits)
    assert db.table("t").count() == 1


def test_run_refuses_an_async_function(db: txns.Database) -> None:
    db.create_table("t", SCHEMA)
    ran: list[int] = []

    async def insert(t: txns.Transaction) -> None:
        ran.append(1)
        t.insert("t", [{"x": 1}])

    class AsyncCallable:
        async def __call__(self, t: txns.Transaction) -> None:
            await insert(t)

    for fn in (insert, AsyncCallable(), lambda t: insert(t)):
        with pytest.raises(InvalidUsage, match="await"):
            db.run(fn)
        _only_table_t(db)
    assert ran == []


# ---- 9. retention bounds ------------------------------------------------------------------------------


def test_retention_out_of_range_is_refused_and_stored_values_read_back(db: txns.Database) -> None:
    import datetime as dt

    from txns.db.retention import MAX_RETENTION
    from txns.db.root import update_root

    db.create_table("t", SCHEMA)
    before = db.retention
    for bad in (dt.timedelta.max, MAX_RETENTION + dt.timedelta(milliseconds=1)):
        with pytest.raises(InvalidUsage, match="at most 36500 days"):
            db.set_retention(bad)
        with pytest.raises(InvalidUsage, match="at most 36500 days"):
            db.set_table_retention("t", bad)
        with pytest.raises(InvalidUsage, match="at most 36500 days"):
            db.create_table("u", SCHEMA, retention=bad)
    assert db.retention == before and db.table("t").retention == before and db.tables() == ["t"]
    db.set_retention(MAX_RETENTION)
    db.set_table_retention("t", MAX_RETENTION)
    again = txns.connect(db.url, create=False)
    try:
        assert again.retention == MAX_RETENTION and again.table("t").retention == MAX_RETENTION
        # a value stored out of range (by an older version of the library) still reads back, as the bound
        update_root(again.client, {"retention_ms": dt.timedelta.max // dt.timedelta(milliseconds=1)})
        again._refresh_root()
        assert again.retention == MAX_RETENTION
    finally:
        again.close()


# ---- 10. a part missing from storage ------------------------------------------------------------------


def _parts_of(db: txns.Database, name: str) -> set[str]:
    plan = db.plan(db.entry(name, db.latest()), db.latest())
    return {p.key for r in plan.runs for p in r.parts}


def test_a_lost_part_is_corruption_in_every_read(tmp_path: Path) -> None:
    """A part the table's state references, deleted: every read says CorruptObject (never "plan again")."""
    from persist import CorruptObject, PersistConfig
    from tests.cli.test_cli import run as cli

    url = helpers.file_url(tmp_path / "db")
    db = txns.connect(url, config=PersistConfig(inline_max_bytes=0))
    db.create_table("t", SCHEMA)
    db.create_table("u", SCHEMA)
    for name in ("t", "u"):
        with db.transaction() as t:
            t.insert(name, [{"x": i} for i in range(100)])
    db._settle()
    (lost,) = _parts_of(db, "t")
    db.close()
    (tmp_path / "db" / "blob" / lost).unlink()
    db = txns.connect(url, create=False)
    try:
        reads = {
            "to_arrow": lambda: db.table("t").to_arrow(),
            "count": lambda: db.table("t").count(),
            "scan": lambda: db.table("t").scan().read_all(),
            "read transaction": lambda: db.read().table("t").count(),
            "truncate": lambda: db.transaction().truncate("t"),
        }
        for what, read in reads.items():
            with pytest.raises(CorruptObject, match="missing") as e:
                read()
            assert lost in str(e.value), what
        assert db.table("u").count() == 100  # (the other table reads)
    finally:
        db.close()
    code, _out, err = cli("tables", url)
    assert code != 0 and "CorruptObject" in err and lost in err and "plan the read again" not in err


def test_a_part_retired_by_compaction_after_planning_is_read_again(tmp_path: Path) -> None:
    """A reader whose cached state names parts compaction has retired (and deleted) plans again: right rows."""
    from persist import PersistConfig

    url = helpers.file_url(tmp_path / "db")
    config = PersistConfig(inline_max_bytes=0, compaction_enabled=False, part_grace_s=0)
    db = txns.connect(url, config=config)
    db.create_table("t", SCHEMA)
    for i in range(3):
        with db.transaction() as t:
            t.insert("t", [{"x": 10 * i + j} for j in range(10)])
    db._settle()
    reader = txns.connect(url, create=False, config=config)
    try:
        assert reader.table("t").count() == 30
        old = _parts_of(reader, "t")
        assert len(old) == 3
        db.compact()
        d = db.entry("t", db.latest()).data_id
        db.handle.data_writer(d).collect_garbage()
        assert not old & set(db.client.blob.list_keys(f"{d}/parts/"))  # the old parts are gone
        assert _parts_of(reader, "t") == old  # (the reader's cached state still names them)
        assert reader.table("t").count() == 30
        assert sorted(reader.table("t").to_arrow().column("x").to_pylist()) == list(range(30))
    finally:
        reader.close()
        db.close()


# ---- 6. a deleted root record ---------------------------------------------------------------------------


def _files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_a_deleted_root_record_is_refused_never_overwritten_and_recovers(tmp_path: Path) -> None:
    import shutil

    from persist import PersistConfig
    from txns.db import recover_root

    url = helpers.file_url(tmp_path / "db")
    config = PersistConfig(retry_deadline_s=0.5)  # (how long a creator waits for a racing creator's root)
    db = txns.connect(url, config=config)
    db.create_table("t", SCHEMA)
    with db.transaction(metadata={"job": "load"}) as t:
        t.insert("t", [{"x": 1}, {"x": 2}])
    history = db.history()
    db.close()
    roots = [p for p in (tmp_path / "db" / "consensus").iterdir() if "txns-db-root" in p.name]
    assert len(roots) == 1
    shutil.rmtree(roots[0])
    before = _files(tmp_path / "db")
    for create in (True, False):
        with pytest.raises(txns.DatabaseNotFound, match=r"no database root record.*recover_root|no database at"):
            txns.connect(url, create=create, config=config)
    with pytest.raises(txns.DatabaseNotFound, match=r"holds shards .* but no database root record.*recover_root"):
        txns.connect(url, config=config)
    assert _files(tmp_path / "db") == before  # nothing written: the old database is intact
    root = recover_root(url)
    with pytest.raises(InvalidUsage, match="has a root record"):
        recover_root(url)
    db = txns.connect(url, create=False)
    try:
        assert db.root.txns_id == root.txns_id
        assert db.tables() == ["t"] and sorted(db.table("t").to_arrow().column("x").to_pylist()) == [1, 2]
        assert db.history().select(["ts", "txn_id", "metadata"]).equals(history.select(["ts", "txn_id", "metadata"]))
        db.table("t")  # and it takes commits again
        db.run(lambda t: t.insert("t", [{"x": 3}]))
        assert db.table("t").count() == 3
    finally:
        db.close()


def test_recover_root_refuses_a_location_without_a_database(tmp_path: Path) -> None:
    from txns.db import recover_root

    url = helpers.file_url(tmp_path / "empty")
    (tmp_path / "empty").mkdir()
    with pytest.raises(InvalidUsage, match=r"found no txns shard with a catalog.*nothing was written"):
        recover_root(url)


# ---- 2. a client with a skewed clock ---------------------------------------------------------------------

DAY_MS = 86_400_000


def _clock(offset_ms: int) -> Callable[[], int]:
    return lambda: int(time.time() * 1000) + offset_ms


def test_a_skewed_client_cannot_commit_compact_or_hold_and_others_are_unharmed(durable_url: str) -> None:
    """A client 30 days fast (or slow) against the storage's clock is refused; the others' history stays readable."""
    from persist import PersistConfig

    good = txns.connect(durable_url)
    fast = txns.connect(durable_url, create=False, config=PersistConfig(clock_ms=_clock(30 * DAY_MS), read_wait_s=0.2))
    slow = txns.connect(durable_url, create=False, config=PersistConfig(clock_ms=_clock(-30 * DAY_MS)))
    near = txns.connect(durable_url, create=False, config=PersistConfig(clock_ms=_clock(60_000)))  # within 5 min
    try:
        good.create_table("t", SCHEMA)
        good.run(lambda t: t.insert("t", [{"x": 1}]))
        history = good.history()
        assert fast.table("t").count() == 1  # reads are fine
        for client, way in ((fast, "ahead of"), (slow, "behind")):
            assert client.tables() == ["t"]
            refusals = {
                "commit": lambda c=client: c.run(lambda t: t.insert("t", [{"x": 2}])),
                "commit ": lambda c=client: c.create_table("u", SCHEMA),
                "compact": lambda c=client: c.compact(),
            }
            for what, op in refusals.items():
                expected = rf"cannot {what.strip()}: this client's clock is .* {way}"
                with pytest.raises(txns.ClockSkewError, match=expected):
                    op()
        with pytest.raises(txns.ReadTimeout):  # (a time in the storage's future is not closed by a commit)
            fast.table("t").to_arrow(as_of=datetime.now(UTC) + timedelta(days=10))
        assert good.history().equals(history) and good.tables() == ["t"]
        near.latest()
        before = datetime.now(UTC)
        near.run(lambda t: t.insert("t", [{"x": 3}]))  # (stamped a minute ahead: within the bound)
        info = good.run(lambda t: t.insert("t", [{"x": 4}]))
        assert info.ts is not None and abs(clock.wall_ms(info.ts) - clock.system_ms()) < 10 * 60_000
        good.compact()
        assert sorted(good.table("t").to_arrow().column("x").to_pylist()) == [1, 3, 4]
        assert good.table("t").to_arrow(as_of=before).column("x").to_pylist() == [1]  # (not locked out)
        assert good.storage_clock.measurements == 1  # once per connection, not per commit
    finally:
        for d in (good, fast, slow, near):
            d.close()


def test_a_skewed_client_cannot_create_a_database(durable_url: str) -> None:
    from persist import PersistConfig

    with pytest.raises(txns.ClockSkewError, match="cannot create a database"):
        txns.connect(durable_url, config=PersistConfig(clock_ms=_clock(30 * DAY_MS)))
    txns.connect(durable_url).close()  # (nothing was left in the way)


def test_retention_never_moves_a_since_past_the_storage_now(db_url: str) -> None:
    """Even a client allowed a huge skew holds the since at the storage's now minus the retention, at most."""
    from persist import PersistConfig

    good = txns.connect(db_url, retention=timedelta(days=7))
    good.create_table("t", SCHEMA)
    good.run(lambda t: t.insert("t", [{"x": 1}]))
    fast = txns.connect(
        db_url, config=PersistConfig(clock_ms=_clock(30 * DAY_MS)), max_clock_skew=timedelta(days=60)
    )
    try:
        fast.run(lambda t: t.insert("t", [{"x": 2}]))
        report = fast.compact()
        assert clock.wall_ms(report["t"]["hold"]) <= clock.system_ms() - 7 * DAY_MS + 60_000
        assert good.table("t").earliest() <= clock.ts_of_datetime(datetime.now(UTC))
        assert good.table("t").to_arrow(as_of=datetime.now(UTC)).column("x").to_pylist() == [1]  # not ReadBelowSince
    finally:
        fast.close()
        good.close()


def test_max_clock_skew_is_checked() -> None:
    for bad in (timedelta(0), timedelta(minutes=-1), 300):
        with pytest.raises(InvalidUsage, match="max_clock_skew must be a positive"):
            txns.connect("mem://skew-bound", max_clock_skew=bad)  # type: ignore[arg-type]


@pytest.mark.s3
def test_a_deleted_root_record_on_s3_is_refused_and_recovers(
    s3_url_factory: Callable[..., str], s3_admin: Any
) -> None:
    from persist import PersistConfig
    from txns.db import recover_root

    url = s3_url_factory("lost")
    config = PersistConfig(retry_deadline_s=0.5)
    db = txns.connect(url, config=config)
    db.create_table("t", SCHEMA)
    db.run(lambda t: t.insert("t", [{"x": 1}]))
    db.close()
    bucket = url.removeprefix("s3://").split("/", 1)[0]
    listed = s3_admin.list_objects_v2(Bucket=bucket)["Contents"]
    root_objects = [o["Key"] for o in listed if "txns-db-root" in o["Key"]]
    assert root_objects
    for key in root_objects:
        s3_admin.delete_object(Bucket=bucket, Key=key)
    with pytest.raises(txns.DatabaseNotFound, match=r"holds shards .* but no database root record"):
        txns.connect(url, config=config)
    after = s3_admin.list_objects_v2(Bucket=bucket)["Contents"]
    assert sorted(o["Key"] for o in after) == sorted(o["Key"] for o in listed if o["Key"] not in root_objects)
    recover_root(url)
    db = txns.connect(url, create=False)
    try:
        assert db.table("t").to_arrow().column("x").to_pylist() == [1]
    finally:
        db.close()


def test_a_crashed_creators_leftovers_do_not_block_a_new_database(tmp_path: Path) -> None:
    """Shards of a creator that crashed before its root record (no catalog registered): a new database is made."""
    from persist import PersistClient, PersistConfig, ShardId
    from txns.handle import TxnsHandle

    url = helpers.file_url(tmp_path / "db")
    config = PersistConfig(retry_deadline_s=0.5)
    client = PersistClient.open(url, config)
    TxnsHandle.open(client, str(ShardId.new()), init_ts=clock.ts_of_ms(clock.system_ms())).close()
    assert (tmp_path / "db" / "consensus").is_dir() and len(list((tmp_path / "db" / "consensus").iterdir())) >= 1
    db = txns.connect(url, config=config)
    try:
        assert db.tables() == []
        db.create_table("t", SCHEMA)
        assert db.tables() == ["t"]
    finally:
        db.close()


def test_a_lost_part_of_a_committed_unapplied_batch_is_corruption(tmp_path: Path) -> None:
    """A part named only by the txns log (committed, not applied to its table yet), deleted: CorruptObject."""
    from persist import CorruptObject, PersistConfig

    url = helpers.file_url(tmp_path / "db")
    db = txns.connect(url, config=PersistConfig(inline_max_bytes=0))
    try:
        db.create_table("t", SCHEMA)
        db._settle()
        e = db.entry("t", db.latest())
        # committed through the core alone: nothing applies it (as after a crash right after the commit)
        t = db.transaction()
        t.insert("t", [{"x": i} for i in range(10)])
        t._staged.finish()
        (batch,) = t._staged.batches[e.data_id]
        txn = db.committer.begin({})
        txn.write_batch(e.data_id, batch)
        txn.commit_at(db.handle, max(db.latest() + 1, clock.ts_of_ms(clock.system_ms())))
        assert db.client.shard(e.data_id).fetch().upper <= db.latest()  # not applied
        (lost,) = {p.key for r in batch.runs for p in r.parts}
    finally:
        db.close()
    (tmp_path / "db" / "blob" / lost).unlink()
    reader = txns.connect(url, create=False)
    try:
        for read in (lambda: reader.table("t").count(), lambda: reader.table("t").to_arrow()):
            with pytest.raises(CorruptObject, match="not applied to its table yet"):
                read()
    finally:
        reader.close()
