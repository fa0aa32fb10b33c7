"""The writer's side of a download read while it runs: its temp file and progress record.

The rules, and the reader's side, are in :mod:`tarindex.storage.pieces`: one writer per
entry (its lock held), a :data:`HEAD` record then one flag and one crc per grain in the lock
file, each grain flagged only once its bytes and then its crc are written.
"""

from __future__ import annotations

import errno
import os
import struct
import threading
from collections.abc import Sequence
from functools import partial

from .cache import DirCache
from .inorder import InOrder
from .sums import CRC32, CRC32C, GRAIN, Grains

__all__ = ["HEAD", "KINDS", "PieceWriter", "n_grains", "parse_head", "writer_of"]


HEAD = struct.Struct("<8sQQ104s")
"""The progress record's header (128 bytes): magic, file size, grain, temp file name."""

_MAGIC = b"TIPIECE2"  # grains' crc: zlib crc32
_MAGIC_C = b"TIPIECE3"  # grains' crc: crc32c
KINDS = {_MAGIC: CRC32, _MAGIC_C: CRC32C}


def n_grains(size: int, grain: int) -> int:
    """Grains of ``grain`` bytes in ``size`` bytes (the last one may be short)."""
    return -(-size // grain) if size else 0


_writing: dict[bytes, PieceWriter] = {}
"""Temp file name -> the writer of that download in this process (:meth:`PieceReader.reached`)."""
_writing_lock = threading.Lock()


def writer_of(tmp_name: bytes) -> PieceWriter | None:
    """This process's writer of the download into temp file ``tmp_name``, if it runs here."""
    with _writing_lock:
        return _writing.get(tmp_name)


def _forget_writers() -> None:
    _writing.clear()  # the parent's writers do not write here


os.register_at_fork(after_in_child=_forget_writers)


class PieceWriter:
    """The temp file of one download and its progress record (the lock holder's side).

    Args:
        cache: The cache the entry goes into.
        lock_fd: The entry's lock, held (:meth:`DirCache.lock`); the record is written there.
        size: The file's size in bytes.
        grain: Bytes per flag. Defaults to :data:`GRAIN`.
        coming: Byte ranges ``[(start, end)]`` written or requested at once (as
            :meth:`coming`), marked before the record is written: a reader in this process
            that joins the download waits for them from the first moment, never fetches
            them again.

    Raises:
        OSError: The temp file cannot be made or preallocated (``ENOSPC``: the disk is full,
            or it does not fit the cache's limit beside the downloads in flight).
    """

    def __init__(
        self,
        cache: DirCache,
        lock_fd: int,
        size: int,
        grain: int = GRAIN,
        coming: Sequence[tuple[int, int]] = (),
    ) -> None:
        self.cache = cache
        self.lock_fd = lock_fd
        self.size = size
        self.grain = grain
        # counted against the cache's limit from now on, preallocated (DirCache.reserve)
        tmp = cache.reserve(size)
        if tmp is None:
            raise OSError(
                errno.ENOSPC,
                f"{cache.root}: {size} bytes do not fit the cache's limit ({cache.limit} bytes) "
                f"beside the downloads running now",
            )
        self.tmp = tmp
        # the sinks' chunks: crc, pwrite and flags on a thread of their own, in order
        self._out = InOrder(f"tarindex-write-{os.path.basename(tmp)}")
        self.fd = os.open(self.tmp, os.O_RDWR | os.O_NOFOLLOW)
        self.ino = os.fstat(self.fd).st_ino
        """The temp file's inode (the entry's once renamed)."""
        self.pid = os.getpid()
        """The writing process (:meth:`PieceReader.check` trusts its own grains in it alone)."""
        self._lock = threading.Lock()
        n = n_grains(size, grain)
        self._done = bytearray(n)
        self._left = [grain] * n  # bytes of each grain not written yet
        if n and size % grain:
            self._left[-1] = size % grain
        self._mixed = bytearray(n)  # grains written by more than one range
        self._arriving: list[tuple[int, int]] = list(coming)  # ranges arriving now
        self.grains = Grains(size, grain)
        """The crc of each grain, as the sinks write them (the entry's ``.sum`` record)."""
        name = os.path.basename(self.tmp).encode()
        self.tmp_name = name
        with _writing_lock:  # before the record: a reader joining it knows what is coming
            _writing[name] = self
        try:
            magic = _MAGIC_C if self.grains.kind == CRC32C else _MAGIC
            head = HEAD.pack(magic, size, grain, name)
            os.ftruncate(lock_fd, 0)
            os.pwrite(lock_fd, head + bytes(5 * len(self._done)), 0)
        except BaseException:
            self._close()
            cache.discard_path(self.tmp)
            raise

    def arriving(self, start: int, end: int) -> bool:
        """Whether every byte of ``[start, end)`` is written or in a reply arriving now.

        A reader in this process then waits for them (they come with the reply) instead of
        fetching them again.
        """
        g = self.grain
        with self._lock:
            todo = [k for k in range(start // g, n_grains(end, g)) if not self._done[k]]
            if not todo:
                return True
            spans = list(self._arriving)
        for k in todo:
            a, b = max(start, k * g), min(end, (k + 1) * g)
            if not any(x <= a and b <= y for x, y in spans):
                return False
        return True

    def coming(self, start: int, end: int) -> None:
        """Bytes ``[start, end)`` are requested now (:meth:`arriving`: a read waits for them)."""
        with self._lock:
            if (start, end) not in self._arriving:
                self._arriving.append((start, end))

    def sink(self, start: int, end: int) -> RangeSink:
        """The sink of the ranged read of bytes ``[start, end)``.

        The ranges of one download never overlap; together they cover the file. A range
        may start or end inside a grain (beside bytes :meth:`fill` wrote): that grain's
        crc is then computed from the file once all its bytes are written.
        """
        self._share(start, end)
        return RangeSink(self, start, end)

    def fill(self, start: int, data: bytes) -> None:
        """Write bytes ``[start, start + len(data))`` of the file, already in memory.

        Bytes this process fetched before the download started (a stream's first window,
        read by ranges): the download fetches only the others. Flags the grains it
        completes.
        """
        end = start + len(data)
        self._share(start, end)
        self.write(start, data)
        g, crc = self.grain, self.grains.crc
        for k in range(-(-start // g) * g, end, g):  # the grains it holds whole
            if k + g <= end or end == self.size:
                self.grains.crcs[k // g] = crc(data[k - start : k - start + g], 0)
        self.wrote(start, end)

    def _share(self, start: int, end: int) -> None:
        """Note the grains range ``[start, end)`` holds only part of (their crc: from the file)."""
        g = self.grain
        if end <= start:
            return
        with self._lock:
            if start % g:
                self._mixed[start // g] = 1
            if end % g and end != self.size:
                self._mixed[(end - 1) // g] = 1

    def put(self, sink: RangeSink, at: int, chunk: bytes) -> None:
        """Queue ``chunk`` of ``sink``'s reply for the download's writer thread.

        The caller (the event loop's thread) goes back to receiving at once; the writer
        thread runs :meth:`RangeSink.take` on the chunks in the order they were queued
        (:class:`~tarindex.storage.inorder.InOrder`, bounded at 32 MiB queued).

        Raises:
            OSError: An earlier chunk failed to be written (``EIO``): the reply is abandoned
                and the download fails with it (:meth:`commit`).
        """
        self._out.put(partial(sink.take, at, chunk), len(chunk))

    def flush(self) -> None:
        """Wait until the sinks' chunks queued so far are written and flagged.

        Raises:
            OSError: A chunk failed to be written.
        """
        self._out.flush()

    def write(self, at: int, data: bytes | memoryview) -> None:
        """Write ``data`` at byte ``at`` of the file (no flag set)."""
        mv = memoryview(data)
        while mv:
            n = os.pwrite(self.fd, mv, at)
            mv, at = mv[n:], at + n

    def wrote(self, start: int, end: int) -> None:
        """Count bytes ``[start, end)`` as written (once each); flag the grains now complete.

        A grain written by more than one range gets its crc from the file here.
        """
        g = self.grain
        done: list[int] = []
        with self._lock:
            for k in range(start // g, n_grains(end, g)):
                a, b = max(start, k * g), min(end, (k + 1) * g)
                if b > a and self._left[k] > 0:
                    self._left[k] -= b - a
                    if self._left[k] <= 0:
                        done.append(k)
        for k in done:
            if self._mixed[k]:
                a = k * g
                n = min(g, self.size - a)
                self.grains.crcs[k] = self.grains.crc(os.pread(self.fd, n, a), 0)
        for k in done:
            self.mark(k, k + 1)

    def mark(self, g0: int, g1: int) -> None:
        """Flag grains ``g0 <= g < g1`` as written (their bytes are in the file)."""
        if g1 <= g0:
            return
        with self._lock:
            self._done[g0:g1] = b"\x01" * (g1 - g0)
        n = len(self._done)
        os.pwrite(self.lock_fd, self.grains.crcs[g0:g1].tobytes(), HEAD.size + n + 4 * g0)
        os.pwrite(self.lock_fd, b"\x01" * (g1 - g0), HEAD.size + g0)

    @property
    def complete(self) -> bool:
        """Whether every grain is flagged."""
        return all(self._done)

    def written(self, g: int) -> bool:
        """Whether this writer wrote every byte of grain ``g`` (and its crc, from those bytes)."""
        return bool(self._done[g])

    def commit(self, key: str, name: str) -> bool:
        """Insert the complete file as entry ``(key, name)``, then clear the record.

        The entry gets its ``.sum`` record (the crc of each grain, computed as the bytes
        arrived), which every other process checks before it reads the entry
        (:meth:`DirCache.open_checked`); this process takes it as checked while the file is
        the one it renamed into place (:func:`~tarindex.storage.sums.vouch`).

        Returns:
            As :meth:`DirCache.put_file` (``False``: it does not fit the cache's limit).

        Raises:
            OSError: A chunk failed to be written (by the writer thread, :meth:`put`).
        """
        self.flush()  # every chunk written and flagged (or its error raised here)
        for k in range(len(self._mixed)):  # (a retried range's crc could have run over them)
            if self._mixed[k]:
                a = k * self.grain
                n = min(self.grain, self.size - a)
                self.grains.crcs[k] = self.grains.crc(os.pread(self.fd, n, a), 0)
        self._close()
        crcs: list[int] | bool = list(self.grains.crcs)
        if self.grain != GRAIN:
            crcs = True  # the record's grain is GRAIN: read the file once
        try:
            # own: the crcs came from the replies' bytes in this process (the reads of this
            # process do not check its own grains; nor, then, the entry they became)
            return self.cache.put_file(key, name, self.tmp, crcs, self.grains.kind, own=True)
        finally:
            os.ftruncate(self.lock_fd, 0)

    def abort(self) -> None:
        """Clear the record and delete the temp file (a failed download; idempotent)."""
        self._close()
        try:
            os.ftruncate(self.lock_fd, 0)
        except OSError:
            pass
        self.cache.discard_path(self.tmp)

    def _close(self) -> None:
        self._out.stop()  # (before the descriptor closes: no write lands on a reused number)
        with _writing_lock:
            if _writing.get(getattr(self, "tmp_name", b"")) is self:
                del _writing[self.tmp_name]
        fd, self.fd = self.fd, -1
        if fd >= 0:
            os.close(fd)


class RangeSink:
    """Writes one ranged reply's body in place as it arrives and flags each grain it completes.

    Called as ``sink(at, chunk)`` (a :data:`~tarindex.storage.remote.transport.Sink`) on the
    event loop's thread: ``at`` is the chunk's offset from the range's start, in order; a
    retry starts at 0 again. The chunk is queued (:meth:`PieceWriter.put`) and the download's
    writer thread takes it (:meth:`take`), in order: the crc of each grain is computed on the
    way (:attr:`PieceWriter.grains`), the bytes written, then the grains they complete
    flagged. The loop receives the next chunk meanwhile.
    """

    def __init__(self, w: PieceWriter, start: int, end: int) -> None:
        self.w = w
        self.start = start
        self.end = end
        self._crc = 0
        self._top = start  # bytes before it were written (a retry writes them again)

    def __call__(self, at: int, chunk: bytes) -> None:
        if at == 0 and self._top == self.start:
            self.w.coming(self.start, self.end)  # its reply is arriving
        self.w.put(self, at, chunk)

    def take(self, at: int, chunk: bytes) -> None:
        """Crc, write, then flag ``chunk`` (on the writer thread, in the order they came)."""
        w = self.w
        pos = self.start + at
        if at == 0:
            self._crc = 0  # (again, for a retry)
        self._crc = w.grains.feed(pos, chunk, self._crc)
        w.write(pos, chunk)
        top = pos + len(chunk)
        if top > self._top:  # counted once, whatever the retries
            w.wrote(max(pos, self._top), top)
            self._top = top


def parse_head(head: bytes) -> tuple[int, int, bytes, str] | None:
    """``(size, grain, temp file name, grain crc)`` of a record's header, or ``None``."""
    try:
        magic, size, grain, name = HEAD.unpack(head)
    except struct.error:
        return None
    kind = KINDS.get(magic)
    if kind is None or grain <= 0:
        return None
    return size, grain, name.rstrip(b"\0"), kind
