"""Transaction repair of functions (``run_batch``, txns.db.batch): 1,000 transfers, contention high to low.

Workload: a keyed table ``acct(id, bal)`` of N accounts (``--accounts``, 10,
100 and 10,000: contention high to low), each starting at 100, on a
``file://`` temporary directory; ``--txns`` (1,000) transfer functions, each
moving 1-50 between two distinct random accounts (seeded) and aborting
(``txns.Abort``) if the source would go negative.

For each N, printed as a Markdown table:

- ``run_batch`` with threads (default pool) and with processes (2 workers,
  spawned: their start-up is included): time, executions per transaction
  (``executions / n`` = 1 + repairs / n), repairs, aborts, database
  transactions tried;
- the same transfers one by one with ``db.run`` (one database transaction
  each: the isolation path), for the ratio;
- a check that both end in the same table (the batch equals serial execution).

Run: ``.venv/bin/python benchmarks/bench_repair.py`` (a minute or two on 2 cores);
``--quick`` for 200 transfers; ``--json out.json`` for the raw numbers.
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from common import emit_json, load, print_table

import txns
from txns.db.batch import run_batch

TABLE = "acct"
SCHEMA = pa.schema([("id", pa.string()), ("bal", pa.int64())])
START = 100


@dataclass(frozen=True)
class Transfer:
    """Move ``amount`` from ``src`` to ``dst``; abort if ``src`` would go negative (picklable)."""

    src: str
    dst: str
    amount: int

    def __call__(self, ctx: Any) -> None:
        s = ctx.get(TABLE, self.src)
        if s is None or s["bal"] < self.amount:
            raise txns.Abort(f"insufficient funds in {self.src}")
        d = ctx.get(TABLE, self.dst)
        ctx.put(TABLE, {"id": self.src, "bal": s["bal"] - self.amount})
        ctx.put(TABLE, {"id": self.dst, "bal": d["bal"] + self.amount})

    def in_transaction(self, t: Any) -> None:
        """The same transfer through a ``Transaction`` (for ``db.run``)."""
        s = t.get(TABLE, self.src)
        if s is None or s["bal"] < self.amount:
            raise txns.Abort(f"insufficient funds in {self.src}")
        d = t.get(TABLE, self.dst)
        rows = [{"id": self.src, "bal": s["bal"] - self.amount}, {"id": self.dst, "bal": d["bal"] + self.amount}]
        t.upsert(TABLE, rows)


def transfers(n: int, accounts: int, seed: int = 7) -> list[Transfer]:
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        a, b = rng.sample(range(accounts), 2)
        out.append(Transfer(f"a{a}", f"a{b}", rng.randint(1, 50)))
    return out


def fresh(root: Path, name: str, accounts: int) -> txns.Database:
    db = txns.connect((root / name).as_uri())
    db.create_table(TABLE, SCHEMA, primary_key=["id"])
    with db.transaction() as t:
        t.upsert(TABLE, [{"id": f"a{i}", "bal": START} for i in range(accounts)])
    return db


def contents(db: txns.Database) -> dict[str, int]:
    return {r["id"]: r["bal"] for r in db.table(TABLE).to_arrow().to_pylist()}


def serial(root: Path, fns: list[Transfer], accounts: int) -> tuple[float, int, dict[str, int]]:
    db = fresh(root, f"serial-{accounts}", accounts)
    aborts = 0
    t0 = time.perf_counter()
    for f in fns:
        try:
            db.run(f.in_transaction)
        except txns.Abort:
            aborts += 1
    seconds = time.perf_counter() - t0
    state = contents(db)
    db.close()
    return seconds, aborts, state


def batch(root: Path, fns: list[Transfer], accounts: int, executor: str, workers: int | None) -> dict[str, Any]:
    db = fresh(root, f"batch-{executor}-{accounts}", accounts)
    t0 = time.perf_counter()
    res = run_batch(db, list(fns), executor=executor, workers=workers)
    seconds = time.perf_counter() - t0
    state = contents(db)
    db.close()
    return {
        "seconds": seconds,
        "executions": res.executions,
        "executions_per_txn": res.executions_per_txn,
        "repairs": res.repairs,
        "aborts": len(res.aborted),
        "attempts": res.attempts,
        "state": state,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--txns", type=int, default=1000)
    ap.add_argument("--accounts", type=int, nargs="*", default=[10, 100, 10_000])
    ap.add_argument("--workers", type=int, default=2, help="process pool size")
    ap.add_argument("--quick", action="store_true", help="200 transfers")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    n = 200 if args.quick else args.txns
    print(f"# bench_repair: {n} transfers; {load()}; {os.cpu_count()} cores")
    rows: list[list[Any]] = []
    results: dict[str, Any] = {"txns": n, "runs": []}
    with tempfile.TemporaryDirectory(prefix="bench-repair-") as tmp:
        root = Path(tmp)
        for accounts in args.accounts:
            fns = transfers(n, accounts)
            s_seconds, s_aborts, s_state = serial(root, fns, accounts)
            for executor, workers in (("threads", None), ("processes", args.workers)):
                r = batch(root, fns, accounts, executor, workers)
                same = r.pop("state") == s_state
                results["runs"].append(
                    {
                        "accounts": accounts,
                        "executor": executor,
                        **r,
                        "serial_seconds": s_seconds,
                        "serial_aborts": s_aborts,
                        "same_as_serial": same,
                    }
                )
                rows.append(
                    [
                        accounts,
                        executor if workers is None else f"{executor} ({workers})",
                        f"{r['seconds']:.2f}",
                        f"{r['executions_per_txn']:.3f}",
                        r["repairs"],
                        r["aborts"],
                        r["attempts"],
                        f"{s_seconds:.2f}",
                        f"{s_seconds / r['seconds']:.1f}x",
                        "yes" if same else "NO",
                    ]
                )
    print_table(
        [
            "accounts",
            "run_batch executor",
            "batch s",
            "executions/txn",
            "repairs",
            "aborts",
            "attempts",
            "db.run one by one s",
            "speed-up",
            "same as serial",
        ],
        rows,
        title=f"{n} transfers: run_batch vs db.run one by one (file://)",
    )
    emit_json(args.json, results)


if __name__ == "__main__":
    main()
