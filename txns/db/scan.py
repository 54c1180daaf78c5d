"""Reading a table's snapshot plan as Arrow: projection and filters pushed into Parquet, bounded memory.

A snapshot plan (``persist.SnapshotPlan``) is a list of runs; each run is
parts (Parquet, rows sorted within a part) and/or inline rows, with an
optional time rewrite. A row's multiplicity at ``as_of`` is the sum of the
diffs of its updates with ``ts <= as_of``, over every run.

Every piece read here is projected to the asked columns (plus ``diff``) and
filtered (the user's filter and ``ts <= as_of``) inside the Parquet read,
after the part's size and CRC-32C are checked against its descriptor.

Consolidation works on the projected rows: a projected row appears as many
times as the sum of the diffs of the rows that project to it (a multiset
projection). A multiplicity that sums to zero or less means absent.

:func:`read_table` reads everything into memory (``to_arrow``). When no diff
is negative (tables only inserted into, or compacted) no grouping is needed
at all: rows are returned as stored.

:func:`scan` streams with memory bounded by one part plus the *delta*: every
run but the largest, and the retractions within the largest. The largest run
is read part by part; a first pass over its parts (only when it has several)
collects its retractions, because a retraction in a later part may cancel a
row of an earlier one. Size-tiered compaction keeps the runs other than the
largest small relative to it.
"""

from __future__ import annotations

import io
from collections.abc import Iterator

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from persist import CorruptObject, InvalidUsage, SnapshotPlan
from persist.codec import crc32c
from persist.location import Blob
from persist.parts import MissingPart, PartRef, Run, decode_inline, get_retrying

IN_MEMORY_BYTES = 64 << 20
"""Plans up to this many stored bytes are consolidated in memory by ``scan`` (one pass)."""


def check_columns(schema: pa.Schema, columns: object) -> list[str]:
    """The projection as a list of column names, or InvalidUsage."""
    if columns is None:
        return list(schema.names)
    if isinstance(columns, str) or not all(isinstance(c, str) for c in columns):  # type: ignore[union-attr]
        raise InvalidUsage(f"columns must be a list of column names, got {columns!r}")
    cols = list(columns)  # type: ignore[call-overload]
    if not cols:
        raise InvalidUsage("columns must name at least one column (or be None for all)")
    unknown = [c for c in cols if c not in schema.names]
    if unknown:
        raise InvalidUsage(f"unknown column(s) {unknown}; the table has {list(schema.names)}")
    if len(set(cols)) != len(cols):
        raise InvalidUsage(f"columns repeat a name: {cols}")
    return cols


def check_filter(schema: pa.Schema, filter: object) -> pc.Expression | None:
    """The filter as an Arrow expression over the table's columns, or InvalidUsage."""
    if filter is None:
        return None
    if not isinstance(filter, pc.Expression):
        raise InvalidUsage(
            f"filter must be a pyarrow.compute expression such as pc.field('balance') > 0, got {type(filter).__name__}"
        )
    try:
        schema.empty_table().filter(filter)
    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError, TypeError) as e:
        raise InvalidUsage(f"filter {filter} does not apply to the table's columns {list(schema.names)}: {e}") from None
    return filter


