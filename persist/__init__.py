"""persist: durable, versioned shards of timestamped updates on object storage.

A shard is a collection of updates ``((key, val), ts, diff)``. Its metadata
lives in a consensus log (one compare-and-set per change), its data in
immutable Parquet parts in blob storage.

>>> import pyarrow as pa
>>> from persist import PersistClient, Schema, ShardId
>>> client = PersistClient.open("mem://doc-persist")
>>> schema = Schema(key=pa.schema([("user", pa.string())]), val=pa.schema([("score", pa.int64())]))
>>> shard = ShardId.new()
>>> writer = client.open_writer(shard, schema)
>>> writer.compare_and_append([((("ann",), (10,)), 0, 1)], expected_upper=0, new_upper=1)
>>> writer.compare_and_append([((("ann",), (10,)), 1, -1), ((("ann",), (12,)), 1, 1)], 1, 2)
>>> reader = client.open_leased_reader(shard, schema)
>>> reader.snapshot_and_fetch(0)
[((('ann',), (10,)), 0, 1)]
>>> reader.snapshot_and_fetch(1)
[((('ann',), (12,)), 1, 1)]

The public API is what this package exports (below) plus the modules
``persist.manifest`` (runs, parts and snapshot plans: what a distributed
reader needs), ``persist.location`` and ``persist.url`` (storage backends and
the URL registry), and ``persist.testing`` (test support). Everything under
``persist._internal`` is private: code outside persist never imports it.
``ShardState`` and ``HollowBatch`` are exported as read-only values (what a
:class:`ShardView` returns); only handles change a shard.
"""

from persist._internal.codec import crc32c, frame, unframe
from persist._internal.retry import Attempts, backoff, retry_storage, retry_until
from persist._internal.state import HollowBatch, ShardState
from persist._internal.threads import ThreadPool
from persist.batch import Batch, BatchBuilder, finish_all
from persist.client import PersistClient
from persist.config import PersistConfig
from persist.errors import (
    CorruptObject,
    Determinate,
    ExternalError,
    Indeterminate,
    InvalidUsage,
    LeaseExpired,
    PartRetired,
    PersistError,
    ReadBelowSince,
    ReadTimeout,
    SchemaMismatch,
    UpperMismatch,
)
from persist.manifest import PartRef, Run, SnapshotPlan, replan
from persist.read import DowngradeResult, Listen, Progress, ReadHandle, SinceHandle, Updates
from persist.schema import CLOSED, TS_MAX, Schema, ShardId, check_ts
from persist.shard import ShardView
from persist.write import WriteHandle

__all__ = [
    "Attempts",
    "Batch",
    "BatchBuilder",
    "CLOSED",
    "CorruptObject",
    "Determinate",
    "DowngradeResult",
    "ExternalError",
    "HollowBatch",
    "Indeterminate",
    "InvalidUsage",
    "LeaseExpired",
    "Listen",
    "PartRef",
    "PartRetired",
    "PersistClient",
    "PersistConfig",
    "PersistError",
    "Progress",
    "ReadBelowSince",
    "ReadHandle",
    "ReadTimeout",
    "Run",
    "Schema",
    "SchemaMismatch",
    "ShardId",
    "ShardState",
    "ShardView",
    "SinceHandle",
    "SnapshotPlan",
    "TS_MAX",
    "ThreadPool",
    "Updates",
    "UpperMismatch",
    "WriteHandle",
    "backoff",
    "check_ts",
    "crc32c",
    "finish_all",
    "frame",
    "replan",
    "retry_storage",
    "retry_until",
    "unframe",
]
