"""Spark writes to database tables by name: ``df.write`` / ``df.writeStream`` with ``format("txns")``.

Batch::

    df.write.format("txns").option("url", url).mode("append").save("orders")
    df.write.format("txns").option("url", url).mode("overwrite").save("orders")

Streaming (each micro-batch committed exactly once)::

    (df.writeStream.format("txns").option("url", url)
       .option("checkpointLocation", cp).start("events"))

**Batch protocol** (:class:`TableWriter`).

1. Planning (Spark calls the constructor in a Python worker on the driver
   side): open the database by URL (``txns.connect(url, create=False)``), find
   the table, check the DataFrame's columns against the table's by name and
   type (``txns.spark.write.check_columns``/``castable``; no ``diff`` column).
   A missing table raises ``TableNotFound``, a keyed table or a missing
   ``url`` ``InvalidUsage``, a column mismatch ``SchemaMismatch``: before any
   task runs, so nothing is written.
2. Executors (``write``): each task writes its rows as Parquet parts with a
   persist ``BatchBuilder`` into the table's data shard (exactly as
   :func:`txns.spark.write.write_batch`'s tasks do) and returns their
   descriptors (a :class:`PartsMessage`: data shard id, parts, rows).
3. Commit (``commit``, driver side): the descriptors become one persist
   ``Batch`` (times ``[0, 1)``) committed in ONE database transaction:
   ``_add_batch`` (append), or ``truncate`` then ``_add_batch`` (overwrite:
   the contents are replaced atomically). The parts are never rewritten: a
   write-only append that loses a race is retried by the database at a new
   timestamp; an overwrite reads the whole table, so a concurrent write makes
   it conflict, and it is run again (same batch, ``keep_on_abort``) up to
   :data:`OVERWRITE_ATTEMPTS` times. A table dropped or renamed since
   planning (its data shard id changed) fails with ``TableNotFound``.
   A commit that fails for sure deletes the parts; a commit whose outcome is
   unknown (``persist.Indeterminate``) keeps them (it may have landed;
   ``db.history()`` tells). A task message that is not this writer's
   (neither its parts nor None, a task that wrote nothing) fails the commit
   (``InvalidUsage``): never some tasks' rows alone.
   ``abort`` (Spark calls it when the job failed, and also after a
   ``commit`` that raised) deletes the parts only when the table's history
   holds no commit of this write (``Target.write_id``, planned once and in
   the commit's metadata); when it cannot tell it keeps them. Parts of
   failed task attempts are left for ``PersistClient.gc_leaked``.

Save modes: Spark gives Python data sources only ``append`` (overwrite=False)
and ``overwrite`` (overwrite=True); ``errorifexists`` (Spark's default) and
``ignore`` are refused by Spark itself with ``UNSUPPORTED_DATA_SOURCE_SAVE_MODE``
before the source is called: write with ``.mode("append")`` or
``.mode("overwrite")``. Both need the table to exist (create it with
``db.create_table``). Keyed tables (with a primary key) are refused: use
``txns.spark.merge(db, name, df)``, which needs the user's SparkSession.

**Streaming protocol** (:class:`TableStreamWriter`): exactly once per
micro-batch. Spark replays a micro-batch whose commit its checkpoint did not
record (a crash between our commit and its record), with the same batch id
and the same input offsets; our commit may or may not have landed.

- Sink identity: ``option("sinkId")`` if given, else derived from the
  ``checkpointLocation`` option (Spark passes it to the source's options), the
  query id Spark keeps in ``<checkpoint>/metadata`` (local checkpoints) and
  the table: ``"<table>@<sha256(path#query id)[:16]>"``. So a checkpoint deleted
  and started again at the same path is a new sink (its batch ids restart at
  0: inheriting the old progress would skip them). With ``sinkId`` (or a
  remote checkpoint) that is the user's job: give a new ``sinkId`` with a new
  checkpoint. A query without either (a checkpoint set only by the session
  conf) is refused.
- Progress: the system keyed table :data:`SINKS` (``sink`` string primary key,
  ``batch`` int64: the last committed batch id), created on first use by the
  committing transaction itself (a racing creator makes one commit fail with
  ``TableExists``/conflict: it retries and sees the table).
- ``commit(messages, batchId)``: one strict-serializable transaction reads
  the sink's progress row; if it is ``>= batchId`` the batch is already in the
  table: commit nothing and delete the new parts. Else add the batch
  (truncating first in complete output mode) and upsert the progress row to
  ``batchId``; commit. A ``TransactionConflict`` (a concurrent committer of
  the same sink, or a write racing a truncate) runs the check again.
- ``abort(messages, batchId)`` (after a failed job, or a ``commit`` that
  raised and may have landed) deletes the parts only while the sink's
  progress is below ``batchId``; when it cannot tell it keeps them.

Invariants: (1) the data of batch ``b`` and the progress row ``b`` are
committed by the same commit, so the table holds a batch's rows iff progress
>= ``b``; (2) a commit adds data only if the progress it read (validated at
commit: strict serializable) is below ``b``, and moves it to ``b``; so each
batch id's rows land at most once, and every batch Spark records as committed
landed (Spark records it only after ``commit`` returned). Batch ids of a
checkpoint only grow, so a smaller id after a larger one is a replay: skipped.
A replayed batch is assumed to carry the same rows (Spark's replay of a
deterministic source); if not, the first committed version is kept.
Output modes: ``append`` adds rows; ``complete`` (overwrite=True) replaces the
table's contents with each batch's result; ``update`` appends the changed rows
(it does not replace earlier versions of them: use complete mode, or a keyed
table through ``merge``).
"""

