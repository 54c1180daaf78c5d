"""``run_batch`` with its parallel phase on Spark executors: ``run_batch(db, fns, executor="spark")``.

:func:`txns.db.batch.run_batch` runs a list of functions ``fn(ctx)`` as if
one by one in list order, and commits their writes as one database
transaction. With ``executor="spark"`` its first phase (every function once,
against one snapshot) is a Spark job instead of a thread or process pool;
nothing else changes.

**What runs where.** On the driver: the snapshot's timestamp is taken
(``db.read()``), each function is serialized with cloudpickle (so closures,
lambdas and notebook functions work, as long as what they capture pickles
too), and ``(index, bytes)`` pairs are spread over ``partitions`` RDD
partitions (default: the context's ``defaultParallelism``, at most one per
function). In the executors: each partition opens the database by its URL
once (:class:`txns.db.batch.SnapshotWorker`, as a pool process does for
``executor="processes"``), runs its functions with
:func:`txns.resolve.repair.execute` against point reads at that timestamp
(cached for the partition), and closes it. Executors only read: they never
write to the store.

**What crosses to the driver.** Only the :class:`txns.resolve.repair.Execution`
records: the rows each function read and the rows it would write, its
return value and how it ended (an abort's message, or another exception
as text). These are small (a transaction's point reads and writes), and the
driver keeps ``n`` of them for the repair phase anyway.

**The result is the same as with the other executors.** The second phase
(repair and commit, in the calling thread, on the driver) checks each
recorded run against the real state (the base plus the writes of the
earlier functions) and runs again every function whose reads changed, an
exception in a speculative run included. So what commits equals serial
execution whatever the executors saw; a run on Spark only saves work when
its reads still hold. The speculation is at the snapshot's timestamp, so
every executor sees the same state however long the job takes.

The database URL must be one the executors can open (``file://`` on a file
system they all mount, ``s3://``); ``mem://`` is refused. ``spark``: a
classic (not Spark Connect) SparkSession, by default the active one.
"""

from __future__ import annotations

import functools
import pickle
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from persist import InvalidUsage
from txns.db.batch import BatchResult, SnapshotWorker
from txns.db.batch import run_batch as _db_run_batch
from txns.db.errors import DatabaseNotFound
from txns.spark._common import check_url, raise_from_spark

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from txns.db.database import Database
    from txns.resolve.repair import BatchContext, Execution

BatchFn = Callable[["BatchContext"], Any]


def active_session(spark: SparkSession | None) -> SparkSession:
    """``spark``, or the active SparkSession; InvalidUsage if there is none or it cannot run RDD jobs."""
    from pyspark.sql import SparkSession

    if spark is None:
        spark = SparkSession.getActiveSession()
        if spark is None:
            raise InvalidUsage(
                "run_batch(executor='spark') found no active SparkSession in this thread: pass spark=SESSION "
                "or start one first (e.g. txns.spark.session('local[2]'))"
            )
    try:
        spark.sparkContext  # noqa: B018 - a Spark Connect session has none (it raises)
    except Exception:  # noqa: BLE001 - pyspark raises its own error kinds for Connect sessions
        raise InvalidUsage(
            f"run_batch(executor='spark') needs a classic SparkSession (with a SparkContext; not Spark "
            f"Connect), got {type(spark).__name__}"
        ) from None
    return spark


def _pickled(fns: Sequence[BatchFn]) -> list[bytes]:
    from pyspark import cloudpickle

    out = []
    for i, fn in enumerate(fns):
        try:
            out.append(cloudpickle.dumps(fn))  # type: ignore[no-untyped-call]
        except Exception as e:  # noqa: BLE001 - whatever pickling raises, the advice is the same
            raise InvalidUsage(
                f"run_batch(executor='spark'): function {i} ({fn!r}) cannot be pickled ({type(e).__name__}: {e}); "
                f"what it captures (e.g. an open database or a lock) must pickle too (or use executor='threads')"
            ) from None
    return out


def _run_partition(
    cls: type[Database], url: str, ts: int, items: Iterable[tuple[int, bytes]]
) -> Iterator[tuple[int, Execution]]:
    """In an executor: open the snapshot once (if the partition has any function) and run each function."""
    worker: SnapshotWorker | None = None
    try:
        for i, blob in items:
            if worker is None:
                worker = SnapshotWorker(cls, url, ts)
            yield i, worker.run(pickle.loads(blob))
    finally:
        if worker is not None:
            worker.close()


def run_speculative(
    spark: SparkSession | None,
    cls: type[Database],
    url: str,
    ts: int,
    fns: Sequence[BatchFn],
    *,
    partitions: int | None = None,
) -> list[Execution]:
    """The parallel phase of ``run_batch(executor="spark")``: ``execute`` of every function at ``ts``, in order.

    ``cls`` / ``url``: the database class and the URL the executors open it
    by; ``partitions``: RDD partitions (default: the context's default
    parallelism), never more than the functions. Returns the executions in
    the order of ``fns``.
    """
    spark = active_session(spark)
    check_url(url)
    if not fns:
        return []
    sc = spark.sparkContext
    blobs = _pickled(fns)
    n = min(len(blobs), partitions or max(1, sc.defaultParallelism))
    run = functools.partial(_run_partition, cls, url, ts)
    previous = sc.getLocalProperty("spark.job.description")
    sc.setLocalProperty("spark.job.description", f"txns run_batch: {len(blobs)} functions at ts {ts}")
    try:
        got: list[tuple[int, Execution]] = sc.parallelize(list(enumerate(blobs)), n).mapPartitions(run).collect()
    except Exception as e:
        raise_from_spark(e)
        marker = "DatabaseNotFound: "
        text = str(e)
        if marker in text:
            raise DatabaseNotFound(text[text.rfind(marker) + len(marker) :].split("\n", 1)[0].strip()) from e
        raise
    finally:
        sc.setLocalProperty("spark.job.description", previous)  # type: ignore[arg-type]
    out: list[Execution | None] = [None] * len(blobs)
    for i, ex in got:
        out[i] = ex
    missing = [i for i, ex in enumerate(out) if ex is None]
    if missing:
        raise RuntimeError(f"run_batch(executor='spark'): the Spark job returned no run of function(s) {missing[:10]}")
    return [ex for ex in out if ex is not None]


def run_batch(
    db: Database,
    fns: Sequence[BatchFn],
    spark: SparkSession | None = None,
    *,
    workers: int | None = None,
    isolation: str | None = None,
    metadata: Mapping[str, Any] | None = None,
    max_attempts: int | None = None,
    deadline_s: float | None = None,
) -> BatchResult:
    """:func:`txns.db.batch.run_batch` with ``executor="spark"``: the parallel phase as a job on ``spark``.

    ``spark``: default the active session; ``workers``: the number of RDD
    partitions. The rest as in :func:`txns.db.batch.run_batch`: conflicts
    are retried until ``deadline_s`` (default 60 s), or ``max_attempts``
    times if given.
    """
    return _db_run_batch(
        db,
        fns,
        executor="spark",
        spark=spark,
        workers=workers,
        isolation=isolation,
        metadata=metadata,
        max_attempts=max_attempts,
        deadline_s=deadline_s,
    )


__all__ = ["active_session", "run_batch", "run_speculative"]
