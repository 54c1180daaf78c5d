"""Transactions: buffered writes to many data shards, committed together.

A :class:`Txn` gathers writes per data shard in persist batch builders (so
it spills to blob storage at the part size: bounded memory for any size).
``commit_at`` writes the batches (at time 0), re-timestamps them to the
commit time (metadata only) and commits pointers to them with one
compare-and-append on the txns shard. If the time is taken, it raises
``TimestampUnavailable`` and stays valid: committing again at a later time
re-timestamps the same batches without rewriting any data.

Exactly once. A transaction has an id (random, or given to ``begin``); every
commit of one that carries data records the id in the commits shard in the
same conditional write (:mod:`txns.commits`). Invariants:

- Any failure inside ``commit_at`` leaves the transaction committable:
  builders and part uploads are retry-safe (uploaded parts are reused,
  failed ones uploaded again under the same keys).
- Once an attempt may have landed (or the transaction came from bytes, or
  its id was given), the transaction is *uncertain*: the next attempt first
  looks its id up, at the txns upper it then commits against, and returns
  the earlier commit if there is one. So retrying the same transaction (this
  object, or one rebuilt with ``from_bytes``, on any handle, in any process,
  at any time) never commits it twice.
- A committed transaction returns its first result from every later
  ``commit_at``.
"""

from __future__ import annotations

import base64
import json
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from persist import Batch, BatchBuilder, ExternalError, InvalidUsage, Schema, SchemaMismatch, finish_all, frame, unframe
from persist.errors import operation
from persist.schema import DIFF_MAX, DIFF_MIN, check_row, check_ts
from txns.commits import COMMIT_RECORD_MAX_BYTES
from txns.entries import Entry
from txns.request import CommitMember, CommitRequest

KIND_TXN = 3
"""The framing kind of a serialized transaction (persist's own kinds are 1 and 2)."""

if TYPE_CHECKING:
    from txns.handle import TxnsHandle


@dataclass
class Tidy:
    """Applied entries to retract from the txns shard. Ride along on a later commit with ``txn.tidy``."""

    entries: set[Entry] = field(default_factory=set)

    def merge(self, other: Tidy) -> None:
        self.entries |= other.entries

    def __len__(self) -> int:
        return len(self.entries)


@dataclass(frozen=True)
class TxnApply:
    """A committed transaction, to be applied with :meth:`apply`."""

    commit_ts: int
    data_ids: tuple[str, ...]

    def apply(self, handle: TxnsHandle) -> Tidy:
        """Apply this transaction (and everything committed before it) to the data shards."""
        return handle.apply_le(self.commit_ts)