from __future__ import annotations

import hashlib
import json
import os
import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import pyarrow as pa
from pyspark.sql.datasource import DataSourceArrowWriter, DataSourceStreamArrowWriter, WriterCommitMessage

from persist import Batch, Indeterminate, InvalidUsage, PersistConfig, SchemaMismatch
from persist.manifest import Run
from txns.db.catalog import TableEntry, check_writable, data_schema
from txns.db.engine import EngineTxn
from txns.db.errors import TableExists, TableNotFound, TransactionConflict
from txns.spark._common import check_url, location
from txns.spark.write import _write_rows, check_columns, part_refs

if TYPE_CHECKING:
    from pyspark.sql.types import StructType

    from txns.db.database import Database
    from txns.db.transaction import Transaction

SINKS = "txns_sinks"
"""The system table of streaming sinks' progress: ``sink`` (primary key) -> ``batch``, the last committed batch id."""
SINKS_SCHEMA = pa.schema([pa.field("sink", pa.string(), nullable=False), pa.field("batch", pa.int64())])
OVERWRITE_ATTEMPTS = 5
"""An overwrite that conflicts with concurrent writes (its truncate read the whole table) is tried this many times."""
STREAM_ATTEMPTS = 20
"""A micro-batch commit that conflicts (a concurrent committer of the sink, a write racing its truncate) is
checked and tried again this many times."""


@dataclass
class PartsMessage(WriterCommitMessage):
    """What one write task returns: the data shard it wrote to, its part descriptors, its rows."""

    data_id: str
    parts: list[dict[str, Any]] = field(default_factory=list)
    rows: int = 0


@dataclass(frozen=True)
class Target:
    """What the executors need to write a table (planned on the driver side)."""

    url: str
    table: str
    data_id: str
    schema_text: str
    part_target_bytes: int
    write_id: str = field(default_factory=lambda: uuid.uuid4().hex)
    """This write's identity, in its commit's metadata: ``abort`` looks it up (see :func:`abort_parts`)."""


def _connect(url: str) -> Database:
    import txns

    return txns.connect(url, create=False)


def plan_target(options: Mapping[str, str], schema: StructType, what: str) -> Target:
    """Check ``options`` and the DataFrame ``schema`` against the table; what executors need. Raises before writing."""
    options = {str(k).lower(): v for k, v in options.items()}  # (Spark passes them case-insensitively)
    url = options.get("url")
    table = options.get("path")
    if not url:
        raise InvalidUsage(
            f'{what} needs the database URL: .option("url", "file:///ABSOLUTE/PATH" or "s3://BUCKET/PREFIX?...")'
        )
    if not table:
        raise InvalidUsage(f'{what} needs the table name: .save("TABLE") (or .start("TABLE") for a stream)')
    check_url(str(url))
    target = options.get("part_target_bytes")
    try:
        size = PersistConfig().part_target_bytes if target is None else int(str(target))
    except ValueError:
        raise InvalidUsage(f"option part_target_bytes must be a positive int, got {target!r}") from None
    if size <= 0:
        raise InvalidUsage(f"option part_target_bytes must be a positive int, got {size}")
    db = _connect(str(url))
    try:
        e = _table_entry(db, str(table))
    finally:
        db.close()
    if e.primary_key is not None:
        raise InvalidUsage(
            f"table {e.name!r} has a primary key {list(e.primary_key)}: write a DataFrame to it with "
            f"txns.spark.merge(db, {e.name!r}, df) (upserts by key), not with format('txns'); a stream with "
            f".foreachBatch(txns.spark.merge_stream(url, {e.name!r}, sink=NAME)) (exactly once)"
        )
    check_table_columns(schema, e)
    return Target(str(url), e.name, e.data_id, data_schema(e.schema, e.primary_key).to_text(), size)


