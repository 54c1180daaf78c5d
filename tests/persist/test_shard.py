"""Unit tests of one persist shard: appends, batches, reads, holds, compaction, GC.

Most tests run on the in-process ``mem://`` backend; the last few run the
same end-to-end scenario on every backend (mem, file, and S3 over moto) via
the ``location_url`` fixture. Every read is checked against
:class:`tests.persist.model.ShardModel`, which computes the answer by brute force.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import pyarrow as pa
import pytest

from persist import (
    CLOSED,
    TS_MAX,
    Batch,
    InvalidUsage,
    LeaseExpired,
    PersistClient,
    PersistConfig,
    Progress,
    ReadBelowSince,
    ShardId,
    UpperMismatch,
    WriteHandle,
)
from persist._internal.parts import read_run
from persist.unreliable import CountingBlob, CountingConsensus, Op
from persist.url import Location, open_location
from tests.helpers import mem_url
from tests.persist.model import (
    SCHEMA,
    FakeClock,
    ShardModel,
    Update,
    consolidate,
    drain_listen,
    read_all,
    shard_blob_keys,
    upd,
)


def new_shard(
    config: PersistConfig | None = None, url: str | None = None
) -> tuple[PersistClient, ShardId]:
    return PersistClient.open(url or mem_url("shard"), config or PersistConfig()), ShardId.new()


def seqno(client: PersistClient, shard: ShardId) -> int | None:
    return client.inspect(shard)["seqno"]


def append_model(model: ShardModel, writer: WriteHandle, updates: list[Update], new_upper: int) -> None:
    """Append ``updates`` at the model's upper through ``writer`` and the model."""
    writer.compare_and_append(updates, model.upper, new_upper)
    model.append(updates, model.upper, new_upper)


# ---- appends ---------------------------------------------------------------------------


def test_compare_and_append_and_upper_mismatch() -> None:
    client, shard = new_shard(PersistConfig(inline_max_bytes=0))
    w = client.open_writer(shard, SCHEMA)
    w.compare_and_append([upd(1, "a", 0), upd(2, "b", 1)], 0, 2)
    assert w.upper == 2 and w.fetch_recent_upper() == 2
    before, keys = client.inspect(shard), shard_blob_keys(client, shard)
    assert len(keys) == 1, "inline_max_bytes=0: the append wrote one part"

    with pytest.raises(UpperMismatch) as e:
        w.compare_and_append([upd(3, "c", 0)], 0, 1)
    assert (e.value.expected, e.value.current) == (0, 2)
    assert "retry with expected_upper=2" in str(e.value)
    # nothing changed: no new state version, and the lost append's part was deleted
    assert client.inspect(shard) == before
    assert shard_blob_keys(client, shard) == keys

    # an expectation ahead of the upper loses too
    with pytest.raises(UpperMismatch) as e:
        w.compare_and_append([], 5, 6)
    assert e.value.current == 2
    assert client.inspect(shard) == before

    # a second writer racing on the same upper: exactly one wins
    w2 = PersistClient.open(client.url).open_writer(shard, SCHEMA)
    w2.compare_and_append([upd(4, "d", 2)], 2, 3)
    with pytest.raises(UpperMismatch) as e:
        w.compare_and_append([upd(5, "e", 2)], 2, 3)
    assert e.value.current == 3
    r = client.open_leased_reader(shard, SCHEMA)
    assert r.snapshot_and_fetch(2) == [upd(1, "a", 2), upd(2, "b", 2), upd(4, "d", 2)]


def test_empty_appends_advance_the_upper_without_state_growth() -> None:
    client, shard = new_shard()
    w = client.open_writer(shard, SCHEMA)
    w.compare_and_append([upd(1, "a", 0)], 0, 1)
    for u in range(1, 50):
        w.compare_and_append([], u, u + 1)
    info = client.inspect(shard)
    assert info["upper"] == 50
    assert info["batches"] == 1, "empty appends extend the last batch instead of adding batches"
    r = client.open_leased_reader(shard, SCHEMA)
    assert r.snapshot_and_fetch(49) == [upd(1, "a", 49)]


