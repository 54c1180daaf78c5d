"""The ``txns`` command: an operator's tool for a txns shard, and a demo.

Usage (also ``python -m txns``)::

    txns demo    [--dir PATH] [--txns N]
    txns init    URL [--retention-days D] [--json]
    txns tables  URL [--as-of T] [--json]
    txns show    URL TABLE [--as-of T] [--limit N] [--json]
    txns history URL [--table T] [--limit N] [--json]
    txns sql     URL QUERY [--as-of T] [--json|--csv]
    txns inspect URL [TXNS_ID] [--json]
    txns apply   URL [TXNS_ID] [--json]
    txns compact URL [TXNS_ID] [--table NAME]... [--spark] [--master URL] [--json]
    txns gc      URL [TXNS_ID] [--older-than SECONDS] [--json]
    txns check-store URL [--racers N] [--keys N] [--rounds N] [--seconds S] [--json]
    txns --version

``URL`` names the store (``file:///PATH``, ``s3://BUCKET/PREFIX?...``; see
:mod:`persist.url`). Given just a database's URL, the operator commands find
its txns shard in the root record (see :mod:`txns.db`); ``TXNS_ID`` (``s`` +
32 hex digits) names a txns shard directly, for stores made with the
low-level API. Only ``init`` and ``demo`` create a database.

Safety. Every operator command is safe to run at any time, alongside
writers, readers and other operators: this module parses arguments and
prints; the work is done by :mod:`txns.admin` (inspect, apply and tidy,
compact, gc on a txns shard) and :mod:`txns.db.commands` (a database's
tables, history, compaction), which use only the protocol's idempotent
operations (their docstrings say how).

Commands that need a txns shard never create one: an unknown id is an error.
Errors a user can fix (bad URL, unknown shard, missing bucket, a bad number
such as ``--older-than nan``) print one line to stderr and exit with status
2; storage failures print one line and exit with status 1 (every command is
safe to run again). With ``--json`` an error is also one JSON document on
stdout (``{"command", "error": {"type", "message", "exit_status"}}``), so
stdout always holds exactly one document. In-process locations (``mem://``)
are refused: whatever a command made or read there would vanish with it.
Set ``TXNS_DEBUG=1`` for tracebacks.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import os
import sys
from collections.abc import Sequence
from typing import Any, NoReturn, TextIO

import pyarrow as pa

from persist import InvalidUsage, PersistClient, PersistError, ShardId
from persist.url import accepted_forms, local_path, redact, validate_url
from txns.admin import TxnsView, apply_and_tidy, collect_garbage, compact_txns, open_handle, read_txns, txns_state
from txns.db.commands import (
    UsageError,
    _cell,
    _grid,
    _when,
    add_commands,
    compact_db,
    gc_reason,
    open_db,
    parse_as_of,
    table_names,
    txns_id_of,
)

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2

DEFAULT_GC_OLDER_THAN_S = 24 * 3600.0


class CliError(Exception):
    """A problem the user can fix; printed as one line, exit status 2."""


class _ArgumentError(Exception):
    """argparse's complaint about the command line (raised instead of exiting, so ``--json`` can report it)."""

    def __init__(self, parser: argparse.ArgumentParser, message: str) -> None:
        super().__init__(message)
        self.parser = parser
        self.message = message


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise _ArgumentError(self, message)


# ---- arguments -----------------------------------------------------------------------


def parse_txns_id(text: str) -> str:
    """``text`` as a shard id string, or CliError."""
    try:
        return str(ShardId.parse(text))
    except PersistError as e:
        raise CliError(str(e)) from None


def open_store(url: str, must_exist: bool = True) -> PersistClient:
    """A client for ``url``. With ``must_exist``, a local directory (``file://``) that is absent is an error.

    (Opening a ``file://`` location creates its directory; an operator
    command on a mistyped path should say so instead.)
    """
    path = local_path(url) if must_exist else None
    if path is not None and not path.is_dir():
        raise CliError(f"no store at {redact(url)!r}: the directory {str(path)!r} does not exist")
    try:
        return PersistClient.open(url)
    except InvalidUsage as e:  # a bad URL, a missing bucket: the user's to fix (exit 2)
        raise CliError(str(e)) from None
    # storage failures (ExternalError) propagate: exit 1, safe to run again


