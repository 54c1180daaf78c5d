"""The long-lived-reader run (issue #25): readers holding one handle for the whole run, checked read by read.

:func:`run_long_readers` on a store (``file://`` directory, or a bucket on
a moto server), with :func:`tests.isolation.long_worker.tight_config`
(part grace 1 s, consensus retention 4 s, reader lease 3 s, GC every 4
versions, every batch a part) in every process:

1. setup: the database and table ``events`` (5 s retention), directly;
2. run: writer processes, reader processes (one handle each for the whole
   run, idle past their lease now and then; planted ones if asked) and a
   maintainer (``db.compact()`` every ~``maintain_every_s``) for
   ``seconds``; readers are SIGKILLed at ``kill_at`` (fractions of the run)
   and started again as new processes (a killed handle's lease then lapses
   on its own);
3. stop: a stop file; every process finishes its current step and writes
   its counts (stragglers are killed);
4. check: ``db.history()`` (a fresh handle) times every commit; writers'
   acknowledgements must agree with it
   (:func:`tests.isolation.long_worker.load_commits`); then
   :func:`tests.isolation.read_checker.check_reads` checks every read.

The result counts what happened: commits, reads by kind, reads below the
since, readers' txns-cache restarts (lease lapses), parts deleted by GC,
consensus versions truncated, compactions, kills.
"""

from __future__ import annotations

import contextlib
import json
import random
import subprocess
import sys
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import txns
from tests.chaos.driver import REPO, child_env
from tests.chaos.driver import _kill as kill
from tests.isolation import long_worker
from tests.isolation.proc_worker import acknowledged, commits_by
from tests.isolation.read_checker import ReadResult, check_reads

TICK_S = 0.1
READY_S = 180.0
"""How long processes get to start and connect (a loaded 2-core box imports slowly) before the run starts."""
FINISH_S = 30.0


@dataclass
class LongConfig:
    """One run (see the module doc)."""

    seconds: float = 15.0
    seed: int = 1
    writers: int = 2
    readers: int = 2
    idle_readers: int = 1
    """Of ``readers``, how many only ever read after an idle time past their lease (never killed)."""
    planted: tuple[str, ...] = ()
    """Extra readers that cheat on purpose (``stale``, ``mixed``): the checker's negative control."""
    kill_at: tuple[float, ...] = (0.5,)
    reader_idle_s: float = 0.4
    maintain_every_s: float = 1.5
    min_ok: int = 0
    """Run past ``seconds`` (up to ``max_seconds``) until the writers have this many acknowledged commits,
    so a slow (loaded) machine still gives a history that means something."""
    min_reads: int = 0
    """... and until the readers have made this many latest reads and half as many ``as_of`` ones."""
    max_seconds: float | None = None
    """None: ``3 * seconds``."""


@dataclass
class LongResult:
    cfg: LongConfig
    backend: str
    check: ReadResult | None = None
    problems: list[str] = field(default_factory=list)
    """Disagreements between the writers and history, unexpected exceptions, processes that died."""
    commits: int = 0
    counts: Counter[str] = field(default_factory=Counter)
    kills: int = 0
    durations: dict[str, float] = field(default_factory=dict)
    work_dir: str = ""

    def summary(self) -> str:
        c = self.cfg
        lines = [
            f"long readers on {self.backend}, seed {c.seed}: {c.seconds:.0f}s, {c.writers} writers, "
            f"{c.readers} readers (+ planted {list(c.planted)}), maintainer every ~{c.maintain_every_s}s",
            f"  commits {self.commits}; kills {self.kills}; counts {dict(sorted(self.counts.items()))}",
            f"  durations {self.durations}; work dir {self.work_dir}",
        ]
        if self.check is not None:
            lines.append("  " + self.check.summary().replace("\n", "\n  "))
        lines.extend(f"  PROBLEM {p[:1500]}" for p in self.problems[:10])
        return "\n".join(lines)


def _enough(cfg: LongConfig, outs: dict[str, list[Path]]) -> bool:
    if acknowledged(outs["writer"]) < cfg.min_ok:
        return False
    reads = latest = 0
    for p in outs["reader"]:
        with contextlib.suppress(OSError):
            data = p.read_bytes()
            reads += data.count(b'"t":"read"')
            latest += data.count(b'"as_of":null')
    return latest >= cfg.min_reads and reads - latest >= cfg.min_reads // 2


def _ready(out: Path) -> bool:
    try:
        return b'"t":"ready"' in out.read_bytes()
    except OSError:
        return False


def make_store(backend: str, work: Path, endpoint: str | None) -> str:
    """A fresh store's URL (``counted+``, so processes count GC and truncation)."""
    if backend == "file":
        return f"counted+file://{work / 'store'}"
    import boto3

    assert endpoint is not None, "an S3 run needs a moto endpoint"
    bucket = f"long-{uuid.uuid4().hex[:20]}"
    admin = boto3.session.Session().client("s3", endpoint_url=endpoint, region_name="us-east-1")
    admin.create_bucket(Bucket=bucket)
    admin.close()
    return f"counted+s3://{bucket}/db?endpoint_url={endpoint}&region=us-east-1"


