"""``run_batch(executor="spark")``: the parallel phase on Spark executors commits what serial execution does."""

from __future__ import annotations

import os
import random
import shutil
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

import txns
import txns.spark
from persist import InvalidUsage
from tests import helpers
from tests.db.test_run_batch import check_serial, contents, new_db
from tests.resolve.test_repair import TABLE, Increment, Transfer, sequential
from txns.db.batch import run_batch
from txns.resolve.repair import ABORTED

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

pytestmark = pytest.mark.spark

BASE = {f"a{i}": 10 for i in range(6)}


def workload(n: int = 40, seed: int = 11) -> list[Any]:
    """Transfers among 6 accounts (some abort: too little in the source), a few increments, one closure."""
    rng = random.Random(seed)
    fns: list[Any] = []
    for i in range(n):
        if i % 10 == 9:
            fns.append(Increment(f"a{rng.randrange(6)}", 3))
        else:
            fns.append(Transfer(f"a{rng.randrange(6)}", f"a{rng.randrange(6)}", rng.randrange(1, 9)))
    bonus = 2

    def closure(ctx: Any) -> None:  # (cloudpickled: a closure is fine on Spark)
        r = ctx.get(TABLE, "a0")
        ctx.put(TABLE, {"id": "a0", "bal": r["bal"] + bonus})

    fns[20] = closure
    return fns


def test_spark_equals_serial_and_executor_none(spark: SparkSession, tmp_path: Path) -> None:
    fns = workload()
    db = new_db(BASE, helpers.file_url(tmp_path / "db"))
    db.close()
    shutil.copytree(tmp_path / "db", tmp_path / "copy")
    db = txns.connect(helpers.file_url(tmp_path / "db"))
    try:
        before = db.history().num_rows
        res = run_batch(db, fns, executor="spark", spark=spark, workers=3)
        check_serial(db, BASE, fns, res)  # the final table, outcomes, results, executions == n + repairs
        assert db.history().num_rows - before == 1  # one database transaction
        assert res.attempts == 1 and res.repairs >= 1  # the transfers chain: some speculation was stale
        _, outcomes, _ = sequential(fns, BASE)
        assert ABORTED in outcomes  # the workload has aborts, and they dropped only their function
        assert set(res.aborted) == {i for i, o in enumerate(outcomes) if o == ABORTED}
        spark_state = contents(db)
    finally:
        db.close()
    with txns.connect(helpers.file_url(tmp_path / "copy")) as copy:
        serial = run_batch(copy, fns, executor=None)
        assert contents(copy) == spark_state
        assert serial.outcomes == res.outcomes and serial.results == res.results


def test_active_session_and_the_package_entry_point(spark: SparkSession, tmp_path: Path) -> None:
    base = {"a": 5, "b": 0}
    fns: list[Any] = [Transfer("a", "b", 3), Transfer("a", "b", 3), Increment("b", 1)]  # the second aborts
    with new_db(base, helpers.file_url(tmp_path / "db")) as db:
        res = txns.spark.run_batch(db, fns)  # the active session
        check_serial(db, base, fns, res)
        assert res.aborted == {1: "insufficient funds in a"} and contents(db) == {"a": 2, "b": 4}
        res = db.run_batch([Increment("c", 1)] * 4, executor="spark")
        assert contents(db)["c"] == 4 and res.executions == 4 + res.repairs


def test_mem_url_is_refused(spark: SparkSession) -> None:
    db = new_db({"a": 1})
    with pytest.raises(InvalidUsage, match=r"memory.*file:// or s3://"):
        run_batch(db, [Increment("a", 1)], executor="spark", spark=spark)
    assert contents(db) == {"a": 1}


def test_no_session_is_a_clear_error(spark: SparkSession, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from pyspark.sql import SparkSession

    monkeypatch.setattr(SparkSession, "getActiveSession", classmethod(lambda cls: None))
    with new_db({"a": 1}, helpers.file_url(tmp_path / "db")) as db:
        with pytest.raises(InvalidUsage, match=r"no active SparkSession.*spark="):
            run_batch(db, [Increment("a", 1)], executor="spark")
        assert contents(db) == {"a": 1}


def test_bad_arguments(spark: SparkSession, tmp_path: Path) -> None:
    with new_db({"a": 1}, helpers.file_url(tmp_path / "db")) as db:
        with pytest.raises(InvalidUsage, match="executor='spark' only"):
            run_batch(db, [Increment("a", 1)], executor="threads", spark=spark)
        with pytest.raises(InvalidUsage, match=r"classic SparkSession.*str"):
            run_batch(db, [Increment("a", 1)], executor="spark", spark="local")  # type: ignore[arg-type]
        lock = threading.Lock()
        with pytest.raises(InvalidUsage, match=r"function 1 .*cannot be pickled"):
            run_batch(db, [Increment("a", 1), lambda ctx: lock], executor="spark", spark=spark)
        assert contents(db) == {"a": 1}


def test_runs_happen_in_executors_and_errors_propagate_from_the_repair(spark: SparkSession, tmp_path: Path) -> None:
    with new_db({"a": 1}, helpers.file_url(tmp_path / "db")) as db:
        # (reads nothing, so each speculative run stands: its result is the executor's process id)
        res = run_batch(db, [lambda ctx: os.getpid()] * 4, executor="spark", spark=spark)
        assert res.repairs == 0 and os.getpid() not in res.results

        def boom(ctx: Any) -> None:
            ctx.get(TABLE, "a")
            raise RuntimeError("boom")

        # an executor only records the error; the function runs again on the driver, where it counts
        with pytest.raises(RuntimeError, match="boom"):
            run_batch(db, [Increment("a", 1), boom], executor="spark", spark=spark)
        assert contents(db) == {"a": 1}


def test_the_spark_entry_point_retries_until_a_deadline_not_a_count(monkeypatch: pytest.MonkeyPatch) -> None:
    """``txns.spark.run_batch`` stops as ``db.run_batch`` does: at the deadline, unless given a count."""
    import txns.spark.batch as spark_batch

    seen: list[dict[str, Any]] = []
    monkeypatch.setattr(spark_batch, "_db_run_batch", lambda db, fns, **kw: seen.append(kw))
    spark_batch.run_batch(None, [])  # type: ignore[arg-type]
    spark_batch.run_batch(None, [], deadline_s=5.0)  # type: ignore[arg-type]
    spark_batch.run_batch(None, [], max_attempts=3)  # type: ignore[arg-type]
    assert [(kw["max_attempts"], kw["deadline_s"]) for kw in seen] == [(None, None), (None, 5.0), (3, None)]
    assert all(kw["executor"] == "spark" for kw in seen)