def inspect_txns(url: str, txns_id: str) -> dict[str, Any]:
    """``txns inspect --json`` as a dict. Keys (stable)::

    url, txns_id, upper, since,
    registered: {data_id: {register_ts}},       # the commits shard (commit records) included
    commits_shard: data_id,
    entries: [{data_id, commit_ts, rows, parts, batch_id, applied}],   # present, not yet tidied
    unapplied: int,
    data_shards: {data_id: {registered, register_ts, physical_upper, logical_upper,
                            since, batches, rows, parts, bytes}}
    """
    client = open_store(url)
    return read_txns(client, parse_txns_id(txns_id)).to_json(url)


def render_inspect(j: dict[str, Any], names: dict[str, str] | None = None) -> str:
    """The human-readable form of an :func:`inspect_txns` dict (``names`` labels data shards)."""
    names = {j["commits_shard"]: "(commit records)", **(names or {})} if "commits_shard" in j else (names or {})
    out = [
        f"txns shard {j['txns_id']} at {j['url']}",
        f"  upper {j['upper']}   since {j['since']}   registered data shards {len(j['registered'])}",
    ]
    shards = j["data_shards"]
    if shards:
        rows = [["data shard", "registered", "physical upper", "logical upper", "since", "batches", "rows"]]
        for d, s in shards.items():
            label = f"{d} ({names[d]})" if d in names else d
            reg = f"at {s['register_ts']}" if s["registered"] else "no"
            rows.append(
                [
                    label,
                    reg,
                    str(s["physical_upper"]),
                    str(s["logical_upper"]),
                    str(s["since"]),
                    str(s["batches"]),
                    str(s["rows"]),
                ]
            )
        out += ["", *_table(rows)]
    entries = j["entries"]
    awaiting = len(entries) - j["unapplied"]
    out += [
        "",
        f"  entries in the txns shard: {len(entries)} ({j['unapplied']} unapplied, {awaiting} applied awaiting tidy)",
    ]
    if entries:
        rows = [["data shard", "commit ts", "rows", "parts", "applied"]]
        for e in entries:
            label = f"{e['data_id']} ({names[e['data_id']]})" if e["data_id"] in names else e["data_id"]
            rows.append([label, str(e["commit_ts"]), str(e["rows"]), str(e["parts"]), "yes" if e["applied"] else "no"])
        out += _table(rows)
    return "\n".join(out)


def _table(rows: list[list[str]], indent: str = "  ") -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = []
    for n, r in enumerate(rows):
        cells = [c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths, strict=True))]
        lines.append(indent + "  ".join(cells).rstrip())
        if n == 0:
            lines.append(indent + "  ".join("-" * w for w in widths))
    return lines


# ---- commands ------------------------------------------------------------------------


def _target(args: argparse.Namespace) -> tuple[PersistClient, str]:
    """The store and the txns shard id: given, or (just a database URL) from its root record."""
    client = open_store(args.url)
    if args.txns_id is not None:
        return client, parse_txns_id(args.txns_id)
    return client, txns_id_of(client, args.url)


def _names(args: argparse.Namespace) -> dict[str, str]:
    """Data shard id -> table name, when the command was given a database URL (else none)."""
    if args.txns_id is not None:
        return {}
    from txns.db.commands import open_db

    db = open_db(args.url)
    try:
        return table_names(db)
    finally:
        db.close()


def cmd_inspect(args: argparse.Namespace, out: TextIO) -> int:
    client, txns_id = _target(args)
    j = read_txns(client, txns_id).to_json(args.url)
    names = _names(args)
    if names:
        j["tables"] = {name: d for d, name in sorted(names.items()) if not name.startswith("(")}
    if args.json:
        out.write(json.dumps(j, indent=2, sort_keys=True) + "\n")
    else:
        out.write(render_inspect(j, names) + "\n")
    return EXIT_OK


def cmd_apply(args: argparse.Namespace, out: TextIO) -> int:
    client, txns_id = _target(args)
    with open_handle(client, txns_id) as handle:
        r = apply_and_tidy(handle)
    if args.json:
        out.write(json.dumps(r, indent=2, sort_keys=True) + "\n")
        return EXIT_OK
    if r["applied"]:
        lo, hi = r["commit_ts"]
        out.write(f"applied {r['applied']} entries (commit ts {lo}..{hi}) to {r['data_shards']} data shards\n")
    else:
        out.write("nothing to apply: every committed write is applied\n")
    if r["tidied"]:
        out.write(f"tidied {r['tidied']} entries with a commit at ts {r['tidy_ts']}\n")
    else:
        out.write("nothing to tidy\n")
    out.write(f"txns upper {r['upper']}\n")
    return EXIT_OK


