"""The one backoff rule for retrying storage failures (every retry loop in persist uses it)."""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from typing import TypeVar

from persist.errors import ExternalError

T = TypeVar("T")


def backoff(attempt: int, cap_s: float = 0.5, base_s: float = 0.005) -> None:
    """Sleep before retry number ``attempt``.

    ``base_s * 2**attempt`` (10 ms first by default), capped at ``cap_s``, jittered.
    """
    time.sleep(min(cap_s, base_s * (2 ** min(attempt, 16))) * (0.5 + random.random()))




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
