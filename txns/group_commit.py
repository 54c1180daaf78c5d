"""Group commit across processes, with no server: a queue of transactions and one sequencer at a time.

One conditional write on the txns shard commits any number of transactions
(``Txn.join``), but processes that each commit their own contend: each lost
race costs a conditional write and a re-read, and a busy txns shard stalls.
A :class:`GroupCommitter` (one per process and txns shard; thread-safe) commits
through a **queue** when there is contention:

1. **Direct first.** ``commit(txn)`` first tries today's path: one
   compare-and-append at the upper. Uncontended, that is all it costs (and
   a listing of the queue every ``probe_s``). A lost race, a direct commit
   that won only after losing one, or one slower than ``slow_s`` (storage
   throttling the key, as S3 does past a few conditional writes per
   second), switches this committer to the queue for ``contended_s``; so
   does finding other transactions waiting in the queue (fairness: a
   direct writer that keeps winning would starve them).
2. **Enqueue.** The transaction's batches are written (as for any commit) and
   the transaction goes, as bytes (``Txn.to_bytes``), into a uniquely named
   object ``{txns_id}/queue/pending/{txn_id}``: a plain PUT that contends with
   nobody. The object also records ``seen_upper``, the txns upper the writer
   had seen (at most the true upper, so every commit of the transaction is at
   a time >= it), and whether the transaction is *uncertain* (an earlier
   attempt may have landed, or its id was chosen by the caller). In the
   process that sequences, it is handed to the sequencer thread in memory
   instead (no object); should that thread stop first, the writer PUTs it,
   and so does the sequencer once a round's write of it lost to another
   commit (so that direct writers, which yield only to objects they find
   in the queue, see it: step 1).
3. **Sequence.** One process at a time is the sequencer: it holds a lease,
   the consensus key ``{txns_id}-sequencer``, taken by a compare-and-set when
   absent, released or lapsed (``lease_ms`` after its last renewal, which the
   holder makes every half lease while it works). The writer that takes the
   lease runs a round, then a background thread of its process keeps running
   rounds while the queue has work; once the queue is empty it lingers
   (``linger_s``, listing at a growing interval up to ``idle_poll_s``) and
   then releases the lease, so under steady contention the sequencer stays
   put. Waiting writers read the lease every fourth poll and take it when
   it is free or lapsed (a killed sequencer is replaced within ``lease_ms``).
   A round of the sequencer lists the queue (not for its own process's
   handed transactions within ``LOCAL_ROUND_LIST_S`` of a listing that
   found it empty, unless one found objects within ``FOUND_LATELY_S``),
   reads the new objects, takes
   its view of the txns shard (upper ``U``; a stale view fails the write,
   which then reads the state and checks again), drops what already
   committed, and commits everything else in **one** conditional write at ``ts_fn(U)``, checking on
   every try of that write, at the upper it appends at, that no member
   committed meanwhile (``Txn.commit_at(check=...)``); a write whose time
   another commit took is made again above it (``ROUND_RETRIES``), leading
   ``ts_fn`` by how long its writes take (:meth:`GroupCommitter._round_ts`);
   then it deletes the objects it committed. While other processes queue,
   a round that has members starts, just before its write, the listing and
   reads of the next round (the read-ahead, in a thread of its own), so
   they overlap the write; the next round takes that listing (if it is
   recent) instead of listing itself. Transactions of its own process
   handed over in memory go *eagerly* (:meth:`GroupCommitter._eager`) when
   listings lately found fewer new objects than there are of them: their
   round neither waits for a listing being read nor makes one. Given a
   ``maintain`` function (the database's: the txns shard's compaction and
   GC), the sequencing process runs it after a round that committed (at
   most every ``SEQUENCER_MAINTAIN_EVERY_S``), in a thread of its own
   (:meth:`GroupCommitter._maintain_after_round`); :attr:`GroupCommitter.sequencing`
   and :meth:`GroupCommitter.another_sequences` tell the database's
   background workers to leave that maintenance to it.
4. **Learn.** A writer of a process that does not sequence reads its
   transaction's *commit note*, ``{txns_id}/queue/committed/{txn_id}``:
   the sequencer that settles another process's queued transaction as
   committed writes its commit time there at the end of the round, before
   it deletes the object (:meth:`GroupCommitter._delete_doomed`). The
   writer deletes the notes it read, several in one request, and the
   sequencing process sweeps those nobody read. Without a note after its
   patience (``NOTE_PATIENCE_S``) a writer waits for its batches to appear
   in the txns log (``TxnsCache.seen_batches``, recorded as its cache
   follows the shard), so it learns its commit time from the log itself,
   from whichever sequencer committed it; it looks first after three
   quarters of how long its
   process's transactions took lately to be found committed, then at a
   growing interval (:meth:`GroupCommitter._pause`); one look (one read
   of the txns shard) finds the commits of every waiting thread of the
   process (:meth:`GroupCommitter._look`); in the process that
   sequences, it sleeps only until that process's next round committed
   (:meth:`GroupCommitter._nap`).

Invariants (nothing submitted is lost or committed twice):

- *Not lost.* An object is deleted only after its transaction is known
  committed (by a sequencer that committed it, or one that found it in the
  log or its commit record) and its commit note was written (or failed to
  be: its writer then reads the log), or after a failure was published for it
  (``{txns_id}/queue/failed/{txn_id}``: its shard was forgotten). Until then
  every round of every sequencer tries it; a sequencer that dies leaves the
  objects for the next.
- *Not twice.* A sequencer's write of a queued transaction checks, on
  every try and at the very upper that try appends at (the append expects
  it, so nothing lands in between), that the transaction did not commit
  below it. The check is exact: for a transaction with ``seen_upper >=
  tracked_from``, the cache has recorded every batch committed since its
  ``seen_upper`` (``TxnsCache.committed_at``); otherwise (old objects after a
  takeover, uncertain transactions) it is the durable look-up of
  ``Txn.commit_at`` (log entries by batch id, then the commit record). So two
  sequencers (a lapsed one still running, say) never both commit it: the
  lease only saves work, safety never depends on it or on clocks.
- A transaction whose commit raised ``Indeterminate`` is found by the next
  round's check (its batches in the log), never committed again.

Costs, per transaction through the queue: one PUT (its object), one GET of
it, and its share of a round (one LIST, one conditional write and one
``Blob.delete_many`` of the round's objects: one DeleteObjects request on
S3), the PUT of its commit note, the writer's GET of it (once or twice)
and its share of one DeleteObjects of read notes; the writer reads the
lease about once, and the txns state only when a note is late. A committer on the
direct path lists the queue every ``probe_s``, unless its last queued commit
waited longer than ``slow_s``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Literal

from persist import ExternalError, InvalidUsage, frame, retry_storage, unframe
from persist.location import Blob, CaSResult, VersionedData
from txns.errors import NotRegistered, TimestampUnavailable
from txns.handle import TxnsHandle
from txns.txn import Txn, TxnApply

log = logging.getLogger(__name__)

FIRST_LOOK_SHARE = 0.75
"""A waiting writer's first look at the txns shard comes after this share of how long its process's
transactions took lately to be found committed (see :meth:`GroupCommitter._pause`)."""
SEQUENCER_MAINTAIN_EVERY_S = 0.25
"""The sequencing process runs the txns shard's maintenance after a round at most this often. Each
compaction is a version of the txns shard that every other process reads; run after every round, it
compacted 8 batches at a time, 9 times as often as the background worker had (0.18 compactions per
commit on moto at 2 processes, against 0.02), and cost more requests than its lost races had."""
NOTE_PATIENCE_S = 1.0
"""A waiting writer that finds no commit note reads the txns log for its transaction once it has waited this
long plus twice how long its process's transactions took lately to be found (see :meth:`GroupCommitter._look`)."""
LOG_AFTER_MISSING_NOTE_S = 60.0
"""After the log showed a commit whose note was missing (a sequencer died between its write and its notes, or
writes none), a process's writers read the log at every look for this long."""
NOTE_SWEEP_S = 300.0
"""The sequencing process deletes commit notes that two of its sweeps this far apart both found (their writer
stopped before reading them)."""
KIND_QUEUED = 4
"""The framing kind of a queued transaction's object."""
KIND_LEASE = 5
"""The framing kind of a sequencer lease version."""
MAX_GROUP = 1000
"""At most this many queued transactions commit in one conditional write."""
ROUND_RETRIES = 3
"""A round whose conditional write lost to another commit checks the commits in between and writes again this
many times before leaving its transactions to the next round."""
LOCAL = "local/"
"""The sequencer's key of a transaction its own process handed over in memory (no queue object)."""
QUEUE_IO_THREADS = 64
"""A committer reads (as sequencer) and deletes queued objects this many at a time (each a request of tens of ms
on S3: a round of 100 transactions read 4 at a time took over a second; at 32, a round of 110 in the S3 model read
in four waves). As many as the S3 backend's connections (``persist.s3.MAX_POOL_CONNECTIONS``)."""
LOCAL_ROUND_LIST_S = 0.1
"""A round for transactions handed over in memory skips listing the queue if the last listing, less than this
long ago, found it empty (a transaction another process queues meanwhile waits at most this much longer)."""
FOUND_LATELY_S = 1.0
"""... unless a listing found objects less than this long ago: then every round lists. (Another process that
queues one transaction at a time puts its next object in soon after its last committed, just after a listing
that found the queue empty; skipping the listings held it back up to ``LOCAL_ROUND_LIST_S`` each time: at 2
processes on ``file://`` it made 10 commits/s while the sequencer's process made 140.)"""
READ_AHEAD_MAX_AGE_S = 1.0
"""A round uses the listing read ahead during the previous round's write only if it began this recently."""
MAX_LEAD_S = 0.5
"""A round's write leads ``ts_fn`` by at most this long (see :meth:`GroupCommitter._round_ts`)."""


