"""Read samples from indexed shards: one shard (ShardReader) or many (ShardSet).

A :class:`ShardReader` mmaps the sidecar index (zero-copy numpy views) and the tar (or uses
``os.pread``), checks the index against the tar at open (FORMAT.md §3), and returns sample
``j`` in O(1). A :class:`ShardSet` maps a global sample index to ``(shard, j)`` from the
per-shard counts in the index headers, and keeps a bounded, per-process LRU of open readers,
so it pickles small and is safe under fork, spawn and forkserver worker processes.
"""

from __future__ import annotations

import bisect
import errno
import mmap
import operator
import os
import stat
import sys
from collections import OrderedDict
from typing import Any

import numpy as np

from .errors import (
    FormatError,
    IndexMissingError,
    SampleIndexError,
    StaleIndexError,
    TarIndexError,
    TruncatedError,
)
from .format.index import IndexTables, decode_index, fingerprint, read_header
from .format.spec import FINGERPRINT_BYTES, HEADER
from .indexfile import index_path_for
from .sources import Source, expand_source

__all__ = ["Sample", "ShardReader", "ShardSet", "read_sample_count", "is_up_to_date"]

Sample = dict[str, Any]


_fork_generation = [0]
"""Bumped in the child after every ``os.fork``: a ShardSet whose generation differs was
inherited from the parent and must drop the parent's readers (cheaper than ``os.getpid()``
on every read)."""


def _bump_fork_generation() -> None:
    _fork_generation[0] += 1


os.register_at_fork(after_in_child=_bump_fork_generation)


def _missing(tar_path: str, index_path: str) -> IndexMissingError:
    return IndexMissingError(
        f"{index_path}: no index for shard {tar_path}; build it with: tarindex index {tar_path}"
    )


def _open_regular(path: str) -> int:
    """``os.open`` read-only without blocking (a FIFO would hang ``open``); regular files only.

    Raises:
        FileNotFoundError, PermissionError, ...: As ``os.open``.
        IsADirectoryError: ``path`` is a directory.
        FormatError: ``path`` is a FIFO, socket or device.
    """
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    mode = os.fstat(fd).st_mode
    if stat.S_ISREG(mode):
        return fd
    os.close(fd)
    if stat.S_ISDIR(mode):
        raise IsADirectoryError(errno.EISDIR, "is a directory, not a shard or index file", path)
    raise FormatError(
        f"{path}: byte 0: not a regular file (mode 0o{mode:o}); expected a tar or index file: "
        f"pass the path of a regular file"
    )


