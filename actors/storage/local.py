"""Filesystem store: one file per blob, one append-only file per log.

Layout under ``root`` (directories 0700, files 0600)::

    blobs/<key>    whole blob; put = temp file + fsync + os.replace + fsync(dir)
    logs/<key>     framed records, appended with O_APPEND + fsync per append

Log frame: a 12-byte header ``<III`` = (record length, CRC32 of the record, CRC32 of the
first 8 header bytes), then the record. The header CRC means a damaged length field is
detected as corruption instead of being mistaken for a torn tail. A torn tail — a short
header, a short body, a bad CRC on the very last record, or zero-filled bytes at the end —
is dropped by :meth:`LocalStore.read_log` and truncated away before the first append of a
process, so later records never land behind garbage.

Because keys map to paths, a key cannot be both a blob and a "directory" of other blobs in
this store (``a`` and ``a/b``); that raises a clear :class:`StoreError`. Logs and blobs live
in separate trees, so blob ``a`` and log ``a/b`` coexist. Temp files contain ``~``, which is
not a key character, so they never show up in :meth:`LocalStore.list`.
"""

from __future__ import annotations

import builtins
import errno
import os
import struct
import threading
import uuid
import zlib
from collections import OrderedDict
from collections.abc import Iterator
from contextlib import suppress
from pathlib import Path
from types import TracebackType

from actors import constants
from actors.storage.base import StoreError, validate_key, validate_prefix

_HEADER = struct.Struct("<III")  # length, crc32(record), crc32(length+crc as packed)
_MAX_RECORD = 0xFFFFFFFF
_DIR_MODE = 0o700
_FILE_MODE = 0o600


def _frame(record: bytes) -> bytes:
    head = struct.pack("<II", len(record), zlib.crc32(record))
    return head + struct.pack("<I", zlib.crc32(head)) + record


def parse_log(buf: bytes, key: str) -> tuple[list[bytes], int]:
    """Decode framed records; return (records, end offset of the last good record).

    Stops silently at a torn tail; raises :class:`StoreError` on damage before the tail.
    """
    view = memoryview(buf)
    records: list[bytes] = []
    off, size = 0, len(buf)
    while size - off >= _HEADER.size:
        length, crc, head_crc = _HEADER.unpack_from(buf, off)
        if zlib.crc32(view[off : off + 8]) != head_crc:
            if buf.count(0, off) == size - off:  # zero-filled tail (crash after size update)
                break
            raise StoreError(f"log {key!r} is corrupt: bad record header at offset {off}")
        end = off + _HEADER.size + length
        if end > size:  # torn body
            break
        body = view[off + _HEADER.size : end]
        if zlib.crc32(body) != crc:
            if end == size:  # last record only partly persisted
                break
            raise StoreError(f"log {key!r} is corrupt: record checksum mismatch at offset {off}")
        records.append(bytes(body))
        off = end
    return records, off


def _write_all(fd: int, data: bytes | bytearray) -> None:
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]


def _read_all(fd: int) -> bytes:
    size = os.fstat(fd).st_size
    chunks, off = [], 0
    while off < size:
        chunk = os.pread(fd, min(size - off, 1 << 30), off)
        if not chunk:
            break
        chunks.append(chunk)
        off += len(chunk)
    return b"".join(chunks)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _mkdir(path: Path) -> bool:
    """Create one directory with mode 0700; return False if it already existed."""
    try:
        os.mkdir(path, _DIR_MODE)
    except FileExistsError:
        return False
    os.chmod(path, _DIR_MODE)  # in case the umask stripped owner bits
    return True


def _error(op: str, key: str, exc: OSError) -> StoreError:
    hint = ""
    if exc.errno in (errno.EISDIR, errno.ENOTDIR, errno.EEXIST):
        hint = " (in the local store a key cannot also be a prefix directory of other keys)"
    return StoreError(f"local store: cannot {op} {key!r}: {exc.strerror or exc}{hint}")


class _Log:
    """An open append handle. ``fd == -1`` means not opened yet; ``closed`` means retired."""

    __slots__ = ("closed", "fd", "lock", "size")

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.fd = -1
        self.size = 0
        self.closed = False

    def shut(self) -> None:  # caller holds self.lock
        self.closed = True
        self.reset()

    def reset(self) -> None:  # caller holds self.lock
        if self.fd >= 0:
            with suppress(OSError):
                os.close(self.fd)
        self.fd = -1


