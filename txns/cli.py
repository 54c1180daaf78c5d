"""The ``txns`` command: an operator's tool for a txns shard, and a demo.

Usage (also ``python -m txns``)::

    txns demo    [--dir PATH] [--txns N]
    txns init    URL [--retention-days D] [--json]
    txns tables  URL [--as-of T] [--json]
    txns show    URL TABLE [--as-of T] [--limit N] [--json]
    txns history URL [--table T] [--limit N] [--json]
    txns inspect URL [TXNS_ID] [--json]
    txns apply   URL [TXNS_ID] [--json]
    txns compact URL [TXNS_ID] [--spark] [--master URL] [--json]
    txns gc      URL [TXNS_ID] [--older-than SECONDS] [--json]
    txns --version

``URL`` names the store (``file:///PATH``, ``s3://BUCKET/PREFIX?...``; see
:mod:`persist.url`). Given just a database's URL, the operator commands find
its txns shard in the root record (see :mod:`txns.db`); ``TXNS_ID`` (``s`` +
32 hex digits) names a txns shard directly, for stores made with the
low-level API. Only ``init`` and ``demo`` create a database.

Safety. Every operator command is safe to run at any time, alongside
writers, readers and other operators, because it only uses the protocol's
idempotent operations:

- ``inspect`` only reads (consensus heads and the txns shard's parts); it
  registers no reader and writes nothing.
- ``apply`` is ``apply_le`` (a data shard whose upper is already past a
  commit is skipped) plus a tidy commit, a compare-and-append at the current
  txns upper that retracts only entries present as of that upper (a lost
  race retries higher).
- ``compact`` is ``compact_to`` (never past an unapplied write) plus
  compactions that replace batches only if they are all still there.
- ``gc`` deletes only parts no state references: retired parts past their
  grace period, and unreferenced parts older than ``--older-than`` that are
  not pointed to by any entry of the txns shard (a committed, unapplied
  batch is referenced only from there).

Commands that need a txns shard never create one: an unknown id is an error.
Errors a user can fix (bad URL, unknown shard, missing bucket) print one
line to stderr and exit with status 2; storage failures print one line and
exit with status 1 (every command is safe to run again). Set
``TXNS_DEBUG=1`` for tracebacks.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TextIO

from persist import Batch, InvalidUsage, PersistClient, PersistError, ShardId, ShardState, replan
from persist.url import accepted_forms, local_path, redact
from txns.commits import commits_shard_id
from txns.db.commands import UsageError, add_commands, compact_db, gc_reason, table_names, txns_id_of
from txns.entries import TXNS_SCHEMA, Entry
from txns.errors import TimestampUnavailable
from txns.handle import TxnsHandle
from txns.txn import Tidy

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2

DEFAULT_GC_OLDER_THAN_S = 24 * 3600.0


class CliError(Exception):
    """A problem the user can fix; printed as one line, exit status 2."""


# ---- reading a txns shard (read-only) ------------------------------------------------


@dataclass(frozen=True)
class EntryInfo:
    """One append entry present in the txns shard."""

    data_id: str
    commit_ts: int
    rows: int
    parts: tuple[str, ...]
    batch_id: str
    applied: bool


@dataclass(frozen=True)
class TxnsView:
    """A txns shard as read at one moment: its state, registrations and present entries."""

    txns_id: str
    upper: int
    since: int
    registered: dict[str, int]  # data shard id -> register ts
    entries: tuple[EntryInfo, ...]
    data: dict[str, dict[str, Any]]  # data shard id -> PersistClient.inspect(...)

    def to_json(self, url: str) -> dict[str, Any]:
        """The stable dict of ``txns inspect --json`` (see :func:`inspect_txns`)."""
        shards = {}
        for d in sorted(set(self.registered) | {e.data_id for e in self.entries}):
            info = self.data.get(d, {})
            reg = self.registered.get(d)
            shards[d] = {
                "registered": reg is not None,
                "register_ts": reg,
                "physical_upper": info.get("upper"),
                "logical_upper": self.upper if reg is not None else info.get("upper"),
                "since": info.get("since"),
                "batches": info.get("batches"),
                "rows": info.get("rows"),
                "parts": info.get("parts"),
                "bytes": info.get("bytes"),
            }
        return {
            "url": redact(url),
            "txns_id": self.txns_id,
            "upper": self.upper,
            "since": self.since,
            "registered": {d: {"register_ts": ts} for d, ts in sorted(self.registered.items())},
            "commits_shard": commits_shard_id(self.txns_id),
            "entries": [
                {
                    "data_id": e.data_id,
                    "commit_ts": e.commit_ts,
                    "rows": e.rows,
                    "parts": len(e.parts),
                    "batch_id": e.batch_id,
                    "applied": e.applied,
                }
                for e in self.entries
            ],
            "unapplied": sum(1 for e in self.entries if not e.applied),
            "data_shards": shards,
        }


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


def _txns_state(client: PersistClient, txns_id: str) -> ShardState:
    state = client.shard(txns_id).fetch()
    if state.seqno is None or state.schema is None:
        raise CliError(
            f"no txns shard {txns_id} at {redact(client.url)!r}; check the id and the URL "
            f"(txns shards are created by TxnsHandle.open, not by this tool)"
        )
    if state.schema != TXNS_SCHEMA.to_text():
        raise CliError(f"shard {txns_id} at {redact(client.url)!r} is a data shard, not a txns shard")
    return state


def read_txns(client: PersistClient, txns_id: str, with_data: bool = True) -> TxnsView:
    """Read the txns shard ``txns_id`` (and its data shards' states) without writing anything.

    The txns shard is read as a snapshot at ``upper - 1``: what remains is
    the current registrations and the append entries not yet tidied. Each
    entry is ``applied`` iff its data shard's physical upper is past its
    commit time. CliError if there is no txns shard with that id.
    """
    shard = client.shard(txns_id)
    state = _txns_state(client, txns_id)

    def read() -> tuple[ShardState, list[Any]]:
        # a part retired by compaction after we read the state: the retry reads it again
        current = shard.state()
        if current.upper == 0:
            return current, []
        return current, shard.fetch_plan(shard.plan(TXNS_SCHEMA, current.upper - 1, current))

    state, updates = replan(read)
    registered: dict[str, int] = {}
    raw: list[Entry] = []
    for (key, val), _ts, diff in updates:
        e = Entry.from_kv(key, val)
        if diff <= 0:
            continue
        if e.is_registration:
            registered[e.data_id] = e.ts
        else:
            raw.extend([e] * diff)
    data: dict[str, dict[str, Any]] = {}
    if with_data:
        for d in sorted(set(registered) | {e.data_id for e in raw}):
            data[d] = client.inspect(d)
    entries = []
    for e in sorted(raw):
        b = Batch.from_bytes(e.batch)
        upper = data.get(e.data_id, {}).get("upper")
        entries.append(
            EntryInfo(
                data_id=e.data_id,
                commit_ts=e.ts,
                rows=b.rows,
                parts=tuple(p.key for p in b.parts),
                batch_id=b.id,
                applied=upper is not None and upper > e.ts,
            )
        )
    return TxnsView(txns_id, state.upper, state.since, registered, tuple(entries), data)


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


# ---- handles for the commands that write ---------------------------------------------


@contextlib.contextmanager
def open_handle(client: PersistClient, txns_id: str) -> Iterator[TxnsHandle]:
    """A TxnsHandle on an existing txns shard; its leased reader is released on exit."""
    _txns_state(client, txns_id)
    # No hold: a killed command holds back no compaction of the txns shard.
    handle = TxnsHandle.open(client, txns_id, hold=False)
    try:
        yield handle
    finally:
        with contextlib.suppress(PersistError):
            handle.close()


def apply_and_tidy(handle: TxnsHandle) -> dict[str, Any]:
    """Apply everything committed, then retract the applied entries with one commit.

    The tidy commit goes at the current txns upper; when another writer takes
    that time first it retries at the new upper (entries it tidied meanwhile
    are left out). Returns counts for the report.
    """
    handle.cache.sync()
    upper = handle.cache.frontier
    if upper == 0:
        return {"applied": 0, "tidied": 0, "tidy_ts": None, "upper": 0, "data_shards": 0}
    uppers: dict[str, int] = {}
    pending = []
    for e in handle.cache.entries_le(upper - 1):
        if e.data_id not in uppers:
            uppers[e.data_id] = handle.data_writer(e.data_id).fetch_recent_upper()
        if uppers[e.data_id] <= e.ts:
            pending.append(e)
    tidy = handle.apply_le(upper - 1)
    tidied, tidy_ts = 0, None
    while True:
        handle.cache.sync()
        present = Tidy({e for e in tidy.entries if handle.cache.present(e)})
        if not present:
            break
        ts = handle.cache.frontier
        n = len(present)
        try:
            handle.tidy_at(ts, present)
        except TimestampUnavailable:
            continue  # someone committed at ts first: retry at the new upper
        tidied, tidy_ts = n, ts
        break
    handle.cache.sync()
    return {
        "applied": len(pending),
        "data_shards": len({e.data_id for e in pending}),
        "commit_ts": [min((e.ts for e in pending), default=None), max((e.ts for e in pending), default=None)],
        "tidied": tidied,
        "tidy_ts": tidy_ts,
        "upper": handle.cache.frontier,
    }


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
    _txns_state(client, txns_id)  # fail fast, before starting Spark
    if args.txns_id is None and not args.spark:
        # a database: retention holds, then every table compacted whole (see Database.compact)
        compact_db(args.url, out, args.json)
        return EXIT_OK
    spark, own = None, False
    if args.spark:
        from pyspark.sql import SparkSession

        from txns.demo import spark_session
        from txns.spark import check_url

        check_url(client.url)
        own = SparkSession.getActiveSession() is None  # stop only a session we started
        spark = spark_session(args.master)
    try:
        _compact(client, txns_id, spark, out)
    finally:
        if spark is not None and own:
            spark.stop()
    return EXIT_OK


def _compact(client: PersistClient, txns_id: str, spark: SparkSession | None, out: TextIO) -> None:
    with open_handle(client, txns_id) as handle:
        handle.cache.sync()
        upper = handle.cache.frontier
        since = handle.compact_to(upper - 1) if upper > 0 else 0
        out.write(f"txns shard {txns_id}: critical since {since} (upper {upper})\n")
        handle.writer.shard.fetch()
        n = _compact_until_done(handle.writer.compact)
        out.write(f"txns shard {txns_id}: {n} compactions\n")
        for d in sorted(handle.cache.registered_now()):
            w = handle.data_writer(d)
            w.shard.fetch()
            before = client.inspect(d)
            if spark is not None:
                import txns.spark as tspark

                res = tspark.compact(spark, client.url, d)
                how = "spark" if res is None or res.applied else "spark; lost a race to another compaction"
            else:
                _compact_until_done(w.compact)
                how = "in-process"
            after = client.inspect(d)
            out.write(
                f"data shard {d}: {before['batches']} -> {after['batches']} batches, "
                f"{before['rows']} -> {after['rows']} rows ({how}, since {after['since']})\n"
            )


def _compact_until_done(compact: Callable[[], int], limit: int = 64) -> int:
    """Run a ``WriteHandle.compact`` until the policy asks for nothing more."""
    total = 0
    for _ in range(limit):
        n = compact()
        total += n
        if n == 0:
            break
    return total


def cmd_gc(args: argparse.Namespace, out: TextIO) -> int:
    if args.older_than < 0:
        raise CliError(f"--older-than must be >= 0 seconds, got {args.older_than}")
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


def collect_garbage(client: PersistClient, txns_id: str, older_than_s: float) -> dict[str, dict[str, Any]]:
    """GC the txns shard and every data shard it knows: retired parts, old versions, leaked parts.

    SUBTLE: the txns shard is read *before* any data shard is listed. A batch
    committed after that read and applied before its data shard is listed is
    referenced by the data shard's state; one committed later still must have
    been written less than ``older_than_s`` ago (the caller's contract), so
    the age threshold keeps it.
    """
    view = read_txns(client, txns_id, with_data=False)
    keep: dict[str, set[str]] = {}
    kept: dict[str, int] = {}
    for e in view.entries:
        keep.setdefault(e.data_id, set()).update(e.parts)
        if not e.applied:
            kept[e.data_id] = kept.get(e.data_id, 0) + len(e.parts)
    result: dict[str, dict[str, Any]] = {}
    shards = [(txns_id, "txns")] + [(d, "data") for d in sorted(set(view.registered) | set(keep))]
    for sid, kind in shards:
        schema = TXNS_SCHEMA if kind == "txns" else client.shard_schema(sid)
        if schema is None:
            continue
        w = client.open_writer(sid, schema)
        w.shard.fetch()
        retired = w.collect_garbage()
        w.shard.fetch()
        versions = w.shard.truncate_old_versions()
        leaked = client.gc_leaked(sid, older_than_s, keep=keep.get(sid, set()))
        result[sid] = {
            "kind": kind,
            "retired": retired,
            "versions": versions,
            "leaked": leaked,
            "kept": kept.get(sid, 0),
        }
    return result


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
    p = argparse.ArgumentParser(
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
    return p


def main(argv: Sequence[str] | None = None, out: TextIO | None = None, err: TextIO | None = None) -> int:
    """Run the ``txns`` command with ``argv`` (default ``sys.argv[1:]``); return the exit status."""
    out = out or sys.stdout
    err = err or sys.stderr
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:  # argparse has printed usage and the error
        return int(e.code or 0)
    try:
        return int(args.func(args, out))
    except (CliError, UsageError) as e:
        err.write(f"txns {args.command}: {e}\n")
        return EXIT_USAGE
    except InvalidUsage as e:  # bad input: a bad URL, a missing bucket, a wrong schema...
        if os.environ.get("TXNS_DEBUG"):
            raise
        err.write(f"txns {args.command}: {e}\n")
        return EXIT_USAGE
    except PersistError as e:  # storage failures, timeouts: safe to run the command again
        if os.environ.get("TXNS_DEBUG"):
            raise
        err.write(f"txns {args.command}: {type(e).__name__}: {e} (safe to run again)\n")
        return EXIT_FAILED
    except KeyboardInterrupt:
        err.write(f"txns {args.command}: interrupted\n")
        return 130
    except Exception as e:  # one line, not a traceback, unless asked
        if os.environ.get("TXNS_DEBUG"):
            raise
        err.write(f"txns {args.command}: unexpected {type(e).__name__}: {e} (set TXNS_DEBUG=1 for a traceback)\n")
        return EXIT_FAILED


__all__ = [
    "CliError",
    "TxnsView",
    "apply_and_tidy",
    "build_parser",
    "collect_garbage",
    "inspect_txns",
    "main",
    "read_txns",
    "render_inspect",
]
