"""The one retry rule: try again after a retryable failure, with jittered backoff, until a deadline.

Every retry loop of the project goes through :func:`retry_until` (storage
failures here in persist, ``TransactionConflict`` in the database's
``run``, ``run_batch`` and intent resolution), so they share one backoff
and one way of giving up.

Invariants:

- An attempt starts only before the deadline; the loop gives up only at the
  deadline (or at ``max_attempts``, when the caller sets one), never earlier.
- A pause never runs past the deadline, and is *full jitter*
  (uniform in ``[0, step]``): contenders that lost the same race spread out
  instead of colliding again in lockstep (no livelock).
- The pause grows with the attempts and with how long an attempt takes
  (``step = max(base_s, last attempt's duration) * 2**n``, capped): a loser
  waits about as long as the winner needs to finish, on a fast store and a
  slow one alike.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeVar

from persist.errors import ExternalError

T = TypeVar("T")


def backoff(attempt: int, cap_s: float = 0.5, base_s: float = 0.005) -> None:
    """Sleep before retry number ``attempt``.

    ``base_s * 2**attempt`` (10 ms first by default), capped at ``cap_s``, jittered.
    """
    time.sleep(min(cap_s, base_s * (2 ** min(attempt, 16))) * (0.5 + random.random()))


@dataclass
class Attempts:
    """The state of one :func:`retry_until` loop, handed to each attempt.

    ``number``: this attempt's (1 for the first); ``started``/``deadline``:
    ``time.monotonic()`` values; ``last_s``: how long the previous attempt took;
    ``priority``: see below.
    """

    deadline_s: float
    max_attempts: int | None = None
    started: float = field(default_factory=time.monotonic)
    number: int = 0
    last_s: float = 0.0
    priority: bool = False
    """Set by an attempt that holds a turn others wait for: the next pause is skipped."""

    @property
    def deadline(self) -> float:
        return self.started + self.deadline_s

    @property
    def elapsed_s(self) -> float:
        return time.monotonic() - self.started

    @property
    def left_s(self) -> float:
        return self.deadline - time.monotonic()

    def exhausted(self) -> bool:
        """Whether the loop must give up instead of trying again."""
        if self.max_attempts is not None and self.number >= self.max_attempts:
            return True
        return self.left_s <= 0

    def pause(self, base_s: float, cap_s: float) -> None:
        """Sleep the jittered backoff before the next attempt (never past the deadline; none with ``priority``)."""
        if self.priority:
            return
        step = min(cap_s, max(base_s, self.last_s) * (2 ** min(self.number, 16)))
        time.sleep(max(0.0, min(self.left_s, random.uniform(0.0, step))))

    def describe(self) -> str:
        """``"after 1.2 s and 7 attempts"``: for the message of the error the loop gives up with."""
        return f"after {self.elapsed_s:.1f} s and {self.number} attempt{'s' if self.number != 1 else ''}"


def retry_until(
    attempt: Callable[[Attempts], T],
    *,
    retry_on: type[BaseException] | tuple[type[BaseException], ...],
    deadline_s: float,
    max_attempts: int | None = None,
    gave_up: Callable[[BaseException, Attempts], BaseException] | None = None,
    on_retry: Callable[[BaseException, Attempts], None] | None = None,
    base_s: float = 0.001,
    cap_s: float = 0.5,
) -> T:
    """``attempt(state)``, run again after each ``retry_on`` failure until ``deadline_s`` (or ``max_attempts``).

    Between attempts it calls ``on_retry(error, state)`` (e.g. to clean up,
    or to wait for a turn) and pauses (see the module doc). At the deadline
    it raises ``gave_up(last error, state)`` from the last error (default:
    the last error itself). Any other exception propagates at once.

    >>> calls = []
    >>> def flaky(a):
    ...     calls.append(a.number)
    ...     if a.number < 3:
    ...         raise ExternalError("try again")
    ...     return "done"
    >>> retry_until(flaky, retry_on=ExternalError, deadline_s=5), calls
    ('done', [1, 2, 3])
    """
    state = Attempts(deadline_s, max_attempts)
    while True:
        state.number += 1
        began = time.monotonic()
        try:
            return attempt(state)
        except retry_on as e:
            state.last_s = time.monotonic() - began
            if state.exhausted():
                if gave_up is None:
                    raise
                raise gave_up(e, state) from e
            if on_retry is not None:
                on_retry(e, state)
            state.pause(base_s, cap_s)


def retry_storage(fn: Callable[[], T], deadline_s: float) -> T:
    """``fn()``, retried after storage failures (``ExternalError``) until ``deadline_s`` has passed.

    Only for operations that are safe to repeat (reads, idempotent writes).
    """
    return retry_until(lambda _: fn(), retry_on=ExternalError, deadline_s=deadline_s, base_s=0.01)


__all__ = ["Attempts", "backoff", "retry_storage", "retry_until"]
