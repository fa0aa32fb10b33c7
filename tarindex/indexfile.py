"""Sidecar index files on disk: where they live, atomic writes, building one from a tar."""

from __future__ import annotations

import mmap
import os
import tempfile

from .format.index import IndexTables, encode_index
from .format.spec import INDEX_SUFFIX
from .scan import index_tables_for, scan_members

__all__ = ["index_path_for", "write_atomic", "build_index"]

_UMASK = os.umask(0)
os.umask(_UMASK)


def index_path_for(tar_path: str | os.PathLike[str]) -> str:
    """Return the sidecar index path of a tar: ``<tar path>.tidx`` (FORMAT.md §1)."""
    return os.fspath(tar_path) + INDEX_SUFFIX


def write_atomic(path: str, data: bytes) -> None:
    """Write ``data`` to ``path`` through a temp file in the same directory and ``os.replace``.

    A crash leaves either the old file or the new one, never a partial file at ``path``.
    The new file gets mode ``0o666`` minus the umask, as ``open()`` would give it.

    Raises:
        OSError: The file cannot be written (the temp file is removed).
    """
    d = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=os.path.basename(path) + ".", suffix=".tmp", dir=d)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.chmod(tmp, 0o666 & ~_UMASK)  # mkstemp makes 0600; give what open() would
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


def build_index(tar_path: str | os.PathLike[str], index_path: str | None = None) -> IndexTables:
    """Scan an existing tar and write its sidecar index atomically (the tar is not modified).

    Args:
        tar_path: A plain tar made by any common tool (GNU tar, bsdtar, Python tarfile,
            webdataset, tarindex).
        index_path: Where to write. Defaults to ``<tar_path>.tidx`` (FORMAT.md §1).

    Returns:
        The tables written.

    Raises:
        FormatError: Any of the scan errors of :func:`tarindex.scan.scan_members` (truncated,
            corrupt, compressed, not a tar); no index file is written then.
        OSError: The tar cannot be read or the index cannot be written.
    """
    tar_path = os.fspath(tar_path)
    members = scan_members(tar_path)
    with open(tar_path, "rb") as f:  # scan_members refused an empty file: mapping is valid
        mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        try:
            tables = index_tables_for(members, mm)
        finally:
            mm.close()
    write_atomic(index_path or index_path_for(tar_path), encode_index(tables))
    return tables
