"""WriteHandle: appends to a shard, and does the maintenance appends ask for.

An append is metadata only: the rows are first written as a :class:`Batch`
(parts in blob storage, or inline), then one compare-and-set adds the batch
to the state iff the shard's upper is the expected one. After a non-empty
append the writer merges batches when the size-tiered policy asks
(:mod:`persist._internal.merge`) and deletes parts retired longer ago than the grace
period.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable, Iterable, Sequence
from typing import Any, cast

from persist import metrics
from persist._internal.holds import gc_horizon
from persist._internal.ids import random_hex
from persist._internal.machine import Machine
from persist._internal.merge import apply_merged, merge_batches
from persist._internal.parts import MissingPart, Run
from persist._internal.state import HollowBatch, ShardState
from persist.batch import Batch, BatchBuilder
from persist.config import PersistConfig
from persist.errors import (
    CorruptObject,
    ExternalError,
    InvalidUsage,
    PartRetired,
    SchemaMismatch,
    UpperMismatch,
    note_write,
    operation,
)
from persist.location import Blob
from persist.manifest import REPLAN_ATTEMPTS, replan
from persist.schema import CLOSED, Schema, check_ts, check_upper
from persist.shard import ShardView

log = logging.getLogger(__name__)


class WriteHandle:
    """Appends to one shard. Open with ``PersistClient.open_writer``.

    >>> import pyarrow as pa
    >>> from persist import PersistClient, Schema, ShardId
    >>> client = PersistClient.open("mem://doc-write")
    >>> schema = Schema(key=pa.schema([("k", pa.string())]), val=pa.schema([("v", pa.int64())]))
    >>> w = client.open_writer(ShardId.new(), schema)
    >>> w.compare_and_append([((("a",), (1,)), 0, 1)], expected_upper=0, new_upper=1)
    >>> w.upper
    1
    """

    def __init__(
        self, blob: Blob, machine: Machine, schema: Schema, config: PersistConfig, inline_max_bytes: int | None = None
    ) -> None:
        self.blob, self.schema, self.config = blob, schema, config
        self._machine = machine
        self.shard = ShardView(blob, machine, config)
        self.inline_max_bytes = config.inline_max_bytes if inline_max_bytes is None else inline_max_bytes
        #: compaction output up to this size stays inline in the state
        self.compaction_inline_max_bytes = self.inline_max_bytes
        #: run :meth:`maintain` after each non-empty append (else the owner calls it)
        self.auto_maintain = True
        self.shard_id = machine.shard_id
        self.schema_text = schema.to_text()
        #: whether this handle's latest :meth:`compare_and_append` appended its updates (see there)
        self.appended = False

    @property
    def writer_id(self) -> str:
        """This handle's id as a writer of the shard (its idempotency record), made at its first use."""
        wid = self.__dict__.get("_writer_id")
        if wid is None:
            wid = self.__dict__.setdefault("_writer_id", "w" + random_hex())  # (atomic: one id, even if raced)
        return cast(str, wid)

    @property
    def upper(self) -> int:
        """The shard's upper as this handle last saw it."""
        return self._machine.state().upper

    def fetch_recent_upper(self) -> int:
        """The shard's upper, read from storage now."""
        return self._machine.fetch().upper

    # ---- batches --------------------------------------------------------------

    def builder(self, lower: int, upper: int) -> BatchBuilder:
        """A builder for a batch of updates with times in ``[lower, upper)``."""
        return BatchBuilder(
            self.blob, self.shard_id, self.schema, lower, upper, self.config, inline_max_bytes=self.inline_max_bytes
        )

    def batch(self, updates: Iterable[Any], lower: int, upper: int) -> Batch:
        """Write ``updates`` as a batch with bounds ``[lower, upper)``."""
        b = self.builder(lower, upper)
        b.add_updates(updates)
        return b.finish()

    # ---- appends ---------------------------------------------------------------

    def compare_and_append(
        self,
        updates: Iterable[Any],
        expected_upper: int,
        new_upper: int,
        token: str | None = None,
        before_write: Callable[[], None] | None = None,
        also: Callable[[ShardState], None] | None = None,
    ) -> None:
        """Append ``updates`` iff the shard's upper is ``expected_upper``; advance it to ``new_upper``.

        Every update time must be in ``[expected_upper, new_upper)``. Raises
        :class:`UpperMismatch` (with ``.current``) if the upper differs;
        nothing is appended then. ``token``: see :meth:`compare_and_append_batch`.
        ``before_write``: the caller's prerequisite, called once the batch is
        built, right before the conditional write (the backend may prepare
        the write meanwhile: the file store writes and syncs the new state's
        temp file first); not called when the upper differs; if it raises,
        nothing is appended (and the batch's parts are deleted).
        ``also``: another change to carry in the same write when it appends
        (for example ``ReadHandle.renewal``: a reader's hold moved at no
        extra write); it must only touch what its owner owns.

        Afterwards :attr:`appended` tells whether this call appended
        ``updates`` (False: the token showed an earlier call's append, whose
        batch is the one in the state).
        """
        check_ts(expected_upper, "expected_upper")
        check_upper(new_upper, "new_upper")
        if new_upper <= expected_upper:
            raise InvalidUsage(f"new_upper {new_upper} must be greater than expected_upper {expected_upper}")
        self.appended = False
        batch = self.batch(updates, expected_upper, new_upper)
        failed: list[BaseException] = []

        def ready() -> None:
            assert before_write is not None
            try:
                before_write()
            except BaseException as e:
                failed.append(e)
                raise

        try:
            appended = self._append_batches(
                [batch], expected_upper, new_upper, token, ready if before_write is not None else None, also
            )
        except BaseException as e:
            if isinstance(e, UpperMismatch) or failed:
                _delete_quietly(self.blob, [p.key for p in batch.parts])  # never appended
            raise
        if not appended:
            # A retry recognised by its token: an earlier call's batch is the one
            # in the state, and this call's parts are referenced by nothing.
            # SUBTLE: unless this very call's first CAS landed and reported a
            # timeout (the machine re-ran it and saw the token): then the state
            # references these parts, and deleting them would lose data.
            state = self._machine.state()
            live = state.part_keys() | {k for k, _ in state.garbage}
            _delete_quietly(self.blob, [p.key for p in batch.parts if p.key not in live])
        self.appended = appended

    def compare_and_append_batch(
        self, batches: Sequence[Batch], expected_upper: int, new_upper: int, token: str | None = None
    ) -> None:
        """Append written ``batches`` as metadata iff the upper is ``expected_upper``.

        Each batch's bounds must lie within ``[expected_upper, new_upper)``
        (re-timestamp it with :meth:`Batch.rewrite_ts` first if needed). A
        retry of the same call after an indeterminate failure is recognised
        and not applied twice. ``token`` overrides the idempotency token
        (derived by default from the bounds and batch ids); it must be unique
        per distinct append.
        """
        self._append_batches(batches, expected_upper, new_upper, token)

    def _append_batches(
        self,
        batches: Sequence[Batch],
        expected_upper: int,
        new_upper: int,
        token: str | None,
        ready: Callable[[], None] | None = None,
        also: Callable[[ShardState], None] | None = None,
    ) -> bool:
        """compare_and_append_batch; False if the append had already happened (token seen).

        ``ready``: the write's prerequisite (see :meth:`Machine.apply`).
        """
        check_ts(expected_upper, "expected_upper")
        check_upper(new_upper, "new_upper")
        if new_upper <= expected_upper:
            raise InvalidUsage(f"new_upper {new_upper} must be greater than expected_upper {expected_upper}")
        for b in batches:
            if b.shard_id != self.shard_id:
                raise InvalidUsage(f"batch {b.id} was written for shard {b.shard_id}, not {self.shard_id}")
            if not b.same_schema(self.schema_text):
                raise SchemaMismatch(f"batch {b.id} was written with a different schema than shard {self.shard_id}'s")
            if b.lower < expected_upper or b.upper > new_upper:
                raise InvalidUsage(
                    f"batch {b.id} has bounds [{b.lower}, {b.upper}), outside the append bounds "
                    f"[{expected_upper}, {new_upper}); rewrite its times with Batch.rewrite_ts"
                )
        runs = tuple(r for b in batches for r in b.runs if r.rows)
        digest = hashlib.sha256(f"{expected_upper}:{new_upper}:{','.join(b.id for b in batches)}".encode())
        token = token or digest.hexdigest()[:32]
        lease_ms = int(self.config.writer_lease_s * 1000)

        def transition(s: ShardState) -> tuple[bool, bool]:
            changed = s.register_schema(self.schema_text, self.schema.describe())
            now = self.config.clock_ms()
            if not s.append(self.writer_id, token, runs, expected_upper, new_upper, now, lease_ms):
                return False, changed
            if also is not None:
                also(s)
            return True, True

        appended = self._machine.apply(transition, ready)
        if runs and self.auto_maintain:
            self.maintain()
        return appended

    def close_shard(self) -> None:
        """Advance the upper past every time: the shard takes no more appends."""
        upper = self.fetch_recent_upper()
        if upper < CLOSED:
            self.compare_and_append_batch([], upper, CLOSED)

    # ---- maintenance -----------------------------------------------------------

    def maintain(self) -> None:
        """Compact if the policy asks; delete parts whose grace period passed.

        Best effort: a storage failure here is logged and left for later.
        """
        try:
            if self.config.compaction_enabled:
                self.compact()
            self.collect_garbage()
        except ExternalError as e:
            log.debug("maintenance of %s deferred: %s", self.shard_id, e)
        except CorruptObject as e:
            # SUBTLE: the append that asked for this maintenance has committed;
            # raising would tell the caller it failed. Readers report the damage.
            log.warning("maintenance of %s skipped: %s", self.shard_id, e)

    def compact(self, max_rounds: int = 4) -> int:
        """Run up to ``max_rounds`` compactions the policy asks for. Returns how many applied."""
        with operation("compact"):
            return self._compact(max_rounds)

    def _compact(self, max_rounds: int) -> int:
        applied = 0
        for _ in range(max_rounds):
            state = self._machine.state()
            inputs = state.compaction_request(self.config.compaction_max_bytes)
            if not inputs:
                break
            try:
                merged = self._merge(inputs, state.since)
            except PartRetired:
                break  # a stale cached state named a part compaction retired since: stop for now
            if not apply_merged(self.blob, self._machine, inputs, merged, self.config):
                break
            applied += 1
        return applied

    def _merge(self, inputs: Sequence[HollowBatch], since: int) -> HollowBatch:
        """The inputs merged and consolidated at ``since`` (output parts written, nothing applied).

        A missing input part raises :meth:`ShardView.missing_part`'s verdict:
        ``PartRetired`` (a stale state named it) or ``CorruptObject`` (lost).
        """
        try:
            return merge_batches(
                self.blob,
                self.shard_id,
                self.schema.arrow,
                list(inputs),
                since,
                self.config,
                self.compaction_inline_max_bytes,
            )
        except MissingPart as e:
            raise self.shard.missing_part(e.key) from None

    def apply_merged(self, inputs: Sequence[HollowBatch], runs: tuple[Run, ...], since: int) -> bool:
        """Replace the contiguous batches ``inputs`` by one batch of ``runs`` (merged elsewhere, e.g. by Spark).

        ``runs`` must hold the inputs' updates consolidated at ``since`` (no
        later than the shard's since when the inputs were read). True if it
        applied; False if another compaction replaced an input first (then
        the parts of ``runs`` are deleted and nothing changes).
        """
        merged = HollowBatch(random_hex(), inputs[0].lower, inputs[-1].upper, since, runs)
        with operation("compact"):
            return apply_merged(self.blob, self._machine, inputs, merged, self.config)

    def compact_all(self) -> dict[str, Any]:
        """Merge every batch into one, consolidated at the since.

        At once when the batches fit ``compaction_max_bytes``; else by policy
        rounds. Then collect garbage. Returns ``{"before", "after"}`` counts (batches,
        rows, parts), the ``since`` and whether everything was merged at once.
        A missing input part is ``CorruptObject`` if the shard still references
        it; if another compaction replaced it meanwhile (``PartRetired``: a
        stale plan, not a failure), the merge is planned again on a fresh
        state (:func:`persist.manifest.replan`). A merge that lost its write to
        another compaction (an append's maintenance) is made again from the
        state that won, up to ``REPLAN_ATTEMPTS`` times: that compaction merged
        only some batches, at its own (maybe older) since.
        """
        return replan(self._compact_all)

    def _compact_all(self) -> dict[str, Any]:
        state = self.shard.fetch()
        before = _counts(state)
        merged_all = False
        for attempt in range(1, REPLAN_ATTEMPTS + 1):
            batches = list(state.batches)
            if not (len(batches) >= 2 or (batches and batches[0].since < state.since and batches[0].rows)):
                break
            if sum(b.size for b in batches) > self.config.compaction_max_bytes:
                self.compact(max_rounds=16)
                break
            with operation("compact"):
                merged = self._merge(batches, state.since)
                merged_all = apply_merged(self.blob, self._machine, batches, merged, self.config)
            if merged_all or attempt == REPLAN_ATTEMPTS:
                break
            # another compaction (an append's maintenance, say) replaced some of the inputs first: that one
            # merged at its own since, maybe older than ours, so merge what the shard holds now
            state = self.shard.fetch()
        self.collect_garbage()
        state = self.shard.fetch()
        return {"before": before, "after": _counts(state), "since": state.since, "merged_all": merged_all}

    def garbage_due(self) -> bool:
        """Whether a retired part is past its grace period (by the cached state): something to collect."""
        grace_ms = int(self.config.part_grace_s * 1000)
        return bool(self._machine.state().garbage_due(self.config.clock_ms() - grace_ms))

    def collect_garbage(self) -> int:
        """Delete retired parts older than the grace period; forget them in the state."""
        with operation("collect_garbage"):
            return self._collect_garbage()

    def _collect_garbage(self) -> int:
        if not self.garbage_due():
            return 0
        state = self._machine.state()
        now, grace_ms = self.config.clock_ms(), int(self.config.part_grace_s * 1000)
        horizon = gc_horizon(self.blob, str(self.shard_id), now, grace_ms)  # live part holds may keep some
        due = state.garbage_due(horizon)
        if not due:
            return 0
        note_write()
        for k in due:
            self.blob.delete(k)
            metrics.count(metrics.PARTS_DELETED)
        gone = set(due)

        def transition(s: ShardState) -> tuple[None, bool]:
            return None, s.forget_garbage(gone)

        self._machine.apply(transition)
        return len(due)

    def expire(self) -> None:
        """Drop this writer's registration (its idempotency record)."""

        def transition(s: ShardState) -> tuple[None, bool]:
            return None, s.expire_writer(self.writer_id)

        self._machine.apply(transition)


def _counts(state: ShardState) -> dict[str, int]:
    return {"batches": len(state.batches), "rows": sum(b.rows for b in state.batches), "parts": len(state.part_keys())}


def _delete_quietly(blob: Blob, keys: Iterable[str]) -> None:
    """Delete parts nothing references, best effort: a failure leaks them for ``gc_leaked``.

    (The operation that calls this has its outcome already: a failed
    clean-up must not be reported as its failure.)
    """
    for key in keys:
        try:
            blob.delete(key)
        except ExternalError as e:
            log.debug("deleting unreferenced part %s failed (left for gc_leaked): %s", key, e)