def test_batch_written_ahead_is_appended_as_metadata_only() -> None:
    url = mem_url("shard")
    loc = open_location(url)
    blob, consensus = CountingBlob(loc.blob), CountingConsensus(loc.consensus)
    config = PersistConfig(inline_max_bytes=0, compaction_enabled=False)
    client = PersistClient(Location(url, blob, consensus), config)
    shard = ShardId.new()
    w = client.open_writer(shard, SCHEMA)
    w.compare_and_append([upd(0, "x", 0)], 0, 1)

    batch = w.batch([upd(1, "a", 1), upd(2, "b", 2)], lower=1, upper=3)
    assert isinstance(batch, Batch) and len(batch.parts) == 1
    assert batch.parts[0].key in shard_blob_keys(client, shard), "the batch is durable before the append"
    blob.counters.reset()
    consensus.counters.reset()

    w.compare_and_append_batch([batch], 1, 3)
    assert blob.counters.calls(Op.BLOB_SET) == 0, "appending a written batch writes no data"
    assert consensus.counters.calls(Op.CAS) == 1, "one compare-and-set, with a current cache"
    assert consensus.counters.calls(Op.HEAD) == consensus.counters.calls(Op.SCAN) == 0, "no read on the happy path"
    r = client.open_leased_reader(shard, SCHEMA)
    assert r.snapshot_and_fetch(2) == [upd(0, "x", 2), upd(1, "a", 2), upd(2, "b", 2)]
    assert r.snapshot_and_fetch(1) == [upd(0, "x", 1), upd(1, "a", 1)]


def test_several_batches_in_one_append() -> None:
    client, shard = new_shard(PersistConfig(inline_max_bytes=0))
    w = client.open_writer(shard, SCHEMA)
    b1 = w.batch([upd(1, "a", 0)], 0, 2)
    b2 = w.batch([upd(2, "b", 1), upd(1, "a", 1, -1)], 1, 3)
    w.compare_and_append_batch([b1, b2], 0, 3)
    r = client.open_leased_reader(shard, SCHEMA)
    assert r.snapshot_and_fetch(0) == [upd(1, "a", 0)]
    assert r.snapshot_and_fetch(2) == [upd(2, "b", 2)]


def test_rewrite_ts_appends_later_without_rewriting_parts() -> None:
    client, shard = new_shard(PersistConfig(inline_max_bytes=0, compaction_enabled=False))
    w = client.open_writer(shard, SCHEMA)
    batch = w.batch([upd(1, "a", 0), upd(2, "b", 1)], lower=0, upper=2)
    # meanwhile, another append moves the upper past the batch
    w.compare_and_append([upd(9, "z", 3)], 0, 5)
    with pytest.raises(InvalidUsage, match=r"outside the append bounds \[5, 7\).*rewrite_ts"):
        w.compare_and_append_batch([batch], 5, 7)
    keys_before = shard_blob_keys(client, shard)

    moved = batch.rewrite_ts(5, upper=7)
    assert (moved.lower, moved.upper) == (5, 7)
    assert [p.key for p in moved.parts] == [p.key for p in batch.parts], "the rewrite shares the parts"
    assert (batch.lower, batch.upper) == (0, 2), "the original batch is unchanged"
    w.compare_and_append_batch([moved], 5, 7)
    assert shard_blob_keys(client, shard) == keys_before, "no data was written by rewrite and append"

    r = client.open_leased_reader(shard, SCHEMA)
    assert r.snapshot_and_fetch(4) == [upd(9, "z", 4)]
    assert r.snapshot_and_fetch(5) == [upd(1, "a", 5), upd(2, "b", 5), upd(9, "z", 5)]
    listen = r.listen(4)
    got, _ = drain_listen(listen, 7)
    assert got == [upd(1, "a", 5), upd(2, "b", 5)], "the rewritten times are what readers see"


def test_rewrite_ts_rules() -> None:
    client, shard = new_shard()
    w = client.open_writer(shard, SCHEMA)
    batch = w.batch([upd(1, "a", 2), upd(1, "b", 4)], lower=2, upper=5)
    assert (batch.rewrite_ts(3).lower, batch.rewrite_ts(3).upper) == (3, 5)
    assert (batch.rewrite_ts(9).lower, batch.rewrite_ts(9).upper) == (9, 10)
    twice = batch.rewrite_ts(3).rewrite_ts(7)
    assert twice.runs[0].ts_rewrite == 7 and (twice.lower, twice.upper) == (7, 8)
    with pytest.raises(InvalidUsage, match="its lower is 2"):
        batch.rewrite_ts(1)
    with pytest.raises(InvalidUsage, match="must be past the rewrite ts"):
        batch.rewrite_ts(6, upper=6)
    # narrowing the upper below the batch's would leave the update at 4 outside [3, 4)
    with pytest.raises(InvalidUsage, match="below the batch's upper 5"):
        batch.rewrite_ts(3, upper=4)


def test_batch_bytes_round_trip() -> None:
    client, shard = new_shard(PersistConfig(inline_max_bytes=0))
    w = client.open_writer(shard, SCHEMA)
    parts = w.batch([upd(1, "a", 0), upd(2, "b", 1)], 0, 2)
    inline = PersistClient.open(client.url, PersistConfig(inline_max_bytes=1 << 20)).open_writer(shard, SCHEMA)
    small = inline.batch([upd(3, "c", 2)], 2, 3)
    assert parts.parts and not small.parts and small.runs[0].inline is not None
    for b in (parts, small, parts.rewrite_ts(4, upper=9), small.rewrite_ts(5)):
        data = b.to_bytes()
        assert isinstance(data, bytes)
        back = Batch.from_bytes(data)
        assert back == b
        assert back.to_bytes() == data

    # a batch travels to another process (client) and is appended there
    other = PersistClient.open(client.url, client.config).open_writer(shard, SCHEMA)
    other.compare_and_append_batch(
        [Batch.from_bytes(parts.to_bytes()), Batch.from_bytes(small.to_bytes())], 0, 3
    )
    r = client.open_leased_reader(shard, SCHEMA)
    assert r.snapshot_and_fetch(2) == [upd(1, "a", 2), upd(2, "b", 2), upd(3, "c", 2)]


