"""The chaos worker: commits bank transfers through a txns shard, following the documented retry rules.

Run as ``python -m tests.chaos.bank --url URL --txns-id ID --legs ID --ledger ID
--worker N --incarnation K --state-dir DIR [--mode run|finish] ...``. The
driver starts several, SIGKILLs them at random times and restarts them (same
worker number and files, next incarnation).

Each transfer ``f"w{worker}-{incarnation}-{n}"`` of ``amt`` from A to B is one
transaction writing

- ``legs``: ``(A, tid) -> (-amt)`` and ``(B, tid) -> (+amt)``, diff +1 each;
- ``ledger``: ``(tid) -> (A, B, amt, pad)``, diff +1, where about one in
  ``--pad-every`` transfers has ~20 KB of random ``pad`` so its batch is a
  Parquet part rather than inline.

The rules (README, persist/errors.py, txns/errors.py):

- commit at ``ts = handle.upper``; ``TimestampUnavailable``: the SAME txn at
  ``e.upper``; ``Determinate``: the SAME txn at a later time;
  ``Indeterminate``: the SAME txn again;
- before the first commit attempt, ``txn.to_bytes()`` is written durably
  (temp file, fsync, rename) as the *pending* file; once ``commit_at``
  returns, ``tid commit_ts`` is appended to the *acked* file (fsync) and the
  pending file is removed;
- a restarted worker first loads its pending file with ``Txn.from_bytes`` and
  commits it (unless its tid is already acked);
- sometimes it applies its commit, and sometimes the returned ``Tidy`` rides
  along on the next transaction.

Besides the driver's kills at random times, a worker kills itself (SIGKILL)
at chosen crash points with probability ``--crash-prob`` per transfer: after
``to_bytes`` before the pending file is written, after it before the first
commit attempt, after ``commit_at`` returned before the ack, and after the
ack before the pending file is removed. These are the windows the rules must
survive, hit far more often than random kills alone would.

In ``--mode finish`` it only commits its pending transaction (if any) and
exits. Exceptions are counted by phase and kind in a stats file (rewritten
atomically every second and at exit); problems the rules say cannot happen
(``InvalidUsage`` from the library, unexpected exceptions, a transaction
that cannot be committed within ``--stuck-after`` seconds) are recorded as
*violations*.

Exit status: 0 done; 3 a transaction could not be committed (a violation,
pending file left); 4 the driver went away; 5 could not open the store in time.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import random
import signal
import string
import sys
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa

from persist import (
    Determinate,
    Indeterminate,
    InvalidUsage,
    PersistClient,
    PersistConfig,
    PersistError,
    Schema,
    metrics,
)
from persist.errors import CorruptObject
from txns import Tidy, TimestampUnavailable, Txn, TxnApply, TxnsHandle
from txns.group_commit import GroupCommitFailed, GroupCommitter

LEGS_SCHEMA = Schema(
    key=pa.schema([("account", pa.string()), ("transfer_id", pa.string())]),
    val=pa.schema([("amount", pa.int64())]),
)
LEDGER_SCHEMA = Schema(
    key=pa.schema([("transfer_id", pa.string())]),
    val=pa.schema([("src", pa.string()), ("dst", pa.string()), ("amount", pa.int64()), ("pad", pa.string())]),
)
REGISTER_TS = 1
ACCOUNTS = tuple(f"acct-{i}" for i in range(8))
PAD_CHARS = 20_000

EXIT_OK = 0
EXIT_STUCK = 3
EXIT_ORPHANED = 4
EXIT_NO_STORE = 5

MAX_VIOLATION_EXAMPLES = 50
CRASH_POINTS = ("before_pending", "after_pending", "after_commit", "after_ack")
MAX_TO_BYTES_ATTEMPTS = 200
MAX_BUILD_ATTEMPTS = 200


# ---- configuration shared with the driver -------------------------------------------------


def worker_config(variant: str) -> PersistConfig:
    """The workers' persist config: short retries so faults surface; ``tight`` also ages data fast."""
    if variant == "default":
        return PersistConfig(retry_deadline_s=3.0, read_wait_s=5.0)
    if variant == "tight":
        return PersistConfig(
            retry_deadline_s=3.0,
            read_wait_s=5.0,
            part_grace_s=1.0,
            consensus_retention_s=4.0,
            reader_lease_s=6.0,
        )
    raise ValueError(f"unknown variant {variant!r} (default, tight)")