def _table_entry(db: Database, name: str) -> TableEntry:
    try:
        return db.entry(name, db.latest())
    except TableNotFound as err:
        raise TableNotFound(
            f"{err}; a Spark write needs an existing table: create it first with "
            f"db.create_table({name!r}, schema) (db.tables() lists the tables)"
        ) from None


def check_table_columns(df_schema: StructType, e: TableEntry) -> list[str]:
    """The DataFrame's columns must be exactly the table's (by name; types convertible), else SchemaMismatch."""
    schema = data_schema(e.schema, e.primary_key)
    try:
        cols = check_columns(df_schema, schema, e.data_id)
    except SchemaMismatch as err:
        raise SchemaMismatch(f"table {e.name!r}: {err}") from None
    if "diff" in cols:
        raise SchemaMismatch(
            f"table {e.name!r} has no column 'diff' (columns: {e.schema.names}); drop it from the DataFrame "
            f"(a Spark write inserts rows; retract rows in a transaction)"
        )
    return cols


def write_parts(target: Target, batches: Iterator[pa.RecordBatch]) -> PartsMessage:
    """Executors: write ``batches`` as parts of the table's data shard (as ``write_batch``'s tasks do)."""
    parts: list[dict[str, Any]] = []
    for out in _write_rows(target.url, target.data_id, target.schema_text, target.part_target_bytes, batches):
        parts.extend(out.to_pylist())
    return PartsMessage(target.data_id, parts, sum(int(p["rows"]) for p in parts))


def gather(target: Target, messages: Sequence[WriterCommitMessage | None]) -> tuple[Batch, int]:
    """The tasks' parts as one Batch of the data shard (times ``[0, 1)``) and its row count.

    A task message for another data shard (the table was dropped or renamed
    and recreated since planning) raises TableNotFound.
    """
    msgs = [m for m in messages if isinstance(m, PartsMessage)]
    odd = [m for m in messages if m is not None and not isinstance(m, PartsMessage)]
    if odd:
        # (None: a task that wrote nothing. Anything else is not ours: its rows would be left out)
        abort_parts(target, msgs)
        raise InvalidUsage(
            f"write to table {target.table!r}: {len(odd)} of {len(messages)} task(s) reported "
            f"{type(odd[0]).__name__}, not the parts they wrote; nothing was committed; write again"
        )
    refs = part_refs([p for m in msgs for p in m.parts])
    for m in msgs:
        if m.data_id != target.data_id:
            _delete(target.url, _batch(m.data_id, target.schema_text, part_refs(m.parts)))
            raise TableNotFound(
                f"table {target.table!r} was dropped or renamed while Spark wrote to it (its data shard changed "
                f"from {m.data_id} to {target.data_id}); nothing was committed; write again"
            )
    return _batch(target.data_id, target.schema_text, refs), sum(m.rows for m in msgs)


def _batch(data_id: str, schema_text: str, refs: tuple[Any, ...]) -> Batch:
    runs = (Run(parts=refs, rows=sum(p.rows for p in refs)),) if refs else ()
    return Batch(shard_id=data_id, id=uuid.uuid4().hex, lower=0, upper=1, runs=runs, schema_fingerprint=schema_text)


def _delete(url: str, batch: Batch) -> None:
    try:
        batch.delete(location(url).blob)
    except Exception:  # noqa: BLE001 - best effort; PersistClient.gc_leaked deletes leaked parts
        pass


