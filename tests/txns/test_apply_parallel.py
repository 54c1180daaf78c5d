"""txns: applying commits that touched K data shards writes them in parallel, then maintains them.

A commit is readable once every touched shard's apply (one conditional write
each) has landed; those writes overlap (up to ``APPLY_PARALLELISM``), and the
maintenance they ask for (compaction) starts only after all of them, so no
shard's apply waits behind another shard's compaction. A shard is maintained
only once it holds ``DATA_MAINTAIN_BATCHES`` batches (an apply adds one small
batch; compacting after nearly every one cost a conditional write each).
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

    # enough commits, applied together below, for every shard to be due its maintenance
    last = [commit_round(r) for r in range(DATA_MAINTAIN_BATCHES)][-1]

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
    inner = h._apply_one

    def apply_one(d: str, ts: int, group: list) -> None:  # type: ignore[type-arg]
        barrier.wait()
        inner(d, ts, group)
        applied.append(stamp())

    real_maintain = WriteHandle.maintain

    def maintain(self: WriteHandle) -> None:
        if self.shard_id in shards:
            maintained.append(self.shard_id)
            maintained_at.append(stamp())
        real_maintain(self)

    monkeypatch.setattr(h, "_apply_one", apply_one)
    monkeypatch.setattr(WriteHandle, "maintain", maintain)
    tidy = h.apply_le(last)

    assert len(applied) == (len(shards) + 1) * DATA_MAINTAIN_BATCHES
    assert sorted(maintained) == sorted(shards)
    assert min(maintained_at) >= max(applied), "a shard's maintenance started before every apply had landed"
    assert len(tidy.entries) == (len(shards) + 1) * DATA_MAINTAIN_BATCHES  # (the commit records too)
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
