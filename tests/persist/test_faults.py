"""Shards under storage faults and corruption.

Faults come from :mod:`persist.unreliable` wrappers around the mem and file
backends: failures *before* an operation (nothing happened; ``Determinate``
or ``Indeterminate``) and *after* it (it happened, then ``Indeterminate``,
like a timed-out response), on consensus compare-and-set, head, and blob set.
The bar: no append is ever lost or applied twice, checked by reading the
shard through a clean client of the same store and comparing with the model.
Corruption is injected in the underlying store directly; it must raise
``CorruptObject`` naming the key, and nothing corrupt is returned.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

import pytest

from persist import (
    Batch,
    CorruptObject,
    Determinate,
    ExternalError,
    Indeterminate,
    PersistClient,
    PersistConfig,
    ShardId,
    UpperMismatch,
    WriteHandle,
)
from persist.unreliable import Fault, Faults, Op
from tests.helpers import faulty_client, mem_url
from tests.persist.model import SCHEMA, ShardModel, Update, consolidate, drain_listen, shard_blob_keys, upd

WRITE_OPS = [Op.CAS, Op.HEAD, Op.SCAN, Op.BLOB_SET]
# (a handle a few versions behind catches up with a scan; HEAD only when further behind)
MUST_FAIL_OPS = [Op.CAS, Op.SCAN, Op.BLOB_SET]


@dataclass
class Store:
    """A store reached both through fault-injecting wrappers and cleanly."""

    url: str
    faults: Faults
    faulty: PersistClient
    clean: PersistClient
    root: Path | None  # the directory of a file:// store

    def head_seqno(self, shard: ShardId) -> int:
        head = self.clean.consensus.head(str(shard))
        assert head is not None
        return head.seqno


def make_store(url: str, config: PersistConfig, root: Path | None = None, seed: int = 0) -> Store:
    faults = Faults(seed=seed)
    return Store(url, faults, faulty_client(url, faults, config), PersistClient.open(url, config), root)


@pytest.fixture(params=["mem", "file"])
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[str, Path | None]]:
    if request.param == "mem":
        yield mem_url("faults"), None
    else:
        yield f"file://{tmp_path / 'store'}", tmp_path / "store"


def snapshots_equal_model(client: PersistClient, shard: ShardId, model: ShardModel) -> None:
    """Snapshots (the first, the last, and a spread between) and a listen from the since agree."""
    r = client.open_leased_reader(shard, SCHEMA)
    for as_of in sorted({r.since, model.upper - 1, *range(r.since, model.upper, 7)}):
        assert r.snapshot_and_fetch(as_of) == model.snapshot(as_of), f"as_of {as_of}"
    got, _ = drain_listen(r.listen(r.since), model.upper)
    assert consolidate(got) == model.changes_after(r.since)
    r.expire()


# ---- appends under random faults --------------------------------------------------------


def append_until_done(w: WriteHandle, ups: list[Update], lo: int, hi: int, stats: dict[str, int]) -> None:
    """Retry the same ``compare_and_append`` until it returns or loses to our own earlier attempt."""
    while True:
        try:
            w.compare_and_append(ups, lo, hi)
            return
        except ExternalError as e:
            stats["blob retries" if "blob.set" in str(e) else "consensus retries"] += 1
        except UpperMismatch as e:
            # SUBTLE: the only writer is us, so an upper at hi means an earlier
            # attempt of this very append committed (and reported a failure).
            assert e.current == hi, f"lost append: expected upper {lo}, found {e.current}"
            stats["committed then failed"] += 1
            return


def append_batch_until_done(w: WriteHandle, ups: list[Update], lo: int, hi: int, stats: dict[str, int]) -> None:
    """Write a batch (retrying), then retry appending that same batch until it returns."""
    while True:
        try:
            batch = w.batch(ups, lo, hi)
            break
        except ExternalError:
            stats["blob retries"] += 1
    while True:
        try:
            w.compare_and_append_batch([batch], lo, hi)
            return
        except ExternalError:
            stats["consensus retries"] += 1
        # an UpperMismatch here would mean the retry did not recognise its own commit: let it fail the test


@pytest.mark.parametrize("deadline", [0.0, 30.0], ids=["caller-retries", "persist-retries"])
def test_appends_under_random_faults_are_exactly_once(
    backend: tuple[str, Path | None], deadline: float
) -> None:
    url, root = backend
    config = PersistConfig(
        inline_max_bytes=390,  # appends of two rows are inline, of three or four write a part
        part_target_bytes=256,
        part_grace_s=0,
        consensus_retention_s=0,
        gc_every_versions=5,
        retry_deadline_s=deadline,
    )
    store = make_store(url, config, root, seed=11)
    shard = ShardId.new()
    with store.faults.disabled():
        w = store.faulty.open_writer(shard, SCHEMA)
    store.faults.set_rates(determinate=0.1, indeterminate=0.05, after=0.1, ops=WRITE_OPS)
    model = ShardModel()
    stats = {"blob retries": 0, "consensus retries": 0, "committed then failed": 0}
    for i in range(60):
        lo = model.upper
        hi = lo + 1 + i % 2
        ups = [upd(i % 6, f"v{i % 3}", lo), upd((i + 3) % 6, "r", hi - 1, -1 if i % 4 else 2)]
        ups += [upd(20 + j, "x", lo, 1 - j) for j in range(i % 3)]
        if i % 2:
            append_batch_until_done(w, ups, lo, hi, stats)
        else:
            append_until_done(w, ups, lo, hi, stats)
        model.append(ups, lo, hi)

    store.faults.clear()
    injected = {op: store.faults.counters[op].injected for op in MUST_FAIL_OPS}
    assert all(injected.values()), f"every faulted op failed at least once: {injected}"
    if deadline == 0:
        assert stats["blob retries"] > 0 and stats["consensus retries"] > 0, stats
        assert stats["committed then failed"] > 0, stats
    else:
        assert set(stats.values()) == {0}, f"persist retried every fault itself: {stats}"

    assert store.clean.inspect(shard)["upper"] == model.upper
    snapshots_equal_model(store.clean, shard, model)
    # faults leak parts at worst (written, never referenced); GC finds them and nothing else
    store.clean.gc_leaked(shard, older_than_s=0)
    state = store.clean.shard(shard).fetch()
    assert shard_blob_keys(store.clean, shard) <= state.part_keys() | {k for k, _ in state.garbage}
    snapshots_equal_model(store.clean, shard, model)


# ---- one fault, on the very append --------------------------------------------------------


def quiet_config(**kw: float) -> PersistConfig:
    return PersistConfig(inline_max_bytes=0, compaction_enabled=False, **kw)  # type: ignore[arg-type]


def test_cas_performed_then_timeout_is_applied_once(backend: tuple[str, Path | None]) -> None:
    url, root = backend
    store = make_store(url, quiet_config(), root)
    shard = ShardId.new()
    w = store.faulty.open_writer(shard, SCHEMA)
    w.compare_and_append([upd(0, "a", 0)], 0, 1)
    before = store.head_seqno(shard)
    cas_before = store.faults.counters.calls(Op.CAS)

    store.faults.fail_next(Op.CAS, Fault.AFTER)
    w.compare_and_append([upd(1, "b", 1)], 1, 2)  # persist re-reads and recognises its own write

    assert store.faults.counters[Op.CAS].injected == 1
    assert store.faults.counters.calls(Op.CAS) == cas_before + 1, "no second compare-and-set"
    assert store.head_seqno(shard) == before + 1, "exactly one new state version"
    model = ShardModel()
    model.append([upd(0, "a", 0)], 0, 1)
    model.append([upd(1, "b", 1)], 1, 2)
    snapshots_equal_model(store.clean, shard, model)
    assert len(shard_blob_keys(store.clean, shard)) == 2, "one part per append, none leaked"


def test_cas_performed_then_timeout_caller_retries_the_same_batch(backend: tuple[str, Path | None]) -> None:
    url, root = backend
    store = make_store(url, quiet_config(retry_deadline_s=0), root)
    shard = ShardId.new()
    w = store.faulty.open_writer(shard, SCHEMA)
    batch = w.batch([upd(1, "b", 0), upd(2, "c", 0)], 0, 1)
    store.faults.fail_next(Op.CAS, Fault.AFTER)
    with pytest.raises(Indeterminate, match="it was done"):
        w.compare_and_append_batch([batch], 0, 1)
    after_first = store.head_seqno(shard)
    assert store.clean.inspect(shard)["upper"] == 1, "the append did happen"

    w.compare_and_append_batch([Batch.from_bytes(batch.to_bytes())], 0, 1)  # the retry
    assert store.head_seqno(shard) == after_first, "the retry recognised its commit and wrote nothing"
    assert store.clean.open_leased_reader(shard, SCHEMA).snapshot_and_fetch(0) == [
        upd(1, "b", 0),
        upd(2, "c", 0),
    ]
    # a different append at the same bounds is not mistaken for the retry
    with pytest.raises(UpperMismatch) as e:
        w.compare_and_append([upd(3, "d", 0)], 0, 1)
    assert e.value.current == 1


def test_cas_performed_then_timeout_caller_retries_compare_and_append(backend: tuple[str, Path | None]) -> None:
    url, root = backend
    store = make_store(url, quiet_config(retry_deadline_s=0), root)
    shard = ShardId.new()
    w = store.faulty.open_writer(shard, SCHEMA)
    store.faults.fail_next(Op.CAS, Fault.AFTER)
    with pytest.raises(Indeterminate):
        w.compare_and_append([upd(1, "b", 0)], 0, 1)
    keys = shard_blob_keys(store.clean, shard)
    seq = store.head_seqno(shard)
    with pytest.raises(UpperMismatch) as e:  # the retry writes a new batch, then finds the first one won
        w.compare_and_append([upd(1, "b", 0)], 0, 1)
    assert e.value.current == 1
    assert store.head_seqno(shard) == seq
    assert shard_blob_keys(store.clean, shard) == keys, "the losing retry deleted its own part"
    assert store.clean.open_leased_reader(shard, SCHEMA).snapshot_and_fetch(0) == [upd(1, "b", 0)]


@pytest.mark.parametrize("fault", [Fault.DETERMINATE, Fault.INDETERMINATE])
def test_cas_failed_before_is_not_applied_and_retry_applies_once(
    backend: tuple[str, Path | None], fault: Fault
) -> None:
    url, root = backend
    store = make_store(url, quiet_config(retry_deadline_s=0), root)
    shard = ShardId.new()
    w = store.faulty.open_writer(shard, SCHEMA)
    w.compare_and_append([], 0, 1)
    seq = store.head_seqno(shard)
    batch = w.batch([upd(1, "b", 1)], 1, 2)
    store.faults.fail_next(Op.CAS, fault)
    with pytest.raises(Determinate if fault is Fault.DETERMINATE else Indeterminate, match="before"):
        w.compare_and_append_batch([batch], 1, 2)
    assert store.head_seqno(shard) == seq and store.clean.inspect(shard)["upper"] == 1
    w.compare_and_append_batch([batch], 1, 2)
    assert store.head_seqno(shard) == seq + 1
    assert store.clean.open_leased_reader(shard, SCHEMA).snapshot_and_fetch(1) == [upd(1, "b", 1)]


def test_head_faults_are_retried_or_reported(backend: tuple[str, Path | None]) -> None:
    url, root = backend
    store = make_store(url, quiet_config(), root)
    shard = ShardId.new()
    store.clean.open_writer(shard, SCHEMA).compare_and_append([upd(1, "a", 0)], 0, 1)
    store.faults.fail_next(Op.HEAD, n=3)
    w = store.faulty.open_writer(shard, SCHEMA)  # reads the head: retried through three failures
    w.compare_and_append([upd(2, "b", 1)], 1, 2)
    assert store.faults.counters[Op.HEAD].injected == 3

    impatient = make_store(url, quiet_config(retry_deadline_s=0), root)
    seq = store.head_seqno(shard)
    impatient.faults.fail_next(Op.HEAD)
    with pytest.raises(Determinate, match=r"consensus.head"):
        impatient.faulty.inspect(shard)
    assert store.head_seqno(shard) == seq
    assert impatient.faulty.inspect(shard)["upper"] == 2


def test_blob_set_faults_leave_no_trace_but_a_leaked_part(backend: tuple[str, Path | None]) -> None:
    url, root = backend
    store = make_store(url, quiet_config(retry_deadline_s=0), root)
    shard = ShardId.new()
    w = store.faulty.open_writer(shard, SCHEMA)
    store.faults.fail_next(Op.BLOB_SET, Fault.DETERMINATE)
    with pytest.raises(Determinate):
        w.compare_and_append([upd(1, "a", 0)], 0, 1)
    assert shard_blob_keys(store.clean, shard) == set()
    store.faults.fail_next(Op.BLOB_SET, Fault.AFTER)
    with pytest.raises(Indeterminate):
        w.compare_and_append([upd(1, "a", 0)], 0, 1)
    assert len(shard_blob_keys(store.clean, shard)) == 1, "the part was written, then the write timed out"
    assert store.clean.inspect(shard)["upper"] == 0, "nothing was appended"
    w.compare_and_append([upd(1, "a", 0)], 0, 1)
    assert store.clean.gc_leaked(shard, older_than_s=0) == 1
    assert store.clean.open_leased_reader(shard, SCHEMA).snapshot_and_fetch(0) == [upd(1, "a", 0)]

    # with time to retry, persist retries the upload itself
    patient = make_store(url, quiet_config(), root)
    pw = patient.faulty.open_writer(shard, SCHEMA)
    patient.faults.fail_next(Op.BLOB_SET, Fault.DETERMINATE)
    patient.faults.fail_next(Op.BLOB_SET, Fault.AFTER)
    pw.compare_and_append([upd(2, "b", 1)], 1, 2)
    assert patient.faults.counters[Op.BLOB_SET].injected == 2
    # the retry wrote the same key again, so the upload that timed out after writing leaked nothing
    assert patient.clean.gc_leaked(shard, older_than_s=0) == 0
    assert patient.clean.open_leased_reader(shard, SCHEMA).snapshot_and_fetch(1) == [upd(1, "a", 1), upd(2, "b", 1)]


def test_compaction_cas_performed_then_timeout_keeps_the_merged_parts(backend: tuple[str, Path | None]) -> None:
    url, root = backend
    store = make_store(url, quiet_config(part_grace_s=0), root)
    shard = ShardId.new()
    w = store.faulty.open_writer(shard, SCHEMA)
    model = ShardModel()
    for t in range(4):
        w.compare_and_append([upd(t, "a", t)], t, t + 1)
        model.append([upd(t, "a", t)], t, t + 1)
    store.faults.fail_next(Op.CAS, Fault.AFTER)
    assert w.compact() >= 1, "the compaction committed (its retry saw that)"
    state = store.clean.shard(shard).fetch()
    assert len(state.batches) < 4
    assert state.part_keys() <= shard_blob_keys(store.clean, shard), "no referenced part was deleted"
    snapshots_equal_model(store.clean, shard, model)
    w.collect_garbage()
    assert shard_blob_keys(store.clean, shard) == store.clean.shard(shard).fetch().part_keys()
    snapshots_equal_model(store.clean, shard, model)


def test_holds_under_cas_performed_then_timeout(backend: tuple[str, Path | None]) -> None:
    url, root = backend
    store = make_store(url, quiet_config(), root)
    shard = ShardId.new()
    store.clean.open_writer(shard, SCHEMA).compare_and_append([upd(1, "a", 0)], 0, 10)

    store.faults.fail_next(Op.CAS, Fault.AFTER)
    r = store.faulty.open_leased_reader(shard, SCHEMA)  # registering the reader timed out, and was retried
    assert store.clean.inspect(shard)["leased_readers"] == 1
    store.faults.fail_next(Op.CAS, Fault.AFTER)
    r.downgrade_since(4)  # re-applied after the timeout: same effect (it may write a second version)
    assert store.clean.inspect(shard)["since"] == 4 and r.since == 4
    assert store.clean.shard(shard).fetch().leased[r.reader_id].since == 4

    h = store.faulty.open_critical_since(shard, "c", opaque=7)
    r.expire()
    seq = store.head_seqno(shard)
    store.faults.fail_next(Op.CAS, Fault.AFTER)
    res = h.compare_and_downgrade_since(7, 7, 6)  # the same opaque: a retry is recognised
    assert (res.ok, res.since, res.opaque) == (True, 6, 7)
    assert store.head_seqno(shard) == seq + 1

    store.faults.fail_next(Op.CAS, Fault.AFTER)
    res = h.compare_and_downgrade_since(7, 8, 9)  # a new opaque: applied once, never lost
    assert store.head_seqno(shard) == seq + 2
    assert store.clean.inspect(shard)["critical_readers"] == {"c": {"since": 9, "opaque": 8}}
    # SUBTLE: the retry cannot tell its own commit from another holder's, so it
    # may report a mismatch; it then reports the opaque it set itself.
    assert res.ok or (res.since, res.opaque) == (9, 8)


# ---- corruption -----------------------------------------------------------------------------


def flip(data: bytes, at: int | None = None) -> bytes:
    i = len(data) // 2 if at is None else at
    return data[:i] + bytes([data[i] ^ 0x40]) + data[i + 1 :]


def corrupt_blob(store: Store, key: str, new: bytes) -> None:
    if store.root is None:
        store.clean.blob.set(key, new)
    else:
        path = store.root / "blob" / key
        assert path.is_file()
        path.write_bytes(new)


def test_corrupt_state_version_raises_naming_the_key(backend: tuple[str, Path | None]) -> None:
    url, root = backend
    store = make_store(url, quiet_config(), root)
    shard = ShardId.new()
    w = store.clean.open_writer(shard, SCHEMA)
    w.compare_and_append([upd(1, "a", 0)], 0, 1)
    head = store.clean.consensus.head(str(shard))
    assert head is not None
    if root is None:
        # the store accepts any bytes as a new version: a corrupt copy of the head
        store.clean.consensus.compare_and_set(str(shard), head.seqno, flip(head.data))
        seq = head.seqno + 1
    else:
        path = root / "consensus" / ("k" + quote(str(shard), safe="")) / f"{head.seqno:020d}"
        assert path.is_file()
        os.chmod(path, 0o644)
        path.write_bytes(flip(head.data))
        seq = head.seqno

    fresh = PersistClient.open(url, quiet_config())
    for call in (
        lambda: fresh.inspect(shard),
        lambda: fresh.open_leased_reader(shard, SCHEMA),
        lambda: fresh.open_writer(shard, SCHEMA).compare_and_append([upd(2, "b", 1)], 1, 2),
    ):
        with pytest.raises(CorruptObject) as e:
            call()
        assert e.value.key == f"consensus {shard} seqno {seq}"
        assert str(shard) in str(e.value) and "CRC-32C mismatch" in str(e.value)
    if root is None:
        # the writer with a cached state notices too: its write lost to the corrupt version
        with pytest.raises(CorruptObject):
            w.compare_and_append([upd(2, "b", 1)], 1, 2)
    else:
        # the writer's cache is the good copy of the damaged head: its next version, a diff
        # on that copy, lands; a fresh reader needs the damaged version too, and says so
        w.compare_and_append([upd(2, "b", 1)], 1, 2)
        with pytest.raises(CorruptObject, match="CRC-32C mismatch") as e:
            PersistClient.open(url, quiet_config()).open_leased_reader(shard, SCHEMA)
        assert e.value.key == f"consensus {shard} seqno {seq}"
        # once a version past it is whole (a rollup), the damaged one is needed no more
        for i in range(2, 2 + quiet_config().state_rollup_every):
            w.compare_and_append([], i, i + 1)
        r = PersistClient.open(url).open_leased_reader(shard, SCHEMA)
        assert r.snapshot_and_fetch(1) == [upd(1, "a", 1), upd(2, "b", 1)]


def test_wrong_kind_of_object_as_state_is_corrupt() -> None:
    store = make_store(mem_url("corrupt"), quiet_config())
    shard = ShardId.new()
    w = store.clean.open_writer(shard, SCHEMA)
    w.compare_and_append([upd(1, "a", 0)], 0, 1)
    batch = w.batch([upd(2, "b", 1)], 1, 2)
    head = store.clean.consensus.head(str(shard))
    assert head is not None
    store.clean.consensus.compare_and_set(str(shard), head.seqno, batch.to_bytes())  # valid CRC, wrong kind
    with pytest.raises(CorruptObject, match="expected object kind 1, found 2"):
        PersistClient.open(store.url).inspect(shard)
    store.clean.consensus.compare_and_set(str(shard), head.seqno + 1, b"short")
    with pytest.raises(CorruptObject, match="too short"):
        PersistClient.open(store.url).inspect(shard)


@pytest.mark.parametrize("damage", ["flip", "truncate", "delete"])
def test_corrupt_part_raises_naming_the_key(
    backend: tuple[str, Path | None], damage: str, caplog: pytest.LogCaptureFixture
) -> None:
    url, root = backend
    store = make_store(url, quiet_config(), root)
    shard = ShardId.new()
    w = store.clean.open_writer(shard, SCHEMA)
    w.compare_and_append([upd(1, "a", 0)], 0, 1)
    w.compare_and_append([upd(2, "b", 1), upd(3, "c", 1)], 1, 2)
    key = w.shard.state().batches[-1].runs[0].parts[0].key
    data = store.clean.blob.get(key)
    assert data is not None
    if damage == "flip":
        corrupt_blob(store, key, flip(data))
        why = "CRC-32C mismatch"
    elif damage == "truncate":
        corrupt_blob(store, key, data[:-10])
        why = f"size {len(data) - 10} != recorded {len(data)}"
    else:
        store.clean.blob.delete(key)
        why = "missing from blob storage"
    before = store.clean.inspect(shard)

    r = PersistClient.open(url).open_leased_reader(shard, SCHEMA)
    assert r.snapshot_and_fetch(0) == [upd(1, "a", 0)], "reads not touching the part still work"
    with pytest.raises(CorruptObject) as e:
        r.snapshot_and_fetch(1)
    assert e.value.key == key and key in str(e.value) and why in str(e.value)
    with pytest.raises(CorruptObject) as e:
        r.listen(0).next()
    assert e.value.key == key
    # a compaction reading the part refuses it too, and changes nothing
    with pytest.raises(CorruptObject) as e:
        w.compact()
    assert e.value.key == key
    after = store.clean.inspect(shard)
    assert {k: v for k, v in after.items() if k not in ("seqno", "leased_readers")} == {
        k: v for k, v in before.items() if k not in ("seqno", "leased_readers")
    }
    # an append whose maintenance trips on the damage still reports its (committed) success
    auto = PersistClient.open(url, PersistConfig(inline_max_bytes=0)).open_writer(shard, SCHEMA)
    with caplog.at_level(logging.WARNING, logger="persist.write"):
        auto.compare_and_append([upd(4, "d", 2)], 2, 3)
    assert store.clean.inspect(shard)["upper"] == 3
    assert key in caplog.text


def test_corrupt_serialized_batch() -> None:
    client = PersistClient.open(mem_url("corrupt"))
    batch = client.open_writer(ShardId.new(), SCHEMA).batch([upd(1, "a", 0)], 0, 1)
    data = batch.to_bytes()
    assert Batch.from_bytes(data) == batch
    with pytest.raises(CorruptObject, match="'serialized batch': CRC-32C mismatch"):
        Batch.from_bytes(flip(data))
    with pytest.raises(CorruptObject, match="too short"):
        Batch.from_bytes(data[:5])


def test_token_retry_of_compare_and_append_keeps_the_state_parts_and_leaks_none() -> None:
    """A caller retrying the same compare_and_append (same token) after Indeterminate.

    The first call's CAS lands, then reports a timeout, and persist's own
    retries are off, so the caller sees Indeterminate and retries with the
    same token. The retry must not append twice, must delete only its own
    (unreferenced) parts, and the first call's parts must stay readable.
    """
    url = mem_url("retry-parts")
    store = make_store(url, PersistConfig(inline_max_bytes=0, compaction_enabled=False, retry_deadline_s=0))
    shard = ShardId.new()
    w = store.faulty.open_writer(shard, SCHEMA)
    ups = [upd(1, "a", 0), upd(2, "b", 0)]
    store.faults.fail_next(Op.CAS, Fault.AFTER)
    with pytest.raises(Indeterminate):
        w.compare_and_append(ups, 0, 1, token="t-1")
    w.compare_and_append(ups, 0, 1, token="t-1")  # recognised: no second append
    state = store.clean.shard(shard).fetch()
    assert state.upper == 1 and len(state.batches) == 1
    assert shard_blob_keys(store.clean, shard) == state.part_keys(), "the retry leaked (or lost) a part"
    r = store.clean.open_leased_reader(shard, SCHEMA)
    assert r.snapshot_and_fetch(0) == consolidate(ups, 0)


def test_internal_retry_after_a_landed_cas_keeps_its_own_parts() -> None:
    """persist retries internally: the re-run sees its own token; its parts are the state's."""
    url = mem_url("retry-own")
    store = make_store(url, PersistConfig(inline_max_bytes=0, compaction_enabled=False))
    shard = ShardId.new()
    w = store.faulty.open_writer(shard, SCHEMA)
    ups = [upd(1, "a", 0)]
    store.faults.fail_next(Op.CAS, Fault.AFTER)
    w.compare_and_append(ups, 0, 1)
    state = store.clean.shard(shard).fetch()
    assert state.part_keys() and shard_blob_keys(store.clean, shard) == state.part_keys()
    assert store.clean.open_leased_reader(shard, SCHEMA).snapshot_and_fetch(0) == consolidate(ups, 0)
