"""Transactions resolved in the data plane, in the database: ``db.submit`` and the resolver (issue #11, part 4).

A client **submits** a transaction as data: what it read (``reads``: ``(table,
key) -> row`` as it saw it, or None for "absent"), what it writes
(``writes``: ``(table, key) -> row``, or None to delete) and what it adds
(``adds``: ``(table, key) -> {column: delta}``, numeric columns of an existing
row). Nothing is checked against the tables then: the intent is appended to
the system table ``txns_intents`` (one row: its id and a JSON body) by an
ordinary write-only transaction, so intents from many threads share one
conditional write (the database's group commit) and intents from many
processes share them too once they contend (:mod:`txns.group_commit`). The
commit time of that write is the intent's **epoch**; its id is ``(epoch,
intent uuid)``, a total order.

**Resolution** (:func:`resolve_intents`; any process, any number at once).
One resolution step is one strict-serializable database transaction ``t``:

1. read the progress row of ``txns_resolver`` (``R``: every intent with
   epoch <= R is resolved) and take ``t``'s read time ``T``. Every intent with
   epoch <= ``T`` is committed by then, and none can arrive later with a
   smaller epoch (the txns upper is past ``T``): the epochs in ``(R, T]`` are
   *closed*;
2. read those intents (``txns_intents``' changes in ``[R + 1, T + 1)``) and,
   through ``t``, the current rows of every key they touch (``get_many``);
3. apply the rule of :mod:`txns.resolve` in id order: an intent commits iff
   each of its reads equals the key's row after every earlier committed intent
   of the step, starting from the rows at ``T``; its writes and adds then apply.
   Plain intents go through :func:`txns.resolve.resolve` (the fixpoint, on
   canonical JSON keys and values; proven equal to the rule); a step with adds
   applies the same rule row by row with the deltas (an add never conflicts; a
   later read of the key sees the sum). An intent that names a table which no
   longer exists (or lost its primary key) rolls back with a reason;
4. in the same ``t``: upsert or delete the final rows of the keys that
   changed, append one row per intent to ``txns_outcomes`` (intent, epoch,
   committed, reason) and set the progress row to ``T``; commit.

**Why outcomes are exactly once and agree.** A step commits only if nothing
it read changed since ``T`` (strict serializable: the progress row, and every
key read, are validated). Two concurrent steps read the same progress ``R``;
the first to commit moves it, so the second's commit fails
(``TransactionConflict``) and it starts again from the new progress. Each
intent's epoch lies in exactly one committed ``(R, T]``, so it gets exactly
one outcome, and everyone reads that one. Resolution is deterministic (the
same intents and rows give the same outcomes), so it does not matter who
runs it. The committed intents' writes are applied in the very commit that
records their outcome, so they are in the tables exactly once, and nothing
they read changed between ``T`` and that commit: the intents of a step are
serialized, in id order, at its commit time.

**Learning the outcome.** ``submit`` returns an :class:`IntentFuture`;
``result()`` runs a resolution step itself when the outcome is not known yet
(so a lone client needs no resolver process), then reads it from
``txns_outcomes`` (from the epoch on) unless this process resolved it. Outcomes
are a table like any other (``db.table("txns_outcomes")``: readable, with
history and changes); the outcome's ``ts`` is the time of the commit that
recorded it (and applied the intent's writes).

**Costs.** A step parses every body with one JSON parse, reads the keys'
rows with one filtered read per table, and hands the fixpoint a relation of
dense integer codes (a (table, key) pair by equality, a row by its sorted
items); outcomes go in as one Arrow table. A step first asks the txns log
(the cache's per-table write times, no request) whether the intents table was
written since the progress at all, ignoring this object's own earlier steps
that committed alone (their only writes there are retirements); if not, it
reads nothing more. A waiter polls the latest time and reads the outcomes
table only when the log says it was written since its last poll, and then
only the new range: each outcome is read once per waiter. A step (and a
submit) pauses CPython's cycle collector while it runs: its hundreds of
thousands of short-lived containers would otherwise trigger full collections,
each a scan of the whole process heap (they took about half of a
10,000-intent step in a long-running process; the garbage has no cycles and
is freed by reference counting anyway).

Limits: the tables an intent touches must have a primary key and columns of
JSON types (integers, floats, strings, booleans), because intents travel as
JSON; a resolver must run within ``txns_intents``' retention of its intents.

**Retiring intents.** The resolution step that records an intent's outcome
also retracts its row from ``txns_intents`` (``Transaction._retract_present``:
no presence check and no read recorded, so concurrent submits do not
conflict with it; the step read those rows itself, and only a step
retracts them, once, under the progress row). Nothing reads an intent below
the progress again but through the table's history (``changes`` keeps the
insertion: the uncertain-submit check and the steps filter on diff > 0), so
once compaction passes the table's retention both updates cancel and the
stored table does not grow with every intent ever submitted.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import json
import os
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc

from persist import Attempts, Indeterminate, InvalidUsage, backoff
from txns.db.arrow_io import conform
from txns.db.catalog import TableEntry, is_system_name
from txns.db.errors import TableExists, TableNotFound, TransactionConflict
from txns.db.fairness import retry_conflicts
from txns.db.keyed import keys_from_values, require_keyed
from txns.resolve import resolve

if TYPE_CHECKING:
    from txns.db.database import Database
    from txns.db.transaction import Transaction

INTENTS = "txns_intents"
OUTCOMES = "txns_outcomes"
RESOLVER = "txns_resolver"
SYSTEM_TABLES = frozenset({INTENTS, OUTCOMES, RESOLVER})
"""The system tables of intents (only the library writes them: ``catalog.SYSTEM_PREFIX``)."""
INTENTS_SCHEMA = pa.schema([("intent", pa.string()), ("body", pa.string())])
OUTCOMES_SCHEMA = pa.schema(
    [("intent", pa.string()), ("epoch", pa.int64()), ("committed", pa.bool_()), ("reason", pa.string())]
)
RESOLVER_SCHEMA = pa.schema([("name", pa.string()), ("epoch", pa.int64())])
PROGRESS = "progress"
RESOLVE_MAX_ATTEMPTS = 100
RESOLVE_DEADLINE_S = 60.0
"""How long intent resolution retries a step that keeps conflicting (unless ``max_attempts`` stops it first)."""
KNOWN_OUTCOMES = 100_000
"""Outcomes this process resolved, kept in memory for its futures (oldest dropped first)."""

Key = tuple[Any, ...]
TableKey = tuple[str, Any]


@dataclasses.dataclass(frozen=True)
class Outcome:
    """What became of a submitted intent: committed or rolled back, at ``ts`` (see the module doc)."""

    intent: str
    epoch: int
    committed: bool
    ts: int
    reason: str | None = None


class IntentState:
    """A database object's intent bookkeeping: whether the tables exist, outcomes it resolved, its step lock."""

    def __init__(self) -> None:
        self.ready = False
        self.lock = threading.Lock()
        self.known: OrderedDict[str, Outcome] = OrderedDict()
        self.resolving = threading.Lock()  # one step at a time per object: concurrent ones would only conflict
        # the commit times of this object's last resolution steps that committed alone (no other
        # transaction at that time): their only writes to the intents table are retirements, so a
        # step need not look at the intents table for them
        self.steps: deque[int] = deque(maxlen=64)


