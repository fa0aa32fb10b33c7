"""Global sample index -> ``(shard, j)``: the one locate rule of every read path.

A set of shards numbers its samples ``0 .. total - 1`` in shard order; ``starts`` (``int64``,
``n_shards + 1``) holds the first global index of each shard and the total last. Negative
indices count from the end, as list indexing does; anything else out of range is a
:class:`~tarindex.errors.SampleIndexError`, and a non-integer a ``TypeError``. ``per > 0``
says every shard but the last holds ``per`` samples (the writer's ``maxcount``): the shard
is then ``i // per`` with no search. The compiled loops hold the C side of the same rule
(``shard_of`` in ``_kernel.c``).
"""

from __future__ import annotations

import bisect
import operator
from collections.abc import Sequence
from typing import Any

import numpy as np
from numpy.typing import NDArray

from ..errors import SampleIndexError

__all__ = ["equal_count", "locate", "locate_many", "sample_indices"]


def equal_count(counts: Sequence[int]) -> int:
    """``per`` for these shard sample counts: the count of all but the last if equal, else 0."""
    c0 = counts[0] if counts else 0  # equal counts but maybe the last: i // c0 finds i
    return c0 if c0 > 0 and all(c == c0 for c in counts[:-1]) else 0


def locate(starts: list[int], per: int, i: int) -> tuple[int, int]:
    """Map global sample index ``i`` to ``(shard, j)``; ``starts`` as a list of ints.

    Raises:
        SampleIndexError: If ``i`` is out of range.
        TypeError: If ``i`` is not an integer.
    """
    if type(i) is not int:
        i = operator.index(i)  # TypeError for 1.5 or "3", as list indexing
    n = starts[-1]
    if i < 0:
        i += n
    if not 0 <= i < n:
        raise SampleIndexError(f"sample index {i} out of range for {n} samples")
    if per:  # shards of equal counts (the writer's maxcount): no search
        s = i // per
        last = len(starts) - 2
        if s > last:
            s = last
    else:
        s = bisect.bisect_right(starts, i) - 1
    return s, i - starts[s]


def sample_indices(
    indices: Sequence[int] | NDArray[np.integer[Any]], total: int
) -> NDArray[np.int64]:
    """Batch indices as ``int64 (n,)`` in ``[0, total)``: negative ones count from the end.

    Raises:
        TypeError: If an index is not an integer (``1.5``, ``"3"``), as list indexing does.
        SampleIndexError: If an index is out of range.
    """
    idx = np.asarray(indices).reshape(-1)
    if idx.dtype.kind not in "iu" and idx.size:
        idx = np.asarray([operator.index(i) for i in idx.tolist()], np.int64)
    idx = idx.astype(np.int64, copy=False)
    idx = np.where(idx < 0, idx + total, idx)
    if idx.size and (int(idx.min()) < 0 or int(idx.max()) >= total):
        bad = int(idx[(idx < 0) | (idx >= total)][0])
        raise SampleIndexError(f"sample index {bad} out of range for {total} samples")
    return idx


def shards_of(starts: NDArray[np.int64], per: int, idx: NDArray[np.int64]) -> NDArray[np.int64]:
    """The shard of each global index of ``idx`` (``int64``, each in ``[0, total)``)."""
    if per:
        return np.minimum(idx // per, len(starts) - 2)
    out: NDArray[np.int64] = np.searchsorted(starts, idx, side="right") - 1
    return out


def locate_many(
    starts: NDArray[np.int64], per: int, indices: Sequence[int] | NDArray[np.integer[Any]]
) -> tuple[NDArray[np.int64], NDArray[np.int64], NDArray[np.int64]]:
    """:func:`locate` for a batch: ``int64`` global indices (normalised), shards, locals.

    Raises:
        SampleIndexError, TypeError: As :func:`sample_indices`.
    """
    idx = sample_indices(indices, int(starts[-1]))
    sid = shards_of(starts, per, idx)
    return idx, sid, idx - starts[sid]