def queue_prefix(txns_id: str) -> str:
    """Where the queue of the txns shard ``txns_id`` lives in blob storage."""
    return f"{txns_id}/queue/"


def queue_has_work(blob: Blob, txns_id: str, mine: frozenset[str] = frozenset()) -> bool:
    """Whether a transaction other than ``mine`` (ids) waits in the queue of txns shard ``txns_id`` (one listing)."""
    prefix = f"{queue_prefix(txns_id)}pending/"
    return any(k[len(prefix) :] not in mine for k in blob.list_keys(prefix))


class QueueSwitch:
    """When a committer writes through the queue rather than directly (fairness; see the module doc, step 1).

    Contended for a while after :meth:`lost` (a direct write lost a race,
    won only after losing one, or was slow), and while other transactions
    wait in the queue, which :meth:`contended` looks for (one listing) at
    most every ``probe_s``: a process whose direct writes win keeps winning
    (its last write made the state it holds, while everyone else must read
    it first), so without the look it would starve the queued transactions,
    whose rounds lose every race to it. Under a steady stream of commits
    (the last call less than ``probe_s`` ago, and the last look less than
    two ``probe_s``), the look runs in a thread of its own and what it finds
    switches the next commits: the committing thread does not wait for the
    listing (in the database at 64 threads in the S3 model, the leader of a
    group waited 60 ms on it every half second, and so did every thread
    waiting for the next write). Each field changes by one assignment, so
    threads may call it without a lock: a race costs at most one more look
    at the queue.
    """

    def __init__(self, blob: Blob, txns_id: str, contended_s: float, probe_s: float, slow_s: float) -> None:
        self.blob = blob
        self.txns_id = txns_id
        self.contended_s = contended_s
        self.probe_s = probe_s
        self.slow_s = slow_s
        self._until = 0.0  # (monotonic) contended until then
        self._probed_at = float("-inf")  # (monotonic) when the queue was last looked at
        self._called_at = float("-inf")  # (monotonic) when contended was last called
        self._probing = False  # whether a look runs in the background

    def lost(self, for_s: float | None = None) -> None:
        """A direct write contended: write through the queue for ``contended_s`` (or ``for_s``) from now."""
        self._until = time.monotonic() + (self.contended_s if for_s is None else for_s)

    def queued(self, waited_s: float, others: Callable[[], bool]) -> None:
        """A commit went through the queue and waited ``waited_s``: if longer than ``slow_s`` while ``others()``
        (other processes use the queue), contention goes on: queue for ``contended_s`` more, with no look."""
        if waited_s > self.slow_s and others():
            self.lost()

    def contended(self, mine: Callable[[], frozenset[str]] = frozenset) -> bool:
        """Whether to write through the queue now; ``mine``: the caller's own queued transactions (not others')."""
        now = time.monotonic()
        steady = now - self._called_at < self.probe_s and now - self._probed_at < 2 * self.probe_s
        self._called_at = now
        if now < self._until:
            return True
        if now - self._probed_at < self.probe_s:
            return False
        self._probed_at = now
        if not steady:
            return self._probe(mine)
        if not self._probing:
            self._probing = True
            threading.Thread(target=self._probe_aside, args=(mine,), name="txns-queue-probe", daemon=True).start()
        return False

    def _probe(self, mine: Callable[[], frozenset[str]]) -> bool:
        """Look at the queue (one listing): whether another's transaction waits there (then :meth:`lost`)."""
        try:
            waiting = queue_has_work(self.blob, self.txns_id, mine())
        except ExternalError as e:  # (direct then; the next look is soon)
            log.debug("looking at the commit queue failed: %s", e)
            return False
        if waiting:
            self.lost()
        return waiting

    def _probe_aside(self, mine: Callable[[], frozenset[str]]) -> None:
        """:meth:`_probe` in a thread of its own (see the class doc)."""
        try:
            self._probe(mine)
        except Exception as e:  # noqa: BLE001 - a look that failed is made again (direct until then)
            log.debug("looking at the commit queue failed: %s", e)
        finally:
            self._probing = False


def lease_key(txns_id: str) -> str:
    """The consensus key of the sequencer lease of the txns shard ``txns_id``."""
    return f"{txns_id}-sequencer"


class GroupCommitFailed(InvalidUsage):
    """The sequencer could not commit a queued transaction (its data shard was forgotten); nothing committed."""


@dataclass(frozen=True)
class Queued:
    """A queued transaction as its object holds it (see the module doc)."""

    txn_id: str
    seen_upper: int
    uncertain: bool
    batch_ids: frozenset[str]
    txn: bytes
    #: the committer that queued it ("": one that reads no commit notes, an older version: none is
    #: written for it)
    writer: str = ""

    def encode(self) -> bytes:
        head: dict[str, Any] = {"txn_id": self.txn_id, "seen_upper": self.seen_upper, "uncertain": self.uncertain,
                                "batch_ids": sorted(self.batch_ids)}
        if self.writer:
            head["writer"] = self.writer
        h = json.dumps(head, separators=(",", ":")).encode()
        return frame(KIND_QUEUED, len(h).to_bytes(4, "big") + h + self.txn)

    @staticmethod
    def decode(what: str, data: bytes) -> Queued:
        body = unframe(what, data, KIND_QUEUED)
        n = int.from_bytes(body[:4], "big")
        head = json.loads(body[4 : 4 + n])
        writer = str(head.get("writer", ""))
        return Queued(head["txn_id"], head["seen_upper"], head["uncertain"], frozenset(head["batch_ids"]),
                      body[4 + n :], writer if writer.isascii() and writer.isalnum() else "")


class SequencerLease:
    """The sequencer lease: a consensus key whose latest version names the holder and its expiry.

    Held means: our compare-and-set wrote the latest version and its expiry
    (by our clock) has not passed. Only an optimization (see the module doc):
    two processes that both believe they hold it are safe, just wasteful.
    """

    def __init__(self, handle: TxnsHandle, lease_ms: int, key: str | None = None) -> None:
        self.consensus = handle.client.consensus
        self.key = key or lease_key(handle.txns_id)
        self.holder = uuid.uuid4().hex
        self.lease_ms = lease_ms
        self._seqno: int | None = None  # the version we wrote, while we believe we hold it
        self._seen: int | None = None  # the latest seqno read or written (the head is at least it: a read's hint)
        self._expires_ms = 0
        self._other_expires_ms = 0  # another holder's expiry, as last read (no read before it passes)
        self.acquired = 0  # how many times this process took the lease (diagnostics)
        #: more fields written with each version we write (e.g. the applier lease's ``applied``)
        self.extra: dict[str, Any] = {}
        #: another holder's version as last read (its JSON), None when free or ours
        self.other: dict[str, Any] | None = None

    @staticmethod
    def _now_ms() -> int:
        return int(time.time() * 1000)

    def _write(self, expected: int | None, expires_ms: int) -> bool:
        data = frame(KIND_LEASE, json.dumps({**self.extra, "holder": self.holder, "expires_ms": expires_ms}).encode())
        try:
            ok = self.consensus.compare_and_set(self.key, expected, data) is CaSResult.COMMITTED
        except ExternalError:
            ok = False  # (an indeterminate write is read back by the next try)
        if ok:
            self._seqno = self._seen = (expected or 0) + 1
            self._expires_ms = expires_ms
            if self._seqno % 64 == 0:
                try:  # old versions are never read (a stale CAS on a truncated one is invisible: head is higher)
                    self.consensus.truncate(self.key, self._seqno - 8)
                except ExternalError as e:
                    log.debug("truncating the sequencer lease deferred: %s", e)
        else:
            self._seqno = None
        return ok

    @property
    def held(self) -> bool:
        return self._seqno is not None and self._now_ms() < self._expires_ms

    def hold(self, fresh: bool = False) -> bool:
        """Take or renew the lease if possible; whether we hold it now.

        Another holder's expiry, once read, is trusted until it passes (no
        request) unless ``fresh``: then the lease is read again (it may have
        been released early).
        """
        now = self._now_ms()
        if self._seqno is not None and now < self._expires_ms - self.lease_ms // 2:
            return True
        if self._seqno is not None and now < self._expires_ms:
            return self._write(self._seqno, now + self.lease_ms)
        if now < self._other_expires_ms and not fresh:
            return False
        head = self._read()
        if head is False:
            return False
        self.other = None
        if head is not None:
            j = json.loads(unframe(f"consensus {self.key} seqno {head.seqno}", head.data, KIND_LEASE))
            if j["holder"] != self.holder and j["expires_ms"] > now:
                self._other_expires_ms = j["expires_ms"]
                self.other = j
                return False
        if self._write(None if head is None else head.seqno, now + self.lease_ms):
            self.acquired += 1
            return True
        return False

    def _read(self) -> VersionedData | Literal[False] | None:
        """The lease's latest version (None: never written), or False if storage failed.

        Passes the latest seqno seen as the hint, so on S3 a read is a short
        listing from there and one GET (no read of the key's head hint).
        """
        try:
            head = self.consensus.head(self.key, hint=self._seen)
        except ExternalError:
            return False
        if head is not None:
            self._seen = head.seqno
        return head

    def held_by_other(self) -> bool:
        """Whether another holder held the lease when last read, and its expiry has not passed (no request)."""
        return self.other is not None and self._now_ms() < self._other_expires_ms

    def busy(self) -> bool:
        """Whether another holder holds the lease now (one fresh read; a storage failure counts as free)."""
        head = self._read()
        if not head:
            return False
        j = json.loads(unframe(f"consensus {self.key} seqno {head.seqno}", head.data, KIND_LEASE))
        return bool(j["holder"] != self.holder and j["expires_ms"] > self._now_ms())

    def release(self) -> None:
        """Give the lease up (best effort: it lapses anyway)."""
        if self.held:
            self._write(self._seqno, 0)
        self._seqno = None


