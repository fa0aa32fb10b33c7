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
- **Sequential multi-MB pieces, read as they arrive.** :data:`PIECE` bytes per request,
  :data:`STREAMS` in flight, each reply's body written in place (``pwrite``, no copy in
  memory, by the download's writer thread: the event loop only receives) into a
  preallocated temp file of the cache as it arrives, renamed when complete
  (:mod:`tarindex.storage.pieces`). A reader does not wait for the whole tar: it joins the
  download (:func:`open_copy`, :func:`find_copy`) and each read waits only for the 1 MiB
  grains it needs once the download has reached them, reading the others by ranges
  (:class:`CopySource`); once the copy is complete the fetch policy reopens the shard
  mapped.
- **One download per machine.** The download runs under the entry's lock
  (:meth:`~tarindex.storage.cache.DirCache.lock`), which holds its progress record: a second
  process or thread that wants the same shard joins it (reads the pieces written so far)
  instead of downloading it again. Read-ahead (:func:`fetch_ahead`) never waits: a shard
  another process is downloading is skipped. If that download fails, its readers read the
  missing bytes by ranges and the next open starts another.
- **Bounded.** The cache's byte limit holds (least recently used entries evicted, shards
  the plan is done with first: :func:`release`); a shard larger than the limit is not
  kept, and its reads stay ranged.
