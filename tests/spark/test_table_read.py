"""Spark reads of tables by name (``spark.read.format("txns").load(name)``), streams by name, and SQL views.

The reference is the Python API: ``db.table(name).to_arrow(as_of=...)``,
``.changes(start, end)`` and filtered reads, compared as multisets. The
tables are built with retractions spread over several transactions and
parts (small ``part_target_bytes``, no inline rows, no compaction), so rows
and their retractions sit in different parts and runs.
"""

from __future__ import annotations

import datetime as dt
import itertools
import json
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc
import pytest

import txns
from persist import InvalidUsage, PersistConfig
from txns.db.transaction import CommitInfo
from txns.spark.table_read import (
    KeyRange,
    TableOptions,
    key_ranges,
    parse_time,
    plan_table_tasks,
)
from txns.spark.tables import read_table, register_tables

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

pytestmark = pytest.mark.spark

ACCOUNTS = pa.schema([("id", pa.int64()), ("name", pa.string()), ("balance", pa.int64())])
PUSHDOWN_CONF = "spark.sql.python.filterPushdown.enabled"
SMALL_PARTS = PersistConfig(compaction_enabled=False, inline_max_bytes=0, part_target_bytes=512)


def test_register_turns_on_the_filter_pushdown_reads_by_name_need(spark: SparkSession) -> None:
    """Spark refuses a reader with pushFilters unless this is on: ``txns.spark.register`` (the fixture's) sets it."""
    assert spark.conf.get(PUSHDOWN_CONF) == "true"


def acct(lo: int, hi: int, tag: str = "a") -> list[dict[str, Any]]:
    return [{"id": i, "name": f"{tag}{i % 13}", "balance": i * 10} for i in range(lo, hi)]


def bag(rows: list[dict[str, Any]]) -> Counter[str]:
    return Counter(json.dumps(r, sort_keys=True, default=str) for r in rows)


def spark_rows(df: DataFrame) -> list[dict[str, Any]]:
    return [r.asDict() for r in df.collect()]


def committed(info: CommitInfo | None) -> CommitInfo:
    assert info is not None and info.ts is not None
    return info


def build(url: str) -> tuple[txns.Database, list[CommitInfo]]:
    """``accounts`` (a multiset) over several transactions, with retractions spread over parts."""
    db = txns.connect(url, config=SMALL_PARTS)
    db.create_table("accounts", ACCOUNTS)
    db.create_table("empty", pa.schema([("k", pa.string())]))
    infos = []
    with db.transaction() as t:
        for lo in range(0, 300, 40):  # one part per insert call: key-disjoint parts in the largest run
            t.insert("accounts", acct(lo, lo + 40) + (acct(0, 20) if lo == 0 else []))  # ids 0..19 twice
    infos.append(committed(t.commit_info))
    time.sleep(0.005)
    with db.transaction() as t:
        t.retract("accounts", acct(50, 120) + acct(0, 10))  # one copy of 0..9 left
        t.insert("accounts", acct(300, 330))
    infos.append(committed(t.commit_info))
    time.sleep(0.005)
    with db.transaction() as t:
        t.insert("accounts", acct(60, 90) + acct(5, 6))
        t.retract("accounts", acct(250, 280))
    infos.append(committed(t.commit_info))
    time.sleep(0.005)
    with db.transaction() as t:
        t.retract("accounts", acct(60, 70) + acct(295, 330))
    infos.append(committed(t.commit_info))
    return db, infos


@pytest.fixture
def built(tmp_path: Path) -> Iterator[tuple[str, txns.Database, list[CommitInfo]]]:
    url = f"file://{tmp_path}/db"
    db, infos = build(url)
    yield url, db, infos
    db.close()


def load(spark: SparkSession, url: str, name: str, **opts: str) -> DataFrame:
    r = spark.read.format("txns").option("url", url)
    for k, v in opts.items():
        r = r.option(k, v)
    return r.load(name)


# ---- planning (no Spark job) ---------------------------------------------------------------------


