"""txns: bad input gets a clear exception, and nothing is committed."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import pyarrow as pa
import pytest

from persist import (
    InvalidUsage,
    PersistClient,
    PersistConfig,
    ReadBelowSince,
    ReadTimeout,
    Schema,
    SchemaMismatch,
)
from tests.txns.model import SCHEMA, Store, consolidated, new_id, row, txns_shard_contents
from txns import DataSubscribe, NotRegistered, TimestampUnavailable, TxnsHandle


@dataclass
class Env:
    store: Store
    client: PersistClient
    h: TxnsHandle
    txns_id: str
    d: str  # registered at 1, written at 2 (applied)

    def txns_state(self) -> tuple[int, list]:
        """The txns shard's upper and contents, read fresh."""
        return self.client.shard(self.txns_id).fetch().upper, sorted(txns_shard_contents(self.client, self.txns_id))


@pytest.fixture
def env() -> Iterator[Env]:
    store = Store(config=PersistConfig(read_wait_s=0.2))
    client = store.client()
    txns_id = new_id()
    h = TxnsHandle.open(client, txns_id)
    d = new_id()
    h.register(1, {d: SCHEMA})
    txn = h.begin()
    txn.write(d, (1,), ("a",), 1)
    txn.commit_at(h, 2).apply(h)
    yield Env(store, client, h, txns_id, d)


def test_commit_to_a_shard_without_schema_is_refused_at_write(env: Env) -> None:
    before = env.txns_state()
    stranger = new_id()
    txn = env.h.begin()
    txn.write(env.d, (5,), ("ok",), 1)
    with pytest.raises(NotRegistered, match=r"has no schema: register it"):
        txn.write(stranger, (1,), ("x",), 1)
    assert env.txns_state() == before
    # the txn itself is still good
    txn.commit_at(env.h, 3).apply(env.h)
    assert consolidated(env.h.snapshot(env.d, 3), 3) == {row(1, "a"): 1, row(5, "ok"): 1}


def test_commit_to_an_unregistered_shard_is_refused(env: Env) -> None:
    other = new_id()
    env.client.register_schema(other, SCHEMA)  # has a schema, never registered with txns
    before = env.txns_state()
    txn = env.h.begin()
    txn.write(env.d, (5,), ("with it",), 1)
    txn.write(other, (1,), ("x",), 1)
    with pytest.raises(NotRegistered) as e:
        txn.commit_at(env.h, 3)
    assert isinstance(e.value, InvalidUsage)
    assert other in str(e.value) and "not registered at 3" in str(e.value) and "Nothing was committed" in str(e.value)
    assert env.txns_state() == before
    assert env.client.shard(other).fetch().upper == 0
    assert env.client.shard(env.d).fetch().upper == 3, "d was not touched either"
    # registering it makes the same txn committable
    env.h.register(3, {other: SCHEMA})
    txn.commit_at(env.h, 4).apply(env.h)
    assert consolidated(env.h.snapshot(other, 4), 4) == {row(1, "x"): 1}


def test_commit_to_a_forgotten_shard_is_refused(env: Env) -> None:
    env.h.forget(3, [env.d])
    before = env.txns_state()
    txn = env.h.begin()
    txn.write(env.d, (9,), ("late",), 1)
    with pytest.raises(NotRegistered, match=r"not registered at 5 \(never registered, or forgotten\)"):
        txn.commit_at(env.h, 5)
    assert env.txns_state() == before
    assert env.client.shard(env.d).fetch().upper == 4
    # a second handle, on another client, refuses it too
    h2 = TxnsHandle.open(env.store.client(), env.txns_id)
    txn2 = h2.begin()
    txn2.write(env.d, (9,), ("late",), 1)
    with pytest.raises(NotRegistered):
        txn2.commit_at(h2, 7)
    assert env.txns_state() == before
    # and reads through txns at or after the forget time
    with pytest.raises(NotRegistered, match="not registered at 3"):
        env.h.snapshot(env.d, 3)
    assert consolidated(env.h.snapshot(env.d, 2), 2) == {row(1, "a"): 1}, "before the forget time: fine"


