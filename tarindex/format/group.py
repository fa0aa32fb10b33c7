"""Group a tar's member list into samples: the one grouping rule shared by writer and scan.

Rules (FORMAT.md §4):

* key and extension come from :func:`tarindex.format.keys.split_key`;
* members the key rule gives no key (no extension, a hidden name, an empty or a ``__``
  extension) belong to no sample and are returned as skipped;
* samples are numbered in order of the first appearance of their key in the tar;
  a sample's members keep the order in which their extensions first appear;
* a member name seen again (``tar -r``) replaces the earlier copy in place: the last copy
  wins, as on extraction, and no later sample changes its number;
* members of one sample need not be adjacent: they are grouped by key across the whole
  shard, and ``interleaved`` reports that it happened.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from .index import IndexTables
from .keys import split_key
from .spec import EXT_ID_DTYPE, OFFSET_DTYPE

__all__ = ["GroupResult", "group_members"]


@dataclass
class GroupResult:
    """Tables grouped by key, with what grouping had to decide."""

    tables: IndexTables
    """The index tables (meta left empty)."""
    skipped_no_ext: list[bytes]
    """Names of members the key rule gives no key (``split_key`` is None: not in any sample)."""
    duplicates: list[bytes]
    """Names that appeared more than once; the last copy was kept."""
    interleaved: bool
    """True if some sample's members were not adjacent in the tar."""


def group_members(
    names: Sequence[bytes],
    offsets: Sequence[int],
    sizes: Sequence[int],
    *,
    tar_size: int,
    head_crc: int,
    tail_crc: int,
    meta: dict[str, Any] | None = None,
) -> GroupResult:
    """Group regular-file members (archive order) into the index tables of FORMAT.md §2.

    Args:
        names: Raw member names (bytes), archive order, length ``m``.
        offsets: Data offsets in bytes, length ``m``.
        sizes: Data sizes in bytes, length ``m``.
        tar_size: Size of the tar in bytes.
        head_crc: Fingerprint crc32 of the tar's first 4096 bytes (FORMAT.md §3).
        tail_crc: Fingerprint crc32 of the tar's last 4096 bytes (FORMAT.md §3).
        meta: Metadata to store (FORMAT.md §2.6).

    Returns:
        A :class:`GroupResult`.
    """
    key_slot: dict[bytes, int] = {}  # key -> sample number
    samples: list[dict[bytes, tuple[int, int]]] = []  # per sample: ext -> (offset, size)
    ext_ids: dict[bytes, int] = {}
    skipped: list[bytes] = []
    dups: list[bytes] = []
    interleaved = False
    last = -1
    for name, off, size in zip(names, offsets, sizes, strict=True):
        ks = split_key(name)
        if ks is None:
            skipped.append(name)
            continue
        key, ext = ks
        slot = key_slot.get(key)
        if slot is None:
            slot = key_slot[key] = len(samples)
            samples.append({})
        elif slot != last:
            interleaved = True
        members = samples[slot]
        if ext in members:
            dups.append(name)
        members[ext] = (off, size)
        if ext not in ext_ids:
            ext_ids[ext] = len(ext_ids)
        last = slot
    n = len(samples)
    counts = np.fromiter((len(s) for s in samples), np.int64, n)
    sample_ptr = np.zeros(n + 1, OFFSET_DTYPE)
    np.cumsum(counts, out=sample_ptr[1:])
    m = int(sample_ptr[-1])
    flat = [(o, s, ext_ids[e]) for sm in samples for e, (o, s) in sm.items()]
    off_arr = np.fromiter((f[0] for f in flat), OFFSET_DTYPE, m)
    size_arr = np.fromiter((f[1] for f in flat), OFFSET_DTYPE, m)
    ext_arr = np.fromiter((f[2] for f in flat), EXT_ID_DTYPE, m)
    keys = list(key_slot)
    key_ptr = np.zeros(n + 1, OFFSET_DTYPE)
    np.cumsum(np.fromiter((len(k) for k in keys), np.int64, n), out=key_ptr[1:])
    tables = IndexTables(
        sample_ptr=sample_ptr,
        offset=off_arr,
        size=size_arr,
        ext_id=ext_arr,
        key_ptr=key_ptr,
        key_blob=b"".join(keys),
        exts=list(ext_ids),
        tar_size=tar_size,
        head_crc=head_crc,
        tail_crc=tail_crc,
        meta=dict(meta or {}),
    )
    return GroupResult(tables, skipped, dups, interleaved)
