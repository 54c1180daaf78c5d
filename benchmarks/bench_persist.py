"""Benchmarks of persist: requests and bytes per append, batch throughput, memory of big writes.

Sections (each prints a Markdown table; nothing here asserts on time):

1. ``small`` (S3/moto, wire counts): requests and bytes of a small append by a
   writer whose cached state is current (goal: one conditional PUT, no read),
   the first append of a freshly opened handle, and an append after a lost
   race (another writer appended in between). Steady state is measured with
   the default config (compaction on) and with compaction off, so the cost of
   the append path itself and the amortized cost of maintenance are apart.
   ``versions``: what reading the head costs (a fresh handle's open, an
   append after a lost race) as the shard's retained versions grow.
2. ``batch`` (S3/moto, wire counts): one append of ``--mb`` MB written through
   ``WriteHandle.builder``: part PUTs (and how many were in flight at once),
   the one state PUT, time and MB/s, against a plain PUT of the same bytes
   measured in the same run.
3. ``memory`` (file://, one subprocess per case): peak memory of a ``--gb`` GB
   append through ``WriteHandle.builder`` with the default part size and a
   smaller one: tracemalloc peak (Python heap), Arrow pool peak, and peak RSS
   growth (VmHWM after reset, /proc/self/status). The factor printed is
   peak RSS growth / part size.

Usage::

    .venv/bin/python benchmarks/bench_persist.py                 # all, defaults (a few minutes)
    .venv/bin/python benchmarks/bench_persist.py --quick         # small sizes, seconds
    .venv/bin/python benchmarks/bench_persist.py --only small --appends 500
    .venv/bin/python benchmarks/bench_persist.py --only memory --gb 2 --part-mb 64 8
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import tracemalloc
from collections.abc import Callable, Iterator

import pyarrow as pa

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from common import (
    MB,
    Attribution,
    Counted,
    Snapshot,
    diff,
    emit_json,
    fmt_counts,
    human_bytes,
    load,
    measure,
    moto_server,
    new_bucket_url,
    open_counted,
    peak_rss_bytes,
    print_table,
    reset_peak_rss,
    rss_bytes,
    total,
)

from persist import PersistClient, PersistConfig, Schema, ShardId, UpperMismatch

SMALL_SCHEMA = Schema(key=pa.schema([("id", pa.int64())]), val=pa.schema([("name", pa.string())]))
VAL_BYTES = 100
BIG_SCHEMA = Schema(key=pa.schema([("id", pa.int64())]), val=pa.schema([("payload", pa.binary(VAL_BYTES))]))
ROW_BYTES = 8 + VAL_BYTES + 8 + 8  # Arrow bytes per row: id, payload, ts, diff


def small_updates(i: int, rows: int) -> list:
    return [(((i * rows + j,), (f"user-{i}-{j}",)), i, 1) for j in range(rows)]


def puts(s: Snapshot) -> int:
    return total(s, lambda k: k.startswith("PUT") and "(" not in k).requests


def reqs(s: Snapshot) -> int:
    return total(s, lambda k: "(" not in k).requests


def bytes_out(s: Snapshot) -> int:
    return total(s, lambda k: "(" not in k).bytes_out


def bytes_in(s: Snapshot) -> int:
    return total(s, lambda k: "(" not in k).bytes_in


# ---- 1. small appends ------------------------------------------------------------------


def bench_small(url_factory: Callable[[], str], appends: int, rows: int) -> dict:
    out: dict = {}
    table: list[list] = []

    def row(what: str, m_counts: Snapshot, ms: float, goal: str, n: int = 1, maint: Snapshot | None = None) -> None:
        table.append(
            [
                what,
                f"{reqs(m_counts) / n:.2f}",
                f"{puts(m_counts) / n:.2f}",
                fmt_counts(m_counts, with_bytes=False) if n == 1 else "see below",
                "-" if maint is None else (fmt_counts(maint, with_bytes=False) if maint else "0"),
                human_bytes(bytes_out(m_counts) / n),
                human_bytes(bytes_in(m_counts) / n),
                f"{ms:.1f}",
                goal,
            ]
        )

    def timed(c: Counted, attr: Attribution, fn: Callable[[], object]) -> tuple[Snapshot, Snapshot, float]:
        """Run ``fn``: its counts, the part of them spent in maintenance, and ms."""
        a0 = attr.snapshot()
        with measure(c) as m:
            fn()
        return m.counts, diff(attr.snapshot(), a0), m.seconds * 1000

    # -- a brand new shard
    a = open_counted(url_factory())
    sid = ShardId.new()
    with measure(a) as m_open:
        wa = a.client.open_writer(sid, SMALL_SCHEMA)
    row("open_writer, new shard", m_open.counts, m_open.seconds * 1000, "-")
    attr_a = Attribution(a)
    attr_a.wrap(wa, "maintain")
    counts, maint, ms = timed(a, attr_a, lambda: wa.compare_and_append(small_updates(0, rows), 0, 1))
    row("first append, new shard", counts, ms, "1 PUT", maint=maint)
    out["first_append_new_shard"] = counts

    # -- steady state, default config and compaction off
    for label, cfg in (
        ("default config", PersistConfig()),
        ("compaction off", PersistConfig(compaction_enabled=False)),
    ):
        c = open_counted(url_factory(), cfg)
        w = c.client.open_writer(ShardId.new(), SMALL_SCHEMA)
        w.compare_and_append(small_updates(0, rows), 0, 1)
        attr = Attribution(c)
        attr.wrap(w, "maintain")  # compaction and GC requested by the append
        per: list[Snapshot] = []
        per_path: list[Snapshot] = []
        times: list[float] = []
        state_sizes: list[int] = []
        with measure(c) as m_all:
            for i in range(1, appends + 1):
                a0 = attr.snapshot()
                with measure(c) as m:
                    w.compare_and_append(small_updates(i, rows), i, i + 1)
                maint = diff(attr.snapshot(), a0)
                per.append(m.counts)
                per_path.append(diff(m.counts, maint))
                times.append(m.seconds * 1000)
                state_sizes.append(total(per_path[-1], lambda k: k == "PUT consensus").bytes_out)
        dist = collections.Counter(reqs(p) for p in per)
        path_dist = collections.Counter(reqs(p) for p in per_path)
        exactly_one = sum(1 for p in per_path if reqs(p) == 1 and puts(p) == 1)
        maint_total = attr.snapshot()
        row(
            f"steady-state append ({label}), mean of {appends}",
            m_all.counts,
            statistics.mean(times),
            "1 PUT",
            n=appends,
        )
        if label == "default config":
            row(
                "  of which the append itself (maintenance excluded)",
                diff(m_all.counts, maint_total),
                statistics.mean(times),
                "1 PUT",
                n=appends,
            )
            row("  of which compaction requested by the appends", maint_total, 0.0, "-", n=appends)
        out[f"steady_{label}"] = {
            "appends": appends,
            "total": m_all.counts,
            "requests_per_append_histogram": dict(sorted(dist.items())),
            "append_path_requests_histogram": dict(sorted(path_dist.items())),
            "appends_whose_own_path_is_exactly_one_put": exactly_one,
            "maintenance_total": maint_total,
            "appends_that_ran_compaction": sum(1 for p, q in zip(per, per_path, strict=True) if reqs(p) != reqs(q)),
            "median_ms": statistics.median(times),
            "state_put_bytes_first": state_sizes[0],
            "state_put_bytes_last_min": min(state_sizes[-10:]),
            "batches_in_state_at_end": len(w.shard.state().batches),
        }

    # -- a fresh handle (new client: nothing cached) on an existing shard
    b = open_counted(a.client.url)
    with measure(b) as m_bopen:
        wb = b.client.open_writer(sid, SMALL_SCHEMA)
    row("open_writer, existing shard (fresh client)", m_bopen.counts, m_bopen.seconds * 1000, "-")
    attr_b = Attribution(b)
    attr_b.wrap(wb, "maintain")
    counts, maint, ms = timed(b, attr_b, lambda: wb.compare_and_append(small_updates(1, rows), 1, 2))
    row("first append of that fresh handle", counts, ms, "1 PUT", maint=maint)
    out["fresh_handle_open"] = m_bopen.counts
    out["fresh_handle_first_append"] = counts

    # -- a lost race: wb appended [1, 2); wa's cache still says the upper is 1
    current: list[int] = []

    def lose() -> None:
        try:
            wa.compare_and_append(small_updates(1, rows), 1, 2)
            raise AssertionError("expected UpperMismatch")
        except UpperMismatch as e:
            current.append(e.current)

    counts, maint, ms = timed(a, attr_a, lose)
    row("lost race: append at a stale upper -> UpperMismatch", counts, ms, "PUT(412)+LIST+GET", maint=maint)
    out["lost_race"] = counts
    u = current[0]
    counts, maint, ms = timed(a, attr_a, lambda: wa.compare_and_append(small_updates(2, rows), u, u + 1))
    row("  ... retry at the upper it returned", counts, ms, "1 PUT", maint=maint)
    out["lost_race_retry"] = counts
    # -- the caller knows the right upper (e.g. from elsewhere), but the handle's cache is stale
    wb.compare_and_append(small_updates(3, rows), 3, 4)
    counts, maint, ms = timed(a, attr_a, lambda: wa.compare_and_append(small_updates(4, rows), 4, 5))
    row("append with the right upper but a stale cache", counts, ms, "LIST+GET+PUT", maint=maint)
    out["stale_cache_append"] = counts

    print_table(
        [
            "operation",
            "requests",
            "PUTs",
            "requests by kind",
            "of which maintenance",
            "bytes out",
            "bytes in",
            "ms",
            "goal",
        ],
        table,
        title=f"small appends ({rows} rows each), S3/moto, wire counts",
    )
    for label in ("default config", "compaction off"):
        s = out[f"steady_{label}"]
        print(f"steady state, {label}: {appends} appends -> {fmt_counts(s['total'])}")
        print(
            f"  requests per append incl. maintenance (histogram): {s['requests_per_append_histogram']}; "
            f"append path alone (histogram): {s['append_path_requests_histogram']}; "
            f"appends whose own path was exactly 1 PUT: {s['appends_whose_own_path_is_exactly_one_put']}/{appends}; "
            f"appends that ran compaction: {s['appends_that_ran_compaction']}, "
            f"costing {fmt_counts(s['maintenance_total'])}; "
            f"median {s['median_ms']:.1f} ms; state PUT size first {human_bytes(s['state_put_bytes_first'])}, "
            f"last {human_bytes(s['state_put_bytes_last_min'])}; batches in state: {s['batches_in_state_at_end']}"
        )
    return out


# ---- 1b. cost of reading the head vs versions retained ------------------------------------


def bench_versions(url: str, targets: list[int]) -> dict:
    """A fresh handle's open (a head read) and a lost race, after ``targets`` versions of one shard.

    Versions younger than ``consensus_retention_s`` (600 s) are never
    truncated, so a busy shard keeps thousands of them.
    """
    out: dict = {}
    rows: list[list] = []
    c = open_counted(url, PersistConfig(compaction_enabled=False))
    sid = ShardId.new()
    w = c.client.open_writer(sid, SMALL_SCHEMA)
    other = open_counted(url).client.open_writer(sid, SMALL_SCHEMA)
    upper = 0
    for target in targets:
        while upper < target:
            w.compare_and_append_batch([], upper, upper + 1)  # one version each
            upper += 1
        fresh = open_counted(url)
        with measure(fresh) as m_open:
            fw = fresh.client.open_writer(sid, SMALL_SCHEMA)
        other.shard.fetch()
        other.compare_and_append_batch([], upper, upper + 1)  # fw's cache is now stale
        upper += 1
        with measure(fresh) as m_lost:
            fw.compare_and_append_batch([], upper, upper + 1)  # PUT(412), head, PUT
        upper += 1
        seqno = w.shard.fetch().seqno
        rows.append(
            [
                seqno,
                fmt_counts(m_open.counts),
                f"{m_open.seconds * 1000:.0f}",
                fmt_counts({k: v for k, v in m_lost.counts.items() if "(" not in k}),
                f"{m_lost.seconds * 1000:.0f}",
            ]
        )
        out[str(seqno)] = {"open": m_open.counts, "open_ms": m_open.seconds * 1000, "stale_append": m_lost.counts}
    print_table(
        [
            "versions retained",
            "fresh open_writer (head)",
            "ms",
            "append after another writer appended (cache stale)",
            "ms",
        ],
        rows,
        title="reading the head vs versions retained, S3/moto, wire counts (compaction off; empty appends)",
    )
    return out


# ---- 2. batch append ---------------------------------------------------------------------


_PAYLOADS: dict[int, list[bytes]] = {}


def payload_chunks(total_bytes: int, chunk_bytes: int, start_id: int = 0) -> Iterator[pa.Table]:
    """Incompressible rows of BIG_SCHEMA, ``chunk_bytes`` (Arrow) at a time, ``total_bytes`` in all.

    Payloads cycle through 8 random buffers made once (outside any measurement's
    time); a repeat is 8 chunks away, far beyond a Parquet page, so the data
    stays incompressible. Ids are unique.
    """
    rows_per_chunk = max(1, chunk_bytes // ROW_BYTES)
    pool = _PAYLOADS.setdefault(rows_per_chunk, [os.urandom(rows_per_chunk * VAL_BYTES) for _ in range(8)])
    ts = pa.nulls(rows_per_chunk, pa.uint64()).fill_null(0)
    diff = pa.nulls(rows_per_chunk, pa.int64()).fill_null(1)
    rows_left = max(1, total_bytes // ROW_BYTES)
    next_id, i = start_id, 0
    while rows_left > 0:
        n = min(rows_per_chunk, rows_left)
        payload = pa.FixedSizeBinaryArray.from_buffers(pa.binary(VAL_BYTES), n, [None, pa.py_buffer(pool[i % 8])])
        ids = pa.array(range(next_id, next_id + n), pa.int64())
        yield pa.table({"id": ids, "payload": payload, "ts": ts.slice(0, n), "diff": diff.slice(0, n)})
        next_id += n
        rows_left -= n
        i += 1


def write_big(client: PersistClient, total_bytes: int, chunk_bytes: int) -> tuple[float, float, int]:
    """Write and append ``total_bytes`` through a builder. Returns (build s, append s, parts)."""
    w = client.open_writer(ShardId.new(), BIG_SCHEMA)
    t0 = time.perf_counter()
    builder = w.builder(0, 1)
    for t in payload_chunks(total_bytes, chunk_bytes):
        builder.add_table(t)
    batch = builder.finish()
    t1 = time.perf_counter()
    w.compare_and_append_batch([batch], 0, 1)
    t2 = time.perf_counter()
    return t1 - t0, t2 - t1, len(batch.parts)


def bench_batch(endpoint: str, mb: int, part_mbs: list[int], chunk_mb: int) -> dict:
    out: dict = {}
    rows: list[list] = []
    total_bytes = mb * MB

    # baseline: one plain PUT of the same number of (already encoded) bytes by the same kind of client
    c0 = open_counted(new_bucket_url(endpoint))
    blob = os.urandom(total_bytes)
    t0 = time.perf_counter()
    c0.client.blob.set("baseline/one-object", blob)
    base_s = time.perf_counter() - t0
    del blob
    base_mbps = mb / base_s
    rows.append(
        [
            f"baseline: one plain PUT of {mb} MB",
            "-",
            "1",
            "-",
            "-",
            human_bytes(total_bytes),
            f"{base_s:.2f}",
            f"{base_mbps:.0f}",
            "1.00",
        ]
    )
    out["baseline_put_s"] = base_s

    for part_mb in part_mbs:
        # the same builder with no I/O at all (mem://): the CPU cost of sorting, encoding, checksumming
        cfg = PersistConfig(part_target_bytes=part_mb * MB)
        mem = PersistClient.open(f"mem://bench-batch-{part_mb}-{os.getpid()}", cfg)
        write_big(mem, min(total_bytes, 16 * MB), chunk_mb * MB)  # warm-up
        t0 = time.perf_counter()
        build_s, append_s, parts = write_big(mem, total_bytes, chunk_mb * MB)
        mem_s = time.perf_counter() - t0
        rows.append(
            [
                f"same append on mem:// (no I/O), part target {part_mb} MB",
                "-",
                f"{parts} parts",
                "-",
                "-",
                "-",
                f"{mem_s:.2f}",
                f"{mb / mem_s:.0f}",
                f"{base_s / mem_s:.2f}",
            ]
        )
        out[f"mem_part_{part_mb}mb_s"] = mem_s
        c: Counted = open_counted(new_bucket_url(endpoint), cfg)
        assert c.wire is not None
        c.wire.reset_inflight()
        with measure(c) as m:
            build_s, append_s, parts = write_big(c.client, total_bytes, chunk_mb * MB)
        part_puts = m.counts.get("PUT blob")
        state_puts = m.counts.get("PUT consensus")
        inflight = c.wire.max_inflight.get("PUT blob", 0)
        mbps = mb / m.seconds
        rows.append(
            [
                f"{mb} MB append, part target {part_mb} MB",
                fmt_counts({k: v for k, v in m.counts.items() if "(" not in k}, with_bytes=False),
                f"{part_puts.requests if part_puts else 0} parts + {state_puts.requests if state_puts else 0} state",
                str(inflight),
                human_bytes(state_puts.bytes_out if state_puts else 0),
                human_bytes(part_puts.bytes_out if part_puts else 0),
                f"{m.seconds:.2f} (build {build_s:.2f}, append {append_s * 1000:.0f} ms)",
                f"{mbps:.0f}",
                f"{base_s / m.seconds:.2f}",
            ]
        )
        out[f"part_{part_mb}mb"] = {
            "counts": m.counts,
            "max_part_puts_in_flight": inflight,
            "seconds": m.seconds,
            "build_s": build_s,
            "append_s": append_s,
            "mb_per_s": mbps,
            "parts": parts,
        }
    print_table(
        [
            "what",
            "requests",
            "PUTs",
            "part PUTs in flight (max)",
            "state bytes",
            "part bytes",
            "seconds",
            "MB/s",
            "speed vs baseline",
        ],
        rows,
        title=f"one {mb} MB append through WriteHandle.builder, S3/moto, wire counts (upload_parallelism=4)",
    )
    return out


# ---- 3. memory -----------------------------------------------------------------------------


def memory_child(gb: float, part_mb: int, chunk_mb: int) -> dict:
    """Runs in a fresh interpreter: one ``gb`` GB append on file:// with parts of ``part_mb`` MB."""
    with tempfile.TemporaryDirectory(prefix="bench-persist-mem-") as d:
        cfg = PersistConfig(part_target_bytes=part_mb * MB, compaction_enabled=False)
        client = PersistClient.open(f"file://{d}", cfg)
        w = client.open_writer(ShardId.new(), BIG_SCHEMA)
        pool = pa.default_memory_pool()
        total_bytes = int(gb * (1 << 30))
        chunks = payload_chunks(total_bytes, chunk_mb * MB)
        first = next(chunks)
        # Warm up before measuring: Parquet/zstd code pages, the upload thread pool, allocators.
        warm = client.open_writer(ShardId.new(), BIG_SCHEMA, inline_max_bytes=0)
        wb = warm.builder(0, 1)
        wb.add_table(first.slice(0, 10_000))
        warm.compare_and_append_batch([wb.finish()], 0, 1)
        rss0 = rss_bytes()
        arrow0 = pool.bytes_allocated()
        reset_ok = reset_peak_rss()
        tracemalloc.start()
        t0 = time.perf_counter()
        builder = w.builder(0, 1)
        builder.add_table(first)
        del first
        for t in chunks:
            builder.add_table(t)
        batch = builder.finish()
        w.compare_and_append_batch([batch], 0, 1)
        seconds = time.perf_counter() - t0
        _, tm_peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        return {
            "gb": gb,
            "part_mb": part_mb,
            "chunk_mb": chunk_mb,
            "parts": len(batch.parts),
            "part_bytes_max": max(p.size for p in batch.parts),
            "seconds": seconds,
            "mb_per_s": total_bytes / MB / seconds,
            "tracemalloc_peak": tm_peak,
            "arrow_pool_peak": pool.max_memory() - arrow0,
            "rss_start": rss0,
            "rss_peak_delta": peak_rss_bytes() - rss0 if reset_ok else None,
            "upload_parallelism": cfg.upload_parallelism,
        }


