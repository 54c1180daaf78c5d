"""The chaos verifier: replay both data shards' change feeds and check the bank at every timestamp.

Run in a fresh process, on the store directly (no proxy), after every worker
has finished: ``python -m tests.chaos.verify --url URL --txns-id ID --legs ID
--ledger ID --state-dir DIR --out result.json``.

It reads each data shard with ``txns.DataSubscribe`` from the earliest
readable time (the registration time, or the shard's since if later) to the
txns upper: the snapshot there, then every update with its time. Replaying
both feeds together in time order, it checks after each time at which
anything changed (the contents are constant in between, so this covers
every timestamp of ``[start, upper)``):

(a) the leg amounts sum to 0;
(b) every ledger row has multiplicity 0 or 1 (2: *applied twice*);
(c) nothing torn: a transfer's two legs are present (multiplicity 1 each,
    matching its ledger row) exactly when its ledger row is;
(d) nothing lost: every acked transfer is present from its acked commit
    time on, and at the end;
(e) no worker left a pending file;
(f) every read of a long-lived reader (:mod:`tests.chaos.reader`) returned
    exactly the contents of both shards at its time (as multisets: a
    duplicated or missing row is a difference), for reads at or after the
    replay's start; reads before it (compaction merged that history) are
    checked for (a)-(c), for every acked transfer committed by then being
    there, none acked later being there, and nothing there that is not
    committed at the end.

It also cross-checks the replayed final contents against a plain
``TxnsHandle.snapshot`` at ``upper - 1``. The report (JSON) has the
violations by kind with examples, and the numbers checked.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import traceback
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from persist import PersistClient, PersistConfig, Progress, Updates
from tests.chaos.bank import REGISTER_TS, read_acked
from txns import DataSubscribe, TxnsHandle

MAX_EXAMPLES = 20
FEED_LIMIT_S = 600.0
MAX_STEPS = 1_000_000


@dataclass
class Report:
    ok: bool = True
    violations: dict[str, int] = field(default_factory=dict)
    examples: dict[str, list[str]] = field(default_factory=dict)
    start: int = 0
    upper: int = 0
    timestamps_checked: int = 0
    change_times: int = 0
    updates_replayed: int = 0
    ledger_rows: int = 0
    acked: int = 0
    committed_unacked: int = 0
    final_sum: int = 0
    read_seconds: float = 0.0
    reads_checked: int = 0
    reads_exact: int = 0
    """Reads compared with the replayed contents at their time (the rest: before the start, invariants only)."""

    def violation(self, kind: str, detail: str) -> None:
        self.ok = False
        self.violations[kind] = self.violations.get(kind, 0) + 1
        ex = self.examples.setdefault(kind, [])
        if len(ex) < MAX_EXAMPLES:
            ex.append(detail[:2000])

    def to_json(self) -> dict[str, Any]:
        return dict(self.__dict__)


def read_feed(client: PersistClient, handle: TxnsHandle, txns_id: str, data_id: str, start: int, upper: int) -> list:
    """Every update of ``data_id`` over ``[start, upper)``: the snapshot at ``start`` then the changes."""
    sub = DataSubscribe(client, txns_id, data_id, as_of=start, until=upper, handle=handle)
    out: list = []
    deadline = time.monotonic() + FEED_LIMIT_S
    try:
        for _ in range(MAX_STEPS):
            if sub.frontier is not None and sub.frontier >= upper:
                return out
            if time.monotonic() > deadline:
                raise TimeoutError(f"change feed of {data_id} stuck at {sub.frontier} (upper {upper})")
            for ev in sub.step(wait_s=1.0):
                if isinstance(ev, Updates):
                    out.extend(ev.updates)
                elif not isinstance(ev, Progress):
                    raise TypeError(f"unexpected event {ev!r}")
        raise TimeoutError(f"change feed of {data_id}: more than {MAX_STEPS} steps")
    finally:
        sub.reader.expire()


def verify(url: str, txns_id: str, legs: str, ledger: str, state_dir: Path) -> Report:
    rep = Report()
    # (e) and the acks
    acked: dict[str, int] = {}
    for p in sorted(state_dir.glob("w*.acked")):
        for tid, ts in read_acked(p):
            if tid in acked:
                rep.violation("acked_twice", f"{tid} acked at {acked[tid]} and {ts}")
            acked[tid] = ts
    rep.acked = len(acked)
    for p in sorted(state_dir.glob("w*.pending")):
        rep.violation("pending_left", f"{p.name}: {p.read_text()[:120]}...")

    client = PersistClient.open(url, PersistConfig(read_wait_s=30.0))
    handle = TxnsHandle.open(client, txns_id)
    try:
        handle.cache.sync()
        upper = handle.cache.frontier
        since = max(client.shard(legs).fetch().since, client.shard(ledger).fetch().since)
        start = max(REGISTER_TS, since)
        rep.start, rep.upper = start, upper
        if upper <= start:
            rep.violation("no_history", f"txns upper {upper} is not past the start {start}")
            return rep
        t0 = time.monotonic()
        try:
            feeds = {
                "legs": read_feed(client, handle, txns_id, legs, start, upper),
                "ledger": read_feed(client, handle, txns_id, ledger, start, upper),
            }
        except Exception as e:  # noqa: BLE001 - unreadable data is a finding
            rep.violation("read_error", f"{e!r}\n{traceback.format_exc(limit=10)}")
            return rep
        rep.read_seconds = round(time.monotonic() - t0, 2)
        reads = load_reads(state_dir)
        replay(rep, feeds, acked, start, upper, reads)
        cross_check(rep, handle, legs, ledger, upper, feeds)
    finally:
        try:
            handle.close()
        except Exception:  # noqa: BLE001
            pass
    return rep


def load_reads(state_dir: Path) -> list[dict[str, Any]]:
    """Every recorded read of the long-lived readers, by time (a torn last line, from a kill, is skipped)."""
    out: list[dict[str, Any]] = []
    for p in sorted(state_dir.glob("r*.reads.jsonl")):
        for line in p.read_text().splitlines():
            try:
                r = json.loads(line)
            except ValueError:
                continue
            r["reader"] = p.name
            out.append(r)
    out.sort(key=lambda r: r["ts"])
    return out


def _contents(ledger: dict, legs: dict) -> tuple[list[list[Any]], list[list[Any]]]:
    """The replayed contents in the readers' format (tests.chaos.reader)."""
    return (
        sorted([*lk, m] for lk, m in ledger.items() if m != 0),
        sorted([*k, m] for k, m in legs.items() if m != 0),
    )