class ShardReader:
    """One open shard: its index (mmapped) and its tar (mmapped, or read with ``os.pread``).

    Args:
        tar_path: Path of the tar.
        index_path: Path of its index. Defaults to ``<tar_path>.tidx``.
        use_mmap: Map the tar into memory (fast). ``False`` reads with ``os.pread``: no SIGBUS
            if the file is truncated while open. Defaults to ``True``.
        full_check: Also verify the index's crc32 footer and table consistency, O(n).
            Defaults to ``False`` (the cheap O(1) checks always run).

    Raises:
        IndexMissingError: No index file.
        FormatError: The index is truncated or corrupt (its subclasses say how, FORMAT.md
            §2.1, §2.7), or the index or tar is a FIFO, socket or device.
        StaleIndexError: The tar's size or content fingerprint differs from the index's
            (FORMAT.md §3).
        FileNotFoundError: The tar itself is missing (its index exists).
        IsADirectoryError: The tar or index path is a directory.
    """

    def __init__(
        self,
        tar_path: str,
        index_path: str | None = None,
        *,
        use_mmap: bool = True,
        full_check: bool = False,
    ) -> None:
        self.tar_path = tar_path
        self.index_path = index_path or index_path_for(tar_path)
        self._imm: mmap.mmap | None = None
        self._mm: mmap.mmap | None = None
        self._fd = -1
        try:
            fi = open(_open_regular(self.index_path), "rb")
        except FileNotFoundError:
            raise _missing(tar_path, self.index_path) from None
        with fi:
            isize = os.fstat(fi.fileno()).st_size
            if isize < HEADER.size:
                raise TruncatedError(
                    f"{self.index_path}: index is {isize} bytes, shorter than its {HEADER.size}-byte "
                    f"header at byte 0; rebuild it with: tarindex index --force {tar_path}"
                )
            self._imm = mmap.mmap(fi.fileno(), 0, access=mmap.ACCESS_READ)
        try:
            self.index: IndexTables = decode_index(
                memoryview(self._imm), self.index_path, full_check=full_check
            )
            self._fd = _open_regular(tar_path)
            self.tar_size = os.fstat(self._fd).st_size
            self._check_fingerprint()
            if use_mmap and self.tar_size:
                self._mm = mmap.mmap(self._fd, 0, access=mmap.ACCESS_READ)
        except BaseException:
            self.close()
            raise
        t = self.index
        self.n_samples = t.n_samples
        self.exts = [e.decode("utf-8", "surrogateescape") for e in t.exts]
        # Hot-path views: memoryview.cast("Q") indexes to Python ints ~3x faster than numpy
        # scalars. The tables are little-endian (FORMAT.md §2); on a big-endian host fall back
        # to numpy views (indexing them also yields ints via int()).
        self._sample_ptr = _fast(t.sample_ptr)
        self._offset = _fast(t.offset)
        self._size = _fast(t.size)
        self._ext_id = _fast(t.ext_id)
        self._key_ptr = _fast(t.key_ptr)
        self._key_blob = memoryview(t.key_blob)
        self._n_members = t.n_members
        self._key_bytes = len(t.key_blob)

    def _corrupt(self, j: int, what: str) -> FormatError:
        return FormatError(
            f"{self.index_path}: sample {j}: {what}; the index is corrupt (checked lazily at read "
            f"time): tarindex verify {self.tar_path}, rebuild with: tarindex index --force "
            f"{self.tar_path}"
        )

    def _check_j(self, j: int) -> None:
        if not 0 <= j < self.n_samples:
            raise SampleIndexError(
                f"{self.tar_path}: sample {j} out of range [0, {self.n_samples})"
            )

    def _check_fingerprint(self) -> None:
        t = self.index
        fix = f"rebuild it with: tarindex index --force {self.tar_path}"
        if self.tar_size != t.tar_size:
            raise StaleIndexError(
                f"{self.tar_path}: tar is {self.tar_size} bytes, its index {self.index_path} was "
                f"made for {t.tar_size} bytes (the tar was replaced, appended to or cut); {fix}"
            )
        fd = self._fd
        head, tail = fingerprint(lambda off, n: os.pread(fd, n, off), self.tar_size)
        if head != t.head_crc or tail != t.tail_crc:
            n = min(FINGERPRINT_BYTES, self.tar_size)
            where = 0 if head != t.head_crc else self.tar_size - n
            raise StaleIndexError(
                f"{self.tar_path}: bytes {where}..{where + n} differ from when {self.index_path} "
                f"was made (the tar was replaced or rewritten); {fix}"
            )

    # -- access ---------------------------------------------------------------------------
    def read(self, offset: int, size: int) -> bytes:
        """Return ``size`` bytes of the tar at byte ``offset``.

        Returns:
            ``size`` bytes (a copy, with or without mmap).

        Raises:
            ValueError: If ``offset`` or ``size`` is negative.
            TruncatedError: If the range runs past the end of the tar (FORMAT.md §2.7: checked
                at read time), or the tar was cut while open (``use_mmap=False``).
        """
        if offset < 0 or size < 0:
            raise ValueError(f"{self.tar_path}: negative range offset={offset} size={size}")
        end = offset + size
        if end > self.tar_size:
            raise TruncatedError(
                f"{self.tar_path}: byte {self.tar_size}: range {offset}..{end} runs past the end "
                f"of the tar; the index is corrupt or the tar was cut: tarindex verify {self.tar_path}"
            )
        if self._mm is not None:
            return self._mm[offset:end]
        data = os.pread(self._fd, size, offset)
        if len(data) != size:
            raise TruncatedError(
                f"{self.tar_path}: byte {offset + len(data)}: short read ({len(data)} of {size} "
                f"bytes); the tar was cut while open: re-open it once it is complete, or copy it "
                f"again and re-index it (tarindex index --force {self.tar_path})"
            )
        return data

    def key(self, j: int) -> str:
        """Return the key of sample ``j`` (``0 <= j < n_samples``), decoded as in FORMAT.md §2.5.

        Raises:
            SampleIndexError: If ``j`` is out of range.
            FormatError: If ``key_ptr`` is corrupt (checked lazily).
        """
        self._check_j(j)
        kp = self._key_ptr
        if not kp[j] <= kp[j + 1] <= self._key_bytes:
            raise self._corrupt(
                j, f"key_ptr {kp[j]}..{kp[j + 1]} outside key_blob[0:{self._key_bytes}]"
            )
        return self._key_blob[kp[j] : kp[j + 1]].tobytes().decode("utf-8", "surrogateescape")

    def member_slice(self, j: int) -> tuple[int, int]:
        """Return the half-open member range ``[lo, hi)`` of sample ``j`` (FORMAT.md §2.2).

        Raises:
            SampleIndexError: If ``j`` is out of range.
            FormatError: If ``sample_ptr`` is corrupt (checked lazily).
        """
        self._check_j(j)
        sp = self._sample_ptr
        lo, hi = int(sp[j]), int(sp[j + 1])
        if not lo <= hi <= self._n_members:
            raise self._corrupt(j, f"sample_ptr {lo}..{hi} outside members [0, {self._n_members}]")
        return lo, hi

    def sample(self, j: int) -> Sample:
        """Return sample ``j`` as ``{"__key__": str, ext: bytes, ...}`` (no ``__shard__``/``__index__``).

        Raises:
            SampleIndexError: If ``j`` is out of range.
            TruncatedError: If a member's range runs past the end of the tar.
            FormatError: If the index tables of sample ``j`` are corrupt (pointers out of
                range, an extension id out of range, an extension twice in the sample).
        """
        if not 0 <= j < self.n_samples:
            raise SampleIndexError(
                f"{self.tar_path}: sample {j} out of range [0, {self.n_samples})"
            )
        kp, sp = self._key_ptr, self._sample_ptr
        k0, k1, lo, hi = kp[j], kp[j + 1], sp[j], sp[j + 1]
        # O(1) guards against a corrupt index that passed the cheap checks at open: pointers
        # that go backwards or past their tables would give a wrong key or a missing member
        if not (k0 <= k1 <= self._key_bytes and lo <= hi <= self._n_members):
            raise self._corrupt(
                j,
                f"key_ptr {k0}..{k1} (key_blob has {self._key_bytes} bytes) or sample_ptr "
                f"{lo}..{hi} ({self._n_members} members) out of range",
            )
        out: Sample = {
            "__key__": self._key_blob[k0:k1].tobytes().decode("utf-8", "surrogateescape")
        }
        exts, offs, sizes, eids = self.exts, self._offset, self._size, self._ext_id
        mm = self._mm
        limit = self.tar_size
        try:
            for m in range(lo, hi):
                off = offs[m]
                end = off + sizes[m]
                if mm is not None and end <= limit:
                    out[exts[eids[m]]] = mm[off:end]
                else:
                    out[exts[eids[m]]] = self.read(off, end - off)
        except IndexError:  # exts[eids[m]]: ext_id out of range
            raise self._corrupt(j, f"ext_id[{m}] = {eids[m]} >= {len(exts)} extensions") from None
        if len(out) != hi - lo + 1:  # an extension twice in one sample: a member would vanish
            raise self._corrupt(j, f"{hi - lo} members but {len(out) - 1} distinct extensions")
        return out

    def sample_byte_range(self, j0: int, j1: int) -> tuple[int, int]:
        """Return ``(start, end)`` in bytes covering the data of samples ``j0 <= j < j1``.

        The range includes the headers in between; read it once for sequential access.
        ``(0, 0)`` when the samples hold no members.

        Raises:
            SampleIndexError: If ``j0`` or ``j1 - 1`` is out of range (when ``j1 > j0``).
            FormatError: If ``sample_ptr`` is corrupt.
        """
        if j1 <= j0:
            return 0, 0
        lo, _ = self.member_slice(j0)
        _, hi = self.member_slice(j1 - 1)
        if hi <= lo:
            return 0, 0
        offs = self.index.offset[lo:hi]
        ends = offs + self.index.size[lo:hi]
        return int(offs.min()), int(ends.max())

    def close(self) -> None:
        """Release the mmaps and the file descriptor (idempotent)."""
        # drop our views first so the index mmap has no exports left when it is closed
        for attr in (
            "_sample_ptr",
            "_offset",
            "_size",
            "_ext_id",
            "_key_ptr",
            "_key_blob",
            "index",
        ):
            if hasattr(self, attr):
                setattr(self, attr, None)
        for attr in ("_mm", "_imm"):
            m = getattr(self, attr, None)
            if m is not None:
                try:
                    m.close()
                except BufferError:
                    pass  # views still alive (numpy arrays handed out); GC closes it later
                setattr(self, attr, None)
        if getattr(self, "_fd", -1) >= 0:
            os.close(self._fd)
            self._fd = -1

    def __enter__(self) -> ShardReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass


def is_up_to_date(tar_path: str | os.PathLike[str], index_path: str | None = None) -> bool:
    """Return True if an index exists for the tar and passes the open-time checks.

    Those are the cheap checks (FORMAT.md §2.7, §3): header, size, end magic, fingerprint. A
    corrupt table inside an otherwise intact index still counts as up to date; ``tarindex
    verify`` catches that.
    """
    try:
        ShardReader(os.fspath(tar_path), index_path).close()
        return True
    except (TarIndexError, OSError):
        return False


def _fast(a: np.ndarray[Any, Any]) -> Any:
    """A zero-copy view of a little-endian table that indexes to Python ints quickly."""
    if sys.byteorder == "little" and a.dtype.itemsize in (4, 8) and len(a):
        return memoryview(a).cast("B").cast("Q" if a.dtype.itemsize == 8 else "I")  # type: ignore[arg-type]
    return a  # big-endian host or empty table: numpy scalars still work as indices


def read_sample_count(tar_path: str, index_path: str | None = None) -> int:
    """Read only the 80-byte index header of a shard and return its sample count.

    Raises:
        IndexMissingError: No index file.
        FormatError: Bad magic, unknown version, truncated header (FORMAT.md §2.1), or the
            index is not a regular file.
    """
    ip = index_path or index_path_for(tar_path)
    try:
        with open(_open_regular(ip), "rb") as f:
            head = f.read(HEADER.size)
    except FileNotFoundError:
        raise _missing(tar_path, ip) from None
    return read_header(head, ip).n_samples


