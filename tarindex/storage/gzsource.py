"""The bytes of the tar inside a gzip file, read at random through recorded seek points.

A ``.tar.gz`` shard (docs/FORMAT.md §10) is read through :class:`GzipSource`, a
:class:`~tarindex.storage.bytesource.ByteSource` whose offsets are offsets in the
*decompressed* tar: the read kernel, the open-time checks and every dataset path use it as
they use a mapping. Under it, `indexed_gzip <https://github.com/pauldmccarthy/indexed_gzip>`_
(the zran seek-point scheme of zlib's ``examples/zran.c``, as ratarmount uses) resumes
inflating at the seek point before the byte asked for, so one read decompresses at most one
``spacing`` of data (1 MiB by default) plus the read itself. The compressed bytes come from
any byte source (``os.pread`` on a local file, a remote source for a URL).

:func:`decompress_indexed` is the build side: one pass records the seek points, a second
(:func:`inflate_checked`) writes the decompressed tar to a file for the header walk.
"""

from __future__ import annotations

import io
import threading
import zlib
from collections.abc import Callable
from typing import IO, Any

import numpy as np
from numpy.typing import NDArray

from ..errors import ChecksumError, FormatError, TruncatedError
from ..format.gzindex import GzipIndex
from ..format.hints import rebuild_hint
from ..format.spec import FINGERPRINT_BYTES, INDEX_SUFFIX
from .bytesource import Buffer, ByteSource, closed_error, reset_after_fork
from .unpack import unpack_checked

__all__ = ["GzipSource", "decompress_indexed", "gzip_fingerprint", "inflate_checked"]

_READ_BUF = 64 << 10
"""Bytes of compressed data indexed_gzip asks the raw source for at a time."""
_OUT_BUF = 64 << 10
"""Decompressed bytes buffered above indexed_gzip (a read of a member fills at most this
much past its end)."""


class _RawFile(io.RawIOBase):
    """A read-only, seekable file object over a byte source (what indexed_gzip reads from).

    ``on_read(n)`` is called after each read of ``n`` compressed bytes (a progress bar).
    """

    def __init__(self, src: ByteSource, on_read: Callable[[int], None] | None = None) -> None:
        super().__init__()
        self.src = src
        self.pos = 0
        self.on_read = on_read

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def readinto(self, b: Any) -> int:
        n = max(0, min(len(b), self.src.size - self.pos))
        if n:
            b[:n] = self.src.read(self.pos, n)
            self.pos += n
            if self.on_read is not None:
                self.on_read(n)
        return n

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = 0 if whence == io.SEEK_SET else self.pos if whence == io.SEEK_CUR else self.src.size
        self.pos = max(0, base + offset)
        return self.pos

    def tell(self) -> int:
        return self.pos


def gzip_fingerprint(src: ByteSource) -> tuple[int, int]:
    """``(head_crc, tail_crc)`` of a compressed file: the crc32 of its first and last 4096 bytes.

    The rule of FORMAT.md §3 applied to the file on disk (FORMAT.md §2.8.4).
    """
    n = min(FINGERPRINT_BYTES, src.size)
    return zlib.crc32(src.read(0, n)), zlib.crc32(src.read(src.size - n, n))


def _gzip_error(path: str, offset: int, e: BaseException) -> FormatError:
    """A failure inside indexed_gzip as a ``FormatError`` naming the file, offset and fix."""
    cls = ChecksumError if "crc" in str(e).lower() else FormatError
    return cls(
        f"{path}: byte {offset} of the decompressed tar: the gzip data cannot be read through "
        f"its seek points ({type(e).__name__}: {e}); the file is corrupt or changed since it "
        f"was indexed: {rebuild_hint(path + INDEX_SUFFIX)}"
    )


def _open(raw: _RawFile, spacing: int) -> Any:
    import indexed_gzip  # type: ignore[import-untyped,unused-ignore]

    return indexed_gzip.IndexedGzipFile(
        fileobj=raw,
        spacing=spacing,
        readbuf_size=_READ_BUF,
        buffer_size=_OUT_BUF,
        auto_build=False,
    )


