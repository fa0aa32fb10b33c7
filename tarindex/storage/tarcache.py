"""Decompressed copies of zstd/xz/bzip2/lz4-compressed tars, made once per machine (FORMAT.md §11).

Such a tar has no seek points, so it is read through a plain copy of the tar inside, kept in
the **tar cache**: a :class:`~tarindex.storage.cache.DirCache` (atomic entries, an LRU bound
in bytes kept on disk, links never followed; docs/REMOTE.md, "Cache") at
``$TARINDEX_TAR_CACHE``, else ``$XDG_CACHE_HOME/tarindex/tars``, else
``~/.cache/tarindex/tars``, holding at most ``$TARINDEX_TAR_CACHE_BYTES`` bytes (default
64 GiB; least recently used copies go first).

- **Keyed by the compressed file.** A local file's key is its real path, format, size,
  modification and change times (ns) and inode; a remote one's its URL, format, size and version
  (ETag / Last-Modified / version id, from ``HEAD``). A changed file gets a new entry, so a
  stale copy is never served; the index's checks then compare the new copy with the index.
- **Once per machine.** A miss takes the entry's ``flock`` (:meth:`DirCache.lock`): DataLoader
  workers and ranks opening the same shard wait for the first one's copy, then map it. The
  copy is decompressed front to back into a temp file of the cache and renamed into place
  (:func:`~tarindex.storage.unpack.unpack_checked` checks every stream); a process killed
  mid-way leaves only a temp file, which the cache deletes later.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import partial
from typing import IO

from .bytesource import ByteSource, PreadSource, open_regular
from .cache import DirCache
from .cachetmp import NO_ROOM
from .remote import RemoteOptions
from .remote.fetch import download
from .remote.fetch import stat as remote_stat
from .remote.options import cache_key
from .unpack import unpack_checked

__all__ = [
    "copy_fix",
    "drop_copy",
    "tar_cache",
    "tar_cache_dir",
    "tar_cache_limit",
    "unpacked_copy",
    "unpacking",
]

_NAME = "tar"
_DEFAULT_LIMIT = 64 << 30


def tar_cache_dir() -> str:
    """The directory of decompressed copies (see the module docs for the variables read)."""
    d = os.environ.get("TARINDEX_TAR_CACHE")
    if d:
        return os.path.abspath(d)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(os.path.abspath(base), "tarindex", "tars")


def tar_cache_limit() -> int:
    """Most bytes the tar cache holds: ``$TARINDEX_TAR_CACHE_BYTES``, default 64 GiB.

    Raises:
        ValueError: The variable is set but not a non-negative integer.
    """
    v = os.environ.get("TARINDEX_TAR_CACHE_BYTES", "")
    if not v:
        return _DEFAULT_LIMIT
    try:
        n = int(v)
    except ValueError:
        n = -1
    if n < 0:
        raise ValueError(
            f"TARINDEX_TAR_CACHE_BYTES={v!r}: expected a number of bytes (a non-negative integer)"
        )
    return n


def tar_cache() -> DirCache:
    """The tar cache (created if missing).

    Raises:
        OSError: Its directory cannot be created.
        ValueError: As :func:`tar_cache_limit`.
    """
    return DirCache(tar_cache_dir(), tar_cache_limit())


def _key(path: str, fmt: str, opts: RemoteOptions | None) -> str:
    """The entry key of the compressed file ``path`` (module docs, "Keyed by")."""
    if opts is not None:
        pin = remote_stat(path, opts)
        return cache_key("unpacked", fmt, path, pin.size, pin.tag())
    st = os.stat(path)
    # ctime too: a rewrite in place with its mtime set back (touch -r, cp -p, rsync -t) still
    # gets a new copy (no one can set ctime), which the members' crc32s then check
    return cache_key(
        "unpacked", fmt, os.path.realpath(path), st.st_size, st.st_mtime_ns, st.st_ino,
        st.st_ctime_ns,
    )


def _too_big(path: str, cache: DirCache) -> OSError:
    return OSError(
        errno.ENOSPC,
        f"{path}: its decompressed copy could not be stored in the tar cache {cache.root} "
        f"(larger than its limit of {cache.limit} bytes, or the disk is full); raise "
        f"TARINDEX_TAR_CACHE_BYTES, point TARINDEX_TAR_CACHE at a larger disk, or decompress "
        f"the shard yourself (FORMAT.md §11)",
    )


class _Bounded:
    """A file that refuses to grow past ``limit`` bytes (the tar cache's).

    So a decompression bomb fills neither the disk nor the cache before it is refused; a disk
    full mid-copy is the same error (naming the shard, the cache and the fix).
    """

    def __init__(self, f: IO[bytes], limit: int, error: Callable[[], OSError]) -> None:
        self.f, self.left, self.error = f, limit, error

    def write(self, data: bytes) -> int:
        self.left -= len(data)
        if self.left < 0:
            raise self.error()
        try:
            return self.f.write(data)
        except OSError as e:  # the disk (or the process's file size limit) full mid-copy
            if e.errno in NO_ROOM:
                raise self.error() from e
            raise


def drop_copy(copy: str) -> None:
    """Delete the decompressed copy ``copy`` (a path :func:`unpacked_copy` returned).

    A link there is removed, never followed; a reader that has the copy open keeps reading
    the old file (it lives until its last descriptor closes); the next open of its shard
    decompresses it again. Missing: nothing.
    """
    root = os.path.dirname(os.path.dirname(os.path.dirname(copy)))
    try:
        DirCache(root, tar_cache_limit()).discard_path(copy)
    except (OSError, ValueError):
        pass


def copy_fix(path: str, copy: str) -> str:
    """The fix for a decompressed copy ``copy`` of ``path`` found to differ from its index."""
    return (
        f"its decompressed copy {copy} in the tar cache was read and is now deleted (by hand: "
        f"rm {copy}); opening the shard again decompresses {path} anew, and if the error "
        f"repeats the compressed file changed since it was indexed: tarindex index --force {path}"
    )


def unpacked_copy(
    path: str,
    fmt: str,
    size: int,
    opts: RemoteOptions | None = None,
    check: Callable[[ByteSource], None] | None = None,
) -> tuple[int, int, str]:
    """A read-only descriptor of the decompressed copy of ``path``, made if missing; its size and path.

    Args:
        path: The compressed tar: a local path, or a URL when ``opts`` is given.
        fmt: Its compression (``"zstd"``, ``"xz"``, ``"bzip2"``, ``"lz4"``).
        size: The decompressed size the index expects (bytes); an entry of another size is
            dropped and made again.
        opts: Remote options for a URL (``HEAD`` for the key; the whole file is downloaded
            once into the cache's temp directory before decompressing). ``None``: local.
        check: Called with the compressed bytes before decompressing them on a miss (the
            index's fingerprint check); raises to refuse them.

    Returns:
        ``(fd, size, copy)``: a descriptor the caller owns and closes, the copy's size, and its
        path (for messages and :func:`drop_copy`).

    Raises:
        TruncatedError, ChecksumError, FormatError: Invalid compressed data (as
            :func:`~tarindex.storage.unpack.unpack_checked`), naming ``path``.
        OSError: The copy cannot be stored (``ENOSPC``, naming the cache and the fix), or
            ``path`` cannot be read.
        RemoteError: A remote file cannot be fetched.
    """
    try:
        cache = tar_cache()
    except OSError as e:
        raise OSError(
            e.errno,
            f"{path}: a {fmt}-compressed tar is read through a decompressed copy, but the tar "
            f"cache {tar_cache_dir()} cannot be made ({e.strerror or e}); point "
            f"TARINDEX_TAR_CACHE at a writable directory, or decompress the shard yourself "
            f"(FORMAT.md §11)",
        ) from None
    key = _key(path, fmt, opts)
    copy = cache.path(key, _NAME)
    fd = _open(cache, key, size)
    if fd is not None:
        return fd, size, copy
    lk = cache.lock(key, _NAME)
    try:
        fd = _open(cache, key, size)  # made by another process while this one waited
        if fd is not None:
            return fd, size, copy
        tmp = cache.temp_path()
        held = cache.hold_temp(tmp)  # never cleaned up while this process works on it
        too_big = partial(_too_big, path, cache)
        try:
            with _compressed(path, cache, opts) as src:
                if check is not None:
                    check(src)
                with open(tmp, "wb") as out:
                    unpack_checked(src, _Bounded(out, cache.limit, too_big), fmt)  # type: ignore[arg-type]
            if not cache.put_file(key, _NAME, tmp):
                raise _too_big(path, cache)
        finally:
            cache.discard_path(tmp)
            os.close(held)
        fd = _open(cache, key, None)
        if fd is None:  # evicted at once: a cache too small for two copies
            raise _too_big(path, cache)
        return fd, os.fstat(fd).st_size, copy
    finally:
        if lk is not None:  # (a blocking lock is always taken)
            cache.unlock(lk)


def _open(cache: DirCache, key: str, size: int | None) -> int | None:
    """A descriptor of the entry ``key`` if it is there (with ``size`` bytes), else ``None``."""
    p = cache.path(key, _NAME)
    if size is not None and cache.local_file(key, _NAME, size) is None:
        if os.path.lexists(p):
            cache.discard_path(p)  # another size: not this tar's copy
        return None
    try:
        return cache.open_entry(p)
    except FileNotFoundError:
        return None


@contextmanager
def _compressed(path: str, cache: DirCache, opts: RemoteOptions | None) -> Iterator[ByteSource]:
    """The compressed bytes of ``path`` as a source: the file, or a download into the cache's tmp."""
    if opts is None:
        fd = open_regular(path, "a compressed tar")
        src = PreadSource(path, fd, os.fstat(fd).st_size)
        try:
            yield src
        finally:
            src.close()
        return
    tmp = cache.temp_path()
    held = cache.hold_temp(tmp)
    try:
        download(path, tmp, opts)
        fd = os.open(tmp, os.O_RDONLY)
        src = PreadSource(path, fd, os.fstat(fd).st_size)
        try:
            yield src
        finally:
            src.close()
    finally:
        cache.discard_path(tmp)
        os.close(held)


@contextmanager
def unpacking(
    path: str,
    fmt: str,
    tmp_dir: str | None = None,
    on_read: Callable[[int], None] | None = None,
    keep: bool = True,
) -> Iterator[tuple[str, ByteSource]]:
    """Yield ``(plain tar, compressed source)``: ``path`` decompressed into a temp file.

    The temp file is in the tar cache's temp directory (else ``tmp_dir`` or ``$TMPDIR`` when
    the cache cannot be made). If ``keep`` and the body returns normally, it becomes the
    cache entry of ``path`` (so indexing a shard also makes the copy its first open maps),
    else it is deleted. The compressed source is open while the body runs.

    Raises:
        TruncatedError, ChecksumError, FormatError: As :func:`unpacked_copy`.
        OSError: ``path`` cannot be read or the temp file written.
    """
    import tempfile

    try:
        cache: DirCache | None = tar_cache()
    except (OSError, ValueError):
        cache = None
    held = -1
    if cache is not None:
        tmp = cache.temp_path()
        held = cache.hold_temp(tmp)  # never cleaned up while indexed here, however long
    else:
        tfd, tmp = tempfile.mkstemp(prefix=".tarindex-unpack-", suffix=".tar", dir=tmp_dir)
        os.close(tfd)
    fd = open_regular(path, f"a {fmt}-compressed tar")
    src = PreadSource(path, fd, os.fstat(fd).st_size)
    try:
        with open(tmp, "wb") as f:
            # read later only from a copy in the cache: a tar larger than it is refused early
            out = f if cache is None else _Bounded(f, cache.limit, partial(_too_big, path, cache))
            unpack_checked(src, out, fmt, on_read)  # type: ignore[arg-type]
        yield tmp, src
        if keep and cache is not None:
            cache.put_file(_key(path, fmt, None), _NAME, tmp)  # best effort: False if too big
    finally:
        src.close()
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        if held >= 0:
            os.close(held)
