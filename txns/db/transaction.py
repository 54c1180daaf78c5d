"""Transactions of a database: DDL and data for any number of tables, committed as one.

``with db.transaction() as t:`` gathers ``create_table`` / ``drop_table`` /
``rename_table`` / ``set_retention`` and ``insert`` / ``retract`` calls; a
clean exit commits them all with one conditional write on the txns shard
(an exception abandons them: nothing is committed).

Invariants:

- Each call either takes effect in the transaction or raises having changed
  nothing: inputs are converted and checked (columns, types, nulls; for
  ``retract``, that the rows are there) before anything is buffered. A
  streamed input (``RecordBatchReader``) goes to its own batch, abandoned
  whole if a later piece is bad.
- The transaction sees its own changes: a table it created, renamed or
  dropped is visible under its new name (or gone) for its later calls.
- Data is buffered in persist batch builders, which spill Parquet parts at
  the part size: memory stays bounded for inserts of any size. An abandoned
  transaction deletes the parts it wrote.
- A table created here gets a fresh data shard. Nothing is written for it
  until the commit: then its schema is recorded on the shard (the schemas
  of several new tables at once) and it is registered in the txns shard,
  just before the commit that adds the catalog row in the same write as the
  data.
- ``commit`` returns once the commit is durable; the database applies it in
  the background (:mod:`txns.db.applier`).
"""

from __future__ import annotations

import datetime as dt
import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc

from persist import Batch, BatchBuilder, Indeterminate, InvalidUsage, PersistError, ShardId, WriteHandle
from txns.db import clock
from txns.db.arrow_io import check_input, conformed
from txns.db.catalog import TableEntry, check_name, check_schema, data_schema
from txns.db.errors import RowNotFound, TableExists, TableNotFound, TransactionClosed
from txns.db.pool import each
from txns.db.scan import PlanReader, read_table

if TYPE_CHECKING:
    from txns.db.database import Database

log = logging.getLogger(__name__)

TRACK_INSERTED_BYTES = 64 << 20
"""Rows a transaction inserts are kept in memory up to this many bytes, so it can retract them itself."""


@dataclass(frozen=True)
class CommitInfo:
    """What a committed transaction did: its timestamp, wall-clock time, id, and per-table row counts.

    ``ts`` is None for a transaction that had nothing to commit.
    """

    ts: int | None
    time: dt.datetime | None
    txn_id: str | None
    tables: dict[str, dict[str, int]] = field(default_factory=dict)
    operations: tuple[str, ...] = ()
    metadata: dict[str, Any] = field(default_factory=dict)


