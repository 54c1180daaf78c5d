"""A table of a database, by name: reads as Arrow, pandas or Polars, at the latest time or any earlier one.

A ``Table`` is a name, resolved in the catalog at the time each read asks
for: after a rename the old name no longer resolves at the latest time but
still does as of earlier times; after a drop, reads as of times before the
drop still work (within the retained history).

Reads return rows with exactly the table's schema (or the projection asked
for). A row inserted twice is returned twice (tables are multisets).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from persist import InvalidUsage, PartRetired
from txns.db import clock
from txns.db.arrow_io import to_pandas, to_polars
from txns.db.catalog import TableEntry
from txns.db.retention import retention_of_ms
from txns.db.scan import PlanReader, check_columns, check_filter, read_changes, read_table, scan

if TYPE_CHECKING:
    from txns.db.database import AsOf, Database
    from txns.db.subscribe import TableSubscription


class Table:
    """The table ``name`` of ``db``. Get one with ``db.table(name)`` or ``db.create_table(...)``."""

    def __init__(self, db: Database, name: str) -> None:
        self.db = db
        self.name = name

    def __repr__(self) -> str:
        return f"Table({self.name!r})"

    def _at(self, as_of: AsOf) -> tuple[TableEntry, int]:
        ts = self.db.timestamp(as_of)
        return self.db.entry(self.name, ts), ts

    @property
    def schema(self) -> pa.Schema:
        """The table's schema (at the latest time)."""
        return self._at(None)[0].schema

    @property
    def primary_key(self) -> list[str] | None:
        """The table's primary key columns (at the latest time), or None for a table created without one."""
        pk = self._at(None)[0].primary_key
        return None if pk is None else list(pk)

    @property
    def retention(self) -> dt.timedelta:
        """The table's history retention (its own, else the database's)."""
        e = self._at(None)[0]
        ms = e.retention_ms if e.retention_ms is not None else self.db.root.retention_ms
        return retention_of_ms(ms)

    def _reader_args(self, e: TableEntry, columns: object, filter: object) -> tuple[list[str], Any]:
        return check_columns(e.schema, columns), check_filter(e.schema, filter)

    def to_arrow(self, as_of: AsOf = None, *, columns: list[str] | None = None, filter: Any = None) -> pa.Table:
        """The table's rows at ``as_of`` (None: the latest commit, without waiting) as a ``pyarrow.Table``.

        ``as_of`` is a timestamp (``commit_info.ts``, a ``ts`` of ``history()``)
        or a ``datetime``. ``columns`` projects, ``filter`` (a
        ``pyarrow.compute`` expression, e.g. ``pc.field("balance") > 0``)
        selects rows; both are pushed into the Parquet reads.
        """
        e, ts = self._at(as_of)
        cols, expr = self._reader_args(e, columns, filter)
        db = self.db
        cfg = db.client.config
        return db.planner.with_replan(
            e, ts, lambda plan: read_table(PlanReader(db.client.blob, plan, cols, expr, cfg.retry_deadline_s))
        )

    def to_pandas(self, as_of: AsOf = None, *, columns: list[str] | None = None, filter: Any = None) -> Any:
        """Like :meth:`to_arrow`, as a pandas DataFrame."""
        return to_pandas(self.to_arrow(as_of, columns=columns, filter=filter))

    def to_polars(
        self, as_of: AsOf = None, *, columns: list[str] | None = None, filter: Any = None, lazy: bool = False
    ) -> Any:
        """Like :meth:`to_arrow`, as a Polars DataFrame; ``lazy=True``: a ``LazyFrame`` over :meth:`to_dataset`.

        A lazy frame reads nothing until collected; Polars pushes its
        projections and filters (``pl.col(...)``) into the part files.
        ``filter`` (a pyarrow expression) is for eager reads only.
        """
        if not lazy:
            return to_polars(self.to_arrow(as_of, columns=columns, filter=filter))
        if filter is not None:
            raise InvalidUsage("filter= is for eager reads; on a lazy frame use .filter(pl.col(...)) instead")
        from txns.db.dataset import lazy_polars

        e, _ = self._at(as_of)
        cols = check_columns(e.schema, columns)
        return lazy_polars(self.to_dataset(as_of), cols)

    def to_dataset(self, as_of: AsOf = None, *, hold_s: float | None = None) -> Any:
        """The rows at ``as_of`` as a lazy ``pyarrow.dataset.Dataset``, for engines that push work down.

        The snapshot is fixed now. DuckDB, Polars, DataFusion and pyarrow
        read the part files themselves (projection, filters, row groups
        skipped by statistics); what needs consolidation (parts a retraction
        not yet compacted may cancel rows of, inline rows, parts with times
        past ``as_of``) is consolidated into memory now. See
        :mod:`txns.db.dataset`. Part files stay readable for the store's
        ``part_grace_s`` after compaction retires them; ``hold_s`` keeps
        them that many seconds (one write).
        """
        from txns.db.dataset import part_files, snapshot_dataset

        e, ts = self._at(as_of)
        db = self.db
        files = part_files(db.url, db.client.blob)

        def build(plan: Any) -> Any:
            reader = PlanReader(db.client.blob, plan, list(e.schema.names), None, db.client.config.retry_deadline_s)
            return snapshot_dataset(reader, files)

        if hold_s is not None:
            db.client.hold_parts(e.data_id, hold_s)
        return db.planner.with_replan(e, ts, build)

    def __arrow_c_schema__(self) -> Any:
        """The table's schema as an Arrow PyCapsule (the Arrow C data interface)."""
        return self.schema.__arrow_c_schema__()

    def __arrow_c_stream__(self, requested_schema: Any = None) -> Any:
        """The table's rows as an Arrow C stream PyCapsule: :meth:`scan` at the latest time (bounded memory).

        So ``pa.table(t)``, ``pl.DataFrame(t)``, ``duckdb.sql("... FROM t")``
        and DataFusion's ``from_arrow(t)`` take a table directly. Each stream
        is the table at the time it is made (a table of ``db.read()``: at the
        read's time).
        """
        return self.scan().__arrow_c_stream__(requested_schema)

    def count(self, as_of: AsOf = None) -> int:
        """How many rows the table has at ``as_of``."""
        e, ts = self._at(as_of)
        db = self.db
        cols = [e.schema.names[0]]

        def read(plan: Any) -> int:
            reader = PlanReader(db.client.blob, plan, cols, None, db.client.config.retry_deadline_s)
            return sum(b.num_rows for b in scan(reader))

        return db.planner.with_replan(e, ts, read)

    def scan(self, *, columns: list[str] | None = None, filter: Any = None, as_of: AsOf = None) -> pa.RecordBatchReader:
        """The rows at ``as_of`` as a ``pyarrow.RecordBatchReader``, read part by part (bounded memory).

        The snapshot is fixed when ``scan`` is called; reading it later gives the same rows.
        """
        e, ts = self._at(as_of)
        cols, expr = self._reader_args(e, columns, filter)
        db = self.db
        plan = db.planner.plan(e, ts)
        reader = PlanReader(db.client.blob, plan, cols, expr, db.client.config.retry_deadline_s)

        def batches() -> Iterator[pa.RecordBatch]:
            try:
                yield from scan(reader)
            except PartRetired as err:  # lost (CorruptObject), or retired since the scan began: scan again
                raise db.planner.missing_part(e.data_id, err.key) from None

        return pa.RecordBatchReader.from_batches(reader.out_schema, batches())

    def subscribe(self, as_of: AsOf = None, until: int | None = None) -> TableSubscription:
        """Follow this table: its contents at ``as_of`` (default: latest), then each change as it commits.

        Iterating yields Arrow tables of the table's columns plus ``ts`` and
        ``diff`` (stopping at ``until``, exclusive, if given; else waiting for
        more); ``step(wait_s)`` returns what is available. See
        :mod:`txns.db.subscribe`.
        """
        from txns.db.subscribe import TableSubscription

        e, ts = self._at(as_of)
        return TableSubscription(self.db, e, ts, until)

    def changes(
        self, start: int | dt.datetime, end: int | dt.datetime | None = None, *, columns: list[str] | None = None
    ) -> pa.Table:
        """The updates with ``start <= ts < end`` (``end`` None: through the latest commit).

        Columns: the table's (or ``columns``), ``ts`` (int64) and ``diff``
        (+n inserted, -n retracted), in time order. A datetime bound stands
        for the first timestamp of its millisecond. ``start`` below the
        retained history raises ``ReadBelowSince``.
        """
        db = self.db
        lo = _bound(start, "start")
        if end is None:
            hi = db.latest()
        else:
            end_ts = _bound(end, "end")
            hi = db.timestamp(end_ts - 1) if end_ts > lo else lo - 1
        e = db.entry(self.name, hi if hi >= lo else db.latest())
        cols = check_columns(e.schema, columns)
        if hi < lo:
            return _changes_schema(e.schema, cols).empty_table()

        def read(plan: Any) -> pa.Table:
            since = plan_since(db, e)
            if lo < since:
                raise db.planner.below(e, lo, since)
            return read_changes(db.client.blob, plan, lo, cols, db.client.config.retry_deadline_s)

        return db.planner.with_replan(e, hi, read).cast(_changes_schema(e.schema, cols))

    def history(self, limit: int | None = None) -> pa.Table:
        """``db.history(table=self.name, limit=limit)``."""
        return self.db.history(table=self.name, limit=limit)

    def earliest(self) -> int:
        """The earliest timestamp this table can be read at now (its since)."""
        return plan_since(self.db, self._at(None)[0])


def _bound(x: object, what: str) -> int:
    """A changes() bound as a timestamp: an int as is, a datetime as the first timestamp of its millisecond."""
    if isinstance(x, dt.datetime):
        return clock.ts_of_ms(clock.ms_of_datetime(x))
    if isinstance(x, int) and not isinstance(x, bool) and x >= 0:
        return x
    raise InvalidUsage(f"changes() {what} must be a timestamp (int >= 0) or a datetime, got {x!r}")


def plan_since(db: Database, e: TableEntry) -> int:
    return db.handle.data_writer(e.data_id).shard.state().since


def _changes_schema(schema: pa.Schema, cols: list[str]) -> pa.Schema:
    return pa.schema([*(schema.field(c) for c in cols), pa.field("ts", pa.int64()), pa.field("diff", pa.int64())])


__all__ = ["Table"]
