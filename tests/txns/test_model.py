"""txns against a model: a Hypothesis state machine over several handles on one store, with and without faults.

Several ``TxnsHandle``s, each on its own ``PersistClient`` over one shared
in-memory store, register and forget data shards, commit (at good and at
closed times), apply (the committer, another handle, or a reader), tidy on
later commits, compact the txns shard, get dropped mid-way and replaced, and
subscribe. Every read of every registered shard, at any time in
``[registration, upper)``, must equal the model of what was committed; the
txns shard must never hold an entry with a multiplicity other than +1.

The same machine runs over persist's fault-injecting blob and consensus
(``persist.unreliable``) with retries of storage operations turned off, so
faults reach the txns layer; every operation is retried until it gets
through (a retried commit is the same txn at the same time on the same
handle, and must not commit twice).

Profiles (env ``HYPOTHESIS_PROFILE``): ``ci`` (default, fast) and ``slow``.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeVar

import pytest
from hypothesis import HealthCheck, Phase, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from persist import Determinate, Indeterminate, PersistConfig, Progress, ReadHandle, Updates
from persist.unreliable import Fault, Faults, Op
from tests.txns.model import (
    SCHEMA,
    Row,
    Store,
    TxnsModel,
    consolidated,
    direct_snapshot,
    new_id,
    retrying,
    row,
    txns_shard_contents,
)
from txns import DataSubscribe, NotRegistered, Tidy, TimestampUnavailable, Txn, TxnsHandle

_COMMON = {
    "deadline": None,
    "suppress_health_check": [HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much],
    "print_blob": True,
}
settings.register_profile("ci", max_examples=100, stateful_step_count=40, **_COMMON)  # type: ignore[arg-type]
settings.register_profile("slow", max_examples=300, stateful_step_count=60, **_COMMON)  # type: ignore[arg-type]
# "dev": like ci, without shrinking (a failure is reported as found, at once)
settings.register_profile(
    "dev", max_examples=100, stateful_step_count=40, phases=[Phase.explicit, Phase.reuse, Phase.generate], **_COMMON  # type: ignore[arg-type]
)
PROFILE = settings.get_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

T = TypeVar("T")
N_SHARDS = 5  # the last one is never registered


@dataclass
class HandleState:
    h: TxnsHandle
    tidy: Tidy = field(default_factory=Tidy)


@dataclass
class SubState:
    sub: DataSubscribe
    d: str
    as_of: int
    until: int | None
    acc: dict[Row, int] | None = None  # None until the snapshot arrived
    frontier: int | None = None


class TxnsMachine(RuleBasedStateMachine):
    """The state machine; ``FAULTS`` switches fault injection on."""

    FAULTS = False

    def __init__(self) -> None:
        super().__init__()
        if self.FAULTS:
            self.faults: Faults | None = Faults(seed=0)
            config = PersistConfig(retry_deadline_s=0.0, read_wait_s=2.0)
        else:
            self.faults = None
            config = PersistConfig(read_wait_s=2.0)
        self.store = Store(faults=self.faults, config=config)
        self.txns_id = new_id()
        self.ds = [new_id() for _ in range(N_SHARDS)]
        self.model = TxnsModel()
        self.critical_since = 0  # the txns shard's critical since, as compact_to last returned it
        self.handles: list[HandleState] = []
        self.subs: list[SubState] = []
        # shards with a schema: register records it first, even if it then fails
        self.has_schema: set[str] = set()
        self.dead_readers: list[ReadHandle] = []  # leases of crashed handles

    # ---- plumbing -----------------------------------------------------------------

    def retry(self, fn: Callable[[], T], between: Callable[[], object] | None = None) -> T:
        return retrying(fn, self.faults, between=between)

    def quiet(self, fn: Callable[[], T]) -> T:
        """Run ``fn`` with random faults off (for the test's own checks)."""
        if self.faults is None:
            return fn()
        with self.faults.disabled():
            return fn()

    def new_handle(self) -> HandleState:
        client = self.store.client()
        return HandleState(self.retry(lambda: TxnsHandle.open(client, self.txns_id)))

    def pick(self, data: st.DataObject) -> HandleState:
        return data.draw(st.sampled_from(self.handles), label="handle")

    def fresh_upper(self, shard: str) -> int:
        return self.quiet(lambda: self.store.client().shard(shard).fetch().upper)

    def registered(self) -> list[str]:
        return [d for d in self.ds if self.model.registered_now(d)]

    def draw_ts(self, data: st.DataObject, low: bool) -> int:
        if low and self.model.upper > 0:
            return data.draw(st.integers(0, self.model.upper - 1), label="low ts")
        return self.model.upper + data.draw(st.sampled_from([0, 0, 1, 3]), label="ts offset")

    def assert_nothing_committed(self, upper_before: int) -> None:
        assert self.fresh_upper(self.txns_id) == upper_before == self.model.upper

    def check_applied_below(self, ts: int, inclusive: bool) -> None:
        """Every committed write below (or at) ``ts`` is physically in its data shard."""
        for d, writes in self.model.writes.items():
            times = [t for t, _, _ in writes if t < ts or (inclusive and t == ts)]
            if times:
                assert self.fresh_upper(d) > max(times), f"write at {max(times)} to {d} not applied"

    # ---- rules --------------------------------------------------------------------

    @initialize(n=st.integers(2, 3), n_regs=st.integers(0, 3))
    def open_handles(self, n: int, n_regs: int) -> None:
        self.handles = [self.new_handle() for _ in range(n)]
        # most runs start with some shards registered, so that commits have somewhere to go
        if n_regs:
            ds = self.ds[:n_regs]
            self.retry(lambda: self.handles[0].h.register(0, dict.fromkeys(ds, SCHEMA)))
            self.model.register(0, ds)
            self.has_schema |= set(ds)

    @rule(data=st.data())
    def register(self, data: st.DataObject) -> None:
        hs = self.pick(data)
        ds = data.draw(st.sets(st.sampled_from(self.ds[:-1]), min_size=1, max_size=3), label="shards")
        new = [d for d in ds if not self.model.registered_now(d)]
        ts = self.draw_ts(data, low=data.draw(st.booleans(), label="low"))
        before = self.model.upper
        self.has_schema |= ds
        if new and ts < self.model.upper:
            with pytest.raises(TimestampUnavailable) as e:
                self.retry(lambda: hs.h.register(ts, dict.fromkeys(ds, SCHEMA)))
            assert e.value.upper == self.model.upper
            self.assert_nothing_committed(before)
            event("register: closed time")
            return
        self.retry(lambda: hs.h.register(ts, dict.fromkeys(ds, SCHEMA)))
        event("register: ok" if new else "register: idempotent")
        self.model.register(ts, ds)
        if not new:
            self.assert_nothing_committed(before)

    @rule(data=st.data())
    def forget(self, data: st.DataObject) -> None:
        hs = self.pick(data)
        ds = data.draw(st.sets(st.sampled_from(self.ds[:-1]), min_size=1, max_size=2), label="shards")
        todo = [d for d in ds if self.model.registered_now(d)]
        ts = self.draw_ts(data, low=data.draw(st.booleans(), label="low"))
        before = self.model.upper
        if todo and ts < self.model.upper:
            with pytest.raises(TimestampUnavailable) as e:
                self.retry(lambda: hs.h.forget(ts, ds))
            assert e.value.upper == self.model.upper
            self.assert_nothing_committed(before)
            event("forget: closed time")
            return
        self.retry(lambda: hs.h.forget(ts, ds))
        event("forget: ok" if todo else "forget: idempotent")
        self.model.forget(ts, ds)
        for d in ds:
            regs = self.model.regs.get(d)
            if regs:
                # every write was applied first; the physical upper is just past the forget
                f = regs[-1].forget_ts
                assert f is not None
                assert self.fresh_upper(d) == f + 1
                # and the data shard, read directly (no txns), holds every committed write
                got = self.quiet(lambda: direct_snapshot(self.store.client(), d, f))  # noqa: B023 - called at once
                assert consolidated(got, f) == self.model.contents(d, f), (d, f)
        for s in [s for s in self.subs if s.d in todo]:
            self.close_sub(s)
        if not todo:
            self.assert_nothing_committed(before)

    @rule(data=st.data())
    def commit(self, data: st.DataObject) -> None:
        """A commit to registered shards (mostly good; sometimes at a closed time)."""
        regs = self.registered()
        shards = data.draw(st.lists(st.sampled_from(regs), max_size=3, unique=True), label="shards") if regs else []
        self.do_commit(data, shards)

    @rule(data=st.data())
    def commit_more(self, data: st.DataObject) -> None:
        """The same as ``commit``: commits are what matters most, so draw them twice as often."""
        self.commit(data)

    @rule(data=st.data())
    def commit_refused(self, data: st.DataObject) -> None:
        """A commit writing to a shard that is not registered (never, or forgotten): refused, nothing committed."""
        unregs = [d for d in self.ds if not self.model.registered_now(d)]
        if not unregs:
            return
        bad = data.draw(st.sampled_from(unregs), label="unregistered shard")
        others = data.draw(st.lists(st.sampled_from(self.registered() or [bad]), max_size=2, unique=True))
        self.do_commit(data, [bad] + [d for d in others if d != bad])

    def do_commit(self, data: st.DataObject, shards: list[str]) -> None:
        hs = self.pick(data)
        writes: dict[str, list[tuple[Row, int]]] = {}
        for d in shards:
            writes[d] = [
                (
                    row(data.draw(st.integers(0, 4)), data.draw(st.sampled_from("abc"))),
                    data.draw(st.sampled_from([1, -1, 2])),
                )
                for _ in range(data.draw(st.integers(1, 3), label="rows"))
            ]
        low = data.draw(st.integers(0, 4), label="low") == 0
        ts = self.draw_ts(data, low=low)
        with_tidy = data.draw(st.booleans(), label="with tidy")
        before = self.model.upper

        txn = hs.h.begin()
        for d, ups in writes.items():
            for (k, v), diff in ups:
                if d not in self.has_schema:
                    # never registered: it has no schema, so the write itself is refused
                    with pytest.raises(NotRegistered, match="has no schema"):
                        self.retry(lambda: txn.write(d, k, v, diff))  # noqa: B023 - called at once
                    self.assert_nothing_committed(before)
                    event("commit: refused at write (never registered)")
                    return
                self.retry(lambda: txn.write(d, k, v, diff))  # noqa: B023 - called at once
        if with_tidy:
            txn.tidy(hs.tidy)

        if ts < self.model.upper:
            with pytest.raises(TimestampUnavailable) as e:
                self.retry(lambda: txn.commit_at(hs.h, ts))
            assert e.value.upper == self.model.upper
            self.assert_nothing_committed(before)
            event("commit: closed time")
            if not data.draw(st.booleans(), label="retry higher"):
                return
            ts = e.value.upper  # the txn stays valid: commit it again, higher
        if not all(self.model.registered_at(d, ts) for d in writes):
            with pytest.raises(NotRegistered, match="not registered at"):
                self.retry(lambda: txn.commit_at(hs.h, ts))
            self.assert_nothing_committed(before)
            event("commit: refused (forgotten)")
            return
        # between attempts, the handle may well re-read the txns shard (anything
        # does): the retry must still recognise an earlier attempt that landed
        reread = hs.h.read_cache().sync if data.draw(st.booleans(), label="reread between retries") else None
        res = self.retry(lambda: txn.commit_at(hs.h, ts), between=reread)
        assert res.commit_ts == ts
        self.model.commit(ts, writes)
        assert self.fresh_upper(self.txns_id) == ts + 1
        event(f"commit: ok, {len(writes)} shards")
        if with_tidy:
            hs.tidy = Tidy()
        how = data.draw(st.sampled_from(["none", "committer", "other"]), label="apply")
        if how != "none":
            applier = hs if how == "committer" else self.pick(data)
            applier.tidy.merge(self.retry(lambda: res.apply(applier.h)))
            self.check_applied_below(ts, inclusive=True)

    @rule(data=st.data())
    def apply(self, data: st.DataObject) -> None:
        hs = self.pick(data)
        if self.model.upper == 0:
            return
        ts = data.draw(st.integers(0, self.model.upper - 1), label="apply_le ts")
        hs.tidy.merge(self.retry(lambda: hs.h.apply_le(ts)))
        self.check_applied_below(ts, inclusive=True)

    @rule(data=st.data())
    def tidy(self, data: st.DataObject) -> None:
        hs = self.pick(data)
        ts = self.draw_ts(data, low=False)
        txn = hs.h.begin()
        txn.tidy(hs.tidy)
        self.retry(lambda: txn.commit_at(hs.h, ts))
        self.model.commit(ts, {})
        hs.tidy = Tidy()

    @rule(data=st.data())
    def compact(self, data: st.DataObject) -> None:
        if data.draw(st.booleans(), label="all handles"):
            targets = [hs.h for hs in self.handles] + [s.sub.handle for s in self.subs]
        else:
            targets = [self.pick(data).h]
        since = data.draw(st.integers(0, self.model.upper + 3), label="since")
        for h in targets:
            got = self.retry(lambda: h.compact_to(since))  # noqa: B023 - called at once
            event(f"compact: since {'<' if got < since else '>='} asked")
            # never past an unapplied write
            self.check_applied_below(got, inclusive=False)
            # monotone (every handle shares the one critical hold), and never past what was asked
            # unless it was already there
            assert got >= self.critical_since, f"critical since went back from {self.critical_since} to {got}"
            assert got <= max(since, self.critical_since), f"since {got} past the asked {since}"
            self.critical_since = got

    @precondition(lambda self: len(self.dead_readers) > 0)
    @rule()
    def dead_leases_lapse(self) -> None:
        """Time passes: the leases of crashed handles lapse (as their reader_lease_s would)."""
        for r in self.dead_readers:
            self.retry(r.expire)
        self.dead_readers = []

    @rule(data=st.data())
    def drop_handle(self, data: st.DataObject) -> None:
        idx = data.draw(st.integers(0, len(self.handles) - 1), label="dropped")
        hs = self.handles[idx]
        mode = data.draw(st.sampled_from(["plain", "after_commit", "after_partial_apply"]), label="mode")
        regs = self.registered()
        if mode != "plain" and regs:
            d = data.draw(st.sampled_from(regs), label="shard")
            first = self.model.upper
            for ts in (first, first + 1):
                txn = hs.h.begin()
                self.retry(lambda: txn.write(d, (ts,), ("dropped",), 1))  # noqa: B023 - called at once
                self.retry(lambda: txn.commit_at(hs.h, ts))  # noqa: B023 - called at once
                self.model.commit(ts, {d: [(row(ts, "dropped"), 1)]})
            if mode == "after_partial_apply":
                self.retry(lambda: hs.h.apply_le(first))
        if data.draw(st.booleans(), label="clean close"):
            self.retry(lambda: hs.h.read_cache().reader.expire())
        else:  # a crash: its lease holds the txns shard's since until it lapses
            self.dead_readers.append(hs.h.read_cache().reader)
        self.handles[idx] = self.new_handle()
        event(f"drop handle: {mode}")

    @rule(data=st.data())
    def read(self, data: st.DataObject) -> None:
        fresh = data.draw(st.integers(0, 3), label="fresh handle") == 0
        hs = self.new_handle() if fresh else self.pick(data)
        for d in self.registered():
            reg = self.model.current_registration(d)
            assert reg is not None
            if reg.register_ts >= self.model.upper:
                continue
            as_of = data.draw(st.integers(reg.register_ts, self.model.upper - 1), label="as_of")
            if data.draw(st.booleans(), label="via read_cache"):
                got = self.retry(lambda: hs.h.read_cache().data_snapshot(d, as_of).snapshot_and_fetch())  # noqa: B023 - called at once
            else:
                got = self.retry(lambda: hs.h.snapshot(d, as_of))  # noqa: B023 - called at once
            assert consolidated(got, as_of) == self.model.contents(d, as_of), (d, as_of)
            event("read: checked")
        if fresh:  # done with it: release its hold on the txns shard
            self.retry(lambda: hs.h.read_cache().reader.expire())

    @precondition(lambda self: len(self.subs) < 3)
    @rule(data=st.data())
    def subscribe(self, data: st.DataObject) -> None:
        regs = [d for d in self.registered() if self.model.regs[d][-1].register_ts < self.model.upper]
        if not regs:
            return
        d = data.draw(st.sampled_from(regs), label="shard")
        reg = self.model.current_registration(d)
        assert reg is not None
        as_of = data.draw(st.integers(reg.register_ts, self.model.upper - 1), label="as_of")
        until = data.draw(st.one_of(st.none(), st.integers(as_of + 1, self.model.upper + 3)), label="until")
        shared = self.pick(data).h if data.draw(st.booleans(), label="shared handle") else None
        client = shared.client if shared is not None else self.store.client()
        sub = self.retry(lambda: DataSubscribe(client, self.txns_id, d, as_of=as_of, until=until, handle=shared))
        s = SubState(sub, d, as_of, until)
        self.subs.append(s)
        self.step_sub(s)

    @precondition(lambda self: len(self.subs) > 0)
    @rule(data=st.data())
    def step_subscription(self, data: st.DataObject) -> None:
        self.step_sub(data.draw(st.sampled_from(self.subs), label="sub"))

    @rule()
    def check_txns_shard(self) -> None:
        contents = self.quiet(lambda: txns_shard_contents(self.store.client(), self.txns_id))
        assert all(diff == 1 for _, diff in contents), contents
        regs = sorted((e.data_id, e.ts) for e, _ in contents if e.is_registration)
        want = sorted((d, self.model.regs[d][-1].register_ts) for d in self.registered())
        assert regs == want
        present = {(e.ts, e.data_id) for e, _ in contents if not e.is_registration}
        for d, writes in self.model.writes.items():
            upper = self.fresh_upper(d)
            for t, _, _ in writes:
                if upper <= t:
                    assert (t, d) in present, f"unapplied write at {t} to {d} missing from the txns shard"

    @invariant()
    def txns_upper_matches_model(self) -> None:
        assert self.fresh_upper(self.txns_id) == self.model.upper
        for hs in self.handles:
            assert hs.h.read_cache().frontier <= self.model.upper

    # ---- subscriptions ---------------------------------------------------------------

    def step_sub(self, s: SubState) -> None:
        """Step ``s`` up to the current upper (or its until), checking every event against the model."""
        target = self.model.upper if s.until is None else min(self.model.upper, s.until)
        idle = 0
        while s.frontier is None or s.frontier < target:
            events = self.retry(lambda: s.sub.step())
            if not events:
                idle += 1
                assert idle < 3, f"subscription stuck at {s.frontier}, upper {self.model.upper}"
                continue
            idle = 0
            for ev in events:
                self.check_event(s, ev)
        if s.until is not None and s.frontier == s.until:
            assert self.retry(lambda: s.sub.step()) == []

    def check_event(self, s: SubState, ev: object) -> None:
        if s.acc is None:
            assert isinstance(ev, Updates), ev
            s.acc = consolidated(ev.updates, s.as_of)
            assert s.acc == self.model.contents(s.d, s.as_of)
            s.frontier = s.as_of + 1
            return
        assert s.frontier is not None
        if isinstance(ev, Updates):
            for (k, v), ts, diff in ev.updates:
                assert ts >= s.frontier and (s.until is None or ts < s.until)
                s.acc[(k, v)] = s.acc.get((k, v), 0) + diff
                if s.acc[(k, v)] == 0:
                    del s.acc[(k, v)]
            return
        assert isinstance(ev, Progress), ev
        assert ev.upper >= s.frontier
        assert s.until is None or ev.upper <= s.until
        assert ev.upper <= self.model.upper
        s.frontier = ev.upper
        assert s.acc == self.model.contents(s.d, ev.upper - 1), (s.d, ev.upper)
        event("subscribe: progress checked")

    def close_sub(self, s: SubState) -> None:
        self.subs.remove(s)
        self.quiet(s.sub.close)

    def teardown(self) -> None:
        for s in list(self.subs):
            self.close_sub(s)
        if self.faults is not None:
            n = self.faults.counters.total().injected
            event(f"faults injected: {'0' if n == 0 else '1-9' if n < 10 else '10+'}")
        event(f"steps: commits {len(self.model.commits)}")
        since = self.quiet(lambda: self.store.client().inspect(self.txns_id)["since"])
        where = "0" if since == 0 else "< upper/2" if since < self.model.upper / 2 else ">= upper/2"
        event(f"txns since at the end: {where}")


TestTxnsModel = TxnsMachine.TestCase
TestTxnsModel.settings = PROFILE


class FaultyTxnsMachine(TxnsMachine):
    FAULTS = True

    @initialize(n=st.integers(2, 3), n_regs=st.integers(0, 3), seed=st.integers(0, 2**32 - 1))
    def open_handles(self, n: int, n_regs: int, seed: int = 0) -> None:
        self.faults = Faults(seed=seed)
        self.store = Store(faults=self.faults, config=self.store.config)
        super().open_handles(n, n_regs)
        # random faults from here on: every storage operation of every client
        self.faults.set_rates(determinate=0.05, indeterminate=0.03, after=0.05)


TestTxnsModelFaults = FaultyTxnsMachine.TestCase
TestTxnsModelFaults.settings = PROFILE


# ---- targeted fault regressions ------------------------------------------------------


def _faulty_setup() -> tuple[Store, Faults, TxnsHandle, str]:
    faults = Faults(seed=3)
    store = Store(faults=faults, config=PersistConfig(retry_deadline_s=0.0, read_wait_s=1.0))
    h = TxnsHandle.open(store.client(), new_id())
    d = new_id()
    h.register(1, {d: SCHEMA})
    h.prepare_commit()  # the commits shard's schema, so the faults below hit the commit itself
    return store, faults, h, d


def test_commit_retried_after_indeterminate_and_a_reread_does_not_commit_twice() -> None:
    store, faults, h, d = _faulty_setup()
    txn = h.begin()
    txn.write(d, (1,), ("once",), 1)
    faults.fail_next(Op.CAS, Fault.AFTER)  # the commit lands, the caller hears Indeterminate
    with pytest.raises(Indeterminate):
        txn.commit_at(h, 2)
    h.read_cache().sync()  # anything may re-read the txns shard before the retry
    assert h.upper == 3
    # the retry at the same time recognises its own commit (it used to raise
    # TimestampUnavailable(upper=3), inviting a second commit at 3)
    res = txn.commit_at(h, 2)
    assert res.commit_ts == 2
    assert h.upper == 3
    res.apply(h)
    assert h.snapshot(d, 2) == [(((1,), ("once",)), 2, 1)]
    appends = [e for e, _ in txns_shard_contents(store.client(), h.txns_id) if not e.is_registration]
    assert len(appends) == 1


def test_forget_retried_after_indeterminate_still_fills_the_data_shard() -> None:
    store, faults, h, d = _faulty_setup()
    txn = h.begin()
    txn.write(d, (1,), ("x",), 1)
    txn.commit_at(h, 2).apply(h)
    faults.fail_next(Op.CAS, Fault.AFTER)  # the forget's retraction lands, the caller hears Indeterminate
    with pytest.raises(Indeterminate):
        h.forget(5, [d])
    h.forget(5, [d])  # idempotent: nothing to retract, but the fill must still happen
    assert store.client().shard(d).fetch().upper == 6
    assert store.client().shard(h.txns_id).fetch().upper == 6


def test_cache_restart_failing_midway_does_not_forget_pending_writes() -> None:
    """A cache whose lease lapsed restarts from a snapshot; a storage error there must not empty it."""
    store, faults, h, d = _faulty_setup()
    writer = store.client().open_writer(d, SCHEMA)
    txn = h.begin()
    for i in range(250):  # enough entries that the commit's txns-shard batch is a part in blob storage
        txn.write_batch(d, writer.batch([(((i,), ("x",)), 0, 1)], 0, 1))
    txn.commit_at(h, 2)  # committed, never applied (the committer "crashed")
    assert store.client().inspect(h.txns_id)["parts"] >= 1
    for ts in range(3, 6):
        h.begin().commit_at(h, ts)
    h.read_cache().reader.expire()  # as if its lease lapsed
    faults.fail_next(Op.BLOB_GET)  # the restart's snapshot fails
    with pytest.raises(Determinate):
        h.read_cache().sync()
    # the unapplied write at 2 still holds the since back
    assert h.compact_to(100) <= 2
    other = TxnsHandle.open(store.client(), h.txns_id)
    assert len(other.snapshot(d, 3)) == 250, "the write at 2 was lost"
    assert len(h.snapshot(d, 4)) == 250


def test_subscription_survives_a_failed_hold_renewal() -> None:
    """A subscription whose data-shard hold renewal fails must not lose the events of that step."""
    now = [1_000_000]
    config = PersistConfig(read_wait_s=1.0, clock_ms=lambda: now[0])
    store = Store(config=config)
    h = TxnsHandle.open(store.client(), new_id())
    d, other = new_id(), new_id()
    h.register(1, {d: SCHEMA, other: SCHEMA})
    txn = h.begin()
    txn.write(d, (1,), ("x",), 1)
    txn.commit_at(h, 2).apply(h)
    sub = DataSubscribe(store.client(), h.txns_id, d, as_of=2)
    assert sub.step() == [Updates([(((1,), ("x",)), 2, 1)]), Progress(3)]
    for ts in range(3, 7):  # time passes for d: commits elsewhere only
        txn = h.begin()
        txn.write(other, (ts,), ("o",), 1)
        txn.commit_at(h, ts).apply(h)
    now[0] += int(config.reader_lease_s * 1000 * 0.3)  # the hold is due for renewal
    real = sub.reader.downgrade_since
    failures = [Determinate("injected: the hold renewal's compare-and-set failed")]

    def flaky_downgrade(since: int) -> None:
        if failures:
            raise failures.pop()
        real(since)

    sub.reader.downgrade_since = flaky_downgrade  # type: ignore[method-assign]
    got: list = []
    for _ in range(3):
        try:
            got += sub.step()
        except Determinate:
            continue
    assert not failures, "the renewal was attempted"
    assert Progress(7) in got, got
    assert sub.frontier == 7


def test_a_transient_blob_failure_does_not_poison_a_big_txn() -> None:
    """A txn whose data goes to parts survives a failed part upload (persist retries it)."""
    faults = Faults(seed=9)
    config = PersistConfig(part_target_bytes=1024, inline_max_bytes=64, retry_deadline_s=5.0)
    store = Store(faults=faults, config=config)
    h = TxnsHandle.open(store.client(), new_id())
    d = new_id()
    h.register(0, {d: SCHEMA})
    txn = h.begin()
    for i in range(100):
        txn.write(d, (i,), ("x",), 1)
    faults.fail_next(Op.BLOB_SET, Fault.DETERMINATE)
    faults.fail_next(Op.BLOB_SET, Fault.INDETERMINATE)
    res = txn.commit_at(h, 1)  # used to raise, and then raise the same on every retry
    assert faults.pending(Op.BLOB_SET) == 0
    res.apply(h)
    assert consolidated(h.snapshot(d, 1), 1) == {row(i, "x"): 1 for i in range(100)}


def test_commit_retried_at_a_later_time_after_indeterminate_does_not_commit_twice() -> None:
    """The caller hears Indeterminate, then tries a *later* time (as TimestampUnavailable would suggest)."""
    store, faults, h, d = _faulty_setup()
    txn = h.begin()
    txn.write(d, (1,), ("once",), 1)
    faults.fail_next(Op.CAS, Fault.AFTER)
    with pytest.raises(Indeterminate):
        txn.commit_at(h, 2)
    res = txn.commit_at(h, 5)  # the earlier attempt landed at 2: it stands
    assert res.commit_ts == 2
    res.apply(h)
    assert h.snapshot(d, 2) == [(((1,), ("once",)), 2, 1)]
    appends = [e for e, _ in txns_shard_contents(store.client(), h.txns_id) if not e.is_registration]
    assert len(appends) == 1


def test_an_uncertain_commit_moved_to_another_process_does_not_commit_twice() -> None:
    store, faults, h, d = _faulty_setup()
    txn = h.begin()
    txn.write(d, (1,), ("once",), 1)
    faults.fail_next(Op.CAS, Fault.AFTER)
    with pytest.raises(Indeterminate):
        txn.commit_at(h, 2)
    other = TxnsHandle.open(store.client(), h.txns_id)
    res = Txn.from_bytes(txn.to_bytes(), other).commit_at(other, other.upper)
    assert res.commit_ts == 2
    res.apply(other)
    assert other.snapshot(d, 2) == [(((1,), ("once",)), 2, 1)]
    assert other.upper == 3, "nothing else was committed"
