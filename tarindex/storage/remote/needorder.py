"""The order a plan needs a tar's bytes in: its whole download fetches its pieces in it.

docs/REMOTE.md, "Fetch policy". A stream's plan reads the blocks of every shard in one
shuffled order; a download in file order hands its bytes out about when it ends (almost every
block waits for the whole tar). The fetch policy hands each whole shard's blocks, in the order
the plan reads them (:func:`need`), to this process's download of that shard, which then
requests its pieces in the order the plan first needs them (:func:`in_need_order`) and marks
them all as coming: a read in this process waits for the piece that holds its bytes (it is
arriving, or requested next) rather than fetching them again by ranges. Each byte still comes
over the network once.
"""

from __future__ import annotations

import os
import threading
from bisect import bisect_right
from collections.abc import Sequence

__all__ = ["in_need_order", "need", "needed"]

_lock = threading.Lock()
_orders: dict[tuple[int, str], list[tuple[int, int]]] = {}
"""(pid, URL) -> byte ranges ``[(start, end)]`` of the tar in the order a plan reads them."""


def _after_fork_in_child() -> None:
    global _lock
    _lock = threading.Lock()


os.register_at_fork(after_in_child=_after_fork_in_child)


def need(url: str, ranges: Sequence[tuple[int, int]]) -> None:
    """Say the order a plan reads ``url``'s bytes in: ranges ``(start, end)``, first first.

    The next download of ``url`` in this process takes it (:func:`needed`); a later call
    replaces it (the next epoch's plan); an empty ``ranges`` forgets it.
    """
    k = (os.getpid(), url)
    with _lock:
        if ranges:
            _orders[k] = [(int(a), int(b)) for a, b in ranges]
        else:
            _orders.pop(k, None)


def needed(url: str) -> list[tuple[int, int]] | None:
    """The order said for ``url`` (:func:`need`), handed to one download; ``None``: none."""
    with _lock:
        return _orders.pop((os.getpid(), url), None)


def in_need_order(
    pieces: Sequence[tuple[int, int]], order: Sequence[tuple[int, int]]
) -> list[tuple[int, int]]:
    """``pieces`` (sorted, disjoint ``(start, end)``) in the order ``order``'s ranges first touch them.

    A piece no range touches goes after those that are, in file order.
    """
    starts = [a for a, _ in pieces]
    rank = [len(order)] * len(pieces)
    for r, (a, b) in enumerate(order):
        k = max(0, bisect_right(starts, a) - 1)
        while k < len(pieces) and pieces[k][0] < b:
            if pieces[k][1] > a and rank[k] > r:
                rank[k] = r
            k += 1
    ranked = sorted(range(len(pieces)), key=lambda i: (rank[i], i))
    return [pieces[i] for i in ranked]
