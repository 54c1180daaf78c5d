"""The creation path's seams: the shared pool hands each submission to its own idle thread,
``each`` works on the calling thread too, the background worker's thread is started off the
committing thread, and a new database plus two tables keeps its writes and their order."""

from __future__ import annotations

import os
import threading
import time
from concurrent.futures import CancelledError

import pyarrow as pa
import pytest

import txns
from persist import ThreadPool as Pool
from persist.errors import Determinate
from txns.db import pool as pool_mod
from txns.db.applier import Applier
from txns.db.pool import each, in_pool

SCHEMA = pa.schema([("k", pa.int64()), ("v", pa.string())])


def test_the_pool_runs_submissions_at_once_on_their_own_threads() -> None:
    p = Pool(4, "test-pool")
    try:
        started = [threading.Event() for _ in range(3)]
        release = threading.Event()

        def task(i: int) -> str:
            started[i].set()
            assert release.wait(10)
            return threading.current_thread().name

        futures = [p.submit(task, i) for i in range(3)]
        assert all(e.wait(10) for e in started), "three at once, none waits for another"
        release.set()
        names = [f.result(10) for f in futures]
        assert len(set(names)) == 3 and all(n.startswith("test-pool_") for n in names)
        # threads are kept: the next submissions go to the idle ones
        assert {p.submit(lambda: threading.current_thread().name).result(10) for _ in range(6)} <= set(names) | {
            "test-pool_3"
        }

        def boom() -> None:
            raise Determinate("storage said no")

        with pytest.raises(Determinate, match="said no"):
            p.submit(boom).result(10)
    finally:
        p.shutdown()
    with pytest.raises(RuntimeError):
        p.submit(lambda: None)


def test_a_process_has_one_pool_per_name_and_a_forked_child_its_own(monkeypatch: pytest.MonkeyPatch) -> None:
    a = Pool.of_process("test-shared", 2)
    assert Pool.of_process("test-shared", 2) is a
    assert Pool.of_process("test-shared-other", 2) is not a
    real = os.getpid()
    monkeypatch.setattr(os, "getpid", lambda: real + 1)  # (as a forked child sees it)
    child = Pool.of_process("test-shared", 2)
    assert child is not a and Pool.of_process("test-shared", 2) is child
    assert child.submit(lambda: 7).result(10) == 7


def test_a_submission_cancelled_before_it_starts_does_not_run() -> None:
    p = Pool(1, "test-pool-1")
    try:
        gate = threading.Event()
        ran: list[int] = []
        first = p.submit(gate.wait, 10)
        second = p.submit(ran.append, 1)
        assert second.cancel()
        gate.set()
        assert first.result(10)
        p.submit(lambda: None).result(10)
        assert not ran
        with pytest.raises(CancelledError):
            second.result()
    finally:
        p.shutdown()


def test_each_runs_the_first_item_on_the_calling_thread_and_keeps_the_order() -> None:
    me = threading.current_thread().name

    def who(i: int) -> tuple[int, str]:
        if i == 2:
            raise ValueError("two")
        time.sleep(0.01)
        return i, threading.current_thread().name

    out = each(who, range(4))
    assert out[0] == (0, me)
    assert isinstance(out[2], ValueError)
    assert [o[0] for o in out if not isinstance(o, BaseException)] == [0, 1, 3]
    # from a pool thread: all inline
    inner = pool_mod.pool().submit(lambda: (in_pool(), each(lambda i: threading.current_thread().name, range(3))))
    inside, names = inner.result(10)
    assert inside and len(set(names)) == 1


def test_a_commit_does_not_start_the_worker_thread_itself(db_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    starters: list[str] = []
    real_start = threading.Thread.start

    def start(self: threading.Thread) -> None:
        if self.name == "txns-db-apply":
            starters.append(threading.current_thread().name)
        real_start(self)

    monkeypatch.setattr(threading.Thread, "start", start)
    db = txns.connect(db_url)
    with db.transaction() as tx:
        tx.create_table("a", SCHEMA)
    db.close()  # (waits for the start, then for the worker)
    assert starters and all(s.startswith(pool_mod.NAME) for s in starters), starters
    assert not db._applier.running


def test_a_worker_thread_that_failed_to_start_is_started_again(db_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    db = txns.connect(db_url)
    real_start = threading.Thread.start
    failures = [1]

    def start(self: threading.Thread) -> None:
        if self.name == "txns-db-apply" and failures:
            failures.pop()
            raise RuntimeError("can't start new thread")
        real_start(self)

    monkeypatch.setattr(threading.Thread, "start", start)
    db.create_table("a", SCHEMA)
    starting = db._applier._starting
    assert starting is not None and isinstance(starting.exception(10), RuntimeError)
    with db.transaction() as tx:
        tx.insert("a", pa.table({"k": [1], "v": ["x"]}))
    assert db._applier.wait(timeout=10) and db._applier.applies >= 1
    db.close()


def test_a_new_database_with_two_tables_is_three_writes_in_order(db_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The root record first (the txns shard's first state and the system shards' schemas meanwhile);
    the new tables' schemas before the commit that registers them becomes visible."""
    order: list[tuple[str, str]] = []
    lock = threading.Lock()
    real = Applier.submit

    def submit(self: Applier, ts: int, written: object = None) -> bool:
        with lock:
            order.append(("applier", ""))
        return real(self, ts, written)  # type: ignore[arg-type]

    monkeypatch.setattr(Applier, "submit", submit)
    from persist import file as file_mod

    real_link = file_mod.os.link

    def link(src: object, dst: object, **kw: object) -> None:
        d = kw.get("dst_dir_fd")
        path = str(dst) if d is None else f"{os.readlink(f'/proc/self/fd/{d}')}/{dst}"
        with lock:
            order.append(("link", path.split("/consensus/")[1].split("/")[0]))
        real_link(src, dst, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(file_mod.os, "link", link)
    db = txns.connect(db_url)
    root_links = list(order)
    assert ("link", "ktxns-db-root") in root_links and len(root_links) == 4, root_links
    order.clear()
    with db.transaction() as tx:
        tx.create_table("a", SCHEMA)
        tx.create_table("b", SCHEMA)
    links = [k for op, k in order if op == "link"]
    txns_dir = "k" + db.root.txns_id
    assert links[-1] == txns_dir and links.count(txns_dir) == 1, "one commit, after both schemas"
    assert len(links) == 3 and order[-1] == ("applier", "")
    assert db.tables() == ["a", "b"]
    db.close()
