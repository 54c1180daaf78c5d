"""Operator logic for a txns shard: inspect, apply-and-tidy, compact, garbage-collect.

The ``txns`` command (:mod:`txns.cli`) parses arguments and prints; what it
does is here, as a library (usable from a scheduler or a notebook too).
Every operation is safe to run at any time, alongside writers, readers and
other operators, because it uses only the protocol's idempotent steps:

- :func:`read_txns` only reads (consensus heads and the txns shard's parts);
  it registers no reader and writes nothing.
- :func:`apply_and_tidy` is ``apply_le`` (a data shard whose upper is past a
  commit is skipped) plus one tidy commit at the current txns upper that
  retracts only entries present as of that upper (a lost race retries higher).
- :func:`compact_txns` is ``compact_to`` (never past an unapplied write) plus
  compactions that replace batches only if they are all still there.
- :func:`collect_garbage` deletes only parts no state references: retired
  parts past their grace period, and unreferenced parts older than
  ``older_than_s`` that no entry of the txns shard points to (a committed,
  unapplied batch is referenced only from there).

None of them creates a txns shard: an unknown id raises :class:`NoTxnsShard`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from persist import Batch, InvalidUsage, PersistClient, PersistError, ShardState, replan
from persist.url import redact
from txns.commits import commits_shard_id
from txns.entries import TXNS_SCHEMA, Entry
from txns.errors import TimestampUnavailable
from txns.handle import TxnsHandle
from txns.txn import Tidy

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


class NoTxnsShard(InvalidUsage):
    """There is no txns shard with that id at that location (or the shard is a data shard)."""


@dataclass(frozen=True)
class EntryInfo:
    """One append entry present in the txns shard."""

    data_id: str
    commit_ts: int
    rows: int
    parts: tuple[str, ...]
    batch_id: str
    applied: bool


@dataclass(frozen=True)
class TxnsView:
    """A txns shard as read at one moment: its state, registrations and present entries."""

    txns_id: str
    upper: int
    since: int
    registered: dict[str, int]  # data shard id -> register ts
    entries: tuple[EntryInfo, ...]
    data: dict[str, dict[str, Any]]  # data shard id -> PersistClient.inspect(...)

    def to_json(self, url: str) -> dict[str, Any]:
        """The stable dict of ``txns inspect --json`` (keys documented in :func:`txns.cli.inspect_txns`)."""
        shards = {}
        for d in sorted(set(self.registered) | {e.data_id for e in self.entries}):
            info = self.data.get(d, {})
            reg = self.registered.get(d)
            shards[d] = {
                "registered": reg is not None,
                "register_ts": reg,
                "physical_upper": info.get("upper"),
                "logical_upper": self.upper if reg is not None else info.get("upper"),
                "since": info.get("since"),
                "batches": info.get("batches"),
                "rows": info.get("rows"),
                "parts": info.get("parts"),
                "bytes": info.get("bytes"),
            }
        return {
            "url": redact(url),
            "txns_id": self.txns_id,
            "upper": self.upper,
            "since": self.since,
            "registered": {d: {"register_ts": ts} for d, ts in sorted(self.registered.items())},
            "commits_shard": commits_shard_id(self.txns_id),
            "entries": [
                {
                    "data_id": e.data_id,
                    "commit_ts": e.commit_ts,
                    "rows": e.rows,
                    "parts": len(e.parts),
                    "batch_id": e.batch_id,
                    "applied": e.applied,
                }
                for e in self.entries
            ],
            "unapplied": sum(1 for e in self.entries if not e.applied),
            "data_shards": shards,
        }


def txns_state(client: PersistClient, txns_id: str) -> ShardState:
    """The txns shard's state, read now; :class:`NoTxnsShard` if there is none (or it is a data shard)."""
    state = client.shard(txns_id).fetch()
    if state.seqno is None or state.schema is None:
        raise NoTxnsShard(
            f"no txns shard {txns_id} at {redact(client.url)!r}; check the id and the URL "
            f"(txns shards are created by TxnsHandle.open, not by this tool)"
        )
    if state.schema != TXNS_SCHEMA.to_text():
        raise NoTxnsShard(f"shard {txns_id} at {redact(client.url)!r} is a data shard, not a txns shard")
    return state


def read_txns(client: PersistClient, txns_id: str, with_data: bool = True) -> TxnsView:
    """Read the txns shard ``txns_id`` (and its data shards' states) without writing anything.

    The txns shard is read as a snapshot at ``upper - 1``: what remains is
    the current registrations and the append entries not yet tidied. Each
    entry is ``applied`` iff its data shard's physical upper is past its
    commit time.
    """
    shard = client.shard(txns_id)
    txns_state(client, txns_id)

    def read() -> tuple[ShardState, list[Any]]:
        # a part retired by compaction after we read the state: the retry reads it again
        current = shard.state()
        if current.upper == 0:
            return current, []
        return current, shard.fetch_plan(shard.plan(TXNS_SCHEMA, current.upper - 1, current))

    state, updates = replan(read)
    registered: dict[str, int] = {}
    raw: list[Entry] = []
    for (key, val), _ts, diff in updates:
        e = Entry.from_kv(key, val)
        if diff <= 0:
            continue
        if e.is_registration:
            registered[e.data_id] = e.ts
        else:
            raw.extend([e] * diff)
    data: dict[str, dict[str, Any]] = {}
    if with_data:
        for d in sorted(set(registered) | {e.data_id for e in raw}):
            data[d] = client.inspect(d)
    entries = []
    for e in sorted(raw):
        b = Batch.from_bytes(e.batch)
        upper = data.get(e.data_id, {}).get("upper")
        entries.append(
            EntryInfo(
                data_id=e.data_id,
                commit_ts=e.ts,
                rows=b.rows,
                parts=tuple(p.key for p in b.parts),
                batch_id=b.id,
                applied=upper is not None and upper > e.ts,
            )
        )
    return TxnsView(txns_id, state.upper, state.since, registered, tuple(entries), data)


