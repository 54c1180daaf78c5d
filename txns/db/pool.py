"""One thread pool per process for the database layer's short, parallel storage work.

Reading parts, writing out a transaction's tables and writing new shards'
schemas each fan out over a few independent storage calls. Starting threads
for each of them costs more than the calls on a busy machine, so they share
this pool, whose threads are started once and kept.

Invariants:

- Its tasks are leaves: none waits for another task of this pool. A caller
  that is itself one of its threads runs its work inline instead (so nested
  use can never deadlock).
- A forked child gets a pool of its own (the parent's threads do not exist
  in it).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

THREADS = 8
"""Threads of the pool: the most storage calls one process's database layer runs at once."""
NAME = "txns-db-io"

T = TypeVar("T")
R = TypeVar("R")

_lock = threading.Lock()
_pool: ThreadPoolExecutor | None = None
_pid: int | None = None


def pool() -> ThreadPoolExecutor:
    """The process's pool (created on first use, and again in a forked child)."""
    global _pool, _pid
    with _lock:
        if _pool is None or _pid != os.getpid():
            _pool = ThreadPoolExecutor(max_workers=THREADS, thread_name_prefix=NAME)
            _pid = os.getpid()
        return _pool


def in_pool() -> bool:
    """Whether the calling thread is one of the pool's (its work must then run inline)."""
    return threading.current_thread().name.startswith(NAME)


def each(fn: Callable[[T], R], items: Iterable[T]) -> list[R | BaseException]:
    """``fn`` of every item, at once on the pool (inline for one item, or from a pool thread).

    Every call runs to its end; a call that raised gives its exception in
    its place (the caller decides what to raise).
    """

    def call(x: T) -> R | BaseException:
        try:
            return fn(x)
        except BaseException as e:  # noqa: BLE001 - handed to the caller
            return e

    items = list(items)
    if len(items) <= 1 or in_pool():
        return [call(x) for x in items]
    futures = [pool().submit(call, x) for x in items]
    return [f.result() for f in futures]


__all__ = ["NAME", "THREADS", "each", "in_pool", "pool"]
