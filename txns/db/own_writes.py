"""What a transaction keeps of its own writes, so that it reads them back (read-your-writes).

- Tables without a primary key: the rows it inserted (``inserted``, up to
  :data:`TRACK_INSERTED_BYTES` in all) and retracted (``retracted``),
  by data shard id. A table it inserted more into, or a stream, is
  ``untracked``: it cannot read it back nor retract those rows.
- Keyed tables: by data shard id, key -> the key's row now (None:
  deleted), within :data:`KEYED_WRITES_BYTES` (``keyed``).
- ``emptied``: tables it truncated (their committed rows are gone for it);
  ``opaque``: tables an engine added batches to (their rows are not kept:
  no reading back, no writes by key, until a later transaction).

Invariants: a table's rows as the transaction sees them are its committed
rows (none if ``emptied`` or created here) with these applied; a call that
would pass a limit raises ``InvalidUsage`` before anything of it is kept.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from persist import InvalidUsage
from txns.db.catalog import TableEntry
from txns.db.errors import RowNotFound
from txns.db.keyed import Key, without_keys
from txns.db.scan import consolidate

TRACK_INSERTED_BYTES = 64 << 20
"""Rows a transaction inserts are kept in memory up to this many bytes, so it can retract them itself."""
KEYED_WRITES_BYTES = 64 << 20
"""A transaction's writes to keyed tables (kept in memory, by key) are limited to this many (Arrow) bytes."""


