"""What an engine (Spark) may do with a transaction: :class:`EngineTxn`, the public engine interface.

An engine writes a DataFrame's rows itself (its workers write Parquet parts
of the table's data shard) and hands the transaction the resulting
``persist.Batch``; the transaction commits that batch like its own
(re-timestamped at the commit, not a byte rewritten). ``t.insert(table,
df)`` with an engine's DataFrame calls ``engine.insert(EngineTxn(t), table,
df)`` (the engine found through :mod:`txns.engines`); an engine's own
writers (a Spark sink, ``merge``) make one with ``EngineTxn(t)``.

>>> import pyarrow as pa, txns
>>> from txns.db.engine import EngineTxn
>>> db = txns.connect("mem://doc-engine")
>>> _ = db.create_table("events", pa.schema([("id", pa.int64())]))
>>> with db.transaction() as t:
...     et = EngineTxn(t)
...     e = et.entry("events")
...     b = db.client.open_writer(e.data_id, et.shard_schema(e)).builder(0, 1)   # (an engine's workers write)
...     b.add_table(pa.table({"id": [1, 2], "ts": pa.array([0, 0], pa.uint64()), "diff": [1, 1]}))
...     _ = et.add_batch("events", b.finish(), added=2, retracted=0, read_table=False)
>>> db.table("events").to_arrow().to_pylist()
[{'id': 1}, {'id': 2}]

Invariants (those of :class:`txns.db.transaction.Transaction`, which this
only exposes):

- Every call checks the transaction is open (``TransactionClosed``) and
  holds its lock: an engine's calls interleave with the user's one at a time.
- A batch added is the caller's promise: it has the table's data shard
  schema and times ``[0, 1)``, and its rows obey the table's rules (for a
  keyed table one row per key, each existing key's row retracted, checked
  against a read of the whole table noted with :meth:`note_scan` or
  ``read_table=True``). The transaction does not keep its rows: the table
  cannot be read back, nor written by key, in the transaction afterwards.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from persist import Batch, Schema
from txns.db.catalog import TableEntry, data_schema

if TYPE_CHECKING:
    from txns.db.database import Database
    from txns.db.transaction import Transaction


class EngineTxn:
    """A transaction as an engine sees it (see the module doc)."""

    def __init__(self, transaction: Transaction) -> None:
        self.transaction = transaction

    @property
    def db(self) -> Database:
        """The transaction's database."""
        return self.transaction._db

    @property
    def url(self) -> str:
        """The database's location as typed (secrets included, for workers to open; never print it)."""
        return self.transaction._db.client.url

    @staticmethod
    def shard_schema(entry: TableEntry) -> Schema:
        """The persist schema of ``entry``'s data shard (what a batch added for it must have)."""
        return data_schema(entry.schema, entry.primary_key)

    def check_open(self) -> None:
        """``TransactionClosed`` if the transaction committed or was abandoned."""
        with self.transaction._lock:
            self.transaction._check_open()

    def entry(self, table: str) -> TableEntry:
        """Table ``table`` as the transaction sees it (its own DDL applied); ``TableNotFound`` if none."""
        with self.transaction._lock:
            self.transaction._check_open()
            return self.transaction._entry(table)

    def check_rows_kept(self, entry: TableEntry) -> None:
        """``InvalidUsage`` if an engine added a batch to ``entry`` here (its rows are not kept: no reads by key)."""
        with self.transaction._lock:
            self.transaction._mine.check_not_opaque(entry)

    def wrote_by_key(self, entry: TableEntry) -> bool:
        """Whether the transaction wrote keyed ``entry`` by key (upsert, delete, update, a keyed Arrow insert)."""
        with self.transaction._lock:
            return bool(self.transaction._mine.keyed.get(entry.data_id))

    def reads_committed(self, entry: TableEntry) -> bool:
        """Whether ``entry``'s committed rows count here: False if the transaction created or truncated it."""
        t = self.transaction
        with t._lock:
            return entry.data_id not in t._cat.created and entry.data_id not in t._mine.emptied

    def note_scan(self, entry: TableEntry) -> None:
        """Record a read of the whole of ``entry`` (validated at commit, per the isolation level)."""
        with self.transaction._lock:
            self.transaction._check_open()
            self.transaction._reads.note_scan(entry)

    def allow_system(self, names: Iterable[str]) -> None:
        """Let the transaction write the system tables ``names`` (the library's own sinks' progress rows only)."""
        with self.transaction._lock:
            self.transaction._system = frozenset(names)

    def add_batch(
        self, table: str, batch: Batch, *, added: int, retracted: int, read_table: bool, keep_on_abort: bool = False
    ) -> TableEntry:
        """Add ``batch`` (written by the engine) to ``table``'s writes; return the table's entry.

        ``added`` / ``retracted``: its row counts (for history).
        ``read_table``: the engine read the whole table to make it (noted as
        a scan). ``keep_on_abort``: an abandoned transaction leaves the
        batch's parts alone (the engine may commit them in a new transaction
        after a conflict, or delete them itself); else it deletes them.
        """
        return self.transaction._add_batch(
            table, batch, added=added, retracted=retracted, read_table=read_table, keep_on_abort=keep_on_abort
        )


__all__ = ["EngineTxn"]
