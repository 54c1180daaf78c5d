"""Cheap opens (issue #13): what opening a handle costs on a txns shard with thousands of retained versions.

One process commits small transactions (one row each) to a txns shard on
moto S3, applying each and tidying it with the next (so the log stays
short); at each checkpoint (200, 2,000 and, with ``--big``, 20,000 commits)
a fresh client opens a ``TxnsHandle`` and reads the upper, and the requests,
bytes and time of that open are printed. Every version stays retained
(consensus versions younger than ``consensus_retention_s``, 10 minutes, are
never truncated), so a store that listed every version would grow with the
checkpoint; persist's S3 consensus writes a ``head-hint`` every 64 versions
and lists from it, so the open should stay flat.

Run: ``.venv/bin/python benchmarks/bench_open.py`` (about 1 minute;
``--big`` adds 20,000 commits, which moto does not finish in 45 minutes:
it walks every key of the bucket for each LIST). ``--backend file`` runs
the same on a local directory, where the counts are storage calls (a
``head`` or ``scan`` lists the versions' directory) and ``--big`` takes a
few minutes.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import tempfile
import time

import pyarrow as pa

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from common import diff, human_bytes, moto_server, new_bucket_url, open_counted, print_table, total

from persist import PersistClient, Schema, ShardId
from txns import TxnsHandle

SCHEMA = Schema(key=pa.schema([("k", pa.int64())]), val=pa.schema([("v", pa.string())]))


def measure_open(url: str, txns_id: str) -> dict[str, float]:
    c = open_counted(url)
    before = c.snapshot()
    t0 = time.perf_counter()
    h = TxnsHandle.open(c.client, txns_id, hold=False)
    upper = h.upper
    seconds = time.perf_counter() - t0
    counts = diff(c.snapshot(), before)
    h.close()
    t = total(counts)
    # (on file://, the logical calls that list a directory: head, scan, blob list)
    lists = total(counts, lambda k: k.startswith("LIST") or k in ("head", "scan", "blob list")).requests
    return {"upper": upper, "requests": t.requests, "lists": lists, "bytes in": t.bytes_in, "ms": 1000 * seconds}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--big", action="store_true")
    p.add_argument(
        "--backend",
        choices=["s3", "file"],
        default="s3",
        help="s3 (moto, the default) or file (a local directory: storage calls instead of requests)",
    )
    a = p.parse_args()
    checkpoints = [200, 2_000] + ([20_000] if a.big else [])
    rows = []
    with contextlib.ExitStack() as stack:
        if a.backend == "s3":
            url = new_bucket_url(stack.enter_context(moto_server()))
        else:
            url = "file://" + stack.enter_context(tempfile.TemporaryDirectory(prefix="bench_open_"))
        client = PersistClient.open(url)
        txns_id = str(ShardId.new())
        h = TxnsHandle.open(client, txns_id)
        d = str(ShardId.new())
        h.register(h.upper, {d: SCHEMA})
        n = 0
        t0 = time.perf_counter()
        tidy = None
        for cp in checkpoints:
            while n < cp:
                txn = h.begin()
                txn.write(d, (n,), ("x" * 50,), 1)
                if tidy is not None:
                    txn.tidy(tidy)  # (applied entries leave the log: the state stays small, the versions stay)
                tidy = h.commit(txn).apply(h)
                n += 1
            head = client.consensus.head(txns_id)
            r = measure_open(url, txns_id)
            print(f"  {n} commits ({time.perf_counter() - t0:.0f} s): {r}", flush=True)
            rows.append([n, head.seqno if head else 0, int(r["requests"]), int(r["lists"]),
                         human_bytes(r["bytes in"]), f"{r['ms']:.0f}"])  # fmt: skip
        h.close()
    print_table(
        ["commits", "txns-shard versions retained", "requests to open", "of them LIST", "bytes read", "ms"],
        rows,
        title="opening a TxnsHandle (and reading its upper) on "
        + ("moto S3" if a.backend == "s3" else "a local directory"),
    )


if __name__ == "__main__":
    main()
