"""The root record: the one object that makes a location a database.

It lives in the location's consensus under the well-known key ``ROOT_KEY``.
Version 1 is written once, with a create-if-absent compare-and-set
(``compare_and_set(ROOT_KEY, None, ...)``), and names the database's txns
shard and its system tables. Racing creators each propose fresh ids; exactly
one version 1 lands and every creator then reads and uses it, so they all
agree. Later versions only change settings (the default history retention),
each with a compare-and-set on the version it read; the ids never change.

Format: persist's framing (magic, kind ``KIND_ROOT``, format version, CRC-32C)
around JSON::

    {"format": 1, "txns_id": "s…", "catalog_id": "s…", "created_ms": int, "retention_ms": int}

(History needs no id here: it is the txns shard's commits shard, whose id is
derived from the txns shard's, see :mod:`txns.commits`.)

Invariants:

- Version 1 of ``ROOT_KEY`` never changes once written; every version keeps
  its ids. Nothing truncates this key.
- A location without ``ROOT_KEY`` has no database (``connect(create=False)``
  refuses it; no operator command creates one).
- A root record is created only where no database's shards are (a
  location where ``leftovers`` finds none, or only crashed creators'
  proposals: :func:`txns.db.recover.find_databases` finds no txns shard
  with a catalog), or is taken from a racing creator (it appears while
  waiting). A location holding a database but no root record (a deleted
  root record) is refused, never covered by a new empty database:
  ``recover_root`` writes the root record again from its shards.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, replace
from typing import Any

from persist import (
    Attempts,
    Determinate,
    ExternalError,
    Indeterminate,
    InvalidUsage,
    PersistClient,
    ShardId,
    backoff,
    frame,
    retry_storage,
    retry_until,
    unframe,
)
from persist.location import CaSResult

ROOT_KEY = "txns-db-root"
KIND_ROOT = 101
ROOT_FORMAT = 1
DEFAULT_RETENTION_MS = 7 * 24 * 3600 * 1000


@dataclass(frozen=True)
class RootRecord:
    """What the root record says (see the module doc). ``seqno`` is the version it was read at."""

    txns_id: str
    catalog_id: str
    created_ms: int
    retention_ms: int
    seqno: int = 0

    def encode(self) -> bytes:
        j = {"format": ROOT_FORMAT, **asdict(self)}
        j.pop("seqno")
        return frame(KIND_ROOT, json.dumps(j, sort_keys=True).encode())

    @staticmethod
    def decode(data: bytes, seqno: int) -> RootRecord:
        j = json.loads(unframe(f"consensus {ROOT_KEY} seqno {seqno}", data, KIND_ROOT))
        if j.get("format", 0) > ROOT_FORMAT:
            raise InvalidUsage(
                f"this database's root record has format {j['format']}, newer than this library's "
                f"{ROOT_FORMAT}: upgrade txns"
            )
        return RootRecord(
            txns_id=j["txns_id"],
            catalog_id=j["catalog_id"],
            created_ms=j["created_ms"],
            retention_ms=j["retention_ms"],
            seqno=seqno,
        )


def read_root(client: PersistClient) -> RootRecord | None:
    """The root record at ``client``'s location, or None if there is no database there."""
    head = retry_storage(lambda: client.consensus.head(ROOT_KEY), client.config.retry_deadline_s)
    return None if head is None else RootRecord.decode(head.data, head.seqno)


LEFTOVER_WAIT_S = 5.0
"""How long a creator that finds shards but no root record waits for a racing creator's root to land."""


LEFTOVERS_SHOWN = 5
"""How many of the shards found at a location without a root record ``leftovers`` returns (for messages)."""


def leftovers(client: PersistClient, limit: int = LEFTOVERS_SHOWN) -> list[str]:
    """Up to ``limit`` consensus keys other than the root record (shards) at ``client``'s location.

    Consensus keys where the backend lists them (file, S3, mem: one LIST on a
    new location), else blob keys. Empty: nothing of a database is there.
    """
    found: list[str] = []
    if client.consensus.lists_keys:
        keys = retry_storage(lambda: list(client.consensus.list_keys()), client.config.retry_deadline_s)
        found = [k for k in keys if k != ROOT_KEY]
    else:
        found = retry_storage(
            lambda: [k for _, k in zip(range(limit), client.blob.list_keys(""), strict=False)],
            client.config.retry_deadline_s,
        )
    return sorted(found)[:limit]


def root_or_leftovers(client: PersistClient) -> RootRecord | list[str]:
    """For a creator that found no root record: the root, if a racing creator writes one; else the shards there.

    An empty list: the location is empty, create the database. Shards but
    no root: a racing creator's proposal (its root lands within moments:
    waited for, up to ``LEFTOVER_WAIT_S``), a crashed creator's, or a
    database whose root record was deleted (returned: the caller tells
    the last two apart and refuses the database, never overwrites it).
    """
    found = leftovers(client)
    if not found:
        return found
    deadline = time.monotonic() + min(LEFTOVER_WAIT_S, client.config.retry_deadline_s)
    attempt = 0
    while True:
        root = read_root(client)
        if root is not None:
            return root
        if time.monotonic() > deadline:
            return found
        attempt += 1
        backoff(attempt)


def create_root(client: PersistClient, proposal: RootRecord) -> RootRecord:
    """Write ``proposal`` as version 1 unless a root exists; return the root that won.

    Storage failures, and an uncertain write found not to have landed, are
    tried again until the client's retry deadline (:func:`persist.retry_until`).
    """
    data = proposal.encode()

    def attempt(_: Attempts) -> RootRecord:
        try:
            res = client.consensus.compare_and_set(ROOT_KEY, None, data)
        except Indeterminate:
            # It may have landed: whatever is there now is the answer.
            res = CaSResult.MISMATCH
        if res is CaSResult.COMMITTED:
            return replace(proposal, seqno=1)
        root = read_root(client)
        if root is None:  # an indeterminate write that did not land: try again
            raise Indeterminate(f"could not create the database root record at {ROOT_KEY}")
        return root

    return retry_until(attempt, retry_on=ExternalError, deadline_s=client.config.retry_deadline_s)


def update_root(client: PersistClient, change: dict[str, Any]) -> RootRecord:
    """Change settings (``retention_ms``) in a new version of the root record; return it.

    A lost race or an uncertain write reads the record again and writes
    again if the change is not there yet; storage failures are tried again
    too, all until the client's retry deadline (:func:`persist.retry_until`).
    """

    def attempt(_: Attempts) -> RootRecord:
        root = read_root(client)
        if root is None:
            raise InvalidUsage("there is no database here to change")
        new = replace(root, **change)
        if new == root:
            return root  # (also: an earlier uncertain write of ours landed)
        res = client.consensus.compare_and_set(ROOT_KEY, root.seqno, new.encode())
        if res is CaSResult.COMMITTED:
            return replace(new, seqno=root.seqno + 1)
        raise Determinate(f"another writer changed the root record {ROOT_KEY} first: read it again")

    return retry_until(attempt, retry_on=ExternalError, deadline_s=client.config.retry_deadline_s)


def new_proposal(now_ms: int) -> RootRecord:
    """A fresh root record with new ids."""
    return RootRecord(
        txns_id=str(ShardId.new()),
        catalog_id=str(ShardId.new()),
        created_ms=now_ms,
        retention_ms=DEFAULT_RETENTION_MS,
    )


__all__ = ["DEFAULT_RETENTION_MS", "ROOT_KEY", "RootRecord", "create_root", "new_proposal", "read_root", "update_root"]
