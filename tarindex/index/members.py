"""The member table of a scanned tar: :class:`Members`, built from one header walk's lists.

:mod:`tarindex.index.scan` walks the headers; :func:`assemble_members` turns what it recorded
(header offsets, sizes, names resolved from the fields or from pax / GNU records, the entries
that are not members) into arrays, and takes the tar's fingerprint (FORMAT.md §3) and data end
from the same mapping.
"""

from __future__ import annotations

import mmap
import zlib
from dataclasses import dataclass, field

import numpy as np
from numpy.typing import NDArray

from ..format.index import fingerprint
from ..format.keys import NO_SAMPLE, no_sample_members, no_sample_reason, normalize_name
from ..format.spec import BLOCK, OFFSET_DTYPE

__all__ = ["Members", "assemble_members", "data_end"]


@dataclass
class Members:
    """The regular-file members of one tar, in archive order.

    ``names`` are decoded UTF-8 with ``surrogateescape`` (so non-UTF-8 bytes round-trip via
    ``os.fsencode``); ``raw_names`` keep the bytes.
    """

    path: str
    """The tar's path."""
    raw_names: list[bytes]
    """Member names as stored (after ustar prefix, GNU and pax long-name resolution), length ``m``."""
    offset: NDArray[np.uint64]
    """Shape ``(m,)``, ``<u8``: data offset of each member in bytes from the start of the tar.
    The member's own ustar header block is the 512 bytes right before it."""
    size: NDArray[np.uint64]
    """Shape ``(m,)``, ``<u8``: data size of each member in bytes."""
    tar_size: int
    """Size of the tar in bytes."""
    head_crc: int
    """crc32 of the tar's first ``min(4096, tar_size)`` bytes (the fingerprint, FORMAT.md §3)."""
    tail_crc: int
    """crc32 of the tar's last ``min(4096, tar_size)`` bytes (FORMAT.md §3)."""
    special: list[tuple[int, str, str]] = field(default_factory=list)
    end: int = -1
    """Byte offset where the tar's data ends: every byte from there on is zero (the end of
    the last non-zero 512-byte block; FORMAT.md §2.8.1)."""
    member_crc: NDArray[np.uint32] | None = None
    """Shape ``(m,)``: zlib crc32 of each member's data, with ``checksums=True``."""
    """``(header offset, name, kind)`` of every entry that is not a regular-file member, in
    archive order: directories, links (``"symlink to <target>"``, ``"hard link to
    <target>"``), devices, fifos, volume labels, sparse files, unknown types, ..."""
    _skipped: list[tuple[str, str]] | None = field(
        default=None, init=False, repr=False, compare=False
    )

    @property
    def skipped(self) -> list[tuple[str, str]]:
        """``(name, reason)`` for every entry that is in no sample, in archive order.

        The :attr:`special` entries (reason = their kind), and each regular file the key
        rule leaves out (FORMAT.md §4; reason ``"in no sample: no extension"``, ``"in no
        sample: hidden name (starts with '.')"``, ...); those regular files are also in
        ``raw_names``. Worked out on first use (a few numpy passes over the names), so a scan
        that only builds an index does not pay for it.
        """
        if self._skipped is None:
            names = self.raw_names
            entries = list(self.special)
            hdr = (self.offset.astype(np.int64) - BLOCK).tolist()
            for i in no_sample_members(names).tolist():
                n = names[i].decode("utf-8", "surrogateescape")
                entries.append((hdr[i], n, no_sample_reason(names[i]) or NO_SAMPLE))
            entries.sort(key=_first)
            self._skipped = [(n, why) for _, n, why in entries]
        return self._skipped

    def shadowed(self) -> dict[int, int]:
        """Members replaced by a later member of the same name: ``{earlier: the last copy}``.

        Names are compared normalized (FORMAT.md §4: ``./a.png`` is ``a.png``), as tar
        extraction and the index see them: the last copy is the one extracted and indexed.
        Member numbers are positions in :attr:`raw_names`.
        """
        last: dict[bytes, int] = {}
        for i, n in enumerate(self.raw_names):
            last[normalize_name(n)] = i
        return {i: j for i, n in enumerate(self.raw_names) if (j := last[normalize_name(n)]) != i}

    @property
    def names(self) -> list[str]:
        """Member names as str (UTF-8, undecodable bytes as surrogate escapes)."""
        return [n.decode("utf-8", "surrogateescape") for n in self.raw_names]

    def __len__(self) -> int:
        return len(self.raw_names)


