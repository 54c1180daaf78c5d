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
  fsyncs the directory. A consensus version is written in full to a temp file,
  fsynced, then published with ``os.link`` (create-if-absent, atomic), and the
  directory is fsynced.
- Temp files are named ``.tmp-<random>`` and are never returned by any read
  or listing. A crash may leave some behind; they are garbage, nothing more.
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
import os
import re
import uuid
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote, unquote

from persist.errors import Determinate, Indeterminate, InvalidUsage
from persist.location import Blob, CaSResult, Consensus, VersionedData, next_seqno

_TMP_PREFIX = ".tmp-"
_SEQNO_RE = re.compile(r"^[0-9]{20}$")
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


def _makedirs_durable(*paths: Path) -> None:
    """Create each of ``paths`` and its missing parents; then fsync each parent that gained an entry, once."""
    touched: list[Path] = []
    for path in paths:
        missing: list[Path] = []
        p = path
        while not p.exists():
            missing.append(p)
            if p.parent == p:
                break
            p = p.parent
        for d in reversed(missing):
            try:
                d.mkdir()
            except FileExistsError:
                if not d.is_dir():
                    raise
                continue
            if d.parent not in touched:
                touched.append(d.parent)
        if not path.is_dir():
            raise NotADirectoryError(f"not a directory: {str(path)!r}")
    for parent in touched:
        fsync_dir(parent)


def _unlink_quietly(path: Path) -> None:
    with contextlib.suppress(OSError):
        path.unlink()


def _write_temp(directory: Path, data: bytes) -> Path:
    """Write ``data`` to a fresh fsynced temp file in ``directory``."""
    tmp = directory / f"{_TMP_PREFIX}{uuid.uuid4().hex}"
    try:
        with open(tmp, "xb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
    except BaseException:
        _unlink_quietly(tmp)
        raise
    return tmp


class FileBlob(Blob):
    """Blobs as files under ``root/blob``."""

    keys_nest = False  # "a" is a file or a directory, not both

    def __init__(self, root: Path) -> None:
        self._root = Path(root) / "blob"
        try:
            _makedirs_durable(self._root)
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
        try:
            _makedirs_durable(path.parent)
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

    def __init__(self, root: Path) -> None:
        self._root = Path(root) / "consensus"
        try:
            _makedirs_durable(self._root)
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
        return sorted(int(n) for n in names if _SEQNO_RE.match(n))

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
        d = self._dir(key)
        target = self._version_path(d, next_seqno(expected))
        try:
            _makedirs_durable(d)
            seqnos = self._seqnos(d)
        except OSError as e:
            raise Determinate(
                f"file consensus compare_and_set {key!r} ({str(d)!r}) failed: {e}"
            ) from e
        # The head is never deleted, so this check is exact at the time of the
        # listing; a writer that commits after it makes our link below fail.
        if (seqnos[-1] if seqnos else None) != expected:
            return CaSResult.MISMATCH
        try:
            tmp = _write_temp(d, data)
        except OSError as e:
            raise Determinate(
                f"file consensus compare_and_set {key!r}: writing a temp file in {str(d)!r} "
                f"failed: {e}"
            ) from e
        try:
            os.link(tmp, target)
        except FileExistsError:
            return CaSResult.MISMATCH
        except OSError as e:
            raise Indeterminate(
                f"file consensus compare_and_set {key!r}: linking {str(target)!r} failed: {e}"
            ) from e
        finally:
            _unlink_quietly(tmp)
        try:
            fsync_dir(d)
        except OSError as e:
            raise Indeterminate(
                f"file consensus compare_and_set {key!r}: fsync of {str(d)!r} failed: {e}"
            ) from e
        return CaSResult.COMMITTED

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
    try:
        _makedirs_durable(root / "blob", root / "consensus")  # (a new location: two fsyncs, not three)
    except OSError as e:
        raise Determinate(f"cannot create the store's directories under {str(root)!r}: {e}") from e
    return FileBlob(root), FileConsensus(root)
