"""The state of one shard, and the pure transitions on it.

Every change of a state is a named method of :class:`ShardState` below (the
handles in ``persist.client``, ``persist.read`` and ``persist.write`` only
call them inside a compare-and-set), and :meth:`ShardState.check` asserts
every invariant on each new version before it is written.

Invariants:

1. ``batches`` tile ``[lower of the first, upper)`` with no gaps or overlaps:
   ``batches[i].upper == batches[i+1].lower``, each ``lower < upper``, and the
   last upper is ``upper``. Every update in a batch has its (rewritten) time
   in ``[lower, upper)`` of that batch, except that times below the batch's
   ``since`` may have been advanced to it by compaction.
2. ``upper`` only advances. ``since`` only advances, and
   ``since = max(old since, min(holds))`` where the holds are every unexpired
   leased reader's since and every critical reader's since (so no hold is
   below the since, and ``since >= min(holds)``).
3. Reading at any ``as_of`` with ``since <= as_of < upper`` gives the same
   consolidated result before and after any compaction. Its structural half
   is checked: a batch's ``since`` (the time its rows were consolidated at)
   is never past the shard's ``since``, and a compacted batch covers exactly
   the interval of the batches it replaced (``apply_compaction``).
4. A writer's ``token`` names its most recent successful append, so a retry of
   that append (after an indeterminate failure) is recognised and not applied twice.
5. Only the first batch may be empty: an empty append extends the last batch
   (or a non-empty append absorbs a trailing empty batch), so empty time
   costs no state.
"""

from __future__ import annotations

import itertools
import json
from dataclasses import dataclass, field, replace
from itertools import pairwise
from typing import Any

from persist._internal.codec import DIFF_VERSION, KIND_STATE, frame, unframe_versioned
from persist._internal.ids import random_hex
from persist._internal.parts import Run, runs_rows, runs_size
from persist.errors import CorruptObject, InvalidUsage, SchemaMismatch, UpperMismatch
from persist.schema import CLOSED

TOMBSTONE = CLOSED
"""A tombstoned shard's since and upper (``persist.CLOSED``): past every time."""


@dataclass(frozen=True)
class HollowBatch:
    """A batch as the state knows it: time bounds and where its rows are."""

    id: str
    lower: int
    upper: int
    since: int
    runs: tuple[Run, ...] = ()

    @property
    def rows(self) -> int:
        return runs_rows(self.runs)

    @property
    def size(self) -> int:
        return runs_size(self.runs)

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "lower": self.lower,
            "upper": self.upper,
            "since": self.since,
            "runs": [r.to_json() for r in self.runs],
        }

    @staticmethod
    def from_json(j: dict[str, Any]) -> HollowBatch:
        return HollowBatch(j["id"], j["lower"], j["upper"], j["since"], tuple(Run.from_json(r) for r in j["runs"]))


@dataclass(frozen=True)
class Chain:
    """Where a state version sits in its chain of diffs (see :mod:`persist._internal.state_diff`).

    Not stored: derived when a version is read or written. ``base``: the
    seqno of the chain's rollup; ``diffs``: how many diffs follow it up to
    this version; ``diff_bytes``: their framed size; ``rollup_bytes``: the
    rollup's framed size.
    """

    base: int
    diffs: int
    diff_bytes: int
    rollup_bytes: int

    def extended(self, diff_bytes: int) -> Chain:
        return Chain(self.base, self.diffs + 1, self.diff_bytes + diff_bytes, self.rollup_bytes)

    def wants_rollup(self, next_diff_bytes: int, rollup_every: int) -> bool:
        """Whether the next version should be a rollup: the chain is long, or its diffs outweigh two rollups."""
        return self.diffs + 1 >= rollup_every or self.diff_bytes + next_diff_bytes > 2 * self.rollup_bytes


@dataclass(frozen=True)
class WriterState:
    heartbeat_ms: int
    lease_ms: int
    token: str


@dataclass(frozen=True)
class LeasedReaderState:
    since: int
    heartbeat_ms: int
    lease_ms: int