def test_small_batches_are_inline() -> None:
    client, shard = new_shard()  # default inline_max_bytes=4096
    w = client.open_writer(shard, SCHEMA)
    for t in range(5):
        w.compare_and_append([upd(t, "v", t), upd(t + 100, "w", t)], t, t + 1)
    assert shard_blob_keys(client, shard) == set(), "small batches live in the state: no part written"
    info = client.inspect(shard)
    assert info["parts"] == 0 and info["rows"] >= 2
    r = client.open_leased_reader(shard, SCHEMA)
    assert len(r.snapshot_and_fetch(4)) == 10

    # the same writes with inlining off write one part each
    client2, shard2 = new_shard(PersistConfig(inline_max_bytes=0, compaction_enabled=False))
    w2 = client2.open_writer(shard2, SCHEMA)
    for t in range(5):
        w2.compare_and_append([upd(t, "v", t)], t, t + 1)
    assert len(shard_blob_keys(client2, shard2)) == 5


def test_large_batch_is_split_into_parts() -> None:
    client, shard = new_shard(PersistConfig(part_target_bytes=16 << 10, inline_max_bytes=0))
    w = client.open_writer(shard, SCHEMA)
    n = 25_000
    builder = w.builder(0, 10)
    for i in range(n):
        builder.add((i,), (f"v{i % 7}",), i % 10, 1)
    batch = builder.finish()
    assert len(batch.parts) >= 3, f"expected several parts, got {len(batch.parts)}"
    assert sum(p.rows for p in batch.parts) == n == batch.rows
    assert {p.key for p in batch.parts} <= shard_blob_keys(client, shard)
    w.compare_and_append_batch([batch], 0, 10)
    r = client.open_leased_reader(shard, SCHEMA)
    snap = r.snapshot_and_fetch(9)
    assert len(snap) == n
    assert snap == [(((i,), (f"v{i % 7}",)), 9, 1) for i in range(n)]


def test_large_arrow_batch_is_split_into_parts() -> None:
    client, shard = new_shard(PersistConfig(part_target_bytes=2048, inline_max_bytes=0))
    w = client.open_writer(shard, SCHEMA)
    builder = w.builder(0, 3)
    for chunk in range(6):
        ks = list(range(chunk * 100, chunk * 100 + 100))
        builder.add_table(
            pa.table({"k": ks, "v": ["x"] * 100, "ts": [chunk % 3] * 100, "diff": [2] * 100})
        )
    batch = builder.finish()
    assert len(batch.parts) >= 3, "tables are flushed as parts whenever part_target_bytes are buffered"
    assert sum(p.rows for p in batch.parts) == 600
    w.compare_and_append_batch([batch], 0, 3)
    r = client.open_leased_reader(shard, SCHEMA)
    assert sum(d for _, _, d in r.snapshot_and_fetch(2)) == 1200


# ---- reads ------------------------------------------------------------------------------


INLINE_FEW = 450
"""An ``inline_max_bytes`` that keeps appends of up to ~4 rows inline (see :func:`build_history`)."""


def build_history(w: WriteHandle, model: ShardModel, rounds: int = 12) -> None:
    """Appends with inserts, retractions and empty spans, mirrored into ``model``.

    Every third append is larger (a dozen more rows), so that with
    ``inline_max_bytes=INLINE_FEW`` small appends stay inline and large ones write parts.
    """
    for i in range(rounds):
        t = model.upper
        ups = [upd(i % 4, f"v{i}", t), upd((i + 1) % 4, f"v{i}", t + 1, 2)]
        if i:
            ups.append(upd((i - 1) % 4, f"v{i - 1}", t, -1))  # retract the previous insert
        ups.append(upd(7, "zero", t, 0))  # a zero diff is dropped by every read
        if i % 3 == 0:
            ups += [upd(10 + j, "bulk", t + j % 2, 1 - 2 * (j % 2)) for j in range(12)]
        append_model(model, w, ups, t + 2 + (i % 3))


