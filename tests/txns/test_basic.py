"""txns: the usage example, the Txn API, apply/tidy/forget/compact_to, reads, the read cache, subscribe."""

from __future__ import annotations

import random

import pytest

from persist import (
    PersistClient,
    PersistConfig,
    Progress,
    ReadTimeout,
    ShardId,
    Updates,
)
from persist.unreliable import Op
from tests.seaweedfs import STORE_KINDS
from tests.txns.model import (
    SCHEMA,
    Recorder,
    Store,
    TxnsModel,
    consolidated,
    new_id,
    open_handle,
    row,
    txns_shard_contents,
)
from txns import DataSubscribe, NotRegistered, TimestampUnavailable, Txn, TxnsHandle
from txns.handle import CRITICAL_READER

# ---- helpers ---------------------------------------------------------------------


def _commit(h: TxnsHandle, model: TxnsModel, ts: int, writes: dict[str, list[tuple]], apply: bool = True) -> None:
    """Commit ``writes`` ({d: [(row, diff)]}) at ``ts`` on ``h`` and record it in the model."""
    txn = h.begin()
    for d, ups in writes.items():
        for (k, v), diff in ups:
            txn.write(d, k, v, diff)
    res = txn.commit_at(h, ts)
    model.commit(ts, writes)
    if apply:
        res.apply(h)


def _physical_upper(client: PersistClient, shard: str) -> int:
    return client.shard(shard).fetch().upper


# ---- the design's usage example ------------------------------------------------------


@pytest.mark.parametrize("location_url", STORE_KINDS, indirect=True)
def test_usage_example(location_url: str) -> None:
    client = PersistClient.open(location_url)
    txns = TxnsHandle.open(client, ShardId.new())
    d0, d1 = new_id(), new_id()
    txns.register(1, {d0: SCHEMA})
    txns.register(2, {d1: SCHEMA})

    txn = txns.begin()
    txn.write(d0, (0,), ("a",), 1)
    txn.write(d1, (1,), ("b",), -1)
    txn.commit_at(txns, 3).apply(txns)

    txn = txns.begin()
    txn.write(d0, (2,), ("c",), 1)
    with pytest.raises(TimestampUnavailable) as e:
        txn.commit_at(txns, 3)
    assert e.value.upper == 4
    assert "commit at 3 is not possible: the txns shard upper is 4; use a time >= 4" in str(e.value)
    txn.commit_at(txns, 4).apply(txns)

    # d1 was not written at 4, but its logical upper moved with the commit.
    assert txns.snapshot(d1, 4) == [(((1,), ("b",)), 4, -1)]
    assert consolidated(txns.snapshot(d0, 4), 4) == {row(0, "a"): 1, row(2, "c"): 1}
    assert consolidated(txns.snapshot(d0, 3), 3) == {row(0, "a"): 1}
    # a second client on the same location sees the same
    other = TxnsHandle.open(PersistClient.open(location_url), txns.txns_id)
    assert other.snapshot(d1, 4) == [(((1,), ("b",)), 4, -1)]


@pytest.mark.parametrize("location_url", STORE_KINDS, indirect=True)
def test_time_travel_on_every_backend(location_url: str) -> None:
    client = PersistClient.open(location_url)
    h = TxnsHandle.open(client, new_id())
    model = TxnsModel()
    d0, d1 = new_id(), new_id()
    h.register(0, {d0: SCHEMA, d1: SCHEMA})
    model.register(0, [d0, d1])
    _commit(h, model, 2, {d0: [(row(1, "x"), 1)]})
    _commit(h, model, 3, {d1: [(row(2, "y"), 1)]}, apply=False)
    _commit(h, model, 5, {d0: [(row(1, "x"), -1), (row(1, "z"), 1)], d1: [(row(3, "w"), 2)]}, apply=False)
    reader = TxnsHandle.open(PersistClient.open(location_url), h.txns_id)
    for as_of in range(0, 6):
        for d in (d0, d1):
            assert consolidated(reader.snapshot(d, as_of), as_of) == model.contents(d, as_of), (d, as_of)


# ---- registration ----------------------------------------------------------------------


