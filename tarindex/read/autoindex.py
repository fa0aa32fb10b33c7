"""A missing index built on first open (``index="auto"``), safely under many processes.

:func:`build_missing` is called by :class:`~tarindex.read.shardset.ShardSet` for the shards
whose index is not there (docs/READING.md, "No index step"):

- **Where.** Beside the tar (or in ``index_dir``) when that directory is writable; else, and
  for a remote tar always, in the per-user index cache (:func:`index_cache_dir`:
  ``$TARINDEX_INDEX_CACHE``, else ``$XDG_CACHE_HOME/tarindex/indexes``, else
  ``~/.cache/tarindex/indexes``), a :class:`~tarindex.storage.cache.DirCache` entry keyed by
  the tar's path (or URL) and its fingerprint as ``stat`` (or ``HEAD``) sees it: size,
  modification time and inode (ETag / Last-Modified / version id), so a changed tar gets a
  new entry, never the old index.
- **Many processes.** Each index is built under an exclusive ``flock`` of
  ``<cache>/locks/<key>.lock``: DDP ranks (or jobs) opening the same missing shards first
  take the shards nobody is building (non-blocking), then wait for the others and re-check;
  every index file appears by ``os.replace`` of a complete temp file, so a reader never
  sees a torn index, and a builder killed mid-way leaves no index (its lock dies with it).
- **Telling.** A tqdm bar on stderr (bytes; shown after 2 s and only on a terminal) and one
  line on stderr saying how many indexes were built and where they went.
"""

from __future__ import annotations

import errno
import fcntl
import os
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

from ..errors import IndexMissingError
from ..format.url import is_url
from ..index.build import build_index, local_tar
from ..storage.cache import DirCache
from ..storage.remote import RemoteOptions
from ..storage.remote.fetch import stat as remote_stat
from ..storage.remote.options import cache_key

__all__ = ["build_missing", "index_cache_dir"]

_CACHE_BYTES = 10 << 30
"""Byte limit of the index cache (least recently used indexes go first)."""
_NAME = "tidx"
_PROGRESS_DELAY_S = 2.0


def index_cache_dir() -> str:
    """The per-user directory of indexes built where the tar's directory is not writable.

    ``$TARINDEX_INDEX_CACHE`` if set, else ``$XDG_CACHE_HOME/tarindex/indexes``, else
    ``~/.cache/tarindex/indexes``.
    """
    d = os.environ.get("TARINDEX_INDEX_CACHE")
    if d:
        return os.path.abspath(d)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(os.path.abspath(base), "tarindex", "indexes")


def _cache() -> DirCache:
    return DirCache(index_cache_dir(), _CACHE_BYTES)


def _local_key(tar: str) -> str:
    """The cache key of a local tar: its real path and ``stat`` fingerprint."""
    st = os.stat(tar)
    return cache_key("auto-index", os.path.realpath(tar), st.st_size, st.st_mtime_ns, st.st_ino)


def _remote_key(url: str, opts: RemoteOptions) -> str:
    """The cache key of a remote tar: its URL, size and version (``HEAD``)."""
    pin = remote_stat(url, opts)
    return cache_key("auto-index", url, pin.size, pin.tag())


class _Lock:
    """An exclusive ``flock`` of ``<cache>/locks/<key>.lock`` (released when its process dies)."""

    def __init__(self, cache: DirCache, key: str) -> None:
        d = os.path.join(cache.root, "locks")
        os.makedirs(d, exist_ok=True)
        self.fd = os.open(os.path.join(d, key + ".lock"), os.O_RDWR | os.O_CREAT, 0o644)

    def take(self, wait: bool) -> bool:
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
        except BlockingIOError:
            return False
        return True

    def close(self) -> None:
        os.close(self.fd)  # releases the lock


class _Job:
    """One shard whose index is missing: where it should go, and where it went."""

    def __init__(self, k: int, tar: str, want: str, opts: RemoteOptions) -> None:
        self.k, self.tar, self.want = k, tar, want
        self.remote = is_url(tar) or is_url(want)  # built into the cache
        self.key = _remote_key(tar, opts) if is_url(tar) else _local_key(tar)
        self.got = ""  # the index path, once there


def _present(job: _Job, cache: DirCache) -> str:
    """The index of ``job`` if it exists now (beside the tar or in the cache), else ``""``."""
    if not job.remote and os.path.isfile(job.want):
        return job.want
    p = cache.path(job.key, _NAME)
    if os.path.isfile(p):
        size = os.path.getsize(p)
        if cache.local_file(job.key, _NAME, size) is not None:
            return p
    return ""


