"""The ``compressed`` metadata of a zstd/xz/bzip2/lz4-compressed shard's index (FORMAT.md §11).

Such a shard has no seek points: its index describes the *decompressed* tar (every offset,
``tar_size`` and the header's fingerprint are of the tar inside, as for gzip, §10) and ties
itself to the compressed file with one metadata entry (§2.6)::

    "compressed": {"format": "zstd", "size": 123456, "head_crc": 305419896, "tail_crc": 2271560481}

``size`` is the compressed file's size in bytes, ``head_crc``/``tail_crc`` the crc32 of its
first and last ``min(4096, size)`` bytes (the fingerprint rule of §3 applied to the file on
disk, as ``GZIX`` does for gzip, §2.8.4). Bytes only: no I/O here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..errors import FormatError
from .hints import rebuild_hint

__all__ = ["PACKED_FORMATS", "PACKED_META", "PackedFile", "packed_of"]

PACKED_FORMATS = ("zstd", "xz", "bzip2", "lz4")
"""Whole-tar compressions read through a decompressed copy (§11), as
:func:`tarindex.format.tar.compression_of` names them."""
PACKED_META = "compressed"
"""The metadata key (§2.6) holding a :class:`PackedFile`."""


@dataclass(frozen=True)
class PackedFile:
    """A compressed shard's format and fingerprint (FORMAT.md §11)."""

    format: str
    """One of :data:`PACKED_FORMATS`."""
    size: int
    """Size of the compressed file in bytes."""
    head_crc: int
    """crc32 of the compressed file's first ``min(4096, size)`` bytes."""
    tail_crc: int
    """crc32 of the compressed file's last ``min(4096, size)`` bytes."""

    def meta(self) -> dict[str, Any]:
        """The metadata value (§11) for this file."""
        return {
            "format": self.format,
            "size": self.size,
            "head_crc": self.head_crc,
            "tail_crc": self.tail_crc,
        }


def packed_of(meta: dict[str, Any], index_path: str) -> PackedFile | None:
    """The :class:`PackedFile` an index's metadata records, or ``None`` (a plain or gzip tar).

    Raises:
        FormatError: The entry is not an object of a known format and three non-negative
            integers below ``2**64``; the message names the index and the rebuild command.
    """
    v = meta.get(PACKED_META)
    if v is None:
        return None
    ints = ("size", "head_crc", "tail_crc")
    ok = (
        isinstance(v, dict)
        and v.get("format") in PACKED_FORMATS
        and all(type(v.get(k)) is int and 0 <= v[k] < 1 << 64 for k in ints)
    )
    if not ok:
        raise FormatError(
            f"{index_path}: metadata {PACKED_META!r} is {v!r}, not a compressed file's format, "
            f"size and crc32s (FORMAT.md §11); rebuild it with: {rebuild_hint(index_path)}"
        )
    return PackedFile(str(v["format"]), int(v["size"]), int(v["head_crc"]), int(v["tail_crc"]))