def check_read_invariants(rep: Report, r: dict[str, Any], acked: dict[str, int]) -> set[str]:
    """(a)-(c) and the acks for one read; returns the transfers it saw."""
    where = f"{r['reader']} read at {r['ts']} ({r['kind']})"
    total = sum(amount * m for _a, _t, amount, m in r["legs"])
    if total != 0:
        rep.violation("read_sum_nonzero", f"{where}: legs sum to {total}")
    rows: dict[str, list[list[Any]]] = defaultdict(list)
    for row in r["ledger"]:
        rows[row[0]].append(row)
    legs: dict[str, set[tuple[str, str, int]]] = defaultdict(set)
    for account, tid, amount, m in r["legs"]:
        if m != 1:
            rep.violation("read_duplicate", f"{where}: leg {account} {tid} has multiplicity {m}")
        legs[tid].add((account, tid, amount))
    for tid, rs in rows.items():
        if len(rs) != 1 or rs[0][5] != 1:
            rep.violation("read_duplicate", f"{where}: ledger rows of {tid}: {rs}")
            continue
        _t, src, dst, amount, _pad, _m = rs[0]
        if legs.get(tid) != {(src, tid, -amount), (dst, tid, amount)}:
            rep.violation("read_torn", f"{where}: {tid} ledger {rs[0]} legs {sorted(legs.get(tid, ()))}")
    for tid in set(legs) - set(rows):
        rep.violation("read_torn", f"{where}: legs of {tid} without its ledger row")
    seen = set(rows)
    for tid, ts in acked.items():
        if ts <= r["ts"] and tid not in seen:
            rep.violation("read_lost", f"{where}: {tid} acked at {ts} missing")
        elif ts > r["ts"] and tid in seen:
            rep.violation("read_early", f"{where}: {tid} acked at {ts} already there")
    return seen


