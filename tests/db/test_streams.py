"""Any Arrow stream into a table: DuckDB relations, Polars frames, readers, through ``__arrow_c_stream__``.

``Transaction.insert`` takes every object exporting the Arrow PyCapsule
stream interface and writes it batch by batch (``txns.db.arrow_io``); the
in-memory bound is checked on pyarrow's allocator, the rows round-trip
exactly, and bad streams (wrong columns, values that do not fit, a source
failing midway) change nothing on the store: the checks of
``tests/db/test_errors.py`` (same files, same contents, same history).
"""

from __future__ import annotations

import uuid
import weakref
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import duckdb
import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.compute as pc
import pytest

import txns
from persist import InvalidUsage, PersistConfig, SchemaMismatch
from tests.db.test_errors import GOOD, SCHEMA, Store, in_txn, unchanged


class Exported:
    """An object that only exports ``__arrow_c_stream__``: a producer the library knows nothing of."""

    def __init__(self, source: Any) -> None:
        self.source = source

    def __arrow_c_stream__(self, requested_schema: object = None) -> object:
        return self.source.__arrow_c_stream__(requested_schema)



def _sql(query: str) -> duckdb.DuckDBPyRelation:
    """``query``'s relation on a DuckDB connection of its own: the default connection has one open result at a
    time, and a stream a test left half-read (a failed insert) would make the next query there fail."""
    return duckdb.connect().sql(query)

def ids(db: txns.Database, table: str) -> list[int]:
    return sorted(db.table(table).to_arrow().column("id").to_pylist())


@pytest.fixture
def db(tmp_path: Path) -> Iterator[txns.Database]:
    d = txns.connect(f"file://{tmp_path / 'db'}")
    yield d
    d.close()


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    s = Store(tmp_path / "db", PersistConfig(part_target_bytes=16 << 10))  # (small parts: a stream spills several)
    yield s
    s.db.close()


def test_a_duckdb_query_result_in_one_transaction_with_another_write(db: txns.Database) -> None:
    n = 100_000
    db.create_table(
        "t", pa.schema([pa.field("id", pa.int64(), nullable=False), ("k", pa.int32()), ("x", pa.float64())])
    )
    db.create_table("log", pa.schema([("msg", pa.string())]))
    rel = _sql(f"SELECT range AS id, range % 1000 AS k, range / 4 AS x FROM range({n})")  # k: BIGINT
    with db.transaction() as t:
        assert t.insert("t", rel) == n
        t.insert("log", [{"msg": "loaded"}])
    assert t.commit_info.tables == {"t": {"added": n, "retracted": 0}, "log": {"added": 1, "retracted": 0}}
    got = db.table("t").to_arrow().sort_by("id")
    assert got.schema == db.table("t").schema  # k converted to the table's int32 (every value fits)
    assert got.column("id").to_pylist() == list(range(n))
    assert got.column("k").to_pylist() == [i % 1000 for i in range(n)]
    assert got.column("x").to_pylist() == [i / 4 for i in range(n)]
    assert db.table("log").to_arrow().to_pylist() == [{"msg": "loaded"}]


def test_a_stream_into_a_keyed_table_and_retracting_one(db: txns.Database) -> None:
    db.create_table(
        "k", pa.schema([pa.field("id", pa.int64(), nullable=False), ("v", pa.string())]), primary_key=["id"]
    )
    db.create_table("m", pa.schema([("id", pa.int64())]))
    with db.transaction() as t:
        t.insert("k", _sql("SELECT range AS id, 'v' || range AS v FROM range(5)"))
        t.insert("m", _sql("SELECT range % 3 AS id FROM range(9)"))
    with pytest.raises(txns.DuplicateKey), db.transaction() as t:
        t.insert("k", _sql("SELECT 4 AS id, 'again' AS v"))
    with db.transaction() as t:
        assert t.retract("m", _sql("SELECT 1 AS id UNION ALL SELECT 1")) == 2
    assert ids(db, "k") == [0, 1, 2, 3, 4]
    assert ids(db, "m") == [0, 0, 0, 1, 2, 2, 2]