def test_register_at_a_closed_time(env: Env) -> None:
    before = env.txns_state()
    new = new_id()
    with pytest.raises(TimestampUnavailable) as e:
        env.h.register(2, {new: SCHEMA})
    assert e.value.upper == 3 and e.value.ts == 2
    assert "register at 2 is not possible" in str(e.value) and "use a time >= 3" in str(e.value)
    assert env.txns_state() == before
    # forget at a closed time, likewise
    with pytest.raises(TimestampUnavailable) as e2:
        env.h.forget(1, [env.d])
    assert e2.value.upper == 3
    assert env.txns_state() == before
    # the advertised upper works
    env.h.register(e.value.upper, {new: SCHEMA})
    assert env.h.upper == 4


def test_commit_at_a_closed_time_commits_nothing(env: Env) -> None:
    before = env.txns_state()
    txn = env.h.begin()
    txn.write(env.d, (3,), ("c",), 1)
    with pytest.raises(TimestampUnavailable) as e:
        txn.commit_at(env.h, 1)
    assert e.value.upper == 3
    assert "commit at 1" in str(e.value)
    assert env.txns_state() == before


@pytest.mark.parametrize(
    ("key", "val", "why"),
    [
        (("one",), ("x",), r"key field 'k' expects int64, got 'one'"),
        ((1, 2), ("x",), r"key \(1, 2\) must be a tuple of 1 field"),
        ((1,), (5,), r"val field 'v' expects string, got 5"),
        ([1], ("x",), r"key \[1\] must be a tuple"),
        ((1,), (), r"val \(\) must be a tuple of 1 field"),
    ],
)
def test_write_not_matching_the_schema(env: Env, key: object, val: object, why: str) -> None:
    before = env.txns_state()
    txn = env.h.begin()
    with pytest.raises(SchemaMismatch, match=why):
        txn.write(env.d, key, val, 1)  # type: ignore[arg-type]
    # first write to the shard and a later one alike
    txn.write(env.d, (7,), ("fine",), 1)
    with pytest.raises(SchemaMismatch, match=why):
        txn.write(env.d, key, val, 1)  # type: ignore[arg-type]
    assert env.txns_state() == before
    # nothing of the bad rows got in
    txn.commit_at(env.h, 3).apply(env.h)
    assert consolidated(env.h.snapshot(env.d, 3), 3) == {row(1, "a"): 1, row(7, "fine"): 1}


def test_bad_diff(env: Env) -> None:
    txn = env.h.begin()
    for diff in (True, 1.0, 2**63):
        with pytest.raises(InvalidUsage, match="diff must be a signed 64-bit int"):
            txn.write(env.d, (1,), ("x",), diff)  # type: ignore[arg-type]
    assert txn.batches() == {}


def test_write_batch_of_another_shard(env: Env) -> None:
    other = new_id()
    env.h.register(3, {other: SCHEMA})
    before = env.txns_state()
    batch = env.client.open_writer(other, SCHEMA).batch([(((1,), ("x",)), 0, 1)], 0, 1)
    txn = env.h.begin()
    with pytest.raises(InvalidUsage, match=rf"batch {batch.id} was written for shard {other}, not {env.d}"):
        txn.write_batch(env.d, batch)
    assert txn.batches() == {}
    with pytest.raises(InvalidUsage, match=r"write_batch takes a persist.Batch"):
        txn.write_batch(env.d, b"not a batch")  # type: ignore[arg-type]
    # a batch of a shard with another schema
    odd_schema = Schema(key=pa.schema([("name", pa.string())]), val=pa.schema([]))
    odd = new_id()
    odd_batch = env.client.open_writer(odd, odd_schema).batch([((("n",), ()), 0, 1)], 0, 1)
    forged = type(odd_batch)(
        env.d, odd_batch.id, odd_batch.lower, odd_batch.upper, odd_batch.runs, odd_batch.schema_fingerprint
    )
    with pytest.raises(SchemaMismatch, match="with a schema other than data shard"):
        txn.write_batch(env.d, forged)
    assert txn.batches() == {}
    assert env.txns_state() == before


