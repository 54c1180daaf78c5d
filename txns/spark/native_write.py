"""The native write path: Spark's own Parquet writer makes the parts, no rows cross into Python.

:func:`txns.spark.write_batch` takes this path when :func:`native_plan`
allows it: the location is a local directory (``file://``: Spark's JVM
writes into it directly; S3 would need Hadoop's S3A jars, which pip does
not install), and every column's Spark type is exactly the Arrow type of
its field (so Spark writes the values persist would, with no conversion to
check). Otherwise the Python path (``mapInArrow`` into a persist
``BatchBuilder``) runs.

Protocol of :func:`write_native`:

1. Spark writes the DataFrame, projected to the shard's key and val
   columns (plus ``diff`` as a long when the DataFrame has one), as Parquet
   files into a staging directory beside the blobs
   (``{root}/spark-staging/{uuid}``), at most ``rows_per_part`` rows a file,
   compressed with the session's Parquet codec as ``df.write.parquet`` is
   (``spark.sql.parquet.compression.codec``: snappy by default; zstd cost
   13% more time at 10M rows for a quarter of the bytes; compaction writes
   persist's zstd parts either way),
   in the DataFrame's order: no row goes through Python, and no sort (parts
   may be unsorted; their key bounds are the first column's min and max,
   whatever the order, so pruning stays exact). ``ts`` is left out, and
   ``diff`` when the DataFrame has none: readers fill them in as 0 and +1
   (``persist.manifest.IMPLIED_COLUMNS``), and Spark does not spend a fifth
   of the write encoding two constant columns.
2. The driver checks the files in parallel (a few threads): each file's
   footer gives the row count and the null counts (a null in a non-nullable
   field fails the write with ``SchemaMismatch``, everything staged
   deleted, nothing adopted); its bytes, read in chunks, give size and
   CRC-32C; the key bounds come from the footer (a signed integer first
   column) or the first column decoded a batch at a time
   (``persist.manifest.describe_file``); the file is fsynced. Memory: a
   chunk and a batch per thread, whatever the files' sizes.
3. Only when every file passed, each is renamed to a fresh part key under
   the shard (``{shard}/parts/{ms}-{uuid}``, the name ``gc_leaked``
   understands) and the directory is fsynced before the batch is returned,
   so a commit never names a part that a crash could lose.
4. The staging directory is removed. A crash before that leaves it (and
   parts renamed so far, unreferenced: ``gc_leaked`` deletes them by age);
   staging directories older than a day are removed by the next native
   write to the same location.

The parts are ordinary persist parts: readers check their size and CRC and
cast their columns to the shard's schema.
"""

from __future__ import annotations

import os
import shutil
import time
import uuid
from concurrent.futures import wait
from pathlib import Path
from typing import TYPE_CHECKING

import pyarrow.parquet as pq

from persist import Schema, SchemaMismatch, ThreadPool
from persist.file import fsync_path, makedirs_durable
from persist.manifest import IMPLIED_COLUMNS, PartRef, describe_file, part_key
from persist.url import local_path

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

STAGING_MAX_AGE_S = 86_400.0
"""Staging directories older than this are leftovers of a crashed write: the next native write removes them."""
ARROW_BYTES_PER_VALUE = 8
"""Rough Arrow bytes per value, to turn ``part_target_bytes`` into rows per file."""
CHECK_THREADS = 4
"""Staged files checked (read, CRC-32C, fsync) at once."""


def native_root(url: str) -> Path | None:
    """The local directory of a ``file://`` location, or None (another scheme: no native path)."""
    return local_path(url)


def native_types(df: DataFrame, schema: Schema) -> bool:
    """Whether every key and val column's Spark type is exactly its field's Arrow type."""
    from pyspark.sql.pandas.types import to_arrow_type
    from pyspark.sql.types import TimestampNTZType, TimestampType

    for field in list(schema.key) + list(schema.val):
        dt = df.schema[field.name].dataType
        if isinstance(dt, (TimestampType, TimestampNTZType)):
            return False  # (Spark's Parquet timestamps depend on session settings)
        try:
            if to_arrow_type(dt, timezone="UTC") != field.type:
                return False
        except Exception:  # noqa: BLE001 - pyspark raises its own kinds
            return False
    return True


def write_native(
    df: DataFrame, root: Path, data_id: str, schema: Schema, columns: list[str], target_bytes: int
) -> tuple[PartRef, ...]:
    """Write ``df``'s ``columns`` (key and val fields, optional ``diff``) as parts of ``data_id``; their refs."""
    from txns.spark._common import col

    names = schema.key_names + schema.val_names
    has_diff = "diff" in columns
    rows_per_part = max(1, target_bytes // (ARROW_BYTES_PER_VALUE * (len(names) + 2)))
    staging_root = root / "spark-staging"
    _remove_old(staging_root)
    staging = staging_root / uuid.uuid4().hex
    out = df.select(*[col(n) for n in names], *([col("diff").cast("long").alias("diff")] if has_diff else []))
    # (the one projection of the write: ``df`` may hold other columns, which are not written)
    try:
        # (the session's Parquet codec, as df.write.parquet: snappy unless configured otherwise)
        out.write.option("maxRecordsPerFile", rows_per_part).parquet(str(staging))
        files = sorted(p for p in staging.iterdir() if p.name.endswith(".parquet"))
        required = [f.name for f in schema.arrow if not f.nullable and f.name not in IMPLIED_COLUMNS]
        required += ["diff"] if has_diff else []
        pool = ThreadPool.of_process("txns-spark-adopt", CHECK_THREADS)
        futures = [pool.submit(_check, p, required, data_id) for p in files]
        wait(futures)  # (all done before a failure removes the staging directory)
        checked = [f.result() for f in futures]
        parts_dir = root / "blob" / data_id / "parts"
        makedirs_durable(parts_dir)  # (a new shard's directories: their entries durable before any part)
        for path, ref in checked:
            os.replace(path, root / "blob" / ref.key)
        refs = [ref for _, ref in checked]
        fsync_path(parts_dir)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return tuple(sorted((r for r in refs if r.rows), key=lambda p: p.key))


def _check(path: Path, required: list[str], data_id: str) -> tuple[Path, PartRef]:
    """Check a staged file (no null in a ``required`` column), fsync it; it and its descriptor at a fresh part key."""
    meta = pq.read_metadata(path)
    names = [meta.schema.column(i).name for i in range(meta.num_columns)]
    for name in required:
        nulls = 0
        for g in range(meta.num_row_groups):
            stats = meta.row_group(g).column(names.index(name)).statistics
            if stats is None or not stats.has_null_count:
                nulls = pq.read_table(path, columns=[name]).column(name).null_count
                break
            nulls += stats.null_count
        if nulls:
            raise SchemaMismatch(f"column {name!r} of shard {data_id} is not nullable, but a row has a null")
    ref = describe_file(part_key(data_id), path)
    fsync_path(path)
    return path, ref


def _remove_old(staging_root: Path) -> None:
    if not staging_root.is_dir():
        return
    horizon = time.time() - STAGING_MAX_AGE_S
    for d in staging_root.iterdir():
        try:
            if d.stat().st_mtime < horizon:
                shutil.rmtree(d, ignore_errors=True)
        except OSError:
            pass


__all__ = ["native_root", "native_types", "write_native"]
