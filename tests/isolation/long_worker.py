"""Processes of the long-lived-reader runs (issue #25): writers, readers that keep one handle, a maintainer.

Run as::

    python -m tests.isolation.long_worker ROLE --url URL --out PATH --seed N --process NAME
        --stop-file PATH [--seconds S] [--plant stale|mixed] [--idle-s S]

Every process opens the database once (``txns.connect(url, create=False,
config=tight_config())``) and keeps that handle until it stops (at
``--seconds`` or once ``--stop-file`` exists); each appends JSON records to
``--out`` (:class:`tests.isolation.proc_worker.Recorder`: one fsynced write
per record, so a SIGKILL loses at most a torn last line), the first one
``ready`` once connected (the driver starts the clock when all are).

Roles (table :data:`TABLE`: ``id`` string primary key, ``v`` int64):

- ``writer``: in phases (:data:`WRITE_S` of commits, then :data:`PAUSE_S`
  with its handle closed, every writer in step, as jobs that end and start
  again), transactions through ``db.run``, each inserting one new row
  (ids ``p<process>-<n>`` are never deleted, ``r<process>-<n>`` may be) and,
  two times in five, deleting one of its own live ``r`` rows; metadata
  ``{"op": ID}``. Records ``invoke`` (before ``db.run``, with the rows) and
  ``complete`` (after: ``ok`` with the commit time, ``fail`` or ``info``).
- ``reader``: the long-lived handle. Sleeps (up to ``--idle-s``, one time in
  twenty, and always with ``--idle-s 0``, 1.1-2 times its txns cache's reader
  lease, so the lease lapses while it is idle; then, half of the time with
  ``--idle-s 0``, waits for the writers' next pause, as issue #25's parent
  did), then reads the table latest (``to_arrow()``) or ``as_of`` a time
  up to 3 s back (or a commit time from ``db.history``), recording the
  interval, the count and digest (:func:`tests.isolation.read_checker.digest`)
  and the rows. Counts how often its txns cache restarted (lease lapses).
  ``--plant`` makes it a *planted* reader, the checker's negative control:
  ``stale`` serves latest reads from its own first result (a stale cache),
  ``mixed`` drops one never-deleted row it read first (a state that never
  existed).
- ``maintainer``: ``db.compact()`` (retention holds, compaction of every
  table and the catalog, release of dropped tables) every ``--idle-s``.

Every process also counts, through the ``counted+`` URL schemes registered
here (:func:`register_counted`), the parts its garbage collection deleted
and the consensus versions it truncated, and reports them in its final
``done`` record with its other counts.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import random
import sys
import threading
import time
import traceback
from collections import Counter
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa

import txns
from persist import Determinate, Indeterminate, PersistConfig, PersistError, ReadBelowSince
from persist.location import Blob, Consensus
from persist.unreliable import CountingBlob, CountingConsensus
from persist.url import Location, LocationURL, open_location, register_scheme
from tests.isolation.proc_worker import Recorder
from tests.isolation.read_checker import Commit, TableRead, digest, rows_of
from txns.db import clock

TABLE = "events"
SCHEMA = pa.schema([("id", pa.string()), ("v", pa.int64())])
RETENTION = dt.timedelta(seconds=5)
ROWS_RECORDED_MAX = 20_000
"""A read records its rows when it has at most this many (the report's diff); always its digest."""
CONNECT_LIMIT_S = 60.0


def tight_config() -> PersistConfig:
    """The persist windows of these runs: short enough that GC, truncation and lease lapses happen in seconds.

    Every process of a run uses exactly this (persist's truncation rule
    assumes every process of a shard has the same retention). Batches are
    written as parts (no inline rows), so compaction retires parts and GC
    deletes them.
    """
    return PersistConfig(
        part_grace_s=1.0,
        consensus_retention_s=4.0,
        reader_lease_s=3.0,
        gc_every_versions=4,
        inline_max_bytes=0,
        read_wait_s=5.0,
    )


# ---- counting GC and truncation, by URL ------------------------------------------------------

COUNTS: Counter[str] = Counter()
_counts_lock = threading.Lock()


def _count(name: str, n: int = 1) -> None:
    with _counts_lock:
        COUNTS[name] += n


class _GcBlob(CountingBlob):
    def delete(self, key: str) -> None:
        super().delete(key)
        if "/parts/" in key:
            _count("parts_deleted")


class _GcConsensus(CountingConsensus):
    def truncate(self, key: str, seqno: int) -> int:
        n = super().truncate(key, seqno)
        _count("versions_truncated", n)
        return n


def _open_counted(u: LocationURL) -> Location:
    inner = open_location(u.url[len("counted+") :])
    blob: Blob = _GcBlob(inner.blob)
    consensus: Consensus = _GcConsensus(inner.consensus)
    return Location(u.url, blob, consensus)


def register_counted() -> None:
    """Register ``counted+file://`` and ``counted+s3://``: the store, counting part deletes and truncated versions."""
    for inner in ("file", "s3"):
        register_scheme(f"counted+{inner}", _open_counted, forms=f"counted+{inner}://...", replace=True)


register_counted()


# ---- the roles ---------------------------------------------------------------------------------


class _Proc:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.rec = Recorder(Path(args.out))
        self.rng = random.Random(f"{args.seed}-{args.process}")
        self.deadline = time.monotonic() + args.seconds
        self.parent = os.getppid()
        self.stats: Counter[str] = Counter()
        self.unexpected: list[str] = []

    def stopped(self) -> bool:
        return (
            time.monotonic() >= self.deadline
            or os.getppid() != self.parent
            or Path(self.args.stop_file).exists()
        )

    def sleep(self, s: float) -> None:
        end = time.monotonic() + s
        while not self.stopped() and time.monotonic() < end:
            time.sleep(min(0.05, max(0.0, end - time.monotonic())))

    def connect(self) -> txns.Database | None:
        limit = time.monotonic() + CONNECT_LIMIT_S
        while not self.stopped():
            try:
                return txns.connect(self.args.url, create=False, config=tight_config())
            except PersistError as e:
                self.stats[f"connect:{type(e).__name__}"] += 1
                if time.monotonic() > limit:
                    raise
                time.sleep(0.1)
        return None

    def surprise(self, what: str, e: BaseException) -> None:
        self.unexpected.append(f"{what}: {''.join(traceback.format_exception(e))[-2000:]}")
        print(f"UNEXPECTED {self.unexpected[-1]}", file=sys.stderr, flush=True)

    def done(self) -> None:
        with _counts_lock:
            counts = dict(COUNTS)
        self.rec.write(
            {"t": "done", "process": self.args.process, "stats": dict(self.stats), "counts": counts,
             "unexpected": self.unexpected}
        )  # fmt: skip
        self.rec.close()


WRITE_S, PAUSE_S = 5.0, 3.0
"""Writers run in phases: ``WRITE_S`` of commits, then ``PAUSE_S`` with their handles closed, all in step."""


def _paused() -> bool:
    return time.monotonic() % (WRITE_S + PAUSE_S) >= WRITE_S


def run_writer(p: _Proc, db: txns.Database) -> None:
    """(``db`` is closed during pauses, as a job process that ends would, and opened again after.)"""
    live: list[tuple[str, int]] = []  # this writer's deletable rows (as far as it knows)
    n = 0
    try:
        while not p.stopped():
            if _paused():
                # Between phases the log keeps the last entries untidied, and with every
                # writer's hold released the txns since moves up to them (issue #25's setting).
                db.close()
                while _paused() and not p.stopped():
                    p.sleep(0.05)
                reopened = p.connect()
                if reopened is None:
                    return
                db = reopened
                continue
            n += 1
            _write_one(p, db, n, live)
    finally:
        db.close()


def _write_one(p: _Proc, db: txns.Database, n: int, live: list[tuple[str, int]]) -> None:
    kind = "p" if p.rng.random() < 0.5 else "r"
    added = [(f"{kind}{p.args.process}-{n}", n)]
    deleted = [live.pop(p.rng.randrange(len(live)))] if live and p.rng.random() < 0.4 else []
    op = f"{p.args.process}-{n}"
    p.rec.write({"t": "invoke", "id": op, "process": p.args.process, "start": time.monotonic(),
                 "added": added, "deleted": deleted})  # fmt: skip

    def body(t: txns.Transaction) -> None:
        t.insert(TABLE, [{"id": i, "v": v} for i, v in added])
        if deleted:
            t.delete(TABLE, [(i,) for i, _ in deleted])

    out: dict[str, Any] = {"t": "complete", "id": op}
    try:
        info = db.run(body, metadata={"op": op})
        out.update(status="ok", ts=info.ts)
        if kind == "r":
            live.extend(added)
    except (txns.TransactionConflict, Determinate) as e:
        out.update(status="fail", error=f"{type(e).__name__}: {e}"[:300])
        live.extend(deleted)
    except Indeterminate as e:
        out.update(status="info", error=f"{type(e).__name__}: {e}"[:300])
    except Exception as e:  # noqa: BLE001 - recorded: the run fails on it
        out.update(status="info")
        p.surprise(f"writer {op}", e)
    out["end"] = time.monotonic()
    p.stats[out["status"]] += 1
    p.rec.write(out)


def run_reader(p: _Proc, db: txns.Database) -> None:
    lease = tight_config().reader_lease_s
    first: list[tuple[str, int]] | None = None  # a planted reader's stale cache
    n = 0
    cache_reader = _cache_reader_id(db)
    while not p.stopped():
        long_idle = p.args.idle_s <= 0 or p.rng.random() < 0.05
        p.sleep(p.rng.uniform(1.1 * lease, 2.0 * lease) if long_idle else p.rng.uniform(0, p.args.idle_s))
        if p.args.idle_s <= 0 and p.rng.random() < 0.5:
            # as in issue #25: read once the writers' phase has ended and the since has caught up
            while not (_paused() and time.monotonic() % (WRITE_S + PAUSE_S) >= WRITE_S + 1.0) and not p.stopped():
                p.sleep(0.05)
        if p.stopped():
            break
        n += 1
        as_of: int | None = None
        if p.rng.random() < 0.4:
            if p.rng.random() < 0.3:
                try:
                    times = db.history(limit=20).column("ts").to_pylist()
                    as_of = p.rng.choice(times) if times else None
                except PersistError as e:
                    p.stats[f"history:{type(e).__name__}"] += 1
            if as_of is None:  # (the last timestamp of a millisecond up to 3 s back, after the table's creation)
                ms = max(p.args.born_ms, clock_ms() - int(p.rng.uniform(0, 3000)))
                as_of = clock.ts_of_ms(ms) | ((1 << 20) - 1)
        start = time.monotonic()
        try:
            rows = rows_of(db.table(TABLE).to_arrow(as_of=as_of))
        except ReadBelowSince:
            p.stats["below-since"] += 1
            continue
        except PersistError as e:
            p.stats[f"read:{type(e).__name__}"] += 1
            continue
        except Exception as e:  # noqa: BLE001 - recorded: the run fails on it
            p.surprise("read", e)
            continue
        end = time.monotonic()
        if as_of is None and p.args.plant:
            if first is None:
                # (the mixed one waits for a never-deleted row to drop; the stale one for any row)
                if any(r[0].startswith("p") for r in rows) or (rows and p.args.plant == "stale"):
                    first = rows
            elif p.args.plant == "stale":
                rows = first
            else:
                keep = {r for r in first if r[0].startswith("p")}
                gone = next((r for r in rows if r in keep), None)
                rows = [r for r in rows if r != gone]
        now_reader = _cache_reader_id(db)
        if now_reader != cache_reader:
            p.stats["cache-restarts"] += 1
            cache_reader = now_reader
        count, h = digest(rows)
        p.stats["latest" if as_of is None else "as_of"] += 1
        p.rec.write(
            {"t": "read", "id": f"{p.args.process}-{n}", "process": p.args.process, "as_of": as_of,
             "start": start, "end": end, "count": count, "digest": h,
             "rows": rows if count <= ROWS_RECORDED_MAX else None}
        )  # fmt: skip


def _cache_reader_id(db: txns.Database) -> str | None:
    reader = db.handle.cache.reader
    return reader.reader_id if reader is not None else None


def clock_ms() -> int:
    return tight_config().clock_ms()


def run_maintainer(p: _Proc, db: txns.Database) -> None:
    while not p.stopped():
        p.sleep(p.rng.uniform(0.5, 1.5) * p.args.idle_s)
        if p.stopped():
            break
        try:
            report = db.compact()
            p.stats["compactions"] += 1
            for r in report.values():
                if isinstance(r, dict) and r.get("merged_all"):
                    p.stats["tables-merged-whole"] += 1
        except PersistError as e:
            p.stats[f"compact:{type(e).__name__}"] += 1
        except Exception as e:  # noqa: BLE001 - recorded: the run fails on it
            p.surprise("compact", e)


ROLES = {"writer": run_writer, "reader": run_reader, "maintainer": run_maintainer}


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("role", choices=sorted(ROLES))
    ap.add_argument("--url", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--process", required=True)
    ap.add_argument("--stop-file", required=True)
    ap.add_argument("--seconds", type=float, default=3600.0)
    ap.add_argument("--plant", choices=["stale", "mixed"], default=None)
    ap.add_argument("--idle-s", type=float, default=0.5)
    ap.add_argument("--born-ms", type=int, default=0, help="the table's creation (wall-clock ms): as_of reads after it")
    args = ap.parse_args(argv)
    p = _Proc(args)
    try:
        db = p.connect()
        if db is not None:
            p.rec.write({"t": "ready", "process": args.process})
            try:
                ROLES[args.role](p, db)
            finally:
                db.close()
    except Exception as e:  # noqa: BLE001 - recorded: the run fails on it
        p.surprise(args.role, e)
    p.done()
    return 0


# ---- loading ---------------------------------------------------------------------------------


def records(paths: Sequence[Path]) -> Iterator[dict[str, Any]]:
    from tests.isolation.proc_worker import read_records

    for path in paths:
        if path.exists():
            yield from read_records(path)


def load_commits(paths: Sequence[Path], history: dict[str, list[int]]) -> tuple[list[Commit], list[str]]:
    """The commits of the writers' files, timed by ``history`` (op id -> commit times); and what disagreed.

    An acknowledged op must be in history exactly once at the time it was
    told; a failed one must not be there; an unknown one (killed, or
    ``Indeterminate``) counts as committed iff history has it.
    """
    invokes: dict[str, dict[str, Any]] = {}
    completes: dict[str, dict[str, Any]] = {}
    for r in records(paths):
        if r.get("t") == "invoke":
            invokes[r["id"]] = r
        elif r.get("t") == "complete":
            completes[r["id"]] = r
    problems = [f"history names op {op!r}, which no writer invoked" for op in history if op not in invokes]
    commits = []
    for op, inv in invokes.items():
        done = completes.get(op)
        status = done["status"] if done is not None else "info"
        found = history.get(op, [])
        if len(found) > 1:
            problems.append(f"op {op!r} committed {len(found)} times: {found}")
        if status == "ok" and found != [done["ts"] if done else None]:
            problems.append(f"op {op!r} was acknowledged at {done['ts'] if done else None}, history says {found}")
        if status == "fail" and found:
            problems.append(f"op {op!r} failed ({done.get('error') if done else ''}) but history has it at {found}")
        if found:
            commits.append(
                Commit(
                    op, found[0],
                    tuple((i, v) for i, v in inv["added"]), tuple((i, v) for i, v in inv["deleted"]),
                    inv["start"], done["end"] if done is not None and status == "ok" else None,
                )
            )  # fmt: skip
    return commits, problems


def load_reads(paths: Sequence[Path]) -> list[TableRead]:
    out = []
    for r in records(paths):
        if r.get("t") == "read":
            rows = tuple((i, v) for i, v in r["rows"]) if r.get("rows") is not None else None
            out.append(
                TableRead(r["id"], r["process"], r["as_of"], r["start"], r["end"], r["count"], r["digest"], rows)
            )
    return out


if __name__ == "__main__":
    sys.exit(main())