def test_snapshot_at_every_as_of() -> None:
    config = PersistConfig(inline_max_bytes=INLINE_FEW, part_target_bytes=128, compaction_enabled=False)
    client, shard = new_shard(config)
    w = client.open_writer(shard, SCHEMA)
    model = ShardModel()
    build_history(w, model)
    runs = [r for b in w.shard.state().batches for r in b.runs]
    assert any(r.inline for r in runs) and any(r.parts for r in runs), "both inline rows and parts are read"
    r = PersistClient.open(client.url).open_leased_reader(shard, SCHEMA)
    for as_of in range(model.upper):
        got = r.snapshot_and_fetch(as_of)
        assert got == model.snapshot(as_of), f"as_of {as_of}"
        assert all(ts == as_of for _, ts, _ in got)
        assert all(d != 0 for _, _, d in got)


def test_snapshot_plan_and_tables() -> None:
    client, shard = new_shard(PersistConfig(inline_max_bytes=0))
    w = client.open_writer(shard, SCHEMA)
    w.compare_and_append([upd(1, "a", 0), upd(2, "b", 3)], 0, 5)
    r = client.open_leased_reader(shard, SCHEMA)
    plan = r.snapshot_plan(4)
    assert plan.as_of == 4 and len(plan.runs) == 1 and len(plan.runs[0].parts) == 1
    tables = list(r.snapshot_tables(2))
    assert sum(t.num_rows for t in tables) == 1
    assert tables[0].column("ts").to_pylist() == [2]


def test_listen_in_time_order_with_progress() -> None:
    client, shard = new_shard(PersistConfig(inline_max_bytes=INLINE_FEW, part_target_bytes=128))
    w = client.open_writer(shard, SCHEMA)
    model = ShardModel()
    build_history(w, model, rounds=8)
    r = client.open_leased_reader(shard, SCHEMA)
    for as_of in (0, 1, 5, model.upper - 2, model.upper - 1):
        listen = r.listen(as_of)
        got, progress = drain_listen(listen, model.upper)
        assert consolidate(got) == model.changes_after(as_of), f"listen from {as_of}"
        # a listen from upper - 1 starts caught up: it has nothing to report
        assert progress[-1:] == ([model.upper] if as_of < model.upper - 1 else [])

    # a caught-up listen returns nothing, then the next append's updates and progress
    listen = r.listen(model.upper - 1)
    assert listen.next(timeout_s=0.0) == []
    t = model.upper
    append_model(model, w, [upd(1, "new", t + 1)], t + 3)
    events = listen.next(timeout_s=0.0)
    assert [type(e).__name__ for e in events] == ["Updates", "Progress"]
    assert events[0].updates == [upd(1, "new", t + 1)] and events[1] == Progress(t + 3)


def test_listen_survives_compaction_of_a_stale_cached_state() -> None:
    """A listen planned on a stale state whose parts compaction deleted re-reads the state."""
    config = PersistConfig(inline_max_bytes=0, part_grace_s=0)
    writer_client, shard = new_shard(config)
    w = writer_client.open_writer(shard, SCHEMA)
    model = ShardModel()
    append_model(model, w, [upd(0, "a", 0)], 1)
    append_model(model, w, [upd(1, "a", 1)], 2)
    reader_client = PersistClient.open(writer_client.url, config)
    r = reader_client.open_leased_reader(shard, SCHEMA)
    listen = r.listen(0)  # planned against the state at upper 2
    for t in range(2, 10):
        append_model(model, w, [upd(t, "a", t)], t + 1)  # compaction retires and deletes parts
    got, _ = drain_listen(listen, model.upper)
    assert consolidate(got) == model.changes_after(0)
    assert r.snapshot_and_fetch(9) == model.snapshot(9)


# ---- holds on the since -----------------------------------------------------------------


def test_leased_reader_holds_since_and_downgrade() -> None:
    client, shard = new_shard(PersistConfig(inline_max_bytes=0))
    w = client.open_writer(shard, SCHEMA)
    model = ShardModel()
    build_history(w, model, rounds=6)
    r1 = client.open_leased_reader(shard, SCHEMA)
    r2 = client.open_leased_reader(shard, SCHEMA)
    assert r1.since == r2.since == 0

    r1.downgrade_since(6)
    assert r1.since == 6
    assert client.inspect(shard)["since"] == 0, "r2 still holds the since at 0"
    assert r2.snapshot_and_fetch(0) == model.snapshot(0)
    with pytest.raises(ReadBelowSince) as e:
        r1.snapshot_and_fetch(5)
    assert e.value.since == 6

    r2.downgrade_since(4)
    assert client.inspect(shard)["since"] == 4
    r2.downgrade_since(2)  # never backwards
    assert r2.since == 4 and client.inspect(shard)["since"] == 4
    model.since = 4
    w.compact()
    for as_of in range(4, model.upper):
        assert r2.snapshot_and_fetch(as_of) == model.snapshot(as_of)

    r2.expire()
    assert client.inspect(shard)["since"] == 6
    with pytest.raises(LeaseExpired):
        r2.snapshot_and_fetch(6)


