"""txns: atomic transactions across many persist shards, through one txns shard.

>>> import pyarrow as pa
>>> from persist import PersistClient, Schema, ShardId
>>> from txns import TxnsHandle, TimestampUnavailable
>>> client = PersistClient.open("mem://doc-txns-usage")
>>> schema = Schema(key=pa.schema([("k", pa.int64())]), val=pa.schema([]))
>>> txns = TxnsHandle.open(client, ShardId.new())
>>> d0, d1 = str(ShardId.new()), str(ShardId.new())
>>> txns.register(1, {d0: schema}); txns.register(2, {d1: schema})
>>> txn = txns.begin(); txn.write(d0, (0,), (), 1); txn.write(d1, (1,), (), -1)
>>> _ = txn.commit_at(txns, 3).apply(txns)
>>> txn = txns.begin(); txn.write(d0, (2,), (), 1)
>>> try:
...     txn.commit_at(txns, 3)
... except TimestampUnavailable as e:
...     print(e.upper)
4
>>> _ = txn.commit_at(txns, 4).apply(txns)
>>> txns.snapshot(d1, 4)
[(((1,), ()), 4, -1)]
"""

from typing import TYPE_CHECKING, Any

from persist import ReadBelowSince, ReadTimeout, SchemaMismatch  # errors db users meet
from txns import engines
from txns.cache import ListenNext, TxnsCache
from txns.entries import TXNS_SCHEMA, Entry
from txns.errors import NotRegistered, TimestampUnavailable
from txns.group_commit import GroupCommitFailed, GroupCommitter
from txns.handle import DataSnapshot, TxnsHandle
from txns.resolve.repair import BatchContext
from txns.subscribe import DataSubscribe
from txns.txn import Tidy, Txn, TxnApply

if TYPE_CHECKING:
    from txns.db import (
        Abort,
        ClockSkewError,
        CommitInfo,
        Database,
        DatabaseNotFound,
        DuplicateKey,
        InvalidTableName,
        RowNotFound,
        Table,
        TableExists,
        TableNotFound,
        Transaction,
        TransactionClosed,
        TransactionConflict,
        connect,
    )

# The database layer (names, Arrow, history, retention), on top of the core modules: its names in
# ``__all__`` load on first use (PEP 562), so that importing the core (``txns.handle``...) does not import it.


def __getattr__(name: str) -> Any:
    if name in __all__:  # (only a name not defined here yet: the database layer's)
        import txns.db

        value = getattr(txns.db, name)
        globals()[name] = value  # (found directly from now on)
        return value
    raise AttributeError(f"module 'txns' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})


def _load_spark() -> None:
    """Import Spark's engine (it registers itself): a pyspark object reached the database layer."""
    import txns.spark  # noqa: F401


# (the registry finds Spark's engine by registration; this loader covers users who never imported txns.spark)
engines.register_loader("pyspark", "spark", _load_spark)

__all__ = [
    "Abort",
    "ClockSkewError",
    "BatchContext",
    "GroupCommitFailed",
    "GroupCommitter",
    "CommitInfo",
    "Database",
    "DatabaseNotFound",
    "DuplicateKey",
    "InvalidTableName",
    "ReadBelowSince",
    "ReadTimeout",
    "RowNotFound",
    "SchemaMismatch",
    "Table",
    "TableExists",
    "TableNotFound",
    "Transaction",
    "TransactionClosed",
    "TransactionConflict",
    "connect",
    "DataSnapshot",
    "DataSubscribe",
    "Entry",
    "ListenNext",
    "NotRegistered",
    "TXNS_SCHEMA",
    "Tidy",
    "TimestampUnavailable",
    "Txn",
    "TxnApply",
    "TxnsCache",
    "TxnsHandle",
]