class LeadTurn:
    """One thread at a time leads a shared write; the others wait for their outcome, not for a lock.

    A writer that joined another's write (its outcome is set by that
    leader) returns as soon as the write ended. Waiting on the lock the
    write is made under instead, it also waited out the next leader's write
    (at 1 process x 64 threads in the S3 model, 63 threads were parked on
    the lock with their commits done). Used by :class:`GroupCommitter`'s
    direct path and the database's in-process group commit.
    """

    def __init__(self, lock: threading.Lock) -> None:
        self._cv = threading.Condition(lock)  # (the lock that guards the callers' pending writers)
        self._leading = False

    def take(self, settled: Callable[[], bool]) -> bool:
        """Wait until ``settled()`` (then False) or no thread leads (then True: the caller leads; it must
        call :meth:`end`). Takes the lock given to the constructor."""
        with self._cv:
            self._cv.wait_for(lambda: settled() or not self._leading)
            if settled():
                return False
            self._leading = True
            return True

    def end(self, tidy: Callable[[], None] = lambda: None) -> None:
        """The leader's write ended (each member's outcome is set): ``tidy()`` under the lock, wake the waiters."""
        with self._cv:
            tidy()
            self._leading = False
            self._cv.notify_all()


@dataclass(frozen=True)
class _Listing:
    """A listing of the queue (begun at ``at``, monotonic) and the bodies of the objects it found that the
    sequencer did not know (``known``, when it began); a body None: the object was deleted meanwhile."""

    at: float
    known: frozenset[str]
    keys: list[str]
    bodies: dict[str, bytes | None]


class _MembersCommitted(Exception):
    """A sequencer's write gave up: these queued objects' transactions committed meanwhile (see ``_round``)."""

    def __init__(self, committed: dict[str, int]) -> None:
        super().__init__(f"{len(committed)} queued transaction(s) committed meanwhile")
        self.committed = committed  # their commit times, by queue key
        self.keys = set(committed)


class _Waiting:
    """A transaction waiting to commit directly, and its outcome once settled (see ``GroupCommitter.commit``)."""

    def __init__(self, txn: Txn) -> None:
        self.txn = txn
        self.outcome: TxnApply | BaseException | None = None
        self.lost = False  # its direct write lost a race: the queue next
        self.alone = False  # commits in a write of its own (a joined write failed on someone's usage error)