def test_register_is_idempotent(store: Store) -> None:
    client, h, txns_id = open_handle(store)
    d0, d1 = new_id(), new_id()
    h.register(1, {d0: SCHEMA})
    assert h.upper == 2
    # again, at the same (now closed) time and at a later one: nothing happens
    h.register(1, {d0: SCHEMA})
    h.register(7, {d0: SCHEMA})
    assert h.upper == 2
    assert _physical_upper(client, txns_id) == 2
    regs = [e for e, _ in txns_shard_contents(client, txns_id) if e.is_registration]
    assert regs == [type(regs[0])(1, d0, b"")]
    # a mix of registered and new: only the new one is added
    h.register(3, {d0: SCHEMA, d1: SCHEMA})
    assert h.upper == 4
    regs = sorted(e for e, _ in txns_shard_contents(client, txns_id) if e.is_registration)
    assert [(e.ts, e.data_id) for e in regs] == sorted([(1, d0), (3, d1)])
    # another handle on another client agrees, and its register is a no-op too
    h2 = TxnsHandle.open(store.client(), txns_id)
    h2.register(0, {d0: SCHEMA, d1: SCHEMA})
    assert _physical_upper(client, txns_id) == 4


# ---- the Txn API -----------------------------------------------------------------------------


def test_write_batch_with_a_batch_written_earlier(store: Store) -> None:
    client, h, _txns_id = open_handle(store)
    d = new_id()
    h.register(0, {d: SCHEMA})
    writer = client.open_writer(d, SCHEMA)
    builder = writer.builder(0, 1)
    builder.add((1,), ("one",), 0, 1)
    builder.add((2,), ("two",), 0, 3)
    b1 = builder.finish()
    b2 = writer.batch([(((9,), ("nine",)), 0, 1)], 0, 1)

    txn = h.begin()
    txn.write_batch(d, b1)
    txn.write_batch(d, b2)
    txn.write(d, (5,), ("five",), 1)
    txn.commit_at(h, 4).apply(h)
    want = {row(1, "one"): 1, row(2, "two"): 3, row(9, "nine"): 1, row(5, "five"): 1}
    assert consolidated(h.snapshot(d, 4), 4) == want
    assert h.snapshot(d, 3) == []
    # every update took the commit time: a listen from 3 sees them all at 4
    reader = client.open_leased_reader(d, SCHEMA)
    evs = reader.listen(3).next()
    ups = [u for ev in evs if isinstance(ev, Updates) for u in ev.updates]
    assert {u[1] for u in ups} == {4}
    assert consolidated(ups) == want


def test_txn_moves_to_another_client_and_commits_there(store: Store) -> None:
    _client_a, ha, txns_id = open_handle(store)
    d0, d1 = new_id(), new_id()
    ha.register(1, {d0: SCHEMA, d1: SCHEMA})
    txn = ha.begin()
    txn.write(d0, (1,), ("a",), 1)
    txn.write(d1, (2,), ("b",), 2)
    data = txn.to_bytes()
    assert isinstance(data, bytes)
    assert ha.upper == 2, "serializing commits nothing"

    client_b = store.client()
    hb = TxnsHandle.open(client_b, txns_id)
    moved = Txn.from_bytes(data, hb)
    assert moved.id == txn.id
    assert moved.data_ids == tuple(sorted([d0, d1]))
    moved.commit_at(hb, 5).apply(hb)
    # visible from the original handle/client
    assert consolidated(ha.snapshot(d0, 5), 5) == {row(1, "a"): 1}
    assert consolidated(ha.snapshot(d1, 5), 5) == {row(2, "b"): 2}
    assert ha.snapshot(d1, 4) == []

    # from_bytes without a handle binds at commit time
    txn2 = ha.begin()
    txn2.write(d0, (3,), ("c",), 1)
    unbound = Txn.from_bytes(txn2.to_bytes())
    unbound.commit_at(hb, 6).apply(hb)
    assert consolidated(ha.snapshot(d0, 6), 6) == {row(1, "a"): 1, row(3, "c"): 1}


