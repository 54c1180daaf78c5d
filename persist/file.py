"""Local-directory backends, the embedded default: ``file://PATH``.

Layout under the location's root directory::

    blob/<key>                                   one file per blob key
    consensus/k<quoted key>/<20-digit seqno>     one file per version

Blob keys are used as relative paths, so a key may contain ``/`` (each part
becomes a directory). Consensus keys are percent-quoted into one directory
name (``k`` + ``urllib.parse.quote(key, safe="")``), so any string works as a
key and :meth:`FileConsensus.list_keys` returns the original keys.

Invariants:

- No reader ever sees a partial file. A blob ``set`` writes a temp file in
  the target's directory, fsyncs it, ``os.replace``\\s it over the target and
  fsyncs the directory. A consensus version is written in full to an unnamed
  file in the key's directory (``O_TMPFILE``; where the system or file
  system refuses that, a temp file), fsynced, then published with a link
  (``linkat`` through /proc/self/fd, or ``os.link``: create-if-absent,
  atomic), and the directory is fsynced.
- Nothing is published in a directory whose own entry may not be durable: a
  new key's directory (and a new location's ``blob`` and ``consensus``
  directories, made by :func:`open_file`) are fsynced before the first write
  in them publishes anything. Those directory fsyncs run on other threads at
  the same time as the new version's content is written and fsynced.
- Temp files are named ``.tmp-<random>`` and are never returned by any read
  or listing. A crash may leave some behind; they are garbage, nothing more
  (an unnamed file leaves nothing).
- A consensus version file is never modified once linked; the highest one
  (the head) is never deleted, so a reader that listed it can always read it
  unless a newer version was written and a truncate raced past it (readers
  re-list then).

Restrictions of the blob layout (checked, raising ``InvalidUsage``): a blob
key must be a relative path without empty, ``.`` or ``..`` parts and without
parts starting with ``.tmp-``; and since a path cannot be both a file and a
directory, the key ``a`` cannot coexist with a key ``a/b``. Persist's own keys
never do either.

Error mapping: reads and writes that definitely did not happen raise
``Determinate``; a write that may have become visible (the publishing step
failed in an unknown way, or the final directory fsync failed) raises
``Indeterminate``. Messages name the key and path.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from pathlib import Path
from urllib.parse import quote, unquote

from persist._internal.ids import random_hex
from persist._internal.threads import ThreadPool
from persist.errors import Determinate, Indeterminate, InvalidUsage
from persist.location import Blob, CaSResult, Consensus, VersionedData, next_seqno

_TMP_PREFIX = ".tmp-"
_SEQNO_RE = re.compile(r"[0-9]{20}")
_KEY_DIR_PREFIX = "k"
_NAME_MAX = 255
# How often a read re-lists after a version it listed vanished (a concurrent
# truncate). Each retry means a newer head was written meanwhile, so this is
# only reached under pathological contention.
_MAX_RELISTS = 100


def fsync_path(path: Path) -> None:
    """Make ``path`` (a file, or a directory's entries) durable."""
    fd = os.open(path, os.O_RDONLY | (getattr(os, "O_DIRECTORY", 0) if path.is_dir() else 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_dir(path: Path) -> None:
    """Make the directory entries of ``path`` durable."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _mkdirs(path: Path, touched: list[Path]) -> None:
    """Create ``path`` and its missing parents, noting in ``touched`` each parent that gained an entry.

    Tries ``mkdir`` first (one system call when only ``path`` is missing or
    it exists), walking up only when a parent is missing.
    """
    try:
        os.mkdir(path)
    except FileExistsError:
        if not path.is_dir():
            raise NotADirectoryError(f"not a directory: {str(path)!r}") from None
        return
    except FileNotFoundError:
        if path.parent == path:
            raise
        _mkdirs(path.parent, touched)
        try:
            os.mkdir(path)
        except FileExistsError:  # (a racing creator)
            if not path.is_dir():
                raise NotADirectoryError(f"not a directory: {str(path)!r}") from None
            return
    if path.parent not in touched:
        touched.append(path.parent)


def makedirs_durable(*paths: Path) -> None:
    """Create each of ``paths`` and its missing parents; then fsync each parent that gained an entry, once."""
    touched: list[Path] = []
    for path in paths:
        _mkdirs(path, touched)
    for parent in touched:
        fsync_dir(parent)


# Directory fsyncs that run alongside the calling thread's own sync (see FileConsensus):
# a few threads of their own (each fsync starts at once), made again in a forked child.
_SYNC_THREADS = 4


def _fsync_dir_soon(path: Path) -> Future[None]:
    """``fsync_dir(path)``, started on another thread (at once, inline, once the interpreter is exiting)."""
    try:
        return ThreadPool.of_process("persist-fsync", _SYNC_THREADS).submit(fsync_dir, path)
    except RuntimeError:  # (shutting down: no new threads)
        done: Future[None] = Future()
        try:
            fsync_dir(path)
            done.set_result(None)
        except OSError as e:
            done.set_exception(e)
        return done


class _PendingSync:
    """A new location's directories that gained entries (``blob``, ``consensus``): made durable once,
    alongside the first write that publishes anything in the location, and before it does."""

    def __init__(self, dirs: list[Path]) -> None:
        self._dirs = dirs
        self._lock = threading.Lock()
        self._futures: list[Future[None]] = []
        self._done = not dirs

    def start(self) -> list[Future[None]]:
        """The syncs to wait for before publishing (none once they succeeded); started if not yet."""
        if self._done:
            return []
        with self._lock:
            if self._done:
                return []
            if not self._futures or any(f.done() and f.exception() is not None for f in self._futures):
                self._futures = [_fsync_dir_soon(d) for d in self._dirs]  # (again after a failure)
            return list(self._futures)

    def settled(self, futures: list[Future[None]]) -> None:
        """Note that ``futures`` (from :meth:`start`) succeeded."""
        if futures and all(f.done() and f.exception() is None for f in futures):
            self._done = True


_SYNCED = _PendingSync([])


def _unlink_quietly(path: Path) -> None:
    with contextlib.suppress(OSError):
        path.unlink()


_O_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_O_TMP = os.O_WRONLY | os.O_CREAT | os.O_EXCL | _O_CLOEXEC


# A new version is written as an unnamed file (``O_TMPFILE``) and named with ``linkat`` through
# /proc/self/fd: no temp name is made and removed in the key's directory. Where the system or the
# file system refuses either step, a named temp file as before (from the first refusal on).
_UNNAMED_REFUSED = frozenset({errno.EOPNOTSUPP, errno.EISDIR, errno.EINVAL, errno.ENOENT, errno.EXDEV, errno.EPERM})
_unnamed_ok = hasattr(os, "O_TMPFILE") and os.path.isdir("/proc/self/fd")


class _Staged:
    """A new version's content, written and fsynced in its directory under no name (or a temp name).

    :meth:`publish` names it (atomic create-if-absent), :meth:`sync_directory`
    makes the name durable, :meth:`discard` drops whatever is left.
    """

    def __init__(self, directory: Path, data: bytes) -> None:
        global _unnamed_ok
        self._dir, self._data = directory, data
        self._fd = -1  # the unnamed file
        self._dfd = -1  # its directory
        self._tmp: Path | None = None
        try:
            if _unnamed_ok:
                self._dfd = os.open(directory, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | _O_CLOEXEC)
                try:
                    self._fd = os.open(".", os.O_TMPFILE | os.O_WRONLY | _O_CLOEXEC, 0o666, dir_fd=self._dfd)
                except OSError as e:
                    if e.errno not in _UNNAMED_REFUSED:
                        raise
                    _unnamed_ok = False
                else:
                    _write_all(self._fd, data)
                    os.fsync(self._fd)
                    return
            self._tmp = _write_temp(directory, data)
        except BaseException:
            self.discard()
            raise

    def publish(self, target: Path) -> None:
        """Name it ``target`` (in its directory), atomically; FileExistsError if that name exists."""
        global _unnamed_ok
        if self._tmp is None:
            try:
                # (dir fds given: Python calls linkat, which follows the /proc link to the open file)
                os.link(f"/proc/self/fd/{self._fd}", target.name, src_dir_fd=self._dfd, dst_dir_fd=self._dfd)
                return
            except FileExistsError:
                raise
            except OSError as e:
                if e.errno not in _UNNAMED_REFUSED:
                    raise
                _unnamed_ok = False  # (no name was made: linkat is all or nothing)
                self._tmp = _write_temp(self._dir, self._data)
        os.link(self._tmp, target)

    def sync_directory(self) -> None:
        """Make the directory's entries (the new name) durable."""
        if self._dfd >= 0:
            os.fsync(self._dfd)
        else:
            fsync_dir(self._dir)

    def discard(self) -> None:
        """Drop what is left: the temp name, the open files (idempotent; a published version stays)."""
        if self._tmp is not None:
            _unlink_quietly(self._tmp)
            self._tmp = None
        for fd in (self._fd, self._dfd):
            if fd >= 0:
                with contextlib.suppress(OSError):
                    os.close(fd)
        self._fd = self._dfd = -1


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _write_temp(directory: Path, data: bytes) -> Path:
    """Write ``data`` to a fresh fsynced temp file in ``directory``."""
    tmp = directory / f"{_TMP_PREFIX}{random_hex()}"
    try:
        fd = os.open(tmp, _O_TMP, 0o666)
        try:
            _write_all(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
    except BaseException:
        _unlink_quietly(tmp)
        raise
    return tmp


class FileBlob(Blob):
    """Blobs as files under ``root/blob``."""

    keys_nest = False  # "a" is a file or a directory, not both

    def __init__(self, root: Path, *, _made: _PendingSync | None = None) -> None:
        self._root = Path(root) / "blob"
        self._pending = _made or _SYNCED
        if _made is not None:  # (open_file made it)
            return
        try:
            makedirs_durable(self._root)
        except OSError as e:
            raise Determinate(f"cannot create blob directory {str(self._root)!r}: {e}") from e

    def _path(self, key: str) -> Path:
        parts = key.split("/")
        if any(p in ("", ".", "..") or p.startswith(_TMP_PREFIX) or "\0" in p for p in parts):
            raise InvalidUsage(
                f"invalid blob key for the file backend: {key!r}; keys must be relative "
                f"paths without empty, '.' or '..' parts or parts starting with "
                f"{_TMP_PREFIX!r}"
            )
        return self._root.joinpath(*parts)

    def get(self, key: str) -> bytes | None:
        path = self._path(key)
        try:
            with open(path, "rb") as f:
                return f.read()
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
            return None
        except OSError as e:
            raise Determinate(f"file blob get {key!r} ({str(path)!r}) failed: {e}") from e

    def set(self, key: str, value: bytes) -> None:
        path = self._path(key)
        pending = self._pending.start()  # (a new location's directories: durable before the rename)
        try:
            self._set(key, value, path, pending)
        finally:
            for f in pending:
                f.exception()  # (waited for: nothing of this call runs after it returns)

    def _set(self, key: str, value: bytes, path: Path, pending: list[Future[None]]) -> None:
        try:
            if not path.parent.is_dir():  # (one stat when it is there, as it mostly is)
                makedirs_durable(path.parent)
        except (FileExistsError, NotADirectoryError) as e:
            raise InvalidUsage(
                f"cannot set blob {key!r}: a parent of {str(path)!r} is a file; the file "
                f"backend cannot store both a key and keys nested under it"
            ) from e
        except OSError as e:
            raise Determinate(
                f"file blob set {key!r}: cannot create {str(path.parent)!r}: {e}"
            ) from e
        try:
            tmp = _write_temp(path.parent, value)
        except OSError as e:
            raise Determinate(
                f"file blob set {key!r}: writing a temp file in {str(path.parent)!r} failed: {e}"
            ) from e
        try:
            for f in pending:
                f.result()
        except OSError as e:
            _unlink_quietly(tmp)
            raise Determinate(f"file blob set {key!r}: fsync of the location's directories failed: {e}") from e
        self._pending.settled(pending)
        try:
            os.replace(tmp, path)
        except IsADirectoryError as e:
            _unlink_quietly(tmp)
            raise InvalidUsage(
                f"cannot set blob {key!r}: {str(path)!r} is a directory holding nested keys; "
                f"the file backend cannot store both a key and keys nested under it"
            ) from e
        except OSError as e:
            # rename(2) is atomic: when it fails nothing was replaced.
            _unlink_quietly(tmp)
            raise Determinate(f"file blob set {key!r}: replacing {str(path)!r} failed: {e}") from e
        try:
            fsync_dir(path.parent)
        except OSError as e:
            raise Indeterminate(
                f"file blob set {key!r}: fsync of {str(path.parent)!r} failed: {e}"
            ) from e

    def delete(self, key: str) -> None:
        path = self._path(key)
        try:
            path.unlink()
        except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
            return
        except OSError as e:
            raise Determinate(f"file blob delete {key!r} ({str(path)!r}) failed: {e}") from e
        try:
            fsync_dir(path.parent)
        except OSError as e:
            raise Indeterminate(
                f"file blob delete {key!r}: fsync of {str(path.parent)!r} failed: {e}"
            ) from e

    def storage_now_ms(self) -> int:
        """The file system's clock: the modification time of a probe file created (and deleted) now."""
        probe = self._root / f"{_TMP_PREFIX}clock-{random_hex()}"
        try:
            fd = os.open(probe, _O_TMP, 0o666)
            try:
                return os.fstat(fd).st_mtime_ns // 1_000_000
            finally:
                os.close(fd)
                _unlink_quietly(probe)
        except OSError as e:
            raise Determinate(f"file blob clock probe in {str(self._root)!r} failed: {e}") from e

    def list_keys(self, prefix: str) -> Iterator[str]:
        dir_part, sep, _ = prefix.rpartition("/")
        start = self._root
        if sep:
            parts = dir_part.split("/")
            if any(p in ("", ".", "..") for p in parts):
                return iter([])  # no valid key starts like this
            start = self._root.joinpath(*parts)
        if not start.is_dir():
            return iter([])

        def fail(e: OSError) -> None:
            raise e

        keys: list[str] = []
        try:
            for dirpath, _dirnames, filenames in os.walk(start, onerror=fail):
                rel_dir = Path(dirpath).relative_to(self._root).as_posix()
                for name in filenames:
                    if name.startswith(_TMP_PREFIX):
                        continue
                    key = name if rel_dir == "." else f"{rel_dir}/{name}"
                    if key.startswith(prefix):
                        keys.append(key)
        except OSError as e:
            raise Determinate(
                f"file blob list_keys {prefix!r} under {str(start)!r} failed: {e}"
            ) from e
        return iter(keys)


def _key_dir_name(key: str) -> str:
    return _KEY_DIR_PREFIX + quote(key, safe="")


def _key_from_dir_name(name: str) -> str | None:
    if not name.startswith(_KEY_DIR_PREFIX):
        return None
    return unquote(name[len(_KEY_DIR_PREFIX) :])


class FileConsensus(Consensus):
    """A directory of version files per key under ``root/consensus``.

    ``compare_and_set`` checks that the head is ``expected``, then publishes
    version ``expected + 1`` with ``os.link``, which fails if that version
    already exists: the link is the arbiter among racing writers (threads or
    processes), so exactly one of them commits.
    """

    lists_keys = True

    def __init__(self, root: Path, *, _made: _PendingSync | None = None) -> None:
        self._root = Path(root) / "consensus"
        self._pending = _made or _SYNCED
        if _made is not None:  # (open_file made it)
            return
        try:
            makedirs_durable(self._root)
        except OSError as e:
            raise Determinate(f"cannot create consensus directory {str(self._root)!r}: {e}") from e

    def _dir(self, key: str) -> Path:
        name = _key_dir_name(key)
        if len(name.encode()) > _NAME_MAX:
            raise InvalidUsage(
                f"consensus key too long for the file backend ({len(name.encode())} bytes "
                f"once quoted, at most {_NAME_MAX}): {key!r}"
            )
        return self._root / name

    @staticmethod
    def _seqnos(directory: Path) -> list[int]:
        """The seqnos present in ``directory``, ascending ([] if it is missing)."""
        try:
            names = os.listdir(directory)
        except FileNotFoundError:
            return []
        return sorted(int(n) for n in names if _SEQNO_RE.fullmatch(n))

    @staticmethod
    def _version_path(directory: Path, seqno: int) -> Path:
        return directory / f"{seqno:020d}"

    def head(self, key: str, hint: int | None = None) -> VersionedData | None:
        d = self._dir(key)
        try:
            for _ in range(_MAX_RELISTS):
                seqnos = self._seqnos(d)
                if not seqnos:
                    return None
                try:
                    data = self._version_path(d, seqnos[-1]).read_bytes()
                except FileNotFoundError:
                    continue  # a newer head was written and a truncate passed this one
                return VersionedData(seqnos[-1], data)
        except OSError as e:
            raise Determinate(f"file consensus head {key!r} ({str(d)!r}) failed: {e}") from e
        raise Determinate(
            f"file consensus head {key!r}: versions kept vanishing while reading {str(d)!r}"
        )

    def compare_and_set(self, key: str, expected: int | None, data: bytes) -> CaSResult:
        return self._compare_and_set(key, expected, data, None)

    def compare_and_set_after(
        self, key: str, expected: int | None, data: bytes, ready: Callable[[], None]
    ) -> CaSResult:
        # The temp file is written and synced first; ``ready`` runs before the link publishes it.
        return self._compare_and_set(key, expected, data, ready)

    def _compare_and_set(
        self, key: str, expected: int | None, data: bytes, ready: Callable[[], None] | None
    ) -> CaSResult:
        d = self._dir(key)
        target = self._version_path(d, next_seqno(expected))
        pending = self._pending.start()  # (a new location's directories)
        syncs: list[Future[None]] = list(pending)  # directories' new entries, made durable meanwhile
        try:
            result = self._publish(key, expected, data, ready, d, target, syncs)
            self._pending.settled(pending)
            return result
        finally:
            for f in syncs:
                f.exception()  # (waited for: nothing of this call runs after it returns)

    def _publish(
        self,
        key: str,
        expected: int | None,
        data: bytes,
        ready: Callable[[], None] | None,
        d: Path,
        target: Path,
        syncs: list[Future[None]],
    ) -> CaSResult:
        try:
            if expected is None:
                # A new key: its directory is made here, and is empty when this call made it
                # (else listed). Its entry is made durable alongside the temp file's sync below.
                touched: list[Path] = []
                _mkdirs(d, touched)
                seqnos = [] if d.parent in touched else self._seqnos(d)
                if not seqnos and d.parent not in touched:
                    touched.append(d.parent)  # (made by a call that failed, or is racing us: durable first)
                syncs.extend(_fsync_dir_soon(parent) for parent in touched)
            else:
                seqnos = self._seqnos(d)  # (a missing directory: no versions, a mismatch below)
        except OSError as e:
            raise Determinate(
                f"file consensus compare_and_set {key!r} ({str(d)!r}) failed: {e}"
            ) from e
        # The head is never deleted, so this check is exact at the time of the
        # listing; a writer that commits after it makes our link below fail.
        if (seqnos[-1] if seqnos else None) != expected:
            return CaSResult.MISMATCH
        try:
            staged = _Staged(d, data)
        except OSError as e:
            raise Determinate(
                f"file consensus compare_and_set {key!r}: writing the new version in {str(d)!r} "
                f"failed: {e}"
            ) from e
        try:
            try:
                for f in syncs:
                    f.result()  # (the new directory's entry is durable before the version is published)
            except OSError as e:
                raise Determinate(f"file consensus compare_and_set {key!r} ({str(d)!r}) failed: {e}") from e
            if ready is not None:
                ready()
                # Listed again: the check above stays exact however long ``ready`` took
                # (see the SUBTLE note on Consensus about truncation).
                try:
                    seqnos = self._seqnos(d)
                except OSError as e:
                    raise Determinate(f"file consensus compare_and_set {key!r} ({str(d)!r}) failed: {e}") from e
                if (seqnos[-1] if seqnos else None) != expected:
                    return CaSResult.MISMATCH
            try:
                staged.publish(target)
            except FileExistsError:
                return CaSResult.MISMATCH
            except OSError as e:
                raise Indeterminate(
                    f"file consensus compare_and_set {key!r}: linking {str(target)!r} failed: {e}"
                ) from e
            try:
                staged.sync_directory()
            except OSError as e:
                raise Indeterminate(
                    f"file consensus compare_and_set {key!r}: fsync of {str(d)!r} failed: {e}"
                ) from e
            return CaSResult.COMMITTED
        finally:
            staged.discard()

    def scan(self, key: str, from_seqno: int, limit: int) -> list[VersionedData]:
        if limit <= 0:
            return []
        d = self._dir(key)
        try:
            for _ in range(_MAX_RELISTS):
                wanted = [s for s in self._seqnos(d) if s >= from_seqno][:limit]
                out: list[VersionedData] = []
                try:
                    for s in wanted:
                        out.append(VersionedData(s, self._version_path(d, s).read_bytes()))
                except FileNotFoundError:
                    continue  # a concurrent truncate: list again for a consistent answer
                return out
        except OSError as e:
            raise Determinate(f"file consensus scan {key!r} ({str(d)!r}) failed: {e}") from e
        raise Determinate(
            f"file consensus scan {key!r}: versions kept vanishing while reading {str(d)!r}"
        )

    def truncate(self, key: str, seqno: int) -> int:
        d = self._dir(key)
        try:
            seqnos = self._seqnos(d)
        except OSError as e:
            raise Determinate(f"file consensus truncate {key!r} ({str(d)!r}) failed: {e}") from e
        if not seqnos or seqno > seqnos[-1]:
            head = seqnos[-1] if seqnos else None
            raise InvalidUsage(
                f"cannot truncate {key!r} to seqno {seqno}: it would delete the latest "
                f"version (head seqno {head}); truncate to at most the head seqno"
            )
        deleted = 0
        try:
            for s in seqnos:
                if s >= seqno:
                    break
                try:
                    self._version_path(d, s).unlink()
                    deleted += 1
                except FileNotFoundError:
                    pass  # a concurrent truncate got it first
            if deleted:
                fsync_dir(d)
        except OSError as e:
            raise Indeterminate(
                f"file consensus truncate {key!r} to {seqno} failed after deleting {deleted} "
                f"versions in {str(d)!r}: {e}"
            ) from e
        return deleted

    def list_keys(self) -> Iterator[str]:
        try:
            names = sorted(os.listdir(self._root))
            keys = []
            for name in names:
                key = _key_from_dir_name(name)
                if key is not None and self._seqnos(self._root / name):
                    keys.append(key)
        except OSError as e:
            raise Determinate(
                f"file consensus list_keys under {str(self._root)!r} failed: {e}"
            ) from e
        return iter(keys)


def open_file(path: Path | str) -> tuple[FileBlob, FileConsensus]:
    """Blob and consensus backends rooted at the directory ``path`` (created if missing)."""
    root = Path(path)
    touched: list[Path] = []
    try:
        _mkdirs(root / "blob", touched)
        _mkdirs(root / "consensus", touched)
    except OSError as e:
        raise Determinate(f"cannot create the store's directories under {str(root)!r}: {e}") from e
    # (the new entries are made durable by the first write, alongside its own syncs, before it publishes)
    pending = _PendingSync(touched)
    return FileBlob(root, _made=pending), FileConsensus(root, _made=pending)
