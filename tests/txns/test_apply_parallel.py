"""txns: applying commits that touched K data shards writes them in parallel, then maintains them.

A commit is readable once every touched shard's apply (one conditional
write each, for the run of commits it applies to that shard) has landed;
those writes overlap (up to ``APPLY_PARALLELISM``), and the maintenance
they ask for (compaction) starts only after all of them, so no
shard's apply waits behind another shard's compaction. A shard is maintained
only once it holds ``DATA_MAINTAIN_BATCHES`` batches (an apply adds one small
batch; compacting after nearly every one cost a conditional write each).
An apply of many commits to one shard is one conditional write (a run).
"""

from __future__ import annotations

import itertools
import threading

import pytest

from persist import PersistClient, WriteHandle
from tests.helpers import mem_url
from tests.txns.model import SCHEMA, new_id
from txns import TxnsHandle
from txns.handle import DATA_MAINTAIN_BATCHES


def test_applies_overlap_and_maintenance_follows_them_all(monkeypatch: pytest.MonkeyPatch) -> None:
    client = PersistClient.open(mem_url("apply-parallel"))
    h = TxnsHandle.open(client, new_id())
    shards = [new_id() for _ in range(12)]
    h.register(h.upper, dict.fromkeys(shards, SCHEMA))

    def commit_round(r: int) -> int:
        txn = h.begin()
        for j, d in enumerate(shards):
            txn.write(d, (j * 100 + r,), ("v",), 1)
        return h.commit(txn).commit_ts

    # enough commits for every shard to be due its maintenance after the apply below: each apply
    # appends one batch to each shard, whatever the number of commits it covers
    for r in range(DATA_MAINTAIN_BATCHES - 1):
        h.apply_le(commit_round(r))
    last = commit_round(DATA_MAINTAIN_BATCHES - 1)

    # every apply (the 12 shards' and the commits shard's) waits at a barrier that only
    # opens once all 13 are in flight at once
    barrier = threading.Barrier(len(shards) + 1, timeout=10)
    # event order by a shared counter (not the clock): deterministic on any machine
    order = itertools.count()
    order_lock = threading.Lock()

    def stamp() -> int:
        with order_lock:
            return next(order)

    applied: list[int] = []
    maintained: list[str] = []
    maintained_at: list[int] = []
    inner = h._apply_run

    def apply_run(d: str, commits: list) -> None:  # type: ignore[type-arg]
        barrier.wait()
        inner(d, commits)
        applied.append(stamp())

    real_maintain = WriteHandle.maintain

    def maintain(self: WriteHandle) -> None:
        if self.shard_id in shards:
            maintained.append(self.shard_id)
            maintained_at.append(stamp())
        real_maintain(self)

    monkeypatch.setattr(h, "_apply_run", apply_run)
    monkeypatch.setattr(WriteHandle, "maintain", maintain)
    tidy = h.apply_le(last)

    assert len(applied) == len(shards) + 1
    assert sorted(maintained) == sorted(shards)
    assert min(maintained_at) >= max(applied), "a shard's maintenance started before every apply had landed"
    # every entry applied so far, the earlier applies' too (none was tidied): the commit records' too
    assert len(tidy.entries) == (len(shards) + 1) * DATA_MAINTAIN_BATCHES
    for j, d in enumerate(shards):
        r = client.open_leased_reader(d, SCHEMA)
        got = r.snapshot_and_fetch(last)
        assert got == [(((j * 100 + k,), ("v",)), last, 1) for k in range(DATA_MAINTAIN_BATCHES)]

    # one more commit: its applies leave every shard with few batches, so none is maintained
    maintained.clear()
    barrier = threading.Barrier(1)
    h.apply_le(commit_round(DATA_MAINTAIN_BATCHES))
    assert all(len(client.shard(d).fetch().batches) < DATA_MAINTAIN_BATCHES for d in shards)
    assert maintained == []


def test_a_run_of_commits_is_applied_in_one_write_each_at_its_own_time() -> None:
    """Ten commits to one shard, applied together: one compare-and-append, every row at its commit time."""
    client = PersistClient.open(mem_url("apply-run"))
    h = TxnsHandle.open(client, new_id())
    d = new_id()
    h.register(h.upper, {d: SCHEMA})
    times = []
    for k in range(10):
        txn = h.begin()
        txn.write(d, (k,), ("v",), 1)
        times.append(h.commit(txn).commit_ts)
    w = h.data_writer(d)
    seqno = client.shard(d).fetch().seqno
    h.apply_le(times[-1])
    assert client.shard(d).fetch().seqno == seqno + 1, "the ten commits were appended in one write"
    assert w.fetch_recent_upper() == times[-1] + 1
    r = client.open_leased_reader(d, SCHEMA)
    for k, ts in enumerate(times):  # every commit at its own time: the snapshot at ts holds rows 0..k
        assert sorted(r.snapshot_and_fetch(ts)) == [(((j,), ("v",)), ts, 1) for j in range(k + 1)]


def test_a_run_already_applied_in_part_appends_only_the_rest() -> None:
    """Another applier applied the first commits of the run: the rest is appended, nothing twice."""
    client = PersistClient.open(mem_url("apply-run-part"))
    h = TxnsHandle.open(client, new_id())
    other = TxnsHandle.open(client, h.txns_id)
    d = new_id()
    h.register(h.upper, {d: SCHEMA})
    times = []
    for k in range(6):
        txn = h.begin()
        txn.write(d, (k,), ("v",), 1)
        times.append(h.commit(txn).commit_ts)
    h.cache.sync()  # (h's view holds all six, unapplied)
    other.apply_le(times[2])  # the first three, by another handle
    h.apply_le(times[-1])
    r = client.open_leased_reader(d, SCHEMA)
    assert sorted(r.snapshot_and_fetch(times[-1])) == [(((j,), ("v",)), times[-1], 1) for j in range(6)]
    assert sorted(r.snapshot_and_fetch(times[2])) == [(((j,), ("v",)), times[2], 1) for j in range(3)]