def test_txn_merge(store: Store) -> None:
    client, h, txns_id = open_handle(store)
    d0, d1 = new_id(), new_id()
    h.register(0, {d0: SCHEMA, d1: SCHEMA})
    t1 = h.begin()
    t1.write(d0, (1,), ("a",), 1)
    t2 = h.begin()
    t2.write(d0, (2,), ("b",), 1)
    t2.write(d1, (3,), ("c",), 1)
    t1.merge(t2)
    assert set(t1.data_ids) == {d0, d1}
    assert t2.batches() == {}, "the merged-from txn is emptied"
    t1.commit_at(h, 3).apply(h)
    assert consolidated(h.snapshot(d0, 3), 3) == {row(1, "a"): 1, row(2, "b"): 1}
    assert consolidated(h.snapshot(d1, 3), 3) == {row(3, "c"): 1}
    # exactly one commit: one append entry per (shard, batch), all at 3
    appends = [e for e, _ in txns_shard_contents(client, txns_id) if not e.is_registration]
    assert {e.ts for e in appends} == {3}
    assert {e.data_id for e in appends} == {d0, d1}


def test_retry_at_higher_ts_retimestamps_without_rewriting() -> None:
    config = PersistConfig(part_target_bytes=2048, inline_max_bytes=64)
    store = Store(config=config)
    client, h, txns_id = open_handle(store)
    d, other = new_id(), new_id()
    h.register(0, {d: SCHEMA, other: SCHEMA})
    txn = h.begin()
    n = 9000  # the builder cuts a part per 8192 rows at least: two parts
    for i in range(n):
        txn.write(d, (i,), (f"value-{i:04d}",), 1)
    first = txn.batches()[d]
    keys = {p.key for b in first for p in b.parts}
    assert len(keys) >= 2, "the test needs real parts"

    # someone else takes ts 5
    h.begin().commit_at(h, 5)
    sets_before = store.counters.calls(Op.BLOB_SET)
    with pytest.raises(TimestampUnavailable) as e:
        txn.commit_at(h, 5)
    assert e.value.upper == 6
    txn.commit_at(h, e.value.upper).apply(h)
    data_sets = store.counters.calls(Op.BLOB_SET) - sets_before
    # the txns shard and data shard metadata are inline; no data was rewritten
    assert data_sets == 0

    # the committed entry points at exactly the parts written first
    appends = [e for e, _ in txns_shard_contents(client, txns_id) if not e.is_registration]
    assert len(appends) == len(first)
    assert {e.ts for e in appends} == {6}
    committed = {p.key for e in appends for p in e.decode_batch().parts}
    assert committed == keys
    assert client.shard(d).fetch().part_keys() == keys
    snap = consolidated(h.snapshot(d, 6), 6)
    assert snap == {row(i, f"value-{i:04d}"): 1 for i in range(n)}
    assert h.snapshot(d, 5) == []


# ---- apply ----------------------------------------------------------------------------


def test_apply_makes_data_readable_from_the_data_shard(store: Store) -> None:
    client, h, _txns_id = open_handle(store)
    d = new_id()
    h.register(0, {d: SCHEMA})
    txn = h.begin()
    txn.write(d, (1,), ("a",), 1)
    res = txn.commit_at(h, 4)
    assert res.commit_ts == 4 and res.data_ids == (d,)
    assert _physical_upper(client, d) <= 4, "committed, not yet applied"
    tidy = res.apply(h)
    assert len([e for e in tidy.entries if e.data_id == d]) == 1
    assert len(tidy) == 2, "the data entry and the commit record"
    assert _physical_upper(client, d) == 5
    # a plain persist reader (no txns at all) now reads it
    reader = client.open_leased_reader(d, SCHEMA)
    assert reader.snapshot_and_fetch(4) == [(((1,), ("a",)), 4, 1)]
    assert reader.snapshot_and_fetch(3) == []
    # applying again is a no-op
    res.apply(h)
    assert _physical_upper(client, d) == 5
    assert reader.snapshot_and_fetch(4) == [(((1,), ("a",)), 4, 1)]


