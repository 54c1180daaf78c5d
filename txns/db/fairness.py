"""Fairness for ``db.run``: a transaction that keeps losing gets a turn, so it commits (no starvation).

Retrying with backoff alone does not guarantee progress: a read-then-write
transaction that loses to other processes' commits again and again (a hot
key, short transactions elsewhere) can lose until its deadline. The rule:

1. **Starving.** After ``PRIORITY_AFTER`` conflicts a ``db.run`` call is
   *starving*: before each further attempt it takes the **run turn**, a
   lease on the consensus key ``{txns_id}-run-turn`` (the same lease as the
   group-commit sequencer's, :class:`txns.group_commit.SequencerLease`),
   and keeps it (renewed before each attempt) until it commits, fails or
   gives up; then it releases it. Holding the turn it retries without
   backing off. A starving call that finds the turn taken waits for it.
2. **Yielding.** Every other ``db.run`` attempt of a process that saw a
   conflict in the last ``CONTENDED_S`` (and every retry) first checks the
   turn (one consensus read) and, while another call holds it, waits. So
   once a starving call holds the turn, each other such process commits at
   most the attempt it already had in flight, and the starving one then
   runs alone: it commits within about two attempts.
3. The turn is a lease, only for liveness: a holder that dies or stalls
   loses it ``TURN_LEASE_MS`` after its last renewal; safety (conflict
   validation at commit) never depends on it.

Among several starving calls the turn goes to one at a time (whichever
takes the lease when it is free); starving calls are few (each one got
there by losing ``PRIORITY_AFTER`` times), so each gets its turn soon.
Transactions outside ``db.run`` (``with db.transaction()``, plain writes)
never wait for the turn: a starving ``run`` can still lose to them, and
retries until its deadline.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

from persist import Attempts, InvalidUsage, retry_until
from txns.db.errors import TransactionConflict
from txns.group_commit import SequencerLease
from txns.handle import TxnsHandle

T = TypeVar("T")

PRIORITY_AFTER = 3
"""After this many conflicts a ``db.run`` call takes the run turn."""
TURN_LEASE_MS = 2000
"""The run turn lapses this long after its holder's last renewal."""
CONTENDED_S = 5.0
"""A process that saw a ``db.run`` conflict checks the run turn before every attempt for this long."""
POLL_CAP_S = 0.05
"""The longest pause between two reads of the turn while waiting for it."""


def check_deadline(deadline_s: object, default: float) -> float:
    """``deadline_s`` checked (a positive number of seconds), or ``default`` for None."""
    if deadline_s is None:
        return default
    if isinstance(deadline_s, bool) or not isinstance(deadline_s, (int, float)) or not deadline_s > 0:
        raise InvalidUsage(f"deadline_s must be a positive number of seconds or None, got {deadline_s!r}")
    return float(deadline_s)


def conflict_gave_up(what: str) -> Callable[[BaseException, Attempts], BaseException]:
    """The ``TransactionConflict`` a conflict retry loop of ``what`` gives up with: how long, how many attempts."""

    def gave_up(last: BaseException, state: Attempts) -> BaseException:
        return TransactionConflict(f"{last} ({what} gave up {state.describe()})", attempts=state.number)

    return gave_up


def retry_conflicts(
    attempt: Callable[[Attempts], T],
    *,
    what: str,
    deadline_s: float,
    max_attempts: int | None,
    cap_s: float,
    base_s: float = 0.0005,
    on_retry: Callable[[BaseException, Attempts], None] | None = None,
) -> T:
    """``attempt`` retried on ``TransactionConflict`` by :func:`persist.retry_until`; gives up as ``what``."""
    return retry_until(
        attempt,
        retry_on=TransactionConflict,
        deadline_s=deadline_s,
        max_attempts=max_attempts,
        gave_up=conflict_gave_up(what),
        on_retry=on_retry,
        base_s=base_s,
        cap_s=cap_s,
    )


def turn_key(txns_id: str) -> str:
    """The consensus key of the run turn of the txns shard ``txns_id``."""
    return f"{txns_id}-run-turn"


class RunTurns:
    """One per database: this process's view of the run turn (thread-safe: its state is one float)."""

    def __init__(self, handle: TxnsHandle) -> None:
        self.handle = handle
        self._contended_until = 0.0
        #: diagnostics: how many times a call of this process took the turn, and waited for another's
        self.taken = 0
        self.waited = 0

    def conflicted(self) -> None:
        """A ``db.run`` attempt of this process conflicted: check the turn for a while."""
        self._contended_until = time.monotonic() + CONTENDED_S

    def turn(self) -> SequencerLease:
        """A new claim on the turn, for a call that starves (its own holder id)."""
        return SequencerLease(self.handle, TURN_LEASE_MS, key=turn_key(self.handle.txns_id))

    def before_attempt(self, state: Attempts, mine: SequencerLease | None) -> None:
        """Before an attempt: take or renew the turn (``mine``: the call starves), or wait while another holds it.

        Returns at the deadline at the latest (the attempt then runs, and
        the retry loop gives up if it conflicts).
        """
        if mine is None and state.number == 1 and time.monotonic() >= self._contended_until:
            return  # uncontended: no read
        probe = mine or self.turn()
        polls = 0
        while state.left_s > 0:
            if mine is not None:
                was = mine.held
                if mine.hold(fresh=True):
                    if not was:
                        self.taken += 1
                    state.priority = True  # (no backoff while holding the turn)
                    return
            elif not probe.busy():
                return
            if polls == 0:
                self.waited += 1
            polls += 1
            time.sleep(min(POLL_CAP_S, 0.001 * 2 ** min(polls, 8), max(0.0, state.left_s)))


__all__ = [
    "CONTENDED_S",
    "PRIORITY_AFTER",
    "TURN_LEASE_MS",
    "RunTurns",
    "check_deadline",
    "conflict_gave_up",
    "retry_conflicts",
    "turn_key",
]