class OwnWrites:
    """A transaction's own writes, as it reads them back (see the module doc)."""

    def __init__(self) -> None:
        self.inserted: dict[str, list[pa.Table]] = {}
        self.retracted: dict[str, list[pa.Table]] = {}
        self._tracked_bytes = 0
        self.untracked: set[str] = set()
        self.emptied: set[str] = set()
        self.opaque: set[str] = set()
        self.keyed: dict[str, dict[Key, dict[str, Any] | None]] = {}
        self._keyed_bytes = 0

    def track(self, data_id: str, rows: pa.Table) -> None:
        """Keep inserted ``rows`` (unless past :data:`TRACK_INSERTED_BYTES`: then the table is untracked)."""
        if data_id in self.untracked:
            return
        self._tracked_bytes += rows.nbytes
        if self._tracked_bytes > TRACK_INSERTED_BYTES:
            self.untracked.add(data_id)
            self.inserted.pop(data_id, None)
            return
        self.inserted.setdefault(data_id, []).append(rows)

    def room(self, e: TableEntry, nbytes: int) -> None:
        """``InvalidUsage`` if ``nbytes`` more of keyed writes would pass :data:`KEYED_WRITES_BYTES`."""
        if self._keyed_bytes + nbytes > KEYED_WRITES_BYTES:
            raise InvalidUsage(
                f"table {e.name!r}: a transaction's writes to keyed tables are limited to "
                f"{KEYED_WRITES_BYTES >> 20} MiB (it keeps them in memory, by key, to hold one row per key); "
                f"split them into several transactions. Nothing of this call was written"
            )

    def set_keys(self, data_id: str, changes: list[tuple[Key, dict[str, Any] | None]], nbytes: int) -> None:
        """The keys' rows are now ``changes`` (None: deleted); ``nbytes`` of rows were added."""
        self._keyed_bytes += nbytes
        own = self.keyed.setdefault(data_id, {})
        for k, r in changes:
            own[k] = r

    def check_not_opaque(self, e: TableEntry) -> None:
        if e.data_id in self.opaque:
            raise InvalidUsage(
                f"table {e.name!r} was written from a Spark DataFrame in this transaction, which it does not "
                f"keep: it cannot be read or written by key here again; do that in a later transaction"
            )

    def check_readable(self, e: TableEntry) -> None:
        """``InvalidUsage`` if the transaction cannot read table ``e`` back (an engine's batch, untracked inserts)."""
        self.check_not_opaque(e)
        if e.primary_key is None and e.data_id in self.untracked:
            raise InvalidUsage(
                f"table {e.name!r}: this transaction inserted more than {TRACK_INSERTED_BYTES >> 20} MiB into it "
                f"(or a stream), which it does not keep: it cannot read the table back; read it in a later transaction"
            )

    def read_back(
        self, e: TableEntry, committed: Callable[[list[str]], pa.Table], cols: list[str], expr: Any
    ) -> pa.Table:
        """Table ``e`` as the transaction sees it: ``committed(columns)`` (its committed rows, filtered by
        ``expr``) with the own writes applied, projected to ``cols`` (the caller checked :meth:`check_readable`)."""
        d = e.data_id
        out_schema = pa.schema([e.schema.field(c) for c in cols])
        if e.primary_key is None:
            ins, ret = self.inserted.get(d, []), self.retracted.get(d, [])
            if not ins and not ret:
                return committed(cols)
            names = list(e.schema.names)
            parts = [_with_diff(committed(names), 1)]
            parts += [_with_diff(t if expr is None else t.filter(expr), 1) for t in ins]
            parts += [_with_diff(t if expr is None else t.filter(expr), -1) for t in ret]
            return consolidate(pa.concat_tables(parts), names).select(cols).cast(out_schema)
        own = self.keyed.get(d, {})
        if not own:
            return committed(cols)
        need = [*cols, *(c for c in e.primary_key if c not in cols)]
        base = without_keys(e, committed(need), list(own)).select(cols)
        mine = pa.Table.from_pylist([r for r in own.values() if r is not None], schema=e.schema)
        if expr is not None:
            mine = mine.filter(expr)
        return pa.concat_tables([base.cast(out_schema), mine.select(cols).cast(out_schema)])

    def check_present(self, e: TableEntry, rows: pa.Table, committed: pa.Table | None) -> None:
        """``RowNotFound`` unless every row of ``rows`` is in unkeyed ``e`` (``committed``: its committed rows
        that may match, None for a table created here; the transaction's own inserts and retractions counted)."""
        cols = list(e.schema.names)
        # the committed rows read are only those that may match: so judge only the rows asked for
        parts = [_with_n(rows, -1, asked=1)]
        if committed is not None:
            parts.append(_with_n(committed, 1))
        parts += [_with_n(t, 1) for t in self.inserted.get(e.data_id, [])]
        parts += [_with_n(t, -1) for t in self.retracted.get(e.data_id, [])]
        t = pa.concat_tables(parts)
        g = t.group_by(cols, use_threads=False).aggregate([("n", "sum"), ("asked", "max")])
        g = g.rename_columns([*cols, "n", "asked"])
        short = g.filter(pc.and_(pc.less(g.column("n"), 0), pc.equal(g.column("asked"), 1))).drop_columns(["asked"])
        if short.num_rows:
            first = short.slice(0, 1).to_pylist()[0]
            missing = -first.pop("n")
            hint = ""
            if e.data_id in self.untracked:
                hint = (
                    " (rows this transaction inserted past "
                    f"{TRACK_INSERTED_BYTES >> 20} MiB, or from a stream, are not counted: "
                    "retract them in a later transaction)"
                )
            raise RowNotFound(
                f"table {e.name!r}: cannot retract {first}: {missing} more occurrence(s) than the table holds"
                f"{hint}; {short.num_rows} distinct row(s) short in all. Nothing was retracted"
            )


def _with_diff(t: pa.Table, diff: int) -> pa.Table:
    return t.append_column("diff", pa.repeat(pa.scalar(diff, pa.int64()), t.num_rows))


def _with_n(t: pa.Table, n: int, asked: int = 0) -> pa.Table:
    t = t.append_column("n", pa.repeat(pa.scalar(n, pa.int64()), t.num_rows))
    return t.append_column("asked", pa.repeat(pa.scalar(asked, pa.int8()), t.num_rows))


__all__ = ["KEYED_WRITES_BYTES", "TRACK_INSERTED_BYTES", "OwnWrites"]
