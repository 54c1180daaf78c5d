"""The long chaos profile: many seeds, minutes each, on S3 (moto behind the fault proxy) and on a directory.

Each run is :func:`tests.chaos.driver.run_chaos` (workers committing bank
transfers, SIGKILLed at random times and at crash points, operator commands
killed too, every fault kind of :mod:`persist.fault_proxy` with outage
bursts; then every pending transaction must commit with faults off, and a
fresh verifier checks every timestamp for lost, duplicated and torn
transfers). Runs go one after the other (the machine has 2 cores).

Cases:

- ``s3``: moto + fault proxy, workers with ``retry_deadline_s`` 3 s, CLI runs.
- ``s3-tight``: the same with ``part_grace_s`` 1 s, ``consensus_retention_s``
  4 s and ``reader_lease_s`` 6 s (part deletion, version truncation and
  lapsed leases under faults), two long-lived readers checked against the
  history and the maintainer (compaction and GC in a loop) instead of CLI
  runs (see tests/chaos/driver.py).
- ``file``: a local directory, kills only.

Usage::

    .venv/bin/python benchmarks/chaos.py                                   # 3 seeds x 3 cases x 180 s
    .venv/bin/python benchmarks/chaos.py --seeds 1-10 --seconds 300 --cases s3,s3-tight
    .venv/bin/python benchmarks/chaos.py --quick                           # 1 seed x 3 cases x 30 s
    .venv/bin/python benchmarks/chaos.py --json results.json --work-dir /tmp/chaos

It prints one Markdown table row per run as it finishes, then the whole
table and the violations found (with examples). The exit status is 1 if any
run found a violation. Each run's state (worker logs, stats, acked files,
the verifier's report) stays in its work directory.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.chaos.driver import ChaosConfig, ChaosResult, run_chaos

CASES: dict[str, dict[str, str]] = {
    "s3": {"backend": "s3", "variant": "default"},
    "s3-tight": {"backend": "s3", "variant": "tight"},
    "file": {"backend": "file", "variant": "default"},
}
HEADER = (
    "| case | seed | run s | total s | acked | ledger rows | ts checked | kills | crash points | "
    "cli runs | faults | commit exc (ind/det/ts) | parts deleted | versions truncated | leases lapsed | "
    "reads checked | violations |"
)
RULE = "|" + "---|" * (HEADER.count("|") - 1)


def parse_seeds(text: str) -> list[int]:
    out: list[int] = []
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        if "-" in part:
            lo, hi = part.split("-", 1)
            out.extend(range(int(lo), int(hi) + 1))
        else:
            out.append(int(part))
    return out


def row(case: str, r: ChaosResult) -> str:
    faults = sum(v for k, v in r.faults.items() if k not in ("requests", "forwarded", "connections"))
    exc = r.exceptions
    ind = exc.get("commit:Indeterminate", 0)
    det = exc.get("commit:Determinate", 0)
    tsu = exc.get("commit:TimestampUnavailable", 0)
    viol = ", ".join(f"{k} {v}" for k, v in sorted(r.violations.items())) or "none"
    return (
        f"| {case} | {r.seed} | {r.durations.get('run', 0):.0f} | {r.durations.get('total', 0):.0f} | {r.acked} | "
        f"{r.ledger_rows} | {r.timestamps_checked} | {r.worker_kills} | {sum(r.worker_crashes.values())} | "
        f"{sum(v for k, v in r.cli_runs.items() if not k.startswith('final'))} | {faults} | {ind}/{det}/{tsu} "
        f"| {r.persist.get('parts_deleted', 0)} | {r.persist.get('versions_truncated', 0)} | "
        f"{r.persist.get('reader_leases_lapsed', 0)} | {r.verifier.get('reads_checked', 0)} | {viol} |"
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--seeds", default="1-3", help="seeds: 1,2,5 or 1-10 (default 1-3)")
    p.add_argument("--seconds", type=float, default=180.0, help="run-phase length of each run (default 180)")
    p.add_argument("--cases", default="s3,s3-tight,file", help=f"comma-separated, of {', '.join(CASES)}")
    p.add_argument("--workers", type=int, default=3)
    p.add_argument(
        "--gc-older-than",
        type=float,
        default=30.0,
        help="txns gc --older-than during runs (default 30; below the time a pending commit can take, "
        "gc deletes parts of transactions about to commit: see tests/chaos/driver.py)",
    )
    p.add_argument("--quick", action="store_true", help="1 seed x every case x 30 s")
    p.add_argument("--work-dir", default=None, help="keep runs under this directory (default: a temp dir)")
    p.add_argument("--json", default=None, help="write every result as JSON here")
    p.add_argument("--verbose", action="store_true", help="print the driver's progress lines")
    a = p.parse_args(argv)
    seeds = [1] if a.quick else parse_seeds(a.seeds)
    seconds = 30.0 if a.quick else a.seconds
    cases = [c.strip() for c in a.cases.split(",") if c.strip()]
    for c in cases:
        if c not in CASES:
            p.error(f"unknown case {c!r}; known: {', '.join(CASES)}")
    base = Path(a.work_dir) if a.work_dir else Path(tempfile.mkdtemp(prefix="txns-chaos-bench-"))
    base.mkdir(parents=True, exist_ok=True)
    print(f"chaos: {len(seeds)} seeds x {len(cases)} cases x {seconds:.0f}s, work dir {base}", flush=True)
    print(HEADER)
    print(RULE, flush=True)
    results: list[tuple[str, ChaosResult]] = []
    started = time.monotonic()
    for seed in seeds:
        for case in cases:
            cfg = ChaosConfig(
                seconds=seconds,
                seed=seed,
                workers=a.workers,
                gc_older_than_s=a.gc_older_than,
                work_dir=base / f"{case}-seed{seed}",
                log=(lambda m: print(f"  {m}", file=sys.stderr, flush=True)) if a.verbose else None,
                **CASES[case],  # type: ignore[arg-type]
            )
            r = run_chaos(cfg)
            results.append((case, r))
            print(row(case, r), flush=True)
    print(f"\n{len(results)} runs in {time.monotonic() - started:.0f}s\n")
    print(HEADER)
    print(RULE)
    for case, r in results:
        print(row(case, r))
    bad = [(c, r) for c, r in results if not r.ok]
    if bad:
        print(f"\n{len(bad)} of {len(results)} runs found violations:")
        for case, r in bad:
            print(f"\n{case} seed {r.seed} ({r.work_dir}):")
            for kind, n in sorted(r.violations.items()):
                print(f"  {kind}: {n}")
                for ex in r.examples.get(kind, [])[:3]:
                    print(f"    {ex[:400]}")
    else:
        print("\nno violations")
    if a.json:
        Path(a.json).write_text(json.dumps([{"case": c, **r.to_json()} for c, r in results], indent=1))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
