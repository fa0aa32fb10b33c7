"""Read-ahead of a worker's planned blocks over remote shards.

Two kinds, chosen per shard by the set's fetch policy (:mod:`tarindex.read.fetchpolicy`,
docs/REMOTE.md "Fetch policy"): shards read whole are downloaded ahead into the cache in the
order the plan first needs them and released once the plan is past them; the blocks of the
others are fetched ahead as ranged reads within the read-ahead budget.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from numpy.typing import NDArray

from ..read.sample_source import SampleSource
from ..read.takes import Takes

__all__ = ["ReadAhead"]


class ReadAhead:
    """The plan's blocks not read yet, queued to the shards' read-ahead (remote shards only).

    :meth:`pump` (before each block read) hands the queue's head to the source's
    :meth:`~tarindex.read.takes.Takes.prefetch_blocks` until the per-process budget
    (``RemoteOptions.readahead_bytes``) is full; what was fetched ahead and not read is dropped
    by :meth:`close` (the iteration ended or was abandoned).

    Args:
        takes: The executor-facing reads of the shards the blocks are read from
            (``shards.takes()``).
        fields: Extensions the reads ask for (``None``: all).
        plan: This worker's planned blocks ``int64 (m, 3)`` in read order, for the fetch
            policy. Defaults to ``None``.
        first: Samples the plan reads before its first sample comes out (a shuffled
            window; ``0``: its first block). Defaults to ``0``.
    """

    DEPTH = 256
    """Blocks looked at per pump at most."""

    def __init__(
        self,
        takes: Takes,
        fields: Sequence[str] | None,
        plan: NDArray[np.int64] | None = None,
        first: int = 0,
    ) -> None:
        self.takes = takes
        self.fields = fields
        self.queue: deque[list[int]] = deque()
        self._windows: dict[int, tuple[NDArray[np.int64], Any]] = {}
        self._added = self._done = 0
        self._last: dict[int, int] = {}  # shard -> index of its last block in the plan
        if plan is not None and len(plan):
            for k, s in enumerate(plan[:, 0].tolist()):
                self._last[s] = k
            takes.plan_blocks(plan, first)

    @classmethod
    def over(
        cls,
        shards: SampleSource,
        takes: Takes,
        fields: Sequence[str] | None,
        plan: NDArray[np.int64] | None = None,
        first: int = 0,
    ) -> ReadAhead | None:
        """A read-ahead through ``takes`` (``shards.takes()``), or ``None`` if no shard is remote."""
        return cls(takes, fields, plan, first) if shards.remote else None

    def add(self, pieces: list[list[int]]) -> None:
        """Append blocks ``(shard, j0, j1)``, in the order they will be read.

        The blocks added before the previous call have been read (the executors add one
        window ahead): shards whose last planned block lies there are passed to the fetch
        policy as done.
        """
        done, self._done = self._done, self._added
        self._added += len(pieces)
        self.queue.extend(pieces)
        if done and self._last:
            passed = [s for s, k in self._last.items() if k < done]
            for s in passed:
                del self._last[s]
            if passed:
                self.takes.passed_blocks(passed)

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

    def pump(self, s: int | None = None) -> None:
        """Queue the next blocks for background reads while the budget has room.

        Called before each block read, with the block's shard ``s``: the fetch policy hears
        of it first (``Takes.reading``: the plan's downloads start after the first block).
        """
        if s is not None:
            self.takes.reading(s)
        q = self.queue
        if not q:
            return
        head = [q[i] for i in range(min(len(q), self.DEPTH))]
        for _ in range(self.takes.prefetch_blocks(head, self.fields)):
            q.popleft()

    def close(self) -> None:
        """Drop what was fetched ahead and not read (frees the budget)."""
        self.queue.clear()
        self.takes.drop_prefetched()
