"""Keyed tables: primary keys as Python tuples, and point reads pushed into the Parquet reads.

A table created with ``primary_key=[...]`` holds at most one row per key.
Keys travel as tuples of Python values in key-column order, normalized
through Arrow (the table's key column types), so a key the user gives and a
key read from the table compare equal exactly when the stored values do.

A point read (:func:`committed_rows`) plans the table's snapshot like any
read, drops the parts whose key bounds (``PartRef.lo``/``hi``: of the data
shard's first key column, which is the first primary key column) exclude
the first key column of every key asked (:func:`prune_plan`; parts without
bounds, and inline rows, are always read), and pushes the key equality into
every remaining Parquet read (one key: an equality per key column; several:
an ``isin`` per column, matched exactly afterwards), so only the parts that
may hold those keys are fetched and only their rows are decoded. A keyed
table's data shard sorts by the primary key first, so a part's row-group
statistics skip it unless the key may be in it.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

import pyarrow as pa
import pyarrow.compute as pc

from persist import SchemaMismatch, SnapshotPlan
from persist.manifest import bound_values, prune_runs
from txns.db.arrow_io import NOT_ARROW, arrow_pieces, conform
from txns.db.catalog import TableEntry
from txns.db.errors import InvalidPrimaryKey
from txns.db.scan import PART_CACHE, PlanReader, read_table

if TYPE_CHECKING:
    from persist import PersistClient

T = TypeVar("T")


class PlannedReads(Protocol):
    """What keyed reads need (:class:`txns.db.planner.ReadPlanner` has it): the client, and plans read again."""

    @property
    def client(self) -> PersistClient: ...

    def with_replan(self, entry: TableEntry, ts: int, read: Callable[[SnapshotPlan], T]) -> T: ...


Key = tuple[Any, ...]


def require_keyed(e: TableEntry, op: str) -> tuple[str, ...]:
    """``e``'s primary key, or InvalidPrimaryKey saying ``op`` needs one."""
    if e.primary_key is None:
        raise InvalidPrimaryKey(
            f"table {e.name!r} has no primary key; create it with primary_key=[...] "
            f"(e.g. primary_key=[{e.schema.names[0]!r}]) to use {op}()"
        )
    return e.primary_key


def key_schema(e: TableEntry) -> pa.Schema:
    """The primary key columns of ``e`` (in key order), non-nullable."""
    assert e.primary_key is not None
    return pa.schema([e.schema.field(n).with_nullable(False) for n in e.primary_key])


def describe_key(e: TableEntry, key: Key) -> str:
    """A key as the messages show it: ``{'account': 'alice'}``."""
    assert e.primary_key is not None
    return repr(dict(zip(e.primary_key, key, strict=True)))


def _conformed_keys(e: TableEntry, table: pa.Table, what: str) -> list[Key]:
    """The key columns of ``table`` (exactly those) as normalized tuples, or InvalidPrimaryKey."""
    schema = key_schema(e)
    for n in schema.names:
        nulls = table.column(n).null_count
        if nulls:
            raise InvalidPrimaryKey(
                f"table {e.name!r}: primary key column {n!r} must not be null, but {nulls} value(s) of {what} are"
            )
    try:
        table = conform(table, schema, e.name)
    except SchemaMismatch as x:
        raise InvalidPrimaryKey(
            f"table {e.name!r}: {what} do not fit the primary key {list(schema.names)}: {x}"
        ) from None
    cols = [table.column(n).to_pylist() for n in schema.names]
    return list(zip(*cols, strict=True))


def keys_from_values(e: TableEntry, values: Sequence[object]) -> list[Key]:
    """Keys given as tuples (or bare values, for a one-column key) as normalized tuples."""
    pk = require_keyed(e, "a keyed read")
    tuples: list[tuple[Any, ...]] = []
    for v in values:
        t = v if isinstance(v, tuple) else (v,)
        if len(t) != len(pk):
            example = "(" + ", ".join("..." for _ in pk) + ("," if len(pk) == 1 else "") + ")"
            raise InvalidPrimaryKey(
                f"table {e.name!r}: key {v!r} has {len(t)} value(s), but the primary key {list(pk)} has "
                f"{len(pk)} column(s); give a tuple {example} in that order"
                + (" (or a bare value)" if len(pk) == 1 else "")
            )
        tuples.append(t)
    if not tuples:
        return []
    arrays = {}
    for j, n in enumerate(pk):
        vals = [t[j] for t in tuples]
        try:
            arrays[n] = pa.array(vals)
        except NOT_ARROW as x:
            raise InvalidPrimaryKey(
                f"table {e.name!r}: the values given for key column {n!r} ({e.schema.field(n).type}) "
                f"are not values of one type: {x}"
            ) from None
    what = "the key" if len(tuples) == 1 else "the keys"
    return _conformed_keys(e, pa.table(arrays), what)


def row_keys(e: TableEntry, rows: pa.Table) -> list[Key]:
    """The primary key of each row of ``rows`` (already of ``e``'s schema); nulls raise InvalidPrimaryKey."""
    assert e.primary_key is not None
    return _conformed_keys(e, rows.select(list(e.primary_key)), "the data")


