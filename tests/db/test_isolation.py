"""Isolation: read-then-write transactions, db.run, the oracles, and histories checked for anomalies."""

from __future__ import annotations

import random
import threading
import time
from collections import Counter
from typing import Any

import pyarrow as pa
import pytest

import txns
from persist import InvalidUsage
from tests.helpers import RecordingLock
from tests.isolation import workload
from tests.isolation.checker import check
from txns import TxnsHandle
from txns.db import committer as committer_module
from txns.db.oracle import LocalOracle, Timeline
from txns.errors import NotRegistered

ACCOUNTS = pa.schema([("account", pa.string()), ("balance", pa.int64())])


def _bank(db: txns.Database, balances: dict[str, int]) -> None:
    db.create_table("accounts", ACCOUNTS, primary_key=["account"])
    with db.transaction() as t:
        t.insert("accounts", [{"account": a, "balance": b} for a, b in balances.items()])


def _balances(db: txns.Database, as_of: int | None = None) -> dict[str, int]:
    """The balances by account; AssertionError if an account has more than one row (a dict would hide it)."""
    rows = _rows(db, as_of)
    counts = Counter(a for a, _ in rows)
    assert all(n == 1 for n in counts.values()), f"an account with several rows at {as_of}: {sorted(rows)}"
    return dict(rows)


def _rows(db: txns.Database, as_of: int | None = None) -> list[tuple[str, int]]:
    """Every row of ``accounts`` as ``(account, balance)``: a multiset, duplicates kept."""
    return [(r["account"], r["balance"]) for r in db.table("accounts").to_arrow(as_of=as_of).to_pylist()]


# ---- read-then-write basics ---------------------------------------------------------------------


def test_a_lost_update_is_refused(db: txns.Database) -> None:
    _bank(db, {"alice": 100})
    t1, t2 = db.transaction(), db.transaction()
    a1, a2 = t1.get("accounts", "alice"), t2.get("accounts", "alice")
    assert a1 == a2 == {"account": "alice", "balance": 100}
    t1.upsert("accounts", [{"account": "alice", "balance": a1["balance"] - 30}])
    t2.upsert("accounts", [{"account": "alice", "balance": a2["balance"] - 50}])
    t1.commit()
    with pytest.raises(txns.TransactionConflict, match="nothing was committed"):
        t2.commit()
    assert _balances(db) == {"alice": 70}
    with pytest.raises(txns.TransactionClosed):
        t2.upsert("accounts", [{"account": "alice", "balance": 0}])


def test_unchanged_reads_commit_later_without_a_rerun(db: txns.Database) -> None:
    _bank(db, {"alice": 100, "bob": 0})
    runs = []
    other_done = threading.Event()

    def pay(t: txns.Transaction) -> None:
        runs.append(1)
        a = t.get("accounts", "alice")
        if len(runs) == 1 and not other_done.is_set():
            # another commit lands between this read and the commit; it writes a key this did not read
            with db.transaction() as o:
                o.upsert("accounts", [{"account": "bob", "balance": 5}])
            other_done.set()
        t.upsert("accounts", [{"account": "alice", "balance": a["balance"] - 10}])

    info = db.run(pay)
    assert len(runs) == 1 and info.attempts == 1  # the function ran once
    assert info.read_ts is not None and info.ts == max(info.ts, info.read_ts + 1)
    assert info.read_ts >= db.history(limit=2).column("ts").to_pylist()[1]  # its reads hold after the other commit
    assert _balances(db) == {"alice": 90, "bob": 5}


def test_a_scan_conflicts_with_any_write_to_the_table(db: txns.Database) -> None:
    _bank(db, {"alice": 100, "bob": 0})
    t = db.transaction()
    total = sum(t.read("accounts").column("balance").to_pylist())
    with db.transaction() as o:
        o.upsert("accounts", [{"account": "carol", "balance": 1}])
    t.upsert("accounts", [{"account": "audit", "balance": total}])
    with pytest.raises(txns.TransactionConflict, match="'accounts'"):
        t.commit()
    assert "audit" not in _balances(db)


