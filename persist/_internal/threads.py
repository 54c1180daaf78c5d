"""A pool of threads for short storage calls, each submission handed straight to an idle thread.

A ``ThreadPoolExecutor`` wakes its threads one after another through one
queue: of two submissions made together, the second waits until the first
one's thread has woken and taken the GIL (often until the submitting thread
blocks). Here each idle thread waits on a lock of its own, and a submission
releases just that thread's lock, so submissions made together start
together.

Invariants:

- Threads are started as submissions need them (up to ``max_workers``) and
  kept; a submission goes to an idle thread if there is one, else it waits
  in order for the next thread that becomes free.
- Its threads are daemon threads: callers wait for what they submit (every
  user of these pools does before it returns), so at exit none runs unless
  its caller still does (and the interpreter waits for the caller's thread
  first).
"""

from __future__ import annotations

import os
import threading
from collections import deque
from collections.abc import Callable
from concurrent.futures import Executor, Future
from typing import Any, TypeVar

T = TypeVar("T")

_Task = tuple[Future[Any], Callable[..., Any], tuple[Any, ...], dict[str, Any]]


class _Idle:
    """A thread waiting for a task: its own lock, released to wake just it."""

    __slots__ = ("task", "wake")

    def __init__(self) -> None:
        self.wake = threading.Lock()
        self.wake.acquire()
        self.task: _Task | None = None


class ThreadPool(Executor):
    """Up to ``max_workers`` threads named ``{name}_{n}``, started as needed and kept (see the module doc)."""

    def __init__(self, max_workers: int, name: str) -> None:
        self._max = max_workers
        self._name = name
        self._lock = threading.Lock()
        self._idle: list[_Idle] = []  # waiting threads (the most recently idle last)
        self._tasks: deque[_Task] = deque()  # submissions no thread has taken yet
        self._threads = 0
        self._shutdown = False

    def submit(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> Future[T]:
        f: Future[T] = Future()
        task: _Task = (f, fn, args, kwargs)
        with self._lock:
            if self._shutdown:
                raise RuntimeError("cannot schedule new futures after shutdown")
            if self._idle:
                idle = self._idle.pop()
                idle.task = task
                idle.wake.release()
                return f
            self._tasks.append(task)
            if self._threads >= self._max:
                return f
            self._threads += 1
            n = self._threads
        try:
            threading.Thread(target=self._work, name=f"{self._name}_{n - 1}", daemon=True).start()
        except BaseException:  # (no thread: the interpreter is exiting, or none can be made)
            with self._lock:
                self._threads -= 1
                if task in self._tasks and not self._threads:
                    self._tasks.remove(task)
                    raise
        return f

    def _work(self) -> None:
        me = _Idle()
        while True:
            task: _Task | None = None
            with self._lock:
                if self._tasks:
                    task = self._tasks.popleft()
                elif self._shutdown:
                    return
                else:
                    self._idle.append(me)
            if task is None:
                me.wake.acquire()
                task, me.task = me.task, None
                if task is None:  # (woken by shutdown)
                    return
            f, fn, args, kwargs = task
            del task
            if f.set_running_or_notify_cancel():
                try:
                    result = fn(*args, **kwargs)
                except BaseException as e:  # noqa: BLE001 - handed to the caller through the future
                    f.set_exception(e)
                else:
                    f.set_result(result)
            del f, fn, args, kwargs

    @staticmethod
    def of_process(name: str, max_workers: int) -> ThreadPool:
        """This process's pool called ``name`` (made on first use, and made again in a forked child,
        which inherits no threads)."""
        with _shared_lock:
            pid = os.getpid()
            got = _shared.get(name)
            if got is None or got[0] != pid:
                got = _shared[name] = (pid, ThreadPool(max_workers, name))
            return got[1]

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        """No new submissions; idle threads end (busy ones after their tasks and what is queued)."""
        with self._lock:
            self._shutdown = True
            if cancel_futures:
                while self._tasks:
                    self._tasks.popleft()[0].cancel()
            idle, self._idle = self._idle, []
        for i in idle:
            i.wake.release()  # (with no task: the thread ends)


_shared_lock = threading.Lock()
_shared: dict[str, tuple[int, ThreadPool]] = {}  # name -> (the pid that made it, the pool)

__all__ = ["ThreadPool"]