def test_plan_has_many_parts_and_ranges_cover_everything(built: tuple[str, txns.Database, list[CommitInfo]]) -> None:
    _, db, _ = built
    ts = db.latest()
    plan = db.plan(db.entry("accounts", ts), ts)
    parts = [p for r in plan.runs for p in r.parts]
    assert len(plan.runs) >= 4 and len(parts) >= 8  # the test's premise: retractions in other parts and runs
    tasks = plan_table_tasks(plan, None)
    assert len(tasks) > 1 and all(t.key_range is not None for t in tasks)
    ranges = [t.key_range for t in tasks if t.key_range is not None]
    # disjoint and covering: consecutive bounds meet, unbounded at both ends, nulls in the first only
    assert ranges[0].lo is None and ranges[-1].hi is None and ranges[0].nulls
    assert all(a.hi == b.lo and not b.nulls for a, b in itertools.pairwise(ranges))


def test_key_ranges_keep_amplification_bounded() -> None:
    from persist.manifest import PartRef, Run

    sorted_run = Run(parts=tuple(PartRef(f"p{i}", 10, 100, 0, i * 10, i * 10 + 9) for i in range(8)), rows=80)
    spanning = Run(parts=tuple(PartRef(f"s{i}", 10, 100, 0, 0, 79) for i in range(8)), rows=80)
    assert len(key_ranges([sorted_run])) == 8  # compacted: one range per part, each part read once
    ranges = key_ranges([sorted_run, spanning])
    planned = sum(p.size for k in ranges for r in (sorted_run, spanning) for p in r.parts if k.overlaps(p))
    assert planned <= 4 * 1600 and len(ranges) >= 2
    assert key_ranges([Run(parts=(PartRef("x", 1, 1, 0),), rows=1)]) == [KeyRange(None, None, True)]


def test_parse_time_forms() -> None:
    from txns.db import clock

    assert parse_time("12345", "asOf", end_of_ms=True) == 12345
    utc = clock.ts_end_of_ms(int(dt.datetime(2026, 11, 23, 15, 0, tzinfo=dt.UTC).timestamp() * 1000))
    assert parse_time("2026-11-23 15:00", "asOf", end_of_ms=True) == utc  # no offset: UTC
    assert parse_time("2026-11-23T15:00:00", "asOf", end_of_ms=True) == utc
    assert parse_time("2026-11-23T17:00:00+02:00", "asOf", end_of_ms=True) == utc
    assert parse_time("2026-11-23T15:00:00Z", "asOf", end_of_ms=True) == utc
    with pytest.raises(InvalidUsage, match=r"option asOf must be .*wall-clock"):
        parse_time("yesterday", "asOf", end_of_ms=True)
    with pytest.raises(InvalidUsage, match="diff must be 'true' or 'false'"):
        TableOptions.parse({"url": "file:///x", "path": "t", "diff": "maybe"})
    with pytest.raises(InvalidUsage, match="option url"):
        TableOptions.parse({"path": "t"})


def test_valid_for_forms() -> None:
    from txns.spark.read import PLAN_VALID_S

    def valid(v: str | None) -> float:
        return TableOptions.parse(
            {"url": "file:///x", "path": "t"} | ({} if v is None else {"validFor": v})
        ).valid_for_s

    assert valid(None) == PLAN_VALID_S == 3600
    assert (valid("7200"), valid("90m"), valid("2h"), valid("1.5h"), valid("30s")) == (7200, 5400, 7200, 5400, 30)
    for bad in ("soon", "0", "-5", "2d", "200h"):
        with pytest.raises(InvalidUsage, match=r"option validFor must be seconds .* at most 7 days"):
            valid(bad)


def test_a_read_holds_its_parts_for_valid_for(
    spark: SparkSession, built: tuple[str, txns.Database, list[CommitInfo]]
) -> None:
    """The planned read's hold (a blob key with its expiry) lasts ``validFor``, else an hour."""
    from persist._internal.holds import parse_hold

    url, db, _ = built
    data_id = db.entry("accounts", db.latest()).data_id

    def holds() -> set[tuple[int, int]]:
        return {h for k in db.client.blob.list_keys(f"{data_id}/holds/") if (h := parse_hold(k)) is not None}

    before = holds()
    load(spark, url, "accounts", validFor="2h").count()
    (new,) = holds() - before
    assert new[1] - new[0] == 2 * 3600 * 1000
    before = holds()
    load(spark, url, "accounts").count()
    (new,) = holds() - before
    assert new[1] - new[0] == 3600 * 1000
    before = holds()
    read_table(spark, url, "accounts", valid_for_s=1800).count()  # (not compacted: by the data source)
    (new,) = holds() - before
    assert new[1] - new[0] == 1800 * 1000
    with pytest.raises(InvalidUsage, match="valid_for_s must be seconds"):
        read_table(spark, url, "accounts", valid_for_s=-1)