def test_a_drop_between_read_and_commit_conflicts(db: txns.Database) -> None:
    _bank(db, {"alice": 100})
    db.create_table("log", pa.schema([("msg", pa.string())]))
    t = db.transaction()
    t.get("accounts", "alice")
    t.insert("log", [{"msg": "seen alice"}])
    db.drop_table("accounts")
    with pytest.raises(txns.TransactionConflict, match="dropped, renamed or re-created"):
        t.commit()
    assert db.table("log").to_arrow().num_rows == 0


def test_run_retries_conflicts_until_every_increment_lands(db_url: str) -> None:
    db = txns.connect(db_url)
    _bank(db, {"counter": 0})
    attempts: list[int] = []

    def worker() -> None:
        mine = txns.connect(db_url)  # (its own client and cache: like another process)
        for _ in range(8):

            def bump(t: txns.Transaction) -> None:
                row = t.get("accounts", "counter")
                t.upsert("accounts", [{"account": "counter", "balance": row["balance"] + 1}])

            attempts.append(mine.run(bump, max_attempts=200).attempts)
        mine.close()

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert _balances(db) == {"counter": 32}  # nothing lost, nothing twice
    assert len(attempts) == 32 and max(attempts) > 1  # there was contention, and run() retried it
    db.close()


def test_abort_commits_nothing_and_is_not_retried(db: txns.Database) -> None:
    _bank(db, {"alice": 5, "bob": 0})
    runs = []

    def transfer(t: txns.Transaction) -> None:
        runs.append(1)
        a = t.get("accounts", "alice")
        t.upsert("accounts", [{"account": "bob", "balance": 10}])
        if a["balance"] < 10:
            raise txns.Abort("insufficient funds")

    before = len(db.history())
    with pytest.raises(txns.Abort, match="insufficient funds"):
        db.run(transfer)
    assert len(runs) == 1 and len(db.history()) == before
    assert _balances(db) == {"alice": 5, "bob": 0}


def test_run_gives_up_after_max_attempts(db: txns.Database) -> None:
    _bank(db, {"alice": 0})

    def always_conflicts(t: txns.Transaction) -> None:
        t.get("accounts", "alice")
        with db.transaction() as o:  # a concurrent writer of the same key, every time
            o.upsert("accounts", [{"account": "alice", "balance": random.randrange(1 << 30)}])
        t.upsert("accounts", [{"account": "alice", "balance": -1}])

    with pytest.raises(txns.TransactionConflict) as e:
        db.run(always_conflicts, max_attempts=3)
    assert e.value.attempts == 3 and "3 attempts" in str(e.value)
    assert _balances(db)["alice"] != -1


def test_bad_isolation_and_run_arguments(db_url: str) -> None:
    db = txns.connect(db_url)
    with pytest.raises(InvalidUsage, match="isolation must be one of"):
        db.transaction(isolation="snapshot")
    with pytest.raises(InvalidUsage, match="isolation must be one of"):
        txns.connect(db_url, isolation="read_committed")
    with pytest.raises(InvalidUsage, match="max_attempts"):
        db.run(lambda t: None, max_attempts=0)
    with pytest.raises(InvalidUsage, match="function of a transaction"):
        db.run("not callable")  # type: ignore[arg-type]
    db.close()


# ---- the oracles ---------------------------------------------------------------------------------


