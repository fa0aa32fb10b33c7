"""Build the sidecar index of an existing tar: one header walk, one mapping of the tar.

:func:`tarindex.scan.scan_members` walks the headers and takes the fingerprint (FORMAT.md §3)
from the same mapping; :func:`index_tables_for` groups the members into samples (FORMAT.md
§2, §4); :func:`build_index` writes the result atomically beside the tar (FORMAT.md §1).
"""

from __future__ import annotations

import os
import warnings

from ._version import __version__
from .format.group import group_members
from .format.index import IndexTables, encode_index
from .indexfile import index_path_for, write_atomic
from .scan import Members, scan_members

__all__ = ["build_index", "index_tables_for"]


def index_tables_for(members: Members, producer: str = "tarindex.scan") -> IndexTables:
    """Group a scanned member list into index tables (FORMAT.md §2, grouping §4).

    Warns (``UserWarning``) when some sample's members are not adjacent, or a member name
    appears more than once (the last copy is indexed).

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


def build_index(tar_path: str | os.PathLike[str], index_path: str | None = None) -> IndexTables:
    """Scan an existing tar and write its sidecar index atomically (the tar is not modified).

    The tar is opened and mapped once: the header walk also takes the fingerprint.

    Args:
        tar_path: A plain tar made by any common tool (GNU tar, bsdtar, Python tarfile,
            webdataset, tarindex); the dialects are in docs/TAR_DIALECTS.md.
        index_path: Where to write. Defaults to ``<tar_path>.tidx`` (FORMAT.md §1).

    Returns:
        The tables written (FORMAT.md §2).

    Raises:
        FormatError: Any of the scan errors of :func:`tarindex.scan.scan_members` (truncated,
            corrupt, compressed, not a tar); each names the file and the byte offset. No
            index file is written then.
        OSError: The tar cannot be read or the index cannot be written.
    """
    tar_path = os.fspath(tar_path)
    tables = index_tables_for(scan_members(tar_path))
    write_atomic(index_path or index_path_for(tar_path), encode_index(tables))
    return tables
