"""The database layer's structure: collaborators own their concern and never depend on the whole ``Database``."""

from __future__ import annotations

import ast
import threading
import uuid
from pathlib import Path

import pyarrow as pa
import pytest

import txns
from persist import InvalidUsage, finish_all
from txns.db.args import check_positive_int
from txns.db.pool import each, each_or_raise

DB = Path(__file__).resolve().parents[2] / "txns" / "db"
COLLABORATORS = [
    "catalog.py",
    "committer.py",
    "history.py",
    "oracle.py",
    "planner.py",
    "retention.py",
    "timeline.py",
    "validation.py",
    "keyed.py",
    "opening.py",
]


@pytest.mark.parametrize("name", COLLABORATORS)
def test_a_collaborator_never_imports_the_database_facade(name: str) -> None:
    tree = ast.parse((DB / name).read_text())
    imported = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    imported |= {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    assert "txns.db.database" not in imported, f"{name} depends on the whole Database"


def test_the_facade_class_stays_small() -> None:
    tree = ast.parse((DB / "database.py").read_text())
    (cls,) = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Database"]
    assert cls.end_lineno is not None and cls.end_lineno - cls.lineno < 500


class _Builder:
    def __init__(self, name: str, fail: bool, finished: list[str]) -> None:
        self.name, self.fail, self.finished = name, fail, finished

    def finish(self) -> str:
        self.finished.append(self.name)
        if self.fail:
            raise OSError(f"upload of {self.name} failed")
        return f"batch {self.name}"


@pytest.mark.parametrize("fan_out", [None, each])
def test_finish_all_finishes_every_builder_and_keeps_the_first_failure(fan_out: object) -> None:
    finished: list[str] = []
    builders = {k: _Builder(k, k in ("b", "d"), finished) for k in "abcde"}
    done, failure = finish_all(builders, fan_out)  # type: ignore[arg-type]
    assert sorted(finished) == list("abcde")  # every builder had its try
    assert done == {k: f"batch {k}" for k in "ace"}
    assert isinstance(failure, OSError) and "upload of b failed" in str(failure)  # the first key's, in order


def test_each_or_raise_runs_every_call_then_raises_the_first_failure() -> None:
    ran: list[int] = []
    lock = threading.Lock()

    def fn(x: int) -> int:
        with lock:
            ran.append(x)
        if x in (2, 3):
            raise ValueError(x)
        return x * 10

    assert each_or_raise(fn, [1, 4]) == [10, 40]
    ran.clear()
    with pytest.raises(ValueError, match="2"):
        each_or_raise(fn, [1, 2, 3, 4])
    assert sorted(ran) == [1, 2, 3, 4]


@pytest.mark.parametrize("bad", [0, -1, True, 1.5, "3"])
def test_check_positive_int_refuses_what_is_not_a_positive_int(bad: object) -> None:
    with pytest.raises(InvalidUsage, match=r"workers must be a positive int or None, got"):
        check_positive_int(bad, "workers")


def test_check_positive_int_passes_positive_ints_and_none() -> None:
    assert check_positive_int(None, "workers") is None
    assert check_positive_int(3, "workers") == 3


def test_timestamp_names_what_resolve_did_and_resolve_warns() -> None:
    db = txns.connect(f"mem://facade-ts-{uuid.uuid4().hex}")
    try:
        db.create_table("t", pa.schema([("x", pa.int64())]))
        with db.transaction() as t:
            t.insert("t", [{"x": 1}])
        committed = t.commit_info.ts  # type: ignore[union-attr]
        assert db.timestamp() == db.latest() >= committed
        assert db.timestamp(committed) == committed
        with pytest.warns(DeprecationWarning, match=r"Database.timestamp\(as_of\)"):
            assert db.resolve(committed) == committed
    finally:
        db.close()
