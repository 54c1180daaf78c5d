"""txns.spark: tables by name from Spark (read, write, stream, SQL, MERGE), and DataFrames in transactions.

Spark executors reach the store by URL (``file:///ABSOLUTE/PATH`` or
``s3://BUCKET/PREFIX?...``; never ``mem://``, which lives in one process).
They write Parquet parts straight into blob storage and read them back,
checking each part's CRC-32C; only part descriptors and plans travel
between the driver and the executors. ``import txns`` does not import
pyspark; this package does. Tables by name (reads, writes, streams, views,
``t.insert``, ``merge``, ``compact_tables``) also work through Spark Connect;
``run_batch`` and ``resolve`` need a classic session.

Usage::

    import txns, txns.spark

    spark = txns.spark.session("local[2]")      # sets PYSPARK_PYTHON first (or set it yourself)
    db = txns.connect(url)
    txns.spark.register(spark, db)              # the "txns" data source, and a SQL view per table
    df = spark.read.format("txns").option("url", url).load("accounts")                 # latest, consolidated
    old = spark.read.format("txns").option("url", url).option("asOf", "2026-11-23 15:00").load("accounts")
    orders_df.write.format("txns").option("url", url).mode("append").save("orders")   # one atomic commit
    with db.transaction() as t:                 # several DataFrames (and Python rows), one commit
        t.insert("orders", orders_df)
        t.insert("ledger", ledger_df)
    txns.spark.merge(db, "accounts", updates_df)  # keyed table: upsert (and delete) by key
    q = (events_df.writeStream.format("txns").option("url", url)
         .option("checkpointLocation", cp).start("events"))  # each micro-batch exactly once
    txns.spark.compact_tables(spark, db, ["orders"])

The low-level API works on shard ids: :func:`write_dataframe` /
:func:`write_batch` into a ``Txn``, :func:`snapshot`, :func:`compact`, and
the data source with ``txns_id`` / ``data_id`` options.

Credentials for S3 come from each executor's own AWS chain (environment,
instance profile...), never from the URL.
"""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING

from txns import engines
from txns.spark._common import check_executors, check_url
from txns.spark.batch import run_batch
from txns.spark.compaction import CompactionResult, compact, compact_tables
from txns.spark.engine import SparkEngine
from txns.spark.merge import MergeStats, merge, merge_stream
from txns.spark.read import snapshot
from txns.spark.resolve import SparkResolution, resolve
from txns.spark.source import TxnsDataSource
from txns.spark.table_write import SINKS, stream_progress
from txns.spark.tables import enable_pushdown, read_table, register_tables
from txns.spark.write import write_batch, write_dataframe

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from txns.db.database import Database

engines.register(SparkEngine())  # t.insert(table, spark_df) and run_batch(executor="spark") find it


def session(master: str = "local[2]", app_name: str = "txns", conf: dict[str, str] | None = None) -> SparkSession:
    """A SparkSession whose Python workers run this interpreter (``PYSPARK_PYTHON``), UI off.

    Sets ``PYSPARK_PYTHON`` and ``PYSPARK_DRIVER_PYTHON`` to ``sys.executable``
    before building, so executors can import persist and txns. If a session
    already runs in this process it is returned as is (with ``conf`` applied
    where Spark allows it at run time).
    """
    from pyspark.sql import SparkSession

    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    builder = (
        SparkSession.builder.master(master)
        .appName(app_name)
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
    )
    for k, v in (conf or {}).items():
        builder = builder.config(k, v)
    return builder.getOrCreate()


def register(spark: SparkSession, db: Database | str | None = None) -> list[str]:
    """Register the ``txns`` data source with ``spark``; with ``db``, a SQL view per table too.

    After it, ``spark.read.format("txns")`` and ``df.write.format("txns")``
    work (:mod:`txns.spark.source`), with filter pushdown on (Spark's
    ``spark.sql.python.filterPushdown.enabled``). ``db`` (a database or its
    URL): every table becomes a temporary view of its name, read at query
    time (:func:`txns.spark.tables.register_tables`). Returns the view names.
    Raises InvalidUsage (saying what to do) if Spark's Python workers cannot
    import this package.
    """
    check_executors(spark)
    spark.dataSource.register(TxnsDataSource)
    enable_pushdown(spark)
    return [] if db is None else register_tables(spark, db)


__all__ = [
    "SINKS",
    "CompactionResult",
    "SparkEngine",
    "MergeStats",
    "SparkResolution",
    "TxnsDataSource",
    "check_url",
    "compact",
    "compact_tables",
    "enable_pushdown",
    "merge",
    "merge_stream",
    "read_table",
    "register",
    "register_tables",
    "resolve",
    "run_batch",
    "session",
    "snapshot",
    "stream_progress",
    "write_batch",
    "write_dataframe",
]
