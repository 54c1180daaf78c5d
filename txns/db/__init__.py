"""txns.db: a database of named tables on object storage, with atomic multi-table transactions.

>>> import pyarrow as pa, txns
>>> db = txns.connect("mem://doc-db")
>>> _ = db.create_table("accounts", pa.schema([("account", pa.string()), ("balance", pa.int64())]))
>>> _ = db.create_table("audit", pa.schema([("event", pa.string())]))
>>> with db.transaction(metadata={"job": "open"}) as t:      # one atomic commit over both tables
...     _ = t.insert("accounts", [{"account": "alice", "balance": 100}, {"account": "bob", "balance": 0}])
...     _ = t.insert("audit", [{"event": "opened two accounts"}])
>>> opened = t.commit_info.ts
>>> with db.transaction() as t:
...     _ = t.retract("accounts", [{"account": "alice", "balance": 100}, {"account": "bob", "balance": 0}])
...     _ = t.insert("accounts", [{"account": "alice", "balance": 90}, {"account": "bob", "balance": 10}])
>>> sorted(db.table("accounts").to_arrow().to_pylist(), key=lambda r: r["account"])
[{'account': 'alice', 'balance': 90}, {'account': 'bob', 'balance': 10}]
>>> db.table("accounts").to_arrow(as_of=opened).column("balance").to_pylist()
[100, 0]
>>> db.history(limit=1).column("rows_retracted").to_pylist()
[2]

Modules, one job each: ``root`` (the root record), ``clock`` (hybrid
timestamps), ``catalog`` (names -> data shards), ``arrow_io`` (inputs and
outputs), ``scan`` (reading plans as Arrow), ``transaction``, ``table``,
``retention``, ``recover`` (a deleted root record), ``skew`` (clients'
clocks against the storage's), ``applier`` (applying commits in the
background), ``oracle`` (read and write timestamps per isolation level), ``validation`` (did what a
transaction read change?), ``keyed`` (primary keys), ``read_txn``
(read-only transactions), ``pool``
(the threads for parallel storage calls), ``database``, ``commands`` (the
CLI's database commands). Spark is never imported here.
"""

from txns.db.batch import BatchResult
from txns.db.catalog import TableEntry
from txns.db.database import HISTORY_SCHEMA, Database, connect
from txns.db.errors import (
    Abort,
    DatabaseNotFound,
    DuplicateKey,
    InvalidTableName,
    RowNotFound,
    TableExists,
    TableNotFound,
    TransactionClosed,
    TransactionConflict,
)
from txns.db.recover import recover_root
from txns.db.skew import ClockSkewError
from txns.db.table import Table
from txns.db.transaction import CommitInfo, Transaction

__all__ = [
    "BatchResult",
    "Abort",
    "ClockSkewError",
    "CommitInfo",
    "Database",
    "DatabaseNotFound",
    "DuplicateKey",
    "HISTORY_SCHEMA",
    "InvalidTableName",
    "RowNotFound",
    "Table",
    "TableEntry",
    "TableExists",
    "TableNotFound",
    "Transaction",
    "TransactionClosed",
    "TransactionConflict",
    "connect",
    "recover_root",
]