class GzipSource:
    """The decompressed tar of a gzip file, read by range through its seek points.

    Thread-safe (one lock: indexed_gzip keeps one inflate position). A read at or a little
    after the previous read's end (within ``spacing``) continues inflating from there, so a
    sequential block read decompresses each byte once.

    Args:
        path: The compressed file's path or URL, for messages.
        raw: Its compressed bytes; the source owns it (closed with this one).
        gz: The index's ``GZIX`` record (FORMAT.md §2.8.4).
        size: Size of the decompressed tar in bytes (the index's ``tar_size``).

    Raises:
        FormatError: The seek points cannot be loaded (corrupt record or a file that does
            not match them).
        ImportError: indexed_gzip is not installed.
    """

    zero_copy = False

    def __init__(self, path: str, raw: ByteSource, gz: GzipIndex, size: int) -> None:
        self.path = path
        self.size = size
        self.raw = raw
        self.spacing = gz.spacing
        self._lock = threading.Lock()
        reset_after_fork(self)
        self._raw = _RawFile(raw)
        self._f = _open(self._raw, gz.spacing)
        try:
            self._f.import_index(fileobj=io.BytesIO(bytes(gz.points)))
        except Exception as e:
            self.close()
            raise _gzip_error(path, 0, e) from None
        self._pos = 0  # where the next plain read continues
        self.inflated = 0
        """Decompressed bytes produced so far, the skipped ones included (for benchmarks)."""

    def read(self, offset: int, size: int) -> bytes:
        """Return ``size`` decompressed bytes at ``offset``.

        Raises:
            TruncatedError: The range runs past the decompressed tar.
            FormatError: The gzip data cannot be decompressed there (``ChecksumError`` if the
                gzip trailer's crc32 fails); the file is corrupt or changed.
            ClosedError: The source is closed.
        """
        end = offset + size
        if offset < 0 or size < 0 or end > self.size:
            raise TruncatedError(
                f"{self.path}: byte {self.size}: range {offset}..{end} runs past the end of the "
                f"decompressed tar; the index is corrupt: tarindex verify {self.path}"
            )
        with self._lock:
            f = self._f
            if f is None:
                raise closed_error(self.path)
            try:
                if not self._pos <= offset <= self._pos + self.spacing:
                    f.seek(offset)
                elif offset > self._pos:
                    self.inflated += len(f.read(offset - self._pos))
                data: bytes = f.read(size)
            except Exception as e:
                self._pos = -1 - self.spacing  # seek again next time
                raise _gzip_error(self.path, offset, e) from None
            self.inflated += len(data)
            self._pos = offset + len(data)
        if len(data) != size:
            raise TruncatedError(
                f"{self.path}: byte {offset + len(data)} of the decompressed tar: the gzip data "
                f"ends {size - len(data)} bytes early; the file was cut or changed: "
                f"{rebuild_hint(self.path + INDEX_SUFFIX)}"
            )
        return data

    def read_ranges(
        self, starts: NDArray[np.int64], ends: NDArray[np.int64]
    ) -> tuple[Buffer, NDArray[np.int64]]:
        """Read the ranges; ascending ranges are one read of the span that covers them.

        Skipping bytes of a gzip stream costs inflating them anyway, so ascending ranges
        (a block of samples) are read as one span and sliced; other orders range by range.

        Raises:
            TruncatedError, FormatError: As :meth:`read`.
        """
        if len(starts) == 1:
            return self.read(int(starts[0]), int(ends[0] - starts[0])), np.zeros(1, np.int64)
        if len(starts) and bool((starts[1:] >= ends[:-1]).all()):
            a = int(starts[0])
            return self.read(a, int(ends[-1]) - a), starts - a
        lens = ends - starts
        bases = np.zeros(len(starts), np.int64)
        np.cumsum(lens[:-1], out=bases[1:])
        parts = [self.read(a, b - a) for a, b in zip(starts.tolist(), ends.tolist(), strict=True)]
        return b"".join(parts), bases

    def prefetch(self, start: int, end: int) -> None:
        """Nothing: the compressed file is read as inflating needs it."""

    def prefetch_ranges(
        self, starts: NDArray[np.int64], ends: NDArray[np.int64], wait: bool = False
    ) -> None:
        """Nothing (as :meth:`prefetch`)."""

    def after_fork(self) -> None:
        """In a forked child: a fresh lock (another thread of the parent may have held it)."""
        self._lock = threading.Lock()

    def close(self) -> None:
        """Close the decompressor and the compressed source (idempotent, any thread).

        Waits for a read in flight in another thread; reads after it raise
        :class:`~tarindex.errors.ClosedError`.
        """
        with self._lock:
            f, self._f = self._f, None
        if f is not None:
            try:
                f.close()
            except Exception:
                pass
        self.raw.close()