@contextlib.contextmanager
def open_handle(client: PersistClient, txns_id: str) -> Iterator[TxnsHandle]:
    """A TxnsHandle on an existing txns shard, holding nothing (a killed operator holds back no compaction)."""
    txns_state(client, txns_id)
    handle = TxnsHandle.open(client, txns_id, hold=False)
    try:
        yield handle
    finally:
        with contextlib.suppress(PersistError):
            handle.close()


def apply_and_tidy(handle: TxnsHandle) -> dict[str, Any]:
    """Apply everything committed, then retract the applied entries with one commit.

    The tidy commit goes at the current txns upper; when another writer takes
    that time first it retries at the new upper (entries it tidied meanwhile
    are left out). Returns counts for the report.
    """
    handle.cache.sync()
    upper = handle.cache.frontier
    if upper == 0:
        return {"applied": 0, "tidied": 0, "tidy_ts": None, "upper": 0, "data_shards": 0}
    uppers: dict[str, int] = {}
    pending = []
    for e in handle.cache.entries_le(upper - 1):
        if e.data_id not in uppers:
            uppers[e.data_id] = handle.data_writer(e.data_id).fetch_recent_upper()
        if uppers[e.data_id] <= e.ts:
            pending.append(e)
    tidy = handle.apply_le(upper - 1)
    tidied, tidy_ts = 0, None
    while True:
        handle.cache.sync()
        present = Tidy({e for e in tidy.entries if handle.cache.present(e)})
        if not present:
            break
        ts = handle.cache.frontier
        n = len(present)
        try:
            handle.tidy_at(ts, present)
        except TimestampUnavailable:
            continue  # someone committed at ts first: retry at the new upper
        tidied, tidy_ts = n, ts
        break
    handle.cache.sync()
    return {
        "applied": len(pending),
        "data_shards": len({e.data_id for e in pending}),
        "commit_ts": [min((e.ts for e in pending), default=None), max((e.ts for e in pending), default=None)],
        "tidied": tidied,
        "tidy_ts": tidy_ts,
        "upper": handle.cache.frontier,
    }


def compact_txns(client: PersistClient, txns_id: str, spark: SparkSession | None = None) -> dict[str, Any]:
    """Advance the txns shard's since to its upper - 1, compact it, then compact every registered data shard.

    Data shards are merged in process, or by a Spark job with ``spark``.
    Returns ``{"txns": {"since", "upper", "compactions"}, "data": {data_id:
    {"before", "after" (PersistClient.inspect), "how"}}}``.
    """
    out: dict[str, Any] = {"data": {}}
    with open_handle(client, txns_id) as handle:
        handle.cache.sync()
        upper = handle.cache.frontier
        since = handle.compact_to(upper - 1) if upper > 0 else 0
        handle.writer.shard.fetch()
        out["txns"] = {"since": since, "upper": upper, "compactions": compact_until_done(handle.writer.compact)}
        for d in sorted(handle.cache.registered_now()):
            w = handle.data_writer(d)
            w.shard.fetch()
            before = client.inspect(d)
            if spark is not None:
                import txns.spark as tspark

                res = tspark.compact(spark, client.url, d)
                how = "spark" if res is None or res.applied else "spark; lost a race to another compaction"
            else:
                compact_until_done(w.compact)
                how = "in-process"
            out["data"][d] = {"before": before, "after": client.inspect(d), "how": how}
    return out


def compact_until_done(compact: Callable[[], int], limit: int = 64) -> int:
    """Run a ``WriteHandle.compact`` until the policy asks for nothing more (at most ``limit`` times)."""
    total = 0
    for _ in range(limit):
        n = compact()
        total += n
        if n == 0:
            break
    return total


def collect_garbage(client: PersistClient, txns_id: str, older_than_s: float) -> dict[str, dict[str, Any]]:
    """GC the txns shard and every data shard it knows: retired parts, old versions, leaked parts.

    SUBTLE: the txns shard is read *before* any data shard is listed. A batch
    committed after that read and applied before its data shard is listed is
    referenced by the data shard's state; one committed later still must have
    been written less than ``older_than_s`` ago (the caller's contract), so
    the age threshold keeps it.
    """
    view = read_txns(client, txns_id, with_data=False)
    keep: dict[str, set[str]] = {}
    kept: dict[str, int] = {}
    for e in view.entries:
        keep.setdefault(e.data_id, set()).update(e.parts)
        if not e.applied:
            kept[e.data_id] = kept.get(e.data_id, 0) + len(e.parts)
    result: dict[str, dict[str, Any]] = {}
    shards = [(txns_id, "txns")] + [(d, "data") for d in sorted(set(view.registered) | set(keep))]
    for sid, kind in shards:
        schema = TXNS_SCHEMA if kind == "txns" else client.shard_schema(sid)
        if schema is None:
            continue
        w = client.open_writer(sid, schema)
        w.shard.fetch()
        retired = w.collect_garbage()
        w.shard.fetch()
        versions = w.shard.truncate_old_versions()
        leaked = client.gc_leaked(sid, older_than_s, keep=keep.get(sid, set()))
        result[sid] = {
            "kind": kind,
            "retired": retired,
            "versions": versions,
            "leaked": leaked,
            "kept": kept.get(sid, 0),
        }
    return result


__all__ = [
    "EntryInfo",
    "NoTxnsShard",
    "TxnsView",
    "apply_and_tidy",
    "collect_garbage",
    "compact_txns",
    "compact_until_done",
    "open_handle",
    "read_txns",
    "txns_state",
]
