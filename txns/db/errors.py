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
    """``retract`` of a row the table does not hold (as many times as asked)."""


class TransactionClosed(InvalidUsage):
    """A transaction was used after it committed or was abandoned."""


__all__ = ["DatabaseNotFound", "InvalidTableName", "RowNotFound", "TableExists", "TableNotFound", "TransactionClosed"]
