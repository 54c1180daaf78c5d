"""Spark as a txns engine: DataFrames as inputs of database transactions, and ``run_batch`` on executors.

:class:`SparkEngine` is registered with :mod:`txns.engines` when
``txns.spark`` is imported (and ``import txns`` registers a loader that
imports ``txns.spark`` the first time a pyspark object reaches the
database layer). It works through the public engine interface
(:class:`txns.db.engine.EngineTxn`). This runs in the user's process, where
the DataFrame's SparkSession lives::

    with db.transaction() as t:
        t.insert("orders", orders_df)      # executors write the parts
        t.insert("ledger", ledger_df)
        t.insert("audit", [{"what": "import"}])   # Python rows mix in
    # one commit: every table or none

Protocol (a table without a primary key): the DataFrame's columns are
checked against the table's by name and type (``SchemaMismatch`` before any
job runs: nothing written, nothing added to the transaction); executors
write the rows as Parquet parts of the table's data shard
(:func:`txns.spark.write.write_batch`), and the transaction gets the batch of
their descriptors (:meth:`EngineTxn.add_batch`, times ``[0, 1)``): the commit
re-timestamps it without rewriting a byte. An exception inside the block
abandons the transaction, which deletes those parts. A keyed table goes to
:func:`txns.spark.merge.insert_keyed` (``DuplicateKey`` semantics).

The table cannot be read back (nor written by key) in the same transaction
after a DataFrame insert: the transaction does not hold its rows. The
database must be on storage the executors reach (``file://``, ``s3://``;
``mem://`` is refused with ``InvalidUsage``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from persist import InvalidUsage
from txns.db.engine import EngineTxn
from txns.spark._common import check_url
from txns.spark.table_write import check_table_columns
from txns.spark.write import write_batch

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

    from txns.db.database import Database
    from txns.resolve.repair import BatchContext, Execution


def insert(txn: EngineTxn, table: str, df: DataFrame) -> int:
    """Insert ``df``'s rows into ``table`` in transaction ``txn``; return how many (see the module doc)."""
    e = txn.entry(table)
    if e.primary_key is not None:
        from txns.spark.merge import insert_keyed

        return insert_keyed(txn.transaction, table, df)
    url = txn.url  # (as typed: executors open it)
    try:
        check_url(url)
    except InvalidUsage as err:
        raise InvalidUsage(f"cannot insert a Spark DataFrame into table {table!r}: {err}") from None
    check_table_columns(df.schema, e)
    batch = write_batch(df, url, e.data_id, txn.shard_schema(e))
    rows = batch.rows
    txn.add_batch(table, batch, added=rows, retracted=0, read_table=False)
    return int(rows)


class SparkEngine:
    """Spark's :class:`txns.engines.Engine`: pyspark DataFrames (classic or Spark Connect), ``executor="spark"``."""

    name = "spark"

    def accepts(self, data: object) -> bool:
        from pyspark.sql import DataFrame

        return isinstance(data, DataFrame)  # (pyspark 4: Connect's DataFrame is one too)

    def insert(self, txn: EngineTxn, table: str, data: Any) -> int:
        return insert(txn, table, data)

    def speculate(
        self,
        db: Database,
        ts: int,
        fns: Sequence[Callable[[BatchContext], Any]],
        *,
        workers: int | None,
        session: Any,
    ) -> list[Execution]:
        from txns.spark.batch import run_speculative

        return run_speculative(session, type(db), db.client.url, ts, fns, partitions=workers)


__all__ = ["SparkEngine", "insert"]
