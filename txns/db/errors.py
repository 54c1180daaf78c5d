"""Errors of the database layer. All are persist's ``InvalidUsage`` (a ``ValueError``): bad input.

Each is raised before anything is written, so the database is unchanged
(a transaction that raises one inside ``with db.transaction()`` is abandoned).
Reads below the retained history raise persist's ``ReadBelowSince``; reads at
a time in the future that does not arrive raise persist's ``ReadTimeout``.
"""

from __future__ import annotations

from persist import InvalidUsage


class DatabaseNotFound(InvalidUsage):
    """``connect(url, create=False)`` found no database at the location."""


class TableNotFound(InvalidUsage, KeyError):
    """No table of that name exists (at the time asked)."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else ""


class TableExists(InvalidUsage):
    """``create_table`` (or ``rename_table``) of a name that is taken."""


class InvalidTableName(InvalidUsage):
    """A table name that is not allowed."""


class RowNotFound(InvalidUsage):
    """``retract`` of a row the table does not hold (as many times as asked), or ``update`` of a missing key."""


class TransactionClosed(InvalidUsage):
    """A transaction was used after it committed or was abandoned."""


class DuplicateKey(InvalidUsage):
    """A keyed table would hold two rows of one primary key.

    ``insert`` of a key the table already holds (committed, or written
    earlier in the same transaction) or of a key twice in its data; also an
    ``upsert`` whose data gives one key twice. The message names the table
    and the key.
    """


class InvalidPrimaryKey(InvalidUsage):
    """A primary key that does not fit its table.

    A bad ``primary_key`` at ``create_table`` (empty, unknown or repeated
    columns, a floating-point column), a key of the wrong arity or type, a
    null in a key column, or a keyed operation (``get`` / ``upsert`` /
    ``delete`` / ``update``) on a table created without a primary key.
    """


__all__ = [
    "DatabaseNotFound",
    "DuplicateKey",
    "InvalidPrimaryKey",
    "InvalidTableName",
    "RowNotFound",
    "TableExists",
    "TableNotFound",
    "TransactionClosed",
]


class TransactionConflict(Exception):
    """A read-then-write transaction could not commit: something it read changed meanwhile.

    Nothing was committed. ``db.run(fn)`` runs ``fn`` again on a conflict (up
    to its ``max_attempts``) and raises this when every attempt conflicted;
    ``with db.transaction()`` raises it at once (run the block again, or use
    ``db.run``). ``attempts`` says how many attempts were made.
    """

    def __init__(self, message: str, attempts: int = 1) -> None:
        super().__init__(message)
        self.attempts = attempts


class Abort(Exception):
    """Raise it inside a transaction to abandon it: nothing commits, and ``db.run`` re-raises it (no retry).

    For an integrity constraint: ``raise txns.Abort("insufficient funds")``.
    """
