"""A checker for reads of one table against the history of its commits (issue #25: long-lived readers).

The model
---------
One table of rows ``(id, v)``; transactions only insert rows and delete
rows (by key) that exist. A :class:`Commit` is one committed transaction:
its commit timestamp ``ts`` (from ``db.history()``, cross-checked with what
the writer was told), the rows it added and deleted, and its real-time
interval (``invoke``: before the writer called ``db.run``; ``complete``:
after it returned, None when the writer never heard, e.g. it was killed).
Several transactions may share one ``ts`` (a group commit). The table at
``ts`` is the fold of every commit at or below ``ts``; the distinct
commit times ``t1 < t2 < ...`` give the states ``S0`` (empty), ``S1``, ...

A :class:`TableRead` is one read by a reader: ``latest`` (``as_of`` None)
or ``as_of`` a timestamp, its real-time interval ``[start, end]``
(``time.monotonic()``, one clock for every process on one Linux box), and
what it returned: the row count and a multiset digest (the sum of a
64-bit hash of each row, mod 2**64; :func:`digest`), plus the rows
themselves when few (for the report). Comparing digests compares
multisets of rows (up to a 64-bit hash collision).

What :func:`check_reads` requires (strict serializability of reads):

- a read ``as_of`` T equals exactly the state at T (``S_i``, ``t_i <= T <
  t_{i+1}``);
- a latest read equals some ``S_i`` with ``lo <= i <= hi``: ``lo`` is the
  newest state that includes every commit acknowledged before the read
  started (it must see them), ``hi`` the last state before any commit that
  was invoked after the read ended (it cannot see them).

Anomalies, by name: ``never-existed`` (the rows are no state of the table
at any time: a read mixing states), ``stale`` (a state older than ``lo``),
``future`` (a state newer than ``hi``), ``wrong-as-of`` (an ``as_of`` read
equal to a state at another time). The report names the read, its window
and, when the rows were recorded, the ids missing and extra against the
nearest allowed state.
"""

from __future__ import annotations

import bisect
import hashlib
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

MASK = (1 << 64) - 1
READ_ANOMALIES = ("never-existed", "stale", "future", "wrong-as-of")

Row = tuple[str, int]


def row_hash(row: Row) -> int:
    """A 64-bit hash of one row ``(id, v)``."""
    return int.from_bytes(hashlib.blake2b(f"{row[0]}\x00{row[1]}".encode(), digest_size=8).digest(), "big")


def digest(rows: Iterable[Row]) -> tuple[int, int]:
    """``(count, multiset digest)`` of ``rows``."""
    n, h = 0, 0
    for r in rows:
        n += 1
        h = (h + row_hash(r)) & MASK
    return n, h


@dataclass(frozen=True)
class Commit:
    """One committed transaction (see the module doc)."""

    op: str
    ts: int
    added: tuple[Row, ...]
    deleted: tuple[Row, ...]
    invoke: float
    complete: float | None


@dataclass(frozen=True)
class TableRead:
    """One read of the table (see the module doc)."""

    id: str
    process: str
    as_of: int | None
    start: float
    end: float
    count: int
    digest: int
    rows: tuple[Row, ...] | None = None


@dataclass
class ReadResult:
    """What :func:`check_reads` found."""

    anomalies: dict[str, list[str]] = field(default_factory=dict)
    by_process: dict[str, Counter[str]] = field(default_factory=lambda: defaultdict(Counter))
    reads: dict[str, int] = field(default_factory=dict)
    states: int = 0

    @property
    def valid(self) -> bool:
        return not self.anomalies

    def add(self, name: str, read: TableRead, text: str) -> None:
        self.anomalies.setdefault(name, []).append(f"{read.id}@{read.process}: {text}")
        self.by_process[read.process][name] += 1

    def summary(self, limit: int = 3) -> str:
        head = f"{'valid' if self.valid else 'INVALID'}: reads {self.reads}, {self.states} states"
        lines = [head]
        for name in sorted(self.anomalies):
            found = self.anomalies[name]
            lines.append(f"{name}: {len(found)}")
            lines.extend(f"  - {t}" for t in found[:limit])
        return "\n".join(lines)