"""

from __future__ import annotations

import errno
import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import replace
from typing import NamedTuple, TypeVar

import numpy as np
from numpy.typing import NDArray

from ...errors import StaleIndexError
from ..bytesource import PreadSource
from ..cache import DirCache
from ..cachetmp import NO_ROOM
from ..pieces import GRAIN, PieceReader, PieceWriter, attach
from .downloads import Downloads
from .fetch import fetch, stat
from .firstwindow import (
    cached_seeds,
    drop_seeds,
    forget_holds,
    hold,
    holes,
    is_held,
    same_version,
    seed,
    take_seeds,
    usable,
)
from .needorder import in_need_order, needed
from .options import STATS, RemoteOptions, cache_key
from .transport import Pin

__all__ = [
    "PIECE",
    "STREAMS",
    "WHOLE",
    "Copy",
    "CopySource",
    "fetch_ahead",
    "find_copy",
    "forget_pins",
    "hold",
    "local_copy",
    "open_copy",
    "check_ahead",
    "drop_seeds",
    "learnt",
    "pin_ahead",
    "pinned",
    "release",
    "running_here",
    "seed",
    "tar_key",
]

T = TypeVar("T")

WHOLE = "whole"
"""The entry name of a whole shard in the cache."""

PIECE = 8 << 20
"""Bytes per ranged read of a whole-shard download."""

STREAMS = 4
"""Ranged reads in flight per whole-shard download."""

_pins: dict[tuple[int, str], Pin] = {}
_pinning: dict[tuple[int, str], Future[Pin]] = {}
"""(pid, URL) -> the version this process pinned (a read-ahead's stat, reused by the open)."""
_lock = threading.Lock()
_ahead: list[tuple[int, Downloads, dict[str, Future[bool | None]]] | None] = [None]
_gates: list[tuple[int, ThreadPoolExecutor] | None] = [None]


def _after_fork_in_child() -> None:
    global _lock
    _lock = threading.Lock()
    _ahead[0] = None  # the parent's threads do not exist here
    _gates[0] = None


os.register_at_fork(after_in_child=_after_fork_in_child)


def tar_key(url: str, size: int, ident: str, pin: Pin | None) -> str:
    """The cache key of one version of a remote tar: URL, size, index fingerprint, pin.

    The same key :class:`~.source.RemoteSource` stores its chunks under.
    """
    tag = pin.tag() if pin is not None else ""
    return cache_key("tar", url, size, ident, tag) if tag else cache_key("tar", url, size, ident)


def forget_pins() -> None:
    """Forget the versions this process pinned and its holds (:func:`hold`).

    The next open stats each tar again.
    """
    with _lock:
        _pins.clear()
        _pinning.clear()
        forget_holds()


def _pin(url: str, opts: RemoteOptions) -> Pin:
    """The version of ``url`` this process pinned; learnt once (one size query at a time)."""
    k = (os.getpid(), url)
    mine: Future[Pin] | None = None
    with _lock:
        p = _pins.get(k)
        f = _pinning.get(k)
        if p is None and f is None:  # ours to learn; others asking meanwhile wait for it
            f = mine = _pinning[k] = Future()
    if p is not None:
        return p
    assert f is not None
    if mine is not None:
        try:
            p = stat(url, opts)
        except BaseException as e:
            mine.set_exception(e)
            raise
        finally:
            with _lock:
                if p is not None:
                    _pins[k] = p
                if _pinning.get(k) is mine:
                    del _pinning[k]
        mine.set_result(p)
        return p
    try:
        return f.result()  # learnt by another thread (or ahead, by pin_ahead)
    finally:
        with _lock:
            if _pinning.get(k) is f and f.done():
                del _pinning[k]


def pinned(url: str) -> Pin | None:
    """The version of ``url`` this process learnt (:func:`pin_ahead`, an open), if any."""
    with _lock:
        return _pins.get((os.getpid(), url))


def learnt(url: str, pin: Pin) -> None:
    """Keep the version of ``url`` a deferred source's first round pinned (its checks passed).

    Its downloads and later opens in this process then send no size query of their own
    (:func:`open_copy`, :func:`find_copy`). A version already known is kept: a source that
    saw another one reads its own pin, and a download pinned to the other is refused by
    the server (``If-Match``) if the object changed.
    """
    with _lock:
        _pins.setdefault((os.getpid(), url), pin)


def check_ahead(fn: Callable[[], None]) -> Future[None]:
    """Run ``fn`` (a source's open-time checks) on this process's check threads now."""
    return _background(fn)


def pin_ahead(url: str, opts: RemoteOptions) -> None:
    """Learn the version of ``url`` in the background (a plan needs the shard soon).

    The open that needs it then sends no size query of its own (it waits for this one).
    """
    k = (os.getpid(), url)
    with _lock:
        if k in _pins or k in _pinning:
            return

    def learn() -> None:
        try:
            _pin(url, opts)
        except Exception:
            pass  # the open that needs it asks again, and raises

    _background(learn)


def _open_entry(c: DirCache, key: str, size: int, url: str) -> int | None:
    """The complete copy, checked against its ``.sum`` record (a bad one: deleted, warned)."""
    return c.open_checked(key, WHOLE, size, f"the whole copy of {url}")


class Copy(NamedTuple):
    """A local copy of a remote tar in the cache (:func:`open_copy`)."""

    fd: int
    """A read-only descriptor of it (the caller owns it)."""
    size: int
    """Its size in bytes."""
    pin: Pin
    """The version it holds."""
    pieces: PieceReader | None
    """``None``: complete (the entry); else the download being written, read as it goes."""


def open_copy(url: str, opts: RemoteOptions, ident: str) -> Copy | None:
    """The whole tar ``url`` in the cache: complete, or being downloaded (read as it arrives).

    Starts the download if none is running on the machine (in this process's background
    threads; one download per machine: the entry's lock) and joins it: the reads of the
    returned copy wait for their pieces (:class:`CopySource`), not for the whole tar.

    Args:
        url: The tar.
        opts: Transport options (:meth:`RemoteOptions.whole_cache` is the directory).
        ident: The index's fingerprint of the tar (part of the entry's key).

    Returns:
        The copy, or ``None`` if the tar does not fit the cache (larger than its limit, or
        the disk is full), or if ``url`` is held (:func:`hold`) and no copy of the version
        this process knows is there or downloading (:func:`find_copy`: no request).

    Raises:
        FileNotFoundError: The tar does not exist.
        StaleIndexError: The object changed before its download could start or while it
            ran in this process (names the URL).
        RemoteError: As :func:`~.fetch.fetch`, from a download this process ran.
    """
    with _lock:
        held = is_held(url)
    if held:  # a stream's first window first (hold): join a running download, start none;
        # no size query either (the first round's replies name the version: learnt)
        return find_copy(url, opts, ident)
    pin = _pin(url, opts)
    c = opts.whole_cache()
    key = tar_key(url, pin.size, ident, pin)
    fd = _open_entry(c, key, pin.size, url)
    if fd is not None:
        return Copy(fd, pin.size, pin, None)
    if pin.size > c.limit:
        return None
    fut = _submit(url, opts, ident, demand=True)
    delay = 0.0005
    while True:
        got = attach(c, key, WHOLE, pin.size)
        if got is not None:
            return Copy(got[0], pin.size, pin, got[1])
        fd = _open_entry(c, key, pin.size, url)
        if fd is not None:
            return Copy(fd, pin.size, pin, None)
        if fut.done():
            ok = fut.result()  # the download's error, if it failed here
            fd = _open_entry(c, key, pin.size, url)
            if fd is not None:
                return Copy(fd, pin.size, pin, None)
            if ok is not None:  # did not fit, or made by this call and evicted at once
                # (the bound too small for the shards in use): read by ranges
                return None
            fut = _submit(url, opts, ident, demand=True)  # another's download ended: ours
        time.sleep(delay)
        delay = min(delay * 2, 0.005)


def find_copy(url: str, opts: RemoteOptions, ident: str) -> Copy | None:
    """The whole tar ``url`` in the cache, complete or downloading now; else ``None``.

    Sends no request and starts nothing: ``None`` when this process has not learnt the
    tar's version yet, or no copy is there or downloading (the fetch policy starts
    downloads in the plan's order; reads go by ranges meanwhile). A download this process
    has queued or started is waited for until it has a progress record to join.

    Args:
        url: The tar.
        opts: Transport options (:meth:`RemoteOptions.whole_cache` is the directory).
        ident: The index's fingerprint of the tar (part of the entry's key).
    """
    with _lock:
        pin = _pins.get((os.getpid(), url))
    if pin is None:
        return None
    try:
        c = opts.whole_cache()
    except OSError:
        return None
    key = tar_key(url, pin.size, ident, pin)
    fut = _running(url)
    delay = 0.0005
    while True:
        got = attach(c, key, WHOLE, pin.size)
        if got is not None:
            return Copy(got[0], pin.size, pin, got[1])
        fd = _open_entry(c, key, pin.size, url)  # after attach: a download ends by its rename
        if fd is not None:
            return Copy(fd, pin.size, pin, None)
        if fut is None or fut.done():
            return None
        time.sleep(delay)  # this process's download is starting: join it
        delay = min(delay * 2, 0.005)


def running_here(url: str) -> bool:
    """Whether this process has a download of ``url`` queued or running."""
    return _running(url) is not None


def _running(url: str) -> Future[bool | None] | None:
    """This process's download of ``url`` if one is queued or running."""
    with _lock:
        a = _ahead[0]
        f = a[2].get(url) if a is not None and a[0] == os.getpid() else None
    return f if f is not None and not f.done() else None


def local_copy(url: str, opts: RemoteOptions, ident: str) -> tuple[int, int, Pin] | None:
    """:func:`open_copy`, complete: waits for the whole download.

    Returns:
        ``(fd, size, pin)`` of the entry, or ``None`` as :func:`open_copy`.

    Raises:
        As :func:`open_copy`.
    """
    while True:
        cp = open_copy(url, opts, ident)
        if cp is None or cp.pieces is None:
            return None if cp is None else (cp.fd, cp.size, cp.pin)
        ok = cp.pieces.wait(0, cp.size)
        cp.pieces.close()
        if ok:
            return cp.fd, cp.size, cp.pin
        os.close(cp.fd)
        err = _failure(url)
        if err is not None:  # it ran here: its error (a replaced object stays an error)
            raise err
        # it ran in another process and failed there: start or join the next one


def _download(url: str, opts: RemoteOptions, ident: str, blocking: bool) -> bool | None:
    """Download ``url`` (pinned) into the cache under its entry's lock.

    Each piece's body is written in place as it arrives, its grains flagged
    (:class:`~tarindex.storage.pieces.PieceWriter`).

    Returns:
        ``True``: the entry is there; ``False``: it does not fit the cache; ``None``: not
        ``blocking`` and another thread or process holds the lock (it downloads).
    """
    pin = _pin(url, opts)
    c = opts.whole_cache()
    key = tar_key(url, pin.size, ident, pin)
    lk = c.lock(key, WHOLE, blocking)
    if lk is None:
        return None
    try:
        if c.local_file(key, WHOLE, pin.size, checked=True) is not None:
            return True  # another process finished it while we waited
        # bytes here already: a stream's first window, chunks read before the switch
        cached = cached_seeds(opts.cache(), key, pin, opts.chunk_bytes, url)
        seeds = usable(take_seeds(url) + cached, pin)
        order = needed(url)  # a plan's: pieces in the order it reads them, all coming
        have = [(a, b) for a, b, _, _ in seeds]
        pieces = holes(pin.size, have, PIECE)
        if order:
            pieces = in_need_order(pieces, order)
        # written now (the seeds in memory) or requested now (the first pieces; in a plan's
        # order all of them): this process's reads wait for them from the moment the
        # download can be joined (a read joining before they were marked fetched them
        # again, under load 4.7% of a stream)
        soon = [(a, b) for a, b, data, _ in seeds if isinstance(data, bytes)]
        try:
            w = PieceWriter(c, lk, pin.size, coming=soon + pieces[: None if order else STREAMS])
        except OSError as e:
            if e.errno in NO_ROOM or e.errno in (errno.EROFS, errno.EACCES):
                return False
            raise
        try:
            for a, _b, data, _ in seeds:  # fetched already (a stream's first window)
                if isinstance(data, bytes):
                    w.fill(a, data)
            fetch(
                [(url, a, b) for a, b in pieces],
                replace(opts, concurrency=STREAMS),
                [pin] * len(pieces),
                sinks=[w.sink(a, b) for a, b in pieces],
            )
            again = []
            for a, b, data, of in seeds:  # still in flight when the download started
                if isinstance(data, bytes):
                    continue
                try:
                    got = data.result()
                    ok = len(got) == b - a and same_version(of(), pin)
                except Exception:
                    ok = False
                if ok:
                    w.fill(a, got)
                else:  # failed, or of another version: from the server, as the rest
                    again.append((a, b))
            if again:
                fetch(
                    [(url, a, b) for a, b in again],
                    replace(opts, concurrency=STREAMS),
                    [pin] * len(again),
                    sinks=[w.sink(a, b) for a, b in again],
                )
            STATS.shards += 1
            return w.commit(key, WHOLE)
        except BaseException as e:
            w.abort()
            if isinstance(e, StaleIndexError):
                with _lock:
                    _pins.pop((os.getpid(), url), None)
            raise
    finally:
        c.unlock(lk)


class CopySource:
    """The byte source of a local copy of a remote tar, read while it downloads.

    A read waits for the pieces it needs (:meth:`PieceReader.wait`) once the download has
    reached them (their piece's reply is arriving) and checks them
    (:meth:`PieceReader.check`); bytes it has not reached yet (a shuffled plan's first
    reads, before the pieces that hold them started), bytes a failed download never wrote
    and bytes that fail their check are read with ``fallback`` (the remote source's pinned
    ranged reads): a read costs one ranged round at most, never the wait for a download's
    earlier pieces. Complete copies read with ``os.pread`` alone.

    Args:
        url: The tar's URL (messages).
        fd: The copy's descriptor (owned from now on).
        size: Its size in bytes.
        pieces: The download's progress (``None``: complete).
        fallback: Reads ranges ``[(start, end)]`` from the server (pinned).
        gate: Checks that must pass before any byte is handed out (the open-time checks),
            started now in a background thread (or running already: their future); the
            first read waits for them and raises their error. Defaults to ``None``.
    """

    zero_copy = False

    def __init__(
        self,
        url: str,
        fd: int,
        size: int,
        pieces: PieceReader | None,
        fallback: Callable[[list[tuple[int, int]]], list[bytes]],
        gate: Callable[[], None] | Future[None] | None = None,
    ) -> None:
        self.path = url
        # (a future: running already, waited for without a thread of its own)
        self._gate = _background(gate) if callable(gate) else gate
        self.size = size
        self.pread = PreadSource(url, fd, size)
        self.pieces = pieces
        self.joined = pieces is not None
        """Whether the copy was being downloaded when it was opened."""
        self.fallback = fallback

    @property
    def complete(self) -> bool:
        """Whether every byte of the copy is written and checked (reads neither wait nor check).

        A copy whose bytes failed their check never is (its reads go to the server).
        """
        p = self.pieces
        return p is None or p.checked

    @property
    def settled(self) -> bool:
        """Whether the copy is complete and is the cache's entry (a reopen maps it)."""
        p = self.pieces
        return p is None or p.settled

    def reached(self, start: int, end: int) -> bool:
        """Whether the download has reached bytes ``[start, end)`` (written, or arriving).

        Bytes not reached are read from the server (``fallback``) rather than waited for:
        their piece's request is not answered yet (:meth:`PieceReader.reached`).
        """
        p = self.pieces
        return p is None or p.complete or p.reached(start, end, PIECE)

    def _here(self, start: int, end: int) -> bool:
        """Whether bytes ``[start, end)`` are written and checked (waited for if reached).

        ``False``: read them from the server (not reached, never written, or failing their
        check).
        """
        p = self.pieces
        if p is None or p.checked:
            return True
        if not p.complete and not p.reached(start, end, PIECE):
            return False
        return p.wait(start, end) and p.check(self.pread.read, start, end)

    def read(self, offset: int, size: int) -> bytes:
        """``size`` bytes at ``offset``: from the copy once written, else the server.

        Bytes the download has not reached (:meth:`reached`) or never wrote (it failed) are
        read with ``fallback``; the others wait for their grains.
        """
        if not self._here(offset, offset + size):
            self.passed()
            return self.fallback([(offset, offset + size)])[0]
        self.passed()
        return self.pread.read(offset, size)

    def passed(self) -> None:
        """Wait for the gate (the open-time checks); raise their error, every time.

        Every byte of the tar handed out, from the copy or fetched beside it, waits for this.
        """
        g = self._gate
        if g is not None:
            g.result()
            self._gate = None

    def read_ranges(
        self, starts: NDArray[np.int64], ends: NDArray[np.int64]
    ) -> tuple[bytes, NDArray[np.int64]]:
        """Read the half-open ranges, as :class:`~tarindex.storage.bytesource.ByteSource`."""
        p = self.pieces
        if p is not None and not p.checked:
            st, en = starts.tolist(), ends.tolist()
            lo, hi = (min(st), max(en)) if st else (0, 0)
            if len(st) > 1 and hi - lo <= 2 * int((ends - starts).sum()) + GRAIN and (
                self._here(lo, hi)
            ):  # a block's runs: waited for and checked at once, not a call per member
                lost = []
            else:
                lost = [i for i in range(len(st)) if not self._here(st[i], en[i])]
            self.passed()
            if lost:  # not reached, or the download failed before these: from the server
                got = dict(zip(lost, self.fallback([(st[i], en[i]) for i in lost]), strict=True))
                parts = [
                    got[i] if i in got else self.pread.read(st[i], en[i] - st[i])
                    for i in range(len(st))
                ]
                bases = np.zeros(len(st), np.int64)
                if len(st) > 1:
                    np.cumsum(ends[:-1] - starts[:-1], out=bases[1:])
                return b"".join(parts), bases
        self.passed()
        buf, bases = self.pread.read_ranges(starts, ends)
        return bytes(buf), bases

    def close(self) -> None:
        """Close the copy's descriptor (after the reads in flight) and the progress record."""
        self.pread.close()
        p = self.pieces
        if p is not None:
            p.close()


def release(url: str, opts: RemoteOptions, ident: str) -> None:
    """Mark the whole copy of ``url`` as done with (evicted first; see ``DirCache.release``)."""
    with _lock:
        pin = _pins.get((os.getpid(), url))
    if pin is not None:
        opts.whole_cache().release(tar_key(url, pin.size, ident, pin), WHOLE)


def fetch_ahead(url: str, opts: RemoteOptions, ident: str) -> Future[bool | None]:
    """Download the whole tar ``url`` into the cache in the background (read-ahead).

    A shard already queued or downloaded here is not queued again while its copy is in the
    cache of ``opts`` (one gone since, deleted or evicted, or a download into another cache
    directory, is downloaded again); one another thread or
    process is downloading is skipped (never waited for). The future says whether the entry
    is there (``None``: skipped); it holds the error of a failed download (the read that
    needs the shard then tries again and raises).
    """
    return _submit(url, opts, ident, demand=False)


def _failure(url: str) -> BaseException | None:
    """The error of this process's last download of ``url``, if it failed."""
    with _lock:
        a = _ahead[0]
        f = a[2].get(url) if a is not None and a[0] == os.getpid() else None
    if f is None or not f.done():
        return None
    return f.exception()


def _executor(opts: RemoteOptions | None = None) -> Downloads:
    """This process's download threads (made on first use, again after a fork)."""
    with _lock:
        a = _ahead[0]
        if a is None or a[0] != os.getpid():
            n = max(1, opts.shards_ahead if opts is not None else 4) + 8
            a = _ahead[0] = (os.getpid(), Downloads(n), {})
        return a[1]


def _background(fn: Callable[[], T]) -> Future[T]:
    """Run ``fn`` on this process's check threads (never queued behind downloads)."""
    with _lock:
        g = _gates[0]
        if g is None or g[0] != os.getpid():
            g = _gates[0] = (
                os.getpid(),
                ThreadPoolExecutor(8, thread_name_prefix="tarindex-check"),
            )
    return g[1].submit(fn)


def _submit(url: str, opts: RemoteOptions, ident: str, demand: bool) -> Future[bool | None]:
    """This process's download of ``url``: the running or finished one, else a new one.

    ``demand`` (a read needs it): a new download waits for the lock (another process's
    download then ends first; the entry is found, or this one takes over after a failure).
    Read-ahead runs at most :attr:`RemoteOptions.shards_ahead` at once (the fetch policy
    counts), demand ones as many as readers need, on threads of their own.
    """
    _executor(opts)
    with _lock:
        a = _ahead[0]
        assert a is not None
        f = a[2].get(url)
    gone = None
    if f is not None and f.done() and f.exception() is None and f.result():
        if not _present(url, opts, ident):  # made here, gone since (deleted, evicted, or
            gone = f  # another cache directory): downloaded again, never read by ranges
    with _lock:
        a = _ahead[0]
        assert a is not None
        _, ex, futs = a
        f = futs.get(url)
        if f is gone:
            f = None
        if f is not None and (not f.done() or (f.exception() is None and f.result())):
            return f
        if f is not None and not demand and f.exception() is None and f.result() is None:
            return f  # read-ahead skipped it (another downloads it): not again
        f = futs[url] = ex.submit(_download, url, opts, ident, demand)
        return f


def _present(url: str, opts: RemoteOptions, ident: str) -> bool:
    """Whether the complete copy of the version of ``url`` this process pinned is there.

    In the cache of ``opts``, by its size (no request); an unknown version counts as there.
    """
    with _lock:
        pin = _pins.get((os.getpid(), url))
    if pin is None:
        return True
    try:
        c = opts.whole_cache()
    except OSError:
        return True  # no cache to download into: the download says so itself
    return c.local_file(tar_key(url, pin.size, ident, pin), WHOLE, pin.size) is not None


def forget_ahead() -> None:
    """Forget this process's whole-shard read-ahead (running downloads finish on their own)."""
    with _lock:
        _ahead[0] = None