def bench_memory(sizes_gb: list[float], part_mbs: list[int], chunk_mb: int) -> dict:
    """One subprocess per (size, part size): peaks are per process."""
    out: dict = {}
    rows: list[list] = []
    for part_mb in part_mbs:
        for gb in sizes_gb:
            cmd = [sys.executable, os.path.abspath(__file__), "--memory-child", str(gb), str(part_mb), str(chunk_mb)]
            res = subprocess.run(cmd, capture_output=True, text=True, check=True)
            r = json.loads(res.stdout.strip().splitlines()[-1])
            out[f"{gb:g}gb_part_{part_mb}mb"] = r
            part = part_mb * MB
            # PersistConfig's doc: part_target_bytes * (3 + 2 * upload_parallelism) at worst
            factor = 3 + 2 * r["upload_parallelism"]
            documented = part * factor
            rss = r["rss_peak_delta"]
            heap = r["arrow_pool_peak"] + r["tracemalloc_peak"]
            rows.append(
                [
                    f"{gb:g} GB, part target {part_mb} MB",
                    f"{r['parts']} (max {human_bytes(r['part_bytes_max'])})",
                    human_bytes(r["tracemalloc_peak"]),
                    human_bytes(r["arrow_pool_peak"]),
                    f"{heap / part:.1f}x",
                    human_bytes(rss) if rss is not None else "n/a",
                    f"{rss / part:.1f}x" if rss is not None else "n/a",
                    f"{documented // MB} MB ({factor}x)",
                    f"{r['seconds']:.1f}",
                    f"{r['mb_per_s']:.0f}",
                ]
            )
    print_table(
        [
            "append",
            "parts",
            "tracemalloc peak (Python heap)",
            "Arrow pool peak",
            "(Arrow + Python) / part size",
            "peak RSS growth",
            "RSS growth / part size",
            "documented bound",
            "seconds",
            "MB/s",
        ],
        rows,
        title=f"memory of big appends through WriteHandle.builder, file:// (chunks of {chunk_mb} MB added; "
        "the same part size at two total sizes shows whether the peak grows with the size)",
    )
    return out