@dataclasses.dataclass
class _Intent:
    epoch: int
    id: str
    reads: list[tuple[str, Key, dict[str, Any] | None]]
    writes: list[tuple[str, Key, dict[str, Any] | None]]
    adds: list[tuple[str, Key, dict[str, float]]]


def _json_type(t: pa.DataType) -> bool:
    return bool(
        pa.types.is_integer(t)
        or pa.types.is_floating(t)
        or pa.types.is_string(t)
        or pa.types.is_large_string(t)
        or pa.types.is_boolean(t)
    )


def _exact_kind(t: pa.DataType) -> type | None:
    """The Python type Arrow gives back for ``t`` where a value of exactly that type needs no conversion."""
    if pa.types.is_int64(t):
        return int
    if pa.types.is_float64(t):
        return float
    if pa.types.is_string(t):
        return str
    if pa.types.is_boolean(t):
        return bool
    return None


def _fits(kind: type | None, v: object) -> bool:
    """Whether ``v`` is already exactly what Arrow gives back for a column of ``kind`` (the fast path)."""
    return kind is not None and type(v) is kind and (kind is not int or -(2**63) <= v < 2**63)  # type: ignore[operator]


@dataclasses.dataclass(frozen=True)
class _Shape:
    """A table as ``encode`` checks against it: computed once per table and submit."""

    entry: TableEntry
    names: tuple[str, ...]
    key: tuple[str, ...]
    key_kinds: tuple[type | None, ...]
    columns: tuple[tuple[str, type | None, bool], ...]  # (name, exact kind, nullable)

    @staticmethod
    def of(e: TableEntry) -> _Shape:
        pk = e.primary_key or ()
        return _Shape(
            e,
            tuple(e.schema.names),
            tuple(pk),
            tuple(_exact_kind(e.schema.field(c).type) for c in pk),
            tuple((f.name, _exact_kind(f.type), f.nullable) for f in e.schema),
        )