def replay(
    rep: Report,
    feeds: dict[str, list],
    acked: dict[str, int],
    start: int,
    upper: int,
    reads: list[dict[str, Any]] | None = None,
) -> None:
    by_ts: dict[int, list[tuple[str, tuple, tuple, int]]] = defaultdict(list)
    for shard, updates in feeds.items():
        for (key, val), ts, diff in updates:
            if not start <= ts < upper:
                rep.violation("time_out_of_range", f"{shard} update {key} at {ts} outside [{start}, {upper})")
                continue
            by_ts[ts].append((shard, tuple(key), tuple(val), diff))
            rep.updates_replayed += 1
    legs: dict[tuple[str, str, int], int] = {}  # (account, tid, amount) -> multiplicity
    legs_by_tid: dict[str, set[tuple[str, str, int]]] = defaultdict(set)
    ledger: dict[tuple[str, str, str, int, int], int] = {}  # (tid, src, dst, amount, pad length) -> mult
    ledger_by_tid: dict[str, set[tuple[str, str, str, int, int]]] = defaultdict(set)
    present_at: dict[str, int] = {}
    vanished_at: dict[str, int] = {}
    total = 0
    sum_bad = False
    pending = list(reads or [])
    pending.reverse()  # (popped oldest first)
    seen_by_reads: set[str] = set()

    def check_reads_before(t: int) -> None:
        """Reads at times below ``t``: the replayed contents are theirs (no change in between)."""
        while pending and pending[-1]["ts"] < t:
            r = pending.pop()
            rep.reads_checked += 1
            seen_by_reads.update(check_read_invariants(rep, r, acked))
            if r["ts"] >= upper:
                rep.violation("read_past_upper", f"{r['reader']} read at {r['ts']}, the final upper is {upper}")
            elif r["ts"] >= start:
                rep.reads_exact += 1
                want_ledger, want_legs = _contents(ledger, legs)
                if (r["ledger"], r["legs"]) != (want_ledger, want_legs):
                    got = {json.dumps(x) for x in r["ledger"] + r["legs"]}
                    want = {json.dumps(x) for x in want_ledger + want_legs}
                    rep.violation(
                        "read_mismatch",
                        f"{r['reader']} read at {r['ts']} ({r['kind']}) differs from the history: only read "
                        f"{sorted(got - want)[:4]}, only in history {sorted(want - got)[:4]}",
                    )

    check_reads_before(start)
    for ts in sorted(by_ts):
        check_reads_before(ts)
        touched: set[str] = set()
        for shard, key, val, diff in by_ts[ts]:
            if shard == "legs":
                account, tid = key
                (amount,) = val
                k = (account, tid, amount)
                legs[k] = legs.get(k, 0) + diff
                legs_by_tid[tid].add(k)
                total += amount * diff
            else:
                (tid,) = key
                src, dst, amount, pad = val
                lk = (tid, src, dst, amount, len(pad))
                ledger[lk] = ledger.get(lk, 0) + diff
                ledger_by_tid[tid].add(lk)
            touched.add(tid)
        rep.change_times += 1
        # (a)
        if total != 0 and not sum_bad:
            rep.violation("sum_nonzero", f"legs sum to {total} at {ts}")
            sum_bad = True  # report the first time only; keep checking the rest
        elif total == 0:
            sum_bad = False
        for tid in sorted(touched):
            rows = {lk: ledger[lk] for lk in ledger_by_tid[tid] if ledger[lk] != 0}
            lgs = {k: legs[k] for k in legs_by_tid[tid] if legs[k] != 0}
            mults = list(rows.values()) + list(lgs.values())
            # (b)
            dup = [m for m in rows.values() if m >= 2]
            if dup:
                rep.violation("duplicate", f"ledger row {tid} has multiplicity {max(dup)} at {ts}")
            if any(m < 0 for m in mults):
                rep.violation("negative", f"{tid} has a negative multiplicity at {ts}: {rows} {lgs}")
            # (c)
            if not dup and all(m >= 0 for m in mults):
                consistent = (not rows and not lgs) or (
                    len(rows) == 1
                    and all(m == 1 for m in mults)
                    and _legs_match(next(iter(rows)), lgs)
                )
                if not consistent:
                    rep.violation("torn", f"{tid} at {ts}: ledger {sorted(rows.items())} legs {sorted(lgs.items())}")
            present = sum(rows.values()) > 0
            if present and tid not in present_at:
                present_at[tid] = ts
            if not present and tid in present_at and tid not in vanished_at:
                vanished_at[tid] = ts
                rep.violation("vanished", f"{tid} present from {present_at[tid]}, gone at {ts}")
    check_reads_before(upper + 1)  # (+1: a read at or past the upper is reported above)
    rep.timestamps_checked = upper - start
    rep.final_sum = total
    final_present = {tid for tid, rows in ledger_by_tid.items() if any(ledger[lk] > 0 for lk in rows)}
    rep.ledger_rows = sum(m for m in ledger.values() if m > 0)
    # (d)
    for tid, ts in sorted(acked.items()):
        if tid not in present_at:
            rep.violation("lost", f"{tid} acked at {ts} never present")
        elif present_at[tid] > ts:
            rep.violation("late", f"{tid} acked at {ts} but present only from {present_at[tid]}")
        elif tid not in final_present:
            rep.violation("lost", f"{tid} acked at {ts} not present at the end")
    rep.committed_unacked = len(final_present - set(acked))
    for tid in sorted(seen_by_reads - final_present):
        rep.violation("read_phantom", f"a reader saw {tid}, which is not committed at the end")


