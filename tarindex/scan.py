"""Walk the headers of an existing tar and build its index, whatever tool made it.

The walk reads only header blocks (via mmap; member data is skipped, never read) and
understands: v7, old GNU, GNU and POSIX ustar headers; the ustar prefix field; GNU
LongName ('L') and LongLink ('K') records; pax extended ('x') and global ('g') headers,
including ``path`` and ``size`` overrides; base-256 numbers; the signed-checksum variant;
concatenated archives (zero blocks in the middle, as ``tar --ignore-zeros`` reads them).
Sources: POSIX.1-2001 "pax Interchange Format", GNU tar manual "Basic Tar Format".

What is indexed: regular files (typeflag '0', NUL, '7'). Not samples: directories,
symlinks, hard links, character/block devices, fifos, GNU volume labels, GNU dumpdirs.
GNU sparse members ('S', or pax ``GNU.sparse.*``) and multi-volume continuations ('M')
are not contiguous bytes in the tar: they are skipped with a warning (FORMAT.md §5).
"""

from __future__ import annotations

import mmap
import os
import warnings
import zlib
from dataclasses import dataclass, field

import numpy as np
from numpy.typing import NDArray

from .errors import (
    ChecksumError,
    CompressedTarError,
    NotATarError,
    TarHeaderError,
    TrailingGarbageError,
    TruncatedError,
)
from .format.group import group_members
from .format.index import IndexTables
from .format.spec import BLOCK, FINGERPRINT_BYTES, OFFSET_DTYPE
from .format.tar import ZERO_BLOCK, checksum_ok, compression_of, padded, parse_number, parse_pax

__all__ = ["Members", "scan", "scan_members", "index_tables_for", "fingerprint"]

_REGULAR = frozenset(b"0\x007")
_NO_DATA = frozenset(b"123456")  # link, symlink, chr, blk, dir, fifo: no data blocks follow
_USTAR = b"ustar\x00"


@dataclass
class Members:
    """The regular-file members of one tar, in archive order.

    ``names`` are decoded UTF-8 with ``surrogateescape`` (so non-UTF-8 bytes round-trip via
    ``os.fsencode``); ``raw_names`` keep the bytes.
    """

    path: str
    """The tar's path."""
    raw_names: list[bytes]
    """Member names as stored (after GNU/pax long-name resolution), length ``m``."""
    offset: NDArray[np.uint64]
    """Shape ``(m,)``, ``<u8``: data offset of each member in bytes from the start of the tar."""
    size: NDArray[np.uint64]
    """Shape ``(m,)``, ``<u8``: data size of each member in bytes."""
    tar_size: int
    """Size of the tar in bytes."""
    skipped: list[tuple[str, str]] = field(default_factory=list)
    """``(name, reason)`` for non-regular members that were skipped."""

    @property
    def names(self) -> list[str]:
        """Member names as str (UTF-8, undecodable bytes as surrogate escapes)."""
        return [n.decode("utf-8", "surrogateescape") for n in self.raw_names]

    def __len__(self) -> int:
        return len(self.raw_names)


def fingerprint(buf: mmap.mmap | bytes, size: int) -> tuple[int, int]:
    """Return ``(head_crc, tail_crc)``: crc32 of the first and last 4096 bytes (FORMAT.md §3)."""
    n = min(FINGERPRINT_BYTES, size)
    return zlib.crc32(buf[:n]), zlib.crc32(buf[size - n : size])


def _fail_head(path: str, head: bytes) -> None:
    comp = compression_of(head)
    if comp is not None:
        fmt, cmd = comp
        raise CompressedTarError(
            f"{path}: byte 0: found a {fmt} stream, expected a plain tar header; tarindex indexes "
            f"uncompressed tars only: run `{cmd} < {path} > plain.tar` and index that"
        )


