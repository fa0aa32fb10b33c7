"""Decompress a whole compressed tar, front to back, checking every stream (FORMAT.md §10, §11).

:func:`unpack_checked` is the one loop that turns a ``.tar.gz``, ``.tar.zst``, ``.tar.xz``,
``.tar.bz2`` or ``.tar.lz4`` into the plain tar inside, as ``gunzip``/``unzstd``/``unxz``/
``bunzip2``/``unlz4`` read them: streams (gzip members, zstd frames, xz streams, bzip2
streams, lz4 frames) are concatenated; each one's own check (gzip crc32 and length, the zstd
content checksum when the frame has one, xz's check, bzip2's crc) is verified by its library;
a stream cut short is an error; zero bytes after the last stream are tar padding, anything
else is refused. Libraries: zlib, :mod:`lzma`, :mod:`bz2` (stdlib), zstandard (a dependency)
and ``lz4`` only if it is installed (:func:`codec_missing`).
"""

from __future__ import annotations

import zlib
from collections.abc import Callable
from typing import IO, Any

from ..errors import ChecksumError, FormatError, TruncatedError
from ..format.tar import compression_of
from .bytesource import ByteSource

__all__ = ["UNPACK_FORMATS", "codec_missing", "unpack_checked"]

UNPACK_FORMATS = ("gzip", "zstd", "xz", "bzip2", "lz4")
"""The compressions :func:`unpack_checked` reads (as
:func:`~tarindex.format.tar.compression_of` names them)."""

_READ = 4 << 20
"""Compressed bytes read from the source at a time."""
_FEED = {"gzip": 64 << 10, "zstd": 4 << 10, "xz": 64 << 10, "bzip2": 64 << 10, "lz4": 64 << 10}
"""Compressed bytes given to the decompressor at a time. With :data:`_OUT`, this bounds the
memory one call fills, whatever the data (a decompression bomb): deflate expands at most 1032
times (64 MiB per 64 KiB); zstd at most 32768 times (a 4-byte RLE block per 128 KiB: 128 MiB
per 4 KiB), and zstandard's ``decompressobj`` takes no output limit."""
_OUT = 32 << 20
"""Most bytes one call of an xz, bzip2 or lz4 decompressor returns (their ``max_length``:
bzip2 and lzma have no useful bound on their expansion)."""
_LIMITED = ("xz", "bzip2", "lz4")
"""The decompressors given ``max_length`` (they have ``needs_input``)."""


def codec_missing(fmt: str) -> str:
    """``""`` if ``fmt`` can be decompressed here, else why not and the fix (one phrase).

    Only lz4 can be missing: its library is optional (``pip install lz4``).
    """
    if fmt not in UNPACK_FORMATS:
        return f"{fmt} is not a compression tarindex reads"
    if fmt == "lz4":
        try:
            import lz4.frame  # type: ignore[import-not-found,unused-ignore]  # noqa: F401
        except ImportError:
            return "the lz4 Python package is not installed (pip install lz4)"
    return ""


def _decompressor(fmt: str) -> Any:
    """A fresh decompressor of one ``fmt`` stream (``decompress``, ``eof``, ``unused_data``)."""
    if fmt == "gzip":
        return zlib.decompressobj(zlib.MAX_WBITS | 16)
    if fmt == "zstd":
        import zstandard

        return zstandard.ZstdDecompressor().decompressobj()
    if fmt == "xz":
        import lzma

        return lzma.LZMADecompressor(lzma.FORMAT_XZ)
    if fmt == "bzip2":
        import bz2

        return bz2.BZ2Decompressor()
    import lz4.frame

    return lz4.frame.LZ4FrameDecompressor()


_WHAT = {"gzip": "member", "zstd": "frame", "xz": "stream", "bzip2": "stream", "lz4": "frame"}


def _is_checksum(e: BaseException) -> bool:
    """Whether a library's error says the data failed its own check (not malformed data)."""
    msg = str(e).lower()
    return any(w in msg for w in ("check", "crc", "length", "checksum"))


