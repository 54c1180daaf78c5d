"""No starvation: ``db.run`` read-then-write transactions on a few hot keys all commit (txns.db.fairness).

The bank workload: a keyed table of 6 accounts; each call of
``db.run(transfer)`` reads two balances, refuses an overdraft with
``txns.Abort`` and upserts both. N spawned processes each make a fixed
number of calls on ``file://``. Every call must end (committed or
refused), none with ``TransactionConflict``; the final balances must equal
the initial ones plus exactly the transfers the processes were told
committed (nothing lost, nothing twice), so the total is conserved.
``benchmarks/bench_contention.py`` runs the same workload for its latencies.
"""

from __future__ import annotations

import multiprocessing
import random
import threading
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

import txns
from tests import helpers
from txns.db.fairness import PRIORITY_AFTER

TABLE = "accounts"
ACCOUNTS = [f"acct{i}" for i in range(6)]
INITIAL = 100


def make_bank(url: str) -> None:
    """Create the accounts table at ``url`` with every account at ``INITIAL``."""
    db = txns.connect(url)
    db.create_table(TABLE, pa.schema([("account", pa.string()), ("balance", pa.int64())]), primary_key=["account"])
    with db.transaction() as t:
        t.upsert(TABLE, [{"account": a, "balance": INITIAL} for a in ACCOUNTS])
    db.close()


def transfer_worker(url: str, seed: int, calls: int, out: Any, deadline_s: float = 120.0) -> None:
    """Make ``calls`` transfers with ``db.run``; put (seed, transfers, errors, turns taken, turn waits) on ``out``.

    A transfer is ``(src, dst, amount, committed, latency_s, attempts)``.
    """
    rng = random.Random(seed)
    db = txns.connect(url)
    done: list[tuple[str, str, int, bool, float, int]] = []
    errors: list[str] = []
    for _ in range(calls):
        src, dst = rng.sample(ACCOUNTS, 2)
        amount = rng.randint(1, 40)

        def transfer(t: txns.Transaction, src: str = src, dst: str = dst, amount: int = amount) -> None:
            a, b = t.get(TABLE, src), t.get(TABLE, dst)
            if a["balance"] < amount:
                raise txns.Abort(f"{src} has {a['balance']}, cannot pay {amount}")
            t.upsert(TABLE, [{"account": src, "balance": a["balance"] - amount},
                             {"account": dst, "balance": b["balance"] + amount}])

        start = time.perf_counter()
        try:
            info = db.run(transfer, deadline_s=deadline_s)
            done.append((src, dst, amount, True, time.perf_counter() - start, info.attempts))
        except txns.Abort:
            done.append((src, dst, amount, False, time.perf_counter() - start, 0))
        except txns.TransactionConflict as e:
            errors.append(str(e))
    turns = db._run_turns
    out.put((seed, done, errors, turns.taken, turns.waited))
    db.close()


def run_processes(url: str, procs: int, calls: int) -> list[tuple[int, list[Any], list[str], int, int]]:
    """Run ``procs`` spawned transfer workers of ``calls`` each; their reports."""
    ctx = multiprocessing.get_context("spawn")
    out = ctx.Queue()
    ps = [ctx.Process(target=transfer_worker, args=(url, seed, calls, out)) for seed in range(procs)]
    for p in ps:
        p.start()
    try:
        results = [out.get(timeout=500) for _ in ps]
    finally:
        for p in ps:
            p.join(60)
            if p.is_alive():
                p.kill()
    assert all(p.exitcode == 0 for p in ps)
    return results


def balances(url: str) -> dict[str, int]:
    db = txns.connect(url)
    try:
        return {r["account"]: r["balance"] for r in db.table(TABLE).to_arrow().to_pylist()}
    finally:
        db.close()


def check_bank(url: str, results: list[tuple[int, list[Any], list[str], int, int]], calls: int) -> None:
    expect = dict.fromkeys(ACCOUNTS, INITIAL)
    for _seed, done, errors, _taken, _waited in results:
        assert errors == []  # no call gave up
        assert len(done) == calls  # every call ended, committed or refused
        for src, dst, amount, committed, _lat, _attempts in done:
            if committed:
                expect[src] -= amount
                expect[dst] += amount
    got = balances(url)
    assert got == expect  # exactly the committed transfers, once each
    assert sum(got.values()) == INITIAL * len(ACCOUNTS)
    assert all(v >= 0 for v in got.values())  # no overdraft committed


@pytest.mark.timeout(540)
@pytest.mark.parametrize(
    ("procs", "calls"),
    [(3, 12), (8, 5), pytest.param(16, 4, marks=pytest.mark.slow)],
)
def test_processes_on_hot_keys_all_commit(tmp_path: Path, procs: int, calls: int) -> None:
    url = helpers.file_url(tmp_path / "bank")
    make_bank(url)
    results = run_processes(url, procs, calls)
    check_bank(url, results, calls)


def test_a_slow_transaction_gets_the_turn_and_commits(db_url: str) -> None:
    """A read-then-write that is slower than its rivals' commits would lose every time; the turn lets it commit.

    Two hog threads (each its own database object, as another process)
    bump one key with ``db.run`` as fast as they can; the slow one reads the
    key, waits, writes it. After ``PRIORITY_AFTER`` conflicts it takes the
    run turn, the hogs wait for it, and it commits within a few attempts.
    """
    make_bank(db_url)
    stop = threading.Event()
    hogs: list[txns.Database] = []
    bumps = [0, 0]

    def hog(i: int) -> None:
        db = txns.connect(db_url)
        hogs.append(db)

        def bump(t: txns.Transaction) -> None:
            row = t.get(TABLE, "acct0")
            t.upsert(TABLE, [{"account": "acct0", "balance": row["balance"] + 1}])

        while not stop.is_set():
            db.run(bump)
            bumps[i] += 1

    threads = [threading.Thread(target=hog, args=(i,)) for i in range(2)]
    for th in threads:
        th.start()
    db = txns.connect(db_url)
    try:
        while sum(bumps) < 5:  # the hogs are committing
            time.sleep(0.01)

        def slow(t: txns.Transaction) -> None:
            row = t.get(TABLE, "acct0")
            time.sleep(0.4)  # (much longer than a hog's whole transaction: without the turn it always loses)
            t.upsert(TABLE, [{"account": "acct0", "balance": row["balance"] + 1000}])

        info = db.run(slow, deadline_s=120)
    finally:
        stop.set()
        for th in threads:
            th.join()
    assert info.attempts > PRIORITY_AFTER  # it did lose (else this test shows nothing) ...
    assert db._run_turns.taken == 1  # ... took the turn once ...
    assert sum(h._run_turns.waited for h in hogs) >= 1  # ... the hogs waited for it ...
    assert info.attempts <= PRIORITY_AFTER + 6  # ... and it committed soon after (each hog: one in flight)
    final = balances(db_url)["acct0"]
    assert final == INITIAL + 1000 + sum(bumps)  # every bump and the slow one, once each
    db.close()
    for h in hogs:
        h.close()
