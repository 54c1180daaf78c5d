"""``db.compact()`` and ``txns gc`` under storage faults on every operation, on file:// and on moto S3.

A database with a few tables takes commits (inserts, retractions, a drop
and a rename) in two phases an hour or more apart on the database's own
(fake) clock; then the clock moves so that the retention (one hour) falls
between the phases, and compaction really forgets the first phase's history.
Compaction and garbage collection (:func:`txns.admin.collect_garbage`, what
``txns gc`` runs) then run while storage faults hit every operation, deletes,
listings and truncations included:

- on file://, through :mod:`persist.unreliable`'s wrappers around the file
  store (registered under a ``mem://`` name, so ``txns.connect`` opens it);
- on S3, through :class:`persist.fault_proxy.FaultProxy` in front of moto
  (dropped requests, lost replies, 503s, truncated replies).

Each faulted call either returns or raises a library error
(:class:`persist.ExternalError`: ``Determinate`` or ``Indeterminate``); it is
retried until it returns, as a user would. The bar, against a model built
from what the test committed (table -> multiset of rows after each commit):

- every table read latest equals the model, through the faulted handle and
  through a fresh connection without faults;
- every read as of a commit at or after a table's since equals the model
  at that time; a read below it raises ``ReadBelowSince`` (never wrong rows);
- ``db.history()`` lists every commit exactly once (nothing lost or doubled);
- compaction acted: retired parts were deleted, consensus versions
  truncated, and the stored rows fell.

Seeds: three on file:// and one on S3 by default (about 30 s in all);
``HYPOTHESIS_PROFILE=slow`` (twelve) or ``COMPACT_FAULT_SEEDS=N`` runs more.
"""

from __future__ import annotations

import datetime as dt
import os
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

import txns
from persist import ExternalError, PartRetired, PersistConfig, ReadBelowSince, metrics
from persist.fault_proxy import FaultPlan, FaultProxy
from persist.mem import _STORES
from persist.unreliable import Fault, Faults, Op, UnreliableBlob, UnreliableConsensus
from persist.url import open_location
from persist.write import WriteHandle
from txns.admin import collect_garbage
from txns.db import clock

RETENTION = dt.timedelta(hours=1)
HOUR_MS = 3600 * 1000
SCHEMA = pa.schema([("k", pa.int64()), ("v", pa.string())])
_DEFAULT_SEEDS = 3
_N_SEEDS = int(
    os.environ.get("COMPACT_FAULT_SEEDS") or (12 if os.environ.get("HYPOTHESIS_PROFILE") == "slow" else _DEFAULT_SEEDS)
)
SEEDS = list(range(1, _N_SEEDS + 1))
S3_SEEDS = SEEDS if _N_SEEDS > _DEFAULT_SEEDS else SEEDS[:1]  # (S3 through the proxy takes ~20 s a seed)
ALL_OPS = list(Op)  # every storage operation, deletes, listings and truncations included
TRIES = 300

Row = tuple[int, str]
Model = dict[str, Counter[Row]]


class FakeClock:
    """Real time plus an offset the test moves forward (the database's and the storage's time at once)."""

    def __init__(self) -> None:
        self.offset_ms = 0

    def __call__(self) -> int:
        return int(time.time() * 1000) + self.offset_ms


def _config(fake: FakeClock) -> PersistConfig:
    return PersistConfig(
        part_grace_s=0,  # retired parts deletable at once
        consensus_retention_s=0,  # old consensus versions truncatable at once
        inline_max_bytes=256,  # most commits write a Parquet part
        retry_deadline_s=0.0,  # every fault reaches the caller, who retries
        clock_ms=fake,
    )


def _until_done(fn: Callable[[], Any], failures: list[str]) -> Any:
    """Call ``fn`` until it returns, as a user would; any error but a storage one fails the test."""
    for _ in range(TRIES):
        try:
            return fn()
        except ExternalError as e:
            failures.append(type(e).__name__)
    raise AssertionError(f"failed {TRIES} times in a row: {failures[-5:]}")


def _rows(db: txns.Database, name: str, as_of: int | None = None) -> Counter[Row]:
    t = db.table(name).to_arrow() if as_of is None else db.table(name).to_arrow(as_of=as_of)
    return Counter((r["k"], r["v"]) for r in t.to_pylist())


