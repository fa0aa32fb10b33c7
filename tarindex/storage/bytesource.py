"""Byte sources: where the read kernel gets a shard's bytes (mmap or ``os.pread``).

The kernel (:meth:`tarindex.read.ShardReader.read_block`) asks a source for whole byte
ranges and slices members out of what it gets back; nothing above the kernel sees a source.
A source is one small interface, :class:`ByteSource`: its ``size``, ``read(offset, size)``,
``read_ranges(starts, ends)``, ``prefetch``/``prefetch_ranges`` hints and ``close``. The
remote source, :class:`tarindex.storage.remote.RemoteSource` (ranged reads, read-ahead, a
shared cache), implements the same interface beside :class:`MmapSource` and
:class:`PreadSource`; :func:`open_source` picks mmap or pread for a local tar.

Each source holds at most one file descriptor (an ``mmap`` keeps its own duplicate of the
descriptor it maps; the original is closed).

Threads: every method may be called from several threads at once, ``close`` too. A read in
flight when another thread closes the source finishes with the right bytes (a mapping is
unmapped, and a ``pread`` descriptor closed, only once no read uses it: a descriptor number
is never reused under a read); a read begun after ``close`` raises
:class:`~tarindex.errors.ClosedError`.
"""

from __future__ import annotations

import errno
import mmap
import os
import stat
import threading
import weakref
from typing import Protocol

try:  # Linux: the calling thread's own page-fault counts
    import resource

    _RUSAGE_THREAD: int | None = resource.RUSAGE_THREAD
except (ImportError, AttributeError):  # no per-thread counts: always give the hint
    _RUSAGE_THREAD = None

import numpy as np
from numpy.typing import NDArray

from ..errors import ClosedError, FormatError, TruncatedError
from ..format.spec import BLOCK

__all__ = [
    "Buffer",
    "ByteSource",
    "COALESCE_GAP",
    "MmapSource",
    "PreadSource",
    "open_source",
    "open_regular",
    "closed_error",
    "reset_after_fork",
]

Buffer = bytes | mmap.mmap
"""What :meth:`ByteSource.read_ranges` returns: a buffer whose slices are ``bytes``."""

COALESCE_GAP = 4 * BLOCK
"""Largest gap in bytes (tar headers, pax records, padding) one read of two ranges spans.

The one value for every source that reads copies: a ``pread`` run of neighbouring members
(:func:`tarindex.read.runs.read_runs`) and a remote request (:mod:`tarindex.storage.remote.fetch`).
"""


class ByteSource(Protocol):
    """The bytes of one tar, read by range. Offsets and sizes are in bytes."""

    path: str
    """The tar's path or URL, for messages."""
    size: int
    """Size of the tar in bytes (as seen when the source was opened)."""
    zero_copy: bool
    """``True`` if :meth:`read_ranges` returns the whole tar mapped (no bytes are read)."""

    def read(self, offset: int, size: int) -> bytes:
        """Return ``size`` bytes at ``offset``; ``TruncatedError`` if they are not all there."""
        ...

    def read_ranges(
        self, starts: NDArray[np.int64], ends: NDArray[np.int64]
    ) -> tuple[Buffer, NDArray[np.int64]]:
        """Read the half-open ranges ``[starts[r], ends[r])``; return ``(buffer, bases)``.

        Range ``r`` is ``buffer[bases[r] : bases[r] + ends[r] - starts[r]]``.
        """
        ...

    def prefetch(self, start: int, end: int) -> None:
        """Hint that bytes ``[start, end)`` will be read soon (may do nothing)."""
        ...

    def prefetch_ranges(
        self, starts: NDArray[np.int64], ends: NDArray[np.int64], wait: bool = False
    ) -> None:
        """Hint that the ranges ``[starts[r], ends[r])`` will be read soon (may do nothing).

        ``wait=True`` asks a remote source to fetch them now, in one batch, before returning.
        """
        ...

    def close(self) -> None:
        """Release the descriptor or mapping (idempotent)."""
        ...


