"""Group commit across processes (txns.group_commit): every queued transaction commits exactly once.

Committers here each have their own client and handle (as separate
processes would); one test runs real processes. The SIGKILL chaos test of
sequencers is in tests/chaos/test_group_commit_chaos.py.
"""

from __future__ import annotations

import dataclasses
import multiprocessing
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from persist import Indeterminate, InvalidUsage, PersistClient
from persist.location import CaSResult
from persist.unreliable import Fault, Faults, Op
from tests.helpers import RecordingLock, file_url
from tests.txns.model import SCHEMA, Store, consolidated, new_id
from txns import TxnsHandle
from txns import group_commit as group_commit_module
from txns.errors import NotRegistered
from txns.group_commit import (
    FIRST_LOOK_SHARE,
    GroupCommitFailed,
    GroupCommitter,
    Queued,
    SequencerLease,
    lease_key,
    queue_prefix,
)
from txns.txn import Txn


def _setup(client: PersistClient, shards: int) -> tuple[str, list[str]]:
    txns_id = new_id()
    h = TxnsHandle.open(client, txns_id)
    ds = [new_id() for _ in range(shards)]
    h.register(1, dict.fromkeys(ds, SCHEMA))
    h.close()
    return txns_id, ds


def _contents(client: PersistClient, txns_id: str, ds: list[str]) -> dict[str, dict]:
    h = TxnsHandle.open(client, txns_id)
    h.cache.sync()
    upper = h.upper
    out = {d: consolidated(h.snapshot(d, upper - 1)) for d in ds}
    h.close()
    return out


def _as_queued(txn: Txn, seen_upper: int) -> Queued:
    """``txn`` as a queued object holds it (certain, seen at ``seen_upper``)."""
    return Queued(txn.id, seen_upper, False, frozenset(b.id for bs in txn.batches().values() for b in bs),
                  txn.to_bytes())


def _queue_keys(client: PersistClient, txns_id: str) -> list[str]:
    """The queue's objects, not its commit notes (a note whose writer never read it waits for a sweep)."""
    return [k for k in client.blob.list_keys(queue_prefix(txns_id)) if "/queue/committed/" not in k]


