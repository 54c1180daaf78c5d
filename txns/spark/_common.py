"""Pieces shared by the Spark functions: URLs, per-process locations, types, read tasks.

Everything here runs both on the driver and in executors' Python workers.
Executors reach the store by URL only: :func:`location` opens it once per
worker process and keeps it.
"""

from __future__ import annotations

import json
import sys
import threading
from collections.abc import Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc

from persist import InvalidUsage, PartRetired, SchemaMismatch
from persist.manifest import Run, read_run
from persist.url import Location, accepted_forms, open_location, redact, validate_url

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession
    from pyspark.sql.types import DataType, StructType

INT64_MAX = 2**63 - 1
INLINE_TASK_BYTES = 1 << 20
"""Inline runs are read together, up to about this many bytes of them per task."""

_LOCATIONS: dict[str, Location] = {}
_LOCK = threading.Lock()
_CHECKED_SESSIONS: set[str] = set()

# The probe runs in executors that may not have this package (nor pyarrow):
# its code is compiled here, in a module namespace that does not exist
# elsewhere, so cloudpickle ships it by value and unpickling it imports
# nothing of ours.
_PROBE_SOURCE = """
def probe(_):
    import sys
    try:
        import persist, txns  # noqa: F401
        err = ""
    except Exception as e:
        err = type(e).__name__ + ": " + str(e)
    return (sys.executable, err)
"""


# ---- locations ---------------------------------------------------------------------


def check_url(url: str) -> str:
    """``url`` if Spark executors can reach it; InvalidUsage otherwise.

    The URL is checked without opening it (:func:`persist.url.validate_url`:
    a relative ``file://`` path is refused there), and a process-local
    scheme (``mem://``) is refused: executors are other processes.
    """
    if not isinstance(url, str):
        raise InvalidUsage(f"the location must be a URL string, got {type(url).__name__}")
    if validate_url(url).process_local:
        raise InvalidUsage(
            f"{redact(url)!r} is an in-memory location, which Spark executors (other processes) cannot "
            f"reach; use one of: {', '.join(accepted_forms(shared_only=True))}"
        )
    return url


def check_executors(spark: SparkSession) -> None:
    """InvalidUsage, saying what to do, if ``spark``'s Python workers cannot import this package.

    Runs one tiny job the first time it is called for a Spark application
    (a few hundred milliseconds), then nothing. Without it, the first read
    or write fails deep in an executor with a long trace ending in
    ``ModuleNotFoundError: No module named 'txns'``.
    """
    try:
        key = spark.sparkContext.applicationId
    except Exception:  # noqa: BLE001 - Spark Connect has no sparkContext (nor RDDs): nothing to probe with
        return
    if key in _CHECKED_SESSIONS:
        return
    namespace: dict[str, Any] = {"__name__": "txns_executor_probe"}
    exec(compile(_PROBE_SOURCE, "<txns executor probe>", "exec"), namespace)  # our own constant code
    try:
        found: list[tuple[str, str]] = spark.sparkContext.parallelize([0], 1).map(namespace["probe"]).collect()
    except Exception as e:  # noqa: BLE001 - a worker that cannot even start Python's side of Spark
        found = [(_python_exec(spark), f"{type(e).__name__}: {str(e).splitlines()[0]}")]
    bad = [r for r in found if r[1]]
    if bad:
        raise InvalidUsage(
            f"Spark's Python workers ({_python_exec(spark)}, running {bad[0][0]}) cannot import txns "
            f"({bad[0][1]}): they must run "
            f"a Python where this package is installed. Either start the session with txns.spark.session(), "
            f"or set PYSPARK_PYTHON={sys.executable} (or the Spark conf spark.pyspark.python) before the "
            f"SparkSession starts"
        )
    _CHECKED_SESSIONS.add(key)


def partition_count(df: DataFrame) -> int:
    """How many partitions ``df`` has, or on Spark Connect (no RDDs) the session's shuffle partitions."""
    try:
        return int(df.rdd.getNumPartitions())
    except Exception:  # noqa: BLE001 - Spark Connect: PySparkNotImplementedError for .rdd
        return int(df.sparkSession.conf.get("spark.sql.shuffle.partitions") or 200)


def _python_exec(spark: SparkSession) -> str:
    """The Python the session starts for its workers, as configured."""
    try:
        return str(spark.sparkContext.pythonExec)
    except Exception:  # noqa: BLE001 - Spark Connect
        return "unknown"


def location(url: str) -> Location:
    """The location ``url``, opened once per process (executors reuse it across tasks)."""
    loc = _LOCATIONS.get(url)
    if loc is None:
        with _LOCK:
            loc = _LOCATIONS.get(url)
            if loc is None:
                loc = open_location(url)
                _LOCATIONS[url] = loc
    return loc


# ---- types -------------------------------------------------------------------------


