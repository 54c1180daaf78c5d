"""DataSubscribe: follow one data shard's updates and its logical progress.

It emits the snapshot at ``as_of`` (as one ``Updates`` at ``as_of``), then
updates at later times in time order, with ``Progress(upper)`` events.
Where the txns shard proves a range of time holds no write to the shard,
progress is emitted without reading the data shard at all; where it holds
writes, they are applied if needed and read from the data shard.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator

from persist import ExternalError, PersistClient, Progress, ReadTimeout, ShardId, Updates
from persist.read import Listen
from persist.schema import check_ts
from txns.cache import ListenKind
from txns.handle import TxnsHandle

log = logging.getLogger(__name__)


class DataSubscribe:
    """Iterate updates and progress of ``data_id`` from ``as_of`` (until ``until``, exclusive).

    >>> import pyarrow as pa
    >>> from persist import PersistClient, Schema, ShardId, Progress
    >>> client = PersistClient.open("mem://doc-subscribe")
    >>> txns_id, d = ShardId.new(), str(ShardId.new())
    >>> h = TxnsHandle.open(client, txns_id)
    >>> h.register(0, {d: Schema(key=pa.schema([("k", pa.int64())]), val=pa.schema([]))})
    >>> txn = h.begin(); txn.write(d, (7,), (), 1); _ = txn.commit_at(h, 2)
    >>> h.begin().commit_at(h, 5)  # a commit elsewhere: time passes for d too
    TxnApply(commit_ts=5, data_ids=())
    >>> sub = DataSubscribe(client, txns_id, d, as_of=0, until=6)
    >>> for e in sub:
    ...     print(e)
    Updates(updates=[])
    Progress(upper=1)
    Updates(updates=[(((7,), ()), 2, 1)])
    Progress(upper=3)
    Progress(upper=6)
    """

    def __init__(
        self,
        client: PersistClient,
        txns_id: ShardId | str,
        data_id: ShardId | str,
        as_of: int,
        until: int | None = None,
        handle: TxnsHandle | None = None,
    ) -> None:
        check_ts(as_of, "as_of")
        if until is not None and until <= as_of:
            from persist import InvalidUsage

            raise InvalidUsage(f"until {until} must be greater than as_of {as_of}")
        self._own_handle = handle is None
        self.handle = handle or TxnsHandle.open(client, txns_id)
        self.data_id = str(ShardId.parse(str(data_id)))
        self.as_of, self.until = as_of, until
        self.reader = client.open_leased_reader(self.data_id, self.handle.data_schema(self.data_id))
        self.frontier: int | None = None  # None until the snapshot is emitted
        self._listen: Listen | None = None

    def _done(self) -> bool:
        return self.until is not None and self.frontier is not None and self.frontier >= self.until

    def step(self, wait_s: float = 0.0) -> list[Updates | Progress]:
        """The events available now (waiting up to ``wait_s`` for the txns shard to advance).

        A storage failure that outlasts persist's retries raises (``Determinate`` or
        ``Indeterminate``); the subscription stays where it was, and the next step goes on from there.
        """
        h, cache = self.handle, self.handle.cache
        if self._done():
            return []
        if self.frontier is None:
            snap = h.snapshot(self.data_id, self.as_of)
            self.frontier = self.as_of + 1
            return [Updates(snap), Progress(self.frontier)]
        nxt = cache.data_listen_next(self.data_id, self.frontier)
        if nxt.kind is ListenKind.WAIT:
            try:
                cache.update_gt(self.frontier, wait_s=wait_s)
            except ReadTimeout:  # nothing new yet (a storage failure is the caller's to hear)
                return []
            nxt = cache.data_listen_next(self.data_id, self.frontier)
            if nxt.kind is ListenKind.WAIT:
                return []
        target = nxt.upper if self.until is None else min(nxt.upper, self.until)
        if nxt.kind is ListenKind.EMIT_PROGRESS:
            self.frontier = target
            self._hold()
            return [Progress(target)]
        h.unblock_read(self.data_id, target - 1)
        if self._listen is None or self._listen.frontier != self.frontier:
            self._listen = Listen(self.reader, self.frontier - 1)
        events: list[Updates | Progress] = []
        while self._listen.frontier < target:
            for ev in self._listen.next(timeout_s=self.reader.config.read_wait_s):
                if isinstance(ev, Updates):
                    ups = [u for u in ev.updates if self.until is None or u[1] < self.until]
                    if ups:
                        events.append(Updates(ups))
                else:
                    up = ev.upper if self.until is None else min(ev.upper, self.until)
                    events.append(Progress(up))
        self.frontier = self._listen.frontier if self.until is None else min(self._listen.frontier, self.until)
        self._hold()
        return events

    def _hold(self) -> None:
        """Let the data shard compact up to what has been emitted (the reader's lease heartbeats too)."""
        assert self.frontier is not None
        if self.frontier - 1 > self.reader.since and self.reader.heartbeat_due():
            # SUBTLE: best effort. step() calls this after moving the frontier
            # past the events it is about to return; raising here dropped
            # them (the caller never saw them, and the next step starts
            # past them). A failed renewal is retried on the next step.
            try:
                self.reader.downgrade_since(self.frontier - 1)
            except ExternalError as e:
                log.debug("subscribe hold on %s deferred: %s", self.data_id, e)

    def __iter__(self) -> Iterator[Updates | Progress]:
        while not self._done():
            yield from self.step(wait_s=self.reader.config.read_wait_s)

    def close(self) -> None:
        self.reader.expire()
        if self._own_handle:
            # The handle opened for this subscription holds the txns shard's
            # since with its cache's leased reader: release it too, or every
            # closed subscription held back compaction of the txns shard for a
            # whole reader lease.
            self.handle.close()