def test_threads_with_their_own_handles_commit_each_transaction_once_in_groups(store: Store) -> None:
    txns_id, ds = _setup(store.client(), 4)
    per = 15
    results: dict[int, list[int]] = {}
    committers = []

    def run(i: int) -> None:
        h = TxnsHandle.open(store.client(), txns_id)
        gc = GroupCommitter(h, direct=False, poll_s=0.001)
        committers.append(gc)
        out = []
        for n in range(per):
            txn = h.begin()
            txn.write(ds[i], (n,), (f"w{i}",), 1)
            out.append(gc.commit(txn).commit_ts)
        results[i] = out
        gc.close()

    threads = [threading.Thread(target=run, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    contents = _contents(store.client(), txns_id, ds)
    for i, d in enumerate(ds):
        assert contents[d] == {((n,), (f"w{i}",)): 1 for n in range(per)}
    assert sum(gc.grouped for gc in committers) == 4 * per
    # transactions shared conditional writes: fewer rounds that committed than transactions
    distinct_ts = {ts for out in results.values() for ts in out}
    assert len(distinct_ts) < 4 * per
    assert _queue_keys(store.client(), txns_id) == []


def test_uncontended_commit_takes_the_direct_path_with_no_queue_or_lease_traffic(store: Store) -> None:
    client = store.client()
    txns_id, ds = _setup(client, 1)
    h = TxnsHandle.open(client, txns_id)
    gc = GroupCommitter(h)
    writes: list[str] = []
    cas, put = client.consensus.compare_and_set, client.blob.set

    def counting_cas(key: str, expected: int | None, data: bytes) -> object:
        writes.append(key)
        return cas(key, expected, data)

    def counting_put(key: str, value: bytes) -> None:
        writes.append(key)
        put(key, value)

    client.consensus.compare_and_set = counting_cas  # type: ignore[method-assign]
    client.blob.set = counting_put  # type: ignore[method-assign]
    for n in range(5):
        txn = h.begin()
        txn.write(ds[0], (n,), ("a",), 1)
        gc.commit(txn)
    assert gc.direct_commits == 5 and gc.queued == 0
    assert not [k for k in writes if k == lease_key(txns_id) or k.startswith(queue_prefix(txns_id))]
    assert writes.count(txns_id) >= 5  # (each commit is its conditional write on the txns shard)
    gc.close()
    assert _contents(store.client(), txns_id, ds)[ds[0]] == {((n,), ("a",)): 1 for n in range(5)}


def test_a_direct_committer_goes_through_the_queue_while_others_wait_there(store: Store) -> None:
    """Fairness: with another process's transaction queued, a direct committer's commit joins the queue."""
    client = store.client()
    txns_id, ds = _setup(client, 1)
    other = TxnsHandle.open(store.client(), txns_id)
    stalled = SequencerLease(TxnsHandle.open(store.client(), txns_id), lease_ms=60_000)
    assert stalled.hold()  # (a sequencer that stalls: the queued transaction stays queued meanwhile)
    queued = other.begin()
    queued.write(ds[0], (0,), ("q",), 1)
    GroupCommitter(other, direct=False)._enqueue(
        _as_queued(queued, other.upper))
    h = TxnsHandle.open(client, txns_id)
    gc = GroupCommitter(h)
    txn = h.begin()
    txn.write(ds[0], (1,), ("d",), 1)
    releaser = threading.Timer(0.3, stalled.release)
    releaser.start()
    gc.commit(txn)  # (waits in the queue until the stalled sequencer lets go, then sequences both)
    releaser.join()
    assert gc.direct_commits == 0 and gc.queued == 1 and gc.grouped == 2
    gc.close()
    assert _queue_keys(client, txns_id) == []
    assert _contents(store.client(), txns_id, ds)[ds[0]] == {((0,), ("q",)): 1, ((1,), ("d",)): 1}


def _counting_queue_puts(client: PersistClient, txns_id: str) -> list[str]:
    puts: list[str] = []
    real = client.blob.set

    def counting(key: str, value: bytes) -> None:
        if key.startswith(queue_prefix(txns_id) + "pending/"):
            puts.append(key)
        real(key, value)

    client.blob.set = counting  # type: ignore[method-assign]
    return puts


def test_the_sequencers_own_process_hands_its_transactions_over_without_queue_objects(store: Store) -> None:
    client = store.client()
    txns_id, ds = _setup(client, 1)
    puts = _counting_queue_puts(client, txns_id)
    gc = GroupCommitter(TxnsHandle.open(client, txns_id), direct=False, linger_s=30)
    first = gc.handle.begin()
    first.write(ds[0], (0,), ("a",), 1)
    gc.commit(first)  # (takes the lease: this process now sequences, in a background thread)
    assert len(puts) == 1 and gc._serving is not None
    for n in range(1, 4):
        txn = gc.handle.begin()
        txn.write(ds[0], (n,), ("a",), 1)
        assert gc.commit(txn).commit_ts > 0
    assert gc.handed == 3 and len(puts) == 1  # no object for the three handed over
    gc.close()
    assert _queue_keys(client, txns_id) == []
    assert _contents(store.client(), txns_id, ds)[ds[0]] == {((n,), ("a",)): 1 for n in range(4)}


def test_a_handed_transaction_is_queued_when_its_sequencer_loses_the_lease(store: Store) -> None:
    """The process's sequencer stops (its lease lost) before committing a handed transaction: it is
    queued (PUT) then, and another process's sequencer commits it, once."""
    client = store.client()
    txns_id, ds = _setup(client, 1)
    puts = _counting_queue_puts(client, txns_id)
    # (poll_s 1 s: the sequencer thread sleeps that long between rounds, so the hand-over below
    # happens while it sleeps, and it wakes to find its lease lost)
    gc = GroupCommitter(TxnsHandle.open(client, txns_id), direct=False, linger_s=30, lease_ms=200, poll_s=1.0)
    first = gc.handle.begin()
    first.write(ds[0], (0,), ("a",), 1)
    gc.commit(first)
    assert gc._serving is not None
    while gc.rounds < 2:  # (the thread's first round found the queue empty: it sleeps now)
        time.sleep(0.01)
    gc.lease.hold = lambda fresh=False: False  # type: ignore[method-assign]  # (lost: it lapses in 200 ms)
    txn = gc.handle.begin()
    txn.write(ds[0], (1,), ("h",), 1)
    out: list[object] = []
    waiter = threading.Thread(target=lambda: out.append(gc.commit(txn)))
    waiter.start()
    other = GroupCommitter(TxnsHandle.open(store.client(), txns_id), direct=False)
    deadline = time.monotonic() + 30
    while other.grouped == 0:
        assert time.monotonic() < deadline, "nobody committed the handed transaction"
        other.run_round()
        time.sleep(0.05)
    waiter.join(30)
    assert gc.handed == 1 and len(out) == 1 and len(puts) == 2  # (the first one's, and the handed one's)
    other.close()
    gc.close()
    assert _contents(store.client(), txns_id, ds)[ds[0]] == {((0,), ("a",)): 1, ((1,), ("h",)): 1}


def test_a_handed_transaction_whose_round_lost_is_queued_where_direct_writers_look(store: Store) -> None:
    """A direct writer yields only to objects it finds in the queue (``QueueSwitch.contended``), and a
    transaction handed to its process's sequencer in memory has none: after its round's write loses, the
    sequencer queues it (PUT), so the winner yields; it still commits once, and its object goes."""
    client = store.client()
    txns_id, ds = _setup(client, 2)
    gc = GroupCommitter(TxnsHandle.open(client, txns_id), direct=False, linger_s=30)
    first = gc.handle.begin()
    first.write(ds[0], (0,), ("a",), 1)
    gc.commit(first)  # (queued by PUT: nobody sequenced yet; now this process does)
    assert gc._serving is not None
    other = TxnsHandle.open(store.client(), txns_id)  # a direct writer in another process
    wins = [2]  # the direct writer lands a commit right before each of the sequencer's next two writes
    seen: list[bool] = []  # (whether the queue showed work to direct writers at each of them)
    consensus = client.consensus
    cas, cas_after = consensus.compare_and_set, consensus.compare_and_set_after

    def gate(key: str) -> None:
        if key == txns_id and threading.current_thread().name == "txns-sequencer" and wins[0] > 0:
            seen.append(group_commit_module.queue_has_work(client.blob, txns_id))
            t = other.begin()
            t.write(ds[1], (wins[0],), ("o",), 1)
            other.commit(t)
            wins[0] -= 1

    inside = threading.local()  # (compare_and_set_after calls compare_and_set: one write, one gate)

    def gated(call: Callable[..., CaSResult]) -> Callable[..., CaSResult]:
        def run(key: str, *args: object) -> CaSResult:
            if getattr(inside, "on", False):
                return call(key, *args)
            gate(key)
            inside.on = True
            try:
                return call(key, *args)
            finally:
                inside.on = False

        return run

    consensus.compare_and_set = gated(cas)  # type: ignore[method-assign]
    consensus.compare_and_set_after = gated(cas_after)  # type: ignore[method-assign]
    txn = gc.handle.begin()
    txn.write(ds[0], (1,), ("h",), 1)
    gc.commit(txn)  # handed over in memory; its round's first write loses
    assert gc.handed == 1 and gc.published == 1
    assert seen == [False, True]  # no object while handed; queued once its write lost
    deadline = time.monotonic() + 30
    while group_commit_module.queue_has_work(client.blob, txns_id):  # (deleted once committed)
        assert time.monotonic() < deadline, "the committed transaction's object stayed queued"
        time.sleep(0.02)
    gc.close()
    other.close()
    contents = _contents(store.client(), txns_id, ds)
    assert contents[ds[0]] == {((0,), ("a",)): 1, ((1,), ("h",)): 1}
    assert contents[ds[1]] == {((1,), ("o",)): 1, ((2,), ("o",)): 1}


def test_a_handed_transaction_whose_queueing_landed_but_failed_commits_once(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The PUT that queues a handed transaction after its round lost lands but reports a failure: the next
    round finds the object and keeps one body for it (not the handed one and the object's both), so the
    transaction is one member of one write (its batches twice in one write read back once, so the count
    of members is what tells)."""
    monkeypatch.setattr(group_commit_module, "LOCAL_ROUND_LIST_S", 0.0)  # (every round lists: it finds the object)
    client = store.client()
    txns_id, ds = _setup(client, 2)
    gc = GroupCommitter(TxnsHandle.open(client, txns_id), direct=False, linger_s=30)
    first = gc.handle.begin()
    first.write(ds[0], (0,), ("a",), 1)
    gc.commit(first)
    assert gc._serving is not None
    other = TxnsHandle.open(store.client(), txns_id)
    wins = [1]
    cas = client.consensus.compare_and_set_after

    def gated_cas_after(key: str, *args: object) -> CaSResult:
        if key == txns_id and threading.current_thread().name == "txns-sequencer" and wins[0] > 0:
            wins[0] -= 1
            t = other.begin()
            t.write(ds[1], (1,), ("o",), 1)
            other.commit(t)  # (lands first: the round's write loses its time)
        return cas(key, *args)  # type: ignore[arg-type]

    client.consensus.compare_and_set_after = gated_cas_after  # type: ignore[method-assign]
    enqueue = gc._enqueue
    failed: list[str] = []

    def landed_but_failed(q: Queued) -> None:
        enqueue(q)
        failed.append(q.txn_id)
        raise Indeterminate("the reply was lost")

    gc._enqueue = landed_but_failed  # type: ignore[method-assign]
    txn = gc.handle.begin()
    txn.write(ds[0], (1,), ("h",), 1)
    gc.commit(txn)
    assert failed == [txn.id] and wins == [0]
    gc.close()
    other.close()
    assert gc.grouped == 2  # (the two transactions, each once: not the handed one and its object's both)
    contents = _contents(store.client(), txns_id, ds)
    assert contents[ds[0]] == {((0,), ("a",)): 1, ((1,), ("h",)): 1}  # once, not twice
    assert contents[ds[1]] == {((1,), ("o",)): 1}


def test_threads_of_one_process_join_one_direct_write_each_committed_once(store: Store) -> None:
    client = store.client()
    txns_id, ds = _setup(client, 2)
    h = TxnsHandle.open(client, txns_id)
    gc = GroupCommitter(h, slow_s=3600)  # (one process: no lost race; a slow write on a busy machine stays direct)
    cas = client.consensus.compare_and_set

    def slow_cas(key: str, expected: int | None, data: bytes) -> object:
        if key == txns_id:
            time.sleep(0.02)  # (a storage round trip: threads arrive while a write is in flight)
        return cas(key, expected, data)

    client.consensus.compare_and_set = slow_cas  # type: ignore[method-assign]
    build = threading.Lock()
    threads, per = 8, 10
    got: dict[str, int] = {}

    def run(i: int) -> None:
        for n in range(per):
            with build:
                txn = h.begin()
                txn.write(ds[i % 2], (i * 1000 + n,), ("v",), 1)
            got[txn.id] = gc.commit(txn).commit_ts

    ts = [threading.Thread(target=run, args=(i,)) for i in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    gc.close()
    assert gc.queued == 0 and gc.direct_commits + gc.joined == threads * per
    assert gc.joined > 0 and len(set(got.values())) == gc.direct_commits < threads * per
    contents = _contents(store.client(), txns_id, ds)
    for d in (0, 1):
        assert contents[ds[d]] == {((i * 1000 + n,), ("v",)): 1 for i in range(d, threads, 2) for n in range(per)}
    # every transaction has its own commit record, at the time its caller was told
    for txn_id, at in got.items():
        record = h.commit_record(txn_id)
        assert record is not None and record.ts == at
    h.close()


def _run_both_pending(gc: GroupCommitter, lock: Any, threads: list[threading.Thread]) -> None:
    """Start ``threads`` (two direct commits) while ``lock`` (the committer's) is held, so that both are pending
    when one of them leads the next write; then wait for them."""
    with lock:
        for t in threads:
            t.start()
        deadline = time.monotonic() + 10
        while len(gc._pending) < 2 and time.monotonic() < deadline:
            time.sleep(0.001)
        assert len(gc._pending) == 2
    for t in threads:
        t.join(30)


def test_a_thread_joined_to_a_direct_write_returns_without_taking_the_committers_lock(store: Store) -> None:
    """Only the thread that leads a direct write takes the lock: one whose transaction joined the write returns
    as soon as it landed. (Waiting for the lock, a joined thread also waited out the next thread's write, or a
    sequencer round: at 1 process x 64 threads in the S3 model, writes carried 4 transactions, not 60.)"""
    client = store.client()
    txns_id, ds = _setup(client, 1)
    h = TxnsHandle.open(client, txns_id)
    gc = GroupCommitter(h, slow_s=3600)
    lock = gc._lock = RecordingLock(gc._lock)  # type: ignore[assignment]
    txns = [h.begin() for _ in range(2)]
    for n, txn in enumerate(txns):
        txn.write(ds[0], (n,), ("v",), 1)
    got: dict[str, int] = {}

    def run(txn: Txn) -> None:
        got[txn.id] = gc.commit(txn).commit_ts

    threads = [threading.Thread(target=run, args=(t,), name=f"writer-{n}") for n, t in enumerate(txns)]
    _run_both_pending(gc, lock.inner, threads)  # (one leads the next write and joins the other to it)
    gc.close()
    assert gc.direct_commits == 1 and gc.joined == 1 and len(set(got.values())) == 1, got
    assert len([n for n in lock.takers if n.startswith("writer-")]) == 1, lock.takers
    assert _contents(store.client(), txns_id, ds)[ds[0]] == {((0,), ("v",)): 1, ((1,), ("v",)): 1}
    h.close()


def test_a_lost_race_sends_the_next_commits_through_the_queue(store: Store) -> None:
    client = store.client()
    txns_id, ds = _setup(client, 2)
    h = TxnsHandle.open(client, txns_id)
    other = TxnsHandle.open(store.client(), txns_id)
    gc = GroupCommitter(h, contended_s=60)
    h.cache.sync()
    t_other = other.begin()
    t_other.write(ds[1], (9,), ("o",), 1)
    other.commit(t_other)  # moves the upper past what h has seen: h's direct try loses
    txn = h.begin()
    txn.write(ds[0], (1,), ("a",), 1)
    applied = gc.commit(txn)
    assert gc.queued == 1 and gc.direct_commits == 0
    txn2 = h.begin()
    txn2.write(ds[0], (2,), ("b",), 1)
    gc.commit(txn2)
    assert gc.queued == 2  # still contended: straight to the queue
    assert txn.commit_at(h, applied.commit_ts + 100) == applied  # settled: never again
    gc.close()
    contents = _contents(store.client(), txns_id, ds)
    assert contents[ds[0]] == {((1,), ("a",)): 1, ((2,), ("b",)): 1}


def test_a_dead_sequencers_committed_objects_are_not_committed_again(store: Store) -> None:
    """A sequencer commits, then dies before deleting the queue objects; the next one only deletes them."""
    txns_id, ds = _setup(store.client(), 1)
    h1 = TxnsHandle.open(store.client(), txns_id)
    dead = GroupCommitter(h1, direct=False, lease_ms=200)
    # it "dies" right after its commit: no deletes, no background sequencing, its lease never released
    dead._delete = lambda key: None  # type: ignore[method-assign]
    dead._serve = lambda: None  # type: ignore[method-assign]
    txns_ids = []
    for n in range(3):
        txn = h1.begin()
        txn.write(ds[0], (n,), ("x",), 1)
        txns_ids.append(dead.commit(txn).commit_ts)
    assert len(_queue_keys(store.client(), txns_id)) == 3  # committed, but still queued
    # (its lease is never released: the next sequencer waits for it to lapse)
    h2 = TxnsHandle.open(store.client(), txns_id)  # tracking starts after those commits: the look-up path
    nxt = GroupCommitter(h2, direct=False, lease_ms=200)
    txn = h2.begin()
    txn.write(ds[0], (10,), ("y",), 1)
    nxt.commit(txn)
    nxt.close()
    assert _queue_keys(store.client(), txns_id) == []
    assert _contents(store.client(), txns_id, ds)[ds[0]] == {
        ((0,), ("x",)): 1, ((1,), ("x",)): 1, ((2,), ("x",)): 1, ((10,), ("y",)): 1
    }


def test_a_group_commit_that_landed_but_reported_failure_is_not_repeated() -> None:
    faults = Faults(seed=1)
    store = Store(faults)
    txns_id, ds = _setup(store.client(), 1)
    h = TxnsHandle.open(store.client(), txns_id)
    gc = GroupCommitter(h, direct=False)
    txn = h.begin()
    txn.write(ds[0], (1,), ("a",), 1)
    txn.batches()  # (written before the fault is armed)
    h.cache.sync()
    injected = faults.counters[Op.CAS].injected
    # the next two conditional writes (the lease's, then the round's) land, and their replies are lost
    faults.fail_next(Op.CAS, Fault.AFTER, n=2)
    applied = gc.commit(txn)
    gc.close()
    assert faults.counters[Op.CAS].injected == injected + 2
    contents = _contents(store.client(), txns_id, ds)
    assert contents[ds[0]] == {((1,), ("a",)): 1}
    assert applied.commit_ts >= 1


def test_a_transaction_for_a_forgotten_shard_fails_with_nothing_committed(store: Store) -> None:
    client = store.client()
    txns_id, ds = _setup(client, 2)
    h = TxnsHandle.open(client, txns_id)
    gc = GroupCommitter(h, direct=False)
    txn = h.begin()
    txn.write(ds[0], (1,), ("a",), 1)
    txn.batches()
    other = TxnsHandle.open(store.client(), txns_id)
    other.forget(other.upper, [ds[0]])
    with pytest.raises(GroupCommitFailed, match="not registered"):
        gc.commit(txn)
    gc.close()
    assert _queue_keys(store.client(), txns_id) == []


def test_a_shard_registered_after_the_sequencers_view_is_not_taken_for_forgotten(store: Store) -> None:
    """A round judges by its view of the txns shard without reading it first; a shard registered past
    that view is looked up on a fresh one before the transaction is failed as forgotten."""
    client = store.client()
    txns_id, _ = _setup(client, 1)
    h = TxnsHandle.open(client, txns_id)
    gc = GroupCommitter(h, direct=False)
    assert gc.lease.hold() and gc.run_round() == 0  # (its view: as of now)
    other = TxnsHandle.open(store.client(), txns_id)
    fresh = new_id()
    other.register(other.upper, {fresh: SCHEMA})  # registered past the sequencer's view
    txn = other.begin()
    txn.write(fresh, (1,), ("n",), 1)
    gc._enqueue(_as_queued(txn, other.upper))
    assert gc.run_round() == 1
    assert not [k for k in _queue_keys(client, txns_id) if "/queue/failed/" in k]  # (no failure published)
    gc.close()
    assert _queue_keys(client, txns_id) == []
    assert _contents(store.client(), txns_id, [fresh])[fresh] == {((1,), ("n",)): 1}


def test_queued_objects_round_trip_and_refuse_garbage() -> None:
    q = Queued("t1", 7, True, frozenset({"b1", "b2"}), b"\x00txn")
    assert Queued.decode("x", q.encode()) == q
    named = dataclasses.replace(q, writer="w1")  # (a sequencer writes commit notes for it)
    assert Queued.decode("x", named.encode()) == named
    from persist import CorruptObject

    with pytest.raises(CorruptObject):
        Queued.decode("x", q.encode()[:-1] + b"!")


def test_bad_settings_are_refused(store: Store) -> None:
    client = store.client()
    txns_id, _ = _setup(client, 1)
    h = TxnsHandle.open(client, txns_id)
    with pytest.raises(Exception, match="lease_ms"):
        GroupCommitter(h, lease_ms=1)
    gc = GroupCommitter(h)
    with pytest.raises(Exception, match=r"txns\.Txn"):
        gc.commit("not a txn")  # type: ignore[arg-type]
    gc.close()


def _process_committer(url: str, txns_id: str, d: str, worker: int, n: int) -> None:
    client = PersistClient.open(url)
    h = TxnsHandle.open(client, txns_id)
    with GroupCommitter(h, direct=False, poll_s=0.002) as gc:
        for i in range(n):
            txn = h.begin()
            txn.write(d, (worker * 1000 + i,), (f"p{worker}",), 1)
            gc.commit(txn)
    h.close()


def test_processes_share_conditional_writes_and_commit_each_transaction_once(tmp_path: Path) -> None:
    url = file_url(tmp_path / "store")
    client = PersistClient.open(url)
    txns_id, ds = _setup(client, 1)
    ctx = multiprocessing.get_context("spawn")
    workers, n = 3, 12
    procs = [ctx.Process(target=_process_committer, args=(url, txns_id, ds[0], w, n)) for w in range(workers)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
        assert p.exitcode == 0
    contents = _contents(client, txns_id, ds)[ds[0]]
    assert contents == {((w * 1000 + i,), (f"p{w}",)): 1 for w in range(workers) for i in range(n)}
    assert _queue_keys(client, txns_id) == []


def test_the_sequencer_lingers_on_an_empty_queue_then_releases_the_lease(store: Store) -> None:
    """Under steady contention one process stays the sequencer; once the queue stays empty it lets go."""
    client = store.client()
    txns_id, ds = _setup(client, 1)
    h = TxnsHandle.open(client, txns_id)
    gc = GroupCommitter(h, direct=False, lease_ms=4000, linger_s=0.6, idle_poll_s=0.02)
    txn = h.begin()
    txn.write(ds[0], (1,), ("a",), 1)
    gc.commit(txn)
    assert gc._serving is not None and gc.lease.held  # serving in the background after its round
    rounds = gc.rounds
    time.sleep(0.3)
    assert gc.lease.held, "it keeps the lease while lingering"
    assert gc.rounds > rounds, "and keeps looking at the queue meanwhile"
    other = GroupCommitter(TxnsHandle.open(store.client(), txns_id), direct=False)
    assert other.lease.busy(), "another process sees it held"
    deadline = time.monotonic() + 10
    while gc._serving is not None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert gc._serving is None and not gc.lease.held and not other.lease.busy(), "released once idle"
    other.close()
    gc.close()


def test_bad_pacing_settings_are_refused(store: Store) -> None:
    h = TxnsHandle.open(store.client(), _setup(store.client(), 1)[0])
    for kwargs in ({"linger_s": -1.0}, {"idle_poll_s": -0.5}, {"poll_s": float("nan")}):
        with pytest.raises(InvalidUsage, match="must be a number of seconds"):
            GroupCommitter(h, **kwargs)  # type: ignore[arg-type]


def test_a_round_that_loses_to_a_direct_commit_writes_again_and_commits_each_once(store: Store) -> None:
    """Direct commits land between the sequencer's read and its write: it writes again, no member twice."""
    client = store.client()
    txns_id, ds = _setup(client, 1)
    h = TxnsHandle.open(client, txns_id)
    direct = TxnsHandle.open(store.client(), txns_id)
    gc = GroupCommitter(h, direct=False)
    queued = []
    for n in range(3):
        txn = h.begin()
        txn.write(ds[0], (n,), ("q",), 1)
        queued.append(txn)
        gc._enqueue(_as_queued(txn, h.upper))
    assert gc.lease.hold()
    real_commit_at = type(queued[0]).commit_at
    lost = []

    def commit_at(self, handle, ts, expect_upper=None, check=None):  # type: ignore[no-untyped-def]
        if len(lost) < 2:  # a direct writer lands first, twice: at the round's time, then past it
            t = direct.begin()
            t.write(ds[0], (100 + len(lost),), ("d",), 1)
            lost.append(real_commit_at(t, direct, ts + len(lost)).commit_ts)
        return real_commit_at(self, handle, ts, expect_upper, check)

    import txns.txn as txn_module
    orig = txn_module.Txn.commit_at
    txn_module.Txn.commit_at = commit_at  # type: ignore[method-assign]
    try:
        assert gc.run_round() == 3
    finally:
        txn_module.Txn.commit_at = orig  # type: ignore[method-assign]
    assert len(lost) == 2
    gc.close()
    assert _queue_keys(client, txns_id) == []
    assert _contents(store.client(), txns_id, ds)[ds[0]] == {
        **{((n,), ("q",)): 1 for n in range(3)}, ((100,), ("d",)): 1, ((101,), ("d",)): 1
    }


def test_after_a_lost_write_a_round_leads_by_how_long_its_writes_take(store: Store) -> None:
    """A round whose write lost its time to a direct commit writes again ahead of ``ts_fn`` by ``lead_fn``.

    (A direct writer picks its time just before it writes; a round does more in between, so without a
    lead every retry was passed again by the next direct commit.)
    """
    client = store.client()
    txns_id, ds = _setup(client, 1)
    h = TxnsHandle.open(client, txns_id)
    direct = TxnsHandle.open(store.client(), txns_id)
    leads: list[float] = []

    def lead_fn(s: float) -> int:
        leads.append(s)
        return 1000

    gc = GroupCommitter(h, direct=False, lead_fn=lead_fn)
    txn = h.begin()
    txn.write(ds[0], (1,), ("q",), 1)
    gc._enqueue(_as_queued(txn, h.upper))
    assert gc.lease.hold()
    real_commit_at = type(txn).commit_at
    tried: list[int] = []
    won: list[int] = []

    def commit_at(self, handle, ts, expect_upper=None, check=None):  # type: ignore[no-untyped-def]
        tried.append(ts)
        if not won:  # a direct writer lands first, at the round's time
            t = direct.begin()
            t.write(ds[0], (100,), ("d",), 1)
            won.append(real_commit_at(t, direct, ts).commit_ts)
        return real_commit_at(self, handle, ts, expect_upper, check)

    import txns.txn as txn_module
    orig = txn_module.Txn.commit_at
    txn_module.Txn.commit_at = commit_at  # type: ignore[method-assign]
    lost = h.lost_races
    try:
        assert gc.run_round() == 1
    finally:
        txn_module.Txn.commit_at = orig  # type: ignore[method-assign]
    assert h.lost_races == lost + 1  # (the round's first write lost to the direct one)
    assert len(tried) == 2
    assert len(leads) == 1 and 0 < leads[0] <= 0.5  # 1.5x how long the lost write took, capped
    assert tried[1] >= won[0] + 1 + 1000  # past the winner, leading by lead_fn's answer
    assert txn.commit_at(h, tried[1]).commit_ts == tried[1]  # (committed there: the same result again)
    gc.close()


def test_commit_at_runs_the_check_at_the_upper_it_appends_at(store: Store) -> None:
    """``Txn.commit_at(check=...)``: called per try with that try's upper; raising commits nothing."""
    client = store.client()
    txns_id, ds = _setup(client, 1)
    h = TxnsHandle.open(client, txns_id)
    other = TxnsHandle.open(store.client(), txns_id)
    seen: list[int] = []

    def check(upper: int) -> None:
        seen.append(upper)
        if len(seen) == 1:  # another commit lands after the first check: the write must not use it
            t = other.begin()
            t.write(ds[0], (9,), ("o",), 1)
            t.commit_at(other, upper)

    txn = h.begin()
    txn.write(ds[0], (1,), ("a",), 1)
    applied = txn.commit_at(h, h.upper + 10, check=check)
    assert len(seen) >= 2 and seen[-1] > seen[0], "checked again at the upper the write landed on"
    assert applied.commit_ts == seen[0] + 10

    class No(Exception):
        pass

    def refuse(upper: int) -> None:
        raise No

    txn2 = h.begin()
    txn2.write(ds[0], (2,), ("b",), 1)
    with pytest.raises(No):
        txn2.commit_at(h, h.upper + 1, check=refuse)
    assert _contents(store.client(), txns_id, ds)[ds[0]] == {((1,), ("a",)): 1, ((9,), ("o",)): 1}
    txn2.commit_at(h, h.upper + 1)  # (still committable)
    assert _contents(store.client(), txns_id, ds)[ds[0]][((2,), ("b",))] == 1


def test_a_queued_commit_that_waited_long_keeps_the_next_commits_queued_without_a_look(store: Store) -> None:
    """Contention goes on: after a queued commit slower than ``slow_s`` while other processes queue, the
    committer queues with no listing; a lone one (nobody else in its rounds) looks again."""
    client = store.client()
    txns_id, ds = _setup(client, 1)
    looks: list[str] = []
    real = client.blob.list_keys

    def counting(prefix: str):  # type: ignore[no-untyped-def]
        looks.append(prefix)
        return real(prefix)

    client.blob.list_keys = counting  # type: ignore[method-assign]
    for others in (False, True):
        h = TxnsHandle.open(client, txns_id)
        gc = GroupCommitter(h, slow_s=0.0, contended_s=60, probe_s=0.0)
        if others:  # another process's transaction waits in the queue: the round commits it too
            other = TxnsHandle.open(store.client(), txns_id)
            theirs = other.begin()
            theirs.write(ds[0], (9,), ("o",), 1)
            GroupCommitter(other, direct=False)._enqueue(_as_queued(theirs, other.upper))
        mine = h.begin()
        mine.write(ds[0], (int(others),), ("a",), 1)
        gc.commit_all([mine])  # through the queue; it waited longer than slow_s (0)
        gc.close()  # (no sequencer thread listing meanwhile)
        looks.clear()
        assert gc._switch.contended(gc.waiting_ids) is others
        assert looks == ([] if others else [queue_prefix(txns_id) + "pending/"])
    assert _contents(store.client(), txns_id, ds)[ds[0]] == {((0,), ("a",)): 1, ((1,), ("a",)): 1, ((9,), ("o",)): 1}


def test_under_steady_commits_the_queue_is_looked_at_aside_and_what_it_finds_queues_the_next(store: Store) -> None:
    """A committer on the direct path looks at the queue every ``probe_s``: the first time (or after a pause)
    before its write; under a steady stream of commits in a thread of its own, so that no write waits for
    the listing (a request on S3); another's transaction found there queues the next commits."""
    client = store.client()
    txns_id, _ds = _setup(client, 1)
    switch = group_commit_module.QueueSwitch(client.blob, txns_id, contended_s=60, probe_s=0.2, slow_s=1.0)
    looks: list[str] = []
    gate = threading.Event()
    real = client.blob.list_keys

    def gated(prefix: str):  # type: ignore[no-untyped-def]
        looks.append(threading.current_thread().name)
        if len(looks) > 1:
            gate.wait(10)  # (a slow listing)
        return real(prefix)

    client.blob.list_keys = gated  # type: ignore[method-assign]
    assert switch.contended() is False and looks == [threading.current_thread().name]  # the first: a look first
    client.blob.set(f"{queue_prefix(txns_id)}pending/theirs", b"another process's transaction")
    answers: list[bool] = []
    deadline = time.monotonic() + 2
    while time.monotonic() < deadline and len(looks) < 2:  # commits every 10 ms: steady
        caller = threading.Thread(target=lambda: answers.append(switch.contended()))
        caller.start()
        caller.join(1)
        assert not caller.is_alive(), "a commit waited for the listing"
        time.sleep(0.01)
    assert looks[1:] == ["txns-queue-probe"] and answers and not any(answers)
    gate.set()
    deadline = time.monotonic() + 10
    while switch._probing:
        assert time.monotonic() < deadline, "the look aside never ended"
        time.sleep(0.005)
    assert switch.contended() is True  # what the look found queues the next commits


def test_a_lease_read_lists_from_the_latest_version_it_saw(store: Store) -> None:
    """Reading the lease passes the seqno seen last as the hint (on S3: no read of the key's head hint)."""
    client = store.client()
    txns_id, _ = _setup(client, 1)
    holder = SequencerLease(TxnsHandle.open(store.client(), txns_id), lease_ms=60_000)
    reader = SequencerLease(TxnsHandle.open(client, txns_id), lease_ms=60_000)
    hints: list[int | None] = []
    real = client.consensus.head

    def recording(key: str, hint: int | None = None):  # type: ignore[no-untyped-def]
        hints.append(hint)
        return real(key, hint)

    client.consensus.head = recording  # type: ignore[method-assign]
    assert not reader.busy()  # never written: nothing seen yet
    assert holder.hold()
    for _ in range(3):
        holder.release()
        assert holder.hold()
    assert reader.busy()
    assert not reader.hold(fresh=True)
    # (nothing seen before the first two reads; the third lists from version 7, which the second read)
    assert hints == [None, None, 7]


def test_a_joined_direct_write_failing_on_one_members_usage_error_commits_the_others(store: Store) -> None:
    """Threads joined to one direct write: a member writing a forgotten shard gets NotRegistered, the others commit."""
    client = store.client()
    txns_id, ds = _setup(client, 2)
    h = TxnsHandle.open(client, txns_id)
    h.forget(h.upper, [ds[1]])
    gc = GroupCommitter(h, slow_s=3600)
    good, bad = h.begin(), h.begin()
    good.write(ds[0], (1,), ("good",), 1)
    bad.write(ds[1], (2,), ("bad",), 1)
    outcomes: dict[str, object] = {}

    def run(txn: Txn) -> None:
        try:
            outcomes[txn.id] = gc.commit(txn).commit_ts
        except Exception as e:  # noqa: BLE001 - the outcome under test
            outcomes[txn.id] = e

    threads = [threading.Thread(target=run, args=(t,)) for t in (bad, good)]
    _run_both_pending(gc, gc._lock, threads)  # (whichever leads joins the other to its write)
    gc.close()
    assert isinstance(outcomes[bad.id], NotRegistered), outcomes
    assert isinstance(outcomes[good.id], int), outcomes
    assert _contents(store.client(), txns_id, ds[:1])[ds[0]] == {((1,), ("good",)): 1}


class _SequencerAndOther:
    """A sequencer ``gc`` (holding the lease) and another process's committer whose transactions it queues."""

    def __init__(self, store: Store) -> None:
        self.store = store
        client = store.client()
        self.txns_id, self.ds = _setup(client, 1)
        self.gc = GroupCommitter(TxnsHandle.open(client, self.txns_id), direct=False)
        self.other = TxnsHandle.open(store.client(), self.txns_id)
        self.theirs = GroupCommitter(self.other, direct=False)
        assert self.gc.lease.hold()

    def foreign(self, n: int) -> None:
        """The other process queues (PUTs) a transaction writing row ``n``."""
        txn = self.other.begin()
        txn.write(self.ds[0], (n,), ("theirs",), 1)
        self.theirs._enqueue(_as_queued(txn, self.other.upper))

    def hand(self, n: int) -> None:
        """The sequencer's own process hands it a transaction writing row ``n`` (in memory)."""
        mine = self.gc.handle.begin()
        mine.write(self.ds[0], (n,), ("mine",), 1)
        self.gc._hand_over([_as_queued(mine, self.gc.handle.cache.frontier)])

    def close_and_contents(self) -> dict:
        self.theirs.close()
        self.gc.close()
        return _contents(self.store.client(), self.txns_id, self.ds)[self.ds[0]]


def test_rounds_for_handed_transactions_list_the_queue_while_another_process_queues(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Once a listing found another process's object, every round lists for FOUND_LATELY_S, also one for handed
    transactions right after a listing found the queue empty: the other process's next object, put in just
    after that listing, commits in the next write (skipped, it waited LOCAL_ROUND_LIST_S: 10 commits/s against
    the sequencer's 140 at 2 processes on file://). The round for the handed transaction does not wait for that
    listing: it writes at once and reads the queue ahead, for the next round."""
    monkeypatch.setattr(group_commit_module, "LOCAL_ROUND_LIST_S", 60.0)
    monkeypatch.setattr(group_commit_module, "FOUND_LATELY_S", 60.0)
    two = _SequencerAndOther(store)
    gc = two.gc
    two.foreign(1)
    assert gc.run_round() == 1  # (found it: another process queues)
    assert gc.run_round() == 0  # (a listing that found the queue empty, just now)
    two.foreign(2)  # (put in just after that listing)
    two.hand(3)
    assert gc.run_round() == 1  # (the handed one, at once)
    assert gc._ahead is not None, "the round for the handed transaction did not list the queue"
    assert gc.run_round() == 1  # (the next round: the listing read ahead found the other's)
    assert two.close_and_contents() == {((1,), ("theirs",)): 1, ((2,), ("theirs",)): 1, ((3,), ("mine",)): 1}


def test_a_handed_transaction_does_not_wait_for_the_listing_read_ahead(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """While another process queues, a round for transactions handed over in memory writes them at once: a
    listing still being read ahead (here: held up until released) is left to the next round, which commits the
    other process's object it found. (Waiting for it put a listing and a read before each of the sequencer's own
    writes: 0.89-0.95x the 1-process rate at 2 processes in the S3 model.)"""
    monkeypatch.setattr(group_commit_module, "FOUND_LATELY_S", 60.0)
    two = _SequencerAndOther(store)
    gc = two.gc
    two.foreign(1)
    assert gc.run_round() == 1  # (found it: another process queues)
    assert gc.run_round() == 0  # (takes the listing that round read ahead: the queue is empty)
    release = threading.Event()
    read_queue = gc._read_queue

    def held_up(at: float, known: frozenset[str]) -> Any:
        assert release.wait(5), "the listing was never released"
        return read_queue(at, known)

    monkeypatch.setattr(gc, "_read_queue", held_up)
    two.foreign(2)
    gc._start_read_ahead()
    assert gc._ahead is not None
    two.hand(3)
    assert gc.run_round() == 1, "the handed transaction did not commit while the listing was read"
    assert gc._ahead is not None and not gc._ahead.done()  # (left for the next round)
    release.set()
    assert gc.run_round() == 1  # (the next round: the other's, from that listing)
    assert two.close_and_contents() == {((1,), ("theirs",)): 1, ((2,), ("theirs",)): 1, ((3,), ("mine",)): 1}


def test_rounds_for_handed_transactions_skip_listing_a_queue_found_empty(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The sequencer's rounds for its own process's transactions (handed over in memory) list the queue only if
    the last listing found objects or is older than LOCAL_ROUND_LIST_S; another process's object still commits."""
    monkeypatch.setattr(group_commit_module, "LOCAL_ROUND_LIST_S", 60.0)
    monkeypatch.setattr(group_commit_module, "FOUND_LATELY_S", 0.0)  # (the first commit's own object: not lately)
    client = store.client()
    txns_id, ds = _setup(client, 1)
    lists: list[str] = []  # (listings of the queue made by rounds that had handed transactions)
    real = client.blob.list_keys
    in_handed_round = threading.local()

    def counting(prefix: str) -> Iterator[str]:
        if prefix.startswith(queue_prefix(txns_id) + "pending/") and getattr(in_handed_round, "on", False):
            lists.append(prefix)
        return real(prefix)

    client.blob.list_keys = counting  # type: ignore[method-assign]
    gc = GroupCommitter(TxnsHandle.open(client, txns_id), direct=False, linger_s=30)
    real_round = gc._round_once

    def round_once() -> int:
        # (only rounds for handed transactions count: the rounds an idle sequencer polls with list the queue,
        # and how many of those run between two commits depends on the machine's load)
        in_handed_round.on = any(k.startswith(group_commit_module.LOCAL) for k in gc._bodies)
        try:
            return real_round()
        finally:
            in_handed_round.on = False

    gc._round_once = round_once  # type: ignore[method-assign]
    first = gc.handle.begin()
    first.write(ds[0], (0,), ("a",), 1)
    gc.commit(first)  # (takes the lease: this process now sequences, in a background thread)
    while gc.rounds < 2:  # (the thread's next round listed the queue and found it empty)
        time.sleep(0.01)
    before = len(lists)
    for n in range(1, 6):
        txn = gc.handle.begin()
        txn.write(ds[0], (n,), ("a",), 1)
        gc.commit(txn)
    assert gc.handed == 5
    assert len(lists) - before <= 1, "a round per handed transaction listed the queue"
    other = GroupCommitter(TxnsHandle.open(store.client(), txns_id), direct=False)
    foreign = other.handle.begin()
    foreign.write(ds[0], (9,), ("f",), 1)
    assert other.commit(foreign).commit_ts > 0  # (queued: the sequencer's next listing finds it)
    other.close()
    gc.close()
    assert _contents(store.client(), txns_id, ds)[ds[0]] == {**{((n,), ("a",)): 1 for n in range(6)}, ((9,), ("f",)): 1}


def _foreign_queuer(store: Store, txns_id: str, d: str) -> tuple[GroupCommitter, Callable[[int], Queued]]:
    """Another process's committer, and a function that queues (PUTs) its transaction number n."""
    other = TxnsHandle.open(store.client(), txns_id)
    theirs = GroupCommitter(other, direct=False)

    def foreign(n: int) -> Queued:
        txn = other.begin()
        txn.write(d, (n,), ("theirs",), 1)
        q = _as_queued(txn, other.upper)
        theirs._enqueue(q)
        return q

    return theirs, foreign


def _gated_queue_listings(client: PersistClient, txns_id: str) -> tuple[list[str], threading.Event]:
    """Record the thread of every listing of ``txns_id``'s queue; the read-ahead thread's wait for the event."""
    threads: list[str] = []
    gate = threading.Event()
    real = client.blob.list_keys

    def listing(prefix: str) -> Iterator[str]:
        if prefix.startswith(queue_prefix(txns_id) + "pending/"):
            name = threading.current_thread().name
            threads.append(name)
            if name.startswith("txns-queue-ahead"):
                assert gate.wait(30)
        return real(prefix)

    client.blob.list_keys = listing  # type: ignore[method-assign]
    return threads, gate


def _second_object_read_ahead(store: Store) -> tuple[str, list[str], list[str], GroupCommitter, GroupCommitter]:
    """A sequencer's round committed another process's first object and started its read-ahead, whose
    listing (held at a gate until then) comes after the second object landed. Returns the txns shard, its
    data shards, the threads that listed the queue, the sequencer's committer and the other process's."""
    client = store.client()
    txns_id, ds = _setup(client, 1)
    threads, gate = _gated_queue_listings(client, txns_id)
    gc = GroupCommitter(TxnsHandle.open(client, txns_id), direct=False)
    theirs, foreign = _foreign_queuer(store, txns_id, ds[0])
    assert gc.lease.hold()
    foreign(1)
    assert gc.run_round() == 1
    assert gc._ahead is not None  # (its listing waits at the gate: it lists after the next object lands)
    foreign(2)
    gate.set()
    return txns_id, ds, threads, gc, theirs


def test_a_round_reads_the_queue_for_the_next_one_while_it_writes(store: Store) -> None:
    """While other processes queue, a round with members starts listing and reading the queue for the next
    round before its write (the read-ahead), and the next round commits what that found without listing:
    in the S3 model at 16 processes x 8 threads the listing and reads were half of every round."""
    txns_id, ds, threads, gc, theirs = _second_object_read_ahead(store)
    mine = threading.current_thread().name
    assert gc.run_round() == 1  # (foreign 2, found by the read-ahead)
    assert threads.count(mine) == 1, "the second round listed the queue itself"
    assert sum(t.startswith("txns-queue-ahead") for t in threads) >= 1
    theirs.close()
    gc.close()
    assert _queue_keys(store.client(), txns_id) == []
    assert _contents(store.client(), txns_id, ds)[ds[0]] == {((1,), ("theirs",)): 1, ((2,), ("theirs",)): 1}


def test_an_object_read_ahead_then_committed_by_another_sequencer_commits_once(store: Store) -> None:
    """The read-ahead read an object; before the next round, a lapsed sequencer still running (another
    process) commits it and deletes it. The next round checks it at its write and commits nothing."""
    txns_id, ds, _threads, gc, theirs = _second_object_read_ahead(store)
    assert gc._ahead is not None
    assert gc._ahead.result(30).bodies  # (foreign 2's object, read ahead)
    theirs.lease.hold = lambda fresh=False: True  # type: ignore[method-assign]  # (it believes it sequences)
    assert theirs.run_round() == 1  # (commits foreign 2, deletes its object)
    assert gc.run_round() == 0
    theirs.close()
    gc.close()
    assert _queue_keys(store.client(), txns_id) == []
    assert _contents(store.client(), txns_id, ds)[ds[0]] == {((1,), ("theirs",)): 1, ((2,), ("theirs",)): 1}


def test_a_listing_read_ahead_keeps_bodies_it_did_not_know_and_drops_what_was_settled(store: Store) -> None:
    """Taking in a listing begun earlier: a body known when it began and missing from it is gone (committed
    elsewhere); one read or published since stays; an object this sequencer settled since it began
    (committed, then deleted) is not read in again."""
    client = store.client()
    txns_id, ds = _setup(client, 1)
    gc = GroupCommitter(TxnsHandle.open(client, txns_id), direct=False)
    pending = queue_prefix(txns_id) + "pending/"
    h = gc.handle
    bodies = {}
    for n, name in enumerate(("gone", "kept", "later", "settled")):
        txn = h.begin()
        txn.write(ds[0], (n,), (name,), 1)
        bodies[name] = _as_queued(txn, h.upper)
    gc._bodies = {pending + "gone": bodies["gone"], pending + "kept": bodies["kept"],
                  pending + "settled": bodies["settled"]}
    listing = group_commit_module._Listing(
        time.monotonic(), gc._known(), [pending + "kept", pending + "settled", pending + "new"],
        {pending + "new": bodies["later"].encode(), pending + "settled": bodies["settled"].encode()},
    )
    gc._bodies[pending + "later"] = bodies["later"]  # (read or published after the listing began)
    gc._delete(pending + "settled")  # (committed by this sequencer after the listing began)
    gc._take_listing(listing)
    assert set(gc._bodies) == {pending + "kept", pending + "later", pending + "new"}
    gc.close()


def test_a_round_does_not_read_again_the_objects_whose_delete_has_not_landed(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A round's deletes run in the background; the next round's listing, made before they land, still holds
    the committed objects. They are not read again (in the S3 model, objects were read 1.6 times each), and
    once a delete lands, a later listing no longer needs the rule."""
    monkeypatch.setattr(group_commit_module, "FOUND_LATELY_S", 0.0)  # (no read-ahead: every round lists itself)
    client = store.client()
    txns_id, ds = _setup(client, 1)
    gets: list[str] = []
    real_get, real_delete_many = client.blob.get, client.blob.delete_many
    deletes_may_land = threading.Event()

    def get(key: str) -> bytes | None:
        gets.append(key)
        return real_get(key)

    def delete_many(keys: list[str]) -> None:
        assert deletes_may_land.wait(30)
        real_delete_many(keys)

    client.blob.get = get  # type: ignore[method-assign]
    client.blob.delete_many = delete_many  # type: ignore[method-assign]
    gc = GroupCommitter(TxnsHandle.open(client, txns_id), direct=False)
    theirs, foreign = _foreign_queuer(store, txns_id, ds[0])
    assert gc.lease.hold()
    first = f"{queue_prefix(txns_id)}pending/{foreign(1).txn_id}"
    assert gc.run_round() == 1
    assert first in _queue_keys(store.client(), txns_id)  # (committed; its delete has not landed)
    second = f"{queue_prefix(txns_id)}pending/{foreign(2).txn_id}"
    assert gc.run_round() == 1
    assert gets.count(first) == 1, "a committed object whose delete had not landed was read again"
    assert gets.count(second) == 1
    deletes_may_land.set()
    gc.close()
    theirs.close()
    assert _queue_keys(store.client(), txns_id) == []
    assert gc._settled == {} or all(t < float("inf") for t in gc._settled.values())
    assert _contents(store.client(), txns_id, ds)[ds[0]] == {((1,), ("theirs",)): 1, ((2,), ("theirs",)): 1}


def test_a_writer_of_the_sequencing_process_learns_its_commit_when_the_round_ends(store: Store) -> None:
    """In the process that sequences, a waiting writer sleeps until the next round of its process committed,
    not for its whole pause (its transaction is handed over; the round moves the view): with a pause of
    30 s, the handed transactions here commit and return at once."""
    client = store.client()
    txns_id, ds = _setup(client, 1)
    gc = GroupCommitter(TxnsHandle.open(client, txns_id), direct=False, linger_s=60)
    first = gc.handle.begin()
    first.write(ds[0], (0,), ("a",), 1)
    gc.commit(first)  # (takes the lease: this process now sequences, in a background thread)
    assert gc._serving is not None
    gc._found_s = 30.0 / FIRST_LOOK_SHARE  # (a writer's first look would come after 30 s)
    out: list[int] = []

    def commit(n: int) -> None:
        txn = gc.handle.begin()
        txn.write(ds[0], (n,), ("a",), 1)
        out.append(gc.commit(txn).commit_ts)

    for n in range(1, 4):
        t = threading.Thread(target=commit, args=(n,))
        t.start()
        t.join(15)
        assert not t.is_alive(), "a handed transaction's writer slept its whole pause after its round committed"
    assert gc.handed == 3 and len(out) == 3
    gc.close()
    assert _contents(store.client(), txns_id, ds)[ds[0]] == {((n,), ("a",)): 1 for n in range(4)}


def test_one_look_finds_the_commits_of_every_waiting_thread_of_a_process(store: Store) -> None:
    """Threads of a process that does not sequence learn their commits from one read of the txns shard: the
    thread that looks checks every transaction its process has waiting, and the others take what it found.
    (Each looking for its own under the lock, with a read each, the looks of 64 threads were a convoy: their
    process committed an eighth of what the sequencing one did.)"""
    client = store.client()
    txns_id, ds = _setup(client, 1)
    sequencer = GroupCommitter(TxnsHandle.open(store.client(), txns_id), direct=False, lease_ms=60_000)
    assert sequencer.lease.hold()  # (another process sequences: these writers only queue and look)
    h = TxnsHandle.open(client, txns_id)
    gc = GroupCommitter(h, direct=False, poll_s=0.0)  # (a read of the txns shard on every look)
    gc._found_s = 1.0 / FIRST_LOOK_SHARE  # (the first look after 1 s: by then the round below committed all of them)
    syncs: list[float] = []
    real_sync = h.cache.sync

    def counting_sync() -> None:
        syncs.append(time.monotonic())
        real_sync()

    h.cache.sync = counting_sync  # type: ignore[method-assign]
    threads, out = 8, {}

    def commit(n: int) -> None:
        with gc._lock:  # (the handle serves one thread at a time)
            txn = h.begin()
            txn.write(ds[0], (n,), ("a",), 1)
        out[n] = gc.commit(txn).commit_ts

    ts = [threading.Thread(target=commit, args=(n,)) for n in range(threads)]
    for t in ts:
        t.start()
    deadline = time.monotonic() + 10
    while len(_queue_keys(client, txns_id)) < threads and time.monotonic() < deadline:
        time.sleep(0.005)
    assert sequencer.run_round() == threads
    for t in ts:
        t.join(30)
    assert len(out) == threads and len(set(out.values())) == 1
    assert len(syncs) <= 2, f"{len(syncs)} reads of the txns shard for {threads} transactions committed together"
    gc.close()
    sequencer.close()
    assert _contents(store.client(), txns_id, ds)[ds[0]] == {((n,), ("a",)): 1 for n in range(threads)}


def test_a_slow_look_does_not_delay_the_next_first_look(store: Store) -> None:
    """A writer's first look comes after a share of how long its process's transactions took to be found
    committed lately, counted to the start of the look that found them, not to its end. (Counted to the
    end, a look that took long made the next first look later, so more versions of the txns shard piled
    up for it to read, so it took longer: on moto at 2 processes, queued commits waited 290 ms, of which
    the looks took 150.)"""
    client = store.client()
    txns_id, ds = _setup(client, 1)
    sequencer = GroupCommitter(TxnsHandle.open(store.client(), txns_id), direct=False, lease_ms=60_000)
    assert sequencer.lease.hold()  # (another process sequences: this writer queues and looks)
    stop = threading.Event()

    def rounds() -> None:
        while not stop.is_set():
            sequencer.run_round()
            time.sleep(0.002)

    seq = threading.Thread(target=rounds)
    seq.start()
    h = TxnsHandle.open(client, txns_id)
    gc = GroupCommitter(h, direct=False)
    look_s = 0.2
    real_sync = h.cache.sync

    def slow_sync() -> None:
        real_sync()
        time.sleep(look_s)  # (a look that reads many versions)

    h.cache.sync = slow_sync  # type: ignore[method-assign]
    try:
        for n in range(12):
            txn = h.begin()
            txn.write(ds[0], (n,), ("a",), 1)
            gc.commit(txn)
    finally:
        stop.set()
        seq.join(30)
        gc.close()
        sequencer.close()
    # found about when the rounds commit them (tens of ms); the looks' 200 ms are not in it
    assert gc._pause(1) < look_s / 2, f"first look after {gc._pause(1):.3f} s"
    assert _contents(store.client(), txns_id, ds)[ds[0]] == {((n,), ("a",)): 1 for n in range(12)}


def test_the_sequencer_maintains_the_txns_shard_after_its_rounds_one_run_at_a_time(store: Store) -> None:
    """The sequencing process runs ``maintain`` after rounds that committed, in a thread of its own, never two
    runs at once (a round that ends while one runs starts none); a committer given none runs nothing."""
    client = store.client()
    txns_id, ds = _setup(client, 1)
    calls: list[str] = []
    running, most = [0], [0]
    lock = threading.Lock()

    def maintain() -> None:
        with lock:
            running[0] += 1
            most[0] = max(most[0], running[0])
            calls.append(threading.current_thread().name)
        time.sleep(0.02)
        with lock:
            running[0] -= 1

    gc = GroupCommitter(TxnsHandle.open(client, txns_id), direct=False, maintain=maintain)

    def commit(t: int) -> None:
        for n in range(10):
            txn = gc.handle.begin()
            txn.write(ds[0], (t * 100 + n,), ("a",), 1)
            gc.commit(txn)

    ts = [threading.Thread(target=commit, args=(t,)) for t in range(4)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(60)
    gc.close()
    assert calls and all(name.startswith("txns-sequencer-maintain") for name in calls), calls
    assert most[0] == 1
    assert len(calls) <= gc.rounds
    want = {((t * 100 + n,), ("a",)): 1 for t in range(4) for n in range(10)}
    assert _contents(store.client(), txns_id, ds)[ds[0]] == want


def test_a_writer_knows_another_process_sequences_once_its_round_committed_the_writers_transaction(
    store: Store,
) -> None:
    """``another_sequences``: true in a process whose queued transaction another process's round committed
    (for ``contended_s``), or while another holds the sequencer lease as last read; never in the process that
    sequences. (The database leaves the txns shard's maintenance to that process then.)"""
    client = store.client()
    txns_id, ds = _setup(client, 1)
    sequencer = GroupCommitter(TxnsHandle.open(store.client(), txns_id), direct=False, lease_ms=60_000)
    assert sequencer.lease.hold()
    gc = GroupCommitter(TxnsHandle.open(client, txns_id), direct=False, contended_s=0.3, lease_ms=60_000)
    assert not gc.another_sequences()  # (nothing known yet)
    out: list[int] = []
    txn = gc.handle.begin()
    txn.write(ds[0], (1,), ("a",), 1)
    writer = threading.Thread(target=lambda: out.append(gc.commit(txn).commit_ts))
    writer.start()
    deadline = time.monotonic() + 10
    while not _queue_keys(client, txns_id) and time.monotonic() < deadline:
        time.sleep(0.005)
    assert sequencer.run_round() == 1
    writer.join(30)
    assert out
    assert gc.another_sequences()  # (another's round committed its transaction; the lease read names it too)
    assert not sequencer.another_sequences()
    sequencer.lease.release()
    assert gc.lease.hold(fresh=True)  # (read again: free, so this process takes it, and knows no other holder)
    assert gc.another_sequences()  # (the other's round committed its transaction within contended_s)
    time.sleep(0.35)
    assert not gc.another_sequences()
    gc.lease.release()
    gc.close()
    sequencer.close()


def test_an_error_looking_up_one_threads_transaction_goes_to_that_thread_not_the_one_looking(store: Store) -> None:
    """A look checks every waiting transaction of its process; an error other than storage's while looking one
    up is that transaction's outcome (its own thread raises it), and the others' are still found."""
    client = store.client()
    txns_id, ds = _setup(client, 1)
    h = TxnsHandle.open(client, txns_id)
    ok, bad = h.begin(), h.begin()
    ok.write(ds[0], (1,), ("a",), 1)
    bad.write(ds[0], (2,), ("b",), 1)
    at = h.commit(ok, at=h.upper).commit_ts
    gc = GroupCommitter(h, direct=False)
    gc._in_queue = {t.id: _as_queued(t, 0) for t in (ok, bad)}
    real = gc._committed

    def committed(q: Queued) -> int | None:
        if q.txn_id == bad.id:
            raise InvalidUsage("planted: this lookup fails")
        return real(q)

    gc._committed = committed  # type: ignore[method-assign]
    gc._look()  # (the looking thread: no error)
    assert gc._learned[ok.id] == at
    assert isinstance(gc._learned[bad.id], InvalidUsage)
    gc.close()


def _writer_and_sequencer(store: Store, **writer: Any) -> tuple[str, list[str], GroupCommitter, GroupCommitter]:
    """A sequencer holding the lease (another process) and a writer that only queues and looks."""
    txns_id, ds = _setup(store.client(), 1)
    sequencer = GroupCommitter(TxnsHandle.open(store.client(), txns_id), direct=False, lease_ms=60_000)
    assert sequencer.lease.hold()
    gc = GroupCommitter(TxnsHandle.open(store.client(), txns_id), direct=False, lease_ms=60_000, **writer)
    return txns_id, ds, sequencer, gc


def _commit_in_thread(gc: GroupCommitter, d: str, n: int, out: list[int]) -> threading.Thread:
    """Commit a write of ``n`` to ``d`` through ``gc`` in a thread; return once its object is queued."""
    with gc._lock:
        txn = gc.handle.begin()
        txn.write(d, (n,), ("a",), 1)
    t = threading.Thread(target=lambda: out.append(gc.commit(txn).commit_ts))
    t.start()
    key = f"{queue_prefix(gc.handle.txns_id)}pending/{txn.id}"
    deadline = time.monotonic() + 10
    while gc.blob.get(key) is None and time.monotonic() < deadline:
        time.sleep(0.005)
    return t


def test_a_writer_learns_its_commit_from_its_note_without_reading_the_txns_shard(store: Store) -> None:
    """The sequencer writes a commit note for another process's transaction it committed (its commit time,
    before the object is deleted); the waiting writer reads it (one GET) and not the txns shard, whose every
    version each such process read before; then the note is deleted."""
    client = store.client()
    txns_id, ds, sequencer, gc = _writer_and_sequencer(store, poll_s=0.0)
    syncs: list[float] = []
    real_sync = gc.handle.cache.sync
    gc.handle.cache.sync = lambda: (syncs.append(1.0), real_sync())[1]  # type: ignore[method-assign]
    out: list[int] = []
    for n in range(3):
        t = _commit_in_thread(gc, ds[0], n, out)
        # (the first round may take the listing the last one read ahead, from before this object)
        assert sequencer.run_round() == 1 or sequencer.run_round() == 1
        t.join(30)
        assert not t.is_alive()
    assert syncs == [], f"the writer read the txns shard {len(syncs)} times"
    assert out == sorted(set(sequencer.handle.cache.seen_batches.values()))  # (the times its rounds committed)
    gc.close()
    sequencer.close()
    assert list(client.blob.list_keys(queue_prefix(txns_id))) == []  # (the notes were deleted once read)
    assert _contents(store.client(), txns_id, ds)[ds[0]] == {((n,), ("a",)): 1 for n in range(3)}


def test_a_writer_whose_note_is_never_written_learns_its_commit_from_the_log(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A sequencer that dies between its write and its notes leaves the writer without a note: after its
    patience the writer reads the txns log, finds the commit there (exactly once), and reads the log at every
    look for a while after (a sequencer may write none)."""
    monkeypatch.setattr(group_commit_module, "NOTE_PATIENCE_S", 0.2)
    txns_id, ds, sequencer, gc = _writer_and_sequencer(store)
    sequencer._write_note = lambda key: None  # type: ignore[method-assign]
    out: list[int] = []
    started = time.monotonic()
    t = _commit_in_thread(gc, ds[0], 1, out)
    assert sequencer.run_round() == 1
    t.join(30)
    assert len(out) == 1 and time.monotonic() - started >= 0.2
    assert time.monotonic() - gc._note_missing_at < 5  # (the log showed a commit with no note)
    assert gc._log_due({})
    gc.close()
    sequencer.close()
    assert _contents(store.client(), txns_id, ds)[ds[0]] == {((1,), ("a",)): 1}


def test_the_next_sequencer_writes_the_note_of_a_transaction_a_dead_one_committed(store: Store) -> None:
    """A sequencer that dies after its write leaves the object; the next round finds it committed, writes its
    note with the commit time the log has, and only then deletes the object."""
    client = store.client()
    txns_id, ds = _setup(client, 1)
    dead = GroupCommitter(TxnsHandle.open(store.client(), txns_id), direct=False, lease_ms=60_000)
    dead._delete_doomed = lambda: None  # type: ignore[method-assign]  # (no notes, no deletes)
    assert dead.lease.hold()
    writer = TxnsHandle.open(store.client(), txns_id)
    txn = writer.begin()
    txn.write(ds[0], (1,), ("a",), 1)
    GroupCommitter(writer, direct=False)._enqueue(dataclasses.replace(_as_queued(txn, writer.upper), writer="w1"))
    assert dead.run_round() == 1
    assert [k for k in _queue_keys(client, txns_id) if "/pending/" in k]  # (committed, still queued)
    assert list(client.blob.list_keys(f"{queue_prefix(txns_id)}committed/")) == []
    dead.lease.release()  # (as if it lapsed)
    nxt = GroupCommitter(TxnsHandle.open(store.client(), txns_id), direct=False)
    assert nxt.run_round() == 0  # (found committed: not committed again)
    nxt.close()
    batch_ids = {b.id for bs in txn.batches().values() for b in bs}
    at = dead.handle.cache.committed_at(batch_ids, dead.handle.cache.tracked_from)
    assert list(client.blob.list_keys(f"{queue_prefix(txns_id)}committed/")) == [nxt._note_key(txn.id)]
    assert client.blob.get(nxt._note_key(txn.id)) == str(at).encode()
    assert _queue_keys(client, txns_id) == []
    assert _contents(store.client(), txns_id, ds)[ds[0]] == {((1,), ("a",)): 1}


def test_commit_notes_no_writer_read_are_swept_after_two_sweeps(store: Store) -> None:
    """A note whose writer stopped before reading it is deleted by the sequencer's sweep once the sweep
    before it (``NOTE_SWEEP_S`` earlier) found it too; a note newer than the last sweep stays."""
    client = store.client()
    txns_id, _ = _setup(client, 1)
    gc = GroupCommitter(TxnsHandle.open(client, txns_id), direct=False)
    prefix = f"{queue_prefix(txns_id)}committed/"
    client.blob.set(f"{prefix}old", b"5")
    gc._swept_at = float("-inf")
    gc._sweep_notes()  # (first sweep: remembers "old")
    client.blob.set(f"{prefix}new", b"6")
    gc._sweep_notes()  # (too soon: nothing)
    assert sorted(client.blob.list_keys(prefix)) == [f"{prefix}new", f"{prefix}old"]
    gc._swept_at = float("-inf")
    gc._sweep_notes()  # (old was in both sweeps; new only in this one)
    assert list(client.blob.list_keys(prefix)) == [f"{prefix}new"]
    gc.close()


def test_a_note_that_lands_while_the_log_is_read_does_not_send_the_writer_to_the_log(store: Store) -> None:
    """A writer past its patience reads the log and finds its commit there; its note, written at the end of
    the same round, may land meanwhile: listed again before the writer concludes that notes go missing (and
    reads the log at every look for a minute), it is found, and the writer stays with the notes."""
    client = store.client()
    txns_id, ds = _setup(client, 1)
    h = TxnsHandle.open(client, txns_id)
    gc = GroupCommitter(h, direct=False, poll_s=0.0)
    other = TxnsHandle.open(store.client(), txns_id)
    txn = other.begin()
    txn.write(ds[0], (1,), ("a",), 1)
    q = dataclasses.replace(_as_queued(txn, other.upper), writer=gc.writer_id)
    at = other.commit(txn, at=other.upper).commit_ts  # (committed by "a sequencer")
    gc._in_queue = {q.txn_id: q}
    gc._queued_at = {q.txn_id: time.monotonic() - 600}  # (long past its patience: the look reads the log)
    real_read_notes = gc._read_notes
    calls: list[set[str] | None] = []

    def note_lands_after_the_first_listing(only: set[str] | None = None) -> dict[str, int]:
        calls.append(only)
        if len(calls) == 1:
            client.blob.set(gc._note_key(q.txn_id), str(at).encode())  # (lands just after)
            return {}
        return real_read_notes(only)

    gc._read_notes = note_lands_after_the_first_listing  # type: ignore[method-assign]
    gc._look()
    assert gc._learned[q.txn_id] == at  # (from the log)
    assert calls == [None, {q.txn_id}]  # (read again for the commit the log showed)
    assert gc._note_missing_at == float("-inf")
    gc._in_queue = {}
    gc.close()
    assert list(client.blob.list_keys(f"{queue_prefix(txns_id)}committed/")) == []  # (the note was deleted)


def test_an_error_looking_a_transaction_up_in_the_log_is_not_taken_for_a_missing_note(store: Store) -> None:
    """A look that reads the log (past a transaction's patience) and gets an error looking it up leaves that
    error to the transaction's thread; it is not a commit without a note, so the process does not go to
    the log at every look for a minute."""
    client = store.client()
    txns_id, ds = _setup(client, 1)
    h = TxnsHandle.open(client, txns_id)
    bad = h.begin()
    bad.write(ds[0], (1,), ("b",), 1)
    gc = GroupCommitter(h, direct=False, poll_s=0.0)
    gc._in_queue = {bad.id: _as_queued(bad, 0)}
    gc._queued_at = {bad.id: time.monotonic() - 600}  # (past its patience: the look reads the log)

    def committed(q: Queued) -> int | None:
        raise InvalidUsage("planted: this lookup fails")

    gc._committed = committed  # type: ignore[method-assign]
    gc._look()
    assert isinstance(gc._learned[bad.id], InvalidUsage)
    assert gc._note_missing_at == float("-inf")
    gc._in_queue = {}
    gc.close()
