"""Key bounds of parts (``PartRef.lo``/``hi``) and keyed point reads that skip parts by them.

persist: bounds of the part's first column (the shard's first key field) are
computed by ``write_part`` for int, string and temporal columns, absent for
other types, nulls and long strings (a long minimum keeps a prefix), survive
a JSON round trip (an old descriptor without them decodes with none: never
pruned) and compaction (merged parts get their own). txns.db: a ``get`` on a
keyed table whose data is in many parts fetches only the part that may hold
the key, with the same results as a full read.
"""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

import txns
from persist import Batch, BatchBuilder, PersistConfig, Schema
from persist._internal.merge import merge_batches
from persist._internal.parts import (
    BOUND_MAX_BYTES,
    PartRef,
    Run,
    bound_value,
    bound_values,
    decode_part,
    first_column_bounds,
    prune_runs,
    sort_updates,
    write_part,
)
from persist._internal.state import HollowBatch
from persist.mem import MemBlob
from txns.db import keyed
from txns.db.keyed import committed_rows


def part_table(values: list[Any], typ: pa.DataType, val: list[Any] | None = None) -> pa.Table:
    n = len(values)
    return pa.table(
        {
            "k": pa.array(values, typ),
            "v": pa.array(val if val is not None else list(range(n)), pa.int64()),
            "ts": pa.array([0] * n, pa.uint64()),
            "diff": pa.array([1] * n, pa.int64()),
        }
    )


def written(values: list[Any], typ: pa.DataType) -> PartRef:
    t = sort_updates(part_table(values, typ))
    return write_part(MemBlob(), "s" + "0" * 32, t)


# ---- persist: computing bounds ------------------------------------------------------------------


def test_int_and_string_bounds() -> None:
    ref = written([5, -3, 12, 7], pa.int64())
    assert (ref.lo, ref.hi) == (-3, 12)
    ref = written([2**64 - 1, 0], pa.uint64())
    assert (ref.lo, ref.hi) == (0, 2**64 - 1)
    ref = written(["pear", "apple", "zoé", "Zed"], pa.string())
    assert (ref.lo, ref.hi) == ("Zed", "zoé")
    ref = written(["b", "a"], pa.large_string())
    assert (ref.lo, ref.hi) == ("a", "b")


def test_temporal_bounds_are_the_stored_ints() -> None:
    ref = written([dt.date(2024, 5, 1), dt.date(2023, 1, 2)], pa.date32())
    assert (ref.lo, ref.hi) == (
        (dt.date(2023, 1, 2) - dt.date(1970, 1, 1)).days,
        (dt.date(2024, 5, 1) - dt.date(1970, 1, 1)).days,
    )
    typ = pa.timestamp("us", tz="UTC")
    a, b = dt.datetime(2020, 1, 1, tzinfo=dt.UTC), dt.datetime(2021, 6, 1, 12, tzinfo=dt.UTC)
    ref = written([b, a], typ)
    assert (ref.lo, ref.hi) == (bound_value(pa.scalar(a, typ)), bound_value(pa.scalar(b, typ)))
    assert ref.may_contain_first_key(bound_value(pa.scalar(dt.datetime(2020, 7, 1, tzinfo=dt.UTC), typ)))
    assert not ref.may_contain_first_key(bound_value(pa.scalar(dt.datetime(2022, 1, 1, tzinfo=dt.UTC), typ)))


@pytest.mark.parametrize(
    "values,typ",
    [
        ([1.5, 2.5], pa.float64()),
        ([b"a", b"b"], pa.binary()),
        ([True, False], pa.bool_()),
        ([1, None, 3], pa.int64()),  # a null: no bounds
        (["a", None], pa.string()),
    ],
)
def test_no_bounds_for_other_types_and_nulls(values: list[Any], typ: pa.DataType) -> None:
    ref = written(values, typ)
    assert (ref.lo, ref.hi) == (None, None)
    assert ref.to_json() == [ref.key, ref.rows, ref.size, ref.crc]  # nothing added to the state
    assert ref.may_contain_first_key(bound_value(pa.scalar(values[0], typ)))