def keys_of(e: TableEntry, keys: object) -> list[Key]:
    """Keys for ``delete``: a list of tuples (or bare values), one tuple, or rows with the key columns.

    (An Arrow array of values, too, for a one-column key.)

    Rows are anything ``insert`` takes (Arrow, pandas, Polars, a list of
    dicts, a dict of columns); columns besides the key's are ignored.
    """
    pk = require_keyed(e, "delete")
    if isinstance(keys, tuple):
        return keys_from_values(e, [keys])
    if isinstance(keys, (pa.Array, pa.ChunkedArray)) and len(pk) == 1:
        return keys_from_values(e, keys.to_pylist())
    if isinstance(keys, list) and not (keys and all(isinstance(k, dict) for k in keys)):
        return keys_from_values(e, keys)
    if keys is None or isinstance(keys, (str, bytes, int, float)):
        raise InvalidPrimaryKey(
            f"table {e.name!r}: keys must be a list of keys (tuples, or bare values for a one-column key) "
            f"or rows with the key columns {list(pk)}; got {type(keys).__name__} {keys!r}"
        )
    out: list[Key] = []
    for piece in arrow_pieces(keys, e.name):
        t = piece if isinstance(piece, pa.Table) else pa.Table.from_batches([piece])
        if t.num_columns == 0 and t.num_rows == 0:
            continue
        missing = [n for n in pk if n not in t.column_names]
        if missing:
            raise InvalidPrimaryKey(
                f"table {e.name!r}: the keys given lack the primary key column(s) {missing} "
                f"(the key is {list(pk)}; they have {t.column_names})"
            )
        out += _conformed_keys(e, t.select(list(pk)), "the keys")
    return out


def key_filter(e: TableEntry, keys: Collection[Key]) -> pc.Expression:
    """A filter selecting (at least) the rows with one of ``keys``: exact for one key, per column for several."""
    pk = require_keyed(e, "a keyed read")
    expr: pc.Expression | None = None
    for j, n in enumerate(pk):
        typ = e.schema.field(n).type
        if len(keys) == 1:
            term = pc.field(n) == pa.scalar(next(iter(keys))[j], typ)
        else:
            term = pc.field(n).isin(pa.array(list({k[j] for k in keys}), typ))
        expr = term if expr is None else expr & term
    assert expr is not None
    return expr


def prune_plan(e: TableEntry, plan: SnapshotPlan, keys: Collection[Key]) -> SnapshotPlan:
    """``plan`` without the parts that cannot hold any of ``keys`` (by their first key column's bounds).

    A keyed table's data shard key starts with the primary key, so a part's
    bounds (:class:`persist.PartRef`) are those of ``keys``' first
    values. Parts without bounds and inline rows are kept.
    """
    pk = require_keyed(e, "a keyed read")
    runs = prune_runs(plan.runs, bound_values({k[0] for k in keys}, e.schema.field(pk[0]).type))
    return plan if runs == plan.runs else replace(plan, runs=runs)


def read_at(
    db: PlannedReads,
    e: TableEntry,
    ts: int,
    columns: list[str],
    expr: pc.Expression | None,
    keys: Collection[Key] | None = None,
) -> pa.Table:
    """``e``'s rows at ``ts`` (projected, filtered in the Parquet reads), in ``columns``' order and types.

    ``keys``: the read wants only rows with these primary keys (``expr``
    selects at least them), so parts whose bounds exclude them all are not
    read (:func:`prune_plan`), and the parts read come from (and go to) the
    process's small-part cache (:data:`txns.db.scan.PART_CACHE`).
    """
    cfg = db.client.config

    def read(plan: Any) -> pa.Table:
        cache = None
        if keys is not None:
            plan = prune_plan(e, plan, keys)
            cache = PART_CACHE  # point reads read the same small parts again and again
        return read_table(PlanReader(db.client.blob, plan, columns, expr, cfg.retry_deadline_s, cache))

    out: pa.Table = db.with_replan(e, ts, read)
    return out.cast(pa.schema([e.schema.field(c) for c in columns]))


def committed_rows(db: PlannedReads, e: TableEntry, ts: int, keys: Iterable[Key]) -> dict[Key, list[dict[str, Any]]]:
    """The rows of ``e`` at ``ts`` by primary key, for each of ``keys`` (a row repeated by its multiplicity).

    Normally at most one row per key. Only the parts whose key bounds may
    hold one of ``keys`` are fetched, and only the rows of ``keys`` decoded
    (the key filter is pushed into every Parquet read).
    """
    wanted = set(keys)
    if not wanted:
        return {}
    pk = require_keyed(e, "a keyed read")
    table = read_at(db, e, ts, list(e.schema.names), key_filter(e, wanted), wanted)
    out: dict[Key, list[dict[str, Any]]] = {k: [] for k in wanted}
    for row in table.to_pylist():
        k = tuple(row[n] for n in pk)
        if k in out:
            out[k].append(row)
    return out


def without_keys(e: TableEntry, table: pa.Table, keys: Collection[Key]) -> pa.Table:
    """``table`` (with the key columns) without its rows whose primary key is one of ``keys``."""
    pk = require_keyed(e, "a keyed read")
    if not keys or table.num_rows == 0:
        return table
    if len(pk) == 1:
        values = pa.array([k[0] for k in keys], e.schema.field(pk[0]).type)
        return table.filter(pc.invert(pc.is_in(table.column(pk[0]), value_set=values)))
    drop = set(keys)
    cols = [table.column(n).to_pylist() for n in pk]
    mask = [k not in drop for k in zip(*cols, strict=True)]
    return table.filter(pa.array(mask, pa.bool_()))


def first_repeat(keys: Iterable[Key]) -> Key | None:
    """The first key seen twice, or None."""
    seen: set[Key] = set()
    for k in keys:
        if k in seen:
            return k
        seen.add(k)
    return None


__all__ = [
    "Key",
    "PlannedReads",
    "committed_rows",
    "describe_key",
    "first_repeat",
    "key_filter",
    "key_schema",
    "keys_from_values",
    "keys_of",
    "prune_plan",
    "read_at",
    "require_keyed",
    "row_keys",
    "without_keys",
]
