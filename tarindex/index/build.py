"""Build the sidecar index of an existing tar: one header walk, one mapping of the tar.

:func:`tarindex.scan.scan_members` walks the headers and takes the fingerprint (FORMAT.md §3)
from the same mapping; :func:`index_tables_for` groups the members into samples (FORMAT.md
§2, §4); :func:`build_index` writes the result atomically beside the tar (FORMAT.md §1).
"""

from __future__ import annotations

import os
import warnings

import numpy as np

from .._version import __version__
from ..format.group import group_members
from ..format.index import IndexTables, encode_index
from ..format.keys import NO_SAMPLE, no_sample_reason, normalize_name
from ..format.spec import MAX_ZSTD_DICT_BYTES, ZSTD_DICT_MEMBER, ZSTD_DICT_META
from ..format.zstd_dict import DictEntry, dict_id_of, entry_for
from ..storage.indexfile import index_path_for, write_atomic
from .scan import Members, scan_members

__all__ = ["build_index", "find_zstd_dict", "index_tables_for"]


def index_tables_for(members: Members, producer: str = "tarindex.scan") -> IndexTables:
    """Group a scanned member list into index tables (FORMAT.md §2, grouping §4).

    Warns (``UserWarning``, at most one warning of each kind per shard) when regular files
    belong to no sample under the key rule (``README``, ``.hidden``, ``name.``, a ``__``
    extension: FORMAT.md §4; they are listed in ``members.skipped``), when some sample's
    members are not adjacent, or when a member name appears more than once (the last copy is
    indexed).

    Args:
        members: The tar's regular-file members and fingerprint, from :func:`scan_members`.
        producer: ``producer`` in the metadata (FORMAT.md §2.6). Defaults to
            ``"tarindex.scan"``.

    Returns:
        The tables, with ``meta`` set; ``tar_size``, ``head_crc`` and ``tail_crc`` are the
        fingerprint the scan took (FORMAT.md §3).
    """
    res = group_members(
        members.raw_names,
        members.offset.tolist(),
        members.size.tolist(),
        tar_size=members.tar_size,
        head_crc=members.head_crc,
        tail_crc=members.tail_crc,
        meta={"producer": producer, "version": __version__},
    )
    t = res.tables
    t.end = members.end
    if members.member_crc is not None:  # into index order (grouping may reorder members)
        crc_at = dict(zip(members.offset.tolist(), members.member_crc.tolist(), strict=True))
        t.member_crc = np.asarray([crc_at[o] for o in t.offset.tolist()], np.uint32)
    # the shard's zstd dictionary is in no sample by design (FORMAT.md §7): no warning
    no_ext = [n for n in res.skipped_no_ext if normalize_name(n) != ZSTD_DICT_MEMBER]
    if no_ext:
        n = len(no_ext)
        first = no_ext[0]
        why = (no_sample_reason(first) or NO_SAMPLE).removeprefix(NO_SAMPLE + ": ")
        warnings.warn(
            f"{members.path}: {n} regular file(s) belong to no sample under the key rule "
            f"(FORMAT.md §4) and are not indexed, e.g. {first!r} ({why}); list them with: "
            f"tarindex ls --members --skipped {members.path}",
            stacklevel=2,
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


def find_zstd_dict(members: Members) -> DictEntry | None:
    """Find the shard's zstd dictionary member (FORMAT.md §7) and describe it, or None.

    The member named ``__tarindex_zstd_dict__`` at the top of the tar (its last copy, as
    extraction does); its bytes are read once (a zstd dictionary is at most
    ``MAX_ZSTD_DICT_BYTES``) for the crc32 and the dictionary id. A member of that name that
    is not a zstd dictionary, or too large, is not recorded (a warning says so).
    """
    names = [normalize_name(n) for n in members.raw_names]
    hits = [i for i, n in enumerate(names) if n == ZSTD_DICT_MEMBER]
    if not hits:
        return None
    i = hits[-1]
    offset, size = int(members.offset[i]), int(members.size[i])
    name = ZSTD_DICT_MEMBER.decode()
    if not 0 < size <= MAX_ZSTD_DICT_BYTES:
        warnings.warn(
            f"{members.path}: byte {offset}: member {name!r} holds {size} bytes, not a zstd "
            f"dictionary of 1 to {MAX_ZSTD_DICT_BYTES} bytes (FORMAT.md §7); not recorded, so "
            f"its .zst members that need it will not decode",
            stacklevel=3,
        )
        return None
    with open(members.path, "rb") as f:
        data = os.pread(f.fileno(), size, offset)
    entry = entry_for(data, offset)
    if len(data) != size or dict_id_of(data) < 0:
        warnings.warn(
            f"{members.path}: byte {offset}: member {name!r} is not a zstd dictionary (no "
            f"dictionary magic, FORMAT.md §7); not recorded",
            stacklevel=3,
        )
        return None
    return entry


def build_index(
    tar_path: str | os.PathLike[str],
    index_path: str | None = None,
    *,
    require_end: bool = True,
    checksums: bool = False,
) -> IndexTables:
    """Scan an existing tar and write its sidecar index atomically (the tar is not modified).

    The tar is opened and mapped once: the header walk also takes the fingerprint. Warnings
    as :func:`index_tables_for` and :func:`tarindex.scan.scan_members`.

    Args:
        tar_path: A plain tar made by any common tool (GNU tar, bsdtar, Python tarfile,
            webdataset, tarindex); the dialects are in docs/TAR_DIALECTS.md.
        index_path: Where to write. Defaults to ``<tar_path>.tidx`` (FORMAT.md §1).
        require_end: Refuse a tar that ends without the end-of-archive zero blocks (a copy
            cut at a member boundary looks the same: ``TruncatedError``). ``False`` indexes
            it with a warning (``tarindex index --no-require-end``). Defaults to ``True``.
            docs/TAR_DIALECTS.md, "End of archive".
        checksums: Also record each member's crc32 (FORMAT.md §2.8.2; reads all the data,
            so ``tarindex verify --data`` and ``verify_data=True`` can check them). Defaults
            to ``False``.

    Returns:
        The tables written (FORMAT.md §2).

    Raises:
        FormatError: Any of the scan errors of :func:`tarindex.scan.scan_members` (truncated,
            corrupt, compressed, not a tar); each names the file and the byte offset. No
            index file is written then.
        OSError: The tar cannot be read or the index cannot be written.
    """
    tar_path = os.fspath(tar_path)
    members = scan_members(tar_path, require_end=require_end, checksums=checksums)
    tables = index_tables_for(members)
    entry = find_zstd_dict(members)
    if entry is not None:
        tables.meta[ZSTD_DICT_META] = entry.meta()
    if not require_end:
        tables.meta["require_end"] = False  # verify rescans it the same way
    write_atomic(index_path or index_path_for(tar_path), encode_index(tables))
    return tables
