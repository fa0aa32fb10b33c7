"""Sidecar index files on disk: where they live and how they are written (atomically).

Kept free of the header walk: the reader and the writer import this module to find an index
path; building an index from a tar is :func:`tarindex.build.build_index`.
"""

from __future__ import annotations

import os
import tempfile

from .format.spec import INDEX_SUFFIX

__all__ = ["index_path_for", "write_atomic"]

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
