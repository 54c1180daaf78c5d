"""txns.spark.resolve: the rollback fixpoint as a Spark job, against the Python resolver and the sequential rule.

Workloads come from tests/resolve/test_resolve.py (its Hypothesis strategies,
its independent references :func:`model` and :func:`fixpoint`, the
reference's nine transactions); each is resolved by Spark (the session-scoped
``local[2]`` ``spark`` fixture) and by :func:`txns.resolve.resolve` and
:func:`txns.resolve.sequential`, and all must agree: rollback, store and
rounds. Each example runs a few Spark jobs, so the property runs few examples.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import txns.resolve
import txns.spark
from persist import InvalidUsage
from tests.resolve.test_resolve import (
    POST,
    POST_STORE,
    STRUCT_KEY,
    Row,
    _post_struct,
    fixpoint,
    model,
    rolled_of,
    store_of,
    table,
    txn_rows,
    typed,
)

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

pytestmark = pytest.mark.spark


SMALL_DATA_CONF = {"spark.sql.adaptive.enabled": "false", "spark.sql.shuffle.partitions": "2"}


@pytest.fixture(autouse=True, scope="module")
def small_data_conf(spark: SparkSession) -> Iterator[None]:
    """For these few-row inputs: no adaptive re-planning (a job per shuffle stage) and 2 shuffle partitions.

    The answers do not depend on either; without them each resolution's jobs take about twice as long.
    ``test_post_example`` resolves once with the session's own settings.
    """
    before = {k: spark.conf.get(k) for k in SMALL_DATA_CONF}
    for k, v in SMALL_DATA_CONF.items():
        spark.conf.set(k, v)
    try:
        yield
    finally:
        for k, old in before.items():
            spark.conf.set(k, old)


@contextlib.contextmanager
def session_defaults(spark: SparkSession) -> Iterator[None]:
    """The session's own settings (adaptive execution on, 4 shuffle partitions) for a while."""
    mine = {k: spark.conf.get(k) for k in SMALL_DATA_CONF}
    spark.conf.unset("spark.sql.adaptive.enabled")
    spark.conf.set("spark.sql.shuffle.partitions", "4")
    try:
        yield
    finally:
        for k, v in mine.items():
            spark.conf.set(k, v)


SPARK_EXAMPLES = int(os.environ.get("RESOLVE_SPARK_EXAMPLES", "6"))
"""Hypothesis examples of the Spark-vs-Python property (each bundles 1-3 workloads): 6 in CI, more on demand."""


def frame(spark: SparkSession, t: pa.Table) -> DataFrame:
    return spark.createDataFrame(t)


def answers(res: txns.spark.SparkResolution) -> tuple[list[Any], dict[Any, Any], int]:
    """(rolled back ids, ascending; store as a dict; rounds), checking the store has each key once."""
    return sorted(res.rollback.toArrow()["id"].to_pylist()), store_of(res.store.toArrow()), res.rounds


def check_against_python(spark: SparkSession, t: pa.Table, **kw: Any) -> txns.spark.SparkResolution:
    res = txns.spark.resolve(spark, frame(spark, t), **kw)
    py = txns.resolve.resolve(t)
    rb, store = txns.resolve.sequential(t)
    got = answers(res)
    assert got == (rolled_of(py.rollback), store_of(py.store), py.rounds)
    assert got[:2] == (rolled_of(rb), store_of(store))
    return res


@pytest.mark.spark
def test_post_example(spark: SparkSession) -> None:
    with session_defaults(spark):
        res = check_against_python(spark, table(POST))
    assert answers(res) == ([4, 8, 9], POST_STORE, 3)
    rollback_df, store_df = res  # unpacks as the two DataFrames
    assert rollback_df.columns == ["id"] and store_df.columns == ["key", "val"]
    # struct keys {table, key}, int values
    rows = [(i, r, k, None if v is None else sum(map(ord, v))) for i, r, k, v in _post_struct(POST)]
    t = table(rows, STRUCT_KEY, pa.int64())
    res = check_against_python(spark, t)
    assert answers(res)[0] == [4, 8, 9] and res.rounds == 3
    assert res.store.schema["key"].dataType.simpleString() == "struct<table:string,key:bigint>"
    assert store_of(res.store.toArrow()) == model(rows)[1]


@st.composite
def workloads(draw: st.DrawFn) -> tuple[list[list[Row]], bool]:
    """A few of tests/resolve's workloads (struct or string keys, deletes, absent reads), some rows twice."""
    struct = draw(st.booleans())
    out = []
    for _ in range(draw(st.integers(1, 3))):
        ids = draw(st.lists(st.integers(0, 40), unique=True, max_size=8))
        rows = draw(txn_rows(ids, struct))
        twice = draw(st.lists(st.sampled_from(rows), max_size=3)) if rows else []
        out.append(rows + twice)
    return out, struct


