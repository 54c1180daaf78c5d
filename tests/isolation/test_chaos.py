"""Isolation under storage faults and killed processes: Jepsen-style list-append histories and a bank (issue #10).

Each run (:func:`run_isolation_chaos`): a moto S3 server (a subprocess)
with a fresh bucket and database, set up directly (no faults); then worker
processes (:mod:`tests.isolation.proc_worker`, several threads each, every
thread with its own ``txns.connect``) running transactions, each worker
through its own :class:`persist.fault_proxy.FaultProxy` (random faults of
every kind and short outages, so an outage cuts off one worker). Besides
the random faults, the driver now and then *aims* at a worker's next commit
write to the txns shard (:class:`_CommitFaultProxy`): the write lands with
its reply lost, or is dropped, and that worker is cut off for a second, so
``db.run`` cannot tell and raises ``Indeterminate`` (persist's retries ride
out single random faults, so these would otherwise almost never surface).
Workers alternate between a long and a very short persist retry deadline,
so faults also surface as ``Determinate`` failures. While they run, workers
are SIGKILLed at planned times (once they have started a few transactions)
and restarted with a new seed (a new process name: op ids and appended
values stay unique). The run goes on until enough transactions were
acknowledged (bounded). At the end faults go off, the workers finish their
last transaction and exit (stragglers are killed), and:

- list-append: every worker file is loaded (an invoke without a completion
  is an ``info`` op with its planned appends) and
  :func:`tests.isolation.checker.check` must find the history valid at the
  run's isolation level, with at least a minimum number of committed ops;
- bank: :func:`tests.isolation.proc_worker.verify_bank` checks, at every
  commit time in ``db.history()``, one row per account, no negative
  balance, a constant total and exactly the commit's transfer as the change
  (snapshot reads and the change feed must agree); and each transfer id at
  most once in history, matching what its worker recorded (an
  ``Indeterminate`` transfer is looked up by its id, never run twice).

Every run must also have injected faults, made its planned kills, and no
worker may meet an exception the library's rules do not allow for (a
non-persist error, ``InvalidUsage``) or exit early.
:func:`test_an_uncertain_transfer_is_looked_up_not_run_again` aims at one
commit deterministically, for each of "landed" and "did not land".

Profiles (``ISOLATION_CHAOS_PROFILE``, else ``CHAOS_PROFILE``; default
``short``):

- ``short`` (in the default run; ~45 s for the file on an idle 2-core box,
  more when it is busy: runs extend until enough commits): one moto server;
  2 workers x 2 threads; list-append at ``strict_serializable`` (12 s) and
  ``serializable`` (7 s), and the bank (7 s); ~1-1.5% of each fault kind,
  a one-second outage every ~10 s per worker, an aimed commit fault every
  ~4 s, one worker killed and restarted mid-way.
- ``long``: seeds ``ISOLATION_CHAOS_SEEDS`` (default ``1,2,3``) x
  {list-append, bank} x {``strict_serializable``, ``serializable``},
  ``ISOLATION_CHAOS_SECONDS`` (default 90) each, 3 workers x 3 threads,
  more faults with 1.5 s outage bursts, a kill every ~8 s.

``ISOLATION_CHAOS_SECONDS`` sets the short runs' length too (the strict
run's; the others keep their proportion), ``ISOLATION_CHAOS_SEED`` their
seed. Work directories (worker records and logs) stay under pytest's
``tmp_path``.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

import txns
from persist.fault_proxy import Fault, FaultPlan, FaultProxy, OutageMode
from persist.testing import fake_aws_env
from tests.chaos.driver import REPO, child_env, moto_subprocess
from tests.isolation import proc_worker, workload
from tests.isolation.checker import Result, check

PROFILE = os.environ.get("ISOLATION_CHAOS_PROFILE") or os.environ.get("CHAOS_PROFILE", "short")
LONG = PROFILE == "long"

TICK_S = 0.05
FINISH_S = 30.0
"""How long workers get (faults off) to finish their last transaction before they are killed."""
KILL_WAIT_S = 10.0
UNCERTAIN_TRIES = 5
"""Tries to make one commit uncertain in the targeted test."""
KILL_AFTER_INVOKES = 3
"""A worker is killed only once it has started this many transactions (not while it is still importing)."""


# ---- one run -----------------------------------------------------------------------------


def short_faults() -> FaultPlan:
    """Every per-request fault kind at ~1-1.5%, and a one-second outage every ~10 s (per proxy)."""
    return FaultPlan(
        drop_before=0.01,
        drop_reply=0.015,
        error_503=0.01,
        truncate=0.01,
        outage_every_s=10.0,
        outage_s=1.0,
        outage_mode=OutageMode.MIXED,
    )


def long_faults() -> FaultPlan:
    """More of every fault kind, and outage bursts of a second or two."""
    return FaultPlan(
        drop_before=0.015,
        drop_reply=0.02,
        error_503=0.015,
        truncate=0.015,
        outage_every_s=15.0,
        outage_s=1.5,
        outage_mode=OutageMode.MIXED,
    )


class _CommitFaultProxy(FaultProxy):
    """A fault proxy that can aim at the next conditional PUT under one prefix (a commit's write).

    :meth:`aim`: that PUT is forwarded with its reply lost (``lands``) or
    dropped unforwarded, and an outage (dropping every request) of
    ``outage_s`` starts with it, so every retry after it fails too.
    """

    def __init__(self, upstream_url: str, seed: int = 0, faults: FaultPlan | None = None) -> None:
        super().__init__(upstream_url, seed=seed, faults=faults)
        self._aim: tuple[str, bool, float] | None = None
        self._aim_lock = threading.Lock()

    def aim(self, prefix: str, lands: bool, outage_s: float) -> None:
        """Aim at the next conditional PUT whose path holds ``prefix`` (replacing any aim not yet fired)."""
        with self._aim_lock:
            self._aim = (prefix, lands, outage_s)

    def disarm(self) -> None:
        """Forget an aim not yet fired."""
        with self._aim_lock:
            self._aim = None

    def aimed(self) -> bool:
        """Whether an aim is waiting for its PUT."""
        return self._aim is not None

    def _decide(self, req: Any) -> Any:
        conditional = req.header("if-match") is not None or req.header("if-none-match") is not None
        with self._aim_lock:
            aim = self._aim
            if aim is not None and req.method == "PUT" and conditional and aim[0] in req.target:
                self._aim = None
            else:
                aim = None
        if aim is not None:
            self.start_outage(aim[2], OutageMode.DROP)
            self.force(Fault.DROP_REPLY if aim[1] else Fault.DROP_BEFORE)  # (a forced fault goes first)
            self._count("aimed_landed" if aim[1] else "aimed_dropped")
        return super()._decide(req)


@dataclass
class RunConfig:
    """One isolation chaos run (see the module doc)."""

    mode: str = "list-append"
    """``list-append`` or ``bank``."""
    isolation: str = "strict_serializable"
    seconds: float = 20.0
    """How long transactions run under faults (at least)."""
    min_ok: int = 0
    """Keep running past ``seconds`` (up to ``max_seconds``) until this many transactions are acknowledged
    (``ok``), so a slow machine still yields a history that means something."""
    max_seconds: float | None = None
    """The longest the run phase may be extended to (None: ``2 * seconds``)."""
    seed: int = 1
    workers: int = 2
    threads: int = 2
    keys: int = 6
    """List keys, or bank accounts."""
    kill_at: tuple[float, ...] = (0.5,)
    """When to SIGKILL a (random) worker, as fractions of ``seconds``; it restarts at once with a new seed.
    Only a worker that has started a few transactions is killed (a kill waits for one)."""
    faults: FaultPlan = field(default_factory=short_faults)
    aim_every_s: float | None = 4.0
    """Mean seconds between commit-aimed faults (None: none): a random worker's next commit write
    to the txns shard lands with its reply lost, or is dropped, and that worker's proxy then drops
    everything for ``aim_outage_s``: the faults that make ``db.run`` raise ``Indeterminate``
    (single random faults are ridden out by persist's retries)."""
    aim_outage_s: float = 1.0
    retry_deadlines: tuple[float, ...] = (3.0, 0.1)
    """The workers' persist ``retry_deadline_s``, by worker number (cycled). Short ones let faults
    surface as exceptions out of ``db.run`` (so ``fail`` and ``info`` ops happen); long ones let
    persist ride them out."""


@dataclass
class RunResult:
    """What a run did and found (see :meth:`summary`)."""

    cfg: RunConfig
    ops: dict[str, int] = field(default_factory=dict)
    """Op (or transfer) counts by status/outcome."""
    check: Result | None = None
    bank: proc_worker.BankReport | None = None
    faults: dict[str, int] = field(default_factory=dict)
    kills: int = 0
    killed_at_end: int = 0
    exits: dict[str, int] = field(default_factory=dict)
    exceptions: dict[str, int] = field(default_factory=dict)
    unexpected: list[str] = field(default_factory=list)
    crashes: list[str] = field(default_factory=list)
    """Workers that exited early, with the end of their logs."""
    durations: dict[str, float] = field(default_factory=dict)
    work_dir: str = ""

    @property
    def committed(self) -> int:
        """Committed list-append ops (ok, plus info ones observed), or transfers in the bank's history."""
        if self.check is not None:
            return self.check.op_counts["committed"]
        return self.bank.transfers_in_history if self.bank is not None else 0

    def injected(self) -> int:
        """Requests broken by a fault (random, outage or aimed)."""
        return sum(
            self.faults.get(k, 0) for k in (*(f.value for f in Fault if f is not Fault.OUTAGE), "outage_dropped")
        )

    def summary(self) -> str:
        c = self.cfg
        lines = [
            (
                f"{c.mode} {c.isolation} seed {c.seed}: {c.seconds:.0f}s, {c.workers} workers x {c.threads} threads, "
                f"{c.keys} keys"
            ),
            f"  ops {self.ops}; committed {self.committed}",
            f"  faults {self.faults}",
            f"  kills {self.kills} (+{self.killed_at_end} at the end), exits {self.exits}",
            f"  exceptions {self.exceptions}",
            f"  durations {self.durations}",
            f"  work dir {self.work_dir}",
        ]
        if self.check is not None:
            lines.append("  " + self.check.summary().replace("\n", "\n  "))
        if self.bank is not None:
            lines.append("  " + self.bank.summary().replace("\n", "\n  "))
        if self.unexpected:
            lines.append(f"  UNEXPECTED ({len(self.unexpected)}):")
            lines.extend(f"    {u[:1500]}" for u in self.unexpected[:5])
        if self.crashes:
            lines.append(f"  CRASHED ({len(self.crashes)}):")
            lines.extend(f"    {c}" for c in self.crashes[:5])
        return "\n".join(lines)


def _kill(p: subprocess.Popen[bytes]) -> None:
    if p.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            p.send_signal(signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        p.wait(KILL_WAIT_S)


def _s3_url(bucket: str, endpoint: str) -> str:
    return f"s3://{bucket}/db?endpoint_url={endpoint}&region=us-east-1"


@dataclass
class _Slot:
    """A worker position: its current process and the files of every incarnation."""

    n: int
    incarnation: int = 0
    proc: subprocess.Popen[bytes] | None = None
    outs: list[Path] = field(default_factory=list)


class _Processes:
    """The run's worker processes: start, kill, and kill every one still alive on exit."""

    def __init__(self, cfg: RunConfig, work: Path) -> None:
        self.cfg, self.work = cfg, work
        self.env = child_env()
        self.all: list[subprocess.Popen[bytes]] = []
        self.logs: list[Any] = []

    @property
    def stop_file(self) -> Path:
        return self.work / "stop"

    def start(self, slot: _Slot, url: str, seconds: float) -> None:
        cfg = self.cfg
        slot.incarnation += 1
        seed = cfg.seed * 1000 + slot.n * 50 + slot.incarnation  # unique per incarnation: ids and values
        name = f"w{slot.n}.{slot.incarnation}"
        out = self.work / f"{name}.jsonl"
        argv = [
            sys.executable, "-m", "tests.isolation.proc_worker",
            "--url", url, "--out", str(out), "--seed", str(seed), "--threads", str(cfg.threads),
            "--txns", "100000", "--keys", str(cfg.keys), "--isolation", cfg.isolation,
            "--seconds", f"{max(0.0, seconds):.2f}", "--stop-file", str(self.stop_file), "--process", name,
            "--retry-deadline", str(cfg.retry_deadlines[slot.n % len(cfg.retry_deadlines)]),
        ]  # fmt: skip
        if cfg.mode == "bank":
            argv.append("--bank")
        log = open(self.work / f"{name}.log", "ab")  # noqa: SIM115 - closed by close(), after the process
        self.logs.append(log)
        slot.proc = subprocess.Popen(argv, cwd=REPO, env=self.env, stdin=subprocess.DEVNULL, stdout=log, stderr=log)
        self.all.append(slot.proc)
        slot.outs.append(out)

    def log_tail(self, slot: _Slot, n: int = 3000) -> str:
        """The end of the log of ``slot``'s current incarnation."""
        try:
            data = (self.work / f"w{slot.n}.{slot.incarnation}.log").read_bytes()
        except OSError:
            return ""
        return data[-n:].decode("utf-8", "replace")

    def close(self) -> None:
        for p in self.all:
            _kill(p)
        for f in self.logs:
            with contextlib.suppress(OSError):
                f.close()


def _invoked(out: Path) -> int:
    """How many transactions a worker file records as started."""
    try:
        return out.read_bytes().count(b'"t":"invoke"')
    except OSError:
        return 0


def run_isolation_chaos(endpoint: str, cfg: RunConfig, work: Path, log: Callable[[str], None] = print) -> RunResult:
    """One run against the moto server at ``endpoint`` (see the module doc); never raises for findings."""
    import boto3

    if cfg.mode not in ("list-append", "bank"):
        raise ValueError(f"mode must be list-append or bank, got {cfg.mode!r}")
    res = RunResult(cfg, work_dir=str(work))
    t0 = time.monotonic()
    work.mkdir(parents=True, exist_ok=True)
    bucket = f"iso-{uuid.uuid4().hex[:20]}"
    admin = boto3.session.Session().client("s3", endpoint_url=endpoint, region_name="us-east-1")
    admin.create_bucket(Bucket=bucket)
    admin.close()
    direct = _s3_url(bucket, endpoint)
    db = txns.connect(direct)
    since_ts = 0
    txns_prefix = f"/consensus/{db.root.txns_id}/"  # the txns shard's versions: commits write there
    try:
        if cfg.mode == "bank":
            since_ts = proc_worker.create_bank(db, cfg.keys)
        else:
            workload.create(db)
    finally:
        db.close()
    res.durations["setup"] = round(time.monotonic() - t0, 1)

    rng = random.Random(f"isolation-chaos-{cfg.seed}")
    slots = [_Slot(n) for n in range(cfg.workers)]
    procs = _Processes(cfg, work)
    exits: Counter[str] = Counter()
    try:
        with contextlib.ExitStack() as stack:
            # one proxy per worker slot: its outages (random or aimed) cut off that worker only
            proxies = [
                stack.enter_context(_CommitFaultProxy(endpoint, seed=cfg.seed * 100 + n, faults=cfg.faults))
                for n in range(cfg.workers)
            ]
            urls = [_s3_url(bucket, p.url) for p in proxies]
            t = time.monotonic()
            end = t + cfg.seconds
            cap = t + (cfg.max_seconds if cfg.max_seconds is not None else 2 * cfg.seconds)
            kills = sorted(t + f * cfg.seconds for f in cfg.kill_at)
            next_aim = None if cfg.aim_every_s is None else t + rng.expovariate(1.0 / cfg.aim_every_s)
            for slot in slots:
                procs.start(slot, urls[slot.n], cap - time.monotonic())
            last_count = 0.0
            while True:
                now = time.monotonic()
                if now >= cap:
                    break
                if now >= end and now - last_count >= 0.5:
                    last_count = now
                    if proc_worker.acknowledged([p for s in slots for p in s.outs]) >= cfg.min_ok:
                        break
                if next_aim is not None and now >= next_aim and cfg.aim_every_s is not None:
                    proxy = rng.choice(proxies)
                    if not proxy.aimed() and not proxy.in_outage():
                        proxy.aim(txns_prefix, lands=rng.random() < 0.5, outage_s=cfg.aim_outage_s)
                    next_aim = now + rng.expovariate(1.0 / cfg.aim_every_s)
                if kills and now >= kills[0]:
                    alive = [
                        s for s in slots
                        if s.proc is not None and s.proc.poll() is None and _invoked(s.outs[-1]) >= KILL_AFTER_INVOKES
                    ]  # fmt: skip
                    if alive:
                        kills.pop(0)
                        victim = rng.choice(alive)
                        assert victim.proc is not None
                        _kill(victim.proc)
                        exits["killed"] += 1
                        res.kills += 1
                        procs.start(victim, urls[victim.n], cap - time.monotonic())
                for s in slots:  # a worker that exits early is a finding (its log says why)
                    if s.proc is not None and s.proc.poll() is not None:
                        exits[f"early:{s.proc.returncode}"] += 1
                        res.crashes.append(f"w{s.n}.{s.incarnation} exited {s.proc.returncode}: {procs.log_tail(s)}")
                        s.proc = None
                time.sleep(TICK_S)
            res.durations["run"] = round(time.monotonic() - t, 1)
            t = time.monotonic()
            procs.stop_file.touch()
            for p in proxies:
                p.disarm()
                p.set_enabled(False)
            deadline = t + FINISH_S
            for s in slots:
                if s.proc is None:
                    continue
                try:
                    exits[f"exit:{s.proc.wait(max(0.1, deadline - time.monotonic()))}"] += 1
                except subprocess.TimeoutExpired:
                    _kill(s.proc)
                    exits["killed-at-end"] += 1
                    res.killed_at_end += 1
            res.durations["finish"] = round(time.monotonic() - t, 1)
            for p in proxies:
                for k, n in p.counters().items():
                    res.faults[k] = res.faults.get(k, 0) + n
    finally:
        procs.close()
    res.exits = dict(exits)

    t = time.monotonic()
    outs = [p for s in slots for p in s.outs if p.exists()]
    for summary in proc_worker.load_summaries(outs):
        for k, n in summary["stats"]["exceptions"].items():
            res.exceptions[k] = res.exceptions.get(k, 0) + n
    res.unexpected = proc_worker.unexpected_errors(outs)
    if cfg.mode == "list-append":
        ops = proc_worker.load_ops(outs)
        res.ops = dict(Counter(op.status for op in ops))
        res.check = check(ops, cfg.isolation)  # type: ignore[arg-type]
    else:
        transfers = proc_worker.load_transfers(outs)
        res.ops = dict(Counter(tr.outcome for tr in transfers))
        db = txns.connect(direct, create=False)
        try:
            res.bank = proc_worker.verify_bank(db, transfers, cfg.keys, since_ts)
        finally:
            db.close()
    res.durations["verify"] = round(time.monotonic() - t, 1)
    res.durations["total"] = round(time.monotonic() - t0, 1)
    log(res.summary())
    (work / "result.json").write_text(
        json.dumps({"summary": res.summary(), "ops": res.ops, "faults": res.faults, "durations": res.durations})
    )
    return res


def assert_sound(res: RunResult, min_committed: int) -> None:
    """The run found nothing wrong, committed enough to mean something, and faults and kills happened."""
    summary = res.summary()
    assert not res.unexpected, f"workers met exceptions the rules do not allow:\n{summary}"
    if res.check is not None:
        assert res.check.valid, res.check.summary()
    if res.bank is not None:
        assert res.bank.ok, res.bank.summary()
    assert res.committed >= min_committed, f"too few commits ({res.committed} < {min_committed}):\n{summary}"
    assert res.injected() > 0, f"no fault was injected:\n{summary}"
    assert res.kills == len(res.cfg.kill_at), f"planned kills did not happen:\n{summary}"
    assert not res.crashes, f"a worker exited early:\n{summary}"


# ---- the tests -------------------------------------------------------------------------------


def test_loader_turns_unfinished_invokes_into_info_ops(tmp_path: Path) -> None:
    """An invoke without completion: info with the planned appends; a fail keeps only its planned appends."""
    out = tmp_path / "w.jsonl"
    rec = proc_worker.Recorder(out)
    rec.write(
        {"t": "invoke", "id": "a", "process": "p", "start": 1.0, "plan": [["r", "k0", None], ["append", "k0", 5]]}
    )
    rec.write(
        {"t": "invoke", "id": "b", "process": "p", "start": 1.5, "plan": [["append", "k1", 6], ["r", "k1", None]]}
    )
    rec.write(
        {"t": "complete", "id": "a", "end": 2.0, "status": "ok", "read_ts": 3, "commit_ts": 4,
         "mops": [["r", "k0", []], ["append", "k0", 5]]}
    )  # fmt: skip
    rec.write(
        {"t": "invoke", "id": "c", "process": "p", "start": 2.5, "plan": [["r", "k0", None], ["append", "k0", 7]]}
    )
    rec.write({"t": "complete", "id": "c", "end": 3.0, "status": "fail", "mops": [["r", "k0", [5]]]})
    rec.close()
    with open(out, "a") as f:
        f.write('{"t": "complete", "id": "b", "en')  # a kill mid-write
    ops = {op.id: op for op in proc_worker.load_ops([out])}
    assert ops["a"].status == "ok" and ops["a"].mops == (("r", "k0", ()), ("append", "k0", 5))
    assert ops["b"].status == "info" and ops["b"].mops == (("append", "k1", 6),) and ops["b"].end == 1.5
    assert ops["c"].status == "fail" and ops["c"].mops == (("append", "k0", 7),)
    assert check(list(ops.values())).valid


def test_bank_verifier_catches_violations(tmp_path: Path) -> None:
    """A doubled transfer, a lost one and money from nowhere are each reported."""
    db = txns.connect(f"file://{tmp_path}/db")
    since = proc_worker.create_bank(db, 3)

    def move(src: str, dst: str, amount: int) -> Callable[[txns.Transaction], None]:
        def fn(t: txns.Transaction) -> None:
            a, b = t.get("accounts", src), t.get("accounts", dst)
            t.upsert("accounts", [{"account": src, "balance": a["balance"] - amount},
                                  {"account": dst, "balance": b["balance"] + amount}])  # fmt: skip

        return fn

    def record(tid: str, src: str, dst: str, amount: int, ts: int | None, status: str = "ok") -> proc_worker.Transfer:
        outcome = "committed" if status == "ok" else "aborted"
        return proc_worker.Transfer(tid, tid, "p", src, dst, amount, status, outcome, ts, 0.0, 1.0)

    one = db.run(move("acct-0", "acct-1", 30), metadata={"transfer": "t1"})
    good = [record("t1", "acct-0", "acct-1", 30, one.ts)]
    assert proc_worker.verify_bank(db, good, 3, since).ok
    assert not proc_worker.verify_bank(db, [], 3, since).ok  # nobody recorded t1
    lost = [*good, record("t2", "acct-1", "acct-2", 5, one.ts + 1)]
    assert "lost-transfer" in proc_worker.verify_bank(db, lost, 3, since).violations
    aborted = [*good, record("t3", "acct-1", "acct-2", 5, None, status="fail")]
    db.run(move("acct-1", "acct-2", 5), metadata={"transfer": "t3"})
    found = proc_worker.verify_bank(db, aborted, 3, since).violations
    assert set(found) == {"failed-transfer-landed"}
    again = db.run(move("acct-0", "acct-1", 30), metadata={"transfer": "t1"})
    assert "transfer-applied-twice" in proc_worker.verify_bank(db, good, 3, since).violations
    with db.transaction() as t:
        t.upsert("accounts", [{"account": "acct-2", "balance": -1}])
    found = proc_worker.verify_bank(db, good, 3, since).violations
    assert {"negative-balance", "total", "wrong-effect"} <= set(found), found
    assert again.ts is not None
    db.close()



@pytest.fixture(scope="module")
def moto_upstream(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A moto S3 server in a subprocess (so it does not share the GIL with the proxy), for the module."""
    log = tmp_path_factory.mktemp("isolation-chaos-moto") / "moto.log"
    with fake_aws_env(), moto_subprocess(sys.executable, log) as endpoint:
        yield endpoint


@pytest.mark.chaos
@pytest.mark.s3
def test_an_uncertain_transfer_is_looked_up_not_run_again(moto_upstream: str) -> None:
    """``Indeterminate`` out of ``db.run``: the worker finds the transfer in history (landed) or not, never reruns it.

    The commit's write to the txns shard is aimed at from inside the
    transaction function: its reply is lost (it landed) or it is dropped
    (it did not), and an outage makes every retry fail, so ``db.run``
    cannot tell. :func:`tests.isolation.proc_worker.run_transfer` must then
    look the transfer up by its id, and history must agree with every
    outcome it recorded.
    """
    from persist import PersistConfig, PersistError

    with fake_aws_env():
        import boto3

        bucket = f"iso-{uuid.uuid4().hex[:20]}"
        admin = boto3.session.Session().client("s3", endpoint_url=moto_upstream, region_name="us-east-1")
        admin.create_bucket(Bucket=bucket)
        admin.close()
        direct = txns.connect(_s3_url(bucket, moto_upstream))
        since = proc_worker.create_bank(direct, 3)
        txns_prefix = f"/consensus/{direct.root.txns_id}/"
        stats = proc_worker.WorkerStats()
        records: list[proc_worker.Transfer] = []
        with _CommitFaultProxy(moto_upstream) as proxy:
            db = txns.connect(
                _s3_url(bucket, proxy.url), create=False, config=PersistConfig(retry_deadline_s=0.1, read_wait_s=5.0)
            )
            try:
                for lands, expected in ((True, "landed"), (False, "not-landed")):
                    # (the aim may hit another conditional write to the txns shard first, a
                    # maintenance or a lease: the commit then fails in the outage, determinately
                    # or not landing; history must agree all the same. Try again, a few times.)
                    for attempt in range(UNCERTAIN_TRIES):
                        fired: list[bool] = []

                        def before_commit(lands: bool = lands, fired: list[bool] = fired) -> None:
                            if not fired:  # the first run of the function only
                                fired.append(True)
                                proxy.aim(txns_prefix, lands, outage_s=1.5)

                        tid = f"{expected}-{attempt}"
                        start = time.monotonic()
                        done = proc_worker.run_transfer(
                            db, tid, "acct-0", "acct-1", 7, "strict_serializable", stats, before_commit=before_commit
                        )
                        record = proc_worker.Transfer(
                            tid, tid, "p", "acct-0", "acct-1", 7, done["status"], done["outcome"],
                            done.get("commit_ts"), start, done["end"],
                        )  # fmt: skip
                        records.append(record)
                        if done["outcome"] == expected:
                            break
                    assert "Indeterminate" in done["error"] and done["outcome"] == expected, done
            finally:
                with contextlib.suppress(PersistError):
                    db.close()
        print("uncertain transfers:", [(r.transfer, r.status, r.outcome) for r in records], stats.to_json())
        assert not stats.unexpected, stats
        report = proc_worker.verify_bank(direct, records, 3, since)  # every try, failed ones included
        assert report.ok, report.summary()
        landed = {r.transfer: [r.commit_ts] for r in records if r.outcome in ("landed", "committed")}
        assert proc_worker.transfer_commits(direct.history()) == landed
        assert records[-1].outcome == "not-landed" and any(r.outcome == "landed" for r in records)
        direct.close()


def _env_float(name: str, default: float) -> float:
    return float(os.environ.get(name, default))


SHORT_S = _env_float("ISOLATION_CHAOS_SECONDS", 12.0)
SHORT_SEED = int(os.environ.get("ISOLATION_CHAOS_SEED", "1"))
# (mode, isolation, run seconds, acknowledged transactions to run for, committed ones the checks need)
SHORT_CASES = [
    pytest.param("list-append", "strict_serializable", SHORT_S, 40, 25, id="list-append-strict"),
    pytest.param("list-append", "serializable", SHORT_S * 7 / 12, 25, 15, id="list-append-serializable"),
    pytest.param("bank", "strict_serializable", SHORT_S * 7 / 12, 25, 15, id="bank"),
]


@pytest.mark.chaos
@pytest.mark.s3
@pytest.mark.slow
@pytest.mark.timeout(int(2.5 * SHORT_S) + 240)
@pytest.mark.skipif(LONG, reason="the long profile runs instead (ISOLATION_CHAOS_PROFILE/CHAOS_PROFILE=long)")
@pytest.mark.parametrize(("mode", "isolation", "seconds", "min_ok", "min_committed"), SHORT_CASES)
def test_isolation_chaos_short(
    moto_upstream: str, tmp_path: Path, mode: str, isolation: str, seconds: float, min_ok: int, min_committed: int
) -> None:
    """2 workers x 2 threads under ~1-1.5% of each fault kind, one killed and restarted mid-way.

    The run goes on past ``seconds`` (up to 2.5x) until ``min_ok`` transactions were acknowledged.
    """
    cfg = RunConfig(
        mode=mode, isolation=isolation, seconds=seconds, min_ok=min_ok, max_seconds=2.5 * seconds, seed=SHORT_SEED
    )
    with fake_aws_env():
        res = run_isolation_chaos(moto_upstream, cfg, tmp_path / "run")
    assert_sound(res, min_committed)


LONG_SEEDS = [int(s) for s in os.environ.get("ISOLATION_CHAOS_SEEDS", "1,2,3").split(",") if s.strip()]
LONG_S = _env_float("ISOLATION_CHAOS_SECONDS", 90.0)
LONG_CASES = [
    pytest.param("list-append", "strict_serializable", id="list-append-strict"),
    pytest.param("list-append", "serializable", id="list-append-serializable"),
    pytest.param("bank", "strict_serializable", id="bank-strict"),
    pytest.param("bank", "serializable", id="bank-serializable"),
]


@pytest.mark.chaos
@pytest.mark.s3
@pytest.mark.slow
@pytest.mark.timeout(int(2 * LONG_S) + 600)
@pytest.mark.skipif(not LONG, reason="the long profile runs with ISOLATION_CHAOS_PROFILE=long (or CHAOS_PROFILE=long)")
@pytest.mark.parametrize("seed", LONG_SEEDS)
@pytest.mark.parametrize(("mode", "isolation"), LONG_CASES)
def test_isolation_chaos_long(moto_upstream: str, tmp_path: Path, mode: str, isolation: str, seed: int) -> None:
    """3 workers x 3 threads for minutes, more faults with outage bursts, a kill every ~8 s."""
    kills = max(1, int(LONG_S / 8))
    cfg = RunConfig(
        mode=mode,
        isolation=isolation,
        seconds=LONG_S,
        seed=seed,
        workers=3,
        threads=3,
        keys=8,
        min_ok=int(LONG_S),
        kill_at=tuple((i + random.Random(seed * 7 + i).random()) / (kills + 1) for i in range(kills)),
        faults=long_faults(),
    )
    with fake_aws_env():
        res = run_isolation_chaos(moto_upstream, cfg, tmp_path / "run")
    assert_sound(res, int(LONG_S))
