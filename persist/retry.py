"""The one backoff rule for retrying storage failures (every retry loop in persist uses it)."""

from __future__ import annotations

import random
import time


def backoff(attempt: int) -> None:
    """Sleep before retry number ``attempt``: exponential from 10 ms, capped at 0.5 s, jittered."""
    time.sleep(min(0.5, 0.005 * (2 ** min(attempt, 8))) * (0.5 + random.random()))


__all__ = ["backoff"]
