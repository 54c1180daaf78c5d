"""Transactions resolved in the data plane (txns.resolve): the post's 10,000-transaction workload.

The workload of F. McSherry's "Transaction Processing in the Data Plane" (see
``txns/resolve/__init__.py``): transactions ``1..N`` (``--txns``, 10,000), each
with two reads expecting absence and two writes ``val = "<id>:<key>"``, the four
keys ``'k' || hash(id || ':rk1') % K`` (``:rk2``, ``:wk1``, ``:wk2``; ``--keys``,
10,000). The post uses seahash; this uses the first 8 bytes of BLAKE2b (the
same shape, other keys, so other counts). The post's reads see the store at
insert time, which holds no ``k*`` key: every read expects absence.

Printed, as Markdown tables:

1. **From scratch**: rows of intents, rollback and store; the fixpoint's rounds;
   time of ``resolve`` (batch, vectorised), of the sequential model
   (``txns.resolve.sequential``), of ``Resolver.add`` of everything, and of the
   three maintenance deletions (rows each removes), against the post's
   27.6 s (``COUNT(*) FROM to_rollback``) and 42.7 s (``store``) from scratch.
2. **Incremental**: ``Resolver.add`` of ``--batches`` batches of 100 intents (25
   transactions) with ids past every existing one (p50/max), the same below
   existing ids (the history uses even ids; these take odd ones in the middle,
   so later transactions are re-evaluated), the transactions evaluated per
   batch, and reading the answers (``rollback`` and ``store`` materialised as
   Arrow tables; O(rows)); against the post's ~30 ms per read of the indexed
   views.
3. **Additive writes** (``AdditiveResolver``): the same shape, values numeric,
   every second transaction additive: it reads one key expecting absence and
   one of ``--counters`` counters (100) at the snapshot (0), and adds 1 to two
   counters (``key(id, 'ac1')``, ``'ac2'``; one add if they coincide). Times
   of ``resolve_additive`` and ``sequential_additive`` from scratch and of
   ``AdditiveResolver.add`` of everything; then ``--batches`` batches of 25
   transactions (about 100 rows) with ids past every existing one: p50/max,
   evaluations, plain-writer scan steps and adder-index queries per batch,
   against ``resolve_additive`` from scratch on the data so far plus the batch.

Run: ``.venv/bin/python benchmarks/bench_resolve.py`` (a few seconds);
``--txns 100000 --keys 100000`` for a bigger one; ``--json out.json`` for the raw numbers.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from common import emit_json, load, print_table

from txns.resolve import (
    AdditiveResolver,
    Resolver,
    dead_intents,
    maintain,
    remove_committed_reads,
    remove_failed,
    resolve,
    resolve_additive,
    sequential,
    sequential_additive,
)

POST_ROLLBACK_S = 27.634  # SELECT count(*) FROM to_rollback, from scratch
POST_STORE_S = 42.650  # SELECT count(*) FROM store, from scratch
POST_READ_S = 0.030  # a read of the maintained index (~30 ms)


def key(i: int, tag: str, keys: int) -> str:
    h = int.from_bytes(hashlib.blake2b(f"{i}:{tag}".encode(), digest_size=8).digest(), "little")
    return f"k{h % keys}"


def workload(ids: range | list[int], keys: int, scale: int = 1) -> pa.Table:
    """Intents of transactions ``ids`` (id written as ``id * scale``), keys hashed from the id."""
    cols: dict[str, list[Any]] = {"id": [], "is_read": [], "key": [], "val": []}
    for g in ids:
        for tag in ("rk1", "rk2"):
            cols["id"].append(g * scale)
            cols["is_read"].append(True)
            cols["key"].append(key(g, tag, keys))
            cols["val"].append(None)
        for tag in ("wk1", "wk2"):
            k = key(g, tag, keys)
            cols["id"].append(g * scale)
            cols["is_read"].append(False)
            cols["key"].append(k)
            cols["val"].append(f"{g * scale}:{k}")
    return pa.table(
        {
            "id": pa.array(cols["id"], pa.int64()),
            "is_read": cols["is_read"],
            "key": pa.array(cols["key"], pa.string()),
            "val": pa.array(cols["val"], pa.string()),
        }
    )


def timed(f: Callable[[], Any]) -> tuple[float, Any]:
    t0 = time.perf_counter()
    out = f()
    return time.perf_counter() - t0, out


def ms(s: float) -> str:
    return f"{s * 1e3:.1f} ms"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--txns", type=int, default=10_000)
    p.add_argument("--keys", type=int, default=10_000)
    p.add_argument("--batches", type=int, default=20, help="incremental batches of 100 intents")
    p.add_argument("--counters", type=int, default=100, help="counters of the additive section")
    p.add_argument("--json", help="also write the raw results to this file")
    args = p.parse_args()
    print(f"bench_resolve: {os.cpu_count()} cores, {load()}", flush=True)
    results: dict[str, Any] = {"args": vars(args)}

    # 1. from scratch
    intents = workload(range(1, args.txns + 1), args.keys)
    resolve(intents.slice(0, 100))  # warm up
    t_batch, res = timed(lambda: resolve(intents))
    t_seq, _ = timed(lambda: sequential(intents))
    r = Resolver()
    t_inc, _ = timed(lambda: r.add(intents))
    assert r.rollback.equals(res.rollback) and r.rounds == res.rounds
    _, after1 = timed(lambda: remove_failed(intents, res))
    _, after2 = timed(lambda: remove_committed_reads(after1, res))
    t_all, kept = timed(lambda: maintain(intents, res))
    t_dead, _ = timed(lambda: dead_intents(intents, res))
    counts = {
        "intents": intents.num_rows,
        "to_rollback": res.rollback.num_rows,
        "store": res.store.num_rows,
        "rounds": res.rounds,
        "task1_removes": intents.num_rows - after1.num_rows,
        "task2_removes": after1.num_rows - after2.num_rows,
        "task3_removes": after2.num_rows - kept.num_rows,
    }
    results["counts"] = counts
    print_table(
        ["intents", "to_rollback", "store", "rounds", "task 1 removes", "task 2 removes", "task 3 removes"],
        [list(counts.values())],
        title=f"{args.txns:,} transactions over {args.keys:,} keys: counts",
    )
    rows = [
        [
            "resolve (batch fixpoint): rollback + store",
            ms(t_batch),
            f"{POST_ROLLBACK_S:.1f} s + {POST_STORE_S:.1f} s",
            f"{(POST_ROLLBACK_S + POST_STORE_S) / t_batch:,.0f}x",
        ],
        ["sequential model (pure Python)", ms(t_seq), "", ""],
        ["Resolver.add of everything (incremental, from empty)", ms(t_inc), "", ""],
        ["maintain (all three tasks)", ms(t_all), "", ""],
        ["dead_intents (rows to DELETE)", ms(t_dead), "", ""],
    ]
    print_table(["from scratch", "time", "post (Materialize, from scratch)", "post / ours"], rows, title="From scratch")
    results["scratch_s"] = {
        "resolve": t_batch,
        "sequential": t_seq,
        "resolver_add": t_inc,
        "maintain": t_all,
        "dead_intents": t_dead,
    }

    # 2. incremental: a history with even ids, then batches of 25 transactions (100 intents)
    added = [workload(range(1, args.txns + 1), args.keys, scale=2)]
    hist = Resolver()
    hist.add(added[0])
    top: list[float] = []
    below: list[float] = []
    evals_top: list[int] = []
    evals_below: list[int] = []
    nxt = args.txns + 1
    for b in range(args.batches):
        batch = workload(range(nxt, nxt + 25), args.keys, scale=2)
        nxt += 25
        e0 = hist.evaluations
        dt, _ = timed(lambda batch=batch: hist.add(batch))
        top.append(dt)
        evals_top.append(hist.evaluations - e0)
        # odd ids in the middle of the history: transactions above them may change
        mid = workload(range(args.txns // 2 + b * 25, args.txns // 2 + b * 25 + 25), args.keys, scale=2)
        odd = mid.set_column(0, "id", pc.add(mid["id"], 1))
        e0 = hist.evaluations
        dt, _ = timed(lambda odd=odd: hist.add(odd))
        below.append(dt)
        evals_below.append(hist.evaluations - e0)
        added += [batch, odd]
    t_rb, _ = timed(lambda: hist.rollback)
    t_store, store = timed(lambda: hist.store)
    rows = [
        [
            "add 100 intents, ids past all (p50 / max)",
            f"{ms(statistics.median(top))} / {ms(max(top))}",
            f"{statistics.mean(evals_top):.0f}",
            f"{POST_READ_S / statistics.median(top):,.0f}x",
        ],
        [
            "add 100 intents, ids in the middle (p50 / max)",
            f"{ms(statistics.median(below))} / {ms(max(below))}",
            f"{statistics.mean(evals_below):.0f}",
            f"{POST_READ_S / statistics.median(below):,.0f}x",
        ],
        ["read rollback (Arrow table, all rows)", ms(t_rb), "", f"{POST_READ_S / t_rb:,.1f}x"],
        [f"read store (Arrow table, {store.num_rows:,} rows)", ms(t_store), "", f"{POST_READ_S / t_store:,.1f}x"],
    ]
    print_table(
        ["incremental", "time", "txns evaluated", "post ~30 ms / ours"],
        rows,
        title=f"Incremental, on a resolver holding {args.txns + 50 * args.batches:,} transactions "
        f"({hist.rollback.num_rows:,} rolled back, {hist.rounds} rounds)",
    )
    check = resolve(pa.concat_tables(added))
    assert hist.rollback.equals(check.rollback), "incremental and batch disagree"
    results["incremental_s"] = {
        "top": top,
        "below": below,
        "evals_top": evals_top,
        "evals_below": evals_below,
        "read_rollback": t_rb,
        "read_store": t_store,
    }
    results["additive"] = additive(args)
    emit_json(args.json, results)


def additive_workload(ids: range, keys: int, counters: int) -> tuple[pa.Table, pa.Table]:
    """(intents, adds): even ids plain (2 reads expecting absence, 2 numeric writes), odd ids additive (a read
    expecting absence, a read of a counter at 0, adds of 1 to two counters)."""
    cols: dict[str, list[Any]] = {"id": [], "is_read": [], "key": [], "val": []}
    add_cols: dict[str, list[Any]] = {"id": [], "key": [], "delta": []}

    def row(g: int, is_read: bool, k: str, v: int | None) -> None:
        for c, x in zip(("id", "is_read", "key", "val"), (g, is_read, k, v), strict=True):
            cols[c].append(x)

    for g in ids:
        row(g, True, key(g, "rk1", keys), None)
        if g % 2 == 0:
            row(g, True, key(g, "rk2", keys), None)
            for n, tag in enumerate(("wk1", "wk2")):
                row(g, False, key(g, tag, keys), g * 2 + n)
        else:
            row(g, True, "c" + key(g, "rc", counters), 0)
            for k in dict.fromkeys("c" + key(g, tag, counters) for tag in ("ac1", "ac2")):
                add_cols["id"].append(g)
                add_cols["key"].append(k)
                add_cols["delta"].append(1)
    intents = pa.table({
        "id": pa.array(cols["id"], pa.int64()), "is_read": pa.array(cols["is_read"], pa.bool_()),
        "key": pa.array(cols["key"], pa.string()), "val": pa.array(cols["val"], pa.int64()),
    })
    adds = pa.table({
        "id": pa.array(add_cols["id"], pa.int64()), "key": pa.array(add_cols["key"], pa.string()),
        "delta": pa.array(add_cols["delta"], pa.int64()),
    })
    return intents, adds


def additive(args: argparse.Namespace) -> dict[str, Any]:
    """Section 3: AdditiveResolver against resolve_additive from scratch."""
    base = pa.table({"key": [f"ck{c}" for c in range(args.counters)], "val": pa.array([0] * args.counters, pa.int64())})
    intents, adds = additive_workload(range(1, args.txns + 1), args.keys, args.counters)
    resolve_additive(intents.slice(0, 100), adds.slice(0, 100), base)  # warm up
    t_batch, res = timed(lambda: resolve_additive(intents, adds, base))
    t_seq, _ = timed(lambda: sequential_additive(intents, adds, base))
    r = AdditiveResolver(base)
    t_inc, _ = timed(lambda: r.add(intents, adds))
    assert r.rollback.equals(res.rollback) and r.rounds == res.rounds, "AdditiveResolver and resolve_additive disagree"
    build_evals = r.evaluations
    added_i, added_a = [intents], [adds]
    top: list[float] = []
    scratch: list[float] = []
    evals: list[int] = []
    steps: list[int] = []
    queries: list[int] = []
    rows_per_batch: list[int] = []
    nxt = args.txns + 1
    for _ in range(args.batches):
        bi, ba = additive_workload(range(nxt, nxt + 25), args.keys, args.counters)
        nxt += 25
        e0, s0, q0 = r.evaluations, r.scan_steps, r.tree_queries
        dt, _ = timed(lambda bi=bi, ba=ba: r.add(bi, ba))
        top.append(dt)
        evals.append(r.evaluations - e0)
        steps.append(r.scan_steps - s0)
        queries.append(r.tree_queries - q0)
        rows_per_batch.append(bi.num_rows + ba.num_rows)
        added_i.append(bi)
        added_a.append(ba)
        all_i, all_a = pa.concat_tables(added_i), pa.concat_tables(added_a)
        dt, again = timed(lambda all_i=all_i, all_a=all_a: resolve_additive(all_i, all_a, base))
        scratch.append(dt)
    assert r.rollback.equals(again.rollback) and r.rounds == again.rounds, "AdditiveResolver disagrees"
    store = dict(zip(r.store["key"].to_pylist(), r.store["val"].to_pylist(), strict=True))
    assert store == dict(zip(again.store["key"].to_pylist(), again.store["val"].to_pylist(), strict=True))
    rows = [
        ["resolve_additive (batch fixpoint), from scratch", ms(t_batch), "", ""],
        ["sequential_additive (pure Python), from scratch", ms(t_seq), "", ""],
        ["AdditiveResolver.add of everything, from empty", ms(t_inc), f"{build_evals:,}", ""],
        [
            f"add ~{statistics.mean(rows_per_batch):.0f} rows (25 txns), ids past all (p50 / max)",
            f"{ms(statistics.median(top))} / {ms(max(top))}",
            f"{statistics.mean(evals):.0f}",
            f"{statistics.mean(steps):.0f} / {statistics.mean(queries):.0f}",
        ],
        [
            "resolve_additive from scratch with the batch (p50 / max)",
            f"{ms(statistics.median(scratch))} / {ms(max(scratch))}",
            "",
            "",
        ],
    ]
    print_table(
        ["additive", "time", "txns evaluated", "scan steps / adder queries"],
        rows,
        title=f"Additive writes: {args.txns:,} transactions (half additive) over {args.keys:,} keys and "
        f"{args.counters:,} counters: {intents.num_rows:,} intents + {adds.num_rows:,} adds, "
        f"{res.rollback.num_rows:,} rolled back, {res.rounds} rounds",
    )
    return {
        "counts": {"intents": intents.num_rows, "adds": adds.num_rows, "to_rollback": res.rollback.num_rows,
                   "rounds": res.rounds},
        "scratch_s": {"resolve_additive": t_batch, "sequential_additive": t_seq, "resolver_add": t_inc},
        "build_evaluations": build_evals,
        "top": top, "evals_top": evals, "scan_steps_top": steps, "tree_queries_top": queries,
        "resolve_additive_with_batch": scratch,
    }


if __name__ == "__main__":
    main()
