"""Every tunable of persist, in one place."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass
class PersistConfig:
    """Tunables. The defaults suit object storage; tests shrink them.

    - ``part_target_bytes``: a batch builder flushes a Parquet part when its
      buffered rows reach this many (Arrow) bytes. Memory for a write of any
      size is bounded independently of its size: a flush holds the buffered
      rows and their sorted copy, and each in-flight upload its sorted table
      and encoded Parquet, so roughly ``part_target_bytes * (3 + 2 *
      upload_parallelism)`` at worst; measured 4.9x the part size at 64 MiB
      parts (benchmarks/README.md).
    - ``inline_max_bytes``: batches whose encoded rows are smaller than this
      live inline in the shard state, with no part at all.
    - ``compaction_max_bytes``: in-process compaction merges at most this many
      bytes of parts at once (bigger merges are for the Spark compaction job).
    - ``consensus_retention_s``: consensus versions younger than this are never
      truncated, and a handle re-reads the head before a compare-and-set whose
      expectation is older than half of it (see docs/storage.md, "Consensus truncation").
    - ``part_grace_s``: parts replaced by compaction are deleted this long
      after, so reads planned against an older state can finish.
    - ``read_wait_s``: how long a read waits for the upper to pass its as_of.
    - ``reader_lease_s``: a leased reader's hold lapses this long after its
      last renewal (reads renew it once a quarter of it has passed). It bounds
      how long a killed process holds back compaction: 2 minutes by default.
    - ``retry_deadline_s``: how long an operation retries storage failures.
    - ``state_rollup_every``: a state version is written as a diff against
      the previous one, and as the whole state (a rollup) at least once in
      this many versions (and whenever its diffs since the last rollup would
      outweigh two rollups), so a reader starting from nothing reads at most
      this many versions. 1: every version whole (no diffs).
    """

    part_target_bytes: int = 64 << 20
    upload_parallelism: int = 4
    inline_max_bytes: int = 4096
    compaction_enabled: bool = True
    compaction_max_bytes: int = 64 << 20
    part_grace_s: float = 300.0
    consensus_retention_s: float = 600.0
    gc_every_versions: int = 32
    reader_lease_s: float = 120.0
    writer_lease_s: float = 3600.0
    read_wait_s: float = 10.0
    retry_deadline_s: float = 30.0
    state_rollup_every: int = 16
    clock_ms: Callable[[], int] = field(default=lambda: int(time.time() * 1000))
