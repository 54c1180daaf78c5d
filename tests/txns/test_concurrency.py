"""txns under racing threads: contended commits, racing apply and tidy, a bank of transfers."""

from __future__ import annotations

import random
import threading
from collections import Counter
from collections.abc import Callable

from persist import PersistConfig
from persist.unreliable import Faults
from tests.txns.model import SCHEMA, Store, TxnsModel, consolidated, new_id, retrying, row, txns_shard_contents
from txns import Tidy, TimestampUnavailable, Txn, TxnApply, TxnsHandle


def _run_threads(targets: list[Callable[[], None]]) -> None:
    """Run every target in its own thread; re-raise the first failure."""
    errors: list[BaseException] = []

    def wrap(fn: Callable[[], None]) -> Callable[[], None]:
        def run() -> None:
            try:
                fn()
            except BaseException as e:  # noqa: BLE001 - reported below
                errors.append(e)

        return run

    threads = [threading.Thread(target=wrap(t)) for t in targets]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]


def _commit_somewhere(h: TxnsHandle, txn: Txn) -> TxnApply:
    """Commit at the handle's upper, retrying higher on TimestampUnavailable."""
    ts = h.upper
    while True:
        try:
            return txn.commit_at(h, ts)
        except TimestampUnavailable as e:
            assert e.upper > ts
            ts = e.upper


def test_contended_commits_one_winner_per_ts_nothing_lost(store: Store) -> None:
    txns_id = new_id()
    setup = TxnsHandle.open(store.client(), txns_id)
    ds = [new_id(), new_id()]
    setup.register(0, dict.fromkeys(ds, SCHEMA))
    n_threads, per_thread = 4, 25
    won: dict[int, list[int]] = {t: [] for t in range(n_threads)}
    lost_races = Counter[int]()

    def worker(t: int) -> Callable[[], None]:
        def run() -> None:
            h = TxnsHandle.open(store.client(), txns_id)
            for i in range(per_thread):
                txn = h.begin()
                txn.write(ds[t % 2], (t * 1000 + i,), (f"t{t}",), 1)
                txn.write(ds[(t + 1) % 2], (t * 1000 + i,), (f"t{t}",), 2)
                ts = h.upper
                while True:
                    try:
                        res = txn.commit_at(h, ts)
                        break
                    except TimestampUnavailable as e:
                        lost_races[t] += 1
                        ts = e.upper
                won[t].append(res.commit_ts)
                if i % 3 == 0:
                    res.apply(h)

        return run

    _run_threads([worker(t) for t in range(n_threads)])
    all_ts = [ts for tss in won.values() for ts in tss]
    assert len(all_ts) == n_threads * per_thread
    assert len(set(all_ts)) == len(all_ts), "two commits won the same ts"
    for tss in won.values():
        assert tss == sorted(tss)
    assert sum(lost_races.values()) > 0, "the threads did contend"
    # the txns shard has exactly the entries of the winners: 2 per commit, each +1
    contents = txns_shard_contents(setup.client, txns_id)
    appends = [(e, diff) for e, diff in contents if not e.is_registration]
    assert all(diff == 1 for _, diff in contents)
    per_ts = Counter(e.ts for e, _ in appends)
    assert set(per_ts) == set(all_ts) and set(per_ts.values()) == {2}
    # nothing lost, nothing doubled: every write once, at its commit time
    reader = TxnsHandle.open(store.client(), txns_id)
    upper = reader.upper
    assert upper == max(all_ts) + 1
    for d_idx, d in enumerate(ds):
        want: dict = {}
        for t in range(n_threads):
            for i in range(per_thread):
                want[row(t * 1000 + i, f"t{t}")] = 1 if t % 2 == d_idx else 2
        assert consolidated(reader.snapshot(d, upper - 1), upper - 1) == want
    # and at every ts in between, exactly the winners below it
    ts_of = {(t, i): won[t][i] for t in range(n_threads) for i in range(per_thread)}
    for as_of in sorted(all_ts)[::7]:
        got = consolidated(reader.snapshot(ds[0], as_of), as_of)
        want0 = {
            row(t * 1000 + i, f"t{t}"): (1 if t % 2 == 0 else 2)
            for (t, i), ts in ts_of.items()
            if ts <= as_of
        }
        assert got == want0, as_of