class Transaction:
    """DDL and writes to commit atomically. Get one with ``Database.transaction()``."""

    def __init__(self, db: Database, metadata: Mapping[str, Any] | None = None) -> None:
        if metadata is not None and not isinstance(metadata, Mapping):
            raise InvalidUsage(f"metadata must be a dict of JSON values, got {type(metadata).__name__}")
        try:
            self._user_meta: dict[str, Any] = json.loads(json.dumps(dict(metadata or {})))
        except (TypeError, ValueError) as e:
            raise InvalidUsage(f"metadata must be JSON-serializable (str keys, JSON values): {e}") from None
        self._db = db
        self._read_ts = db.latest()
        self._view: dict[str, TableEntry] = dict(db.catalog(self._read_ts).tables)
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
        self._state = "open"
        self.commit_info: CommitInfo | None = None

    # ---- context manager ----------------------------------------------------------------

    def __enter__(self) -> Transaction:
        return self

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        if self._state != "open":
            return
        if exc_type is not None:
            self.abort()
        else:
            self.commit()

    def _check_open(self) -> None:
        if self._state != "open":
            raise TransactionClosed(f"this transaction is {self._state}; start a new one with db.transaction()")

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

    def create_table(self, name: str, schema: pa.Schema, *, retention: dt.timedelta | None = None) -> None:
        """Create table ``name`` with ``schema`` (a flat ``pyarrow.Schema``; every column is data)."""
        from txns.db.database import check_retention

        self._check_open()
        check_name(name)
        schema = check_schema(schema)
        ret = None if retention is None else check_retention(retention)
        if name in self._view:
            raise TableExists(
                f"table {name!r} already exists in the database at {self._db.url!r}; drop it first, "
                f"or pick another name"
            )
        d = str(ShardId.new())
        # Nothing is written for it until the commit: its data is buffered with a
        # writer opened here (a read only), and the commit registers it.
        self._writers[d] = self._db.client.open_writer(d, data_schema(schema))
        entry = TableEntry(name, d, schema, self._db.client.config.clock_ms(), ret)
        self._view[name] = entry
        self._new[d] = entry
        self._ops.append(("create", None, entry))

    def drop_table(self, name: str) -> None:
        """Drop table ``name``. Reads as of earlier times still see it (within retention)."""
        self._check_open()
        e = self._entry(name)
        del self._view[name]
        self._ops.append(("drop", e, None))

    def rename_table(self, old: str, new: str) -> None:
        """Rename table ``old`` to ``new``; its data and history stay with it."""
        self._check_open()
        e = self._entry(old)
        check_name(new, "new table name")
        if new in self._view:
            raise TableExists(f"cannot rename {old!r} to {new!r}: table {new!r} already exists")
        n = replace(e, name=new)
        del self._view[old]
        self._view[new] = n
        self._ops.append(("rename", e, n))

    def set_retention(self, name: str, retention: dt.timedelta | None) -> None:
        """Give table ``name`` its own history retention (None: the database's default)."""
        from txns.db.database import check_retention

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
        table = table.append_column(pa.field("ts", pa.uint64()), pa.repeat(pa.scalar(0, pa.uint64()), n))
        return table.append_column(pa.field("diff", pa.int64()), pa.repeat(pa.scalar(diff, pa.int64()), n))

    def insert(self, table: str, data: object) -> int:
        """Add ``data``'s rows to ``table``; return how many. See :mod:`txns.db.arrow_io` for the inputs."""
        self._check_open()
        e = self._entry(table)
        check_input(data, table)
        if isinstance(data, pa.RecordBatchReader):
            return self._insert_stream(e, data)
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
            for p in conformed(reader, e.schema, e.name):
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

    def retract(self, table: str, data: object) -> int:
        """Remove one occurrence of each of ``data``'s rows from ``table``; return how many.

        Every row must be in the table (as committed when checked, with this
        transaction's own inserts and retractions counted), else
        ``RowNotFound`` and nothing is retracted.
        """
        self._check_open()
        e = self._entry(table)
        check_input(data, table)
        pieces = [p for p in conformed(data, e.schema, table) if p.num_rows]
        if not pieces:
            return 0
        rows = pa.concat_tables(pieces)
        self._check_present(e, rows)
        self._builder(e.data_id, -1).add_table(self._updates(rows, -1))
        self._retracted.setdefault(e.data_id, []).append(rows)
        self._count(e.data_id, 0, rows.num_rows)
        return rows.num_rows

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
                    f"{TRACK_INSERTED_BYTES >> 20} MiB, or from a stream, are not counted: retract them in a later transaction)"
                )
            raise RowNotFound(
                f"table {e.name!r}: cannot retract {first}: {missing} more occurrence(s) than the table holds"
                f"{hint}; {short.num_rows} distinct row(s) short in all. Nothing was retracted"
            )

    @staticmethod
    def _with_n(t: pa.Table, n: int, asked: int = 0) -> pa.Table:
        t = t.append_column("n", pa.repeat(pa.scalar(n, pa.int64()), t.num_rows))
        return t.append_column("asked", pa.repeat(pa.scalar(asked, pa.int8()), t.num_rows))

    def _committed_matching(self, e: TableEntry, rows: pa.Table) -> pa.Table:
        """The committed rows of ``e`` (latest) that may equal one of ``rows`` (filter pushed down)."""
        db = self._db
        ts = db.latest()
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

        return db.with_replan(cur, ts, read).cast(e.schema)

    # ---- commit ---------------------------------------------------------------------------------

    def _info(self) -> dict[str, Any]:
        """What history shows of this commit: per data shard its name and row counts, the DDL, the user's metadata."""
        tables: dict[str, dict[str, Any]] = {}

        def touch(e: TableEntry) -> None:
            tables.setdefault(e.data_id, {"name": e.name, "added": 0, "retracted": 0})["name"] = e.name

        for op, old, new in self._ops:
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
        for op, old, new in self._ops:
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
        items = sorted(self._builders.items())

        results = each(lambda b: b.finish(), [b for _, b in items])
        failure: BaseException | None = None
        for ((d, sign), _b), res in zip(items, results, strict=True):
            if isinstance(res, BaseException):
                failure = failure or res
                continue
            del self._builders[(d, sign)]
            if res.rows:
                self._batches.setdefault(d, []).append(res)
        if failure is not None:
            raise failure

    def commit(self) -> CommitInfo:
        """Commit everything atomically (one conditional write); return what was committed.

        Called by a clean exit of ``with db.transaction() as t``. Raises
        (having committed nothing) if another transaction meanwhile made the
        DDL impossible (a name taken, a table dropped).
        """
        self._check_open()
        db = self._db
        try:
            self._finish()
        except BaseException:
            self.abort()
            raise
        changes = self._catalog_changes()
        for d, e in self._new.items():
            if not any(x.data_id == d and n > 0 for x, n in changes.items()):
                # created and dropped again in this transaction: its data goes nowhere
                for b in self._batches.pop(d, []):
                    b.delete(db.client.blob)
                self._counts.pop(d, None)
        if not self._batches and not changes:
            self._state = "committed"
            self.commit_info = CommitInfo(None, None, None, {}, (), self._user_meta)
            return self.commit_info
        info = self._info()
        committed = False
        registered: list[str] = []
        try:
            live_ids = {x.data_id for x, n in changes.items() if n > 0}
            new = {d: data_schema(e.schema) for d, e in self._new.items() if d in live_ids}
            if new:  # registered (with their schemas) right before the commit that names them
                db._register(new)
                registered = list(new)
            txn = db._begin(info)
            for d, bs in sorted(self._batches.items()):
                for b in bs:
                    txn.write_batch(d, b)
            for e, n in sorted(changes.items(), key=lambda x: (x[0].name, x[1])):
                txn.write(db.root.catalog_id, e.key(), (), n)
            known = [*self._view.values(), *(x for _, a, b in self._ops for x in (a, b) if x is not None)]
            written = {e.data_id: e.created_ms for e in known if e.data_id in self._batches}
            ts = db._commit(txn, self._validate if self._ops else None, written)
            committed = True
        except Indeterminate:
            # it may have committed: keep its parts; the caller may find it in db.history()
            self._state = "uncertain"
            raise
        except BaseException:
            self._discard(registered)
            raise
        finally:
            if committed:
                self._state = "committed"
        self.commit_info = CommitInfo(
            ts=ts,
            time=clock.to_datetime(ts),
            txn_id=txn.id,
            tables=_by_name(info["db"]["tables"]),
            operations=tuple(info["db"]["ops"]),
            metadata=self._user_meta,
        )
        return self.commit_info

    def abort(self) -> None:
        """Abandon the transaction: nothing is committed; its written parts are deleted."""
        if self._state != "open":
            return
        self._discard([])

    def _discard(self, registered: list[str]) -> None:
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
                try:
                    batch.delete(blob)
                except Exception:  # noqa: BLE001
                    pass
        self._batches = {}
        if registered:
            try:
                self._db._forget(registered)
            except PersistError as e:
                log.debug("forgetting abandoned shards deferred: %s", e)


def _by_name(tables: dict[str, dict[str, Any]]) -> dict[str, dict[str, int]]:
    out: dict[str, dict[str, int]] = {}
    for t in tables.values():
        c = out.setdefault(t["name"], {"added": 0, "retracted": 0})
        c["added"] += t["added"]
        c["retracted"] += t["retracted"]
    return out


__all__ = ["CommitInfo", "Transaction"]
