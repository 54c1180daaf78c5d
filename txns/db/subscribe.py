"""Following a table's changes as they commit: ``db.table(name).subscribe(as_of)``.

A :class:`TableSubscription` wraps the txns layer's
:class:`txns.DataSubscribe` for one table: first the table's contents at
``as_of`` (with ``ts`` = ``as_of`` and ``diff``), then every later change in
time order, each as an Arrow table of the table's columns plus ``ts`` and
``diff``; ``upper`` says up to which time everything has been delivered. Time
with no write to the table passes without reading it (the txns shard proves
it empty). The table is the one the name resolves to at ``as_of``; a later
rename does not stop the subscription (it follows the data, not the name).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Protocol

import pyarrow as pa

from persist import Progress, Updates
from txns.db.catalog import TableEntry
from txns.subscribe import DataSubscribe

if TYPE_CHECKING:
    from persist import PersistClient
    from txns.db.root import RootRecord


class Location(Protocol):
    """What a subscription needs of the database (``Database`` has it): its client and root record."""

    @property
    def client(self) -> PersistClient: ...

    @property
    def root(self) -> RootRecord: ...


class TableSubscription:
    """Changes of one table from ``as_of`` on (see the module doc). Close it when done."""

    def __init__(self, db: Location, e: TableEntry, as_of: int, until: int | None = None) -> None:
        self.entry = e
        self._sub = DataSubscribe(db.client, db.root.txns_id, e.data_id, as_of, until=until)
        # the data shard's key holds every column, the primary key's first (txns.db.catalog.data_schema)
        self._stored = [f.name for f in self._sub.handle.data_schema(e.data_id).key]
        self.upper = as_of

    def _table(self, ev: Updates) -> pa.Table:
        cols: list[list[object]] = [[] for _ in self._stored]
        ts, diff = [], []
        for (key, _val), t, d in ev.updates:
            for i, v in enumerate(key):
                cols[i].append(v)
            ts.append(t)
            diff.append(d)
        s = self.entry.schema
        data = {n: pa.array(cols[self._stored.index(n)], s.field(n).type) for n in s.names}
        data["ts"] = pa.array(ts, pa.int64())
        data["diff"] = pa.array(diff, pa.int64())
        return pa.table(data)

    def step(self, wait_s: float = 0.0) -> list[pa.Table]:
        """The changes available now (waiting up to ``wait_s`` seconds for more time to pass)."""
        out = []
        for ev in self._sub.step(wait_s=wait_s):
            if isinstance(ev, Progress):
                self.upper = ev.upper
            elif ev.updates:
                out.append(self._table(ev))
        return out

    def __iter__(self) -> Iterator[pa.Table]:
        for ev in self._sub:
            if isinstance(ev, Progress):
                self.upper = ev.upper
            elif ev.updates:
                yield self._table(ev)

    def close(self) -> None:
        self._sub.close()

    def __enter__(self) -> TableSubscription:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


__all__ = ["Location", "TableSubscription"]
