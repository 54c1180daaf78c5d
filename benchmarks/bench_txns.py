"""Benchmarks of txns: requests and bytes per commit and apply, scaling with registered shards, throughput.

Sections (each prints a Markdown table; nothing here asserts on time):

1. ``commit`` (S3/moto, wire counts): requests and bytes of one commit that
   touches 1, 10 and 100 data shards, with small writes (inline: goal one
   conditional PUT of the txns shard's state and no part at all) and with
   writes big enough to need a part per shard (goal: that one PUT plus the
   parts, uploaded in parallel). Broken down by operation: PUT state,
   PUT part, GET, LIST. Then the apply of each commit.
2. ``scaling``: commit cost (requests, bytes, ms) with 10, 100, 1,000 and
   10,000 registered data shards (goal: flat), against advancing every one
   of those shards' uppers directly with one compare-and-append each, in the
   same run, as a ratio. Runs on ``mem://`` (logical counts: calls into the
   Blob/Consensus API) for every N and on S3/moto (wire counts) up to
   ``--s3-max-shards`` (registering 10,000 shards on moto takes minutes).
3. ``apply`` (S3/moto): bytes PUT to blob storage while applying a committed
   transaction (goal: 0; applying is metadata only) against the data bytes
   the transaction wrote, and the consensus (state) bytes the apply PUT.
4. ``throughput``: commits per second through one txns shard with 1, 4 and 16
   concurrent committers (threads, each with its own client and handle,
   retrying on TimestampUnavailable at ``e.upper``), on mem://, file:// and
   S3/moto, and the fraction of commit attempts that lost a race. Mode
   ``commit`` only commits; mode ``commit+apply`` also applies each commit
   and tidies it in the next one (the normal committer loop).

Usage::

    .venv/bin/python benchmarks/bench_txns.py                      # all, defaults (a few minutes)
    .venv/bin/python benchmarks/bench_txns.py --quick              # small sizes, well under a minute
    .venv/bin/python benchmarks/bench_txns.py --only scaling --shards 10 100 1000 10000 --s3-max-shards 10000
    .venv/bin/python benchmarks/bench_txns.py --only throughput --seconds 10 --committers 1 4 16
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass

import pyarrow as pa

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from common import (
    MB,
    Attribution,
    Counted,
    Snapshot,
    Stat,
    diff,
    emit_json,
    human_bytes,
    load,
    measure,
    moto_server,
    new_bucket_url,
    open_counted,
    print_table,
)

from persist import Schema, ShardId
from txns import Tidy, TimestampUnavailable, TxnsHandle

SCHEMA = Schema(key=pa.schema([("id", pa.int64())]), val=pa.schema([("payload", pa.binary())]))
SMALL_PAYLOAD = b"x" * 16


@dataclass
class Breakdown:
    """Requests by the kinds the goals talk about, and body bytes."""

    put_state: int = 0
    put_state_lost: int = 0
    put_part: int = 0
    get: int = 0
    list: int = 0
    delete: int = 0
    other: int = 0
    state_bytes_out: int = 0
    part_bytes_out: int = 0
    bytes_in: int = 0

    @property
    def requests(self) -> int:
        return self.put_state + self.put_part + self.get + self.list + self.delete + self.other

    @property
    def bytes_out(self) -> int:
        return self.state_bytes_out + self.part_bytes_out

    def scaled(self, n: float) -> dict:
        return {k: getattr(self, k) / n for k in self.__dataclass_fields__} | {
            "requests": self.requests / n,
            "bytes_out": self.bytes_out / n,
        }


def breakdown(s: Snapshot) -> Breakdown:
    """Wire categories (``PUT consensus`` ...) or logical ones (``cas`` ...) as a :class:`Breakdown`."""
    b = Breakdown()
    for k, v in s.items():
        if k in ("PUT consensus", "cas"):
            b.put_state += v.requests
            b.state_bytes_out += v.bytes_out
        elif k in ("PUT consensus (lost)", "cas lost"):
            b.put_state_lost += v.requests
        elif "(" in k:
            continue
        elif k in ("PUT blob", "blob set"):
            b.put_part += v.requests
            b.part_bytes_out += v.bytes_out
        elif k.startswith("GET") or k == "blob get":
            b.get += v.requests
        elif k == "head":  # one LIST and one GET on S3; a listdir and a read on file://
            b.get += v.requests
            b.list += v.requests
        elif k.startswith("LIST") or k == "blob list":
            b.list += v.requests
        elif k.startswith("DELETE") or k in ("blob delete", "truncate"):
            b.delete += v.requests
        else:
            b.other += v.requests
        b.bytes_in += v.bytes_in
    return b


def bd_cells(b: Breakdown, n: int = 1) -> list[str]:
    f = (lambda x: f"{x / n:.2f}") if n != 1 else (lambda x: str(x))
    lost = f" ({f(b.put_state_lost)} lost)" if b.put_state_lost else ""
    return [
        f(b.put_state) + lost,
        f(b.put_part),
        f(b.get),
        f(b.list),
        f(b.delete + b.other),
        f(b.requests),
        human_bytes(b.state_bytes_out / n),
        human_bytes(b.part_bytes_out / n),
        human_bytes(b.bytes_in / n),
    ]


BD_HEADERS = ["PUT state", "PUT part", "GET", "LIST", "other", "total", "state bytes out", "part bytes out", "bytes in"]


def attribute_maintenance(attr: Attribution, txns: TxnsHandle) -> None:
    """Count maintenance apart: compaction/GC requested by appends (txns and data writers),
    the txns shard's periodic ``compact_to``, and the read cache's lease/hold updates."""
    attr.wrap(txns.writer, "maintain")
    attr.wrap(txns, "_maybe_compact")
    attr.wrap(txns.cache.reader, "downgrade_since")
    attr.wrap(txns.cache.reader, "heartbeat")
    for w in txns._data_writers.values():
        attr.wrap(w, "maintain")


def new_shards(n: int) -> list[str]:
    return [str(ShardId.new()) for _ in range(n)]


def register_chunked(txns: TxnsHandle, shards: list[str], chunk: int) -> float:
    """Register ``shards`` ``chunk`` at a time, one register call per chunk. Returns seconds."""
    t0 = time.perf_counter()
    for i in range(0, len(shards), chunk):
        ts = txns.upper
        txns.register(ts, dict.fromkeys(shards[i : i + chunk], SCHEMA))
    return time.perf_counter() - t0


def commit_small(
    txns: TxnsHandle, shards: list[str], rows: int = 1, payload: bytes = SMALL_PAYLOAD, tidy: Tidy | None = None
) -> int:
    """Commit ``rows`` rows to each of ``shards`` at the handle's upper (retrying if taken)."""
    txn = txns.begin()
    if tidy is not None:
        txn.tidy(tidy)
    for j, d in enumerate(shards):
        for r in range(rows):
            txn.write(d, (j * rows + r,), (payload,), 1)
    return txns.commit(txn).commit_ts