def test_long_strings_keep_a_lower_prefix_and_no_upper() -> None:
    long_lo = "a" + "é" * 100  # 201 bytes
    ref = written([long_lo, "b"], pa.string())
    assert ref.hi == "b"
    assert isinstance(ref.lo, str) and len(ref.lo.encode()) <= BOUND_MAX_BYTES and long_lo.startswith(ref.lo)
    assert ref.lo.encode() == b"a" + "é".encode() * 31  # cut at a character boundary
    assert ref.may_contain_first_key(long_lo) and ref.may_contain_first_key("b")
    assert not ref.may_contain_first_key("a") and not ref.may_contain_first_key("c")
    long_hi = "z" * (BOUND_MAX_BYTES + 1)
    ref = written(["m", long_hi], pa.string())
    assert (ref.lo, ref.hi) == ("m", None)
    assert ref.may_contain_first_key(long_hi) and ref.may_contain_first_key(
        "zzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzz"
    )
    assert not ref.may_contain_first_key("l")
    exact = "x" * BOUND_MAX_BYTES
    ref = written([exact], pa.string())
    assert (ref.lo, ref.hi) == (exact, exact)


def test_bounds_match_the_rows_written() -> None:
    blob = MemBlob()
    t = sort_updates(part_table([9, 1, 4, 4, 7], pa.int32()))
    ref = write_part(blob, "s" + "0" * 32, t)
    back = decode_part(ref, blob.get(ref.key), t.schema)
    assert (ref.lo, ref.hi) == (min(back.column("k").to_pylist()), max(back.column("k").to_pylist()))
    assert first_column_bounds(t.slice(0, 0)) == (None, None)


# ---- persist: the descriptor's JSON -------------------------------------------------------------


def test_json_round_trip_and_old_descriptors() -> None:
    for ref in (
        PartRef("p", 3, 100, 7, -5, 9),
        PartRef("p", 3, 100, 7, "a", "zz"),
        PartRef("p", 3, 100, 7, "a", None),
        PartRef("p", 3, 100, 7, None, 2**64 - 1),
        PartRef("p", 3, 100, 7),
    ):
        j = json.loads(json.dumps(ref.to_json()))
        assert PartRef.from_json(j) == ref
    assert PartRef("p", 3, 100, 7, 1, 2).to_json() == ["p", 3, 100, 7, 1, 2]
    old = PartRef.from_json(["p", 3, 100, 7])  # written before bounds existed
    assert (old.lo, old.hi) == (None, None)
    assert old.may_contain_first_key(5) and old.may_contain_first_key("x")
    # a whole batch of an old state decodes, and is never pruned
    hb = HollowBatch.from_json(
        {"id": "b", "lower": 0, "upper": 1, "since": 0, "runs": [{"rows": 3, "parts": [["p", 3, 100, 7]]}]}
    )
    assert prune_runs(hb.runs, [42]) == hb.runs
    new = HollowBatch("b", 0, 1, 0, (Run(parts=(PartRef("p", 3, 100, 7, "a", "c"),), rows=3),))
    assert HollowBatch.from_json(json.loads(json.dumps(new.to_json()))) == new


def test_batch_bytes_keep_bounds() -> None:
    schema = Schema(key=pa.schema([("k", pa.int64())]), val=pa.schema([("v", pa.int64())]))
    cfg = PersistConfig(part_target_bytes=256, inline_max_bytes=0)
    b = BatchBuilder(MemBlob(), "s" + "1" * 32, schema, 0, 1, cfg, inline_max_bytes=0)
    for lo in range(0, 100, 25):
        b.add_table(part_table(list(range(lo, lo + 25)), pa.int64()))
    batch = b.finish()
    assert len(batch.parts) > 1
    assert all(p.lo is not None and p.hi is not None for p in batch.parts)
    assert Batch.from_bytes(batch.to_bytes()).parts == batch.parts


# ---- persist: pruning ---------------------------------------------------------------------------