def _build(job: _Job, cache: DirCache, opts: RemoteOptions, on_read: Callable[[int], None]) -> str:
    """Build the index of ``job`` beside its tar if writable, else into the cache."""
    if not job.remote and os.access(os.path.dirname(job.want) or ".", os.W_OK):
        try:
            build_index(job.tar, job.want, on_read=on_read)
            return job.want
        except PermissionError:
            pass
        except OSError as e:
            if e.errno not in (errno.EROFS, errno.EACCES, errno.EPERM):
                raise
        if os.path.isfile(job.want):  # written by someone else meanwhile
            return job.want
    tmp = cache.temp_path()
    try:
        with local_tar(job.tar, os.path.join(cache.root, "tmp")) as local:
            build_index(  # a temp download: its decompressed copy (§11) is not kept
                local, tmp, on_read=on_read, tmp_dir=os.path.join(cache.root, "tmp"),
                keep_copy=local == job.tar,
            )
        if not cache.put_file(job.key, _NAME, tmp):
            raise OSError(
                errno.ENOSPC,
                f"{job.tar}: its index could not be stored in the index cache "
                f"{cache.root} (full or over its limit); build it with: tarindex index "
                f"{job.tar} --out DIR, then read with index_dir=DIR",
            )
    finally:
        cache.discard_path(tmp)
    return cache.path(job.key, _NAME)


def build_missing(
    tars: Sequence[str],
    wanted: Sequence[str],
    ks: Sequence[int],
    opts: RemoteOptions,
) -> dict[int, str]:
    """Build the indexes of shards ``ks`` that have none; return ``{k: index path}``.

    Args:
        tars: Every shard's tar (local path or URL).
        wanted: Every shard's index path (beside it, or in ``index_dir``).
        ks: The shards whose index is missing.
        opts: Remote options (``HEAD`` and download of remote tars).

    Returns:
        For each of ``ks``: the index to read, beside the tar or in the index cache.

    Raises:
        FormatError: A tar that cannot be indexed (truncated, corrupt, not a tar,
            ``CompressedTarError``): the message names it; other shards keep their indexes.
        FileNotFoundError: A tar is missing.
        RemoteError: A remote tar cannot be fetched.
        OSError: The index cache cannot be written.
    """
    cache = _cache()
    jobs = [_Job(k, tars[k], wanted[k], opts) for k in ks]
    out: dict[int, str] = {}
    built: list[_Job] = []
    bar = _Progress(jobs)
    t0 = time.monotonic()
    try:
        waiting: list[tuple[_Job, _Lock]] = []
        for job in jobs:  # first the shards nobody else is building
            lock = _Lock(cache, cache_key("lock", job.want if not job.remote else job.key))
            if lock.take(wait=False):
                try:
                    job.got = _present(job, cache)
                    if not job.got:
                        job.got = bar.build(job, cache, opts)
                        built.append(job)
                finally:
                    lock.close()
            else:
                waiting.append((job, lock))
        for job, lock in waiting:  # then wait for the others' builders, and check
            try:
                lock.take(wait=True)
                job.got = _present(job, cache)
                if not job.got:  # its builder failed or died: build it here
                    job.got = bar.build(job, cache, opts)
                    built.append(job)
            finally:
                lock.close()
    finally:
        bar.close()
    for job in jobs:
        if not job.got:
            raise IndexMissingError(f"{job.tar}: no index was built for it")
        out[job.k] = job.got
    if built:
        _tell(built, cache, time.monotonic() - t0)
    return out


class _Progress:
    """A tqdm bar over the bytes of the tars being indexed (on stderr, on a terminal only)."""

    def __init__(self, jobs: list[_Job]) -> None:
        from tqdm import tqdm  # type: ignore[import-untyped,unused-ignore]

        self.size = {j.k: 0 if is_url(j.tar) else os.path.getsize(j.tar) for j in jobs}
        self.bar: Any = tqdm(
            total=sum(self.size.values()) or None,
            unit="B",
            unit_scale=True,
            desc="tarindex: indexing",
            delay=_PROGRESS_DELAY_S,
            disable=None,  # only on a terminal
            leave=False,
        )
        self.counted = 0.0

    def _read(self, n: int) -> None:  # a compressed tar is read twice: half a byte each
        self.counted += n / 2
        self.bar.update(n / 2)

    def build(self, job: _Job, cache: DirCache, opts: RemoteOptions) -> str:
        self.counted = 0.0
        got = _build(job, cache, opts, self._read)
        self.bar.update(max(0.0, self.size[job.k] - self.counted))
        return got

    def close(self) -> None:
        self.bar.close()


def _tell(built: list[_Job], cache: DirCache, secs: float) -> None:
    """One line on stderr: how many indexes were built, and where."""
    beside = [j for j in built if j.got == j.want]
    cached = len(built) - len(beside)
    if len(built) == 1:
        where = built[0].got
        what = f"the index of {built[0].tar}"
    else:
        what = f"{len(built)} indexes"
        parts = []
        if beside:
            parts.append(f"{len(beside)} beside their tars")
        if cached:
            parts.append(f"{cached} in {cache.root}")
        where = ", ".join(parts)
    print(
        f"tarindex: built {what} on first open ({secs:.1f} s) -> {where}; "
        f"index='require' turns this off",
        file=sys.stderr,
        flush=True,
    )
