"""A Hypothesis state machine: one persist shard against a reference model.

Every step does one thing to the shard (an append, a batch written ahead and
appended later re-timestamped, a lost append, a compaction, a since move, a
read, a reopen with a fresh client) and to :class:`tests.persist.model.ShardModel`,
and the invariants compare the two after each step. Sizes are tiny so that
inline batches, Parquet parts, compaction, part GC and consensus truncation
all happen within a few steps.

Profiles (select with the environment variable ``HYPOTHESIS_PROFILE``):
``ci`` (the default: quick, for every run), ``dev`` (as ci, without
shrinking) and ``slow`` (many more examples and longer runs; marked ``slow``
and exempt from pytest's timeout). A failure prints a reproduction blob.
"""

from __future__ import annotations

import os
import shutil
import tempfile

import pytest
from hypothesis import HealthCheck, Phase, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from persist import Batch, PersistClient, PersistConfig, ShardId, UpperMismatch
from tests.helpers import mem_url
from tests.persist.model import SCHEMA, ShardModel, Update, consolidate, drain_listen, shard_blob_keys

_COMMON = {
    "deadline": None,
    "derandomize": False,
    "print_blob": True,
    "suppress_health_check": [HealthCheck.too_slow, HealthCheck.data_too_large],
}
settings.register_profile("ci", max_examples=60, stateful_step_count=40, **_COMMON)
settings.register_profile("slow", max_examples=500, stateful_step_count=60, **_COMMON)
# "dev": like ci, without shrinking (a failure is reported as found, at once)
settings.register_profile(
    "dev", max_examples=60, stateful_step_count=40, phases=[Phase.explicit, Phase.reuse, Phase.generate], **_COMMON
)
PROFILE_NAME = os.environ.get("HYPOTHESIS_PROFILE", "ci")
PROFILE = settings.get_profile(PROFILE_NAME)
# deep runs take longer than pytest's default per-test timeout
DEEP = [pytest.mark.slow, pytest.mark.timeout(0)] if PROFILE_NAME == "slow" else []

KEYS = st.integers(0, 3)
VALS = st.sampled_from(["a", "b"])
DIFFS = st.integers(-2, 2)


def updates_in(lo: int, hi: int, max_size: int = 6) -> st.SearchStrategy[list[Update]]:
    """Lists of updates with times in ``[lo, hi)``."""
    one = st.tuples(st.tuples(st.tuples(KEYS), st.tuples(VALS)), st.integers(lo, hi - 1), DIFFS)
    return st.lists(one, max_size=max_size)