class ShardSet:
    """Many shards as one sequence of samples; global index ``i`` -> ``(shard, j)``.

    Construction reads only the 80-byte header of every index (no tar scan, no per-sample
    objects). Readers open lazily in the process that reads, at most ``max_open`` at a time
    (least recently used closed first), and are never pickled.

    Args:
        source: Shards: a path, list, brace pattern, glob or directory (see
            :func:`tarindex.sources.expand_source`).
        max_open: Bound on simultaneously open shards per process (each holds one file
            descriptor and two mmaps). Defaults to ``64``.
        use_mmap: See :class:`ShardReader`. Defaults to ``True``.

    Raises:
        FileNotFoundError: No shard matches ``source``.
        IndexMissingError: A shard has no index (the message gives the command).
        FormatError: An index header is bad (FORMAT.md §2.1).
    """

    def __init__(self, source: Source, *, max_open: int = 64, use_mmap: bool = True) -> None:
        self.paths = expand_source(source)
        counts = [read_sample_count(p) for p in self.paths]
        self.counts = np.asarray(counts, dtype=np.int64)
        self.starts = np.zeros(len(counts) + 1, dtype=np.int64)
        np.cumsum(self.counts, out=self.starts[1:])
        self._starts_list: list[int] = self.starts.tolist()
        self.max_open = max(1, int(max_open))
        self.use_mmap = use_mmap
        self._readers: OrderedDict[int, ShardReader] = OrderedDict()
        self._gen = _fork_generation[0]

    def __len__(self) -> int:
        return self._starts_list[-1]

    @property
    def n_shards(self) -> int:
        """Number of shards."""
        return len(self.paths)

    def locate(self, i: int) -> tuple[int, int]:
        """Map global sample index ``i`` (negative counts from the end) to ``(shard, j)``.

        Raises:
            SampleIndexError: If ``i`` is out of range.
            TypeError: If ``i`` is not an integer.
        """
        i = operator.index(i)  # TypeError for 1.5 or "3", as list indexing
        n = self._starts_list[-1]
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise SampleIndexError(f"sample index {i} out of range for {n} samples")
        s = bisect.bisect_right(self._starts_list, i) - 1
        return s, i - self._starts_list[s]

    def reader(self, s: int) -> ShardReader:
        """Return the open reader of shard ``s``, opening it (and closing the LRU one) if needed.

        Raises:
            StaleIndexError: If the shard's index changed since this ShardSet was made, or
                no longer matches its tar.
            FormatError: If the index is corrupt (see :class:`ShardReader`).
        """
        if self._gen != _fork_generation[0]:  # forked: the parent's mmaps and fds are not ours
            self._readers = OrderedDict()
            self._gen = _fork_generation[0]
        r = self._readers.get(s)
        if r is not None:
            self._readers.move_to_end(s)
            return r
        r = ShardReader(self.paths[s], use_mmap=self.use_mmap)
        if r.n_samples != self._starts_list[s + 1] - self._starts_list[s]:
            r.close()
            raise StaleIndexError(
                f"{r.index_path}: now holds {r.n_samples} samples, this ShardSet counted "
                f"{self._starts_list[s + 1] - self._starts_list[s]} when it was made (the index was "
                f"rebuilt meanwhile); make a new ShardSet"
            )
        self._readers[s] = r
        while len(self._readers) > self.max_open:
            _, old = self._readers.popitem(last=False)
            old.close()
        return r

    def get(self, i: int) -> Sample:
        """Return global sample ``i`` with ``__key__``, ``__shard__``, ``__index__`` and raw bytes.

        Raises:
            SampleIndexError: If ``i`` is out of range.
            StaleIndexError: As :meth:`reader`.
            FormatError: As :meth:`ShardReader.sample`.
        """
        # locate() and the LRU hit of reader(), inlined: this is the per-sample hot path
        starts = self._starts_list
        if type(i) is not int:
            i = operator.index(i)  # TypeError for 1.5 or "3", as list indexing
        if i < 0:
            i += starts[-1]
        if not 0 <= i < starts[-1]:
            raise SampleIndexError(f"sample index {i} out of range for {starts[-1]} samples")
        s = bisect.bisect_right(starts, i) - 1
        r = self._readers.get(s) if self._gen == _fork_generation[0] else None
        if r is None:
            r = self.reader(s)
        elif len(self._readers) > 1:
            self._readers.move_to_end(s)
        j = i - starts[s]
        out = r.sample(j)
        out["__shard__"] = self.paths[s]
        out["__index__"] = i
        return out

    def close(self) -> None:
        """Close every open reader of this process."""
        for r in self._readers.values():
            r.close()
        self._readers.clear()

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_readers"] = OrderedDict()  # handles are reopened lazily, never pickled
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._gen = _fork_generation[0]