def test_lease_expiry_with_fake_clock() -> None:
    clock = FakeClock()
    config = PersistConfig(reader_lease_s=10, clock_ms=clock)
    client, shard = new_shard(config)
    w = client.open_writer(shard, SCHEMA)
    w.compare_and_append([upd(1, "a", 0)], 0, 10)
    lapsing = client.open_leased_reader(shard, SCHEMA)
    alive = client.open_leased_reader(shard, SCHEMA)
    alive.downgrade_since(5)
    assert client.inspect(shard)["since"] == 0, "the lapsing reader holds the since at 0"

    for _ in range(4):  # the live reader heartbeats through its reads
        clock.advance(4)
        assert alive.snapshot_and_fetch(6) == [upd(1, "a", 6)]
    assert client.inspect(shard)["leased_readers"] == 1, "the silent reader's lease expired"
    assert client.inspect(shard)["since"] == 5, "its hold was released"
    with pytest.raises(LeaseExpired, match="open a new reader"):
        lapsing.snapshot_and_fetch(6)
    with pytest.raises(LeaseExpired):
        lapsing.downgrade_since(7)
    with pytest.raises(LeaseExpired):
        lapsing.listen(6)
    # a new reader starts at the current since
    assert client.open_leased_reader(shard, SCHEMA).since == 5


def test_critical_since_fencing() -> None:
    client, shard = new_shard()
    w = client.open_writer(shard, SCHEMA)
    w.compare_and_append([upd(1, "a", 0)], 0, 10)
    h = client.open_critical_since(shard, "controller", opaque=0)
    assert (h.since, h.opaque) == (0, 0)

    res = h.compare_and_downgrade_since(0, 1, 4)
    assert (res.ok, res.since, res.opaque) == (True, 4, 1)
    assert client.inspect(shard)["since"] == 4

    before = client.inspect(shard)
    stale = PersistClient.open(client.url).open_critical_since(shard, "controller", opaque=99)
    assert (stale.since, stale.opaque) == (4, 1), "an existing registration keeps its since and opaque"
    res = stale.compare_and_downgrade_since(0, 2, 8)
    assert (res.ok, res.since, res.opaque) == (False, 4, 1), "a mismatch returns the actual opaque"
    assert client.inspect(shard) == before, "and changes nothing"

    res = h.compare_and_downgrade_since(1, 1, 2)  # never backwards
    assert (res.ok, res.since) == (True, 4)
    res = stale.compare_and_downgrade_since(1, 7, 8)
    assert (res.ok, res.since, res.opaque) == (True, 8, 7)
    res = h.compare_and_downgrade_since(1, 2, 9)  # the old holder is fenced out now
    assert (res.ok, res.opaque) == (False, 7) and h.opaque == 7
    assert client.inspect(shard)["critical_readers"] == {"controller": {"since": 8, "opaque": 7}}


def test_an_opener_takes_its_lease_critical_since_and_initial_upper_in_one_write() -> None:
    url = mem_url("shard")
    loc = open_location(url)
    consensus = CountingConsensus(loc.consensus)
    client = PersistClient(Location(url, loc.blob, consensus), PersistConfig())
    shard = ShardId.new()
    r = client.open_leased_reader(shard, SCHEMA, critical_reader="controller", init_upper=7)
    assert consensus.counters.calls(Op.CAS) == 1, "a new shard: schema, critical since, upper, lease at once"
    state = client.inspect(shard)
    assert state["upper"] == 7 and state["since"] == 0
    assert state["critical_readers"] == {"controller": {"since": 0, "opaque": 0}}
    assert r.since == 0 and r.snapshot_and_fetch(6) == []
    assert client.shard_schema(shard) == SCHEMA
    h = client.open_critical_since(shard, "controller", opaque=5)
    assert (h.since, h.opaque) == (0, 0) and consensus.counters.calls(Op.CAS) == 1, "registered: nothing written"

    # an existing shard keeps its upper and its critical since; only a lease is added
    h.compare_and_downgrade_since(0, 3, 4)
    client.open_writer(shard, SCHEMA).compare_and_append([upd(1, "a", 8)], 7, 9)
    consensus.counters.reset()
    client.open_leased_reader(shard, SCHEMA, critical_reader="controller", init_upper=100)
    assert consensus.counters.calls(Op.CAS) == 1
    state = client.inspect(shard)
    assert state["upper"] == 9 and state["critical_readers"]["controller"] == {"since": 4, "opaque": 3}
    with pytest.raises(InvalidUsage, match="critical reader id"):
        client.open_leased_reader(shard, SCHEMA, critical_reader="")


