"""The ``GZIX`` record of a gzip-compressed shard's index (docs/FORMAT.md §2.8.4, §10): bytes only.

An index of ``x.tar.gz`` describes the *decompressed* tar (every offset, ``tar_size`` and the
header's fingerprint are of the tar inside), and holds one ``GZIX`` record tying it to the
compressed file and making random access possible without recompressing::

    <QIIQQ>  gz_size, gz_head_crc, gz_tail_crc, spacing, 0      (32 bytes)
    bytes    seek points: an indexed_gzip ("zran") index export, starting b"GZIDX"

``gz_size`` is the compressed file's size in bytes, ``gz_head_crc``/``gz_tail_crc`` the crc32
of its first and last ``min(4096, gz_size)`` bytes (the fingerprint rule of FORMAT.md §3,
applied to the file on disk; the last 4 KiB hold the gzip trailer: the crc32 and length of
the data). ``spacing`` is the most uncompressed bytes between two seek points (informative:
a read decompresses at most one such span).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import FormatError
from .hints import rebuild_hint
from .spec import GZIP_RECORD, GZIP_SEEK_MAGIC

__all__ = ["GzipIndex", "encode_gzip_record", "decode_gzip_record"]


@dataclass(frozen=True)
class GzipIndex:
    """A compressed shard's fingerprint and seek points (FORMAT.md §2.8.4)."""

    gz_size: int
    """Size of the compressed file in bytes."""
    head_crc: int
    """crc32 of the compressed file's first ``min(4096, gz_size)`` bytes."""
    tail_crc: int
    """crc32 of the compressed file's last ``min(4096, gz_size)`` bytes."""
    spacing: int
    """Most uncompressed bytes between two seek points."""
    points: bytes | memoryview
    """The seek points: an indexed_gzip index export (starts with ``b"GZIDX"``)."""


def encode_gzip_record(g: GzipIndex) -> bytes:
    """The data of the ``GZIX`` record for ``g`` (the record header is the caller's)."""
    return GZIP_RECORD.pack(g.gz_size, g.head_crc, g.tail_crc, g.spacing, 0) + bytes(g.points)


def decode_gzip_record(data: memoryview, at: int, path: str) -> GzipIndex:
    """Parse the data of a ``GZIX`` record found at byte ``at`` of the index at ``path``.

    Raises:
        FormatError: The record is shorter than its fixed part, its spacing is 0, or its seek
            points do not start with ``b"GZIDX"``; the message names the byte and the rebuild
            command.
    """
    n = GZIP_RECORD.size
    if len(data) < n + len(GZIP_SEEK_MAGIC) or bytes(data[n : n + 5]) != GZIP_SEEK_MAGIC:
        raise FormatError(
            f"{path}: byte {at}: GZIX record of {len(data)} bytes does not hold a {n}-byte "
            f"fingerprint followed by seek points starting {GZIP_SEEK_MAGIC!r} (FORMAT.md "
            f"§2.8.4); rebuild it with: {rebuild_hint(path)}"
        )
    size, head, tail, spacing, _ = GZIP_RECORD.unpack_from(data)
    if spacing == 0:
        raise FormatError(
            f"{path}: byte {at + 16}: GZIX spacing is 0 (FORMAT.md §2.8.4); rebuild it with: "
            f"{rebuild_hint(path)}"
        )
    return GzipIndex(int(size), int(head), int(tail), int(spacing), data[n:])