def cmd_compact(args: argparse.Namespace, out: TextIO) -> int:
    client, txns_id = _target(args)
    txns_state(client, txns_id)  # fail fast, before starting Spark
    if args.table and args.txns_id is not None:
        raise UsageError("--table names tables of a database: give its URL without a TXNS_ID")
    spark, own = None, False
    if args.spark:
        from pyspark.sql import SparkSession

        from txns.demo import spark_session
        from txns.spark import check_url

        check_url(client.url)
        own = SparkSession.getActiveSession() is None  # stop only a session we started
        spark = spark_session(args.master)
    try:
        if args.txns_id is None:
            # a database: retention holds, then its tables compacted whole (see Database.compact)
            merge = None
            if spark is not None:
                from txns.spark import compact_tables

                session = spark

                def merge(db: Any) -> dict[str, dict[str, Any]]:
                    return compact_tables(session, db, args.table)

            compact_db(args.url, out, args.json, tables=args.table, merge=merge)
            return EXIT_OK
        r = compact_txns(client, txns_id, spark)
    finally:
        if spark is not None and own:
            spark.stop()
    t = r["txns"]
    out.write(f"txns shard {txns_id}: critical since {t['since']} (upper {t['upper']})\n")
    out.write(f"txns shard {txns_id}: {t['compactions']} compactions\n")
    for d, c in r["data"].items():
        before, after = c["before"], c["after"]
        out.write(
            f"data shard {d}: {before['batches']} -> {after['batches']} batches, "
            f"{before['rows']} -> {after['rows']} rows ({c['how']}, since {after['since']})\n"
        )
    return EXIT_OK


def cmd_gc(args: argparse.Namespace, out: TextIO) -> int:
    if not math.isfinite(args.older_than) or args.older_than < 0:
        raise CliError(f"--older-than must be a number of seconds >= 0, got {args.older_than}")
    client, txns_id = _target(args)
    r = collect_garbage(client, txns_id, args.older_than)
    names = _names(args)
    keep: dict[str, set[str]] = {}
    for e in read_txns(client, txns_id, with_data=False).entries:
        keep.setdefault(e.data_id, set()).update(e.parts)
    for sid, s in r.items():
        if names.get(sid):
            s["table"] = names[sid]
        if not s["retired"] and not s["leaked"]:
            s["why_nothing_deleted"] = gc_reason(client, sid, args.older_than, keep.get(sid, set()))
    if args.json:
        out.write(json.dumps(r, indent=2, sort_keys=True) + "\n")
        return EXIT_OK
    for sid, s in r.items():
        label = f"{s['kind']} shard {sid}" + (f" ({s['table']})" if "table" in s else "")
        out.write(
            f"{label}: deleted {s['retired']} retired parts, {s['leaked']} leaked parts; "
            f"truncated {s['versions']} consensus versions; kept {s['kept']} parts of unapplied entries\n"
        )
        if "why_nothing_deleted" in s:
            out.write(f"  nothing deleted: {s['why_nothing_deleted']}\n")
    return EXIT_OK


def cmd_check_store(args: argparse.Namespace, out: TextIO) -> int:
    """Probe a store's conditional writes (:mod:`persist.check_store`); exit 1 if any check failed."""
    from persist.check_store import check_store

    report = check_store(
        args.url, racers=args.racers, race_keys=args.keys, match_rounds=args.rounds, sustain_s=args.seconds
    )
    if args.json:
        out.write(json.dumps(report.to_json(), indent=2, sort_keys=True) + "\n")
    else:
        out.write(report.table() + "\n")
    return EXIT_OK if report.ok else EXIT_FAILED


def cmd_sql(args: argparse.Namespace, out: TextIO) -> int:
    """``txns sql URL QUERY``: DuckDB over the database's tables, all as of one time (see :mod:`txns.duckdb`)."""
    from txns.duckdb import EngineNotInstalled, load_duckdb

    try:
        duckdb = load_duckdb()
    except EngineNotInstalled as e:
        raise CliError(str(e)) from None
    db = open_db(args.url)
    try:
        as_of = db.timestamp(parse_as_of(args.as_of))
        try:
            rel = db.sql(args.query, as_of=as_of)
            table = rel.arrow()
        except (duckdb.ParserException, duckdb.BinderException, duckdb.CatalogException) as e:
            raise CliError(f"DuckDB refused the query: {e}") from None
        if isinstance(table, pa.RecordBatchReader):
            table = table.read_all()
    finally:
        db.close()
    names = list(table.schema.names)
    records = table.to_pylist()
    if args.json:
        doc = {"as_of": as_of, "time": _when(as_of), "columns": names, "rows": records, "total_rows": len(records)}
        out.write(json.dumps(doc, indent=2, sort_keys=True, default=str) + "\n")
    elif args.csv:
        w = csv.writer(out, lineterminator="\n")
        w.writerow(names)
        w.writerows([["" if v is None else v for v in r.values()] for r in records])
    else:
        out.write(f"{len(records)} rows as of {_when(as_of)} (ts {as_of})\n")
        if names:
            cells = [names] + [[_cell(v) for v in r.values()] for r in records]
            out.write("\n".join(_grid(cells)) + "\n")
    return 0