def test_since_is_min_of_holds() -> None:
    client, shard = new_shard()
    w = client.open_writer(shard, SCHEMA)
    w.compare_and_append([upd(1, "a", 0)], 0, 20)
    r = client.open_leased_reader(shard, SCHEMA)
    c1 = client.open_critical_since(shard, "a", opaque=0)
    c2 = client.open_critical_since(shard, "b", opaque=0)
    r.downgrade_since(7)
    c1.compare_and_downgrade_since(0, 0, 3)
    assert client.inspect(shard)["since"] == 0, "c2 still holds 0"
    c2.compare_and_downgrade_since(0, 0, 12)
    assert client.inspect(shard)["since"] == 3
    c1.compare_and_downgrade_since(0, 0, 15)
    assert client.inspect(shard)["since"] == 7
    r.expire()
    assert client.inspect(shard)["since"] == 12
    c2.compare_and_downgrade_since(0, 0, 19)
    assert client.inspect(shard)["since"] == 15
    assert client.open_leased_reader(shard, SCHEMA).since == 15


# ---- closing ----------------------------------------------------------------------------


def test_close_shard() -> None:
    client, shard = new_shard()
    w = client.open_writer(shard, SCHEMA)
    w.compare_and_append([upd(1, "a", 0)], 0, 3)
    r = client.open_leased_reader(shard, SCHEMA)
    listen = r.listen(0)
    w.close_shard()
    assert client.inspect(shard)["upper"] == CLOSED
    before = client.inspect(shard)
    w.close_shard()  # closing twice is a no-op
    assert client.inspect(shard) == before
    with pytest.raises(UpperMismatch) as e:
        w.compare_and_append([upd(2, "b", 3)], 3, 4)
    assert e.value.current == CLOSED
    other = PersistClient.open(client.url).open_writer(shard, SCHEMA)
    with pytest.raises(UpperMismatch) as e:
        other.compare_and_append_batch([], 3, CLOSED)
    assert e.value.current == CLOSED
    assert client.inspect(shard) == before
    assert r.snapshot_and_fetch(TS_MAX) == [upd(1, "a", TS_MAX)]
    got, progress = drain_listen(listen, CLOSED)
    assert got == [] and progress == [CLOSED]


# ---- compaction and garbage collection --------------------------------------------------


def test_compaction_preserves_reads_at_every_as_of_past_the_since() -> None:
    config = PersistConfig(inline_max_bytes=INLINE_FEW, part_target_bytes=128, compaction_enabled=False)
    client, shard = new_shard(config)
    w = client.open_writer(shard, SCHEMA)
    model = ShardModel()
    build_history(w, model, rounds=16)
    r = client.open_leased_reader(shard, SCHEMA)
    r.downgrade_since(9)
    model.since = 9
    before = read_all(r, 9, model.upper)
    batches_before = client.inspect(shard)["batches"]
    assert batches_before == 16

    applied = 0
    while w.compact():
        applied += 1
    info = client.inspect(shard)
    assert applied >= 1 and info["batches"] < batches_before
    assert info["garbage_parts"] > 0
    assert read_all(r, 9, model.upper) == before
    assert before == {t: model.snapshot(t) for t in range(9, model.upper)}
    # times below the since were advanced to it, so listens from the since are intact
    got, _ = drain_listen(r.listen(9), model.upper)
    assert consolidate(got) == model.changes_after(9)


def test_compaction_keeps_batches_logarithmic() -> None:
    client, shard = new_shard(PersistConfig(inline_max_bytes=INLINE_FEW, part_target_bytes=256))
    w = client.open_writer(shard, SCHEMA)
    model = ShardModel()
    n = 200
    worst = 0
    for t in range(n):
        append_model(model, w, [upd(t, "v", t)], t + 1)
        batches = len(w.shard.state().batches)
        worst = max(worst, batches - 2 * math.log2(t + 1))
    assert worst <= 2, f"batches exceeded 2*log2(n)+2 by {worst}"
    r = client.open_leased_reader(shard, SCHEMA)
    assert r.snapshot_and_fetch(n - 1) == model.snapshot(n - 1)


def test_retired_parts_are_deleted_and_blob_stays_bounded() -> None:
    client, shard = new_shard(PersistConfig(inline_max_bytes=0, part_grace_s=0))
    w = client.open_writer(shard, SCHEMA)
    r = client.open_leased_reader(shard, SCHEMA)
    model = ShardModel()
    sizes = []
    for t in range(150):
        ups = [upd(t % 5, f"v{t}", t)]
        if t:
            ups.append(upd((t - 1) % 5, f"v{t - 1}", t, -1))
        append_model(model, w, ups, t + 1)
        r.downgrade_since(t)  # let compaction consolidate the retractions away
        model.since = t
        sizes.append(len(shard_blob_keys(client, shard)))
    assert max(sizes[50:]) <= 12, f"blob keys kept growing: {sizes[-20:]}"
    state = w.shard.fetch()
    assert shard_blob_keys(client, shard) <= state.part_keys() | {k for k, _ in state.garbage}
    assert r.snapshot_and_fetch(149) == model.snapshot(149) == [upd(149 % 5, "v149", 149)]