def test_read_path_applies_an_unapplied_commit(store: Store) -> None:
    _client_a, ha, txns_id = open_handle(store)
    d = new_id()
    ha.register(0, {d: SCHEMA})
    txn = ha.begin()
    txn.write(d, (7,), ("seven",), 1)
    txn.commit_at(ha, 3)  # never applied by A (think: A crashed)
    ha.begin().commit_at(ha, 8)  # time passes
    client_b = store.client()
    hb = TxnsHandle.open(client_b, txns_id)
    assert _physical_upper(client_b, d) <= 3
    assert hb.snapshot(d, 5) == [(((7,), ("seven",)), 5, 1)]
    assert _physical_upper(client_b, d) == 6, "applied at 3 and filled up to the read time"
    assert hb.snapshot(d, 2) == []
    assert hb.snapshot(d, 7) == [(((7,), ("seven",)), 7, 1)]


# ---- tidy and compaction ----------------------------------------------------------------


def test_tidy_rides_along_and_the_txns_shard_stays_small(store: Store) -> None:
    client, h, txns_id = open_handle(store)
    ds = [new_id() for _ in range(3)]
    h.register(0, dict.fromkeys(ds, SCHEMA))
    rows_at: dict[int, int] = {}
    tidy = None
    for i in range(1, 161):
        txn = h.begin()
        txn.write(ds[i % 3], (i,), ("v",), 1)
        if tidy is not None:
            txn.tidy(tidy)
        tidy = txn.commit_at(h, h.upper).apply(h)
        if i % 40 == 0:
            h.compact_to(h.upper - 1)
            rows_at[i] = client.inspect(txns_id)["rows"]
    # logically: the registrations plus the one applied, not yet tidied, entry
    contents = txns_shard_contents(client, txns_id)
    assert all(diff == 1 for _, diff in contents)
    regs = sorted(e.data_id for e, _ in contents if e.is_registration)
    appends = [e for e, _ in contents if not e.is_registration]
    assert regs == sorted(ds)
    assert [e.ts for e in appends] == [h.upper - 1]
    # physically: the state does not grow with history (4 updates per commit:
    # the entry and the commit record, each added and later tidied)
    info = client.inspect(txns_id)
    assert info["since"] >= h.upper - 2
    assert max(rows_at.values()) <= 128, rows_at
    assert rows_at[160] <= rows_at[40] + 32, rows_at
    assert info["parts"] == 0, "the txns shard stays inline"
    # and the data is all there
    for j, d in enumerate(ds):
        want = {row(i, "v"): 1 for i in range(1, 161) if i % 3 == j}
        assert consolidated(h.snapshot(d, h.upper - 1)) == want


def test_compact_to_never_passes_an_unapplied_write(store: Store) -> None:
    client, h, txns_id = open_handle(store)
    d, e = new_id(), new_id()
    h.register(0, {d: SCHEMA, e: SCHEMA})
    model = TxnsModel()
    model.register(0, [d, e])
    _commit(h, model, 3, {d: [(row(1, "a"), 1)]}, apply=False)
    # commit more (applied) writes to e: only d's write is pending
    for ts in range(4, 12):
        _commit(h, model, ts, {e: [(row(ts, "e"), 1)]}, apply=False)
        h.apply_le(ts, only={e})
    assert _physical_upper(client, d) <= 3
    since = h.compact_to(1_000)
    assert since <= 3
    crit = client.inspect(txns_id)["critical_readers"][CRITICAL_READER]["since"]
    assert crit <= 3
    # another handle, on another client, that never touched d: same answer
    h2 = TxnsHandle.open(store.client(), txns_id)
    assert h2.compact_to(1_000) <= 3
    assert client.inspect(txns_id)["critical_readers"][CRITICAL_READER]["since"] <= 3
    # once applied, the since may pass it
    h.apply_le(h.upper - 1)
    assert h.compact_to(1_000) == h.upper - 1
    assert h.snapshot(d, 5) == [(((1,), ("a",)), 5, 1)]


# ---- forget ---------------------------------------------------------------------------------


