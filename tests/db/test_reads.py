"""Reads fetch, check and decode parts in parallel (txns.db.scan) with exactly the results of one at a time.

The table here spans many small parts, has retractions (in later commits and,
after compaction, inside the same run as the rows they cancel), duplicates,
and a since in the middle of its history, so the reads at each retained
commit need the time filter on some parts and not on others.
"""

from __future__ import annotations

import datetime as dt
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

import txns
from persist import CorruptObject, InvalidUsage, PersistConfig
from txns.db import scan as scan_mod

SCHEMA = pa.schema([("k", pa.int64()), ("v", pa.string()), ("g", pa.int8())])


def rows_of(ks: Iterable[int]) -> pa.Table:
    ks = list(ks)
    return pa.table(
        {"k": pa.array(ks, pa.int64()), "v": [f"v{k % 37}" for k in ks], "g": pa.array([k % 5 for k in ks], pa.int8())},
        schema=SCHEMA,
    )


def multiset(t: pa.Table) -> Counter:
    return Counter(tuple(r.values()) for r in t.to_pylist())


def sequential(fn: Callable[[Any], Any], items: Iterable[Any], ahead: int, workers: int = 0) -> Iterator[Any]:
    for x in list(items):
        yield fn(x)


class FakeClock:
    def __init__(self) -> None:
        self.offset_ms = 0

    def __call__(self) -> int:
        return int(time.time() * 1000) + self.offset_ms


class Built:
    """A database whose table ``t`` has many parts, retractions, duplicates and a since mid-history."""

    def __init__(self, root: Path) -> None:
        self.clock = FakeClock()
        cfg = PersistConfig(part_target_bytes=16 << 10, part_grace_s=0, clock_ms=self.clock)
        self.db = txns.connect(f"file://{root}", config=cfg, max_clock_skew=None)  # (the fake clock is everyone's)
        self.db.create_table("t", SCHEMA, retention=dt.timedelta(hours=1))
        self.model: Counter = Counter()
        self.commits: list[tuple[int, Counter]] = []
        self.commit(insert=range(6000))
        self.commit(insert=range(6000, 6500), retract=range(100, 400))
        self.commit(insert=range(50))  # duplicates
        self.commit(insert=range(7000, 7100), retract=range(0, 25))  # one occurrence of each
        self.commit(retract=[*range(6000, 6100), *range(5000, 5010)])
        # now an hour and a half after the first commit: compaction merges what is older
        # than an hour at the since, the later commits keep their own times
        self.db.compact()
        self.db._settle()
        self.since = self.db.table("t").earliest()
        assert self.commits[1][0] < self.since <= self.commits[3][0]

    def commit(self, insert: Iterable[int] = (), retract: Iterable[int] = ()) -> None:
        with self.db.transaction() as t:
            ins, ret = rows_of(insert), rows_of(retract)
            if ret.num_rows:
                t.retract("t", ret)
            if ins.num_rows:
                t.insert("t", ins)
        self.model.update(multiset(ins))
        self.model.subtract(multiset(ret))
        self.model = +self.model
        self.commits.append((t.commit_info.ts, Counter(self.model)))  # type: ignore[union-attr]
        self.clock.offset_ms += 20 * 60 * 1000

    def retained(self) -> list[tuple[int, Counter]]:
        return [(ts, m) for ts, m in self.commits if ts >= self.since]


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Built]:
    b = Built(tmp_path_factory.mktemp("reads") / "db")
    yield b
    b.db.close()


QUERIES: list[tuple[list[str] | None, Any]] = [
    (None, None),
    (["g"], None),
    (["v", "g"], pc.field("k") < 3000),
    (None, pc.field("g") == 1),
]


def every_read(db: txns.Database, as_of: int) -> list[pa.Table]:
    """Each query at ``as_of``: to_arrow, then the streamed scan (forced past the in-memory path)."""
    out = []
    tbl = db.table("t")
    for cols, flt in QUERIES:
        out.append(tbl.to_arrow(as_of=as_of, columns=cols, filter=flt))
        plan = db.plan(db.entry("t", as_of), as_of)
        reader = scan_mod.PlanReader(db.client.blob, plan, cols or SCHEMA.names, flt, 30.0)
        out.append(pa.Table.from_batches(list(scan_mod.scan(reader, in_memory_bytes=0)), schema=reader.out_schema))
    return out


def test_the_table_spans_many_parts(built: Built) -> None:
    db = built.db
    plan = db.plan(db.entry("t", db.latest()), db.latest())
    assert sum(len(r.parts) for r in plan.runs) >= 8


