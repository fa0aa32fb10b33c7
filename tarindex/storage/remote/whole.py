"""Whole shards in the cache directory: one download per machine, then read locally.

The ``"shard"`` fetch policy (docs/REMOTE.md, "Fetch policy"): a remote tar is downloaded
whole into :meth:`RemoteOptions.whole_cache` and its reader maps the local copy (the
compiled read kernel then runs as on a local shard). The rules:

- **Pinned, checked.** The tar's version is learnt once (:func:`~.fetch.stat`: size, ETag,
  Last-Modified, version id) and every piece of the download is a ranged read pinned to it
  (``If-Match``, ``Content-Range`` and ``ETag`` checked on every reply, as for any ranged
  read): an object replaced mid-download is :class:`~tarindex.errors.StaleIndexError`
  naming the URL. The entry's key holds the URL, the index's fingerprint and the pinned
  version, so a replaced object is a new entry, never the old bytes; the open-time checks
  (FORMAT.md §3) then run on the local copy against the index.
- **Sequential multi-MB pieces.** :data:`PIECE` bytes per request, :data:`STREAMS` in
  flight, written in place into a temp file of the cache, renamed when complete.
- **One download per machine.** The download runs under the entry's lock
  (:meth:`~tarindex.storage.cache.DirCache.lock`): a second process or thread that wants
  the same shard waits for the lock, then finds the entry. Read-ahead (:func:`fetch_ahead`)
  never waits: a shard another process is downloading is skipped.
- **Bounded.** The cache's byte limit holds (least recently used entries evicted, shards
  the plan is done with first: :func:`release`); a shard larger than the limit is not
  kept, and its reads stay ranged.
"""

from __future__ import annotations

import os
import threading
from concurrent.futures import Future, ThreadPoolExecutor

from ...errors import StaleIndexError
from ..cache import DirCache
from .fetch import fetch, stat
from .options import STATS, RemoteOptions, cache_key
from .transport import Pin

__all__ = [
    "PIECE",
    "STREAMS",
    "WHOLE",
    "fetch_ahead",
    "forget_pins",
    "local_copy",
    "release",
    "tar_key",
]

WHOLE = "whole"
"""The entry name of a whole shard in the cache."""

PIECE = 8 << 20
"""Bytes per ranged read of a whole-shard download."""

STREAMS = 4
"""Ranged reads in flight per whole-shard download."""

_pins: dict[tuple[int, str], Pin] = {}
"""(pid, URL) -> the version this process pinned (a read-ahead's stat, reused by the open)."""
_lock = threading.Lock()
_ahead: list[tuple[int, ThreadPoolExecutor, dict[str, Future[bool]]] | None] = [None]


def _after_fork_in_child() -> None:
    global _lock
    _lock = threading.Lock()
    _ahead[0] = None  # the parent's threads do not exist here


os.register_at_fork(after_in_child=_after_fork_in_child)


def tar_key(url: str, size: int, ident: str, pin: Pin | None) -> str:
    """The cache key of one version of a remote tar: URL, size, index fingerprint, pin.

    The same key :class:`~.source.RemoteSource` stores its chunks under.
    """
    tag = pin.tag() if pin is not None else ""
    return cache_key("tar", url, size, ident, tag) if tag else cache_key("tar", url, size, ident)


def forget_pins() -> None:
    """Forget the versions this process pinned (the next open stats each tar again)."""
    with _lock:
        _pins.clear()


def _pin(url: str, opts: RemoteOptions) -> Pin:
    k = (os.getpid(), url)
    with _lock:
        p = _pins.get(k)
    if p is None:
        p = stat(url, opts)
        with _lock:
            _pins[k] = p
    return p


def _open_entry(c: DirCache, key: str, size: int) -> int | None:
    p = c.local_file(key, WHOLE, size)
    if p is None:
        return None
    try:
        return c.open_entry(p)
    except OSError:
        return None