class LocalStore:
    """:class:`~actors.storage.base.Store` on a local (or mounted) filesystem. Thread-safe."""

    def __init__(self, root: Path | str, *, max_open_logs: int = 64) -> None:
        self.root = Path(root)
        self._blobs = self.root / "blobs"
        self._logs = self.root / "logs"
        self._max_open_logs = max_open_logs
        # Lock order: self._lock, then a _Log.lock — never the other way round.
        self._lock = threading.Lock()
        self._handles: OrderedDict[str, _Log] = OrderedDict()
        self._closed = False
        try:
            if not self.root.is_dir():
                self.root.parent.mkdir(parents=True, exist_ok=True)
                if _mkdir(self.root):
                    _fsync_dir(self.root.parent)
            for tree in (self._blobs, self._logs):
                if _mkdir(tree):
                    _fsync_dir(self.root)
        except OSError as exc:
            raise StoreError(f"local store: cannot create {str(self.root)!r}: {exc}") from exc

    def __repr__(self) -> str:
        return f"LocalStore({str(self.root)!r})"

    def __enter__(self) -> LocalStore:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # -- helpers -------------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise StoreError("local store is closed")

    def _ensure_dir(self, tree: Path, directory: Path) -> None:
        """Create ``directory`` (inside ``tree``) and missing parents, each fsynced into its parent."""
        if directory.is_dir():
            return
        missing = []
        while directory != tree and not directory.exists():
            missing.append(directory)
            directory = directory.parent
        for path in reversed(missing):
            if _mkdir(path):
                _fsync_dir(path.parent)

    def _prune(self, tree: Path, directory: Path) -> None:
        """Remove ``directory`` and its parents (below ``tree``) while they are empty."""
        while directory != tree and tree in directory.parents:
            try:
                directory.rmdir()
            except OSError:
                return
            directory = directory.parent

    def _unlink(self, tree: Path, key: str) -> bool:
        path = tree / key
        try:
            path.unlink()
        except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
            return False
        _fsync_dir(path.parent)
        self._prune(tree, path.parent)
        return True

    def _drop_log(self, key: str) -> bool:
        """Retire any append handle and unlink the log file. Caller holds ``self._lock``."""
        log = self._handles.pop(key, None)
        if log is not None:
            with log.lock:
                log.shut()
        return self._unlink(self._logs, key)

    def _walk(self, tree: Path, prefix: str) -> Iterator[str]:
        head = prefix.rpartition("/")[0]
        base = tree / head if head else tree

        def fail(exc: OSError) -> None:
            if not isinstance(exc, (FileNotFoundError, NotADirectoryError)):
                raise exc

        for dirpath, dirnames, filenames in os.walk(base, onerror=fail):
            rel = os.path.relpath(dirpath, tree).replace(os.sep, "/")
            stem = "" if rel == "." else rel + "/"
            dirnames[:] = [
                d for d in dirnames if _is_key(stem + d) and (stem + d + "/").startswith(prefix)
            ]
            for name in filenames:
                key = stem + name
                if key.startswith(prefix) and _is_key(key):
                    yield key

    # -- blobs ---------------------------------------------------------------------------

    def get(self, key: str) -> bytes | None:
        self._check_open()
        path = self._blobs / validate_key(key)
        try:
            with open(path, "rb") as f:
                return f.read()
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
            return None
        except OSError as exc:
            raise _error("read", key, exc) from exc

    def put(self, key: str, data: bytes | bytearray) -> None:
        self._check_open()
        path = self._blobs / validate_key(key)
        tmp = path.parent / f".~tmp-{uuid.uuid4().hex}"  # '~' is not a key character
        for attempt in range(constants.LOCAL_STORE_RETRIES):
            try:
                self._ensure_dir(self._blobs, path.parent)
                fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, _FILE_MODE)
                break
            except FileNotFoundError as exc:
                if attempt == constants.LOCAL_STORE_RETRIES - 1:
                    raise _error("write", key, exc) from exc
            except OSError as exc:
                raise _error("write", key, exc) from exc
        try:
            try:
                _write_all(fd, data)
                os.fsync(fd)
            finally:
                os.close(fd)
            os.replace(tmp, path)
            _fsync_dir(path.parent)
        except BaseException as exc:
            with suppress(OSError):
                os.unlink(tmp)
            if isinstance(exc, OSError):
                raise _error("write", key, exc) from exc
            raise

    def delete(self, key: str) -> None:
        self._check_open()
        validate_key(key)
        try:
            self._unlink(self._blobs, key)
            with self._lock:
                self._drop_log(key)
        except OSError as exc:
            raise _error("delete", key, exc) from exc

    def delete_prefix(self, prefix: str) -> int:
        """Remove matching blobs and logs; returns the number of objects (files) removed."""
        self._check_open()
        validate_prefix(prefix)
        removed = 0
        try:
            for key in list(self._walk(self._blobs, prefix)):
                removed += self._unlink(self._blobs, key)
            with self._lock:
                for key in list(self._walk(self._logs, prefix)):
                    removed += self._drop_log(key)
        except OSError as exc:
            raise _error("delete prefix", prefix, exc) from exc
        return removed

    def list(self, prefix: str) -> list[str]:
        self._check_open()
        validate_prefix(prefix)
        try:
            return sorted(
                set(self._walk(self._blobs, prefix)) | set(self._walk(self._logs, prefix))
            )
        except OSError as exc:
            raise _error("list", prefix, exc) from exc

    # -- logs ----------------------------------------------------------------------------

    def _handle(self, key: str) -> _Log:
        with self._lock:
            self._check_open()
            log = self._handles.get(key)
            if log is None:
                log = self._handles[key] = _Log()
                while len(self._handles) > self._max_open_logs:
                    _, old = self._handles.popitem(last=False)
                    with old.lock:
                        old.shut()
            else:
                self._handles.move_to_end(key)
            return log

    def _open_log(self, key: str, log: _Log) -> None:
        """Open ``log`` for appending, truncating a torn tail. Caller holds ``log.lock``."""
        path = self._logs / key
        for attempt in range(constants.LOCAL_STORE_RETRIES):
            try:
                self._ensure_dir(self._logs, path.parent)
                fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, _FILE_MODE)
                break
            except FileNotFoundError:
                if attempt == constants.LOCAL_STORE_RETRIES - 1:
                    raise
        try:
            _fsync_dir(path.parent)
            data = _read_all(fd)
            _, end = parse_log(data, key)
            if end < len(data):
                os.ftruncate(fd, end)
                os.fsync(fd)
        except BaseException:
            os.close(fd)
            raise
        log.fd, log.size = fd, end

    def append(self, key: str, record: bytes) -> None:
        self._check_open()
        validate_key(key)
        if len(record) > _MAX_RECORD:
            raise StoreError(f"log record for {key!r} is too large ({len(record)} bytes)")
        frame = _frame(record)
        while True:
            log = self._handle(key)
            with log.lock:
                if log.closed:  # evicted or deleted meanwhile: take a fresh handle
                    continue
                try:
                    if log.fd < 0:
                        self._open_log(key, log)
                    _write_all(log.fd, frame)
                    os.fsync(log.fd)
                except OSError as exc:
                    # Undo a partial frame so later appends never follow garbage; if even that
                    # fails, drop the handle so the next append rescans and truncates the tail.
                    # After a failed fsync the page-cache state is unknown, so never reuse the fd.
                    if log.fd >= 0:
                        with suppress(OSError):
                            os.ftruncate(log.fd, log.size)
                        log.reset()
                    raise _error("append to", key, exc) from exc
                log.size += len(frame)
                return

    def read_log(self, key: str) -> builtins.list[bytes]:
        self._check_open()
        path = self._logs / validate_key(key)
        try:
            with open(path, "rb") as f:
                data = f.read()
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
            return []
        except OSError as exc:
            raise _error("read log", key, exc) from exc
        return parse_log(data, key)[0]

    def close(self) -> None:
        with self._lock:
            self._closed = True
            handles, self._handles = list(self._handles.values()), OrderedDict()
            for log in handles:
                with log.lock:
                    log.shut()


def _is_key(key: str) -> bool:
    try:
        validate_key(key)
    except ValueError:
        return False
    return True
