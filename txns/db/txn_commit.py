"""A transaction's commit: its staged batches and DDL as one ``txns.Txn``, and what came of it (:class:`CommitInfo`).

:func:`submit` builds the commit of a transaction whose builders are
finished: the new tables' registrations (their schemas recorded on the pool
meanwhile, waited for right before the conditional write), every staged
batch, the catalog's net change; then the database commits it
(``Database.committer``: group commit, validation of the reads and of the DDL
at the commit time) and returns once it is durable.

Invariants:

- One conditional write on the txns shard carries everything: the
  batches, the catalog rows and the new tables' registrations (a table
  created and dropped again in the same transaction is not registered: its
  data was dropped before).
- Nothing this module started is still running when it returns or raises
  (a schema write under way after a failure is waited for, so none lands
  later).
- It never deletes parts: the caller decides by the outcome (kept on
  ``Indeterminate``, deleted on any other failure).
"""

from __future__ import annotations

import datetime as dt
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from txns.db import clock
from txns.db.catalog import TableEntry, data_schema
from txns.db.committer import CommitRequest
from txns.db.keyed import Key

if TYPE_CHECKING:
    from txns.db.database import Database
    from txns.db.staging import Staging
    from txns.db.txn_catalog import TxnCatalog


@dataclass(frozen=True)
class CommitInfo:
    """What a committed transaction did: its timestamp, wall-clock time, id, and per-table row counts.

    ``ts`` is None for a transaction that had nothing to commit.
    ``read_ts``: the time its reads are valid at (they would return the same
    rows at ``ts - 1``: nothing they read changed in between).
    ``attempts``: how many times ``db.run`` ran the function (1 otherwise).
    """

    ts: int | None
    time: dt.datetime | None
    txn_id: str | None
    tables: dict[str, dict[str, int]] = field(default_factory=dict)
    operations: tuple[str, ...] = ()
    metadata: dict[str, Any] = field(default_factory=dict)
    read_ts: int | None = None
    attempts: int = 1


def submit(
    db: Database,
    catalog: TxnCatalog,
    staging: Staging,
    changes: dict[TableEntry, int],
    *,
    user_meta: dict[str, Any],
    reads: dict[str, set[Key] | None],
    read_ts: int | None,
    isolation: str,
    writes: dict[str, set[Key] | None],
) -> tuple[CommitInfo, int | None]:
    """Commit the staged batches and DDL (see the module doc); return what was committed and the read time.

    ``changes``: the catalog's net change; ``reads``: the read set; ``writes``:
    per data shard written, the keys written (None: not known by key).
    """
    info = catalog.info(staging.counts, user_meta)
    started: dict[str, Future[None]] = {}
    try:
        live_ids = {x.data_id for x, n in changes.items() if n > 0}
        new = {d: data_schema(e.schema, e.primary_key) for d, e in catalog.created.items() if d in live_ids}
        txn = db.committer.begin(info)
        if new:
            # Registered in the commit's own conditional write; their schemas are
            # recorded on the pool while the commit is built, and waited for right
            # before that write.
            started = {d: f for d, s in new.items() if (f := db.committer.record_schema_soon(d, s)) is not None}
            txn.before_write(lambda: db.committer.record_schemas(new, started))
            for d in sorted(new):
                txn.register(d, new[d])
        for d, bs in sorted(staging.batches.items()):
            for b in bs:
                txn.write_batch(d, b)
        if changes:
            db.catalogs.register_in(txn)
        for e, n in sorted(changes.items(), key=lambda x: (x[0].name, x[1])):
            txn.write(db.root.catalog_id, e.key(), (), n)
        written = {e.data_id: e.created_ms for e in catalog.known() if e.data_id in staging.batches}
        names = {}  # the tables it read, by the names it read them under
        if read_ts is not None and reads:
            names = {n: e for n, e in db.catalog(read_ts).tables.items() if e.data_id in reads}

        def validate(ts: int) -> dict[str, TableEntry]:
            return catalog.validate(ts, set(staging.counts))

        ts, read_ts = db.committer.commit(
            CommitRequest(
                txn,
                validate if catalog.ops else None,
                written,
                reads=reads,
                names=names,
                read_ts=read_ts,
                isolation=isolation,
                writes=writes,
            )
        )
    finally:
        for f in started.values():
            f.exception()  # (a write still under way after a failure: waited for, so none lands later)
    committed = CommitInfo(
        ts=ts,
        time=clock.to_datetime(ts),
        txn_id=txn.id,
        tables=_by_name(info["db"]["tables"]),
        operations=tuple(info["db"]["ops"]),
        metadata=user_meta,
        read_ts=read_ts,
    )
    return committed, read_ts


def _by_name(tables: dict[str, dict[str, Any]]) -> dict[str, dict[str, int]]:
    out: dict[str, dict[str, int]] = {}
    for t in tables.values():
        c = out.setdefault(t["name"], {"added": 0, "retracted": 0})
        c["added"] += t["added"]
        c["retracted"] += t["retracted"]
    return out


__all__ = ["CommitInfo", "submit"]