class _States:
    """The table's states in commit-time order: counts, digests and (lazily) rows."""

    def __init__(self, commits: Sequence[Commit]) -> None:
        by_ts: dict[int, list[Commit]] = defaultdict(list)
        for c in commits:
            by_ts[c.ts].append(c)
        self.times = sorted(by_ts)
        self.groups = [by_ts[t] for t in self.times]
        self.count = [0]
        self.digest = [0]
        n, h = 0, 0
        for group in self.groups:
            for c in group:
                n += len(c.added) - len(c.deleted)
                h = (h + sum(map(row_hash, c.added)) - sum(map(row_hash, c.deleted))) & MASK
            self.count.append(n)
            self.digest.append(h)

    def at(self, ts: int) -> int:
        """The index of the state at ``ts`` (0: before every commit)."""
        return bisect.bisect_right(self.times, ts)

    def matches(self, i: int, read: TableRead) -> bool:
        return self.count[i] == read.count and self.digest[i] == read.digest

    def rows(self, i: int) -> Counter[Row]:
        out: Counter[Row] = Counter()
        for group in self.groups[:i]:
            for c in group:
                out.update(c.added)
                out.subtract(c.deleted)
        return +out

    def find(self, read: TableRead) -> list[int]:
        return [i for i in range(len(self.count)) if self.matches(i, read)]


class _Windows:
    """``(lo, hi)`` of latest reads (see the module doc), by bisection over the commits' real times."""

    def __init__(self, states: _States, commits: Sequence[Commit]) -> None:
        done = sorted((c.complete, states.at(c.ts)) for c in commits if c.complete is not None)
        self.done_at = [t for t, _ in done]
        self.lo: list[int] = []  # lo[k]: the newest state among the first k acknowledged commits
        best = 0
        for _, i in done:
            best = max(best, i)
            self.lo.append(best)
        begun = sorted((c.invoke, states.at(c.ts)) for c in commits)
        self.begun_at = [t for t, _ in begun]
        self.hi = [len(states.count) - 1] * (len(begun) + 1)  # hi[k]: before every commit from the k-th invoked on
        for k in range(len(begun) - 1, -1, -1):
            self.hi[k] = min(self.hi[k + 1], begun[k][1] - 1)

    def of(self, read: TableRead) -> tuple[int, int]:
        k = bisect.bisect_left(self.done_at, read.start)  # acknowledged strictly before the start
        lo = self.lo[k - 1] if k else 0
        return lo, self.hi[bisect.bisect_right(self.begun_at, read.end)]  # invoked strictly after the end


def _diff(states: _States, i: int, read: TableRead) -> str:
    if read.rows is None:
        return f"read {read.count} rows; state {i} has {states.count[i]}"
    want, got = states.rows(i), Counter(read.rows)
    missing, extra = want - got, got - want
    return (
        f"read {read.count} rows; against state {i} ({states.count[i]} rows) "
        f"{sum(missing.values())} missing (e.g. {sorted(missing)[:3]}), {sum(extra.values())} extra "
        f"(e.g. {sorted(extra)[:3]})"
    )


def check_reads(commits: Sequence[Commit], reads: Sequence[TableRead]) -> ReadResult:
    """Check every read against the commits (see the module doc)."""
    states = _States(commits)
    windows = _Windows(states, commits)
    res = ReadResult(states=len(states.count))
    kinds: Counter[str] = Counter()
    for r in reads:
        kinds["as_of" if r.as_of is not None else "latest"] += 1
        if r.as_of is not None:
            i = states.at(r.as_of)
            if states.matches(i, r):
                continue
            others = states.find(r)
            if others:
                res.add("wrong-as-of", r, f"as_of {r.as_of} (state {i}) but equal to state(s) {others[:5]}")
            else:
                res.add("never-existed", r, f"as_of {r.as_of}: {_diff(states, i, r)}")
            continue
        lo, hi = windows.of(r)
        if any(states.matches(i, r) for i in range(lo, hi + 1)):
            continue
        found = states.find(r)
        if not found:
            res.add("never-existed", r, f"latest, allowed states {lo}..{hi}: {_diff(states, lo, r)}")
        elif max(found) < lo:
            res.add("stale", r, f"latest, allowed states {lo}..{hi}, equal to older state {max(found)}")
        else:
            res.add("future", r, f"latest, allowed states {lo}..{hi}, equal to newer state {min(found)}")
    res.reads = dict(kinds)
    return res


def rows_of(table: Any) -> list[Row]:
    """The ``(id, v)`` rows of an Arrow table with those columns."""
    return list(zip(table.column("id").to_pylist(), table.column("v").to_pylist(), strict=True))


__all__ = ["READ_ANOMALIES", "Commit", "ReadResult", "TableRead", "check_reads", "digest", "row_hash", "rows_of"]
