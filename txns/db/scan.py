"""Reading a table's snapshot plan as Arrow: projection and filters pushed into Parquet, bounded memory.

A snapshot plan (``persist.SnapshotPlan``) is a list of runs; each run is
parts (Parquet, rows sorted within a part) and/or inline rows, with an
optional time rewrite. A row's multiplicity at ``as_of`` is the sum of the
diffs of its updates with ``ts <= as_of``, over every run.

Every part read here is fetched and its size and CRC-32C checked against its
descriptor before anything of it is decoded. Then it is projected to the
asked columns (plus ``diff``) and filtered (the user's filter and
``ts <= as_of``) inside the Parquet read. The part's footer statistics
(checked bytes, like the rest) decide what filtering is needed at all: a
part whose stored times are all at or below ``as_of`` is read without the
time filter, and without any filter when the user gave none (the fast path
of a plain Parquet read).

Parts are fetched, checked and decoded on the process's shared thread pool
(:mod:`txns.db.pool`), up to ``READ_PARALLELISM`` at once (the Parquet
decode runs outside the GIL), in the plan's order: results are the same, in the same order, as one part at
a time. A read of one part (or none: inline rows only) uses no thread.

Consolidation works on the projected rows: a projected row appears as many
times as the sum of the diffs of the rows that project to it (a multiset
projection). A multiplicity that sums to zero or less means absent.

:func:`read_table` reads everything into memory (``to_arrow``). When no diff
is negative (tables only inserted into, or compacted) no grouping is needed
at all: rows are returned as stored.

:func:`scan` streams with memory bounded by the *delta* (every run but the
largest, and the retractions within the largest) plus a few parts: the one
being returned and at most ``SCAN_AHEAD`` read ahead of it (and, between the
two passes below, ``SCAN_KEEP`` parts' checked bytes). The largest run is
read part by part; when it has several pieces, a first pass over its parts
collects its retractions, because a retraction in a later part may cancel a
row of an earlier one. That pass decodes only parts whose footer shows a
negative diff; it goes from the last part to the first and keeps the bytes
of the first ``SCAN_KEEP`` parts, which the second pass then uses instead of
fetching them again. Size-tiered compaction keeps the runs other than the
largest small relative to it.
"""

from __future__ import annotations

import threading
from collections import OrderedDict, deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import Future, wait
from typing import TypeVar, cast

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from persist import CorruptObject, InvalidUsage, SnapshotPlan
from persist.location import Blob
from persist.manifest import IMPLIED_COLUMNS, PartRef, Run, decode_inline, fetch_part, read_part_table
from txns.db.pool import in_pool, pool

IN_MEMORY_BYTES = 64 << 20
"""Plans up to this many stored bytes are consolidated in memory by ``scan`` (one pass)."""
PART_CACHE_BYTES = 64 << 20
"""The most bytes of parts the point-read cache (:data:`PART_CACHE`) keeps."""
PART_CACHE_ITEM_BYTES = 4 << 20
"""Parts bigger than this are never cached."""
READ_PARALLELISM = 8
"""Parts one read fetches, checks and decodes at once (threads)."""
SCAN_AHEAD = 2
"""Parts ``scan`` reads ahead of the one it returns."""
SCAN_KEEP = 2
"""Parts of the largest run whose checked bytes ``scan``'s first pass keeps for its second."""

T = TypeVar("T")
R = TypeVar("R")


def ordered(fn: Callable[[T], R], items: Iterable[T], ahead: int, workers: int = READ_PARALLELISM) -> Iterator[R]:
    """``fn`` of each item, in order, computed on the shared pool (:mod:`txns.db.pool`).

    While the caller holds the result of one item, at most ``ahead`` of the
    next ones are computed or held (so a stream of parts holds at most
    ``ahead + 1`` of them; and at most ``workers`` run at once). One item
    (or none, or ``ahead`` < 1, or ``workers`` < 2, or a caller on the pool)
    runs on the calling thread. Closing the iterator early cancels what has
    not started and waits for what has.
    """
    items = list(items)
    if len(items) <= 1 or ahead < 1 or workers < 2 or in_pool():
        for x in items:
            yield fn(x)
        return
    ahead = min(ahead, workers - 1)
    threads = pool()
    pending: deque[Future[R]] = deque()
    rest = iter(items)
    try:
        for x in rest:
            pending.append(threads.submit(fn, x))
            if len(pending) > ahead:
                break
        while pending:
            r = pending.popleft().result()
            yield r
            del r
            for x in rest:
                pending.append(threads.submit(fn, x))
                break
    finally:
        for f in pending:
            f.cancel()
        wait(pending)


