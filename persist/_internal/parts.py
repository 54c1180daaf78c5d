"""Data parts: how a batch's updates are stored.

A *part* is one Parquet object in blob storage, written once under a unique
key and never changed. Its rows are sorted by (key fields, val fields, ts).
Its CRC-32C and size are recorded in the :class:`PartRef` that the shard
state holds, and every read checks them, so a corrupt or truncated part is
never decoded. Small batches are *inline*: their rows are kept in the state
itself as Arrow IPC bytes (the state's own checksum covers them).

A :class:`Run` is the unit a batch is made of: parts and/or inline rows that
share one optional ``ts_rewrite``; reading a run advances every update time
to at least ``ts_rewrite`` (re-timestamping without rewriting any data).

Key bounds: a :class:`PartRef` may carry ``lo``/``hi``, the least and
greatest value of the part's first column (the shard's first key field),
computed by :func:`write_part` (which every part goes through: batches,
compaction, Spark writes) with ``pyarrow.compute.min_max``, never inferred
from the sort order. They are JSON scalars that order as the column does
(:func:`bound_value`): integers as ints; strings as str (UTF-8 byte order is
code point order); dates, times and timestamps as the int they are stored
as. Other types (floats, decimals, binary, bool, durations, nested...), a
column with a null, or an empty part: no bounds. Each bound is optional on
its own (None: unbounded on that side): a string minimum longer than
:data:`BOUND_MAX_BYTES` UTF-8 bytes is stored as its prefix of at most that
many bytes (a prefix is <= the string: still a lower bound), a longer
maximum is not stored. Readers prune with :meth:`PartRef.may_contain_first_key`
or :func:`prune_runs`; a part without bounds is never pruned.
"""

from __future__ import annotations

import base64
import bisect
import io
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any, cast

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from persist._internal.codec import FORMAT_VERSION, crc32c
from persist._internal.ids import random_hex
from persist._internal.retry import retry_storage
from persist.errors import CorruptObject
from persist.location import Blob

PARQUET_META = {b"persist.format": str(FORMAT_VERSION).encode()}


Bound = int | str
"""A key bound as stored (see the module doc): it orders as the column's values do."""

BOUND_MAX_BYTES = 64
"""Longest string bound stored (UTF-8 bytes): keeps the state small."""


@dataclass(frozen=True)
class PartRef:
    """A pointer to one Parquet part in blob storage.

    ``lo``/``hi``: bounds of the part's first column (the shard's first key
    field) over its rows, or None when unknown (see the module doc). As JSON:
    ``[key, rows, size, crc]``, plus ``lo, hi`` (either may be null) when a
    bound is known; a descriptor without them (older states) has none.
    """

    key: str
    rows: int
    size: int
    crc: int
    lo: Bound | None = None
    hi: Bound | None = None

    def to_json(self) -> list[Any]:
        j: list[Any] = [self.key, self.rows, self.size, self.crc]
        if self.lo is not None or self.hi is not None:
            j += [self.lo, self.hi]
        return j

    @staticmethod
    def from_json(j: list[Any]) -> PartRef:
        lo, hi = (j[4], j[5]) if len(j) >= 6 else (None, None)
        return PartRef(j[0], j[1], j[2], j[3], lo, hi)

    def may_contain_first_key(self, value: Bound | None) -> bool:
        """Whether the part may hold a row whose first column is ``value`` (as :func:`bound_value` gives it).

        False only when a known bound excludes it; ``value`` None (not
        comparable) or of another kind than the bounds: True.
        """
        if value is None:
            return True
        for b in (self.lo, self.hi):
            if b is not None and type(b) is not type(value):
                return True
        return (self.lo is None or self.lo <= value) and (self.hi is None or value <= self.hi)  # type: ignore[operator]


