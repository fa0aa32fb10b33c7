"""Index a compressed tar without recompressing it (docs/FORMAT.md §10, §11).

:func:`gunzipped` records a gzip file's seek points
(:func:`tarindex.storage.gzsource.decompress_indexed`) and hands the header walk a temporary
decompressed copy, removed afterwards whatever happens; :func:`unpacked` does the same for a
zstd/xz/bzip2/lz4 file (no seek points; the copy is kept in the tar cache);
:func:`renamed_errors` makes every message about a copy name the compressed file instead.
:func:`plain_tar` is such a copy without seek points, for the commands that walk the headers
of an indexed shard again (``tarindex verify``, ``tarindex ls --members``).
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from ..errors import TarIndexError
from ..format.gzindex import GzipIndex
from ..format.packed import PackedFile
from ..format.spec import MIN_GZIP_SPACING
from ..format.tar import compression_of
from ..storage.bytesource import PreadSource, open_regular
from ..storage.gzsource import decompress_indexed, gzip_fingerprint
from ..storage.tarcache import unpacking
from ..storage.unpack import UNPACK_FORMATS, codec_missing, unpack_checked

__all__ = ["gunzipped", "unpacked", "plain_tar", "renamed_errors", "check_spacing"]


def check_spacing(spacing: int) -> int:
    """``spacing`` as an int, refused below :data:`~tarindex.format.spec.MIN_GZIP_SPACING`.

    Raises:
        ValueError: ``spacing`` is not an integer of at least 64 KiB.
    """
    if type(spacing) is not int or spacing < MIN_GZIP_SPACING:
        raise ValueError(
            f"gzip_spacing={spacing!r}: expected an int of at least {MIN_GZIP_SPACING} bytes "
            f"(each seek point keeps a 32 KiB window; FORMAT.md §10)"
        )
    return spacing


@contextmanager
def gunzipped(
    path: str,
    spacing: int,
    tmp_dir: str | None = None,
    on_read: Callable[[int], None] | None = None,
) -> Iterator[tuple[str, GzipIndex]]:
    """Yield ``(plain tar, GZIX record)`` for the gzip file at ``path``.

    The plain tar is a temp file in ``tmp_dir`` (else the system's temp directory, ``$TMPDIR``)
    as large as the decompressed tar, deleted on exit.

    Raises:
        TruncatedError, ChecksumError, FormatError: Invalid gzip data (as
            :func:`~tarindex.storage.gzsource.decompress_indexed`), naming ``path``.
        OSError: ``path`` cannot be read or the temp file written (``ENOSPC``).
    """
    fd = open_regular(path, "a gzip-compressed tar")
    src = PreadSource(path, fd, os.fstat(fd).st_size)
    tfd, tmp = tempfile.mkstemp(prefix=".tarindex-gunzip-", suffix=".tar", dir=tmp_dir)
    try:
        with os.fdopen(tfd, "wb") as out:
            gz = decompress_indexed(src, out, check_spacing(spacing), on_read)
        src.close()
        with renamed_errors(tmp, path):
            yield tmp, gz
    finally:
        src.close()
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass


@contextmanager
def unpacked(
    path: str,
    fmt: str,
    tmp_dir: str | None = None,
    on_read: Callable[[int], None] | None = None,
    keep: bool = True,
) -> Iterator[tuple[str, PackedFile]]:
    """Yield ``(plain tar, PackedFile)`` for the ``fmt``-compressed tar at ``path`` (FORMAT.md §11).

    The tar is decompressed once, front to back, every stream checked
    (:func:`~tarindex.storage.unpack.unpack_checked`), into a temp file of the tar cache
    (:func:`~tarindex.storage.tarcache.unpacking`), which becomes ``path``'s cache entry when
    ``keep`` and the body succeeds. Errors about the copy name ``path``.

    Raises:
        TruncatedError, ChecksumError, FormatError: Invalid compressed data, naming ``path``.
        OSError: ``path`` cannot be read or the copy written (``ENOSPC``).
    """
    with unpacking(path, fmt, tmp_dir, on_read, keep) as (tmp, src):
        head, tail = gzip_fingerprint(src)
        with renamed_errors(tmp, path):
            yield tmp, PackedFile(fmt, src.size, head, tail)


@contextmanager
def plain_tar(path: str, tmp_dir: str | None = None) -> Iterator[str]:
    """Yield a plain tar holding the bytes of the tar at ``path``: ``path`` itself, or a copy.

    A compressed tar (gzip, zstd, xz, bzip2, lz4: found by its first bytes, whatever its name;
    FORMAT.md §10, §11) is decompressed once, every stream's own check verified, into a temp
    file in ``tmp_dir`` (else ``$TMPDIR``) as large as the decompressed tar, deleted on exit;
    byte offsets in it are those of the index's tables. Errors about the copy name ``path``
    and say "decompressed byte" (:func:`renamed_errors`). Any other file is yielded as is.

    Raises:
        TruncatedError, ChecksumError, FormatError: Invalid compressed data (as
            :func:`~tarindex.storage.unpack.unpack_checked`), naming ``path``.
        CompressedTarError: lz4 data without the lz4 package (as the header walk raises it).
        OSError: ``path`` cannot be read or the temp file written (``ENOSPC``).
    """
    fd = open_regular(path)
    src = PreadSource(path, fd, os.fstat(fd).st_size)
    try:
        found = compression_of(src.read(0, min(4096, src.size)))  # (skippable frames)
        if found is None or found[0] not in UNPACK_FORMATS or codec_missing(found[0]):
            src.close()
            yield path
            return
        tfd, tmp = tempfile.mkstemp(prefix=".tarindex-unpack-", suffix=".tar", dir=tmp_dir)
        try:
            with os.fdopen(tfd, "wb") as out:
                unpack_checked(src, out, found[0])
            src.close()
            with renamed_errors(tmp, path):
                yield tmp
        finally:
            try:
                os.unlink(tmp)
            except FileNotFoundError:
                pass
    finally:
        src.close()


@contextmanager
def renamed_errors(tmp: str, path: str) -> Iterator[None]:
    """Re-raise a :class:`~tarindex.errors.TarIndexError` about ``tmp`` as one about ``path``.

    Its class is kept; the message says the byte offsets are in the decompressed tar.
    """
    try:
        yield
    except TarIndexError as e:
        msg = str(e)
        if tmp not in msg:
            raise
        msg = msg.replace(f"{tmp}: byte", f"{path}: decompressed byte").replace(tmp, path)
        raise type(e)(msg) from None
