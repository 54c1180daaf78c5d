"""A transaction's reads and writes of keyed tables by key: each key's row as the transaction sees it.

A key's row, for the transaction, is its own write of the key if it made
one (:attr:`txns.db.own_writes.OwnWrites.keyed`: the row, or None for
deleted), else the committed row at the transaction's read time, found by
one filtered read and cached (:class:`txns.db.key_cache.KeyCache`). Every
key looked up is recorded in the read set, found or not.

Invariants:

- A keyed table holds at most one row per key, in the transaction too: a
  write retracts the key's current row(s) and adds the new one, staged
  together (:mod:`txns.db.staging`), and the key's row in ``keyed`` changes
  with them; a write that would break the rule (``DuplicateKey``,
  ``RowNotFound``) raises before anything is staged.
- Nothing of a call is staged past ``KEYED_WRITES_BYTES`` (``InvalidUsage``).
- A table created or truncated in the transaction has no committed rows
  for it: no read is made.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from persist import InvalidUsage, SchemaMismatch
from txns.db.arrow_io import NOT_ARROW, conform, conformed
from txns.db.catalog import TableEntry
from txns.db.errors import DuplicateKey, InvalidPrimaryKey, RowNotFound
from txns.db.key_cache import KeyCache
from txns.db.keyed import Key, committed_rows, describe_key, first_repeat, row_keys

if TYPE_CHECKING:
    from txns.db.database import Database
    from txns.db.own_writes import OwnWrites
    from txns.db.read_tracker import ReadTracker
    from txns.db.staging import Staging

Row = dict[str, Any]


class KeyedWrites:
    """Keyed reads and writes of one transaction (see the module doc)."""

    def __init__(
        self,
        db: Database,
        created: dict[str, TableEntry],
        staged: Staging,
        mine: OwnWrites,
        reads: ReadTracker,
        reads_at: Callable[[], int],
    ) -> None:
        self._db = db
        self._created = created
        self._staged = staged
        self._mine = mine
        self._reads = reads
        self._reads_at = reads_at
        self.cache = KeyCache()

    def current(self, e: TableEntry, keys: Sequence[Key]) -> dict[Key, list[Row]]:
        """The rows of each key as the transaction sees them (normally 0 or 1); records the read.

        The lists are shared (with the cache and the own writes): callers do not change them.
        """
        self._mine.check_not_opaque(e)
        own = self._mine.keyed.get(e.data_id, {})
        out: dict[Key, list[Row]] = {}
        need: list[Key] = []
        for k in keys:
            if k in own:
                r = own[k]
                out[k] = [] if r is None else [r]
            elif k not in out:
                out[k] = []
                need.append(k)
        self._reads.note_keys(e, keys)
        if need and e.data_id not in self._created and e.data_id not in self._mine.emptied:
            cached, missing = self.cache.lookup(e.data_id, need)
            out.update(cached)
            if missing:
                found = committed_rows(self._db.planner, e, self._reads_at(), missing)
                out.update(found)
                self.cache.add(e.data_id, found)
        return out

    def apply(
        self, e: TableEntry, add: pa.Table | None, changes: list[tuple[Key, Row | None]], retract: list[Row]
    ) -> None:
        """Stage a keyed write: retract ``retract``, add ``add``; the keys' rows are now ``changes``."""
        d = e.data_id
        if retract:
            self._staged.add(d, pa.Table.from_pylist(retract, schema=e.schema), -1)
        added = add.num_rows if add is not None else 0
        if add is not None and added:
            self._staged.add(d, add, 1)
        self._mine.set_keys(d, changes, add.nbytes if add is not None and added else 0)
        self._staged.count(d, added, len(retract))

    def rows_of(self, e: TableEntry, data: object, why: str) -> tuple[pa.Table, list[Key], dict[Key, list[Row]]]:
        """``data`` as rows of keyed table ``e``, their keys, and each key's current rows (read at the read time).

        In memory (within ``KEYED_WRITES_BYTES``); DuplicateKey (``why`` says
        what was refused) if a key is twice in ``data``.
        """
        pieces: list[pa.Table] = []
        size = 0
        for p in conformed(data, e.schema, e.name):
            if p.num_rows:
                size += p.nbytes
                self._mine.room(e, size)
                pieces.append(p)
        rows = pa.concat_tables(pieces) if pieces else e.schema.empty_table()
        if rows.num_rows == 0:
            return rows, [], {}
        keys = row_keys(e, rows)
        dup = first_repeat(keys)
        if dup is not None:
            raise DuplicateKey(f"table {e.name!r}: the data has key {describe_key(e, dup)} more than once; {why}")
        return rows, keys, self.current(e, keys)

    def insert(self, e: TableEntry, data: object) -> int:
        """Insert ``data`` into keyed ``e``: DuplicateKey if a key is there already (or twice in ``data``)."""
        rows, keys, cur = self.rows_of(e, data, "a keyed table holds one row per key. Nothing was inserted")
        if rows.num_rows == 0:
            return 0
        there = next((k for k in keys if cur[k]), None)
        if there is not None:
            mine = there in self._mine.keyed.get(e.data_id, {})
            where = "written earlier in this transaction" if mine else "committed"
            raise DuplicateKey(
                f"table {e.name!r} already has a row with key {describe_key(e, there)} ({where}): "
                f"{cur[there][0]!r}; use upsert() to replace it. Nothing was inserted"
            )
        self.apply(e, rows, list(zip(keys, rows.to_pylist(), strict=True)), [])
        return int(rows.num_rows)

    def upsert(self, e: TableEntry, data: object) -> int:
        """Write ``data`` into keyed ``e``, each row replacing its key's (a row equal to it writes nothing)."""
        rows, keys, cur = self.rows_of(e, data, "an upsert takes one row per key. Nothing was upserted")
        if rows.num_rows == 0:
            return 0
        new = rows.to_pylist()
        changed = [i for i, (k, r) in enumerate(zip(keys, new, strict=True)) if cur[k] != [r]]
        old = [r for i in changed for r in cur[keys[i]]]
        add = rows if len(changed) == rows.num_rows else rows.take(pa.array(changed, pa.int64()))
        self.apply(e, add, [(keys[i], new[i]) for i in changed], old)
        return int(rows.num_rows)

    def delete(self, e: TableEntry, keys: list[Key]) -> int:
        """Remove the rows of ``keys`` (distinct) from keyed ``e``; return how many rows."""
        cur = self.current(e, keys)
        gone = [k for k in keys if cur[k]]
        old = [r for k in gone for r in cur[k]]
        self.apply(e, None, [(k, None) for k in gone], old)
        return len(old)

    def update(self, e: TableEntry, pk: Sequence[str], k: Key, values: object) -> Row:
        """Change some columns of the row of ``k`` in keyed ``e`` (see ``Transaction.update``); return the new row."""
        if not isinstance(values, Mapping):
            raise InvalidUsage(
                f"table {e.name!r}: update takes the new values as a dict of column -> value, "
                f"got {type(values).__name__}"
            )
        unknown = [c for c in values if c not in e.schema.names]
        if unknown:
            raise SchemaMismatch(f"table {e.name!r} has no column(s) {unknown}; its columns are {list(e.schema.names)}")
        given: dict[str, Any] = {}
        if values:
            try:
                arrays = {c: pa.array([v]) for c, v in values.items()}
            except NOT_ARROW as x:
                raise SchemaMismatch(
                    f"table {e.name!r}: update values {dict(values)!r} cannot be converted to Arrow: {x}"
                ) from None
            sub = pa.schema([e.schema.field(c) for c in values])
            given = conform(pa.table(arrays), sub, e.name).to_pylist()[0]
        moved = [c for j, c in enumerate(pk) if c in given and given[c] != k[j]]
        if moved:
            raise InvalidPrimaryKey(
                f"table {e.name!r}: update cannot change primary key column(s) {moved}; "
                f"delete the row of {describe_key(e, k)} and insert the new one instead"
            )
        cur = self.current(e, [k])[k]
        if not cur:
            raise RowNotFound(
                f"table {e.name!r} has no row with key {describe_key(e, k)}; nothing was updated "
                f"(upsert() adds a row)"
            )
        new = {**cur[0], **given}
        if cur == [new]:
            return dict(new)
        add = pa.Table.from_pylist([new], schema=e.schema)
        self._mine.room(e, add.nbytes)
        self.apply(e, add, [(k, new)], list(cur))
        return dict(new)

    def retract(self, e: TableEntry, rows: pa.Table) -> int:
        """Retract ``rows`` of keyed ``e``: each must be its key's current row (else RowNotFound)."""
        keys = row_keys(e, rows)
        asked = rows.to_pylist()
        cur = self.current(e, list(dict.fromkeys(keys)))
        left = {k: list(v) for k, v in cur.items()}
        for k, r in zip(keys, asked, strict=True):
            if r in left[k]:
                left[k].remove(r)
                continue
            now = f"its row is {cur[k][0]!r}" if cur[k] else "no row has that key"
            raise RowNotFound(
                f"table {e.name!r}: cannot retract {r!r} (key {describe_key(e, k)}): {now}"
                + (" (and it is retracted once already)" if r in cur[k] else "")
                + "; nothing was retracted"
            )
        changes = [(k, left[k][0] if left[k] else None) for k in dict.fromkeys(keys)]
        self.apply(e, None, changes, asked)
        return len(asked)


__all__ = ["KeyedWrites"]