@dataclass(frozen=True)
class Run:
    """Parts and inline rows that share one ``ts_rewrite``.

    ``distinct_kv``: no two rows of the run (over all its parts and inline
    rows) have the same ``(key, val)``, whatever their times, and no diff is
    zero. A snapshot that reads only such a run needs no consolidation
    (compaction sets it when every merged time was advanced to one since).
    Re-timestamping keeps it: it changes times only.
    """

    parts: tuple[PartRef, ...] = ()
    inline: bytes | None = None
    rows: int = 0
    ts_rewrite: int | None = None
    distinct_kv: bool = False

    @property
    def size(self) -> int:
        return sum(p.size for p in self.parts) + (len(self.inline) if self.inline else 0)

    def rewritten(self, ts: int) -> Run:
        new = ts if self.ts_rewrite is None else max(ts, self.ts_rewrite)
        return Run(self.parts, self.inline, self.rows, new, self.distinct_kv)

    def to_json(self) -> dict[str, Any]:
        j: dict[str, Any] = {"rows": self.rows}
        if self.parts:
            j["parts"] = [p.to_json() for p in self.parts]
        if self.inline is not None:
            j["inline"] = base64.b64encode(self.inline).decode()
        if self.ts_rewrite is not None:
            j["ts_rewrite"] = self.ts_rewrite
        if self.distinct_kv:
            j["distinct_kv"] = True
        return j

    @staticmethod
    def from_json(j: dict[str, Any]) -> Run:
        return Run(
            parts=tuple(PartRef.from_json(p) for p in j.get("parts", ())),
            inline=base64.b64decode(j["inline"]) if "inline" in j else None,
            rows=j["rows"],
            ts_rewrite=j.get("ts_rewrite"),
            distinct_kv=j.get("distinct_kv", False),
        )


def runs_rows(runs: tuple[Run, ...]) -> int:
    """How many updates ``runs`` hold."""
    return sum(r.rows for r in runs)


def runs_size(runs: tuple[Run, ...]) -> int:
    """How many bytes ``runs`` hold (parts and inline rows)."""
    return sum(r.size for r in runs)


def part_key(shard_id: str) -> str:
    """A fresh, unique blob key for a part of ``shard_id``.

    The key embeds the wall-clock write time so that leaked parts (written,
    never referenced) can be found by age without a metadata request.
    """
    return f"{shard_id}/parts/{int(time.time() * 1000):013d}-{random_hex()}"


def part_written_ms(key: str) -> int | None:
    """The write time embedded in a part key, or None if the key is not a part."""
    name = key.rsplit("/", 1)[-1]
    head = name.split("-", 1)[0]
    return int(head) if head.isascii() and head.isdigit() else None


def sort_updates(table: pa.Table) -> pa.Table:
    """Rows sorted by every column but ``diff`` (key, val, ts).

    Rows whose first column strictly increases are in that order already
    (no ties for the later columns to break): they are returned as they are
    (chunks too: no copy), after one comparison pass instead of a sort
    (inserts of a sequence, a query's ordered result). Sorted rows are
    contiguous.
    """
    if table.num_rows <= 1 or _strictly_increasing(table.column(0)):
        return table
    order = [(n, "ascending") for n in table.column_names if n != "diff"]
    try:
        return table.combine_chunks().sort_by(order)
    except (pa.ArrowNotImplementedError, pa.ArrowInvalid):
        return table  # a type Arrow cannot sort; parts stay unsorted, which is allowed


def _strictly_increasing(col: pa.ChunkedArray) -> bool:
    """Whether every value of ``col`` is greater than the one before (no nulls), for types that
    compare as they sort (integers, strings, binary, dates, times, timestamps); False for others."""
    t = col.type
    if col.null_count or not (pa.types.is_integer(t) or _stringy(t) or _binary(t) or _temporal(t)):
        return False
    try:
        return bool(pc.all(pc.greater(col.slice(1), col.slice(0, len(col) - 1))).as_py())
    except (pa.ArrowNotImplementedError, pa.ArrowInvalid):
        return False


def _binary(t: pa.DataType) -> bool:
    binary: bool = pa.types.is_binary(t) or pa.types.is_large_binary(t)
    return binary


DICTIONARY_PAGE_MAX = 16 << 10
"""A column's Parquet dictionary stops growing past this (then plain encoding): low-cardinality
columns keep their dictionaries, high-cardinality ones skip a costly one (about 2x faster to
encode and to decode, and smaller, on 200k rows with a random-string column)."""


def encode_parquet(table: pa.Table) -> bytes:
    buf = io.BytesIO()
    table = table.replace_schema_metadata(PARQUET_META)
    pq.write_table(
        table, buf, compression="zstd", write_page_checksum=True, dictionary_pagesize_limit=DICTIONARY_PAGE_MAX
    )
    return buf.getvalue()