def _legs_match(row: tuple[str, str, str, int, int], lgs: dict[tuple[str, str, int], int]) -> bool:
    tid, src, dst, amount, _ = row
    return set(lgs) == {(src, tid, -amount), (dst, tid, amount)}


def cross_check(rep: Report, handle: TxnsHandle, legs: str, ledger: str, upper: int, feeds: dict[str, list]) -> None:
    """The replayed contents at ``upper - 1`` equal a plain snapshot there."""
    for name, d in (("legs", legs), ("ledger", ledger)):
        replayed: Counter = Counter()
        for (key, val), _ts, diff in feeds[name]:
            replayed[(tuple(key), tuple(val))] += diff
        replayed = Counter({k: v for k, v in replayed.items() if v != 0})
        try:
            snap = handle.snapshot(d, upper - 1)
        except Exception as e:  # noqa: BLE001
            rep.violation("read_error", f"snapshot of {name} at {upper - 1}: {e!r}")
            continue
        direct = Counter({(tuple(k), tuple(v)): diff for (k, v), _ts, diff in snap if diff != 0})
        if direct != replayed:
            only_feed = list((replayed - direct).items())[:3]
            only_snap = list((direct - replayed).items())[:3]
            rep.violation(
                "feed_mismatch",
                f"{name} at {upper - 1}: feed and snapshot differ; feed only {only_feed!r:.500}, "
                f"snapshot only {only_snap!r:.500}",
            )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="tests.chaos.verify", description=__doc__.split("\n")[0])
    p.add_argument("--url", required=True)
    p.add_argument("--txns-id", required=True)
    p.add_argument("--legs", required=True)
    p.add_argument("--ledger", required=True)
    p.add_argument("--state-dir", required=True)
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)
    try:
        rep = verify(args.url, args.txns_id, args.legs, args.ledger, Path(args.state_dir))
    except Exception as e:  # noqa: BLE001 - the report says what failed
        rep = Report()
        rep.violation("verifier_error", f"{e!r}\n{traceback.format_exc(limit=12)}")
    Path(args.out).write_text(json.dumps(rep.to_json(), indent=1, sort_keys=True))
    return 0 if rep.ok else 1


if __name__ == "__main__":
    sys.exit(main())