def test_forget_applies_pending_writes_and_is_idempotent(store: Store) -> None:
    client, h, txns_id = open_handle(store)
    d0, d1, d2 = new_id(), new_id(), new_id()
    h.register(0, {d0: SCHEMA, d1: SCHEMA, d2: SCHEMA})
    model = TxnsModel()
    model.register(0, [d0, d1, d2])
    _commit(h, model, 2, {d0: [(row(1, "a"), 1)], d1: [(row(2, "b"), 1)]}, apply=False)
    _commit(h, model, 4, {d0: [(row(3, "c"), 1)]}, apply=False)
    assert _physical_upper(client, d0) <= 2

    h.forget(6, [d0])
    assert _physical_upper(client, d0) == 7
    assert h.upper == 7
    # the data shard now reads directly, with every committed write
    reader = client.open_leased_reader(d0, SCHEMA)
    assert consolidated(reader.snapshot_and_fetch(6), 6) == model.contents(d0, 6)
    # idempotent, at the same or a later time: no new commit, same upper
    h.forget(6, [d0])
    h.forget(9, [d0])
    assert _physical_upper(client, txns_id) == 7
    assert _physical_upper(client, d0) == 7
    # writes through txns are refused from now on
    txn = h.begin()
    txn.write(d0, (9,), ("nope",), 1)
    with pytest.raises(NotRegistered, match="not registered"):
        txn.commit_at(h, 10)
    assert _physical_upper(client, txns_id) == 7
    # reads before the forget still work through txns; the other shards too
    assert consolidated(h.snapshot(d0, 4), 4) == model.contents(d0, 4)
    assert consolidated(h.snapshot(d1, 6), 6) == model.contents(d1, 6)

    # forget_all: the rest, applying d1's pending write first
    h.forget_all(12)
    for d in (d0, d1, d2):
        assert _physical_upper(client, d) == (7 if d == d0 else 13)
    assert consolidated(client.open_leased_reader(d1, SCHEMA).snapshot_and_fetch(12), 12) == model.contents(d1, 12)
    h.forget_all(14)
    assert _physical_upper(client, txns_id) == 13, "forget_all with nothing registered commits nothing"
    txn = h.begin()
    txn.write(d2, (1,), ("no",), 1)
    with pytest.raises(NotRegistered):
        txn.commit_at(h, 15)
    assert _physical_upper(client, txns_id) == 13
    contents = txns_shard_contents(client, txns_id)
    assert not [e for e, _ in contents if e.is_registration]
    # a forgotten shard can be registered again and used through txns
    h.register(20, {d1: SCHEMA})
    _commit(h, model, 21, {d1: [(row(5, "again"), 1)]})
    assert consolidated(h.snapshot(d1, 21), 21) == model.contents(d1, 21)


# ---- reads at many times ------------------------------------------------------------------


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_time_travel_matches_the_model(seed: int, store: Store) -> None:
    rng = random.Random(seed)
    _client, h, txns_id = open_handle(store)
    ds = [new_id() for _ in range(3)]
    model = TxnsModel()
    h.register(0, dict.fromkeys(ds, SCHEMA))
    model.register(0, ds)
    ts = 0
    for _ in range(25):
        ts += rng.randint(1, 3)
        writes = {}
        for d in rng.sample(ds, rng.randint(0, 3)):
            writes[d] = [(row(rng.randint(0, 5), rng.choice("xyz")), rng.choice([1, 1, 2, -1])) for _ in range(3)]
        _commit(h, model, ts, writes, apply=rng.random() < 0.5)
        if rng.random() < 0.2:
            h.compact_to(rng.randint(0, ts))
    reader = TxnsHandle.open(store.client(), txns_id)
    for as_of in range(0, ts + 1):
        for d in ds:
            assert consolidated(reader.snapshot(d, as_of), as_of) == model.contents(d, as_of), (d, as_of)


# ---- the read cache ------------------------------------------------------------------------