def test_polars_frames_and_readers_through_the_capsule(db: txns.Database) -> None:
    schema = pa.schema([("id", pa.int64()), ("s", pa.string())])
    data = pa.table({"id": list(range(1000)), "s": [f"r{i}" for i in range(1000)]}, schema=schema)
    inputs: dict[str, object] = {
        "reader": Exported(pa.RecordBatchReader.from_batches(schema, data.to_batches(max_chunksize=100))),
        "table": Exported(data),
        "polars": pl.from_arrow(data),
        "polars_lazy": pl.from_arrow(data).lazy().filter(pl.col("id") >= 0),
    }
    if hasattr(pl.DataFrame, "__arrow_c_stream__"):  # (Polars 1.3 and later)
        inputs["polars_stream"] = Exported(pl.from_arrow(data))
    for name, obj in inputs.items():
        db.create_table(name, schema)
        with db.transaction() as t:
            assert t.insert(name, obj) == 1000, name
        assert db.table(name).to_arrow().sort_by("id").equals(data), name


def test_a_datafusion_dataframe_and_string_views(db: txns.Database) -> None:
    schema = pa.schema([("id", pa.int64()), ("s", pa.string())])
    db.create_table("views", schema)
    views = pa.table({"id": [1, 2, 3], "s": pa.array(["a", None, "c"], pa.string_view())})
    with db.transaction() as t:
        assert t.insert("views", Exported(views)) == 3  # (pyarrow 18 cannot compare string views)
    assert db.table("views").to_arrow().sort_by("id").to_pylist() == views.cast(schema).to_pylist()
    datafusion = pytest.importorskip("datafusion")
    db.create_table("df", schema)
    frame = datafusion.SessionContext().sql("SELECT value AS id, 'r' || CAST(value AS VARCHAR) AS s FROM range(1000)")
    with db.transaction() as t:
        assert t.insert("df", frame) == 1000
    got = db.table("df").to_arrow().sort_by("id")
    assert got.to_pylist() == [{"id": i, "s": f"r{i}"} for i in range(1000)]