def _workers(items: list[tuple[Run, PartRef | None]]) -> int:
    """Threads for reading ``items``: none unless at least two are parts (inline rows decode in no time)."""
    return READ_PARALLELISM if sum(ref is not None for _, ref in items) > 1 else 1


class PartCache:
    """Recently read small parts' checked bytes, least recently used out first; bounded in bytes.

    Parts never change once written (a key is written once, or again with
    the same bytes by a retry), so a cached part is always right: it is
    found by its key, size and CRC. For point reads, which read the same
    small parts again and again; scans do not use it.
    """

    def __init__(self, max_bytes: int = PART_CACHE_BYTES, item_max_bytes: int = PART_CACHE_ITEM_BYTES) -> None:
        self.max_bytes, self.item_max_bytes = max_bytes, item_max_bytes
        self._items: OrderedDict[tuple[str, int, int], bytes] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()
        self.hits = self.misses = 0

    def get(self, ref: PartRef) -> bytes | None:
        with self._lock:
            data = self._items.get((ref.key, ref.size, ref.crc))
            if data is None:
                self.misses += 1
                return None
            self._items.move_to_end((ref.key, ref.size, ref.crc))
            self.hits += 1
            return data

    def put(self, ref: PartRef, data: bytes) -> None:
        if len(data) > self.item_max_bytes:
            return
        with self._lock:
            k = (ref.key, ref.size, ref.crc)
            if k in self._items:
                return
            self._items[k] = data
            self._bytes += len(data)
            while self._bytes > self.max_bytes:
                _, old = self._items.popitem(last=False)
                self._bytes -= len(old)


PART_CACHE = PartCache()
"""The process's cache of small parts read by point reads."""


def load_part(blob: Blob, ref: PartRef, retry_deadline_s: float, cache: PartCache | None = None) -> bytes:
    """A part's bytes, after checking their size and CRC-32C against its descriptor (from ``cache`` if there)."""
    if cache is not None:
        hit = cache.get(ref)
        if hit is not None:
            return hit
    data = fetch_part(blob, ref, retry_deadline_s)
    if cache is not None:
        cache.put(ref, data)
    return data


def footer_stats(meta: pq.FileMetaData) -> tuple[int, int, int] | None:
    """(largest stored ``ts``, smallest ``diff``, largest ``diff``) of a part, from its footer; None: unknown.

    A column the part leaves out has its implied constant (``IMPLIED_COLUMNS``).
    """
    names = [meta.schema.column(j).name for j in range(meta.num_columns)]
    its, idiff = (names.index(c) if c in names else None for c in ("ts", "diff"))
    ts0, diff0 = (int(IMPLIED_COLUMNS[c].as_py()) for c in ("ts", "diff"))
    found: tuple[int, int, int] | None = None
    for i in range(meta.num_row_groups):
        rg = meta.row_group(i)
        if rg.num_rows == 0:
            continue
        a = None if its is None else rg.column(its).statistics
        b = None if idiff is None else rg.column(idiff).statistics
        if (its is not None and (a is None or not a.has_min_max)) or (
            idiff is not None and (b is None or not b.has_min_max)
        ):
            return None
        here = (
            ts0 if a is None else int(a.max),
            diff0 if b is None else int(b.min),
            diff0 if b is None else int(b.max),
        )
        found = here if found is None else (max(found[0], here[0]), min(found[1], here[1]), max(found[2], here[2]))
    return found


def _footer_bounds(meta: pq.FileMetaData) -> tuple[int | None, int | None]:
    """(largest stored ``ts``, smallest ``diff``) over the part's row groups, from its footer; None: unknown."""
    stats = footer_stats(meta)
    return (None, None) if stats is None else (stats[0], stats[1])


def conjunction(terms: Sequence[pc.Expression]) -> pc.Expression | None:
    """``terms`` joined with AND; None when there are none."""
    if not terms:
        return None
    e = terms[0]
    for t in terms[1:]:
        e = e & t
    return e


