"""A local tar mapped by the read kernel: the byte source of a mapped shard.

:class:`MappedSource` is :class:`~tarindex.storage.bytesource.MmapSource`'s interface over the
kernel's ``Mapped`` (``kernel.kernel.Mapped``: ``_kernel.c``'s, or its twin's) instead of a
Python ``mmap``, so that no read of a mapped tar escapes the cut and change check: the
compiled copies run in the fault guard (a tar cut while mapped raises
:class:`~tarindex.errors.TruncatedError` naming the byte, never SIGBUS), the twin reads with
``os.pread``. The ``Mapped`` owns the tar's one descriptor (the mapping's and ``fstat``'s).
"""

from __future__ import annotations

from functools import partial
from typing import Any

import numpy as np
from numpy.typing import NDArray

from ..errors import TruncatedError
from ..storage.bytesource import MmapSource, closed_error, cold_cache
from . import checks, kernel

__all__ = ["MappedSource"]


class MappedSource(MmapSource):
    """The whole tar mapped read-only by the kernel; ranges are guarded slices of it.

    Args:
        path: The tar's path, for messages.
        fd: An open descriptor of the tar, owned from now on (closed when the last block
            read from it is freed; the caller closes it if this raises).
        size: The tar's size in bytes when opened (``> 0``).
        ident: Its device, inode and mtime (ns) when opened (:func:`checks.ident_of`).

    Raises:
        OSError: If the file cannot be mapped.
    """

    def __init__(self, path: str, fd: int, size: int, ident: checks.Ident) -> None:
        self.path = path
        self.size = size
        self.mm = None  # no Python mmap: reads go through self.mapped
        fault = partial(checks.tar_fault, fd, size, ident, path)
        self.mapped: Any = kernel.kernel.Mapped(fd, size, *ident, fault)
        """The kernel's ``Mapped`` (``None`` once closed; blocks read keep it alive)."""

    def read(self, offset: int, size: int) -> bytes:
        """Return a copy of ``size`` bytes at ``offset`` (guarded).

        Raises:
            TruncatedError: If the range runs past the end of the tar, or the tar was cut
                while mapped; StaleIndexError if it changed (:func:`checks.tar_fault`).
            ClosedError: If the source is closed.
        """
        end = offset + size
        m = self.mapped
        if m is None:
            raise closed_error(self.path)
        if offset < 0 or size < 0 or end > self.size:
            raise TruncatedError(
                f"{self.path}: byte {self.size}: range {offset}..{end} runs past the end of the "
                f"tar; the index is corrupt or the tar was cut: tarindex verify {self.path}"
            )
        got: bytes = m[offset:end]
        return got

    def read_ranges(
        self, starts: NDArray[np.int64], ends: NDArray[np.int64]
    ) -> tuple[Any, NDArray[np.int64]]:
        """Return the ``Mapped`` itself and ``starts`` (offsets into it are tar offsets).

        Raises:
            ClosedError: If the source is closed.
        """
        if self.mapped is None:
            raise closed_error(self.path)
        return self.mapped, starts

    def prefetch(self, start: int, end: int) -> None:
        """The ``MADV_WILLNEED`` hint over ``[start, end)`` while reads fault (:func:`cold_cache`)."""
        if cold_cache():
            self.willneed(start, end)

    def willneed(self, start: int, end: int) -> None:
        """``madvise(MADV_WILLNEED)`` over ``[start, end)`` (the twin: ``posix_fadvise``)."""
        m = self.mapped
        if m is not None and end > start:
            m.willneed(start, min(end, self.size))

    def close(self) -> None:
        """Drop the ``Mapped``; a block handed out stays valid (it holds the ``Mapped``)."""
        self.mapped = None
