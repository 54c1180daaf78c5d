"""The ``txns`` Spark data source: a data shard as a stream (and a batch) of updates.

Usage (after ``txns.spark.register(spark)``)::

    stream = (spark.readStream.format("txns")
              .option("url", url).option("txns_id", txns_id).option("data_id", data_id)
              .option("as_of", 5)          # optional; default: the latest readable time
              .load())

Rows: the shard's key and val columns, ``ts`` (a long: the update's time,
i.e. its commit time) and ``diff`` (a long). The stream first emits the
snapshot at ``as_of`` (every update at or before it, with ``ts = as_of``),
then every later update, micro-batch by micro-batch, in commit order:
partitions follow time, and rows within one are sorted by ``ts``. Rows are
updates, not consolidated: sum ``diff`` per key and val for contents.

Offsets are txns timestamps: ``{"ts": t}`` means every update with a time
below ``t`` was emitted; the initial one is ``{"ts": as_of, "snapshot":
true}``. ``latestOffset`` is the txns shard's upper (from the read cache);
planning ``[start, end)`` first makes the data readable
(``TxnsHandle.unblock_read(data_id, end - 1)``); a range the txns shard
proves has no write to the shard is planned without reading it.

Invariant: a range ``[lo, hi)`` is only read from a shard state whose since
is below ``lo`` (at or below ``as_of`` for the snapshot). Compaction moves
times below the since up to it, so a since past ``lo`` could move updates
already emitted into the range, and they would be emitted twice: planning
refuses with ``ReadBelowSince`` instead. While the query runs, its leased
reader holds the since at ``end - 1`` of the last committed batch. A query
stopped for longer than ``reader_lease_s`` may find the since moved on by
other readers; restart it then with a new checkpoint and ``as_of``.

``spark.read.format("txns")`` gives the rows at ``as_of`` (default: the
latest readable time), all with ``ts = as_of``, not consolidated (use
:func:`txns.spark.snapshot` for a consolidated DataFrame).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    DataSourceStreamWriter,
    DataSourceWriter,
    InputPartition,
)
from pyspark.sql.streaming.datasource import ReadLimit, SupportsTriggerAvailableNow
from pyspark.sql.types import LongType, StructField, StructType

from persist import InvalidUsage, LeaseExpired, PersistClient, ReadBelowSince, ReadHandle, Schema, ShardId
from persist.manifest import apply_rewrite
from txns.errors import NotRegistered
from txns.handle import TxnsHandle
from txns.spark import table_read, table_write
from txns.spark._common import arrow_schema, check_url, plan_tasks, read_task, spark_struct, to_spark_arrow, ts_as_int64
from txns.spark.read import release

Offset = dict[str, Any]
"""A stream offset: ``{"ts": t}``, or the initial ``{"ts": as_of, "snapshot": True}``."""


@dataclass(frozen=True)
class Options:
    """The options of a ``txns`` read: ``url``, ``txns_id``, ``data_id`` and optional ``as_of``."""

    url: str
    txns_id: str
    data_id: str
    as_of: int | None

    @staticmethod
    def parse(options: Mapping[str, str]) -> Options:
        missing = [k for k in ("url", "txns_id", "data_id") if not options.get(k)]
        if missing:
            raise InvalidUsage(f"the txns data source needs the options {missing} (and optionally as_of)")
        as_of = options.get("as_of")
        if as_of is not None:
            try:
                as_of_int = int(str(as_of))
            except ValueError:
                raise InvalidUsage(f"option as_of must be a timestamp (an int), got {as_of!r}") from None
            if not 0 <= as_of_int < 2**64:
                raise InvalidUsage(f"option as_of must be in [0, 2**64), got {as_of_int}")
        return Options(
            url=check_url(str(options["url"])),
            txns_id=str(ShardId.parse(str(options["txns_id"]))),
            data_id=str(ShardId.parse(str(options["data_id"]))),
            as_of=None if as_of is None else as_of_int,
        )

    def open(self) -> TxnsHandle:
        return TxnsHandle.open(PersistClient.open(self.url), self.txns_id)


def output_struct(schema: Schema) -> StructType:
    """The rows of the source: key and val fields, ``ts`` and ``diff``."""
    struct = spark_struct(list(schema.key) + list(schema.val))
    struct.add(StructField("ts", LongType(), False))
    struct.add(StructField("diff", LongType(), False))
    return struct


class TxnsDataSource(DataSource):
    """``spark.read[Stream].format("txns")``: see the module doc. Register with ``txns.spark.register``."""

    @classmethod
    def name(cls) -> str:
        return "txns"

    def schema(self) -> StructType:
        if by_name(self.options):
            return table_read.table_schema(self.options)
        opts = Options.parse(self.options)
        schema = PersistClient.open(opts.url).shard_schema(opts.data_id)
        if schema is None:
            raise NotRegistered(f"data shard {opts.data_id} has no schema: register it with TxnsHandle.register")
        return output_struct(schema)

    def reader(self, schema: StructType) -> DataSourceReader:
        if by_name(self.options):
            return table_read.TableBatchReader(self.options, schema)
        return TxnsBatchReader(Options.parse(self.options), schema)

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        if by_name(self.options):
            return table_stream_reader(self.options, schema)
        return TxnsStreamReader(Options.parse(self.options), schema)

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        return table_write.TableWriter(self.options, schema, overwrite)

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        return table_write.TableStreamWriter(self.options, schema, overwrite)


def by_name(options: Mapping[str, str]) -> bool:
    """Whether a read names a database table (``load("accounts")``: option ``path``) rather than raw shard ids."""
    return bool(options.get("path")) and not options.get("data_id")


# ---- planning and reading ranges ------------------------------------------------------------


class RangeTask(InputPartition):
    """One read task of a range: runs to read, and which of their rows to emit.

    Rows with ``lo <= ts < hi``; for a snapshot (``snapshot_at`` set) every
    row with ``ts < hi``, times at or below ``snapshot_at`` moved to it.
    """

    def __init__(self, url: str, schema_text: str, task: bytes, lo: int, hi: int, snapshot_at: int | None) -> None:
        super().__init__(task)
        self.url, self.schema_text, self.task = url, schema_text, task
        self.lo, self.hi, self.snapshot_at = lo, hi, snapshot_at


def plan_range(
    handle: TxnsHandle, url: str, data_id: str, lo: int, hi: int, snapshot_at: int | None
) -> list[RangeTask]:
    """Read tasks for the updates of ``data_id`` in ``[lo, hi)`` (see :class:`RangeTask`).

    Makes the shard readable up to ``hi - 1`` first. Raises ReadBelowSince
    if the shard's since is not below ``lo`` (not at or below ``snapshot_at``).
    """
    cache = handle.cache
    if snapshot_at is None:
        cache.update_ge(hi)
        nxt = cache.next_write_ge(data_id, lo)
        if lo >= cache.since and (nxt is None or nxt >= hi) and cache.registered_at(data_id, hi - 1):
            return []  # SUBTLE: the txns shard proves [lo, hi) holds no write to the shard
    handle.unblock_read(data_id, hi - 1)
    shard = handle.data_writer(data_id).shard
    state = shard.state()
    if state.upper < hi:
        state = shard.fetch()
    bound = lo if snapshot_at is None else snapshot_at + 1
    if state.since >= bound:
        raise ReadBelowSince(
            f"data shard {data_id} was compacted up to {state.since}, past this read's start "
            f"({bound - 1 if snapshot_at is not None else lo}): updates already emitted may have moved into "
            f"it. Start again (a new checkpoint) with as_of >= {state.since}",
            state.since,
        )
    schema_text = state.schema or handle.data_schema(data_id).to_text()
    runs = [
        r for b in state.batches if b.lower < hi and (snapshot_at is not None or b.upper > lo) for r in b.runs if r.rows
    ]
    return [RangeTask(url, schema_text, t, lo, hi, snapshot_at) for t in plan_tasks(runs)]


def read_range(task: InputPartition) -> Iterator[pa.RecordBatch]:
    """The rows of one :class:`RangeTask`, sorted by ``ts``, as the source's Arrow batches."""
    if not isinstance(task, RangeTask):
        return  # Spark's placeholder partition of an empty read
    schema = Schema.from_text(task.schema_text)
    out = arrow_schema(output_struct(schema))
    hi = pa.scalar(task.hi, pa.uint64())
    for table in read_task(task.url, schema.arrow, task.task):
        ts = table.column("ts")
        keep = pc.less(ts, hi)
        if task.snapshot_at is None:
            keep = pc.and_(keep, pc.greater_equal(ts, pa.scalar(task.lo, pa.uint64())))
        table = table.filter(keep)
        if task.snapshot_at is not None:
            table = apply_rewrite(table, task.snapshot_at)
        if table.num_rows:
            table = ts_as_int64(table.sort_by([("ts", "ascending")]), f"shard {task.url}")
            yield from to_spark_arrow(table, out).to_batches()