# ---- batch reads ---------------------------------------------------------------------------------


def test_reads_at_several_times_equal_python(
    spark: SparkSession, built: tuple[str, txns.Database, list[CommitInfo]]
) -> None:
    url, db, infos = built
    table = db.table("accounts")
    assert bag(spark_rows(load(spark, url, "accounts"))) == bag(table.to_arrow().to_pylist())
    ts1, time2 = infos[1].ts, infos[2].time
    assert ts1 is not None and time2 is not None
    assert bag(spark_rows(read_table(spark, url, "accounts", as_of=ts1))) == bag(table.to_arrow(as_of=ts1).to_pylist())
    # a wall-clock time (no offset: UTC) reads at the end of its millisecond, as the Python API's datetime does
    wall = time2.astimezone(dt.UTC).replace(tzinfo=None).isoformat(sep=" ", timespec="milliseconds")
    want = bag(table.to_arrow(as_of=time2).to_pylist())
    assert want != bag(table.to_arrow(as_of=ts1).to_pylist())
    assert bag(spark_rows(load(spark, url, "accounts", timestampAsOf=wall))) == want
    assert load(spark, url, "empty").count() == 0


def test_diff_option_on_a_multiset(spark: SparkSession, built: tuple[str, txns.Database, list[CommitInfo]]) -> None:
    url, db, _ = built
    df = load(spark, url, "accounts", diff="true")
    assert df.columns == ["id", "name", "balance", "diff"]
    got = {(r["id"], r["name"], r["balance"]): r["diff"] for r in spark_rows(df)}
    want = Counter((r["id"], r["name"], r["balance"]) for r in db.table("accounts").to_arrow().to_pylist())
    assert got == dict(want) and 2 in got.values()  # (ids 10..19 are there twice)
    db.set_table_retention("accounts", dt.timedelta(milliseconds=1))
    time.sleep(0.01)
    db.compact(["accounts"])  # the fast path: one distinct_kv run, a task per part, no consolidation
    ts = db.latest()
    plan = db.plan(db.entry("accounts", ts), ts)
    assert len(plan.runs) == 1 and plan.runs[0].distinct_kv
    assert all(t.key_range is None for t in plan_table_tasks(plan, None))
    assert bag(spark_rows(load(spark, url, "accounts"))) == bag(db.table("accounts").to_arrow().to_pylist())


def test_changes_equal_python(spark: SparkSession, built: tuple[str, txns.Database, list[CommitInfo]]) -> None:
    url, db, infos = built
    t1, t3 = infos[1].ts, infos[3].ts
    assert t1 is not None and t3 is not None
    df = load(spark, url, "accounts", changes="true", start=str(t1), end=str(t3))
    assert df.columns == ["id", "name", "balance", "ts", "diff"]
    want = db.table("accounts").changes(t1, t3).to_pylist()
    assert bag(spark_rows(df)) == bag(want) and {r["diff"] for r in want} >= {1, -1}


def test_filters_pushed_equal_python_filtered_read(
    spark: SparkSession, built: tuple[str, txns.Database, list[CommitInfo]]
) -> None:
    from pyspark.sql import functions as F

    url, db, _ = built
    df = load(spark, url, "accounts").where(
        (F.col("id") >= 5) & (F.col("id") < 200) & F.col("name").startswith("a1") & F.col("balance").isNotNull()
    )
    want = db.table("accounts").to_arrow(
        filter=(pc.field("id") >= 5) & (pc.field("id") < 200) & pc.starts_with(pc.field("name"), pattern="a1")
    )
    assert bag(spark_rows(df)) == bag(want.to_pylist()) and want.num_rows > 0
    plan = df._jdf.queryExecution().executedPlan().toString()
    assert "Filter" not in plan or "startswith" not in plan.lower()  # pushed: Spark does not filter again
    df = load(spark, url, "accounts").where(
        F.col("id").isin(1, 5, 61, 70, 2000) & (F.col("id") != 5) & ((F.col("id") % 2 == 0) | (F.col("id") < 3))
    )  # (the last term is left to Spark)
    assert bag(spark_rows(df)) == bag(db.table("accounts").to_arrow(filter=pc.field("id").isin([1, 70])).to_pylist())