def test_a_long_stream_is_written_with_bounded_memory() -> None:
    """At most a few parts' worth of the stream's batches is alive at once, and the bytes held stay small.

    The source makes each batch only when asked (a generator) over a numpy
    array of its own (Arrow wraps it without a copy, so the array lives as
    long as any Arrow buffer of that batch: a weak reference tells). Before
    making each batch it counts the earlier ones still alive and samples
    ``pa.total_allocated_bytes()`` (everything the insert holds then:
    buffered rows, sorted copies, parts being encoded). An insert that kept
    the stream, or fell behind its uploads, would hold all of it.
    """
    part = 64 << 10
    rows_per_batch, n_batches = 1024, 300
    schema = pa.schema([pa.field("id", pa.int64(), nullable=False), ("x", pa.float64())])
    batch_bytes = rows_per_batch * 16
    # A batch in the builder is its rows plus ts and diff: twice its bytes; a part is flushed at `part` bytes
    # and keeps its batches (already sorted: not copied) until uploaded, with at most `upload_parallelism`
    # uploads under way.
    config = PersistConfig(part_target_bytes=part)
    per_part = -(-part // (2 * batch_bytes))
    most_alive = per_part * (1 + config.upload_parallelism)
    alive: list[int] = []
    held: list[int] = []
    refs: list[weakref.ref[np.ndarray]] = []

    def batches(base: int) -> Iterator[pa.RecordBatch]:
        for i in range(n_batches):
            alive.append(sum(r() is not None for r in refs))
            held.append(pa.total_allocated_bytes() - base)
            values = np.arange(i * rows_per_batch, (i + 1) * rows_per_batch, dtype=np.int64)
            refs.append(weakref.ref(values))
            yield pa.record_batch([pa.array(values), pa.array(values * 0.5)], schema=schema)

    db = txns.connect(f"mem://streams-{uuid.uuid4().hex}", config=config)
    try:
        db.create_table("t", schema)
        base = pa.total_allocated_bytes()
        with db.transaction() as t:
            reader = pa.RecordBatchReader.from_batches(schema, batches(base))
            assert t.insert("t", Exported(reader)) == n_batches * rows_per_batch
        assert len(alive) == n_batches
        assert max(alive) <= most_alive < n_batches // 20, alive
        # (bytes are process-wide: other threads' allocations count too, so this bound is loose; a stream
        # kept whole would hold all n_batches * batch_bytes, twice over with ts and diff)
        assert max(held) <= n_batches * batch_bytes // 2, held
        got = db.table("t").to_arrow().sort_by("id")
        want = pa.array(np.arange(n_batches * rows_per_batch, dtype=np.int64))
        assert got.column("id").combine_chunks().equals(want)
        assert got.column("x").combine_chunks().equals(pc.multiply(want, 0.5))
    finally:
        db.close()


@pytest.mark.parametrize(
    ("query", "match"),
    [
        ("SELECT 2 AS id, 'b' AS name", r"missing \['amount'\] .*select, rename or add columns"),
        ("SELECT 2 AS id, 'b' AS name, 1.0 AS amount, 0 AS extra", r"unexpected \['extra'\]"),
        ("SELECT 2 AS id, 'b' AS name FROM range(0)", r"missing \['amount'\]"),  # (an empty stream)
        ("SELECT 'two' AS id, 'b' AS name, 1.0 AS amount", r"column 'id' is int32, but the data has string"),
        ("SELECT range * 1000000 AS id, 'b' AS name, 1.0 AS amount FROM range(5000)", r"'id' .* does not fit int32"),
        ("SELECT NULL::INTEGER AS id, 'b' AS name, 1.0 AS amount", r"column 'id' is not nullable"),
    ],
)
def test_a_bad_duckdb_result_changes_nothing(store: Store, query: str, match: str) -> None:
    unchanged(store, in_txn(store, lambda t: t.insert("t", _sql(query))), SchemaMismatch, match)


def test_a_source_failing_midway_leaves_no_part_behind(store: Store) -> None:
    during: list[set[str]] = []

    def failing() -> Iterator[pa.RecordBatch]:
        for i in range(8):
            yield pa.record_batch(
                [pa.array(range(i * 4096, (i + 1) * 4096), pa.int32()), pa.array(["n"] * 4096), pa.array([0.5] * 4096)],
                schema=SCHEMA,
            )
        during.append(store.files())
        raise RuntimeError("the source failed")

    before = store.files()
    stream = in_txn(store, lambda t: t.insert("t", Exported(pa.RecordBatchReader.from_batches(SCHEMA, failing()))))
    unchanged(store, stream, pa.ArrowException, "the source failed")
    assert during and during[0] > before, "parts were written before the source failed (and deleted after)"
    # A DuckDB query failing as it runs: the same.
    failing_query = (
        "SELECT CASE WHEN range < 60000 THEN range ELSE error('the query failed') END AS id, "
        "'q' AS name, 1.0 AS amount FROM range(100000)"
    )
    unchanged(store, in_txn(store, lambda t: t.insert("t", _sql(failing_query))), Exception, "the query failed")
    # Caught inside a transaction, the failed insert leaves the transaction usable and its other writes whole.
    with store.db.transaction() as t:
        t.insert("t", [{"id": 2, "name": "b", "amount": 2.0}])
        with pytest.raises(Exception, match="the query failed"):
            t.insert("t", _sql(failing_query))
        t.insert("t", [{"id": 3, "name": "c", "amount": 3.0}])
    assert ids(store.db, "t") == [g["id"] for g in GOOD] + [2, 3]


def test_a_stream_that_is_not_of_rows(store: Store) -> None:
    unchanged(
        store, in_txn(store, lambda t: t.insert("t", pa.chunked_array([[1, 2]]))), InvalidUsage, "not one of rows"
    )
