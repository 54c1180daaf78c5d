"""A Jepsen/Elle-style checker for list-append transaction histories.

History format
--------------
Every key holds a list of ints. A transaction (:class:`Op`) is a sequence of
micro-ops ("mops"):

- ``("append", key, value)`` appends ``value`` to the list at ``key``; every
  value appended to a key is unique across the whole history (a repeated
  ``(key, value)`` append is a bug in the workload and raises ``ValueError``);
- ``("r", key, values)`` reads the whole list at ``key`` (``values`` is a tuple
  of ints; ``None`` or empty for an empty list).

Keys are any hashable JSON-representable value (``str`` or a tuple of such);
JSON lists are read back as tuples. Each op records the worker that ran it,
real-time ``start``/``end`` (``time.monotonic()``: the same clock in every
process on one Linux box) and a ``status``: ``"ok"`` (committed), ``"fail"``
(definitely not committed) or ``"info"`` (outcome unknown). ``read_ts`` and
``commit_ts`` are informational only and never used for inference. Worker
processes write their ops as JSON lines with :func:`dump_history`;
:func:`load_history` reads them back.

What :func:`check` infers and checks
------------------------------------
*Committed* transactions are the ``ok`` ones plus the ``info`` ones an append
of which is observed by a read of another committed transaction (to a fixed
point); an ``info`` transaction never observed is treated as not committed,
``fail`` ones as aborted. Only committed transactions' reads are evidence.

Per transaction and per read (anomaly names as used in ``Result.anomalies``):

- ``internal``: a read does not reflect the transaction's own earlier appends
  (the last read of the key plus the appends since, or ending with the appends
  since the start), or the version order puts its own appends out of order;
- ``duplicate-elements``: a value appears twice in a read;
- ``garbage-read``: a read holds a value nobody appended;
- ``G1a`` (aborted read): a read holds a value appended by a ``fail``
  transaction;
- ``G1b`` (intermediate read): a read ends with a value whose writer appended
  more to that key later in the same transaction;
- ``incompatible-order``: two reads of a key are not prefixes of one another.

Version order: the longest committed read of a key gives the order of the
values in it; values appended by committed transactions but never read are
after all observed ones, in unknown order. A key whose reads are incompatible
gets no ``ww``/``rw`` edges.

Dependency graph over committed transactions (Adya):

- ``ww``: Ti appended a version of x, Tj appended the next one (skipping
  uncommitted writers); also from the writer of the last observed version to
  every committed writer of a never-observed version (it must come later);
- ``wr``: Tj read (before its own appends) a list ending with Ti's value;
- ``rw``: Ti read (before its own appends) a list whose next version Tj
  appended; if Ti read the last observed (committed) version, to every
  committed writer of a never-observed version;
- ``rt`` (``strict_serializable`` only): Ti -> Tj when Ti ended before Tj
  started, built as a transitive reduction (each op links from the ops that
  completed before it started and are not already covered by a later one);
  an ``info`` transaction's commit may land at any time after its start, so
  it gets no outgoing ``rt`` edges.

Cycles: Tarjan's SCCs of the data graph (ww/wr/rw), then in each SCC short
explicit cycles found by BFS, the weakest kind first, with exact reachability
(SCC condensation with bitset closures) deciding which edges close which kind
of cycle. Each cycle is named by its edges: ``G0`` (ww only), ``G1c`` (ww/wr,
at least one wr), ``G-single`` (exactly one rw), ``G2`` (two or more rw; only
looked for where no G-single is). Under ``strict_serializable`` the SCCs of
the graph with ``rt`` edges are searched too, for cycles that cannot be closed
without ``rt`` edges (with the kinds their name allows), named with the suffix
``-realtime`` (``G0-realtime``, ``G1c-realtime``, ``G-single-realtime``,
``G2-realtime``). Real-time cycles passing through two transactions of one
data SCC are detours around a data cycle already reported and are left out;
they are printed with direct ``rt`` hops (``Ti`` ended before ``Tj`` started)
in place of chains of reduced edges. At most :data:`MAX_CYCLES_PER_KIND`
cycles are printed per kind per SCC. The history is valid iff no anomaly of
any kind is found (every SCC yields at least one reported cycle).
"""

from __future__ import annotations

import json
import os
from collections import defaultdict, deque
from collections.abc import Hashable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from itertools import pairwise
from pathlib import Path
from typing import Any, Literal

Key = Hashable
Mop = tuple[Any, ...]
Level = Literal["serializable", "strict_serializable"]

STATUSES = ("ok", "fail", "info")
LEVELS = ("serializable", "strict_serializable")