class Workload:
    """Commits to ``db`` and keeps the model: the tables' contents after each commit, by commit timestamp."""

    def __init__(self, db: txns.Database, seed: int) -> None:
        self.db = db
        self.seed = seed
        self.current: Model = {}
        self.at: dict[int, Model] = {}
        self.next_k = 0
        self.written: Counter[str] = Counter()  # updates (inserts and retractions) written, by table

    def _record(self, ts: int) -> None:
        assert ts not in self.at
        self.at[ts] = {n: Counter(c) for n, c in self.current.items()}

    def create(self, name: str) -> None:
        self.db.create_table(name, SCHEMA)
        self.current[name] = Counter()
        self._record(self.db.latest())

    def write(self, inserts: dict[str, int], retract: dict[str, int]) -> None:
        """Insert ``n`` fresh rows into each table of ``inserts``; retract the ``n`` oldest of ``retract``'s."""
        with self.db.transaction() as t:
            for name, n in retract.items():
                gone = sorted(self.current[name].elements())[:n]
                if gone:
                    t.retract(name, [{"k": k, "v": v} for k, v in gone])
                    self.current[name] -= Counter(gone)
                    self.written[name] += len(gone)
            for name, n in inserts.items():
                new = [(self.next_k + i, f"s{self.seed}-{name}-{'x' * (i % 7)}") for i in range(n)]
                self.next_k += n
                t.insert(name, [{"k": k, "v": v} for k, v in new])
                self.current[name] += Counter(new)
                self.written[name] += n
        assert t.commit_info is not None and t.commit_info.ts is not None, "every write commits something"
        self._record(t.commit_info.ts)

    def drop(self, name: str) -> None:
        self.db.drop_table(name)
        del self.current[name]
        self._record(self.db.latest())

    def rename(self, old: str, new: str) -> None:
        self.db.rename_table(old, new)
        self.current[new] = self.current.pop(old)
        self.written[new] = self.written.pop(old)
        self._record(self.db.latest())

    def phase(self, rounds: int) -> None:
        names = sorted(self.current)
        for i in range(rounds):
            ins = {n: 3 + (self.seed + i + j) % 5 for j, n in enumerate(names)}
            ret = {n: (i + j) % 3 for j, n in enumerate(names) if i > 0}
            self.write(ins, ret)


def _stored(db: txns.Database, name: str) -> dict[str, Any]:
    db._settle()
    out: dict[str, Any] = db.client.inspect(db.entry(name, db.latest()).data_id)
    return out


def _check_against_model(db: txns.Database, w: Workload, since: dict[str, int], who: str) -> None:
    for name, rows in w.current.items():
        assert _rows(db, name) == rows, f"{who}: latest {name}"
    names = sorted(w.current)
    below = 0
    for ts, model in sorted(w.at.items()):
        for name in names:
            if ts < since[name]:
                with pytest.raises(ReadBelowSince):
                    _rows(db, name, ts)
                below += 1
            elif name in model:
                assert _rows(db, name, ts) == model[name], f"{who}: {name} as of {ts}"
    assert below > 0, "some reads fell below the since"
    hist = db.history().column("ts").to_pylist()
    assert len(hist) == len(set(hist)), f"{who}: a commit listed twice"
    assert set(w.at) <= set(hist), f"{who}: commits lost from the history"


def _run(
    url: str, fresh_url: str, seed: int, fault_on: Callable[[], None], fault_off: Callable[[], None]
) -> dict[str, int]:
    fake = FakeClock()
    db = txns.connect(url, retention=RETENTION, config=_config(fake), max_clock_skew=None)
    w = Workload(db, seed)
    for name in ("a", "b", "c"):
        w.create(name)
    w.phase(4)
    w.drop("c")
    w.rename("b", "b2")
    w.phase(2)
    old_last = max(w.at)
    fake.offset_ms += 2 * HOUR_MS  # the second phase, two hours later
    w.create("d")
    w.phase(5)
    new_first = min(ts for ts in w.at if ts > old_last)
    # half an hour on: the retention (an hour) reaches back past the first phase, not into the second
    fake.offset_ms = clock.wall_ms(new_first) - int(time.time() * 1000) + HOUR_MS // 2
    counts = metrics.snapshot()

    failures: list[str] = []
    fault_on()
    try:
        _until_done(db.compact, failures)
        _until_done(lambda: collect_garbage(db.client, db.root.txns_id, older_than_s=0), failures)
        _until_done(db.compact, failures)  # a second round after the faults: nothing left half done
    finally:
        fault_off()
    done = {k: metrics.snapshot()[k] - counts[k] for k in counts}
    after = {n: _stored(db, n) for n in w.current}
    assert done[metrics.PARTS_DELETED] > 0 and done[metrics.VERSIONS_TRUNCATED] > 0, f"compaction idle: {done}"
    for n in ("a", "b2"):  # the first phase's inserts and retractions of the same rows consolidated away
        assert after[n]["rows"] < w.written[n], (n, after[n], w.written[n])
    since = {n: a["since"] for n, a in after.items()}
    for n in ("a", "b2"):
        assert old_last < since[n] <= new_first, f"{n}: the since lies between the phases"

    _check_against_model(db, w, since, "faulted handle")
    db.close()
    fresh = txns.connect(fresh_url, create=False, config=_config(fake), max_clock_skew=None)
    try:
        assert sorted(fresh.tables()) == sorted(w.current)
        _check_against_model(fresh, w, since, "fresh connection")
    finally:
        fresh.close()
    return {"failures": len(failures), **done}