def test_racing_apply_and_tidy_never_double_retracts(store: Store) -> None:
    txns_id = new_id()
    setup = TxnsHandle.open(store.client(), txns_id)
    ds = [new_id() for _ in range(3)]
    setup.register(0, dict.fromkeys(ds, SCHEMA))
    committed: list[tuple[int, dict]] = []  # (ts, writes); list.append is atomic
    writers_done = threading.Event()

    def writer(w: int) -> Callable[[], None]:
        def run() -> None:
            rng = random.Random(w)
            h = TxnsHandle.open(store.client(), txns_id)
            for i in range(20):
                writes = {d: [(row(w * 100 + i, "x"), rng.choice([1, 2]))] for d in rng.sample(ds, rng.randint(1, 3))}
                txn = h.begin()
                for d, ups in writes.items():
                    for (k, v), diff in ups:
                        txn.write(d, k, v, diff)
                committed.append((_commit_somewhere(h, txn).commit_ts, writes))
                # never applied by the writer: the appliers race to do it

        return run

    def applier(a: int) -> Callable[[], None]:
        def run() -> None:
            h = TxnsHandle.open(store.client(), txns_id)
            tidy = Tidy()
            rounds = 0
            while not writers_done.is_set() or rounds < 3:
                rounds += 1
                h.read_cache().sync()
                tidy.merge(h.apply_le(h.upper - 1))
                carrier = h.begin()
                carrier.tidy(tidy)
                committed.append((_commit_somewhere(h, carrier).commit_ts, {}))
                assert carrier.batches() == {}
                tidy = Tidy()  # retracted (or found retracted by the other applier)

        return run

    writer_threads = [writer(w) for w in range(2)]

    def writers() -> None:
        try:
            _run_threads(writer_threads)
        finally:
            writers_done.set()

    _run_threads([writers, applier(0), applier(1)])
    model = TxnsModel()
    model.register(0, ds)
    assert len({ts for ts, _ in committed}) == len(committed)
    for ts, writes in sorted(committed, key=lambda c: c[0]):
        model.commit(ts, writes)

    contents = txns_shard_contents(setup.client, txns_id)
    diffs = Counter(diff for _, diff in contents)
    assert set(diffs) == {1}, f"a txns entry with multiplicity other than +1: {diffs}"
    # whatever is left over is registrations plus entries not yet tidied; one more
    # apply + tidy leaves only the registrations
    final = TxnsHandle.open(store.client(), txns_id)
    tidy = final.apply_le(final.upper - 1)
    final.tidy_at(final.upper, tidy)
    model.commit(final.upper - 1, {})
    contents = txns_shard_contents(setup.client, txns_id)
    assert all(diff == 1 for _, diff in contents)
    assert sorted(e.data_id for e, _ in contents) == sorted(ds), "only registrations remain"
    for d in ds:
        for as_of in range(0, model.upper, 3):
            assert consolidated(final.snapshot(d, as_of), as_of) == model.contents(d, as_of), (d, as_of)