# ---- 1. commit cost by shards touched ----------------------------------------------------


def bench_commit(endpoint: str, touched: list[int], repeats: int, big_rows: int, big_payload: int) -> dict:
    out: dict = {}
    rows: list[list] = []
    c = open_counted(new_bucket_url(endpoint))
    assert c.wire is not None
    txns = TxnsHandle.open(c.client, ShardId.new())
    shards = new_shards(max(touched))
    register_chunked(txns, shards, 1000)
    # warm: every data writer of this handle has its state cached; one small commit each
    commit_small(txns, shards)
    txns.apply_le(txns.upper - 1)
    attr = Attribution(c)
    attribute_maintenance(attr, txns)
    for kind, nrows, payload in (
        ("small (1 row, inline)", 1, SMALL_PAYLOAD),
        (f"big ({big_rows} rows x {big_payload} B, a part each)", big_rows, None),
    ):
        for k in touched:
            commit_bd, apply_bd = Breakdown(), Breakdown()
            commit_maint, apply_maint = Breakdown(), Breakdown()
            commit_ms: list[float] = []
            apply_ms: list[float] = []
            inflight = 0
            for _ in range(repeats):
                txn = txns.begin()
                for j, d in enumerate(shards[:k]):
                    for r in range(nrows):
                        txn.write(d, (j * nrows + r,), (payload or os.urandom(big_payload),), 1)
                c.wire.reset_inflight()
                a0 = attr.snapshot()
                with measure(c) as m:
                    ts = txns.upper
                    applied = txn.commit_at(txns, ts)
                inflight = max(inflight, c.wire.max_inflight.get("PUT blob", 0))
                commit_bd = add_bd(commit_bd, breakdown(m.counts))
                commit_maint = add_bd(commit_maint, breakdown(diff(attr.snapshot(), a0)))
                commit_ms.append(m.seconds * 1000)
                a0 = attr.snapshot()
                with measure(c) as m:
                    tidy = applied.apply(txns)
                apply_bd = add_bd(apply_bd, breakdown(m.counts))
                apply_maint = add_bd(apply_maint, breakdown(diff(attr.snapshot(), a0)))
                apply_ms.append(m.seconds * 1000)
                nxt = txns.begin()  # the applied entries are tidied by the next commit (not measured)
                nxt.tidy(tidy)
                with measure(c):
                    nxt.commit_at(txns, txns.upper)
            rows.append(
                [
                    f"commit, {kind}",
                    k,
                    *bd_cells(commit_bd, repeats),
                    maint_cell(commit_maint, repeats),
                    f"{statistics.median(commit_ms):.0f}",
                    str(inflight),
                ]
            )
            rows.append(
                [
                    "  apply of it",
                    k,
                    *bd_cells(apply_bd, repeats),
                    maint_cell(apply_maint, repeats),
                    f"{statistics.median(apply_ms):.0f}",
                    "-",
                ]
            )
            out[f"{kind} x{k}"] = {
                "commit": commit_bd.scaled(repeats),
                "commit_maintenance": commit_maint.scaled(repeats),
                "apply": apply_bd.scaled(repeats),
                "apply_maintenance": apply_maint.scaled(repeats),
                "commit_ms_median": statistics.median(commit_ms),
                "apply_ms_median": statistics.median(apply_ms),
                "max_part_puts_in_flight": inflight,
            }
    print_table(
        [
            "operation",
            "shards touched",
            *BD_HEADERS,
            "of which maintenance",
            "ms (median)",
            "part PUTs in flight (max)",
        ],
        rows,
        title=f"one commit touching k data shards, S3/moto, wire counts, mean per commit of {repeats} "
        f"(tidy commits in between not shown)",
    )
    return out