def _fault_file(faults: Faults) -> None:
    # random faults on every operation (low: compaction makes hundreds of calls, each retry starts over) ...
    faults.set_rates(determinate=0.02, indeterminate=0.01, after=0.02, ops=ALL_OPS)
    # ... and, so that each kind is met whatever the seed, the first deletes, truncation and listing fail
    # (a delete or truncation that happened, then reported a timeout; a listing that failed)
    faults.fail_next(Op.BLOB_DELETE, Fault.AFTER)
    faults.fail_next(Op.BLOB_DELETE, Fault.INDETERMINATE)
    faults.fail_next(Op.TRUNCATE, Fault.AFTER)
    faults.fail_next(Op.TRUNCATE, Fault.DETERMINATE)
    faults.fail_next(Op.BLOB_LIST_KEYS, Fault.DETERMINATE)


@pytest.mark.timeout(240)
@pytest.mark.parametrize("seed", SEEDS)
def test_compact_and_gc_under_faults_on_file(tmp_path: Path, seed: int) -> None:
    file_url = f"file://{tmp_path / 'store'}"
    inner = open_location(file_url)
    faults = Faults(seed=seed)
    name = f"compact-faults-{uuid.uuid4().hex}"
    _STORES[name] = (UnreliableBlob(inner.blob, faults), UnreliableConsensus(inner.consensus, faults))  # type: ignore[assignment]
    try:
        got = _run(
            f"mem://{name}",
            file_url,
            seed,
            lambda: _fault_file(faults),
            faults.clear,
        )
    finally:
        _STORES.pop(name, None)
    injected = {op.value: faults.counters[op].injected for op in ALL_OPS}
    for op in (Op.BLOB_DELETE, Op.BLOB_LIST_KEYS, Op.TRUNCATE):
        assert injected[op.value] >= 2 if op is not Op.BLOB_LIST_KEYS else 1, f"{op.value}: {injected}"
    assert sum(injected.values()) > 5, injected
    assert got["failures"] > 0, got


@pytest.fixture
def proxy(moto_endpoint: str, request: pytest.FixtureRequest) -> Iterator[FaultProxy]:
    plan = FaultPlan(drop_before=0.04, drop_reply=0.04, error_503=0.04, truncate=0.04)
    with FaultProxy(moto_endpoint, seed=request.node.callspec.params["seed"], faults=plan) as p:
        p.set_enabled(False)
        yield p


@pytest.mark.s3
@pytest.mark.timeout(240)
@pytest.mark.parametrize("seed", S3_SEEDS)
def test_compact_and_gc_under_faults_on_s3(
    proxy: FaultProxy, moto_endpoint: str, s3_bucket_factory: Callable[..., str], seed: int
) -> None:
    bucket = s3_bucket_factory("compactfaults")
    faulted = f"s3://{bucket}/db?endpoint_url={proxy.url}&region=us-east-1"
    direct = f"s3://{bucket}/db?endpoint_url={moto_endpoint}&region=us-east-1"
    _run(faulted, direct, seed, lambda: proxy.set_enabled(True), lambda: proxy.set_enabled(False))
    c = proxy.counters()
    hit = sum(c.get(k, 0) for k in ("drop_before", "drop_reply", "error_503", "truncate"))
    assert hit > 0, c


def test_compact_plans_again_when_another_compaction_retired_a_part_first(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``db.compact`` meets ``PartRetired`` when the background worker's compaction of the same shard went
    first (seen under faults on S3): a stale plan, not a failure; it plans again."""
    db = txns.connect(f"file://{tmp_path}/db")
    db.create_table("t", pa.schema([("k", pa.int64())]))
    for i in range(3):
        with db.transaction() as t:
            t.insert("t", [{"k": i}])
    real = WriteHandle._merge
    calls: list[str] = []

    def raced(self: WriteHandle, inputs: Any, since: int) -> Any:
        if threading.current_thread() is not threading.main_thread():  # (the background worker's own)
            return real(self, inputs, since)
        calls.append(str(self.shard_id))
        if len(calls) == 1:
            raise PartRetired(f"part x of shard {self.shard_id} was retired by compaction", "x")
        return real(self, inputs, since)

    monkeypatch.setattr(WriteHandle, "_merge", raced)
    report = db.compact(tables=["t"])
    assert len(calls) == 2 and report["t"]["after"]["batches"] <= 1
    assert sorted(r["k"] for r in db.table("t").to_arrow().to_pylist()) == [0, 1, 2]
    db.close()