# edge kinds, as bits of one mask per ordered pair of transactions
WW, WR, RW, RT = 1, 2, 4, 8
DATA = WW | WR | RW
ALL = DATA | RT
KIND_NAMES = {WW: "ww", WR: "wr", RW: "rw", RT: "rt"}
# when one pair has several kinds, a cycle is labelled with the weakest allowed one
_LABEL_PREFERENCE = (WW, WR, RW, RT)

CYCLE_ANOMALIES = (
    "G0",
    "G1c",
    "G-single",
    "G2",
    "G0-realtime",
    "G1c-realtime",
    "G-single-realtime",
    "G2-realtime",
)
OTHER_ANOMALIES = (
    "internal",
    "duplicate-elements",
    "garbage-read",
    "G1a",
    "G1b",
    "incompatible-order",
)

# explicit cycles reported per anomaly kind per strongly connected component
MAX_CYCLES_PER_KIND = 8
# BFS searches per kind per component (bounds the work on big, badly broken histories)
_MAX_TRIES = 4 * MAX_CYCLES_PER_KIND


# ----------------------------------------------------------------------------
# history records


@dataclass(frozen=True)
class Op:
    """One transaction as observed by the client.

    ``mops`` is normalised to a tuple of tuples, with read values as a tuple of
    ints (``None`` becomes ``()``), so ops built from JSON compare equal.
    """

    id: str
    process: str
    start: float
    end: float
    status: str
    mops: tuple[Mop, ...]
    read_ts: int | None = None
    commit_ts: int | None = None

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ValueError(f"op {self.id!r}: status {self.status!r} is not one of {STATUSES}")
        if self.end < self.start:
            raise ValueError(f"op {self.id!r}: ends ({self.end}) before it starts ({self.start})")
        object.__setattr__(self, "mops", tuple(_normalise_mop(self.id, m) for m in self.mops))

    def appends(self) -> Iterator[tuple[Key, int]]:
        """The ``(key, value)`` of every append, in order."""
        for mop in self.mops:
            if mop[0] == "append":
                yield mop[1], mop[2]

    def to_json(self) -> dict[str, Any]:
        """A JSON-serialisable dict (tuples become lists)."""
        return {
            "id": self.id,
            "process": self.process,
            "start": self.start,
            "end": self.end,
            "status": self.status,
            "mops": [[m[0], m[1], list(m[2]) if m[0] == "r" else m[2]] for m in self.mops],
            "read_ts": self.read_ts,
            "commit_ts": self.commit_ts,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Op:
        """The inverse of :meth:`to_json` (JSON lists in keys become tuples)."""
        return cls(
            id=str(data["id"]),
            process=str(data["process"]),
            start=float(data["start"]),
            end=float(data["end"]),
            status=data["status"],
            mops=tuple(data["mops"]),
            read_ts=data.get("read_ts"),
            commit_ts=data.get("commit_ts"),
        )


def _freeze(value: Any) -> Any:
    """JSON lists (at any depth) as tuples, so keys are hashable again."""
    if isinstance(value, list):
        return tuple(_freeze(v) for v in value)
    return value


def _normalise_mop(op_id: str, mop: Sequence[Any]) -> Mop:
    if len(mop) != 3 or mop[0] not in ("append", "r"):
        raise ValueError(f"op {op_id!r}: bad micro-op {mop!r}")
    kind, key, value = mop
    key = _freeze(key)  # a list (as from JSON) becomes a hashable tuple
    if kind == "append":
        if not isinstance(value, int):
            raise ValueError(f"op {op_id!r}: appended value {value!r} is not an int")
        return ("append", key, value)
    return ("r", key, tuple(value) if value is not None else ())


def dump_history(ops: Iterable[Op], path: str | Path, append: bool = False) -> None:
    """Write ``ops`` to ``path`` as JSON lines (appending if ``append``), flushed and fsynced."""
    with open(path, "a" if append else "w", encoding="utf-8") as f:
        f.writelines(json.dumps(op.to_json(), separators=(",", ":")) + "\n" for op in ops)
        f.flush()
        os.fsync(f.fileno())


def load_history(path: str | Path) -> list[Op]:
    """Read the ops written by :func:`dump_history` (blank lines are skipped)."""
    with open(path, encoding="utf-8") as f:
        return [Op.from_json(json.loads(line)) for line in f if line.strip()]


def load_histories(paths: Iterable[str | Path]) -> list[Op]:
    """The ops of several history files, concatenated."""
    return [op for path in paths for op in load_history(path)]


# ----------------------------------------------------------------------------
# result


@dataclass
class Result:
    """What :func:`check` found.

    ``anomalies`` maps an anomaly name (see :data:`CYCLE_ANOMALIES` and
    :data:`OTHER_ANOMALIES`) to human-readable explanations naming the
    transactions (``id@process``) and, for cycles, every edge with its reason.
    """

    valid: bool
    level: str
    anomalies: dict[str, list[str]]
    op_counts: dict[str, int]
    edge_counts: dict[str, int]

    @property
    def anomaly_names(self) -> set[str]:
        return set(self.anomalies)

    def summary(self, limit: int = 3) -> str:
        """A multi-line report with at most ``limit`` explanations per anomaly."""
        lines = [
            f"{'valid' if self.valid else 'INVALID'} ({self.level}); ops {self.op_counts}; edges {self.edge_counts}"
        ]
        for name in sorted(self.anomalies):
            found = self.anomalies[name]
            lines.append(f"{name}: {len(found)}")
            lines.extend(f"  - {text}" for text in found[:limit])
            if len(found) > limit:
                lines.append(f"  ... and {len(found) - limit} more")
        return "\n".join(lines)


# ----------------------------------------------------------------------------
# analysis state


@dataclass(frozen=True)
class _Write:
    op: int  # index into the op list
    last: bool  # whether it is the op's last append to this key


@dataclass(frozen=True)
class _Read:
    op: int
    key: Key
    values: tuple[int, ...]  # the whole list as read
    external: tuple[int, ...] | None  # the list before the op's own appends, if known


@dataclass
class _Graph:
    """Edges between committed transactions: ``succ[u][v]`` is a mask of kinds."""

    succ: dict[int, dict[int, int]] = field(default_factory=lambda: defaultdict(dict))
    reasons: dict[tuple[int, int, int], tuple[Any, ...]] = field(default_factory=dict)

    def add(self, u: int, v: int, kind: int, reason: tuple[Any, ...]) -> None:
        if u == v:
            return
        mask = self.succ[u].get(v, 0)
        if not mask & kind:
            self.succ[u][v] = mask | kind
            self.reasons[(u, v, kind)] = reason

    def mask(self, u: int, v: int) -> int:
        return self.succ.get(u, {}).get(v, 0)

    def counts(self) -> dict[str, int]:
        counts = dict.fromkeys(KIND_NAMES.values(), 0)
        for targets in self.succ.values():
            for mask in targets.values():
                for bit, name in KIND_NAMES.items():
                    if mask & bit:
                        counts[name] += 1
        return counts


class _Anomalies:
    def __init__(self) -> None:
        self.found: dict[str, list[str]] = defaultdict(list)

    def add(self, name: str, text: str) -> None:
        self.found[name].append(text)


def _show(values: Sequence[int]) -> str:
    if len(values) <= 6:
        return "[" + ", ".join(map(str, values)) + "]"
    head = ", ".join(map(str, values[:2]))
    tail = ", ".join(map(str, values[-3:]))
    return f"[{head}, ..., {tail}] ({len(values)} values)"


# ----------------------------------------------------------------------------
# checking


def check(ops: Sequence[Op], level: Level = "strict_serializable") -> Result:
    """Check a list-append history for ``level`` (see the module docstring)."""
    if level not in LEVELS:
        raise ValueError(f"level {level!r} is not one of {LEVELS}")
    ops = list(ops)
    _check_ids(ops)
    writers = _index_writers(ops)
    committed = _committed(ops, writers)
    anomalies = _Anomalies()
    reads = _collect_reads(ops, committed, anomalies)
    orders = _version_orders(ops, reads, writers, committed, anomalies)
    graph = _Graph()
    _add_write_edges(ops, writers, committed, orders, graph, anomalies)
    _add_read_edges(reads, writers, committed, orders, graph)
    if level == "strict_serializable":
        _add_realtime_edges(ops, committed, graph)
    _CycleSearch(ops, graph, sorted(committed), anomalies).run(realtime=level == "strict_serializable")
    found = dict(anomalies.found)
    return Result(
        valid=not found,
        level=level,
        anomalies=found,
        op_counts=_op_counts(ops, committed),
        edge_counts=graph.counts(),
    )


def _name(op: Op) -> str:
    return f"{op.id}@{op.process}"


def _check_ids(ops: Sequence[Op]) -> None:
    seen: set[str] = set()
    for op in ops:
        if op.id in seen:
            raise ValueError(f"op id {op.id!r} is used twice")
        seen.add(op.id)


def _index_writers(ops: Sequence[Op]) -> dict[Key, dict[int, _Write]]:
    """``writers[key][value]``: who appended it (a repeated append raises ``ValueError``)."""
    writers: dict[Key, dict[int, _Write]] = defaultdict(dict)
    for i, op in enumerate(ops):
        appends = list(op.appends())
        last_index = {key: j for j, (key, _) in enumerate(appends)}
        for j, (key, value) in enumerate(appends):
            if value in writers[key]:
                other = ops[writers[key][value].op]
                raise ValueError(f"{key!r}: value {value} appended by both {_name(other)} and {_name(op)}")
            writers[key][value] = _Write(i, last_index[key] == j)
    return writers


def _committed(ops: Sequence[Op], writers: dict[Key, dict[int, _Write]]) -> set[int]:
    """The ok ops, plus (to a fixed point) info ops whose appends a committed op's read observed."""
    committed = {i for i, op in enumerate(ops) if op.status == "ok"}
    pending = list(committed)
    while pending:
        reader = pending.pop()
        for mop in ops[reader].mops:
            if mop[0] != "r":
                continue
            for value in mop[2]:
                write = writers.get(mop[1], {}).get(value)
                if write is None or write.op == reader or write.op in committed:
                    continue
                if ops[write.op].status == "info":
                    committed.add(write.op)
                    pending.append(write.op)
    return committed


def _op_counts(ops: Sequence[Op], committed: set[int]) -> dict[str, int]:
    counts = dict.fromkeys(STATUSES, 0)
    for op in ops:
        counts[op.status] += 1
    counts["committed"] = len(committed)
    counts["info-committed"] = sum(1 for i in committed if ops[i].status == "info")
    return counts


def _collect_reads(ops: Sequence[Op], committed: set[int], anomalies: _Anomalies) -> list[_Read]:
    """Every read of a committed op; reports ``internal`` inconsistencies."""
    reads: list[_Read] = []
    for i in sorted(committed):
        reads.extend(_op_reads(i, ops[i], anomalies))
    return reads


def _op_reads(index: int, op: Op, anomalies: _Anomalies) -> Iterator[_Read]:
    last_read: dict[Key, tuple[int, ...]] = {}
    appended: dict[Key, list[int]] = defaultdict(list)
    for mop in op.mops:
        kind, key, value = mop
        if kind == "append":
            appended[key].append(value)
            continue
        own = tuple(appended.pop(key, ()))
        external: tuple[int, ...] | None = None
        if key in last_read:
            expected = last_read[key] + own
            if value != expected:
                anomalies.add(
                    "internal",
                    f"{_name(op)} read {key!r} = {_show(value)} but its earlier read "
                    f"and own appends give {_show(expected)}",
                )
        elif own and value[len(value) - len(own) :] != own:
            anomalies.add(
                "internal",
                f"{_name(op)} read {key!r} = {_show(value)}, which does not end with its own appends {_show(own)}",
            )
        else:
            external = value[: len(value) - len(own)]
        last_read[key] = value
        yield _Read(index, key, value, external)


def _version_orders(
    ops: Sequence[Op],
    reads: Sequence[_Read],
    writers: dict[Key, dict[int, _Write]],
    committed: set[int],
    anomalies: _Anomalies,
) -> dict[Key, tuple[int, ...] | None]:
    """Per key: the observed version order (the longest read), or None if reads disagree."""
    by_key: dict[Key, dict[tuple[int, ...], list[int]]] = defaultdict(lambda: defaultdict(list))
    for read in reads:
        by_key[read.key][read.values].append(read.op)
    orders: dict[Key, tuple[int, ...] | None] = {}
    for key, readers in by_key.items():
        distinct = sorted(readers, key=len, reverse=True)
        longest = distinct[0]
        compatible = _check_prefixes(ops, key, distinct, readers, anomalies)
        orders[key] = longest if compatible else None
        _check_elements(ops, key, distinct, readers, writers.get(key, {}), committed, compatible, anomalies)
        _check_intermediate(ops, key, readers, writers.get(key, {}), anomalies)
    return orders


def _check_prefixes(
    ops: Sequence[Op],
    key: Key,
    distinct: list[tuple[int, ...]],
    readers: dict[tuple[int, ...], list[int]],
    anomalies: _Anomalies,
) -> bool:
    longest = distinct[0]
    compatible = True
    for values in distinct[1:]:
        if longest[: len(values)] != values:
            compatible = False
            anomalies.add(
                "incompatible-order",
                f"{key!r}: {_name(ops[readers[values][0]])} read {_show(values)} but "
                f"{_name(ops[readers[longest][0]])} read {_show(longest)}; neither is a prefix of the other",
            )
    return compatible


def _check_elements(
    ops: Sequence[Op],
    key: Key,
    distinct: list[tuple[int, ...]],
    readers: dict[tuple[int, ...], list[int]],
    key_writers: dict[int, _Write],
    committed: set[int],
    compatible: bool,
    anomalies: _Anomalies,
) -> None:
    """``duplicate-elements``, ``garbage-read`` and ``G1a`` in the reads of one key."""
    # when all reads are prefixes of the longest, checking the longest decides whether any read is bad
    candidates = distinct[:1] if compatible else distinct
    has_duplicates = any(len(set(values)) != len(values) for values in candidates)
    seen = set().union(*map(set, candidates))
    unknown = {v for v in seen if v not in key_writers}
    aborted = {v for v in seen if v in key_writers and key_writers[v].op not in committed}
    if not (has_duplicates or unknown or aborted):
        return
    for values in distinct:
        reader = _name(ops[readers[values][0]])
        if has_duplicates and len(set(values)) != len(values):
            dupes = sorted({v for v in values if values.count(v) > 1})
            anomalies.add("duplicate-elements", f"{reader} read {key!r} = {_show(values)} with {dupes} more than once")
        garbage = [v for v in values if v in unknown]
        if garbage:
            text = f"{reader} read {key!r} = {_show(values)} holding {garbage}, which nobody appended"
            anomalies.add("garbage-read", text)
        dirty = [v for v in values if v in aborted]
        if dirty:
            by = ", ".join(f"{v} by {_name(ops[key_writers[v].op])} ({ops[key_writers[v].op].status})" for v in dirty)
            anomalies.add("G1a", f"{reader} read {key!r} = {_show(values)} holding uncommitted appends: {by}")


def _check_intermediate(
    ops: Sequence[Op],
    key: Key,
    readers: dict[tuple[int, ...], list[int]],
    key_writers: dict[int, _Write],
    anomalies: _Anomalies,
) -> None:
    """``G1b``: a read ending in a value its writer followed with more appends to the key."""
    for values, reader_ops in readers.items():
        if not values or values[-1] not in key_writers:
            continue
        write = key_writers[values[-1]]
        if write.last:
            continue
        for reader in reader_ops:
            if reader != write.op:
                anomalies.add(
                    "G1b",
                    f"{_name(ops[reader])} read {key!r} = {_show(values)}, an intermediate state of "
                    f"{_name(ops[write.op])}, which appended more to {key!r} after {values[-1]}",
                )


def _add_write_edges(
    ops: Sequence[Op],
    writers: dict[Key, dict[int, _Write]],
    committed: set[int],
    orders: dict[Key, tuple[int, ...] | None],
    graph: _Graph,
    anomalies: _Anomalies,
) -> None:
    """``ww`` edges along each key's version order, then on to the never-observed versions."""
    for key, key_writers in writers.items():
        order = orders.get(key, ())
        if order is None:
            continue
        chain = [(v, key_writers[v].op) for v in order if v in key_writers and key_writers[v].op in committed]
        for (v1, w1), (v2, w2) in pairwise(chain):
            graph.add(w1, w2, WW, (key, v1, v2))
        _check_own_order(ops, key, chain, anomalies)
        if chain:
            last_value, last_writer = chain[-1]
            for value, writer in _unobserved(key_writers, order, committed).items():
                graph.add(last_writer, writer, WW, (key, last_value, value))


def _unobserved(key_writers: dict[int, _Write], order: tuple[int, ...], committed: set[int]) -> dict[int, int]:
    """Committed appends never read: ``{value: writer}``, one value per writer (its first)."""
    observed = set(order)
    result: dict[int, int] = {}
    seen_writers: set[int] = set()
    for value, write in key_writers.items():
        if value not in observed and write.op in committed and write.op not in seen_writers:
            seen_writers.add(write.op)
            result[value] = write.op
    return result


def _check_own_order(ops: Sequence[Op], key: Key, chain: list[tuple[int, int]], anomalies: _Anomalies) -> None:
    """``internal``: a transaction's appends to a key must be in the version order in append order."""
    positions: dict[int, list[int]] = defaultdict(list)
    for value, writer in chain:
        positions[writer].append(value)
    for writer, observed in positions.items():
        if len(observed) < 2:
            continue
        observed_set = set(observed)
        appended = [v for k, v in ops[writer].appends() if k == key and v in observed_set]
        if appended != observed:
            anomalies.add(
                "internal",
                f"{_name(ops[writer])} appended {appended} to {key!r} but the version order has {observed}",
            )


def _add_read_edges(
    reads: Sequence[_Read],
    writers: dict[Key, dict[int, _Write]],
    committed: set[int],
    orders: dict[Key, tuple[int, ...] | None],
    graph: _Graph,
) -> None:
    """``wr`` and ``rw`` edges from every committed read of a known external state."""
    known = {key: order for key, order in orders.items() if order is not None}
    next_committed = {key: _next_committed(order, writers.get(key, {}), committed) for key, order in known.items()}
    unobserved = {key: _unobserved(writers.get(key, {}), order, committed) for key, order in known.items()}
    for read in reads:
        if read.external is None:
            continue
        key_writers = writers.get(read.key, {})
        if read.external:
            write = key_writers.get(read.external[-1])
            if write is not None and write.op in committed:
                graph.add(write.op, read.op, WR, (read.key, read.external))
        order = orders.get(read.key)
        if order is None:
            continue
        following = next_committed[read.key][len(read.external)]
        if following is not None:
            graph.add(read.op, key_writers[order[following]].op, RW, (read.key, read.external, order[following]))
            continue
        for value, writer in unobserved[read.key].items():
            graph.add(read.op, writer, RW, (read.key, read.external, value))


def _next_committed(order: tuple[int, ...], key_writers: dict[int, _Write], committed: set[int]) -> list[int | None]:
    """For each position ``i`` in ``0..len(order)``, the first index ``>= i`` with a committed writer."""
    result: list[int | None] = [None] * (len(order) + 1)
    following: int | None = None
    for i in range(len(order) - 1, -1, -1):
        write = key_writers.get(order[i])
        if write is not None and write.op in committed:
            following = i
        result[i] = following
    return result


def _add_realtime_edges(ops: Sequence[Op], committed: set[int], graph: _Graph) -> None:
    """``rt`` edges, transitively reduced: an op links from the frontier of ops completed before it started.

    When an op completes, the ops it linked from leave the frontier: anything
    starting later also starts after them and is reached through it. ``info``
    ops never complete here (their commit may land any time after the start).
    """
    events: list[tuple[float, int, int]] = []
    for i in committed:
        events.append((ops[i].start, 0, i))
        if ops[i].status == "ok":
            events.append((ops[i].end, 1, i))
    events.sort()  # at equal times starts come first: rt needs end < start
    frontier: set[int] = set()
    predecessors: dict[int, set[int]] = {}
    for _, is_end, i in events:
        if is_end:
            frontier -= predecessors.pop(i)
            frontier.add(i)
        else:
            predecessors[i] = set(frontier)
            for p in frontier:
                graph.add(p, i, RT, ())


# ----------------------------------------------------------------------------
# cycles


def _tarjan(members: set[int], graph: _Graph, mask: int) -> list[list[int]]:
    """All strongly connected components of the subgraph on ``members`` with edges in ``mask``.

    Iterative Tarjan; components come in reverse topological order (each after
    every component it reaches).
    """
    index: dict[int, int] = {}
    low: dict[int, int] = {}
    stack: list[int] = []
    on_stack: set[int] = set()
    components: list[list[int]] = []

    def successors(v: int) -> Iterator[int]:
        return (w for w, m in graph.succ.get(v, {}).items() if m & mask and w in members)

    for root in sorted(members):
        if root in index:
            continue
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        work = [(root, successors(root))]
        while work:
            v, it = work[-1]
            descended = False
            for w in it:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, successors(w)))
                    descended = True
                    break
                if w in on_stack:
                    low[v] = min(low[v], index[w])
            if descended:
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[v])
            if low[v] == index[v]:
                component = []
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    component.append(w)
                    if w == v:
                        break
                components.append(component)
    return components


