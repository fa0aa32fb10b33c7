"""Read-ahead of a worker's planned blocks over remote shards."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from numpy.typing import NDArray

from ..read.sample_source import SampleSource

__all__ = ["ReadAhead"]


class ReadAhead:
    """The plan's blocks not read yet, queued to the shards' read-ahead (remote shards only).

    :meth:`pump` (before each block read) hands the queue's head to
    :meth:`~tarindex.read.ShardSet.prefetch_blocks` until the per-process budget
    (``RemoteOptions.readahead_bytes``) is full; what was fetched ahead and not read is dropped
    by :meth:`close` (the iteration ended or was abandoned).

    Args:
        shards: The shards the blocks are read from.
        fields: Extensions the reads ask for (``None``: all).
    """

    DEPTH = 256
    """Blocks looked at per pump at most."""

    def __init__(self, shards: SampleSource, fields: Sequence[str] | None) -> None:
        self.shards = shards
        self.fields = fields
        self.queue: deque[list[int]] = deque()
        self._windows: dict[int, tuple[NDArray[np.int64], Any]] = {}

    @classmethod
    def over(cls, shards: SampleSource, fields: Sequence[str] | None) -> ReadAhead | None:
        """A read-ahead for ``shards``, or ``None`` if none is remote."""
        return cls(shards, fields) if shards.remote else None

    def add(self, pieces: list[list[int]]) -> None:
        """Append blocks ``(shard, j0, j1)``, in the order they will be read."""
        self.queue.extend(pieces)

    def window(
        self,
        k: int,
        pieces_of: Callable[[int], tuple[NDArray[np.int64], Any]],
        has_next: bool,
    ) -> tuple[NDArray[np.int64], Any]:
        """Window ``k``'s pieces (planned once), queueing it and window ``k + 1``."""
        for q in (k, k + 1) if has_next else (k,):
            if q not in self._windows:
                self._windows[q] = pieces_of(q)
                self.add(self._windows[q][0].tolist())
        for q in [q for q in self._windows if q < k]:
            del self._windows[q]
        return self._windows[k]

    def pump(self) -> None:
        """Queue the next blocks for background reads while the budget has room."""
        q = self.queue
        if not q:
            return
        head = [q[i] for i in range(min(len(q), self.DEPTH))]
        for _ in range(self.shards.prefetch_blocks(head, self.fields)):
            q.popleft()

    def close(self) -> None:
        """Drop what was fetched ahead and not read (frees the budget)."""
        self.queue.clear()
        self.shards.drop_prefetched()
