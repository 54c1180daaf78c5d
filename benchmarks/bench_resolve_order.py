"""Serialization order within an epoch (txns.resolve.order): committed fraction, id order vs each strategy.

The workload is ``benchmarks/bench_resolve.py``'s version of the post's (each
transaction reads two keys expecting absence and writes two others; keys
hashed from the id), with ``--txns`` transactions (10,000) over each of
``--keys`` key counts (10,000, the post's, and 1,000, more contended).
For each strategy of :func:`txns.resolve.order.reorder`: the fraction of
transactions that commit, the gain over id order, the fixpoint's rounds, and
the time of ``reorder`` and of ``resolve`` in the new order.

Run: ``.venv/bin/python benchmarks/bench_resolve_order.py`` (a few seconds);
``--keys 10000 1000 100`` adds a hot variant (readers-first is quadratic in
per-key readers x writers: ~15 s at 100 keys); ``--json out.json`` for the raw numbers.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench_resolve import workload
from common import emit_json, load, print_table

from txns.resolve import resolve
from txns.resolve.order import STRATEGIES, renumber, reorder


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--txns", type=int, default=10_000)
    p.add_argument("--keys", type=int, nargs="+", default=[10_000, 1_000])
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", help="also write the raw results to this file")
    args = p.parse_args()
    print(f"bench_resolve_order: {os.cpu_count()} cores, {load()}", flush=True)
    results: dict[str, Any] = {"args": vars(args), "runs": []}
    for keys in args.keys:
        intents = workload(range(1, args.txns + 1), keys)
        rows = []
        base = None
        for strategy in STRATEGIES:
            t0 = time.perf_counter()
            order = reorder(intents, strategy, args.seed)
            t1 = time.perf_counter()
            res = resolve(renumber(intents, order))
            t2 = time.perf_counter()
            frac = 1 - res.rollback.num_rows / args.txns
            base = frac if base is None else base
            rows.append(
                [
                    strategy,
                    f"{frac:.3f}",
                    f"{frac - base:+.3f}",
                    res.rounds,
                    f"{(t1 - t0) * 1e3:.0f} ms",
                    f"{(t2 - t1) * 1e3:.0f} ms",
                ]
            )
            results["runs"].append(
                {
                    "keys": keys,
                    "strategy": strategy,
                    "committed_fraction": frac,
                    "rounds": res.rounds,
                    "reorder_s": t1 - t0,
                    "resolve_s": t2 - t1,
                }
            )
        print_table(
            ["strategy", "committed", "gain vs id order", "rounds", "reorder", "resolve"],
            rows,
            title=f"{args.txns:,} transactions over {keys:,} keys",
        )
    emit_json(args.json, results)


if __name__ == "__main__":
    main()