def test_reads_match_the_model_at_every_retained_commit(built: Built) -> None:
    for ts, model in built.retained():
        full = built.db.table("t").to_arrow(as_of=ts)
        assert multiset(full) == model
        streamed, = every_read(built.db, ts)[1:2]
        assert multiset(streamed) == model
        for (cols, flt), got in zip(QUERIES, every_read(built.db, ts)[::2], strict=True):
            want = built.db.table("t").to_arrow(as_of=ts)  # (checked above) projected and filtered here
            if flt is not None:
                want = want.filter(flt)
            want = want.select(cols or SCHEMA.names)
            assert multiset(got) == multiset(want), (ts, cols, flt)


def test_parallel_reads_give_exactly_the_sequential_results(built: Built, monkeypatch: pytest.MonkeyPatch) -> None:
    db = built.db
    times = [ts for ts, _ in built.retained()]
    parallel = {ts: every_read(db, ts) for ts in times}
    changes = db.table("t").changes(built.since)
    monkeypatch.setattr(scan_mod, "ordered", sequential)
    for ts in times:
        for a, b in zip(parallel[ts], every_read(db, ts), strict=True):
            assert a.equals(b)  # same rows, same order, same schema
    assert changes.equals(db.table("t").changes(built.since))


def test_parts_are_read_at_once(built: Built, monkeypatch: pytest.MonkeyPatch) -> None:
    barrier = threading.Barrier(2, timeout=10)
    outcome: list[str] = []
    arrived = []
    lock = threading.Lock()
    orig = scan_mod.load_part

    def load_part(*args: Any) -> bytes:
        with lock:
            first_two = len(arrived) < 2
            arrived.append(1)
        if first_two:
            try:
                barrier.wait()
                outcome.append("together")
            except threading.BrokenBarrierError:
                outcome.append("alone")
        return orig(*args)

    monkeypatch.setattr(scan_mod, "load_part", load_part)
    assert multiset(built.db.table("t").to_arrow()) == built.commits[-1][1]
    assert outcome == ["together", "together"]


