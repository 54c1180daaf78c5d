"""The Spark test session: one ``local[2]`` SparkSession for the whole run (fixture ``spark``).

It depends on ``moto_endpoint`` (tests/conftest.py) so that the fake AWS
credentials are in ``os.environ`` before the JVM starts: the JVM's Python
workers (the executors) inherit them and reach moto's S3 over HTTP.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

SPARK_CONF = {
    "spark.sql.shuffle.partitions": "4",
    "spark.default.parallelism": "2",
    "spark.driver.memory": "1g",
    "spark.sql.session.timeZone": "UTC",
}


@pytest.fixture(scope="session")
def spark(moto_endpoint: str) -> Iterator[SparkSession]:
    """A ``local[2]`` SparkSession, UI off, 4 shuffle partitions, with the ``txns`` source registered."""
    import txns.spark

    session = txns.spark.session("local[2]", app_name="txns-tests", conf=SPARK_CONF)
    session.sparkContext.setLogLevel("ERROR")
    txns.spark.register(session)
    try:
        yield session
    finally:
        session.stop()
