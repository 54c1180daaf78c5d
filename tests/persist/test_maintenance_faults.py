"""Compaction, garbage collection, retention and truncation under faults on every storage operation.

The random-fault test of tests/persist/test_faults.py faults the write path
(compare-and-set, head, scan, blob set) on mem and file. Here *every*
operation is faulted, deletes, truncations and listings included, before
and after it happens (``after``: it happened, then a timeout), on file://
and on S3 (moto over HTTP, through :mod:`persist.unreliable`), while one
writer appends (inline batches and Parquet parts) and, between appends,
maintenance runs: compaction merging parts, garbage collection deleting the
retired ones (grace 0), leaked-part collection, the since moved up (the
retention of a reader's hold) and consensus truncation (retention 0, every
few versions). Each maintenance call that fails is left for the next round,
as a caller would.

The bar, checked through a clean client against :class:`tests.persist.model.ShardModel`:
every snapshot from the since to the upper and a listen from the since
equal the model (nothing lost, nothing twice, no part deleted while a
state still names it), and after a clean ``gc_leaked`` the blob store holds
only parts the state references. Every faulted operation failed at least
once (counted), so each kind of fault was met.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from persist import ExternalError, PersistClient, PersistConfig, ShardId, UpperMismatch, metrics
from persist.unreliable import Faults, Op
from tests.helpers import faulty_client
from tests.persist.model import SCHEMA, ShardModel, shard_blob_keys, upd
from tests.persist.test_faults import snapshots_equal_model

ALL_OPS = [
    Op.BLOB_GET,
    Op.BLOB_SET,
    Op.BLOB_DELETE,
    Op.BLOB_LIST_KEYS,
    Op.HEAD,
    Op.CAS,
    Op.SCAN,
    Op.TRUNCATE,
]
# (a scan or head may be skipped by a handle that is current; these are reached on every round)
MUST_FAIL = [Op.BLOB_GET, Op.BLOB_SET, Op.BLOB_DELETE, Op.BLOB_LIST_KEYS, Op.CAS, Op.TRUNCATE]
ROUNDS = 40


@pytest.fixture(params=["file", pytest.param("s3", marks=pytest.mark.s3)])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "file":
        return f"file://{tmp_path / 'store'}"
    factory: Callable[..., str] = request.getfixturevalue("s3_url_factory")
    return factory()


def _until_done(fn: Callable[[], Any], failures: dict[str, int], what: str, tries: int = 200) -> Any:
    for _ in range(tries):
        try:
            return fn()
        except ExternalError:
            failures[what] = failures.get(what, 0) + 1
    raise AssertionError(f"{what} failed {tries} times in a row")


def _best_effort(fn: Callable[[], Any], failures: dict[str, int], what: str) -> None:
    try:
        fn()
    except ExternalError:
        failures[what] = failures.get(what, 0) + 1  # left for the next round, as a caller would


@pytest.mark.parametrize("deadline", [0.0, 5.0], ids=["caller-retries", "persist-retries"])
def test_maintenance_under_faults_on_every_operation_loses_nothing(store_url: str, deadline: float) -> None:
    config = PersistConfig(
        inline_max_bytes=390,  # two-row appends inline, bigger ones write a part
        part_target_bytes=256,
        part_grace_s=0,  # retired parts deletable at once
        consensus_retention_s=0,  # every version older than the newest mark may be truncated
        gc_every_versions=3,
        # 0: every fault surfaces (the callers below retry or defer); 5 s: persist retries them itself,
        # re-running transitions after a write that landed and reported a timeout
        retry_deadline_s=deadline,
    )
    faults = Faults(seed=29)
    client = faulty_client(store_url, faults, config)
    clean = PersistClient.open(store_url, PersistConfig())
    shard = ShardId.new()
    w = client.open_writer(shard, SCHEMA)
    reader = client.open_leased_reader(shard, SCHEMA)
    before = metrics.snapshot()
    faults.set_rates(determinate=0.08, indeterminate=0.04, after=0.08, ops=ALL_OPS)
    model = ShardModel()
    failures: dict[str, int] = {}
    for i in range(ROUNDS):
        lo = model.upper
        hi = lo + 1 + i % 2
        ups = [upd(i % 5, f"v{i % 3}", lo), upd((i + 2) % 5, "r", hi - 1, -1 if i % 3 else 2)]
        ups += [upd(10 + j, "x" * 40, lo, 1) for j in range(i % 4)]

        def append(ups: list[Any] = ups, lo: int = lo, hi: int = hi) -> None:
            try:
                w.compare_and_append(ups, lo, hi)
            except UpperMismatch as e:
                # the only writer is us: an upper at hi means an earlier attempt committed
                assert e.current == hi, f"lost append: expected upper {lo}, found {e.current}"

        _until_done(append, failures, "append")
        model.append(ups, lo, hi)
        # maintenance between appends, each step deferred when a fault hits it
        _best_effort(lambda: w.compact(max_rounds=2), failures, "compact")
        _best_effort(w.collect_garbage, failures, "collect_garbage")
        if i % 5 == 4:
            # the retention moves the since: everything below upper - 3 may be merged
            _best_effort(lambda: reader.downgrade_since(max(0, model.upper - 3)), failures, "downgrade_since")
            _best_effort(w.shard.truncate_old_versions, failures, "truncate")
        if i % 10 == 9:
            # (no batch is in flight between appends: every unreferenced part is leaked)
            _best_effort(lambda: client.gc_leaked(shard, older_than_s=0), failures, "gc_leaked")

    faults.clear()
    injected = {op.value: faults.counters[op].injected for op in MUST_FAIL}
    assert all(injected.values()), f"every operation was faulted at least once: {injected}"
    if deadline == 0:
        assert failures.get("compact", 0) + failures.get("collect_garbage", 0) > 0, failures
    done = {k: metrics.snapshot()[k] - before[k] for k in before}
    assert done["parts_deleted"] > 0 and done["versions_truncated"] > 0, f"maintenance never acted: {done}"

    # a clean client agrees with the model everywhere from the since
    assert clean.inspect(shard)["upper"] == model.upper
    snapshots_equal_model(clean, shard, model)
    # one more clean round of maintenance: the faults left leaked parts at worst, nothing else
    cw = clean.open_writer(shard, SCHEMA)
    cw.compact()
    cw.collect_garbage()
    clean.gc_leaked(shard, older_than_s=0)
    state = clean.shard(shard).fetch()
    assert shard_blob_keys(clean, shard) <= state.part_keys() | {k for k, _ in state.garbage}
    snapshots_equal_model(clean, shard, model)
    versions = clean.consensus.scan(str(shard), 0, 10_000)
    assert versions[0].seqno > 1, "old versions were truncated"
    client.location.close()
    clean.location.close()