def test_a_corrupt_part_is_still_caught(tmp_path: Path) -> None:
    db = txns.connect(f"file://{tmp_path / 'db'}", config=PersistConfig(part_target_bytes=16 << 10))
    db.create_table("t", SCHEMA)
    with db.transaction() as t:
        t.insert("t", pa.RecordBatchReader.from_batches(SCHEMA, rows_of(range(5000)).to_batches(max_chunksize=500)))
    db._settle()
    plan = db.plan(db.entry("t", db.latest()), db.latest())
    refs = [p for r in plan.runs for p in r.parts]
    assert len(refs) >= 3
    path = tmp_path / "db" / "blob" / refs[len(refs) // 2].key
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(CorruptObject, match="CRC-32C"):
        db.table("t").to_arrow()
    with pytest.raises(CorruptObject, match="CRC-32C"):
        db.table("t").count()
    db.close()


@pytest.fixture
def inserted(db_url: str) -> Iterator[txns.Database]:
    """A table of many parts that was only ever inserted into (one run, no retraction)."""
    db = txns.connect(db_url, config=PersistConfig(part_target_bytes=16 << 10))
    db.create_table("t", SCHEMA)
    with db.transaction() as t:
        t.insert("t", pa.RecordBatchReader.from_batches(SCHEMA, rows_of(range(8000)).to_batches(max_chunksize=1000)))
    db._settle()
    yield db
    db.close()


def counting(monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    n = {"load": 0, "filtered": 0}
    orig_load, orig_read_table = scan_mod.load_part, pq.read_table

    def load_part(*args: Any) -> bytes:
        n["load"] += 1
        return orig_load(*args)

    def read_table(*args: Any, **kwargs: Any) -> pa.Table:
        n["filtered"] += 1
        return orig_read_table(*args, **kwargs)

    monkeypatch.setattr(scan_mod, "load_part", load_part)
    monkeypatch.setattr(pq, "read_table", read_table)
    return n


def test_a_scan_fetches_the_big_run_once_and_a_few_parts_again(
    inserted: txns.Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    db = inserted
    plan = db.plan(db.entry("t", db.latest()), db.latest())
    (run,) = plan.runs
    parts = len(run.parts)
    assert parts > scan_mod.SCAN_KEEP + scan_mod.SCAN_AHEAD + 2
    n = counting(monkeypatch)
    reader = scan_mod.PlanReader(db.client.blob, plan, SCHEMA.names, None, 30.0)
    it = scan_mod.scan(reader, in_memory_bytes=0)
    first = next(it)
    # pass 1 fetched every part (to find retractions: none); pass 2 has only just started
    assert n["load"] <= parts + scan_mod.SCAN_AHEAD + 1
    got = pa.Table.from_batches([first, *it])
    assert multiset(got) == multiset(rows_of(range(8000)))
    assert n["load"] == 2 * parts - scan_mod.SCAN_KEEP  # the first parts' checked bytes were kept
    assert n["filtered"] == 0  # no part needed a filtered decode: footers show no retraction, no later time


def test_a_plain_read_decodes_without_filters(inserted: txns.Database, monkeypatch: pytest.MonkeyPatch) -> None:
    db = inserted
    n = counting(monkeypatch)
    assert db.table("t").to_arrow().num_rows == 8000
    assert n["filtered"] == 0 and n["load"] > 1
    loads = n["load"]
    assert db.table("t").to_arrow(filter=pc.field("g") == 2).num_rows == 1600
    assert n["filtered"] == loads  # a user filter is pushed into every part's read


def test_an_abandoned_scan_reads_nothing_more(inserted: txns.Database, monkeypatch: pytest.MonkeyPatch) -> None:
    db = inserted
    plan = db.plan(db.entry("t", db.latest()), db.latest())
    parts = sum(len(r.parts) for r in plan.runs)
    live = {"now": 0, "started": 0}
    lock = threading.Lock()
    orig = scan_mod.load_part

    def load_part(*args: Any) -> bytes:
        with lock:
            live["now"] += 1
            live["started"] += 1
        try:
            time.sleep(0.01)
            return orig(*args)
        finally:
            with lock:
                live["now"] -= 1

    monkeypatch.setattr(scan_mod, "load_part", load_part)
    reader = scan_mod.PlanReader(db.client.blob, plan, SCHEMA.names, None, 30.0)
    it = scan_mod.scan(reader, in_memory_bytes=0)
    assert next(it).num_rows > 0
    it.close()  # (what dropping a RecordBatchReader over it does)
    started = live["started"]
    assert live["now"] == 0  # nothing of it still running
    time.sleep(0.2)
    assert live["started"] == started < 2 * parts  # and nothing started after


def test_ordered_keeps_order_and_bounds_what_is_ahead() -> None:
    live = {"now": 0, "max": 0}
    lock = threading.Lock()

    def work(i: int) -> int:
        with lock:
            live["now"] += 1
            live["max"] = max(live["max"], live["now"])
        time.sleep(0.002 * (i % 3))
        return i

    out = []
    for r in scan_mod.ordered(work, range(40), ahead=3):
        out.append(r)
        with lock:
            live["now"] -= 1  # the caller is done with it
    assert out == list(range(40))
    assert live["max"] <= 3 + 1  # the one the caller holds and three ahead
    assert list(scan_mod.ordered(lambda x: x * 2, [uuid.uuid4().int % 7], ahead=3))  # one item: no pool


def test_columns_may_be_any_iterable_of_names_read_once(tmp_path: Path) -> None:
    db = txns.connect(f"file://{tmp_path / 'db'}")
    db.create_table("t", SCHEMA)
    with db.transaction() as t:
        t.insert("t", rows_of(range(5)))
    tbl = db.table("t")
    got = tbl.to_arrow(columns=(c for c in ["v", "k"]))  # a generator: consumed once, not twice
    assert got.column_names == ["v", "k"] and sorted(got.column("k").to_pylist()) == [0, 1, 2, 3, 4]
    for bad in ("k", 5, ["k", 1]):
        with pytest.raises(InvalidUsage, match="columns must be a list of column names"):
            tbl.to_arrow(columns=bad)
    db.close()


def test_footer_stats_use_the_implied_constants_of_a_part_without_ts_or_diff() -> None:
    """A part that leaves out ``ts`` and ``diff`` (Spark's native writes) has footer stats (ts 0, diff +1)."""
    import io

    from persist.manifest import IMPLIED_COLUMNS
    from txns.db.scan import footer_stats

    def meta(t: pa.Table) -> pq.FileMetaData:
        buf = io.BytesIO()
        pq.write_table(t, buf)
        return pq.read_metadata(io.BytesIO(buf.getvalue()))

    kv = pa.table({"k": pa.array([3, 1, 2], pa.int64())})
    assert footer_stats(meta(kv)) == (0, 1, 1)
    assert footer_stats(meta(kv.append_column("diff", pa.array([2, -1, 1], pa.int64())))) == (0, -1, 2)
    full = kv.append_column("ts", pa.array([5, 0, 4], pa.uint64())).append_column("diff", pa.array([1, 1, 1]))
    assert footer_stats(meta(full)) == (5, 1, 1)
    assert set(IMPLIED_COLUMNS) == {"ts", "diff"}
