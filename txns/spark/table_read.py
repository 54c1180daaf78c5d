"""Spark reads of database tables by name: ``spark.read[Stream].format("txns").load("accounts")``, and SQL.

Batch reads (:class:`TableBatchReader`)::

    spark.read.format("txns").option("url", url).load("accounts")            # latest contents
    ....option("asOf", "2026-11-23 15:00")                                 # time travel
    ....option("diff", "true")                                               # distinct rows + diff
    ....option("changes", "true").option("start", t0).option("end", t1)       # updates in [t0, t1)

Options (values are strings, as Spark passes them):

- ``url`` (required): the database's location (``file:///...``, ``s3://...``).
- ``path``: the table name (what ``load(name)`` sets).
- ``asOf`` (aliases ``timestampAsOf``, ``versionAsOf``): read at this time:
  a txns timestamp (an integer: ``commit_info.ts``, a ``ts`` of
  ``db.history()``) or a wall-clock time in ISO form (``"2026-11-23 15:00"``,
  ``"2026-11-23T15:00:00.250"``, optionally with an offset such as
  ``+02:00`` or ``Z``). **A wall-clock time without an offset is UTC**
  (unlike the Python API, where a naive ``datetime`` is local time); it
  reads at the end of its millisecond, like ``to_arrow(as_of=datetime)``.
  A time before the retained history raises ``ReadBelowSince``.
- ``diff``: ``"true"``: one row per distinct row plus ``diff`` (its multiplicity).
- ``validFor``: how long a planned read's parts are held for its tasks
  (``PersistClient.hold_parts``): seconds (``"7200"``) or a duration
  (``"90m"``, ``"2h"``), at most 7 days; default an hour (``PLAN_VALID_S``). Spark plans
  again for every action, so this bounds one job, not the DataFrame's life;
  compaction is not blocked past it.
- ``changes``: ``"true"``: the table's updates, columns + ``ts`` + ``diff``,
  equal as a multiset to ``db.table(name).changes(start, end)``; ``start``
  (required for a batch read) and ``end`` (exclusive, default: through the
  latest commit) are timestamps or wall-clock strings (a wall-clock bound
  stands for the first timestamp of its millisecond, as in ``changes()``).

Schema rule (``DataSource.schema()`` cannot tell a stream from a batch
read): the table's columns; plus ``diff`` with ``diff=true``; plus ``ts``
and ``diff`` with ``changes=true``.

**Column pruning.** Spark's Python data source API does not hand a query's
projection to the source, so a batch read prunes columns when the user
names them: a user-given schema (``.schema("account string")``) with some
of the table's columns (any order, the table's types), followed by the
option's ``ts`` / ``diff`` columns, reads only those columns from the
Parquet parts (filters may still name others) and consolidates on them:
a plain read gives the projection of the table (duplicates kept, as SQL's
``SELECT`` without ``DISTINCT``); a changes read gives updates whose diffs,
summed per (columns, ``ts``), are the projection's changes (one value may
come in several rows, one per task). Sound because projection is linear: a
row and its retraction project alike, and they lie in the same task (tasks
split the first key column, which every full row has). ``diff=true``
promises distinct rows, which tasks cannot give for a projection: it reads
every column (a pruned schema is refused). A stream emits updates (columns + ``ts``
+ ``diff``), so ``spark.readStream`` needs ``.option("changes", "true")``
(or a user-given schema with those columns); without it the stream refuses
with InvalidUsage saying so.

Planning protocol (``partitions()``, in the Python worker the JVM starts on
the driver side): open the database by URL (``txns.connect(url,
create=False)``), resolve the read time once (latest, or ``asOf``), take
the table's catalog entry at that time, hold the data shard's parts for
``PLAN_VALID_S`` (``PersistClient.hold_parts``: compaction may retire them
but does not delete them meanwhile), plan the snapshot (``db.plan``) and
close the database. Executors read parts by URL; every part's size and
CRC-32C are checked before it is decoded (``txns.db.scan.PlanReader``).

Consolidation inside the data source (it has no shuffle): a row and its
retractions (negative diffs) may sit in different runs and parts, and must
meet in one task. Tasks are ranges of the data shard's first key column
(the table's first primary-key column, else its first column), cut at the
``lo`` key bounds of the parts of the plan's largest run
(``PartRef.lo/hi``, stored for integer, string and temporal columns). A
task reads every part whose bounds overlap its range (parts without bounds
and inline rows: every task), keeps the rows in its range (the first
range also takes nulls), and consolidates locally. The ranges are
disjoint and cover every value, so each distinct row is consolidated by
exactly one task. Read amplification: a part is read by each range it
overlaps; a compacted table (one run of key-disjoint parts) reads each part
about once; the parts of other runs (recent, uncompacted writes usually span
all keys) are read by every task. Ranges are halved until the planned bytes
are at most ``MAX_AMPLIFICATION`` times the plan's bytes (one range reads
every part once). A first column without bounds (floats, binary, nulls...):
one task. Fast path: a plan that is one ``distinct_kv`` run (a compacted
table) or has a single part needs no consolidation across parts: one task
per part.

Filters (``pushFilters``): comparisons, ``In``, ``IsNull``/``IsNotNull``,
string prefix/suffix/contains and ``Not`` of comparisons on integer,
string, boolean, date and decimal columns become pyarrow expressions
applied inside the Parquet reads, before consolidation (sound: a row and
its retraction have the same values). The rest are returned to Spark.

Streams (:func:`table_stream_reader`): the table resolves to its data shard
and the database's txns shard when the query starts; the rows are those of
:class:`txns.spark.source.TxnsStreamReader` (snapshot at ``asOf`` or the
latest, then every update). A table dropped or renamed later is not
followed: the stream keeps reading the data shard it started on.

SQL: :func:`register_tables` creates a temporary view per table; time travel
in SQL is ``CREATE TEMPORARY VIEW t_then USING txns OPTIONS (url '...',
path 't', asOf '...')``.
"""

