"""Engines found by registration (txns.engines) and working through the public interface (txns.db.engine).

An engine of the test's own (its "DataFrames" are lists of ints, written
with a persist batch builder, as executors would) goes through the same
path as Spark's: ``t.insert`` asks the registry, the engine adds its batch
through :class:`txns.db.engine.EngineTxn`.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

import txns
from persist import InvalidUsage, PersistConfig
from tests import helpers
from txns import engines
from txns.db.engine import EngineTxn

SCHEMA = pa.schema([("x", pa.int64())])


class Ints(list[int]):
    """The test engine's DataFrame."""


class IntsEngine:
    name = "test-ints"

    def __init__(self) -> None:
        self.batches: list[Any] = []

    def accepts(self, data: object) -> bool:
        return isinstance(data, Ints)

    def insert(self, txn: EngineTxn, table: str, data: Any) -> int:
        e = txn.entry(table)
        b = txn.db.client.open_writer(e.data_id, txn.shard_schema(e)).builder(0, 1)
        n = len(data)
        b.add_table(pa.table({"x": pa.array(data, pa.int64()), "ts": pa.array([0] * n, pa.uint64()), "diff": [1] * n}))
        batch = b.finish()
        self.batches.append(batch)
        txn.add_batch(table, batch, added=n, retracted=0, read_table=False)
        return n

    def speculate(self, db: Any, ts: int, fns: Sequence[Callable[..., Any]], *, workers: Any, session: Any) -> Any:
        raise NotImplementedError


@pytest.fixture
def ints() -> Iterator[IntsEngine]:
    engine = IntsEngine()
    engines.register(engine)
    yield engine
    engines.unregister(engine.name)


def test_insert_hands_a_registered_engines_frame_to_it(tmp_path: Path, ints: IntsEngine) -> None:
    db = txns.connect(helpers.file_url(tmp_path / "db"), config=PersistConfig(inline_max_bytes=0))  # (parts: files)
    try:
        db.create_table("t", SCHEMA)
        with db.transaction() as t:
            assert t.insert("t", Ints([1, 2, 3])) == 3
            assert t.insert("t", [{"x": 4}]) == 1  # (Python rows mix in)
            with pytest.raises(InvalidUsage, match="does not keep"):  # an engine's rows are not kept
                t.read("t")
        assert sorted(r["x"] for r in db.table("t").to_arrow().to_pylist()) == [1, 2, 3, 4]
        # abandoned: the engine's parts are deleted with the transaction
        with pytest.raises(RuntimeError), db.transaction() as t:
            t.insert("t", Ints([5]))
            raise RuntimeError("abandon")
        parts = [p.key for r in ints.batches[-1].runs for p in r.parts]
        assert parts and all(db.client.blob.get(k) is None for k in parts)
        assert db.table("t").count() == 4
    finally:
        db.close()


def test_without_the_engine_a_frame_is_no_input(tmp_path: Path) -> None:
    db = txns.connect(helpers.file_url(tmp_path / "db"))
    try:
        db.create_table("t", SCHEMA)
        with db.transaction() as t, pytest.raises(InvalidUsage, match="row #0 is a int, not a dict"):
            t.insert("t", Ints([1]))  # (a list of ints is no table input: nobody registered the engine)
    finally:
        db.close()


def test_a_loader_registers_its_engine_when_an_object_of_its_package_comes() -> None:
    loaded: list[str] = []
    engine = IntsEngine()

    def load() -> None:
        loaded.append("x")
        engines.register(engine)

    # (this test module's objects come from the top-level package "tests")
    engines.register_loader("tests", "test-ints", load)
    try:
        assert engines.engine_for(Ints([1])) is engine
        assert engines.engine_for(Ints([2])) is engine
        assert loaded == ["x"]  # once: the engine answers from then on
        assert engines.engine_for([1]) is None
        assert engines.engine_named("test-ints") is engine
    finally:
        engines.unregister(engine.name)
        engines._loaders[:] = [x for x in engines._loaders if x.load is not load]


def test_a_pyspark_frame_loads_txns_spark_without_anyone_importing_it() -> None:
    pytest.importorskip("pyspark")
    # (a DataFrame object without a session: only its class matters to the registry)
    code = (
        "import sys\n"
        "import txns.db\n"
        "from pyspark.sql.classic.dataframe import DataFrame\n"
        "assert 'txns.spark' not in sys.modules\n"
        "from txns.engines import engine_for\n"
        "e = engine_for(DataFrame.__new__(DataFrame))\n"
        "print(e.name, 'txns.spark' in sys.modules)\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["spark", "True"]
