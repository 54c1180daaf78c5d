"""A database's write-only transactions that lose a race go through the cross-process queue (txns.group_commit)."""

from __future__ import annotations

import threading
import time
import uuid

import pyarrow as pa

import txns
from persist import PersistConfig

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
