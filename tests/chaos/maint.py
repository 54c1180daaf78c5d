"""The chaos maintainer: compaction and garbage collection in a loop, alongside the workers and readers.

Run as ``python -m tests.chaos.maint --url URL --txns-id ID --incarnation K
--state-dir DIR --seed S --variant V --seconds T --older-than S``. Each round
runs :func:`txns.admin.compact_txns` (the txns since moved up to its upper,
the txns shard and every data shard compacted) and then
:func:`txns.admin.collect_garbage` (retired parts past their grace, consensus
versions past the retention, leaked parts older than ``--older-than``), with
the workers' persist config: the CLI's ``compact`` and ``gc`` in process,
with the same retention as every other process of the run (persist's
truncation rule assumes that; see tests/chaos/driver.py). The driver kills
it at random times like anything else. Storage failures are counted;
anything else is a violation.
"""

from __future__ import annotations

import argparse
import random
import sys
import time
import traceback
from pathlib import Path

from persist import PersistClient, PersistError
from tests.chaos.bank import worker_config
from tests.chaos.sidecar import Side
from txns.admin import collect_garbage, compact_txns


def run(a: argparse.Namespace) -> int:
    side = Side(Path(a.state_dir), "maint", a.incarnation)
    st = side.stats
    rng = random.Random(f"maint-{a.seed}-{a.incarnation}")
    deadline = time.monotonic() + a.seconds
    client: PersistClient | None = None
    try:
        while time.monotonic() < deadline and not side.orphaned():
            side.save()
            for phase in ("compact", "gc"):
                try:
                    if client is None:
                        client = PersistClient.open(a.url, worker_config(a.variant))
                    if phase == "compact":
                        compact_txns(client, a.txns_id)
                    else:
                        collect_garbage(client, a.txns_id, a.older_than)
                    st.bump(phase)
                except PersistError as e:
                    st.exception(phase, e)
                except Exception as e:  # noqa: BLE001 - a library bug: record it
                    st.exception(phase, e)
                    st.violation("maint_unexpected", f"{phase}: {e!r}\n{traceback.format_exc(limit=8)}")
            time.sleep(rng.uniform(0.2, 1.0))
        return 0
    finally:
        side.save(force=True)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="tests.chaos.maint", description=__doc__.split("\n")[0])
    p.add_argument("--url", required=True)
    p.add_argument("--txns-id", required=True)
    p.add_argument("--incarnation", type=int, default=1)
    p.add_argument("--state-dir", required=True)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--variant", default="default")
    p.add_argument("--seconds", type=float, default=600.0)
    p.add_argument("--older-than", type=float, default=30.0)
    return run(p.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
