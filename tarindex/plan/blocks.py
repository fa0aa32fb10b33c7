"""Block tables: rows ``(shard, start, stop)`` of contiguous samples, cut, sliced, expanded.

A *block table* is an ``int64`` array of shape ``(n, 3)``; row ``(s, a, b)`` is samples
``a <= j < b`` of shard ``s`` (one sequential byte range of its tar). A table's *positions* are
the samples of its rows in row order, numbered from 0: the epoch's stream
(:func:`tarindex.plan.epoch.epoch_blocks`), a worker's share of it, a window. Pure functions of
their arguments (docs/STREAMING.md).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from numpy.typing import NDArray

from .checks import check_int

__all__ = ["BLOCK_DTYPE", "Blocks", "IntArray", "cut_blocks", "slice_blocks", "blocks_to_indices"]

BLOCK_DTYPE = np.dtype(np.int64)
"""dtype of every block table: rows of ``(shard, start, stop)``, half-open sample ranges."""

Blocks = NDArray[np.int64]
IntArray = NDArray[np.integer[Any]] | Sequence[int]


def cut_blocks(
    counts: IntArray,
    order: IntArray,
    block_size: int,
    offsets: IntArray | None = None,
) -> Blocks:
    """Cut shards into blocks of at most ``block_size`` contiguous samples.

    Args:
        counts: Samples per shard, shape ``(n_shards,)``, non-negative integers.
        order: Shards to cut, in this order, shape ``(n_shards,)`` (usually a permutation).
        block_size: Samples per block, ``>= 1``.
        offsets: Per shard (indexed by shard id, shape ``(n_shards,)``), the size of its first
            block in ``[1, block_size]``; later blocks are ``block_size`` long, the last one
            what remains. ``None`` cuts at ``0, block_size, 2 * block_size, ...``.

    Returns:
        ``int64`` array of shape ``(n_blocks, 3)``: rows ``(shard, start, stop)``, a half-open
        range of sample indices within the shard; shards in ``order``, blocks of one shard in
        stored order. Empty shards contribute no rows.

    Raises:
        ValueError: If ``block_size < 1`` or a count is negative.
    """
    bs = check_int("block_size", block_size, 1)
    cnt = np.asarray(counts, dtype=np.int64)
    if cnt.size and int(cnt.min()) < 0:
        raise ValueError("counts: sample counts must be >= 0")
    ordr = np.asarray(order, dtype=np.int64)
    c = cnt[ordr]
    first = np.full(len(ordr), bs, dtype=np.int64)
    if offsets is not None:
        first = np.asarray(offsets, dtype=np.int64)[ordr]
    first = np.minimum(first, c)
    # blocks per shard: the first block, then ceil((c - first) / bs) more
    rest = c - first
    nb = np.where(c > 0, 1 + (rest + bs - 1) // bs, 0)
    total = int(nb.sum())
    out = np.empty((total, 3), dtype=BLOCK_DTYPE)
    if total == 0:
        return out
    shard_of = np.repeat(ordr, nb)
    # index of each block within its shard
    ends = np.cumsum(nb)
    k = np.arange(total, dtype=np.int64) - np.repeat(ends - nb, nb)
    f = np.repeat(first, nb)
    start = np.where(k == 0, 0, f + (k - 1) * bs)
    stop = np.minimum(f + k * bs, np.repeat(c, nb))
    out[:, 0] = shard_of
    out[:, 1] = start
    out[:, 2] = stop
    return out


def slice_blocks(blocks: Blocks, start: int, stop: int, wrap: bool = False) -> Blocks:
    """Return the blocks covering positions ``[start, stop)`` of the concatenation of ``blocks``.

    Args:
        blocks: ``int64`` array of shape ``(n_blocks, 3)``, rows ``(shard, start, stop)``.
        start: First position, ``>= 0``.
        stop: End position (exclusive).
        wrap: Allow positions past the total length ``n``: position ``p`` means ``p % n``
            (used for padding). Without it, ``stop`` must be ``<= n``. Defaults to ``False``.

    Returns:
        ``int64`` array of shape ``(m, 3)``; the first and last rows are trimmed, so the row
        lengths sum to ``max(stop - start, 0)``.

    Raises:
        ValueError: If the range is out of bounds (``wrap=False``) or ``blocks`` is empty while
            the range is not.
    """
    b = np.asarray(blocks, dtype=BLOCK_DTYPE).reshape(-1, 3)
    start, stop = int(start), int(stop)
    if stop <= start:
        return np.empty((0, 3), dtype=BLOCK_DTYPE)
    lens = b[:, 2] - b[:, 1]
    cum = np.zeros(len(b) + 1, dtype=np.int64)
    np.cumsum(lens, out=cum[1:])
    n = int(cum[-1])
    if start < 0 or (not wrap and stop > n) or n == 0:
        raise ValueError(f"positions [{start}, {stop}) out of range for {n} samples")
    pieces = []
    while start < stop:
        base = (start // n) * n
        a, e = start - base, min(stop - base, n)
        i0 = int(np.searchsorted(cum, a, side="right")) - 1
        i1 = int(np.searchsorted(cum, e, side="left"))
        part = b[i0:i1].copy()
        part[0, 1] += a - cum[i0]
        part[-1, 2] -= cum[i1] - e
        pieces.append(part)
        start = base + e
    return pieces[0] if len(pieces) == 1 else np.concatenate(pieces)


def blocks_to_indices(blocks: Blocks, starts: IntArray) -> NDArray[np.int64]:
    """Expand blocks into global sample indices (``starts[shard] + j``), in block order.

    Args:
        blocks: ``int64`` ``(m, 3)`` rows ``(shard, start, stop)``.
        starts: Cumulative sample counts, shape ``(n_shards + 1,)`` (``ShardSet.starts``).

    Returns:
        ``int64`` array of shape ``(sum of block lengths,)``.
    """
    b = np.asarray(blocks, dtype=np.int64).reshape(-1, 3)
    lens = b[:, 2] - b[:, 1]
    first = np.asarray(starts, dtype=np.int64)[b[:, 0]] + b[:, 1]
    tot = int(lens.sum())
    if tot == 0:
        return np.empty(0, dtype=np.int64)
    offs = np.arange(tot, dtype=np.int64) - np.repeat(np.cumsum(lens) - lens, lens)
    out: NDArray[np.int64] = np.repeat(first, lens) + offs
    return out
