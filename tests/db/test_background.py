"""Commits return when durable; the database applies them in the background (txns.db.applier).

Each test pins one behaviour: the commit does not wait for the apply (checked
on the data shard with a plain persist read), reads see every commit anyway
without writing anything, the worker coalesces, tidies ride along, a failed
apply is only logged, ``close()`` waits for the worker and stops it, and the
DDL path does its independent writes at once.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter

import pyarrow as pa
import pytest

import txns
from persist import PersistClient, PersistError, Schema
from txns.commits import COMMITS_SCHEMA
from txns.db.applier import Applier
from txns.db.catalog import CATALOG_SCHEMA, CatalogView
from txns.db.retention import RETENTION_READER
from txns.handle import TxnsHandle

SCHEMA = pa.schema([("k", pa.int64()), ("v", pa.string())])


def table(ks: range, v: str = "x") -> pa.Table:
    return pa.table({"k": pa.array(list(ks), pa.int64()), "v": [f"{v}{k}" for k in ks]})


def rows(t: pa.Table) -> Counter:
    return Counter(tuple(sorted(r.items())) for r in t.to_pylist())


class Gate:
    """Holds the background worker at the start of each apply until ``release()``; records what it was asked."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.released = threading.Event()
        self.entered = threading.Event()
        self.calls: list[int] = []
        orig = Applier._apply
        gate = self

        def _apply(applier: Applier, ts: int, ids: frozenset[str]) -> None:
            gate.calls.append(ts)
            gate.entered.set()
            assert gate.released.wait(60), "the test never released the worker"
            orig(applier, ts, ids)

        monkeypatch.setattr(Applier, "_apply", _apply)

    def release(self) -> None:
        self.released.set()


def upper(url: str, data_id: str) -> int:
    """The data shard's physical upper, read from storage by a client with nothing cached."""
    return PersistClient.open(url).shard(data_id).fetch().upper


def seqnos(url: str, ids: list[str]) -> list[int | None]:
    c = PersistClient.open(url)
    return [c.shard(d).fetch().seqno for d in ids]