def scan_members(path: str | os.PathLike[str]) -> Members:
    """Walk the tar's headers and return its regular-file members (see module docs).

    Args:
        path: Path of a plain (uncompressed) tar.

    Returns:
        :class:`Members` in archive order.

    Raises:
        NotATarError: Empty file, or the first block is not a tar header.
        CompressedTarError: The file is gzip/bzip2/xz/zstd/lz4 data.
        ChecksumError: A header block's checksum is wrong (offset given).
        TarHeaderError: A numeric field is not a number, or a pax record is malformed.
        TruncatedError: The file ends inside a header or a member's data, or before the
            end-of-archive marker.
        TrailingGarbageError: Non-zero bytes that are not a header follow the end marker.
    """
    path = os.fspath(path)
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size == 0:
            raise NotATarError(f"{path}: byte 0: empty file (0 bytes), expected a tar header")
        mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    try:
        return _walk(path, mm, size)
    finally:
        mm.close()


def _walk(path: str, mm: mmap.mmap, size: int) -> Members:
    names: list[bytes] = []
    offsets: list[int] = []
    sizes: list[int] = []
    skipped: list[tuple[str, str]] = []
    longname: bytes | None = None
    longlink_pending = False
    pax: dict[bytes, bytes] = {}
    pos = 0
    if size < BLOCK:
        _fail_head(path, mm[:size])
        raise NotATarError(f"{path}: byte 0: file is {size} bytes, shorter than one 512-byte tar header")
    while True:
        if pos + BLOCK > size:
            if pos == size:
                raise TruncatedError(
                    f"{path}: byte {pos}: file ends without the end-of-archive marker (two zero "
                    f"blocks); it was probably cut short: copy it again"
                )
            raise TruncatedError(
                f"{path}: byte {pos}: file ends inside a header block ({size - pos} of 512 bytes); "
                f"it was cut short: copy it again"
            )
        block = mm[pos : pos + BLOCK]
        if block == ZERO_BLOCK:
            pos = _after_end(path, mm, pos, size)
            if pos >= size:
                break
            continue
        if not checksum_ok(block):
            if pos == 0:
                _fail_head(path, block)
                raise NotATarError(
                    f"{path}: byte 0: not a tar archive (the first 512-byte block is not a valid "
                    f"tar header: checksum mismatch)"
                )
            raise ChecksumError(
                f"{path}: byte {pos}: tar header checksum mismatch (expected a valid header after "
                f"the previous member); the archive is corrupt"
            )
        tf = block[156]
        try:
            msize = parse_number(block[124:136])
        except ValueError:
            raise TarHeaderError(
                f"{path}: byte {pos + 124}: size field {block[124:136]!r} is not an octal or "
                f"base-256 number"
            ) from None
        if b"size" in pax and tf not in b"xg":
            try:
                msize = int(pax[b"size"])
            except ValueError:
                raise TarHeaderError(f"{path}: byte {pos}: pax size {pax[b'size']!r} is not a number") from None
        if msize < 0:
            raise TarHeaderError(f"{path}: byte {pos + 124}: negative size {msize}")
        data = pos + BLOCK
        has_data = tf not in _NO_DATA
        end = data + (msize if has_data else 0)
        if end > size:
            raise TruncatedError(
                f"{path}: byte {size}: member at header byte {pos} needs {msize} data bytes up to "
                f"byte {end}, but the file ends at byte {size}; it was cut short: copy it again"
            )
        if tf == 0x4C:  # 'L' GNU LongName
            longname = mm[data:end].split(b"\0", 1)[0]
        elif tf == 0x4B:  # 'K' GNU LongLink
            longlink_pending = True
        elif tf == 0x78:  # 'x' pax extended header for the next member
            try:
                pax.update(parse_pax(mm[data:end]))
            except ValueError as e:
                raise TarHeaderError(f"{path}: byte {data}: malformed pax header: {e}") from None
        elif tf == 0x67:  # 'g' pax global header: validated; path/size in it are not applied
            try:
                parse_pax(mm[data:end])
            except ValueError as e:
                raise TarHeaderError(f"{path}: byte {data}: malformed pax global header: {e}") from None
        else:
            name = _member_name(block, longname, pax)
            if tf in _REGULAR:
                if any(k.startswith(b"GNU.sparse.") for k in pax):
                    sname = pax.get(b"GNU.sparse.name", name)
                    _warn_skip(path, pos, sname, "pax sparse file", skipped)
                else:
                    names.append(name)
                    offsets.append(data)
                    sizes.append(msize)
            elif tf == 0x53:  # 'S' GNU sparse
                _warn_skip(path, pos, name, "GNU sparse file", skipped)
            elif tf == 0x4D:  # 'M' multi-volume continuation
                _warn_skip(path, pos, name, "multi-volume continuation", skipped)
            else:
                skipped.append((name.decode("utf-8", "surrogateescape"), _KIND.get(tf, f"type {chr(tf)!r}")))
            longname = None
            longlink_pending = False
            pax = {}
        pos = data + (padded(msize) if has_data else 0)
    del longlink_pending
    return Members(
        path=path,
        raw_names=names,
        offset=np.array(offsets, OFFSET_DTYPE),
        size=np.array(sizes, OFFSET_DTYPE),
        tar_size=size,
        skipped=skipped,
    )


