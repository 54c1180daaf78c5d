"""The write path's fast paths: a file compare-and-set's steps and their order, a prerequisite
overlapping the write (``compare_and_set_after``, ``Machine.apply(ready=)``), small batches
sorted in Python, ids without a system call each, schemas a client already holds."""

from __future__ import annotations

import errno
import os
import random
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

import persist.batch as batch_mod
import persist.file as file_mod
from persist import InvalidUsage, PersistClient, Schema, ShardId
from persist._internal import ids
from persist._internal.parts import decode_inline
from persist.batch import BatchBuilder
from persist.config import PersistConfig
from persist.errors import Determinate
from persist.file import FileConsensus, open_file
from persist.location import CaSResult
from persist.mem import MemBlob, MemConsensus
from persist.schema import rows_to_table

COMMITTED, MISMATCH = CaSResult.COMMITTED, CaSResult.MISMATCH


def _events(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, str]]:
    """Record the file store's durable steps, in order: fsyncs and links, by path (a new
    version's content, named or not, as ``<its directory>/(new)``)."""
    events: list[tuple[str, str]] = []
    fds: dict[int, str] = {}
    real_open, real_fsync, real_link = os.open, os.fsync, os.link

    def open_(path: Any, flags: int, mode: int = 0o777, *, dir_fd: int | None = None) -> int:
        fd = real_open(path, flags, mode, dir_fd=dir_fd)
        full = str(path) if dir_fd is None else fds[dir_fd]
        if flags & getattr(os, "O_TMPFILE", 0) == getattr(os, "O_TMPFILE", -1) or ".tmp-" in str(path):
            full = str(Path(full if dir_fd is not None else Path(path).parent) / "(new)")
        fds[fd] = full
        return fd

    def fsync(fd: int) -> None:
        events.append(("fsync", fds.get(fd, "?")))
        real_fsync(fd)

    def link(src: Any, dst: Any, *, src_dir_fd: int | None = None, dst_dir_fd: int | None = None) -> None:
        events.append(("link", str(dst) if dst_dir_fd is None else f"{fds[dst_dir_fd]}/{dst}"))
        real_link(src, dst, src_dir_fd=src_dir_fd, dst_dir_fd=dst_dir_fd)

    monkeypatch.setattr(file_mod.os, "open", open_)
    monkeypatch.setattr(file_mod.os, "fsync", fsync)
    monkeypatch.setattr(file_mod.os, "link", link)
    return events