def test_read_below_the_data_shard_since(env: Env) -> None:
    for ts in (3, 4, 5, 6):
        txn = env.h.begin()
        txn.write(env.d, (ts,), ("x",), 1)
        txn.commit_at(env.h, ts).apply(env.h)
    hold = env.client.open_critical_since(env.d, "test-hold", 0)
    res = hold.compare_and_downgrade_since(0, 0, 5)
    assert res.ok and res.since == 5
    assert env.client.inspect(env.d)["since"] == 5
    before = env.txns_state()
    with pytest.raises(ReadBelowSince) as e:
        env.h.snapshot(env.d, 4)
    assert e.value.since == 5
    assert "as_of 4 is below" in str(e.value) and "Read at an as_of >= 5" in str(e.value)
    assert env.txns_state() == before
    # at and above the since, reads work
    assert consolidated(env.h.snapshot(env.d, 5), 5) == {row(1, "a"): 1, row(3, "x"): 1, row(4, "x"): 1, row(5, "x"): 1}
    # a subscription from below the since fails the same way
    sub = DataSubscribe(env.client, env.txns_id, env.d, as_of=2)
    with pytest.raises(ReadBelowSince):
        sub.step()


def test_read_far_beyond_the_upper_times_out(env: Env) -> None:
    before = env.txns_state()
    with pytest.raises(ReadTimeout) as e:
        env.h.snapshot(env.d, 1_000)
    assert e.value.upper == 3
    assert "upper is 3, not 1001" in str(e.value)
    assert env.txns_state() == before
    assert env.client.shard(env.d).fetch().upper == 3, "no fill past the txns upper"
    with pytest.raises(ReadTimeout):
        env.h.read_cache().update_gt(3, wait_s=0)


@pytest.mark.parametrize("bad", ["not-a-shard", "S" + "0" * 32, "s" + "0" * 31, "", "s" + "g" * 32])
def test_bad_txns_id(bad: str) -> None:
    client = Store().client()
    with pytest.raises(InvalidUsage, match=r"invalid shard id .*expected 's' followed by 32 lowercase hex"):
        TxnsHandle.open(client, bad)
    assert list(client.consensus.list_keys()) == [], "nothing was created"


def test_bad_data_ids_and_times(env: Env) -> None:
    before = env.txns_state()
    with pytest.raises(InvalidUsage, match="invalid shard id"):
        env.h.register(5, {"table-1": SCHEMA})
    with pytest.raises(InvalidUsage, match="register takes"):
        env.h.register(5, {new_id(): "schema"})  # type: ignore[dict-item]
    with pytest.raises(InvalidUsage, match=r"register_ts must be an int in \[0, 2\*\*64\)"):
        env.h.register(-1, {new_id(): SCHEMA})
    with pytest.raises(InvalidUsage, match="commit_ts must be an int"):
        env.h.begin().commit_at(env.h, True)  # type: ignore[arg-type]
    with pytest.raises(InvalidUsage, match="invalid shard id"):
        env.h.forget(5, ["nope"])
    with pytest.raises(InvalidUsage, match="until 2 must be greater than as_of 2"):
        DataSubscribe(env.client, env.txns_id, env.d, as_of=2, until=2)
    assert env.txns_state() == before


def test_register_a_shard_written_outside_txns(env: Env) -> None:
    outside = new_id()
    w = env.client.open_writer(outside, SCHEMA)
    w.compare_and_append([(((1,), ("x",)), 0, 1)], 0, 10)
    before = env.txns_state()
    with pytest.raises(InvalidUsage, match=r"has upper 10, past register_ts \+ 1 = 4.*register it at a time >= 9"):
        env.h.register(3, {outside: SCHEMA})
    assert env.txns_state() == before
    env.h.register(9, {outside: SCHEMA})
    assert consolidated(env.h.snapshot(outside, 9), 9) == {row(1, "x"): 1}


def test_commit_at_a_closed_time_on_a_stale_handle(env: Env) -> None:
    """A handle that has not seen a later registration: the time is what is wrong, say so."""
    stale = TxnsHandle.open(env.store.client(), env.txns_id)
    late = new_id()
    env.h.register(5, {late: SCHEMA})
    before = env.txns_state()
    txn = stale.begin()
    txn.write(late, (1,), ("x",), 1)
    with pytest.raises(TimestampUnavailable) as e:
        txn.commit_at(stale, 4)  # closed (upper 6), and before the registration
    assert e.value.upper == 6
    assert env.txns_state() == before
    txn.commit_at(stale, e.value.upper).apply(stale)
    assert consolidated(env.h.snapshot(late, 6), 6) == {row(1, "x"): 1}
