"""txns: a holding cache's hold on the txns shard moves with every commit of its handle, at no extra write.

Before, the hold moved only on the lease heartbeat (every 30 s by default),
so in a busy loop the txns shard's since stood still and its history stayed
unconsolidated in every state written. Now each commit's own
compare-and-append carries the hold (``TxnsCache.hold_renewal``).
"""

from __future__ import annotations

from persist import PersistClient, PersistConfig
from persist.unreliable import Faults, Op
from tests.helpers import faulty_client, mem_url
from tests.txns.model import SCHEMA, new_id
from txns import TxnsHandle


def test_each_commit_moves_the_hold_and_writes_once() -> None:
    url = mem_url("hold")
    faults = Faults(seed=0)  # (counts only)
    config = PersistConfig(reader_lease_s=3600.0)  # the heartbeat never comes due in this test
    client = faulty_client(url, faults, config)
    h = TxnsHandle.open(client, new_id())
    h.maintain_on_commit = False  # (only the commits write the txns shard)
    d = new_id()
    h.register(h.upper, {d: SCHEMA})
    warm = h.begin()  # (a handle's first commit also records the commits shard's schema)
    warm.write(d, (-1,), ("w",), 1)
    h.commit(warm)
    reader = h.cache.reader
    assert reader is not None
    start = h.cache.frontier
    for i in range(10):
        before = faults.counters.calls(Op.CAS)
        frontier = h.cache.frontier
        txn = h.begin()
        txn.write(d, (i,), (f"v{i}",), 1)
        res = h.commit(txn)
        # the commit is its one conditional write to the txns shard (no apply here)...
        assert faults.counters.calls(Op.CAS) == before + 1
        # ... and the hold moved up to what the cache had read before it
        state = PersistClient.open(url)._machine(h.txns_id).fetch()
        assert state.leased[reader.reader_id].since == frontier - 1
        assert reader.since == frontier - 1
        assert res.commit_ts >= frontier
    assert reader.since > start


def test_a_commit_without_a_hold_carries_none() -> None:
    client = PersistClient.open(mem_url("nohold"))
    h = TxnsHandle.open(client, new_id(), hold=False)
    d = new_id()
    h.register(h.upper, {d: SCHEMA})
    txn = h.begin()
    txn.write(d, (1,), ("a",), 1)
    h.commit(txn)
    assert h.cache.reader is None and h.cache.hold_renewal() is None
    assert PersistClient.open(mem_url("nohold"))._machine(h.txns_id).fetch().leased == {}
