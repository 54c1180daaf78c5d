"""What the chaos run's side processes share: the long-lived readers and the maintainer.

- :mod:`tests.chaos.reader`: one txns handle kept open for the whole run,
  reading both data shards at the latest time and at older ones; every read
  is recorded for the verifier, which checks it against the history.
- :mod:`tests.chaos.maint`: compaction (``compact_txns``: the txns since,
  then every data shard merged) and garbage collection (``collect_garbage``:
  retired parts, old consensus versions, leaked parts) in a loop, with the
  workers' persist config (so in the ``tight`` variant parts are deleted a
  second after retirement and versions truncated after 4 s).

Each writes a stats file (``<name>.<incarnation>.stats.json``: counters,
exceptions by kind, violations, and :mod:`persist.metrics`) at most once a
second and at exit, and stops when the driver goes away.
"""

from __future__ import annotations

import json
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from persist import metrics

MAX_EXAMPLES = 50


@dataclass
class SideStats:
    name: str
    incarnation: int
    counts: dict[str, int] = field(default_factory=dict)
    exceptions: dict[str, int] = field(default_factory=dict)
    violations: dict[str, int] = field(default_factory=dict)
    violation_examples: list[str] = field(default_factory=list)
    persist: dict[str, int] = field(default_factory=dict)

    def bump(self, key: str, n: int = 1) -> None:
        self.counts[key] = self.counts.get(key, 0) + n

    def exception(self, phase: str, e: BaseException) -> None:
        key = f"{phase}:{type(e).__name__}"
        self.exceptions[key] = self.exceptions.get(key, 0) + 1

    def violation(self, kind: str, detail: str) -> None:
        self.violations[kind] = self.violations.get(kind, 0) + 1
        if len(self.violation_examples) < MAX_EXAMPLES:
            self.violation_examples.append(f"{kind}: {detail}"[:2000])
        print(f"VIOLATION {kind}: {detail}", file=sys.stderr, flush=True)


class Side:
    """A side process's stats file and its check that the driver is still there."""

    def __init__(self, state_dir: Path, name: str, incarnation: int) -> None:
        self.stats = SideStats(name, incarnation)
        self.path = state_dir / f"{name}.{incarnation}.stats.json"
        self.parent = os.getppid()
        self._last = 0.0

    def orphaned(self) -> bool:
        return os.getppid() != self.parent

    def save(self, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self._last < 1.0:
            return
        self._last = now
        self.stats.persist = metrics.snapshot()
        tmp = self.path.with_name(self.path.name + ".tmp")
        tmp.write_text(json.dumps(self.stats.__dict__, sort_keys=True))
        os.replace(tmp, self.path)


def read_stats(state_dir: Path, pattern: str) -> list[dict[str, Any]]:
    out = []
    for p in sorted(state_dir.glob(pattern)):
        try:
            out.append(json.loads(p.read_text()))
        except (OSError, ValueError):
            continue
    return out