def _check_same_table(t: Transaction, target: Target) -> None:
    e = EngineTxn(t).entry(target.table)
    if e.data_id != target.data_id:
        raise TableNotFound(
            f"table {target.table!r} was dropped or renamed (and another created under its name) since Spark "
            f"planned this write; nothing was committed; write again"
        )


def commit_batch(target: Target, batch: Batch, rows: int, overwrite: bool) -> None:
    """Commit ``batch`` to the table in one transaction (truncating first if ``overwrite``); see the module doc."""
    meta = {"spark": {"mode": "overwrite" if overwrite else "append", "rows": rows, "write": target.write_id}}
    db = _connect(target.url)
    try:
        for attempt in range(1, OVERWRITE_ATTEMPTS + 1):
            try:
                with db.transaction(metadata=meta) as t:
                    _check_same_table(t, target)
                    if overwrite:
                        t.truncate(target.table)
                    EngineTxn(t).add_batch(
                        target.table, batch, added=rows, retracted=0, read_table=False, keep_on_abort=True
                    )
                return
            except TransactionConflict:
                if attempt == OVERWRITE_ATTEMPTS:
                    _delete(target.url, batch)
                    raise
            except Indeterminate:
                raise  # it may have committed: keep the parts
            except BaseException:
                _delete(target.url, batch)
                raise
    finally:
        db.close()


class TableWriter(DataSourceArrowWriter):
    """``df.write.format("txns").option("url", url).mode("append"|"overwrite").save(table)``: see the module doc."""

    def __init__(self, options: Mapping[str, str], schema: StructType, overwrite: bool) -> None:
        self.target = plan_target(options, schema, 'df.write.format("txns")')
        self.overwrite = bool(overwrite)

    def write(self, iterator: Iterator[pa.RecordBatch]) -> PartsMessage:
        return write_parts(self.target, iterator)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        batch, rows = gather(self.target, messages)
        commit_batch(self.target, batch, rows, self.overwrite)

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        abort_parts(self.target, messages, check=True)


def abort_parts(target: Target, messages: Sequence[WriterCommitMessage | None], *, check: bool = False) -> None:
    """Delete the parts the tasks reported (best effort); with ``check``, only if this write did not commit.

    Spark calls ``abort`` when the job failed, and also when ``commit``
    raised: a commit whose outcome was unknown (``Indeterminate``) may have
    landed, and deleting its parts would lose committed rows. So ``abort``
    (``check=True``) first looks for its write id in the table's history
    and deletes nothing when it is there, or when the history cannot be read
    (the parts are then left to ``PersistClient.gc_leaked``).
    """
    if check and not _surely_not_committed(target):
        return
    for m in messages:
        if isinstance(m, PartsMessage) and m.parts:
            _delete(target.url, _batch(m.data_id, target.schema_text, part_refs(m.parts)))


def _surely_not_committed(target: Target) -> bool:
    """Whether the table's history (read now) holds no commit of ``target.write_id``; False if unreadable."""
    try:
        db = _connect(target.url)
        try:
            for text in db.history(target.table).column("metadata").to_pylist():
                spark = json.loads(text or "{}").get("spark")
                if isinstance(spark, dict) and spark.get("write") == target.write_id:
                    return False
        finally:
            db.close()
    except Exception:  # noqa: BLE001 - cannot tell (storage, a dropped table): keep the parts
        return False
    return True


# ---- streaming -----------------------------------------------------------------------------------


def sink_id(options: Mapping[str, str], table: str) -> str:
    """The sink's identity: option ``sinkId``, else ``table@hash(checkpointLocation)``; InvalidUsage if neither."""
    opts = {str(k).lower(): v for k, v in options.items()}  # (Spark passes them case-insensitively)
    given = opts.get("sinkid")
    if given:
        return str(given)
    cp = opts.get("checkpointlocation")
    if not cp:
        raise InvalidUsage(
            f'a streaming write to table {table!r} needs .option("checkpointLocation", DIR) on the writeStream '
            f'(the session conf alone does not reach the sink), or .option("sinkId", NAME): a name unique to '
            f"this query, kept across its restarts (it keys the exactly-once progress in table {SINKS!r})"
        )
    cp = str(cp)
    local = cp[len("file:") :] if cp.startswith("file:") else cp if "://" not in cp else None
    if local is not None:
        cp = os.path.abspath(local.removeprefix("//"))
    return f"{table}@{hashlib.sha256((cp + '#' + _query_id(local)).encode()).hexdigest()[:16]}"