def test_bank_transfers_keep_the_total_at_every_time(store: Store) -> None:
    txns_id = new_id()
    setup = TxnsHandle.open(store.client(), txns_id)
    shards = [new_id() for _ in range(3)]
    setup.register(0, dict.fromkeys(shards, SCHEMA))
    n_accounts, initial = 12, 100
    total = n_accounts * initial

    def shard_of(acct: int) -> str:
        return shards[acct % 3]

    txn = setup.begin()
    for a in range(n_accounts):
        txn.write(shard_of(a), (a,), ("balance",), initial)
    start_ts = txn.commit_at(setup, 1).commit_ts
    setup.apply_le(start_ts)
    done = threading.Event()
    violations: list[str] = []

    def teller(t: int) -> Callable[[], None]:
        def run() -> None:
            rng = random.Random(100 + t)
            h = TxnsHandle.open(store.client(), txns_id)
            for i in range(15):
                a = rng.randrange(n_accounts)
                b = rng.choice([x for x in range(n_accounts) if x % 3 != a % 3])  # another shard
                amount = rng.randint(1, 30)
                txn = h.begin()
                txn.write(shard_of(a), (a,), ("balance",), -amount)
                txn.write(shard_of(b), (b,), ("balance",), amount)
                res = _commit_somewhere(h, txn)
                if t == 0 or i % 2 == 0:
                    res.apply(h)  # the others leave it to readers

        return run

    def auditor() -> None:
        h = TxnsHandle.open(store.client(), txns_id)
        while not done.is_set():
            h.read_cache().sync()
            as_of = h.upper - 1
            got = sum(diff for d in shards for _, _, diff in h.snapshot(d, as_of))
            if got != total:
                violations.append(f"total {got} at {as_of}")

    tellers = [teller(t) for t in range(3)]

    def all_tellers() -> None:
        try:
            _run_threads(tellers)
        finally:
            done.set()

    _run_threads([all_tellers, auditor])
    assert violations == []
    reader = TxnsHandle.open(store.client(), txns_id)
    upper = reader.upper
    assert upper > 1 + 3 * 15, "every transfer committed at its own time"
    since = store.client().inspect(shards[0])["since"]
    balances_seen: set[tuple] = set()
    for as_of in range(max(since, start_ts), upper):
        snaps = [consolidated(reader.snapshot(d, as_of), as_of) for d in shards]
        assert sum(sum(s.values()) for s in snaps) == total, as_of
        balances_seen.add(tuple(sorted((k, n) for s in snaps for k, n in s.items())))
    assert len(balances_seen) > 10, "the balances did move"
    for as_of in range(0, start_ts):
        assert all(reader.snapshot(d, as_of) == [] for d in shards)


def test_contended_commits_under_storage_faults_commit_each_txn_once() -> None:
    """Racing committers over a faulty store, retrying (same txn, same ts, same handle) on storage errors."""
    faults = Faults(seed=11)
    store = Store(faults=faults, config=PersistConfig(retry_deadline_s=0.0, read_wait_s=2.0))
    txns_id = new_id()
    setup = TxnsHandle.open(store.client(), txns_id)
    d = new_id()
    setup.register(0, {d: SCHEMA})
    n_threads, per_thread = 3, 12
    won: dict[int, list[int]] = {t: [] for t in range(n_threads)}
    faults.set_rates(determinate=0.05, indeterminate=0.03, after=0.05)

    def worker(t: int) -> Callable[[], None]:
        def run() -> None:
            h = retrying(lambda: TxnsHandle.open(store.client(), txns_id), faults)
            for i in range(per_thread):
                txn = h.begin()
                retrying(lambda: txn.write(d, (t * 100 + i,), (f"t{t}",), 1), faults)  # noqa: B023 - called at once
                ts = retrying(lambda: h.upper, faults)
                while True:
                    try:
                        # a storage error may or may not have committed it: retry the
                        # same txn at the same ts, re-reading the txns shard in between
                        res = retrying(lambda: txn.commit_at(h, ts), faults, between=h.read_cache().sync)  # noqa: B023 - called at once
                        break
                    except TimestampUnavailable as e:
                        ts = e.upper
                won[t].append(res.commit_ts)
                if i % 2 == 0:
                    retrying(lambda: res.apply(h), faults)  # noqa: B023 - called at once

        return run

    _run_threads([worker(t) for t in range(n_threads)])
    assert faults.counters.total().injected > 10, "faults were injected"
    faults.set_rates()  # off: check the outcome
    all_ts = [ts for tss in won.values() for ts in tss]
    assert len(set(all_ts)) == len(all_ts) == n_threads * per_thread
    contents = txns_shard_contents(store.client(), txns_id)
    assert all(diff == 1 for _, diff in contents)
    assert sorted(e.ts for e, _ in contents if not e.is_registration) == sorted(all_ts), "one entry per commit"
    reader = TxnsHandle.open(store.client(), txns_id)
    upper = reader.upper
    want = {row(t * 100 + i, f"t{t}"): 1 for t in range(n_threads) for i in range(per_thread)}
    assert consolidated(reader.snapshot(d, upper - 1), upper - 1) == want
    ts_of = {row(t * 100 + i, f"t{t}"): won[t][i] for t in range(n_threads) for i in range(per_thread)}
    for as_of in range(0, upper, 5):
        assert consolidated(reader.snapshot(d, as_of), as_of) == {r: 1 for r, ts in ts_of.items() if ts <= as_of}