def _sccs(members: set[int], graph: _Graph, mask: int) -> list[list[int]]:
    """The strongly connected components of two or more nodes."""
    return [c for c in _tarjan(members, graph, mask) if len(c) > 1]


class _Reach:
    """Reachability inside ``members`` over edges in ``mask``: the SCC condensation with bitset closures."""

    def __init__(self, graph: _Graph, members: set[int], mask: int) -> None:
        order = _tarjan(members, graph, mask)
        self.order = order
        self.component = {n: i for i, c in enumerate(order) for n in c}
        self.cyclic = [c for c in order if len(c) > 1]
        closure: list[int] = []
        for i, nodes in enumerate(order):
            bits = 1 << i
            for n in nodes:
                for w, m in graph.succ.get(n, {}).items():
                    if m & mask and w in members:
                        j = self.component[w]
                        if j != i:
                            bits |= closure[j]  # j < i: emitted earlier
            closure.append(bits)
        self.closure = closure

    def reaches(self, a: int, b: int) -> bool:
        return bool(self.closure[self.component[a]] >> self.component[b] & 1)

    def together(self, a: int, b: int) -> bool:
        return self.component[a] == self.component[b]


def _shortest_path(graph: _Graph, src: int, dst: int, mask: int, members: set[int]) -> list[int] | None:
    """Nodes ``[src, ..., dst]`` of a shortest path using edges in ``mask`` inside ``members`` (BFS)."""
    parent: dict[int, int] = {src: src}
    queue = deque([src])
    while queue:
        v = queue.popleft()
        if v == dst:
            path = [v]
            while v != src:
                v = parent[v]
                path.append(v)
            return path[::-1]
        for w, m in graph.succ.get(v, {}).items():
            if m & mask and w in members and w not in parent:
                parent[w] = v
                queue.append(w)
    return None