def maint_cell(b: Breakdown, n: int) -> str:
    if not b.requests:
        return "0"
    parts = [f"{b.put_state / n:.2f} PUT state"]
    if b.put_part:
        parts.append(f"{b.put_part / n:.2f} PUT part ({human_bytes(b.part_bytes_out / n)})")
    if b.get or b.list:
        parts.append(f"{(b.get + b.list) / n:.2f} GET/LIST")
    return ", ".join(parts)


def add_bd(a: Breakdown, b: Breakdown) -> Breakdown:
    return Breakdown(**{k: getattr(a, k) + getattr(b, k) for k in a.__dataclass_fields__})


# ---- 2. scaling with registered shards ----------------------------------------------------


def bench_scaling(
    url_factory: Callable[[], str], label: str, ns: list[int], repeats: int, chunk: int
) -> tuple[list[list], dict]:
    rows: list[list] = []
    out: dict = {}
    c = open_counted(url_factory())
    txns = TxnsHandle.open(c.client, ShardId.new())
    # the shard every measured commit writes to (kept out of the direct-advance baseline)
    target = new_shards(1)
    register_chunked(txns, target, chunk)
    registered: list[str] = []
    attr = Attribution(c)
    for n in ns:
        more = new_shards(n - len(registered))
        reg_s = register_chunked(txns, more, chunk)
        registered += more
        # warm up: the first commit after registering pays for catching up
        tidy = txns.apply_le(commit_small(txns, target))
        attribute_maintenance(attr, txns)
        commit_bd, maint = Breakdown(), Breakdown()
        ms: list[float] = []
        for _ in range(repeats):
            a0 = attr.snapshot()
            with measure(c) as m:
                ts = commit_small(txns, target, tidy=tidy)  # carries the tidy of the previous one
            commit_bd = add_bd(commit_bd, breakdown(m.counts))
            maint = add_bd(maint, breakdown(diff(attr.snapshot(), a0)))
            ms.append(m.seconds * 1000)
            tidy = txns.apply_le(ts)  # applied (not measured), tidied by the next commit
        commit_ms = statistics.median(ms)
        state_bytes = txns.writer.shard.state().encode()
        # baseline: advance each registered shard's upper directly (one compare-and-append each)
        writers = [txns.data_writer(d) for d in registered]
        for w in writers:
            w.shard.state()  # cached: what a writer that keeps its handles open has
        with measure(c) as m:
            for w in writers:
                u = w.upper
                w.compare_and_append_batch([], u, u + 1)
        direct = breakdown(m.counts)
        per = commit_bd.scaled(repeats)
        mper = maint.scaled(repeats)
        rows.append(
            [
                label,
                n,
                f"{per['requests']:.2f} ({per['put_state']:.2f} PUT state)",
                f"{mper['requests']:.2f}",
                human_bytes(per["bytes_out"]),
                human_bytes(per["bytes_in"]),
                f"{commit_ms:.1f}",
                human_bytes(len(state_bytes)),
                f"{direct.requests} ({direct.put_state} PUT state)",
                human_bytes(direct.bytes_out),
                f"{m.seconds * 1000:.0f}",
                ratio(direct.requests, per["requests"]),
                ratio(direct.bytes_out, per["bytes_out"]),
                ratio(m.seconds * 1000, commit_ms),
                f"{reg_s:.1f}",
            ]
        )
        out[str(n)] = {
            "commit": per,
            "commit_maintenance": mper,
            "commit_ms_median": commit_ms,
            "txns_state_bytes": len(state_bytes),
            "direct": direct.scaled(1),
            "direct_ms": m.seconds * 1000,
            "register_s": reg_s,
        }
        print(
            f"  [{label}] N={n}: commit {per['requests']:.2f} req, {commit_ms:.1f} ms; direct {direct.requests} req, "
            f"{m.seconds:.2f} s; registering took {reg_s:.1f} s",
            flush=True,
        )
    return rows, out