class PlanReader:
    """Reads the pieces of one plan: projected, filtered, rows with ``ts <= as_of`` only, ``diff`` kept."""

    def __init__(
        self,
        blob: Blob,
        plan: SnapshotPlan,
        columns: list[str],
        filter: pc.Expression | None,
        retry_deadline_s: float,
    ) -> None:
        self.blob, self.plan = blob, plan
        self.columns = columns
        self.arrow = plan.schema.arrow  # key columns, ts, diff
        self.out_schema = pa.schema([self.arrow.field(c) for c in columns])
        self.filter = filter
        self.retry_deadline_s = retry_deadline_s

    def _expr(self, negative_only: bool) -> pc.Expression:
        e = pc.field("ts") <= pa.scalar(self.plan.as_of, pa.uint64())
        if self.filter is not None:
            e = e & self.filter
        if negative_only:
            e = e & (pc.field("diff") < 0)
        return e

    def _finish(self, table: pa.Table, run: Run) -> pa.Table:
        return table.select([*self.columns, "diff"]).cast(pa.schema([*self.out_schema, self.arrow.field("diff")]))

    def inline(self, run: Run, negative_only: bool = False) -> pa.Table | None:
        if run.inline is None:
            return None
        t = decode_inline(run.inline, self.arrow)
        if run.ts_rewrite is not None and t.num_rows:
            t = t.set_column(
                t.column_names.index("ts"),
                "ts",
                pc.max_element_wise(t.column("ts"), pa.scalar(run.ts_rewrite, pa.uint64())),
            )
        return self._finish(t.filter(self._expr(negative_only)), run)

    def part(self, run: Run, ref: PartRef, negative_only: bool = False) -> pa.Table:
        data = get_retrying(self.blob, ref.key, self.retry_deadline_s)
        if data is None:
            raise MissingPart(ref.key)
        if len(data) != ref.size:
            raise CorruptObject(ref.key, f"size {len(data)} != recorded {ref.size}")
        if crc32c(data) != ref.crc:
            raise CorruptObject(ref.key, "CRC-32C mismatch with the part descriptor")
        if run.ts_rewrite is not None and run.ts_rewrite > self.plan.as_of:
            return self.empty()
        # A rewritten time is max(ts, rewrite), which is <= as_of iff both are:
        # the rewrite was checked just above, so filtering on the stored ts is exact.
        try:
            t = pq.read_table(io.BytesIO(data), columns=[*self.columns, "diff"], filters=self._expr(negative_only))
        except Exception as e:  # noqa: BLE001 - any decode failure of a checked part means corrupt
            raise CorruptObject(ref.key, f"unreadable Parquet: {e}") from None
        return self._finish(t.replace_schema_metadata(None), run)

    def run_pieces(self, run: Run, negative_only: bool = False) -> Iterator[pa.Table]:
        t = self.inline(run, negative_only)
        if t is not None:
            yield t
        for ref in run.parts:
            yield self.part(run, ref, negative_only)

    def empty(self) -> pa.Table:
        return pa.schema([*self.out_schema, self.arrow.field("diff")]).empty_table()


def consolidate(table: pa.Table, columns: list[str]) -> pa.Table:
    """Rows ``(columns..., diff)`` as the multiset they stand for: each row repeated by its summed diff."""
    if table.num_rows == 0:
        return table.drop_columns(["diff"])
    diff = table.column("diff")
    if pc.min(diff).as_py() < 0:
        grouped = table.group_by(columns, use_threads=False).aggregate([("diff", "sum")])
        grouped = grouped.rename_columns([*columns, "diff"])
        table = grouped.filter(pc.greater(grouped.column("diff"), 0)).select([*columns, "diff"])
    return expand(table)


def expand(table: pa.Table) -> pa.Table:
    """Rows with positive ``diff`` repeated ``diff`` times; ``diff`` dropped."""
    if table.num_rows == 0:
        return table.drop_columns(["diff"])
    diff = table.column("diff")
    mm = pc.min_max(diff).as_py()
    if mm["min"] == 1 and mm["max"] == 1:
        return table.drop_columns(["diff"])
    counts = np.maximum(diff.to_numpy(), 0)
    idx = np.repeat(np.arange(table.num_rows), counts)
    return table.drop_columns(["diff"]).take(pa.array(idx))


def read_table(reader: PlanReader) -> pa.Table:
    """The whole snapshot, consolidated, in memory."""
    pieces = [t for run in reader.plan.runs for t in reader.run_pieces(run)]
    table = pa.concat_tables(pieces) if pieces else reader.empty()
    return consolidate(table, reader.columns).cast(reader.out_schema)


def scan(reader: PlanReader, in_memory_bytes: int = IN_MEMORY_BYTES) -> Iterator[pa.RecordBatch]:
    """The snapshot as record batches, with bounded memory (see the module doc)."""
    runs = list(reader.plan.runs)
    if not runs or sum(r.size for r in runs) <= in_memory_bytes:
        yield from read_table(reader).to_batches()
        return
    big = max(runs, key=lambda r: r.size)
    rest = [r for r in runs if r is not big]
    pieces = [t for r in rest for t in reader.run_pieces(r)]
    two_pass = len(big.parts) + (big.inline is not None) > 1
    if two_pass:
        # pass 1: the big run's retractions, which may cancel rows of any of its pieces
        pieces += list(reader.run_pieces(big, negative_only=True))
    delta = _grouped(pieces, reader)  # projected row -> summed diff, nonzero
    for piece in reader.run_pieces(big):
        if two_pass:
            piece = piece.filter(pc.greater(piece.column("diff"), 0))  # its retractions are in the delta
        if piece.num_rows == 0:
            continue
        out, delta = _apply_delta(piece, delta, reader)
        if out.num_rows:
            yield from expand(out).cast(reader.out_schema).to_batches()
    left = delta.filter(pc.greater(delta.column("diff"), 0))
    if left.num_rows:
        yield from expand(left).cast(reader.out_schema).to_batches()