def test_read_cache_api(store: Store) -> None:
    _client, h, txns_id = open_handle(store)
    d, e = new_id(), new_id()
    h.register(0, {d: SCHEMA, e: SCHEMA})
    model = TxnsModel()
    model.register(0, [d, e])
    # a second handle's cache, which has to catch up by itself
    cache = TxnsHandle.open(store.client(), txns_id).read_cache()
    assert cache.frontier == 1
    with pytest.raises(ReadTimeout) as rt:
        cache.update_gt(1, wait_s=0)
    assert rt.value.upper == 1
    _commit(h, model, 3, {d: [(row(1, "a"), 1)]}, apply=False)
    _commit(h, model, 6, {e: [(row(2, "b"), 1)]})
    _commit(h, model, 9, {d: [(row(3, "c"), 1)]}, apply=False)
    cache.update_gt(3, wait_s=0)
    assert cache.frontier == 10
    cache.update_ge(10, wait_s=0)
    with pytest.raises(ReadTimeout):
        cache.update_ge(11, wait_s=0)
    assert cache.latest_write_le(d, 8) == 3
    assert cache.latest_write_le(e, 5) is None

    # data_snapshot applies and fills as needed
    snap = cache.data_snapshot(d, 4)
    assert consolidated(snap.snapshot_and_fetch(), 4) == model.contents(d, 4)
    assert consolidated(cache.data_snapshot(d, 9).snapshot_and_fetch(), 9) == model.contents(d, 9)

    # data_listen_next: what a listener at ts should do next
    nxt = cache.data_listen_next(d, 1)
    assert (nxt.kind, nxt.upper) == ("read_data_to", 4)  # write at 3
    nxt = cache.data_listen_next(d, 4)
    assert (nxt.kind, nxt.upper) == ("read_data_to", 10)  # write at 9
    nxt = cache.data_listen_next(e, 7)
    assert (nxt.kind, nxt.upper) == ("emit_progress", 10)  # nothing for e in [7, 10)
    nxt = cache.data_listen_next(e, 10)
    assert (nxt.kind, nxt.upper) == ("wait", 10)
    h.begin().commit_at(h, 12)
    cache.update_gt(10, wait_s=0)
    nxt = cache.data_listen_next(e, 10)
    assert (nxt.kind, nxt.upper) == ("emit_progress", 13)


# ---- subscribe ----------------------------------------------------------------------------------


def _check_events(events: list, model: TxnsModel, d: str, as_of: int, until: int | None) -> int:
    """Replay subscribe events against the model; return the final frontier."""
    assert isinstance(events[0], Updates)
    acc = dict(consolidated(events[0].updates, as_of))
    assert acc == model.contents(d, as_of)
    frontier = as_of + 1
    last_ts = as_of
    for ev in events[1:]:
        if isinstance(ev, Updates):
            for (k, v), ts, diff in ev.updates:
                assert ts >= frontier, "an update below the emitted frontier"
                assert ts >= last_ts, "updates out of time order"
                assert until is None or ts < until
                last_ts = ts
                acc[(k, v)] = acc.get((k, v), 0) + diff
                if acc[(k, v)] == 0:
                    del acc[(k, v)]
        else:
            assert isinstance(ev, Progress)
            assert ev.upper >= frontier, "progress went backwards"
            assert until is None or ev.upper <= until
            assert last_ts < ev.upper
            frontier = ev.upper
            assert acc == model.contents(d, frontier - 1), (frontier, acc)
    return frontier


@pytest.mark.parametrize("seed", range(6))
def test_data_subscribe_matches_the_model(seed: int, store: Store) -> None:
    rng = random.Random(seed)
    client, h, txns_id = open_handle(store)
    ds = [new_id() for _ in range(2)]
    model = TxnsModel()
    h.register(0, dict.fromkeys(ds, SCHEMA))
    model.register(0, ds)
    ts = 0
    for _ in range(20):
        ts += rng.randint(1, 3)
        d = rng.choice(ds)
        writes = {d: [(row(rng.randint(0, 4), "v"), rng.choice([1, -1, 2]))]} if rng.random() < 0.6 else {}
        _commit(h, model, ts, writes, apply=rng.random() < 0.5)
    upper = model.upper
    d = ds[0]
    for _ in range(3):
        as_of = rng.randint(0, upper - 1)
        until = rng.choice([None, rng.randint(as_of + 1, upper)])
        sub = DataSubscribe(store.client(), txns_id, d, as_of=as_of, until=until)
        events: list = []
        while True:
            got = sub.step()
            if not got:
                break
            events.extend(got)
        frontier = _check_events(events, model, d, as_of, until)
        assert frontier == (upper if until is None else until)
        if until is not None:
            assert sub.step() == [], "nothing after until"
            assert list(sub) == []
        sub.close()

    # a live subscription keeps following new commits
    sub = DataSubscribe(client, txns_id, d, as_of=upper - 1, handle=h)
    events = sub.step()
    _commit(h, model, upper + 2, {d: [(row(9, "late"), 1)]}, apply=False)
    events += sub.step() + sub.step()
    assert _check_events(events, model, d, upper - 1, None) == upper + 3