def write_part(blob: Blob, shard_id: str, table: pa.Table, key: str | None = None) -> PartRef:
    """Write ``table`` (already sorted) as a part; return its ref (with its first column's bounds).

    ``key``: the part's key (default: a fresh one). Writing the same table to
    the same key again is idempotent, so a retried upload reuses its key and
    an attempt that landed but reported a failure leaks nothing.
    """
    data = encode_parquet(table)
    key = key or part_key(shard_id)
    blob.set(key, data)
    lo, hi = first_column_bounds(table)
    return PartRef(key=key, rows=table.num_rows, size=len(data), crc=crc32c(data), lo=lo, hi=hi)


def _temporal(t: pa.DataType) -> bool:
    temporal: bool = pa.types.is_date(t) or pa.types.is_timestamp(t) or pa.types.is_time(t)
    return temporal


def _stringy(t: pa.DataType) -> bool:
    stringy: bool = pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_string_view(t)
    return stringy


def bound_value(value: pa.Scalar) -> Bound | None:
    """``value`` as a key bound compares it (see the module doc); None for a null or a type without bounds."""
    if not value.is_valid:
        return None
    t = value.type
    if pa.types.is_integer(t) or _stringy(t):
        return value.as_py()  # type: ignore[no-any-return]
    if _temporal(t):
        return int(value.value)
    return None


def bound_values(values: Iterable[object], t: pa.DataType) -> list[Bound | None]:
    """:func:`bound_value` of each of ``values`` (Python values of Arrow type ``t``, as Arrow gives them back).

    Integers and strings are their own bounds: no Arrow scalar is made for
    them (a point read of thousands of keys made one each).
    """
    if pa.types.is_integer(t) or _stringy(t):
        return list(values)  # type: ignore[arg-type]
    return [bound_value(pa.scalar(v, t)) for v in values]


def bounded_type(t: pa.DataType) -> bool:
    """Whether a first column of type ``t`` gets key bounds (see the module doc)."""
    return pa.types.is_integer(t) or _stringy(t) or _temporal(t)


def first_column_bounds(table: pa.Table) -> tuple[Bound | None, Bound | None]:
    """(least, greatest) value of ``table``'s first column as stored bounds; None where unknown."""
    if table.num_columns == 0 or table.num_rows == 0:
        return None, None
    col = table.column(0)
    if not bounded_type(col.type) or col.null_count:
        return None, None
    try:
        mm = pc.min_max(col)
    except (pa.ArrowNotImplementedError, pa.ArrowInvalid, pa.ArrowTypeError):
        return None, None
    lo, hi = bound_value(mm["min"]), bound_value(mm["max"])
    if isinstance(lo, str) and len(lo.encode()) > BOUND_MAX_BYTES:
        lo = lo.encode()[:BOUND_MAX_BYTES].decode("utf-8", "ignore")  # a prefix: still a lower bound
    if isinstance(hi, str) and len(hi.encode()) > BOUND_MAX_BYTES:
        hi = None
    return lo, hi


def prune_runs(runs: tuple[Run, ...], values: Iterable[Bound | None]) -> tuple[Run, ...]:
    """``runs`` without the parts whose bounds exclude every one of ``values`` (first-column values).

    ``values`` as :func:`bound_value` gives them; one that is None (not
    comparable) keeps every part. Inline rows are kept; a run left with
    neither parts nor inline rows is dropped. Each run's ``rows`` counts
    what it keeps.
    """
    vals = list(values)
    if any(v is None for v in vals) or len({type(v) for v in vals}) > 1:
        return runs
    ordered: list[Any] = sorted(cast("list[Any]", vals))  # values of one kind (checked above): comparable

    def keep(ref: PartRef) -> bool:
        if any(b is not None and type(b) is not type(v) for b in (ref.lo, ref.hi) for v in ordered[:1]):
            return True  # bounds of another kind: not comparable
        # the least value >= lo is the only one to check against hi
        i = 0 if ref.lo is None else bisect.bisect_left(ordered, ref.lo)
        return i < len(ordered) and ref.may_contain_first_key(ordered[i])

    return keep_parts(runs, keep)


