"""One thread pool per process for the database layer's short, parallel storage work.

Reading parts, writing out a transaction's tables and writing new shards'
schemas each fan out over a few independent storage calls. Starting threads
for each of them costs more than the calls on a busy machine, so they share
this pool, whose threads are started once and kept.

Each submission is handed straight to an idle thread, which alone is woken
for it (``persist.ThreadPool``: two submissions made together start
together, where a ``ThreadPoolExecutor`` starts the second only once the
first one's thread has woken).

Invariants:

- Its tasks are leaves: none waits for another task of this pool. A caller
  that is itself one of its threads runs its work inline instead (so nested
  use can never deadlock).
- A forked child gets a pool of its own (the parent's threads do not exist
  in it).
- Every caller waits for what it submitted before it returns (the pool's
  threads are daemon threads: at exit none runs unless its caller does).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from typing import TypeVar

from persist import ThreadPool

THREADS = 8
"""Threads of the pool: the most storage calls one process's database layer runs at once."""
NAME = "txns-db-io"

T = TypeVar("T")
R = TypeVar("R")


def pool() -> ThreadPool:
    """The process's pool (created on first use, and again in a forked child)."""
    return ThreadPool.of_process(NAME, THREADS)


def in_pool() -> bool:
    """Whether the calling thread is one of the pool's (its work must then run inline)."""
    return threading.current_thread().name.startswith(NAME)


def each(fn: Callable[[T], R], items: Iterable[T]) -> list[R | BaseException]:
    """``fn`` of every item, at once (inline for one item, or from a pool thread).

    The calling thread runs the first item itself and the others run on the
    pool; one the pool has not started by the time the caller is done with
    its own is run by the caller too. Every call runs to its end; a call
    that raised gives its exception in its place (the caller decides what
    to raise).
    """

    def call(x: T) -> R | BaseException:
        try:
            return fn(x)
        except BaseException as e:  # noqa: BLE001 - handed to the caller
            return e

    items = list(items)
    if len(items) <= 1 or in_pool():
        return [call(x) for x in items]
    futures = [pool().submit(call, x) for x in items[1:]]
    out = [call(items[0])]
    for x, f in zip(items[1:], futures, strict=True):
        out.append(call(x) if f.cancel() else f.result())
    return out


def each_or_raise(fn: Callable[[T], R], items: Iterable[T]) -> list[R]:
    """``fn`` of every item, at once (as :func:`each`); once every call ended, the first failure is raised."""
    out: list[R] = []
    for res in each(fn, items):
        if isinstance(res, BaseException):
            raise res
        out.append(res)
    return out


__all__ = ["NAME", "THREADS", "each", "each_or_raise", "in_pool", "pool"]