def run_long_readers(
    backend: str, cfg: LongConfig, work: Path, endpoint: str | None = None, log: Any = print
) -> LongResult:
    """One run (see the module doc); never raises for findings."""
    res = LongResult(cfg, backend, work_dir=str(work))
    t0 = time.monotonic()
    work.mkdir(parents=True, exist_ok=True)
    url = make_store(backend, work, endpoint)
    db = txns.connect(url, config=long_worker.tight_config())
    try:
        db.create_table(long_worker.TABLE, long_worker.SCHEMA, primary_key=["id"], retention=long_worker.RETENTION)
        born_ms = long_worker.clock_ms()
    finally:
        db.close()
    res.durations["setup"] = round(time.monotonic() - t0, 1)

    stop = work / "stop"
    env = child_env()
    procs: list[subprocess.Popen[bytes]] = []
    outs: dict[str, list[Path]] = {"writer": [], "reader": [], "maintainer": []}
    logs: list[Any] = []
    names: Counter[str] = Counter()

    def start(role: str, slot: str, plant: str | None = None, idle: float = 0.0) -> subprocess.Popen[bytes]:
        names[slot] += 1
        name = f"{slot}.{names[slot]}"
        out = work / f"{name}.jsonl"
        argv = [
            sys.executable, "-m", "tests.isolation.long_worker", role, "--url", url, "--out", str(out),
            "--seed", str(cfg.seed), "--process", name, "--stop-file", str(stop),
            "--seconds", str(3 * cfg.seconds + (cfg.max_seconds or 0) + READY_S + FINISH_S), "--born-ms", str(born_ms),
            "--idle-s", str(idle),
        ]  # fmt: skip
        if plant:
            argv += ["--plant", plant]
        f = open(work / f"{name}.log", "ab")  # noqa: SIM115 - closed at the end, after the process
        logs.append(f)
        p = subprocess.Popen(argv, cwd=REPO, env=env, stdin=subprocess.DEVNULL, stdout=f, stderr=f)
        procs.append(p)
        outs[role].append(out)
        return p

    rng = random.Random(f"long-readers-{cfg.seed}")
    try:
        for w in range(cfg.writers):
            start("writer", f"w{w}")
        for r in range(cfg.idle_readers):
            start("reader", f"idle{r}")
        chatty = range(cfg.readers - cfg.idle_readers)
        readers = {f"r{r}": start("reader", f"r{r}", idle=cfg.reader_idle_s) for r in chatty}
        for k, plant in enumerate(cfg.planted):
            start("reader", f"planted-{plant}{k}", plant, idle=cfg.reader_idle_s)
        start("maintainer", "m", idle=cfg.maintain_every_s)
        t = time.monotonic()
        while not all(_ready(o) for ps in outs.values() for o in ps) and time.monotonic() < t + READY_S:
            time.sleep(TICK_S)
        res.durations["start"] = round(time.monotonic() - t, 1)
        t = time.monotonic()
        kills = sorted(t + f * cfg.seconds for f in cfg.kill_at)
        cap = t + (cfg.max_seconds if cfg.max_seconds is not None else 3 * cfg.seconds)
        while time.monotonic() < cap:
            if time.monotonic() >= t + cfg.seconds and _enough(cfg, outs):
                break
            if kills and time.monotonic() >= kills[0] and readers:
                kills.pop(0)
                slot = rng.choice(sorted(readers))
                kill(readers[slot])
                res.kills += 1
                readers[slot] = start("reader", slot, idle=cfg.reader_idle_s)
            time.sleep(TICK_S)
        res.durations["run"] = round(time.monotonic() - t, 1)
        t = time.monotonic()
        stop.touch()
        deadline = t + FINISH_S
        for p in procs:
            try:
                p.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                kill(p)
                res.problems.append(f"a process did not stop within {FINISH_S}s: {p.args}")
        res.durations["finish"] = round(time.monotonic() - t, 1)
    finally:
        for p in procs:
            kill(p)
        for f in logs:
            with contextlib.suppress(OSError):
                f.close()

    t = time.monotonic()
    killed = {p for p in procs if p.returncode is not None and p.returncode < 0}
    res.counts["processes-killed"] = len(killed)
    every = [p for ps in outs.values() for p in ps]
    for r in long_worker.records(every):
        if r.get("t") == "done":
            res.counts.update(r["stats"])
            res.counts.update(r["counts"])
            res.problems.extend(r["unexpected"])
    db = txns.connect(url, create=False, config=long_worker.tight_config())
    try:
        history = commits_by(db.history(), "op")
    finally:
        db.close()
    commits, problems = long_worker.load_commits(outs["writer"], history)
    res.problems.extend(problems)
    res.commits = len(commits)
    res.check = check_reads(commits, long_worker.load_reads(outs["reader"]))
    res.durations["check"] = round(time.monotonic() - t, 1)
    res.durations["total"] = round(time.monotonic() - t0, 1)
    log(res.summary())
    (work / "result.json").write_text(json.dumps({"summary": res.summary(), "counts": dict(res.counts)}))
    return res


__all__ = ["LongConfig", "LongResult", "make_store", "run_long_readers"]