def keep_parts(runs: tuple[Run, ...], keep: Callable[[PartRef], bool]) -> tuple[Run, ...]:
    """``runs`` with only the parts ``keep`` accepts; inline rows kept, a run left empty dropped, rows recounted."""
    out = []
    for run in runs:
        parts = tuple(p for p in run.parts if keep(p))
        if len(parts) == len(run.parts):
            out.append(run)
        elif parts or run.inline is not None:
            rows = run.rows - sum(p.rows for p in run.parts) + sum(p.rows for p in parts)
            out.append(Run(parts, run.inline, rows, run.ts_rewrite, run.distinct_kv))
    return tuple(out)


IMPLIED_COLUMNS: dict[str, pa.Scalar] = {"ts": pa.scalar(0, pa.uint64()), "diff": pa.scalar(1, pa.int64())}
"""Columns a part written by another engine may leave out, and the value of every row then.

Spark's native write path leaves out ``ts`` (every row at time 0; the
batch's ``ts_rewrite`` gives the real time) and, unless the DataFrame has a
``diff`` column, ``diff`` (every row an insertion): writing two constant
columns was about a fifth of that write's time. Persist's own parts always
hold both.
"""


def read_part_table(
    data: bytes,
    columns: list[str] | None = None,
    filter: pc.Expression | None = None,
    opened: pq.ParquetFile | None = None,
) -> pa.Table:
    """``columns`` (None: all) of a part's checked Parquet bytes, ``filter`` applied.

    A column of :data:`IMPLIED_COLUMNS` that the file leaves out is filled in
    with its constant (before ``filter``, which may refer to it). ``opened``:
    the caller's ``ParquetFile`` of ``data`` (its footer parsed once). Decode
    failures raise as pyarrow raises them; callers report them as corrupt.
    """
    f = opened if opened is not None else pq.ParquetFile(pa.BufferReader(data))
    names = f.schema_arrow.names
    missing = [c for c in IMPLIED_COLUMNS if c not in names]
    if not missing:
        if filter is None:
            return f.read(columns=columns)
        return pq.read_table(pa.BufferReader(data), columns=columns, filters=filter)
    # (a filter may name columns outside the projection: read them all then)
    present = None if columns is None or filter is not None else [c for c in columns if c in names]
    table = f.read(columns=present)
    for name in missing:
        value = IMPLIED_COLUMNS[name]
        table = table.append_column(pa.field(name, value.type, nullable=False), pa.repeat(value, table.num_rows))
    if filter is not None:
        table = table.filter(filter)
    return table if columns is None else table.select(columns)


def decode_part(ref: PartRef, data: bytes | None, schema: pa.Schema) -> pa.Table:
    """The rows of part ``ref`` from its bytes, after checking size and CRC."""
    if data is None:
        raise MissingPart(ref.key)
    check_part_bytes(ref, data)
    try:
        table = read_part_table(data)
    except Exception as e:  # noqa: BLE001 - any decode failure means corrupt
        raise CorruptObject(ref.key, f"unreadable Parquet: {e}") from None
    return table.replace_schema_metadata(None).select(schema.names).cast(schema)


def check_part_bytes(ref: PartRef, data: bytes) -> None:
    """CorruptObject unless ``data`` has the size and CRC-32C that part ``ref`` records."""
    if len(data) != ref.size:
        raise CorruptObject(ref.key, f"size {len(data)} != recorded {ref.size}")
    if crc32c(data) != ref.crc:
        raise CorruptObject(ref.key, "CRC-32C mismatch with the part descriptor")


class MissingPart(Exception):
    """Internal: a referenced part was not found (compaction may have replaced it)."""

    def __init__(self, key: str) -> None:
        super().__init__(key)
        self.key = key


def encode_inline(table: pa.Table) -> bytes:
    """``table`` as one Arrow IPC record batch message, without the schema.

    The reader always knows the shard's schema, so the (often larger than
    the rows) schema message is left out: small commits stay small.
    """
    batches = table.combine_chunks().to_batches()
    batch = batches[0] if batches else pa.RecordBatch.from_pylist([], schema=table.schema)
    data: bytes = batch.serialize().to_pybytes()
    return data


def decode_inline(data: bytes, schema: pa.Schema) -> pa.Table:
    """The rows of :func:`encode_inline`'s bytes, read with the shard's ``schema``."""
    batch = pa.ipc.read_record_batch(pa.py_buffer(data), schema)
    return pa.Table.from_batches([batch], schema=schema)


