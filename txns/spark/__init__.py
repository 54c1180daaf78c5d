"""txns.spark: DataFrames in and out of data shards, a streaming source, Spark compaction.

Spark executors reach the store by URL (``file:///ABSOLUTE/PATH`` or
``s3://BUCKET/PREFIX?...``; never ``mem://``, which lives in one process).
They write Parquet parts straight into blob storage and read them back,
checking each part's CRC-32C; only part descriptors and plans travel
between the driver and the executors. ``import txns`` does not import
pyspark; this package does. A classic (not Spark Connect) session is needed.

Usage::

    from txns import TxnsHandle
    from persist import PersistClient
    import txns.spark

    spark = txns.spark.session("local[2]")      # sets PYSPARK_PYTHON first
    handle = TxnsHandle.open(PersistClient.open(url), txns_id)
    txn = handle.begin()
    txns.spark.write_dataframe(txn, orders_id, orders_df)   # executors write the parts
    txns.spark.write_dataframe(txn, lines_id, lines_df)
    txn.commit_at(handle, ts).apply(handle)     # both tables, atomically

    df = txns.spark.snapshot(spark, url, txns_id, orders_id, as_of=ts)
    txns.spark.register(spark)
    stream = (spark.readStream.format("txns").option("url", url)
              .option("txns_id", txns_id).option("data_id", orders_id).load())
    txns.spark.compact(spark, url, orders_id)

Credentials for S3 come from each executor's own AWS chain (environment,
instance profile...), never from the URL.
"""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING

from txns.spark._common import check_executors, check_url
from txns.spark.batch import run_batch
from txns.spark.compaction import CompactionResult, compact, compact_tables
from txns.spark.read import snapshot
from txns.spark.resolve import SparkResolution, resolve
from txns.spark.source import TxnsDataSource
from txns.spark.write import write_batch, write_dataframe

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


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


def register(spark: SparkSession) -> None:
    """Register the ``txns`` data source with ``spark`` (see :mod:`txns.spark.source`).

    Raises InvalidUsage (saying what to do) if Spark's Python workers cannot import this package.
    """
    check_executors(spark)
    spark.dataSource.register(TxnsDataSource)


__all__ = [
    "CompactionResult",
    "SparkResolution",
    "TxnsDataSource",
    "check_url",
    "compact",
    "compact_tables",
    "register",
    "resolve",
    "run_batch",
    "session",
    "snapshot",
    "write_batch",
    "write_dataframe",
]
