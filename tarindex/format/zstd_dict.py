"""The shard's zstd dictionary member and its index entry (docs/FORMAT.md §7): bytes only.

A shard written with ``ShardWriter(..., zstd_dict=True)`` holds one regular tar member named
:data:`~tarindex.format.spec.ZSTD_DICT_MEMBER` before its first sample: a zstd dictionary
(RFC 8878 §5: magic ``0xEC30A437``, then its 4-byte id) that the shard's ``EXT.zst`` members
were compressed with. The name has no dot, so the key rule (§4) puts it in no sample, and
webdataset skips top-level names of the form ``__*__``. The index records where it is in its
metadata (§2.6), under :data:`~tarindex.format.spec.ZSTD_DICT_META`::

    "zstd_dict": {"offset": 1536, "size": 32768, "crc32": 305419896, "dict_id": 1234567}
"""

from __future__ import annotations

import struct
import zlib
from typing import Any, NamedTuple

from ..errors import ChecksumError, FormatError
from .spec import BLOCK, MAX_ZSTD_DICT_BYTES, ZSTD_DICT_MAGIC, ZSTD_DICT_META

__all__ = ["DictEntry", "dict_entry", "dict_id_of", "check_dict", "entry_for"]

_HEAD = struct.Struct("<II")  # magic, dict id (RFC 8878 §5, "Dictionary Format")


class DictEntry(NamedTuple):
    """Where a shard's dictionary is: data offset and size in bytes, crc32, zstd dict id."""

    offset: int
    size: int
    crc32: int
    dict_id: int

    def meta(self) -> dict[str, int]:
        """The metadata value (FORMAT.md §7) for this entry."""
        return dict(self._asdict())


def dict_id_of(data: bytes) -> int:
    """The id in a zstd dictionary's header (RFC 8878 §5), or ``-1`` if it has no header."""
    if len(data) < _HEAD.size:
        return -1
    magic, did = _HEAD.unpack_from(data)
    return int(did) if magic == ZSTD_DICT_MAGIC else -1


def dict_entry(meta: dict[str, Any], index_path: str, tar_size: int) -> DictEntry | None:
    """Parse and check the ``zstd_dict`` entry of an index's metadata (FORMAT.md §7).

    Returns:
        The entry, or ``None`` when the shard has no dictionary.

    Raises:
        FormatError: The entry is not an object of four integers, or its range lies outside
            the tar, is not block-aligned, or is larger than ``MAX_ZSTD_DICT_BYTES``; the
            message names the index and the rebuild command.
    """
    e = meta.get(ZSTD_DICT_META)
    if e is None:
        return None
    fields = DictEntry._fields
    ok = isinstance(e, dict) and all(
        type(e.get(f)) is int and e[f] >= 0 for f in fields
    )  # bool is not an int here
    if ok:
        entry = DictEntry(*(int(e[f]) for f in fields))
        ok = (
            entry.offset >= BLOCK
            and entry.offset % BLOCK == 0
            and 0 < entry.size <= MAX_ZSTD_DICT_BYTES
            and entry.offset + entry.size <= tar_size
            and entry.crc32 < 1 << 32
            and entry.dict_id < 1 << 32
        )
    if not ok:
        raise FormatError(
            f"{index_path}: metadata entry {ZSTD_DICT_META!r} = {e!r} is not a zstd dictionary "
            f"inside the tar (FORMAT.md §7: block-aligned offset, 0 < size <= "
            f"{MAX_ZSTD_DICT_BYTES}, crc32, dict_id); rebuild the index with: tarindex index "
            f"--force <tar>"
        )
    return entry


def check_dict(data: bytes, entry: DictEntry, tar_path: str) -> bytes:
    """Check the dictionary bytes read from the tar against the index entry.

    Raises:
        ChecksumError: The bytes' crc32 is not the recorded one (the tar changed in place).
        FormatError: The bytes are not a zstd dictionary with the recorded id.
    """
    if len(data) != entry.size:
        raise FormatError(
            f"{tar_path}: byte {entry.offset}: read {len(data)} bytes of the zstd dictionary, "
            f"expected {entry.size}"
        )
    crc = zlib.crc32(data)
    if crc != entry.crc32:
        raise ChecksumError(
            f"{tar_path}: byte {entry.offset}: zstd dictionary member crc32 0x{crc:08x} != "
            f"0x{entry.crc32:08x} recorded in the index; the tar changed since it was indexed: "
            f"copy it again, or re-index it (tarindex index --force {tar_path})"
        )
    did = dict_id_of(data)
    if did != entry.dict_id:
        raise FormatError(
            f"{tar_path}: byte {entry.offset}: the zstd dictionary member has id {did}, the "
            f"index records {entry.dict_id} (FORMAT.md §7); re-index it (tarindex index --force "
            f"{tar_path})"
        )
    return data


def entry_for(data: bytes, offset: int) -> DictEntry:
    """The entry that describes dictionary bytes ``data`` stored at ``offset``."""
    return DictEntry(offset, len(data), zlib.crc32(data), max(dict_id_of(data), 0))
