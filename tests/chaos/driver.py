"""The chaos driver: moto, the fault proxy, killable workers and CLI runs; then finish and verify.

:func:`run_chaos` runs one chaos run and returns a :class:`ChaosResult`:

1. setup: a moto S3 server (a subprocess running
   :func:`persist.testing.moto_server`, or a given endpoint) and a bucket, or
   a local directory; a txns shard with two data shards (``legs``,
   ``ledger``) registered at time 1, created directly (no faults);
2. run: a :class:`persist.fault_proxy.FaultProxy` in front of moto with every
   fault kind (outage bursts included), ``workers`` worker processes
   (:mod:`tests.chaos.bank`) committing transfers through it, and one
   operator command at a time (``python -m txns apply|compact|gc URL
   TXNS_ID``) through it too. Workers and commands are SIGKILLed at random
   times (seeded), and workers also kill themselves at crash points
   (``crash_prob``: around the pending file, the commit and the ack); a
   killed worker restarts as a new incarnation with the same files. A
   command exiting with status 2 (usage error) on a storage failure is a
   violation; status 1 is fine;
3. finish: every worker is killed, faults are turned off, and each worker
   runs once in ``finish`` mode, committing its pending transaction; every
   one must commit within ``finish_timeout_s``. Then ``txns apply`` runs once
   and must succeed;
4. verify: :mod:`tests.chaos.verify` in a fresh process, on the store
   directly.

On a directory (``backend="file"``) there is no proxy: kills only.

Two worker variants (:func:`tests.chaos.bank.worker_config`): ``default``
(short ``retry_deadline_s`` so faults surface as exceptions) and ``tight``
(also ``part_grace_s`` 1 s, ``consensus_retention_s`` 4 s, ``reader_lease_s``
6 s, so part deletion, version truncation and lapsed leases happen under
faults). The ``tight`` variant also runs two long-lived readers
(:mod:`tests.chaos.reader`: one handle each for the whole run, every read
checked by the verifier against the history) and the maintainer
(:mod:`tests.chaos.maint`: ``compact`` and ``gc`` in process, in a loop,
with the workers' config; killed at random too). Every process saves its
:mod:`persist.metrics` with its stats; the result sums them
(``ChaosResult.persist``: parts deleted, versions truncated, leases lapsed),
and ``ChaosConfig.goals`` extends the run phase until given counters are
reached (up to ``max_seconds``). The ``tight`` variant runs no CLI commands: the CLI always uses
the default config (retention 600 s), and persist's truncation rule assumes
every process of a shard uses the same retention; a CLI write with a cached
expectation older than 4 s could re-create a version a worker truncated,
which would be a finding about the harness, not the library.

SUBTLE: ``txns gc --older-than S`` deletes unreferenced parts older than
``S`` seconds, and its contract (docs/crash-cases.md) is that every write commits
within ``S`` of writing its parts. A pending transaction retried after a
kill or an outage can be older than a second, so ``gc_older_than_s``
defaults to 30 s, not 1 s: with 1 s the harness itself would delete parts
of transactions it is about to commit.

Every process started is killed in a ``finally``; every loop is bounded in
time; ports are chosen by the OS on 127.0.0.1.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from persist.fault_proxy import FaultPlan, FaultProxy, OutageMode
from persist.testing import FAKE_AWS_ENV, UNSET_AWS_ENV
from tests.chaos.sidecar import read_stats

REPO = Path(__file__).resolve().parents[2]
TICK_S = 0.1
MOTO_START_S = 60.0
CLI_TIMEOUT_S = 120.0
FINAL_APPLY_TIMEOUT_S = 180.0
KILL_WAIT_S = 10.0
LOG_TAIL = 1500
MAX_EXAMPLES = 20


def default_faults() -> FaultPlan:
    """Every fault kind, often enough to hit commits, with outage bursts of a few seconds."""
    return FaultPlan(
        drop_before=0.01,
        drop_reply=0.02,
        error_503=0.01,
        truncate=0.01,
        outage_every_s=10.0,
        outage_s=5.0,
        outage_mode=OutageMode.MIXED,
    )


def tight_faults() -> FaultPlan:
    """:func:`default_faults` with shorter and rarer outages: the short ``tight`` case must commit enough
    (and write enough parts) in under a minute for compaction, GC, truncation and lease expiry to act
    on, on a busy 2-core CI machine."""
    return dataclasses.replace(default_faults(), outage_every_s=15.0, outage_s=3.0)


@dataclass
class ChaosConfig:
    backend: str = "s3"
    """``s3`` (moto behind the fault proxy) or ``file`` (a local directory, kills only)."""
    seconds: float = 40.0
    """Length of the run phase (faults and kills)."""
    seed: int = 0
    workers: int = 3
    variant: str = "default"
    faults: FaultPlan | None = None
    """None: :func:`default_faults` (S3 only)."""
    kill_every_s: float = 4.0
    """Mean seconds between worker kills (exponential)."""
    crash_prob: float = 0.1
    """Per transfer, the chance a worker kills itself at one of its crash points (see tests.chaos.bank)."""
    cli: bool | None = None
    """Run operator commands during the run (None: yes, except in the ``tight`` variant)."""
    goals: dict[str, int] | None = None
    """persist.metrics counters (summed over every process), or the readers' and maintainer's counters
    (``compact``, ``gc``), the run phase must reach: it goes on past
    ``seconds`` until they are reached or ``max_seconds`` passed (a slow machine gets the time it needs)."""
    max_seconds: float | None = None
    """With ``goals``: the longest run phase (None: ``3 * seconds``)."""
    readers: int | None = None
    """Long-lived reader processes (tests.chaos.reader; never killed). None: 2 in the ``tight`` variant, else 0."""
    maint: bool | None = None
    """Run the maintainer (tests.chaos.maint: compaction and GC in a loop with the workers' config, killed at
    random like the workers). None: in the ``tight`` variant only."""
    cli_every_s: float = 2.0
    cli_kill_prob: float = 0.3
    gc_older_than_s: float = 30.0
    stuck_after_s: float = 60.0
    finish_timeout_s: float = 90.0
    verify_timeout_s: float = 600.0
    apply_prob: float = 0.5
    pad_every: int = 10
    think_s: float = 0.0
    group_commit: bool = False
    """Workers commit through txns.group_commit (the queue and its sequencers, killed like anything else)."""
    work_dir: Path | None = None
    """Where the state (and the store, for ``file``) goes; a temporary directory if None."""
    keep_work_dir: bool = True
    python: str = sys.executable
    upstream: str | None = None
    """An already running moto endpoint to use; None: start one in a subprocess."""
    log: Callable[[str], None] | None = None


@dataclass
class ChaosResult:
    backend: str
    seed: int
    variant: str
    seconds: float
    ok: bool = False
    violations: dict[str, int] = field(default_factory=dict)
    examples: dict[str, list[str]] = field(default_factory=dict)
    verifier: dict[str, Any] = field(default_factory=dict)
    acked: int = 0
    ledger_rows: int = 0
    timestamps_checked: int = 0
    worker_starts: int = 0
    worker_kills: int = 0
    worker_crashes: dict[str, int] = field(default_factory=dict)
    """Self-kills at crash points, by point."""
    worker_exits: dict[str, int] = field(default_factory=dict)
    cli_runs: dict[str, int] = field(default_factory=dict)
    cli_kills: int = 0
    faults: dict[str, int] = field(default_factory=dict)
    exceptions: dict[str, int] = field(default_factory=dict)
    worker_stats: dict[str, int] = field(default_factory=dict)
    side_stats: dict[str, int] = field(default_factory=dict)
    """Counters of the readers and the maintainer (reads by kind, compaction and GC rounds, ...)."""
    persist: dict[str, int] = field(default_factory=dict)
    """persist.metrics summed over every process (parts deleted, versions truncated, leases lapsed)."""
    durations: dict[str, float] = field(default_factory=dict)
    work_dir: str = ""

    def violation(self, kind: str, detail: str, n: int = 1) -> None:
        self.violations[kind] = self.violations.get(kind, 0) + n
        ex = self.examples.setdefault(kind, [])
        if len(ex) < MAX_EXAMPLES:
            ex.append(detail[:3000])

    def summary(self) -> str:
        lines = [
            f"chaos {self.backend}/{self.variant} seed {self.seed} ({self.seconds:.0f}s run): "
            f"{'OK' if self.ok else 'VIOLATIONS'}",
            f"  acked {self.acked}, ledger rows {self.ledger_rows}, timestamps checked {self.timestamps_checked}",
            f"  workers: {self.worker_starts} starts, {self.worker_kills} kills, crash points "
            f"{self.worker_crashes}, exits {self.worker_exits}",
            f"  cli: runs by command:status {self.cli_runs}, {self.cli_kills} kills",
            f"  faults: {self.faults}",
            f"  exceptions: {self.exceptions}",
            f"  worker stats: {self.worker_stats}",
            f"  readers and maintainer: {self.side_stats}",
            f"  persist (all processes): {self.persist}",
            f"  durations: {self.durations}",
            f"  work dir: {self.work_dir}",
        ]
        if self.violations:
            lines.append(f"  violations: {self.violations}")
            for kind, ex in self.examples.items():
                for e in ex[:3]:
                    lines.append(f"    {kind}: {e[:600]}")
        return "\n".join(lines)

    def to_json(self) -> dict[str, Any]:
        return dict(self.__dict__)


def child_env() -> dict[str, str]:
    env = dict(os.environ)
    env.update(FAKE_AWS_ENV)
    for k in UNSET_AWS_ENV:
        env.pop(k, None)
    env["PYTHONPATH"] = str(REPO) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env["PYTHONUNBUFFERED"] = "1"
    env.pop("TXNS_DEBUG", None)
    return env


def _tail(path: Path, n: int = LOG_TAIL) -> str:
    try:
        data = path.read_bytes()
    except OSError:
        return ""
    return data[-n:].decode("utf-8", "replace")


def _kill(p: subprocess.Popen[bytes]) -> None:
    if p.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            p.send_signal(signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        p.wait(KILL_WAIT_S)


@contextlib.contextmanager
def moto_subprocess(python: str, log_path: Path) -> Iterator[str]:
    """``http://127.0.0.1:PORT`` of a moto server in a child process (stopped on exit)."""
    log = open(log_path, "ab")  # noqa: SIM115 - the child writes to it until the server stops
    p = subprocess.Popen(
        [python, "-m", "tests.chaos.driver", "moto"],
        cwd=REPO,
        env=child_env(),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=log,
    )
    try:
        assert p.stdout is not None
        deadline = time.monotonic() + MOTO_START_S
        line = b""
        # one line, with the endpoint; the child prints it once the server listens
        import selectors

        with selectors.DefaultSelector() as sel:
            sel.register(p.stdout, selectors.EVENT_READ)
            while not line.endswith(b"\n"):
                left = deadline - time.monotonic()
                if left <= 0 or p.poll() is not None:
                    raise RuntimeError(f"moto server did not start: {_tail(log_path)}")
                if sel.select(min(left, 1.0)):
                    chunk = os.read(p.stdout.fileno(), 256)
                    if not chunk:
                        raise RuntimeError(f"moto server exited: {_tail(log_path)}")
                    line += chunk
        yield line.decode().strip()
    finally:
        with contextlib.suppress(OSError):
            if p.stdin is not None:
                p.stdin.close()
        with contextlib.suppress(subprocess.TimeoutExpired):
            p.wait(5)
        _kill(p)
        if p.stdout is not None:
            p.stdout.close()
        log.close()