from __future__ import annotations

import datetime as dt
import json
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.datasource import (
    DataSourceReader,
    EqualNullSafe,
    EqualTo,
    Filter,
    GreaterThan,
    GreaterThanOrEqual,
    In,
    InputPartition,
    IsNotNull,
    IsNull,
    LessThan,
    LessThanOrEqual,
    Not,
    StringContains,
    StringEndsWith,
    StringStartsWith,
)
from pyspark.sql.types import LongType, StructField, StructType

from persist import InvalidUsage, PartRetired, SchemaMismatch, SnapshotPlan
from persist.manifest import PartRef, Run
from persist.schema import Schema
from persist.url import redact
from txns.db import clock
from txns.db.catalog import TableEntry
from txns.db.scan import PlanReader, conjunction, consolidate, read_changes
from txns.spark._common import arrow_schema, check_url, location, spark_struct, to_spark_arrow
from txns.spark.read import PLAN_VALID_S

if TYPE_CHECKING:
    from txns.db.database import Database

MAX_AMPLIFICATION = 4.0
"""Key ranges are merged until a consolidating read plans at most this many times the plan's bytes."""
RETRY_DEADLINE_S = 30.0
"""How long an executor retries a part's read."""
AS_OF_KEYS = ("asOf", "timestampAsOf", "versionAsOf")
"""The option names of the read time (the last two as Delta users know them)."""
WALL_CLOCK_FORMS = "a txns timestamp (an integer), or a wall-clock time such as '2026-11-23 15:00', "
WALL_CLOCK_FORMS += "'2026-11-23T15:00:00.250' or '2026-11-23T15:00:00+02:00' (no offset: UTC)"
_INT = re.compile(r"\s*[0-9]+\s*")
_DURATION = re.compile(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([smh]?)\s*")
_UNIT_S = {"": 1.0, "s": 1.0, "m": 60.0, "h": 3600.0}
MAX_VALID_S = 7 * 86400.0
"""The longest ``validFor`` (a part hold's limit)."""


# ---- options -----------------------------------------------------------------------------


def _flag(options: Mapping[str, str], key: str) -> bool:
    v = options.get(key)
    if v is None:
        return False
    s = str(v).strip().lower()
    if s in ("true", "1", "yes"):
        return True
    if s in ("false", "0", "no", ""):
        return False
    raise InvalidUsage(f"option {key} must be 'true' or 'false', got {v!r}")


def parse_time(value: object, option: str, *, end_of_ms: bool) -> int:
    """A time option as a txns timestamp: an integer as is, a wall-clock string converted (no offset: UTC).

    ``end_of_ms``: a wall-clock time stands for the last timestamp of its
    millisecond (reads ``as of`` it); else the first (a ``changes`` bound).
    """
    if isinstance(value, int) and not isinstance(value, bool):
        if value < 0:
            raise InvalidUsage(f"option {option} must be >= 0, got {value}")
        return value
    if isinstance(value, dt.datetime):
        when = value
    else:
        text = str(value).strip()
        if _INT.fullmatch(text):
            ts = int(text)
            if ts >= 2**63:
                raise InvalidUsage(f"option {option} {text} is out of range (a timestamp is below 2**63)")
            return ts
        try:
            when = dt.datetime.fromisoformat(text)
        except ValueError:
            raise InvalidUsage(f"option {option} must be {WALL_CLOCK_FORMS}; got {value!r}") from None
        if when.tzinfo is None:
            when = when.replace(tzinfo=dt.UTC)
    ms = clock.ms_of_datetime(when)
    if ms < 0:
        raise InvalidUsage(f"option {option} {value!r} is before 1970")
    return clock.ts_end_of_ms(ms) if end_of_ms else clock.ts_of_ms(ms)


def parse_duration(value: object, option: str) -> float:
    """Seconds from ``"7200"``, ``"90m"`` or ``"2h"`` (positive); InvalidUsage otherwise."""
    m = _DURATION.fullmatch(str(value))
    seconds = float(m.group(1)) * _UNIT_S[m.group(2)] if m else 0.0
    if not 0 < seconds <= MAX_VALID_S:
        raise InvalidUsage(
            f"option {option} must be seconds (e.g. '7200') or a duration such as '90m' or '2h', "
            f"at most 7 days; got {value!r}"
        )
    return seconds


@dataclass(frozen=True)
class TableOptions:
    """The parsed options of a read by table name (see the module doc)."""

    url: str
    name: str
    as_of: int | None
    diff: bool
    changes: bool
    start: int | None
    end: int | None
    valid_for_s: float = PLAN_VALID_S

    @staticmethod
    def parse(options: Mapping[str, str]) -> TableOptions:
        url = options.get("url")
        if not url:
            raise InvalidUsage(
                "the txns data source needs the option url (the database's location), e.g. "
                "spark.read.format('txns').option('url', 'file:///data/db').load('accounts')"
            )
        name = options.get("path")
        if not name:
            raise InvalidUsage("name the table to read: .load('accounts') (or the option path)")
        given = [k for k in AS_OF_KEYS if options.get(k) is not None]
        if len(given) > 1:
            raise InvalidUsage(f"give one of the options {given}, not several (they are aliases)")
        as_of = parse_time(options[given[0]], given[0], end_of_ms=True) if given else None
        diff, changes = _flag(options, "diff"), _flag(options, "changes")
        start = options.get("start")
        end = options.get("end")
        if not changes and (start is not None or end is not None):
            raise InvalidUsage("the options start and end go with .option('changes', 'true')")
        if changes and as_of is not None:
            raise InvalidUsage(
                "a changes read takes start (and end), not asOf; for a stream starting at a time use "
                "readStream with asOf (and changes=true)"
            )
        start_ts = None if start is None else parse_time(start, "start", end_of_ms=False)
        end_ts = None if end is None else parse_time(end, "end", end_of_ms=False)
        valid = options.get("validFor")
        valid_for_s = PLAN_VALID_S if valid is None else parse_duration(valid, "validFor")
        return TableOptions(check_url(str(url)), str(name), as_of, diff, changes, start_ts, end_ts, valid_for_s)

    def connect(self) -> Database:
        import txns

        return txns.connect(self.url, create=False)


def output_struct(entry: TableEntry, *, diff: bool, changes: bool) -> StructType:
    """The rows of a read: the table's columns, plus ``ts`` and ``diff`` (changes) or ``diff``."""
    struct = spark_struct(entry.schema)
    if changes:
        struct.add(StructField("ts", LongType(), False))
    if diff or changes:
        struct.add(StructField("diff", LongType(), False))
    return struct


def _entry_now(db: Database, opts: TableOptions) -> tuple[TableEntry, int]:
    """The table's entry at the read's time (changes: its end) and that time."""
    if opts.changes and opts.end is not None:
        ts = db.timestamp(max(opts.end - 1, opts.start or 0))
    else:
        ts = db.timestamp(opts.as_of)
    return db.entry(opts.name, ts), ts


def table_schema(options: Mapping[str, str]) -> StructType:
    """The Spark schema of a read by table name (see the module doc's schema rule)."""
    opts = TableOptions.parse(options)
    with opts.connect() as db:
        entry, _ = _entry_now(db, opts)
    return output_struct(entry, diff=opts.diff, changes=opts.changes)


# ---- filters -----------------------------------------------------------------------------


def _pushable_type(t: pa.DataType) -> bool:
    return bool(
        pa.types.is_integer(t)
        or pa.types.is_string(t)
        or pa.types.is_large_string(t)
        or pa.types.is_boolean(t)
        or pa.types.is_date(t)
        or pa.types.is_decimal(t)
    )


def _value(v: Any, t: pa.DataType) -> pa.Scalar:
    if isinstance(v, float) or (isinstance(v, Decimal) and not pa.types.is_decimal(t)):
        raise TypeError("no exact conversion")
    return pa.scalar(v, t)


def filter_expr(f: Filter, schema: pa.Schema) -> pc.Expression | None:
    """``f`` as a pyarrow expression with Spark's meaning, or None if it is not translated."""
    if isinstance(f, Not):
        child = f.child
        negatable = (EqualTo, GreaterThan, GreaterThanOrEqual, LessThan, LessThanOrEqual)
        if isinstance(child, (*negatable, StringStartsWith, StringEndsWith, StringContains)):
            inner = filter_expr(child, schema)
            return None if inner is None else ~inner  # (null stays null: dropped, as in Spark)
        if isinstance(child, IsNull):
            return filter_expr(IsNotNull(child.attribute), schema)
        return None
    attr = getattr(f, "attribute", None)
    if not isinstance(attr, tuple) or len(attr) != 1 or attr[0] not in schema.names:
        return None
    name = attr[0]
    t = schema.field(name).type
    if not _pushable_type(t):
        return None
    field = pc.field(name)
    try:
        if isinstance(f, IsNull):
            return field.is_null()
        if isinstance(f, IsNotNull):
            return field.is_valid()
        if isinstance(f, (StringStartsWith, StringEndsWith, StringContains)):
            if not (pa.types.is_string(t) or pa.types.is_large_string(t)) or not isinstance(f.value, str):
                return None
            if isinstance(f, StringStartsWith):
                return pc.starts_with(field, pattern=f.value)
            if isinstance(f, StringEndsWith):
                return pc.ends_with(field, pattern=f.value)
            return pc.match_substring(field, pattern=f.value)
        if isinstance(f, In):
            if any(v is None for v in f.value):
                return None
            return field.isin(pa.array([_value(v, t).as_py() for v in f.value], t))
        if isinstance(f, (EqualTo, EqualNullSafe)):
            if f.value is None:
                return field.is_null() if isinstance(f, EqualNullSafe) else None
            return field == _value(f.value, t)
        ops = {GreaterThan: "__gt__", GreaterThanOrEqual: "__ge__", LessThan: "__lt__", LessThanOrEqual: "__le__"}
        op = ops.get(type(f))
        value = getattr(f, "value", None)
        if op is None or value is None:
            return None
        e: pc.Expression = getattr(field, op)(_value(value, t))
        return e
    except (TypeError, ValueError, OverflowError, pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError):
        return None


# ---- planning ----------------------------------------------------------------------------


@dataclass(frozen=True)
class KeyRange:
    """First-key-column values ``lo <= v < hi`` (None: unbounded); ``nulls``: nulls too."""

    lo: Any
    hi: Any
    nulls: bool

    def overlaps(self, ref: PartRef) -> bool:
        try:
            below = self.hi is None or ref.lo is None or ref.lo < self.hi
            above = self.lo is None or ref.hi is None or ref.hi >= self.lo
        except TypeError:
            return True  # (bounds of another kind: not comparable, read it)
        return below and above


def key_ranges(runs: Sequence[Run]) -> list[KeyRange]:
    """Disjoint ranges covering every first-column value (see the module doc), nulls in the first."""
    largest = max(runs, key=lambda r: r.size, default=None)
    cuts: list[Any] = []
    if largest is not None:
        los = {p.lo for p in largest.parts if p.lo is not None}
        kinds = {type(x) for x in los}
        if len(kinds) == 1:
            cuts = sorted(los)[1:]
    total = sum(r.size for r in runs) or 1
    while True:
        ranges = _ranges(cuts)
        planned = sum(p.size for k in ranges for r in runs for p in r.parts if k.overlaps(p))
        if len(ranges) == 1 or planned <= MAX_AMPLIFICATION * total:
            return ranges
        cuts = cuts[1::2]


def _ranges(cuts: Sequence[Any]) -> list[KeyRange]:
    bounds = [None, *cuts, None]
    return [KeyRange(bounds[i], bounds[i + 1], i == 0) for i in range(len(bounds) - 1)]


class TableTask(InputPartition):
    """One read task: runs (their parts overlapping ``key_range``), the rows of ``key_range`` kept.

    ``key_range`` None: every row of the runs (no consolidation is needed
    across tasks). ``start`` set: a changes read of ``[start, as_of]``.
    """

    def __init__(
        self, data_id: str, schema_text: str, as_of: int, runs: bytes, key_range: KeyRange | None, start: int | None
    ) -> None:
        super().__init__(runs)
        self.data_id, self.schema_text, self.as_of, self.runs = data_id, schema_text, as_of, runs
        self.key_range, self.start = key_range, start


def _runs_json(runs: Sequence[Run]) -> bytes:
    return json.dumps([r.to_json() for r in runs], separators=(",", ":")).encode()


def plan_table_tasks(plan: SnapshotPlan, start: int | None) -> list[TableTask]:
    """The tasks of a read of ``plan`` (``start``: a changes read); see the module doc."""
    runs = [r for r in plan.runs if r.rows]
    text = plan.schema.to_text()
    n_parts = sum(len(r.parts) for r in runs)
    if not runs:
        return []
    if (len(runs) == 1 and runs[0].distinct_kv) or (n_parts <= 1 and sum(r.inline is not None for r in runs) <= 1):
        # No two pieces can hold the same row (or there is one piece): a task per part.
        tasks = []
        for r in runs:
            if r.inline is not None:
                inline = Run(inline=r.inline, rows=r.rows, ts_rewrite=r.ts_rewrite, distinct_kv=r.distinct_kv)
                tasks.append(TableTask(plan.shard_id, text, plan.as_of, _runs_json([inline]), None, start))
            for p in r.parts:
                one = Run(parts=(p,), rows=p.rows, ts_rewrite=r.ts_rewrite, distinct_kv=r.distinct_kv)
                tasks.append(TableTask(plan.shard_id, text, plan.as_of, _runs_json([one]), None, start))
        return tasks
    ranges = key_ranges(runs)
    out = []
    for k in ranges:
        sub = []
        for r in runs:
            parts = tuple(p for p in r.parts if len(ranges) == 1 or k.overlaps(p))
            if parts or r.inline is not None:
                rows = sum(p.rows for p in parts) + (r.rows - sum(p.rows for p in r.parts))
                sub.append(Run(parts=parts, inline=r.inline, rows=rows, ts_rewrite=r.ts_rewrite))
        if sub:
            out.append(
                TableTask(plan.shard_id, text, plan.as_of, _runs_json(sub), None if len(ranges) == 1 else k, start)
            )
    return out


def _bound_scalar(b: Any, t: pa.DataType) -> pa.Scalar:
    """A stored key bound as a scalar of the column's type (temporal bounds are the stored ints)."""
    if pa.types.is_temporal(t) and isinstance(b, int):
        storage = pa.int32() if t.bit_width == 32 else pa.int64()
        return pa.array([b], storage).view(t)[0]
    return pa.scalar(b, t)


def range_expr(k: KeyRange, field: pa.Field) -> pc.Expression | None:
    f = pc.field(field.name)
    terms = []
    if k.lo is not None:
        terms.append(f >= _bound_scalar(k.lo, field.type))
    if k.hi is not None:
        terms.append(f < _bound_scalar(k.hi, field.type))
    e = conjunction(terms)
    if k.nulls and e is not None:
        e = f.is_null() | e
    return e


def read_table_task(
    url: str,
    task: TableTask,
    pushed: Sequence[pc.Expression],
    out: pa.Schema,
    diff: bool,
    columns: Sequence[str] | None = None,
) -> Iterator[pa.RecordBatch]:
    """The rows of one task (``pushed``: filters applied in the reads), consolidated within it, as Arrow.

    ``columns``: only these of the table's columns (pruned from the reads; see the module doc).
    """
    schema = Schema.from_text(task.schema_text)
    arrow = schema.arrow
    cols = list(columns) if columns else list(schema.key_names)
    terms = list(pushed)
    if task.key_range is not None:
        r = range_expr(task.key_range, arrow.field(0))
        if r is not None:
            terms.append(r)
    expr = conjunction(terms)
    runs = tuple(Run.from_json(j) for j in json.loads(task.runs))
    plan = SnapshotPlan(task.data_id, task.as_of, runs, schema)
    blob = location(url).blob
    try:
        if task.start is not None:
            t = read_changes(blob, plan, task.start, cols, RETRY_DEADLINE_S, filter=expr)
        else:
            reader = PlanReader(blob, plan, cols, expr, RETRY_DEADLINE_S)
            pieces = [p for p in reader.pieces(runs) if p.num_rows]
            t = pa.concat_tables(pieces) if pieces else reader.empty()
            if diff:
                if t.num_rows and (pc.min(t.column("diff")).as_py() <= 0 or task.key_range is not None):
                    g = t.group_by(cols, use_threads=False).aggregate([("diff", "sum")])
                    t = g.rename_columns([*cols, "diff"])
                t = t.filter(pc.greater(t.column("diff"), 0))
            else:
                t = consolidate(t, cols)
    except PartRetired as e:
        raise PartRetired(
            f"part {e.key} is gone from {redact(url)}: compaction retired it (and deleted it after "
            f"part_grace_s) after this read was planned; run the query again",
            e.key,
        ) from None
    if t.num_rows:
        yield from to_spark_arrow(t, out).to_batches()


class TableBatchReader(DataSourceReader):
    """``spark.read.format("txns").option("url", url).load(name)``: see the module doc."""

    def __init__(self, options: Mapping[str, str], schema: StructType) -> None:
        self.opts = TableOptions.parse(options)
        self.schema = schema
        self.columns: list[str] | None = None  # the table columns read (None: all), set by _check
        self.pushed: list[pc.Expression] = []
        if self.opts.changes and self.opts.start is None:
            raise InvalidUsage("a changes read needs the option start (a timestamp or wall-clock time)")

    def pushFilters(self, filters: list[Filter]) -> Iterator[Filter]:
        with self.opts.connect() as db:
            entry, _ = _entry_now(db, self.opts)
        empty = entry.schema.empty_table()
        for f in filters:
            e = filter_expr(f, entry.schema)
            if e is not None:
                try:
                    empty.filter(e)  # (binds it: a type the expression does not fit is left to Spark)
                except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError, TypeError):
                    e = None
            if e is None:
                yield f
            else:
                self.pushed.append(e)

    def partitions(self) -> Sequence[InputPartition]:
        opts = self.opts
        with opts.connect() as db:
            if opts.changes:
                assert opts.start is not None
                lo = opts.start
                if opts.end is None:
                    hi = db.latest()
                else:
                    hi = db.timestamp(opts.end - 1) if opts.end > lo else lo - 1
                if hi < lo:
                    entry = db.entry(opts.name, db.latest())
                    self._check(entry)
                    return []
                entry = db.entry(opts.name, hi)
                self._check(entry)
                from txns.db.table import plan_since

                db.client.hold_parts(entry.data_id, opts.valid_for_s)
                plan = db.plan(entry, hi)
                since = plan_since(db, entry)
                if lo < since:
                    raise db.planner.below(entry, lo, since)
                return plan_table_tasks(plan, lo)
            ts = db.timestamp(opts.as_of)
            entry = db.entry(opts.name, ts)
            self._check(entry)
            db.client.hold_parts(entry.data_id, opts.valid_for_s)
            return plan_table_tasks(db.plan(entry, ts), None)

    def _check(self, entry: TableEntry) -> None:
        """The schema read must be the table's (plus the option's columns), or a projection of it (pruning)."""
        want = output_struct(entry, diff=self.opts.diff, changes=self.opts.changes)
        got = [(f.name, f.dataType) for f in self.schema.fields]
        full = [(f.name, f.dataType) for f in want.fields]
        if got == full:
            self.columns = None
            return
        n_extra = len(full) - len(entry.schema)
        table_cols, extra = dict(full[: len(full) - n_extra]), full[len(full) - n_extra :]
        picked = got[: len(got) - n_extra] if n_extra else got
        names = [n for n, _ in picked]
        if self.opts.diff and not self.opts.changes:
            raise SchemaMismatch(
                f"a read of table {entry.name!r} with diff=true has the columns {want.simpleString()}, not "
                f"{self.schema.simpleString()}: its rows are distinct only over every column; prune columns in "
                f"a read without diff (rows repeat per multiplicity), or group the pruned read yourself"
            )
        if (
            (got[len(got) - n_extra :] if n_extra else []) != extra
            or not picked
            or len(set(names)) != len(names)
            or any(table_cols.get(n) != t for n, t in picked)
        ):
            raise SchemaMismatch(
                f"table {entry.name!r} has the columns {want.simpleString()} now, not "
                f"{self.schema.simpleString()} (it changed since the query was analyzed, or the schema given "
                f"does not match): give no schema, or some of the table's columns with their types "
                f"(followed by {', '.join(n for n, _ in extra) or 'nothing else'}) to read only those"
            )
        self.columns = names

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        if not isinstance(partition, TableTask):
            return iter(())  # Spark's placeholder partition of an empty read
        out = arrow_schema(self.schema)
        return read_table_task(self.opts.url, partition, self.pushed, out, self.opts.diff, self.columns)


__all__ = [
    "MAX_AMPLIFICATION",
    "KeyRange",
    "TableBatchReader",
    "TableOptions",
    "TableTask",
    "filter_expr",
    "key_ranges",
    "parse_time",
    "plan_table_tasks",
    "table_schema",
]