def _entry(db: Database, view: Mapping[str, TableEntry], table: object, what: str) -> TableEntry:
    if not isinstance(table, str):
        raise InvalidUsage(f"{what}: keys are (table name, primary key) pairs; got table {table!r}")
    e = view.get(table)
    if _system(table):
        raise InvalidUsage(f"{what}: {table!r} is a system table of intents; submit works on your own tables")
    if e is None:
        raise TableNotFound(f"{what}: no table {table!r}; tables: {sorted(n for n in view if not _system(n))}")
    require_keyed(e, "submit")
    bad = [f.name for f in e.schema if not _json_type(f.type)]
    if bad:
        raise InvalidUsage(
            f"{what}: table {table!r} has column(s) {bad} of types intents cannot carry (they travel as JSON): "
            f"submit works on tables of integers, floats, strings and booleans"
        )
    return e


def _system(name: str) -> bool:
    return is_system_name(name)


def _key(s: _Shape, key: object) -> Key:
    """``key`` normalized through the table's key columns (plain values pass as they are)."""
    t = key if isinstance(key, tuple) else (key,)
    if len(t) == len(s.key) and all(_fits(k, v) for k, v in zip(s.key_kinds, t, strict=True)):
        return t
    return keys_from_values(s.entry, [key])[0]


def _row(s: _Shape, key: Key, row: object, what: str) -> dict[str, Any]:
    e = s.entry
    if not isinstance(row, Mapping):
        raise InvalidUsage(f"{what}: the row of {e.name!r} {key!r} must be a dict of column -> value, got {row!r}")
    if len(row) == len(s.names) and all(
        n in row and (_fits(k, v := row[n]) or (v is None and nullable)) for n, k, nullable in s.columns
    ):
        out = {n: row[n] for n in s.names}
    else:
        out = conform(pa.Table.from_pylist([dict(row)]), e.schema, e.name).to_pylist()[0]
    if tuple(out[c] for c in s.key) != key:
        raise InvalidUsage(f"{what}: the row {out} of {e.name!r} does not have the key {key!r} it is given under")
    return out


def _pairs(arg: object, what: str) -> list[tuple[Any, Any]]:
    if arg is None:
        return []
    if not isinstance(arg, Mapping):
        raise InvalidUsage(f"{what} must be a dict of (table, key) -> value, got {type(arg).__name__}")
    out = []
    for k, v in arg.items():
        if not (isinstance(k, tuple) and len(k) == 2):
            raise InvalidUsage(f"{what}: each key must be a (table name, primary key) pair, got {k!r}")
        out.append((k, v))
    return out


def _once(seen: set[TableKey], table: str, k: Key, what: str) -> Key:
    """``k``, noted in ``seen``; InvalidUsage if ``what`` names that key of ``table`` twice (in two spellings)."""
    if (table, k) in seen:
        raise InvalidUsage(f"{what}: {table!r} key {k!r} is given twice (as two spellings of one key); give it once")
    seen.add((table, k))
    return k


