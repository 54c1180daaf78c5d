"""Applies state transitions to a shard's consensus log, with caching and retries.

Protocol. The shard's state lives in the consensus key ``<shard_id>``; each
version is a :class:`ShardState`, written whole (a rollup) or as a diff
against the version before it (:mod:`persist._internal.state_diff`). To
change it, a handle runs a pure transition on its cached state and
compare-and-sets the result at ``seqno + 1``. On a mismatch it reads the
versions it missed and runs the transition again. A handle whose cache is
current pays exactly one conditional write.

Invariants kept here:

- A compare-and-set never uses an expectation observed longer ago than
  ``consensus_retention_s / 2``, and truncation only removes versions older
  than the newest truncation mark that is itself older than
  ``consensus_retention_s`` (so a create-if-absent CAS can never re-create a
  truncated version; see :class:`persist.location.Consensus`).
- A diff is only ever written against the cached state at ``seqno``, the
  version the compare-and-set expects: if the write lands, it follows
  exactly the version it was computed from. Every version that adds a
  truncation mark is a rollup, so truncating below a mark keeps every
  chain a kept version needs.
- After an indeterminate failure the transition is re-run against a freshly
  read state; transitions recognise their own earlier success (writer
  tokens, ids), so a write that happened but reported a timeout is neither
  repeated nor lost.
- Within a process, writes to one shard take turns (``Machine._turn``,
  held from the transition through its compare-and-set): threads sharing a
  client never race each other at storage, and the next writer runs its
  transition on the state the last one wrote and remembered. (A race
  between them cost a lost compare-and-set and a read of the head: a
  database's background apply and maintenance, writing the txns shard
  between two commits of its own process, cost 0.4 lost races per commit.)
  The turn is per process only; other processes race as before.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import TypeVar

from persist import metrics
from persist._internal.retry import backoff
from persist._internal.state import ShardState
from persist._internal.state_diff import encode_version, read_version
from persist.config import PersistConfig
from persist.errors import Determinate, ExternalError, Indeterminate, UpperMismatch, note_write
from persist.location import CaSResult, Consensus, VersionedData

T = TypeVar("T")
log = logging.getLogger(__name__)

_CATCH_UP_VERSIONS = 16
"""A handle at most this many versions behind catches up by reading just those (a lost race: usually 1)."""
_REREADS = 5
"""How often a read starts again when versions of its chain vanish under it (truncation of old versions)."""


class _NotReady(BaseException):
    """Carries a failed ``ready`` (see :meth:`Machine.apply`) out of the backend's compare-and-set."""


