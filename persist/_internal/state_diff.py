"""A shard state version written as what changed since the previous one.

A consensus version of a shard holds either its whole state (a *rollup*:
frame version 1 or 2, see :mod:`persist._internal.codec`) or a *diff*
(frame version 3): the fields that changed from version ``seqno - 1``,
plus ``base``, the seqno of the newest rollup at or below it. A small
commit then uploads about what it adds (its batch and new upper), not the
whole state.

A diff's fields (JSON): ``base``; ``since``, ``upper`` and ``walltime_ms``
(always); ``schema`` and ``marks`` whole, when changed; ``writers``,
``leased`` and ``critical`` as ``{"set": {id: value}, "del": [id]}``, when
changed; ``batches`` and ``garbage`` as ``[keep_head, keep_tail, middle]``:
the new list is the old one's first ``keep_head`` items, then ``middle``
(new items, as JSON), then the old one's last ``keep_tail`` items (an
append, an empty append's extension of the last batch, or a compaction's
replacement of a run of batches each change one stretch of the list).

Invariants (kept by :class:`persist._internal.machine.Machine`):

1. Versions ``base .. seqno`` form a chain: ``base`` is a rollup and each
   later one is a diff against the one before it, so reading the state at
   ``seqno`` needs exactly those versions (or the reader's cached state at
   any seqno in ``[base, seqno)`` and the diffs after it).
2. Every version carrying a new truncation mark (``ShardState.marks``) is a
   rollup. Truncation only deletes versions below a mark, so it never
   removes a version that a kept version's chain needs.
3. A chain is at most ``PersistConfig.state_rollup_every`` versions long,
   and its diffs weigh at most twice its rollup: reading a state from
   nothing costs a bounded number of versions and bytes.
4. Applying ``diff(prev, new)`` to ``prev`` gives a state equal to ``new``
   (``tests/persist/test_state_diff.py`` checks it on random transitions).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from persist._internal.codec import DIFF_VERSION, KIND_STATE, frame, unframe_versioned
from persist._internal.state import (
    Chain,
    CriticalReaderState,
    HollowBatch,
    LeasedReaderState,
    ShardState,
    WriterState,
    critical_json,
    leased_json,
    writer_json,
)
from persist.errors import CorruptObject

T = TypeVar("T")


def _list_diff(old: Sequence[T], new: Sequence[T], to_json: Callable[[T], Any]) -> list[Any] | None:
    """``[keep_head, keep_tail, middle]`` turning ``old`` into ``new``; None if they are equal."""
    n_old, n_new = len(old), len(new)
    head = 0
    while head < n_old and head < n_new and (old[head] is new[head] or old[head] == new[head]):
        head += 1
    if head == n_old == n_new:
        return None
    tail = 0
    while (
        tail < n_old - head
        and tail < n_new - head
        and (old[n_old - 1 - tail] is new[n_new - 1 - tail] or old[n_old - 1 - tail] == new[n_new - 1 - tail])
    ):
        tail += 1
    return [head, tail, [to_json(x) for x in new[head : n_new - tail]]]


def _apply_list(old: list[T], d: list[Any], from_json: Callable[[Any], T], where: str) -> list[T]:
    head, tail, middle = d
    if head < 0 or tail < 0 or head + tail > len(old):
        raise CorruptObject(where, f"state diff keeps {head} + {tail} items of a list of {len(old)}")
    return old[:head] + [from_json(x) for x in middle] + old[len(old) - tail :]


def _dict_diff(old: dict[str, T], new: dict[str, T], to_json: Callable[[T], Any]) -> dict[str, Any] | None:
    put = {k: to_json(v) for k, v in new.items() if k not in old or old[k] != v}
    gone = [k for k in old if k not in new]
    if not put and not gone:
        return None
    return {"set": put, "del": gone}


def _apply_dict(old: dict[str, T], d: dict[str, Any], from_json: Callable[[Any], T]) -> dict[str, T]:
    out = {k: v for k, v in old.items() if k not in d["del"]}
    for k, v in d["set"].items():
        out[k] = from_json(v)
    return out


def encode_diff(prev: ShardState, new: ShardState, base: int) -> bytes:
    """The framed diff turning ``prev`` (the previous version's state) into ``new``."""
    j: dict[str, Any] = {"base": base, "since": new.since, "upper": new.upper, "walltime_ms": new.walltime_ms}
    if new.shard_id != prev.shard_id:
        raise ValueError(f"a diff between two shards' states: {prev.shard_id} and {new.shard_id}")
    if new.schema != prev.schema:
        j["schema"] = new.schema
    if new.marks != prev.marks:
        j["marks"] = new.marks
    batches = _list_diff(prev.batches, new.batches, HollowBatch.to_json)
    if batches is not None:
        j["batches"] = batches
    garbage = _list_diff(prev.garbage, new.garbage, list)
    if garbage is not None:
        j["garbage"] = garbage
    for name, to_json in (("writers", writer_json), ("leased", leased_json), ("critical", critical_json)):
        d = _dict_diff(getattr(prev, name), getattr(new, name), to_json)
        if d is not None:
            j[name] = d
    return frame(KIND_STATE, json.dumps(j, separators=(",", ":")).encode(), compress=True, version=DIFF_VERSION)


def diff_base(where: str, payload: bytes) -> tuple[int, dict[str, Any]]:
    """A diff payload's ``base`` and its decoded fields."""
    try:
        j = json.loads(payload)
        return int(j["base"]), j
    except (ValueError, KeyError, TypeError) as e:
        raise CorruptObject(where, f"not a state diff: {e}") from None


def apply_diff(prev: ShardState, j: dict[str, Any], where: str) -> ShardState:
    """The state ``prev`` turned into by the diff fields ``j`` (seqno and chain left to the caller)."""
    try:
        new = prev.clone()
        new.since, new.upper, new.walltime_ms = j["since"], j["upper"], j["walltime_ms"]
        if "schema" in j:
            new.schema = j["schema"]
        if "marks" in j:
            new.marks = [(a, b) for a, b in j["marks"]]
        if "batches" in j:
            new.batches = _apply_list(prev.batches, j["batches"], HollowBatch.from_json, where)
        if "garbage" in j:
            new.garbage = _apply_list(prev.garbage, j["garbage"], lambda g: (g[0], g[1]), where)
        if "writers" in j:
            new.writers = _apply_dict(prev.writers, j["writers"], lambda v: WriterState(*v))
        if "leased" in j:
            new.leased = _apply_dict(prev.leased, j["leased"], lambda v: LeasedReaderState(*v))
        if "critical" in j:
            new.critical = _apply_dict(prev.critical, j["critical"], lambda v: CriticalReaderState(*v))
    except (KeyError, TypeError, ValueError) as e:
        raise CorruptObject(where, f"state diff does not apply: {e!r}") from None
    return new


def read_version(where: str, data: bytes, seqno: int, prev: ShardState | None) -> tuple[ShardState | None, int]:
    """The state at ``seqno`` from that version's bytes (a rollup on its own, a diff on ``prev``), and its base.

    ``prev``: the state at ``seqno - 1`` (or anything: it is only used when
    it is that one). The state is None when the version is a diff and
    ``prev`` is not its previous version: the caller reads from the base.
    """
    version, payload = unframe_versioned(where, data, KIND_STATE)
    if version != DIFF_VERSION:
        return ShardState.from_payload(where, payload, seqno, len(data)), seqno
    base, j = diff_base(where, payload)
    if prev is None or prev.seqno != seqno - 1:
        return None, base
    new = apply_diff(prev, j, where)
    new.seqno = seqno
    chain = prev.chain
    if chain is None or chain.base != base:
        chain = Chain(base, 0, 0, 0)  # (unknown weight: the next write is a rollup)
    new.chain = chain.extended(len(data))
    return new, base


def encode_version(prev: ShardState, new: ShardState, seqno: int, rollup_every: int) -> tuple[bytes, Chain]:
    """The bytes to write as version ``seqno`` (``new``, replacing ``prev`` at ``seqno - 1``), and its chain.

    A rollup when ``prev`` is not known to be ``seqno - 1`` with a known
    chain, when the version adds a truncation mark (invariant 2), or when
    the chain is due one (invariant 3); a diff otherwise.
    """
    chain = prev.chain
    marked = bool(new.marks) and new.marks[-1][0] == seqno
    if rollup_every > 1 and chain is not None and prev.seqno == seqno - 1 and not marked:
        diff = encode_diff(prev, new, chain.base)
        if not chain.wants_rollup(len(diff), rollup_every):
            return diff, chain.extended(len(diff))
    data = new.encode()
    return data, Chain(seqno, 0, 0, len(data))