class ShardMachine(RuleBasedStateMachine):
    """One shard, its handles, and the model it must agree with."""

    backend = "mem"

    def __init__(self) -> None:
        super().__init__()
        self.tmp: str | None = None
        if self.backend == "mem":
            self.url = mem_url("model")
        else:
            self.tmp = tempfile.mkdtemp(prefix="persist-model-")
            self.url = f"file://{self.tmp}/store"
        self.config = PersistConfig(
            inline_max_bytes=450,  # up to ~4 rows inline, more go to parts
            part_target_bytes=240,  # compaction writes parts of ~8 rows
            part_grace_s=0,  # retired parts are deleted by the next maintenance
            consensus_retention_s=0,  # every version older than the newest mark may be truncated
            gc_every_versions=5,
        )
        self.shard = ShardId.new()
        self.model = ShardModel()
        self.pending: list[tuple[Batch, list[Update]]] = []
        self.opaque = 0
        self.reopens = 0
        self._open()
        self.crit = self.read_client.open_critical_since(self.shard, "crit", opaque=0)
        self.last_upper = 0
        self.last_since = 0
        self.saw_inline = False

    def _open(self) -> None:
        # SUBTLE: the reader has its own client, so its cached state lags the
        # writer's: reads planned on stale states (whose parts compaction may
        # have deleted) are exercised too.
        self.client = PersistClient.open(self.url, self.config)
        self.read_client = PersistClient.open(self.url, self.config)
        self.writer = self.client.open_writer(self.shard, SCHEMA)
        self.reader = self.read_client.open_leased_reader(self.shard, SCHEMA)

    def teardown(self) -> None:
        # what this run exercised (shown by --hypothesis-show-statistics)
        state = self.client.shard(self.shard).fetch()
        event(f"parts written: {bool(state.part_keys())}")
        event(f"inline batches seen: {self.saw_inline}")
        first = self.client.consensus.scan(str(self.shard), 0, 1)
        event(f"consensus truncated: {bool(first) and first[0].seqno > 1}")
        event(f"reopened: {self.reopens > 0}")
        if self.tmp is not None:
            shutil.rmtree(self.tmp, ignore_errors=True)

    @initialize(data=st.data())
    def some_appends(self, data: st.DataObject) -> None:
        """Start every run with a little data, so that short runs read something too."""
        # without automatic compaction, only the compact rule merges batches
        self.config.compaction_enabled = data.draw(st.booleans(), label="automatic compaction")
        for _ in range(data.draw(st.integers(1, 3), label="initial appends")):
            self.append(data)

    # ---- helpers --------------------------------------------------------------------------

    def _holds_changed(self) -> None:
        self.model.hold([self.reader.since, self.crit.since])

    def _readable(self) -> bool:
        return self.reader.since < self.model.upper

    # ---- writes ---------------------------------------------------------------------------

    @rule(data=st.data())
    def append(self, data: st.DataObject) -> None:
        lo = self.model.upper
        hi = lo + data.draw(st.integers(1, 3), label="width")
        ups = data.draw(updates_in(lo, hi), label="updates")
        self.writer.compare_and_append(ups, lo, hi)
        self.model.append(ups, lo, hi)

    @rule(data=st.data())
    def append_several(self, data: st.DataObject) -> None:
        """A few appends in one step (steps are cheap to spend on reads otherwise)."""
        for _ in range(data.draw(st.integers(2, 5), label="appends")):
            self.append(data)

    @precondition(lambda self: len(self.pending) < 3)
    @rule(data=st.data())
    def write_batch_ahead(self, data: st.DataObject) -> None:
        """Write a batch now (possibly at times already past), append it later."""
        lo = data.draw(st.integers(max(0, self.model.upper - 3), self.model.upper), label="lower")
        hi = lo + data.draw(st.integers(1, 3), label="width")
        ups = data.draw(updates_in(lo, hi, max_size=10), label="updates")
        batch = self.writer.batch(ups, lo, hi)
        assert batch.rows == len(ups) and (batch.lower, batch.upper) == (lo, hi)
        if data.draw(st.booleans(), label="via bytes"):
            batch = Batch.from_bytes(batch.to_bytes())
        self.pending.append((batch, ups))

    @precondition(lambda self: self.pending)
    @rule(data=st.data())
    def append_written_batches(self, data: st.DataObject) -> None:
        """Append some written batches, re-timestamped to the upper (or later) if needed."""
        n = data.draw(st.integers(1, len(self.pending)), label="batches")
        chosen, self.pending = self.pending[:n], self.pending[n:]
        lo = self.model.upper
        batches: list[Batch] = []
        model_ups: list[Update] = []
        for batch, ups in chosen:
            if batch.lower < lo or data.draw(st.booleans(), label="rewrite anyway"):
                ts = lo + data.draw(st.integers(0, 2), label="rewrite ts")
                upper = None
                if data.draw(st.booleans(), label="explicit upper"):
                    upper = max(batch.upper, ts + 1) + data.draw(st.integers(0, 2), label="extra")
                moved = batch.rewrite_ts(ts, upper)
                assert [p.key for p in moved.parts] == [p.key for p in batch.parts]
                batches.append(moved)
                model_ups.extend((kv, max(t, ts), d) for kv, t, d in ups)
            else:
                batches.append(batch)
                model_ups.extend(ups)
        hi = max([lo + 1] + [b.upper for b in batches]) + data.draw(st.integers(0, 2), label="slack")
        self.writer.compare_and_append_batch(batches, lo, hi)
        self.model.append(model_ups, lo, hi)

    @rule(data=st.data())
    def append_at_wrong_upper(self, data: st.DataObject) -> None:
        up = self.model.upper
        if up > 0 and data.draw(st.booleans(), label="behind"):
            expected = up - data.draw(st.integers(1, up), label="behind by")
        else:
            expected = up + data.draw(st.integers(1, 3), label="ahead by")
        ups = data.draw(updates_in(expected, expected + 2), label="updates")
        before = self.client.inspect(self.shard)
        keys = shard_blob_keys(self.client, self.shard)
        try:
            self.writer.compare_and_append(ups, expected, expected + 2)
        except UpperMismatch as e:
            assert (e.expected, e.current) == (expected, up)
        else:
            raise AssertionError(f"an append expecting upper {expected} succeeded at upper {up}")
        assert self.client.inspect(self.shard) == before, "a lost append changed the state"
        assert shard_blob_keys(self.client, self.shard) == keys, "a lost append left data behind"

    @rule()
    def compact(self) -> None:
        applied = self.writer.compact()
        event(f"compactions applied by the compact rule: {min(applied, 2)}")

    # ---- holds ----------------------------------------------------------------------------

    @rule(data=st.data())
    def downgrade_reader(self, data: st.DataObject) -> None:
        old = self.reader.since
        target = data.draw(st.integers(max(0, old - 1), max(old, self.model.upper)), label="since")
        self.reader.downgrade_since(target)
        assert self.reader.since == max(old, target)
        self._holds_changed()

    @rule(data=st.data())
    def downgrade_critical(self, data: st.DataObject) -> None:
        old_since = self.crit.since
        target = data.draw(st.integers(max(0, old_since - 1), max(old_since, self.model.upper)), label="since")
        if data.draw(st.booleans(), label="wrong opaque"):
            wrong = self.opaque + data.draw(st.integers(1, 3), label="off by")
            before = self.client.inspect(self.shard)
            res = self.crit.compare_and_downgrade_since(wrong, wrong + 1, target)
            assert (res.ok, res.since, res.opaque) == (False, old_since, self.opaque)
            assert self.client.inspect(self.shard) == before, "a fenced downgrade changed the state"
            return
        new_opaque = self.opaque + data.draw(st.integers(0, 1), label="new opaque")
        res = self.crit.compare_and_downgrade_since(self.opaque, new_opaque, target)
        assert (res.ok, res.since, res.opaque) == (True, max(old_since, target), new_opaque)
        self.opaque = new_opaque
        self._holds_changed()

    # ---- reads ----------------------------------------------------------------------------

    @precondition(lambda self: self._readable())
    @rule(data=st.data())
    def snapshot(self, data: st.DataObject) -> None:
        as_of = data.draw(st.integers(self.reader.since, self.model.upper - 1), label="as_of")
        assert self.reader.snapshot_and_fetch(as_of) == self.model.snapshot(as_of), f"as_of {as_of}"

    @precondition(lambda self: self._readable())
    @rule()
    def snapshot_every_as_of(self) -> None:
        for as_of in range(self.reader.since, self.model.upper):
            assert self.reader.snapshot_and_fetch(as_of) == self.model.snapshot(as_of), f"as_of {as_of}"

    @precondition(lambda self: self._readable())
    @rule(data=st.data())
    def listen(self, data: st.DataObject) -> None:
        as_of = data.draw(st.integers(self.reader.since, self.model.upper - 1), label="as_of")
        got, _ = drain_listen(self.reader.listen(as_of), self.model.upper)
        assert consolidate(got) == self.model.changes_after(as_of), f"listen from {as_of}"

    # ---- reopening ------------------------------------------------------------------------

    @rule()
    def reopen(self) -> None:
        """Switch to a fresh client on the same store; the old reader lets go."""
        old_reader = self.reader
        self._open()
        assert self.reader.since == self.model.since
        old_reader.expire()
        crit = self.read_client.open_critical_since(self.shard, "crit", opaque=12345)
        assert (crit.since, crit.opaque) == (self.crit.since, self.opaque)
        self.crit = crit
        self.reopens += 1

    # ---- invariants -----------------------------------------------------------------------

    @invariant()
    def agrees_with_model(self) -> None:
        state = self.client.shard(self.shard).fetch()
        state.check()
        assert state.upper == self.model.upper
        assert state.since == self.model.since
        assert state.upper >= self.last_upper, "the upper went backwards"
        assert state.since >= self.last_since, "the since went backwards"
        self.last_upper, self.last_since = state.upper, state.since
        self.saw_inline |= any(r.inline is not None for b in state.batches for r in b.runs)
        assert len(state.leased) == 1 and set(state.critical) == {"crit"}
        assert sum(b.rows for b in state.batches) <= len(self.model.updates)
        # every part in blob storage is referenced, retired, or in a batch not yet appended
        pending = {p.key for b, _ in self.pending for p in b.parts}
        live, retired = state.part_keys(), {k for k, _ in state.garbage}
        assert shard_blob_keys(self.client, self.shard) == live | retired | pending


class FileShardMachine(ShardMachine):
    backend = "file"


TestShardMemModel = ShardMachine.TestCase
TestShardMemModel.settings = PROFILE
TestShardMemModel.pytestmark = DEEP

TestShardFileModel = FileShardMachine.TestCase
TestShardFileModel.settings = settings(
    PROFILE,
    max_examples=max(5, PROFILE.max_examples // 4),
    stateful_step_count=max(20, PROFILE.stateful_step_count * 2 // 3),
)
TestShardFileModel.pytestmark = DEEP
