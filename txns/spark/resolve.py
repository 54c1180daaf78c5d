"""The rollback fixpoint of :mod:`txns.resolve` as an iterative Spark job: ``resolve(spark, intents_df)``.

**What it computes.** The same thing as :func:`txns.resolve.resolve` on the
same relation ``intents(id, is_read, key, val)`` (a read's null ``val`` is
"absent", a write's null ``val`` a delete; a row twice counts once; at most
one read and one write per (id, key)): the ids the rule rolls back, the store
(the latest committed write per key, deleted keys left out) and the number of
rounds of the fixpoint B_{n+1} = F(B_n) from B_0 = {}, counted as the Python
resolver counts them (the round that saw no change included; 1 for empty
input). ``key`` and ``val`` may be any Spark type that hashes, sorts and
compares for equality (strings, numbers, structs such as ``{table, key}``);
``id`` any orderable type.

**Why it equals the Python resolver.** Each round evaluates F literally: the
writes of ids not in B; for each read, the latest such write to its key with
a smaller id (``last(struct(val), ignorenulls)`` over a window by key ordered
by ``(id, is_read desc)``: at one id the read sorts before the write, as a
transaction does not see its own writes); the read fails iff its ``val`` is
not null-safe equal to that write's value (null if none). The proof that the
iteration stops, after at most (distinct ids + 1) rounds, on exactly the set
the sequential rule rolls back is in :mod:`txns.resolve` (locality, unique
fixed point, progress); it is about F, so it holds for any evaluation of F.
The pruning below leaves F unchanged, so B_n is the Python resolver's B_n
round for round, and ``rounds`` agree:

- a read with no write to its key at a smaller id sees null in every round:
  it fails in every F(B) iff its ``val`` is not null. Such reads leave the
  loop; the ids with a failing one form the constant set A (in every B_n,
  n >= 1) and their remaining reads leave too (the id is in F(B) anyway);
- a write no read of its key follows (by id) is never "the latest write
  before" a read: it leaves the loop (it still counts for the store).

A's ids keep their writes in the loop with B_0 = {} (alive in round 1), so
round 1 is F({}) exactly; "B changed" in round 1 also counts A being non-empty.

**Cost.** Preparation: one shuffle for ``distinct`` (a row twice counts
once), one by key (the earlier-write test, the latest read of each key and the
duplicate check, all one window partitioning), one by id (spreading A to the
id's rows), then one aggregate job bringing four numbers to the driver. Each
round, over the rows still in the loop only (reads that can fail, writes
some read can see): one shuffle + sort by key (the window above), one shuffle
+ sort by id (``bool_or`` of the failed reads over the id's rows, giving the
new membership of each row's id), then one narrow count of the rows whose
membership changed. No broadcast, so a large B costs no driver or executor
memory beyond the shuffles. Rows in the loop carry their id's membership as a
column, so no join with B is needed. ``store`` costs a shuffle by id
(anti-join of the writes with the rollback ids) and one by key (``max_by``
over id); both results are lazy DataFrames over checkpointed data.

**Lineage.** The state is truncated every ``checkpoint_every`` rounds (and
the prepared intents once): with ``localCheckpoint()`` (blocks in the
executors' block managers, memory and disk) unless the SparkContext has a
checkpoint directory, in which case ``checkpoint()`` (written to that reliable
directory). ``localCheckpoint`` by default because the state is rebuilt
every round and only lives for this call: writing it to reliable storage each
round costs I/O for a fault tolerance that re-running the call provides too;
set a checkpoint directory (``spark.sparkContext.setCheckpointDir``) where an
executor lost mid-resolution must not fail the job. Between checkpoints the
state is ``persist()``-ed (memory and disk). Each replaced state is released
at once.

**On the driver.** Only query plans and numbers: four counts after the
preparation and one count per round. B lives as a column of a DataFrame;
no intent, id or key is collected, so the driver's memory does not grow
with the number of intents.

NOTE: ``txns.spark.resolve`` is this function (the package re-exports it over
the module's name); import the module itself as ``sys.modules["txns.spark.resolve"]``
if you ever need it.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from persist import InvalidUsage

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession

COLUMNS = ("id", "is_read", "key", "val")


@dataclass(frozen=True)
class SparkResolution:
    """What :func:`resolve` decides, as in :class:`txns.resolve.Resolution`.

    ``rollback``: a DataFrame of one column ``id``, the ids that roll back, in no particular order.
    ``store``: a DataFrame ``key, val``, the latest committed write per key (deleted keys left out).
    ``rounds``: the rounds of the fixpoint, the one that saw no change included.

    Unpacks as ``rollback_df, store_df = txns.spark.resolve(spark, df)``.
    """

    rollback: DataFrame
    store: DataFrame
    rounds: int

    def __iter__(self) -> Iterator[DataFrame]:
        yield self.rollback
        yield self.store


def resolve(
    spark: SparkSession,
    intents_df: DataFrame,
    *,
    max_rounds: int | None = None,
    checkpoint_every: int = 1,
) -> SparkResolution:
    """Resolve ``intents_df(id, is_read, key, val)`` by the fixpoint, as an iterative Spark job.

    Rounds run eagerly (one Spark job each, plus preparation); the returned
    DataFrames are lazy views over checkpointed data. ``max_rounds``: give up
    with ``RuntimeError`` if the fixpoint has not stabilised after that many
    rounds (``None``: no limit; the fixpoint stops by distinct ids + 1).
    ``checkpoint_every``: truncate the lineage every that many rounds
    (persist in between). ``InvalidUsage`` for a malformed relation: a column
    missing, ``is_read`` not boolean, a null ``id``/``is_read``/``key``, or
    two reads (two writes) of one key by one transaction with different values.
    """
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    _check_args(intents_df, max_rounds, checkpoint_every)
    reliable = spark.sparkContext.getCheckpointDir() is not None
    i, r, k, v = (F.col(c) for c in COLUMNS)

    # ---- preparation: distinct rows, the checks, the pruning flags (see the module doc)
    by_key_ordered = Window.partitionBy("key").orderBy(i, r.desc())
    running = by_key_ordered.rowsBetween(Window.unboundedPreceding, Window.currentRow)
    same_slot = (F.lag(i).over(by_key_ordered) == i) & (F.lag(r).over(by_key_ordered) == r)
    prepared = (
        intents_df.select(*COLUMNS)
        .distinct()
        .select(
            *COLUMNS,
            F.coalesce(same_slot, F.lit(False)).alias("dup"),
            (F.count(F.when(~r, 1)).over(running) > 0).alias("seen_write"),  # for a read: a write at a smaller id
            F.max(F.when(r, i)).over(Window.partitionBy("key")).alias("last_read"),
        )
    )
    fails_always = r & ~F.col("seen_write") & v.isNotNull()
    prepared = prepared.select(
        *COLUMNS,
        "dup",
        F.coalesce(F.bool_or(fails_always).over(Window.partitionBy("id")), F.lit(False)).alias("a"),
        "seen_write",
        "last_read",
    )
    in_loop = F.when(r, F.col("seen_write") & ~F.col("a")).otherwise(F.coalesce(F.col("last_read") > i, F.lit(False)))
    prepared, stats = _materialise(
        prepared.select(*COLUMNS, "dup", "a", in_loop.alias("in_loop")),
        True,
        reliable,
        F.count_if(F.col("dup")).alias("dup"),
        F.count_if(i.isNull() | r.isNull() | k.isNull()).alias("nulls"),
        F.count_if(F.col("a")).alias("a"),
    )
    if stats["nulls"]:
        _release(prepared)
        raise InvalidUsage(
            f"intents_df has {stats['nulls']} row(s) with a null id, is_read or key; "
            "filter them out (a null val is fine: absent for a read, a delete for a write)"
        )
    if stats["dup"]:
        _release(prepared)
        raise InvalidUsage(
            "intents_df holds two reads or two writes of one key by one transaction, with different values "
            f"({stats['dup']} such row(s)); a transaction reads and writes each key at most once"
        )
    any_a = bool(stats["a"])

    # ---- the rounds: `rb` is B_n's membership of the row's id, `prev` B_{n-1}'s
    state = prepared.filter("in_loop").select(*COLUMNS, "a", F.lit(False).alias("rb"))
    seen = F.last(F.when(~r & ~F.col("rb"), F.struct(v.alias("v"))), ignorenulls=True).over(running)
    failed = r & ~v.eqNullSafe(seen.getField("v"))
    rounds = 0
    owned: list[DataFrame] = []  # states materialised since the last truncation (the newest one is `state`)
    while True:
        rounds += 1
        judged = state.select(*COLUMNS, "a", "rb", failed.alias("failed"))
        new_rb = F.col("a") | F.coalesce(F.bool_or("failed").over(Window.partitionBy("id")), F.lit(False))
        nxt = judged.select(*COLUMNS, "a", new_rb.alias("rb"), F.col("rb").alias("prev"))
        truncate = rounds % checkpoint_every == 0
        nxt, seen_now = _materialise(nxt, truncate, reliable, F.count_if(F.col("rb") != F.col("prev")).alias("n"))
        if truncate:
            for old in owned:  # nothing depends on them any more
                _release(old)
            owned = []  # (else its lineage still reaches the states before: they stay until the next truncation)
        owned.append(nxt)
        changed = seen_now["n"] > 0 or (rounds == 1 and any_a)
        state = nxt.drop("prev")
        if not changed:
            break
        if max_rounds is not None and rounds >= max_rounds:
            for old in [*owned, prepared]:
                _release(old)
            raise RuntimeError(
                f"the fixpoint did not stabilise in max_rounds={max_rounds} rounds; it always does by "
                "(distinct ids + 1) rounds: raise max_rounds, or pass None"
            )

    rolled = prepared.filter("a").select("id").union(state.filter("rb").select("id")).distinct()
    writes = prepared.filter(~r).select("id", "key", "val").join(rolled, "id", "left_anti")
    store = writes.groupBy("key").agg(F.max_by("val", "id").alias("val")).filter(F.col("val").isNotNull())
    return SparkResolution(rollback=rolled, store=store, rounds=rounds)


# ---- helpers


def _check_args(df: Any, max_rounds: int | None, checkpoint_every: int) -> None:
    from pyspark.sql import DataFrame
    from pyspark.sql.types import BooleanType

    if not isinstance(df, DataFrame):
        raise InvalidUsage(f"intents_df must be a Spark DataFrame, got {type(df).__name__}")
    names = df.columns
    missing = [c for c in COLUMNS if c not in names]
    if missing:
        raise InvalidUsage(
            f"intents_df lacks column(s) {missing}; it has {names} and needs {list(COLUMNS)} "
            "(rename with withColumnRenamed, or add a null val with lit(None).cast(...))"
        )
    is_read = df.schema["is_read"].dataType
    if not isinstance(is_read, BooleanType):
        raise InvalidUsage(
            f"intents_df.is_read must be boolean, not {is_read.simpleString()}; "
            "cast it, e.g. df.withColumn('is_read', col('is_read').cast('boolean'))"
        )
    if max_rounds is not None and (not isinstance(max_rounds, int) or max_rounds < 1):
        raise InvalidUsage(f"max_rounds must be None or a positive int, got {max_rounds!r}")
    if not isinstance(checkpoint_every, int) or checkpoint_every < 1:
        raise InvalidUsage(f"checkpoint_every must be a positive int, got {checkpoint_every!r}")


def _materialise(df: DataFrame, truncate: bool, reliable: bool, *metrics: Column) -> tuple[DataFrame, dict[str, Any]]:
    """``df`` computed now, and ``metrics`` (aggregates over its rows) computed by the same job.

    ``truncate``: checkpoint, cutting the lineage (see the module doc for which
    checkpoint and why); else persist (memory and disk) and count. The metrics
    ride along as an ``Observation``, so a checkpoint is one Spark job.
    """
    from pyspark import StorageLevel
    from pyspark.sql import Observation

    obs = Observation()
    observed = df.observe(obs, *metrics)
    if truncate:
        out = observed.checkpoint(eager=True) if reliable else observed.localCheckpoint(eager=True)
    else:
        out = observed.persist(StorageLevel.MEMORY_AND_DISK)
        out.count()
    return out, obs.get


def _release(df: DataFrame) -> None:
    """Free a state this call materialised: unpersist it, or drop a checkpoint's blocks.

    A DataFrame from ``localCheckpoint`` is not in the cache manager, so
    ``unpersist`` does not reach its blocks; they would stay until the JVM
    garbage-collects the RDD. Its plan is a ``LogicalRDD``; unpersisting that
    RDD frees them now (classic sessions only; a no-op where that fails).
    """
    if df.is_cached:
        df.unpersist()
        return
    try:
        plan = df._jdf.queryExecution().logical()
        if plan.getClass().getSimpleName() == "LogicalRDD":
            plan.rdd().unpersist(False)
    except Exception:  # noqa: BLE001 - best effort: without it the blocks go when the JVM collects the RDD
        pass
