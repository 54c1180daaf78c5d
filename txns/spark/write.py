"""DataFrames into data shards: executors write the parts, the driver gets a Batch.

Protocol of :func:`write_batch`:

1. On the driver, the DataFrame's columns are checked against the shard's
   schema by name and by type, before any job runs. A mismatch raises
   ``SchemaMismatch`` and nothing is written.
2. Each Spark partition, in its executor, opens the store by URL and feeds
   its Arrow batches to a :class:`persist.BatchBuilder` (no inline rows),
   which writes sorted Parquet parts of the target size straight into blob
   storage (memory per task stays near ``part_target_bytes * 3``). It returns
   one small row per part: key, rows, size, CRC-32C, key bounds.
3. The driver collects those rows (never data) into a :class:`persist.Batch`
   with times ``[0, 1)``, ready for ``Txn.write_batch``: committing
   re-timestamps it to the commit time without rewriting anything.

Failures: a task that fails after writing parts, a retried task attempt, or
a job that fails leaves parts that no state references. They are harmless
and ``PersistClient.gc_leaked`` deletes them by age. A value that cannot be
converted (an overflow, a null in a non-nullable field) is only seen by the
executor reading it: the job fails with ``SchemaMismatch`` naming it (parts
of other tasks may then be left, as above).
"""

from __future__ import annotations

import functools
import json
import uuid
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc

from persist import CLOSED, Batch, BatchBuilder, InvalidUsage, PersistConfig, Schema, SchemaMismatch, ShardId
from persist.manifest import PartRef, Run
from txns.spark._common import check_executors, check_url, col, location, raise_from_spark
from txns.spark.native_write import native_root, native_types, write_native

if TYPE_CHECKING:
    from pyspark.sql import DataFrame
    from pyspark.sql.types import StructType

    from txns.txn import Txn

PART_ROWS = "key string, rows long, size long, crc long, min_ts decimal(20,0), max_ts decimal(20,0), bounds string"
"""What a writing task returns: one row per part it wrote, with the range of its update times
and its key bounds (``PartRef.lo``/``hi`` as a JSON list, or null)."""

UPLOAD_PARALLELISM = 2
"""Parts a task uploads at once (while it buffers the next)."""


def write_dataframe(txn: Txn, data_id: str | ShardId, df: DataFrame) -> None:
    """Write ``df`` to data shard ``data_id`` in transaction ``txn`` (:func:`write_batch` + ``Txn.write_batch``).

    Executors write the parts straight into blob storage; only part
    descriptors come back to the driver. Columns are matched by name to the
    shard's key and val fields; an optional ``diff`` column gives
    multiplicities (default 1). ``txn`` must be bound to a handle
    (``TxnsHandle.begin()``), whose location the executors write to.
    """
    handle = txn.handle
    if handle is None:
        raise InvalidUsage("this transaction is not bound to a handle; create it with TxnsHandle.begin()")
    data_id = str(data_id)
    txn.write_batch(data_id, write_batch(df, handle.client.url, data_id, handle.data_schema(data_id)))