def _grouped(pieces: list[pa.Table], reader: PlanReader) -> pa.Table:
    """The pieces' rows with equal projected values summed; zero sums dropped."""
    pieces = [p for p in pieces if p.num_rows]
    if not pieces:
        return reader.empty()
    t = pa.concat_tables(pieces)
    g = t.group_by(reader.columns, use_threads=False).aggregate([("diff", "sum")])
    g = g.rename_columns([*reader.columns, "diff"])
    g = g.filter(pc.not_equal(g.column("diff"), 0)).select([*reader.columns, "diff"])
    return g.cast(t.schema)


def _apply_delta(piece: pa.Table, delta: pa.Table, reader: PlanReader) -> tuple[pa.Table, pa.Table]:
    """The piece's rows net of the delta's outstanding retractions, and the delta left over.

    Grouping (not a join) matches rows, so nulls match nulls. Rows of the
    delta with a positive sum stay in it until the end of the scan.
    """
    neg = delta.filter(pc.less(delta.column("diff"), 0))
    if neg.num_rows == 0 and pc.min(piece.column("diff")).as_py() > 0:
        return piece, delta  # nothing to cancel: the piece's rows stand as stored
    pos = delta.filter(pc.greater(delta.column("diff"), 0))
    net = _grouped([piece, neg], reader)
    out = net.filter(pc.greater(net.column("diff"), 0))
    left = net.filter(pc.less(net.column("diff"), 0))
    return out, _grouped([pos, left], reader)


def read_changes(
    blob: Blob, plan: SnapshotPlan, start: int, columns: list[str], retry_deadline_s: float
) -> pa.Table:
    """The updates of ``plan``'s shard with ``start <= ts <= plan.as_of``: columns, ``ts`` (int64), ``diff``.

    Consolidated per (row, ts), zero sums dropped, sorted by time. The caller
    checks ``start`` is at or above the shard's since (below it, compaction
    has merged times).
    """
    arrow = plan.schema.arrow
    hi = pa.scalar(plan.as_of, pa.uint64())
    pieces = []
    for run in plan.runs:
        if run.ts_rewrite is not None and run.ts_rewrite > plan.as_of:
            continue
        tables: list[pa.Table] = []
        if run.inline is not None:
            t = decode_inline(run.inline, arrow)
            tables.append(t.filter(pc.field("ts") <= hi).select([*columns, "ts", "diff"]))
        for ref in run.parts:
            data = get_retrying(blob, ref.key, retry_deadline_s)
            if data is None:
                raise MissingPart(ref.key)
            if len(data) != ref.size or crc32c(data) != ref.crc:
                raise CorruptObject(ref.key, "size or CRC-32C mismatch with the part descriptor")
            t = pq.read_table(io.BytesIO(data), columns=[*columns, "ts", "diff"], filters=pc.field("ts") <= hi)
            tables.append(t.replace_schema_metadata(None))
        for t in tables:
            if run.ts_rewrite is not None and t.num_rows:
                ts = pc.max_element_wise(t.column("ts"), pa.scalar(run.ts_rewrite, pa.uint64()))
                t = t.set_column(t.column_names.index("ts"), "ts", ts)
            t = t.filter(pc.greater_equal(t.column("ts"), pa.scalar(start, pa.uint64())))
            if t.num_rows:
                pieces.append(t.cast(pa.schema([*(arrow.field(c) for c in columns), arrow.field("ts"), arrow.field("diff")])))
    out_schema = pa.schema([*(arrow.field(c) for c in columns), pa.field("ts", pa.int64()), pa.field("diff", pa.int64())])
    if not pieces:
        return out_schema.empty_table()
    t = pa.concat_tables(pieces)
    keys = [*columns, "ts"]
    g = t.group_by(keys, use_threads=False).aggregate([("diff", "sum")]).rename_columns([*keys, "diff"])
    g = g.filter(pc.not_equal(g.column("diff"), 0))
    g = g.sort_by([("ts", "ascending"), *((c, "ascending") for c in columns if _sortable(arrow.field(c).type))])
    return g.select([*columns, "ts", "diff"]).cast(out_schema)


def _sortable(t: pa.DataType) -> bool:
    return not (pa.types.is_binary(t) or pa.types.is_large_binary(t) or pa.types.is_fixed_size_binary(t))


__all__ = ["IN_MEMORY_BYTES", "PlanReader", "check_columns", "check_filter", "consolidate", "read_changes", "read_table", "scan"]

