"""A Hypothesis state machine of the database against a model.

Random transactions mix DDL (create, drop, rename) with inserts and
retractions across a few tables; a transaction either commits or raises
(a bad operation inside it, or an exception of the caller's) and then
commits nothing. After every step, every read is checked against the model:
the latest contents of every table, the contents as of every earlier commit,
``tables(as_of)`` at every commit, and ``history()``. Other steps reopen the
database from a fresh connection (nothing cached), and compact it with a
zero retention: reads below the new sinces must then raise
``ReadBelowSince``, reads at or above them must be unchanged.

Runs on a ``file://`` store. ``HYPOTHESIS_PROFILE=slow`` runs it deeper.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import shutil
import tempfile
from collections import Counter
from dataclasses import dataclass, field

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

import txns
from persist import ReadBelowSince

NAMES = ["a", "b", "c", "d"]
SCHEMAS = [
    pa.schema([pa.field("k", pa.int64(), nullable=False), pa.field("v", pa.string())]),
    pa.schema([pa.field("x", pa.int32())]),
]
VALUES = [
    [{"k": k, "v": v} for k in range(3) for v in ("p", "q", None)],
    [{"x": x} for x in (None, 0, 1, 2)],
]

_COMMON = {
    "deadline": None,
    "suppress_health_check": [HealthCheck.too_slow, HealthCheck.filter_too_much, HealthCheck.data_too_large],
}
settings.register_profile("db-ci", max_examples=12, stateful_step_count=14, **_COMMON)  # type: ignore[arg-type]
settings.register_profile("db-slow", max_examples=100, stateful_step_count=40, **_COMMON)  # type: ignore[arg-type]
PROFILE = settings.get_profile("db-slow" if os.environ.get("HYPOTHESIS_PROFILE") == "slow" else "db-ci")


class CallerError(Exception):
    """An exception of the caller's, raised inside a transaction."""


def key(row: dict) -> tuple:
    return tuple(sorted(row.items(), key=lambda kv: kv[0]))


@dataclass
class ModelTable:
    schema: int
    ident: int  # which table this is (a rename keeps it, a new table gets a new one)
    rows: Counter = field(default_factory=Counter)

    def copy(self) -> ModelTable:
        return ModelTable(self.schema, self.ident, Counter(self.rows))


@dataclass
class Commit:
    ts: int
    tables: dict[str, ModelTable]
    ops: list[str]
    added: int
    retracted: int
    metadata: dict


class DatabaseMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.dir = tempfile.mkdtemp(prefix="txns-db-model-")
        self.url = f"file://{self.dir}/db"
        self.db = txns.connect(self.url)
        self.tables: dict[str, ModelTable] = {}
        self.commits: list[Commit] = []
        self.n = 0
        self.n_tables = 0

    def teardown(self) -> None:
        self.db.close()
        shutil.rmtree(self.dir, ignore_errors=True)

    @initialize()
    def start(self) -> None:
        assert self.db.tables() == []

    # ---- transactions --------------------------------------------------------------------------

    @rule(data=st.data(), n_ops=st.integers(1, 4), caller_fails=st.booleans())
    def transaction(self, data: st.DataObject, n_ops: int, caller_fails: bool) -> None:
        self.n += 1
        work = {n: t.copy() for n, t in self.tables.items()}
        ops: list[str] = []
        counts: dict[int, list[int]] = {}  # table ident -> [added, retracted]
        created: set[int] = set()
        expected_error: type[BaseException] | None = None
        meta = {"n": self.n}
        try:
            with self.db.transaction(metadata=meta) as t:
                for _ in range(n_ops):
                    kind = data.draw(
                        st.sampled_from(["create", "drop", "rename", "insert", "insert", "retract", "retract"])
                    )
                    # mostly a table that exists (as the transaction sees it), sometimes any name
                    known = kind != "create" and bool(work) and data.draw(st.integers(0, 4)) > 0
                    name = data.draw(st.sampled_from(sorted(work) if known else NAMES))
                    if kind == "create":
                        s = data.draw(st.integers(0, 1))
                        expected_error = txns.TableExists if name in work else None
                        t.create_table(name, SCHEMAS[s])
                        self.n_tables += 1
                        work[name] = ModelTable(s, self.n_tables)
                        created.add(self.n_tables)
                        ops.append(f"create {name}")
                    elif kind == "drop":
                        expected_error = None if name in work else txns.TableNotFound
                        t.drop_table(name)
                        del work[name]
                        ops.append(f"drop {name}")
                    elif kind == "rename":
                        new = data.draw(st.sampled_from(NAMES))
                        expected_error = (
                            txns.TableNotFound if name not in work else txns.TableExists if new in work else None
                        )
                        t.rename_table(name, new)
                        work[new] = work.pop(name)
                        ops.append(f"rename {name} {new}")
                    elif kind == "insert":
                        expected_error = None if name in work else txns.TableNotFound
                        s = work[name].schema if name in work else 0
                        rows = data.draw(st.lists(st.sampled_from(VALUES[s]), min_size=1, max_size=4))
                        t.insert(name, rows)
                        work[name].rows.update(key(r) for r in rows)
                        counts.setdefault(work[name].ident, [0, 0])[0] += len(rows)
                    else:
                        expected_error = None if name in work else txns.TableNotFound
                        s = work[name].schema if name in work else 0
                        present = sorted(work[name].rows.elements(), key=repr) if name in work else []
                        absent = data.draw(st.booleans()) or not present
                        if absent:
                            row = data.draw(st.sampled_from(VALUES[s]))
                            rows = [row] * (work[name].rows[key(row)] + 1 if name in work else 1)
                            if name in work:
                                expected_error = txns.RowNotFound
                        else:
                            picks = data.draw(
                                st.lists(st.integers(0, len(present) - 1), min_size=1, max_size=3, unique=True)
                            )
                            rows = [dict(present[i]) for i in picks]
                        t.retract(name, rows)
                        work[name].rows.subtract(key(r) for r in rows)
                        work[name].rows = +work[name].rows
                        counts.setdefault(work[name].ident, [0, 0])[1] += len(rows)
                    assert expected_error is None, f"expected {expected_error.__name__}"
                if caller_fails:
                    raise CallerError()
        except CallerError:
            event("transaction: the caller raised")
            return
        except (txns.TableExists, txns.TableNotFound, txns.RowNotFound) as e:
            assert expected_error is not None and isinstance(e, expected_error), (e, expected_error)
            event(f"transaction: {type(e).__name__}")
            return
        event("transaction: committed")
        info = t.commit_info
        assert info is not None
        # a table created and dropped again in one transaction takes its rows with it
        live = {m.ident for m in work.values()}
        kept = [c for i, c in counts.items() if i in live or i not in created]
        added, retracted = sum(c[0] for c in kept), sum(c[1] for c in kept)
        if info.ts is None:  # nothing to commit: no data kept, and the DDL undid itself
            assert added == retracted == 0
            assert {n: (m.ident, m.schema) for n, m in work.items()} == {
                n: (m.ident, m.schema) for n, m in self.tables.items()
            }
            event("transaction: nothing to commit")
            return
        assert not self.commits or info.ts > self.commits[-1].ts
        self.tables = work
        self.commits.append(
            Commit(info.ts, {n: x.copy() for n, x in work.items()}, ops, added, retracted, meta)
        )

    @rule()
    def reopen(self) -> None:
        """A fresh connection: nothing cached from the old one."""
        self.db.close()
        self.db = txns.connect(self.url, create=False)

    @precondition(lambda self: len(self.commits) > 1)
    @rule()
    def compact_with_zero_retention(self) -> None:
        db = self.db
        event("compacted")
        latest = db.latest()
        db.set_retention(dt.timedelta(0))
        db.compact()
        db.set_retention(dt.timedelta(days=7))
        for name in db.tables():
            d = db.entry(name, db.latest()).data_id
            assert db.client.inspect(d)["since"] <= latest  # never past what is readable

    # ---- checks ----------------------------------------------------------------------------------

    def _since(self, data_id: str) -> int:
        return self.db.client.shard(data_id).fetch().since

    @invariant()
    def latest_reads_match(self) -> None:
        db = self.db
        assert db.tables() == sorted(self.tables)
        for name, m in self.tables.items():
            got = db.table(name).to_arrow()
            assert got.schema == SCHEMAS[m.schema]
            assert Counter(key(r) for r in got.to_pylist()) == m.rows, name

    @invariant()
    def time_travel_matches(self) -> None:
        db = self.db
        cat_since = self._since(db.root.catalog_id)
        for c in self.commits:
            if c.ts < cat_since:
                event("read below the retained history")
                with pytest.raises(ReadBelowSince):
                    db.tables(as_of=c.ts)
                continue
            assert db.tables(as_of=c.ts) == sorted(c.tables)
            for name, m in c.tables.items():
                tbl = txns.Table(db, name)
                if c.ts < self._since(db.entry(name, c.ts).data_id):
                    with pytest.raises(ReadBelowSince, match="earliest readable time"):
                        tbl.to_arrow(as_of=c.ts)
                    continue
                got = tbl.to_arrow(as_of=c.ts)
                assert Counter(key(r) for r in got.to_pylist()) == m.rows, (name, c.ts)

    @invariant()
    def history_matches(self) -> None:
        h = self.db.history().to_pylist()
        ours = [r for r in h if json.loads(r["metadata"]).get("n") is not None]
        assert len(ours) == len(self.commits)
        for r, c in zip(ours, reversed(self.commits), strict=True):
            assert r["ts"] == c.ts
            assert r["operations"] == c.ops
            assert (r["rows_added"], r["rows_retracted"]) == (c.added, c.retracted)
            assert json.loads(r["metadata"]) == c.metadata


DatabaseMachine.TestCase.settings = PROFILE
TestDatabaseModel = DatabaseMachine.TestCase
