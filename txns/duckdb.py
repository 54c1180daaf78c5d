"""DuckDB over a database: SQL across its tables, every table at one timestamp.

``connect(db, as_of)`` gives a DuckDB connection in which every table of
the database is a view of its lazy dataset (:meth:`Table.to_dataset`), all
taken from one read transaction (``db.read(as_of)``): whatever commits
while the views are made or queried, a query joining several tables sees
them all as of ``r.ts``. ``sql(db, query, as_of)`` (``db.sql``) does the
same for just the tables the query names and returns the query's DuckDB
relation (``.arrow()``, ``.df()``, ``.pl()``, ``.fetchall()``), run on a new
connection (``cursor()``) to a DuckDB database private to this module and
shared by its calls (a new database costs about 0.1 s; a connection,
nothing); the views are temporary, so calls never see each other's.

DuckDB is optional (``pip install 'txns[duckdb]'``): it is imported on
first use here, never by ``import txns``; without it these raise
:class:`EngineNotInstalled` (an ``ImportError``) saying what to install.
"""

from __future__ import annotations

import importlib
import threading
from collections.abc import Iterable
from types import ModuleType
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.fs as pafs

from persist import InvalidUsage

if TYPE_CHECKING:
    from txns.db.database import AsOf, Database
    from txns.db.read_txn import ReadTransaction


class EngineNotInstalled(ImportError):
    """An optional query engine is not installed; the message says which extra to install."""


def load_duckdb() -> ModuleType:
    """The ``duckdb`` module, or :class:`EngineNotInstalled`."""
    try:
        return importlib.import_module("duckdb")
    except ImportError:
        raise EngineNotInstalled(
            "DuckDB is not installed; install it with: pip install 'txns[duckdb]' (or pip install duckdb)"
        ) from None


def _register(con: Any, r: ReadTransaction, names: Iterable[str]) -> None:
    for name in names:
        view(con, name, r.table(name).to_dataset())


def view(con: Any, name: str, d: ds.Dataset) -> None:
    """Make ``name`` a view of dataset ``d`` (of ``Table.to_dataset``) in DuckDB connection ``con``.

    Direct parts on a local disk, of one stored schema and of types Parquet
    stores as themselves, are read by DuckDB's own Parquet reader
    (``read_parquet`` of the files, as fast as a plain Parquet table; it
    does not verify page checksums); the consolidated rows, and any other
    dataset, through Arrow. The consolidated rows of such a view are the
    connection's table ``txns_rows__NAME`` (a name no table of a database can
    have: ``txns_`` is reserved).
    """
    files, rest = _split(d)
    if files is None:
        con.register(name, d)  # (a view local to this connection)
        return
    cols = ", ".join(_quote(c) for c in d.schema.names)
    paths = ", ".join("'" + p.replace("'", "''") + "'" for p in files.files)
    sources = [f"SELECT {cols} FROM read_parquet([{paths}])"]
    if rest is not None:
        rows = f"txns_rows__{name}"  # (the reserved prefix: no table of the database is named so)
        con.register(rows, rest.to_table())
        sources.append(f"SELECT {cols} FROM {_quote(rows)}")
    con.execute(f"CREATE OR REPLACE TEMP VIEW {_quote(name)} AS " + " UNION ALL ".join(sources))


