"""Bytes of shard state per commit (issue #13, "small state writes"): compressed states against the old format.

A conditional write uploads a version of a shard's state, so its size is
what a small commit costs in bytes. A database on moto S3 runs N one-row
commits in a tight loop (``with db.transaction() as t: t.insert(...)``); the
wire counter on its S3 client counts what goes out and comes in. Three
formats in the same run, each on a fresh bucket:

- ``diffs`` (the format since 26 Nov 2026, second session): each version a
  diff against the previous one (frame version 3), the whole state (a
  rollup) every ``state_rollup_every`` versions;
- ``zstd``: every version the whole state, framed with version 2 (a zstd
  frame of the JSON; ``state_rollup_every=1``);
- ``plain``: every version whole, framed with version 1, the JSON as it is
  (what every version before 26 Nov wrote; the benchmark switches the
  encoder back).

Printed per format: mean bytes PUT to consensus per commit (states: the
commits' and the background maintenance's), the largest and the last
txns-shard state object, bytes read per commit, requests per commit, ms per
commit, and a fresh process's open (``txns.connect``) afterwards.

Run: ``.venv/bin/python benchmarks/bench_state_bytes.py`` (``--commits N``;
about 1 minute).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable
from typing import Any

import boto3
import pyarrow as pa

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from common import WireCounter, human_bytes, load, moto_server, new_bucket_url, print_table, total

import persist._internal.state as state_module
import txns
from persist import PersistConfig

SCHEMA = pa.schema([("k", pa.string()), ("v", pa.int64())])


def _plain_frames() -> Callable[[], None]:
    """Make states encode as version-1 frames (uncompressed) until the returned undo is called."""
    original = state_module.frame

    def frame(kind: int, payload: bytes, *, compress: bool = False) -> bytes:
        return original(kind, payload, compress=False)

    state_module.frame = frame  # type: ignore[assignment]

    def undo() -> None:
        state_module.frame = original

    return undo


def _objects(endpoint: str, url: str, shard: str) -> list[int]:
    s3 = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")
    bucket = url.split("/")[2].split("?")[0]
    sizes: list[tuple[str, int]] = []
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket):
        for o in page.get("Contents", []):
            if shard in o["Key"] and "/consensus/" in o["Key"] and o["Key"].rsplit("/", 1)[-1].isdigit():
                sizes.append((o["Key"], o["Size"]))  # (versions only: not the head hint)
    return [n for _, n in sorted(sizes)]


FORMATS = ("diffs", "zstd", "plain")


def run(endpoint: str, commits: int, fmt: str) -> dict[str, Any]:
    undo = _plain_frames() if fmt == "plain" else (lambda: None)
    config = PersistConfig() if fmt == "diffs" else PersistConfig(state_rollup_every=1)
    try:
        url = new_bucket_url(endpoint)
        db = txns.connect(url, config=config)
        db.create_table("t", SCHEMA)
        wire = WireCounter(db.client.blob._client)  # type: ignore[attr-defined]
        t0 = time.perf_counter()
        for i in range(commits):
            with db.transaction() as t:
                t.insert("t", [{"k": f"k{i}", "v": i}])
        seconds = time.perf_counter() - t0
        snap = wire.snapshot()
        sizes = _objects(endpoint, url, db.root.txns_id)
        db.close()
        t1 = time.perf_counter()
        fresh = txns.connect(url, config=config)
        fresh_wire = WireCounter(fresh.client.blob._client)  # type: ignore[attr-defined]
        fresh.table("t").to_arrow()
        open_ms = (time.perf_counter() - t1) * 1000
        opened = total(fresh_wire.snapshot())
        fresh.close()
    finally:
        undo()
    cons_put = total(snap, lambda k: k.startswith("PUT consensus"))
    every = total(snap)
    return {
        "format": {
            "diffs": "diffs (version 3)",
            "zstd": "whole, zstd (version 2)",
            "plain": "whole, plain (version 1)",
        }[fmt],
        "kind": fmt,
        "state PUT bytes per commit": cons_put.bytes_out / commits,
        "largest txns state": max(sizes) if sizes else 0,
        "median txns version": sorted(sizes)[len(sizes) // 2] if sizes else 0,
        "last txns state": sizes[-1] if sizes else 0,
        "bytes in per commit": every.bytes_in / commits,
        "requests per commit": every.requests / commits,
        "ms per commit": seconds * 1000 / commits,
        "open": f"{opened.requests} requests, {human_bytes(opened.bytes_in)} in, {open_ms:.0f} ms",
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--commits", type=int, default=200)
    p.add_argument("--rounds", type=int, default=2, help="each format once per round, in turns (default 2)")
    a = p.parse_args()
    print(f"bench_state_bytes: {a.commits} one-row commits per format, moto S3; {load()}", flush=True)
    rows = []
    with moto_server() as endpoint:
        results = [run(endpoint, a.commits, fmt) for _ in range(a.rounds) for fmt in FORMATS]
    for r in results:
        rows.append(
            [
                r["format"],
                human_bytes(r["state PUT bytes per commit"]),
                human_bytes(r["median txns version"]),
                human_bytes(r["largest txns state"]),
                human_bytes(r["last txns state"]),
                human_bytes(r["bytes in per commit"]),
                f"{r['requests per commit']:.2f}",
                f"{r['ms per commit']:.1f}",
                r["open"],
            ]
        )
    keys = ("state PUT bytes per commit", "ms per commit")
    means = {f: {k: sum(r[k] for r in results if r["kind"] == f) / a.rounds for k in keys} for f in FORMATS}
    for f in FORMATS:
        means[f]["largest txns state"] = max(r["largest txns state"] for r in results if r["kind"] == f)
    for f in ("zstd", "plain"):
        rows.append(
            [
                f"{f} / diffs (means over the rounds)",
                f"{means[f]['state PUT bytes per commit'] / means['diffs']['state PUT bytes per commit']:.1f}x",
                "",
                f"{means[f]['largest txns state'] / max(1, means['diffs']['largest txns state']):.1f}x",
                "",
                "",
                "",
                f"{means[f]['ms per commit'] / means['diffs']['ms per commit']:.2f}x",
                "",
            ]
        )
    print_table(
        ["state format", "state bytes PUT per commit", "median txns version", "largest txns version",
         "last txns version", "bytes in per commit",
         "requests per commit", "ms per commit", "a fresh open + read"],
        rows,
        title=f"{a.commits} one-row database commits in a loop, moto S3, wire counts",
    )  # fmt: skip


if __name__ == "__main__":
    main()