def write_batch(
    df: DataFrame,
    url: str,
    data_id: str | ShardId,
    schema: Schema,
    *,
    part_target_bytes: int | None = None,
    native: bool | None = None,
) -> Batch:
    """Write ``df`` as a batch of data shard ``data_id`` (at ``url``); return the batch, not appended.

    ``df`` has one column per key and val field of ``schema``, matched by
    name, and optionally an integer ``diff`` column (multiplicities;
    default 1). A missing or unexpected column, or a column whose type cannot
    be converted to the field's, raises ``SchemaMismatch`` before anything is
    written. Executors write the Parquet parts (each at most about
    ``part_target_bytes`` of Arrow data; default ``PersistConfig().part_target_bytes``)
    into blob storage; only part descriptors come back to the driver.

    ``native``: Spark's own Parquet writer makes the parts, no row going
    through Python (:mod:`txns.spark.native_write`); None (the default)
    takes that path where it can (a ``file://`` location, every column
    already of its field's type), False never, True or InvalidUsage.

    The batch has times ``[0, 1)``: add it to a transaction with
    ``Txn.write_batch`` (:func:`write_dataframe` does both), which moves its
    times to the commit time. A batch that is never committed leaves parts
    for ``PersistClient.gc_leaked``.
    """
    check_url(url)
    data_id = str(ShardId.parse(str(data_id)))
    if not isinstance(schema, Schema):
        raise InvalidUsage(f"write_batch takes a persist.Schema, got {type(schema).__name__}")
    target = PersistConfig().part_target_bytes if part_target_bytes is None else part_target_bytes
    if isinstance(target, bool) or not isinstance(target, int) or target <= 0:
        raise InvalidUsage(f"part_target_bytes must be a positive int, got {target!r}")
    columns = check_columns(df.schema, schema, data_id)
    location(url)  # a bad URL fails here, on the driver, before any task runs
    check_executors(df.sparkSession)
    root = native_root(url)
    use_native = native is not False and root is not None and native_types(df, schema)
    if native and not use_native:
        raise InvalidUsage(
            "native=True needs a file:// location and DataFrame columns of exactly the shard's types "
            f"({schema.describe()}); cast the columns, or leave native=None"
        )
    try:
        if use_native and root is not None:
            refs = write_native(df, root, data_id, schema, columns, target)
        else:
            fn = functools.partial(_write_rows, url, data_id, schema.to_text(), target)
            refs = part_refs(df.select(*[col(c) for c in columns]).mapInArrow(fn, PART_ROWS).collect())
    except Exception as e:
        raise_from_spark(e)
        raise
    runs = (Run(parts=refs, rows=sum(p.rows for p in refs)),) if refs else ()
    return Batch(
        shard_id=data_id, id=uuid.uuid4().hex, lower=0, upper=1, runs=runs, schema_fingerprint=schema.to_text()
    )


def part_refs(rows: list[Any]) -> tuple[PartRef, ...]:
    """The part descriptors of :data:`PART_ROWS` rows (collected on the driver), by key."""
    refs = (PartRef(r["key"], r["rows"], r["size"], r["crc"], *json.loads(r["bounds"] or "[null, null]")) for r in rows)
    return tuple(sorted(refs, key=lambda p: p.key))


def _bounds_json(p: PartRef) -> str | None:
    return None if p.lo is None and p.hi is None else json.dumps([p.lo, p.hi])


# ---- checking columns on the driver ---------------------------------------------------------


def check_columns(df_schema: StructType, schema: Schema, data_id: str) -> list[str]:
    """The DataFrame columns to write (key and val fields, then ``diff`` if present), or SchemaMismatch."""
    from pyspark.sql.pandas.types import to_arrow_type
    from pyspark.sql.types import ByteType, IntegerType, LongType, ShortType

    have = df_schema.fieldNames()
    want = schema.key_names + schema.val_names
    dup = sorted({n for n in have if have.count(n) > 1})
    missing = [n for n in want if n not in have]
    extra = [n for n in have if n not in want and n != "diff"]
    if dup or missing or extra:
        raise SchemaMismatch(
            f"DataFrame columns do not match data shard {data_id}'s schema {schema.describe()}: "
            f"missing {missing}, unexpected {extra}" + (f", repeated {dup}" if dup else "") + "; columns are "
            "matched by name (case-sensitive), plus an optional integer 'diff' column (times are set at commit)"
        )
    for field in list(schema.key) + list(schema.val):
        dt = df_schema[field.name].dataType
        try:
            src = to_arrow_type(dt, timezone="UTC")
        except Exception:  # noqa: BLE001 - pyspark raises its own kinds
            src = None
        if src is None or not castable(src, field.type):
            raise SchemaMismatch(
                f"column {field.name!r} has Spark type {dt.simpleString()}, which cannot be converted to "
                f"data shard {data_id}'s {field.type} ({schema.describe()}); cast the column first"
            )
    if "diff" in have:
        dt = df_schema["diff"].dataType
        if not isinstance(dt, (ByteType, ShortType, IntegerType, LongType)):
            raise SchemaMismatch(f"column 'diff' must be an integer (multiplicities), got {dt.simpleString()}")
    return want + (["diff"] if "diff" in have else [])