class _Encoder:
    """Intents to JSON bodies, their rows and keys normalized through the tables' schemas (bad input raises).

    ``view``: the catalog's tables. Each table is checked once per encoder.
    """

    def __init__(self, db: Database, view: Mapping[str, TableEntry]) -> None:
        self.db = db
        self.view = view
        self.shapes: dict[object, _Shape] = {}

    def shape(self, table: object, what: str) -> _Shape:
        s = self.shapes.get(table) if isinstance(table, str) else None
        if s is None:
            s = _Shape.of(_entry(self.db, self.view, table, what))
            self.shapes[table] = s
        return s

    def encode(self, reads: object, writes: object, adds: object) -> str:
        body: dict[str, list[Any]] = {"r": [], "w": [], "a": []}
        for what, pairs, side in (("reads", reads, body["r"]), ("writes", writes, body["w"])):
            seen: set[TableKey] = set()
            for (table, key), row in _pairs(pairs, what):
                s = self.shape(table, what)
                k = _once(seen, table, _key(s, key), what)
                side.append([table, list(k), None if row is None else _row(s, k, row, what)])
        seen = set()
        for (table, key), deltas in _pairs(adds, "adds"):
            s = self.shape(table, "adds")
            e = s.entry
            k = _once(seen, table, _key(s, key), "adds")
            if not isinstance(deltas, Mapping) or not deltas:
                raise InvalidUsage(f"adds: {table!r} {key!r} needs a non-empty dict of column -> delta, got {deltas!r}")
            for col, d in deltas.items():
                f = e.schema.field(col) if col in e.schema.names else None
                if f is None or col in s.key or not (pa.types.is_integer(f.type) or pa.types.is_floating(f.type)):
                    raise InvalidUsage(f"adds: {col!r} is not a numeric non-key column of {table!r}")
                if isinstance(d, bool) or not isinstance(d, int | float):
                    raise InvalidUsage(f"adds: the delta of {table!r}.{col} must be a number, got {d!r}")
                if pa.types.is_integer(f.type) and not isinstance(d, int):
                    raise InvalidUsage(
                        f"adds: {table!r}.{col} is an integer column; its delta must be an int, got {d!r}"
                    )
            body["a"].append([table, list(k), dict(deltas)])
        if not (body["r"] or body["w"] or body["a"]):
            raise InvalidUsage("an intent needs reads, writes or adds; this one has none")
        return json.dumps(body, separators=(",", ":"), sort_keys=True)


# ---- the tables ------------------------------------------------------------------------------


def ensure_tables(db: Database) -> None:
    """Create the three system tables if they are missing (idempotent; racing creators are fine)."""
    if db.intent_state.ready:
        return
    for _ in range(5):
        have = set(db.tables())
        missing = [n for n in (INTENTS, OUTCOMES, RESOLVER) if n not in have]
        if not missing:
            db.intent_state.ready = True
            return
        try:
            with db.transaction() as t:
                t._system = SYSTEM_TABLES
                if INTENTS in missing:
                    t.create_table(INTENTS, INTENTS_SCHEMA)
                if OUTCOMES in missing:
                    t.create_table(OUTCOMES, OUTCOMES_SCHEMA)
                if RESOLVER in missing:
                    t.create_table(RESOLVER, RESOLVER_SCHEMA, primary_key=["name"])
        except (TableExists, TransactionConflict):
            continue  # another process created some: look again
    raise TransactionConflict("could not create the intent tables: other processes kept changing the catalog")


# ---- submitting ----------------------------------------------------------------------------


class IntentNotDurable(Exception):
    """An intent whose submit was uncertain never became durable: submit it again."""


class SubmitUncertain(Indeterminate):
    """``submit`` failed after its write may have landed: each intent may or may not be durable.

    Do not submit them again (that could commit them twice): wait on
    ``futures`` instead. Each gives the intent's outcome if it landed, or
    raises :class:`IntentNotDurable` if it is not among the stored intents
    (then submitting again is safe).
    """

    def __init__(self, message: str, futures: list[IntentFuture]) -> None:
        super().__init__(message)
        self.futures = futures


class IntentFuture:
    """The outcome of a submitted intent, once resolved (see the module doc).

    ``uncertain``: its submit raised :class:`SubmitUncertain`; ``epoch`` is then
    only a lower bound, and waiting may end in :class:`IntentNotDurable`.
    """

    def __init__(self, db: Database, intent: str, epoch: int, *, uncertain: bool = False) -> None:
        self.db = db
        self.intent = intent
        self.epoch = epoch
        self.uncertain = uncertain
        self._landed_by: int | None = None  # uncertain: any landing of it is at or below this time
        self._outcome: Outcome | None = None

    def __repr__(self) -> str:
        return f"IntentFuture({self.intent!r}, epoch={self.epoch}, outcome={self._outcome})"

    def done(self) -> bool:
        """Whether the outcome is known (asks this process's resolver state and the outcomes table)."""
        if self._outcome is None:
            self._outcome = lookup(self.db, self.intent, self.epoch)
        return self._outcome is not None

    @property
    def outcome(self) -> Outcome | None:
        """The outcome if known already (no request), else None."""
        return self._outcome

    def result(self, timeout: float | None = 60.0, *, resolve: bool = True) -> Outcome:
        """The outcome: committed or rolled back, and when.

        ``resolve``: run resolution steps while waiting (so no resolver process
        is needed); False waits for another one to resolve. ``TimeoutError``
        if it is not known within ``timeout`` seconds (None: wait forever).
        """
        return wait_all([self], timeout, resolve=resolve)[0]