def _first(entry: tuple[int, str, str]) -> int:
    return entry[0]


def data_end(mm: mmap.mmap, size: int) -> int:
    """Return the end of the last 512-byte block holding a non-zero byte.

    ``size`` if the file does not end in whole zero blocks. Read backwards from the end,
    32 KiB at a time (the zero tail is a few records at most).
    """
    end = size - size % BLOCK
    if end != size and mm[end:size].strip(b"\0"):
        return size
    step = 64 * BLOCK
    while end > 0:
        lo = max(0, end - step)
        chunk = np.frombuffer(mm, np.uint8, count=end - lo, offset=lo).reshape(-1, BLOCK)
        nz = np.flatnonzero(chunk.any(axis=1))
        if len(nz):
            return lo + (int(nz[-1]) + 1) * BLOCK
        end = lo
    return 0


def assemble_members(
    path: str,
    mm: mmap.mmap,
    tar_size: int,
    mpos: list[int],
    msize: list[int],
    fast_names: list[bytes],
    names_by_member: dict[int, bytes],
    dirs: list[int],
    special: list[tuple[int, str, str]],
    checksums: bool,
) -> Members:
    """Build the member table of a finished header walk (the walk's lists become arrays).

    Args:
        path: The tar's path.
        mm: The tar, mapped (the fingerprint, the data end and the crc32s are read from it).
        tar_size: The tar's size in bytes.
        mpos: Header offset of every member, archive order.
        msize: Data size of every member.
        fast_names: Names from the name/prefix fields, one per member.
        names_by_member: Member number -> name resolved from a pax or GNU record (wins).
        dirs: Member numbers whose header name ends in ``/`` (v7 directories, unless a
            record renamed them): moved to ``special`` as directories.
        special: ``(header offset, name, kind)`` of the entries that are not members; sorted
            in place into archive order.
        checksums: Also compute each member's crc32 (reads all the data).

    Returns:
        The :class:`Members`, with the fingerprint (FORMAT.md §3) taken from ``mm``.
    """
    names = fast_names
    for i, n in names_by_member.items():
        names[i] = n
    offset = (np.array(mpos, np.int64) + BLOCK).astype(OFFSET_DTYPE)
    size = np.array(msize, OFFSET_DTYPE)
    skipped = special
    dirs = [i for i in dirs if i not in names_by_member]
    if dirs:
        keep = np.ones(len(names), bool)
        keep[dirs] = False
        for i in dirs:
            skipped.append((mpos[i], names[i].decode("utf-8", "surrogateescape"), "directory"))
        names = [n for i, n in enumerate(names) if keep[i]]
        offset, size = offset[keep], size[keep]
    skipped.sort(key=_first)  # v7 directories found in batches go in their place
    head, tail = fingerprint(lambda off, n: mm[off : off + n], tar_size)
    crc = None
    if checksums:  # opt-in: reads every member's data
        with memoryview(mm) as mv:
            crc = np.array(
                [
                    zlib.crc32(mv[o : o + n])
                    for o, n in zip(offset.tolist(), size.tolist(), strict=True)
                ],
                np.uint32,
            )
    return Members(
        path=path,
        raw_names=names,
        offset=offset,
        size=size,
        tar_size=tar_size,
        head_crc=head,
        tail_crc=tail,
        special=skipped,
        end=data_end(mm, tar_size),
        member_crc=crc,
    )