class GroupCommitter:
    """Commits transactions of one txns shard, grouping them across processes when they contend.

    One per process and txns shard; any number of threads may call
    :meth:`commit`. It uses ``handle`` (which then must not be used by other
    threads meanwhile) under its own lock. See the module doc.

    >>> import pyarrow as pa
    >>> from persist import PersistClient, Schema, ShardId
    >>> client = PersistClient.open("mem://doc-group-commit")
    >>> handle = TxnsHandle.open(client, ShardId.new())
    >>> d = str(ShardId.new())
    >>> handle.register(1, {d: Schema(key=pa.schema([("k", pa.string())]), val=pa.schema([]))})
    >>> gc = GroupCommitter(handle, direct=False)   # always through the queue
    >>> txn = handle.begin()
    >>> txn.write(d, ("a",), (), 1)
    >>> applied = gc.commit(txn)
    >>> _ = applied.apply(handle)
    >>> handle.snapshot(d, applied.commit_ts)
    [((('a',), ()), 2, 1)]
    >>> gc.close()
    """

    def __init__(
        self,
        handle: TxnsHandle,
        *,
        ts_fn: Callable[[int], int] | None = None,
        lead_fn: Callable[[float], int] | None = None,
        direct: bool = True,
        lease_ms: int = 2000,
        poll_s: float = 0.005,
        contended_s: float = 1.0,
        slow_s: float = 0.25,
        timeout_s: float = 60.0,
        linger_s: float | None = None,
        idle_poll_s: float = 0.05,
        probe_s: float = 0.5,
        maintain: Callable[[], None] | None = None,
    ) -> None:
        if lease_ms < 100:
            raise InvalidUsage(f"lease_ms must be at least 100, got {lease_ms}")
        for name, value in (("poll_s", poll_s), ("idle_poll_s", idle_poll_s), ("linger_s", linger_s or 0.0),
                            ("probe_s", probe_s)):
            if not value >= 0:
                raise InvalidUsage(f"{name} must be a number of seconds >= 0, got {value!r}")
        self.handle = handle
        self.ts_fn = ts_fn or (lambda upper: upper)
        #: seconds -> timestamp units, for a round's lead (default: timestamps count milliseconds)
        self.lead_fn = lead_fn or (lambda s: int(s * 1000) + 1)
        self._write_s = 0.0  # how long a round's write took lately, from picking its time to landing (EWMA)
        self._lead = False  # whether the next round's write leads (the last one lost its time)
        self.direct = direct
        self.poll_s = poll_s
        self.slow_s = slow_s
        self.timeout_s = timeout_s
        #: the sequencer keeps the lease this long after the queue empties (default: a quarter lease)
        self.linger_s = lease_ms / 4000 if linger_s is None else linger_s
        self.idle_poll_s = max(idle_poll_s, poll_s)
        #: how long after it was queued a transaction of this process was found committed lately: the
        #: start of the look that found it (EWMA; see :meth:`_pause`)
        self._found_s = 4 * poll_s
        self.lease = SequencerLease(handle, lease_ms)
        self.blob = handle.client.blob
        self.prefix = queue_prefix(handle.txns_id)
        self._lock = threading.RLock()
        self._switch = QueueSwitch(self.blob, handle.txns_id, contended_s, probe_s, slow_s)
        self._synced_at = 0.0  # when a waiting writer last read the txns shard
        # the writer's side of commit notes (see _look): the notes read and not yet deleted, when they were last
        # deleted, when the log last showed a commit whose note was missing, and the least upper the notes
        # read imply (a commit at ts landed: the upper is past ts)
        self._spent_notes: set[str] = set()
        self._spent_at = 0.0
        self._note_missing_at = float("-inf")
        self._upper_seen = 0
        #: this committer's name in its queued transactions: a sequencer writes commit notes for the
        #: transactions of writers other than itself (its own learn theirs from its rounds)
        self.writer_id = uuid.uuid4().hex[:16]
        # the sequencer's side: other processes' transactions settled in this round, with their commit times
        # (under _lock), and the notes its last sweep found (see _sweep_notes)
        self._notes: list[tuple[str, int]] = []
        self._swept_at = time.monotonic()
        self._swept: frozenset[str] = frozenset()
        self._serving: threading.Thread | None = None  # the background sequencer, while this process holds the lease
        self._closed = False
        self._bodies: dict[str, Queued] = {}  # queued objects read by this sequencer, by key (LOCAL...: handed)
        self._listed_at = float("-inf")  # (monotonic) when a round last listed the queue
        self._found_at = float("-inf")  # (monotonic) when a listing last found queued objects
        self._doomed: list[str] = []  # queued objects this round found committed (or failed): deleted at its end
        self._foreign_at = float("-inf")  # (monotonic) when a round last committed another process's transaction
        self._elsewhere_at = float("-inf")  # (monotonic) when another process's round last committed one of ours
        self._wake = threading.Event()  # set when a transaction is handed to this process's sequencer thread
        # set by a hand-over or a finished read-ahead: the sequencer thread's wait for its read-ahead (_serve). Not
        # _wake, whose pause between rounds it would also cut short: one event for both took 2 processes in the
        # S3 model from 0.99-1.10x to 0.91-0.93x the 1-process rate.
        self._go = threading.Event()
        self._taken_n = 0  # of the transactions handed over so far (``handed``), those a round took (under _lock)
        self._found_per_listing = 0.0  # new objects a listing found lately (EWMA; see _eager)
        self._round_done = threading.Condition()  # notified when a round of this process's committed (see _nap)
        self._round_gen = 0  # rounds of this process that committed (under _lock and _round_done)
        self._deleter = ThreadPoolExecutor(max_workers=QUEUE_IO_THREADS, thread_name_prefix="txns-queue-io")
        self._ahead_pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="txns-queue-ahead")
        #: the txns shard's maintenance, run by the sequencing process after rounds that committed (see
        #: :meth:`_maintain_after_round`); its thread, and the run in progress
        self._maintain = maintain
        self._maintainer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="txns-sequencer-maintain")
        self._maintaining: Future[None] | None = None
        self._maintained_at = float("-inf")  # (monotonic) when the last run started
        self._ahead: Future[_Listing] | None = None  # the next round's listing, read while this round writes
        # queue objects this sequencer settled (committed or failed) and deletes: when the delete returned
        # (monotonic; inf until then). A listing begun before that may still hold the object: not read again.
        self._settled: dict[str, float] = {}
        self._settled_lock = threading.Lock()
        self._deadline_s = handle.client.config.retry_deadline_s
        handle.cache.start_tracking()
        self._pending_lock = threading.Lock()
        self._pending: list[_Waiting] = []  # direct commits waiting for a write (the next one joins them)
        self._direct_turn = LeadTurn(self._pending_lock)  # one thread at a time leads a direct write
        # under _pending_lock: this committer's transactions in the queue (waiting), by id; the commit times
        # a look found for them (see _look); whether a thread is looking, and how many looks ended
        self._in_queue: dict[str, Queued] = {}
        self._queued_at: dict[str, float] = {}  # (monotonic) when each of them was queued
        self._learned: dict[str, int | Exception] = {}
        self._looking = False
        self._look_gen = 0
        self._looked = threading.Condition(self._pending_lock)  # notified when a look ended
        self._looks = 0  # looks made (under _lock): every fourth reads the lease afresh
        #: diagnostics: commits made directly (and transactions joined to them), queued, rounds run and
        #: transactions they committed
        self.direct_commits = 0
        self.joined = 0
        self.queued = 0
        self.rounds = 0
        self.grouped = 0
        self.handed = 0  # transactions of this process handed to its own sequencer in memory (not PUT)
        self.published = 0  # handed transactions queued (PUT) after their round's write lost (_publish_handed)

    def close(self) -> None:
        """Stop sequencing, release the lease if held and finish pending deletes (the handle stays open)."""
        self._closed = True
        self._go.set()
        serving = self._serving
        if serving is not None:
            serving.join()
        with self._lock:
            self.lease.release()
        self._delete_spent_notes(force=True)
        self._ahead_pool.shutdown(wait=True)  # (before the reads it makes stop being served)
        self._deleter.shutdown(wait=True)
        self._maintainer.shutdown(wait=True)

    def __enter__(self) -> GroupCommitter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- the writer's side ------------------------------------------------------------------

    def commit(self, txn: Txn) -> TxnApply:
        """Commit ``txn`` (directly, or through the queue under contention); return once durable.

        Raises ``GroupCommitFailed`` if a sequencer could not commit it (a
        data shard it writes was forgotten), ``TimeoutError`` if nothing
        committed it within ``timeout_s`` (it stays queued and may still
        commit: commit the same ``txn`` again to wait on), and storage errors
        of the direct path as ``Txn.commit_at`` does.
        """
        if not isinstance(txn, Txn):
            raise InvalidUsage(f"commit takes a txns.Txn, got {type(txn).__name__}")
        # (Direct unless a direct write of this process lost a race, or was slow, lately, or others'
        # transactions wait in the queue; not merely while another process sequences: a queued
        # commit takes several round trips, so with a few writers on a store where a request costs
        # tens of ms, direct writes are faster.)
        if self.direct and not self._switch.contended(self.waiting_ids):
            mine = _Waiting(txn)
            with self._pending_lock:
                self._pending.append(mine)
            try:
                self._lead_or_join(mine)
            finally:
                with self._pending_lock:
                    self._pending.remove(mine)
            if isinstance(mine.outcome, BaseException):
                raise mine.outcome
            if mine.outcome is not None:
                return mine.outcome
        return self._through_queue([txn])[0]

    def waiting_ids(self) -> frozenset[str]:
        """The ids of this committer's transactions waiting in the queue now (its own, not others')."""
        with self._pending_lock:
            return frozenset(self._in_queue)

    def _lead_or_join(self, mine: _Waiting) -> None:
        """Wait until another thread's direct write settled ``mine`` (joined it), or lead the next one
        (:class:`LeadTurn`: a joined member returns without the committer's lock)."""
        if not self._direct_turn.take(lambda: mine.outcome is not None or mine.lost):
            return
        try:
            with self._lock:
                self._commit_direct(mine)
        finally:
            self._direct_turn.end()

    def _commit_direct(self, leader: _Waiting) -> None:
        """Under the lock: commit ``leader``'s transaction directly, with every joinable one waiting meanwhile.

        Threads that called :meth:`commit` while another thread's direct
        commit held the lock join the next one (``Txn.join``: one
        conditional write, one commit record each), so T threads of one
        process cost one write per round, not T. Each member's outcome is set
        on its ``_Waiting``; a lost race leaves them all unset (each then
        goes through the queue), an error that may have landed the write
        marks every member uncertain (a later commit of it looks it up). A
        joined write that failed with nothing written and not on storage (a
        usage error, such as a member writing a forgotten shard) may be any
        member's fault: then each commits alone, so only its own error
        reaches a thread.
        """
        h = self.handle
        with self._pending_lock:
            others = [
                w for w in self._pending if w is not leader and w.outcome is None and not w.alone and w.txn.joinable
            ]
            others = [] if leader.alone else others[: MAX_GROUP - 1]
        group = [leader, *others]
        base = leader.txn
        h.cache.sync_cached()
        start = time.monotonic()
        lost = h.lost_races
        try:
            base.join([w.txn for w in others])
            try:
                applied = base.commit_at(h, self.ts_fn(h.upper))
            finally:
                base.join([])
        except TimestampUnavailable:
            self._switch.lost()
            for w in group:
                w.outcome = None  # (each goes through the queue)
                w.lost = True
            return
        except BaseException as e:  # noqa: BLE001 - each member's outcome, raised in its thread
            if others and base.failed_on_usage(e):
                for w in group:
                    w.alone = True  # (the others, still pending, each lead a write of their own when their turn comes)
                self._commit_direct(leader)
                return
            for w in others:
                w.txn.uncertain = w.txn.uncertain or base.uncertain
            for w in group:
                w.outcome = e
            return
        self.direct_commits += 1
        self.joined += len(others)
        if time.monotonic() - start > self.slow_s or h.lost_races > lost:
            # throttled (or slow), or won only after losing to another process's write: group the next ones
            self._switch.lost()
        leader.outcome = applied
        for w in others:
            a = TxnApply(applied.commit_ts, tuple(sorted(w.txn.batches())))
            w.txn.settle(a)
            w.outcome = a

    def commit_all(self, txns: list[Txn]) -> list[TxnApply]:
        """Commit each of ``txns`` through the queue (no direct try); return each one's commit, in order.

        For a caller that already grouped transactions in its own process
        and lost a race with that group (the database). They may commit in
        different rounds, so at different times. Errors as :meth:`commit`.
        A transaction carrying a tidy has it dropped: a queued transaction
        may be joined to another's write, which only its base may tidy (the
        entries are found again by later applies).
        """
        for t in txns:
            if not isinstance(t, Txn):
                raise InvalidUsage(f"commit_all takes txns.Txn objects, got {type(t).__name__}")
        return self._through_queue(list(txns))

    def _through_queue(self, txns: list[Txn]) -> list[TxnApply]:
        h = self.handle
        results: dict[int, TxnApply] = {}
        waiting: list[tuple[int, Txn, Queued, tuple[str, ...]]] = []
        for i, txn in enumerate(txns):
            txn.drop_tidy()
            batches = txn.batches()
            batch_ids = frozenset(b.id for bs in batches.values() for b in bs if b.rows)
            if not batch_ids:  # nothing to group: an empty commit (a commit record only)
                with self._lock:
                    results[i] = h.commit(txn, at=self.ts_fn(h.upper))
                continue
            with self._lock:
                # (a commit note read lately says the upper passed its commit time: at most the true upper)
                seen = max(h.cache.frontier, self._upper_seen)
            q = Queued(txn.id, seen, txn.uncertain, batch_ids, txn.to_bytes(), self.writer_id)
            txn.uncertain = True  # from here on a sequencer may commit it: any later commit looks it up first
            waiting.append((i, txn, q, tuple(sorted(batches))))
        with self._pending_lock:
            self._in_queue.update((q.txn_id, q) for _, _, q, _ in waiting)
            now = time.monotonic()
            self._queued_at.update((q.txn_id, now) for _, _, q, _ in waiting)
        try:
            return self._wait_queued(txns, waiting, results)
        finally:
            with self._pending_lock:
                for _, _, q, _ in waiting:
                    self._in_queue.pop(q.txn_id, None)
                    self._queued_at.pop(q.txn_id, None)
                    self._learned.pop(q.txn_id, None)

    def _wait_queued(
        self,
        txns: list[Txn],
        waiting: list[tuple[int, Txn, Queued, tuple[str, ...]]],
        results: dict[int, TxnApply],
    ) -> list[TxnApply]:
        """Enqueue ``waiting`` and wait until each committed; ``results`` has the others' (see :meth:`commit`)."""
        with self._lock:
            if self._serving is not None and not self._closed:
                # This process sequences: hand them to its next round in memory (no PUT, GET or
                # DELETE); they are checked and committed exactly as queued objects are.
                self._hand_over([q for _, _, q, _ in waiting])
                put = []
            else:
                put = [q for _, _, q, _ in waiting]
            seen = self._round_gen  # (the rounds before the first look: a round after this wakes it)
        if len(put) > 1:
            list(self._deleter.map(self._enqueue, put))
        elif put:
            self._enqueue(put[0])
        self.queued += len(waiting)
        started = time.monotonic()
        deadline = started + self.timeout_s
        polls = 0
        while waiting:
            looked_at = time.monotonic()
            if polls == 0:
                # (just enqueued, nothing can have committed it yet: no read; only the lease, if free)
                sequenced = False
                with self._lock:
                    try:
                        if self._serving is None and self.lease.hold():
                            sequenced = True
                            self._round()
                            self._serve()
                    except ExternalError as e:  # storage trouble: the looks try again until the deadline
                        log.debug("taking the sequencer lease: %s", e)
                    seen = self._round_gen
                if sequenced:  # (its round may have committed them: a look, with no read, finds them now)
                    seen = self._look()
            else:
                with self._pending_lock:
                    learned = all(w[2].txn_id in self._learned for w in waiting)
                if not learned:  # (another thread's look may have found them all)
                    seen = self._look()
            with self._pending_lock:
                found = [(w, self._learned.pop(w[2].txn_id, None)) for w in waiting]
            for (i, txn, _q, data_ids), ts in found:
                if isinstance(ts, Exception):
                    raise ts
                if ts is not None:
                    results[i] = TxnApply(ts, data_ids)
                    txn.settle(results[i])
            waiting = [w for w, ts in found if ts is None]
            if not waiting:
                break
            polls += 1
            if polls % 16 == 0:
                for _i, txn, _q, _d in waiting:
                    self._check_failed(txn.id)
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"{len(waiting)} transaction(s) ({waiting[0][1].id}, ...) are queued but no sequencer committed "
                    f"them within {self.timeout_s} s; they may still commit: commit the same transactions again "
                    f"to wait for them"
                )
            self._nap(self._pause(polls), seen)
        waited = time.monotonic() - started
        if polls > 0:
            self._found_s = 0.75 * self._found_s + 0.25 * (looked_at - started)
            if self._serving is None:
                self._elsewhere_at = time.monotonic()  # (another process's round committed them)
        self._switch.queued(waited, self.others_queued)  # (not under the lock: see QueueSwitch)
        return [results[i] for i in range(len(txns))]

    def _look(self) -> int:
        """Look for the commits of this process's queued transactions, for every waiting thread at once.

        One thread at a time looks (``_looking``). In a process that does
        not sequence, it first reads the **commit note** of each waiting
        transaction (``{txns_id}/queue/committed/{txn_id}``: its commit time,
        written by the sequencer that settled it; one GET each, in parallel,
        see :meth:`_read_notes`). Only for a transaction with no note after
        ``NOTE_PATIENCE_S`` plus twice ``_found_s`` (or for
        ``LOG_AFTER_MISSING_NOTE_S`` after the log showed a commit whose
        note was missing) does it read the txns shard, under the lock (at
        most every ``poll_s``; never while this process sequences: its
        rounds move the view past each commit they make). It checks every
        transaction of this process still waiting against that view, and
        leaves each one's commit time in ``_learned``; then it wakes the
        others (``_looked``). (Reading the log, every process that did not
        sequence read every version of the txns shard, one GET each: on moto
        at 8 processes, half of all requests. Listing a writer's notes, their
        names holding the commit times, was tried too: one request per look
        for all threads, but a listing costs more than a GET on moto, and 12
        times as much on S3.) A thread that finds a look in progress waits for it
        instead of for the lock, so a read of the txns shard serves every
        thread, and no thread reads it again before the others saw what it
        found. (Each thread looking for its own, under the lock, made the
        looks of 64 threads a convoy: each read let one or two threads look
        before the next read held the lock again; their process committed
        an eighth of what the sequencing one did.) Also takes the sequencer
        lease when free, reading it afresh every fourth look. Returns
        ``_round_gen`` as of the look (see :meth:`_nap`).
        """
        with self._pending_lock:
            if self._looking:
                gen = self._look_gen
                self._looked.wait_for(lambda: self._look_gen != gen, self.timeout_s)
                return self._round_gen
            self._looking = True
        h = self.handle
        try:
            noted = self._read_notes() if self._serving is None else {}
            with self._lock:
                seen = self._round_gen  # (this look sees every round before it)
                mine: list[Queued] = []
                try:
                    if (
                        self._serving is None
                        and time.monotonic() - self._synced_at >= self.poll_s
                        and self._log_due(noted)
                    ):
                        h.cache.sync()
                        self._synced_at = time.monotonic()
                        logged = True
                    else:
                        logged = False
                    with self._pending_lock:  # (after the read: whatever waits now)
                        mine = list(self._in_queue.values())
                    found = [(q, noted[q.txn_id] if q.txn_id in noted else self._outcome(q)) for q in mine]
                    # (a commit time, not an error looking it up: that is its thread's to raise)
                    missed = {q.txn_id for q, ts in found if logged and isinstance(ts, int) and q.txn_id not in noted}
                    if missed and not missed <= self._read_notes(missed).keys():
                        # Committed, and still no note (read again: one may have landed since the look
                        # began, as after a slow round): read the log at every look for a while.
                        self._note_missing_at = time.monotonic()
                    if self._serving is None:
                        self._unhand([q for q, ts in found if ts is None])
                    # The lease: read afresh every fourth look (a holder that released it is replaced
                    # then; a lapsed one at its expiry, which needs no read; a sequencer lingers, so
                    # under load it rarely lets go early).
                    self._looks += 1
                    if any(ts is None for _, ts in found) and self._serving is None and self.lease.hold(
                        fresh=self._looks % 4 == 1
                    ):
                        self._round()
                        found = [(q, self._outcome(q)) for q in mine]
                        self._serve()
                except ExternalError as e:  # storage trouble: try again until the deadline
                    log.debug("waiting for %d queued transactions: %s", len(mine), e)
                    found = []
                with self._pending_lock:
                    for q, ts in found:
                        if ts is not None and q.txn_id in self._in_queue:
                            self._learned[q.txn_id] = ts
        finally:
            with self._pending_lock:
                self._looking = False
                self._look_gen += 1
                self._looked.notify_all()
        return seen

    def _read_notes(self, only: set[str] | None = None) -> dict[str, int]:
        """The commit times in the notes of this process's waiting transactions not learned yet (``only``: of
        these ids instead): one GET each, in parallel; a missing or unreadable note is left out. Each note read
        is deleted soon after, several in one request (:meth:`_delete_spent_notes`)."""
        with self._pending_lock:
            ids = sorted(i for i in self._in_queue if i not in self._learned) if only is None else sorted(only)
        if not ids:
            return {}

        def get(txn_id: str) -> bytes | None:
            try:
                return self.blob.get(self._note_key(txn_id))
            except ExternalError:
                return None  # (the log is the fallback)

        found: dict[str, int] = {}
        for txn_id, data in zip(ids, self._deleter.map(get, ids) if len(ids) > 1 else map(get, ids), strict=True):
            text = data.decode("ascii", "replace") if data is not None else ""
            if text.isascii() and text.isdigit():
                found[txn_id] = int(text)
        if found:
            with self._pending_lock:
                self._upper_seen = max(self._upper_seen, max(found.values()) + 1)
                self._spent_notes.update(self._note_key(i) for i in found)
            self._delete_spent_notes()
        return found

    def _log_due(self, noted: dict[str, int]) -> bool:
        """Whether a look reads the txns shard: a waiting transaction has no note and waited past its patience
        (``NOTE_PATIENCE_S`` plus twice ``_found_s``), or the log lately showed a commit whose note was missing."""
        now = time.monotonic()
        if now - self._note_missing_at < LOG_AFTER_MISSING_NOTE_S:
            return True
        patience = NOTE_PATIENCE_S + 2 * self._found_s
        with self._pending_lock:
            return any(
                now - at > patience for i, at in self._queued_at.items() if i not in noted and i not in self._learned
            )

    def _delete_spent_notes(self, force: bool = False) -> None:
        """Delete the notes read so far, in one request, once 32 wait or a second passed (``force``: now)."""
        with self._pending_lock:
            now = time.monotonic()
            if not self._spent_notes or not (force or len(self._spent_notes) >= 32 or now - self._spent_at >= 1.0):
                return
            keys, self._spent_notes, self._spent_at = sorted(self._spent_notes), set(), now
        try:
            self._deleter.submit(self._quietly_delete_many, keys)
        except RuntimeError:  # (closed meanwhile: the sequencer's sweep deletes them)
            pass

    def _note_key(self, txn_id: str) -> str:
        """Where the commit note of transaction ``txn_id`` goes (its writer GETs it: a known key, no listing)."""
        return f"{self.prefix}committed/{txn_id}"

    def _outcome(self, q: Queued) -> int | Exception | None:
        """``q``'s commit time (:meth:`_committed`), or the error looking it up raised other than storage's
        (for ``q``'s own thread to raise: a look checks every thread's transactions). Under the lock."""
        try:
            return self._committed(q)
        except ExternalError:
            raise
        except Exception as e:  # noqa: BLE001 - the outcome of q's thread, raised there
            return e

    def others_queued(self) -> bool:
        """Whether other processes use the queue lately: their transactions were in this process's rounds
        within ``contended_s``, or another process held the sequencer lease when last read.

        (A lone process whose commits queue after a slow write must not stay
        queued: with 8 threads in the S3 model it made 13 transactions/s
        queued against 48 joined in direct writes.)
        """
        return time.monotonic() - self._foreign_at < self._switch.contended_s or self.lease.other is not None

    def _unhand(self, waiting: list[Queued]) -> None:
        """Queue (PUT) those of ``waiting`` handed to this process's sequencer in memory, now that it stopped.

        Under the lock, with no sequencer thread running: its lease was lost
        (or lapsed), so another process's sequencer must be able to commit
        them. Each stays uncommitted below the cache's frontier (checked just
        before), and whichever sequencer commits it checks it again at its write.
        """
        for q in waiting:
            if self._bodies.pop(f"{LOCAL}{q.txn_id}", None) is not None:
                self._enqueue(q)

    def _pause(self, polls: int) -> float:
        """How long a waiting writer sleeps before its poll number ``polls`` (1 = the first).

        The first look comes after ``FIRST_LOOK_SHARE`` of how long this
        process's queued transactions took lately to be found (``_found_s``,
        a moving average of the start of the look that found them, from
        their enqueueing), the next ones ``poll_s`` apart, doubling every
        other poll up to 8 ``poll_s``; so a writer reads the txns shard a few
        times per commit whatever the number of writers. The average ends at
        the start of that look, not at its end: a look reads the versions
        written since the last one, so a slow look made the next first look
        later, with more versions to read (on moto at 2 processes, queued
        commits waited 290 ms, 150 of them in the look). A share under 1
        lets the average come down when commits get faster. (Spacing the
        looks by the average wait instead, about three per commit, cut the
        reads and the clients' CPU per commit on a real S3 server by a
        fifth, but made commits in the S3 model, where a read costs time and
        no CPU, a third slower.)
        """
        if polls == 1:
            return max(self.poll_s, FIRST_LOOK_SHARE * self._found_s)
        return self.poll_s * float(min(8, 2 ** ((polls - 2) // 2)))

    def _nap(self, pause: float, seen: int) -> None:
        """Sleep ``pause`` before a waiting writer's next look; in the process that sequences, only until its
        next round committed (its waiters' transactions are handed over, and its rounds move the view: at
        16 processes x 8 threads in the S3 model, the sequencer's own writers waited 0.66 s at the median,
        the others 0.44 s). ``seen``: ``_round_gen`` at the writer's last look
        (under the lock), so a round that committed since is never missed."""
        if self._serving is None:
            time.sleep(pause)
            return
        with self._round_done:
            self._round_done.wait_for(lambda: self._round_gen != seen, pause)

    def _serve(self) -> None:
        """Keep sequencing in a background thread while the queue has work; then release the lease.

        Called by a writer that just took the lease and ran a round (under
        the lock): the writer returns as soon as its own transactions are in,
        while this thread serves everyone else's (and this process's later
        ones) without a lease hand-over per round. Once a round finds the
        queue empty it keeps the lease for ``linger_s`` more, listing the
        queue at a growing interval (``poll_s`` doubling up to ``idle_poll_s``),
        so that under steady contention one process stays the sequencer
        (no lease hand-over, no re-reading of queued objects, no writers
        racing for a free lease); it releases the lease once the queue has
        stayed empty that long (or the lease is lost).
        """
        if self._serving is not None or self._closed:
            return

        def loop() -> None:
            idle_since: float | None = None
            pause = self.poll_s
            try:
                while not self._closed:
                    ahead = self._ahead
                    if ahead is None and self._found_lately(time.monotonic()) and not self._eager():
                        # (the round's listing is read ahead too, not under the lock: a transaction handed
                        # over meanwhile goes at once, not after a listing and reads)
                        with self._lock:
                            self._start_read_ahead()
                            ahead = self._ahead
                    if ahead is not None:
                        # The round waits for its read-ahead, unless this process hands transactions over
                        # meanwhile: those go now, and the listing to the next round (see _round_once).
                        # (Not under the lock, which this process's waiting writers take to hand
                        # transactions over and to look for their commits.)
                        self._go.clear()
                        ahead.add_done_callback(lambda _f: self._go.set())
                        while not ahead.done() and not self._eager() and not self._closed:
                            self._go.wait()
                            self._go.clear()  # (then the conditions are read again: no wake-up is lost)
                    with self._lock:
                        if not self.lease.hold():
                            self._serving = None  # (under the lock: no transaction is handed to it after this)
                            self._ahead = None  # (a later holder lists afresh)
                            return
                        try:
                            committed = self._round()
                        except ExternalError as e:
                            log.debug("sequencer round deferred: %s", e)
                            committed = -1
                        if committed > 0:
                            self._maintain_after_round()
                        if committed == 0 and not self._bodies:
                            now = time.monotonic()
                            idle_since = idle_since or now
                            if now - idle_since >= self.linger_s:
                                self.lease.release()
                                self._serving = None
                                self._ahead = None
                                return
                            pause = min(self.idle_poll_s, pause * 2)
                        else:
                            idle_since, pause = None, self.poll_s
                    self._wake.wait(pause)  # (set when this process hands a transaction over)
                    self._wake.clear()
            finally:
                self._serving = None

        self._serving = threading.Thread(target=loop, name="txns-sequencer", daemon=True)
        self._serving.start()

    def _maintain_after_round(self) -> None:
        """Run ``maintain`` (the txns shard's compaction and GC) in this committer's maintenance thread,
        unless a run is still in progress or one started less than ``SEQUENCER_MAINTAIN_EVERY_S`` ago.

        The sequencing process maintains the txns shard, and other processes
        leave it to it (:meth:`another_sequences`): it writes the shard most,
        and its maintenance's writes take turns with its rounds' (one
        client's writes to a shard do), so they never lose a race to them.
        Maintained in a process that did not sequence, every compaction there
        raced the sequencer's rounds: on moto at 2 processes, 0.28 lost
        compare-and-sets per commit and a read of the shard after each. The
        same thread sweeps the commit notes nobody read, every
        ``NOTE_SWEEP_S`` (:meth:`_sweep_notes`; without ``maintain`` too).
        """
        if self._closed:
            return
        running = self._maintaining
        now = time.monotonic()
        if (running is not None and not running.done()) or now - self._maintained_at < SEQUENCER_MAINTAIN_EVERY_S:
            return
        if self._maintain is None and now - self._swept_at < NOTE_SWEEP_S:
            return
        self._maintained_at = now
        maintain = self._maintain

        def run() -> None:
            try:
                if maintain is not None:
                    maintain()
            except Exception as e:  # noqa: BLE001 - maintenance is best effort
                log.debug("txns shard maintenance after a round deferred: %s", e)
            self._sweep_notes()

        try:
            self._maintaining = self._maintainer.submit(run)
        except RuntimeError:  # (closed meanwhile)
            pass

    @property
    def sequencing(self) -> bool:
        """Whether this process sequences now (its sequencer thread runs)."""
        return self._serving is not None

    def another_sequences(self) -> bool:
        """Whether another process sequences, as far as this one knows (no request): this process does not,
        and another's round committed one of its transactions within ``contended_s``, or another held
        the sequencer lease when this process last read it, and that lease has not run out since."""
        if self._serving is not None:
            return False
        return time.monotonic() - self._elsewhere_at < self._switch.contended_s or self.lease.held_by_other()

    def _enqueue(self, q: Queued) -> None:
        key = f"{self.prefix}pending/{q.txn_id}"
        retry_storage(lambda: self.blob.set(key, q.encode()), self._deadline_s)

    def _check_failed(self, txn_id: str) -> None:
        """Raise GroupCommitFailed if a sequencer published a failure for ``txn_id``."""
        key = f"{self.prefix}failed/{txn_id}"
        try:
            failed = self.blob.get(key)
        except ExternalError:
            return
        if failed is not None:
            self._quietly_delete(key)
            raise GroupCommitFailed(failed.decode())

    def _committed(self, q: Queued) -> int | None:
        """``q``'s commit time if it committed below the cache's frontier, else None (exact; see the module doc)."""
        if not q.uncertain:
            try:
                return self.handle.cache.committed_at(set(q.batch_ids), q.seen_upper)
            except LookupError:
                pass
        return self.handle.find_commit(q.txn_id, set(q.batch_ids))

    # ---- the sequencer's side ---------------------------------------------------------------

    def run_round(self) -> int:
        """Run one sequencer round if this process holds (or can take) the lease; how many it committed.

        Writers run rounds themselves while they wait; this is for tests and tools.
        """
        with self._lock:
            if not self.lease.hold():
                return 0
            return self._round()

    def _round(self) -> int:
        """List the queue, drop what committed, commit the rest in one conditional write. Under the lock."""
        try:
            return self._round_once()
        finally:
            self._delete_doomed()

    def _round_once(self) -> int:
        h = self.handle
        now = time.monotonic()
        eager = self._eager()
        self._taken_n = self.handed  # (every transaction handed over so far is in _bodies)
        local = any(k.startswith(LOCAL) for k in self._bodies)
        listing = self._take_read_ahead(now, wait=not eager)
        if listing is None and self._ahead is None:
            if eager and self._found_lately(now):
                self._start_read_ahead()  # (for the next round)
            elif not (local and now - self._listed_at < LOCAL_ROUND_LIST_S and not self._found_lately(now)):
                listing = self._read_queue(now, self._known())
        if listing is not None:
            self._take_listing(listing)
        self.rounds += 1
        if not self._bodies:
            return 0  # (an empty queue: nothing to check, no read of the txns shard)
        # No read of the txns shard first: the sequencer's own writes keep its view at the upper
        # most of the time, and when another write landed meanwhile, the write below fails on it,
        # reads the new state and checks every member again there (safety rests on that check).
        h.cache.sync_cached()
        upper = h.cache.frontier
        todo: list[tuple[str, Queued]] = []
        for k, q in list(self._bodies.items()):
            committed_at = self._committed(q)
            if committed_at is not None:
                self._settle_committed(k, q, committed_at)
                continue
            if q.uncertain or q.seen_upper < upper:
                # Not committed below `upper` (exact): later checks of it need only the commits since,
                # which the cache tracks (not the durable look-up on every try of every round).
                q = self._bodies[k] = dataclasses.replace(q, seen_upper=upper, uncertain=False)
            todo.append((k, q))
        if not todo:
            return 0
        todo = todo[:MAX_GROUP]
        ts = max(upper, self.ts_fn(upper))  # (the write may go later: a shard forgotten by then fails it there)
        members: list[tuple[str, Txn]] = []
        fresh = False
        for k, q in todo:
            t = Txn.from_bytes(q.txn, h)
            gone = [d for d in t.data_ids if not h.cache.registered_at(d, ts)]
            if gone and not fresh:
                # (the view may be older than the shard's registration: judge on a fresh one)
                h.cache.sync()
                fresh = True
                ts = max(ts, h.cache.frontier, self.ts_fn(h.cache.frontier))
                gone = [d for d in t.data_ids if not h.cache.registered_at(d, ts)]
            if gone:
                self._fail(k, q, f"data shard(s) {', '.join(gone)} are not registered at {ts} (forgotten); "
                                 f"transaction {q.txn_id} was not committed")
                continue
            t.uncertain = False  # checked just above, and again on every try of the write (none_committed)
            if members:
                t.drop_tidy()  # (only the base of a join may tidy; writers drop theirs anyway)
            members.append((k, t))
        if not members:
            return 0
        self._start_read_ahead()

        def none_committed(at: int) -> None:
            # On every try of the write, at the very upper it appends at: no member committed
            # below it (by a lapsed sequencer still running), so none commits twice.
            done = {k: ts for k, _ in members if (ts := self._committed(self._bodies[k])) is not None}
            if done:
                raise _MembersCommitted(done)

        for attempt in range(ROUND_RETRIES + 1):
            base = members[0][1]
            base.join([t for _, t in members[1:]])
            picked = time.monotonic()
            ts = self._round_ts()
            try:
                committed_ts = base.commit_at(h, ts, check=none_committed).commit_ts
                self._wrote(picked, lost=False)
                break
            except _MembersCommitted as e:
                for k, at in e.committed.items():
                    self._settle_committed(k, self._bodies[k], at)
                members = [(k, t) for k, t in members if k not in e.keys]
            except TimestampUnavailable as e:
                # Another commit took a time past ours (a direct writer's): write again above it,
                # leading by how long the write takes, without a new round (no listing, no
                # re-reads of queued objects).
                self._wrote(picked, lost=True)
                log.debug("group commit round of %d at %d lost to %d (attempt %d, %.0f ms after picking its time)",
                          len(members), ts, e.upper, attempt, 1000 * (time.monotonic() - picked))
                members = self._publish_handed(members)
            except (ExternalError, NotRegistered) as e:
                log.debug("group commit round at %d deferred: %s", ts, e)  # the next round checks again
                return 0
            finally:
                base.join([])
            if not members or attempt == ROUND_RETRIES:
                return 0
        self._synced_at = time.monotonic()  # (the view is at this write's upper: local waiters need no read)
        with self._pending_lock:
            mine = {f"{self.prefix}pending/{i}" for i in self._in_queue}
        if any(not k.startswith(LOCAL) and k not in mine for k, _ in members):
            self._foreign_at = self._synced_at
        for k, _ in members:
            self._settle_committed(k, self._bodies[k], committed_ts)
        self.grouped += len(members)
        with self._round_done:
            self._round_gen += 1
            self._round_done.notify_all()
        return len(members)

    def _hand_over(self, qs: list[Queued]) -> None:
        """Give ``qs`` to this process's sequencer thread for its next round (in memory). Under the lock."""
        for q in qs:
            self._bodies[f"{LOCAL}{q.txn_id}"] = q
        self.handed += len(qs)
        self._wake.set()
        self._go.set()

    def _eager(self) -> bool:
        """Whether this process's transactions handed over since the last round go in the next one without
        waiting for a listing of the queue: a listing found fewer new objects lately (``_found_per_listing``)
        than there are of them. A listing still being read ahead is then left to the round after, and none
        is made for this one. (Waiting put a listing and a read before each of the sequencer's own writes:
        at 2 processes x 1 thread in the S3 model, 0.83-0.99x the 1-process rate. Not waiting at 16 x 8,
        where a listing finds dozens, halved the transactions per write and cost 12% of the rate.)"""
        pending = self.handed - self._taken_n
        return pending > 0 and self._found_per_listing < pending

    def _found_lately(self, now: float) -> bool:
        """Whether a listing found queued objects within ``FOUND_LATELY_S``: another process commits through
        the queue, so every round lists (see ``LOCAL_ROUND_LIST_S``)."""
        return now - self._found_at < FOUND_LATELY_S

    def _known(self) -> frozenset[str]:
        """The queue keys this sequencer holds bodies of (a handed transaction's too: its object, if any), and
        those it settled whose delete may not have landed: a listing need not read them."""
        pending = f"{self.prefix}pending/"
        with self._settled_lock:
            settled = list(self._settled)
        return frozenset(pending + k[len(LOCAL):] if k.startswith(LOCAL) else k for k in self._bodies).union(settled)

    def _read_queue(self, at: float, known: frozenset[str]) -> _Listing:
        """List the queue and read the objects not in ``known`` (their bodies; None: deleted meanwhile)."""
        keys = sorted(retry_storage(lambda: list(self.blob.list_keys(f"{self.prefix}pending/")), self._deadline_s))
        new = [k for k in keys if k not in known]

        def get(k: str) -> bytes | None:
            return retry_storage(lambda: self.blob.get(k), self._deadline_s)

        bodies = dict(zip(new, self._deleter.map(get, new) if len(new) > 1 else map(get, new), strict=True))
        return _Listing(at, known, keys, bodies)

    def _start_read_ahead(self) -> None:
        """Start listing and reading the queue for the next round, while this round writes. Under the lock.

        A round is a listing, reads of the new objects, then the write: in
        the S3 model (60 ms a request) at 16 processes x 8 threads, the
        listing and reads were half of each round. Done during the write,
        they cost the next round nothing when the queue stays busy. Only
        while other processes queue (a listing found objects within
        ``FOUND_LATELY_S``): rounds for this process's handed transactions
        alone skip most listings (``LOCAL_ROUND_LIST_S``).
        """
        if self._ahead is None and not self._closed and self._found_lately(time.monotonic()):
            self._ahead = self._ahead_pool.submit(self._read_queue, time.monotonic(), self._known())

    def _take_read_ahead(self, now: float, wait: bool = True) -> _Listing | None:
        """The listing read ahead for this round, if there is one and it is recent. Under the lock.

        ``wait=False``: None if it is still being read (it stays for the next round)."""
        ahead = self._ahead
        if ahead is None or (not wait and not ahead.done()):
            return None
        self._ahead = None
        try:
            listing = ahead.result()
        except ExternalError as e:  # (this round lists afresh)
            log.debug("reading the queue ahead failed: %s", e)
            return None
        return listing if now - listing.at < READ_AHEAD_MAX_AGE_S else None

    def _take_listing(self, listing: _Listing) -> None:
        """Bring this sequencer's bodies up to ``listing``. Under the lock.

        A body whose object the listing lacks, though it was known when the
        listing started, is gone: another sequencer committed (or failed) it.
        One the listing did not know of (handed over, published or read
        since) stays. A new object this sequencer settled since the listing
        started, or whose delete had not returned by then (``_settled``), is
        not read in again: were it, the next round would only find it
        committed and delete it again (before this rule, objects were read
        1.6 times each in the S3 model, where the round after a write
        listed the queue before that write's deletes landed).
        """
        with self._settled_lock:
            # (deletes that returned before the listing began: their objects are not in it)
            self._settled = {k: t for k, t in self._settled.items() if t >= listing.at}
            settled = set(self._settled)
        self._listed_at = max(self._listed_at, listing.at)
        if listing.keys:
            self._found_at = max(self._found_at, listing.at)
        listed = set(listing.keys)
        self._bodies = {k: v for k, v in self._bodies.items()
                        if k in listed or k.startswith(LOCAL) or k not in listing.known}
        pending = f"{self.prefix}pending/"
        for k in listing.keys:
            # One body per transaction: a handed one whose PUT landed though it reported a failure
            # (``_publish_handed``) moves to its object's key (not read in again as a second member).
            handed = self._bodies.pop(f"{LOCAL}{k[len(pending):]}", None)
            if handed is not None:
                self._bodies[k] = handed
        found = 0
        for k, data in listing.bodies.items():
            if data is not None and k not in self._bodies and k not in settled:
                # (None: deleted meanwhile, committed by another sequencer)
                self._bodies[k] = Queued.decode(f"queued transaction {k}", data)
                found += 1
        self._found_per_listing = 0.75 * self._found_per_listing + 0.25 * found

    def _publish_handed(self, members: list[tuple[str, Txn]]) -> list[tuple[str, Txn]]:
        """Queue (PUT) the handed-over transactions among ``members`` after their round's write lost; the
        members again, under their new keys.

        A direct writer yields to the queue only when it finds objects there
        (``QueueSwitch.contended`` lists it), and a transaction handed over in
        memory has none: a direct writer whose writes kept winning starved
        it (17 s at 2 processes on moto), round after round losing to it. The
        object is the transaction as the round checked it (not committed
        below its ``seen_upper``: its writes so far took no time), so any
        sequencer may commit it from here, under the usual check; this one
        keeps it under the object's key (no re-read), deletes the object once
        it commits, and the waiting writer learns its time as before. A PUT
        that landed but reported a failure leaves it handed; the next listing
        finds the object and moves the body to its key (one body each).
        """
        out: list[tuple[str, Txn]] = []
        for k, t in members:
            q = self._bodies.get(k) if k.startswith(LOCAL) else None
            if q is None:
                out.append((k, t))
                continue
            self._enqueue(q)  # (a storage failure leaves it handed, and ends the round: its caller runs another)
            key = f"{self.prefix}pending/{q.txn_id}"
            del self._bodies[k]
            self._bodies[key] = q
            self.published += 1
            out.append((key, t))
        return out

    def _round_ts(self) -> int:
        """The time a round writes at: ``ts_fn`` of the upper, led by how long its write takes once one lost.

        A direct writer picks its time just before its write, and so does a
        round, but a round's write does more between the two (every member's
        batches are stamped, the check runs), so under steady direct writes a
        round's time was always passed by a direct commit that landed first,
        round after round: the queued transactions starved while one process
        committed directly. After a lost write, a round's time leads by 1.5x
        how long its recent writes took (at most ``MAX_LEAD_S``): about the
        time it will land, so it is still free then, and the direct writers
        it passes lose theirs and queue too. Timestamps only ever go up; the
        lead costs no wait.
        """
        upper = self.handle.cache.frontier
        ts = max(upper, self.ts_fn(upper))
        if self._lead:
            ts += self.lead_fn(min(MAX_LEAD_S, 1.5 * self._write_s))
        return ts

    def _wrote(self, picked: float, lost: bool) -> None:
        """A round's write, whose time was picked at ``picked`` (monotonic), landed or lost its time."""
        took = time.monotonic() - picked
        self._write_s = took if self._write_s == 0.0 else 0.75 * self._write_s + 0.25 * took
        self._lead = lost

    def _fail(self, key: str, q: Queued, message: str) -> None:
        retry_storage(lambda: self.blob.set(f"{self.prefix}failed/{q.txn_id}", message.encode()), self._deadline_s)
        self._delete(key)

    def _settle_committed(self, key: str, q: Queued, ts: int) -> None:
        """Forget ``key``'s transaction, committed at ``ts``; for another process's, its commit note is written
        at the end of the round, before its object is deleted. Under the lock."""
        if not key.startswith(LOCAL) and q.writer and q.writer != self.writer_id:
            # (this process's own writers learn theirs from the rounds; "": a writer that reads no notes)
            self._notes.append((q.txn_id, ts))
        self._delete(key)

    def _delete(self, key: str) -> None:
        """Forget ``key``'s transaction (committed or failed); its object goes at the end of the round."""
        self._bodies.pop(key, None)
        if not key.startswith(LOCAL):  # (handed over in memory: no object)
            self._doomed.append(key)
            with self._settled_lock:
                self._settled[key] = float("inf")

    def _delete_doomed(self) -> None:
        """Write the round's commit notes, then delete the objects of its committed (or failed) transactions
        (one request on S3), off the lock.

        The notes go first (each a PUT, in parallel), so that a transaction's
        object outlives its note's write: a sequencer that dies in between
        leaves the object, and the next one, finding it committed, writes the
        note. (The delete waits for the note writes it follows, which the
        pool took before it: no deadlock.)"""
        notes, self._notes = self._notes, []
        written = [self._deleter.submit(self._write_note, txn_id, ts) for txn_id, ts in notes]
        if self._doomed:
            keys, self._doomed = self._doomed, []
            self._deleter.submit(self._quietly_delete_many, keys, written)

    def _write_note(self, txn_id: str, ts: int) -> None:
        try:
            self.blob.set(self._note_key(txn_id), str(ts).encode("ascii"))
        except ExternalError as e:  # (its writer reads the log after its patience)
            log.debug("writing the commit note of %s failed: %s", txn_id, e)

    def _sweep_notes(self) -> None:
        """Delete the commit notes that this sweep and the last one (``NOTE_SWEEP_S`` ago or more) both found:
        their writers stopped (or gave up) before reading them. A writer reads its note within moments; one
        that waits longer and finds it gone reads the log."""
        now = time.monotonic()
        if now - self._swept_at < NOTE_SWEEP_S:
            return
        self._swept_at = now
        try:
            notes = frozenset(self.blob.list_keys(f"{self.prefix}committed/"))
        except ExternalError as e:
            log.debug("listing commit notes deferred: %s", e)
            return
        stale, self._swept = sorted(notes & self._swept), notes
        if stale:
            self._quietly_delete_many(stale)

    def _quietly_delete_many(self, keys: list[str], after: list[Future[None]] | None = None) -> None:
        """Delete ``keys`` (queued objects or commit notes) in one request, after the futures ``after``; a
        failure is left to a later round or sweep."""
        for f in after or ():
            with contextlib.suppress(Exception):  # (_write_note raises no storage error)
                f.result()  # (the notes of these objects' transactions are written first)
        try:
            self.blob.delete_many(keys)
        except ExternalError as e:  # a later round (they are known committed then) or sweep deletes them
            log.debug("deleting %d queue objects deferred: %s", len(keys), e)
        finally:
            done = time.monotonic()  # (a listing begun after this no longer holds them, unless the delete failed)
            with self._settled_lock:
                for k in keys:
                    if k in self._settled:
                        self._settled[k] = done

    def _quietly_delete(self, key: str) -> None:
        try:
            self.blob.delete(key)
        except ExternalError as e:  # a later round deletes it (it is known committed then)
            log.debug("deleting queued %s deferred: %s", key, e)


__all__ = [
    "GroupCommitFailed",
    "GroupCommitter",
    "QueueSwitch",
    "Queued",
    "SequencerLease",
    "lease_key",
    "queue_has_work",
    "queue_prefix",
]
