"""Arrow in and out: user data to a table's exact schema, and results to pandas / Polars.

Inputs accepted by ``insert`` / ``retract``: a ``pyarrow.Table`` or
``RecordBatch``, a pandas ``DataFrame``, a Polars ``DataFrame`` (or
``LazyFrame``, collected), a list of dicts (one per row), a dict of columns,
or a stream: a ``pyarrow.RecordBatchReader`` or any other object exporting
``__arrow_c_stream__`` (the Arrow PyCapsule interface: a DuckDB relation, a
DataFusion DataFrame, a Spark DataFrame given to ``retract``, ...).

Streams (:func:`stream_of`) are read batch by batch: ``insert`` conforms
each batch and hands it to the table's batch builder, which spills parts at
the part size, so memory stays bounded whatever the stream's length. A
stream's schema is checked (column names) before its first batch is read;
each batch's values are checked as it arrives. The in-memory kinds above
keep their own paths even where they export ``__arrow_c_stream__`` too
(pyarrow, pandas, Polars); a Spark DataFrame given to ``insert`` is written
by its executors (:mod:`txns.db.engines`) before any of this applies.

Conforming rules (:func:`conform`), each failure a ``SchemaMismatch`` naming
the table and column, raised before anything is written:

- the columns must be exactly the table's (any order): missing and
  unexpected ones are named;
- a column's type must be the table's, or one whose values convert without
  loss: a value converts when converting it back gives the same value
  (:func:`_convert`). So integers of other widths convert when every value
  fits; integers and decimals to floats when the float reads back as the same
  number (``2**53 + 1`` does not fit a float64, nor ``Decimal(2**60 + 1)``);
  floats to integers when they are whole; decimals to other precisions and
  scales, timestamps, times and durations to other units when nothing is cut
  off (nor overflows); a timestamp to a date only at midnight (a time of day
  is refused, not dropped); other string/binary encodings; an all-null
  column. The one rounding allowed: a float64 into a float32 (or float16)
  column rounds to the nearest float32, as every float32 store does
  (``16777217.0`` is stored as ``16777216.0``), but a finite value too large
  for it (``1e300``) is refused, never stored as ``inf``. A string where a
  number is expected is a mistake, not a conversion;
- timestamps without a time zone are UTC: a naive value into a column with a
  time zone is read as UTC, an aware value into a column without one is
  stored as its UTC time (as ``as_of`` reads a naive ``datetime``);
- a column the table declares non-nullable must hold no nulls.

Pandas and Polars are imported only when such an object is passed or asked
for.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from persist import InvalidUsage, SchemaMismatch

_ROWS_PER_CHUNK = 65_536

NOT_ARROW = (
    pa.ArrowInvalid,
    pa.ArrowTypeError,
    pa.ArrowNotImplementedError,
    TypeError,
    ValueError,
    OverflowError,
)
"""What converting Python values to Arrow raises when they do not fit (catch it to say which values)."""


def _kind(t: pa.DataType) -> str:
    if pa.types.is_null(t):
        return "null"
    if pa.types.is_integer(t):
        return "int"
    if pa.types.is_floating(t):
        return "float"
    if pa.types.is_boolean(t):
        return "bool"
    if pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_string_view(t):
        return "string"
    if (
        pa.types.is_binary(t)
        or pa.types.is_large_binary(t)
        or pa.types.is_binary_view(t)
        or pa.types.is_fixed_size_binary(t)
    ):
        return "binary"
    if pa.types.is_decimal(t):
        return "decimal"
    if pa.types.is_timestamp(t):
        return "timestamp"
    if pa.types.is_date(t):
        return "date"
    if pa.types.is_time(t):
        return "time"
    if pa.types.is_duration(t):
        return "duration"
    if pa.types.is_dictionary(t):
        return _kind(t.value_type)
    return str(t)


_CONVERTIBLE = {
    ("int", "float"),
    ("int", "decimal"),
    ("float", "int"),  # pandas turns int columns into floats; only exact values convert
    ("decimal", "float"),
    ("timestamp", "date"),
}


def _batches(data: object, table_name: str) -> Iterator[pa.RecordBatch | pa.Table]:
    """``data`` as Arrow pieces (streamed for readers), or InvalidUsage if it is no supported kind."""
    if isinstance(data, pa.Table):
        yield data
        return
    if isinstance(data, pa.RecordBatch):
        yield data
        return
    if isinstance(data, pa.RecordBatchReader):
        yield from data
        return
    module = _module(data)
    if module.startswith("pandas"):
        import pandas as pd

        if isinstance(data, pd.DataFrame):
            try:
                yield pa.Table.from_pandas(data, preserve_index=False)
            except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, ValueError) as e:
                raise SchemaMismatch(
                    f"table {table_name!r}: this pandas DataFrame cannot be converted to Arrow: {e}"
                ) from None
            return
    if module.startswith("polars"):
        import polars as pl

        if isinstance(data, pl.LazyFrame):
            data = data.collect()
        if isinstance(data, pl.DataFrame):
            yield data.to_arrow()
            return
    if isinstance(data, dict):
        try:
            yield pa.table(data)
        except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, ValueError) as e:
            raise SchemaMismatch(f"table {table_name!r}: these columns cannot be converted to Arrow: {e}") from None
        return
    if isinstance(data, (list, tuple)):
        yield from _rows(list(data), table_name)
        return
    reader = stream_of(data, table_name)
    if reader is not None:
        yield from reader
        return
    raise InvalidUsage(
        f"table {table_name!r}: cannot insert a {type(data).__module__}.{type(data).__name__}; pass a pyarrow "
        f"Table, RecordBatch or RecordBatchReader, a pandas or Polars DataFrame, a list of dicts, a dict of columns, "
        f"or any object exporting __arrow_c_stream__ (a DuckDB relation, a DataFusion DataFrame, ...)"
    )


def stream_of(data: object, table_name: str) -> pa.RecordBatchReader | None:
    """``data`` as a reader to consume batch by batch if it is a stream (see the module doc), else None.

    A foreign stream (not a ``RecordBatchReader``) is opened here: for a
    DuckDB relation that starts its query. InvalidUsage if the object's
    stream is not one of record batches (e.g. a Polars Series).
    """
    if isinstance(data, pa.RecordBatchReader):
        return data
    if isinstance(data, (pa.Table, pa.RecordBatch)) or _module(data).startswith(("pandas", "polars")):
        return None  # (in memory already: their own paths)
    if not hasattr(type(data), "__arrow_c_stream__"):
        return None
    try:
        return pa.RecordBatchReader.from_stream(_Exported(data))
    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError) as e:
        raise InvalidUsage(
            f"table {table_name!r}: this {_module(data)}.{type(data).__name__} exports an Arrow stream that is not "
            f"one of rows (record batches): {_short(e)}; pass a table-like object"
        ) from None


class _Exported:
    """An object's Arrow stream, asked for without a requested schema.

    We never ask a producer to cast (the conversions are ours, checked for
    loss), and some producers take no argument at all (DuckDB 1.1.0's
    relations), while ``RecordBatchReader.from_stream`` always passes one.
    """

    __slots__ = ("_obj",)

    def __init__(self, obj: Any) -> None:
        self._obj = obj

    def __arrow_c_stream__(self, requested_schema: object = None) -> object:
        if requested_schema is None:
            return self._obj.__arrow_c_stream__()
        return self._obj.__arrow_c_stream__(requested_schema)


def _module(data: object) -> str:
    return type(data).__module__ or ""


def _rows(rows: list[Any], table_name: str) -> Iterator[pa.Table]:
    """A list of dicts as Arrow, in chunks; every row must be a dict with the same keys."""
    if not rows:
        return
    for i, r in enumerate(rows):
        if not isinstance(r, dict):
            raise InvalidUsage(f"table {table_name!r}: row #{i} is a {type(r).__name__}, not a dict of column values")
    if not rows[0]:
        # (Arrow makes zero rows of empty dicts: the insert would do nothing, silently)
        raise SchemaMismatch(
            f"table {table_name!r}: row #0 has no columns; each row is a dict of the table's column values"
        )
    for start in range(0, len(rows), _ROWS_PER_CHUNK):
        chunk = rows[start : start + _ROWS_PER_CHUNK]
        names = list(chunk[0])
        for i, r in enumerate(chunk):
            if list(r) != names and set(r) != set(names):
                missing = sorted(set(names) - set(r))
                extra = sorted(set(r) - set(names))
                raise SchemaMismatch(
                    f"table {table_name!r}: row #{start + i} has different columns from row #0 "
                    f"(missing {missing}, unexpected {extra})"
                )
        cols: dict[str, list[Any]] = {n: [r[n] for r in chunk] for n in names}
        arrays = {}
        for n, values in cols.items():
            try:
                arrays[n] = pa.array(values)
            except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, OverflowError) as e:
                bad = next((v for v in values if not _same_kind(v, values)), values[0])
                raise SchemaMismatch(
                    f"table {table_name!r}: column {n!r} has mixed or unsupported values ({bad!r}): {e}"
                ) from None
        yield pa.table(arrays) if arrays else pa.table({})


def _same_kind(v: object, values: list[Any]) -> bool:
    first = next((x for x in values if x is not None), None)
    return v is None or first is None or type(v) is type(first)


def conform(piece: pa.Table | pa.RecordBatch, schema: pa.Schema, table_name: str) -> pa.Table:
    """``piece`` with exactly ``schema`` (see the module doc), or SchemaMismatch."""
    table = piece if isinstance(piece, pa.Table) else pa.Table.from_batches([piece])
    have = list(table.column_names)
    want = list(schema.names)
    missing = [n for n in want if n not in have]
    extra = [n for n in have if n not in want]
    if missing or extra:
        raise SchemaMismatch(
            f"table {table_name!r} has columns {want}; the data is missing {missing} and has unexpected {extra}: "
            f"select, rename or add columns so that the data has exactly the table's"
        )
    if len(set(have)) != len(have):
        raise SchemaMismatch(f"table {table_name!r}: the data repeats a column: {have}")
    arrays = []
    for field in schema:
        col = table.column(field.name)
        if not col.type.equals(field.type):
            col = _convert(col, field, table_name)
        if not field.nullable and col.null_count:
            raise SchemaMismatch(
                f"table {table_name!r}: column {field.name!r} is not nullable, but {col.null_count} value(s) are null"
            )
        arrays.append(col)
    return pa.Table.from_arrays(arrays, schema=schema)


def _convert(col: pa.ChunkedArray, field: pa.Field, table_name: str) -> pa.ChunkedArray:
    """``col`` as ``field``'s type, or SchemaMismatch: only when every value converts without loss.

    Arrow's safe cast refuses overflow and truncation for most pairs, but not
    all (a float64 overflowing a float32 becomes ``inf``; a decimal or an
    integer rounds into a float; a timestamp drops its time of day into a
    date), so every conversion is also checked by converting back: the
    values must come back equal. Float-to-float is the exception: it rounds
    (see the module doc) and only overflow is refused.
    """
    src, dst = col.type, field.type
    if pa.types.is_dictionary(src):
        col, src = col.cast(src.value_type), src.value_type
    ks, kd = _kind(src), _kind(dst)
    all_null = col.null_count == len(col)
    if not (ks == kd or ks == "null" or (ks, kd) in _CONVERTIBLE or all_null):
        raise SchemaMismatch(
            f"table {table_name!r}: column {field.name!r} is {dst}, but the data has {src}; "
            f"convert it first (e.g. pyarrow.compute.cast)"
        )
    try:
        if ks == "int" and kd == "decimal" and pa.types.is_decimal128(dst) and 0 <= dst.scale <= 18:
            # (Arrow checks an integer against the decimal's precision by its type, not its values:
            # through the widest decimal, the values are checked)
            col = pc.cast(col, pa.decimal128(38, dst.scale), safe=True)
        out = pc.cast(col, dst, safe=True)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError) as e:
        raise SchemaMismatch(
            f"table {table_name!r}: column {field.name!r} ({src}) does not fit {dst} without loss: {_short(e)}"
        ) from None
    if ks == "null" or all_null:
        return out
    if ks == kd and ks in ("string", "binary"):
        # another layout of the same bytes (views, 64-bit offsets): the safe cast is the check (and
        # pyarrow before 19 cannot compare string views, which DataFusion's streams carry)
        return out
    if ks == "float" and kd == "float":
        lost = pc.and_(_is_finite(col), pc.invert(_is_finite(out)))
    else:
        try:
            back = pc.cast(out, src, safe=False)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError):
            return out  # (no way back to compare with: the safe cast above is the check)
        lost = pc.not_equal(back, col)
        if ks == "float":  # NaN converts to NaN (it never equals itself)
            lost = pc.and_(lost, pc.invert(pc.and_(pc.is_nan(back), pc.is_nan(col))))
    lost = pc.fill_null(lost, False)
    if pc.any(lost).as_py():
        i = pc.index(lost, True).as_py()
        raise SchemaMismatch(
            f"table {table_name!r}: column {field.name!r} is {dst}, and the value {col[i].as_py()!r} ({src}) "
            f"does not convert without loss (it would be stored as {out[i].as_py()!r}); convert the data "
            f"yourself if that is what you want, or give the column a type that holds it"
        )
    return out


def _is_finite(values: Any) -> Any:
    """``pc.is_finite``, also for half floats (pyarrow before 19 has no such kernel: through float32, exact)."""
    if pa.types.is_float16(values.type):
        values = pc.cast(values, pa.float32())
    return pc.is_finite(values)


def _short(e: Exception, limit: int = 300) -> str:
    """An Arrow error's message, cut to ``limit`` characters (a float's repr in it can run to 300 digits)."""
    text = str(e)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def conformed(data: object, schema: pa.Schema, table_name: str) -> Iterator[pa.Table]:
    """``data`` (any supported input) as tables of exactly ``schema``, streamed piece by piece."""
    for piece in _batches(data, table_name):
        if piece.num_columns == 0 and piece.num_rows == 0:
            continue
        yield conform(piece, schema, table_name)


def conformed_stream(reader: pa.RecordBatchReader, schema: pa.Schema, table_name: str) -> Iterator[pa.Table]:
    """``reader``'s batches as tables of exactly ``schema``, one at a time; its columns are checked first.

    SchemaMismatch before any batch is read when the stream's columns are not
    the table's (an empty stream with the wrong columns is refused too).
    """
    conform(reader.schema.empty_table(), schema, table_name)
    for batch in reader:
        if batch.num_rows:
            yield conform(batch, schema, table_name)


def arrow_pieces(data: object, table_name: str) -> Iterator[pa.RecordBatch | pa.Table]:
    """``data`` (any supported input) as Arrow pieces, unconformed (columns and types as given)."""
    yield from _batches(data, table_name)


def check_input(data: object, table_name: str) -> None:
    """InvalidUsage now (before any write) if ``data`` is no supported input kind."""
    if data is None:
        raise InvalidUsage(f"table {table_name!r}: nothing to write (got None)")


def to_pandas(table: pa.Table) -> Any:
    """``table`` as a pandas DataFrame."""
    return table.to_pandas()


def to_polars(table: pa.Table) -> Any:
    """``table`` as a Polars DataFrame (Polars must be installed)."""
    try:
        import polars as pl
    except ImportError:
        raise InvalidUsage("to_polars needs Polars: pip install polars") from None
    return pl.from_arrow(table)


__all__ = [
    "arrow_pieces",
    "check_input",
    "conform",
    "conformed",
    "conformed_stream",
    "stream_of",
    "to_pandas",
    "to_polars",
]
