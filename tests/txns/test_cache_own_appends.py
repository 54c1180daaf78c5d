"""txns: a handle's cache takes in its own commits without reading them back (``TxnsCache.absorb_appended``).

What it knows afterwards must be exactly what a cache that reads the txns
shard from storage knows: the frontier, the present entries, the
registrations and the write times.
"""

from __future__ import annotations

import pytest

from persist import PersistClient, ShardId
from persist.shard import ShardView
from tests.txns.model import SCHEMA, new_id
from txns import TxnsHandle
from txns.cache import TxnsCache


def _view(cache: TxnsCache) -> tuple:
    regs = {d: [(r.register_ts, r.forget_ts) for r in rs] for d, rs in cache.registrations.items() if rs}
    writes = {d: list(w) for d, w in cache.writes.items() if w}
    return cache.frontier, dict(cache.entries), regs, writes


def _fresh_view(client: PersistClient, txns_id: str) -> tuple:
    other = TxnsHandle.open(client, txns_id, hold=False)
    return _view(other.cache)


@pytest.fixture
def opened(tmp_path) -> tuple[PersistClient, TxnsHandle]:
    client = PersistClient.open(f"file://{tmp_path}/loc")
    return client, TxnsHandle.open(client, new_id(), init_ts=10)


def test_own_commits_are_taken_in_without_reading_them_back(opened, monkeypatch: pytest.MonkeyPatch) -> None:
    client, h = opened
    reads: list[int] = []
    real = ShardView.read_batch
    monkeypatch.setattr(ShardView, "read_batch", lambda self, *a: reads.append(1) or real(self, *a))
    d1, d2 = str(ShardId.new()), str(ShardId.new())
    h.register(10, {d1: SCHEMA})
    ts = 11
    for i in range(6):
        txn = h.begin()
        if i == 1:
            client.register_schema(d2, SCHEMA)
            txn.register(d2)
        txn.write(d1, (i,), (f"v{i}",), 1)
        if i >= 1:
            txn.write(d2, (i,), ("w",), 1)
            txn.write(d1, (i,), (f"v{i}",), -1 if i % 2 else 1)  # (consolidated within the commit)
        applied = txn.commit_at(h, ts)
        if i % 2:
            txn2 = h.begin()
            txn2.tidy(applied.apply(h))  # tidy retractions ride in a commit of their own
            txn2.commit_at(h, ts + 1)
            ts += 1
        ts += 1
    h.forget(ts, [d2])
    reads.clear()
    h.begin().commit_at(h, ts + 1)  # (an empty commit too)
    assert not reads, "the commit read nothing back"
    assert _view(h.cache) == _fresh_view(client, h.txns_id)


def test_a_state_that_moved_on_is_read_as_before(opened, monkeypatch: pytest.MonkeyPatch) -> None:
    client, h = opened
    d = str(ShardId.new())
    h.register(10, {d: SCHEMA})
    other = TxnsHandle.open(client, h.txns_id)  # (same client: the same cached shard state)
    appended: list[tuple] = []
    real = TxnsCache.absorb_appended

    def record(self: TxnsCache, updates: list, lower: int, upper: int) -> None:
        appended.append((self, list(updates), lower, upper))
        real(self, updates, lower, upper)

    monkeypatch.setattr(TxnsCache, "absorb_appended", record)
    txn = h.begin()
    txn.write(d, (1,), ("a",), 1)
    txn.commit_at(h, 11)
    t2 = other.begin()
    t2.write(d, (2,), ("b",), 1)
    t2.commit_at(other, 12)
    # ``h``'s own append, taken in once more after the other handle's commit moved the state on:
    # not taken on trust (the batches past its frontier are not all its own), read as before
    cache, updates, lower, upper = appended[0]
    assert cache is h.cache and (lower, upper) == (11, 12) and h.cache.frontier == 12
    real(h.cache, updates, lower, upper)
    assert h.cache.frontier == 13
    assert _view(h.cache) == _view(other.cache) == _fresh_view(client, h.txns_id)