def ratio(a: float, b: float) -> str:
    r = a / b if b else float("inf")
    return f"{r:.0f}x" if r >= 10 else f"{r:.2g}x"


SCALING_HEADERS = [
    "backend",
    "registered shards",
    "commit: requests",
    "of which maintenance",
    "commit: bytes out",
    "commit: bytes in",
    "commit: ms",
    "txns state size",
    "direct: requests",
    "direct: bytes out",
    "direct: ms",
    "requests ratio",
    "bytes ratio",
    "time ratio",
    "register s (setup)",
]


# ---- 3. apply rewrites no data --------------------------------------------------------------


def bench_apply(endpoint: str, shards: int, mb_per_shard: float, rounds: int) -> dict:
    out: dict = {}
    rows: list[list] = []
    c = open_counted(new_bucket_url(endpoint))
    txns = TxnsHandle.open(c.client, ShardId.new())
    ds = new_shards(shards)
    register_chunked(txns, ds, 1000)
    payload = 1000
    nrows = max(1, int(mb_per_shard * MB) // payload)
    tidy = None
    for rnd in range(rounds):
        txn = txns.begin()
        if tidy is not None:
            txn.tidy(tidy)
        data_bytes = 0
        for d in ds:
            b = txns.data_writer(d).builder(0, 1)
            t = pa.table(
                {
                    "id": pa.array(range(rnd * nrows, (rnd + 1) * nrows), pa.int64()),
                    "payload": pa.array([os.urandom(payload) for _ in range(nrows)], pa.binary()),
                    "ts": pa.array([0] * nrows, pa.uint64()),
                    "diff": pa.array([1] * nrows, pa.int64()),
                }
            )
            b.add_table(t)
            with measure(c) as mw:
                batch = b.finish()
            txn.write_batch(d, batch)
            data_bytes += breakdown(mw.counts).part_bytes_out
        with measure(c) as mc:
            applied = txn.commit_at(txns, txns.upper)
        with measure(c) as ma:
            tidy = applied.apply(txns)
        cb, ab = breakdown(mc.counts), breakdown(ma.counts)
        label = (
            "first apply to each shard" if rnd == 0 else f"apply #{rnd + 1} to each shard (compaction may be requested)"
        )
        rows.append(
            [
                label,
                shards,
                human_bytes(data_bytes),
                f"{cb.put_state} / {human_bytes(cb.state_bytes_out)}",
                f"{ab.put_part} / {human_bytes(ab.part_bytes_out)}",
                f"{ab.put_state} / {human_bytes(ab.state_bytes_out)}",
                f"{ab.get} GET, {ab.list} LIST",
                f"{ab.part_bytes_out / max(data_bytes, 1):.3f}",
                f"{ma.seconds * 1000:.0f}",
            ]
        )
        out[f"round{rnd}"] = {
            "data_bytes": data_bytes,
            "commit": cb.scaled(1),
            "apply": ab.scaled(1),
            "apply_ms": ma.seconds * 1000,
        }
    print_table(
        [
            "apply",
            "shards",
            "data bytes written by the txn (parts)",
            "commit: state PUTs / bytes",
            "apply: part PUTs / bytes",
            "apply: state PUTs / bytes",
            "apply: reads",
            "apply part bytes / data bytes",
            "apply ms",
        ],
        rows,
        title=f"apply rewrites no data: {shards} shards x {mb_per_shard:g} MB per commit, S3/moto, wire counts",
    )
    return out


# ---- 4. throughput ----------------------------------------------------------------------------


def throughput_one(url: str, committers: int, seconds: float, apply: bool, setup: Counted) -> dict:
    """``committers`` threads committing to one txns shard for ``seconds``."""
    txns_id = str(ShardId.new())
    admin = TxnsHandle.open(setup.client, txns_id)
    ds = new_shards(committers)
    admin.register(admin.upper, dict.fromkeys(ds, SCHEMA))
    handles: list[tuple[Counted, TxnsHandle]] = []
    for _ in range(committers):
        cc = open_counted(url)
        h = TxnsHandle.open(cc.client, txns_id)
        h.data_writer(ds[len(handles)])  # open its data writer before the clock starts
        handles.append((cc, h))
    start = threading.Barrier(committers + 1)
    stop = threading.Event()
    stats = [{"commits": 0, "attempts": 0, "lost": 0, "errors": 0} for _ in range(committers)]
    latencies: list[list[float]] = [[] for _ in range(committers)]
    deadline = [0.0]

    def run(i: int) -> None:
        _cc, h = handles[i]
        d = ds[i]
        st = stats[i]
        tidy = None
        n = 0
        start.wait()
        while not stop.is_set():
            t_begin = time.perf_counter()
            txn = h.begin()
            txn.write(d, (n,), (SMALL_PAYLOAD,), 1)
            if tidy is not None:
                txn.tidy(tidy)
            ts = h.upper
            while True:
                st["attempts"] += 1
                try:
                    applied = txn.commit_at(h, ts)
                    break
                except TimestampUnavailable as e:
                    st["lost"] += 1
                    ts = e.upper
                except Exception:  # noqa: BLE001 - counted: the benchmark reports errors
                    st["errors"] += 1
                    ts = h.upper
            n += 1
            if apply:
                tidy = applied.apply(h)
            t_end = time.perf_counter()
            if t_end <= deadline[0]:  # only what finished inside the window counts
                st["commits"] += 1
                latencies[i].append((t_end - t_begin) * 1000)

    threads = [threading.Thread(target=run, args=(i,), daemon=True) for i in range(committers)]
    for t in threads:
        t.start()
    before = [cc.snapshot() for cc, _ in handles]
    deadline[0] = time.perf_counter() + 3600.0
    start.wait()
    t0 = time.perf_counter()
    deadline[0] = t0 + seconds
    time.sleep(seconds)
    stop.set()
    for t in threads:
        t.join()
    elapsed = seconds
    counts: Snapshot = {}
    for (cc, _), b0 in zip(handles, before, strict=True):
        for k, v in cc.snapshot().items():
            counts[k] = counts.get(k, Stat()) + (v - b0.get(k, Stat()))
    commits = sum(s["commits"] for s in stats)
    attempts = sum(s["attempts"] for s in stats)
    lost = sum(s["lost"] for s in stats)
    bd = breakdown(counts)
    lat = sorted(x for xs in latencies for x in xs)
    for cc, _ in handles:
        cc.client.location.close()
    return {
        "commits": commits,
        "seconds": elapsed,
        "commits_per_s": commits / elapsed,
        "attempts": attempts,
        "lost": lost,
        "lost_fraction": lost / max(attempts, 1),
        "errors": sum(s["errors"] for s in stats),
        "cas": bd.put_state,
        "cas_lost": bd.put_state_lost,
        "requests_per_commit": bd.requests / max(commits, 1),
        "latency_ms_p50": lat[len(lat) // 2] if lat else None,
        "latency_ms_p99": lat[min(len(lat) - 1, int(len(lat) * 0.99))] if lat else None,
        "latency_ms_max": lat[-1] if lat else None,
    }


def fmt_ms(x: float | None) -> str:
    return "-" if x is None else f"{x:.0f}"


def bench_throughput(
    backends: dict[str, Callable[[], str]], committers: list[int], seconds: float, modes: list[str]
) -> dict:
    out: dict = {}
    rows: list[list] = []
    for name, url_factory in backends.items():
        for mode in modes:
            base = None
            for n in committers:
                url = url_factory()
                setup = open_counted(url)
                r = throughput_one(url, n, seconds, mode == "commit+apply", setup)
                base = base or r["commits_per_s"]
                out[f"{name} {mode} {n}"] = r
                rows.append(
                    [
                        name,
                        mode,
                        n,
                        r["commits"],
                        f"{r['commits_per_s']:.1f}",
                        f"{r['commits_per_s'] / base:.2f}",
                        f"{r['lost_fraction']:.1%} ({r['lost']}/{r['attempts']})",
                        f"{r['cas_lost']}/{r['cas']}",
                        f"{r['requests_per_commit']:.1f}",
                        fmt_ms(r["latency_ms_p50"]) + " / " + fmt_ms(r["latency_ms_max"]),
                        r["errors"],
                    ]
                )
                print(
                    f"  [{name} {mode}] {n} committers: {r['commits_per_s']:.1f} commits/s, "
                    f"lost {r['lost_fraction']:.1%}",
                    flush=True,
                )
    print_table(
        [
            "backend",
            "mode",
            "committers",
            "commits",
            "commits/s",
            "vs 1 committer",
            "attempts that lost a race",
            "state CAS lost/total",
            "requests per commit",
            "latency ms p50 / max",
            "errors",
        ],
        rows,
        title=f"commit throughput through one txns shard ({seconds:g} s per row; threads in one process, 2 cores)",
    )
    return out


# ---- main ------------------------------------------------------------------------------------


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument(
        "--only", nargs="*", choices=["commit", "scaling", "apply", "throughput"], help="sections (default: all)"
    )
    p.add_argument("--touched", type=int, nargs="+", default=[1, 10, 100], help="shards touched per commit")
    p.add_argument("--repeats", type=int, default=5, help="commits measured per configuration (default 5)")
    p.add_argument("--big-rows", type=int, default=64, help="rows per shard in a big commit (default 64)")
    p.add_argument("--big-payload", type=int, default=1024, help="payload bytes per row in a big commit (default 1024)")
    p.add_argument("--shards", type=int, nargs="+", default=[10, 100, 1000, 10000], help="registered shards")
    p.add_argument(
        "--s3-max-shards", type=int, default=1000, help="largest N run on S3/moto in 'scaling' (default 1000)"
    )
    p.add_argument("--scaling-backends", nargs="+", default=["mem", "s3"], choices=["mem", "file", "s3"])
    p.add_argument("--register-chunk", type=int, default=1000, help="shards per register call (default 1000)")
    p.add_argument("--apply-shards", type=int, default=10, help="shards written by the apply txn (default 10)")
    p.add_argument("--apply-mb", type=float, default=1.0, help="MB per shard in the apply txn (default 1)")
    p.add_argument("--apply-rounds", type=int, default=3, help="commits applied in a row (default 3)")
    p.add_argument("--committers", type=int, nargs="+", default=[1, 4, 16])
    p.add_argument("--seconds", type=float, default=3.0, help="seconds per throughput row (default 3)")
    p.add_argument("--backends", nargs="+", default=["mem", "file", "s3"], choices=["mem", "file", "s3"])
    p.add_argument("--modes", nargs="+", default=["commit", "commit+apply"], choices=["commit", "commit+apply"])
    p.add_argument("--quick", action="store_true", help="small sizes (well under a minute)")
    p.add_argument("--json", help="also write the results as JSON to this file")
    args = p.parse_args()
    if args.quick:
        args.touched, args.repeats, args.shards, args.s3_max_shards = [1, 10], 2, [10, 100], 100
        args.apply_shards, args.apply_mb, args.apply_rounds, args.seconds = 3, 0.25, 2, 1.0
        args.committers = [1, 4]
    only = set(args.only or ["commit", "scaling", "apply", "throughput"])
    pa.array(["warm up pyarrow (its first pa.array imports pandas)"])
    print(f"machine: {os.cpu_count()} cores, python {sys.version.split()[0]}, pyarrow {pa.__version__}, {load()}")
    results: dict = {}
    tmp = tempfile.TemporaryDirectory(prefix="bench-txns-")
    with moto_server() as endpoint:
        factories: dict[str, Callable[[], str]] = {
            "mem": lambda: f"mem://bench-{uuid.uuid4().hex}",
            "file": lambda: f"file://{tmp.name}/{uuid.uuid4().hex}",
            "s3": lambda: new_bucket_url(endpoint),
        }
        if "commit" in only:
            results["commit"] = bench_commit(endpoint, args.touched, args.repeats, args.big_rows, args.big_payload)
        if "scaling" in only:
            all_rows: list[list] = []
            results["scaling"] = {}
            for b in args.scaling_backends:
                ns = [n for n in args.shards if b != "s3" or n <= args.s3_max_shards]
                label = {"mem": "mem:// (logical)", "file": "file:// (logical)", "s3": "S3/moto (wire)"}[b]
                r, o = bench_scaling(factories[b], label, ns, args.repeats, args.register_chunk)
                all_rows += r
                results["scaling"][b] = o
            print_table(
                SCALING_HEADERS,
                all_rows,
                title="commit cost vs registered shards; 'direct' = one compare-and-append per registered shard "
                "(the cost of advancing every upper without txns); ratio = direct / commit",
            )
        if "apply" in only:
            results["apply"] = bench_apply(endpoint, args.apply_shards, args.apply_mb, args.apply_rounds)
        if "throughput" in only:
            results["throughput"] = bench_throughput(
                {b: factories[b] for b in args.backends}, args.committers, args.seconds, args.modes
            )
    tmp.cleanup()
    print(f"done: {load()} (times are only comparable within one run on a quiet machine)")
    emit_json(args.json, results)


if __name__ == "__main__":
    main()
