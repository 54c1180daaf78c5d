"""Exactly once under faults: one deterministic regression test per problem found by the chaos runs.

1. A commit that landed was reported ``Determinate`` (the re-read after the
   write failed, and a read's failure counted as "did not happen").
2. A transaction whose part upload failed could never be committed.
3. An uncertain commit that someone applied and tidied was committed again.
4. Committing the same ``Txn`` twice wrote its rows twice.
5. The CLI exited 2 ("your mistake") on storage failures; opening a store
   did not retry a transient failure.
6. A killed process held the txns shard's since for 15 minutes.
"""

from __future__ import annotations

import http.server
import threading
from collections.abc import Iterator

import pytest

from persist import Determinate, Indeterminate, PersistClient, PersistConfig, ShardState
from persist.location import CaSResult, Consensus, VersionedData
from persist.mem import MemBlob, MemConsensus
from persist.unreliable import Fault, Faults, Op, UnreliableBlob, UnreliableConsensus
from persist.url import Location
from tests.txns.model import SCHEMA, Store, new_id, txns_shard_contents
from txns import Txn, TxnsHandle
from txns.cli import main as cli_main

BIG = "x" * 20_000  # bigger than inline_max_bytes: the batch becomes a Parquet part


def _setup(config: PersistConfig, faults: Faults | None = None) -> tuple[Store, TxnsHandle, str, str]:
    store = Store(faults=faults, config=config)
    h = TxnsHandle.open(store.client(), new_id())
    d0, d1 = new_id(), new_id()
    h.register(1, {d0: SCHEMA, d1: SCHEMA})
    return store, h, d0, d1


def _multiplicity(h: TxnsHandle, d: str, as_of: int) -> dict:
    return {kv: diff for kv, _, diff in h.snapshot(d, as_of)}


# ---- 1. landed, then a failed re-read: Indeterminate, never Determinate -------------------


class _LandThenMismatch(Consensus):
    """Lands the next CAS but answers MISMATCH, as a client library's internal retry of a landed
    conditional PUT does (its second attempt gets "already exists")."""

    def __init__(self, inner: Consensus) -> None:
        self.inner = inner
        self.armed = False

    def head(self, key: str, hint: int | None = None) -> VersionedData | None:
        return self.inner.head(key, hint)

    def compare_and_set(self, key: str, expected: int | None, data: bytes) -> CaSResult:
        res = self.inner.compare_and_set(key, expected, data)
        if self.armed and res is CaSResult.COMMITTED:
            self.armed = False
            return CaSResult.MISMATCH
        return res

    def scan(self, key: str, from_seqno: int, limit: int) -> list[VersionedData]:
        return self.inner.scan(key, from_seqno, limit)

    def truncate(self, key: str, seqno: int) -> int:
        return self.inner.truncate(key, seqno)

    def list_keys(self) -> Iterator[str]:
        return self.inner.list_keys()


@pytest.mark.parametrize("how", ["reply lost", "retried into 412"])
def test_a_landed_commit_whose_reread_fails_is_indeterminate_and_commits_once(how: str) -> None:
    faults = Faults(seed=1)
    config = PersistConfig(retry_deadline_s=0.2, read_wait_s=1.0)
    mem = MemConsensus()
    trick = _LandThenMismatch(UnreliableConsensus(mem, faults))
    client = PersistClient(Location(f"mem://eo-{new_id()}", UnreliableBlob(MemBlob(), faults), trick), config)
    h = TxnsHandle.open(client, new_id())
    d = new_id()
    h.register(1, {d: SCHEMA})
    txn = h.begin()
    txn.write(d, (1,), ("once",), 1)
    h.prepare_commit()
    if how == "reply lost":
        faults.fail_next(Op.CAS, Fault.AFTER)
    else:
        trick.armed = True
    faults.fail_next(Op.HEAD, Fault.DETERMINATE, n=10_000)  # every read fails past the deadline
    faults.fail_next(Op.SCAN, Fault.DETERMINATE, n=10_000)  # (a cached handle catches up with a scan)
    with pytest.raises(Indeterminate):
        txn.commit_at(h, 2)
    faults.clear()
    fresh = TxnsHandle.open(client, h.txns_id)
    assert fresh.upper == 3, "the commit did land"
    # The documented answer to Indeterminate: commit the same transaction again (here later).
    res = txn.commit_at(h, 7)
    assert res.commit_ts == 2, "the earlier commit is found, not repeated"
    assert _multiplicity(fresh, d, 2) == {((1,), ("once",)): 1}
    assert fresh.upper == 3, "nothing else was committed"


