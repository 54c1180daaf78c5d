"""Misuse a careful user might try (issue 26): lossy conversions, system tables, names, naive datetimes.

Each test fails on the code before the fix: a lossy value was stored
rounded or truncated, a user could create, write and drop ``txns_`` tables,
``"acct\\n"`` was a valid table name, and a naive ``datetime`` meant local
time for ``as_of`` but UTC in a timestamp column.
"""

from __future__ import annotations

import datetime as dt
import decimal
import math
import time
from collections.abc import Callable, Iterator
from typing import Any

import pyarrow as pa
import pytest

import txns
from persist import InvalidUsage, SchemaMismatch, ShardId
from txns.db import clock
from txns.db.catalog import check_name

D = decimal.Decimal
T0 = dt.datetime(2024, 3, 1, 0, 0)

# ---- item 3: conversions without loss -----------------------------------------------------------

# (column type, value given, what is stored) : converts, stored exactly so (or as the documented rounding)
CONVERTS: list[tuple[pa.DataType, Any, Any]] = [
    (pa.int8(), 127, 127),
    (pa.uint8(), 255, 255),
    (pa.int32(), -(2**31), -(2**31)),
    (pa.float64(), 2**53, float(2**53)),
    (pa.float32(), 2**24, float(2**24)),
    (pa.float64(), D("0.1"), 0.1),
    (pa.float64(), D("123456.25"), 123456.25),
    (pa.float32(), D("0.5"), 0.5),
    (pa.int64(), 3.0, 3),
    (pa.decimal128(10, 2), 12, D("12.00")),
    (pa.decimal128(10, 3), D("1.5"), D("1.500")),
    (pa.float32(), 16777217.0, 16777216.0),  # the one rounding allowed: float64 -> float32 (README)
    (pa.float32(), 0.1, float(pa.scalar(0.1, pa.float32()).as_py())),
    (pa.float32(), math.inf, math.inf),
    (pa.date32(), T0, T0.date()),  # midnight: no time of day is lost
    (pa.timestamp("s"), T0, T0),
    (pa.timestamp("ns"), T0.replace(microsecond=5), T0.replace(microsecond=5)),
    (pa.time32("s"), dt.time(1, 2, 3), dt.time(1, 2, 3)),
    (pa.duration("s"), dt.timedelta(seconds=5), dt.timedelta(seconds=5)),
    (pa.large_string(), "x", "x"),
    (pa.binary(3), b"abc", b"abc"),
]

# (column type, value given): refused with SchemaMismatch, nothing stored
REFUSED: list[tuple[pa.DataType, Any]] = [
    (pa.float32(), 1e300),  # would be inf
    (pa.float32(), -1e300),
    (pa.float16(), 1e10),
    (pa.float64(), D(2**60 + 1)),  # would round
    (pa.float64(), D("123456789.123456789")),
    (pa.float32(), D("16777217")),
    (pa.float32(), 2**24 + 1),  # an integer that a float32 cannot hold
    (pa.float64(), 2**53 + 1),
    (pa.int64(), 1.5),
    (pa.int64(), 1e300),
    (pa.int64(), math.nan),
    (pa.int8(), 128),
    (pa.uint8(), -1),
    (pa.int32(), 2**31),
    (pa.decimal128(10, 2), D("1.234")),
    (pa.decimal128(5, 0), 10**17),
    (pa.date32(), T0.replace(hour=12, minute=30)),  # a time of day would be dropped
    (pa.date32(), T0.replace(microsecond=1)),
    (pa.timestamp("s"), T0.replace(microsecond=1)),  # sub-second precision would be dropped
    (pa.timestamp("ms"), T0.replace(microsecond=1001)),
    (pa.timestamp("ns"), dt.datetime(3000, 1, 1)),  # out of the nanosecond range
    (pa.time32("s"), dt.time(1, 2, 3, 4)),
    (pa.duration("s"), dt.timedelta(microseconds=5)),
    (pa.binary(4), b"abc"),
    (pa.int64(), "1"),  # a string is not a number
    (pa.string(), 1),
]


def _ids(cases: list[Any]) -> list[str]:
    return [f"{c[0]}<-{type(c[1]).__name__}:{c[1]!r}" for c in cases]


@pytest.fixture(scope="module")
def mem_db() -> Iterator[txns.Database]:
    d = txns.connect(f"mem://misuse-{ShardId.new()}")
    yield d
    d.close()


def _table(db: txns.Database, t: pa.DataType) -> str:
    name = "t_" + "".join(c if c.isalnum() else "_" for c in str(t))
    if name not in db.tables():
        db.create_table(name, pa.schema([("x", t)]))
    return name