def open_regular(path: str, what: str = "a tar", error: type[FormatError] = FormatError) -> int:
    """``os.open`` read-only without blocking; refuse anything but a regular file.

    A FIFO would block a plain ``open`` until a writer appears and a device would be read
    forever; ``O_NONBLOCK`` makes the open return at once, then ``fstat`` decides. The one
    rule for the scanner (tars) and the reader (tars and indexes).

    Args:
        path: The file.
        what: What the file should be, for messages. Defaults to ``"a tar"``.
        error: The error class for a FIFO, socket or device. Defaults to ``FormatError``.

    Returns:
        The open descriptor (the caller closes it).

    Raises:
        FormatError: (``error``) ``path`` is a FIFO, socket, or character or block device.
        IsADirectoryError: ``path`` is a directory.
        OSError: As ``os.open`` (``FileNotFoundError``, ``PermissionError``, ...).
    """
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    mode = os.fstat(fd).st_mode
    if stat.S_ISREG(mode):
        return fd
    os.close(fd)
    if stat.S_ISDIR(mode):
        raise IsADirectoryError(errno.EISDIR, f"is a directory, not {what} file", path)
    kind = (
        "a FIFO"
        if stat.S_ISFIFO(mode)
        else "a character device"
        if stat.S_ISCHR(mode)
        else "a block device"
        if stat.S_ISBLK(mode)
        else "a socket"
        if stat.S_ISSOCK(mode)
        else "a special file"
    )
    raise error(
        f"{path}: byte 0: {kind} (mode 0o{mode:o}), not a regular file; expected {what} file: "
        f"tarindex maps files and reads them out of order, so it needs a regular file: save "
        f"the stream to a file and use that"
    )


def closed_error(path: str) -> ClosedError:
    """The error of a read through a closed reader or source of the tar ``path``."""
    return ClosedError(
        f"{path}: read after close(): this reader was closed by its caller; open the shard "
        f"again (the datasets reopen shards by themselves)"
    )


def _past_end(path: str, size: int, offset: int, end: int) -> TruncatedError:
    return TruncatedError(
        f"{path}: byte {size}: range {offset}..{end} runs past the end of the tar; the index "
        f"is corrupt or the tar was cut: tarindex verify {path}"
    )


_HINTED_RUN = 16
"""Blocks read with the hint after one read without it took a major page fault."""


class _ColdCache(threading.local):
    """Whether a block's ``MADV_WILLNEED`` hint is worth giving, judged per thread.

    On a cold page cache the hint turns a fault per page into one read of the block ahead
    (~1.1x the streaming rate from disk here); on a warm one it only costs the kernel's walk
    over resident pages (~57 ns a page: 0.8x the warm streaming rate). A block read without
    the hint that took a major fault (the thread's ``ru_majflt`` grew) means cold: the next
    :data:`_HINTED_RUN` blocks get it, then one goes without to look again. Without
    per-thread counts (not Linux) every block gets it.
    """

    def __init__(self) -> None:
        self.hinted = 0  # blocks left to hint
        self.faults = -1  # ru_majflt at the last unhinted block, -1: none yet

    def hint(self) -> bool:
        """Called before each block is read: give this one the hint?"""
        if _RUSAGE_THREAD is None:
            return True
        f = resource.getrusage(_RUSAGE_THREAD).ru_majflt
        if self.faults >= 0 and f > self.faults:  # the unhinted block before this faulted
            self.hinted = _HINTED_RUN
        if self.hinted > 0:
            self.hinted -= 1
            self.faults = -1
            return True
        self.faults = f
        return False


_cold = _ColdCache()


def cold_cache() -> bool:
    """Give the next block read (or window of blocks) the ``MADV_WILLNEED`` hint?

    Called once before each read it decides for: see :class:`_ColdCache`.
    """
    return _cold.hint()


class _LocalSource:
    """What the local sources share: read-ahead of many ranges is their ``prefetch`` of each."""

    def prefetch(self, start: int, end: int) -> None:
        raise NotImplementedError

    def prefetch_ranges(
        self, starts: NDArray[np.int64], ends: NDArray[np.int64], wait: bool = False
    ) -> None:
        """:meth:`prefetch` of each range (the kernel's page cache does the rest)."""
        for a, b in zip(starts.tolist(), ends.tolist(), strict=True):
            self.prefetch(a, b)