def test_machine_reports_indeterminate_for_any_failure_after_a_possible_write() -> None:
    faults = Faults(seed=2)
    _store, h, d0, _ = _setup(PersistConfig(retry_deadline_s=0.1), faults)
    w = h.data_writer(d0)
    faults.fail_next(Op.CAS, Fault.AFTER)
    faults.fail_next(Op.HEAD, Fault.DETERMINATE, n=10_000)
    faults.fail_next(Op.SCAN, Fault.DETERMINATE, n=10_000)
    with pytest.raises(Indeterminate):
        w.compare_and_append_batch([], w.upper, w.upper + 1)
    faults.clear()
    # and a failure before anything was sent stays Determinate
    faults.fail_next(Op.HEAD, Fault.DETERMINATE, n=10_000)
    faults.fail_next(Op.SCAN, Fault.DETERMINATE, n=10_000)
    with pytest.raises(Determinate):
        w.fetch_recent_upper()


# ---- 2. a failed part upload leaves the transaction committable ----------------------------


def test_a_transaction_whose_part_uploads_failed_commits_later_without_leaking() -> None:
    faults = Faults(seed=3)
    store, h, d0, d1 = _setup(PersistConfig(retry_deadline_s=0.05, read_wait_s=1.0), faults)
    txn = h.begin()
    txn.write(d0, (1,), (BIG,), 1)
    txn.write(d1, (2,), (BIG,), 1)
    faults.fail_next(Op.BLOB_SET, Fault.INDETERMINATE, n=10_000)  # storage down for every upload
    for _ in range(2):
        with pytest.raises(Indeterminate):
            txn.commit_at(h, 2)
    faults.clear()  # storage is back
    res = txn.commit_at(h, h.upper)
    res.apply(h)
    assert _multiplicity(h, d0, res.commit_ts) == {((1,), (BIG,)): 1}
    assert _multiplicity(h, d1, res.commit_ts) == {((2,), (BIG,)): 1}
    client = store.client()
    referenced = {p.key for d in (d0, d1) for b in client.shard(d).fetch().batches for r in b.runs for p in r.parts}
    written = {k for d in (d0, d1) for k in client.blob.list_keys(f"{d}/parts/")}
    assert referenced and written == referenced, "every upload went to its own key once: nothing leaked"


def test_a_transaction_with_one_failed_shard_finishes_the_others_once() -> None:
    faults = Faults(seed=4)
    store, h, d0, d1 = _setup(PersistConfig(retry_deadline_s=0.0, read_wait_s=1.0), faults)
    txn = h.begin()
    txn.write(d0, (1,), (BIG,), 1)
    txn.write(d1, (2,), (BIG,), 1)
    faults.fail_next(Op.BLOB_SET, Fault.AFTER, n=2)  # an upload lands but reports a failure, twice
    with pytest.raises(Indeterminate):
        txn.commit_at(h, 2)
    res = txn.commit_at(h, 2)  # retried: only the failed upload again, under its key
    res.apply(h)
    assert _multiplicity(h, d0, 2) == {((1,), (BIG,)): 1}
    assert _multiplicity(h, d1, 2) == {((2,), (BIG,)): 1}
    client = store.client()
    written = {k for d in (d0, d1) for k in client.blob.list_keys(f"{d}/parts/")}
    assert len(written) == 2


# ---- 3. applied and tidied, then retried: still once ----------------------------------------