def _moto_child() -> int:
    """Child: serve moto until stdin closes (the parent exited or is done)."""
    from persist.testing import moto_server

    with moto_server() as endpoint:
        sys.stdout.write(endpoint + "\n")
        sys.stdout.flush()
        sys.stdin.buffer.read()  # until EOF
    return 0


@dataclass
class _Worker:
    n: int
    incarnation: int = 0
    proc: subprocess.Popen[bytes] | None = None
    restart_at: float | None = None


class _Run:
    """One chaos run's processes and counters (see :func:`run_chaos`)."""

    def __init__(self, cfg: ChaosConfig, res: ChaosResult, state_dir: Path, url: str, ids: dict[str, str]) -> None:
        self.cfg, self.res, self.state_dir, self.url, self.ids = cfg, res, state_dir, url, ids
        self.rng = random.Random(f"driver-{cfg.seed}")
        self.env = child_env()
        self.procs: list[subprocess.Popen[bytes]] = []
        self.logs: list[IO[bytes]] = []
        self.cli_count = 0
        self.workers: list[_Worker] = [_Worker(n) for n in range(cfg.workers)]
        tight = cfg.variant == "tight"
        self.n_readers = cfg.readers if cfg.readers is not None else (2 if tight else 0)
        self.maint_on = cfg.maint if cfg.maint is not None else tight
        self.maint_incarnation = 0

    def log(self, msg: str) -> None:
        if self.cfg.log is not None:
            self.cfg.log(msg)

    def popen(self, argv: list[str], log_path: Path) -> subprocess.Popen[bytes]:
        f = open(log_path, "ab")  # noqa: SIM115 - kept for the child's life, closed with the run
        self.logs.append(f)
        p = subprocess.Popen(argv, cwd=REPO, env=self.env, stdin=subprocess.DEVNULL, stdout=f, stderr=f)
        self.procs.append(p)
        return p

    def kill_all(self) -> None:
        for p in self.procs:
            _kill(p)
        for f in self.logs:
            with contextlib.suppress(OSError):
                f.close()

    # ---- workers ----

    def start_worker(self, w: _Worker, mode: str) -> None:
        w.incarnation += 1
        cfg = self.cfg
        stuck = cfg.stuck_after_s if mode == "run" else max(5.0, cfg.finish_timeout_s - 15.0)
        argv = [
            cfg.python, "-m", "tests.chaos.bank",
            "--url", self.url,
            "--txns-id", self.ids["txns"],
            "--legs", self.ids["legs"],
            "--ledger", self.ids["ledger"],
            "--worker", str(w.n),
            "--incarnation", str(w.incarnation),
            "--state-dir", str(self.state_dir),
            "--mode", mode,
            "--seed", str(cfg.seed),
            "--variant", cfg.variant,
            "--seconds", str(cfg.seconds + cfg.finish_timeout_s + 60),
            "--stuck-after", str(stuck),
            "--open-limit", str(stuck),
            "--apply-prob", str(cfg.apply_prob),
            "--pad-every", str(cfg.pad_every),
            "--think-s", str(cfg.think_s),
            "--crash-prob", str(cfg.crash_prob if mode == "run" else 0.0),
        ] + (["--group-commit"] if cfg.group_commit else [])  # fmt: skip
        w.proc = self.popen(argv, self.state_dir / f"w{w.n}.log")
        w.restart_at = None
        self.res.worker_starts += 1

    def reap_worker(self, w: _Worker, phase: str) -> None:
        """Record how a finished worker process ended."""
        assert w.proc is not None
        rc = w.proc.returncode
        key = f"{phase}:{rc}"
        self.res.worker_exits[key] = self.res.worker_exits.get(key, 0) + 1
        if rc not in (0, 3, 4, 5, -signal.SIGKILL):
            self.res.violation(
                "worker_crash", f"worker {w.n} incarnation {w.incarnation} ({phase}) exited {rc}: "
                f"{_tail(self.state_dir / f'w{w.n}.log')}"
            )
        w.proc = None

    # ---- side processes: long-lived readers, the maintainer ----

    def _side_argv(self, module: str, *extra: str) -> list[str]:
        cfg = self.cfg
        return [
            cfg.python, "-m", module,
            "--url", self.url,
            "--txns-id", self.ids["txns"],
            "--state-dir", str(self.state_dir),
            "--seed", str(cfg.seed),
            "--variant", cfg.variant,
            "--seconds", str(cfg.seconds + 30),
            *extra,
        ]  # fmt: skip

    def start_reader(self, n: int) -> subprocess.Popen[bytes]:
        argv = self._side_argv(
            "tests.chaos.reader", "--legs", self.ids["legs"], "--ledger", self.ids["ledger"], "--reader", str(n)
        )
        return self.popen(argv, self.state_dir / f"r{n}.log")

    def start_maint(self) -> subprocess.Popen[bytes]:
        self.maint_incarnation += 1
        argv = self._side_argv(
            "tests.chaos.maint",
            "--incarnation", str(self.maint_incarnation),
            "--older-than", str(self.cfg.gc_older_than_s),
        )  # fmt: skip
        return self.popen(argv, self.state_dir / "maint.log")

    def reap_side(self, p: subprocess.Popen[bytes], name: str, log_path: Path) -> None:
        rc = p.returncode
        key = f"{name}:{rc}"
        self.res.worker_exits[key] = self.res.worker_exits.get(key, 0) + 1
        if rc not in (0, -signal.SIGKILL):
            self.res.violation(f"{name}_crash", f"{name} exited {rc}: {_tail(log_path)}")

    # ---- operator commands ----

    def start_cli(self) -> tuple[subprocess.Popen[bytes], str, float | None, Path]:
        cmd = self.rng.choice(["apply", "compact", "gc"])
        argv = [self.cfg.python, "-m", "txns", cmd, self.url, self.ids["txns"]]
        if cmd == "gc":
            argv += ["--older-than", str(self.cfg.gc_older_than_s)]
        self.cli_count += 1
        log_path = self.state_dir / f"cli-{self.cli_count}-{cmd}.log"
        p = self.popen(argv, log_path)
        kill_at = time.monotonic() + self.rng.uniform(0.2, 4.0) if self.rng.random() < self.cfg.cli_kill_prob else None
        return p, cmd, kill_at, log_path

    def reap_cli(self, p: subprocess.Popen[bytes], cmd: str, log_path: Path, killed: bool) -> None:
        rc = p.returncode
        key = f"{cmd}:{'killed' if killed else rc}"
        self.res.cli_runs[key] = self.res.cli_runs.get(key, 0) + 1
        if killed:
            return
        if rc == 2:
            self.res.violation("cli_usage_error", f"txns {cmd} exited 2: {_tail(log_path, 600)}")
        elif rc not in (0, 1):
            self.res.violation("cli_crash", f"txns {cmd} exited {rc}: {_tail(log_path, 600)}")

    # ---- phases ----

    def run_phase(self, proxy: FaultProxy | None) -> None:
        cfg, rng = self.cfg, self.rng
        workers = self.workers
        for w in workers:
            self.start_worker(w, "run")
        readers = [self.start_reader(n) for n in range(self.n_readers)]
        maint = self.start_maint() if self.maint_on else None
        maint_restart_at: float | None = None
        cli_on = cfg.cli if cfg.cli is not None else cfg.variant != "tight"
        now = time.monotonic()
        end = now + cfg.seconds
        hard_end = now + (cfg.max_seconds if cfg.max_seconds is not None else 3 * cfg.seconds)
        next_goal_check = end
        next_kill = now + rng.expovariate(1.0 / cfg.kill_every_s)
        next_cli = now + rng.uniform(0.5, cfg.cli_every_s)
        cli: tuple[subprocess.Popen[bytes], str, float | None, Path] | None = None
        cli_started = 0.0
        last_log = now
        for _ in range(int(max(cfg.seconds, hard_end - now) / TICK_S) + 1000):
            now = time.monotonic()
            if now >= end:
                if not cfg.goals or now >= hard_end:
                    break
                if now >= next_goal_check:
                    next_goal_check = now + 2.0
                    got = {**self.side_counts(), **self.persist_metrics()}
                    if all(got.get(k, 0) >= n for k, n in cfg.goals.items()):
                        break
            for w in workers:
                if w.proc is not None and w.proc.poll() is not None:
                    self.reap_worker(w, "run")
                    w.restart_at = now + rng.uniform(0.0, 0.5)
                if w.proc is None and w.restart_at is not None and now >= w.restart_at:
                    self.start_worker(w, "run")
            if maint is not None and maint.poll() is not None:
                self.reap_side(maint, "maint", self.state_dir / "maint.log")
                maint, maint_restart_at = None, now + rng.uniform(0.0, 1.0)
            if self.maint_on and maint is None and maint_restart_at is not None and now >= maint_restart_at:
                maint = self.start_maint()
            if now >= next_kill:
                alive = [w for w in workers if w.proc is not None and w.proc.poll() is None]
                if maint is not None and maint.poll() is None and rng.random() < 0.15:
                    maint.send_signal(signal.SIGKILL)  # the maintainer, killed mid-compaction or mid-GC
                    self.res.worker_kills += 1
                    alive = []
                if alive:
                    victim = rng.choice(alive)
                    assert victim.proc is not None
                    victim.proc.send_signal(signal.SIGKILL)
                    self.res.worker_kills += 1
                next_kill = now + rng.expovariate(1.0 / cfg.kill_every_s)
            if cli is not None:
                p, cmd, kill_at, log_path = cli
                if p.poll() is not None:
                    self.reap_cli(p, cmd, log_path, killed=False)
                    cli = None
                elif (kill_at is not None and now >= kill_at) or now - cli_started > CLI_TIMEOUT_S:
                    if now - cli_started > CLI_TIMEOUT_S:
                        self.res.cli_runs["timeout"] = self.res.cli_runs.get("timeout", 0) + 1
                    _kill(p)
                    self.res.cli_kills += 1
                    self.reap_cli(p, cmd, log_path, killed=True)
                    cli = None
                    next_cli = now + rng.uniform(0.2, cfg.cli_every_s)
            elif cli_on and now >= next_cli:
                cli = self.start_cli()
                cli_started = now
                next_cli = now + rng.uniform(0.5, cfg.cli_every_s)
            if now - last_log >= 10:
                last_log = now
                self.log(
                    f"  t={cfg.seconds - (end - now):.0f}s starts {self.res.worker_starts} kills "
                    f"{self.res.worker_kills} cli {sum(self.res.cli_runs.values())} "
                    f"faults {proxy.counters() if proxy else {}}"
                )
            time.sleep(TICK_S)
        if cli is not None:
            _kill(cli[0])
            self.res.cli_kills += 1
            self.reap_cli(cli[0], cli[1], cli[3], killed=True)
        for w in workers:  # the last kill: wherever each worker is now
            if w.proc is not None:
                _kill(w.proc)
                self.reap_worker(w, "run")
        for n, p in enumerate(readers):
            if p.poll() is not None:  # (a reader that exited early)
                self.reap_side(p, "reader", self.state_dir / f"r{n}.log")
            _kill(p)
        if maint is not None:
            _kill(maint)

    def finish_phase(self) -> None:
        cfg = self.cfg
        for w in self.workers:
            self.start_worker(w, "finish")
        deadline = time.monotonic() + cfg.finish_timeout_s
        for w in self.workers:
            assert w.proc is not None
            try:
                w.proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                _kill(w.proc)
                self.res.violation(
                    "finish_timeout",
                    f"worker {w.n} did not commit its pending transaction in {cfg.finish_timeout_s:.0f}s: "
                    f"{_tail(self.state_dir / f'w{w.n}.log')}",
                )
            self.reap_worker(w, "finish")

    def final_apply(self) -> None:
        log_path = self.state_dir / "cli-final-apply.log"
        p = self.popen([self.cfg.python, "-m", "txns", "apply", self.url, self.ids["txns"]], log_path)
        try:
            rc = p.wait(FINAL_APPLY_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            _kill(p)
            self.res.violation("final_apply", f"txns apply without faults did not finish in {FINAL_APPLY_TIMEOUT_S}s")
            return
        self.res.cli_runs[f"final-apply:{rc}"] = 1
        if rc != 0:
            self.res.violation("final_apply", f"txns apply without faults exited {rc}: {_tail(log_path, 800)}")

    def verify(self, direct_url: str) -> None:
        out = self.state_dir / "verify.json"
        log_path = self.state_dir / "verify.log"
        argv = [
            self.cfg.python, "-m", "tests.chaos.verify",
            "--url", direct_url,
            "--txns-id", self.ids["txns"],
            "--legs", self.ids["legs"],
            "--ledger", self.ids["ledger"],
            "--state-dir", str(self.state_dir),
            "--out", str(out),
        ]  # fmt: skip
        p = self.popen(argv, log_path)
        try:
            p.wait(self.cfg.verify_timeout_s)
        except subprocess.TimeoutExpired:
            _kill(p)
            self.res.violation("verifier_timeout", f"verifier did not finish in {self.cfg.verify_timeout_s}s")
            return
        if not out.exists():
            self.res.violation("verifier_error", f"verifier exited {p.returncode}: {_tail(log_path)}")
            return
        rep = json.loads(out.read_text())
        self.res.verifier = {k: v for k, v in rep.items() if k not in ("examples", "violations")}
        for kind, n in rep["violations"].items():
            for ex in rep["examples"].get(kind, [])[:MAX_EXAMPLES]:
                self.res.violation(kind, ex, 0)
            self.res.violations[kind] = self.res.violations.get(kind, 0) + n
        self.res.acked = rep.get("acked", 0)
        self.res.ledger_rows = rep.get("ledger_rows", 0)
        self.res.timestamps_checked = rep.get("timestamps_checked", 0)

    def side_counts(self) -> dict[str, int]:
        """The readers' and the maintainer's counters summed (``compact``, ``gc``, ``reads_latest``, ...)."""
        out: dict[str, int] = {}
        for pattern in ("r*.stats.json", "maint.*.stats.json"):
            for s in read_stats(self.state_dir, pattern):
                for k, n in s.get("counts", {}).items():
                    out[k] = out.get(k, 0) + n
        return out

    def persist_metrics(self) -> dict[str, int]:
        """persist.metrics summed over every process's last saved stats."""
        out: dict[str, int] = {}
        for pattern in ("w*.stats.json", "r*.stats.json", "maint.*.stats.json"):
            for s in read_stats(self.state_dir, pattern):
                for k, n in s.get("persist", {}).items():
                    out[k] = out.get(k, 0) + n
        return out

    def gather_stats(self) -> None:
        counters = (
            "transfers_started", "committed", "commit_attempts", "from_bytes_loaded", "from_bytes_committed",
            "pending_already_acked", "abandoned", "applies", "tidies_attached", "queued_commits",
            "grouped_by_this_sequencer",
        )  # fmt: skip
        for p in sorted(self.state_dir.glob("w*.stats.json")):
            try:
                s = json.loads(p.read_text())
            except (OSError, ValueError):
                continue
            for k, n in s.get("crashes", {}).items():
                self.res.worker_crashes[k] = self.res.worker_crashes.get(k, 0) + n
            for k in counters:
                self.res.worker_stats[k] = self.res.worker_stats.get(k, 0) + int(s.get(k, 0))
            for k, n in s.get("exceptions", {}).items():
                self.res.exceptions[k] = self.res.exceptions.get(k, 0) + n
            for kind, n in s.get("violations", {}).items():
                self.res.violations[kind] = self.res.violations.get(kind, 0) + n
            for ex in s.get("violation_examples", []):
                kind = ex.split(":", 1)[0]
                self.res.violation(kind, f"{p.name}: {ex}", 0)
            for k, n in s.get("persist", {}).items():
                self.res.persist[k] = self.res.persist.get(k, 0) + n
        for pattern in ("r*.stats.json", "maint.*.stats.json"):
            for s in read_stats(self.state_dir, pattern):
                for k, n in s.get("counts", {}).items():
                    self.res.side_stats[k] = self.res.side_stats.get(k, 0) + n
                for k, n in s.get("exceptions", {}).items():
                    key = f"{s['name'].rstrip('0123456789')}.{k}"
                    self.res.exceptions[key] = self.res.exceptions.get(key, 0) + n
                for kind, n in s.get("violations", {}).items():
                    self.res.violations[kind] = self.res.violations.get(kind, 0) + n
                for ex in s.get("violation_examples", []):
                    self.res.violation(ex.split(":", 1)[0], f"{s['name']}: {ex}", 0)
                for k, n in s.get("persist", {}).items():
                    self.res.persist[k] = self.res.persist.get(k, 0) + n


def _setup_store(url: str) -> dict[str, str]:
    """A txns shard with ``legs`` and ``ledger`` registered at time 1."""
    from persist import PersistClient, ShardId
    from tests.chaos.bank import LEDGER_SCHEMA, LEGS_SCHEMA, REGISTER_TS
    from txns import TxnsHandle

    client = PersistClient.open(url)
    ids = {"txns": str(ShardId.new()), "legs": str(ShardId.new()), "ledger": str(ShardId.new())}
    handle = TxnsHandle.open(client, ids["txns"])
    try:
        handle.register(REGISTER_TS, {ids["legs"]: LEGS_SCHEMA, ids["ledger"]: LEDGER_SCHEMA})
    finally:
        handle.close()
    return ids


def run_chaos(cfg: ChaosConfig) -> ChaosResult:
    """One chaos run (see the module docstring). Never raises for findings: they are in the result."""
    if cfg.backend not in ("s3", "file"):
        raise ValueError(f"backend must be s3 or file, got {cfg.backend!r}")
    res = ChaosResult(cfg.backend, cfg.seed, cfg.variant, cfg.seconds)
    t0 = time.monotonic()
    own_dir = cfg.work_dir is None
    work = Path(tempfile.mkdtemp(prefix="txns-chaos-")) if cfg.work_dir is None else Path(cfg.work_dir)
    work.mkdir(parents=True, exist_ok=True)
    state_dir = work / "state"
    state_dir.mkdir(exist_ok=True)
    res.work_dir = str(work)
    from persist.testing import fake_aws_env

    with contextlib.ExitStack() as stack:
        stack.enter_context(fake_aws_env())
        proxy: FaultProxy | None = None
        if cfg.backend == "s3":
            import boto3

            endpoint = cfg.upstream or stack.enter_context(moto_subprocess(cfg.python, work / "moto.log"))
            bucket = f"chaos-{uuid.uuid4().hex[:20]}"
            admin = boto3.session.Session().client("s3", endpoint_url=endpoint, region_name="us-east-1")
            admin.create_bucket(Bucket=bucket)
            admin.close()
            direct_url = f"s3://{bucket}/chaos?endpoint_url={endpoint}&region=us-east-1"
            proxy = stack.enter_context(
                FaultProxy(endpoint, seed=cfg.seed, faults=cfg.faults if cfg.faults is not None else default_faults())
            )
            proxy.set_enabled(False)
            url = f"s3://{bucket}/chaos?endpoint_url={proxy.url}&region=us-east-1"
        else:
            direct_url = url = f"file://{work / 'store'}"
        ids = _setup_store(direct_url)
        (work / "ids.json").write_text(json.dumps({**ids, "url": direct_url}))
        run = _Run(cfg, res, state_dir, url, ids)
        stack.callback(run.kill_all)
        res.durations["setup"] = round(time.monotonic() - t0, 1)
        run.log(f"chaos {cfg.backend}/{cfg.variant} seed {cfg.seed}: {cfg.seconds:.0f}s in {work}")
        t = time.monotonic()
        if proxy is not None:
            proxy.set_enabled(True)
        run.run_phase(proxy)
        res.durations["run"] = round(time.monotonic() - t, 1)
        t = time.monotonic()
        if proxy is not None:
            proxy.set_enabled(False)
        run.finish_phase()
        run.final_apply()
        res.durations["finish"] = round(time.monotonic() - t, 1)
        if proxy is not None:
            res.faults = proxy.counters()
        t = time.monotonic()
        run.verify(direct_url)
        res.durations["verify"] = round(time.monotonic() - t, 1)
        run.gather_stats()
    res.ok = not res.violations
    res.durations["total"] = round(time.monotonic() - t0, 1)
    if own_dir and res.ok and not cfg.keep_work_dir:
        shutil.rmtree(work, ignore_errors=True)
    return res


def main(argv: list[str] | None = None) -> int:
    import argparse

    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["moto"]:
        return _moto_child()
    p = argparse.ArgumentParser(prog="tests.chaos.driver", description="one chaos run")
    p.add_argument("--backend", default="s3", choices=["s3", "file"])
    p.add_argument("--seconds", type=float, default=40.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--workers", type=int, default=3)
    p.add_argument("--variant", default="default", choices=["default", "tight"])
    p.add_argument("--work-dir", default=None)
    a = p.parse_args(args)
    res = run_chaos(
        ChaosConfig(
            backend=a.backend,
            seconds=a.seconds,
            seed=a.seed,
            workers=a.workers,
            variant=a.variant,
            work_dir=Path(a.work_dir) if a.work_dir else None,
            log=lambda m: print(m, file=sys.stderr, flush=True),
        )
    )
    print(res.summary())
    return 0 if res.ok else 1


if __name__ == "__main__":
    sys.exit(main())
