"""Tables by name from Python and SQL: :func:`read_table`, :func:`register_tables`, :func:`enable_pushdown`.

Conveniences over the ``txns`` data source (:mod:`txns.spark.source`,
reads by name in :mod:`txns.spark.table_read`): a DataFrame of a table by
name, a temporary view per table for SQL, and the Spark setting the
source's filter pushdown needs.
"""

from __future__ import annotations

import datetime as dt
from typing import TYPE_CHECKING

from txns.db import clock
from txns.spark._common import check_executors, check_url
from txns.spark.read import PLAN_VALID_S
from txns.spark.source import TxnsDataSource
from txns.spark.table_read import parse_duration, parse_time

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from txns.db.database import Database


PUSHDOWN_CONF = "spark.sql.python.filterPushdown.enabled"
"""Spark refuses a Python reader that implements ``pushFilters`` unless this conf is true (default false)."""


def enable_pushdown(spark: SparkSession) -> None:
    """Turn on Spark's filter pushdown into Python data sources (needed by reads of tables by name).

    Without it Spark refuses the read (``DATA_SOURCE_PUSHDOWN_DISABLED``,
    naming the conf). :func:`register_tables` and :func:`read_table` call it.
    """
    spark.conf.set(PUSHDOWN_CONF, "true")


def _raw_url(db_or_url: Database | str) -> str:
    if isinstance(db_or_url, str):
        return db_or_url
    return db_or_url.client.url  # (the URL as given: db.url is redacted, executors need the secrets)


def _as_of_option(db: Database, as_of: int | dt.datetime | str | None) -> str | None:
    if as_of is None:
        return None
    if isinstance(as_of, str):
        return str(parse_time(as_of, "as_of", end_of_ms=True))
    return str(db.timestamp(as_of))


def register_tables(
    spark: SparkSession, db_or_url: Database | str, *, as_of: int | dt.datetime | str | None = None
) -> list[str]:
    """Register the ``txns`` source and a temporary view per table of the database (named as the table).

    ``as_of`` (a timestamp, a datetime as in the Python API, or a wall-clock
    string, UTC without an offset): every view reads at that time; None: each
    query reads the latest state. Returns the view names (sorted).
    """
    spark.dataSource.register(TxnsDataSource)
    enable_pushdown(spark)
    check_executors(spark)
    url = check_url(_raw_url(db_or_url))
    own = isinstance(db_or_url, str)
    db: Database
    if isinstance(db_or_url, str):
        import txns

        db = txns.connect(url, create=False)
    else:
        db = db_or_url
    try:
        at = _as_of_option(db, as_of)
        names = db.tables(None if at is None else int(at))
    finally:
        if own:
            db.close()
    for name in names:
        reader = spark.read.format("txns").option("url", url)
        if at is not None:
            reader = reader.option("asOf", at)
        reader.load(name).createOrReplaceTempView(name)
    return names


def read_table(
    spark: SparkSession,
    url: str,
    name: str,
    *,
    as_of: int | dt.datetime | str | None = None,
    diff: bool = False,
    native: bool | None = None,
    valid_for_s: float | None = None,
) -> DataFrame:
    """``spark.read.format("txns").option("url", url)[.option("asOf", ...)].load(name)``, or Spark's own reader.

    ``as_of``: a timestamp, a datetime (naive: local time, as in the Python
    API) or a wall-clock string (no offset: UTC). ``diff``: one row per
    distinct row with a ``diff`` column (its multiplicity). ``native``:
    None (default): a compacted table on a local directory is read by
    Spark's own Parquet reader, as of this call (no row through Python:
    :mod:`txns.spark.native_read`), anything else by the data source;
    False: always the data source (which resolves the latest time when the
    query runs); True: Spark's reader, or ``InvalidUsage`` saying why not.
    ``valid_for_s``: how long the parts of a planned read are held for its
    tasks (the data source's ``validFor``; default an hour). Spark's own
    reader is planned once, here: its DataFrame reads those parts for that
    long.
    """
    import txns
    from persist import InvalidUsage
    from txns.spark.native_read import native_table_read
    from txns.spark.native_write import native_root

    check_url(url)
    if native is not None and not isinstance(native, bool):
        raise InvalidUsage(f"native must be True, False or None, got {native!r}")
    valid = PLAN_VALID_S if valid_for_s is None else parse_duration(valid_for_s, "valid_for_s")
    at: str | None = None
    if isinstance(as_of, dt.datetime):
        at = str(clock.ts_of_datetime(as_of))
    elif as_of is not None:
        at = str(parse_time(as_of, "as_of", end_of_ms=True))
    if native or (native is None and native_root(url) is not None):  # (elsewhere: no connect needed)
        with txns.connect(url, create=False) as db:
            ts = db.timestamp(None if at is None else int(at))
            df = native_table_read(spark, db, url, db.entry(name, ts), ts, diff=diff, valid_for_s=valid)
        if df is not None:
            return df
        if native:
            raise InvalidUsage(
                f"table {name!r} cannot be read by Spark's own Parquet reader: that needs a local directory "
                f"(file://) and a compacted table (db.compact([{name!r}]) after its retention); read it with "
                f"native=None or False"
            )
    spark.dataSource.register(TxnsDataSource)
    enable_pushdown(spark)
    reader = spark.read.format("txns").option("url", url)
    if at is not None:
        reader = reader.option("asOf", at)
    if diff:
        reader = reader.option("diff", "true")
    if valid_for_s is not None:
        reader = reader.option("validFor", str(valid))
    return reader.load(name)


__all__ = ["PUSHDOWN_CONF", "enable_pushdown", "read_table", "register_tables"]
