"""txns: the commit path's seams: registrations riding in the commit, ``expect_upper``, maintenance off the commit."""

from __future__ import annotations

import pytest

import txns.handle as handle_module
from persist import InvalidUsage, PersistClient, ShardId
from tests.txns.model import SCHEMA, new_id
from txns import NotRegistered, TimestampUnavailable, TxnsHandle


def _cas_count(client: PersistClient, shard: str) -> int:
    return client.shard(shard).fetch().seqno


@pytest.fixture
def opened(tmp_path) -> tuple[PersistClient, TxnsHandle]:
    client = PersistClient.open(f"file://{tmp_path}/loc")
    return client, TxnsHandle.open(client, new_id())


def test_registration_rides_in_the_commit(opened) -> None:
    client, h = opened
    d = str(ShardId.new())
    client.register_schema(d, SCHEMA)
    before = _cas_count(client, h.txns_id)
    txn = h.begin()
    txn.register(d)
    txn.write(d, (1,), ("v",), 1)
    applied = txn.commit_at(h, 5)
    # one conditional write registered the shard and committed its data (commit record included)
    assert _cas_count(client, h.txns_id) == before + 1
    assert h.cache.registered_at(d, 5) and not h.cache.registered_at(d, 4)
    applied.apply(h)
    assert h.snapshot(d, 5) == [(((1,), ("v",)), 5, 1)]


def test_an_abandoned_registration_leaves_nothing_registered(opened) -> None:
    client, h = opened
    d = str(ShardId.new())
    client.register_schema(d, SCHEMA)
    txn = h.begin()
    txn.register(d)
    txn.write(d, (1,), ("v",), 1)
    h2 = TxnsHandle.open(client, h.txns_id)
    h2.begin().commit_at(h2, 10)  # takes the time
    with pytest.raises(TimestampUnavailable):
        txn.commit_at(h, 7)
    h.cache.sync()
    assert d not in h.cache.registered_now()
    # the same transaction commits later, registering then
    txn.commit_at(h, 11)
    assert h.cache.registered_at(d, 11) and not h.cache.registered_at(d, 10)


def test_registering_needs_a_schema_and_a_fresh_shard(opened) -> None:
    client, h = opened
    txn = h.begin()
    with pytest.raises(NotRegistered, match="no schema"):
        txn.register(str(ShardId.new()))
    d = str(ShardId.new())
    w = client.open_writer(d, SCHEMA)
    w.compare_and_append([(((1,), ("y",)), 0, 1)], 0, 20)  # written outside the txns shard
    txn.register(d)
    before = _cas_count(client, h.txns_id)
    with pytest.raises(InvalidUsage, match="outside the txns shard"):
        txn.commit_at(h, 5)
    assert _cas_count(client, h.txns_id) == before  # nothing committed
    txn.commit_at(h, 19)  # at upper - 1 it may register
    assert h.cache.registered_at(d, 19)


def test_expect_upper_commits_only_on_the_upper_it_names(opened) -> None:
    client, h = opened
    h.begin().commit_at(h, 3)
    upper = h.upper
    assert upper == 4
    # past the upper (a later, wall-clock-like time) as long as nothing else committed
    h.begin().commit_at(h, 9, expect_upper=upper)
    assert h.upper == 10
    other = TxnsHandle.open(client, h.txns_id)
    other.begin().commit_at(other, 12)
    stale = h.begin()
    with pytest.raises(TimestampUnavailable) as e:
        stale.commit_at(h, 20, expect_upper=10)  # validated as of 9: another commit landed since
    assert e.value.upper == 13
    assert h.upper == 13  # nothing committed
    with pytest.raises(InvalidUsage, match="below expect_upper"):
        h.begin().commit_at(h, 5, expect_upper=13)


def test_maintenance_can_leave_the_commit_path(opened) -> None:
    client, h = opened
    d = str(ShardId.new())
    h.register(1, {d: SCHEMA})
    h.maintain_on_commit = False
    for ts in range(2, 12):
        txn = h.begin()
        txn.write(d, (ts,), ("v",), 1)
        txn.commit_at(h, ts)
    piled = len(client.shard(h.txns_id).fetch().batches)
    assert piled >= 10  # no compaction ran on the commits
    h.maintain()
    assert len(client.shard(h.txns_id).fetch().batches) < piled
    h.apply_le(11)
    assert len(h.snapshot(d, 11)) == 10


def test_maintenance_compacts_the_txns_shard_once_it_holds_txns_maintain_batches(opened, monkeypatch) -> None:
    """``maintain`` (the database's worker, after its applies) merges the txns shard's small batches several at
    a time: below ``TXNS_MAINTAIN_BATCHES`` it writes nothing there (each merge is a conditional write on the
    key every commit contends for), at it the tail is merged in one write."""
    client, h = opened
    monkeypatch.setattr(handle_module, "COMPACT_TO_EVERY_S", 3600.0)  # (only the compaction writes here)
    h.maintain()  # (the first compact_to)
    d = str(ShardId.new())
    h.register(h.upper, {d: SCHEMA})
    h.maintain_on_commit = False
    ts = h.upper
    n = handle_module.TXNS_MAINTAIN_BATCHES

    def commit() -> None:
        nonlocal ts
        txn = h.begin()
        txn.write(d, (ts,), ("v",), 1)
        txn.commit_at(h, ts)
        ts += 1

    while len(client.shard(h.txns_id).fetch().batches) < n - 1:
        commit()
    before = _cas_count(client, h.txns_id)
    h.maintain()
    assert _cas_count(client, h.txns_id) == before, "maintenance wrote the txns shard below the threshold"
    commit()
    piled = len(client.shard(h.txns_id).fetch().batches)
    assert piled >= n
    before = _cas_count(client, h.txns_id)
    h.maintain()
    assert len(client.shard(h.txns_id).fetch().batches) < piled
    assert _cas_count(client, h.txns_id) - before <= 2  # (the tail in one merge; the policy may ask one more)