def test_serializable_reads_may_be_stale_strict_ones_are_not(db_url: str) -> None:
    a = txns.connect(db_url)
    _bank(a, {"alice": 1})
    b = txns.connect(db_url)  # another process, in effect
    _ = b.read().ts  # (b has seen the database once)
    with a.transaction() as t:
        t.upsert("accounts", [{"account": "alice", "balance": 2}])
    with b.read(isolation="serializable") as r:
        assert r.table("accounts").to_arrow().to_pylist()[0]["balance"] == 1  # what b last saw: no request
    with b.read(isolation="strict_serializable") as r:
        assert r.table("accounts").to_arrow().to_pylist()[0]["balance"] == 2  # a linearizable read of the upper
    # a serializable read-then-write still validates: its stale read conflicts
    t = b.transaction(isolation="serializable")
    row = t.get("accounts", "alice")
    if row["balance"] == 1:  # (stale, as above)
        t.upsert("accounts", [{"account": "alice", "balance": row["balance"] + 10}])
        with pytest.raises(txns.TransactionConflict):
            t.commit()
    assert _balances(a) == {"alice": 2}
    a.close()
    b.close()


# ---- the bank: overdraft checks under contention --------------------------------------------------


def test_bank_transfers_never_overdraw_nor_lose_money(db_url: str) -> None:
    db = txns.connect(db_url)
    accounts = [f"a{i}" for i in range(5)]
    _bank(db, dict.fromkeys(accounts, 50))
    funded_ts = db.latest()
    aborted: list[int] = []

    def worker(seed: int) -> None:
        rng = random.Random(seed)
        mine = txns.connect(db_url)
        for _ in range(12):
            src, dst = rng.sample(accounts, 2)
            amount = rng.randint(1, 60)

            def transfer(t: txns.Transaction, src: str = src, dst: str = dst, amount: int = amount) -> None:
                s, d = t.get("accounts", src), t.get("accounts", dst)
                if s["balance"] < amount:
                    raise txns.Abort("insufficient funds")
                t.upsert("accounts", [{"account": src, "balance": s["balance"] - amount}])
                t.upsert("accounts", [{"account": dst, "balance": d["balance"] + amount}])

            try:
                mine.run(transfer, max_attempts=500)
            except txns.Abort:
                aborted.append(1)
        mine.close()

    threads = [threading.Thread(target=worker, args=(s,)) for s in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    db._settle()
    checked = 0
    for ts in sorted(t for t in set(db.history().column("ts").to_pylist()) if t >= funded_ts):
        # every timestamp from the funding on: exactly one row per account (a multiset, not a dict)
        rows = _rows(db, ts)
        assert Counter(a for a, _ in rows) == Counter(accounts), f"not one row per account at {ts}: {sorted(rows)}"
        assert sum(b for _, b in rows) == 250, f"money created or lost at {ts}: {sorted(rows)}"
        assert min(b for _, b in rows) >= 0, f"overdraft at {ts}: {sorted(rows)}"
        checked += 1
    assert checked == 1 + 4 * 12 - len(aborted)  # the funding and every committed transfer
    assert Counter(a for a, _ in _rows(db)) == Counter(accounts)  # and at the latest time
    db.close()


# ---- histories checked for anomalies ---------------------------------------------------------------


@pytest.mark.parametrize("isolation", ["strict_serializable", "serializable"])
def test_list_append_histories_have_no_anomalies(db_url: str, isolation: str) -> None:
    db = txns.connect(db_url)
    workload.create(db)
    ops = workload.run_threads(
        lambda: txns.connect(db_url), workers=4, txns_each=25, keys=5, isolation=isolation, seed=1, pause_s=0.01
    )
    db.close()
    result = check(ops, isolation)
    assert result.op_counts["committed"] >= 60
    assert result.valid, result.summary()


class LaggingOracle(LocalOracle):
    """A deliberately broken oracle: reads at the time it last read the upper, refreshed every 4th call only."""

    def __init__(self, db: Timeline) -> None:
        super().__init__(db)
        self._calls = 0
        self._ts: int | None = None

    def read_ts(self) -> int:
        self._calls += 1
        if self._ts is None or self._calls % 4 == 0:
            self._ts = self._db.latest()
        return self._ts


def test_the_checker_catches_stale_reads_under_a_weakened_strict_level(db_url: str) -> None:
    db = txns.connect(db_url)
    workload.create(db)

    def weakened() -> txns.Database:
        d = txns.connect(db_url)
        d.oracles.by_level["strict_serializable"] = LaggingOracle(d.timeline)  # stale reads, called strict
        return d

    ops = workload.run_threads(weakened, workers=4, txns_each=25, keys=3, isolation="strict_serializable", seed=2)
    db.close()
    assert check(ops, "serializable").valid  # still serializable: the commits validate what they read
    result = check(ops, "strict_serializable")
    assert not result.valid and any(n.endswith("-realtime") for n in result.anomaly_names), result.summary()


def test_the_checker_catches_lost_updates_without_validation(db_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    db = txns.connect(db_url)
    workload.create(db)
    monkeypatch.setattr(committer_module, "conflict", lambda *a, **k: None)  # commit later without checking reads
    ops = workload.run_threads(
        lambda: txns.connect(db_url), workers=4, txns_each=25, keys=2, isolation="serializable", seed=3
    )
    db.close()
    result = check(ops, "serializable")
    assert not result.valid and result.anomaly_names & {"G-single", "G2", "incompatible-order"}, result.summary()


# ---- group commit: threads sharing one database object ------------------------------------------------


def test_concurrent_commits_in_one_process_share_conditional_writes(db: txns.Database) -> None:
    db.create_table("events", pa.schema([("worker", pa.int64()), ("i", pa.int64())]))
    _bank(db, {"counter": 0})
    infos: list[txns.CommitInfo] = []
    lock = threading.Lock()
    start = threading.Barrier(8)
    grouped, groups = db.grouped_transactions, db.group_commits

    def worker(w: int) -> None:
        start.wait()
        for i in range(10):
            with db.transaction(metadata={"w": w, "i": i}) as t:  # blind writes
                t.insert("events", [{"worker": w, "i": i}])
            with lock:
                infos.append(t.commit_info)  # type: ignore[arg-type]

            def bump(t: txns.Transaction) -> None:  # read-then-write on one key: never in one group twice
                row = t.get("accounts", "counter")
                t.upsert("accounts", [{"account": "counter", "balance": row["balance"] + 1}])

            db.run(bump, max_attempts=1000)

    threads = [threading.Thread(target=worker, args=(w,)) for w in range(8)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert db.grouped_transactions - grouped == 160
    assert db.group_commits - groups < 160  # some conditional writes carried several transactions
    events = db.table("events").to_arrow().to_pylist()
    assert sorted((r["worker"], r["i"]) for r in events) == sorted((w, i) for w in range(8) for i in range(10))
    assert _balances(db) == {"counter": 80}  # no lost update inside a group
    # each transaction has its own identity and commit record, found in history
    ids = {i.txn_id for i in infos}
    assert len(ids) == 80
    history = db.history()
    assert ids <= set(history.column("txn_id").to_pylist())
    meta = [m for m in history.column("metadata").to_pylist() if '"w"' in m]
    assert len(meta) == 80


def test_a_transaction_committed_in_another_threads_group_returns_without_the_handle_lock(db: txns.Database) -> None:
    """Only the thread that leads a group takes the handle lock to commit it; a member returns once its outcome
    is set. (Waiting for the lock, a member also waited out the next group's write, or its whole wait in the
    cross-process queue, or anything else that held the lock meanwhile.)"""
    db.create_table("events", pa.schema([("worker", pa.int64()), ("i", pa.int64())]))
    committer = db.committer

    def both_queued() -> None:  # (so that whoever leads commits both in one group)
        deadline = time.monotonic() + 10
        while len(committer._queue) < 2 and time.monotonic() < deadline:
            time.sleep(0.001)

    lock = committer._lock = RecordingLock(committer._lock, both_queued)  # type: ignore[assignment]
    grouped, groups = db.grouped_transactions, db.group_commits

    def worker(w: int) -> None:
        with db.transaction() as t:
            t.insert("events", [{"worker": w, "i": 0}])

    threads = [threading.Thread(target=worker, args=(w,), name=f"writer-{w}") for w in range(2)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(30)
    assert db.grouped_transactions - grouped == 2 and db.group_commits - groups == 1
    assert len([n for n in lock.takers if n.startswith("writer-")]) == 1, lock.takers
    events = db.table("events").to_arrow().to_pylist()
    assert sorted(r["worker"] for r in events) == [0, 1]


def test_the_latest_time_seen_is_read_without_the_handle_lock_and_never_goes_back(db: txns.Database) -> None:
    """Every transaction begins at the latest time this process saw (``Timeline.cached_latest``), read without
    the handle lock, which a group's leader holds through its write (at 64 threads in the S3 model, threads
    waited there a quarter of their time). It never goes back, not even while the txns cache restarts from
    a snapshot, which lowers its frontier until it has read the shard again."""
    db.create_table("events", pa.schema([("worker", pa.int64()), ("i", pa.int64())]))
    with db.transaction() as t:
        t.insert("events", [{"worker": 0, "i": 0}])
    seen = t.commit_info.ts  # type: ignore[union-attr]
    held, release = threading.Event(), threading.Event()

    def hold() -> None:
        with db.committer._lock:
            held.set()
            release.wait(10)

    holder = threading.Thread(target=hold)
    holder.start()
    assert held.wait(5)
    try:
        got: list[int | None] = []
        reader = threading.Thread(target=lambda: got.append(db.timeline.cached_latest()))
        reader.start()
        reader.join(5)
        assert got and got[0] is not None and got[0] >= seen, "cached_latest waited for the handle lock"
    finally:
        release.set()
        holder.join(10)
    cache = db.handle.cache
    real = cache._absorb
    during: list[tuple[int, int | None]] = []

    def absorb(state):  # type: ignore[no-untyped-def]
        during.append((cache.frontier, db.timeline.cached_latest()))
        return real(state)

    with db.committer._lock:
        cache._absorb = absorb  # type: ignore[method-assign]  # (this cache only: not the applier's)
        try:
            cache._start()  # (as when its hold lapsed)
        finally:
            del cache._absorb
    assert during and during[0][0] <= seen  # the restart's frontier fell back...
    assert all(latest is not None and latest >= seen for _, latest in during)  # ...the latest time seen did not


def test_strict_read_times_share_head_reads_but_never_one_started_earlier(db_url: str) -> None:
    from txns.db.oracle import SharedOracle

    db = txns.connect(db_url)
    _bank(db, {"alice": 1})
    oracle = SharedOracle(db.timeline)
    real = db.timeline.latest
    entered = threading.Event()
    release = threading.Event()

    def slow_latest() -> int:
        ts = real()
        entered.set()
        release.wait(5)  # a head read in flight, holding an old answer
        return ts

    db.timeline.latest = slow_latest  # type: ignore[method-assign]
    got: dict[str, int] = {}
    first = threading.Thread(target=lambda: got.__setitem__("first", oracle.read_ts()))
    first.start()
    assert entered.wait(5)
    db.timeline.latest = real  # type: ignore[method-assign]
    with db.transaction() as t:  # completes while the first head read is still in flight
        t.upsert("accounts", [{"account": "alice", "balance": 2}])
    committed = t.commit_info.ts  # type: ignore[union-attr]
    late = threading.Thread(target=lambda: got.__setitem__("late", oracle.read_ts()))
    late.start()
    release.set()
    first.join(5)
    late.join(5)
    assert got["first"] < committed <= got["late"]  # the late caller did not reuse the earlier read
    # many callers at once share reads: the first head read is held until the 15 others wait behind
    # it (counted by the oracle's condition), so exactly two head reads serve all 16
    class CountingCondition(threading.Condition):
        waits = 0

        def wait(self, timeout: float | None = None) -> bool:
            self.waits += 1
            return super().wait(timeout)

    cv = CountingCondition()
    oracle._cv = cv
    first_read = threading.Event()
    tick = threading.Event()  # (never set: a 1 ms pause while polling)

    def held() -> int:
        if not first_read.is_set():
            first_read.set()
            for _ in range(10_000):  # until the others wait (bounded: 10 s at most)
                if cv.waits >= 15:
                    break
                tick.wait(0.001)
        return real()

    db.timeline.latest = held  # type: ignore[method-assign]
    out: list[int] = []
    threads = [threading.Thread(target=lambda: out.append(oracle.read_ts())) for _ in range(16)]
    before = oracle.head_reads
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    db.timeline.latest = real  # type: ignore[method-assign]
    assert cv.waits >= 15, "the callers did not pile up behind the first read"
    assert len(out) == 16 and min(out) >= committed
    assert oracle.head_reads - before == 2  # the held read, then one for every caller that waited
    db.close()


def test_a_group_failing_on_one_members_usage_error_commits_the_others(db: txns.Database) -> None:
    """Two threads' commits in one group: one writes a table whose shard was forgotten (NotRegistered at
    the write), the other commits; only the first caller sees the error."""
    schema = pa.schema([("i", pa.int64())])
    db.create_table("good", schema)
    db.create_table("gone", schema)
    gone_id = db.entry("gone", db.latest()).data_id
    other = TxnsHandle.open(db.client, db.handle.txns_id)
    other.forget(other.upper, [gone_id])  # (as a retired drop's would, with the catalog not told)
    other.close()
    outcomes: dict[str, object] = {}
    in_flight = threading.Event()
    queued: list[int] = []  # (how many waited in the committer's queue when the first write went on)
    consensus = db.client.consensus
    cas, cas_after = consensus.compare_and_set, consensus.compare_and_set_after

    def gate(key: str) -> None:
        # the first commit's write waits until both others queue behind it: the next group holds both
        if key == db.handle.txns_id and threading.current_thread().name == "first" and not in_flight.is_set():
            in_flight.set()
            deadline = time.monotonic() + 30
            while len(db.committer._queue) < 3 and time.monotonic() < deadline:
                time.sleep(0.001)
            queued.append(len(db.committer._queue))

    def gated_cas(key: str, *args: Any) -> object:
        gate(key)
        return cas(key, *args)

    def gated_cas_after(key: str, *args: Any) -> object:
        gate(key)
        return cas_after(key, *args)

    consensus.compare_and_set = gated_cas  # type: ignore[method-assign]
    consensus.compare_and_set_after = gated_cas_after  # type: ignore[method-assign]

    def commit(t: txns.Transaction, name: str) -> None:
        try:
            outcomes[name] = t.commit()
        except Exception as e:  # noqa: BLE001 - the outcome under test
            outcomes[name] = e

    staged = {}
    for name, i in (("good", 0), ("gone", 1), ("good", 2)):  # (built first: only their commits run in threads)
        staged[f"{name}{i}"] = t = db.transaction()
        t.insert(name, [{"i": i}])
    first = threading.Thread(target=commit, args=(staged["good0"], "good0"), name="first")
    first.start()
    assert in_flight.wait(30)
    threads = [first, *(threading.Thread(target=commit, args=(staged[n], n)) for n in ("gone1", "good2"))]
    for th in threads[1:]:
        th.start()
    for th in threads:
        th.join(60)
    assert queued == [3]
    assert isinstance(outcomes["gone1"], NotRegistered), outcomes
    assert isinstance(outcomes["good0"], txns.CommitInfo) and isinstance(outcomes["good2"], txns.CommitInfo), outcomes
    assert sorted(r["i"] for r in db.table("good").to_arrow().to_pylist()) == [0, 2]