# ---- main ------------------------------------------------------------------------------------


def main() -> None:
    if len(sys.argv) == 5 and sys.argv[1] == "--memory-child":
        print(json.dumps(memory_child(float(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]))))
        return
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument(
        "--only", choices=["small", "versions", "batch", "memory"], nargs="*", help="sections (default: all)"
    )
    p.add_argument("--appends", type=int, default=200, help="steady-state small appends (default 200)")
    p.add_argument("--rows", type=int, default=10, help="rows per small append (default 10)")
    p.add_argument("--versions", type=int, nargs="+", default=[10, 1000, 2500], help="versions for 'versions'")
    p.add_argument("--mb", type=int, default=100, help="size of the S3 batch append in MB (default 100)")
    p.add_argument("--batch-part-mb", type=int, nargs="+", default=[64, 8], help="part sizes for the batch append")
    p.add_argument("--gb", type=float, default=1.0, help="size of the memory-measured append in GB (default 1)")
    p.add_argument(
        "--gb-compare",
        type=float,
        default=0.25,
        help="also measure this size, to compare peaks (0: skip; default 0.25)",
    )
    p.add_argument("--part-mb", type=int, nargs="+", default=[64, 16], help="part sizes for the memory runs")
    p.add_argument("--chunk-mb", type=int, default=4, help="size of each table handed to the builder (default 4)")
    p.add_argument("--quick", action="store_true", help="small sizes: 30 appends, 20 MB, 0.1 GB")
    p.add_argument("--json", help="also write the results as JSON to this file")
    args = p.parse_args()
    if args.quick:
        args.appends, args.mb, args.gb, args.part_mb, args.batch_part_mb = 30, 20, 0.1, [16, 4], [16, 4]
        args.versions, args.gb_compare = [10, 300], 0.0
    only = set(args.only or ["small", "versions", "batch", "memory"])
    pa.array(["warm up pyarrow (its first pa.array imports pandas)"])
    print(f"machine: {os.cpu_count()} cores, python {sys.version.split()[0]}, pyarrow {pa.__version__}, {load()}")
    results: dict = {}
    if only & {"small", "versions", "batch"}:
        with moto_server() as endpoint:
            if "small" in only:
                results["small"] = bench_small(lambda: new_bucket_url(endpoint), args.appends, args.rows)
            if "versions" in only:
                results["versions"] = bench_versions(new_bucket_url(endpoint), args.versions)
            if "batch" in only:
                results["batch"] = bench_batch(endpoint, args.mb, args.batch_part_mb, args.chunk_mb)
    if "memory" in only:
        sizes = sorted({args.gb, args.gb_compare} - {0.0})
        results["memory"] = bench_memory(sizes, args.part_mb, args.chunk_mb)
    print(f"done: {load()} (times are only comparable within one run on a quiet machine)")
    emit_json(args.json, results)


if __name__ == "__main__":
    main()
