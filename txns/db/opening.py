"""Opening a database: ``txns.connect(url)`` finds (or creates) the root record and opens the txns shard.

:func:`open_location` (for ``connect``) reads (or creates) the root record (:mod:`txns.db.root`) and
opens the txns shard it names (one conditional write: the handle's lease;
for a new database also the shard's schema, critical since and an upper at
the clock). Creating a database overlaps the root record's write with
opening the proposed txns shard and recording the system shards' schemas:
a creator whose root loses the race leaves those unused. The catalog shard
is registered by the first commit that writes it (the first DDL), in that
commit's own write.

Invariants:

- ``connect(create=False)`` creates nothing, not even a directory.
- A new database is never created over shards without a root record that
  hold a database (a deleted root record: :func:`txns.db.recover_root`).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import unquote

from persist import InvalidUsage, PersistClient, PersistConfig
from persist.url import redact
from txns.commits import COMMITS_SCHEMA, commits_shard_id
from txns.db import clock
from txns.db.catalog import CATALOG_SCHEMA
from txns.db.errors import DatabaseNotFound
from txns.db.pool import in_pool, pool
from txns.db.recover import find_databases
from txns.db.retention import check_retention
from txns.db.root import (
    LEFTOVERS_SHOWN,
    ROOT_KEY,
    RootRecord,
    create_root,
    new_proposal,
    read_root,
    root_or_leftovers,
)
from txns.db.skew import StorageClock, check_max_skew
from txns.handle import TxnsHandle

log = logging.getLogger(__name__)


def _quietly(fn: Callable[..., Any], *args: Any) -> None:
    try:
        fn(*args)
    except Exception as e:  # noqa: BLE001 - an optimization only; the caller's later steps do it again
        log.debug("%s%r deferred: %s", getattr(fn, "__name__", fn), args, e)


def _missing_file_dir(url: str) -> str | None:
    """For a ``file://`` URL whose directory does not exist, that directory (opening would create it)."""
    scheme, sep, rest = url.partition("://")
    if not sep or scheme.lower() != "file" or "?" in rest or "#" in rest:
        return None
    path = unquote(rest)
    if path.startswith("localhost/"):
        path = path[len("localhost") :]
    if path.startswith("/") and not (Path(path) / "consensus").is_dir():
        return path  # (a file store keeps every consensus key under PATH/consensus: no database here)
    return None


@dataclasses.dataclass(frozen=True)
class Opened:
    """What :func:`open_location` found or made: the client, the root record, the txns handle if it opened one."""

    client: PersistClient
    root: RootRecord
    handle: TxnsHandle | None
    storage_clock: StorageClock


def open_location(
    url: str,
    *,
    create: bool,
    retention: dt.timedelta | None,
    config: PersistConfig | None,
    max_clock_skew: dt.timedelta | None,
) -> Opened:
    """Find the database at ``url``, or create it (``create``); the arguments as :func:`txns.connect` takes them."""
    if not isinstance(url, str):
        raise InvalidUsage(f"connect takes a URL string, got {type(url).__name__}")
    retention_ms = None if retention is None else check_retention(retention)
    max_skew_ms = check_max_skew(max_clock_skew)
    how = f"create one with txns.connect({redact(url)!r}) or `txns init {redact(url)}`"
    if not create and _missing_file_dir(url) is not None:
        raise DatabaseNotFound(f"no database at {redact(url)!r}; {how}")
    client = PersistClient.open(url, config)
    skew = StorageClock(client.blob, client.config.clock_ms, max_skew_ms, redact(url))
    root = read_root(client)
    handle = None
    if root is None and create:
        found = root_or_leftovers(client)  # (one LIST on an empty location)
        if isinstance(found, RootRecord):
            root = found  # a racing creator's
        elif found and find_databases(client):  # (else only crashed creators' proposals: unused, as before)
            shards = ", ".join(found) + (", ..." if len(found) >= LEFTOVERS_SHOWN else "")
            raise DatabaseNotFound(
                f"the location {redact(url)!r} holds shards ({shards}) "
                f"but no database root record ({ROOT_KEY!r}): a database whose root record was deleted? A new "
                f"database is never created over it. Recover it with txns.db.recover_root({redact(url)!r}) "
                f'(README: "Clocks, and a deleted root record"), or use an empty location'
            )
    if root is None:
        if not create:
            raise DatabaseNotFound(f"no database at {redact(url)!r}; {how}")
        skew.check("create a database")  # (its first upper is at this client's clock)
        proposal = new_proposal(client.config.clock_ms())
        if retention_ms is not None:
            proposal = RootRecord(proposal.txns_id, proposal.catalog_id, proposal.created_ms, retention_ms)
        for d in (proposal.txns_id, proposal.catalog_id, commits_shard_id(proposal.txns_id)):
            client.assume_new(d)  # (fresh ids nothing names yet: their first writes read nothing first)
        opened = _open_proposed(client, proposal)
        root = create_root(client, proposal)
        handle = opened(root)
    return Opened(client, root, handle, skew)


def _open_proposed(client: PersistClient, proposal: RootRecord) -> Callable[[RootRecord], TxnsHandle | None]:
    """Start opening a proposed database's txns shard and recording its system shards' schemas.

    Runs while the root record is written, so a new database costs one
    conditional write in sequence, not three. Returns a function of the
    root that won: the opened handle if it is ours, else None (a racing
    creator's root won, or the speculative open failed: the database then
    opens the txns shard itself). The losers' shards stay unused and empty.
    """
    if in_pool():
        return lambda root: None
    # (upper just past now: the latest time, upper - 1, is then not before the root's creation)
    init_ts = clock.ts_of_ms(client.config.clock_ms()) + 1
    opening = pool().submit(TxnsHandle.open, client, proposal.txns_id, init_ts)
    system = ((proposal.catalog_id, CATALOG_SCHEMA), (commits_shard_id(proposal.txns_id), COMMITS_SCHEMA))
    schemas = [pool().submit(_quietly, client.register_schema, d, schema) for d, schema in system]

    def opened(root: RootRecord) -> TxnsHandle | None:
        for f in schemas:
            f.result()
        if root.txns_id != proposal.txns_id:
            opening.exception()  # (waited for: nothing of this call writes after connect returns)
            return None
        try:
            return opening.result()
        except Exception as e:  # noqa: BLE001 - the database opens it again and meets any failure itself
            log.debug("opening the new txns shard %s deferred: %s", proposal.txns_id, e)
            return None

    return opened


__all__ = ["Opened", "open_location"]