def _starts_stream(fmt: str, head: bytes) -> bool:
    """Whether ``head`` may start a ``fmt`` stream (its magic, or a zstd/lz4 skippable frame).

    Fewer than 6 bytes are left to the decompressor (a stream split across reads).
    """
    if len(head) < 6:
        return True
    found = compression_of(head)
    if found is not None and found[0] == fmt:
        return True
    return fmt in ("zstd", "lz4") and head[1:4] == b"\x2a\x4d\x18" and head[0] & 0xF0 == 0x50


def _call(d: Any, chunk: bytes, fmt: str, path: str, at: int, total: int) -> bytes:
    """One bounded call of the decompressor ``d`` on ``chunk``; its errors named (offset ``at``)."""
    try:
        return d.decompress(chunk, _OUT) if fmt in _LIMITED else d.decompress(chunk)  # type: ignore[no-any-return]
    except Exception as e:  # zlib.error, LZMAError, OSError (bz2), ZstdError, lz4
        cls = ChecksumError if _is_checksum(e) else FormatError
        raise cls(
            f"{path}: compressed bytes from {at}: invalid {fmt} data ({type(e).__name__}: {e}) "
            f"after {total} decompressed bytes; the file is corrupt: re-copy or re-create it"
        ) from None


def unpack_checked(
    src: ByteSource,
    out: IO[bytes],
    fmt: str,
    on_read: Callable[[int], None] | None = None,
) -> int:
    """Decompress all of ``src`` (``fmt`` data) into ``out``; return the decompressed length (bytes).

    One pass, front to back. Compressed offsets in messages are bytes of ``src``.

    Args:
        src: The compressed file.
        out: Where the decompressed bytes go (written in order).
        fmt: One of :data:`UNPACK_FORMATS`.
        on_read: Called with each count of compressed bytes read (``src.size`` in all).

    Raises:
        TruncatedError: The data ends inside a stream (the file was cut).
        ChecksumError: A stream fails its own check (gzip crc32/length, zstd checksum, xz
            check, bzip2 crc).
        FormatError: Other invalid data, or bytes other than zeros after the last stream.
        ImportError: ``fmt`` is lz4 and the lz4 package is not installed.
    """
    what = _WHAT[fmt]
    feed = _FEED[fmt]
    d = _decompressor(fmt)
    started = padding = False  # d has been fed a byte; only zeros may follow
    pos = total = 0
    while pos < src.size:
        block = src.read(pos, min(_READ, src.size - pos))
        if on_read is not None:
            on_read(len(block))
        for k in range(0, len(block), feed):
            chunk = block[k : k + feed]
            end = pos + k + len(chunk)  # compressed offset just past chunk
            while chunk:
                at = end - len(chunk)  # compressed offset of chunk[0]
                if padding or (not started and chunk[:1] == b"\0"):
                    rest = chunk.lstrip(b"\0")
                    if rest and fmt == "xz" and _starts_stream(fmt, rest):
                        # stream padding between xz streams (xz file format 1.2.0, §2.2)
                        chunk, padding = rest, False
                        continue
                    if rest:
                        raise FormatError(
                            f"{src.path}: compressed byte {at + len(chunk) - len(rest)}: bytes "
                            f"after the {fmt} data that start no {fmt} {what}; not read: re-create "
                            f"the file (or cut it at byte {at + len(chunk) - len(rest)})"
                        )
                    padding = True
                    break
                if not started and not _starts_stream(fmt, chunk):
                    raise FormatError(
                        f"{src.path}: compressed byte {at}: bytes after the {fmt} data that start "
                        f"no {fmt} {what}; not read: re-create the file (or cut it at byte {at})"
                    )
                started = True
                data = _call(d, chunk, fmt, src.path, at, total)
                while True:  # an xz/bzip2/lz4 call returns at most _OUT bytes: drain it
                    out.write(data)
                    total += len(data)
                    if fmt not in _LIMITED or d.eof or d.needs_input:
                        break
                    data = _call(d, b"", fmt, src.path, at, total)
                if d.eof:
                    chunk = d.unused_data
                    d = _decompressor(fmt)
                    started = False
                else:
                    chunk = b""
        pos += len(block)
    if started:
        raise TruncatedError(
            f"{src.path}: compressed byte {src.size}: the {fmt} data ends inside a {what} (after "
            f"{total} decompressed bytes); the file was cut: re-copy it"
        )
    return total
