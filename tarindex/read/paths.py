"""Where a shard's index is, and what its header says: no reader opened.

:func:`index_for` names the index of a tar (beside it, or in an index directory);
:func:`read_sample_count` reads only an index's 80-byte header (FORMAT.md §2.1).
"""

from __future__ import annotations

import os

from ..format.index import read_header
from ..format.spec import HEADER
from ..storage.bytesource import open_regular
from ..storage.indexfile import index_path_for
from ..storage.remote import is_url, local_path
from .checks import missing_index

__all__ = ["index_for", "read_sample_count", "read_local_index", "open_regular_file"]


def open_regular_file(path: str) -> int:
    """A descriptor of ``path`` opened for reading; FIFOs, sockets and devices are refused.

    Raises:
        FormatError: If ``path`` is not a regular file.
        FileNotFoundError, IsADirectoryError, OSError: As ``os.open``.
    """
    return open_regular(path, "a tar or index")


def read_local_index(tar_path: str, index_path: str) -> bytes:
    """The bytes of a local index file (for a remote tar whose index is kept locally).

    Raises:
        IndexMissingError: No index file.
    """
    try:
        with open(open_regular_file(index_path), "rb") as f:
            return f.read()
    except FileNotFoundError:
        raise missing_index(tar_path, index_path) from None


def index_for(tar_path: str, index_dir: str | None = None) -> str:
    """The index of a tar: ``<tar>.tidx`` beside it, or ``<index_dir>/<basename>.tidx``.

    ``index_dir`` holds indexes kept apart from their tars (``tarindex index URL --out DIR``
    for a remote tar one cannot write beside); it may be a local directory or a URL.
    """
    if index_dir is None:
        return index_path_for(tar_path)
    base = tar_path.rstrip("/").rsplit("/", 1)[-1]
    if is_url(index_dir):
        return index_dir.rstrip("/") + "/" + index_path_for(base)
    return os.path.join(local_path(index_dir), index_path_for(base))


def read_sample_count(tar_path: str, index_path: str | None = None) -> int:
    """Read only the 80-byte index header of a shard and return its sample count.

    The header's counts are checked against the index file's real size first, so a corrupt
    count (``n_samples = 2**40`` in a small file) is refused before anything is sized from it.

    Raises:
        IndexMissingError: No index file.
        FormatError: Bad magic, unknown version, truncated header, counts that do not match
            the file's size (FORMAT.md §2.1), or the index is not a regular file.
    """
    ip = index_path or index_path_for(tar_path)
    try:
        with open(open_regular_file(ip), "rb") as f:
            head = f.read(HEADER.size)
            size = os.fstat(f.fileno()).st_size
    except FileNotFoundError:
        raise missing_index(tar_path, ip) from None
    return read_header(head, ip, file_size=size).n_samples