def local_copy(
    url: str, opts: RemoteOptions, ident: str, blocking: bool = True
) -> tuple[int, int, Pin] | None:
    """A descriptor of the whole tar ``url`` in the cache, downloading it first if needed.

    Args:
        url: The tar.
        opts: Transport options (:meth:`RemoteOptions.whole_cache` is the directory).
        ident: The index's fingerprint of the tar (part of the entry's key).
        blocking: Wait for another process's download of it. ``False`` returns ``None`` if
            one is running. Defaults to ``True``.

    Returns:
        ``(fd, size, pin)``: a read-only descriptor of the local copy (the caller owns it),
        its size in bytes and the version it holds; ``None`` if the tar does not fit the
        cache (larger than its limit, or the disk is full) or, not blocking, another
        process is downloading it.

    Raises:
        FileNotFoundError: The tar does not exist.
        StaleIndexError: The object changed while it was downloaded (names the URL).
        RemoteError: As :func:`~.fetch.fetch`.
    """
    pin = _pin(url, opts)
    c = opts.whole_cache()
    key = tar_key(url, pin.size, ident, pin)
    fd = _open_entry(c, key, pin.size)
    if fd is not None:
        return fd, pin.size, pin
    if pin.size > c.limit:
        return None
    lk = c.lock(key, WHOLE, blocking)
    if lk is None:
        return None
    try:
        fd = _open_entry(c, key, pin.size)  # another process finished it while we waited
        if fd is None:
            try:
                if not _download(url, pin, opts, c, key):
                    return None
            except StaleIndexError:
                with _lock:
                    _pins.pop((os.getpid(), url), None)
                raise
            fd = _open_entry(c, key, pin.size)
            if fd is None:
                return None
    finally:
        c.unlock(lk)
    return fd, pin.size, pin


def _download(url: str, pin: Pin, opts: RemoteOptions, c: DirCache, key: str) -> bool:
    """Download ``url`` (pinned) into a temp file of ``c``, then insert it as the entry."""
    tmp = c.temp_path()
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
    try:
        try:
            pieces = [(a, min(a + PIECE, pin.size)) for a in range(0, pin.size, PIECE)]
            for g in range(0, len(pieces), STREAMS):
                group = pieces[g : g + STREAMS]
                got = fetch([(url, a, b) for a, b in group], opts, [pin] * len(group))
                for (a, _), data in zip(group, got, strict=True):
                    os.pwrite(fd, data, a)
        finally:
            os.close(fd)
        STATS.shards += 1
        return c.put_file(key, WHOLE, tmp)
    except BaseException:
        c.discard_path(tmp)
        raise


def release(url: str, opts: RemoteOptions, ident: str) -> None:
    """Mark the whole copy of ``url`` as done with (evicted first; see ``DirCache.release``)."""
    with _lock:
        pin = _pins.get((os.getpid(), url))
    if pin is not None:
        opts.whole_cache().release(tar_key(url, pin.size, ident, pin), WHOLE)


def fetch_ahead(url: str, opts: RemoteOptions, ident: str) -> Future[bool]:
    """Download the whole tar ``url`` into the cache in the background (read-ahead).

    At most :attr:`RemoteOptions.shards_ahead` downloads run at once per process; a shard
    already queued here is not queued again, one another process is downloading is skipped
    (never waited for). The future says whether the entry is there; it holds the error of a
    failed download (the read that needs the shard then tries again and raises).
    """
    with _lock:
        a = _ahead[0]
        if a is None or a[0] != os.getpid():
            ex = ThreadPoolExecutor(max(1, opts.shards_ahead), thread_name_prefix="tarindex-shard")
            a = _ahead[0] = (os.getpid(), ex, {})
        _, ex, futs = a
        f = futs.get(url)
        if f is not None and (not f.done() or (f.exception() is None and f.result())):
            return f

        def run() -> bool:
            got = local_copy(url, opts, ident, blocking=False)
            if got is None:
                return False
            os.close(got[0])
            return True

        f = futs[url] = ex.submit(run)
        return f


def ahead_pending() -> int:
    """Whole-shard downloads queued or running in this process's read-ahead."""
    with _lock:
        a = _ahead[0]
        if a is None or a[0] != os.getpid():
            return 0
        return sum(1 for f in a[2].values() if not f.done())


def forget_ahead() -> None:
    """Forget this process's whole-shard read-ahead (running downloads finish on their own)."""
    with _lock:
        _ahead[0] = None
