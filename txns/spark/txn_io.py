"""Spark DataFrames as inputs of database transactions: ``t.insert(table, spark_df)``.

``Transaction.insert`` hands a Spark DataFrame here (:mod:`txns.db.engines`).
This runs in the user's process, where the DataFrame's SparkSession lives::

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
their descriptors (``Transaction._add_batch``, times ``[0, 1)``): the commit
re-timestamps it without rewriting a byte. An exception inside the block
abandons the transaction, which deletes those parts. A keyed table goes to
:func:`txns.spark.merge.insert_keyed` (``DuplicateKey`` semantics).

The table cannot be read back (nor written by key) in the same transaction
after a DataFrame insert: the transaction does not hold its rows. The
database must be on storage the executors reach (``file://``, ``s3://``;
``mem://`` is refused with ``InvalidUsage``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from persist import InvalidUsage
from txns.db.catalog import data_schema
from txns.spark._common import check_url
from txns.spark.table_write import check_table_columns
from txns.spark.write import write_batch

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

    from txns.db.transaction import Transaction


def insert(t: Transaction, table: str, df: DataFrame) -> int:
    """Insert ``df``'s rows into ``table`` in transaction ``t``; return how many (see the module doc)."""
    e = t._entry(table)
    if e.primary_key is not None:
        from txns.spark.merge import insert_keyed

        return insert_keyed(t, table, df)
    url = t._db.client.url  # as typed (db.url is redacted): executors open it
    try:
        check_url(url)
    except InvalidUsage as err:
        raise InvalidUsage(f"cannot insert a Spark DataFrame into table {table!r}: {err}") from None
    check_table_columns(df.schema, e)
    batch = write_batch(df, url, e.data_id, data_schema(e.schema, e.primary_key))
    rows = batch.rows
    t._add_batch(table, batch, added=rows, retracted=0, read_table=False)
    return int(rows)


__all__ = ["insert"]
