"""History: a database's committed transactions, read from the txns layer's commit records.

Each commit's record (the txns shard's commits shard) carries, under
``metadata.db``, the tables it touched (by data shard: ``name``, rows
``added`` and ``retracted``) and its DDL operations, and under
``metadata.user`` the user's metadata; commits made below the database
layer carry no ``db`` part and are not shown.

Invariants: history is read like any table (:mod:`txns.db.planner`), so it
never writes anything where the txns cache allows; every commit appears
exactly once, newest first.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from typing import Any, Protocol, TypeVar

import pyarrow as pa

from persist import InvalidUsage, SnapshotPlan, replan
from txns.db import clock
from txns.db.catalog import TableEntry, check_name
from txns.db.scan import PlanReader, read_table
from txns.handle import TxnsHandle

T = TypeVar("T")

HISTORY_SCHEMA = pa.schema(
    [
        pa.field("ts", pa.int64(), nullable=False),
        pa.field("time", pa.timestamp("ms", tz="UTC"), nullable=False),
        pa.field("txn_id", pa.string(), nullable=False),
        pa.field("tables", pa.list_(pa.string()), nullable=False),
        pa.field("rows_added", pa.int64(), nullable=False),
        pa.field("rows_retracted", pa.int64(), nullable=False),
        pa.field("operations", pa.list_(pa.string()), nullable=False),
        pa.field("metadata", pa.string(), nullable=False),
    ]
)


class LogReads(Protocol):
    """What history needs of the read planner (:class:`txns.db.planner.ReadPlanner`)."""

    def log_plan(self, data_id: str, ts: int) -> SnapshotPlan | None: ...

    def read_checked(self, data_id: str, read: Callable[[], T]) -> T: ...

    def plan_reader(self, plan: SnapshotPlan, cols: list[str], filter: Any = None) -> PlanReader: ...


class History:
    """Reads one database's history (``db.history()``). Owns no state; uses the txns handle under ``handle_lock``."""

    def __init__(
        self,
        handle: TxnsHandle,
        handle_lock: threading.RLock,
        reads: LogReads,
        latest: Callable[[], int],
        entry: Callable[[str, int], TableEntry],
    ) -> None:
        self.handle = handle
        self._lock = handle_lock
        self._reads = reads
        self._latest = latest
        self._entry = entry

    def history(self, table: str | None = None, limit: int | None = None) -> pa.Table:
        """``db.history(table, limit)``: committed transactions, newest first (``HISTORY_SCHEMA``).

        ``table``: only those that touched it (by its data shard, so renames
        are included); ``limit``: only the newest ones.
        """
        if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 0):
            raise InvalidUsage(f"limit must be a non-negative int or None, got {limit!r}")
        ts = self._latest()
        data_id = None
        if table is not None:
            check_name(table)
            data_id = self._entry(table, ts).data_id
        with self._lock:
            records = self.commit_records(ts)
        rows = []
        for r in records.to_pylist():
            info = json.loads(r["info"])
            meta = info.get("metadata", {})
            db = meta.get("db")
            if not isinstance(db, dict):
                continue  # a commit made below the database layer
            touched = db.get("tables", {})  # data_id -> {name, added, retracted}
            if data_id is not None and data_id not in touched:
                continue
            rows.append(
                {
                    "ts": int(r["commit_ts"]),
                    "time": clock.wall_ms(int(r["commit_ts"])),
                    "txn_id": r["txn_id"],
                    "tables": sorted({t["name"] for t in touched.values()}),
                    "rows_added": sum(int(t.get("added", 0)) for t in touched.values()),
                    "rows_retracted": sum(int(t.get("retracted", 0)) for t in touched.values()),
                    "operations": list(db.get("ops", [])),
                    "metadata": json.dumps(meta.get("user", {}), sort_keys=True),
                }
            )
        rows.sort(key=lambda r: r["ts"], reverse=True)
        if limit is not None:
            rows = rows[:limit]
        return pa.Table.from_pylist(rows, schema=HISTORY_SCHEMA)

    def commit_records(self, ts: int) -> pa.Table:
        """The commit records at ``ts`` (txn_id, commit_ts, wall_ms, info).

        Read without writing anything when the txns cache allows (see
        :meth:`txns.db.planner.ReadPlanner.log_plan`); else as ``TxnsHandle.commit_records``.
        """
        d = self.handle.commits_id
        cols = ["txn_id", "commit_ts", "wall_ms", "info"]

        def read() -> pa.Table:
            plan = self._reads.log_plan(d, ts) if self.handle.cache.registered_at(d, ts) else None
            if plan is None:
                return self.handle.commit_records(ts)
            return self._reads.read_checked(d, lambda: read_table(self._reads.plan_reader(plan, cols)))

        return replan(read)


__all__ = ["HISTORY_SCHEMA", "History"]
