"""Transaction repair for transactions given as functions (issue #11, part 5): the pure core.

A *batch* is a list of functions ``fn(ctx)`` with a fixed serialization order
(the list order). Each reads and writes keyed rows only through a
:class:`BatchContext`: ``ctx.get(table, key)``, ``ctx.put(table, row)``,
``ctx.delete(table, key)`` (and ``ctx.add``, a get then a put). The context
records an *execution*: the reads (sensitivities: ``(table, key)`` -> the row
it saw, None for absent; first read of each key only, and not of keys the
function wrote itself before reading them, which it sees from its own write)
and the writes (deltas: ``(table, key)`` -> row, or :data:`DELETE`), in order,
and whether the function raised an *abort* (an integrity constraint: the
function is dropped, its writes never apply).

:func:`repair` walks the functions in order over an *overlay*: the base
state (``read``) plus the merged writes of the functions committed so far in
the batch. A function with a recorded execution (``speculative``: e.g. a
parallel run against an older snapshot) whose reads all still match the
overlay (null-safe row equality) keeps that execution without running again;
any other function is run (again) against base + overlay: a *repair*. Its
writes (if it did not abort) are merged into the overlay; later writes to a
key supersede earlier ones.

**The invariant.** ``repair(fns, read)`` gives the same outcomes, the same
return values and the same final writes as running ``fns`` one by one, in
list order, on the base state, each seeing the writes of the earlier ones that
committed (a function that aborts changes nothing).

**The requirement** that makes it hold: a function is *deterministic in what
it reads through ctx*. Given the same values returned by its ``ctx.get``
calls, it makes the same calls, the same writes, raises the same abort and
returns the same value; it reads no clock, no randomness, no state outside
``ctx`` (and has no side effects outside ``ctx``: it may run several times).

*Proof sketch.* Let S_i be the state after serially running f_1 .. f_{i-1} on
the base B, and O_i the overlay before f_i. By induction B + O_i = S_i (true
for i = 1, O_1 empty). An execution E of f_i is *valid* for a state S if
each recorded read (k, v) has S(k) = v. Claim: if E is valid for S_i, running
f_i on S_i reproduces E. By induction on f_i's ctx calls: the calls so far
are identical, so the next call is identical (determinism); a ``get`` of a key
the function wrote returns its own write (identical so far), a repeated read
returns what the first one did, and a first read of k returns S_i(k) = v, the
recorded value. So a valid E has exactly the writes, outcome and result of
the serial run; a re-run on B + O_i = S_i is the serial run by definition.
Either way O_{i+1} = O_i merged with f_i's writes (none if it aborted), which
is S_{i+1} over B. One pass in order is the fixpoint: f_i only depends on
f_1 .. f_{i-1}, which are final when it is checked. ∎

**Cost.** Every function runs once speculatively (n executions, in
parallel) and once more in the walk if its reads changed: ``executions = n +
repairs``. With no speculation a function runs once in the walk (executions =
n, repairs = 0). Each check of a recorded read is a dict lookup (overlay) or
a base read (cached per key within one call).

**External reads.** The reads of final executions that the overlay did not
answer (no earlier batch function wrote the key) are what the result depends
on in the base state: :attr:`RepairResult.reads`. A database commit of the
batch must validate them (they were all read through ``read``).

Aborts: ``aborts`` (exception types) mark a function as aborted. Any other
exception from a function run in :func:`repair` propagates (nothing is
committed). :func:`execute` with ``capture=True`` records it instead (as
``error``): a speculative run against a stale state may fail where the serial
one would not, so :func:`repair` runs such a function again.

>>> base = {("acct", ("a",)): {"id": "a", "bal": 5}}
>>> def read(table, key):
...     return base.get((table, key))
>>> def bump(ctx):
...     row = ctx.get("acct", "a")
...     ctx.put("acct", {"id": "a", "bal": row["bal"] + 1})
>>> res = repair([bump, bump], read, keys={"acct": ("id",)}, aborts=())
>>> res.writes, res.outcomes, res.executions
({('acct', ('a',)): {'id': 'a', 'bal': 7}}, ['committed', 'committed'], 2)
"""

from __future__ import annotations

import enum
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

Key = tuple[Any, ...]
"""A primary key: the values of the key columns, in key order (a bare value means a 1-tuple)."""
Row = dict[str, Any]


class _Deleted(enum.Enum):
    DELETE = "DELETE"

    def __repr__(self) -> str:
        return "DELETE"


DELETE = _Deleted.DELETE
"""A write that removes the key's row (an enum member: it survives pickling between processes)."""

Write = Row | _Deleted
Reader = Callable[[str, Key], "Row | None"]
"""``read(table, key)``: the key's row in the base state, or None."""
NormalizeRow = Callable[[str, Mapping[str, Any]], Row]
"""``normalize_row(table, row)``: the row as the store would hold it (or an error saying what is wrong)."""
NormalizeKey = Callable[[str, Any], Key]
"""``normalize_key(table, key)``: the key as the store would hold it (a tuple), or an error."""