def test_subscribe_emits_empty_ranges_without_reading_the_data_shard(store: Store) -> None:
    client, h, txns_id = open_handle(store)
    d, busy = new_id(), new_id()
    h.register(0, {d: SCHEMA, busy: SCHEMA})
    model = TxnsModel()
    model.register(0, [d, busy])
    # (fewer than 16 commits: the handle's periodic compact_to stays out of the
    # way; below the txns shard's since, write times are forgotten and ranges
    # are read from the data shard instead)
    _commit(h, model, 2, {d: [(row(1, "a"), 1)]})
    for ts in range(3, 10):
        _commit(h, model, ts, {busy: [(row(ts, "b"), 1)]})
    assert client.inspect(txns_id)["since"] <= 2
    rec = Recorder()
    sub_client = rec.wrap(store.client())
    sub = DataSubscribe(sub_client, txns_id, d, as_of=2)
    first = sub.step()
    assert first == [Updates([(((1,), ("a",)), 2, 1)]), Progress(3)]
    rec.clear()
    # [3, 10) holds no write to d: progress, without touching d at all
    assert sub.step() == [Progress(10)]
    assert rec.touching(d) == [], rec.touching(d)
    for ts in range(10, 14):
        _commit(h, model, ts, {busy: [(row(ts, "b"), 1)]})
    assert sub.step() == [Progress(14)]
    assert rec.touching(d) == []
    learned = rec.touching(txns_id, ["consensus.head", "consensus.scan"])
    assert learned, "it learned of the new commits from the txns shard"
    # a write to d: now the data shard is read (the recorder does see d's requests)
    _commit(h, model, 15, {d: [(row(2, "z"), 1)]}, apply=False)
    evs = sub.step()
    assert [e for e in evs if isinstance(e, Updates)] == [Updates([(((2,), ("z",)), 15, 1)])]
    assert evs[-1] == Progress(16)
    assert rec.touching(d, ["consensus.head", "consensus.cas"]), "reading d's range went to d"


# ---- the small-write inline path ------------------------------------------------------------


def test_small_commits_write_no_blob_objects(store: Store) -> None:
    client, h, txns_id = open_handle(store)
    ds = [new_id() for _ in range(3)]
    h.register(0, dict.fromkeys(ds, SCHEMA))
    model = TxnsModel()
    model.register(0, ds)
    tidy = None
    for i in range(1, 41):
        txn = h.begin()
        for d in ds[: 1 + i % 3]:
            txn.write(d, (i,), ("small",), 1)
        if tidy is not None:
            txn.tidy(tidy)
        before = store.counters.calls(Op.BLOB_SET)
        res = txn.commit_at(h, h.upper)
        assert store.counters.calls(Op.BLOB_SET) == before, f"commit {i} wrote a blob object"
        tidy = res.apply(h)
        assert store.counters.calls(Op.BLOB_SET) == before, f"apply {i} wrote a blob object"
        model.commit(res.commit_ts, {d: [(row(i, "small"), 1)] for d in ds[: 1 + i % 3]})
    assert client.inspect(txns_id)["parts"] == 0
    for d in ds:
        assert consolidated(h.snapshot(d, h.upper - 1)) == model.contents(d, h.upper - 1)


def test_forget_on_a_handle_that_has_not_seen_the_registration(store: Store) -> None:
    client, h1, txns_id = open_handle(store)
    h2 = TxnsHandle.open(store.client(), txns_id)  # opened before the registration
    d = new_id()
    h1.register(0, {d: SCHEMA})
    txn = h1.begin()
    txn.write(d, (1,), ("a",), 1)
    txn.commit_at(h1, 1)  # not applied
    h2.forget(3, [d])  # used to return early: "not registered" as of its stale cache
    assert _physical_upper(client, txns_id) == 4
    assert _physical_upper(client, d) == 4
    assert client.open_leased_reader(d, SCHEMA).snapshot_and_fetch(3) == [(((1,), ("a",)), 3, 1)]
    txn = h1.begin()
    txn.write(d, (2,), ("b",), 1)
    with pytest.raises(NotRegistered):
        txn.commit_at(h1, 5)