def spark_type(field: pa.Field) -> DataType:
    """The Spark type a shard field is shown as (unsigned ints widen; uint64 is decimal(20,0))."""
    from pyspark.sql.pandas.types import from_arrow_type
    from pyspark.sql.types import DecimalType, IntegerType, LongType, ShortType

    t = field.type
    if pa.types.is_unsigned_integer(t):
        return {8: ShortType(), 16: IntegerType(), 32: LongType(), 64: DecimalType(20, 0)}[t.bit_width]
    try:
        return from_arrow_type(t)
    except Exception as e:  # noqa: BLE001 - pyspark raises its own TypeError kinds
        raise InvalidUsage(f"field {field.name!r} has type {t}, which Spark cannot represent: {e}") from None


def spark_struct(fields: Iterable[pa.Field]) -> StructType:
    """A Spark schema for these Arrow fields (see :func:`spark_type`)."""
    from pyspark.sql.types import StructField, StructType

    return StructType([StructField(f.name, spark_type(f), f.nullable) for f in fields])


def col(name: str) -> Column:
    """The column ``name`` exactly (dots and backticks in it taken literally)."""
    from pyspark.sql import functions as F

    return F.col("`" + name.replace("`", "``") + "`")


def arrow_schema(struct: StructType) -> pa.Schema:
    """The Arrow schema Spark exchanges for ``struct`` with Python workers."""
    from pyspark.sql.pandas.types import to_arrow_schema

    return to_arrow_schema(struct, timezone="UTC")


def to_spark_arrow(table: pa.Table, schema: pa.Schema) -> pa.Table:
    """``table``'s columns named in ``schema``, cast to it (the Spark-side types)."""
    return table.select(schema.names).cast(schema)


def ts_as_int64(table: pa.Table, what: str) -> pa.Table:
    """``table`` with its uint64 ``ts`` column as int64, or InvalidUsage if a time does not fit."""
    ts = table.column("ts")
    if table.num_rows and pc.max(ts).as_py() > INT64_MAX:
        raise InvalidUsage(f"{what}: an update time is past 2**63 - 1, which Spark's long cannot hold")
    return table.set_column(table.column_names.index("ts"), "ts", ts.cast(pa.int64()))


# ---- read tasks -----------------------------------------------------------------------


def plan_tasks(runs: Iterable[Run]) -> list[bytes]:
    """Read tasks for ``runs``: one per part, and inline rows grouped (about 1 MiB a task).

    A task is JSON of a list of runs (each keeping its ``ts_rewrite``).
    """
    tasks: list[list[Run]] = []
    inline: list[Run] = []
    inline_bytes = 0
    for run in runs:
        if run.inline is not None:
            inline.append(Run(inline=run.inline, rows=run.rows, ts_rewrite=run.ts_rewrite))
            inline_bytes += len(run.inline)
            if inline_bytes >= INLINE_TASK_BYTES:
                tasks.append(inline)
                inline, inline_bytes = [], 0
        for ref in run.parts:
            tasks.append([Run(parts=(ref,), rows=ref.rows, ts_rewrite=run.ts_rewrite)])
    if inline:
        tasks.append(inline)
    return [json.dumps([r.to_json() for r in t], separators=(",", ":")).encode() for t in tasks]


def task_frame(spark: SparkSession, n: int) -> DataFrame:
    """``n`` rows (column ``id``, 0 to ``n - 1``), row ``i`` alone in Spark partition ``i``.

    The tasks themselves travel in the mapInArrow function's closure (which
    PySpark broadcasts when it is big), and each partition runs task ``id``:
    no Python stage and no shuffle before the reads.
    """
    check_executors(spark)
    return spark.range(0, n, 1, max(1, n))


def task_tables(
    url: str, schema: pa.Schema, tasks: Sequence[bytes], batches: Iterator[pa.RecordBatch]
) -> Iterator[pa.Table]:
    """The tables of the tasks whose ids are in ``batches`` (rows of :func:`task_frame`); see :func:`read_task`."""
    for batch in batches:
        for i in batch.column(0).to_pylist():
            yield from read_task(url, schema, tasks[i])


def read_task(url: str, schema: pa.Schema, task: bytes) -> Iterator[pa.Table]:
    """The tables of one task of :func:`plan_tasks`: each part's size and CRC-32C checked, times rewritten."""
    blob = location(url).blob
    for j in json.loads(task):
        try:
            yield from read_run(blob, Run.from_json(j), schema)
        except PartRetired as e:
            raise PartRetired(
                f"part {e.key} is gone from {redact(url)}: compaction retired it (and deleted it after "
                f"part_grace_s) after this read was planned; plan the read again",
                e.key,
            ) from None


def raise_from_spark(e: Exception) -> None:
    """Re-raise a persist error that an executor raised (Spark wraps it) as itself."""
    text = str(e)
    for cls in (SchemaMismatch, PartRetired, InvalidUsage):
        marker = f"{cls.__module__}.{cls.__name__}: "
        i = text.rfind(marker)
        if i >= 0:
            msg = text[i + len(marker) :].split("\n", 1)[0].strip()
            raise cls(msg) from e