def _quote(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _split(d: ds.Dataset) -> tuple[ds.FileSystemDataset | None, ds.Dataset | None]:
    """(direct local parts DuckDB can read itself, the consolidated rows), or (None, d): Arrow reads it all."""
    children = d.children if isinstance(d, ds.UnionDataset) else [d]
    files = next((c for c in children if isinstance(c, ds.FileSystemDataset)), None)
    rest = next((c for c in children if not isinstance(c, ds.FileSystemDataset)), None)
    if files is None or not isinstance(files.filesystem, pafs.LocalFileSystem):
        return None, d
    if not all(_native(f.type) for f in d.schema):
        return None, d
    names = d.schema.names
    stored = {tuple(frag.physical_schema.field(n).type for n in names) for frag in files.get_fragments()}
    if len(stored) != 1:
        return None, d
    return files, rest


_NATIVE = (
    pa.types.is_integer,
    pa.types.is_floating,
    pa.types.is_boolean,
    pa.types.is_string,
    pa.types.is_large_string,
    pa.types.is_binary,
    pa.types.is_large_binary,
    pa.types.is_date32,
    pa.types.is_decimal128,
)
"""Arrow types DuckDB reads back from Parquet as themselves (timestamps apart: see :func:`_native`)."""


def _native(t: pa.DataType) -> bool:
    """Whether DuckDB reads a Parquet column written from Arrow type ``t`` as the type Arrow gives it."""
    if pa.types.is_timestamp(t):
        return bool(t.unit != "s")  # (Parquet has no seconds: stored as milliseconds)
    return any(is_(t) for is_ in _NATIVE) and not pa.types.is_float16(t)


def connect(db: Database, as_of: AsOf = None, *, tables: Iterable[str] | None = None) -> Any:
    """A new in-memory DuckDB connection with each table of ``db`` as a view, all as of one time.

    ``as_of`` as for ``db.read`` (None: the latest commit); ``tables``
    limits the views to those names. The views stay at that time for the
    connection's life; connect again for a later one.
    """
    duckdb = load_duckdb()
    con = duckdb.connect()
    with db.read(as_of) as r:
        names = r.tables() if tables is None else list(tables)
        _register(con, r, names)
    return con


_PRIVATE: dict[str, Any] = {}
_PRIVATE_LOCK = threading.Lock()


def _private(duckdb: ModuleType) -> Any:
    """This process's DuckDB database for ``sql``: each call gets its own connection to it (``cursor()``),
    whose views are temporary, so calls never see each other's tables."""
    with _PRIVATE_LOCK:
        con = _PRIVATE.get("db")
        if con is None:
            con = _PRIVATE["db"] = duckdb.connect()
        return con


def words(duckdb: ModuleType, query: str) -> set[str]:
    """Every identifier or keyword of ``query``, unquoted and lowercased: a superset of the tables it names.

    (Registering a table the query does not use costs only its planning;
    DuckDB's own ``get_table_names`` binds the query, which needs the
    tables first.)
    """
    try:
        tokens = duckdb.tokenize(query)
    except duckdb.Error as e:
        raise InvalidUsage(f"cannot parse the query: {e}") from None
    kinds = {duckdb.token_type.identifier, duckdb.token_type.keyword}
    ends = [pos for pos, _ in tokens[1:]] + [len(query)]
    out = set()
    for (pos, kind), end in zip(tokens, ends, strict=True):
        if kind in kinds:
            text = query[pos:end].strip()
            if len(text) >= 2 and text[0] == text[-1] == '"':
                text = text[1:-1].replace('""', '"')
            out.add(text.lower())
    return out


def sql(db: Database, query: str, as_of: AsOf = None) -> Any:
    """``query`` run by DuckDB over the tables it names, all as of one time; its DuckDB relation.

    Table names are DuckDB identifiers: case-insensitive unless quoted.
    A query naming no table of the database runs as plain DuckDB.
    """
    duckdb = load_duckdb()
    if not isinstance(query, str) or not query.strip():
        raise InvalidUsage(f"query must be a SQL string, got {query!r}")
    named = words(duckdb, query)
    con = _private(duckdb).cursor()  # (a new database costs ~0.1 s; a connection to one, nothing)
    with db.read(as_of) as r:
        _register(con, r, [n for n in r.tables() if n.lower() in named])
    rel = con.sql(query)
    if rel is None:
        raise InvalidUsage(f"the query returns no rows to read (a statement such as CREATE or SET?): {query!r}")
    return rel


__all__ = ["EngineNotInstalled", "connect", "load_duckdb", "sql", "view"]