@pytest.mark.parametrize(("typ", "given", "stored"), CONVERTS, ids=_ids(CONVERTS))
def test_lossless_conversions_are_stored_exactly(
    mem_db: txns.Database, typ: pa.DataType, given: Any, stored: Any
) -> None:
    name = _table(mem_db, typ)
    with mem_db.transaction() as t:
        t.truncate(name)
        t.insert(name, [{"x": given}])
    got = mem_db.table(name).to_arrow().column("x").to_pylist()
    assert got == [stored]


@pytest.mark.parametrize(("typ", "given"), REFUSED, ids=_ids(REFUSED))
def test_lossy_conversions_are_refused(mem_db: txns.Database, typ: pa.DataType, given: Any) -> None:
    name = _table(mem_db, typ)
    before, rows = mem_db.latest(), mem_db.table(name).count()
    with pytest.raises(SchemaMismatch) as e, mem_db.transaction() as t:
        t.insert(name, [{"x": given}])
    assert repr(name) in str(e.value) and "'x'" in str(e.value)
    assert len(str(e.value)) < 600  # (no 300-digit float repr)
    assert mem_db.latest() == before and mem_db.table(name).count() == rows


def test_lossy_conversions_are_refused_from_arrow_and_pandas(mem_db: txns.Database) -> None:
    """The rule is the column's, whatever the input kind: Arrow columns and pandas frames too."""
    pd = pytest.importorskip("pandas")
    f32 = _table(mem_db, pa.float32())
    with pytest.raises(SchemaMismatch, match="stored as inf"):
        mem_db.transaction().insert(f32, pa.table({"x": pa.array([1.0, 1e39])}))
    with pytest.raises(SchemaMismatch, match="does not convert without loss"):
        mem_db.transaction().insert(
            _table(mem_db, pa.date32()), pd.DataFrame({"x": [pd.Timestamp("2024-01-01 08:00")]})
        )
    with pytest.raises(SchemaMismatch):
        mem_db.transaction().insert(_table(mem_db, pa.float64()), pa.table({"x": pa.array([2**62 + 1], pa.int64())}))


def test_update_refuses_a_lossy_value(mem_db: txns.Database) -> None:
    mem_db.create_table("kv32", pa.schema([("k", pa.string()), ("v", pa.float32())]), primary_key=["k"])
    with mem_db.transaction() as t:
        t.insert("kv32", [{"k": "a", "v": 1.0}])
    with pytest.raises(SchemaMismatch, match="stored as inf"), mem_db.transaction() as t:
        t.update("kv32", "a", {"v": 1e300})
    assert mem_db.table("kv32").to_arrow().to_pylist() == [{"k": "a", "v": 1.0}]


# ---- item 5: the system tables are the library's ------------------------------------------------


def test_system_tables_are_reserved(mem_db: txns.Database) -> None:
    mem_db.create_table("kv_sys", pa.schema([("k", pa.string()), ("v", pa.int64())]), primary_key=["k"])
    assert mem_db.submit(writes={("kv_sys", "a"): {"k": "a", "v": 1}}).result().committed  # makes txns_* tables
    system = [n for n in mem_db.tables() if n.startswith("txns_")]
    assert {"txns_intents", "txns_outcomes", "txns_resolver"} <= set(system)
    outcomes = mem_db.table("txns_outcomes").to_arrow()
    before = mem_db.latest()
    schema = pa.schema([("a", pa.int64())])
    attempts: list[Callable[[txns.Transaction], object]] = [
        lambda t: t.create_table("txns_intents2", schema),
        lambda t: t.create_table("TXNS_mine", schema),
        lambda t: t.insert("txns_outcomes", outcomes),
        lambda t: t.retract("txns_outcomes", outcomes),
        lambda t: t.truncate("txns_intents"),
        lambda t: t.upsert("txns_resolver", mem_db.table("txns_resolver").to_arrow()),
        lambda t: t.delete("txns_resolver", ["resolved"]),
        lambda t: t.update("txns_resolver", "resolved", {"epoch": 0}),
        lambda t: t.drop_table("txns_intents"),
        lambda t: t.rename_table("txns_outcomes", "mine"),
        lambda t: t.rename_table("kv_sys", "txns_kv"),
    ]
    for attempt in attempts:
        with pytest.raises(txns.InvalidTableName, match="reserved for the library"), mem_db.transaction() as t:
            attempt(t)
    with pytest.raises(txns.InvalidTableName, match="reserved"):
        mem_db.create_table("txns_sinks", schema)
    with pytest.raises(txns.InvalidTableName, match="reserved"):
        mem_db.drop_table("txns_outcomes")
    with pytest.raises(txns.InvalidTableName, match="reserved"):
        mem_db.rename_table("txns_intents", "x")
    assert mem_db.latest() == before
    assert mem_db.table("txns_outcomes").to_arrow().equals(outcomes)
    mem_db.set_table_retention("txns_outcomes", dt.timedelta(hours=1))  # retention stays the operator's
    assert mem_db.submit(writes={("kv_sys", "b"): {"k": "b", "v": 2}}).result().committed  # the library still writes


