"""What the header walk says about a file that is not a tar, or a tar that is cut or damaged.

:mod:`tarindex.index.scan` finds the place; the functions here decide which error it is and word
it (file, byte offset, what was found, the fix; docs/TAR_DIALECTS.md, "Damage"). They return the
error rather than raise it, so the walk can first check the header checksums it deferred (the
earliest bad header wins over any later error).
"""

from __future__ import annotations

import mmap

from ..errors import (
    ChecksumError,
    CompressedTarError,
    NotATarError,
    TarIndexError,
    TrailingGarbageError,
    TruncatedError,
)
from ..format.spec import BLOCK, TAR_CHKSUM, TAR_NAME
from ..format.tar import ZERO_BLOCK, checksum_ok, compression_of, header_checksum
from ..storage.unpack import codec_missing

__all__ = [
    "after_zeros",
    "checksum_error",
    "cut_member_error",
    "eof_error",
    "eof_warning",
    "fail_head",
]


def fail_head(path: str, head: bytes) -> None:
    """Raise :class:`~tarindex.errors.CompressedTarError` if ``head`` starts a compressed stream.

    Called where a plain tar is expected: a compressed tar is indexed before the walk
    (:func:`tarindex.index.build.build_index`: gzip through seek points, FORMAT.md §10;
    zstd, xz, bzip2 and lz4 through a decompressed copy, §11), which catches this error. The
    message says what works: indexing it, or (lz4 without its package) installing the package
    or decompressing it.

    Raises:
        CompressedTarError: gzip, bzip2, xz, zstd or lz4 data.
    """
    comp = compression_of(head)
    if comp is not None:
        fmt, cmd = comp
        missing = codec_missing(fmt)
        if not missing:
            how = "seek points, FORMAT.md §10" if fmt == "gzip" else "FORMAT.md §11"
            msg = (
                f"found a {fmt} stream, expected a plain tar header; index it with build_index "
                f"or `tarindex index {path}` ({how})"
            )
        else:
            msg = (
                f"found a {fmt} stream, which cannot be read here: {missing}; or decompress it: "
                f"`{cmd} < {path} > {_stem(path)}.tar`"
            )
        err = CompressedTarError(f"{path}: byte 0: {msg}")
        err.compression = fmt
        raise err


def _stem(path: str) -> str:
    """``path`` without its compression suffixes: ``x.tar.zst``, ``x.tzst`` -> ``x``."""
    base = path
    for suf in (".zst", ".zstd", ".xz", ".bz2", ".lz4", ".tzst", ".txz", ".tbz2", ".tbz"):
        if base.endswith(suf):
            base = base[: -len(suf)]
            break
    return base.removesuffix(".tar")


def checksum_error(path: str, block: bytes, pos: int) -> TarIndexError:
    """The error for the header ``block`` at ``pos`` whose checksum is wrong.

    At byte 0 the file is not a tar at all (:class:`~tarindex.errors.NotATarError`, or a compressed
    tar: raised at once), elsewhere a :class:`~tarindex.errors.ChecksumError`.
    """
    if pos == 0:
        fail_head(path, block)
        return NotATarError(
            f"{path}: byte 0: not a tar archive (the first 512-byte block is not a valid "
            f"tar header: checksum mismatch; found {block[:16]!r})"
        )
    computed = header_checksum(block)
    return ChecksumError(
        f"{path}: byte {pos}: tar header checksum mismatch: the chksum field holds "
        f"{block[TAR_CHKSUM]!r}, the block sums to {computed} (0o{computed:o}); found name "
        f"{block[TAR_NAME].split(bytes(1), 1)[0][:60]!r}. The archive is corrupt at this header "
        f"(or the previous member's size is wrong): re-copy or re-create it"
    )