def wait_all(futures: list[IntentFuture], timeout: float | None = 60.0, *, resolve: bool = True) -> list[Outcome]:
    """The outcomes of ``futures`` (of one database), waiting as :meth:`IntentFuture.result` does.

    Each poll reads the latest time (one head read) and, only when the
    outcomes table was written since the previous poll (the txns log says),
    the outcomes committed since then: one read serves all the futures, and
    no outcome is read twice.
    """
    if not futures:
        return []
    db = futures[0].db
    deadline = None if timeout is None else time.monotonic() + timeout
    attempt = 0
    read_to: int | None = None  # every outcome committed at or below it has been read
    while True:
        pending = [f for f in futures if f._outcome is None]
        if not pending:
            break
        st = db.intent_state
        with st.lock:
            for f in pending:
                f._outcome = st.known.get(f.intent)
        rest = [f for f in pending if f._outcome is None]
        if not rest:
            break
        hi = db.latest()
        lo = min(f.epoch for f in rest) + 1 if read_to is None else read_to + 1
        if hi >= lo:
            found = _outcomes(db, [f.intent for f in rest], lo, hi)
            for f in rest:
                f._outcome = found.get(f.intent)
            read_to = hi
        if all(f._outcome is not None for f in rest):
            break
        _check_durable([f for f in rest if f._outcome is None and f.uncertain])
        if deadline is not None and time.monotonic() > deadline:
            missing = [f.intent for f in futures if f._outcome is None]
            raise TimeoutError(f"{len(missing)} intent(s) ({missing[0]}, ...) have no outcome after {timeout} s")
        if resolve and resolve_intents(db):
            continue
        attempt += 1
        backoff(attempt, cap_s=0.1, base_s=0.001)
    return [f._outcome for f in futures if f._outcome is not None]


def _outcomes(db: Database, intents: list[str], lo: int, hi: int) -> dict[str, Outcome]:
    """The outcomes of ``intents`` committed in ``[lo, hi]`` (``hi`` at most the latest time)."""
    from txns.db.table import Table

    if not db.planner.may_have_written(OUTCOMES, lo, hi):
        return {}
    ch = Table(db, OUTCOMES).changes(lo, hi + 1)
    ch = ch.filter(pc.and_(pc.is_in(ch.column("intent"), pa.array(intents, pa.string())),
                           pc.greater(ch.column("diff"), 0)))  # fmt: skip
    return {r["intent"]: Outcome(r["intent"], r["epoch"], r["committed"], r["ts"], r["reason"]) for r in ch.to_pylist()}


def _check_durable(uncertain: list[IntentFuture]) -> None:
    """IntentNotDurable for an uncertain intent that is not in ``txns_intents``; the others are certain from now.

    Its write, if it landed, landed before the submit raised: at a time in
    ``(epoch, _landed_by]``, where ``_landed_by`` is the latest time read at
    its first wait. So its row is among the changes of that range, or it
    never landed.
    """
    if not uncertain:
        return
    db = uncertain[0].db
    for f in uncertain:
        if f._landed_by is None:
            f._landed_by = db.latest()
    lo = min(f.epoch for f in uncertain)
    hi = max(f._landed_by for f in uncertain if f._landed_by is not None)
    ch = db.table(INTENTS).changes(lo, hi + 1, columns=["intent"])
    present = set(ch.filter(pc.greater(ch.column("diff"), 0)).column("intent").to_pylist())
    for f in uncertain:
        if f.intent not in present:
            raise IntentNotDurable(
                f"intent {f.intent} was never durable (no such intent up to {f._landed_by}); submit it again"
            )
        f.uncertain = False  # it landed: its outcome will come


def submit_many(
    db: Database, intents: list[Mapping[str, Any]], metadata: Mapping[str, Any] | None
) -> list[IntentFuture]:
    """Submit several intents (each a dict with ``reads``/``writes``/``adds``) in one commit."""
    ensure_tables(db)
    with _collector_paused():
        return _submit_many(db, intents, metadata)