def test_run_batch_cannot_write_a_system_table(mem_db: txns.Database) -> None:
    mem_db.create_table("kv_rb", pa.schema([("k", pa.string()), ("v", pa.int64())]), primary_key=["k"])
    assert mem_db.submit(writes={("kv_rb", "a"): {"k": "a", "v": 1}}).result().committed
    before = mem_db.latest()

    def forge(ctx: Any) -> None:
        ctx.put("txns_resolver", {"name": "resolved", "epoch": 10**9})

    with pytest.raises(txns.InvalidTableName, match="reserved"):
        mem_db.run_batch([forge])
    assert mem_db.latest() == before


# ---- item 8: names are matched whole --------------------------------------------------------------


@pytest.mark.parametrize("name", ["acct\n", "acct\r", "acct ", "\nacct", "acct\n\n", "ac\nct", "a" * 129])
def test_table_names_with_a_final_newline_are_refused(mem_db: txns.Database, name: str) -> None:
    with pytest.raises(txns.InvalidTableName):
        check_name(name)
    with pytest.raises(txns.InvalidTableName):
        mem_db.create_table(name, pa.schema([("a", pa.int64())]))
    assert name not in mem_db.tables()


def test_ids_and_other_names_are_matched_whole() -> None:
    sid = str(ShardId.new())
    assert str(ShardId.parse(sid)) == sid
    for bad in (sid + "\n", sid + "\r\n", " " + sid):
        with pytest.raises(InvalidUsage, match="invalid shard id"):
            ShardId.parse(bad)
    from persist.url import register_scheme

    with pytest.raises(InvalidUsage, match="invalid scheme name"):
        register_scheme("scratch\n", lambda u: None, forms="scratch://X")  # type: ignore[arg-type,return-value]
    with pytest.raises(InvalidUsage, match="bucket"):
        txns.connect("s3://bucket%0A/p?endpoint_url=http://127.0.0.1:9&region=us-east-1")


def test_cli_as_of_takes_only_ascii_digits_as_a_timestamp() -> None:
    from txns.db.commands import UsageError, parse_as_of

    assert parse_as_of("12") == 12
    with pytest.raises(UsageError):
        parse_as_of("²")  # str.isdigit() says yes; int() would raise a raw ValueError


# ---- item 12: a naive datetime is UTC everywhere --------------------------------------------------


@pytest.fixture
def far_from_utc(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """This process's local time zone 9 hours from UTC (so local and UTC readings differ)."""
    monkeypatch.setenv("TZ", "Asia/Tokyo")
    time.tzset()
    assert time.timezone == -9 * 3600
    yield
    monkeypatch.undo()
    time.tzset()


def test_naive_datetimes_mean_utc_for_as_of_and_for_columns(far_from_utc: None, mem_db: txns.Database) -> None:
    naive = dt.datetime(2025, 6, 1, 12, 0, 0)
    utc = naive.replace(tzinfo=dt.UTC)
    assert clock.ms_of_datetime(naive) == clock.ms_of_datetime(utc)
    mem_db.create_table("events", pa.schema([("at", pa.timestamp("us", tz="UTC")), ("plain", pa.timestamp("us"))]))
    with mem_db.transaction() as t:
        t.insert("events", [{"at": naive, "plain": utc}])
    row = mem_db.table("events").to_arrow().to_pylist()[0]
    assert row["at"] == utc  # the naive value was read as UTC ...
    assert row["plain"] == naive  # ... and an aware one is stored as its UTC time
    info = mem_db.history(limit=1).to_pylist()[0]
    when = info["time"].astimezone(dt.UTC).replace(tzinfo=None) + dt.timedelta(milliseconds=1)
    assert mem_db.table("events").count(as_of=when) == 1  # a naive as_of is UTC too (local would be 9 h off)
    assert mem_db.table("events").count(as_of=when.replace(tzinfo=dt.UTC)) == 1
