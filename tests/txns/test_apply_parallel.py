"""txns: applying a commit that touched K data shards writes them in parallel, then maintains them.

A commit is readable once every touched shard's apply (one conditional write
each) has landed; those writes overlap (up to ``APPLY_PARALLELISM``), and the
maintenance they ask for (compaction) starts only after all of them, so no
shard's apply waits behind another shard's compaction.
"""

from __future__ import annotations

import threading
import time

from persist import PersistClient, WriteHandle
from tests.helpers import mem_url
from tests.txns.model import SCHEMA, new_id
from txns import TxnsHandle


def test_applies_overlap_and_maintenance_follows_them_all(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    client = PersistClient.open(mem_url("apply-parallel"))
    h = TxnsHandle.open(client, new_id())
    shards = [new_id() for _ in range(12)]
    h.register(h.upper, dict.fromkeys(shards, SCHEMA))
    txn = h.begin()
    for j, d in enumerate(shards):
        txn.write(d, (j,), ("v",), 1)
    res = h.commit(txn)

    # every apply (the 12 shards' and the commits shard's) waits at a barrier that only
    # opens once all 13 are in flight at once
    barrier = threading.Barrier(len(shards) + 1, timeout=10)
    applied: list[float] = []
    maintained: list[float] = []
    inner = h._apply_one

    def apply_one(d: str, ts: int, group: list) -> None:  # type: ignore[type-arg]
        barrier.wait()
        inner(d, ts, group)
        applied.append(time.monotonic())

    real_maintain = WriteHandle.maintain

    def maintain(self: WriteHandle) -> None:
        if self.shard_id in shards:
            maintained.append(time.monotonic())
        real_maintain(self)

    monkeypatch.setattr(h, "_apply_one", apply_one)
    monkeypatch.setattr(WriteHandle, "maintain", maintain)
    tidy = res.apply(h)

    assert len(applied) == len(shards) + 1 and len(maintained) == len(shards)
    assert min(maintained) >= max(applied), "a shard's maintenance started before every apply had landed"
    assert len(tidy.entries) == len(shards) + 1  # (and the commit record)
    for j, d in enumerate(shards):
        r = client.open_leased_reader(d, SCHEMA)
        assert r.snapshot_and_fetch(res.commit_ts) == [(((j,), ("v",)), res.commit_ts, 1)]
