"""A list-append workload over keyed tables, recorded for :mod:`tests.isolation.checker`.

Each key ``k`` of table ``lists`` holds a list of ints stored as a
comma-separated string. A transaction is 1-4 random micro-ops: read a key's
list (``t.get``), or append a unique value to it (``t.get`` then
``t.upsert``). Workers run transactions through ``db.run`` (or one attempt
of ``db.transaction()`` with ``retry=False``) and record each as an
:class:`~tests.isolation.checker.Op`: the micro-ops of the attempt that
committed, real-time start/end, and the outcome (``ok``; ``fail`` when
nothing committed for sure: a conflict or an abort; ``info`` when a storage
error leaves it unknown).
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable
from typing import Any

import pyarrow as pa

import txns
from persist import Indeterminate, PersistError
from tests.isolation.checker import Op

SCHEMA = pa.schema([("k", pa.string()), ("vals", pa.string())])
TABLE = "lists"


def create(db: txns.Database) -> None:
    db.create_table(TABLE, SCHEMA, primary_key=["k"])


def parse(row: dict[str, Any] | None) -> tuple[int, ...]:
    if row is None or not row["vals"]:
        return ()
    return tuple(int(x) for x in row["vals"].split(","))


class Counter:
    """Unique append values shared by a process's workers."""

    def __init__(self, start: int = 0) -> None:
        self._next = start
        self._lock = threading.Lock()

    def take(self) -> int:
        with self._lock:
            self._next += 1
            return self._next


def random_txn(rng: random.Random, keys: int, counter: Counter) -> list[tuple[str, str, int | None]]:
    """A plan: 1-4 micro-ops over ``keys`` keys (values fixed up front, so a re-run appends the same)."""
    plan = []
    for _ in range(rng.randint(1, 4)):
        k = f"k{rng.randrange(keys)}"
        if rng.random() < 0.5:
            plan.append(("r", k, None))
        else:
            plan.append(("append", k, counter.take()))
    return plan


def txn_body(plan: list[tuple[str, str, int | None]], mops: list[tuple]) -> Callable[[txns.Transaction], None]:
    """The transaction function running ``plan``; each run records its micro-ops in ``mops`` (cleared first).

    So after ``db.run`` returns, ``mops`` holds what the attempt that
    committed read and appended.
    """

    def body(t: txns.Transaction) -> None:
        mops.clear()
        for kind, k, v in plan:
            cur = parse(t.get(TABLE, (k,)))
            if kind == "r":
                mops.append(("r", k, cur))
            else:
                new = ",".join(str(x) for x in (*cur, v))
                t.upsert(TABLE, [{"k": k, "vals": new}])
                mops.append(("append", k, v))

    return body


def planned_appends(plan: list[tuple[str, str, int | None]]) -> tuple[tuple[str, str, int], ...]:
    """The append micro-ops ``plan`` makes if it runs to the end (the same values on every run)."""
    return tuple(("append", k, v) for kind, k, v in plan if kind == "append" and v is not None)


def run_one(
    db: txns.Database,
    plan: list[tuple[str, str, int | None]],
    process: str,
    op_id: str,
    isolation: str,
    retry: bool = True,
) -> Op:
    """Run ``plan`` as one transaction; the recorded op."""
    mops: list[tuple] = []
    body = txn_body(plan, mops)
    start = time.monotonic()
    status, read_ts, commit_ts = "ok", None, None
    try:
        if retry:
            info = db.run(body, isolation=isolation)
        else:
            with db.transaction(isolation=isolation) as t:
                body(t)
            info = t.commit_info
        read_ts, commit_ts = info.read_ts, info.ts
    except (txns.TransactionConflict, txns.Abort):
        status = "fail"
    except Indeterminate:
        status = "info"
    except PersistError:
        status = "fail"  # a determinate storage failure: nothing committed
    end = time.monotonic()
    return Op(op_id, process, start, end, status, tuple(mops), read_ts, commit_ts)


def run_threads(
    connect: Callable[[], txns.Database],
    workers: int,
    txns_each: int,
    keys: int,
    isolation: str,
    seed: int,
    retry: bool = True,
    process: str = "p",
    counter: Counter | None = None,
    pause_s: float = 0.0,
) -> list[Op]:
    """``workers`` threads, each with its own database object from ``connect()``, ``txns_each`` transactions each.

    ``pause_s``: each worker pauses up to this long (random) between transactions.
    """
    counter = counter or Counter()
    out: list[Op] = []
    lock = threading.Lock()
    errors: list[BaseException] = []

    def worker(w: int) -> None:
        rng = random.Random(seed * 1000 + w)
        db = connect()
        try:
            for i in range(txns_each):
                op = run_one(
                    db, random_txn(rng, keys, counter), f"{process}-{w}", f"{process}-{w}-{i}", isolation, retry
                )
                with lock:
                    out.append(op)
                if pause_s:
                    time.sleep(rng.random() * pause_s)
        except BaseException as e:  # noqa: BLE001 - reported by the caller
            errors.append(e)
        finally:
            db.close()

    threads = [threading.Thread(target=worker, args=(w,)) for w in range(workers)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    if errors:
        raise errors[0]
    return out


__all__ = [
    "SCHEMA",
    "TABLE",
    "Counter",
    "create",
    "parse",
    "planned_appends",
    "random_txn",
    "run_one",
    "run_threads",
    "txn_body",
]