def cmd_demo(args: argparse.Namespace, out: TextIO) -> int:
    from txns.demo import run_demo

    if args.txns < 1:
        raise CliError(f"--txns must be at least 1, got {args.txns}")
    return run_demo(args.dir, n_txns=args.txns, master=args.master, out=out, err=sys.stderr, spark=args.spark)


# ---- entry point -----------------------------------------------------------------------


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("txns")
    except PackageNotFoundError:
        return "unknown"


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog="txns",
        description="Atomic multi-table transactions on object storage: operator tools and a demo.",
    )
    p.add_argument("--version", action="version", version=f"txns {_version()}")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    d = sub.add_parser("demo", help="a database of three tables on a local directory, used end to end (no server)")
    d.add_argument("--dir", default="./txns-demo", help="directory of the database (default ./txns-demo)")
    d.add_argument("--txns", type=int, default=300, help="number of transfer transactions (default 300)")
    d.add_argument("--spark", action="store_true", help="also read a table as a Spark DataFrame (needs Java 17)")
    d.add_argument("--master", default="local[2]", help="Spark master for --spark (default local[2])")
    d.set_defaults(func=cmd_demo)

    add_commands(sub)

    q = sub.add_parser("sql", help="run a SQL query (DuckDB) over the database's tables, all as of one time")
    q.add_argument("url", metavar="URL")
    q.add_argument("query", metavar="QUERY", help='e.g. "SELECT sum(balance) FROM accounts"')
    q.add_argument("--as-of", default=None, metavar="T", help="a timestamp or an ISO datetime (default: latest)")
    fmt = q.add_mutually_exclusive_group()
    fmt.add_argument("--json", action="store_true", help="print JSON")
    fmt.add_argument("--csv", action="store_true", help="print CSV (a header, then the rows)")
    q.set_defaults(func=cmd_sql)

    def target(sp: argparse.ArgumentParser) -> None:
        sp.add_argument("url", metavar="URL", help=f"store URL: {' or '.join(accepted_forms(shared_only=True))}")
        sp.add_argument(
            "txns_id",
            metavar="TXNS_ID",
            nargs="?",
            default=None,
            help="the txns shard id (s + 32 hex digits); omit it for a database (found by its URL)",
        )

    i = sub.add_parser("inspect", help="show a txns shard, its data shards and unapplied entries")
    target(i)
    i.add_argument("--json", action="store_true", help="print a stable JSON dict instead")
    i.set_defaults(func=cmd_inspect)

    a = sub.add_parser("apply", help="apply everything committed, then tidy the applied entries")
    target(a)
    a.add_argument("--json", action="store_true", help="print JSON")
    a.set_defaults(func=cmd_apply)

    c = sub.add_parser("compact", help="advance the txns since and compact every registered data shard")
    target(c)
    c.add_argument("--spark", action="store_true", help="compact data shards with a Spark job")
    c.add_argument(
        "--table", action="append", metavar="NAME", help="only this table of a database (repeatable; default: all)"
    )
    c.add_argument("--master", default="local[2]", help="Spark master for --spark (default local[2])")
    c.add_argument("--json", action="store_true", help="print JSON (database URL only)")
    c.set_defaults(func=cmd_compact)

    g = sub.add_parser("gc", help="delete retired and leaked parts, truncate old consensus versions")
    target(g)
    g.add_argument(
        "--older-than",
        type=float,
        default=DEFAULT_GC_OLDER_THAN_S,
        metavar="SECONDS",
        help="delete unreferenced parts older than this (default 86400: longer than any write takes)",
    )
    g.add_argument("--json", action="store_true", help="print JSON")
    g.set_defaults(func=cmd_gc)

    k = sub.add_parser(
        "check-store",
        help="probe a store's conditional writes (enforced? atomic under races?) before trusting it; exit 1 if not",
    )
    k.add_argument("url", metavar="URL", help=f"store URL: {' or '.join(accepted_forms(shared_only=True))}")
    k.add_argument("--racers", type=int, default=8, help="concurrent writers per race (default 8)")
    k.add_argument("--keys", type=int, default=24, help="fresh keys raced with If-None-Match (default 24)")
    k.add_argument("--rounds", type=int, default=12, help="versions of one key raced with If-Match (default 12)")
    k.add_argument(
        "--seconds", type=float, default=2.0, help="how long to measure conditional PUTs/s on one key (default 2)"
    )
    k.add_argument("--json", action="store_true", help="print JSON")
    k.set_defaults(func=cmd_check_store)
    return p