class Txn:
    """A write-only transaction over any number of registered data shards.

    Start one with ``TxnsHandle.begin()``. See :mod:`txns` for an example.
    """

    def __init__(
        self, handle: TxnsHandle | None = None, txn_id: str | None = None, metadata: Mapping[str, Any] | None = None
    ) -> None:
        if txn_id is not None and (not isinstance(txn_id, str) or not 0 < len(txn_id) <= 256):
            raise InvalidUsage(f"a transaction id must be a non-empty string of at most 256 characters, got {txn_id!r}")
        try:
            text = json.dumps(dict(metadata or {}))
        except (TypeError, ValueError) as e:
            raise InvalidUsage(f"transaction metadata must be a JSON-serializable mapping: {e}") from None
        if len(text) > COMMIT_RECORD_MAX_BYTES:
            raise InvalidUsage(
                f"transaction metadata is {len(text)} bytes as JSON; at most {COMMIT_RECORD_MAX_BYTES} are "
                f"recorded with a commit: keep large data in a table"
            )
        self.metadata: dict[str, Any] = json.loads(text)
        self.id = txn_id if txn_id is not None else uuid.uuid4().hex
        self._handle = handle
        self._builders: dict[str, BatchBuilder] = {}
        self._batches: dict[str, list[Batch]] = {}
        self._tidy = Tidy()
        self._register: set[str] = set()  # fresh data shards this commit registers
        self._ready: list[Callable[[], None]] = []  # prerequisites of the conditional write (before_write)
        self._joined: list[Txn] = []  # transactions committed in this one's write (group commit)
        # Whether an earlier commit attempt (here or elsewhere) may have landed.
        # A caller-chosen id may have been committed by anyone already.
        self._uncertain = txn_id is not None
        self._committed: TxnApply | None = None

    # ---- building ---------------------------------------------------------------

    def _bind(self, handle: TxnsHandle) -> None:
        if self._handle is None:
            self._handle = handle

    def write(self, data_id: str, key: tuple[Any, ...], val: tuple[Any, ...], diff: int) -> None:
        """Add the update ``(key, val)`` with multiplicity ``diff`` to ``data_id``.

        ``key`` and ``val`` are tuples matching the data shard's schema (as
        registered); a mismatch raises SchemaMismatch and adds nothing.
        """
        if self._handle is None:
            raise InvalidUsage("this transaction is not bound to a handle; create it with TxnsHandle.begin()")
        data_id = str(data_id)
        if isinstance(diff, bool) or not isinstance(diff, int) or not DIFF_MIN <= diff <= DIFF_MAX:
            raise InvalidUsage(f"diff must be a signed 64-bit int, got {diff!r}")
        builder = self._builders.get(data_id)
        if builder is None:
            schema = self._handle.data_schema(data_id)
            check_row(schema, key, val)
            builder = self._handle.data_writer(data_id).builder(0, 1)
            self._builders[data_id] = builder
        else:
            check_row(builder.schema, key, val)
        builder.add(key, val, 0, diff)

    def write_batch(self, data_id: str, batch: Batch) -> None:
        """Add a batch written earlier (for example by Spark executors) to ``data_id``.

        Its update times are all advanced to the commit time.
        """
        data_id = str(data_id)
        if not isinstance(batch, Batch):
            raise InvalidUsage(f"write_batch takes a persist.Batch, got {type(batch).__name__}")
        if batch.shard_id != data_id:
            raise InvalidUsage(f"batch {batch.id} was written for shard {batch.shard_id}, not {data_id}")
        if self._handle is not None:
            schema = self._handle.data_schema(data_id)
            if not batch.same_schema(schema.to_text()):
                raise SchemaMismatch(
                    f"batch {batch.id} was written with a schema other than data shard {data_id}'s "
                    f"({schema.describe()})"
                )
        self._batches.setdefault(data_id, []).append(batch)

    @property
    def uncertain(self) -> bool:
        """Whether an earlier commit of this transaction may have landed (see the module doc).

        Its next commit looks it up first. Group commit (:mod:`txns.group_commit`)
        sets it once the transaction is queued (a sequencer may commit it), and
        clears it on a copy it checked at the very upper its commit expects.
        """
        return self._uncertain

    @uncertain.setter
    def uncertain(self, value: bool) -> None:
        self._uncertain = bool(value)

    def settle(self, applied: TxnApply) -> None:
        """Record that this transaction committed as ``applied`` (by another's write: group commit).

        Every later ``commit_at`` returns ``applied``.
        """
        self._committed = applied
        self._uncertain = False

    @property
    def handle(self) -> TxnsHandle | None:
        """The handle this transaction is bound to (set by ``TxnsHandle.begin`` or the first commit)."""
        return self._handle

    def register(self, data_id: str, schema: Schema | None = None) -> None:
        """Register the fresh data shard ``data_id`` at the commit time, in the commit's own write.

        Its schema must be recorded already (``PersistClient.register_schema``),
        or be ``schema`` and be recorded by a prerequisite of the commit's
        write (:meth:`before_write`). Nothing may have written the shard
        outside the txns shard (its upper is at most the commit time + 1).
        Until this transaction commits, the shard is not registered; if it
        never commits, nothing needs undoing. Already registered at the
        commit time: a no-op.
        """
        if self._handle is None:
            raise InvalidUsage("this transaction is not bound to a handle; create it with TxnsHandle.begin()")
        data_id = str(data_id)
        if schema is not None:
            self._handle.expect_schema(data_id, schema)
        self._handle.data_schema(data_id)  # NotRegistered if it has no schema yet
        self._register.add(data_id)

    def before_write(self, fn: Callable[[], None]) -> None:
        """Call ``fn`` right before the commit's conditional write (each attempt), once the entries are built.

        For work the commit depends on that can overlap with building it
        (recording new shards' schemas). If ``fn`` raises, nothing is
        committed and the exception propagates.
        """
        self._ready.append(fn)

    def join(self, others: list[Txn]) -> None:
        """Commit ``others`` in this transaction's conditional write too (a group commit), each keeping its identity.

        Their batches ride along and each gets its own commit record (its id,
        metadata and row counts), so each is found by its id as if committed
        alone. Replaces any earlier join (a group that changed is re-joined);
        ``others`` are not modified and are not marked committed. Only
        transactions that register nothing and tidy nothing may join.
        """
        for o in others:
            if o is self or o._register or o._tidy.entries or o._ready:
                raise InvalidUsage(
                    "a joined transaction must be another one that registers, tidies and waits for nothing "
                    "(no before_write)"
                )
        self._joined = list(others)

    @property
    def joinable(self) -> bool:
        """Whether this transaction may join another's write (:meth:`join`): it registers, tidies and waits
        for nothing, is not uncertain (its own look-up would be skipped) and has not committed."""
        return not (self._register or self._tidy.entries or self._ready or self._uncertain or self._committed)

    def failed_on_usage(self, e: BaseException) -> bool:
        """Whether this transaction's commit, which raised ``e``, wrote nothing and failed on a usage error
        (not storage's: a shard not registered, say). With others joined (:meth:`join`), that may be any
        member's fault, so a caller may commit each member alone, only the one at fault failing again."""
        return not self._uncertain and isinstance(e, Exception) and not isinstance(e, ExternalError)

    def tidy(self, tidy: Tidy) -> None:
        """Retract these applied entries as part of this transaction's commit."""
        self._tidy.merge(tidy)

    def drop_tidy(self) -> Tidy:
        """Remove and return the entries this transaction was to retract (later applies find them again)."""
        tidy, self._tidy = self._tidy, Tidy()
        return tidy

    def merge(self, other: Txn) -> None:
        """Move everything of ``other`` into this transaction. ``other`` must not be used after."""
        other._finish_builders()
        self._finish_builders()
        for d, bs in other._batches.items():
            self._batches.setdefault(d, []).extend(bs)
        self._tidy.merge(other._tidy)
        if self._handle is None:
            self._handle = other._handle
        other._batches, other._tidy = {}, Tidy()

    def _finish_builders(self) -> None:
        """Finish every shard's builder, uploading the shards' last parts in parallel.

        Retry-safe: a builder that finished moves its batch over; one that
        failed stays, and the next call retries just its failed uploads.
        Raises the first failure after every builder had its try.
        """
        done, failure = finish_all(dict(sorted(self._builders.items())))
        for d, batch in done.items():
            del self._builders[d]
            if batch.rows:
                self._batches.setdefault(d, []).append(batch)
        if failure is not None:
            raise failure

    @property
    def data_ids(self) -> tuple[str, ...]:
        return tuple(sorted(set(self._batches) | set(self._builders)))

    def batches(self) -> dict[str, list[Batch]]:
        """The written batches per data shard (finishing any buffered writes)."""
        self._finish_builders()
        return {d: list(bs) for d, bs in self._batches.items()}

    # ---- moving between processes ------------------------------------------------

    def to_bytes(self) -> bytes:
        """This uncommitted transaction as bytes (buffered writes are written out first)."""
        self._finish_builders()
        j = {
            "id": self.id,
            "metadata": self.metadata,
            "batches": {d: [base64.b64encode(b.to_bytes()).decode() for b in bs] for d, bs in self._batches.items()},
            "tidy": [[e.ts, e.data_id, base64.b64encode(e.batch).decode()] for e in sorted(self._tidy.entries)],
        }
        return frame(KIND_TXN, json.dumps(j, separators=(",", ":")).encode())

    @staticmethod
    def from_bytes(data: bytes, handle: TxnsHandle | None = None) -> Txn:
        """A transaction from :meth:`to_bytes`; bound to ``handle`` if given (else at commit).

        Its commit first looks up whether a copy of it committed already (the
        bytes may have been committed elsewhere), and if so returns that commit.
        """
        j = json.loads(unframe("serialized txn", data, KIND_TXN))
        txn = Txn(handle, txn_id=j["id"], metadata=j.get("metadata"))
        txn._batches = {d: [Batch.from_bytes(base64.b64decode(b)) for b in bs] for d, bs in j["batches"].items()}
        txn._tidy = Tidy({Entry(ts, d, base64.b64decode(b)) for ts, d, b in j["tidy"]})
        return txn

    # ---- committing ----------------------------------------------------------------

    def commit_at(
        self,
        handle: TxnsHandle,
        commit_ts: int,
        expect_upper: int | None = None,
        check: Callable[[int], None] | None = None,
    ) -> TxnApply:
        """Commit atomically at ``commit_ts``; return a :class:`TxnApply` to apply it.

        Raises TimestampUnavailable (with ``.upper``) if the txns shard is
        past ``commit_ts``, and NotRegistered if a written shard is not
        registered at ``commit_ts``; nothing is committed then, and this
        transaction can be committed again at a later time. ``Determinate``:
        it did not commit. ``Indeterminate``: it may have; commit it again
        (at any time): an earlier commit is found and returned, never repeated.
        A transaction that committed returns the same result from every call.

        ``expect_upper``: commit only if the txns upper is exactly this, else
        TimestampUnavailable (for a caller that validated something as of
        ``expect_upper - 1``: nothing can commit in between). ``check``:
        called on every try with the txns upper that try appends at (the
        handle's cache is at it; nothing can commit between the call and the
        write); it raises to give up, with nothing committed.
        """
        check_ts(commit_ts, "commit_ts")
        if expect_upper is not None:
            check_ts(expect_upper, "expect_upper")
            if commit_ts < expect_upper:
                raise InvalidUsage(f"commit_ts {commit_ts} is below expect_upper {expect_upper}")
        if self._committed is not None:
            return self._committed
        self._bind(handle)
        handle.prepare_commit()
        self._finish_builders()  # a failure here leaves the transaction committable
        for o in self._joined:
            o._finish_builders()
        group = [self, *self._joined]
        data_ids = tuple(sorted({d for m in group for d in m._batches}))
        adds = [
            Entry(commit_ts, d, b.rewrite_ts(commit_ts, upper=commit_ts + 1).to_bytes())
            for m in group
            for d in sorted(m._batches)
            for b in m._batches[d]
            if b.rows
        ]
        members = [
            CommitMember(m.id, {d: sum(b.rows for b in bs) for d, bs in sorted(m._batches.items())}, m.metadata)
            for m in group
            if m is self or any(b.rows for bs in m._batches.values() for b in bs)
        ]
        request = CommitRequest(
            ts=commit_ts,
            adds=tuple(adds),
            data_ids=data_ids,
            token=f"txn-{self.id}-{commit_ts}",
            txn_id=self.id,
            uncertain=self._uncertain,
            members=tuple(members),
            register=tuple(sorted(self._register)),
            ready=tuple(self._ready),
            expect_upper=expect_upper,
            check=check,
        )
        with operation("commit") as op:
            if self._uncertain:
                op.may_have_written = True  # an earlier attempt may have landed
            try:
                done = handle.commit_entries(request, self._tidy)
            except BaseException:
                if op.may_have_written:
                    self._uncertain = True
                raise
        self._uncertain = False
        self._committed = TxnApply(done, data_ids)
        return self._committed
