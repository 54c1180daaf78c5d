"""Recovering a database whose root record was deleted: write the root record again from the shards there.

``txns.connect`` never creates a database over a location that holds shards
but no root record (:func:`txns.db.root.root_or_leftovers`): it raises
``DatabaseNotFound`` pointing here. The root record names two shards, the
txns shard and the catalog shard, and both are still there:

- the txns shard is the shard whose schema is ``TXNS_SCHEMA``;
- the catalog shard is the shard with ``CATALOG_SCHEMA`` that the txns
  shard registers (a database registers its catalog with its first DDL).

:func:`recover_root` finds them (reading every shard's state: one LIST and a
head read per shard), and writes root version 1 again with a
create-if-absent compare-and-set, so it never replaces a root record that
exists. It refuses, changing nothing, when the location does not
identify exactly one database: no txns shard with a registered catalog (a
database with no tables lost nothing: use another location or empty this
one), or several. History: the recovered root's creation time is the txns
shard's since (no earlier time is readable anyway); its retention is the
given one (default 7 days; set it again if it was another).
"""

from __future__ import annotations

import datetime as dt

from persist import InvalidUsage, PersistClient, PersistConfig
from persist.url import redact
from txns.db import clock
from txns.db.catalog import CATALOG_SCHEMA
from txns.db.retention import check_retention
from txns.db.root import DEFAULT_RETENTION_MS, ROOT_KEY, RootRecord, create_root, read_root
from txns.entries import TXNS_SCHEMA
from txns.handle import TxnsHandle


def find_databases(client: PersistClient) -> list[tuple[str, str, int]]:
    """The databases whose shards are at ``client``'s location, root record or not: (txns id, catalog id, since).

    A txns shard counts when it registers exactly one catalog shard (its
    database had DDL); a crashed creator's proposal (a txns shard that
    registers nothing) does not. Reads every shard's state (one LIST and
    a head read per shard). ``InvalidUsage`` if the store cannot list its
    consensus keys.
    """
    if not client.consensus.lists_keys:
        raise InvalidUsage(f"the store at {redact(client.url)!r} cannot list its consensus keys")
    txns_text, catalog_text = TXNS_SCHEMA.to_text(), CATALOG_SCHEMA.to_text()
    found: list[tuple[str, str, int]] = []
    for key in sorted(client.consensus.list_keys()):
        if key == ROOT_KEY:
            continue
        state = client.shard(key).fetch()
        if state.schema != txns_text:
            continue
        handle = TxnsHandle.open(client, key, hold=False)  # (holds nothing: reads the registrations)
        try:
            registered = set(handle.cache.registered_now())
        finally:
            handle.close()
        catalogs = [d for d in sorted(registered) if client.shard(d).fetch().schema == catalog_text]
        if len(catalogs) == 1:
            found.append((key, catalogs[0], state.since))
    return found


def recover_root(url: str, *, retention: dt.timedelta | None = None, config: PersistConfig | None = None) -> RootRecord:
    """Write the root record of the database at ``url`` again, from its txns and catalog shards; return it.

    ``InvalidUsage`` (nothing written) if there is a root record already, or
    if the shards there do not identify exactly one database.
    """
    retention_ms = DEFAULT_RETENTION_MS if retention is None else check_retention(retention)
    client = PersistClient.open(url, config)
    where = redact(url)
    if read_root(client) is not None:
        raise InvalidUsage(f"the location {where!r} has a root record: nothing to recover; txns.connect it")
    found = find_databases(client)
    if len(found) != 1:
        what = "no txns shard with a catalog" if not found else f"{len(found)} txns shards with a catalog"
        raise InvalidUsage(
            f"cannot recover the root record at {where!r}: found {what} "
            f"({', '.join(t for t, _, _ in found) or 'none'}); nothing was written"
        )
    txns_id, catalog_id, since = found[0]
    proposal = RootRecord(txns_id, catalog_id, clock.wall_ms(since), retention_ms)
    root = create_root(client, proposal)
    if (root.txns_id, root.catalog_id) != (txns_id, catalog_id):
        raise InvalidUsage(f"another process wrote a different root record at {where!r} meanwhile: {root}")
    return root


__all__ = ["find_databases", "recover_root"]