def test_a_user_schema_prunes_columns(spark: SparkSession, built: tuple[str, txns.Database, list[CommitInfo]]) -> None:
    """Some of the table's columns as the read's schema: only those are read; the result is the projection."""
    url, db, infos = built
    full = db.table("accounts").to_arrow().to_pylist()

    def pruned(schema: str, **opts: str) -> list[dict[str, Any]]:
        r = spark.read.format("txns").option("url", url).schema(schema)
        for k, v in opts.items():
            r = r.option(k, v)
        return spark_rows(r.load("accounts"))

    # "name" repeats across ids (and ids 10..19 are there twice): duplicates are kept, as SELECT name does
    want = Counter(r["name"] for r in full)
    assert Counter(r["name"] for r in pruned("name string")) == want and max(want.values()) > 2
    got = pruned("balance long, name string")  # any order
    assert bag(got) == bag([{"balance": r["balance"], "name": r["name"]} for r in full])
    with pytest.raises(Exception, match=r"SchemaMismatch.*with diff=true.*distinct only over every column"):
        pruned("name string, diff long", diff="true")
    t1, t3 = infos[1].ts, infos[3].ts
    changes = db.table("accounts").changes(t1, t3).to_pylist()
    for schema, cols in (("id long, ts long, diff long", ["id"]), ("name string, ts long, diff long", ["name"])):
        want_changes: Counter[tuple[Any, ...]] = Counter()
        for r in changes:
            want_changes[(*(r[c] for c in cols), r["ts"])] += r["diff"]
        got_changes: Counter[tuple[Any, ...]] = Counter()
        for r in pruned(schema, changes="true", start=str(t1), end=str(t3)):
            got_changes[(*(r[c] for c in cols), r["ts"])] += r["diff"]
        assert +got_changes == +want_changes and -got_changes == -want_changes
    # a filter on a column not read still applies
    from pyspark.sql import functions as F

    r = spark.read.format("txns").option("url", url).schema("name string").load("accounts")
    assert Counter(x["name"] for x in spark_rows(r.where(F.col("name") == "a3"))) == Counter({"a3": want["a3"]})
    for bad in ("nope string", "name long", "name string, name string", "diff long"):
        with pytest.raises(Exception, match=r"SchemaMismatch.*give no schema, or some of the table's columns"):
            spark.read.format("txns").option("url", url).schema(bad).load("accounts").collect()