def test_retired_parts_kept_through_the_grace_period() -> None:
    clock = FakeClock()
    config = PersistConfig(inline_max_bytes=0, part_grace_s=60, clock_ms=clock, compaction_enabled=False)
    client, shard = new_shard(config)
    w = client.open_writer(shard, SCHEMA)
    for t in range(4):
        w.compare_and_append([upd(t, "a", t)], t, t + 1)
    old = shard_blob_keys(client, shard)
    plan = client.open_leased_reader(shard, SCHEMA).snapshot_plan(3)  # planned before compaction
    assert w.compact() >= 1
    retired = old - w.shard.state().part_keys()
    assert retired and retired <= shard_blob_keys(client, shard), "retired parts wait out the grace"
    assert w.collect_garbage() == 0
    rows = sum(t.num_rows for run in plan.runs for t in read_run(client.blob, run, SCHEMA.arrow))
    assert rows == 4, "a read planned before the compaction still finishes"

    clock.advance(61)
    assert w.collect_garbage() == len(retired)
    assert not retired & shard_blob_keys(client, shard)
    assert client.inspect(shard)["garbage_parts"] == 0


def test_consensus_truncation_keeps_versions_bounded() -> None:
    clock = FakeClock()
    config = PersistConfig(consensus_retention_s=2, gc_every_versions=4, clock_ms=clock)
    client, shard = new_shard(config)
    w = client.open_writer(shard, SCHEMA)
    model = ShardModel()
    counts = []
    for t in range(120):
        clock.advance(1)
        append_model(model, w, [upd(t % 3, "v", t)], t + 1)
        counts.append(len(client.consensus.scan(str(shard), 0, 10**6)))
    head = seqno(client, shard)
    assert head is not None and head >= 120
    assert max(counts[20:]) <= 16, f"versions kept growing: {counts[-10:]}"
    versions = client.consensus.scan(str(shard), 0, 10**6)
    assert versions[-1].seqno == head, "the head is never truncated"
    fresh = PersistClient.open(client.url).open_leased_reader(shard, SCHEMA)
    assert fresh.snapshot_and_fetch(119) == model.snapshot(119)

    # without truncation (a long retention) every version stays
    client2, shard2 = new_shard(PersistConfig(gc_every_versions=4, clock_ms=clock))
    w2 = client2.open_writer(shard2, SCHEMA)
    for t in range(30):
        clock.advance(1)
        w2.compare_and_append([upd(t, "v", t)], t, t + 1)
    assert len(client2.consensus.scan(str(shard2), 0, 10**6)) == seqno(client2, shard2)


def test_gc_leaked_deletes_only_unreferenced_parts() -> None:
    client, shard = new_shard(PersistConfig(inline_max_bytes=0, compaction_enabled=False))
    w = client.open_writer(shard, SCHEMA)
    w.compare_and_append([upd(1, "a", 0)], 0, 1)
    referenced = shard_blob_keys(client, shard)
    leaked = w.batch([upd(2, "b", 1)], 1, 2)  # written, never appended
    pending = w.batch([upd(3, "c", 1)], 1, 2)  # written, to be appended later (e.g. a committed txn)
    keep = {p.key for p in pending.parts}
    assert shard_blob_keys(client, shard) == referenced | keep | {p.key for p in leaked.parts}

    assert client.gc_leaked(shard, older_than_s=3600, keep=keep) == 0, "young parts are kept"
    assert client.gc_leaked(shard, older_than_s=0, keep=keep) == 1
    assert shard_blob_keys(client, shard) == referenced | keep
    w.compare_and_append_batch([pending], 1, 2)
    assert client.gc_leaked(shard, older_than_s=0) == 0
    r = client.open_leased_reader(shard, SCHEMA)
    assert r.snapshot_and_fetch(1) == [upd(1, "a", 1), upd(3, "c", 1)]


def test_reopen_with_a_fresh_client_sees_the_same_data() -> None:
    config = PersistConfig(inline_max_bytes=600, part_target_bytes=128)
    client, shard = new_shard(config)
    w = client.open_writer(shard, SCHEMA)
    model = ShardModel()
    build_history(w, model, rounds=10)
    c = client.open_critical_since(shard, "c", opaque=3)
    c.compare_and_downgrade_since(3, 4, 2)

    fresh = PersistClient.open(client.url, config)
    assert fresh.inspect(shard) == client.inspect(shard)
    r = fresh.open_leased_reader(shard, SCHEMA)
    assert r.since == 2, "the critical hold is the only one: the since followed it"
    model.since = 2
    assert read_all(r, 2, model.upper) == {t: model.snapshot(t) for t in range(2, model.upper)}
    w2 = fresh.open_writer(shard, SCHEMA)
    assert w2.upper == model.upper
    append_model(model, w2, [upd(5, "again", model.upper)], model.upper + 1)
    assert client.open_leased_reader(shard, SCHEMA).snapshot_and_fetch(model.upper - 1) == model.snapshot(
        model.upper - 1
    )
    assert fresh.open_critical_since(shard, "c", opaque=0).opaque == 4


