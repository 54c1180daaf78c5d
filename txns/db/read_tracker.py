"""What a transaction read (its read set, :data:`txns.db.validation.ReadSet`), for validation at its commit.

``reads``: data shard id -> the set of primary-key tuples read (by
``get`` / ``update`` / ``upsert`` / ``delete`` / keyed ``insert`` and
``retract``; keys found absent included), or None when the transaction read
the whole table (``read``, ``truncate``, the check of a ``retract`` on a
table without primary key, an engine's batch made from a read of the table).

Invariants: a whole-table read is never narrowed back to keys; a read is
recorded even when the call then raises (the caller saw its outcome);
tables created in the transaction are not recorded (nothing committed to
read, and no other transaction can write them).
"""

from __future__ import annotations

from collections.abc import Container, Sequence

from txns.db.catalog import TableEntry
from txns.db.keyed import Key


class ReadTracker:
    """The reads of one transaction (see the module doc)."""

    def __init__(self, created: Container[str]) -> None:
        """``created``: the data shard ids of the tables the transaction creates (shared, kept current)."""
        self._created = created
        self.reads: dict[str, set[Key] | None] = {}

    def note_keys(self, e: TableEntry, keys: Sequence[Key]) -> None:
        """Record point reads of ``keys`` (unless the whole table was read)."""
        if e.data_id in self._created:
            return
        if e.data_id not in self.reads:
            self.reads[e.data_id] = set(keys)
            return
        s = self.reads[e.data_id]
        if s is not None:
            s.update(keys)

    def note_scan(self, e: TableEntry) -> None:
        """Record a read of the whole table."""
        if e.data_id not in self._created:
            self.reads[e.data_id] = None


__all__ = ["ReadTracker"]