def eof_error(
    path: str, mm: mmap.mmap, pos: int, size: int, require_end: bool, pending_at: int
) -> TarIndexError | None:
    """The error for a walk that reached ``pos >= size - 511`` without an end-of-archive marker.

    Returns:
        A :class:`~tarindex.errors.TruncatedError`; None when ``require_end`` is False and the file
        ends right after a member's data or inside its padding (then indexed, with
        :func:`eof_warning`). A pax or GNU long-name record at ``pending_at`` (>= 0) still
        waiting for its member is an error either way.
    """
    if pos >= size and not require_end and pending_at >= 0:
        return TruncatedError(
            f"{path}: byte {size}: file ends without the end-of-archive marker right after "
            f"the pax or GNU long-name record at byte {pending_at}, before the member "
            f"it describes; it was cut short: copy it again"
        )
    if pos >= size and not require_end:
        return None
    if pos == size:
        return TruncatedError(
            f"{path}: byte {pos}: file ends without the end-of-archive marker (two zero "
            f"blocks) after the last member; it was probably cut short: copy it again "
            f"(or, if the tool that wrote it omits the marker, index it with "
            f"`tarindex index --no-require-end`)"
        )
    if pos > size:
        return TruncatedError(
            f"{path}: byte {size}: file ends inside the zero padding of the last member "
            f"(its padded data runs to byte {pos}); it was cut short: copy it again (or "
            f"index it with `tarindex index --no-require-end`)"
        )
    return TruncatedError(
        f"{path}: byte {pos}: file ends inside a header block ({size - pos} of 512 bytes, "
        f"found {mm[pos : pos + 16]!r}); it was cut short: copy it again"
    )


def eof_warning(path: str, pos: int, size: int) -> str:
    """The warning for a tar indexed without its end-of-archive marker (``require_end=False``)."""
    where = "after the last member" if pos == size else "inside its zero padding"
    return (
        f"{path}: byte {size}: file ends {where}, without the end-of-archive marker (two "
        f"zero blocks); indexed anyway (require_end=False): every member listed is "
        f"complete, but a copy cut at a member boundary looks the same, so members after "
        f"byte {size} may be missing"
    )


def cut_member_error(
    path: str, size: int, name: bytes, pos: int, msize: int, end: int
) -> TruncatedError:
    """The error for the member ``name`` (header at ``pos``) whose data runs to ``end > size``."""
    return TruncatedError(
        f"{path}: byte {size}: member {name[:80]!r} (header at byte {pos}) needs {msize} "
        f"data bytes up to byte {end}, but the file ends at byte {size}; it was cut short: "
        f"copy it again (a part of a GNU multi-volume archive made without -V is "
        f"indistinguishable: extract the set with tar -M and re-pack it)"
    )


def after_zeros(path: str, mm: mmap.mmap, pos: int, size: int) -> int | TrailingGarbageError:
    """Skip the zero blocks at ``pos`` (an end-of-archive marker).

    Returns:
        Where the next archive starts (concatenated archives, as GNU ``--ignore-zeros`` reads
        them), ``size`` at the end of the file, or the
        :class:`~tarindex.errors.TrailingGarbageError` for non-zero bytes that are not a header.
    """
    while pos + BLOCK <= size and mm[pos : pos + BLOCK] == ZERO_BLOCK:
        pos += BLOCK
    if pos >= size:
        return size
    rest = mm[pos : min(size, pos + BLOCK)]
    if len(rest) == BLOCK and checksum_ok(rest):
        return pos  # another archive follows
    if rest.count(0) == len(rest):
        return size  # a short run of zero padding at the end
    nz = pos + next(i for i, b in enumerate(rest) if b)
    return TrailingGarbageError(
        f"{path}: byte {nz}: non-zero bytes after the end-of-archive marker that are "
        f"not a tar header (found {bytes(mm[nz : nz + 16])!r}); the file has trailing garbage "
        f"(or a concatenated archive whose first header is damaged): truncate it to {pos} "
        f"bytes if the rest is not needed"
    )
