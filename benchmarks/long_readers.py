"""The long profile of the long-lived-reader checker (issue #25): many seeds, minutes each, on S3 and a directory.

Each run is :func:`tests.isolation.long_readers.run_long_readers`: writer
processes committing in phases (their handles closed between phases),
readers that keep one ``Database`` for the whole run (one only ever reads
after an idle time past its reader lease; the others read every fraction of
a second, are SIGKILLed now and then and start again), a maintainer running
``db.compact()`` (retention holds, compaction, release of dropped tables);
every process with part grace 1 s, consensus retention 4 s, reader lease
3 s and GC every 4 versions. Every read must equal the table at a time
inside its real-time window (latest) or at its ``as_of``
(:mod:`tests.isolation.read_checker`). Runs go one after the other (the
machine has 2 cores).

Usage::

    .venv/bin/python benchmarks/long_readers.py                              # 3 seeds x {file, s3} x 180 s
    .venv/bin/python benchmarks/long_readers.py --seeds 1-5 --seconds 300 --backends s3
    .venv/bin/python benchmarks/long_readers.py --quick                      # 1 seed x {file, s3} x 30 s
    .venv/bin/python benchmarks/long_readers.py --planted                    # with the planted readers (must be caught)

It prints one Markdown table row per run, then the whole table; the exit
status is 1 if an honest reader read a wrong state, or a planted one was
not caught. Each run's records stay in its work directory.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from persist.testing import fake_aws_env
from tests.chaos.driver import moto_subprocess
from tests.isolation.long_readers import LongConfig, LongResult, run_long_readers

HEADER = (
    "| backend | seed | run s | commits | latest reads | as_of reads | below since | cache restarts | "
    "parts deleted | versions truncated | compactions | kills | anomalies (honest) | planted caught |"
)
RULE = "|" + "---|" * (HEADER.count("|") - 1)


def parse_seeds(text: str) -> list[int]:
    out: list[int] = []
    for part in text.split(","):
        if "-" in part:
            lo, hi = part.split("-")
            out.extend(range(int(lo), int(hi) + 1))
        elif part.strip():
            out.append(int(part))
    return out


def judge(res: LongResult) -> tuple[int, str]:
    """(anomalies of honest readers, whether every planted reader was caught)."""
    assert res.check is not None
    honest = sum(sum(k.values()) for p, k in res.check.by_process.items() if not p.startswith("planted-"))
    planted = {p for p in res.check.by_process if p.startswith("planted-")}
    caught = "-" if not res.cfg.planted else f"{len(planted)}/{len(res.cfg.planted)}"
    return honest + len(res.problems), caught


def row(res: LongResult) -> str:
    assert res.check is not None
    c = res.counts
    bad, caught = judge(res)
    return (
        f"| {res.backend} | {res.cfg.seed} | {res.durations.get('run', 0):.0f} | {res.commits} | "
        f"{res.check.reads.get('latest', 0)} | {res.check.reads.get('as_of', 0)} | {c['below-since']} | "
        f"{c['cache-restarts']} | {c['parts_deleted']} | {c['versions_truncated']} | {c['compactions']} | "
        f"{res.kills} | {bad} | {caught} |"
    )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", default="1-3")
    ap.add_argument("--seconds", type=float, default=180.0)
    ap.add_argument("--backends", default="file,s3")
    ap.add_argument("--writers", type=int, default=3)
    ap.add_argument("--readers", type=int, default=3)
    ap.add_argument("--planted", action="store_true", help="add a stale and a mixed planted reader to every run")
    ap.add_argument("--quick", action="store_true", help="1 seed, 30 s")
    ap.add_argument("--work-dir", default=None)
    args = ap.parse_args()
    seeds = [1] if args.quick else parse_seeds(args.seeds)
    seconds = 30.0 if args.quick else args.seconds
    work = Path(args.work_dir or tempfile.mkdtemp(prefix="long-readers-"))
    work.mkdir(parents=True, exist_ok=True)
    rows, failed = [], False
    backends = args.backends.split(",")
    with contextlib.ExitStack() as stack:
        stack.enter_context(fake_aws_env())
        endpoint = stack.enter_context(moto_subprocess(sys.executable, work / "moto.log")) if "s3" in backends else None
        print(HEADER)
        print(RULE, flush=True)
        for backend in backends:
            for seed in seeds:
                cfg = LongConfig(
                    seconds=seconds, seed=seed, writers=args.writers, readers=args.readers,
                    planted=("stale", "mixed") if args.planted else (),
                    kill_at=tuple((i + 0.5) / max(1, int(seconds / 20)) for i in range(max(1, int(seconds / 20)))),
                    min_ok=int(seconds),
                )  # fmt: skip
                res = run_long_readers(backend, cfg, work / f"{backend}-{seed}", endpoint=endpoint, log=lambda _: None)
                rows.append(row(res))
                print(rows[-1], flush=True)
                bad, caught = judge(res)
                if bad or (cfg.planted and caught != f"{len(cfg.planted)}/{len(cfg.planted)}"):
                    failed = True
                    print(res.summary(), file=sys.stderr, flush=True)
    print()
    print(HEADER)
    print(RULE)
    print("\n".join(rows))
    print(f"\nwork dir: {work}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