@pytest.fixture(params=["unnamed", "named temp"])
def staging(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Both ways of staging a new version: an unnamed file (O_TMPFILE), a named temp file."""
    if request.param == "named temp":
        monkeypatch.setattr(file_mod, "_unnamed_ok", False)
    elif not file_mod._unnamed_ok:
        pytest.skip("no O_TMPFILE here")
    return str(request.param)


def test_a_new_key_is_durable_before_its_first_version_is_published(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, staging: str
) -> None:
    events = _events(monkeypatch)
    _blob, consensus = open_file(tmp_path)
    assert not events, "opening a new location syncs nothing yet"
    assert consensus.compare_and_set("k", None, b"v1") is COMMITTED
    keydir = str(tmp_path / "consensus" / "kk")
    # the location's new directories, the key's directory entry and the version's content are all
    # durable (synced at once, on separate threads) before the link publishes it; its entry right after
    assert sorted(events[:3]) == [
        ("fsync", str(tmp_path)),
        ("fsync", str(tmp_path / "consensus")),
        ("fsync", f"{keydir}/(new)"),
    ]
    assert events[3:] == [("link", f"{keydir}/00000000000000000001"), ("fsync", keydir)]
    events.clear()
    assert consensus.compare_and_set("k", 1, b"v2") is COMMITTED
    assert [op for op, _ in events] == ["fsync", "link", "fsync"], "an existing key: no directory made"
    assert consensus.compare_and_set("k", None, b"again") is MISMATCH
    assert consensus.head("k") is not None and consensus.head("k").data == b"v2"  # type: ignore[union-attr]
    assert not [p for p in Path(keydir).iterdir() if p.name.startswith(".tmp-")]
    assert sorted(p.name for p in Path(keydir).iterdir()) == ["00000000000000000001", "00000000000000000002"]
    assert (Path(keydir) / "00000000000000000002").stat().st_mode & 0o777 == 0o666 & ~_umask()


def _umask() -> int:
    m = os.umask(0)
    os.umask(m)
    return m


def test_unnamed_files_refused_fall_back_to_named_temp_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    if not file_mod._unnamed_ok:
        pytest.skip("no O_TMPFILE here")
    monkeypatch.setattr(file_mod, "_unnamed_ok", True)
    real_link = os.link

    def link(src: Any, dst: Any, **kw: Any) -> None:
        if str(src).startswith("/proc/self/fd/"):
            raise OSError(errno.ENOENT, "no /proc here")
        real_link(src, dst, **kw)

    monkeypatch.setattr(file_mod.os, "link", link)
    consensus = FileConsensus(tmp_path)
    assert consensus.compare_and_set("k", None, b"v1") is COMMITTED
    assert not file_mod._unnamed_ok, "from then on: named temp files"
    assert consensus.compare_and_set("k", 1, b"v2") is COMMITTED
    assert [v.data for v in consensus.scan("k", 1, 10)] == [b"v1", b"v2"]
    assert not [p for p in (tmp_path / "consensus" / "kk").iterdir() if p.name.startswith(".tmp-")]


def test_a_new_location_is_durable_before_its_first_blob_or_version(tmp_path: Path, monkeypatch) -> None:
    events = _events(monkeypatch)
    blob, consensus = open_file(tmp_path / "loc")
    blob.set("a", b"x")
    synced = [p for op, p in events if op == "fsync"]
    assert str(tmp_path / "loc") in synced, "the location's directories, before the blob's rename"
    events.clear()
    assert consensus.compare_and_set("k", None, b"v1") is COMMITTED
    assert str(tmp_path / "loc") not in [p for op, p in events if op == "fsync"], "once"
    _blob, again = open_file(tmp_path / "loc")  # (an existing location: nothing to sync)
    events.clear()
    assert again.compare_and_set("k", 1, b"v2") is COMMITTED
    assert [op for op, _ in events] == ["fsync", "link", "fsync"]


def test_a_new_key_whose_directory_cannot_be_made_durable_is_not_written(tmp_path: Path, monkeypatch) -> None:
    _blob, consensus = open_file(tmp_path)
    real = file_mod.fsync_dir

    def fsync_dir(path: Path) -> None:
        if path == tmp_path / "consensus":
            raise OSError("EIO")
        real(path)

    monkeypatch.setattr(file_mod, "fsync_dir", fsync_dir)
    with pytest.raises(Determinate, match="EIO"):
        consensus.compare_and_set("k", None, b"v1")
    keydir = tmp_path / "consensus" / "kk"
    assert consensus.head("k") is None and not list(keydir.iterdir()), "nothing published, no temp file left"
    monkeypatch.setattr(file_mod, "fsync_dir", real)
    assert consensus.compare_and_set("k", None, b"v1") is COMMITTED


def test_an_expectation_on_a_missing_key_makes_no_directory(tmp_path: Path) -> None:
    _blob, consensus = open_file(tmp_path)
    assert consensus.compare_and_set("never", 3, b"x") is MISMATCH
    assert not (tmp_path / "consensus" / "knever").exists()
    assert consensus.head("never") is None


def test_temp_files_of_one_process_have_distinct_names(tmp_path: Path) -> None:
    names = {file_mod._write_temp(tmp_path, b"x").name for _ in range(500)}
    assert len(names) == 500 and all(n.startswith(".tmp-") for n in names)


def test_ids_are_128_random_bits_each_and_a_forked_child_reads_its_own() -> None:
    got = [ids.random_hex() for _ in range(3 * ids.BULK)]
    assert len(set(got)) == len(got) and all(len(x) == 32 and int(x, 16) >= 0 for x in got)
    ids.random_hex()  # (some left in the bulk)
    assert ids._ready
    ids._drop_after_fork()  # what a forked child runs first
    assert not ids._ready
    if hasattr(os, "fork"):
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the child
            os.write(w, ids.random_hex().encode())
            os._exit(0)
        os.close(w)
        child = os.read(r, 64).decode()
        os.waitpid(pid, 0)
        os.close(r)
        assert len(child) == 32 and child not in set(got) | set(ids._ready)


# ---- a prerequisite overlapping the write -----------------------------------------------


def test_file_compare_and_set_after_writes_the_version_first_and_publishes_after_ready(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, staging: str
) -> None:
    consensus = FileConsensus(tmp_path)
    assert consensus.compare_and_set("k", None, b"v1") is COMMITTED
    keydir = tmp_path / "consensus" / "kk"
    events = _events(monkeypatch)
    seen: list[bytes | None] = []

    def ready() -> None:
        head = consensus.head("k")
        seen.append(head.data if head else None)
        events.append(("ready", ""))

    assert consensus.compare_and_set_after("k", 1, b"v2", ready) is COMMITTED
    assert seen == [b"v1"], "not visible while ready runs"
    assert events == [
        ("fsync", f"{keydir}/(new)"),  # its content is written and synced before
        ("ready", ""),
        ("link", f"{keydir}/00000000000000000002"),
        ("fsync", str(keydir)),
    ]
    assert consensus.head("k").data == b"v2"  # type: ignore[union-attr]
    assert not [p for p in keydir.iterdir() if p.name.startswith(".tmp-")]


def test_file_compare_and_set_after_a_failing_ready_writes_nothing(tmp_path: Path, staging: str) -> None:
    consensus = FileConsensus(tmp_path)
    assert consensus.compare_and_set("k", None, b"v1") is COMMITTED

    def refuse() -> None:
        raise OSError("the prerequisite's own failure, not the store's")

    with pytest.raises(OSError, match="prerequisite") as info:
        consensus.compare_and_set_after("k", 1, b"v2", refuse)
    assert not isinstance(info.value, Determinate), "raised as it was"
    assert consensus.head("k").data == b"v1"  # type: ignore[union-attr]
    assert not [p for p in (tmp_path / "consensus" / "kk").iterdir() if p.name.startswith(".tmp-")]


def test_file_compare_and_set_after_loses_to_a_write_made_while_ready_ran(tmp_path: Path, staging: str) -> None:
    consensus, other = FileConsensus(tmp_path), FileConsensus(tmp_path)
    assert consensus.compare_and_set("k", None, b"v1") is COMMITTED

    def race() -> None:
        assert other.compare_and_set("k", 1, b"theirs") is COMMITTED

    assert consensus.compare_and_set_after("k", 1, b"mine", race) is MISMATCH
    assert consensus.head("k").data == b"theirs"  # type: ignore[union-attr]
    assert not [p for p in (tmp_path / "consensus" / "kk").iterdir() if p.name.startswith(".tmp-")]


def test_the_default_compare_and_set_after_calls_ready_first() -> None:
    consensus = MemConsensus()
    order: list[str] = []
    assert consensus.compare_and_set_after("k", None, b"v", lambda: order.append("ready")) is COMMITTED
    assert order == ["ready"] and consensus.head("k").data == b"v"  # type: ignore[union-attr]


SCHEMA = Schema(key=pa.schema([("k", pa.int64())]), val=pa.schema([("v", pa.string())]))


@pytest.fixture
def client(tmp_path: Path) -> PersistClient:
    return PersistClient.open(f"file://{tmp_path}/loc")


def test_a_prerequisite_runs_once_before_the_append_and_not_when_nothing_is_appended(client: PersistClient) -> None:
    sid = ShardId.new()
    w = client.open_writer(sid, SCHEMA)
    calls: list[int | None] = []

    def ready() -> None:
        calls.append(client.shard(sid).fetch().seqno)

    w.compare_and_append([(((1,), ("a",)), 0, 1)], 0, 1, before_write=ready)
    assert w.appended
    assert calls == [None], "called once, before the first version landed"
    with pytest.raises(Exception, match="upper"):
        w.compare_and_append([(((2,), ("b",)), 5, 1)], 5, 6, before_write=ready)
    assert calls == [None], "the upper differs: nothing to wait for"


def test_a_writer_tells_whether_its_last_append_was_its_own(client: PersistClient) -> None:
    sid = ShardId.new()
    w = client.open_writer(sid, SCHEMA)
    w.compare_and_append([(((1,), ("a",)), 0, 1)], 0, 1, token="t1")
    assert w.appended
    w.compare_and_append([(((1,), ("a",)), 0, 1)], 0, 1, token="t1")  # (a retry: the token shows it landed)
    assert not w.appended and client.shard(sid).fetch().seqno == 1


def test_a_failing_prerequisite_is_raised_as_it_is_and_nothing_is_appended(client: PersistClient) -> None:
    sid = ShardId.new()
    w = client.open_writer(sid, SCHEMA)
    attempts: list[int] = []

    def fails() -> None:
        attempts.append(1)
        raise Determinate("the schema write failed")

    with pytest.raises(Determinate, match="schema write failed"):
        w.compare_and_append([(((1,), ("a",)), 0, 1)], 0, 1, before_write=fails)
    assert attempts == [1], "not retried as if the conditional write had failed"
    assert client.shard(sid).fetch().upper == 0
    w.compare_and_append([(((1,), ("a",)), 0, 1)], 0, 1)
    assert client.shard(sid).fetch().upper == 1


def test_a_client_returns_the_schemas_it_was_given(client: PersistClient) -> None:
    sid = ShardId.new()
    client.register_schema(sid, SCHEMA)
    assert client.shard_schema(sid) is SCHEMA, "no decoding of a schema this client registered"
    other = PersistClient.open(client.url)
    decoded = other.shard_schema(sid)
    assert decoded == SCHEMA and decoded is not SCHEMA
    assert other.shard_schema(sid) is decoded


def test_a_shard_assumed_new_is_written_without_a_read_first(client: PersistClient, monkeypatch) -> None:
    heads: list[str] = []
    real = FileConsensus.head
    monkeypatch.setattr(FileConsensus, "head", lambda self, key, hint=None: heads.append(key) or real(self, key, hint))
    sid = ShardId.new()
    client.assume_new(sid)
    client.register_schema(sid, SCHEMA)
    assert not heads and client.shard(sid).fetch().schema == SCHEMA.to_text()
    # assumed wrongly (it exists): the conditional write finds out, reads it, and runs again
    other = PersistClient.open(client.url)
    other.assume_new(sid)
    other.register_schema(sid, SCHEMA)  # (recorded already: nothing written)
    assert other.shard(sid).fetch().seqno == 1
    w = other.open_writer(sid, SCHEMA)
    w.compare_and_append([(((1,), ("a",)), 0, 1)], 0, 1)
    late = PersistClient.open(client.url)
    late.shard(sid).fetch()
    late.assume_new(sid)  # (known to this client already: a no-op)
    assert late.shard(sid).state().upper == 1


# ---- small batches sorted in Python ---------------------------------------------------------


SCHEMAS = {
    "exact": Schema(
        key=pa.schema([("s", pa.string()), ("n", pa.int64()), ("b", pa.binary())]),
        val=pa.schema([("u", pa.uint64()), ("f", pa.bool_())]),
    ),
    "nullable": Schema(key=pa.schema([("s", pa.string()), ("n", pa.int64())]), val=pa.schema([])),
    "float": Schema(key=pa.schema([("x", pa.float64())]), val=pa.schema([("s", pa.string())])),
}


def _row(kind: str, rng: random.Random) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
    if kind == "exact":
        return (rng.choice("abé"), rng.randint(-3, 3), rng.choice([b"", b"\x00", b"x"])), (
            rng.randint(0, 2**64 - 1) if rng.random() < 0.2 else rng.randint(0, 2),
            rng.random() < 0.5,
        )
    if kind == "nullable":
        return (rng.choice(["a", "b", None]), rng.choice([1, 2, None])), ()
    return (rng.choice([0.0, -0.0, 1.5, float("nan")]),), (rng.choice("ab"),)


@pytest.mark.parametrize("kind", sorted(SCHEMAS))
def test_a_small_batch_is_the_batch_the_general_path_makes(kind: str, monkeypatch: pytest.MonkeyPatch) -> None:
    schema = SCHEMAS[kind]
    rng = random.Random(kind)
    config = PersistConfig()
    sorts: list[int] = []
    real_sort = batch_mod.sort_updates
    monkeypatch.setattr(batch_mod, "sort_updates", lambda t: sorts.append(t.num_rows) or real_sort(t))
    for n in [1, 2, 3, 7, 64]:
        for _ in range(20):
            updates = [(_row(kind, rng), rng.randint(3, 9), rng.choice([-2, -1, 1, 2])) for _ in range(n)]
            small = BatchBuilder(MemBlob(), "s" + "0" * 32, schema, 3, 10, config)
            small.add_updates(updates)
            sorts.clear()
            got = small.finish()
            if kind == "exact":
                assert not sorts, "sorted in Python"
            general = BatchBuilder(MemBlob(), "s" + "0" * 32, schema, 3, 10, config)
            general.add_table(rows_to_table(schema, updates))  # (a table: never the small path)
            want = general.finish()
            assert [r.rows for r in got.runs] == [r.rows for r in want.runs] == [n]
            a = decode_inline(got.runs[0].inline, schema.arrow)  # type: ignore[arg-type]
            b = decode_inline(want.runs[0].inline, schema.arrow)  # type: ignore[arg-type]
            key = [n for n in schema.arrow.names if n != "diff"]
            # the same rows in the same (key, val, ts) order; equal rows may differ only in the order of diffs
            assert list(map(str, a.select(key).to_pylist())) == list(map(str, b.select(key).to_pylist())), updates
            assert sorted(map(str, a.to_pylist())) == sorted(map(str, b.to_pylist()))


def test_a_small_batch_checks_its_rows_as_the_general_path_does() -> None:
    schema = SCHEMAS["exact"]
    b = BatchBuilder(MemBlob(), "s" + "0" * 32, schema, 3, 10, PersistConfig())
    b.add_updates([((("a", 1, b""), (1, True)), 3, 1), ((("a", "oops", b""), (1, True)), 3, 1)])
    with pytest.raises(Exception, match="expects int64"):
        b.finish()
    out = BatchBuilder(MemBlob(), "s" + "0" * 32, schema, 3, 10, PersistConfig())
    out.add_updates([((("a", 1, b""), (1, True)), 12, 1)])
    with pytest.raises(Exception, match="outside the batch bounds"):
        out.finish()


def test_a_location_opened_by_url_makes_its_own_directory_entry_durable(tmp_path: Path, monkeypatch) -> None:
    from persist.url import open_location

    events = _events(monkeypatch)
    loc = open_location(f"file://{tmp_path}/a/b")  # (a and b are new)
    assert (tmp_path / "a" / "b" / "blob").is_dir()
    assert loc.consensus.compare_and_set("k", None, b"v1") is COMMITTED
    synced = [p for op, p in events if op == "fsync"]
    # every directory that gained an entry, up to the first that existed, before the version is named
    first_link = next(i for i, (op, _) in enumerate(events) if op == "link")
    before = [p for op, p in events[:first_link] if op == "fsync"]
    for d in (tmp_path, tmp_path / "a", tmp_path / "a" / "b"):
        assert str(d) in before, f"{d} was not synced before the first version was published: {synced}"


def test_a_url_whose_directory_cannot_be_made_is_refused(tmp_path: Path) -> None:
    from persist.url import open_location

    (tmp_path / "file").write_text("x")
    with pytest.raises(InvalidUsage, match="cannot create the directory"):
        open_location(f"file://{tmp_path}/file/sub")