def pending_path(state_dir: Path, worker: int) -> Path:
    return state_dir / f"w{worker}.pending"


def acked_path(state_dir: Path, worker: int) -> Path:
    return state_dir / f"w{worker}.acked"


def stats_path(state_dir: Path, worker: int, incarnation: int, mode: str) -> Path:
    return state_dir / f"w{worker}.{incarnation}.{mode}.stats.json"


def read_acked(path: Path) -> list[tuple[str, int]]:
    """``(tid, commit_ts)`` lines of an acked file (a torn last line, from a kill mid-write, is skipped)."""
    out: list[tuple[str, int]] = []
    if not path.exists():
        return out
    for line in path.read_text().splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[1].isdigit():
            out.append((parts[0], int(parts[1])))
    return out


def fsync_dir(d: Path) -> None:
    fd = os.open(d, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_durably(path: Path, data: bytes) -> None:
    """Temp file, fsync, rename, fsync the directory."""
    tmp = path.with_name(path.name + f".tmp{os.getpid()}")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fsync_dir(path.parent)


def append_durably(path: Path, line: str) -> None:
    with open(path, "a", encoding="utf-8") as f:
        f.write(line)
        f.flush()
        os.fsync(f.fileno())


# ---- the worker -----------------------------------------------------------------------------


class Stuck(Exception):
    """A transaction could not be committed within the time allowed."""


class Orphaned(Exception):
    """The driver process went away."""


@dataclass
class Stats:
    worker: int
    incarnation: int
    mode: str
    started: float = field(default_factory=time.time)
    transfers_started: int = 0
    committed: int = 0
    commit_attempts: int = 0
    from_bytes_loaded: int = 0
    from_bytes_committed: int = 0
    pending_already_acked: int = 0
    abandoned: int = 0
    applies: int = 0
    tidies_attached: int = 0
    queued_commits: int = 0  # --group-commit: transactions that went through the queue
    grouped_by_this_sequencer: int = 0  # ... and how many this process committed as the sequencer
    open_s: float | None = None
    crashes: dict[str, int] = field(default_factory=dict)
    exceptions: dict[str, int] = field(default_factory=dict)
    violations: dict[str, int] = field(default_factory=dict)
    violation_examples: list[str] = field(default_factory=list)
    exit_status: int | None = None
    persist: dict[str, int] = field(default_factory=dict)
    """persist.metrics of this process (parts deleted, versions truncated, leases lapsed), as last saved."""

    def exception(self, phase: str, e: BaseException) -> None:
        key = f"{phase}:{type(e).__name__}"
        self.exceptions[key] = self.exceptions.get(key, 0) + 1

    def violation(self, kind: str, detail: str) -> None:
        self.violations[kind] = self.violations.get(kind, 0) + 1
        if len(self.violation_examples) < MAX_VIOLATION_EXAMPLES:
            self.violation_examples.append(f"{kind}: {detail}"[:2000])
        print(f"VIOLATION {kind}: {detail}", file=sys.stderr, flush=True)

    def to_json(self) -> dict[str, Any]:
        return dict(self.__dict__.items())


class Worker:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.state_dir = Path(args.state_dir)
        self.worker: int = args.worker
        self.incarnation: int = args.incarnation
        self.rng = random.Random(f"{args.seed}-{args.worker}-{args.incarnation}")
        self.stats = Stats(args.worker, args.incarnation, args.mode)
        self.stats_file = stats_path(self.state_dir, self.worker, self.incarnation, args.mode)
        self.pending_file = pending_path(self.state_dir, self.worker)
        self.acked_file = acked_path(self.state_dir, self.worker)
        self.parent = os.getppid()
        self.deadline = time.monotonic() + args.seconds
        self._last_stats = 0.0
        self.client: PersistClient | None = None
        self.handle: TxnsHandle | None = None
        self.tidy: Tidy | None = None
        self.crash_at: str | None = None  # the crash point drawn for the current transfer
        self.group: GroupCommitter | None = None  # with --group-commit (see commit)

    # ---- bookkeeping ----

    def save_stats(self, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self._last_stats < 1.0:
            return
        self._last_stats = now
        self.stats.persist = metrics.snapshot()
        tmp = self.stats_file.with_name(self.stats_file.name + ".tmp")
        tmp.write_text(json.dumps(self.stats.to_json(), sort_keys=True))
        os.replace(tmp, self.stats_file)

    def check_parent(self) -> None:
        if os.getppid() != self.parent:
            raise Orphaned()

    def maybe_crash(self, point: str) -> None:
        """SIGKILL this process at ``point`` if this transfer drew it."""
        if self.crash_at != point:
            return
        self.stats.crashes[point] = self.stats.crashes.get(point, 0) + 1
        self.save_stats(force=True)
        os.kill(os.getpid(), signal.SIGKILL)

    def pause(self, attempt: int) -> None:
        time.sleep(min(0.25, 0.01 * (2 ** min(attempt, 5))) * (0.5 + self.rng.random()))

    # ---- opening ----

    def open(self) -> TxnsHandle:
        """Client and txns handle, retrying storage failures for up to ``--open-limit`` seconds."""
        limit = time.monotonic() + self.args.open_limit
        attempt = 0
        while True:
            self.check_parent()
            try:
                if self.client is None:
                    self.client = PersistClient.open(self.args.url, worker_config(self.args.variant))
                return TxnsHandle.open(self.client, self.args.txns_id)
            except InvalidUsage as e:
                self.stats.exception("open", e)
                self.stats.violation("invalid_usage", f"opening: {e!r}")
                raise
            except PersistError as e:
                self.stats.exception("open", e)
                attempt += 1
                if time.monotonic() > limit:
                    raise
                self.pause(attempt)
            finally:
                self.save_stats()

    # ---- committing ----

    def commit(self, txn: Txn, tid: str, limit_s: float) -> TxnApply:
        """Commit ``txn`` following the rules; Stuck if it cannot within ``limit_s``."""
        h = self.handle
        assert h is not None
        limit = time.monotonic() + limit_s
        ts: int | None = None
        attempt = 0
        last: str = "no attempt"
        while True:
            self.check_parent()
            if time.monotonic() > limit:
                raise Stuck(f"transfer {tid} not committed after {limit_s:.0f}s; last error: {last}")
            attempt += 1
            if ts is None:
                # SUBTLE: ``handle.upper`` ("as this handle last saw it") may write
                # (the cache moves its since hold) and so raise storage errors
                try:
                    ts = h.upper
                except PersistError as e:
                    self.stats.exception("upper", e)
                    last = repr(e)
                    self.pause(attempt)
                    continue
            self.stats.commit_attempts += 1
            try:
                if self.args.group_commit:
                    # (the same txn again after any failure: it commits once, directly or from the queue)
                    if self.group is None:
                        # (most incarnations always queue, so sequencers are busy when they are killed)
                        direct = self.rng.random() < 0.3
                        self.group = GroupCommitter(h, direct=direct, lease_ms=1000, timeout_s=10.0)
                    try:
                        return self.group.commit(txn)
                    finally:
                        self.stats.queued_commits = self.group.queued
                        self.stats.grouped_by_this_sequencer = self.group.grouped
                return txn.commit_at(h, ts)
            except GroupCommitFailed as e:
                self.stats.exception("commit", e)
                self.stats.violation("uncommittable", f"group commit of {tid} failed: {e!r}")
                raise Stuck(f"transfer {tid}: {e!r}") from e
            except TimeoutError as e:  # queued, not committed yet: wait on the same txn again
                self.stats.exception("commit", e)
                last = repr(e)
            except TimestampUnavailable as e:
                self.stats.exception("commit", e)
                ts = e.upper  # the same txn at the upper
                last = repr(e)
                continue
            except Determinate as e:
                self.stats.exception("commit", e)
                ts += 1  # the same txn, later
                last = repr(e)
            except Indeterminate as e:
                self.stats.exception("commit", e)  # the same txn again
                last = repr(e)
            except InvalidUsage as e:
                # "can never succeed as given": the rules have no retry for it
                self.stats.exception("commit", e)
                self.stats.violation("uncommittable", f"commit_at of {tid} at {ts} raised {e!r}")
                raise Stuck(f"transfer {tid}: commit_at raised {e!r}") from e
            except CorruptObject as e:
                self.stats.exception("commit", e)
                self.stats.violation("corrupt", f"commit_at of {tid}: {e!r}")
                last = repr(e)
            except PersistError as e:  # ReadTimeout, LeaseExpired, ...: retry the same txn
                self.stats.exception("commit", e)
                last = repr(e)
            except Exception as e:  # noqa: BLE001 - a library bug: record it, keep to the rules
                self.stats.exception("commit", e)
                self.stats.violation("unexpected", f"commit_at of {tid}: {e!r}\n{traceback.format_exc(limit=8)}")
                last = repr(e)
            finally:
                self.save_stats()
            self.pause(attempt)

    def finish_commit(self, txn: Txn, tid: str, applied: TxnApply) -> None:
        self.maybe_crash("after_commit")
        append_durably(self.acked_file, f"{tid} {applied.commit_ts}\n")
        self.maybe_crash("after_ack")
        self.pending_file.unlink(missing_ok=True)
        fsync_dir(self.state_dir)
        self.stats.committed += 1
        if self.args.mode == "run" and self.rng.random() < self.args.apply_prob:
            assert self.handle is not None
            try:
                self.stats.applies += 1
                tidy = applied.apply(self.handle)
                if self.rng.random() < 0.5:
                    self.tidy = tidy
            except InvalidUsage as e:
                self.stats.exception("apply", e)
                self.stats.violation("invalid_usage", f"apply of {tid} at {applied.commit_ts}: {e!r}")
            except PersistError as e:
                self.stats.exception("apply", e)
            except Exception as e:  # noqa: BLE001
                self.stats.exception("apply", e)
                self.stats.violation("unexpected", f"apply of {tid}: {e!r}\n{traceback.format_exc(limit=8)}")
        self.save_stats(force=True)

    def resume_pending(self) -> None:
        """Commit the pending transaction left by an earlier incarnation, from its bytes."""
        if not self.pending_file.exists():
            return
        j = json.loads(self.pending_file.read_text())
        tid: str = j["tid"]
        if tid in {t for t, _ in read_acked(self.acked_file)}:
            # killed after the ack, before removing the pending file: done already
            self.stats.pending_already_acked += 1
            self.pending_file.unlink(missing_ok=True)
            fsync_dir(self.state_dir)
            return
        assert self.handle is not None
        self.stats.from_bytes_loaded += 1
        txn = Txn.from_bytes(base64.b64decode(j["txn"]), self.handle)
        applied = self.commit(txn, tid, self.args.stuck_after)
        self.stats.from_bytes_committed += 1
        self.finish_commit(txn, tid, applied)

    # ---- transfers ----

    def build(self, tid: str) -> Txn | None:
        """A transfer transaction, or None if a storage failure interrupted building it."""
        assert self.handle is not None
        src, dst = self.rng.sample(ACCOUNTS, 2)
        amt = self.rng.randint(1, 100)
        pad = ""
        if self.rng.randrange(self.args.pad_every) == 0:
            pad = "".join(self.rng.choices(string.ascii_letters + string.digits, k=PAD_CHARS))
        txn = self.handle.begin()
        try:
            txn.write(self.args.legs, (src, tid), (-amt,), 1)
            txn.write(self.args.legs, (dst, tid), (amt,), 1)
            txn.write(self.args.ledger, (tid,), (src, dst, amt, pad), 1)
        except InvalidUsage as e:
            self.stats.exception("write", e)
            self.stats.violation("invalid_usage", f"write of {tid}: {e!r}")
            return None
        except PersistError as e:  # first use of a shard reads its schema: nothing pending yet
            self.stats.exception("write", e)
            return None
        if self.tidy is not None and self.rng.random() < 0.5 and not self.args.group_commit:
            # (a queued transaction may be joined to another's write: it carries no tidy)
            txn.tidy(self.tidy)
            self.tidy = None
            self.stats.tidies_attached += 1
        return txn

    def serialize(self, txn: Txn, tid: str) -> bytes | None:
        """``txn.to_bytes()``, retrying storage failures on the SAME txn; None if it cannot be."""
        for attempt in range(1, MAX_TO_BYTES_ATTEMPTS + 1):
            self.check_parent()
            try:
                return txn.to_bytes()
            except InvalidUsage as e:
                self.stats.exception("to_bytes", e)
                self.stats.violation("uncommittable", f"to_bytes of {tid} (attempt {attempt}) raised {e!r}")
                return None
            except PersistError as e:
                self.stats.exception("to_bytes", e)
            except Exception as e:  # noqa: BLE001
                self.stats.exception("to_bytes", e)
                self.stats.violation("unexpected", f"to_bytes of {tid}: {e!r}\n{traceback.format_exc(limit=8)}")
                return None
            finally:
                self.save_stats()
            self.pause(attempt)
        self.stats.violation("uncommittable", f"to_bytes of {tid} failed {MAX_TO_BYTES_ATTEMPTS} times")
        return None

    def run(self) -> None:
        n = 0
        builds_failed = 0
        while time.monotonic() < self.deadline and n < self.args.max_transfers:
            self.check_parent()
            tid = f"w{self.worker}-{self.incarnation}-{n}"
            n += 1
            self.stats.transfers_started += 1
            self.crash_at = self.rng.choice(CRASH_POINTS) if self.rng.random() < self.args.crash_prob else None
            txn = self.build(tid)
            if txn is None:
                builds_failed += 1
                if builds_failed > MAX_BUILD_ATTEMPTS:
                    raise Stuck(f"could not build a transaction {MAX_BUILD_ATTEMPTS} times")
                self.pause(builds_failed)
                continue
            data = self.serialize(txn, tid)
            if data is None:
                self.stats.abandoned += 1
                continue
            self.maybe_crash("before_pending")
            write_durably(self.pending_file, json.dumps({"tid": tid, "txn": base64.b64encode(data).decode()}).encode())
            self.maybe_crash("after_pending")
            applied = self.commit(txn, tid, self.args.stuck_after)
            self.finish_commit(txn, tid, applied)
            if self.args.think_s > 0:
                time.sleep(self.rng.uniform(0, self.args.think_s))

    def main(self) -> int:
        try:
            t0 = time.monotonic()
            try:
                self.handle = self.open()
                self.stats.open_s = round(time.monotonic() - t0, 3)
            except PersistError as e:
                print(f"could not open the store: {e!r}", file=sys.stderr, flush=True)
                if self.args.mode == "finish":
                    self.stats.violation("uncommittable", f"finish mode could not open the store: {e!r}")
                return self.exit(EXIT_NO_STORE)
            self.resume_pending()
            if self.args.mode == "run":
                self.run()
            return self.exit(EXIT_OK)
        except Stuck as e:
            if self.args.mode == "finish":
                self.stats.violation("uncommittable", f"finish mode: {e}")
            else:
                self.stats.violation("stuck", str(e))
            return self.exit(EXIT_STUCK)
        except Orphaned:
            return self.exit(EXIT_ORPHANED)
        finally:
            if self.handle is not None:
                try:
                    self.handle.close()
                except Exception as e:  # noqa: BLE001 - best effort
                    self.stats.exception("close", e)
            self.save_stats(force=True)

    def exit(self, status: int) -> int:
        self.stats.exit_status = status
        return status


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="tests.chaos.bank", description=__doc__.split("\n")[0])
    p.add_argument("--url", required=True)
    p.add_argument("--txns-id", required=True)
    p.add_argument("--legs", required=True)
    p.add_argument("--ledger", required=True)
    p.add_argument("--worker", type=int, required=True)
    p.add_argument("--incarnation", type=int, required=True)
    p.add_argument("--state-dir", required=True)
    p.add_argument("--mode", choices=["run", "finish"], default="run")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--variant", default="default")
    p.add_argument("--seconds", type=float, default=600.0, help="stop starting transfers after this long")
    p.add_argument("--max-transfers", type=int, default=1_000_000)
    p.add_argument("--stuck-after", type=float, default=60.0, help="a commit not done by then is a violation")
    p.add_argument("--open-limit", type=float, default=60.0)
    p.add_argument("--apply-prob", type=float, default=0.5)
    p.add_argument("--pad-every", type=int, default=10)
    p.add_argument("--crash-prob", type=float, default=0.0, help="kill itself at a crash point per transfer")
    p.add_argument("--group-commit", action="store_true", help="commit through txns.group_commit")
    p.add_argument("--think-s", type=float, default=0.0, help="sleep up to this long between transfers")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    Path(args.state_dir).mkdir(parents=True, exist_ok=True)
    return Worker(args).main()


if __name__ == "__main__":
    sys.exit(main())