def decompress_indexed(
    src: ByteSource,
    out: IO[bytes],
    spacing: int,
    on_read: Callable[[int], None] | None = None,
) -> GzipIndex:
    """Record a gzip file's seek points and write its decompressed bytes to ``out``.

    Two passes over the compressed bytes: indexed_gzip builds the seek points (one every
    ``spacing`` decompressed bytes), then zlib inflates the data into ``out``, checking every
    gzip member's trailer (crc32 and length, RFC 1952 §2.3.1) and that the last one is
    complete. A multi-member file (``cat a.gz b.gz``, bgzip) is one stream, as ``gunzip``
    reads it; bytes after the last member must be zeros (tar's padding), else it is refused.

    Args:
        src: The compressed file.
        out: Where the decompressed tar goes (a temp file the caller scans and removes).
        spacing: Decompressed bytes between seek points (FORMAT.md §10).
        on_read: Called with each count of compressed bytes read (``2 * src.size`` in all).

    Returns:
        The ``GZIX`` record: the compressed file's fingerprint and the seek points.

    Raises:
        TruncatedError: The gzip data ends inside a member.
        ChecksumError: A member's crc32 or length does not match its trailer.
        FormatError: Other invalid gzip data, or the two passes disagree on the length.
        ImportError: indexed_gzip is not installed.
    """
    raw = _RawFile(src, on_read)
    f = _open(raw, spacing)
    try:
        try:
            f.build_full_index()
            bio = io.BytesIO()
            f.export_index(fileobj=bio)
            n_points = f.seek(0, io.SEEK_END)
        except (OSError, ValueError) as e:
            raise _gzip_error(src.path, 0, e) from None
    finally:
        f.close()
    n = inflate_checked(src, out, on_read)
    if n != n_points:
        raise FormatError(
            f"{src.path}: the gzip data decompresses to {n} bytes, but its seek points end at "
            f"byte {n_points}; not indexed (a gzip stream zlib and indexed_gzip read differently)"
        )
    head, tail = gzip_fingerprint(src)
    return GzipIndex(src.size, head, tail, spacing, bio.getvalue())


def inflate_checked(
    src: ByteSource, out: IO[bytes], on_read: Callable[[int], None] | None = None
) -> int:
    """Inflate every gzip member of ``src`` into ``out``; return the decompressed length (bytes).

    As ``gunzip``: each member's crc32 and length trailer is checked (RFC 1952 §2.3.1), members
    are concatenated, zeros after the last one are tar padding
    (:func:`~tarindex.storage.unpack.unpack_checked`). One pass, no seek points (the
    second pass of :func:`decompress_indexed`; ``tarindex verify`` and ``ls --members`` use it
    alone).

    Raises:
        TruncatedError: The gzip data ends inside a member.
        ChecksumError: A member's crc32 or length does not match its trailer.
        FormatError: Other invalid gzip data, or non-zero bytes after the last member.
    """
    return unpack_checked(src, out, "gzip", on_read)
