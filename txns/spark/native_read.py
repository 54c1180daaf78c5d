"""Reads of a compacted table by Spark's own Parquet reader: no row passes through Python.

A read through the ``txns`` data source runs Python in every task (the
data source API has no other way), which costs about twice Spark's JVM
Parquet reader on a compacted table. :func:`native_table_read` serves such
a read with ``spark.read.parquet`` of the plan's part files instead, when
that gives exactly what the data source would:

- the location is a local directory (``file://``): Spark reads the part
  files in place (S3 would need Hadoop's S3A jars, which pip cannot install);
- the plan is one run of parts, consolidated (``distinct_kv``: every row
  distinct, every diff positive), without inline rows and without a time
  rewrite above the read time: what compaction leaves;
- Spark reads each of the table's columns as the data source's type (else
  the data source reads it).

Invariants:

- **Integrity.** Persist writes a CRC-32 into every Parquet page header
  (``write_page_checksum``); the JVM reader verifies them
  (``parquet.page.verify-checksum.enabled``), in place of the part's
  whole-file CRC-32C (which needs its bytes in Python). A damaged footer
  fails to parse; a part of another size than recorded is refused here.
- **Times.** A part whose footer says it holds a time past the read time
  gets the filter ``ts <= as_of``; others are read whole.
- **Multiplicity.** A row stored with ``diff`` n > 1 is n rows (repeated by
  ``explode``) unless ``diff=True`` keeps the column, as the data source.
- **Holds.** The parts are held for ``valid_for_s`` (default
  ``PLAN_VALID_S``; ``hold_parts``), as a planned read: compaction may
  retire them, GC keeps them meanwhile.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import pyarrow.parquet as pq

from persist.manifest import SnapshotPlan
from txns.db.scan import footer_stats
from txns.spark.native_write import native_root
from txns.spark.read import PLAN_VALID_S
from txns.spark.table_read import output_struct

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from txns.db.catalog import TableEntry
    from txns.db.database import Database

VERIFY_PAGES = "parquet.page.verify-checksum.enabled"
"""The Parquet reader's option that checks every page's CRC-32 (persist writes them)."""


def native_table_read(
    spark: SparkSession,
    db: Database,
    url: str,
    entry: TableEntry,
    ts: int,
    *,
    diff: bool,
    valid_for_s: float = PLAN_VALID_S,
) -> DataFrame | None:
    """The table ``entry`` at ``ts`` read by Spark's Parquet reader, or None when only the data source can."""
    from pyspark.sql import functions as F

    root = native_root(url)
    if root is None:
        return None
    plan: SnapshotPlan = db.plan(entry, ts)
    if len(plan.runs) != 1:
        return None
    run = plan.runs[0]
    if not run.distinct_kv or run.inline is not None or not run.parts:
        return None
    if run.ts_rewrite is not None and run.ts_rewrite > ts:
        return None
    paths, ts_max, diff_max, ts_types = [], 0, 1, set()
    for ref in run.parts:
        path = root / "blob" / ref.key
        stats = _footer_stats(path, ref.size)
        if stats is None:
            return None
        ts_max, diff_max = max(ts_max, stats[0]), max(diff_max, stats[1])
        ts_types.add(stats[2])
        paths.append(str(path))
    if len(ts_types) != 1:
        return None  # (parts of Spark's writer store ts as a long, persist's as uint64: one reader schema)
    cols = list(entry.schema.names)
    df = spark.read.option(VERIFY_PAGES, "true").parquet(*paths)
    want = output_struct(entry, diff=False, changes=False)
    if [(f.name, f.dataType) for f in want.fields] != [(n, df.schema[n].dataType) for n in cols]:
        return None  # (a column Spark reads as another type than the data source gives)
    # (held from here on, as a planned read; compaction's part grace covered the checks above)
    db.client.hold_parts(entry.data_id, valid_for_s)
    if ts_max > ts:
        df = df.where(F.col("ts") <= F.lit(ts).cast("decimal(20,0)"))
    if diff:
        return df.select(*cols, F.col("diff"))
    if diff_max > 1:
        df = df.withColumn("_n", F.explode(F.sequence(F.lit(1), F.col("diff"))))
    return df.select(*cols)


def _footer_stats(path: Path, size: int) -> tuple[int, int, str] | None:
    """(largest ``ts``, largest ``diff``, how ``ts`` is stored) of a part, from its footer; None: unknown."""
    try:
        if path.stat().st_size != size:
            return None
        meta = pq.read_metadata(path)
    except (OSError, ValueError):
        return None
    stats = footer_stats(meta)
    cols = {c.name: c for c in (meta.schema.column(j) for j in range(meta.num_columns))}
    if stats is None or "ts" not in cols or "diff" not in cols:
        return None  # (a part that leaves them out: Spark's reader would not see them)
    ts_col = cols["ts"]
    return stats[0], stats[2], f"{ts_col.physical_type}/{ts_col.logical_type}"


__all__ = ["VERIFY_PAGES", "native_table_read"]