_KIND = {
    0x31: "hard link",
    0x32: "symlink",
    0x33: "character device",
    0x34: "block device",
    0x35: "directory",
    0x36: "fifo",
    0x56: "GNU volume label",
    0x44: "GNU dumpdir",
}


def _warn_skip(path: str, pos: int, name: bytes, what: str, skipped: list[tuple[str, str]]) -> None:
    n = name.decode("utf-8", "surrogateescape")
    skipped.append((n, what))
    warnings.warn(
        f"{path}: byte {pos}: member {n!r} is a {what}, not stored as contiguous bytes; "
        f"skipped (extract and re-pack it to include it)",
        stacklevel=3,
    )


def _member_name(block: bytes, longname: bytes | None, pax: dict[bytes, bytes]) -> bytes:
    if b"path" in pax:
        return pax[b"path"]
    if longname is not None:
        return longname
    name = block[0:100].split(b"\0", 1)[0]
    if block[257:263] == _USTAR:  # POSIX ustar: prefix field (GNU uses the area otherwise)
        prefix = block[345:500].split(b"\0", 1)[0]
        if prefix:
            name = prefix + b"/" + name
    return name


def _after_end(path: str, mm: mmap.mmap, pos: int, size: int) -> int:
    """Skip zero blocks at ``pos``; return where the next archive starts, or ``size`` at the end.

    Concatenated archives continue after the zeros (GNU ``--ignore-zeros``); anything else
    non-zero after the end marker is trailing garbage.
    """
    while pos + BLOCK <= size and mm[pos : pos + BLOCK] == ZERO_BLOCK:
        pos += BLOCK
    if pos >= size:
        return size
    rest = mm[pos : min(size, pos + BLOCK)]
    if len(rest) == BLOCK and checksum_ok(rest):
        return pos  # another archive follows
    if rest.count(0) == len(rest) and pos + len(rest) == size:
        return size  # a short run of zero padding
    nz = pos + next(i for i, b in enumerate(rest) if b)
    raise TrailingGarbageError(
        f"{path}: byte {nz}: non-zero bytes after the end-of-archive marker that are not a tar "
        f"header (found {bytes(mm[nz:nz + 16])!r}); the file has trailing garbage: truncate it "
        f"to {pos} bytes"
    )


def index_tables_for(members: Members, mm: mmap.mmap | bytes, producer: str = "tarindex.scan") -> IndexTables:
    """Group a scanned member list into index tables (FORMAT.md §2, grouping §4)."""
    from . import __version__

    head, tail = fingerprint(mm, members.tar_size)
    res = group_members(
        members.raw_names,
        members.offset.tolist(),
        members.size.tolist(),
        tar_size=members.tar_size,
        head_crc=head,
        tail_crc=tail,
        meta={"producer": producer, "version": __version__},
    )
    if res.interleaved:
        warnings.warn(
            f"{members.path}: the members of some samples are not adjacent in the tar; grouped "
            f"by key across the shard (sequential reads of such samples seek)",
            stacklevel=2,
        )
    if res.duplicates:
        warnings.warn(
            f"{members.path}: {len(res.duplicates)} member name(s) appear more than once, e.g. "
            f"{res.duplicates[0]!r}; the last copy is indexed (as tar extraction does)",
            stacklevel=2,
        )
    return res.tables


def scan(path: str | os.PathLike[str]) -> Members:
    """List the regular-file members of a tar: names, data offsets (bytes) and sizes (bytes).

    Same as :func:`scan_members`; see it for the errors raised.
    """
    return scan_members(path)