def _submit_many(
    db: Database, intents: list[Mapping[str, Any]], metadata: Mapping[str, Any] | None
) -> list[IntentFuture]:
    for i, it in enumerate(intents):
        if not isinstance(it, Mapping) or set(it) - {"reads", "writes", "adds"}:
            raise InvalidUsage(f"intent {i} must be a dict with keys among reads, writes, adds; got {it!r}")
    latest = db.timeline.cached_latest()
    try:  # (the catalog as this process last saw it: no request; a table it has not seen yet: look again)
        enc = _Encoder(db, db.catalog(latest if latest is not None else db.latest()).tables)
        bodies = [enc.encode(it.get("reads"), it.get("writes"), it.get("adds")) for it in intents]
    except TableNotFound:
        enc = _Encoder(db, db.catalog(db.latest()).tables)
        bodies = [enc.encode(it.get("reads"), it.get("writes"), it.get("adds")) for it in intents]
    if not bodies:
        return []
    hexed = os.urandom(16 * len(bodies)).hex()  # (as uuid4: 128 random bits each)
    ids = [hexed[32 * n : 32 * n + 32] for n in range(len(bodies))]
    before = db.timeline.cached_latest()
    try:
        with db.transaction(metadata=metadata) as t:
            t._system = frozenset({INTENTS})
            t.insert(INTENTS, pa.table({"intent": pa.array(ids, pa.string()), "body": pa.array(bodies, pa.string())}))
    except Indeterminate as e:
        futures = [IntentFuture(db, i, before or 0, uncertain=True) for i in ids]
        raise SubmitUncertain(
            f"the submit of {len(ids)} intent(s) may or may not have landed ({e}); do not submit them again: "
            f"wait on this exception's futures (an outcome, or IntentNotDurable if it never landed)",
            futures,
        ) from e
    info = t.commit_info
    assert info is not None and info.ts is not None
    epoch = info.ts
    return [IntentFuture(db, i, epoch) for i in ids]


# ---- resolving -------------------------------------------------------------------------------


def lookup(db: Database, intent: str, epoch: int) -> Outcome | None:
    """The outcome of ``intent`` (submitted at ``epoch``) if it is resolved, else None."""
    return lookup_many(db, [(intent, epoch)])[0]


def lookup_many(db: Database, asked: list[tuple[str, int]]) -> list[Outcome | None]:
    """The outcomes of ``(intent, epoch)`` pairs that are resolved (None for the others).

    This process's own resolutions first; the rest with one read of the
    outcomes table's changes from the smallest epoch on (an outcome commits
    after its epoch).
    """
    st = db.intent_state
    with st.lock:
        out: list[Outcome | None] = [st.known.get(i) for i, _ in asked]
    rest = [(n, i, e) for n, (i, e) in enumerate(asked) if out[n] is None]
    if not rest:
        return out
    hi = db.latest()
    lo = min(e for _, _, e in rest) + 1
    found = _outcomes(db, [i for _, i, _ in rest], lo, hi) if hi >= lo else {}
    for n, i, _ in rest:
        out[n] = found.get(i)
    return out


def resolve_intents(db: Database, max_attempts: int | None = RESOLVE_MAX_ATTEMPTS) -> int:
    """Resolve every closed epoch not resolved yet (one database transaction); how many intents it resolved.

    Safe to run anywhere, any number of times, concurrently (see the module
    doc): a step that loses to another one starts again from its progress
    (:func:`persist.retry_until`, until ``RESOLVE_DEADLINE_S`` or ``max_attempts``).
    """
    ensure_tables(db)
    st = db.intent_state

    def attempt(_state: Attempts) -> int:
        t = db.transaction(metadata={"txns": "resolve intents"}, isolation="strict_serializable")
        t._system = SYSTEM_TABLES
        try:
            with _collector_paused():
                done = _step(db, t)
                if done is None:
                    t.abort()
                    return 0
                info = t.commit()
        except BaseException:
            t.abort()
            raise
        assert info.ts is not None
        with st.lock:
            if info.ts not in db.committer.shared_commits():  # (committed alone: no one's intents at that time)
                st.steps.append(info.ts)
            for i, epoch, ok, why in zip(done.ids, done.epochs, done.committed, done.reasons, strict=True):
                st.known[i] = Outcome(i, epoch, ok, info.ts, why)
            while len(st.known) > KNOWN_OUTCOMES:
                st.known.popitem(last=False)
        return len(done.ids)

    with st.resolving:
        return retry_conflicts(
            attempt,
            what="resolving intents (try again)",
            deadline_s=RESOLVE_DEADLINE_S,
            max_attempts=max_attempts,
            base_s=0.001,
            cap_s=0.05,
        )