def test_register_judges_on_a_current_view(store: Store) -> None:
    client, h1, txns_id = open_handle(store)
    h2 = TxnsHandle.open(store.client(), txns_id)  # stays stale until it has to look
    d = new_id()
    h1.register(0, {d: SCHEMA})
    # another handle forgot it: h1's cache still says "registered"; register must not be a no-op
    h2.forget(1, [d])
    h1.register(5, {d: SCHEMA})
    assert _physical_upper(client, txns_id) == 6
    txn = h1.begin()
    txn.write(d, (1,), ("a",), 1)
    txn.commit_at(h1, 6).apply(h1)
    assert h1.snapshot(d, 6) == [(((1,), ("a",)), 6, 1)]
    # a register at a closed time, on a handle that has not seen the forget (which
    # filled the data shard's upper): TimestampUnavailable, not "written outside txns"
    e_id = new_id()
    h3 = TxnsHandle.open(store.client(), txns_id)
    h1.register(8, {e_id: SCHEMA})
    h1.forget(9, [e_id])
    with pytest.raises(TimestampUnavailable) as e:
        h3.register(8, {e_id: SCHEMA})
    assert e.value.upper == 10


def test_closing_a_subscription_releases_its_holds(store: Store) -> None:
    client, h, txns_id = open_handle(store)
    d = new_id()
    h.register(0, {d: SCHEMA})
    txns_readers = client.inspect(txns_id)["leased_readers"]
    data_readers = client.inspect(d)["leased_readers"]
    sub = DataSubscribe(store.client(), txns_id, d, as_of=0)
    assert client.inspect(txns_id)["leased_readers"] == txns_readers + 1
    assert sub.step() == [Updates([]), Progress(1)]
    sub.close()
    # its own txns handle's hold used to stay for a whole lease, holding back txns compaction
    assert client.inspect(txns_id)["leased_readers"] == txns_readers
    assert client.inspect(d)["leased_readers"] == data_readers
    # a subscription on a handle it was given leaves that handle alone
    sub = DataSubscribe(client, txns_id, d, as_of=0, handle=h)
    sub.close()
    assert client.inspect(txns_id)["leased_readers"] == txns_readers
    assert h.snapshot(d, 0) == []


def test_a_handle_whose_lease_lapsed_starts_over_and_stays_correct() -> None:
    now = [1_000_000]
    config = PersistConfig(clock_ms=lambda: now[0])
    store = Store(config=config)
    client, idle, txns_id = open_handle(store, config)
    busy = TxnsHandle.open(store.client(), txns_id)
    model = TxnsModel()
    d = new_id()
    busy.register(0, {d: SCHEMA})
    model.register(0, [d])
    _commit(busy, model, 1, {d: [(row(1, "a"), 1)]}, apply=False)
    assert idle.snapshot(d, 1) == [(((1,), ("a",)), 1, 1)]
    # the idle handle sleeps through its whole lease; the busy one commits and compacts
    now[0] += int(config.reader_lease_s * 1000) + 1
    for ts in range(2, 40):
        _commit(busy, model, ts, {d: [(row(ts, "b"), 1)]}, apply=ts % 3 == 0)
        now[0] += 1000
    busy.compact_to(busy.upper - 1)
    assert client.inspect(txns_id)["since"] > 1, "the lapsed lease no longer holds the txns shard back"
    # the idle handle notices, starts over from a snapshot, and is right about everything
    for as_of in (1, 20, 39):
        assert consolidated(idle.snapshot(d, as_of), as_of) == model.contents(d, as_of)
    _commit(idle, model, 40, {d: [(row(40, "idle"), 1)]})
    assert consolidated(busy.snapshot(d, 40), 40) == model.contents(d, 40)