def test_a_commit_returns_when_durable_and_is_applied_after(
    db_url: str, db: txns.Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    db.create_table("t", SCHEMA)
    db._settle()
    gate = Gate(monkeypatch)
    with db.transaction() as t:
        t.insert("t", table(range(10)))
    ts = t.commit_info.ts  # type: ignore[union-attr]
    d = db.entry("t", ts).data_id
    assert gate.entered.wait(10)
    # durable and acknowledged, not applied: the data shard has not reached the commit
    assert upper(db_url, d) <= ts
    # every read sees it anyway, and writes nothing for it (no apply, no fill)
    ids = [d, db.root.catalog_id, db.handle.commits_id]
    before = seqnos(db_url, ids)
    assert rows(db.table("t").to_arrow()) == rows(table(range(10)))
    assert rows(db.table("t").to_arrow(as_of=ts)) == rows(table(range(10)))
    assert db.table("t").to_arrow(as_of=ts - 1).num_rows == 0
    assert db.table("t").count() == 10
    assert db.history(table="t").column("ts").to_pylist()[0] == ts
    assert db.tables() == ["t"]
    assert seqnos(db_url, ids) == before and upper(db_url, d) <= ts
    gate.release()
    db.close()
    assert upper(db_url, d) > ts  # close() waited for the apply
    assert not db._applier.running


def test_close_waits_for_the_apply_and_stops_the_worker(db_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    db = txns.connect(db_url)
    db.create_table("t", SCHEMA)
    gate = Gate(monkeypatch)
    with db.transaction() as t:
        t.insert("t", table(range(3)))
    ts = t.commit_info.ts  # type: ignore[union-attr]
    d = db.entry("t", ts).data_id
    assert gate.entered.wait(10) and db._applier.running
    worker = db._applier._thread
    assert worker is not None
    threading.Timer(0.3, gate.release).start()
    db.close()
    assert upper(db_url, d) > ts
    assert not db._applier.running
    # this database's worker has ended (other tests' idle workers may still be winding down)
    assert not worker.is_alive()
    with pytest.raises(PersistError, match="closed"):
        db.tables()


def test_an_idle_worker_ends_its_thread_and_the_next_commit_starts_one(
    db: txns.Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("txns.db.applier.IDLE_EXIT_S", 0.05)
    db.create_table("t", SCHEMA)
    db._settle()
    deadline = time.monotonic() + 10
    while db._applier.running and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not db._applier.running
    with db.transaction() as t:
        t.insert("t", table(range(2)))
    assert db._settle(10)
    assert db._applier.applies >= 2


def test_applies_coalesce_at_most_one_queued(db: txns.Database, monkeypatch: pytest.MonkeyPatch) -> None:
    db.create_table("t", SCHEMA)
    db._settle()
    gate = Gate(monkeypatch)
    stamps = []
    for i in range(5):
        with db.transaction() as t:
            t.insert("t", table(range(i * 10, i * 10 + 10)))
        stamps.append(t.commit_info.ts)  # type: ignore[union-attr]
        if i == 0:
            assert gate.entered.wait(10)  # the first apply is running (held)
    gate.release()
    assert db._settle(10)
    assert gate.calls == [stamps[0], stamps[-1]]  # the four queued while the first ran: one apply
    assert rows(db.table("t").to_arrow()) == rows(table(range(50)))


def test_applied_entries_are_tidied_by_the_next_commit(db: txns.Database) -> None:
    db.create_table("t", SCHEMA)
    with db.transaction() as t:
        t.insert("t", table(range(5)))
    ts = t.commit_info.ts  # type: ignore[union-attr]
    db._settle()
    assert [e for e in db.handle.cache.entries if e.ts == ts]  # applied, still in the log
    with db.transaction() as t:
        t.insert("t", table(range(5, 6)))
    assert not [e for e in db.handle.cache.entries if e.ts == ts]  # retracted by that commit
    assert db.table("t").count() == 6


def test_a_failed_background_apply_is_only_logged(
    db_url: str, db: txns.Database, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    db.create_table("t", SCHEMA)
    db._settle()
    orig = TxnsHandle.apply_le

    def failing(self: TxnsHandle, ts: int, only: set[str] | None = None) -> object:
        if threading.current_thread().name == "txns-db-apply":
            raise PersistError("storage is down (injected)")
        return orig(self, ts, only)

    monkeypatch.setattr(TxnsHandle, "apply_le", failing)
    with caplog.at_level(logging.INFO, logger="txns.db.applier"):
        with db.transaction() as t:
            t.insert("t", table(range(4)))
        ts = t.commit_info.ts  # type: ignore[union-attr]
        assert db._settle(10)
    assert db._applier.failures == 1
    assert "background apply" in caplog.text and "injected" in caplog.text
    d = db.entry("t", ts).data_id
    assert upper(db_url, d) <= ts
    assert db.table("t").count() == 4  # readers do not need it
    monkeypatch.setattr(TxnsHandle, "apply_le", orig)
    with db.transaction() as t:
        t.insert("t", table(range(4, 5)))
    assert db._settle(10)
    assert upper(db_url, d) > t.commit_info.ts  # type: ignore[union-attr]  # the next apply covers both


def test_reads_neither_wait_for_a_stuck_worker_nor_write(
    db_url: str, db: txns.Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    db.create_table("t", SCHEMA)
    with db.transaction() as t:
        t.insert("t", table(range(10)))
    first = t.commit_info.ts  # type: ignore[union-attr]
    db._settle()
    gate = Gate(monkeypatch)  # from now on the worker applies nothing
    with db.transaction() as t:
        t.create_table("u", SCHEMA)
        t.insert("u", table(range(3), "u"))
        t.retract("t", table(range(5)))
    second = t.commit_info.ts  # type: ignore[union-attr]
    with db.transaction() as t:  # its retract check reads rows committed but not applied
        t.retract("u", table(range(1), "u"))
        t.insert("t", table(range(100, 101)))
    third = t.commit_info.ts  # type: ignore[union-attr]
    assert gate.entered.wait(10)
    ids = [db.entry(n, third).data_id for n in ("t", "u")] + [db.root.catalog_id, db.handle.commits_id]
    before = seqnos(db_url, ids)
    # no read waits for the (gated) worker: waiting for it is the applier's wait
    waited: list[object] = []
    real_wait = db._applier.wait
    db._applier.wait = lambda *a, **k: waited.append(a) or real_wait(*a, **k)  # type: ignore[method-assign]
    assert db.tables() == ["t", "u"] and db.tables(as_of=first) == ["t"]
    assert rows(db.table("t").to_arrow()) == rows(pa.concat_tables([table(range(5, 10)), table(range(100, 101))]))
    assert rows(db.table("t").to_arrow(as_of=second)) == rows(table(range(5, 10)))
    assert rows(db.table("t").to_arrow(as_of=first)) == rows(table(range(10)))
    assert rows(db.table("u").to_arrow()) == rows(table(range(1, 3), "u"))
    changes = db.table("t").changes(second)
    assert sorted(zip(changes.column("ts").to_pylist(), changes.column("diff").to_pylist(), strict=False)) == [
        *[(second, -1)] * 5,
        (third, 1),
    ]
    assert [r["ts"] for r in db.history().to_pylist()][:2] == [third, second]
    db._applier.wait = real_wait  # type: ignore[method-assign]
    assert waited == [], "a read waited for the worker"
    assert seqnos(db_url, ids) == before
    gate.release()


def test_new_tables_cost_no_retention_hold(db_url: str, db: txns.Database) -> None:
    """A table's first batch starts at time 0 but holds updates only from its commit: no hold is due."""
    db.create_table("t", SCHEMA)
    for i in range(3):
        with db.transaction() as t:
            t.insert("t", table(range(i, i + 1)))
    db._settle()
    d = db.entry("t", db.latest()).data_id
    assert RETENTION_READER not in PersistClient.open(db_url).shard(d).fetch().critical


def test_the_catalog_after_ddl_needs_no_read(db: txns.Database, monkeypatch: pytest.MonkeyPatch) -> None:
    def no_read(ts: int) -> CatalogView:
        raise AssertionError("the catalog was read")

    monkeypatch.setattr(db.catalogs, "read", no_read)
    # a new database's catalog is known empty; each DDL commit's catalog is the one it validated
    db.create_table("a", SCHEMA)
    with db.transaction() as t:
        t.create_table("b", pa.schema([("x", pa.int8())]))
        t.rename_table("a", "c")
        t.insert("c", table(range(2)))
    db.drop_table("b")
    assert db.tables() == ["c"]
    assert db.table("c").schema == SCHEMA
    assert db.table("c").count() == 2
    monkeypatch.undo()
    # what was cached is what a read of the catalog gives
    ts = db.latest()
    cached = db.catalog(ts)
    db.catalogs.forget_views()
    assert db.catalog(ts) == cached
    assert db.catalogs.read(ts) == cached


def _concurrent(monkeypatch: pytest.MonkeyPatch, pick: object) -> list[str]:
    """Make the first call of ``PersistClient.register_schema`` for each schema ``pick`` accepts wait
    (up to 10 s) for a second such call to be under way; return how those waits ended."""
    barrier = threading.Barrier(2, timeout=10)
    seen: set[str] = set()
    outcome: list[str] = []
    orig = PersistClient.register_schema

    def register_schema(self: PersistClient, shard_id: str, schema: Schema) -> None:
        if pick(schema) and str(shard_id) not in seen:  # type: ignore[operator]
            seen.add(str(shard_id))
            try:
                barrier.wait()
                outcome.append("together")
            except threading.BrokenBarrierError:
                outcome.append("alone")
        orig(self, shard_id, schema)

    monkeypatch.setattr(PersistClient, "register_schema", register_schema)
    return outcome


def test_a_new_database_writes_its_system_schemas_at_once(db_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    outcome = _concurrent(monkeypatch, lambda s: s in (CATALOG_SCHEMA, COMMITS_SCHEMA))
    db = txns.connect(db_url)
    db.create_table("t", SCHEMA)
    assert outcome == ["together", "together"]
    db.close()


def test_tables_created_together_have_their_schemas_written_at_once(
    db: txns.Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    keys = {SCHEMA, pa.schema([("x", pa.int8())])}
    outcome = _concurrent(monkeypatch, lambda s: isinstance(s, Schema) and s.key in keys)
    with db.transaction() as t:
        t.create_table("a", SCHEMA)
        t.create_table("b", pa.schema([("x", pa.int8())]))
    assert outcome == ["together", "together"]
    assert db.tables() == ["a", "b"]


def test_a_transactions_tables_are_written_out_at_once(db: txns.Database, monkeypatch: pytest.MonkeyPatch) -> None:
    from persist.batch import BatchBuilder

    db.create_table("a", SCHEMA)
    db.create_table("b", SCHEMA)
    ids = {db.entry(n, db.latest()).data_id for n in ("a", "b")}
    barrier = threading.Barrier(2, timeout=10)
    outcome: list[str] = []
    orig = BatchBuilder.finish

    def finish(self: BatchBuilder) -> object:
        if self.shard_id in ids and self._result is None:
            try:
                barrier.wait()
                outcome.append("together")
            except threading.BrokenBarrierError:
                outcome.append("alone")
        return orig(self)

    monkeypatch.setattr(BatchBuilder, "finish", finish)
    with db.transaction() as t:
        t.insert("a", table(range(100)))
        t.insert("b", table(range(100)))
    assert outcome == ["together", "together"]
    assert db.table("a").count() == db.table("b").count() == 100


def test_a_table_not_written_since_is_read_without_a_state_read(
    db: txns.Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    from persist._internal.machine import Machine

    db.create_table("quiet", SCHEMA)
    db.create_table("busy", SCHEMA)
    with db.transaction() as t:
        t.insert("quiet", table(range(3)))
    db._settle()
    assert db.table("quiet").count() == 3
    for i in range(3):
        with db.transaction() as t:
            t.insert("busy", table(range(i, i + 1)))
    d = db.entry("quiet", db.latest()).data_id
    fetched: list[str] = []
    orig = Machine.fetch

    def fetch(self: Machine) -> object:
        fetched.append(self.shard_id)
        return orig(self)

    monkeypatch.setattr(Machine, "fetch", fetch)
    assert rows(db.table("quiet").to_arrow()) == rows(table(range(3)))
    assert d not in fetched  # no write to it since its cached state: that state is the snapshot


def test_a_stale_connection_reads_commits_another_applied_and_tidied(db_url: str, db: txns.Database) -> None:
    """Its cached table state predates the apply; its txns cache has seen the tidy: the state must be re-read."""
    db.create_table("t", SCHEMA)
    db.create_table("u", SCHEMA)
    with db.transaction() as t:
        t.insert("t", table(range(2)))
    other = txns.connect(db_url, create=False)
    assert other.table("t").count() == 2  # caches the table's state
    with db.transaction() as t:
        t.insert("t", table(range(2, 4)))
    db._settle()  # applied...
    with db.transaction() as t:
        t.insert("t", table(range(4, 5)))  # ...and tidied by this commit
    db._settle()
    with db.transaction() as t:
        t.insert("t", table(range(5, 6)))  # (and tidied again: the log keeps none of the earlier ones)
    db._settle()
    with db.transaction() as t:
        t.insert("u", table(range(1)))  # (so the latest time is past the table's last write)
    db._settle()
    d = db.entry("t", db.latest()).data_id
    before = seqnos(db_url, [d])
    assert rows(other.table("t").to_arrow()) == rows(table(range(6)))
    assert seqnos(db_url, [d]) == before  # read from a fresh state and the log: nothing applied or filled
    other.close()


# ---- creating a database and tables ---------------------------------------------------------


def test_a_new_database_opens_its_txns_shard_while_writing_its_root(
    db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from txns.db import opening

    barrier = threading.Barrier(2, timeout=10)
    outcome: list[str] = []

    def meet() -> None:
        try:
            barrier.wait()
            outcome.append("together")
        except threading.BrokenBarrierError:
            outcome.append("alone")

    orig_root, orig_open = opening.create_root, TxnsHandle.open

    def create_root(*a: object) -> object:
        meet()
        return orig_root(*a)  # type: ignore[arg-type]

    def open_(*a: object, **k: object) -> TxnsHandle:
        meet()
        return orig_open(*a, **k)  # type: ignore[arg-type]

    monkeypatch.setattr(opening, "create_root", create_root)
    monkeypatch.setattr(TxnsHandle, "open", staticmethod(open_))
    db = txns.connect(db_url)
    assert outcome == ["together", "together"]
    monkeypatch.undo()
    db.create_table("t", SCHEMA)
    assert db.tables() == ["t"]
    db.close()


def test_the_catalog_is_registered_by_the_first_ddl_commit(db_url: str) -> None:
    import datetime as dt

    db = txns.connect(db_url)
    cache = db.handle.cache
    assert db.root.catalog_id not in cache.registered_now()
    assert db.tables() == [] and db.history().num_rows == 0
    with pytest.raises(txns.ReadBelowSince, match="before the database"):
        db.tables(as_of=dt.datetime.fromtimestamp(db.root.created_ms / 1000 - 60, dt.UTC))
    empty_at = db.latest()
    with db.transaction() as t:
        t.create_table("a", SCHEMA)
    ts = t.commit_info.ts  # type: ignore[union-attr]
    assert cache.registered_at(db.root.catalog_id, ts) and not cache.registered_at(db.root.catalog_id, ts - 1)
    assert db.tables(as_of=empty_at) == [] and db.tables() == ["a"]
    other = txns.connect(db_url)  # another object reads the same
    assert other.tables(as_of=empty_at) == [] and other.tables() == ["a"]
    other.close()
    db.close()


def test_a_creator_that_crashed_after_its_root_record_is_finished_by_the_next_one(db_url: str) -> None:
    from txns.db.root import create_root, new_proposal

    client = PersistClient.open(db_url)
    root = create_root(client, new_proposal(client.config.clock_ms()))  # nothing else was written
    db = txns.connect(db_url)
    assert db.root.txns_id == root.txns_id and db.tables() == []
    db.create_table("t", SCHEMA)  # records the catalog's schema, then registers it in its commit
    with db.transaction() as t:
        t.insert("t", table(range(3)))
    assert db.tables() == ["t"] and db.table("t").count() == 3
    assert client.shard_schema(root.catalog_id) == CATALOG_SCHEMA
    db.close()


def test_a_commit_waits_for_its_new_tables_schemas(db: txns.Database, monkeypatch: pytest.MonkeyPatch) -> None:
    release = threading.Event()
    failures = [1]  # the first background write of the schema fails; the commit writes it again
    orig = PersistClient.register_schema

    def register_schema(self: PersistClient, shard_id: str, schema: Schema) -> None:
        if schema.key.equals(SCHEMA):
            assert release.wait(30)
            if failures:
                failures.pop()
                raise PersistError("injected: the schema write failed")
        orig(self, shard_id, schema)

    monkeypatch.setattr(PersistClient, "register_schema", register_schema)
    upper = db.latest()
    done = threading.Event()

    def create() -> None:
        with db.transaction() as t:
            t.create_table("t", SCHEMA)
        done.set()

    th = threading.Thread(target=create)
    th.start()
    assert not done.wait(0.5), "the commit waits for the schema"
    assert db.handle.cache.shard.fetch().upper == upper + 1, "and has written nothing yet"
    release.set()
    th.join(30)
    assert done.is_set() and db.tables() == ["t"]
    d = db.entry("t", db.latest()).data_id
    assert PersistClient.open(db.url).shard_schema(d) is not None

    def broken(self: PersistClient, shard_id: str, schema: Schema) -> None:
        if schema.key.equals(SCHEMA):
            raise PersistError("injected: the schema write failed")
        orig(self, shard_id, schema)

    monkeypatch.setattr(PersistClient, "register_schema", broken)
    before = db.latest()
    with pytest.raises(PersistError, match="injected"), db.transaction() as t:
        t.create_table("u", SCHEMA)
    assert db.latest() == before and db.tables() == ["t"], "nothing was committed"


def test_an_abandoned_transaction_registers_nothing(db: txns.Database) -> None:
    db.create_table("a", SCHEMA)
    registered = set(db.handle.cache.registered_now())
    before = db.latest()
    with pytest.raises(RuntimeError, match="changed my mind"), db.transaction() as t:
        t.create_table("b", SCHEMA)
        t.insert("b", table(range(5)))
        raise RuntimeError("changed my mind")
    db.handle.cache.sync()
    assert db.tables() == ["a"] and db.latest() == before
    assert set(db.handle.cache.registered_now()) == registered


def test_the_worker_leaves_the_txns_shards_maintenance_to_the_process_that_sequences(
    db: txns.Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    """While another process sequences the queue (``Applier.sequencer_maintains``), the background worker's
    applies leave the txns shard's maintenance to that process (whose writes there take turns with its
    rounds instead of racing them), unless the shard has grown to ``TXNS_OVERGROWN_BATCHES`` batches."""
    db.create_table("t", SCHEMA)
    db._settle()
    maintained: list[int] = []
    real = TxnsHandle.maintain

    def counting(self: TxnsHandle) -> None:
        if threading.current_thread().name.startswith("txns-db-apply"):
            maintained.append(len(self.writer.shard.state().batches))
        real(self)

    monkeypatch.setattr(TxnsHandle, "maintain", counting)

    def commit(n: int) -> None:
        with db.transaction() as t:
            t.insert("t", table([n]))
        assert db._settle(10)

    db._applier.sequencer_maintains = lambda: True
    monkeypatch.setattr("txns.db.applier.TXNS_OVERGROWN_BATCHES", 10_000)
    for n in range(3):
        commit(n)
    assert maintained == []
    monkeypatch.setattr("txns.db.applier.TXNS_OVERGROWN_BATCHES", 1)  # (any shard is overgrown now)
    commit(3)
    assert maintained, "an overgrown txns shard is maintained whoever sequences"
    maintained.clear()
    db._applier.sequencer_maintains = lambda: False
    monkeypatch.setattr("txns.db.applier.TXNS_OVERGROWN_BATCHES", 10_000)
    commit(4)
    assert maintained
    assert rows(db.table("t").to_arrow()) == rows(table(range(5)))