@contextlib.contextmanager
def _collector_paused() -> Iterator[None]:
    """Pause CPython's cycle collector while a step or a submit makes (and drops) many small containers.

    Their garbage has no cycles: reference counting frees it. What the pause
    saves are the full collections those allocations trigger, each a scan of
    every tracked object in the process (measured: 16 full collections, 1.7 s,
    over five 10,000-intent steps and their submits). The collector is on
    again afterwards if it was on before.
    """
    was_on = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_on:
            gc.enable()


@dataclasses.dataclass
class _Resolved:
    """The outcomes of one step, in id order (column by column)."""

    ids: list[str]
    epochs: list[int]
    committed: list[bool]
    reasons: list[str | None]


ROLLED_BACK = "a read no longer matched"


def _step(db: Database, t: Transaction) -> _Resolved | None:
    """Stage one resolution step in ``t`` (see the module doc); the outcomes, or None if nothing is to resolve."""
    from txns.db.table import Table

    prog = t.get(RESOLVER, PROGRESS)
    done_to = -1 if prog is None else int(prog["epoch"])
    read_ts = t.read_ts
    st = db.intent_state
    with st.lock:
        own_steps = set(st.steps)
    if read_ts <= done_to or not db.planner.may_have_written(INTENTS, done_to + 1, read_ts, but=own_steps):
        return None
    ch = Table(db, INTENTS).changes(done_to + 1, read_ts + 1)
    ch = ch.filter(pc.greater(ch.column("diff"), 0))
    if ch.num_rows == 0:
        return None
    ch = ch.sort_by([("ts", "ascending"), ("intent", "ascending")])
    ids = ch.column("intent").to_pylist()
    epochs = ch.column("ts").to_pylist()
    # one parse for every body (a JSON array of the bodies); keys become tuples in place
    bodies: list[dict[str, list[list[Any]]]] = json.loads("[" + ",".join(ch.column("body").to_pylist()) + "]")
    # the tables as t sees them; intents naming a table that is gone roll back
    tables = db.catalog(read_ts).tables  # (t has no DDL: its view is the catalog at its read time)
    usable = {n for n, e in tables.items() if e.primary_key is not None and not _system(n)}
    keys: dict[str, set[Key]] = {}
    gone: dict[int, list[str]] = {}
    any_adds = False
    for n, body in enumerate(bodies):
        missing: set[str] | None = None
        for side in ("r", "w", "a"):
            for x in body[side]:
                tb = x[0]
                x[1] = k = tuple(x[1])
                if tb in usable:
                    keys.setdefault(tb, set()).add(k)
                else:
                    missing = {tb} if missing is None else missing | {tb}
        any_adds = any_adds or bool(body["a"])
        if missing is not None:
            gone[n] = sorted(missing)
    base: dict[TableKey, dict[str, Any] | None] = {}
    for table, ks in sorted(keys.items()):
        for k, row in t.get_many(table, list(ks)).items():
            base[(table, k)] = row
    if any_adds:
        intents = [
            _Intent(ep, i, [(x[0], x[1], x[2]) for x in body["r"]], [(x[0], x[1], x[2]) for x in body["w"]],
                    [(x[0], x[1], x[2]) for x in body["a"]])
            for ep, i, body in zip(epochs, ids, bodies, strict=True)
        ]  # fmt: skip
        committed, final = _evaluate_sequential(intents, gone, base)
    else:
        committed, final = _evaluate_fixpoint(bodies, gone, base)
    reasons = [
        None if ok else (f"table(s) {gone[n]} no longer exist" if n in gone else ROLLED_BACK)
        for n, ok in enumerate(committed)
    ]
    upserts: dict[str, list[dict[str, Any]]] = {}
    deletes: dict[str, list[Key]] = {}
    for (table, k), row in final.items():
        if row == base.get((table, k)):
            continue
        if row is None:
            deletes.setdefault(table, []).append(k)
        else:
            upserts.setdefault(table, []).append(row)
    for table, rs in sorted(upserts.items()):
        t.upsert(table, rs)
    for table, gone_keys in sorted(deletes.items()):
        t.delete(table, gone_keys)
    t.insert(
        OUTCOMES,
        pa.table({"intent": pa.array(ids, pa.string()), "epoch": pa.array(epochs, pa.int64()),
                  "committed": pa.array(committed, pa.bool_()), "reason": pa.array(reasons, pa.string())}),
    )  # fmt: skip
    t.upsert(RESOLVER, [{"name": PROGRESS, "epoch": read_ts}])
    # Retire the resolved intents in the same commit: their outcomes are recorded and nothing reads
    # an intent below the progress again but by its history (changes keep the insertion), so
    # compaction past the table's retention drops them (the table does not grow with every intent).
    t._retract_present(INTENTS, ch.select(["intent", "body"]))
    return _Resolved(ids, epochs, committed, reasons)


