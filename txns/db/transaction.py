"""Transactions of a database: DDL and data for any number of tables, committed as one.

``with db.transaction() as t:`` gathers ``create_table`` / ``drop_table`` /
``rename_table`` / ``set_retention`` and ``insert`` / ``retract`` calls (and,
on keyed tables, ``upsert`` / ``delete`` / ``update``); a clean exit commits
them all with one conditional write on the txns shard (an exception abandons
them: nothing is committed). ``get`` (a keyed point read) and ``read`` (a
scan) read inside the transaction.

Invariants:

- Each call either takes effect in the transaction or raises having changed
  nothing: inputs are converted and checked (columns, types, nulls; for
  ``retract``, that the rows are there) before anything is buffered. A
  streamed input (a ``RecordBatchReader``, any ``__arrow_c_stream__``)
  goes to a batch of its own, abandoned whole (its parts deleted) if a
  later piece is bad or the source fails.
- The transaction sees its own changes: a table it created, renamed or
  dropped is visible under its new name (or gone) for its later calls.
- Every read (``get``, ``read``, and the checks of ``retract``, keyed
  ``insert``, ``upsert``, ``delete``, ``update``) is of the committed data
  at the transaction's read timestamp (the latest when it began), with the
  transaction's own writes applied on top (read-your-writes). What it read
  is recorded in ``_read_set`` (see :class:`Transaction`).
- A keyed table holds at most one row per primary key: ``upsert`` retracts
  the current row of each key and adds the new one, ``delete`` retracts,
  ``update`` retracts and adds the changed row, ``insert`` refuses a key
  that is there (``DuplicateKey``). The transaction keeps what it wrote to
  keyed tables in memory, by key (at most ``KEYED_WRITES_BYTES``), and
  caches the committed rows its point reads found (``KEY_CACHE_KEYS``).
- Data is buffered in persist batch builders, which spill Parquet parts at
  the part size: memory stays bounded for inserts of any size. An abandoned
  transaction deletes the parts it wrote.
- A table created here gets a fresh data shard. Nothing is written for it
  until the commit: then its schema is recorded on the shard (the schemas
  of several new tables at once), and the commit that adds its catalog row
  and data registers it in the txns shard in the same write
  (``Txn.register``): an abandoned transaction leaves nothing registered.
- ``commit`` returns once the commit is durable; the database applies it in
  the background (:mod:`txns.db.applier`).
- A transaction commits at most once, even when threads share it: every
  public method holds the transaction's lock, so calls from several
  threads run one at a time; a ``commit()`` that finds the transaction
  committed (or abandoned) by another call raises ``TransactionClosed``
  saying so (with the commit's time). No call can change or discard what
  a commit in progress commits.
"""

from __future__ import annotations

import datetime as dt
import functools
import json
import threading
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Concatenate, ParamSpec, TypeVar

import pyarrow as pa
import pyarrow.compute as pc

from persist import (
    Batch,
    BatchBuilder,
    Indeterminate,
    InvalidUsage,
    PartRetired,
    SchemaMismatch,
    ShardId,
    WriteHandle,
    finish_all,
)
from txns.db import clock
from txns.db.arrow_io import NOT_ARROW, check_input, conform, conformed, conformed_stream, stream_of
from txns.db.catalog import TableEntry, check_name, check_primary_key, check_schema, check_writable, data_schema
from txns.db.committer import CommitRequest
from txns.db.engine import EngineTxn
from txns.db.errors import (
    DuplicateKey,
    InvalidPrimaryKey,
    RowNotFound,
    TableExists,
    TableNotFound,
    TransactionClosed,
    TransactionConflict,
)
from txns.db.keyed import (
    Key,
    committed_rows,
    describe_key,
    first_repeat,
    keys_from_values,
    keys_of,
    read_at,
    require_keyed,
    row_keys,
    without_keys,
)
from txns.db.pool import each
from txns.db.retention import check_retention
from txns.db.scan import PlanReader, check_columns, check_filter, consolidate, read_table, scan
from txns.engines import engine_for

if TYPE_CHECKING:
    from txns.db.database import Database


TRACK_INSERTED_BYTES = 64 << 20
"""Rows a transaction inserts are kept in memory up to this many bytes, so it can retract them itself."""
KEYED_WRITES_BYTES = 64 << 20
"""A transaction's writes to keyed tables (kept in memory, by key) are limited to this many (Arrow) bytes."""
KEY_CACHE_KEYS = 100_000
"""Committed rows found by a transaction's point reads, cached for its later ones: at most this many keys."""

P = ParamSpec("P")
R = TypeVar("R")


def _serialized(method: Callable[Concatenate[Transaction, P], R]) -> Callable[Concatenate[Transaction, P], R]:
    """Run ``method`` holding the transaction's lock (see the module doc: one call at a time)."""

    def locked(self: Transaction, /, *args: P.args, **kwargs: P.kwargs) -> R:
        with self._lock:
            return method(self, *args, **kwargs)

    functools.update_wrapper(locked, method)
    return locked


@dataclass(frozen=True)
class CommitInfo:
    """What a committed transaction did: its timestamp, wall-clock time, id, and per-table row counts.

    ``ts`` is None for a transaction that had nothing to commit.
    ``read_ts``: the time its reads are valid at (they would return the same
    rows at ``ts - 1``: nothing they read changed in between).
    ``attempts``: how many times ``db.run`` ran the function (1 otherwise).
    """

    ts: int | None
    time: dt.datetime | None
    txn_id: str | None
    tables: dict[str, dict[str, int]] = field(default_factory=dict)
    operations: tuple[str, ...] = ()
    metadata: dict[str, Any] = field(default_factory=dict)
    read_ts: int | None = None
    attempts: int = 1