def check_columns(schema: pa.Schema, columns: object) -> list[str]:
    """The projection as a list of column names, or InvalidUsage."""
    if columns is None:
        return list(schema.names)
    if isinstance(columns, (str, bytes)) or not isinstance(columns, Iterable):
        raise InvalidUsage(f"columns must be a list of column names, got {columns!r}")
    given = list(columns)  # (read once: a generator is fine)
    if not all(isinstance(c, str) for c in given):
        raise InvalidUsage(f"columns must be a list of column names, got {given!r}")
    cols = cast("list[str]", given)
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
        cache: PartCache | None = None,
    ) -> None:
        self.blob, self.plan = blob, plan
        self.cache = cache  # (point reads: PART_CACHE)
        self.columns = columns
        self.arrow = plan.schema.arrow  # key columns, ts, diff
        self.out_schema = pa.schema([self.arrow.field(c) for c in columns])
        self.filter = filter
        self.retry_deadline_s = retry_deadline_s

    def _expr(self, negative_only: bool, times: bool = True) -> pc.Expression | None:
        terms = []
        if times:
            terms.append(pc.field("ts") <= pa.scalar(self.plan.as_of, pa.uint64()))
        if self.filter is not None:
            terms.append(self.filter)
        if negative_only:
            terms.append(pc.field("diff") < 0)
        return conjunction(terms)

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
        latest = pc.max(t.column("ts")).as_py() if t.num_rows else None
        expr = self._expr(negative_only, times=latest is not None and latest > self.plan.as_of)
        return self._finish(t if expr is None else t.filter(expr), run)

    def load(self, ref: PartRef) -> bytes:
        """The part's bytes, checked (size and CRC-32C)."""
        return load_part(self.blob, ref, self.retry_deadline_s, self.cache)

    def part(self, run: Run, ref: PartRef, negative_only: bool = False, data: bytes | None = None) -> pa.Table:
        """The part's rows (fetched and checked first, unless ``data`` are its checked bytes)."""
        if data is None:
            data = self.load(ref)
        if run.ts_rewrite is not None and run.ts_rewrite > self.plan.as_of:
            return self.empty()
        cols = [*self.columns, "diff"]
        try:
            f = pq.ParquetFile(pa.BufferReader(data))
            ts_max, diff_min = _footer_bounds(f.metadata)
            if negative_only and diff_min is not None and diff_min > 0:
                return self.empty()  # no retraction in this part
            # A rewritten time is max(ts, rewrite), which is <= as_of iff both are:
            # the rewrite was checked just above, so filtering on the stored ts is exact
            # (and needless when every stored ts is <= as_of).
            expr = self._expr(negative_only, times=ts_max is None or ts_max > self.plan.as_of)
            t = read_part_table(data, cols, expr, opened=f)
        except Exception as e:  # noqa: BLE001 - any decode failure of a checked part means corrupt
            raise CorruptObject(ref.key, f"unreadable Parquet: {e}") from None
        return self._finish(t.replace_schema_metadata(None), run)

    def pieces(
        self, runs: Iterable[Run], negative_only: bool = False, ahead: int = READ_PARALLELISM
    ) -> Iterator[pa.Table]:
        """Every piece of ``runs`` in order (inline rows, then parts), parts read by a pool (see :func:`ordered`)."""

        def read(item: tuple[Run, PartRef | None]) -> pa.Table:
            run, ref = item
            if ref is None:
                t = self.inline(run, negative_only)
                return t if t is not None else self.empty()
            return self.part(run, ref, negative_only)

        items: list[tuple[Run, PartRef | None]] = []
        for run in runs:
            if run.inline is not None:
                items.append((run, None))
            items.extend((run, ref) for ref in run.parts)
        yield from ordered(read, items, ahead, _workers(items))

    def run_pieces(self, run: Run, negative_only: bool = False) -> Iterator[pa.Table]:
        yield from self.pieces([run], negative_only)

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
    """The whole snapshot, consolidated, in memory (parts read in parallel)."""
    pieces = list(reader.pieces(reader.plan.runs))
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
    pieces = list(reader.pieces(rest, ahead=SCAN_AHEAD))
    two_pass = len(big.parts) + (big.inline is not None) > 1
    kept: dict[int, bytes] = {}
    if two_pass:
        # pass 1: the big run's retractions, which may cancel rows of any of its pieces
        neg = reader.inline(big, negative_only=True)
        if neg is not None:
            pieces.append(neg)

        def retractions(i: int) -> tuple[int, pa.Table, bytes]:
            data = reader.load(big.parts[i])
            return i, reader.part(big, big.parts[i], negative_only=True, data=data), data

        negs: dict[int, pa.Table] = {}
        for i, t, data in ordered(retractions, reversed(range(len(big.parts))), SCAN_AHEAD):
            negs[i] = t
            if i < SCAN_KEEP:
                kept[i] = data  # the second pass starts with these: no second fetch
        pieces += [negs[i] for i in sorted(negs)]
    delta = _grouped(pieces, reader)  # projected row -> summed diff, nonzero
    del pieces

    def whole(i: int) -> pa.Table:
        ref = big.parts[i]
        return reader.part(big, ref, data=kept.pop(i, None))

    big_inline = reader.inline(big)
    for piece in _chain(
        [big_inline] if big_inline is not None else [], ordered(whole, range(len(big.parts)), SCAN_AHEAD)
    ):
        if two_pass and piece.num_rows and pc.min(piece.column("diff")).as_py() <= 0:
            piece = piece.filter(pc.greater(piece.column("diff"), 0))  # its retractions are in the delta
        if piece.num_rows == 0:
            continue
        out, delta = _apply_delta(piece, delta, reader)
        if out.num_rows:
            yield from expand(out).cast(reader.out_schema).to_batches()
    left = delta.filter(pc.greater(delta.column("diff"), 0))
    if left.num_rows:
        yield from expand(left).cast(reader.out_schema).to_batches()


