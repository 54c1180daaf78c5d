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
  is recorded in its read set (:mod:`txns.db.read_tracker`).
- A keyed table holds at most one row per primary key: ``upsert`` retracts
  the current row of each key and adds the new one, ``delete`` retracts,
  ``update`` retracts and adds the changed row, ``insert`` refuses a key
  that is there (``DuplicateKey``). The transaction keeps what it wrote to
  keyed tables in memory, by key (at most ``KEYED_WRITES_BYTES``:
  :mod:`txns.db.own_writes`), and caches the committed rows its point reads
  found (:mod:`txns.db.key_cache`).
- Data is buffered in persist batch builders, which spill Parquet parts at
  the part size: memory stays bounded for inserts of any size
  (:mod:`txns.db.staging`). An abandoned transaction deletes the parts it wrote.
- A table created here gets a fresh data shard. Nothing is written for it
  until the commit: then its schema is recorded on the shard (the schemas
  of several new tables at once), and the commit that adds its catalog row
  and data registers it in the txns shard in the same write
  (``Txn.register``): an abandoned transaction leaves nothing registered.
- ``commit`` returns once the commit is durable (:mod:`txns.db.txn_commit`);
  the database applies it in the background (:mod:`txns.db.applier`).
- Its state (:class:`txns.db.txn_state.TxnState`) leaves ``OPEN`` once.
- A transaction commits at most once, even when threads share it: every
  public method holds the transaction's lock, so calls from several
  threads run one at a time; a ``commit()`` that finds the transaction
  committed (or abandoned) by another call raises ``TransactionClosed``
  saying so (with the commit's time). No call can change or discard what
  a commit in progress commits.

The transaction's parts, each in its own module with its invariants: the
tables as it sees them and its DDL (:mod:`txns.db.txn_catalog`), its staged
batches (:mod:`txns.db.staging`), its own writes kept for reading back
(:mod:`txns.db.own_writes`), its read set (:mod:`txns.db.read_tracker`),
its cache of committed keyed rows (:mod:`txns.db.key_cache`), its commit
(:mod:`txns.db.txn_commit`). Engines (Spark) reach it through
:class:`txns.db.engine.EngineTxn`.
"""

from __future__ import annotations

import datetime as dt
import functools
import json
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Concatenate, ParamSpec, TypeVar

import pyarrow as pa
import pyarrow.compute as pc

from persist import Batch, Indeterminate, InvalidUsage, PartRetired, ShardId
from txns.db import clock
from txns.db.arrow_io import check_input, conformed, conformed_stream, stream_of
from txns.db.catalog import TableEntry, check_name, check_primary_key, check_schema, check_writable, data_schema
from txns.db.engine import EngineTxn
from txns.db.errors import (
    TableExists,
    TableNotFound,
    TransactionClosed,
    TransactionConflict,
)
from txns.db.key_cache import KEY_CACHE_KEYS
from txns.db.keyed import (
    Key,
    keys_from_values,
    keys_of,
    read_at,
    require_keyed,
)
from txns.db.keyed_writes import KeyedWrites
from txns.db.own_writes import KEYED_WRITES_BYTES, TRACK_INSERTED_BYTES, OwnWrites
from txns.db.read_tracker import ReadTracker
from txns.db.retention import check_retention
from txns.db.scan import PlanReader, check_columns, check_filter, read_table, scan
from txns.db.staging import Staging
from txns.db.txn_catalog import TxnCatalog
from txns.db.txn_commit import CommitInfo, submit
from txns.db.txn_state import TxnState
from txns.engines import engine_for

if TYPE_CHECKING:
    from txns.db.database import Database


P = ParamSpec("P")
R = TypeVar("R")


def _serialized(method: Callable[Concatenate[Transaction, P], R]) -> Callable[Concatenate[Transaction, P], R]:
    """Run ``method`` holding the transaction's lock (see the module doc: one call at a time)."""

    def locked(self: Transaction, /, *args: P.args, **kwargs: P.kwargs) -> R:
        with self._lock:
            return method(self, *args, **kwargs)

    functools.update_wrapper(locked, method)
    return locked


class Transaction:
    """DDL, writes and reads to commit atomically. Get one with ``Database.transaction()``.

    Reads happen at ``_read_ts``, taken from the isolation level's oracle at
    the first read (a transaction that only writes takes none, so it costs
    no request beyond its commit), with the transaction's own writes
    applied. Until then, table names resolve against the catalog as this
    process last saw it; the first read re-resolves them at ``_read_ts``.
    ``_read_set`` records what was read, for validation at commit
    (:mod:`txns.db.read_tracker`).
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
        self._cat = TxnCatalog(db, cached if cached is not None else db.latest())
        self._staged = Staging(db)
        self._mine = OwnWrites()
        self._reads = ReadTracker(self._cat.created)
        self._read_set = self._reads.reads  # (the same dict: what the committer validates)
        self._keyed = KeyedWrites(db, self._cat.created, self._staged, self._mine, self._reads, self._reads_at)
        self._state = TxnState.OPEN
        # SUBTLE: reentrant, since public methods call each other (and engines'
        # calls through EngineTxn hold it too) on the thread that holds it.
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
        if self._state is not TxnState.OPEN:
            return
        if exc_type is not None:
            self.abort()
        else:
            self.commit()

    def _check_open(self) -> None:
        if self._state is not TxnState.OPEN:
            at = ""
            if self._state is TxnState.COMMITTED and self.commit_info is not None and self.commit_info.ts is not None:
                at = f" (at {clock.describe(self.commit_info.ts)}, txn {self.commit_info.txn_id})"
            raise TransactionClosed(
                f"this transaction is {self._state}{at}; a transaction commits once (a commit() from another "
                f"thread may have done it): start a new one with db.transaction()"
            )

    def _entry(self, name: str) -> TableEntry:
        return self._cat.entry(name)

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
        if name in self._cat.view:
            raise TableExists(
                f"table {name!r} already exists in the database at {self._db.url!r}; drop it first, "
                f"or pick another name"
            )
        d = str(ShardId.new())
        # Nothing is written for it until the commit: its data is buffered with a
        # writer opened here (a read only), and the commit records its schema and
        # registers it.
        self._staged.open_new(d, data_schema(schema, pk))
        self._cat.create(TableEntry(name, d, schema, self._db.client.config.clock_ms(), ret, pk))

    @_serialized
    def drop_table(self, name: str) -> None:
        """Drop table ``name``. Reads as of earlier times still see it (within retention)."""
        self._check_open()
        check_writable(name, "drop", self._system)
        self._cat.drop(self._entry(name))

    @_serialized
    def rename_table(self, old: str, new: str) -> None:
        """Rename table ``old`` to ``new``; its data and history stay with it."""
        self._check_open()
        check_writable(old, "rename", self._system)
        check_writable(new, "rename a table to", self._system)
        e = self._entry(old)
        check_name(new, "new table name")
        if new in self._cat.view:
            raise TableExists(f"cannot rename {old!r} to {new!r}: table {new!r} already exists")
        self._cat.rename(e, new)

    @_serialized
    def set_retention(self, name: str, retention: dt.timedelta | None) -> None:
        """Give table ``name`` its own history retention (None: the database's default)."""
        self._check_open()
        e = self._entry(name)
        self._cat.alter(e, None if retention is None else check_retention(retention))

    # ---- data -----------------------------------------------------------------------------------

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
            return self._keyed.insert(e, data)
        reader = stream_of(data, table)
        if reader is not None:  # a RecordBatchReader or any Arrow stream (a DuckDB relation, ...)
            return self._insert_stream(e, reader)
        pieces = list(conformed(data, e.schema, table))  # every piece checked before any is buffered
        rows = 0
        for p in pieces:
            if p.num_rows:
                self._staged.add(e.data_id, p, 1)
                self._mine.track(e.data_id, p)
                rows += p.num_rows
        self._staged.count(e.data_id, rows, 0)
        return rows

    def _insert_stream(self, e: TableEntry, reader: pa.RecordBatchReader) -> int:
        """A stream goes to a batch of its own: abandoned whole if a piece is bad."""
        rows = self._staged.add_stream(e.data_id, conformed_stream(reader, e.schema, e.name))
        self._mine.untracked.add(e.data_id)  # a stream is not kept in memory
        self._staged.count(e.data_id, rows, 0)
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
            return self._keyed.retract(e, rows)
        self._mine.check_not_opaque(e)
        committed = None  # (a table created here has none)
        if e.data_id not in self._cat.created:
            ts = self._reads_at()
            self._reads.note_scan(e)
            if e.data_id not in self._mine.emptied:
                committed = _committed_matching(self._db, e, ts, rows)
        self._mine.check_present(e, rows, committed)
        return self._retract_rows(e, rows)

    def _retract_rows(self, e: TableEntry, rows: pa.Table) -> int:
        self._staged.add(e.data_id, rows, -1)
        self._mine.retracted.setdefault(e.data_id, []).append(rows)
        self._staged.count(e.data_id, 0, rows.num_rows)
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
        return self._retract_rows(e, rows) if rows.num_rows else 0

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
        if d in self._staged.counts or d in self._mine.keyed or d in self._mine.emptied:
            raise InvalidUsage(
                f"table {e.name!r}: truncate must come before any other write to it in the transaction "
                f"(it retracts the committed rows); start a new transaction"
            )
        self._reads.note_scan(e)
        rows = 0
        if d not in self._cat.created:
            db = self._db
            plan = db.planner.plan(e, self._reads_at())
            reader = PlanReader(db.client.blob, plan, list(e.schema.names), None, db.client.config.retry_deadline_s)
            try:
                for batch in scan(reader):
                    self._staged.add(d, pa.Table.from_batches([batch]).cast(e.schema), -1)
                    rows += batch.num_rows
            except PartRetired as err:  # lost (CorruptObject), or retired meanwhile: the caller starts again
                raise db.planner.missing_part(d, err.key) from None
        self._mine.emptied.add(d)
        self._staged.count(d, 0, rows)
        return rows

    @_serialized
    def _add_batch(
        self, table: str, batch: Batch, *, added: int, retracted: int, read_table: bool, keep_on_abort: bool = False
    ) -> TableEntry:
        """Add a batch an engine wrote to ``table``'s writes (see :meth:`txns.db.engine.EngineTxn.add_batch`)."""
        self._check_open()
        check_writable(table, "write to", self._system)
        e = self._entry(table)
        if read_table:
            self._reads.note_scan(e)
        self._staged.add_batch(e.data_id, batch, keep_on_abort)
        self._mine.opaque.add(e.data_id)
        self._mine.untracked.add(e.data_id)
        self._staged.count(e.data_id, added, retracted)
        return e

    def _reads_at(self) -> int:
        """The read timestamp: taken from the oracle at the first read; the table names re-resolved there.

        Raises TransactionConflict if this transaction's own DDL so far no
        longer fits the catalog at that time (another transaction's DDL
        came in between): nothing was committed.
        """
        if self._read_ts is not None:
            return self._read_ts
        ts = self._db.oracle(self._isolation).read_ts()
        cat = self._cat
        if ts != cat.view_ts:
            if cat.ops:
                try:
                    view = cat.validate(ts, set(self._staged.counts))
                except (TableExists, TableNotFound) as x:
                    raise TransactionConflict(f"{x} (seen at this transaction's first read)") from None
            else:
                view = dict(self._db.catalog(ts).tables)
            for name, e in cat.view.items():
                if e.data_id in self._staged.counts and (name not in view or view[name].data_id != e.data_id):
                    raise TransactionConflict(
                        f"table {name!r}, which this transaction wrote, was dropped or renamed meanwhile; "
                        f"nothing was committed"
                    )
            cat.view, cat.view_ts = view, ts
        self._read_ts = ts
        return ts

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
        rows = self._keyed.current(e, [k])[k]
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
        cur = self._keyed.current(e, wanted)
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
        return self._keyed.upsert(e, data)

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
        return self._keyed.delete(e, wanted)

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
        return self._keyed.update(e, pk, k, values)

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
        self._mine.check_readable(e)
        self._reads.note_scan(e)
        return self._mine.read_back(e, lambda names: self._committed(e, names, expr), cols, expr)

    def _committed(self, e: TableEntry, cols: list[str], expr: Any) -> pa.Table:
        """``e``'s committed rows at the read time (projected, filtered); none for a table created here."""
        if e.data_id in self._cat.created or e.data_id in self._mine.emptied:
            return pa.schema([e.schema.field(c) for c in cols]).empty_table()
        return read_at(self._db.planner, e, self._reads_at(), cols, expr)

    # ---- commit ---------------------------------------------------------------------------------

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
        try:
            self._db.storage_clock.check("commit")  # (a skewed clock would stamp it, and all after it, wrongly)
            self._staged.finish()
        except BaseException:
            self.abort()
            raise
        changes = self._cat.changes()
        for d in self._cat.created:
            if not any(x.data_id == d and n > 0 for x, n in changes.items()):
                self._staged.forget(d)  # created and dropped again in this transaction: its data goes nowhere
        if not self._staged.batches and not changes:
            self._state = TxnState.COMMITTED
            self.commit_info = CommitInfo(None, None, None, {}, (), self._user_meta, read_ts=self._read_ts)
            return self.commit_info
        opaque = self._mine.emptied | self._mine.opaque
        keyed = self._mine.keyed
        try:
            info, self._read_ts = submit(
                self._db,
                self._cat,
                self._staged,
                changes,
                user_meta=self._user_meta,
                reads=self._read_set,
                read_ts=self._read_ts,
                isolation=self._isolation,
                writes={d: (set(keyed[d]) if d in keyed and d not in opaque else None) for d in self._staged.batches},
            )
        except Indeterminate:
            # it may have committed: keep its parts; the caller may find it in db.history()
            self._state = TxnState.UNCERTAIN
            raise
        except BaseException:
            self._discard()
            raise
        self._state = TxnState.COMMITTED
        self.commit_info = info
        return info

    @_serialized
    def abort(self) -> None:
        """Abandon the transaction: nothing is committed; its written parts are deleted."""
        if self._state is not TxnState.OPEN:
            return
        self._discard()

    def _discard(self) -> None:
        self._state = TxnState.ABANDONED
        self._staged.discard()


def _committed_matching(db: Database, e: TableEntry, ts: int, rows: pa.Table) -> pa.Table:
    """The committed rows of ``e`` at ``ts`` that may equal one of ``rows`` (filter pushed down)."""
    cur = db.catalog(ts).by_data_id().get(e.data_id)
    if cur is None:
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


__all__ = ["KEYED_WRITES_BYTES", "KEY_CACHE_KEYS", "TRACK_INSERTED_BYTES", "CommitInfo", "Transaction", "TxnState"]