class Transaction:
    """DDL, writes and reads to commit atomically. Get one with ``Database.transaction()``.

    Reads happen at ``_read_ts``, taken from the isolation level's oracle at
    the first read (a transaction that only writes takes none, so it costs
    no request beyond its commit), with the transaction's own writes
    applied. Until then, table names resolve against the catalog as this
    process last saw it; the first read re-resolves them at ``_read_ts``. ``_read_set`` records
    what was read, for validation at commit: data shard id -> the set of
    primary-key tuples read by ``get`` / ``update`` / ``upsert`` / ``delete``
    / keyed ``insert`` and ``retract`` (keys found absent included), or None
    when the transaction read the whole table (``read``; the check of a
    ``retract`` on a table without primary key). A read is recorded even
    when the call then raises (``DuplicateKey``, ``RowNotFound``): the caller
    saw its outcome. Tables created in this transaction are not recorded
    (nothing committed to read; no other transaction can write them).
    """

    _system: frozenset[str] = frozenset()
    """The system tables (``catalog.SYSTEM_PREFIX``) this transaction may write: set by the library only."""

    def __init__(
        self, db: Database, metadata: Mapping[str, Any] | None = None, isolation: str = "strict_serializable"
    ) -> None:
        if metadata is not None and not isinstance(metadata, Mapping):
            raise InvalidUsage(f"metadata must be a dict of JSON values, got {type(metadata).__name__}")
        try:
            self._user_meta: dict[str, Any] = json.loads(json.dumps(dict(metadata or {})))
        except (TypeError, ValueError) as e:
            raise InvalidUsage(f"metadata must be JSON-serializable (str keys, JSON values): {e}") from None
        self._db = db
        self._isolation = isolation
        self._read_ts: int | None = None  # taken at the first read (see _reads_at)
        cached = db.timeline.cached_latest()
        self._view_ts = cached if cached is not None else db.latest()
        self._view: dict[str, TableEntry] = dict(db.catalog(self._view_ts).tables)
        self._ops: list[tuple[str, TableEntry | None, TableEntry | None]] = []
        self._new: dict[str, TableEntry] = {}  # data_id -> entry, for tables created here
        self._writers: dict[str, WriteHandle] = {}  # writers of tables created here (not registered yet)
        self._builders: dict[tuple[str, int], BatchBuilder] = {}
        self._batches: dict[str, list[Batch]] = {}
        self._counts: dict[str, list[int]] = {}  # data_id -> [added, retracted]
        self._inserted: dict[str, list[pa.Table]] = {}
        self._retracted: dict[str, list[pa.Table]] = {}
        self._tracked_bytes = 0
        self._untracked: set[str] = set()
        self._emptied: set[str] = set()  # tables truncated here: their committed rows are gone for this transaction
        self._opaque: set[str] = set()  # tables given batches written elsewhere (Spark): not readable back here
        self._kept: set[int] = set()  # ids of such batches an abandoned transaction must not delete
        self._read_set: dict[str, set[Key] | None] = {}
        # keyed tables: data_id -> key -> row (None: deleted)
        self._own: dict[str, dict[Key, dict[str, Any] | None]] = {}
        self._own_bytes = 0
        self._key_cache: dict[str, dict[Key, list[dict[str, Any]]]] = {}  # committed rows at _read_ts, by key
        self._key_cache_size = 0
        self._state = "open"
        # SUBTLE: reentrant, since public methods call each other (and Spark's
        # writers call private ones) on the thread that holds it.
        self._lock = threading.RLock()
        self._in_run = False  # owned by db.run, which commits it (see Database.run)
        self.commit_info: CommitInfo | None = None

    # ---- context manager ----------------------------------------------------------------

    def __enter__(self) -> Transaction:
        if self._in_run:
            raise InvalidUsage(
                "db.run(fn) commits the transaction it passes to fn: use t directly inside fn, not "
                "`with t:` (nothing was committed)"
            )
        return self

    @_serialized
    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        if self._state != "open":
            return
        if exc_type is not None:
            self.abort()
        else:
            self.commit()

    def _check_open(self) -> None:
        if self._state != "open":
            at = ""
            if self._state == "committed" and self.commit_info is not None and self.commit_info.ts is not None:
                at = f" (at {clock.describe(self.commit_info.ts)}, txn {self.commit_info.txn_id})"
            raise TransactionClosed(
                f"this transaction is {self._state}{at}; a transaction commits once (a commit() from another "
                f"thread may have done it): start a new one with db.transaction()"
            )

    def _entry(self, name: str) -> TableEntry:
        check_name(name)
        e = self._view.get(name)
        if e is None:
            known = sorted(self._view)
            raise TableNotFound(
                f"no table {name!r} in the database at {self._db.url!r} (as this transaction sees it); "
                f"tables: {known if known else 'none'}"
            )
        return e

    # ---- DDL ------------------------------------------------------------------------------------

    @_serialized
    def create_table(
        self,
        name: str,
        schema: pa.Schema,
        *,
        retention: dt.timedelta | None = None,
        primary_key: Sequence[str] | None = None,
    ) -> None:
        """Create table ``name`` with ``schema`` (a flat ``pyarrow.Schema``; every column is data).

        ``primary_key`` (a list of column names) makes it a keyed table: at
        most one row per key, with ``get`` / ``upsert`` / ``delete`` /
        ``update``; key columns must hold no nulls and not be floating-point
        (``InvalidPrimaryKey``).
        """
        self._check_open()
        check_name(name)
        check_writable(name, "create", self._system)
        schema = check_schema(schema)
        pk = check_primary_key(schema, primary_key)
        ret = None if retention is None else check_retention(retention)
        if name in self._view:
            raise TableExists(
                f"table {name!r} already exists in the database at {self._db.url!r}; drop it first, "
                f"or pick another name"
            )
        d = str(ShardId.new())
        # Nothing is written for it until the commit: its data is buffered with a
        # writer opened here (a read only), and the commit records its schema and
        # registers it.
        self._writers[d] = self._db.client.open_writer(d, data_schema(schema, pk))
        entry = TableEntry(name, d, schema, self._db.client.config.clock_ms(), ret, pk)
        self._view[name] = entry
        self._new[d] = entry
        self._ops.append(("create", None, entry))

    @_serialized
    def drop_table(self, name: str) -> None:
        """Drop table ``name``. Reads as of earlier times still see it (within retention)."""
        self._check_open()
        check_writable(name, "drop", self._system)
        e = self._entry(name)
        del self._view[name]
        self._ops.append(("drop", e, None))

    @_serialized
    def rename_table(self, old: str, new: str) -> None:
        """Rename table ``old`` to ``new``; its data and history stay with it."""
        self._check_open()
        check_writable(old, "rename", self._system)
        check_writable(new, "rename a table to", self._system)
        e = self._entry(old)
        check_name(new, "new table name")
        if new in self._view:
            raise TableExists(f"cannot rename {old!r} to {new!r}: table {new!r} already exists")
        n = replace(e, name=new)
        del self._view[old]
        self._view[new] = n
        self._ops.append(("rename", e, n))

    @_serialized
    def set_retention(self, name: str, retention: dt.timedelta | None) -> None:
        """Give table ``name`` its own history retention (None: the database's default)."""
        self._check_open()
        e = self._entry(name)
        ret = None if retention is None else check_retention(retention)
        n = replace(e, retention_ms=ret)
        self._view[name] = n
        self._ops.append(("alter", e, n))

    # ---- data -----------------------------------------------------------------------------------

    def _writer(self, data_id: str) -> WriteHandle:
        w = self._writers.get(data_id)
        return w if w is not None else self._db.handle.data_writer(data_id)

    def _builder(self, data_id: str, sign: int) -> BatchBuilder:
        b = self._builders.get((data_id, sign))
        if b is None:
            b = self._writer(data_id).builder(0, 1)
            self._builders[(data_id, sign)] = b
        return b

    @staticmethod
    def _updates(table: pa.Table, diff: int) -> pa.Table:
        n = table.num_rows
        table = table.append_column(pa.field("ts", pa.uint64()), _constant(0, pa.uint64(), n))
        return table.append_column(pa.field("diff", pa.int64()), _constant(diff, pa.int64(), n))

    @_serialized
    def insert(self, table: str, data: object) -> int:
        """Add ``data``'s rows to ``table``; return how many. See :mod:`txns.db.arrow_io` for the inputs.

        On a keyed table, a key that is already there (committed, or written
        earlier in this transaction) or twice in ``data`` raises
        ``DuplicateKey`` naming it, and nothing of ``data`` is inserted.
        """
        self._check_open()
        check_writable(table, "write to", self._system)
        engine = engine_for(data)
        if engine is not None:  # an engine's DataFrame (Spark's): its workers write the parts
            return int(engine.insert(EngineTxn(self), table, data))
        e = self._entry(table)
        check_input(data, table)
        if e.primary_key is not None:
            return self._insert_keyed(e, data)
        reader = stream_of(data, table)
        if reader is not None:  # a RecordBatchReader or any Arrow stream (a DuckDB relation, ...)
            return self._insert_stream(e, reader)
        pieces = list(conformed(data, e.schema, table))  # every piece checked before any is buffered
        rows = 0
        for p in pieces:
            if p.num_rows:
                self._builder(e.data_id, 1).add_table(self._updates(p, 1))
                self._track(e.data_id, p)
                rows += p.num_rows
        self._count(e.data_id, rows, 0)
        return rows

    def _insert_stream(self, e: TableEntry, reader: pa.RecordBatchReader) -> int:
        """A stream goes to a batch of its own: abandoned whole if a piece is bad."""
        b = self._writer(e.data_id).builder(0, 1)
        rows = 0
        try:
            for p in conformed_stream(reader, e.schema, e.name):
                if p.num_rows:
                    b.add_table(self._updates(p, 1))
                    rows += p.num_rows
        except BaseException:
            try:
                b.finish().delete(self._db.client.blob)
            except Exception:  # noqa: BLE001 - best effort; gc finds leaked parts
                pass
            raise
        batch = b.finish()
        if batch.rows:
            self._batches.setdefault(e.data_id, []).append(batch)
        self._untracked.add(e.data_id)  # a stream is not kept in memory
        self._count(e.data_id, rows, 0)
        return rows

    @_serialized
    def retract(self, table: str, data: object) -> int:
        """Remove one occurrence of each of ``data``'s rows from ``table``; return how many.

        Every row must be in the table (as committed at the transaction's
        read time, with this transaction's own writes counted), else
        ``RowNotFound`` and nothing is retracted. On a keyed table each row
        must be exactly its key's current row.
        """
        self._check_open()
        check_writable(table, "write to", self._system)
        e = self._entry(table)
        check_input(data, table)
        pieces = [p for p in conformed(data, e.schema, table) if p.num_rows]
        if not pieces:
            return 0
        rows = pa.concat_tables(pieces)
        if e.primary_key is not None:
            return self._retract_keyed(e, rows)
        self._check_present(e, rows)
        self._builder(e.data_id, -1).add_table(self._updates(rows, -1))
        self._retracted.setdefault(e.data_id, []).append(rows)
        self._count(e.data_id, 0, rows.num_rows)
        return int(rows.num_rows)

    @_serialized
    def _retract_present(self, table: str, rows: pa.Table) -> int:
        """Retract ``rows`` of unkeyed ``table`` that the caller knows are there, without checking or reading.

        For system tables whose rows the caller read itself (as committed at
        or below this transaction's read time) and that nothing else
        retracts: resolved intents. No read is recorded, so concurrent
        inserts into the table do not conflict with this transaction.
        """
        self._check_open()
        e = self._entry(table)
        if e.primary_key is not None:
            raise InvalidUsage(f"_retract_present is for unkeyed tables; {e.name!r} has a primary key")
        rows = rows.select(e.schema.names).cast(e.schema)
        if rows.num_rows:
            self._builder(e.data_id, -1).add_table(self._updates(rows, -1))
            self._retracted.setdefault(e.data_id, []).append(rows)
            self._count(e.data_id, 0, rows.num_rows)
        return int(rows.num_rows)

    @_serialized
    def truncate(self, table: str) -> int:
        """Remove every row of ``table`` (as committed at the read time); return how many.

        The rows are read part by part and retracted (bounded memory); the
        read covers the whole table, so under serializable isolation a
        concurrent write to it makes this transaction conflict. Must come
        before any other write to ``table`` in this transaction (then
        ``insert`` after it replaces the contents: an overwrite).
        """
        self._check_open()
        check_writable(table, "write to", self._system)
        e = self._entry(table)
        d = e.data_id
        if d in self._counts or d in self._own or d in self._emptied:
            raise InvalidUsage(
                f"table {e.name!r}: truncate must come before any other write to it in the transaction "
                f"(it retracts the committed rows); start a new transaction"
            )
        self._note_scan(e)
        rows = 0
        if d not in self._new:
            db = self._db
            ts = self._reads_at()
            plan = db.planner.plan(e, ts)
            reader = PlanReader(db.client.blob, plan, list(e.schema.names), None, db.client.config.retry_deadline_s)
            b = self._builder(d, -1)
            try:
                for batch in scan(reader):
                    if batch.num_rows:
                        b.add_table(self._updates(pa.Table.from_batches([batch]).cast(e.schema), -1))
                        rows += batch.num_rows
            except PartRetired as err:  # lost (CorruptObject), or retired meanwhile: the caller starts again
                raise db.planner.missing_part(d, err.key) from None
        self._emptied.add(d)
        self._count(d, 0, rows)
        return rows

    @_serialized
    def _add_batch(
        self, table: str, batch: Batch, *, added: int, retracted: int, read_table: bool, keep_on_abort: bool = False
    ) -> TableEntry:
        """Add a batch written elsewhere (by Spark executors: :mod:`txns.spark`) to ``table``'s writes.

        ``batch`` has the table's data shard schema and times ``[0, 1)``; the
        caller checked its rows (for a keyed table: one row per key, and each
        existing key's row retracted). ``read_table``: the caller read the
        whole table to make it (recorded as a scan, validated at commit).
        The table cannot be read back, nor written by key, in this
        transaction afterwards. ``keep_on_abort``: an abandoned transaction
        leaves the batch's parts alone (the caller may commit them in a new
        transaction, e.g. after a conflict, or delete them itself).
        """
        self._check_open()
        check_writable(table, "write to", self._system)
        e = self._entry(table)
        if keep_on_abort:
            self._kept.add(id(batch))
        if read_table:
            self._note_scan(e)
        if batch.rows:
            self._batches.setdefault(e.data_id, []).append(batch)
        self._opaque.add(e.data_id)
        self._untracked.add(e.data_id)
        self._count(e.data_id, added, retracted)
        return e

    def _check_not_opaque(self, e: TableEntry) -> None:
        if e.data_id in self._opaque:
            raise InvalidUsage(
                f"table {e.name!r} was written from a Spark DataFrame in this transaction, which it does not "
                f"keep: it cannot be read or written by key here again; do that in a later transaction"
            )

    def _track(self, data_id: str, rows: pa.Table) -> None:
        if data_id in self._untracked:
            return
        self._tracked_bytes += rows.nbytes
        if self._tracked_bytes > TRACK_INSERTED_BYTES:
            self._untracked.add(data_id)
            self._inserted.pop(data_id, None)
            return
        self._inserted.setdefault(data_id, []).append(rows)

    def _count(self, data_id: str, added: int, retracted: int) -> None:
        c = self._counts.setdefault(data_id, [0, 0])
        c[0] += added
        c[1] += retracted

    def _check_present(self, e: TableEntry, rows: pa.Table) -> None:
        self._check_not_opaque(e)
        cols = list(e.schema.names)
        # the committed rows read are only those that may match: so judge only the rows asked for
        parts = [self._with_n(rows, -1, asked=1)]
        if e.data_id not in self._new:
            parts.append(self._with_n(self._committed_matching(e, rows), 1))
        parts += [self._with_n(t, 1) for t in self._inserted.get(e.data_id, [])]
        parts += [self._with_n(t, -1) for t in self._retracted.get(e.data_id, [])]
        t = pa.concat_tables(parts)
        g = t.group_by(cols, use_threads=False).aggregate([("n", "sum"), ("asked", "max")])
        g = g.rename_columns([*cols, "n", "asked"])
        short = g.filter(pc.and_(pc.less(g.column("n"), 0), pc.equal(g.column("asked"), 1))).drop_columns(["asked"])
        if short.num_rows:
            first = short.slice(0, 1).to_pylist()[0]
            missing = -first.pop("n")
            hint = ""
            if e.data_id in self._untracked:
                hint = (
                    " (rows this transaction inserted past "
                    f"{TRACK_INSERTED_BYTES >> 20} MiB, or from a stream, are not counted: "
                    "retract them in a later transaction)"
                )
            raise RowNotFound(
                f"table {e.name!r}: cannot retract {first}: {missing} more occurrence(s) than the table holds"
                f"{hint}; {short.num_rows} distinct row(s) short in all. Nothing was retracted"
            )

    @staticmethod
    def _with_n(t: pa.Table, n: int, asked: int = 0) -> pa.Table:
        t = t.append_column("n", pa.repeat(pa.scalar(n, pa.int64()), t.num_rows))
        return t.append_column("asked", pa.repeat(pa.scalar(asked, pa.int8()), t.num_rows))

    def _reads_at(self) -> int:
        """The read timestamp: taken from the oracle at the first read; the table names re-resolved there.

        Raises TransactionConflict if this transaction's own DDL so far no
        longer fits the catalog at that time (another transaction's DDL
        came in between): nothing was committed.
        """
        if self._read_ts is not None:
            return self._read_ts
        ts = self._db.oracle(self._isolation).read_ts()
        if ts != self._view_ts:
            if self._ops:
                try:
                    view = self._validate(ts)
                except (TableExists, TableNotFound) as e:
                    raise TransactionConflict(f"{e} (seen at this transaction's first read)") from None
            else:
                view = dict(self._db.catalog(ts).tables)
            self._check_writes_still_named(view)
            self._view, self._view_ts = view, ts
        self._read_ts = ts
        return ts

    def _check_writes_still_named(self, view: dict[str, TableEntry]) -> None:
        """TransactionConflict if a table this transaction wrote is no longer in ``view`` under the same name."""
        for name, e in self._view.items():
            if e.data_id in self._counts and (name not in view or view[name].data_id != e.data_id):
                raise TransactionConflict(
                    f"table {name!r}, which this transaction wrote, was dropped or renamed meanwhile; "
                    f"nothing was committed"
                )

    def _committed_matching(self, e: TableEntry, rows: pa.Table) -> pa.Table:
        """The committed rows of ``e`` (at the read time) that may equal one of ``rows`` (filter pushed down)."""
        db = self._db
        ts = self._reads_at()
        self._note_scan(e)
        cur = db.catalog(ts).by_data_id().get(e.data_id)
        if cur is None or e.data_id in self._emptied:
            return e.schema.empty_table()
        expr = None
        for c in e.schema.names:
            col = rows.column(c)
            values = pc.unique(col.drop_null())
            term = pc.field(c).isin(values)
            if col.null_count:
                term = term | pc.field(c).is_null()
            expr = term if expr is None else expr & term
        cols = list(e.schema.names)
        cfg = db.client.config

        def read(plan: Any) -> pa.Table:
            return read_table(PlanReader(db.client.blob, plan, cols, expr, cfg.retry_deadline_s))

        return db.planner.with_replan(cur, ts, read).cast(e.schema)

    # ---- keyed tables and reads -------------------------------------------------------------------

    @_serialized
    def get(self, table: str, key: object) -> dict[str, Any] | None:
        """The row of ``key`` in keyed ``table`` as a dict (column -> value), or None if there is none.

        ``key`` is a tuple of the primary key's values in its column order
        (or a bare value for a one-column key). The row is as committed at
        the transaction's read time, with this transaction's own writes
        applied (a ``get`` after an ``upsert`` of the key sees the upsert).
        Only that key's rows are decoded (the key is pushed into the Parquet
        reads); committed rows found are cached for the transaction's later
        reads. ``InvalidPrimaryKey`` for a table without a primary key or a
        key of the wrong arity or type.
        """
        self._check_open()
        e = self._entry(table)
        require_keyed(e, "get")
        k = keys_from_values(e, [key])[0]
        rows = self._current(e, [k])[k]
        return dict(rows[0]) if rows else None

    @_serialized
    def get_many(self, table: str, keys: Sequence[object]) -> dict[Key, dict[str, Any] | None]:
        """The rows of many keys of keyed ``table`` at once: normalized key tuple -> row dict, or None.

        As :meth:`get` for each key (own writes applied, reads recorded), but
        one filtered read fetches every committed row asked for.
        """
        self._check_open()
        e = self._entry(table)
        require_keyed(e, "get_many")
        wanted = list(dict.fromkeys(keys_from_values(e, list(keys))))
        cur = self._current(e, wanted)
        return {k: (dict(cur[k][0]) if cur[k] else None) for k in wanted}

    @property
    def read_ts(self) -> int:
        """The time this transaction reads at (taken from its isolation level's oracle on first use)."""
        with self._lock:
            self._check_open()
            return self._reads_at()

    @_serialized
    def upsert(self, table: str, data: object) -> int:
        """Write ``data``'s rows into keyed ``table``, each replacing the row of its key (or adding it).

        ``data`` is anything ``insert`` takes; returns how many rows it has.
        Under the hood the current row of each key is retracted and the new
        one added (a row equal to the current one writes nothing). A key
        twice in ``data`` raises ``DuplicateKey``; nothing is written then.
        """
        self._check_open()
        check_writable(table, "write to", self._system)
        e = self._entry(table)
        require_keyed(e, "upsert")
        check_input(data, table)
        rows, keys, cur = self._keyed_rows(e, data, "an upsert takes one row per key. Nothing was upserted")
        if rows.num_rows == 0:
            return 0
        new = rows.to_pylist()
        changed = [i for i, (k, r) in enumerate(zip(keys, new, strict=True)) if cur[k] != [r]]
        old = [r for i in changed for r in cur[keys[i]]]
        add = rows if len(changed) == rows.num_rows else rows.take(pa.array(changed, pa.int64()))
        self._apply_keyed(e, add, [(keys[i], new[i]) for i in changed], old)
        return int(rows.num_rows)

    @_serialized
    def delete(self, table: str, keys: object) -> int:
        """Remove the rows of ``keys`` from keyed ``table``; return how many rows were removed.

        ``keys``: a list of key tuples (or bare values for a one-column key),
        or rows holding the key columns (Arrow, pandas, Polars, a list of
        dicts; other columns are ignored). A key with no row is skipped.
        """
        self._check_open()
        check_writable(table, "write to", self._system)
        e = self._entry(table)
        require_keyed(e, "delete")
        wanted = list(dict.fromkeys(keys_of(e, keys)))
        if not wanted:
            return 0
        cur = self._current(e, wanted)
        gone = [k for k in wanted if cur[k]]
        old = [r for k in gone for r in cur[k]]
        self._apply_keyed(e, None, [(k, None) for k in gone], old)
        return len(old)

    @_serialized
    def update(self, table: str, key: object, values: Mapping[str, Any]) -> dict[str, Any]:
        """Change some columns (``values``: column -> new value) of the row of ``key``; return the new row.

        ``RowNotFound`` naming the key if keyed ``table`` has no row of it;
        ``SchemaMismatch`` for an unknown column or a value of the wrong
        type; ``InvalidPrimaryKey`` for a change of a key column (delete the
        row and insert the new one instead). The old row is retracted and
        the new one added.
        """
        self._check_open()
        check_writable(table, "write to", self._system)
        e = self._entry(table)
        pk = require_keyed(e, "update")
        k = keys_from_values(e, [key])[0]
        if not isinstance(values, Mapping):
            raise InvalidUsage(
                f"table {e.name!r}: update takes the new values as a dict of column -> value, "
                f"got {type(values).__name__}"
            )
        unknown = [c for c in values if c not in e.schema.names]
        if unknown:
            raise SchemaMismatch(f"table {e.name!r} has no column(s) {unknown}; its columns are {list(e.schema.names)}")
        given: dict[str, Any] = {}
        if values:
            try:
                arrays = {c: pa.array([v]) for c, v in values.items()}
            except NOT_ARROW as x:
                raise SchemaMismatch(
                    f"table {e.name!r}: update values {dict(values)!r} cannot be converted to Arrow: {x}"
                ) from None
            sub = pa.schema([e.schema.field(c) for c in values])
            given = conform(pa.table(arrays), sub, e.name).to_pylist()[0]
        moved = [c for j, c in enumerate(pk) if c in given and given[c] != k[j]]
        if moved:
            raise InvalidPrimaryKey(
                f"table {e.name!r}: update cannot change primary key column(s) {moved}; "
                f"delete the row of {describe_key(e, k)} and insert the new one instead"
            )
        cur = self._current(e, [k])[k]
        if not cur:
            raise RowNotFound(
                f"table {e.name!r} has no row with key {describe_key(e, k)}; nothing was updated (upsert() adds a row)"
            )
        new = {**cur[0], **given}
        if cur == [new]:
            return dict(new)
        add = pa.Table.from_pylist([new], schema=e.schema)
        self._room(e, add.nbytes)
        self._apply_keyed(e, add, [(k, new)], list(cur))
        return dict(new)

    @_serialized
    def read(self, table: str, *, filter: Any = None, columns: list[str] | None = None) -> pa.Table:
        """``table``'s rows as a ``pyarrow.Table``, as this transaction sees them (read-your-writes).

        The committed rows at the transaction's read time (``filter``, a
        ``pyarrow.compute`` expression, and the ``columns`` projection pushed
        into the Parquet reads, as in ``Table.to_arrow``) with this
        transaction's own writes applied. The result has the table's schema
        (or the projection). A table this transaction inserted past
        ``TRACK_INSERTED_BYTES`` (or a stream) into cannot be read back in it
        (``InvalidUsage``), unless it is keyed.
        """
        self._check_open()
        e = self._entry(table)
        cols = check_columns(e.schema, columns)
        expr = check_filter(e.schema, filter)
        self._check_not_opaque(e)
        d = e.data_id
        if e.primary_key is None and d in self._untracked:
            raise InvalidUsage(
                f"table {e.name!r}: this transaction inserted more than {TRACK_INSERTED_BYTES >> 20} MiB into it "
                f"(or a stream), which it does not keep: it cannot read the table back; read it in a later transaction"
            )
        self._note_scan(e)
        out_schema = pa.schema([e.schema.field(c) for c in cols])
        if e.primary_key is None:
            ins, ret = self._inserted.get(d, []), self._retracted.get(d, [])
            if not ins and not ret:
                return self._committed(e, cols, expr)
            names = list(e.schema.names)
            parts = [_with_diff(self._committed(e, names, expr), 1)]
            parts += [_with_diff(t if expr is None else t.filter(expr), 1) for t in ins]
            parts += [_with_diff(t if expr is None else t.filter(expr), -1) for t in ret]
            return consolidate(pa.concat_tables(parts), names).select(cols).cast(out_schema)
        own = self._own.get(d, {})
        if not own:
            return self._committed(e, cols, expr)
        need = [*cols, *(c for c in e.primary_key if c not in cols)]
        base = without_keys(e, self._committed(e, need, expr), list(own)).select(cols)
        mine = pa.Table.from_pylist([r for r in own.values() if r is not None], schema=e.schema)
        if expr is not None:
            mine = mine.filter(expr)
        return pa.concat_tables([base.cast(out_schema), mine.select(cols).cast(out_schema)])

    def _committed(self, e: TableEntry, cols: list[str], expr: Any) -> pa.Table:
        """``e``'s committed rows at the read time (projected, filtered); none for a table created here."""
        if e.data_id in self._new or e.data_id in self._emptied:
            return pa.schema([e.schema.field(c) for c in cols]).empty_table()
        return read_at(self._db.planner, e, self._reads_at(), cols, expr)

    def _keyed_input(self, e: TableEntry, data: object) -> pa.Table:
        """``data`` conformed to ``e``'s schema, in memory (within ``KEYED_WRITES_BYTES``)."""
        pieces: list[pa.Table] = []
        size = 0
        for p in conformed(data, e.schema, e.name):
            if p.num_rows:
                size += p.nbytes
                self._room(e, size)
                pieces.append(p)
        return pa.concat_tables(pieces) if pieces else e.schema.empty_table()

    def _room(self, e: TableEntry, nbytes: int) -> None:
        if self._own_bytes + nbytes > KEYED_WRITES_BYTES:
            raise InvalidUsage(
                f"table {e.name!r}: a transaction's writes to keyed tables are limited to "
                f"{KEYED_WRITES_BYTES >> 20} MiB (it keeps them in memory, by key, to hold one row per key); "
                f"split them into several transactions. Nothing of this call was written"
            )

    def _keyed_rows(
        self, e: TableEntry, data: object, why: str
    ) -> tuple[pa.Table, list[Key], dict[Key, list[dict[str, Any]]]]:
        """``data`` as rows of keyed table ``e``, their keys, and each key's current rows (read at the read time).

        DuplicateKey (``why`` says what was refused) if a key is twice in ``data``.
        """
        rows = self._keyed_input(e, data)
        if rows.num_rows == 0:
            return rows, [], {}
        keys = row_keys(e, rows)
        dup = first_repeat(keys)
        if dup is not None:
            raise DuplicateKey(f"table {e.name!r}: the data has key {describe_key(e, dup)} more than once; {why}")
        return rows, keys, self._current(e, keys)

    def _insert_keyed(self, e: TableEntry, data: object) -> int:
        rows, keys, cur = self._keyed_rows(e, data, "a keyed table holds one row per key. Nothing was inserted")
        if rows.num_rows == 0:
            return 0
        there = next((k for k in keys if cur[k]), None)
        if there is not None:
            where = "written earlier in this transaction" if there in self._own.get(e.data_id, {}) else "committed"
            raise DuplicateKey(
                f"table {e.name!r} already has a row with key {describe_key(e, there)} ({where}): "
                f"{cur[there][0]!r}; use upsert() to replace it. Nothing was inserted"
            )
        self._apply_keyed(e, rows, list(zip(keys, rows.to_pylist(), strict=True)), [])
        return int(rows.num_rows)

    def _retract_keyed(self, e: TableEntry, rows: pa.Table) -> int:
        """Retract ``rows`` of a keyed table: each must be its key's current row (else RowNotFound)."""
        keys = row_keys(e, rows)
        asked = rows.to_pylist()
        cur = self._current(e, list(dict.fromkeys(keys)))
        left = {k: list(v) for k, v in cur.items()}
        for k, r in zip(keys, asked, strict=True):
            if r in left[k]:
                left[k].remove(r)
                continue
            now = f"its row is {cur[k][0]!r}" if cur[k] else "no row has that key"
            raise RowNotFound(
                f"table {e.name!r}: cannot retract {r!r} (key {describe_key(e, k)}): {now}"
                + (" (and it is retracted once already)" if r in cur[k] else "")
                + "; nothing was retracted"
            )
        changes = [(k, left[k][0] if left[k] else None) for k in dict.fromkeys(keys)]
        self._apply_keyed(e, None, changes, asked)
        return len(asked)

    def _current(self, e: TableEntry, keys: Sequence[Key]) -> dict[Key, list[dict[str, Any]]]:
        """The rows of each key as this transaction sees them (normally 0 or 1); records the read.

        The lists are shared (with the cache and the own writes): callers do not change them.
        """
        self._check_not_opaque(e)
        own = self._own.get(e.data_id, {})
        out: dict[Key, list[dict[str, Any]]] = {}
        need: list[Key] = []
        for k in keys:
            if k in own:
                r = own[k]
                out[k] = [] if r is None else [r]
            elif k not in out:
                out[k] = []
                need.append(k)
        self._note_keys(e, keys)
        if need:
            out.update(self._committed_keys(e, need))
        return out

    def _committed_keys(self, e: TableEntry, keys: list[Key]) -> dict[Key, list[dict[str, Any]]]:
        """The committed rows of ``keys`` at the read time, from the cache or one filtered read."""
        if e.data_id in self._new or e.data_id in self._emptied:
            return {k: [] for k in keys}
        cache = self._key_cache.setdefault(e.data_id, {})
        out = {k: cache[k] for k in keys if k in cache}
        missing = [k for k in keys if k not in out]
        if missing:
            found = committed_rows(self._db.planner, e, self._reads_at(), missing)
            out.update(found)
            if self._key_cache_size + len(found) > KEY_CACHE_KEYS:
                self._key_cache, self._key_cache_size = {}, 0  # (bounded: start over)
            if len(found) <= KEY_CACHE_KEYS:
                self._key_cache.setdefault(e.data_id, {}).update(found)
                self._key_cache_size += len(found)
        return out

    def _apply_keyed(
        self,
        e: TableEntry,
        add: pa.Table | None,
        changes: list[tuple[Key, dict[str, Any] | None]],
        retract: list[dict[str, Any]],
    ) -> None:
        """Buffer a keyed write: retract ``retract``, add ``add``; the keys' rows are now ``changes``."""
        d = e.data_id
        if retract:
            self._builder(d, -1).add_table(self._updates(pa.Table.from_pylist(retract, schema=e.schema), -1))
        added = 0
        if add is not None and add.num_rows:
            self._builder(d, 1).add_table(self._updates(add, 1))
            self._own_bytes += add.nbytes
            added = add.num_rows
        own = self._own.setdefault(d, {})
        for k, r in changes:
            own[k] = r
        self._count(d, added, len(retract))

    def _note_keys(self, e: TableEntry, keys: Sequence[Key]) -> None:
        """Record point reads of ``keys`` in the read set (unless the whole table was read)."""
        if e.data_id in self._new:
            return
        if e.data_id not in self._read_set:
            self._read_set[e.data_id] = set(keys)
            return
        s = self._read_set[e.data_id]
        if s is not None:
            s.update(keys)

    def _note_scan(self, e: TableEntry) -> None:
        """Record a read of the whole table in the read set."""
        if e.data_id not in self._new:
            self._read_set[e.data_id] = None

    # ---- commit ---------------------------------------------------------------------------------

    def _info(self) -> dict[str, Any]:
        """What history shows of this commit: per data shard its name and row counts, the DDL, the user's metadata."""
        tables: dict[str, dict[str, Any]] = {}

        def touch(e: TableEntry) -> None:
            tables.setdefault(e.data_id, {"name": e.name, "added": 0, "retracted": 0})["name"] = e.name

        for _op, old, new in self._ops:
            for x in (old, new):
                if x is not None:
                    touch(x)
        for e in self._view.values():
            if e.data_id in self._counts:
                touch(e)
        for d, (a, r) in self._counts.items():
            if d not in tables:
                tables[d] = {"name": self._name_of(d), "added": 0, "retracted": 0}
            tables[d]["added"] += a
            tables[d]["retracted"] += r
        ops = []
        for op, old, new in self._ops:
            if op == "create" and new is not None:
                ops.append(f"create {new.name}")
            elif op == "drop" and old is not None:
                ops.append(f"drop {old.name}")
            elif op == "rename" and old is not None and new is not None:
                ops.append(f"rename {old.name} {new.name}")
            elif op == "alter" and new is not None:
                ops.append(f"set retention {new.name}")
        return {"db": {"tables": tables, "ops": ops}, "user": self._user_meta}

    def _catalog_changes(self) -> dict[TableEntry, int]:
        net: dict[TableEntry, int] = {}
        for _op, old, new in self._ops:
            if old is not None:
                net[old] = net.get(old, 0) - 1
            if new is not None:
                net[new] = net.get(new, 0) + 1
        return {e: n for e, n in net.items() if n}

    def _validate(self, ts: int) -> dict[str, TableEntry]:
        """Replay this transaction's DDL on the catalog at ``ts``; TableExists / TableNotFound if it no longer fits.

        Returns the tables after it: what the catalog is once this commits right after ``ts``.
        """
        live = dict(self._db.catalog(ts).tables)
        for _op, old, new in self._ops:
            if old is not None:
                cur = live.get(old.name)
                if cur is None or cur.data_id != old.data_id:
                    raise TableNotFound(
                        f"table {old.name!r} was dropped or renamed by another transaction meanwhile; "
                        f"nothing was committed"
                    )
                del live[old.name]
            if new is not None:
                if new.name in live:
                    raise TableExists(
                        f"table {new.name!r} was created by another transaction meanwhile; nothing was committed"
                    )
                # (as a read of the catalog would decode it)
                live[new.name] = TableEntry.from_key(new.key())
        self._check_written_live(live)
        return live

    def _check_written_live(self, live: dict[str, TableEntry]) -> None:
        ids = {e.data_id for e in live.values()}
        # (a table this transaction drops itself may take writes with it)
        own_drops = {old.data_id for op, old, _ in self._ops if op == "drop" and old is not None}
        for d in self._counts:
            if d not in ids and d not in own_drops:
                raise TableNotFound(
                    f"a table this transaction writes ({self._name_of(d)!r}) was dropped by another "
                    f"transaction meanwhile; nothing was committed"
                )

    def _name_of(self, data_id: str) -> str:
        for e in [*self._view.values(), *(x for _, a, b in self._ops for x in (a, b) if x is not None)]:
            if e.data_id == data_id:
                return e.name
        return data_id

    def _finish(self) -> None:
        """Finish every builder (their last parts encoded and uploaded at once, on the shared pool).

        A builder that finished moves its batch over (so an abort deletes its
        parts); one that failed stays. Raises the first failure.
        """
        done, failure = finish_all(dict(sorted(self._builders.items())), each)
        for (d, sign), batch in done.items():
            del self._builders[(d, sign)]
            if batch.rows:
                self._batches.setdefault(d, []).append(batch)
        if failure is not None:
            raise failure

    def commit(self) -> CommitInfo:
        """Commit everything atomically (one conditional write); return what was committed.

        Called by a clean exit of ``with db.transaction() as t``. Raises
        (having committed nothing) if another transaction meanwhile made the
        DDL impossible (a name taken, a table dropped). A transaction commits
        once: a second call, from this thread or another one racing it, raises
        ``TransactionClosed`` naming the commit (calls wait for one another).
        """
        if self._in_run:
            raise InvalidUsage(
                "db.run(fn) commits the transaction it passes to fn once fn returns: do not call "
                "t.commit() inside fn (nothing was committed)"
            )
        return self._commit()

    @_serialized
    def _commit(self) -> CommitInfo:
        self._check_open()
        db = self._db
        try:
            db.storage_clock.check("commit")  # (a skewed clock would stamp it, and all after it, wrongly)
        except BaseException:
            self.abort()
            raise
        try:
            self._finish()
        except BaseException:
            self.abort()
            raise
        changes = self._catalog_changes()
        for d in self._new:
            if not any(x.data_id == d and n > 0 for x, n in changes.items()):
                # created and dropped again in this transaction: its data goes nowhere
                for b in self._batches.pop(d, []):
                    b.delete(db.client.blob)
                self._counts.pop(d, None)
        if not self._batches and not changes:
            self._state = "committed"
            self.commit_info = CommitInfo(None, None, None, {}, (), self._user_meta, read_ts=self._read_ts)
            return self.commit_info
        info = self._info()
        committed = False
        started: dict[str, Future[None]] = {}
        try:
            live_ids = {x.data_id for x, n in changes.items() if n > 0}
            new = {d: data_schema(e.schema, e.primary_key) for d, e in self._new.items() if d in live_ids}
            txn = db.committer.begin(info)
            if new:
                # Registered in the commit's own conditional write; their schemas are
                # recorded on the pool while the commit is built, and waited for right
                # before that write.
                started = {d: f for d, s in new.items() if (f := db.committer.record_schema_soon(d, s)) is not None}
                txn.before_write(lambda: db.committer.record_schemas(new, started))
                for d in sorted(new):
                    txn.register(d, new[d])
            for d, bs in sorted(self._batches.items()):
                for b in bs:
                    txn.write_batch(d, b)
            if changes:
                db.catalogs.register_in(txn)
            for e, n in sorted(changes.items(), key=lambda x: (x[0].name, x[1])):
                txn.write(db.root.catalog_id, e.key(), (), n)
            known = [*self._view.values(), *(x for _, a, b in self._ops for x in (a, b) if x is not None)]
            written = {e.data_id: e.created_ms for e in known if e.data_id in self._batches}
            names = {}  # the tables it read, by the names it read them under
            if self._read_ts is not None and self._read_set:
                names = {n: e for n, e in db.catalog(self._read_ts).tables.items() if e.data_id in self._read_set}
            ts, self._read_ts = db.committer.commit(
                CommitRequest(
                    txn,
                    self._validate if self._ops else None,
                    written,
                    reads=self._read_set,
                    names=names,
                    read_ts=self._read_ts,
                    isolation=self._isolation,
                    writes={
                        d: (set(self._own[d]) if d in self._own and d not in self._emptied | self._opaque else None)
                        for d in self._batches
                    },
                )
            )
            committed = True
        except Indeterminate:
            # it may have committed: keep its parts; the caller may find it in db.history()
            self._state = "uncertain"
            raise
        except BaseException:
            self._discard()
            raise
        finally:
            for f in started.values():
                f.exception()  # (a write still under way after a failure: waited for, so none lands later)
            if committed:
                self._state = "committed"
        self.commit_info = CommitInfo(
            ts=ts,
            time=clock.to_datetime(ts),
            txn_id=txn.id,
            tables=_by_name(info["db"]["tables"]),
            operations=tuple(info["db"]["ops"]),
            metadata=self._user_meta,
            read_ts=self._read_ts,
        )
        return self.commit_info

    @_serialized
    def abort(self) -> None:
        """Abandon the transaction: nothing is committed; its written parts are deleted."""
        if self._state != "open":
            return
        self._discard()

    def _discard(self) -> None:
        self._state = "abandoned"
        blob = self._db.client.blob
        for b in self._builders.values():
            try:
                b.finish().delete(blob)
            except Exception:  # noqa: BLE001 - best effort; gc deletes leaked parts
                pass
        self._builders = {}
        for bs in self._batches.values():
            for batch in bs:
                if id(batch) in self._kept:
                    continue
                try:
                    batch.delete(blob)
                except Exception:  # noqa: BLE001
                    pass
        self._batches = {}