COMMITTED = "committed"
ABORTED = "aborted"


def as_key(key: object) -> Key:
    """A key as a tuple (a bare value is a one-column key)."""
    return key if isinstance(key, tuple) else (key,)


def _same_value(a: Any, b: Any) -> bool:
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    return bool(a == b)


def same_row(a: Row | None, b: Row | None) -> bool:
    """Null-safe equality of two rows (None: absent; NaN equals NaN)."""
    if a is None or b is None:
        return a is None and b is None
    return a.keys() == b.keys() and all(_same_value(v, b[c]) for c, v in a.items())


@dataclass
class Execution:
    """One run of a function: what it read (first reads, in order), wrote (in order) and how it ended.

    ``aborted``: the abort's message (the function's writes do not apply);
    ``error``: a description of another exception, recorded only by a
    capturing (speculative) run; ``result``: the function's return value.
    """

    reads: dict[tuple[str, Key], Row | None] = field(default_factory=dict)
    writes: dict[tuple[str, Key], Write] = field(default_factory=dict)
    aborted: str | None = None
    error: str | None = None
    result: Any = None

    @property
    def ok(self) -> bool:
        """It ran to the end (its writes apply)."""
        return self.aborted is None and self.error is None


class BatchContext:
    """What a batch function gets: keyed point reads and writes, recorded as an :class:`Execution`.

    ``read(table, key)``: the state the function runs on (base + overlay).
    ``keys``: each table's primary key columns (to take a row's key from it).
    ``normalize_row`` / ``normalize_key``: optional checks and conversions
    (the database layer conforms rows and keys to the tables' schemas).
    """

    def __init__(
        self,
        read: Reader,
        keys: Mapping[str, Sequence[str]],
        *,
        normalize_row: NormalizeRow | None = None,
        normalize_key: NormalizeKey | None = None,
    ) -> None:
        self._read = read
        self._keys = keys
        self._normalize_row = normalize_row
        self._normalize_key = normalize_key
        self.execution = Execution()

    def _key(self, table: str, key: object) -> Key:
        if self._normalize_key is not None:
            return self._normalize_key(table, key)
        return as_key(key)

    def _key_columns(self, table: str) -> Sequence[str]:
        cols = self._keys.get(table)
        if cols is None:
            raise ValueError(
                f"table {table!r} has no primary key known to this batch (known: {sorted(self._keys)}); "
                f"batch functions write keyed tables only"
            )
        return cols

    def get(self, table: str, key: object) -> Row | None:
        """The row of ``key`` in ``table`` (a copy), or None; the function's own writes are seen."""
        k = (table, self._key(table, key))
        ex = self.execution
        if k in ex.writes:
            w = ex.writes[k]
            return None if w is DELETE else dict(w)
        if k in ex.reads:
            seen = ex.reads[k]
        else:
            seen = self._read(*k)
            ex.reads[k] = None if seen is None else dict(seen)
        return None if seen is None else dict(seen)

    def put(self, table: str, row: Mapping[str, Any]) -> None:
        """Upsert ``row`` into ``table``: it replaces the row of its key (taken from the key columns)."""
        if self._normalize_row is not None:
            r = self._normalize_row(table, row)  # (it checks the row's type itself)
        elif isinstance(row, Mapping):
            r = dict(row)
        else:
            raise TypeError(f"table {table!r}: put takes a row as a dict of column -> value, not {type(row).__name__}")
        cols = self._key_columns(table)
        missing = [c for c in cols if c not in r]
        if missing:
            raise ValueError(f"table {table!r}: the row lacks primary key column(s) {missing}: {row!r}")
        k = tuple(r[c] for c in cols)
        self.execution.writes[(table, k)] = r

    def delete(self, table: str, key: object) -> None:
        """Remove the row of ``key`` from ``table`` (nothing happens if there is none)."""
        self.execution.writes[(table, self._key(table, key))] = DELETE

    def add(self, table: str, key: object, column: str, delta: Any) -> Row:
        """``row[column] += delta`` for the row of ``key`` (a read, then a put); returns the new row.

        ``LookupError`` if there is no row of ``key``.
        """
        row = self.get(table, key)
        if row is None:
            raise LookupError(f"table {table!r}: no row with key {key!r} to add {delta!r} to column {column!r}")
        row[column] = row[column] + delta
        self.put(table, row)
        return row