@dataclass(frozen=True)
class CriticalReaderState:
    since: int
    opaque: int


def writer_json(w: WriterState) -> list[Any]:
    return [w.heartbeat_ms, w.lease_ms, w.token]


def leased_json(r: LeasedReaderState) -> list[Any]:
    return [r.since, r.heartbeat_ms, r.lease_ms]


def critical_json(r: CriticalReaderState) -> list[Any]:
    return [r.since, r.opaque]


@dataclass
class ShardState:
    """Everything the consensus log stores about one shard, one version at a time."""

    shard_id: str
    #: The schema's text. Invariant: set once (``register_schema``), never changed.
    schema: str | None = None
    #: Times below it may have been merged. Invariant (2): only advances; at least the least hold.
    since: int = 0
    #: Every update has a time below it. Invariant (2): only advances.
    upper: int = 0
    #: Invariant (1): tile ``[lower, upper)``; (3): none consolidated past ``since``; (5): only the first empty.
    batches: list[HollowBatch] = field(default_factory=list)
    #: writer id -> lease and the token of its last append. Invariant (4): the token names that append.
    writers: dict[str, WriterState] = field(default_factory=dict)
    #: Leased readers' holds. Invariant: expired leases are dropped on the next write (``maintain``).
    leased: dict[str, LeasedReaderState] = field(default_factory=dict)
    #: Critical readers' holds. Invariant: a hold only advances, and only by its opaque token.
    critical: dict[str, CriticalReaderState] = field(default_factory=dict)
    #: The writer's clock at this version's write.
    walltime_ms: int = 0
    #: (seqno, wall ms) truncation marks. Invariant: seqnos and times increase; old ones thinned.
    marks: list[tuple[int, int]] = field(default_factory=list)
    #: (part key, retired at ms). Invariant: no key here is referenced by ``batches``.
    garbage: list[tuple[str, int]] = field(default_factory=list)
    #: The consensus seqno this version was read at (not serialized).
    seqno: int | None = None
    #: Where this version sits in its chain of diffs (not serialized; None: unknown, so the next write is a rollup).
    chain: Chain | None = field(default=None, compare=False)

    # ---- encoding -------------------------------------------------------------

    def to_json(self) -> dict[str, Any]:
        return {
            "shard_id": self.shard_id,
            "schema": self.schema,
            "since": self.since,
            "upper": self.upper,
            "batches": [b.to_json() for b in self.batches],
            "writers": {k: writer_json(w) for k, w in self.writers.items()},
            "leased": {k: leased_json(r) for k, r in self.leased.items()},
            "critical": {k: critical_json(r) for k, r in self.critical.items()},
            "walltime_ms": self.walltime_ms,
            "marks": self.marks,
            "garbage": self.garbage,
        }

    def encode(self) -> bytes:
        """This whole state, framed (a rollup; see :mod:`persist._internal.state_diff` for diffs)."""
        return frame(KIND_STATE, json.dumps(self.to_json(), separators=(",", ":")).encode(), compress=True)

    @staticmethod
    def from_json(j: dict[str, Any], seqno: int | None) -> ShardState:
        return ShardState(
            shard_id=j["shard_id"],
            schema=j["schema"],
            since=j["since"],
            upper=j["upper"],
            batches=[HollowBatch.from_json(b) for b in j["batches"]],
            writers={k: WriterState(*v) for k, v in j["writers"].items()},
            leased={k: LeasedReaderState(*v) for k, v in j["leased"].items()},
            critical={k: CriticalReaderState(*v) for k, v in j["critical"].items()},
            walltime_ms=j["walltime_ms"],
            marks=[(a, b) for a, b in j["marks"]],
            garbage=[(a, b) for a, b in j["garbage"]],
            seqno=seqno,
        )

    @staticmethod
    def decode(key: str, data: bytes, seqno: int) -> ShardState:
        """A whole state (a rollup) from its framed bytes. CorruptObject for anything else (a diff included)."""
        version, payload = unframe_versioned(key, data, KIND_STATE)
        if version == DIFF_VERSION:
            raise CorruptObject(key, "a state diff where a whole state was expected")
        return ShardState.from_payload(key, payload, seqno, len(data))

    @staticmethod
    def from_payload(key: str, payload: bytes, seqno: int, framed_size: int) -> ShardState:
        """A whole state from its unframed JSON (``framed_size``: the bytes it was read from)."""
        try:
            state = ShardState.from_json(json.loads(payload), seqno)
        except (ValueError, KeyError, TypeError) as e:
            raise CorruptObject(key, f"not a shard state: {e!r}") from None
        state.chain = Chain(seqno, 0, 0, framed_size)
        return state

    def clone(self) -> ShardState:
        return replace(
            self,
            batches=list(self.batches),
            writers=dict(self.writers),
            leased=dict(self.leased),
            critical=dict(self.critical),
            marks=list(self.marks),
            garbage=list(self.garbage),
        )

    # ---- invariants -----------------------------------------------------------

    def check(self, prev: ShardState | None = None) -> None:
        """Raise AssertionError if an invariant is broken (a bug, never bad input).

        ``prev``: the version this one replaces, for the invariants about change (2).
        """
        # (1) the batches tile [lower, upper)
        for a, b in pairwise(self.batches):
            assert a.upper == b.lower, f"batches not contiguous: {a.upper} != {b.lower}"
        for b in self.batches:
            assert b.lower < b.upper, f"batch {b.id} has an empty interval [{b.lower}, {b.upper})"
        if self.batches:
            assert self.batches[-1].upper == self.upper, "last batch upper != shard upper"
        # (2) since and upper only advance; the since is at least the least hold
        if prev is not None:
            assert self.upper >= prev.upper, f"upper went back: {prev.upper} -> {self.upper}"
            assert self.since >= prev.since, f"since went back: {prev.since} -> {self.since}"
        holds = [r.since for r in self.leased.values()] + [r.since for r in self.critical.values()]
        assert not holds or self.since >= min(holds), f"since {self.since} is below every hold {sorted(holds)}"
        # (3) structural half: no batch was consolidated past the shard's since
        for b in self.batches:
            assert b.since <= self.since, f"batch {b.id} since {b.since} is past the shard since {self.since}"
        # (4) a writer's token names an append
        for wid, w in self.writers.items():
            assert w.token, f"writer {wid} has no token"
        # (5) only the first batch may be empty
        for b in self.batches[1:]:
            assert b.rows > 0, "an empty batch after the first"
        # (fields) retired parts are referenced by no batch; truncation marks increase
        live = self.part_keys()
        assert not any(k in live for k, _ in self.garbage), "a retired part is still referenced"
        for m, n in itertools.pairwise(self.marks):
            assert m[0] < n[0] and m[1] <= n[1], f"truncation marks out of order: {m} then {n}"

    @property
    def lower(self) -> int:
        return self.batches[0].lower if self.batches else self.upper

    # ---- maintenance done on every write ---------------------------------------

    def maintain(self, now_ms: int, seqno: int, mark_every_ms: int) -> None:
        """Expire leases, recompute the since, stamp the time, keep truncation marks."""
        self.leased = {k: r for k, r in self.leased.items() if r.heartbeat_ms + r.lease_ms > now_ms}
        self.writers = {k: w for k, w in self.writers.items() if w.heartbeat_ms + w.lease_ms > now_ms}
        self.recompute_since()
        self.walltime_ms = now_ms
        if not self.marks or now_ms - self.marks[-1][1] >= mark_every_ms:
            self.marks.append((seqno, now_ms))
            # Keep every mark younger than 4 spacings, plus the newest older one.
            old = [m for m in self.marks if now_ms - m[1] >= 4 * mark_every_ms]
            young = [m for m in self.marks if now_ms - m[1] < 4 * mark_every_ms]
            self.marks = old[-2:] + young

    def recompute_since(self) -> None:
        holds = [r.since for r in self.leased.values()] + [r.since for r in self.critical.values()]
        if holds:
            self.since = max(self.since, min(holds))

    # ---- transitions ----------------------------------------------------------

    def register_schema(self, schema_text: str, describe: str) -> bool:
        """Set the schema if unset; SchemaMismatch if it differs. True if changed."""
        if self.schema is None:
            self.schema = schema_text
            return True
        if self.schema != schema_text:
            from persist.schema import Schema

            raise SchemaMismatch(
                f"shard {self.shard_id} has schema {Schema.from_text(self.schema).describe()}, "
                f"but the handle was opened with {describe}; open it with the shard's schema"
            )
        return False

    def append(
        self,
        writer_id: str,
        token: str,
        runs: tuple[Run, ...],
        expected_upper: int,
        new_upper: int,
        now_ms: int,
        lease_ms: int,
    ) -> bool:
        """Append ``runs`` as ``[expected_upper, new_upper)``.

        Returns False (nothing to write) if this exact append already
        happened; raises UpperMismatch if the upper is not ``expected_upper``.
        """
        w = self.writers.get(writer_id)
        if w is not None and w.token == token:
            return False
        if self.upper != expected_upper:
            raise UpperMismatch(expected_upper, self.upper)
        if new_upper <= expected_upper:
            raise InvalidUsage(f"new upper {new_upper} must be greater than expected upper {expected_upper}")
        rows = sum(r.rows for r in runs)
        if rows == 0 and self.batches:
            last = self.batches[-1]
            self.batches[-1] = replace(last, upper=new_upper)
        elif rows > 0 and self.batches and self.batches[-1].rows == 0:
            last = self.batches[-1]
            self.batches[-1] = HollowBatch(random_hex(), last.lower, new_upper, self.since, runs)
        else:
            runs = runs if rows else ()
            self.batches.append(HollowBatch(random_hex(), expected_upper, new_upper, self.since, runs))
        self.upper = new_upper
        self.writers[writer_id] = WriterState(now_ms, lease_ms, token)
        return True

    def add_leased_reader(self, reader_id: str, now_ms: int, lease_ms: int) -> int:
        """Register leased reader ``reader_id`` holding the current since; returns that since."""
        self.leased[reader_id] = LeasedReaderState(self.since, now_ms, lease_ms)
        return self.since

    def renew_leased_reader(self, reader_id: str, now_ms: int, lease_ms: int, since: int | None = None) -> int:
        """Renew ``reader_id``'s lease and advance its hold to ``since`` (never back). Returns the hold.

        The reader must be registered (callers check liveness first).
        """
        r = self.leased[reader_id]
        held = r.since if since is None else max(r.since, since)
        self.leased[reader_id] = LeasedReaderState(held, now_ms, lease_ms)
        return held

    def expire_leased_reader(self, reader_id: str) -> bool:
        """Drop leased reader ``reader_id``'s hold. False if it had none."""
        return self.leased.pop(reader_id, None) is not None

    def register_critical_reader(self, reader_id: str, opaque: int) -> tuple[CriticalReaderState, bool]:
        """Critical reader ``reader_id``, and whether it was new (then registered at the current since with
        ``opaque``)."""
        cur = self.critical.get(reader_id)
        if cur is not None:
            return cur, False
        self.critical[reader_id] = CriticalReaderState(self.since, opaque)
        return self.critical[reader_id], True

    def downgrade_critical_reader(
        self, reader_id: str, expected_opaque: int, new_opaque: int, new_since: int
    ) -> tuple[bool, CriticalReaderState, bool]:
        """If ``reader_id``'s opaque is ``expected_opaque``: set ``new_opaque``, advance its since (never back).

        Returns (whether the opaque matched, the reader's state now, whether anything changed).
        """
        cur = self.critical.get(reader_id)
        if cur is None:
            raise InvalidUsage(f"critical reader {reader_id} is not registered on shard {self.shard_id}")
        if cur.opaque != expected_opaque:
            return False, cur, False
        since = max(cur.since, new_since)
        if since == cur.since and new_opaque == cur.opaque:
            return True, cur, False
        self.critical[reader_id] = CriticalReaderState(since, new_opaque)
        return True, self.critical[reader_id], True

    def expire_writer(self, writer_id: str) -> bool:
        """Drop writer ``writer_id``'s registration (its idempotency record). False if it had none."""
        return self.writers.pop(writer_id, None) is not None

    def forget_garbage(self, deleted: set[str]) -> bool:
        """Forget retired parts whose blobs were ``deleted``. False if none was listed."""
        before = len(self.garbage)
        self.garbage = [(k, at) for k, at in self.garbage if k not in deleted]
        return len(self.garbage) != before

    def last_token(self, writer_id: str) -> str | None:
        """The token of writer ``writer_id``'s most recent append, if it is registered."""
        w = self.writers.get(writer_id)
        return None if w is None else w.token

    def tombstone(self, now_ms: int) -> bool:
        """Retire the whole shard: ``since`` and ``upper`` past every time, no holds, no batches.

        Every part becomes garbage (deleted after the grace period, like a
        compaction's inputs). Nothing can be read or appended afterwards.
        False if the shard is a tombstone already.
        """
        if self.is_tombstone:
            return False
        keys = self.part_keys()
        self.garbage.extend((k, now_ms) for k in sorted(keys))
        self.batches = []
        self.leased, self.critical, self.writers = {}, {}, {}
        self.since = self.upper = TOMBSTONE
        return True

    @property
    def is_tombstone(self) -> bool:
        return self.since == TOMBSTONE and self.upper == TOMBSTONE and not self.batches

    def part_keys(self) -> set[str]:
        return {p.key for b in self.batches for r in b.runs for p in r.parts}

    def apply_compaction(self, ids: list[str], merged: HollowBatch, now_ms: int) -> bool:
        """Replace the contiguous batches ``ids`` with ``merged``. False if gone.

        The replaced batches' parts become garbage: deleted after a grace
        period, so readers that planned with an older state can finish.
        """
        pos = [i for i, b in enumerate(self.batches) if b.id in ids]
        if not pos or len(pos) != len(ids) or pos != list(range(pos[0], pos[0] + len(ids))):
            return False
        old_keys = {p.key for i in pos for r in self.batches[i].runs for p in r.parts}
        first, last = self.batches[pos[0]], self.batches[pos[-1]]
        merged = replace(merged, lower=first.lower, upper=last.upper)
        if merged.rows == 0 and pos[0] > 0:
            # an empty result folds into its predecessor (invariant 5)
            prev = self.batches[pos[0] - 1]
            self.batches[pos[0] - 1 : pos[-1] + 1] = [replace(prev, upper=merged.upper)]
        elif merged.rows == 0 and pos[-1] + 1 < len(self.batches):
            nxt = self.batches[pos[-1] + 1]
            self.batches[pos[0] : pos[-1] + 2] = [replace(nxt, lower=merged.lower)]
        else:
            self.batches[pos[0] : pos[-1] + 1] = [merged]
        live = self.part_keys()
        self.garbage.extend((k, now_ms) for k in sorted(old_keys - live))
        return True

    def garbage_due(self, retired_by_ms: int) -> list[str]:
        """The retired parts retired at or before ``retired_by_ms``."""
        return [k for k, at in self.garbage if at <= retired_by_ms]

    def compaction_request(self, max_bytes: int) -> list[HollowBatch] | None:
        """The tail of batches a size-tiered policy wants merged, if any.

        Walking back from the newest batch, include the previous batch while
        it holds at most twice the rows gathered so far (and the total stays
        under ``max_bytes``). This keeps O(log n) batches, and since every
        merge consolidates at the shard's since, updates and their later
        retractions cancel once a merge covers both with the since past them.
        """
        bs = self.batches
        if len(bs) < 2:
            return None
        j = len(bs) - 1
        rows, size = bs[j].rows, bs[j].size
        while j > 0 and bs[j - 1].rows <= 2 * rows and size + bs[j - 1].size <= max_bytes:
            j -= 1
            rows += bs[j].rows
            size += bs[j].size
        if j < len(bs) - 1:
            return bs[j:]
        return None