def test_may_contain_and_prune_runs() -> None:
    a, b, c = PartRef("a", 2, 10, 0, 0, 9), PartRef("b", 2, 10, 0, 10, 19), PartRef("c", 2, 10, 0)
    assert a.may_contain_first_key(0) and a.may_contain_first_key(9) and not a.may_contain_first_key(10)
    assert a.may_contain_first_key(None) and a.may_contain_first_key("x")  # unknown / another kind: kept
    runs = (Run(parts=(a, b), rows=4), Run(parts=(c,), inline=b"rows", rows=5, ts_rewrite=3))
    assert prune_runs(runs, [9]) == (Run(parts=(a,), rows=2), Run(parts=(c,), inline=b"rows", rows=5, ts_rewrite=3))
    assert prune_runs(runs, [10, 11]) == (Run(parts=(b,), rows=2), runs[1])
    assert prune_runs(runs, [-1, 20]) == (runs[1],)  # no part of the first run may hold them: dropped
    assert prune_runs(runs, [5, 15]) == runs
    assert prune_runs(runs, [5, None]) == runs  # a value without a bound: nothing pruned
    assert prune_runs(runs, ["x"]) == runs  # not comparable: nothing pruned
    only_inline = (Run(parts=(a,), inline=b"rows", rows=3),)
    assert prune_runs(only_inline, [50]) == (Run(inline=b"rows", rows=1),)


def test_compaction_gives_merged_parts_their_own_bounds() -> None:
    schema = Schema(key=pa.schema([("k", pa.string())]), val=pa.schema([("v", pa.int64())]))
    blob, sid = MemBlob(), "s" + "2" * 32
    cfg = PersistConfig(part_target_bytes=400, inline_max_bytes=0)
    batches = []
    for lower, keys in enumerate([[f"k{i:03d}" for i in range(0, 60, 2)], [f"k{i:03d}" for i in range(1, 60, 2)]]):
        bb = BatchBuilder(blob, sid, schema, lower, lower + 1, cfg, inline_max_bytes=0)
        t = part_table(keys, pa.string())
        bb.add_table(t.set_column(2, "ts", pa.array([lower] * t.num_rows, pa.uint64())))
        batch = bb.finish()
        batches.append(HollowBatch(batch.id, batch.lower, batch.upper, 0, batch.runs))
    # the inputs' parts interleave: each spans (nearly) the whole key range
    assert batches[0].runs[0].parts[0].lo == "k000" and batches[1].runs[0].parts[0].lo == "k001"
    merged = merge_batches(blob, sid, schema.arrow, batches, 2, cfg, inline_max_bytes=0)
    parts = [p for r in merged.runs for p in r.parts]
    assert len(parts) > 2
    seen = []
    for p in parts:
        keys = decode_part(p, blob.get(p.key), schema.arrow).column("k").to_pylist()
        assert (p.lo, p.hi) == (min(keys), max(keys))
        seen += keys
    assert seen == [f"k{i:03d}" for i in range(60)]
    # after the merge, a key is in exactly one part
    assert [p.key for p in parts if p.may_contain_first_key("k031")] == [
        p.key for p in parts if "k031" in (p.lo, p.hi) or p.lo < "k031" < p.hi
    ]  # type: ignore[operator]
    assert len(prune_runs(merged.runs, ["k031"])[0].parts) == 1


def test_spark_part_rows_carry_bounds(tmp_path: Path) -> None:
    """The rows Spark tasks return (no Spark needed: the task function itself) keep the bounds."""
    from txns.spark.write import part_refs, write_tables

    schema = Schema(key=pa.schema([("k", pa.string())]), val=pa.schema([("v", pa.int64())]))
    tables = [part_table([f"k{i:03d}" for i in range(a, a + 50)], pa.string()) for a in (0, 50, 100)]
    out = write_tables(f"file://{tmp_path}", "s" + "3" * 32, schema.to_text(), 600, iter(tables))
    rows = pa.Table.from_batches(list(out)).to_pylist()
    refs = part_refs(rows)
    assert sorted((p.lo, p.hi) for p in refs) == [("k000", "k049"), ("k050", "k099"), ("k100", "k149")]
    assert part_refs([{**rows[0], "bounds": None}])[0].lo is None  # a part without bounds


