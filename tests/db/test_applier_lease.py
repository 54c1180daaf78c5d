"""Applying once across processes: the applier lease (txns.db.applier).

Two spawned processes commit one-row transactions to one table. Contended,
they apply through the applier lease: one holder applies everyone's
commits, the other leaves its applies to it. The holder is killed with
SIGKILL mid-run; the survivor's background worker (never waited for, so
never forced) must take over within a lease and apply every commit, the
dead holder's included, and each exactly once: the data shard's own
contents (read raw, without the txns log) equal the table a fresh
connection reads, one row per commit in the history, and hold every
acknowledged commit.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import queue
import signal
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

import txns
from persist import unframe
from txns.db.applier import applier_key
from txns.group_commit import KIND_LEASE
from txns.handle import DataSnapshot, TxnsHandle


def _worker(url: str, wid: int, out: Any, stop: Any) -> None:
    db = txns.connect(url)
    n = 0
    told = covered = False
    while not stop.is_set():
        with db.transaction() as t:
            t.insert("events", [{"id": f"{wid}-{n}"}])
        out.put(("ack", wid, f"{wid}-{n}"))
        n += 1
        lease = db._applier._lease
        if lease is not None and not told:
            out.put(("lease", wid, lease.holder))
            told = True
        if db._applier.covered and not covered:
            out.put(("covered", wid))
            covered = True
        time.sleep(0.01)
    # The survivor: its background worker (nothing waits for it, so nothing forces an apply)
    # must get every commit applied, its own and the dead holder's.
    last = db.latest()
    deadline = time.monotonic() + 60
    while db._applier._applied < last and time.monotonic() < deadline:
        time.sleep(0.05)
    lease = db._applier._lease
    out.put(("applied", wid, db._applier._applied, last, db._applier.covered, lease is not None and lease.held))
    db.close()


def _holder(db: txns.Database) -> str | None:
    key = applier_key(db.root.txns_id)
    head = db.client.consensus.head(key)
    if head is None:
        return None
    j = json.loads(unframe(key, head.data, KIND_LEASE))
    return str(j["holder"]) if j["expires_ms"] > time.time() * 1000 else None


@pytest.mark.slow  # (about 20 s: two spawned processes, a lease to lapse)
@pytest.mark.timeout(300)
def test_a_killed_applier_lease_holder_is_replaced_and_every_commit_is_applied_once(tmp_path: Path) -> None:
    url = f"file://{tmp_path / 'db'}"
    db = txns.connect(url)
    db.create_table("events", pa.schema([("id", pa.string())]))
    data_id = db.catalog(db.latest()).tables["events"].data_id
    ctx = multiprocessing.get_context("spawn")
    # One queue per process: a process killed while it sends holds its queue's write lock (and may
    # leave half a message) for good, so a shared queue would silence the survivor too.
    outs, stops = [ctx.Queue(), ctx.Queue()], [ctx.Event(), ctx.Event()]
    ps = [ctx.Process(target=_worker, args=(url, i, outs[i], stops[i])) for i in range(2)]
    reading = [0, 1]  # (the queues still read: not the killed process's)
    for p in ps:
        p.start()
    acked: dict[int, set[str]] = {0: set(), 1: set()}
    holders: dict[str, int] = {}
    covered: set[int] = set()
    applied: list[tuple[Any, ...]] = []

    def drain(timeout: float = 0.05) -> None:
        # A message from each queue in turn (a process that keeps sending does not starve the other's),
        # until a turn finds none; returns within about a second even while messages keep coming.
        until = time.monotonic() + 1.0
        while time.monotonic() < until:
            got = False
            for i in reading:
                try:
                    m = outs[i].get(timeout=timeout / len(reading))
                except queue.Empty:
                    continue
                got = True
                if m[0] == "ack":
                    acked[m[1]].add(m[2])
                elif m[0] == "lease":
                    holders[m[2]] = m[1]
                elif m[0] == "covered":
                    covered.add(m[1])
                else:
                    applied.append(m)
            if not got:
                return

    try:
        # wait until one of them holds the lease (we know which) and has applied commits of the other
        deadline = time.monotonic() + 120
        victim = None
        while victim is None and time.monotonic() < deadline:
            drain()
            h = _holder(db)
            if h in holders and (1 - holders[h]) in covered:
                victim = holders[h]
        assert victim is not None, f"no process applied for the other (acked {[len(a) for a in acked.values()]})"
        survivor = 1 - victim
        reading.remove(victim)
        os.kill(ps[victim].pid or 0, signal.SIGKILL)
        ps[victim].join(30)
        drain()
        n_before = len(acked[survivor])
        # the survivor keeps committing past the dead holder's lease
        deadline = time.monotonic() + 60
        while len(acked[survivor]) < n_before + 20 and time.monotonic() < deadline:
            drain()
        time.sleep(3)
        stops[survivor].set()
        deadline = time.monotonic() + 120
        while not applied and time.monotonic() < deadline:
            drain(0.5)
        ps[survivor].join(60)
        drain()
    finally:
        for p in ps:
            if p.is_alive():
                p.kill()
                p.join(10)
    assert applied, "the survivor did not report"
    _, _, survivor_applied, last, _, held = applied[0]
    assert survivor_applied >= last, "the survivor's background worker did not apply every commit"
    assert held, "the survivor did not take the applier lease over"

    # Every commit exactly once: the table (fresh connection), the history, and the data shard's own contents.
    fresh = txns.connect(url)
    ids = fresh.table("events").to_arrow().column("id").to_pylist()
    assert len(ids) == len(set(ids))
    assert acked[0] | acked[1] <= set(ids)
    for w in (0, 1):  # each process's commits: its first m, none skipped, none made up
        mine = {i for i in ids if i.startswith(f"{w}-")}
        assert mine == {f"{w}-{n}" for n in range(len(mine))}
    # (the survivor's acks were all read; the victim's last ones may not have been)
    assert len({i for i in ids if i.startswith(f"{survivor}-")}) <= len(acked[survivor]) + 1
    history = fresh.history("events")
    assert history.num_rows == len(ids) + 1  # (and the table's creation)
    h = TxnsHandle.open(fresh.client, fresh.root.txns_id, hold=False)
    w = h.data_writer(data_id)
    assert w.upper > last, "the data shard was not applied through the last commit"
    raw = DataSnapshot(h, data_id, last).snapshot_and_fetch()
    assert all(diff == 1 for _, _, diff in raw), "a commit was applied twice"
    assert len(raw) == len(ids)
    h.close()
    fresh.close()
    db.close()