# ---- batch reads ---------------------------------------------------------------------------------


class TxnsBatchReader(DataSourceReader):
    """``spark.read.format("txns")``: the rows at ``as_of`` (see the module doc)."""

    def __init__(self, opts: Options, schema: StructType) -> None:
        self.opts = opts

    def partitions(self) -> Sequence[InputPartition]:
        opts = self.opts
        handle = opts.open()
        try:
            as_of = opts.as_of if opts.as_of is not None else latest_readable(handle)
            return plan_range(handle, opts.url, opts.data_id, 0, as_of + 1, snapshot_at=as_of)
        finally:
            release(handle)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return read_range(partition)


def latest_readable(handle: TxnsHandle) -> int:
    """The latest time readable now: the txns shard's upper - 1 (0 if nothing was committed)."""
    handle.cache.sync()
    return max(0, handle.cache.frontier - 1)


# ---- streaming -----------------------------------------------------------------------------------


class TxnsStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """``spark.readStream.format("txns")``: see the module doc.

    Spark calls the offset and planning methods in one long-lived process
    (which keeps the handle and the leased reader) and ``read`` in
    executors, on a copy of this object without them.
    """

    def __init__(self, opts: Options, schema: StructType) -> None:
        self.opts = opts
        self._handle: TxnsHandle | None = None
        self._reader: ReadHandle | None = None
        self._target: int | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {"opts": self.opts, "_handle": None, "_reader": None, "_target": None}

    def _h(self) -> TxnsHandle:
        if self._handle is None:
            self._handle = self.opts.open()
        return self._handle

    def _hold(self) -> ReadHandle:
        """The leased reader holding the data shard's since (opened on first use, heartbeated)."""
        r = self._reader
        if r is not None:
            try:
                r.heartbeat()
                return r
            except LeaseExpired:
                self._reader = None
        h = self._h()
        self._reader = h.client.open_leased_reader(self.opts.data_id, h.data_schema(self.opts.data_id))
        return self._reader

    def _frontier(self) -> int:
        cache = self._h().cache
        cache.sync()
        return cache.frontier if self._target is None else min(cache.frontier, self._target)

    def initialOffset(self) -> Offset:
        as_of = self.opts.as_of if self.opts.as_of is not None else latest_readable(self._h())
        self._hold()
        return {"ts": as_of, "snapshot": True}

    def latestOffset(self, start: Offset, limit: ReadLimit) -> Offset:
        frontier = self._frontier()
        self._hold()
        return {"ts": frontier} if frontier > start["ts"] else start

    def prepareForTriggerAvailableNow(self) -> None:
        self._target = None
        self._target = self._frontier()

    def partitions(self, start: Offset, end: Offset) -> Sequence[InputPartition]:
        lo, hi = start["ts"], end["ts"]
        if hi <= lo:
            return []
        self._hold()
        snapshot_at = lo if start.get("snapshot") else None
        return plan_range(self._h(), self.opts.url, self.opts.data_id, lo, hi, snapshot_at)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return read_range(partition)

    def commit(self, end: Offset) -> None:
        # Everything below end["ts"] is emitted: compaction may now advance times up to end - 1.
        reader = self._hold()
        since = end["ts"] - 1
        if since > reader.since:
            reader.downgrade_since(since)

    def stop(self) -> None:
        if self._reader is not None:
            with contextlib.suppress(Exception):
                self._reader.expire()
            self._reader = None
        if self._handle is not None:
            release(self._handle)
            self._handle = None


# ---- streams of tables by name -----------------------------------------------------------------------------


def table_stream_reader(options: Mapping[str, str], schema: StructType) -> DataSourceStreamReader:
    """``spark.readStream.format("txns").option("url", url).option("changes", "true").load(name)``.

    Resolves the table (at ``asOf``, else the latest time) to its data shard
    and the database's txns shard now, and streams them with
    :class:`txns.spark.source.TxnsStreamReader`.
    """
    opts = table_read.TableOptions.parse(options)
    names = [f.name for f in schema.fields]
    if names[-2:] != ["ts", "diff"]:
        raise InvalidUsage(
            f"a stream of table {opts.name!r} emits its updates: the table's columns plus ts and diff; "
            f"add .option('changes', 'true') to spark.readStream (the schema is chosen before Spark says "
            f"it is a stream)"
        )
    if opts.start is not None or opts.end is not None:
        raise InvalidUsage("a stream starts at asOf (default: the latest time), not at start/end")
    with opts.connect() as db:
        ts = db.timestamp(opts.as_of)
        entry = db.entry(opts.name, ts)
        txns_id = db.root.txns_id
    return TxnsStreamReader(Options(opts.url, txns_id, entry.data_id, None if opts.as_of is None else ts), schema)
