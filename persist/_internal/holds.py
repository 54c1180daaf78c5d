"""Part holds: a planned read's promise that the parts it names outlive compaction for a while.

A read planned now (a Spark DataFrame, for instance) names parts that
compaction may retire before the read runs. Retired parts are deleted
``part_grace_s`` after retirement; a read that starts later than that fails
with ``PartRetired`` and must be planned again. A *hold* stretches this for
one shard without blocking compaction: merging goes on as before, only the
deletion of the parts retired while the hold lives waits.

A hold is an empty blob object ``{shard}/holds/{created_ms}-{expires_ms}-{uuid}``
(times in ms since the epoch, zero-padded to 13 digits). Invariant kept by
garbage collection (:func:`gc_horizon`): a part retired at or after
``created_ms - part_grace_s`` is not deleted before the hold expires. So a
read planned after its hold was written (against a state at most
``part_grace_s`` old) reads every part it names until ``expires_ms``. An
expired hold is deleted by the next garbage collection that lists it; one
whose reader finished early may be released at once.

Costs: one PUT per hold; garbage collection LISTs the shard's holds only
when it has parts due for deletion.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass

from persist.location import Blob


@dataclass(frozen=True)
class PartHold:
    """A hold on a shard's retired parts until ``expires_ms`` (see the module doc)."""

    key: str
    created_ms: int
    expires_ms: int

    def release(self, blob: Blob) -> None:
        """End the hold now (the read that needed it is done)."""
        blob.delete(self.key)


def hold_key(shard_id: str, created_ms: int, expires_ms: int) -> str:
    return f"{shard_id}/holds/{created_ms:013d}-{expires_ms:013d}-{uuid.uuid4().hex}"


def parse_hold(key: str) -> tuple[int, int] | None:
    """``(created_ms, expires_ms)`` of a hold key, or None for another object."""
    parts = key.rsplit("/", 1)[-1].split("-")
    if len(parts) != 3 or not all(p.isascii() and p.isdigit() for p in parts[:2]):
        return None
    return int(parts[0]), int(parts[1])


def hold(blob: Blob, shard_id: str, for_s: float, now_ms: int | None = None) -> PartHold:
    """Write a hold on ``shard_id``'s retired parts for ``for_s`` seconds from now."""
    now = int(time.time() * 1000) if now_ms is None else now_ms
    expires = now + int(for_s * 1000)
    key = hold_key(shard_id, now, expires)
    blob.set(key, b"")
    return PartHold(key, now, expires)


def gc_horizon(blob: Blob, shard_id: str, now_ms: int, grace_ms: int) -> int:
    """Retired parts retired at or before the returned time may be deleted now.

    ``now - grace`` unless a live hold asks for more: then the earliest live
    hold's ``created_ms - grace``. Expired holds are deleted on the way.
    """
    horizon = now_ms - grace_ms
    for key in list(blob.list_keys(f"{shard_id}/holds/")):
        times = parse_hold(key)
        if times is None:
            continue
        created, expires = times
        if expires <= now_ms:
            blob.delete(key)
        else:
            horizon = min(horizon, created - grace_ms - 1)
    return horizon


__all__ = ["PartHold", "gc_horizon", "hold", "parse_hold"]