def _chain(*its: Iterable[pa.Table]) -> Iterator[pa.Table]:
    for it in its:
        yield from it


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
    blob: Blob,
    plan: SnapshotPlan,
    start: int,
    columns: list[str],
    retry_deadline_s: float,
    filter: pc.Expression | None = None,
) -> pa.Table:
    """The updates of ``plan``'s shard with ``start <= ts <= plan.as_of``: columns, ``ts`` (int64), ``diff``.

    Consolidated per (row, ts), zero sums dropped, sorted by time. The caller
    checks ``start`` is at or above the shard's since (below it, compaction
    has merged times). Parts are read like :func:`read_table`'s. ``filter``
    (on the shard's columns) is pushed into every read.
    """
    arrow = plan.schema.arrow
    hi = pa.scalar(plan.as_of, pa.uint64())
    keep = pc.field("ts") <= hi if filter is None else (pc.field("ts") <= hi) & filter
    runs = [run for run in plan.runs if run.ts_rewrite is None or run.ts_rewrite <= plan.as_of]

    def read(item: tuple[Run, PartRef | None]) -> pa.Table:
        run, ref = item
        if ref is None:
            assert run.inline is not None
            t = decode_inline(run.inline, arrow)
            t = t.filter(keep).select([*columns, "ts", "diff"])
        else:
            data = load_part(blob, ref, retry_deadline_s)
            try:
                t = read_part_table(data, [*columns, "ts", "diff"], keep)
            except Exception as e:  # noqa: BLE001 - any decode failure of a checked part means corrupt
                raise CorruptObject(ref.key, f"unreadable Parquet: {e}") from None
            t = t.replace_schema_metadata(None)
        if run.ts_rewrite is not None and t.num_rows:
            ts = pc.max_element_wise(t.column("ts"), pa.scalar(run.ts_rewrite, pa.uint64()))
            t = t.set_column(t.column_names.index("ts"), "ts", ts)
        t = t.filter(pc.greater_equal(t.column("ts"), pa.scalar(start, pa.uint64())))
        return t.cast(pa.schema([*(arrow.field(c) for c in columns), arrow.field("ts"), arrow.field("diff")]))

    items: list[tuple[Run, PartRef | None]] = []
    for run in runs:
        if run.inline is not None:
            items.append((run, None))
        items.extend((run, ref) for ref in run.parts)
    pieces = [t for t in ordered(read, items, READ_PARALLELISM, _workers(items)) if t.num_rows]
    out_schema = pa.schema(
        [*(arrow.field(c) for c in columns), pa.field("ts", pa.int64()), pa.field("diff", pa.int64())]
    )
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


__all__ = [
    "IN_MEMORY_BYTES",
    "PART_CACHE",
    "PART_CACHE_BYTES",
    "PART_CACHE_ITEM_BYTES",
    "PartCache",
    "READ_PARALLELISM",
    "SCAN_AHEAD",
    "SCAN_KEEP",
    "PlanReader",
    "check_columns",
    "check_filter",
    "consolidate",
    "load_part",
    "ordered",
    "read_changes",
    "read_table",
    "scan",
]