def apply_rewrite(table: pa.Table, ts_rewrite: int | None) -> pa.Table:
    """Advance every update time in ``table`` to at least ``ts_rewrite``."""
    if ts_rewrite is None or table.num_rows == 0:
        return table
    idx = table.column_names.index("ts")
    ts = pc.max_element_wise(table.column("ts"), pa.scalar(ts_rewrite, pa.uint64()))
    return table.set_column(idx, "ts", ts)


def read_run(blob: Blob, run: Run, schema: pa.Schema, retry_deadline_s: float = 30.0) -> Iterator[pa.Table]:
    """The tables of a run, one per part (plus one for inline rows), rewritten.

    A failed part get is retried for up to ``retry_deadline_s``.
    """
    if run.inline is not None:
        yield apply_rewrite(decode_inline(run.inline, schema), run.ts_rewrite)
    for ref in run.parts:
        yield apply_rewrite(decode_part(ref, get_retrying(blob, ref.key, retry_deadline_s), schema), run.ts_rewrite)


def get_retrying(blob: Blob, key: str, deadline_s: float = 30.0) -> bytes | None:
    """``blob.get(key)``, retrying failed gets (they change nothing) for up to ``deadline_s``."""
    return retry_storage(lambda: blob.get(key), deadline_s)


SMALL_TABLE_ROWS = 64
"""Tables up to this many rows are consolidated (and their times checked) in Python: starting an Arrow
kernel (an aggregation: ~0.2 ms) costs more than a commit's few rows take."""


def exact_key_type(t: pa.DataType) -> bool:
    """Whether Python equality and order of ``t``'s values are Arrow's grouping equality and sort order
    (no floats: NaN, -0.0)."""
    return bool(
        pa.types.is_integer(t)
        or pa.types.is_string(t)
        or pa.types.is_large_string(t)
        or pa.types.is_binary(t)
        or pa.types.is_large_binary(t)
        or pa.types.is_boolean(t)
    )


def _consolidate_small(table: pa.Table, group: list[str]) -> pa.Table:
    """:func:`consolidate` of a small table whose non-diff columns have exact types (same result)."""
    keys = list(zip(*(table.column(n).to_pylist() for n in group), strict=True))
    diffs = table.column("diff").to_pylist()
    sums: dict[tuple[Any, ...], list[int]] = {}  # key -> [first row, summed diff]
    for i, (k, d) in enumerate(zip(keys, diffs, strict=True)):
        cur = sums.get(k)
        if cur is None:
            sums[k] = [i, d]
        else:
            cur[1] += d
    kept = [(i, d) for i, d in sums.values() if d != 0]
    out = table.take(pa.array([i for i, _ in kept], pa.int64()))
    idx = table.column_names.index("diff")
    out = out.set_column(idx, table.schema.field(idx), pa.array([d for _, d in kept], table.schema.field(idx).type))
    return sort_updates(out)


def consolidate(table: pa.Table, advance_to: int | None = None) -> pa.Table:
    """Sum diffs of equal (key, val, ts), drop zeros, sort.

    With ``advance_to``, times below it are first advanced to it (what
    compaction does with the since, and what a snapshot does with its as_of).
    """
    if advance_to is not None and table.num_rows:
        idx = table.column_names.index("ts")
        ts = pc.max_element_wise(table.column("ts"), pa.scalar(advance_to, pa.uint64()))
        table = table.set_column(idx, "ts", ts)
    if table.num_rows == 0:
        return table
    schema = table.schema
    group = [n for n in table.column_names if n != "diff"]
    if table.num_rows <= SMALL_TABLE_ROWS and all(exact_key_type(schema.field(n).type) for n in group):
        try:
            return _consolidate_small(table, group)
        except (OverflowError, pa.ArrowInvalid):
            pass  # a sum past 64 bits: Arrow's aggregation decides, as for a big table
    out = table.group_by(group, use_threads=False).aggregate([("diff", "sum")])
    out = out.rename_columns([*group, "diff"]) if out.column_names[-1] != "diff" else out
    out = out.filter(pc.not_equal(out.column("diff"), 0))
    return sort_updates(out.select(schema.names).cast(schema))