# ---- txns.db: point reads fetch only the parts that may hold the keys --------------------------


SCHEMA = pa.schema([("note", pa.string()), ("id", pa.int64()), ("region", pa.string())])
RANGES = [range(a, a + 40) for a in range(0, 480, 40) if a != 200]  # 11 parts, a gap at 200..239


def row(i: int) -> dict[str, Any]:
    return {"note": f"n{i}", "id": i, "region": "eu" if i % 2 else "us"}


class GetCounter:
    """Counts the blob gets of one shard's parts (wraps the location's blob); logs every get."""

    def __init__(self, blob: Any) -> None:
        self.inner, self.prefix = blob.get, None
        self.parts, self.all = 0, 0

    def __call__(self, key: str) -> bytes | None:
        self.all += 1
        if self.prefix is not None and key.startswith(self.prefix):
            self.parts += 1
        return self.inner(key)


@pytest.fixture
def many_parts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[txns.Database, GetCounter]:
    # (no part cache: every part a get needs is fetched, so the fetches say what it needed)
    monkeypatch.setattr(keyed, "PART_CACHE", None)
    cfg = PersistConfig(part_target_bytes=1024, inline_max_bytes=0, compaction_enabled=False)
    db = txns.connect(f"file://{tmp_path / 'db'}", config=cfg)
    db.create_table("items", SCHEMA, primary_key=["id", "region"])
    for r in RANGES:  # sorted, disjoint key ranges: parts with disjoint bounds
        with db.transaction() as t:
            t.insert("items", [row(i) for i in r])
    counter = GetCounter(db.client.blob)
    counter.prefix = f"{db.entry('items', db.latest()).data_id}/parts/"
    monkeypatch.setattr(db.client.blob, "get", counter)
    return db, counter


def test_get_fetches_only_the_part_that_may_hold_the_key(many_parts: tuple[txns.Database, GetCounter]) -> None:
    db, counter = many_parts
    e = db.entry("items", db.latest())
    plan = db.plan(e, db.latest())
    parts = [p for r in plan.runs for p in r.parts]
    assert len(parts) >= 10 and all(isinstance(p.lo, int) and isinstance(p.hi, int) for p in parts)
    assert not any(r.inline for r in plan.runs)
    full = {(r["id"], r["region"]): r for r in db.table("items").to_arrow().to_pylist()}
    assert len(full) == sum(len(r) for r in RANGES)
    counter.parts = 0

    def region(i: int) -> str:
        return "eu" if i % 2 else "us"

    # keys at every part's boundaries, keys inside, keys absent (gaps, below, above, wrong region)
    probes = sorted({p.lo for p in parts} | {p.hi for p in parts} | {50, 150, 210, 239, 479, -1, 480, 1000})  # type: ignore[arg-type]
    for i in probes:
        for reg in {region(i), "xx"}:
            with db.transaction() as t:
                before = counter.parts
                got = t.get("items", (i, reg))
                fetched = counter.parts - before
            assert got == full.get((i, reg)), (i, reg)
            holding = [p for p in parts if p.lo <= i <= p.hi]  # type: ignore[operator]
            assert fetched == len(holding) <= 1, (i, fetched)
    # many keys in one read: only the parts that may hold one of them
    keys = [(5, "eu"), (5, "us"), (455, "eu"), (220, "us"), (1000, "us")]
    counter.parts = 0
    found = committed_rows(db.planner, e, db.latest(), keys)
    assert {k: v[0] if v else None for k, v in found.items()} == {k: full.get(k) for k in keys}
    assert counter.parts == 2
    counter.parts = 0
    with db.transaction() as t:
        assert t.read("items").num_rows == len(full)  # a scan still reads every part
    assert counter.parts == len(parts)


