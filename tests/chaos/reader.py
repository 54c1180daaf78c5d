"""A long-lived chaos reader: one txns handle for the whole run, every read recorded for the verifier.

Run as ``python -m tests.chaos.reader --url URL --txns-id ID --legs ID
--ledger ID --reader N --state-dir DIR --seed S --variant V --seconds T``.
It opens one :class:`txns.TxnsHandle` (through the fault proxy, with the
workers' persist config) and keeps it until the end: its leased reader must
survive faults, compaction, garbage collection and truncation around it
(or lapse and restart, which the handle does by itself). In a loop it
catches up and reads *both* data shards at one time: the latest readable
time (``frontier - 1``) or, one read in three, an older time drawn from
everything since registration. Each successful pair of reads is one JSON
line of ``r<N>.reads.jsonl``::

    {"ts": T, "kind": "latest"|"as_of",
     "ledger": [[tid, src, dst, amount, pad_length, multiplicity], ...],
     "legs": [[account, tid, amount, multiplicity], ...]}

The verifier (:mod:`tests.chaos.verify`) checks every line against the
history it replays. A read refused with ``ReadBelowSince`` (compaction
merged that time) is expected and counted; storage failures are counted and
retried; anything else is a violation.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
import traceback
from pathlib import Path
from typing import Any

from persist import PersistClient, PersistError, ReadBelowSince
from tests.chaos.bank import REGISTER_TS, worker_config
from tests.chaos.sidecar import Side
from txns import TxnsHandle

PAUSE_S = (0.05, 0.3)


def reads_path(state_dir: Path, reader: int) -> Path:
    return state_dir / f"r{reader}.reads.jsonl"


def ledger_rows(snap: list[Any]) -> list[list[Any]]:
    return sorted([k[0], v[0], v[1], v[2], len(v[3]), d] for (k, v), _ts, d in snap if d != 0)


def legs_rows(snap: list[Any]) -> list[list[Any]]:
    return sorted([k[0], k[1], v[0], d] for (k, v), _ts, d in snap if d != 0)


def run(a: argparse.Namespace) -> int:
    state_dir = Path(a.state_dir)
    side = Side(state_dir, f"r{a.reader}", a.incarnation)
    st = side.stats
    rng = random.Random(f"reader-{a.seed}-{a.reader}-{a.incarnation}")
    deadline = time.monotonic() + a.seconds
    client: PersistClient | None = None
    handle: TxnsHandle | None = None
    out = reads_path(state_dir, a.reader).open("a", encoding="utf-8")
    try:
        while time.monotonic() < deadline and not side.orphaned():
            side.save()
            try:
                if client is None:
                    client = PersistClient.open(a.url, worker_config(a.variant))
                if handle is None:
                    handle = TxnsHandle.open(client, a.txns_id)  # once: kept for the whole run
                    st.bump("opens")
                handle.cache.sync()
                latest = handle.cache.frontier - 1
                if latest < REGISTER_TS:
                    time.sleep(PAUSE_S[1])
                    continue
                kind = "latest" if rng.random() < 2 / 3 else "as_of"
                ts = latest if kind == "latest" else rng.randint(REGISTER_TS, latest)
                ledger = handle.snapshot(a.ledger, ts)
                legs = handle.snapshot(a.legs, ts)
            except ReadBelowSince as e:
                st.exception("read", e)
                st.bump("below_since")
                continue
            except PersistError as e:
                st.exception("read", e)
                time.sleep(rng.uniform(*PAUSE_S))
                continue
            except Exception as e:  # noqa: BLE001 - a library bug: record it
                st.exception("read", e)
                st.violation("reader_unexpected", f"{e!r}\n{traceback.format_exc(limit=8)}")
                time.sleep(rng.uniform(*PAUSE_S))
                continue
            line = {"ts": ts, "kind": kind, "ledger": ledger_rows(ledger), "legs": legs_rows(legs)}
            out.write(json.dumps(line) + "\n")
            out.flush()
            st.bump(f"reads_{kind}")
            time.sleep(rng.uniform(*PAUSE_S))
        return 0
    finally:
        out.close()
        if handle is not None:
            try:
                handle.close()
            except Exception as e:  # noqa: BLE001 - best effort
                st.exception("close", e)
        side.save(force=True)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="tests.chaos.reader", description=__doc__.split("\n")[0])
    p.add_argument("--url", required=True)
    p.add_argument("--txns-id", required=True)
    p.add_argument("--legs", required=True)
    p.add_argument("--ledger", required=True)
    p.add_argument("--reader", type=int, required=True)
    p.add_argument("--incarnation", type=int, default=1)
    p.add_argument("--state-dir", required=True)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--variant", default="default")
    p.add_argument("--seconds", type=float, default=600.0)
    return run(p.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
