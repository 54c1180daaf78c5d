"""A table's snapshot as a ``pyarrow.dataset.Dataset``: engines push projections and filters into its parts.

``Table.to_dataset()`` plans the snapshot once (its time is fixed then) and
builds a dataset over it, split in two:

- **direct parts**: Parquet part files the engine reads itself, in place
  (``file://``: the local files; ``s3://``: through pyarrow's
  ``S3FileSystem`` with the location's endpoint and region and the standard
  AWS credential chain), so it prunes row groups by their statistics,
  reads only the columns it needs and filters while decoding;
- **consolidated rows**: everything else, read through the usual checked
  path (:class:`~txns.db.scan.PlanReader`: size and CRC-32C, ``ts <= as_of``)
  and consolidated in memory.

Invariant (why the union is exactly the table at ``as_of``): the snapshot
is a multiset, the sum of the diffs of every stored row with
``ts <= as_of``. A part is direct only when its footer shows no retraction
(every ``diff`` >= 1; a row stored with ``diff`` n > 1 is read once from
the file and its other n - 1 copies are added to the consolidated half),
no time past ``as_of``, the table's column
types, and when no retraction of the snapshot can cancel one of its rows:
the first column of every retracted row (``diff < 0``, in any part or
inline run) lies outside the part's key bounds (``PartRef.lo/hi``; a part
without bounds is never direct while retractions exist). A row of a direct
part therefore has no negative diff anywhere, and its count is the sum of
its occurrences in both halves; a row with a retraction has every
occurrence in the consolidated half, which sums its diffs
(:func:`~txns.db.scan.consolidate`). A compacted table (no retractions, diff
1 everywhere) is all direct; a table with many uncompacted retractions is
mostly consolidated, in memory: compact it (``db.compact()``) first.

The dataset is :class:`pyarrow.dataset.FileSystemDataset` (all direct),
``InMemoryDataset`` (none direct, or a location whose parts have no file
system: ``mem://``), or a ``UnionDataset`` of the two.

Integrity. The engine's reads of direct parts check persist's per-page
CRC-32 (``page_checksum_verification``) instead of the whole part's CRC-32C;
each part's footer is read here, once (the engine reuses it), and a part
whose size is not the recorded one is ``CorruptObject`` (local files: their
size is checked; S3: the footer is read at the recorded size).

Reach. When pyarrow cannot read the part files (S3 credentials it does not
find, an endpoint it cannot reach), the whole snapshot is consolidated in
memory instead, with a warning in the log.

Lifetime. Direct parts stay readable for ``part_grace_s`` (5 minutes by
default) after compaction retires them; ``hold_s`` holds them longer (one
PUT, :meth:`persist.PersistClient.hold_parts`).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
import pyarrow.fs as pafs

from persist import CorruptObject, PartRetired, SnapshotPlan
from persist.location import Blob
from persist.manifest import PartRef, Run, bound_values, prune_runs
from persist.s3 import S3Blob
from persist.url import local_path
from txns.db.scan import PlanReader, consolidate, footer_stats, ordered, read_table

log = logging.getLogger(__name__)

FOOTERS_AHEAD = 8
"""Part footers read at once while planning a dataset."""


@dataclass(frozen=True)
class PartFiles:
    """Where a location's parts are as files: a pyarrow file system and the blob area's path on it."""

    fs: pafs.FileSystem
    base: str

    def path(self, key: str) -> str:
        return f"{self.base}/{key}"


def part_files(url: str, blob: Blob) -> PartFiles | None:
    """The parts of the location at ``url`` as files, or None (in-process storage, or an endpoint pyarrow can't use)."""
    root = local_path(url)
    if root is not None:
        return PartFiles(pafs.LocalFileSystem(), str(root / "blob"))
    if isinstance(blob, S3Blob):
        return _s3_files(blob)
    return None


def _s3_files(blob: S3Blob) -> PartFiles | None:
    import boto3

    meta = blob.client.meta
    kwargs: dict[str, Any] = {"region": meta.region_name or "us-east-1"}
    endpoint = meta.endpoint_url
    if endpoint and not endpoint.endswith("amazonaws.com"):
        ep = urlsplit(endpoint)
        if ep.path not in ("", "/"):
            return None  # (an endpoint with a path: pyarrow has no such option; read through the blob)
        kwargs.update(endpoint_override=ep.netloc, scheme=ep.scheme)
    creds = boto3.session.Session().get_credentials()  # the standard chain, as the location's client
    if creds is not None:
        frozen = creds.get_frozen_credentials()
        kwargs.update(access_key=frozen.access_key, secret_key=frozen.secret_key, session_token=frozen.token)
    base = "/".join(p for p in (blob.bucket, blob.prefix, "blob") if p)
    return PartFiles(pafs.S3FileSystem(**kwargs), base)


@dataclass(frozen=True)
class _Footer:
    ts_max: int
    diff_min: int
    diff_max: int
    types_match: bool


def _fragment(files: PartFiles, ref: PartRef, schema: pa.Schema) -> tuple[Any, _Footer | None]:
    """A part's fragment, its footer read (and kept: the engine does not read it again), and the footer's facts.

    Facts None: unknown (no statistics). A local file of another size than
    recorded is CorruptObject; on S3 the footer is read at the recorded size
    (no HEAD request), where a file of another size has no footer.
    """
    path = files.path(ref.key)
    if isinstance(files.fs, pafs.LocalFileSystem):  # (pyarrow ignores file_size there: checked here, one stat)
        info = files.fs.get_file_info(path)
        if info.type == pafs.FileType.NotFound:
            raise PartRetired(f"part {ref.key} is gone (retired by compaction?)", ref.key)
        if info.size != ref.size:
            raise CorruptObject(ref.key, f"size {info.size} != recorded {ref.size}")
    frag = parquet_format().make_fragment(path, filesystem=files.fs, file_size=ref.size)
    try:
        frag.ensure_complete_metadata()
        meta, stored = frag.metadata, frag.physical_schema
    except Exception as e:  # noqa: BLE001 - a part that is not there (retired), else one that is damaged
        if isinstance(e, FileNotFoundError) or files.fs.get_file_info(path).type == pafs.FileType.NotFound:
            raise PartRetired(f"part {ref.key} is gone (retired by compaction?)", ref.key) from None
        raise CorruptObject(ref.key, f"unreadable Parquet footer: {e}") from None
    stats = footer_stats(meta)
    if stats is None:
        return frag, None
    match = all(c.name in stored.names and stored.field(c.name).type == c.type for c in schema)
    return frag, _Footer(stats[0], stats[1], stats[2], match)


def _extra_copies(frag: Any, reader: PlanReader) -> pa.Table:
    """The rows of a part stored with ``diff`` n > 1, with ``diff`` n - 1 (row groups without any: skipped)."""
    schema = reader.empty().schema
    t = frag.to_table(schema=schema, filter=pc.field("diff") > 1)
    return t.set_column(t.schema.get_field_index("diff"), "diff", pc.subtract(t.column("diff"), 1)).cast(schema)


def parquet_format() -> ds.ParquetFileFormat:
    """The format engines read direct parts with: every page's CRC-32 checked (persist writes them)."""
    return ds.ParquetFileFormat(
        default_fragment_scan_options=ds.ParquetFragmentScanOptions(page_checksum_verification=True)
    )


def snapshot_dataset(reader: PlanReader, files: PartFiles | None) -> ds.Dataset:
    """The snapshot ``reader.plan`` (all of ``reader.columns``) as a dataset (see the module doc)."""
    plan: SnapshotPlan = reader.plan
    schema = reader.out_schema
    if files is None:
        return ds.dataset(read_table(reader), schema=schema)
    live: list[tuple[Run, PartRef]] = [
        (run, ref) for run in plan.runs if run.ts_rewrite is None or run.ts_rewrite <= plan.as_of for ref in run.parts
    ]
    workers = 1 if isinstance(files.fs, pafs.LocalFileSystem) else FOOTERS_AHEAD  # (local footers: no wait to hide)
    try:
        opened = list(ordered(lambda item: _fragment(files, item[1], schema), live, FOOTERS_AHEAD, workers))
    except OSError as e:  # pyarrow cannot read the parts as files (credentials, endpoint): through the blob
        log.warning("reading the parts of %s as files failed (%s); consolidating the snapshot in memory", files.base, e)
        return ds.dataset(read_table(reader), schema=schema)
    footers = [foot for _, foot in opened]
    memory: list[pa.Table] = [t for run in plan.runs if (t := reader.inline(run)) is not None and t.num_rows]
    negatives = [t.filter(pc.less(t.column("diff"), 0)) for t in memory]
    for (run, ref), foot in zip(live, footers, strict=True):
        if foot is None or foot.diff_min < 0:
            negatives.append(reader.part(run, ref, negative_only=True))
    first = reader.arrow.field(0)  # (the shard's first column, which part bounds are of: a primary key's first)
    values = [v for t in negatives for v in t.column(first.name).to_pylist()]
    touched: set[str] = set()
    if values:
        bounds = bound_values(values, first.type)
        touched = {ref.key for run in prune_runs(tuple(run for run, _ in live), bounds) for ref in run.parts}
        touched |= {ref.key for _, ref in live if ref.lo is None or ref.hi is None}
    direct: list[Any] = []
    rest: list[tuple[Run, PartRef]] = []
    for (run, ref), (frag, foot) in zip(live, opened, strict=True):
        ok = (
            foot is not None
            and foot.types_match
            and foot.diff_min >= 1
            and foot.ts_max <= plan.as_of
            and ref.key not in touched
        )
        if not ok:
            rest.append((run, ref))
            continue
        direct.append(frag)
        if foot is not None and foot.diff_max > 1:  # (the file gives each row once: its other copies in memory)
            memory.append(_extra_copies(frag, reader))
    memory += [t for t in ordered(lambda item: reader.part(*item), rest, FOOTERS_AHEAD) if t.num_rows]
    parts: list[ds.Dataset] = []
    if direct:
        parts.append(ds.FileSystemDataset(direct, schema=schema, format=parquet_format(), filesystem=files.fs))
    if memory or not direct:
        rows = consolidate(pa.concat_tables(memory), reader.columns) if memory else schema.empty_table()
        parts.append(ds.dataset(rows.cast(schema), schema=schema))
    return parts[0] if len(parts) == 1 else ds.dataset(parts)


def lazy_polars(d: ds.Dataset, columns: list[str]) -> Any:
    """A Polars ``LazyFrame`` of ``columns`` of a dataset of :func:`snapshot_dataset`.

    All direct, local, and one stored schema: Polars' own Parquet scan of
    the files (``pl.scan_parquet``); else ``pl.scan_pyarrow_dataset``.
    """
    import polars as pl

    if isinstance(d, ds.FileSystemDataset) and isinstance(d.filesystem, pafs.LocalFileSystem):
        schemas = {frag.physical_schema.remove_metadata() for frag in d.get_fragments()}  # (footers kept)
        if len(schemas) == 1:
            return pl.scan_parquet(list(d.files)).select(columns)
    return pl.scan_pyarrow_dataset(d).select(columns)


def direct_files(d: ds.Dataset) -> Iterator[str]:
    """The part files a dataset of :func:`snapshot_dataset` lets the engine read directly."""
    if isinstance(d, ds.FileSystemDataset):
        yield from d.files
    elif isinstance(d, ds.UnionDataset):
        for child in d.children:
            yield from direct_files(child)


__all__ = ["PartFiles", "direct_files", "lazy_polars", "parquet_format", "part_files", "snapshot_dataset"]