_CONSTANTS: dict[tuple[int, str], pa.Array] = {}
_CONSTANT_MAX_ROWS = 1 << 20


def _constant(value: int, type_: pa.DataType, n: int) -> pa.Array:
    """``n`` copies of ``value``: a slice of one cached array (up to 1M rows; no new buffers per batch)."""
    if n > _CONSTANT_MAX_ROWS:
        return pa.repeat(pa.scalar(value, type_), n)
    key = (value, str(type_))
    cached = _CONSTANTS.get(key)
    if cached is None or len(cached) < n:  # (a race makes two arrays at worst: both right)
        cached = _CONSTANTS[key] = pa.repeat(pa.scalar(value, type_), n)
    return cached.slice(0, n)


def _with_diff(t: pa.Table, diff: int) -> pa.Table:
    return t.append_column("diff", pa.repeat(pa.scalar(diff, pa.int64()), t.num_rows))


def _by_name(tables: dict[str, dict[str, Any]]) -> dict[str, dict[str, int]]:
    out: dict[str, dict[str, int]] = {}
    for t in tables.values():
        c = out.setdefault(t["name"], {"added": 0, "retracted": 0})
        c["added"] += t["added"]
        c["retracted"] += t["retracted"]
    return out


__all__ = ["CommitInfo", "Transaction"]
