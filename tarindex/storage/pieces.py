"""A cache entry written in pieces by one writer while other threads and processes read it.

A whole remote shard is downloaded into the cache (:mod:`tarindex.storage.remote.whole`) in
concurrent ranged reads; a reader should not wait for the last byte before it reads the
first. The rules (docs/REMOTE.md, "One download per machine"):

- **One writer.** The writer holds the entry's lock (:meth:`DirCache.lock`, an ``flock``) for
  the whole download, so there is one download per entry on the machine.
- **A progress record in the lock file.** While it holds the lock, the writer keeps in the
  lock file (``<root>/locks/<key>.<name>``) a :data:`HEAD` record (magic, the file's size, the
  grain, the temp file's name in ``<root>/tmp/``) followed by one byte per :data:`GRAIN`
  bytes of the file: ``1`` once every byte of that grain is written (``pwrite`` of the data
  first, then of the grain's crc, then of the flag, from one thread: another process that
  reads the flag ``1`` reads the data and the crc after it from the same page cache), then
  the crc of each grain (4 bytes, little-endian; the ``.sum`` record of the entry). The
  magic names the crc, by the rule of :mod:`tarindex.storage.sums`: ``TIPIECE3`` crc32c
  (google-crc32c compiled), ``TIPIECE2`` zlib's crc32; a reader that cannot compute the
  record's crc reads the bytes another way. The
  temp file is preallocated (``posix_fallocate``) to its full size, so a write never
  extends it, and reserved in the cache's limit when made (:meth:`DirCache.reserve`): a
  download that does not fit beside the entries and the downloads in flight does not start.
- **Readers** (:func:`attach`) open the temp file named by the record and read a range only
  once every grain it touches is flagged (:meth:`PieceReader.wait`) and its bytes match the
  grain's crc (:meth:`PieceReader.check`, once per grain and reader: a flag set by
  someone else, or bytes changed in the temp file, never hand out wrong bytes).
- **The trust boundary: the writing process.** A reader in the process that runs the
  download does not read back the grains that process's writer wrote (:meth:`PieceWriter.written`):
  their crc was computed from the reply's bytes as they were written, the flag was set after
  the ``pwrite`` returned (no torn write), and the bytes are read from the page cache they
  were just written to. The check guards what crosses a process: a reader in another
  process (or a forked child) checks every grain, and a finished entry opened later is
  checked against its ``.sum`` (:meth:`DirCache.open_checked`). What this gives up: a byte
  another process changes in the temp file while this process downloads it is not seen by
  this process's reads of it (as a byte changed in a checked entry after it was opened is
  not); the entry's ``.sum`` still refuses it at its next open. When the download ends
  the temp file is renamed to the entry (same inode: a reader's descriptor now reads the
  entry) and the record is cleared; a reader that sees the record gone or replaced checks
  that the entry is its file. A download that failed or whose process died (the ``flock``
  is free, the record stale) is reported to the reader (``wait`` returns ``False``), which
  then reads those bytes another way.
- **No fsync.** The temp file and the record are never trusted after a crash: a temp file
  becomes an entry only by the rename of a complete download, and the next cache open deletes
  the temp files of dead writers (:class:`DirCache`). What was written is in the page cache
  for every reader on the machine at once; durability is that of any cache entry.
"""

from __future__ import annotations

import fcntl
import os
import stat
import threading
import time
import warnings
from array import array
from collections.abc import Callable

from . import sums
from .cache import DirCache
from .piecewriter import HEAD, PieceWriter, n_grains, parse_head, writer_of
from .sums import CRC32, GRAIN, SUM_SUFFIX, Crc

__all__ = ["GRAIN", "HEAD", "PieceReader", "PieceWriter", "attach"]


_POLL_S = (0.0005, 0.005)
"""A waiting reader polls the flags first every 0.5 ms, backing off to 5 ms."""


