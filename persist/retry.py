"""The one backoff rule for retrying storage failures (every retry loop in persist uses it)."""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from typing import TypeVar

from persist.errors import ExternalError

T = TypeVar("T")


def backoff(attempt: int) -> None:
    """Sleep before retry number ``attempt``: exponential from 10 ms, capped at 0.5 s, jittered."""
    time.sleep(min(0.5, 0.005 * (2 ** min(attempt, 8))) * (0.5 + random.random()))




def retry_storage(fn: Callable[[], T], deadline_s: float) -> T:
    """``fn()``, retried after storage failures (``ExternalError``) until ``deadline_s`` has passed.

    Only for operations that are safe to repeat (reads, idempotent writes).
    """
    deadline = time.monotonic() + deadline_s
    attempt = 0
    while True:
        try:
            return fn()
        except ExternalError:
            attempt += 1
            if time.monotonic() > deadline:
                raise
            backoff(attempt)


__all__ = ["backoff", "retry_storage"]