class Machine:
    """One shard's state, cached, plus the compare-and-set loop."""

    def __init__(self, consensus: Consensus, shard_id: str, config: PersistConfig) -> None:
        self.consensus = consensus
        self.shard_id = shard_id
        self.key = shard_id
        self.config = config
        self._state: ShardState | None = None
        self._lock = threading.Lock()
        # (an RLock: a transition or ``ready`` may write this shard again; no known caller does)
        self._turn = threading.RLock()  # one writer at a time in this process: see the module doc
        self._observed_at = 0.0  # monotonic time the cached seqno was known to be the head

    # ---- reading ---------------------------------------------------------------

    def fetch(self) -> ShardState:
        """Read the head, retrying storage failures until the deadline."""
        deadline = time.monotonic() + self.config.retry_deadline_s
        attempt = 0
        while True:
            started = time.monotonic()
            try:
                state = self._read_head()
            except ExternalError:
                attempt += 1
                if time.monotonic() > deadline:
                    raise
                backoff(attempt)
                continue
            self._remember(state, started)
            return state

    def _where(self, seqno: int) -> str:
        return f"consensus {self.key} seqno {seqno}"

    def _replay(self, state: ShardState | None, versions: list[VersionedData]) -> ShardState | None:
        """``state`` moved through ``versions`` (consecutive, oldest first); None at a diff it cannot apply."""
        for v in versions:
            state, _ = read_version(self._where(v.seqno), v.data, v.seqno, state)
            if state is None:
                return None
        return state

    def _read_head(self) -> ShardState:
        """The state at the head: the cached one moved on by the versions after it, else from the head's rollup.

        A handle that is a few versions behind reads just those versions (one
        scan); one further behind, or with nothing cached, reads the head, then
        the versions from its chain's rollup (or from the cached state, if that
        is in the chain). See :mod:`persist._internal.state_diff`.
        """
        cached = self._state
        read: dict[int, VersionedData] = {}  # versions the catch-up read, for the chain to reuse
        if cached is not None and cached.seqno is not None:
            versions = self.consensus.scan(self.key, cached.seqno + 1, _CATCH_UP_VERSIONS)
            if len(versions) < _CATCH_UP_VERSIONS:
                state = self._replay(cached, versions)
                if state is not None:
                    return state
            read = {v.seqno: v for v in versions}
        for _ in range(_REREADS):
            hint = cached.seqno if cached is not None else None
            head = self.consensus.head(self.key, hint)
            if head is None:
                return ShardState(shard_id=self.shard_id)
            if cached is not None and cached.seqno == head.seqno:
                return cached
            state, base = read_version(self._where(head.seqno), head.data, head.seqno, None)
            if state is not None:
                return state  # a rollup
            start: ShardState | None = None
            first = base
            if cached is not None and cached.seqno is not None and base <= cached.seqno < head.seqno:
                start, first = cached, cached.seqno + 1
            versions = self._chain(first, head.seqno, read)
            state = self._replay(start, [*versions, head])
            if state is not None:
                return state
            # A version of the chain vanished (truncated under a newer head): read again.
        raise Determinate(f"consensus {self.key}: the state's versions kept vanishing while reading")

    def _chain(self, first: int, head: int, read: dict[int, VersionedData]) -> list[VersionedData]:
        """The versions ``[first, head)``, oldest first: those in ``read`` (a catch-up's), the rest scanned.

        (A handle more than ``_CATCH_UP_VERSIONS`` behind has read that many
        before it learns so; its chain to the head mostly overlaps them, and
        reading them again made such a read cost twice the GETs.)
        """
        have = first
        while have < head and have in read:
            have += 1
        rest = self.consensus.scan(self.key, have, head - have) if head > have else []
        return [read[s] for s in range(first, have)] + rest

    def _remember(self, state: ShardState, observed_at: float) -> None:
        with self._lock:
            cur = self._state
            if cur is None or cur.seqno is None or (state.seqno is not None and state.seqno >= cur.seqno):
                self._state, self._observed_at = state, observed_at

    def assume_new(self) -> None:
        """Take the shard as one without any state, without reading it (see ``PersistClient.assume_new``)."""
        with self._lock:
            if self._state is None:
                self._state, self._observed_at = ShardState(shard_id=self.shard_id), time.monotonic()

    def state(self, max_age_s: float | None = None) -> ShardState:
        """The cached state, re-read if older than ``max_age_s`` (None: never)."""
        if self._state is None:
            return self.fetch()
        if max_age_s is not None and time.monotonic() - self._observed_at > max_age_s:
            return self.fetch()
        return self._state

    def wait_for(self, pred: Callable[[ShardState], bool], wait_s: float) -> ShardState | None:
        """A state satisfying ``pred`` (the cached one if it does), re-reading with
        backoff for up to ``wait_s``; None if none did by then (after at least one read)."""
        state = self.state()
        if pred(state):
            return state
        deadline = time.monotonic() + wait_s
        attempt = 0
        while True:
            state = self.fetch()
            if pred(state):
                return state
            if time.monotonic() >= deadline:
                return None
            attempt += 1
            backoff(attempt)

    # ---- writing ---------------------------------------------------------------

    def apply(self, transition: Callable[[ShardState], tuple[T, bool]], ready: Callable[[], None] | None = None) -> T:
        """Run ``transition`` on a copy of the state and commit it if it changed it.

        ``transition(state) -> (result, changed)``. It may raise to abort (for
        example UpperMismatch); nothing is written then.

        ``ready``: the write's prerequisite, called once, right before the
        first compare-and-set that can land (:meth:`Consensus.compare_and_set_after`:
        a backend may prepare the write meanwhile). Not called when nothing
        is written (the transition aborted, or changed nothing). If it
        raises, nothing was written and its exception propagates. It runs
        in this call's turn: it must not wait for another thread's write
        to this shard.

        Outcome rule (see :mod:`persist.errors`): once a compare-and-set of
        this call may have reached storage, every later storage failure of
        the call is raised as ``Indeterminate``, whatever failed last (a
        read's failure included).
        """
        with self._turn:
            result, truncate = self._apply(transition, ready)
        if truncate:
            self.truncate_old_versions()  # (out of the turn: deletes that need not hold up the next write)
        return result

    def _apply(
        self, transition: Callable[[ShardState], tuple[T, bool]], ready: Callable[[], None] | None
    ) -> tuple[T, bool]:
        """:meth:`apply`, in its turn; also whether old versions are due to be truncated."""
        deadline = time.monotonic() + self.config.retry_deadline_s
        may_have_written = False  # whether a CAS of this call may have landed
        ready_done = False  # whether ``ready`` returned
        not_ready: list[BaseException] = []  # what it raised

        def run_ready() -> None:
            nonlocal ready_done
            assert ready is not None
            try:
                ready()
            except BaseException as e:  # noqa: BLE001 - carried out of the backend, raised below as it is
                not_ready.append(e)
            if not_ready:
                raise _NotReady
            ready_done = True

        try:
            state = self.state(max_age_s=self.config.consensus_retention_s / 2)
            fresh = False
            attempt = 0
            while True:
                new = state.clone()
                now = self.config.clock_ms()
                try:
                    result, changed = transition(new)
                except UpperMismatch:
                    # SUBTLE: a cached state may lag; only a fresh one can refute.
                    if fresh:
                        # Appends check their own token before the upper: on a
                        # fresh state this proves no CAS of this call landed.
                        may_have_written = False
                        raise
                    state, fresh = self.fetch(), True
                    continue
                if not changed:
                    return result, False  # (after a landed CAS: the transition saw its own token)
                seqno = 1 if state.seqno is None else state.seqno + 1
                leased, writers = len(new.leased), len(new.writers)
                new.maintain(now, seqno, int(self.config.consensus_retention_s * 1000 / 4))
                lapsed = (leased - len(new.leased), writers - len(new.writers))  # (maintain only drops lapsed ones)
                new.check(state if state.seqno is not None else None)
                data, chain = encode_version(state, new, seqno, self.config.state_rollup_every)
                started = time.monotonic()
                outcome: CaSResult | None = None
                try:
                    if ready is None or ready_done:
                        outcome = self.consensus.compare_and_set(self.key, state.seqno, data)
                    else:
                        outcome = self.consensus.compare_and_set_after(self.key, state.seqno, data, run_ready)
                except _NotReady:
                    pass  # raised below, as ``ready`` raised it
                except (Determinate, Indeterminate) as e:
                    # SUBTLE: an indeterminate CAS may have committed. Re-read and
                    # re-run: the transition sees its own token and reports success.
                    # (Only one that ``ready`` had returned for: a backend calls it first.)
                    landable = ready is None or ready_done
                    may_have_written = may_have_written or (isinstance(e, Indeterminate) and landable)
                    attempt += 1
                    if time.monotonic() > deadline:
                        raise
                    log.debug("cas on %s failed (%s); retrying", self.key, e)
                    backoff(attempt)
                    state, fresh = self.fetch(), True
                    continue
                if outcome is None:
                    # ``ready`` raised: nothing of this call can have landed (every attempt
                    # that could called it first, and this was its first call).
                    raise not_ready[0]
                if outcome is CaSResult.COMMITTED:
                    may_have_written = True
                    metrics.count(metrics.READER_LEASES_LAPSED, lapsed[0])
                    metrics.count(metrics.WRITER_LEASES_LAPSED, lapsed[1])
                    new.seqno, new.chain = seqno, chain
                    self._remember(new, started)
                    return result, seqno % self.config.gc_every_versions == 0
                # SUBTLE: a MISMATCH may be our own write: a client library's
                # internal retry of a CAS that landed gets "already exists".
                # (Not one found before ``ready`` was called: nothing was written.)
                may_have_written = may_have_written or ready is None or ready_done
                attempt += 1
                state, fresh = self.fetch(), True
        except ExternalError as e:
            if may_have_written and not isinstance(e, Indeterminate):
                raise Indeterminate(f"{e} (an earlier attempt of this write may have landed)") from e
            raise
        finally:
            if may_have_written:
                note_write()

    def truncate_old_versions(self) -> int:
        """Delete consensus versions older than the newest mark past the retention."""
        state = self._state
        if state is None or state.seqno is None:
            return 0
        horizon = self.config.clock_ms() - int(self.config.consensus_retention_s * 1000)
        old = [seqno for seqno, wall in state.marks if wall <= horizon and seqno <= state.seqno]
        if not old:
            return 0
        try:
            n = self.consensus.truncate(self.key, max(old))
        except ExternalError as e:  # best effort: the next GC tries again
            log.debug("truncate of %s failed: %s", self.key, e)
            return 0
        metrics.count(metrics.VERSIONS_TRUNCATED, n)
        return n