def test_an_uncertain_commit_applied_and_tidied_by_someone_else_is_not_committed_again() -> None:
    faults = Faults(seed=5)
    store, h, d0, d1 = _setup(PersistConfig(retry_deadline_s=0.0, read_wait_s=1.0), faults)
    txn = h.begin()
    txn.write(d0, (1,), ("a",), 1)
    txn.write(d1, (1,), ("b",), 1)
    h.prepare_commit()
    faults.fail_next(Op.CAS, Fault.AFTER)
    with pytest.raises(Indeterminate):
        txn.commit_at(h, 2)
    faults.clear()
    # an operator applies and tidies everything (as `txns apply` does)
    other = TxnsHandle.open(store.client(), h.txns_id)
    tidy = other.apply_le(other.upper - 1)
    other.tidy_at(other.upper, tidy)
    assert not [
        e for e, _ in txns_shard_contents(store.client(), h.txns_id) if not e.is_registration and e.data_id == d0
    ]
    for attempt in (txn, Txn.from_bytes(txn.to_bytes(), other)):  # this object, and a copy elsewhere
        res = attempt.commit_at(h if attempt is txn else other, other.upper + 5)
        assert res.commit_ts == 2
    end = other.upper + 10
    other.tidy_at(end, other.apply_le(end - 1))
    assert _multiplicity(other, d0, end) == {((1,), ("a",)): 1}
    assert _multiplicity(other, d1, end) == {((1,), ("b",)): 1}
    rec = other.commit_record(txn.id)
    assert rec is not None and rec.ts == 2 and rec.tables == {d0: 1, d1: 1}