def test_a_compacted_table_is_read_by_sparks_own_reader(
    spark: SparkSession, built: tuple[str, txns.Database, list[CommitInfo]]
) -> None:
    url, db, _ = built
    with pytest.raises(InvalidUsage, match="cannot be read by Spark's own Parquet reader"):
        read_table(spark, url, "accounts", native=True)  # not compacted yet
    db.set_table_retention("accounts", dt.timedelta(milliseconds=1))
    time.sleep(0.01)
    db.compact(["accounts"])
    full = db.table("accounts").to_arrow().to_pylist()
    df = read_table(spark, url, "accounts")  # native by default now
    assert "FileScan parquet" in df._jdf.queryExecution().executedPlan().toString()
    assert bag(spark_rows(df)) == bag(full) and Counter(r["id"] for r in full)[15] == 2  # (diff 2: repeated)
    by_source = read_table(spark, url, "accounts", native=False)
    assert bag(spark_rows(by_source)) == bag(full)
    distinct = spark_rows(read_table(spark, url, "accounts", diff=True))
    with_diff = {(r["id"], r["name"], r["balance"]): r["diff"] for r in distinct}
    assert with_diff == dict(Counter((r["id"], r["name"], r["balance"]) for r in full))
    # a part corrupted in place (same size) fails the read: every page's CRC-32 is checked
    ts = db.latest()
    part = db.plan(db.entry("accounts", ts), ts).runs[0].parts[0]
    path = Path(url[len("file://") :]) / "blob" / part.key
    data = bytearray(path.read_bytes())
    data[len(data) // 3] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(Exception):  # noqa: B017 - Spark's own error (a checksum or a decoding failure)
        read_table(spark, url, "accounts").collect()


# ---- errors --------------------------------------------------------------------------------------


def test_errors(spark: SparkSession, built: tuple[str, txns.Database, list[CommitInfo]], tmp_path: Path) -> None:
    url, _, _ = built
    with pytest.raises(Exception, match="option url"):
        spark.read.format("txns").load("accounts").collect()
    with pytest.raises(Exception, match=r"TableNotFound.*no table 'nope'.*accounts"):
        load(spark, url, "nope").collect()
    with pytest.raises(Exception, match="DatabaseNotFound"):
        load(spark, f"file://{tmp_path}/nothing", "accounts").collect()
    assert not (tmp_path / "nothing").exists()
    with pytest.raises(Exception, match="option asOf must be"):
        load(spark, url, "accounts", asOf="last tuesday").collect()
    with pytest.raises(Exception, match="ReadBelowSince"):
        load(spark, url, "accounts", asOf="2001-01-01 00:00").collect()


# ---- streams and SQL -----------------------------------------------------------------------------


def test_stream_by_name(
    spark: SparkSession, built: tuple[str, txns.Database, list[CommitInfo]], tmp_path: Path
) -> None:
    url, db, _ = built
    stream = spark.readStream.format("txns").option("url", url).option("changes", "true").load("accounts")
    assert stream.columns == ["id", "name", "balance", "ts", "diff"]
    out, ckpt = str(tmp_path / "out"), str(tmp_path / "ckpt")

    def run() -> Counter[tuple[Any, ...]]:
        q = stream.writeStream.format("parquet").option("path", out).option("checkpointLocation", ckpt)
        query = q.trigger(availableNow=True).start()
        query.awaitTermination(120)
        assert query.exception() is None
        got: Counter[tuple[Any, ...]] = Counter()
        for r in spark.read.parquet(out).collect():
            got[(r["id"], r["name"], r["balance"])] += r["diff"]
        return +got

    def python() -> Counter[tuple[Any, ...]]:
        return Counter((r["id"], r["name"], r["balance"]) for r in db.table("accounts").to_arrow().to_pylist())

    assert run() == python()
    with db.transaction() as t:
        t.insert("accounts", acct(1000, 1003))
        t.retract("accounts", acct(0, 1))
    assert run() == python()
    with pytest.raises(Exception, match="changes"):
        bad = spark.readStream.format("txns").option("url", url).load("accounts")
        bad.writeStream.format("parquet").option("path", str(tmp_path / "o2")).option(
            "checkpointLocation", str(tmp_path / "ckpt2")
        ).start().awaitTermination(60)


def test_sql_views_and_time_travel(spark: SparkSession, built: tuple[str, txns.Database, list[CommitInfo]]) -> None:
    url, db, infos = built
    assert register_tables(spark, db) == ["accounts", "empty"]
    got = spark.sql("SELECT name, SUM(balance) AS s, COUNT(*) AS n FROM accounts GROUP BY name").collect()
    rows = db.table("accounts").to_arrow().to_pylist()
    want = {
        n: (sum(r["balance"] for r in rows if r["name"] == n), sum(r["name"] == n for r in rows))
        for n in {r["name"] for r in rows}
    }
    assert {r["name"]: (r["s"], r["n"]) for r in got} == want
    ts = infos[1].ts
    assert ts is not None
    spark.sql(
        f"CREATE OR REPLACE TEMPORARY VIEW accounts_then USING txns OPTIONS (url '{url}', path 'accounts', asOf '{ts}')"
    )
    then = spark_rows(spark.sql("SELECT * FROM accounts_then"))
    assert bag(then) == bag(db.table("accounts").to_arrow(as_of=ts).to_pylist())
    assert register_tables(spark, url, as_of=ts) == ["accounts", "empty"]
    assert bag(spark_rows(spark.sql("SELECT * FROM accounts"))) == bag(then)


# ---- S3 ------------------------------------------------------------------------------------------


@pytest.mark.s3
def test_read_on_s3(spark: SparkSession, s3_url_factory: Callable[..., str]) -> None:
    url = s3_url_factory()
    db, infos = build(url)
    try:
        table = db.table("accounts")
        ts = infos[2].ts
        assert ts is not None
        assert bag(spark_rows(load(spark, url, "accounts", versionAsOf=str(ts)))) == bag(
            table.to_arrow(as_of=ts).to_pylist()
        )
    finally:
        db.close()
