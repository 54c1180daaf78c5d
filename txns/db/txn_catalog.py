"""The catalog as one transaction sees it: the tables by name with its own DDL applied, and that DDL.

``view`` starts as the catalog at ``view_ts`` (as this process last saw
it) and takes the transaction's ``create`` / ``drop`` / ``rename`` /
``alter`` at once, so its later calls see them (a created table under its
name, a dropped one gone). ``ops`` keeps the DDL in order: (op, old entry,
new entry). At the commit :meth:`TxnCatalog.validate` replays it on the
catalog of the commit time.

Invariants:

- ``view`` is always ``ops`` applied to the catalog at ``view_ts``; moving
  ``view_ts`` (the transaction's first read) replays ``ops`` there or fails
  (``TableExists`` / ``TableNotFound``), never drops one.
- ``created`` holds the data shard ids of the tables created here (a fresh
  shard each), also after a drop of them in the same transaction.
- The net catalog change (:meth:`TxnCatalog.changes`) is what the commit
  writes to the catalog shard: each entry +1 (added) or -1 (removed).
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Any

from txns.db.catalog import TableEntry, check_name
from txns.db.errors import TableExists, TableNotFound

if TYPE_CHECKING:
    from txns.db.database import Database


class TxnCatalog:
    """The tables a transaction sees and the DDL it made (see the module doc)."""

    def __init__(self, db: Database, view_ts: int) -> None:
        self._db = db
        self.view_ts = view_ts
        self.view: dict[str, TableEntry] = dict(db.catalog(view_ts).tables)
        self.ops: list[tuple[str, TableEntry | None, TableEntry | None]] = []
        self.created: dict[str, TableEntry] = {}  # data_id -> entry, for tables created here

    def entry(self, name: str) -> TableEntry:
        """Table ``name`` as the transaction sees it; ``TableNotFound`` naming the tables there are."""
        check_name(name)
        e = self.view.get(name)
        if e is None:
            known = sorted(self.view)
            raise TableNotFound(
                f"no table {name!r} in the database at {self._db.url!r} (as this transaction sees it); "
                f"tables: {known if known else 'none'}"
            )
        return e

    def create(self, entry: TableEntry) -> None:
        self.view[entry.name] = entry
        self.created[entry.data_id] = entry
        self.ops.append(("create", None, entry))

    def drop(self, e: TableEntry) -> None:
        del self.view[e.name]
        self.ops.append(("drop", e, None))

    def rename(self, e: TableEntry, new: str) -> None:
        n = replace(e, name=new)
        del self.view[e.name]
        self.view[new] = n
        self.ops.append(("rename", e, n))

    def alter(self, e: TableEntry, retention_ms: int | None) -> None:
        n = replace(e, retention_ms=retention_ms)
        self.view[e.name] = n
        self.ops.append(("alter", e, n))

    def known(self) -> list[TableEntry]:
        """Every entry the transaction knows: those it sees and those its DDL named."""
        return [*self.view.values(), *(x for _, a, b in self.ops for x in (a, b) if x is not None)]

    def name_of(self, data_id: str) -> str:
        """The name of the table of ``data_id`` (the shard id itself if none is known)."""
        return next((e.name for e in self.known() if e.data_id == data_id), data_id)

    def changes(self) -> dict[TableEntry, int]:
        """The net change to the catalog: entry -> +1 (added) / -1 (removed)."""
        net: dict[TableEntry, int] = {}
        for _op, old, new in self.ops:
            if old is not None:
                net[old] = net.get(old, 0) - 1
            if new is not None:
                net[new] = net.get(new, 0) + 1
        return {e: n for e, n in net.items() if n}

    def validate(self, ts: int, written: set[str]) -> dict[str, TableEntry]:
        """Replay the DDL on the catalog at ``ts``; TableExists / TableNotFound if it no longer fits.

        ``written``: the data shard ids the transaction writes (each must
        still be a table, unless the transaction drops it itself). Returns
        the tables after it: what the catalog is once this commits right
        after ``ts``.
        """
        live = dict(self._db.catalog(ts).tables)
        for _op, old, new in self.ops:
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
        ids = {e.data_id for e in live.values()}
        # (a table this transaction drops itself may take writes with it)
        own_drops = {old.data_id for op, old, _ in self.ops if op == "drop" and old is not None}
        for d in written:
            if d not in ids and d not in own_drops:
                raise TableNotFound(
                    f"a table this transaction writes ({self.name_of(d)!r}) was dropped by another "
                    f"transaction meanwhile; nothing was committed"
                )
        return live

    def info(self, counts: dict[str, list[int]], user_meta: dict[str, Any]) -> dict[str, Any]:
        """What history shows of the commit: per data shard its name and row counts, the DDL, the user's metadata."""
        tables: dict[str, dict[str, Any]] = {}

        def touch(e: TableEntry) -> None:
            tables.setdefault(e.data_id, {"name": e.name, "added": 0, "retracted": 0})["name"] = e.name

        for _op, old, new in self.ops:
            for x in (old, new):
                if x is not None:
                    touch(x)
        for e in self.view.values():
            if e.data_id in counts:
                touch(e)
        for d, (a, r) in counts.items():
            if d not in tables:
                tables[d] = {"name": self.name_of(d), "added": 0, "retracted": 0}
            tables[d]["added"] += a
            tables[d]["retracted"] += r
        ops = []
        for op, old, new in self.ops:
            if op == "create" and new is not None:
                ops.append(f"create {new.name}")
            elif op == "drop" and old is not None:
                ops.append(f"drop {old.name}")
            elif op == "rename" and old is not None and new is not None:
                ops.append(f"rename {old.name} {new.name}")
            elif op == "alter" and new is not None:
                ops.append(f"set retention {new.name}")
        return {"db": {"tables": tables, "ops": ops}, "user": user_meta}


__all__ = ["TxnCatalog"]