def main(argv: Sequence[str] | None = None, out: TextIO | None = None, err: TextIO | None = None) -> int:
    """Run the ``txns`` command with ``argv`` (default ``sys.argv[1:]``); return the exit status.

    Errors print one line on ``err``; with ``--json`` also one JSON document
    on ``out``: ``{"error": {"type", "message", "exit_status"}, "command"}``
    (so a script reading ``out`` always gets one document).
    """
    out = out or sys.stdout
    err = err or sys.stderr
    argv = list(sys.argv[1:] if argv is None else argv)
    as_json = "--json" in argv
    command = next((a for a in argv if not a.startswith("-")), None)
    parser = build_parser()

    def fail(status: int, kind: str, line: str) -> int:
        err.write(line + "\n")
        if as_json:
            doc = {"command": command, "error": {"type": kind, "message": line, "exit_status": status}}
            out.write(json.dumps(doc, indent=2, sort_keys=True) + "\n")
        return status

    try:
        args = parser.parse_args(argv)
    except _ArgumentError as e:  # as argparse prints it: the usage, then the error
        e.parser.print_usage(err)
        return fail(EXIT_USAGE, "UsageError", f"{e.parser.prog}: error: {e.message}")
    except SystemExit as e:  # --help, --version: argparse has printed them
        return int(e.code or 0)
    command = args.command
    try:
        url = getattr(args, "url", None)
        if url is not None:
            _check_shared(url)
        return int(args.func(args, out))
    except (CliError, UsageError) as e:
        return fail(EXIT_USAGE, type(e).__name__, f"txns {args.command}: {e}")
    except InvalidUsage as e:  # bad input: a bad URL, a missing bucket, a wrong schema...
        if os.environ.get("TXNS_DEBUG"):
            raise
        return fail(EXIT_USAGE, type(e).__name__, f"txns {args.command}: {e}")
    except PersistError as e:  # storage failures, timeouts: safe to run the command again
        if os.environ.get("TXNS_DEBUG"):
            raise
        return fail(EXIT_FAILED, type(e).__name__, f"txns {args.command}: {type(e).__name__}: {e} (safe to run again)")
    except KeyboardInterrupt:
        return fail(130, "KeyboardInterrupt", f"txns {args.command}: interrupted")
    except Exception as e:  # one line, not a traceback, unless asked
        if os.environ.get("TXNS_DEBUG"):
            raise
        return fail(
            EXIT_FAILED,
            type(e).__name__,
            f"txns {args.command}: unexpected {type(e).__name__}: {e} (set TXNS_DEBUG=1 for a traceback)",
        )


def _check_shared(url: str) -> None:
    """CliError for a URL of storage that lives in one process (``mem://``): the command's would vanish with it."""
    try:
        scheme = validate_url(url)
    except InvalidUsage as e:
        raise CliError(str(e)) from None
    if scheme.process_local:
        raise CliError(
            f"{redact(url)!r} is in-process storage: it lives only as long as this command (a database "
            f"made there would vanish when it exits, and there is none to read); give a shared location: "
            f"{', '.join(accepted_forms(shared_only=True))}"
        )


def entry() -> None:
    """The ``txns`` command and ``python -m txns``: :func:`main`, then exit at once with its status.

    Everything a command does is durable or reported before :func:`main`
    returns, so the process flushes its output and ends with ``os._exit``,
    skipping interpreter finalization: pyarrow's native thread pools can
    abort a finishing process there (``terminate called without an active
    exception``, exit -6; apache/arrow#34314), which would turn a command
    that succeeded into a crash.
    """
    rc = main()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:  # noqa: BLE001 - a closed pipe: nothing more to say
            pass
    os._exit(rc)


__all__ = ["CliError", "TxnsView", "build_parser", "entry", "inspect_txns", "main", "render_inspect"]