def test_maintenance_moves_the_txns_since_at_most_every_compact_to_every_s(opened, monkeypatch) -> None:
    """``maintain`` after every apply (the database's worker) does not make every call a write on the txns shard."""
    _client, h = opened
    moved: list[int] = []
    real = h.compact_to
    monkeypatch.setattr(h, "compact_to", lambda since: moved.append(since) or real(since))
    h.maintain()
    h.maintain()
    assert len(moved) == 1  # the second call came within COMPACT_TO_EVERY_S
    monkeypatch.setattr(handle_module, "COMPACT_TO_EVERY_S", 0.0)
    h.maintain()
    assert len(moved) == 2


def test_critical_since_with_a_schema_is_one_write(tmp_path) -> None:
    client = PersistClient.open(f"file://{tmp_path}/loc")
    s = str(ShardId.new())
    client.open_critical_since(s, "c", 0, schema=SCHEMA)
    state = client.shard(s).fetch()
    assert state.seqno == 1 and state.schema == SCHEMA.to_text() and "c" in state.critical
    client.open_critical_since(s, "c", 0, schema=SCHEMA)  # both there: no write
    assert client.shard(s).fetch().seqno == 1


def test_opening_a_txns_shard_is_one_write(tmp_path) -> None:
    client = PersistClient.open(f"file://{tmp_path}/loc")
    t = new_id()
    h = TxnsHandle.open(client, t, init_ts=42)
    state = client.shard(t).fetch()
    assert state.seqno == 1, "schema, critical since, initial upper and the cache's lease in one write"
    assert state.upper == 42 and "txns-critical-since" in state.critical and len(state.leased) == 1
    assert h.cache.frontier == 42
    h2 = TxnsHandle.open(client, t, init_ts=99)  # an existing shard: only a lease, the upper stays
    assert client.shard(t).fetch().seqno == 2 and h2.cache.frontier == 42


def test_a_prerequisite_runs_right_before_the_write_and_can_stop_it(opened) -> None:
    client, h = opened
    d = str(ShardId.new())
    seen: list[int | None] = []
    txn = h.begin()
    # the schema is recorded by the prerequisite itself: register() takes it on trust meanwhile
    txn.register(d, SCHEMA)
    txn.before_write(lambda: seen.append(client.shard(h.txns_id).fetch().seqno))
    txn.before_write(lambda: client.register_schema(d, SCHEMA))
    txn.write(d, (1,), ("v",), 1)
    before = _cas_count(client, h.txns_id)
    txn.commit_at(h, 5).apply(h)
    assert seen == [before], "called once, before the commit's write"
    assert _cas_count(client, h.txns_id) == before + 1
    assert h.snapshot(d, 5) == [(((1,), ("v",)), 5, 1)]

    def refuse() -> None:
        raise RuntimeError("not ready")

    failing = h.begin()
    failing.before_write(refuse)
    failing.write(d, (2,), ("w",), 1)
    with pytest.raises(InvalidUsage, match="waits for nothing"):  # a group commit would skip its prerequisite
        h.begin().join([failing])
    with pytest.raises(RuntimeError, match="not ready"):
        failing.commit_at(h, 7)
    assert _cas_count(client, h.txns_id) == before + 1, "nothing was written"
    h.cache.sync()
    assert h.cache.frontier == 6


def test_a_groups_commit_records_ride_in_as_few_inline_batches_as_fit(opened) -> None:
    """One batch of records per commit, not one per member (each built and encoded on the committing
    thread); a group whose records pass ``COMMIT_RECORD_MAX_BYTES`` splits, and nothing goes to a blob."""
    from txns.commits import COMMIT_RECORD_MAX_BYTES

    _client, h = opened
    d = str(ShardId.new())
    h.register(1, {d: SCHEMA})
    big = "m" * (COMMIT_RECORD_MAX_BYTES // 4)  # three such records fit in a batch, four do not
    for metadata, batches in (({}, 1), ({"note": big}, 4)):
        txns = [h.begin(metadata={**metadata, "i": i}) for i in range(10)]
        for i, t in enumerate(txns):
            t.write(d, (i,), ("v",), 1)
        txns[0].join(txns[1:])
        ts = txns[0].commit_at(h, h.upper).commit_ts
        records = [e for e in h.cache.entries if e.ts == ts and e.data_id == h.commits_id]
        assert len(records) == batches
        assert all(not r.parts and r.inline for e in records for r in e.decode_batch().runs)  # (no blob)
        table = h.commit_records(ts)
        mine = {t.id for t in txns}
        got = {r["txn_id"]: r for r in table.to_pylist() if r["txn_id"] in mine}
        assert set(got) == mine and all(r["commit_ts"] == ts for r in got.values())
        assert all(h.commit_record(t.id).metadata == t.metadata for t in txns)  # type: ignore[union-attr]