class MmapSource(_LocalSource):
    """The whole tar mapped read-only; ranges are slices of the mapping (no read, no copy).

    Args:
        path: The tar's path, for messages.
        fd: An open descriptor of the tar; the mapping keeps its own duplicate, so the caller
            may close ``fd`` afterwards.
        size: The tar's size in bytes (``> 0``).

    Raises:
        OSError: If the file cannot be mapped.
    """

    zero_copy = True

    def __init__(self, path: str, fd: int, size: int) -> None:
        self.path = path
        self.size = size
        self.mm: mmap.mmap | None = mmap.mmap(fd, 0, access=mmap.ACCESS_READ)

    def read(self, offset: int, size: int) -> bytes:
        """Return a copy of ``size`` bytes at ``offset``.

        Raises:
            TruncatedError: If the range runs past the end of the tar.
            ClosedError: If the source is closed.
        """
        end = offset + size
        mm = self.mm  # once: close() in another thread drops it
        if mm is None:
            raise closed_error(self.path)
        if offset < 0 or size < 0 or end > self.size:
            raise _past_end(self.path, self.size, offset, end)
        return mm[offset:end]

    def read_ranges(
        self, starts: NDArray[np.int64], ends: NDArray[np.int64]
    ) -> tuple[Buffer, NDArray[np.int64]]:
        """Return the mapping itself and ``starts`` (offsets into it are tar offsets).

        The caller has checked the ranges against :attr:`size` (the kernel's guards do); a
        slice past the mapping would come back short, never wrong.

        Raises:
            ClosedError: If the source is closed.
        """
        mm = self.mm
        if mm is None:
            raise closed_error(self.path)
        return mm, starts

    def prefetch(self, start: int, end: int) -> None:
        """``madvise(MADV_WILLNEED)`` over ``[start, end)``: the kernel reads it ahead.

        Given only while blocks read without it take major page faults (:func:`cold_cache`):
        over a warm page cache the hint costs more than the read it speeds up.
        """
        if cold_cache():
            self.willneed(start, end)

    def willneed(self, start: int, end: int) -> None:
        """``madvise(MADV_WILLNEED)`` over ``[start, end)``, whatever the page cache holds."""
        mm = self.mm
        if mm is None or end <= start:
            return
        try:
            p0 = start - start % mmap.PAGESIZE
            mm.madvise(mmap.MADV_WILLNEED, p0, min(end, self.size) - p0)
        except (AttributeError, OSError, ValueError):
            pass

    def close(self) -> None:
        """Drop the mapping; a block handed out, and a read in flight, stay valid.

        The mapping is unmapped (and its descriptor closed) at once, or when the last block
        read from it (or the last read in flight in another thread) lets go of it.
        """
        self.mm = None


