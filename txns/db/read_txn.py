"""Read-only transactions: every read at one timestamp.

``with db.read() as r:`` fixes one timestamp, ``r.ts`` (the latest commit
when it began, or the ``as_of`` given), and every read through ``r`` is of
the database as of that time: ``r.table(name)`` behaves like
``db.table(name)`` with its reads pinned at ``r.ts`` (commits that land
meanwhile are not seen), ``r.tables()`` lists the tables then, ``r.get``
reads one row of a keyed table. Nothing is written; nothing is held either:
a read transaction kept open longer than the tables' retention may meet
``ReadBelowSince``.
"""

from __future__ import annotations

import datetime as dt
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from txns.db.catalog import check_name
from txns.db.errors import TransactionClosed
from txns.db.keyed import committed_rows, keys_from_values, require_keyed
from txns.db.table import Table

if TYPE_CHECKING:
    from txns.db.catalog import TableEntry
    from txns.db.database import AsOf, Database


class PinnedTable(Table):
    """A table whose reads default to one timestamp (``ts``) instead of the latest."""

    def __init__(self, db: Database, name: str, ts: int) -> None:
        super().__init__(db, name)
        self.ts = ts

    def __repr__(self) -> str:
        return f"Table({self.name!r}, ts={self.ts})"

    def _at(self, as_of: AsOf) -> tuple[TableEntry, int]:
        ts = self.ts if as_of is None else self.db.timestamp(as_of)
        return self.db.entry(self.name, ts), ts

    def changes(
        self, start: int | dt.datetime, end: int | dt.datetime | None = None, *, columns: list[str] | None = None
    ) -> pa.Table:
        """Like ``Table.changes``; ``end`` None: through the pinned timestamp (not the latest commit)."""
        return super().changes(start, self.ts + 1 if end is None else end, columns=columns)


class ReadTransaction:
    """A read-only transaction at timestamp ``ts``. Get one with ``db.read()``; use it as a context manager."""

    def __init__(self, db: Database, ts: int) -> None:
        self._db = db
        self.ts = ts
        self._open = True

    def __repr__(self) -> str:
        return f"ReadTransaction({self._db.url!r}, ts={self.ts})"

    def __enter__(self) -> ReadTransaction:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """End the transaction: its methods raise ``TransactionClosed`` after (tables it gave keep working)."""
        self._open = False

    def _check_open(self) -> None:
        if not self._open:
            raise TransactionClosed("this read transaction has ended; start a new one with db.read()")

    def table(self, name: str) -> Table:
        """The table ``name`` as of ``ts``: its reads (``to_arrow``, ``scan``, ``count``, ...) default to ``ts``.

        ``TableNotFound`` if there was no such table at ``ts``.
        """
        self._check_open()
        check_name(name)
        self._db.entry(name, self.ts)
        return PinnedTable(self._db, name, self.ts)

    def tables(self) -> list[str]:
        """The names of the tables at ``ts``, sorted."""
        self._check_open()
        return sorted(self._db.catalog(self.ts).tables)

    def get(self, table: str, key: object) -> dict[str, Any] | None:
        """The row of ``key`` in keyed ``table`` at ``ts`` as a dict, or None (see ``Transaction.get``)."""
        self._check_open()
        check_name(table)
        e = self._db.entry(table, self.ts)
        require_keyed(e, "get")
        k = keys_from_values(e, [key])[0]
        rows = committed_rows(self._db.planner, e, self.ts, [k])[k]
        return dict(rows[0]) if rows else None


__all__ = ["PinnedTable", "ReadTransaction"]
