"""A database's write-only transactions that lose a race go through the cross-process queue (txns.group_commit)."""

from __future__ import annotations

import threading
import time
import uuid

import pyarrow as pa

import txns
from persist import PersistConfig
from txns.db.committer import QUEUE_PROBE_S
from txns.group_commit import SequencerLease, queue_has_work
from txns.handle import TxnsHandle

SCHEMA = pa.schema([("w", pa.int64()), ("i", pa.int64())])


def test_a_lost_race_commits_through_the_queue_exactly_once() -> None:
    url = f"mem://queued-{uuid.uuid4().hex}"
    # a's clock stands still (behind b's): the time a picks for its commit is the upper it last saw,
    # which b's commit takes, so a loses the race (with a running clock that needs two commits in one tick)
    frozen = int(time.time() * 1000)
    a = txns.connect(url, config=PersistConfig(clock_ms=lambda: frozen))
    a.create_table("e", SCHEMA)
    b = txns.connect(url)
    with a.transaction() as t:
        t.insert("e", [{"w": 0, "i": 0}])
    with b.transaction() as t:  # b commits: a's view of the upper is now stale
        t.insert("e", [{"w": 1, "i": 0}])
    with a.transaction() as t:  # a's first try loses the race: the queue
        t.insert("e", [{"w": 0, "i": 1}])
    committer = a.committer._queue_committer
    assert committer is not None and committer.queued == 1 and committer.grouped == 1
    assert committer.handle is not a.handle  # (its sequencer thread never shares the database's handle)
    assert t.commit_info is not None and t.commit_info.ts is not None
    rows = sorted((r["w"], r["i"]) for r in a.table("e").to_arrow().to_pylist())
    assert rows == [(0, 0), (0, 1), (1, 0)]
    history = [r for r in a.history().to_pylist() if r["ts"] == t.commit_info.ts]
    assert len(history) == 1  # one commit record for it
    a.close()
    b.close()


def test_database_objects_racing_from_threads_commit_every_row_once() -> None:
    url = f"mem://queued-race-{uuid.uuid4().hex}"
    first = txns.connect(url)
    first.create_table("e", SCHEMA)
    dbs = [txns.connect(url) for _ in range(4)]

    def run(w: int) -> None:
        for i in range(10):
            with dbs[w].transaction() as t:
                t.insert("e", [{"w": w, "i": i}])

    ths = [threading.Thread(target=run, args=(w,)) for w in range(4)]
    for th in ths:
        th.start()
    for th in ths:
        th.join()
    rows = sorted((r["w"], r["i"]) for r in first.table("e").to_arrow().to_pylist())
    assert rows == [(w, i) for w in range(4) for i in range(10)]
    for d in dbs:
        d.close()
    first.close()


def test_a_direct_writer_yields_to_transactions_waiting_in_the_queue() -> None:
    """A process whose direct writes keep winning goes through the queue once others' transactions wait there.

    (Before, it kept committing directly: its writes always won, as it holds the state its last write
    made, and a sequencer's rounds lost every race to it, starving the queued transactions.)
    """
    url = f"mem://queued-yield-{uuid.uuid4().hex}"
    a = txns.connect(url)
    a.create_table("e", SCHEMA)
    with a.transaction() as t:
        t.insert("e", [{"w": 0, "i": 0}])
    assert a.committer._queue_committer is None  # alone: direct
    txns_id = a.handle.txns_id
    # a stalled sequencer holds the lease, so queued transactions stay queued until it lets go
    stalled = SequencerLease(TxnsHandle.open(a.client, txns_id, hold=False), lease_ms=60_000)
    assert stalled.hold()
    b = txns.connect(url)
    b.committer._switch.lost(60)  # b lost a race lately: its commits queue
    errors: list[BaseException] = []

    def b_commits() -> None:
        try:
            with b.transaction() as t:
                t.insert("e", [{"w": 1, "i": 0}])
        except BaseException as e:  # noqa: BLE001 - reported by the test
            errors.append(e)

    waiting = threading.Thread(target=b_commits)
    waiting.start()
    deadline = time.monotonic() + 10
    while not queue_has_work(a.client.blob, txns_id):
        assert time.monotonic() < deadline, "b's transaction never reached the queue"
        time.sleep(0.01)
    time.sleep(QUEUE_PROBE_S)  # (a looks at the queue at most this often)
    releaser = threading.Timer(0.5, stalled.release)
    releaser.start()
    with a.transaction() as t:  # waits in the queue with b's, until the stalled sequencer lets go
        t.insert("e", [{"w": 0, "i": 1}])
    waiting.join(30)
    releaser.join()
    assert not errors and not waiting.is_alive()
    queue = a.committer._queue_committer
    assert queue is not None and queue.queued == 1  # a's second commit went through the queue
    rows = sorted((r["w"], r["i"]) for r in a.table("e").to_arrow().to_pylist())
    assert rows == [(0, 0), (0, 1), (1, 0)]
    a.close()
    b.close()


def test_a_slow_queued_commit_keeps_the_next_write_only_commits_queued(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """Contention goes on after a queued commit that waited while others queue: no look before the next commit.

    (Whether others queue is ``GroupCommitter.others_queued``, tested in tests/txns/test_group_commit.py.)
    """
    import txns.db.committer as committer_module
    from txns.group_commit import GroupCommitter

    monkeypatch.setattr(committer_module, "QUEUED_SLOW_S", 0.0)  # (every queued commit counts as slow)
    for others in (False, True):
        monkeypatch.setattr(GroupCommitter, "others_queued", lambda self, others=others: others)
        db = txns.connect(f"mem://queued-slow-{uuid.uuid4().hex}")
        db.create_table("e", SCHEMA)
        db.committer._switch.lost(0.05)  # a lost race lately: the next commit queues, for 50 ms only
        with db.transaction() as t:
            t.insert("e", [{"w": 0, "i": 0}])
        assert db.committer._queue_committer is not None and db.committer._queue_committer.queued == 1
        time.sleep(0.1)  # (past the lost race's 50 ms)
        looks: list[str] = []
        blob = db.committer._switch.blob
        real = blob.list_keys

        def counting(prefix: str, looks: list[str] = looks, real=real):  # type: ignore[no-untyped-def]
            looks.append(prefix)
            return real(prefix)

        monkeypatch.setattr(blob, "list_keys", counting)
        contended = db.committer._switch.contended(db.committer._queued_ids)
        assert contended is others and len(looks) == (0 if others else 1)
        db.close()
