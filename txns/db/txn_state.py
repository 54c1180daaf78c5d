"""The states of a database transaction (:class:`txns.db.transaction.Transaction`).

Invariants: a transaction starts ``OPEN`` and leaves it once, for one of
the three others, which are final:

- ``COMMITTED``: its commit is durable (or it had nothing to commit);
- ``UNCERTAIN``: its conditional write's outcome is unknown
  (``persist.Indeterminate``): it keeps its parts; ``db.history()`` tells;
- ``ABANDONED``: aborted, or its commit failed: its parts are deleted.

Only ``OPEN`` accepts calls. The values are the words messages show
("this transaction is committed").
"""

from __future__ import annotations

import enum


class TxnState(enum.StrEnum):
    """A transaction's state (see the module doc)."""

    OPEN = "open"
    COMMITTED = "committed"
    UNCERTAIN = "uncertain"
    ABANDONED = "abandoned"


__all__ = ["TxnState"]
