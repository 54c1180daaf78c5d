"""The ``txns`` commands that work on a database by its URL: init, tables, show, history.

Also the pieces the operator commands (inspect, apply, compact, gc) use when
given just a database URL: finding the txns shard from the root record, and
naming data shards by their tables.

Only ``init`` (and ``demo``) create a database; every other command opens
with ``create=False`` and reports a location without one as a usage error.
Every command takes ``--json`` and then prints one JSON document.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import math
from collections.abc import Callable
from typing import Any, TextIO

from persist import PersistClient
from persist.url import redact
from txns.db import clock
from txns.db.database import DROPPED_REPORT, Database, connect
from txns.db.errors import DatabaseNotFound
from txns.db.root import read_root


class UsageError(Exception):
    """A problem the user can fix (the CLI prints it as one line, exit status 2)."""


def parse_as_of(text: str | None) -> int | dt.datetime | None:
    """``--as-of``: a timestamp (digits) or an ISO 8601 datetime (UTC unless it has an offset)."""
    if text is None:
        return None
    if text.isascii() and text.isdigit():
        return int(text)
    try:
        return dt.datetime.fromisoformat(text)
    except ValueError:
        raise UsageError(
            f"--as-of {text!r} is neither a timestamp nor an ISO datetime (e.g. 2024-05-01T15:30:00 or "
            f"2024-05-01T15:30:00+00:00)"
        ) from None


def open_db(url: str) -> Database:
    """The database at ``url``; UsageError if there is none (nothing is created)."""
    try:
        return connect(url, create=False)
    except DatabaseNotFound as e:
        raise UsageError(str(e)) from None


def txns_id_of(client: PersistClient, url: str) -> str:
    """The txns shard id of the database at ``url`` (UsageError if there is no database)."""
    root = read_root(client)
    if root is None:
        raise UsageError(
            f"no database at {redact(url)!r} (no root record); give the txns shard id after the URL, "
            f"or create a database with `txns init {redact(url)}`"
        )
    return root.txns_id


def table_names(db: Database) -> dict[str, str]:
    """Data shard id -> table name, for the tables live now (plus the catalog and commits shards)."""
    names = {e.data_id: name for name, e in db.catalog(db.latest()).tables.items()}
    names[db.root.catalog_id] = "(catalog)"
    names[db.handle.commits_id] = "(commits)"
    return names


def _dump(out: TextIO, j: Any) -> None:
    out.write(json.dumps(j, indent=2, sort_keys=True, default=str) + "\n")


def _when(ts: int) -> str:
    return clock.to_datetime(ts).isoformat(timespec="milliseconds")


# ---- commands ------------------------------------------------------------------------------------


def cmd_init(args: argparse.Namespace, out: TextIO) -> int:
    retention = None
    if args.retention_days is not None:
        days = args.retention_days
        if not math.isfinite(days) or days < 0:
            raise UsageError(f"--retention-days must be a number of days >= 0, got {days}")
        try:
            retention = dt.timedelta(days=days)
        except OverflowError:
            raise UsageError(f"--retention-days {days} is too large (at most {dt.timedelta.max.days} days)") from None
    existed = True
    try:
        db = connect(args.url, create=False)
    except DatabaseNotFound:
        existed = False
        db = connect(args.url, retention=retention)
    try:
        if existed and retention is not None and retention != db.retention:
            db.set_retention(retention)
        j: dict[str, Any] = {
            "url": db.url,
            "created": not existed,
            "txns_id": db.root.txns_id,
            "catalog_id": db.root.catalog_id,
            "retention_s": db.retention.total_seconds(),
            "tables": db.tables(),
        }
    finally:
        db.close()
    if args.json:
        _dump(out, j)
    elif existed:
        out.write(f"a database already exists at {j['url']} ({len(j['tables'])} tables); nothing changed\n")
    else:
        out.write(f"created a database at {j['url']} (history retention {db.retention})\n")
    return 0


def cmd_tables(args: argparse.Namespace, out: TextIO) -> int:
    db = open_db(args.url)
    try:
        ts = db.timestamp(parse_as_of(args.as_of))
        view = db.catalog(ts)
        rows: list[dict[str, Any]] = []
        for name in sorted(view.tables):
            e = view.tables[name]
            t = db.table(name) if args.as_of is None else None
            count = t.count() if t is not None else _count_at(db, name, ts)
            rows.append(
                {
                    "name": name,
                    "columns": {f.name: str(f.type) for f in e.schema},
                    "primary_key": list(e.primary_key) if e.primary_key is not None else None,
                    "rows": count,
                    "retention_s": (e.retention_ms if e.retention_ms is not None else db.root.retention_ms) / 1000,
                    "data_id": e.data_id,
                }
            )
    finally:
        db.close()
    if args.json:
        _dump(out, {"url": db.url, "as_of": ts, "time": _when(ts), "tables": rows})
        return 0
    if not rows:
        out.write(f"no tables at {db.url} as of {_when(ts)}\n")
        return 0
    cells = [["table", "rows", "columns"]] + [
        [r["name"], str(r["rows"]), ", ".join(f"{k} {v}" for k, v in r["columns"].items())] for r in rows
    ]
    out.write("\n".join(_grid(cells)) + "\n")
    return 0


def _count_at(db: Database, name: str, ts: int) -> int:
    from txns.db.table import Table

    return Table(db, name).count(as_of=ts)


def cmd_show(args: argparse.Namespace, out: TextIO) -> int:
    if args.limit is not None and args.limit < 0:
        raise UsageError(f"--limit must be >= 0, got {args.limit}")
    db = open_db(args.url)
    try:
        from txns.db.table import Table

        as_of = db.timestamp(parse_as_of(args.as_of))
        db.entry(args.table, as_of)  # TableNotFound (a usage error) names what exists
        table = Table(db, args.table).to_arrow(as_of=as_of)
    finally:
        db.close()
    limit = 20 if args.limit is None else args.limit
    shown = table.slice(0, limit)
    if args.json:
        _dump(
            out,
            {
                "table": args.table,
                "as_of": as_of,
                "time": _when(as_of),
                "rows": shown.to_pylist(),
                "total_rows": table.num_rows,
                "schema": {f.name: str(f.type) for f in table.schema},
            },
        )
        return 0
    out.write(f"{args.table} as of {_when(as_of)} (ts {as_of}): {table.num_rows} rows\n")
    if table.num_rows:
        cells = [list(table.schema.names)] + [[_cell(v) for v in r.values()] for r in shown.to_pylist()]
        out.write("\n".join(_grid(cells)) + "\n")
    if table.num_rows > limit:
        out.write(f"  ... {table.num_rows - limit} more (--limit N)\n")
    return 0


def cmd_history(args: argparse.Namespace, out: TextIO) -> int:
    if args.limit is not None and args.limit < 0:
        raise UsageError(f"--limit must be >= 0, got {args.limit}")
    db = open_db(args.url)
    try:
        h = db.history(table=args.table, limit=args.limit)
    finally:
        db.close()
    rows = h.to_pylist()
    if args.json:
        for r in rows:
            r["time"] = r["time"].isoformat(timespec="milliseconds")
            r["metadata"] = json.loads(r["metadata"])
        _dump(out, {"url": db.url, "table": args.table, "commits": rows})
        return 0
    if not rows:
        out.write("no commits\n")
        return 0
    cells = [["time", "ts", "tables", "+rows", "-rows", "operations", "metadata"]]
    for r in rows:
        cells.append(
            [
                r["time"].isoformat(timespec="milliseconds"),
                str(r["ts"]),
                ", ".join(r["tables"]),
                str(r["rows_added"]),
                str(r["rows_retracted"]),
                "; ".join(r["operations"]),
                "" if r["metadata"] == "{}" else r["metadata"],
            ]
        )
    out.write("\n".join(_grid(cells)) + "\n")
    return 0


def compact_db(
    url: str,
    out: TextIO,
    as_json: bool,
    *,
    tables: list[str] | None = None,
    merge: Callable[[Database], dict[str, dict[str, Any]]] | None = None,
) -> dict[str, Any]:
    """``txns compact URL [--table T ...] [--spark]``: retention holds and a full compaction of the tables.

    ``merge``: compacts the database's tables itself (the CLI passes a Spark
    job: ``txns.spark.compact_tables``) and returns ``Database.compact``'s report.
    """
    db = open_db(url)
    try:
        report = db.compact(tables) if merge is None else merge(db)
        db.handle.compact_to(db.latest())
        db.handle.writer.shard.fetch()
        for _ in range(64):  # the txns shard itself, until its policy asks for nothing more
            if db.handle.writer.compact() == 0:
                break
    finally:
        db.close()
    dropped = report.pop(DROPPED_REPORT, {"tombstoned": 0, "forgotten": 0})
    j = {
        name: {
            "batches": [r["before"]["batches"], r["after"]["batches"]],
            "rows": [r["before"]["rows"], r["after"]["rows"]],
            "parts": [r["before"]["parts"], r["after"]["parts"]],
            "since": r["since"],
            "history_from": _when(r["since"]),
        }
        for name, r in report.items()
    }
    if as_json:
        _dump(out, {"url": db.url, "tables": j, "dropped_tables": dropped})
    else:
        for name, r in j.items():
            out.write(
                f"table {name}: {r['batches'][0]} -> {r['batches'][1]} batches, {r['rows'][0]} -> {r['rows'][1]} "
                f"stored rows, {r['parts'][0]} -> {r['parts'][1]} parts; history kept from {r['history_from']}\n"
            )
        if dropped["tombstoned"] or dropped["forgotten"]:
            out.write(
                f"dropped tables past their history: {dropped['tombstoned']} retired (data deleted after the "
                f"grace period), {dropped['forgotten']} released\n"
            )
    return j


def gc_reason(client: PersistClient, shard_id: str, older_than_s: float, keep: set[str]) -> str:
    """Why a gc of ``shard_id`` deleted nothing: what it found and kept, or that there was nothing."""
    import time

    from persist.manifest import part_written_ms

    state = client.shard(shard_id).fetch()
    grace_ms = int(client.config.part_grace_s * 1000)
    now = client.config.clock_ms()
    waiting = [k for k, at in state.garbage if at > now - grace_ms]
    live = state.part_keys() | {k for k, _ in state.garbage} | keep
    horizon = int(time.time() * 1000) - int(older_than_s * 1000)
    young = 0
    for key in client.blob.list_keys(f"{shard_id}/parts/"):
        written = part_written_ms(key)
        if key not in live and written is not None and written > horizon:
            young += 1
    why = []
    if waiting:
        why.append(f"{len(waiting)} retired part(s) wait out their {client.config.part_grace_s:g}s grace period")
    if young:
        why.append(
            f"{young} unreferenced part(s) are younger than --older-than {older_than_s:g}s (maybe writes in progress)"
        )
    return "; ".join(why) if why else "every part is referenced by the shard or an unapplied commit"


def _cell(v: object) -> str:
    s = "null" if v is None else str(v)
    return s if len(s) <= 40 else s[:37] + "..."


def _grid(rows: list[list[str]]) -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = []
    for n, r in enumerate(rows):
        lines.append("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip())
        if n == 0:
            lines.append("  ".join("-" * w for w in widths))
    return lines


def add_commands(sub: Any) -> None:
    """Add init, tables, show and history to the ``txns`` parser."""
    i = sub.add_parser("init", help="create a database at URL (if there is none)")
    i.add_argument("url", metavar="URL", help="file:///absolute/path or s3://BUCKET/PREFIX?endpoint_url=...")
    i.add_argument("--retention-days", type=float, default=None, help="history retention (default 7 days)")
    i.add_argument("--json", action="store_true", help="print JSON")
    i.set_defaults(func=cmd_init)

    t = sub.add_parser("tables", help="list the tables of the database at URL")
    t.add_argument("url", metavar="URL")
    t.add_argument("--as-of", default=None, metavar="T", help="a timestamp or an ISO datetime (default: latest)")
    t.add_argument("--json", action="store_true", help="print JSON")
    t.set_defaults(func=cmd_tables)

    s = sub.add_parser("show", help="print a table's rows")
    s.add_argument("url", metavar="URL")
    s.add_argument("table", metavar="TABLE")
    s.add_argument("--as-of", default=None, metavar="T", help="a timestamp or an ISO datetime (default: latest)")
    s.add_argument("--limit", type=int, default=None, metavar="N", help="rows to print (default 20)")
    s.add_argument("--json", action="store_true", help="print JSON")
    s.set_defaults(func=cmd_show)

    h = sub.add_parser("history", help="the committed transactions, newest first")
    h.add_argument("url", metavar="URL")
    h.add_argument("--table", default=None, metavar="T", help="only commits that touched table T")
    h.add_argument("--limit", type=int, default=None, metavar="N", help="the newest N commits")
    h.add_argument("--json", action="store_true", help="print JSON")
    h.set_defaults(func=cmd_history)


__all__ = [
    "UsageError",
    "add_commands",
    "compact_db",
    "gc_reason",
    "open_db",
    "parse_as_of",
    "table_names",
    "txns_id_of",
]
