"""Sidecar index files on disk: where they live and how files are written (atomic, durable).

Kept free of the header walk: the reader and the writer import this module to find an index
path; building an index from a tar is :func:`tarindex.build.build_index`.
"""

from __future__ import annotations

import os
import secrets

from ..format.spec import INDEX_SUFFIX

__all__ = ["index_path_for", "temp_path_for", "write_atomic", "fsync_dir"]


def index_path_for(tar_path: str | os.PathLike[str]) -> str:
    """Return the sidecar index path of a tar: ``<tar path>.tidx`` (FORMAT.md §1)."""
    return os.fspath(tar_path) + INDEX_SUFFIX


def temp_path_for(path: str) -> str:
    """A fresh temp name beside ``path``: ``<path>.<pid>.<random>.tmp`` (same filesystem)."""
    return f"{path}.{os.getpid()}.{secrets.token_hex(4)}.tmp"


def fsync_dir(path: str) -> None:
    """``fsync`` the directory holding ``path``, so a rename in it survives a power loss.

    Platforms that cannot open a directory (Windows) skip it.
    """
    try:
        fd = os.open(os.path.dirname(os.path.abspath(path)), os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def write_atomic(path: str, data: bytes, *, durable: bool = True) -> None:
    """Write ``data`` to ``path`` through a temp file in the same directory and ``os.replace``.

    A crash leaves either the old file or the new one, never a partial file at ``path``. The
    new file gets mode ``0o666`` minus the umask, as ``open()`` would give it (the kernel
    applies the umask; this module never changes it).

    Args:
        path: Destination.
        data: The bytes.
        durable: ``fsync`` the file before the rename and the directory after it (the new
            file survives a power loss once this returns). ``False`` for scratch data.
            Defaults to ``True``.

    Raises:
        OSError: The file cannot be written (the temp file is removed; e.g. ``ENOSPC``).
    """
    tmp = temp_path_for(path)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            if durable:
                f.flush()
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    if durable:
        fsync_dir(path)