class PreadSource(_LocalSource):
    """The tar read with ``os.pread``: one read per range, and no SIGBUS if the tar is cut.

    Args:
        path: The tar's path, for messages.
        fd: An open descriptor of the tar; the source owns it from now on.
        size: The tar's size in bytes.

    Attributes:
        bytes_read: Total bytes read so far (for tests and benchmarks).
        log: If set to a list, every read appends its ``(offset, size)`` to it.
    """

    zero_copy = False

    def __init__(self, path: str, fd: int, size: int) -> None:
        self.path = path
        self.size = size
        self.fd = fd
        self.bytes_read = 0
        self.log: list[tuple[int, int]] | None = None
        self._lock = threading.Lock()
        self._busy = 0  # reads in flight: close() leaves the descriptor to the last of them
        self._closing = False
        reset_after_fork(self)

    def after_fork(self) -> None:
        """In a forked child: a fresh lock, no read in flight (the parent's threads are gone)."""
        self._lock = threading.Lock()
        self._busy = 0

    def read(self, offset: int, size: int) -> bytes:
        """Return ``size`` bytes at ``offset``.

        Raises:
            TruncatedError: If the range runs past the end of the tar, or the tar was cut
                while open (a short read).
            ClosedError: If the source is closed.
        """
        end = offset + size
        if offset < 0 or size < 0 or end > self.size:
            raise _past_end(self.path, self.size, offset, end)
        fd = self._pin()
        try:
            data = os.pread(fd, size, offset)
        finally:
            self._unpin()
        self.bytes_read += len(data)
        if self.log is not None:
            self.log.append((offset, size))
        if len(data) != size:
            raise TruncatedError(
                f"{self.path}: byte {offset + len(data)}: short read ({len(data)} of {size} "
                f"bytes); the tar was cut while open: re-open it once it is complete, or copy "
                f"it again and re-index it (tarindex index --force {self.path})"
            )
        return data

    def fstat(self) -> os.stat_result:
        """``os.fstat`` of the tar's descriptor (the cut and change check), held open meanwhile.

        Raises:
            ClosedError: If the source is closed.
        """
        fd = self._pin()
        try:
            return os.fstat(fd)
        finally:
            self._unpin()

    def _pin(self) -> int:
        """The descriptor, kept ours (not closed, its number not reused) until :meth:`_unpin`."""
        with self._lock:
            if self._closing:
                raise closed_error(self.path)
            self._busy += 1
            return self.fd

    def _unpin(self) -> None:
        with self._lock:
            self._busy -= 1
            if self._closing and not self._busy:
                self._release()

    def read_ranges(
        self, starts: NDArray[np.int64], ends: NDArray[np.int64]
    ) -> tuple[Buffer, NDArray[np.int64]]:
        """One ``pread`` per range, concatenated in the order given.

        Raises:
            TruncatedError: As :meth:`read`.
        """
        if len(starts) == 1:
            return self.read(int(starts[0]), int(ends[0] - starts[0])), np.zeros(1, np.int64)
        lens = ends - starts
        bases = np.zeros(len(starts), np.int64)
        np.cumsum(lens[:-1], out=bases[1:])
        parts = [self.read(a, b - a) for a, b in zip(starts.tolist(), ends.tolist(), strict=True)]
        return b"".join(parts), bases

    def prefetch(self, start: int, end: int) -> None:
        """``posix_fadvise(POSIX_FADV_WILLNEED)`` where the platform has it."""
        if end <= start or not hasattr(os, "posix_fadvise"):
            return
        try:
            fd = self._pin()
        except ClosedError:
            return
        try:
            os.posix_fadvise(fd, start, end - start, os.POSIX_FADV_WILLNEED)
        except OSError:
            pass
        finally:
            self._unpin()

    def close(self) -> None:
        """Close the descriptor: now, or when the last read in flight (another thread's) ends.

        Reads begun after ``close`` raise :class:`~tarindex.errors.ClosedError`. Idempotent.
        """
        with self._lock:
            self._closing = True
            if not self._busy:
                self._release()

    def _release(self) -> None:
        """Close the descriptor (the lock held, no read in flight)."""
        fd, self.fd = self.fd, -1
        if fd >= 0:
            os.close(fd)


class _Forkable(Protocol):
    def after_fork(self) -> None: ...


_locked_sources: weakref.WeakSet[_Forkable] = weakref.WeakSet()
"""The sources of this process that hold a lock: a forked child makes theirs afresh (one held
by another thread at the fork would otherwise stay held forever in the child)."""


def reset_after_fork(src: _Forkable) -> None:
    """Have ``src.after_fork()`` run in every child this process forks from now on."""
    _locked_sources.add(src)


def _after_fork_in_child() -> None:
    for src in list(_locked_sources):
        src.after_fork()


os.register_at_fork(after_in_child=_after_fork_in_child)


def open_source(path: str, fd: int, size: int, use_mmap: bool = True) -> ByteSource:
    """Wrap the open descriptor ``fd`` of the tar at ``path`` (``size`` bytes) in a source.

    With ``use_mmap`` (and a non-empty file) the tar is mapped and ``fd`` is closed, so the
    source holds one descriptor either way.

    Raises:
        OSError: If mapping fails (``fd`` is closed then too).
    """
    if use_mmap and size > 0:
        try:
            return MmapSource(path, fd, size)
        finally:
            os.close(fd)
    return PreadSource(path, fd, size)