def _query_id(local: str | None) -> str:
    """The query id Spark keeps in ``<checkpoint>/metadata`` (local checkpoints only; else "").

    A checkpoint deleted and made again at the same path is a new query
    (new id, batch ids from 0 again): it must not inherit the old progress,
    or its batches would be skipped as replays.
    """
    if local is None:
        return ""
    try:
        with open(os.path.join(os.path.abspath(local.removeprefix("//")), "metadata")) as f:
            return str(json.loads(f.readline()).get("id", ""))
    except (OSError, ValueError, AttributeError):
        return ""


def stream_progress(db: Database, sink: str) -> int | None:
    """The last batch id committed by streaming sink ``sink`` (None: none yet)."""
    if SINKS not in db.tables():
        return None
    with db.transaction() as t:
        row = t.get(SINKS, sink)
    return None if row is None else int(row["batch"])


def commit_stream_batch(target: Target, sink: str, batch: Batch, rows: int, batch_id: int, overwrite: bool) -> bool:
    """Commit micro-batch ``batch_id`` exactly once (see the module doc); False if it was already committed."""
    meta = {
        "spark": {
            "mode": "complete" if overwrite else "append",
            "rows": rows,
            "sink": sink,
            "batch": batch_id,
            "write": target.write_id,
        }
    }
    check_writable(target.table, "write to")
    db = _connect(target.url)
    try:
        for attempt in range(1, STREAM_ATTEMPTS + 1):
            try:
                with db.transaction(metadata=meta, isolation="strict_serializable") as t:
                    EngineTxn(t).allow_system({SINKS})
                    _ = t.read_ts  # the read time first: the names below resolve at it
                    _check_same_table(t, target)
                    try:
                        row = t.get(SINKS, sink)
                    except TableNotFound:
                        t.create_table(SINKS, SINKS_SCHEMA, primary_key=["sink"])
                        row = None
                    if row is not None and int(row["batch"]) >= batch_id:
                        t.abort()
                        _delete(target.url, batch)
                        return False
                    if overwrite:
                        t.truncate(target.table)
                    EngineTxn(t).add_batch(
                        target.table, batch, added=rows, retracted=0, read_table=False, keep_on_abort=True
                    )
                    t.upsert(SINKS, [{"sink": sink, "batch": batch_id}])
                return True
            except (TransactionConflict, TableExists):
                if attempt == STREAM_ATTEMPTS:
                    _delete(target.url, batch)
                    raise
            except Indeterminate:
                raise  # it may have committed: keep the parts; Spark's replay finds out from the progress row
            except BaseException:
                _delete(target.url, batch)
                raise
        raise AssertionError("unreachable")
    finally:
        db.close()


class TableStreamWriter(DataSourceStreamArrowWriter):
    """``df.writeStream.format("txns").option("url", url).option("checkpointLocation", cp).start(table)``.

    Each micro-batch is committed exactly once (see the module doc). Spark
    builds a new writer for every commit, in a Python worker on the driver
    side: the constructor checks the table again then.
    """

    def __init__(self, options: Mapping[str, str], schema: StructType, overwrite: bool) -> None:
        self.target = plan_target(options, schema, 'df.writeStream.format("txns")')
        self.sink = sink_id(options, self.target.table)
        self.overwrite = bool(overwrite)

    def write(self, iterator: Iterator[pa.RecordBatch]) -> PartsMessage:
        return write_parts(self.target, iterator)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        batch, rows = gather(self.target, messages)
        commit_stream_batch(self.target, self.sink, batch, rows, int(batchId), self.overwrite)

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        # (a commit that raised may have landed: then the sink's progress is at this batch, keep its parts)
        try:
            with _connect(self.target.url) as db:
                progress = stream_progress(db, self.sink)
        except Exception:  # noqa: BLE001 - cannot tell: keep the parts (PersistClient.gc_leaked)
            return
        if progress is None or progress < int(batchId):
            abort_parts(self.target, messages)


__all__ = [
    "OVERWRITE_ATTEMPTS",
    "SINKS",
    "SINKS_SCHEMA",
    "PartsMessage",
    "TableStreamWriter",
    "TableWriter",
    "commit_batch",
    "commit_stream_batch",
    "plan_target",
    "sink_id",
    "stream_progress",
]