def side_by_side(parts: list[list[Row]], struct: bool) -> list[Row]:
    """The workloads as one: ids and keys made disjoint (key k of part j: table/prefix j), so none sees another."""
    rows: list[Row] = []
    for j, part in enumerate(parts):
        for i, r, k, v in part:
            key = {"table": f"{k['table']}{j}", "key": k["key"]} if struct else f"{j}:{k}"
            rows.append((i + 1000 * j, r, key, v))
    return rows


@pytest.mark.spark
@settings(max_examples=SPARK_EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(case=workloads())
def test_same_answers_as_python(spark: SparkSession, case: tuple[list[list[Row]], bool]) -> None:
    """Several workloads per Spark job, disjoint: each resolves as alone, and rounds are the longest one's."""
    parts, struct = case
    rows = side_by_side(parts, struct)
    res = check_against_python(spark, typed(rows, struct))
    assert answers(res)[:2] == model(rows)
    assert res.rounds == fixpoint(rows)[1] == max(fixpoint(p)[1] for p in parts)


@pytest.mark.spark
def test_empty_input(spark: SparkSession) -> None:
    res = check_against_python(spark, table([]))
    assert answers(res) == ([], {}, 1)


def chain(n: int, root_fails_alone: bool) -> list[Row]:
    """t_1 reads what t_0 writes, t_2 what t_1 writes, ...: t_0's rollback reaches t_i in round i + 1.

    ``root_fails_alone``: t_0 reads a key no one writes expecting a value (it fails in every round);
    else t_0 fails because of a write below it (id -1), which the loop has to see.
    """
    rows: list[Row] = [(0, False, "c0", "v0")]
    if root_fails_alone:
        rows.append((0, True, "nowhere", "expected"))
    else:
        rows += [(-1, False, "q", "there"), (0, True, "q", None)]
    for i in range(1, n):
        rows += [(i, True, f"c{i - 1}", f"v{i - 1}"), (i, False, f"c{i}", f"v{i}")]
    return rows


@pytest.mark.spark
@pytest.mark.parametrize("root_fails_alone", [True, False])
def test_long_chain_converges_in_pythons_rounds(spark: SparkSession, root_fails_alone: bool) -> None:
    rows = chain(8, root_fails_alone)
    t = table(rows)
    res = check_against_python(spark, t)
    assert answers(res)[0] == list(range(8))
    assert res.rounds == fixpoint(rows)[1] == 9  # round i + 1 adds t_i; round 9 sees no change
    if root_fails_alone:
        # truncating the lineage every 3 rounds (persisting in between) changes nothing
        check_against_python(spark, t, checkpoint_every=3)
    else:
        with pytest.raises(RuntimeError, match="max_rounds=4"):
            txns.spark.resolve(spark, frame(spark, t), max_rounds=4)


@pytest.mark.spark
def test_reliable_checkpoints_with_a_checkpoint_dir(spark: SparkSession, tmp_path: Path) -> None:
    """With a checkpoint directory set, the states are checkpointed there (files appear), same answers."""
    sc = spark.sparkContext
    assert sc.getCheckpointDir() is None
    sc.setCheckpointDir(str(tmp_path))
    try:
        check_against_python(spark, table(chain(4, False)), checkpoint_every=2)
        assert any(p.name.startswith("part-") for p in tmp_path.rglob("*"))
    finally:  # the session is shared: back to no checkpoint directory (SparkContext has no API for it)
        getattr(sc._jsc.sc(), "checkpointDir_$eq")(sc._jvm.scala.Option.empty())  # type: ignore[attr-defined]
    assert sc.getCheckpointDir() is None


@pytest.mark.spark
def test_bad_input(spark: SparkSession) -> None:
    df = frame(spark, table(POST))
    with pytest.raises(InvalidUsage, match=r"lacks column\(s\) \['val'\].*withColumnRenamed"):
        txns.spark.resolve(spark, df.drop("val"))
    with pytest.raises(InvalidUsage, match=r"is_read must be boolean, not string.*cast"):
        txns.spark.resolve(spark, df.withColumn("is_read", df["is_read"].cast("string")))
    with pytest.raises(InvalidUsage, match="Spark DataFrame"):
        txns.spark.resolve(spark, table(POST))  # type: ignore[arg-type]
    with pytest.raises(InvalidUsage, match="checkpoint_every"):
        txns.spark.resolve(spark, df, checkpoint_every=0)
    with pytest.raises(InvalidUsage, match="max_rounds"):
        txns.spark.resolve(spark, df, max_rounds=0)
    with pytest.raises(InvalidUsage, match="null id, is_read or key"):
        txns.spark.resolve(spark, frame(spark, table([(1, False, "a", "1"), (2, True, None, "1")])))
    with pytest.raises(InvalidUsage, match="two reads or two writes"):
        txns.spark.resolve(spark, frame(spark, table([(1, False, "a", "1"), (1, False, "a", "2")])))
    # the same row twice is one row
    res = txns.spark.resolve(spark, frame(spark, table(POST + POST[:5])))
    assert answers(res) == ([4, 8, 9], POST_STORE, 3)