def _evaluate_sequential(
    intents: list[_Intent], gone: dict[int, list[str]], base: dict[TableKey, dict[str, Any] | None]
) -> tuple[list[bool], dict[TableKey, dict[str, Any] | None]]:
    """The rule in id order, one intent at a time (the path for steps with adds): each intent's outcome, and
    the final row of every key a committed one changed."""
    state = dict(base)
    final: dict[TableKey, dict[str, Any] | None] = {}
    committed = []
    for n, it in enumerate(intents):
        if n in gone or any(state.get((tb, k)) != v for tb, k, v in it.reads):
            committed.append(False)
            continue
        for tb, k, v in it.writes:
            state[(tb, k)] = final[(tb, k)] = v
        for tb, k, deltas in it.adds:
            cur = state.get((tb, k))
            if cur is None:
                continue  # (an add to a missing row adds nothing)
            new = dict(cur)
            for col, d in deltas.items():
                new[col] = (new[col] or 0) + d
            state[(tb, k)] = final[(tb, k)] = new
        committed.append(True)
    return committed, final


def _evaluate_fixpoint(
    bodies: list[dict[str, list[list[Any]]]], gone: dict[int, list[str]], base: dict[TableKey, dict[str, Any] | None]
) -> tuple[list[bool], dict[TableKey, dict[str, Any] | None]]:
    """Plain intents (decoded bodies, keys as tuples) through :func:`txns.resolve.resolve`; base rows are id 0's writes.

    The relation's keys and values are dense integer codes: a (table, key)
    pair by equality, a row by its sorted items (rows hold only JSON-typed
    values, and both the stored intents and the rows read come back as the
    same Python types, so equal rows give equal codes); null is "absent".
    """
    kcode: dict[TableKey, int] = {}
    vcode: dict[tuple[tuple[str, Any], ...], int] = {}
    rows: list[dict[str, Any]] = []
    ids: list[int] = []
    is_read: list[bool] = []
    kc: list[int] = []
    vc: list[int | None] = []

    def row_code(canon: tuple[tuple[str, Any], ...], v: dict[str, Any]) -> int:
        d = vcode.get(canon)
        if d is None:
            d = vcode[canon] = len(rows)
            rows.append(v)
        return d

    for tk, row in base.items():
        if row is not None:
            ids.append(0)
            is_read.append(False)
            kc.append(kcode.setdefault(tk, len(kcode)))
            vc.append(row_code(tuple(sorted(row.items())), row))
    for n, body in enumerate(bodies, start=1):
        if n - 1 in gone:
            continue
        for read, side in ((True, body["r"]), (False, body["w"])):
            for tb, k, v in side:
                ids.append(n)
                is_read.append(read)
                kc.append(kcode.setdefault((tb, k), len(kcode)))
                # (a body's rows come with their columns sorted: encode dumps them with sort_keys)
                vc.append(None if v is None else row_code(tuple(v.items()), v))
    relation = pa.table(
        {"id": pa.array(ids, pa.int64()), "is_read": pa.array(is_read, pa.bool_()),
         "key": pa.array(kc, pa.int64()), "val": pa.array(vc, pa.int64())}
    )  # fmt: skip
    res = resolve(relation)
    rolled = set(res.rollback.column("id").to_pylist())
    committed = [n not in rolled and n - 1 not in gone for n in range(1, len(bodies) + 1)]
    store = dict(zip(res.store.column("key").to_pylist(), res.store.column("val").to_pylist(), strict=True))
    final: dict[TableKey, dict[str, Any] | None] = {}
    for n, body in enumerate(bodies, start=1):
        if committed[n - 1]:
            for tb, k, _ in body["w"]:
                tk = (tb, k)
                if tk not in final:
                    v = store.get(kcode[tk])
                    final[tk] = None if v is None else rows[v]
    return committed, final


__all__ = [
    "INTENTS",
    "OUTCOMES",
    "RESOLVER",
    "SubmitUncertain",
    "IntentFuture",
    "IntentNotDurable",
    "Outcome",
    "ensure_tables",
    "lookup",
    "lookup_many",
    "resolve_intents",
    "submit_many",
    "wait_all",
]