def test_keyed_writes_and_validation_still_right(many_parts: tuple[txns.Database, GetCounter]) -> None:
    db, counter = many_parts
    with db.transaction() as t:
        t.upsert("items", [{"note": "new", "id": 150, "region": "us"}, {"note": "new", "id": 210, "region": "us"}])
        t.delete("items", [(0, "us"), (399, "eu")])
    rows = {(r["id"], r["region"]): r for r in db.table("items").to_arrow().to_pylist()}
    assert rows[(150, "us")]["note"] == "new" and rows[(210, "us")]["note"] == "new"
    assert (0, "us") not in rows and (399, "eu") not in rows
    # a read-then-write that loses a race on a key it read is refused; on another key it commits
    t1 = db.transaction()
    assert t1.get("items", (150, "us"))["note"] == "new"
    t1.upsert("items", [{"note": "t1", "id": 151, "region": "eu"}])
    with db.transaction() as t2:
        t2.upsert("items", [{"note": "t2", "id": 350, "region": "us"}])  # another key, another part
    parts = [p for r in db.plan(db.entry("items", db.latest()), db.latest()).runs for p in r.parts]
    holding = [p for p in parts if p.lo <= 151 and p.hi >= 150]  # type: ignore[operator]
    counter.parts = 0
    t1.commit()  # validation reads changes of the keys it read (150, 151): only the parts that may hold them
    assert counter.parts == len(holding) < len(parts)
    with db.transaction() as t3:
        assert t3.get("items", (151, "eu"))["note"] == "t1"
        assert t3.get("items", (350, "us"))["note"] == "t2"
    t4 = db.transaction()
    t4.get("items", (351, "eu"))
    t4.upsert("items", [{"note": "t4", "id": 0, "region": "us"}])
    with db.transaction() as t5:
        t5.upsert("items", [{"note": "t5", "id": 351, "region": "eu"}])
    with pytest.raises(txns.TransactionConflict):
        t4.commit()


def test_point_reads_reuse_small_parts_from_the_cache() -> None:
    from persist._internal.parts import PartRef
    from txns.db.scan import PartCache

    cache = PartCache(max_bytes=10, item_max_bytes=6)
    a, b, c = (PartRef(k, 1, 5, 1) for k in "abc")
    cache.put(a, b"aaaaa")
    cache.put(b, b"bbbbb")
    assert cache.get(a) == b"aaaaa"  # a is now the most recently used
    cache.put(c, b"ccccc")  # over 10 bytes: the least recently used (b) goes
    assert cache.get(b) is None and cache.get(a) == b"aaaaa" and cache.get(c) == b"ccccc"
    cache.put(PartRef("big", 1, 7, 1), b"1234567")  # bigger than an item may be: not kept
    assert cache.get(PartRef("big", 1, 7, 1)) is None
    assert cache.get(PartRef("a", 1, 5, 2)) is None  # another CRC is another part


def test_repeated_point_reads_come_from_the_part_cache(
    many_parts: tuple[txns.Database, GetCounter], monkeypatch: pytest.MonkeyPatch
) -> None:
    from txns.db.scan import PartCache

    db, counter = many_parts
    cache = PartCache()
    monkeypatch.setattr(keyed, "PART_CACHE", cache)
    counter.parts = 0
    for _ in range(3):
        with db.transaction() as t:  # a new transaction each time: its own key cache starts empty
            assert t.get("items", (155, "eu")) is not None
    assert counter.parts == 1 and cache.hits == 2  # the part was fetched once, then served from the cache
    # a scan does not use (nor fill) it
    hits = cache.hits
    db.table("items").to_arrow()
    assert cache.hits == hits


@pytest.mark.parametrize(
    ("values", "t"),
    [
        ([3, -1, None], pa.int64()),
        (["b", "a", None], pa.string()),
        (["x"], pa.large_string()),
        ([dt.date(2026, 1, 2), None], pa.date32()),
        ([1.5], pa.float64()),
    ],
)
def test_bound_values_are_bound_value_of_each(values: list[object], t: pa.DataType) -> None:
    assert bound_values(values, t) == [bound_value(pa.scalar(v, t)) for v in values]