class PieceReader:
    """A reader's view of a download another thread or process writes (see module docs).

    Args:
        cache: The cache.
        key: The entry's key.
        name: The entry's name.
        lock_path: The entry's lock file (holding the record).
        fd: The temp file, opened read-only (the caller owns it).
        size: The file's size in bytes.
        grain: Bytes per flag.
        tmp_name: The temp file's name the record gave.
        kind: The grains' crc the record names (:data:`~tarindex.storage.sums.CRC32` or
            :data:`~tarindex.storage.sums.CRC32C`).
    """

    def __init__(
        self,
        cache: DirCache,
        key: str,
        name: str,
        lock_path: str,
        fd: int,
        size: int,
        grain: int,
        tmp_name: bytes,
        kind: str = CRC32,
    ) -> None:
        self.cache = cache
        self.key = key
        self.name = name
        self.lock_path = lock_path
        self.size = size
        self.grain = grain
        self.tmp_name = tmp_name
        self.kind = kind
        self._me = (size, grain, tmp_name, kind)  # the record's fields (parse_head)
        self.ino = os.fstat(fd).st_ino
        w = writer_of(tmp_name)
        # this process's own download of this very file: its grains need no read-back
        self._own = w if w is not None and w.ino == self.ino and w.pid == os.getpid() else None
        self._seen = bytearray(n_grains(size, grain))
        self._ok = bytearray(len(self._seen))  # grains whose bytes this reader checked
        # the record's crc of each grain seen flagged (taken with the flags: _refresh)
        self._rcrcs = array("I", bytes(4 * len(self._seen)))
        self._has = bytearray(len(self._seen))  # grains whose record crc is in _rcrcs
        self._crcs: tuple[array[int], Crc] | None = None  # the entry's, once the record is gone
        self._warned = False
        self._left = len(self._seen)
        self._lock = threading.Lock()
        self._rec = cache.open_entry(lock_path)
        self.complete = self._left == 0
        """Every byte of the file is written (no more waiting, no more record reads)."""
        self._entry = False
        self.failed = False
        """The download ended without this file becoming the entry (its writer failed)."""

    @property
    def settled(self) -> bool:
        """Whether the download is over and the file is the entry now (renamed, complete)."""
        if not self.complete:
            return False
        if not self._entry:
            self._entry = self._is_entry()
        return self._entry

    def close(self) -> None:
        """Close the record's descriptor (idempotent)."""
        fd, self._rec = self._rec, -1
        if fd >= 0:
            os.close(fd)

    def __del__(self) -> None:
        self.close()

    def ready(self, start: int, end: int) -> bool:
        """Whether bytes ``[start, end)`` are written (one ``pread`` of the flags if not known)."""
        if self.complete or end <= start:
            return True
        g0, g1 = start // self.grain, n_grains(end, self.grain)
        if all(self._seen[g0:g1]):
            return True
        self._refresh()
        return self.complete or all(self._seen[g0:g1])

    def reached(self, start: int, end: int, piece: int) -> bool:
        """Whether the download has reached bytes ``[start, end)``: written, or arriving next.

        A grain not yet written is arriving next when the grain before it in the same
        ``piece``-byte piece (the writer's ranged read holding both: pieces start on
        multiples of ``piece``, their bodies arrive in order) is written. A read of bytes not
        reached would wait for the earlier bytes of its piece, or for a request not yet
        answered: the caller reads them another way instead.
        """
        if self.ready(start, end):
            return True
        w = writer_of(self.tmp_name)
        if w is not None and w.arriving(start, end):
            return True  # written by this process, which knows the replies it awaits
        per = max(1, piece // self.grain)
        seen = self._seen
        for g in range(start // self.grain, n_grains(end, self.grain)):
            if not seen[g] and (g % per == 0 or not seen[g - 1]):
                return False
        return True

    def wait(self, start: int, end: int) -> bool:
        """Wait until bytes ``[start, end)`` are written; ``False`` if they never will be.

        ``False``: the download failed, or its process died, before writing them (the
        caller reads them another way). Polls the flags (0.5 ms, backing off to 5 ms).
        """
        delay = _POLL_S[0]
        while not self.ready(start, end):
            if self.failed or not self._alive():
                return self.ready(start, end)
            time.sleep(delay)
            delay = min(delay * 2, _POLL_S[1])
        return True

    @property
    def checked(self) -> bool:
        """Whether this reader checked every grain (reads need no :meth:`check`)."""
        return self.complete and all(self._ok)

    def check(self, read: Callable[[int, int], bytes], start: int, end: int) -> bool:
        """Check bytes ``[start, end)`` (written: :meth:`wait`) against their grains' crcs.

        Each grain is checked once per reader (its bytes read whole with ``read(offset,
        size)``, ``bytes``): against the crc the writer put in the record (taken as its flag
        was seen: a commit that clears the record after that loses nothing), or, once the
        download ended, the entry's ``.sum`` record. A grain this process's own writer
        wrote (the download runs here, into this reader's file) is not read back: its crc
        was taken from the reply's bytes as they were written (the trust boundary is the
        process; see the module docs). ``False``: a grain differs (a ``RuntimeWarning``
        names the temp file and the bytes), or its crc cannot be computed (a crc32c without
        google-crc32c, warned once per reader), or cannot be had (the download failed, or
        its entry was evicted or replaced before this reader read the crc: no warning,
        nothing failed); the caller reads those bytes another way, never these.
        """
        g0, g1 = start // self.grain, n_grains(end, self.grain)
        if end <= start or all(self._ok[g0:g1]):
            return True
        own = self._own
        if own is not None and own.pid != os.getpid():
            own = self._own = None  # (a forked child: the parent's grains are another's)
        for g in range(g0, g1):
            if self._ok[g]:
                continue
            if own is not None and own.written(g):
                self._ok[g] = 1  # written here, its crc taken from the reply's bytes
                continue
            a = g * self.grain
            b = min(a + self.grain, self.size)
            got = self._crc_of(g)
            if got is None and sums.crc_of(self.kind) is None:
                if not self._warned:
                    self._warned = True
                    warnings.warn(
                        f"{self.lock_path}: the download of {self.key}/{self.name} checks its "
                        f"grains with a {self.kind}, which this process cannot compute "
                        f"(pip install google-crc32c); its bytes are read from the server",
                        RuntimeWarning,
                        stacklevel=3,
                    )
                return False
            if got is None or got[1](read(a, b - a), 0) != got[0]:
                if got is None:  # (not a failed check: bytes with no crc left to check them)
                    return False
                warnings.warn(
                    f"{self.cache.root}/tmp/{self.tmp_name.decode('ascii', 'replace')}: bytes "
                    f"{a}..{b} of the download of {self.key}/{self.name} fail their check "
                    f"(they differ from their crc: the file or its progress record "
                    f"{self.lock_path} was changed by someone else); read from the server "
                    f"instead",
                    RuntimeWarning,
                    stacklevel=3,
                )
                return False
            self._ok[g] = 1
        return True

    def _crc_of(self, g: int) -> tuple[int, Crc] | None:
        """The crc of grain ``g`` (flagged) and its function, or ``None``.

        From the record (taken with the flags by :meth:`_refresh`, else read now), else the
        entry's ``.sum`` (the download committed: the record is cleared, or was cleared
        between two reads of it); ``None``: none to be had (the entry evicted or replaced
        before its record was read), or not computable here.
        """
        f = sums.crc_of(self.kind)
        if self._has[g] and f is not None:
            return self._rcrcs[g], f
        if self._crcs is None and self._rec >= 0 and f is not None:
            got = self._record_crcs(g, g + 1)
            if got is not None and got[0][0]:
                return got[1][0], f
        if self._crcs is None:
            self._load_sums()
        if self._crcs is None:
            return None
        return self._crcs[0][g], self._crcs[1]

    def _record_crcs(self, g0: int, g1: int) -> tuple[bytes, array[int]] | None:
        """The flags and crcs of grains ``g0 <= g < g1`` in the record, or ``None``.

        ``None``: the record is not this download's any more (cleared by its commit or
        abort). The flags are read first, then the crcs (a writer writes a grain's crc
        before its flag), then the header: still this download's, so both reads were of
        its record (a record once cleared never comes back: a new one names another temp
        file). A grain's crc is its writer's only where its flag read ``1``.
        """
        fd, n = self._rec, len(self._seen)
        if fd < 0 or g1 <= g0:
            return None
        flags = os.pread(fd, g1 - g0, HEAD.size + g0)
        raw = os.pread(fd, 4 * (g1 - g0), HEAD.size + n + 4 * g0)
        head = os.pread(fd, HEAD.size, 0)
        if len(flags) != g1 - g0 or len(raw) != 4 * (g1 - g0) or parse_head(head) != self._me:
            return None
        crcs = array("I")  # (as the writer wrote them: Grains.crcs, this machine's order)
        crcs.frombytes(raw)
        return bytes(f == 1 for f in flags), crcs

    def _load_sums(self) -> None:
        """Read the entry's ``.sum`` record if the entry is this download's file."""
        if self._crcs is not None or not self._is_entry():
            return
        try:
            fd = self.cache.open_entry(self.cache.path(self.key, self.name) + SUM_SUFFIX)
        except OSError:
            return
        with open(fd, "rb") as fh:
            rec = fh.read(sums.sums_size(self.size) + 1)
            got = sums.decode_sums(self.key, self.name, rec, self.size)
        f = None if isinstance(got, str) else sums.crc_of(got[2])
        if isinstance(got, str) or got[0] != self.grain or f is None:
            return
        self._crcs = got[1], f

    def _refresh(self) -> None:
        """Read the record's flags; a record gone or replaced means the download ended."""
        fd = self._rec
        if fd < 0:
            return
        n = len(self._seen)
        data = os.pread(fd, HEAD.size + n, 0)
        if len(data) == HEAD.size + n and parse_head(data[: HEAD.size]) == self._me:
            flags = data[HEAD.size :]
            new = []
            if flags.count(1) != self._has.count(1):  # (C speed: most polls see nothing new)
                new = [g for g in range(n) if flags[g] == 1 and not self._has[g]]
            # their crcs now, while the record is there: read after the commit cleared it
            # (or the entry was evicted) they would be lost, the grain fetched again
            got = self._record_crcs(new[0], new[-1] + 1) if new else None
            with self._lock:
                if got is not None:
                    for g in new:
                        if got[0][g - new[0]]:
                            self._rcrcs[g] = got[1][g - new[0]]
                            self._has[g] = 1
                self._seen = bytearray(a | b for a, b in zip(self._seen, flags, strict=True))
                self._left = self._seen.count(0)
                if not self._left:
                    self.complete = True
            return
        self._ended()

    def _is_entry(self) -> bool:
        """Whether the entry is this download's file (renamed: same inode, full size)."""
        try:
            st = os.lstat(self.cache.path(self.key, self.name))
        except OSError:
            return False
        return stat.S_ISREG(st.st_mode) and st.st_ino == self.ino and st.st_size == self.size

    def _ended(self) -> None:
        """The record is not this download's: complete if the entry is our file, else failed."""
        if self._is_entry():
            self._load_sums()  # now: an entry evicted later takes its .sum with it
            self.complete = self._entry = True
            self._left = 0
        else:
            self.failed = True

    def _alive(self) -> bool:
        """Whether the writer still holds the entry's lock (else: ended, see :meth:`_ended`)."""
        fd = self._rec
        if fd < 0:
            return False
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        fcntl.flock(fd, fcntl.LOCK_UN)
        self._refresh()  # the last flags, or the rename seen
        if not self.complete:
            self._ended()
        return False


def attach(cache: DirCache, key: str, name: str, size: int) -> tuple[int, PieceReader] | None:
    """Join the download of entry ``(key, name)`` that holds its lock now, if it has a record.

    Returns:
        ``(fd, reader)``: a read-only descriptor of the temp file being written (the caller
        owns it; after the rename it is the entry's) and its :class:`PieceReader`; ``None``
        if no download of ``size`` bytes is recorded (none running, or not started yet).
    """
    lp = cache.lock_path(key, name)
    try:
        rec = cache.open_entry(lp)  # (a regular file: a FIFO planted there would block)
    except OSError:
        return None
    try:
        head = os.pread(rec, HEAD.size, 0)
    except OSError:  # (not a file: a planted directory, removed by the next lock)
        return None
    finally:
        os.close(rec)
    got = parse_head(head) if len(head) == HEAD.size else None
    if got is None or got[0] != size or b"/" in got[2] or not got[2]:
        return None
    tmp = os.path.join(cache.root, "tmp", got[2].decode("ascii", "replace"))
    try:
        fd = cache.open_entry(tmp)
    except OSError:
        return None
    try:
        return fd, PieceReader(cache, key, name, lp, fd, size, got[1], got[2], got[3])
    except BaseException:
        os.close(fd)
        raise