def _label(mask: int) -> int:
    return next(kind for kind in _LABEL_PREFERENCE if mask & kind)


def classify(kinds: Sequence[int]) -> str:
    """The anomaly name of a cycle with edges of these kinds (``WW``, ``WR``, ``RW``, ``RT``)."""
    rw = sum(1 for k in kinds if k == RW)
    if rw == 0:
        base = "G1c" if WR in kinds else "G0"
    else:
        base = "G-single" if rw == 1 else "G2"
    return base + ("-realtime" if RT in kinds else "")


Cycle = list[tuple[int, int, int]]  # (from, to, kind)


class _CycleSearch:
    """Finds and reports explicit cycles, the weakest kinds first, in each strongly connected component.

    Data cycles (ww/wr/rw) are searched in the components of the data graph.
    A cycle is reported as ``*-realtime`` only if ``rt`` edges are needed to
    close it with the kinds its name allows, and not if it passes through two
    transactions of one data component (a detour around a data cycle, already
    reported). Real-time cycles are printed with direct ``rt`` shortcuts
    (``Ti`` ended before ``Tj`` started) in place of chains of reduced edges.
    """

    def __init__(self, ops: Sequence[Op], graph: _Graph, nodes: list[int], anomalies: _Anomalies) -> None:
        self.ops = ops
        self.graph = graph
        self.nodes = set(nodes)
        self.anomalies = anomalies
        self.reported: set[tuple[str, frozenset[int]]] = set()
        self.data_component: dict[int, int] = {}

    def run(self, realtime: bool) -> None:
        data_components = _sccs(self.nodes, self.graph, DATA)
        self.data_component = {n: i for i, c in enumerate(data_components) for n in c}
        for component in data_components:
            self._data_cycles(set(component))
        if realtime:
            for component in _sccs(self.nodes, self.graph, ALL):
                self._realtime_cycles(set(component))

    # -- searches

    def _data_cycles(self, members: set[int]) -> None:
        for sub in _sccs(members, self.graph, WW):
            self._some_cycle(self._edges(set(sub), WW), WW, WW, set(sub))
        ww_wr = _Reach(self.graph, members, WW | WR)
        for sub in ww_wr.cyclic:
            self._some_cycle(self._edges(set(sub), WR), WR, WW | WR, set(sub))
        rw_edges = self._edges(members, RW)
        single = [(u, v) for u, v in rw_edges if ww_wr.reaches(v, u)]
        if single:
            self._cycles_through(single, RW, WW | WR, members)
        else:
            self._shortest_cycle(rw_edges, RW, DATA, members)

    def _realtime_cycles(self, members: set[int]) -> None:
        data = _Reach(self.graph, members, DATA)
        needed = [(a, b) for a, b in self._edges(members, RT) if not data.reaches(a, b)]
        if not needed:
            return  # every rt edge here is implied by data dependencies: the data cycles say it all
        found = self._closed_by_realtime(members, needed, WW) + self._closed_by_realtime(members, needed, WW | WR)
        ww_wr = _Reach(self.graph, members, WW | WR)
        ww_wr_rt = _Reach(self.graph, members, WW | WR | RT)
        single = [(u, v) for u, v in self._edges(members, RW) if ww_wr_rt.reaches(v, u) and not ww_wr.reaches(v, u)]
        found += self._cycles_through(single, RW, WW | WR | RT, members)
        if not found:
            self._shortest_cycle(needed, RT, ALL, members)

    def _closed_by_realtime(self, members: set[int], needed: list[tuple[int, int]], mask: int) -> int:
        """Cycles over ``mask | RT`` through an rt edge ``a -> b`` where ``a`` does not reach ``b`` over ``mask``."""
        with_rt = _Reach(self.graph, members, mask | RT)
        without = _Reach(self.graph, members, mask)
        by_component: dict[int, list[tuple[int, int]]] = defaultdict(list)
        for a, b in needed:
            if with_rt.together(a, b) and not without.reaches(a, b):
                by_component[with_rt.component[a]].append((a, b))
        return sum(
            self._some_cycle(edges, RT, mask | RT, set(with_rt.order[component]))
            for component, edges in by_component.items()
        )

    def _edges(self, members: set[int], kind: int) -> list[tuple[int, int]]:
        """The ``kind`` edges with both ends in ``members``."""
        return [
            (u, v)
            for u in sorted(members)
            for v, m in self.graph.succ.get(u, {}).items()
            if m & kind and v in members
        ]

    def _some_cycle(self, edges: list[tuple[int, int]], kind: int, mask: int, members: set[int]) -> int:
        """Report one cycle through one of the first ``edges`` that closes over ``mask`` inside ``members``."""
        for u, v in edges[:_MAX_TRIES]:
            cycle = self._candidate(u, v, kind, mask, members)
            if cycle is not None and self._report(cycle):
                return 1
        return 0

    def _cycles_through(self, edges: list[tuple[int, int]], kind: int, mask: int, members: set[int]) -> int:
        """Report up to :data:`MAX_CYCLES_PER_KIND` cycles, each through one of the first ``edges``."""
        found = 0
        for u, v in edges[:_MAX_TRIES]:
            if found >= MAX_CYCLES_PER_KIND:
                break
            cycle = self._candidate(u, v, kind, mask, members)
            if cycle is not None:
                found += self._report(cycle)
        return found

    def _shortest_cycle(self, edges: list[tuple[int, int]], kind: int, mask: int, members: set[int]) -> int:
        """Report the shortest of the cycles through the first ``edges``."""
        candidates = [self._candidate(u, v, kind, mask, members) for u, v in edges[:_MAX_TRIES]]
        found = [c for c in candidates if c is not None]
        return self._report(min(found, key=len)) if found else 0

    def _candidate(self, u: int, v: int, kind: int, mask: int, members: set[int]) -> Cycle | None:
        """The cycle of edge ``u -> v`` and a shortest path back, or None (no path, or a real-time detour)."""
        path = _shortest_path(self.graph, v, u, mask, members)
        if path is None:
            return None
        cycle: Cycle = [(u, v, kind)]
        cycle.extend((a, b, _label(self.graph.mask(a, b) & mask)) for a, b in pairwise(path))
        if not any(k == RT for _, _, k in cycle):
            return cycle
        cycle = self._shortcut(cycle)
        components = [self.data_component[n] for n, _, _ in cycle if n in self.data_component]
        return cycle if len(components) == len(set(components)) else None

    def _shortcut(self, cycle: Cycle) -> Cycle:
        """The cycle with runs of nodes skipped where an earlier ok op ended before a later one started."""
        nodes = [u for u, _, _ in cycle]
        k = len(nodes)
        shorter: Cycle = []
        i = 0
        while i < k:
            a = self.ops[nodes[i]]
            target = None
            if a.status == "ok":
                for j in range(k if i > 0 else k - 1, i + 1, -1):
                    if a.end < self.ops[nodes[j % k]].start:
                        target = j
                        break
            if target is None:
                shorter.append(cycle[i])
                i += 1
            else:
                shorter.append((nodes[i], nodes[target % k], RT))
                i = target
        return shorter

    # -- reporting

    def _report(self, cycle: Cycle) -> int:
        name = classify([k for _, _, k in cycle])
        nodes = frozenset(u for u, _, _ in cycle)
        if (name, nodes) in self.reported:
            return 0
        self.reported.add((name, nodes))
        # start the printed cycle at its lowest-indexed op for stable output
        start = min(range(len(cycle)), key=lambda i: cycle[i][0])
        cycle = cycle[start:] + cycle[:start]
        steps = " ".join(f"{_name(self.ops[a])} -{self._explain(a, b, k)}->" for a, b, k in cycle)
        self.anomalies.add(name, f"cycle of {len(cycle)}: {steps} {_name(self.ops[cycle[0][0]])}")
        return 1

    def _explain(self, a: int, b: int, kind: int) -> str:
        reason = self.graph.reasons.get((a, b, kind), ())
        if kind == WW:
            key, v1, v2 = reason
            return f"ww[{key!r}: {v1} then {v2}]"
        if kind == WR:
            key, values = reason
            return f"wr[{key!r}: read {_show(values)}]"
        if kind == RW:
            key, values, nxt = reason
            return f"rw[{key!r}: read {_show(values)}, next version {nxt}]"
        return f"rt[ended {self.ops[a].end:.6f} < started {self.ops[b].start:.6f}]"