def execute(
    fn: Callable[[BatchContext], Any],
    read: Reader,
    keys: Mapping[str, Sequence[str]],
    *,
    aborts: tuple[type[BaseException], ...] = (),
    capture: bool = False,
    normalize_row: NormalizeRow | None = None,
    normalize_key: NormalizeKey | None = None,
) -> Execution:
    """Run ``fn`` once on ``read``'s state; return what it read and wrote, and how it ended.

    An exception of ``aborts`` ends it as aborted (its message kept). Any
    other ``Exception`` propagates, unless ``capture`` (then it is recorded
    in ``error``: for speculative runs).
    """
    ctx = BatchContext(read, keys, normalize_row=normalize_row, normalize_key=normalize_key)
    try:
        ctx.execution.result = fn(ctx)
    except aborts as e:
        ctx.execution.aborted = str(e)
    except Exception as e:
        if not capture:
            raise
        ctx.execution.error = f"{type(e).__name__}: {e}"
    return ctx.execution


@dataclass
class RepairResult:
    """What :func:`repair` decided.

    ``outcomes[i]``: ``"committed"`` or ``"aborted"``; ``aborted``: index ->
    the abort's message; ``results[i]``: fn i's return value (None if it
    aborted); ``writes``: the batch's net writes, key -> row or
    :data:`DELETE` (in the order first written); ``reads``: the external read
    set, key -> the row seen in the base state; ``final``: each function's
    final execution (speculation for a later :func:`repair`);
    ``executions`` / ``repairs`` in all and per function (speculative runs
    given count as executions).
    """

    outcomes: list[str]
    aborted: dict[int, str]
    results: list[Any]
    writes: dict[tuple[str, Key], Write]
    reads: dict[tuple[str, Key], Row | None]
    final: list[Execution]
    executions: int
    repairs: int
    executions_per_fn: list[int]
    repairs_per_fn: list[int]


def repair(
    fns: Sequence[Callable[[BatchContext], Any]],
    read: Reader,
    *,
    keys: Mapping[str, Sequence[str]],
    aborts: tuple[type[BaseException], ...],
    speculative: Sequence[Execution | None] | None = None,
    normalize_row: NormalizeRow | None = None,
    normalize_key: NormalizeKey | None = None,
) -> RepairResult:
    """Repair ``fns`` in list order on ``read``'s base state, reusing valid ``speculative`` executions.

    See the module doc for what the result equals and why. ``speculative[i]``
    (None: none) is a recorded execution of ``fns[i]`` against any state.
    """
    n = len(fns)
    if speculative is not None and len(speculative) != n:
        raise ValueError(f"speculative has {len(speculative)} executions for {n} functions")
    overlay: dict[tuple[str, Key], Write] = {}
    base_cache: dict[tuple[str, Key], Row | None] = {}

    def base(table: str, key: Key) -> Row | None:
        k = (table, key)
        if k not in base_cache:
            row = read(table, key)
            base_cache[k] = None if row is None else dict(row)
        return base_cache[k]

    def current(table: str, key: Key) -> Row | None:
        w = overlay.get((table, key))
        if w is None:
            return base(table, key)
        return None if w is DELETE else dict(w)

    def valid(ex: Execution) -> bool:
        if not (ex.ok or ex.aborted is not None):
            return False  # a failed speculative run: run it for real
        # the reads the overlay answers first (no base read), then the others
        for k, seen in ex.reads.items():
            w = overlay.get(k)
            if w is not None and not same_row(None if w is DELETE else w, seen):
                return False
        return all(same_row(base(*k), seen) for k, seen in ex.reads.items() if k not in overlay)

    outcomes: list[str] = []
    aborted: dict[int, str] = {}
    results: list[Any] = []
    external: dict[tuple[str, Key], Row | None] = {}
    final: list[Execution] = []
    execs = [0] * n
    reps = [0] * n
    for i, fn in enumerate(fns):
        spec = speculative[i] if speculative is not None else None
        if spec is not None:
            execs[i] += 1
        if spec is None or not valid(spec):
            ex = execute(
                fn, current, keys, aborts=aborts, normalize_row=normalize_row, normalize_key=normalize_key
            )
            execs[i] += 1
            if spec is not None:
                reps[i] += 1
        else:
            ex = spec
        final.append(ex)
        for k, seen in ex.reads.items():
            if k not in overlay and k not in external:
                external[k] = seen
        if ex.aborted is not None:
            outcomes.append(ABORTED)
            aborted[i] = ex.aborted
            results.append(None)
            continue
        outcomes.append(COMMITTED)
        results.append(ex.result)
        overlay.update(ex.writes)
    return RepairResult(
        outcomes=outcomes,
        aborted=aborted,
        results=results,
        writes=overlay,
        reads=external,
        final=final,
        executions=sum(execs),
        repairs=sum(reps),
        executions_per_fn=execs,
        repairs_per_fn=reps,
    )


__all__ = [
    "ABORTED",
    "COMMITTED",
    "DELETE",
    "BatchContext",
    "Execution",
    "Key",
    "RepairResult",
    "Row",
    "as_key",
    "execute",
    "repair",
    "same_row",
]