# ---- every backend ----------------------------------------------------------------------


def scenario(url: str) -> None:
    """Appends, a re-timestamped batch, compaction, GC, snapshots, a listen, and a reopen."""
    config = PersistConfig(inline_max_bytes=700, part_target_bytes=256, part_grace_s=0, gc_every_versions=8)
    client = PersistClient.open(url, config)
    shard = ShardId.new()
    w = client.open_writer(shard, SCHEMA)
    model = ShardModel()
    ahead = w.batch([upd(50, "ahead", 0), upd(51, "ahead", 1, 3)], 0, 2)
    build_history(w, model, rounds=8)
    t = model.upper
    w.compare_and_append_batch([Batch.from_bytes(ahead.to_bytes()).rewrite_ts(t)], t, t + 1)
    model.append([upd(50, "ahead", t), upd(51, "ahead", t, 3)], t, t + 1)
    r = client.open_leased_reader(shard, SCHEMA)
    r.downgrade_since(3)
    model.since = 3
    for as_of in range(3, model.upper):
        assert r.snapshot_and_fetch(as_of) == model.snapshot(as_of)
    got, _ = drain_listen(r.listen(3), model.upper)
    assert consolidate(got) == model.changes_after(3)
    state = w.shard.fetch()
    state.check()
    assert shard_blob_keys(client, shard) <= state.part_keys() | {k for k, _ in state.garbage}

    fresh = PersistClient.open(url, config)
    r2 = fresh.open_leased_reader(shard, SCHEMA)
    assert r2.since == 3
    assert r2.snapshot_and_fetch(model.upper - 1) == model.snapshot(model.upper - 1)
    fresh.open_writer(shard, SCHEMA).close_shard()
    with pytest.raises(UpperMismatch) as e:
        w.compare_and_append([], model.upper, model.upper + 1)
    assert e.value.current == CLOSED
    client.location.close()
    fresh.location.close()


def test_scenario_on_every_backend(location_url: str) -> None:
    scenario(location_url)


@pytest.mark.s3
def test_s3_prefixes_are_separate_stores(s3_url_factory: Callable[..., str]) -> None:
    url = s3_url_factory("a")
    other = url.replace("/a?", "/b?")
    c1 = PersistClient.open(url)
    shard = ShardId.new()
    c1.open_writer(shard, SCHEMA).compare_and_append([upd(1, "a", 0)], 0, 1)
    c2 = PersistClient.open(other)
    assert c2.inspect(shard)["upper"] == 0
    assert c1.inspect(shard)["upper"] == 1
    c1.location.close()
    c2.location.close()


def test_a_part_hold_keeps_retired_parts_until_it_expires_without_blocking_compaction() -> None:
    clock = FakeClock()
    config = PersistConfig(inline_max_bytes=0, part_grace_s=60, clock_ms=clock, compaction_enabled=False)
    client, shard = new_shard(config)
    w = client.open_writer(shard, SCHEMA)
    for t in range(4):
        w.compare_and_append([upd(t, "a", t)], t, t + 1)
    hold = client.hold_parts(shard, for_s=3600)
    plan = client.open_leased_reader(shard, SCHEMA).snapshot_plan(3)  # a read planned under the hold
    old = {p.key for run in plan.runs for p in run.parts}
    assert w.compact() >= 1, "compaction is not blocked"
    retired = old - w.shard.state().part_keys()
    assert retired
    clock.advance(61 * 30)  # far past the grace period, within the hold
    assert w.collect_garbage() == 0
    rows = sum(t.num_rows for run in plan.runs for t in read_run(client.blob, run, SCHEMA.arrow))
    assert rows == 4, "the held read still finishes"
    clock.advance(3600)  # the hold expired: the parts go, and so does the hold object
    assert w.collect_garbage() == len(retired)
    assert not list(client.blob.list_keys(f"{shard}/holds/"))
    assert client.inspect(shard)["garbage_parts"] == 0

    h2 = client.hold_parts(shard, for_s=3600)  # released early: no longer keeps anything
    w.compare_and_append([upd(9, "b", 4)], 4, 5)
    w.compare_and_append([upd(8, "b", 5)], 5, 6)
    assert w.compact() >= 1
    h2.release(client.blob)
    clock.advance(61)
    assert w.collect_garbage() >= 1
    assert hold.key != h2.key


def test_a_part_hold_is_refused_for_a_bad_duration() -> None:
    client, shard = new_shard(PersistConfig())
    for bad in (0, -1, True, "1h", 10**9):
        with pytest.raises(InvalidUsage, match="for_s"):
            client.hold_parts(shard, for_s=bad)  # type: ignore[arg-type]
    assert not list(client.blob.list_keys(f"{shard}/holds/"))
