"""Random ids (shard, batch, writer and reader ids, part and temp-file names) without a system call each.

``uuid.uuid4()`` reads the OS's randomness on every call: a system call that
releases the GIL, so on a busy process each id can cost a wait for the GIL.
:func:`random_hex` hands out the same 128 random bits (``os.urandom``), read
``BULK`` ids at a time.

Invariants:

- Every id is 128 bits of ``os.urandom``, handed out once in this process.
- A forked child never hands out ids its parent read (the child drops the
  ones not handed out yet).
"""

from __future__ import annotations

import os

BULK = 64
"""Ids read from the OS at once."""

_ready: list[str] = []


def random_hex() -> str:
    """32 random lowercase hex digits (128 bits), like ``uuid.uuid4().hex``'s randomness."""
    try:
        return _ready.pop()  # (atomic: threads never get the same one)
    except IndexError:
        hexed = os.urandom(16 * BULK).hex()
        _ready.extend(hexed[i : i + 32] for i in range(32, 32 * BULK, 32))
        return hexed[:32]


def _drop_after_fork() -> None:
    _ready.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_drop_after_fork)


__all__ = ["BULK", "random_hex"]