def _kind(t: pa.DataType) -> str:
    if pa.types.is_integer(t):
        return "int"
    if pa.types.is_floating(t):
        return "float"
    if pa.types.is_decimal(t):
        return "decimal"
    if pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_string_view(t):
        return "string"
    if pa.types.is_binary(t) or pa.types.is_large_binary(t) or pa.types.is_fixed_size_binary(t):
        return "binary"
    if pa.types.is_null(t):
        return "null"
    return str(t.id)  # bool, date, timestamp, nested...: only the same kind converts


def castable(src: pa.DataType, dst: pa.DataType) -> bool:
    """Whether Spark values of Arrow type ``src`` may be written into a field of type ``dst``.

    The same kind of value only (integers may also go to floats and
    decimals, and decimals to integers), and Arrow must be able to cast it.
    Value-level failures (an overflow) are found while writing.
    """
    if src.equals(dst):
        return True
    a, b = _kind(src), _kind(dst)
    ok = a == b or a == "null" or (a == "int" and b in ("float", "decimal")) or (a == "decimal" and b == "int")
    if not ok:
        return False
    try:
        pa.array([], type=src).cast(dst)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError):
        return False
    return True


# ---- writing on executors -------------------------------------------------------------------


def _write_rows(
    url: str, shard_id: str, schema_text: str, target: int, batches: Iterator[pa.RecordBatch]
) -> Iterator[pa.RecordBatch]:
    """mapInArrow function of :func:`write_batch`: DataFrame rows (no ``ts``) into parts."""

    def tables() -> Iterator[pa.Table]:
        for b in batches:
            t = pa.Table.from_batches([b])
            n = t.num_rows
            if "diff" not in t.column_names:
                t = t.append_column("diff", pa.repeat(pa.scalar(1, pa.int64()), n))
            yield t.append_column("ts", pa.repeat(pa.scalar(0, pa.uint64()), n))

    return write_tables(url, shard_id, schema_text, target, tables())


def write_tables(
    url: str, shard_id: str, schema_text: str, target: int, tables: Iterator[pa.Table]
) -> Iterator[pa.RecordBatch]:
    """Write ``tables`` (columns of the shard's parts, by name) as parts; yield :data:`PART_ROWS`."""
    schema = Schema.from_text(schema_text)
    config = PersistConfig(part_target_bytes=target, upload_parallelism=UPLOAD_PARALLELISM)
    builder = BatchBuilder(location(url).blob, shard_id, schema, 0, CLOSED, config, inline_max_bytes=0)
    required = [f.name for f in schema.arrow if not f.nullable] + ["diff"]
    lo: int | None = None
    hi: int | None = None
    for t in tables:
        if t.num_rows == 0:
            continue
        for name in required:
            if name in t.column_names and t.column(name).null_count:
                raise SchemaMismatch(f"column {name!r} of shard {shard_id} is not nullable, but a row has a null")
        builder.add_table(t)
        mm = pc.min_max(t.column("ts")).as_py()
        lo = mm["min"] if lo is None else min(lo, mm["min"])
        hi = mm["max"] if hi is None else max(hi, mm["max"])
    parts = builder.finish().parts
    if parts:
        yield pa.RecordBatch.from_pydict(
            {
                "key": [p.key for p in parts],
                "rows": [p.rows for p in parts],
                "size": [p.size for p in parts],
                "crc": [p.crc for p in parts],
                "min_ts": pa.array([lo] * len(parts), pa.decimal128(20, 0)),
                "max_ts": pa.array([hi] * len(parts), pa.decimal128(20, 0)),
                "bounds": pa.array([_bounds_json(p) for p in parts], pa.string()),
            }
        )