def test_concurrent_copies_of_one_transaction_commit_once() -> None:
    store, h, d0, _ = _setup(PersistConfig(read_wait_s=2.0))
    txn = h.begin(txn_id="transfer-42", metadata={"job": "t"})
    txn.write(d0, (1,), ("x",), 1)
    data = txn.to_bytes()
    results: list[int] = []
    errors: list[BaseException] = []

    def run() -> None:
        hh = TxnsHandle.open(store.client(), h.txns_id)
        copy = Txn.from_bytes(data, hh)
        for _ in range(200):
            try:
                results.append(copy.commit_at(hh, hh.upper).commit_ts)
                return
            except Exception as e:  # noqa: BLE001 - TimestampUnavailable: retry higher
                if type(e).__name__ != "TimestampUnavailable":
                    errors.append(e)
                    return

    threads = [threading.Thread(target=run) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors
    assert len(results) == 4 and len(set(results)) == 1, results
    h.read_cache().sync()
    assert _multiplicity(h, d0, h.upper - 1) == {((1,), ("x",)): 1}
    rec = h.commit_record("transfer-42")
    assert rec is not None and rec.ts == results[0] and rec.metadata == {"job": "t"}


# ---- 4. the same Txn committed twice ---------------------------------------------------------


def test_committing_the_same_transaction_twice_returns_the_first_commit() -> None:
    _store, h, d0, _ = _setup(PersistConfig())
    txn = h.begin()
    txn.write(d0, (1,), ("a",), 1)
    first = txn.commit_at(h, 2)
    again = txn.commit_at(h, 5)
    assert again == first
    assert h.upper == 3, "the second call committed nothing"
    assert _multiplicity(h, d0, 2) == {((1,), ("a",)): 1}


def test_a_given_transaction_id_commits_once_across_handles() -> None:
    store, h, d0, _ = _setup(PersistConfig())
    a = h.begin(txn_id="batch-7")
    a.write(d0, (1,), ("a",), 1)
    first = a.commit_at(h, 2)
    b = TxnsHandle.open(store.client(), h.txns_id).begin(txn_id="batch-7")
    b.write(d0, (1,), ("a",), 1)
    assert b.commit_at(b._handle, 9).commit_ts == first.commit_ts  # type: ignore[arg-type]
    assert _multiplicity(h, d0, 2) == {((1,), ("a",)): 1}
    assert h.upper == 3


def test_commit_records_list_every_commit() -> None:
    _store, h, d0, d1 = _setup(PersistConfig())
    ids = []
    for i in range(3):
        t = h.begin(metadata={"i": i})
        t.write(d0 if i % 2 else d1, (i,), ("v",), 1)
        t.commit_at(h, h.upper)
        ids.append(t.id)
    table = h.commit_records(h.upper - 1)
    assert table.column("txn_id").to_pylist() == ids
    assert table.column_names == ["txn_id", "commit_ts", "wall_ms", "info"]
    assert h.commit_record("never-committed") is None


# ---- 5. the CLI and opening a store under storage failures ----------------------------------


class _Flaky(http.server.BaseHTTPRequestHandler):
    """Answers 503 to the first ``failures`` requests, then 200 (enough for S3's bucket check)."""

    failures = 0
    seen = 0

    def do_HEAD(self) -> None:
        cls = type(self)
        cls.seen += 1
        self.send_response(503 if cls.seen <= cls.failures else 200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    do_GET = do_HEAD

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def flaky_endpoint() -> Iterator[type[_Flaky]]:
    handler = type("Flaky", (_Flaky,), {"failures": 0, "seen": 0})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    handler.url = f"http://127.0.0.1:{server.server_address[1]}"  # type: ignore[attr-defined]
    try:
        yield handler
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


def test_opening_a_store_retries_transient_failures(flaky_endpoint: type[_Flaky]) -> None:
    from persist.testing import fake_aws_env

    flaky_endpoint.failures = 6  # more than botocore's own retries
    with fake_aws_env():
        client = PersistClient.open(
            f"s3://bucket/p?endpoint_url={flaky_endpoint.url}&region=us-east-1",  # type: ignore[attr-defined]
            PersistConfig(retry_deadline_s=20.0),
        )
    assert flaky_endpoint.seen > 6
    client.location.close()


def test_the_cli_exits_1_on_storage_failures(flaky_endpoint: type[_Flaky], monkeypatch: pytest.MonkeyPatch) -> None:
    import io

    import persist.client
    from persist.testing import fake_aws_env

    flaky_endpoint.failures = 10**9  # storage never answers
    monkeypatch.setattr(persist.client, "PersistConfig", lambda: PersistConfig(retry_deadline_s=0.3))
    url = f"s3://bucket/p?endpoint_url={flaky_endpoint.url}&region=us-east-1"  # type: ignore[attr-defined]
    for command in (["apply", url, new_id()], ["compact", url, new_id()], ["gc", url, new_id()]):
        err = io.StringIO()
        with fake_aws_env():
            assert cli_main(command, out=io.StringIO(), err=err) == 1, err.getvalue()
        assert "safe to run again" in err.getvalue()


# ---- 6. a killed process releases its hold quickly ----------------------------------------


def test_the_default_lease_bounds_a_dead_holder_to_two_minutes() -> None:
    """With the default config (only the clock injected), a killed holder holds the since for 2 minutes at most."""
    now = [1_000_000]
    store, h, d0, _ = _setup(PersistConfig(clock_ms=lambda: now[0]))
    t = h.begin()
    t.write(d0, (1,), ("v",), 1)
    t.commit_at(h, h.upper).apply(h)
    dead = TxnsHandle.open(store.client(), h.txns_id)  # killed: never closed, never heartbeats again
    dead_reader = dead.cache.reader
    assert dead_reader is not None

    def maintain_and_read() -> ShardState:
        h.tidy_at(h.upper, h.apply_le(h.upper - 1))  # a write: maintenance drops lapsed leases
        h.compact_to(h.upper - 1)
        return store.client().shard(h.txns_id).fetch()

    now[0] += 119_000
    assert dead_reader.reader_id in maintain_and_read().leased, "held for just under two minutes"
    now[0] += 1_001
    state = maintain_and_read()
    assert dead_reader.reader_id not in state.leased, "lapsed after two minutes"
    assert state.since == h.upper - 1, "nothing holds the since back any more"


def test_a_handle_without_a_hold_holds_nothing_and_still_works() -> None:
    store, h, d0, _ = _setup(PersistConfig())
    oneoff = TxnsHandle.open(store.client(), h.txns_id, hold=False)
    t = oneoff.begin()
    t.write(d0, (1,), ("a",), 1)
    res = t.commit_at(oneoff, oneoff.upper)
    tidy = res.apply(oneoff)
    oneoff.tidy_at(oneoff.upper, tidy)
    state = store.client().shard(h.txns_id).fetch()
    assert set(state.leased) == {h.cache.reader.reader_id}, "only the holding handle holds"  # type: ignore[union-attr]
    h.close()
    # with no hold left, compaction passes the one-off cache's frontier; it restarts and stays right
    oneoff.compact_to(oneoff.upper - 1)
    t2 = oneoff.begin()
    t2.write(d0, (2,), ("b",), 1)
    t2.commit_at(oneoff, oneoff.upper).apply(oneoff)
    assert _multiplicity(oneoff, d0, oneoff.upper - 1) == {((1,), ("a",)): 1, ((2,), ("b",)): 1}


def test_a_lapsed_lease_releases_the_txns_shard_since() -> None:
    now = [1_000_000]
    config = PersistConfig(reader_lease_s=10.0, clock_ms=lambda: now[0])
    store, h, d0, _ = _setup(config)
    for i in range(3):
        t = h.begin()
        t.write(d0, (i,), ("v",), 1)
        t.commit_at(h, h.upper).apply(h)
    dead = TxnsHandle.open(store.client(), h.txns_id)  # a process that gets killed: never closed
    dead_reader = dead.cache.reader
    assert dead_reader is not None
    now[0] += 11_000  # the lease passes without a heartbeat
    h.tidy_at(h.upper, h.apply_le(h.upper - 1))
    h.compact_to(h.upper - 1)
    state = store.client().shard(h.txns_id).fetch()
    assert dead_reader.reader_id not in state.leased, "the dead holder's lease lapsed"
    assert state.since == h.upper - 1, "nothing holds the since back any more"


# ---- the commit helper ------------------------------------------------------------------------


def test_commit_helper_retries_taken_times_and_commits_once() -> None:
    store, h, d0, _ = _setup(PersistConfig())
    other = TxnsHandle.open(store.client(), h.txns_id)
    t = h.begin()
    t.write(d0, (1,), ("a",), 1)
    for _ in range(3):  # another handle takes the next times first
        o = other.begin()
        o.write(d0, (9,), ("o",), 1)
        other.commit(o)
    res = h.commit(t, at=1)
    assert res.commit_ts == other.upper == 5
    assert h.commit(t) == res, "a committed transaction returns its commit"
    with pytest.raises(Exception, match="max_attempts must be at least 1"):
        h.commit(h.begin(), max_attempts=0)


def test_catching_up_from_the_cached_state_never_fails_on_a_lease_renewal() -> None:
    now = [1_000_000]
    faults = Faults(seed=9)
    config = PersistConfig(reader_lease_s=10.0, retry_deadline_s=0.0, clock_ms=lambda: now[0])
    store, h, _d0, _ = _setup(config, faults)
    upper = h.upper
    now[0] += 5_000  # past a quarter of the lease: the next catch-up renews it
    calls = faults.counters[Op.CAS].calls
    assert h.upper == upper and faults.counters[Op.CAS].calls == calls, "reading the upper changes nothing"
    faults.fail_next(Op.CAS, Fault.DETERMINATE, n=5)
    h.cache.sync_cached()  # "a failed renewal is deferred, not raised from a catch-up with the cached state"
    assert h.upper == upper
    faults.clear()
    now[0] += 1_000
    h.cache.sync_cached()  # and renewed once storage answers
    assert h.upper == upper
    state = store.client().shard(h.txns_id).fetch()
    assert state.leased[h.cache.reader.reader_id].heartbeat_ms == now[0]  # type: ignore[union-attr]


# ---- the database retries an uncertain data commit itself --------------------------------------


def test_a_database_commit_whose_reply_was_lost_commits_once() -> None:
    import uuid

    import pyarrow as pa

    import txns
    from persist.mem import _STORES

    faults = Faults(seed=11)
    name = f"db-eo-{uuid.uuid4().hex}"
    _STORES[name] = (UnreliableBlob(MemBlob(), faults), UnreliableConsensus(MemConsensus(), faults))  # type: ignore[assignment]
    try:
        db = txns.connect(f"mem://{name}", config=PersistConfig(retry_deadline_s=0.0))
        db.create_table("t", pa.schema([("k", pa.int64())]))
        with db.transaction() as t:
            t.insert("t", [{"k": 0}])
        injected = faults.counters[Op.CAS].injected
        faults.fail_next(Op.CAS, Fault.AFTER)  # the commit lands; its reply is lost
        with db.transaction() as t:
            t.insert("t", [{"k": 1}])
        assert faults.counters[Op.CAS].injected == injected + 1, "the fault hit"
        assert sorted(db.table("t").to_arrow().column("k").to_pylist()) == [0, 1], "committed once"
        assert t.commit_info.txn_id in db.history().column("txn_id").to_pylist()
        db.close()
    finally:
        _STORES.pop(name, None)


# ---- found by the chaos profile with a 1 s part grace --------------------------------------------


def test_a_cache_catching_up_from_a_stale_state_survives_compaction_and_gc() -> None:
    """A handle's machine knew a txns-shard part its cache had not read; compaction retired it and GC
    deleted it (part_grace_s=0); catching up must read the merged parts instead of failing."""
    store = Store(config=PersistConfig(part_grace_s=0.0))
    c1, c2 = store.client(), store.client()
    h1 = TxnsHandle.open(c1, new_id())
    d = new_id()
    h1.register(1, {d: SCHEMA})
    h2 = TxnsHandle.open(c2, h1.txns_id)
    w = h1.data_writer(d)
    big = h1.begin()
    for i in range(100):  # 100 inline batches: entries past the txns shard's inline limit, so a part
        big.write_batch(d, w.batch([(((i,), ("x" * 2500,)), 0, 1)], 0, 1))
    h1.commit(big)
    parts = c1.shard(h1.txns_id).fetch().part_keys()
    assert parts
    h2.read_cache().shard.fetch()  # h2's shard names the part; its cache has not read it
    for i in range(60):  # enough small commits for compaction to merge the big batch away
        t = h1.begin()
        t.write(d, (1000 + i,), ("y",), 1)
        h1.commit(t)
    assert not parts & c1.shard(h1.txns_id).fetch().part_keys()
    assert all(c1.blob.get(k) is None for k in parts), "retired and deleted"
    h2.read_cache().sync_cached()
    assert h2.read_cache().frontier == h1.upper
    assert len(h2.snapshot(d, h1.upper - 1)) == 160


def test_a_lease_renewal_during_a_commit_does_not_make_it_uncertain(tmp_path) -> None:
    """The txns cache moves its hold (a write) while catching up inside a commit attempt: that attempt,
    losing its race, did not write, so the transaction must stay certain (no look-ups, no Indeterminate)."""
    client = PersistClient.open(f"file://{tmp_path}/loc")
    txns_id = new_id()
    h, other = TxnsHandle.open(client, txns_id), TxnsHandle.open(PersistClient.open(f"file://{tmp_path}/loc"), txns_id)
    d = new_id()
    h.register(1, {d: SCHEMA})
    other.begin().commit_at(other, 5)  # h's cache is now behind: its commit at 3 loses and catches up
    assert h.cache.reader is not None
    h.cache.reader.heartbeat_due = lambda: True  # the catch-up moves the hold (a write to the txns shard)
    txn = h.begin()
    txn.write(d, (1,), ("v",), 1)
    with pytest.raises(Exception) as e:
        txn.commit_at(h, 3)
    assert type(e.value).__name__ == "TimestampUnavailable"
    assert txn._uncertain is False  # the hold move is not the commit's write
    assert txn.commit_at(h, 6).commit_ts == 6
