"""Every guard of the read path, each written once in Python (FORMAT.md §2.7, §3, §9).

- the chunk guard: a reader's index tables are checked (:func:`check_chunk`, over
  :func:`tarindex.format.guards.check_samples`) one chunk of :data:`CHUNK` samples at a time,
  before the first read of that chunk, and flagged in the reader's ``checked`` bytes;
- the cut and change check: a local tar cut since it was opened would kill the process with
  SIGBUS on the next read of a page past its new end, and one rewritten in place would be
  read under an index that no longer describes it; so every read first compares one
  ``fstat`` of the open tar with what it was at open (:func:`tar_fault`: size, device,
  inode, mtime), and a copy out of the mapping that faults anyway (a cut during the copy)
  raises the same error (the fault guard of ``_kernel.c``; the twin reads with ``pread``);
- the open-time checks (FORMAT.md §3): size, fingerprint, bytes after the archive's end,
  a few member headers re-read (:func:`check_opened`);
- a manifest's record of a shard against the shard opened (FORMAT.md §9).

The compiled loops (``_kernel.c``) hold their own copy of the cut and change check and the
chunk flag test (the C side of the same rules); see docs/READING.md.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Callable

import numpy as np
from numpy.typing import NDArray

from ..errors import (
    FormatError,
    IndexMissingError,
    StaleIndexError,
    StaleManifestError,
    TarHeaderError,
    TruncatedError,
)
from ..format.guards import check_samples
from ..format.index import IndexTables, fingerprint
from ..format.keys import normalize_name
from ..format.spec import (
    BLOCK,
    END_CHECK_BYTES,
    FINGERPRINT_BYTES,
    HEADER_CHECKS,
    REGULAR_TYPES,
    TAR_SIZE,
    TAR_TYPEFLAG,
    USTAR_MAX_SIZE,
)
from ..format.tar import (
    MAX_NAME_BYTES,
    checksum_ok,
    header_name,
    name_after,
    padded,
    parse_number,
)
from .sources import ShardList

__all__ = [
    "CHUNK",
    "CHUNK_SHIFT",
    "check_chunk",
    "fold_exts",
    "Ident",
    "ident_of",
    "check_open_tar",
    "stat_fault",
    "tar_fault",
    "cut_error",
    "check_opened",
    "check_fingerprint",
    "check_size",
    "check_compressed",
    "check_gzip",
    "open_ranges",
    "missing_index",
    "stale_count",
    "check_listed",
    "unlisted",
]

CHUNK_SHIFT = 10
CHUNK = 1 << CHUNK_SHIFT
"""Samples whose index tables are checked together, once per open reader, before a read."""

Read = Callable[[int, int], bytes]
"""``read(offset, size)``: bytes of the tar (an open-time check's read)."""


# -- the chunk guard -------------------------------------------------------------------------
def check_chunk(
    t: IndexTables,
    checked: bytearray,
    c: int,
    index_path: str,
    fold: NDArray[np.int64] | None = None,
    tar_path: str = "<tar>",
) -> None:
    """Check the tables of chunk ``c`` (samples ``c * CHUNK ...``) and flag it in ``checked``.

    Args:
        t: The index tables.
        checked: One flag per chunk.
        c: The chunk.
        index_path: The index's path, for messages.
        fold: ``int64 (len(t.exts),)``: the extension id each extension is served as, when
            two extensions differ only in case (:func:`tarindex.format.keys.served_ext`);
            ``None`` (the usual case) when every served name is distinct.
        tar_path: The tar's path, for messages.

    Raises:
        FormatError: If an entry of the chunk is corrupt (FORMAT.md §2.2-2.5), or a sample
            holds two extensions that differ only in case.
    """
    j0 = c << CHUNK_SHIFT
    j1 = min(j0 + CHUNK, t.n_samples)
    check_samples(t, j0, j1, index_path)
    if fold is not None:
        _check_folded(t, j0, j1, fold, tar_path)
    checked[c] = 1


def fold_exts(exts: list[str]) -> NDArray[np.int64] | None:
    """For served extension names with repeats: each id -> the first id of its name, else None."""
    if len(set(exts)) == len(exts):
        return None
    first: dict[str, int] = {}
    return np.asarray([first.setdefault(e, k) for k, e in enumerate(exts)], np.int64)


def _check_folded(
    t: IndexTables, j0: int, j1: int, fold: NDArray[np.int64], tar_path: str
) -> None:
    """Refuse a sample of ``j0 <= j < j1`` holding two extensions served under one name."""
    lo, hi = int(t.sample_ptr[j0]), int(t.sample_ptr[j1])
    if hi - lo < 2:
        return
    sp = t.sample_ptr[j0 : j1 + 1].astype(np.int64)
    local = np.repeat(np.arange(j1 - j0, dtype=np.int64), sp[1:] - sp[:-1])
    code = local * len(fold) + fold[t.ext_id[lo:hi].astype(np.int64)]
    order = np.argsort(code, kind="stable")
    c = code[order]
    same = np.flatnonzero(c[1:] == c[:-1])
    if len(same):
        a, b = int(order[same[0]]), int(order[same[0] + 1])
        j = j0 + int(local[a])
        names = [t.exts[int(t.ext_id[lo + m])].decode("utf-8", "surrogateescape") for m in (a, b)]
        key = bytes(t.key_blob[int(t.key_ptr[j]) : int(t.key_ptr[j + 1])]).decode(
            "utf-8", "surrogateescape"
        )
        raise FormatError(
            f"{tar_path}: sample {key!r} (index {j}) holds both {key}.{names[0]} and "
            f"{key}.{names[1]}; extensions are read case-insensitively, as webdataset reads "
            f"them (FORMAT.md §4), so the sample would lose one: rename one of them"
        )


# -- the cut and change check ----------------------------------------------------------------
Ident = tuple[int, int, int]
"""What a local tar was when opened, besides its size: ``(st_dev, st_ino, st_mtime_ns)``; an
mtime ``< 0`` is not compared (a cached copy of a remote tar, written in pieces while read)."""


def ident_of(st: os.stat_result) -> Ident:
    """The :data:`Ident` of an ``os.fstat`` result."""
    return st.st_dev, st.st_ino, st.st_mtime_ns


def cut_error(tar_path: str, now: int, size: int, at: int = -1) -> TruncatedError:
    """The error for a tar of ``size`` bytes found cut to ``now`` bytes while open.

    ``at``: the byte a read through the mapping faulted at (``-1``: found before reading).
    """
    where = (
        f"byte {at}: reading it faulted (SIGBUS) there, past its new end"
        if at >= 0
        else (f"byte {now}")
    )
    return TruncatedError(
        f"{tar_path}: {where}: the tar was cut to {now} bytes while open (it had "
        f"{size}); re-open it once it is complete, or copy it again and re-index it "
        f"(tarindex index --force {tar_path})"
    )


def tar_fault(fd: int, size: int, ident: Ident, tar_path: str, at: int = -1) -> Exception | None:
    """The error for a local tar that changed since it was opened, or ``None``.

    The one rule (its C side is ``_kernel.c``'s ``mapped_check``): one ``fstat`` of the open
    descriptor ``fd``; the size, device, inode and mtime (ns) must be what they were at open
    (``size``, ``ident``). The read kernel calls it before reads (the cut and change check)
    and when a copy out of the mapping faulted at byte ``at`` (a page past the end of a file
    cut since: SIGBUS otherwise).

    Returns:
        :class:`TruncatedError` if the tar is shorter than ``size`` (naming the byte);
        :class:`StaleIndexError` if it changed otherwise (rewritten in place, appended to,
        touched); with ``at >= 0`` and nothing changed an ``OSError`` (``EIO``: the device
        under the mapping failed); else ``None``.
    """
    try:
        st = os.fstat(fd)
    except OSError as e:
        return OSError(e.errno, f"{tar_path}: the open tar cannot be checked: {e.strerror}")
    return stat_fault(st, size, ident, tar_path, at)


def stat_fault(
    st: os.stat_result, size: int, ident: Ident, tar_path: str, at: int = -1
) -> Exception | None:
    """:func:`tar_fault` of the ``fstat`` result ``st`` (a source that pins its descriptor)."""
    if st.st_size < size:
        return cut_error(tar_path, st.st_size, size, at)
    got = ident_of(st)
    if st.st_size != size or got[:2] != ident[:2] or (ident[2] >= 0 and got[2] != ident[2]):
        what = (
            f"size {size} -> {st.st_size}" if st.st_size != size
            else f"mtime {ident[2]} -> {got[2]} ns" if got[2] != ident[2]
            else "device or inode"
        )  # fmt: skip
        return StaleIndexError(
            f"{tar_path}: byte {max(at, 0)}: the tar changed since it was opened ({what}): "
            f"its index may no longer describe it; if it was rewritten, rebuild the index "
            f"with: tarindex index --force {tar_path}, then open it again"
        )
    if at >= 0:
        return OSError(
            errno.EIO,
            f"{tar_path}: byte {at}: reading the mapped tar failed (SIGBUS) though it did not "
            f"change: an I/O error of the device or network file system under it; check the "
            f"device, or read it with use_mmap=False",
        )
    return None


def check_open_tar(src: object, size: int, ident: Ident, tar_path: str) -> None:
    """Refuse a read of a reader's local tar (mapped or ``pread``) that changed since it was opened.

    Its kernel ``Mapped`` (``check()``: the same rule in C or the twin), a ``pread``
    source's descriptor, or nothing (remote: its reads check the version pinned at open).

    Raises:
        TruncatedError: If the tar was cut (a read through its mapping would be SIGBUS).
        StaleIndexError: If it changed otherwise (:func:`tar_fault`).
        ClosedError: If a ``pread`` source was closed.
    """
    check = getattr(src, "check", None)
    if check is not None:
        check()
        return
    fstat = getattr(src, "fstat", None)
    if fstat is not None:  # a pread source: fstat with its descriptor held open (threads)
        e = stat_fault(fstat(), size, ident, tar_path)
        if e is not None:
            raise e


# -- the open-time checks (FORMAT.md §3) ------------------------------------------------------
def header_checks(t: IndexTables) -> list[int]:
    """Members whose headers are re-read at open: first, quartiles, last (FORMAT.md §3)."""
    m = t.n_members
    if not m:
        return []
    return sorted({(m - 1) * q // (HEADER_CHECKS - 1) for q in range(HEADER_CHECKS)})


def open_ranges(t: IndexTables, size: int) -> tuple[NDArray[np.int64], NDArray[np.int64]]:
    """The byte ranges ``[start, end)`` the open-time checks read: fingerprint, end, headers."""
    n = min(FINGERPRINT_BYTES, size)
    rs = [(0, n), (size - n, size)]
    if 0 <= t.end < size:
        rs.append((t.end, t.end + min(END_CHECK_BYTES, size - t.end)))
    for k in header_checks(t):
        off = int(t.offset[k])
        if BLOCK <= off <= size:
            rs.append((off - BLOCK, off))
    a = np.asarray(rs, np.int64).reshape(-1, 2)
    return a[:, 0].copy(), a[:, 1].copy()


def check_size(t: IndexTables, size: int, tar_path: str, index_path: str) -> None:
    """Refuse a tar whose size is not the one its index was made for.

    Raises:
        StaleIndexError: Naming both sizes and the command that rebuilds the index.
    """
    if size != t.tar_size:
        raise StaleIndexError(
            f"{tar_path}: tar is {size} bytes, its index {index_path} was "
            f"made for {t.tar_size} bytes (the tar was replaced, appended to or cut); "
            f"rebuild it with: tarindex index --force {tar_path}"
        )


def check_gzip(t: IndexTables, size: int, read: Read, tar_path: str, index_path: str) -> None:
    """Refuse a gzip shard that is not the file its index was made from (FORMAT.md §2.8.4).

    :func:`check_compressed` against the index's ``GZIX`` record. A tar whose index has no
    such record passes (its own checks apply).

    Raises:
        StaleIndexError: Naming what differs and the command that rebuilds the index.
    """
    gz = t.gzip
    if gz is not None:
        check_compressed((gz.gz_size, gz.head_crc, gz.tail_crc), size, read, tar_path, index_path)


def check_compressed(
    want: tuple[int, int, int], size: int, read: Read, tar_path: str, index_path: str
) -> None:
    """Refuse a compressed shard that is not the file its index was made from (FORMAT.md §10, §11).

    The rule of :func:`check_size` and :func:`check_fingerprint` applied to the compressed
    file: its size and the crc32 of its first and last 4 KiB (which hold the gzip trailer or
    the zstd/xz/bzip2 checksums) against ``want``, the index's ``(size, head_crc,
    tail_crc)`` (``GZIX``, or the ``compressed`` metadata).

    Args:
        want: What the index recorded.
        size: The compressed file's size now (bytes).
        read: ``read(offset, size)`` of the compressed file.
        tar_path: The compressed file, for messages.
        index_path: Its index, for messages.

    Raises:
        StaleIndexError: Naming what differs and the command that rebuilds the index.
    """
    fix = f"rebuild it with: tarindex index --force {tar_path}"
    if size != want[0]:
        raise StaleIndexError(
            f"{tar_path}: compressed file is {size} bytes, its index {index_path} was made for "
            f"{want[0]} bytes (the file was replaced, appended to or cut); {fix}"
        )
    head, tail = fingerprint(read, size)
    if head != want[1] or tail != want[2]:
        n = min(FINGERPRINT_BYTES, size)
        where = 0 if head != want[1] else size - n
        raise StaleIndexError(
            f"{tar_path}: compressed bytes {where}..{where + n} differ from when {index_path} "
            f"was made (the file was replaced or rewritten); {fix}"
        )


def check_opened(
    t: IndexTables,
    size: int,
    read: Read,
    guard: Callable[[int], None],
    tar_path: str,
    index_path: str,
) -> None:
    """The open-time checks after the fingerprint: end of archive, headers (FORMAT.md §3).

    Args:
        t: The decoded index.
        size: The tar's size in bytes (already checked against ``t``).
        read: Reads the checked bytes of the tar.
        guard: ``guard(j)`` runs the chunk guard of sample ``j`` (a corrupt index is a
            ``FormatError`` about the index, not a "rewritten tar").
        tar_path: The tar, for the messages.
        index_path: Its index, for the messages.

    Raises:
        StaleIndexError: The bytes after the archive's end, or a re-read member header,
            differ from what the index recorded.
        TarHeaderError: A re-read header's size field is not a number.
        FormatError: The chunk guard of a sample whose header differs.
    """
    _check_end(t, size, read, tar_path, index_path)
    _check_headers(t, size, read, guard, tar_path, index_path)


def check_fingerprint(
    t: IndexTables, size: int, read: Read, tar_path: str, index_path: str
) -> None:
    """Compare the tar's first and last 4 KiB with the index's fingerprint (FORMAT.md §3).

    Raises:
        StaleIndexError: Naming the bytes that differ and the command that rebuilds the index.
    """
    head, tail = fingerprint(read, size)
    if head != t.head_crc or tail != t.tail_crc:
        n = min(FINGERPRINT_BYTES, size)
        where = 0 if head != t.head_crc else size - n
        raise StaleIndexError(
            f"{tar_path}: bytes {where}..{where + n} differ from when {index_path} "
            f"was made (the tar was replaced or rewritten); rebuild it with: tarindex index "
            f"--force {tar_path}"
        )


def _check_end(t: IndexTables, size: int, read: Read, tar_path: str, index_path: str) -> None:
    """The bytes after the archive's data must still be zeros.

    Catches ``tar -r`` and concatenation even when the size did not change.
    """
    end = t.end
    if end < 0 or end >= size:
        return
    n = min(END_CHECK_BYTES, size - end)
    data = read(end, n)
    tail = data.lstrip(b"\0")
    if tail or len(data) != n:
        at = end + len(data) - len(tail)
        raise StaleIndexError(
            f"{tar_path}: byte {at}: data after the end of the archive ({end}) that "
            f"{index_path} recorded: members were appended (tar -r, concatenation) or "
            f"the tar was rewritten; rebuild it with: tarindex index --force {tar_path}"
        )


def _check_headers(
    t: IndexTables,
    size: int,
    read: Read,
    guard: Callable[[int], None],
    tar_path: str,
    index_path: str,
) -> None:
    """Re-read a few member headers: their checksum, type, size and name must still match."""
    for k in header_checks(t):
        off, msize = int(t.offset[k]), int(t.size[k])
        if off < BLOCK or off % BLOCK or off + msize > size or t.ext_id[k] >= len(t.exts):
            continue  # a corrupt entry: the table guards refuse it before any read
        j = int(np.searchsorted(t.sample_ptr, np.uint64(k), side="right")) - 1
        j = min(max(j, 0), t.n_samples - 1)
        block = read(off - BLOCK, BLOCK)
        what = None
        try:
            stored = parse_number(block[TAR_SIZE]) if block[TAR_SIZE].strip(b" \0") else msize
        except ValueError:
            guard(j)
            raise TarHeaderError(
                f"{tar_path}: byte {off - BLOCK + TAR_SIZE.start}: the size field of "
                f"member {k}'s header ({bytes(block[TAR_SIZE])!r}) is not a number; the tar "
                f"is damaged: copy it again, or re-index it (tarindex index --force "
                f"{tar_path})"
            ) from None
        if len(block) < BLOCK or not checksum_ok(block):
            what = "is no longer a valid tar header (checksum)"
        elif block[TAR_TYPEFLAG] not in REGULAR_TYPES:
            what = f"has type {bytes([block[TAR_TYPEFLAG]])!r}, not a regular file"
        elif msize <= USTAR_MAX_SIZE and stored != msize:
            what = f"says size {stored}, the index {msize}"
        else:
            raw = header_name(block)
            what = _name_mismatch(t, raw, True, j, int(t.ext_id[k]))
            if what is not None or len(raw) >= 99:  # maybe a GNU LongName or pax path before
                name = _name_before(t, k, read, tar_path)  # the name as the scanner reads it
                if name is not None:
                    what = _name_mismatch(t, name, False, j, int(t.ext_id[k]))
        if what is not None:
            # a corrupt index is a FormatError about the index, not a "rewritten tar":
            # the guards of this sample's chunk decide (they run only on a mismatch)
            guard(j)
            raise StaleIndexError(
                f"{tar_path}: byte {off - BLOCK}: the header of member {k} {what}: the "
                f"tar and {index_path} do not match (the tar was rewritten since it "
                f"was indexed, or the index was damaged); rebuild it with: tarindex index "
                f"--force {tar_path}"
            )


def _name_before(t: IndexTables, k: int, read: Read, tar_path: str) -> bytes | None:
    """The name the scanner gives member ``k``: from the records after member ``k - 1``'s data.

    ``None`` when those records span more than a pax header and a long name may
    (:data:`~tarindex.format.tar.MAX_NAME_BYTES` each) or are damaged: the header's own
    name decides then.
    """
    prev = int(t.offset[k - 1]) + padded(int(t.size[k - 1])) if k else 0
    off = int(t.offset[k])
    if not 0 <= prev <= off - BLOCK or off - prev > 2 * MAX_NAME_BYTES + 8 * BLOCK:
        return None
    try:
        return name_after(read(prev, off - prev))
    except ValueError:
        return None


def _name_mismatch(t: IndexTables, raw: bytes, cut: bool, j: int, ext: int) -> str | None:
    """How name ``raw`` differs from sample ``j``'s key and extension, or None.

    ASCII names only (a pax ``path`` may hold a non-ASCII name the ustar field cannot);
    ``cut``: ``raw`` is the header's own name field, which a long name fills to 100 bytes
    (it need only be a prefix then).
    """
    kp = t.key_ptr
    want = bytes(t.key_blob[int(kp[j]) : int(kp[j + 1])]) + b"." + t.exts[ext]
    got = normalize_name(raw)
    if got == want or not (got.isascii() and want.isascii()):
        return None
    if cut and len(raw) >= 99 and want.startswith(got):
        return None
    return f"names {got[:120]!r}, the index {want[:120]!r}"


# -- errors of the shard set -----------------------------------------------------------------
def missing_index(tar_path: str, index_path: str) -> IndexMissingError:
    """The error for a shard without an index, with the command that builds it."""
    return IndexMissingError(
        f"{index_path}: no index for shard {tar_path}; build it with: tarindex index {tar_path}"
    )


def stale_count(index_path: str, now: int, counted: int) -> StaleIndexError:
    """The error for an index rebuilt with another sample count after the ShardSet was made."""
    return StaleIndexError(
        f"{index_path}: now holds {now} samples, this ShardSet counted "
        f"{counted} when it was made (the index was "
        f"rebuilt meanwhile); make a new ShardSet"
    )


def unlisted(
    listing: ShardList, paths: list[str], s: int, what: str, missing: bool = False
) -> StaleManifestError:
    """The error for shard ``s`` of a manifest that is missing or differs from its row."""
    m = listing.origin[s]
    if missing:  # the manifest cannot be made again from itself: name the shards
        return StaleManifestError(
            f"{paths[s]}: shard {s} of manifest {m} is missing ({what}); restore it, "
            f"or make the manifest again from the shards there are: tarindex manifest "
            f"SHARDS... -o {m}"
        )
    return StaleManifestError(
        f"{paths[s]}: shard {s} of manifest {m} changed since the manifest was made "
        f"({what}); if the new shard is the one you want, rebuild the manifest over the same "
        f"shards: tarindex manifest {m} -o {m}; otherwise restore the shard"
    )


def check_listed(listing: ShardList, paths: list[str], s: int, t: IndexTables) -> None:
    """Compare shard ``s``'s index with what its manifest recorded (FORMAT.md §9).

    Raises:
        StaleManifestError: Naming the first field that differs.
    """
    for name, want, got in (
        ("samples", int(listing.samples[s]), t.n_samples),
        ("members", int(listing.members[s]), t.n_members),
        ("tar bytes", int(listing.tar_bytes[s]), t.tar_size),
        ("head crc32", int(listing.head_crc[s]), t.head_crc),
        ("tail crc32", int(listing.tail_crc[s]), t.tail_crc),
        ("shard id", listing.shard_id[s], t.shard_id.hex()),
    ):
        if want != got and (name != "shard id" or (want and got)):  # `index` records none
            if "crc32" in name:
                got, want = f"0x{got:08x}", f"0x{want:08x}"
            raise unlisted(listing, paths, s, f"{name} now {got}, the manifest says {want}")
