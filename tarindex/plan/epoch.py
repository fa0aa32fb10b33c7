"""Pure, seeded planning of a streaming epoch: what each (rank, worker) reads, in what order.

Nothing here reads data, imports torch or keeps state: every function is a pure function of its
arguments, so every rank and every DataLoader worker computes the same plan with no
communication, and the plan can be computed and inspected offline (docs/STREAMING.md).

The plan of one epoch (``shuffle=True``):

1. **Shard order**: a permutation of the shards.
2. **Blocks**: each shard, in that order, is cut into blocks of at most ``block_size``
   contiguous samples. The cut points are shifted by a random offset per shard and epoch, so
   the same samples are not glued together every epoch.
3. **Block order**: the blocks are permuted globally. Their concatenation is the epoch's
   *stream* of ``n`` sample positions.
4. **Dealing**: rank ``r`` takes stream positions ``[r * P, (r + 1) * P)`` where ``P`` is
   :func:`rank_share`; within a rank, worker ``w`` takes a contiguous sub-range of
   :func:`worker_shares` ``[w]`` positions. Blocks are dealt, not shards (a block is split where
   a slice boundary falls inside it), so any number of ranks x workers works with one shard.
5. **Remainder**: ``drop_last=False`` makes ``P = ceil(n / world_size)`` and the positions past
   ``n`` wrap to the start of the stream (the first ``world_size * P - n`` samples of the
   plan are yielded twice, the rest once). ``drop_last=True`` makes ``P = n // world_size``
   and the last ``n - world_size * P`` stream positions are not yielded this epoch (a
   different set each epoch when shuffling). Either way fewer than ``world_size`` samples are
   affected; when ``world_size`` divides ``n`` every sample is yielded exactly once.
6. **Mixing**: each worker's positions are cut into windows of ``buffer_size``; the samples of
   window ``k`` are yielded in the order of :func:`window_order` ``(..., window=k)``, a
   permutation that depends only on ``(seed, epoch, rank, worker, k)``. A worker holds one
   window in memory; resuming at position ``p`` reads window ``p // buffer_size`` again and
   skips ``p % buffer_size`` of its samples, so a resumed epoch is exact.

Every worker of every rank gets the same per-worker counts (:func:`worker_shares` depends on
``P`` and ``num_workers`` only), so all ranks yield the same number of samples *and* of batches.

With ``shuffle=False`` steps 1, 2 (offset), 3 and 6 are the identity: rank ``r`` reads its
share in stored order, worker ``w`` a contiguous part of it.

Seeds: :func:`tarindex.plan.seeds.make_rng`, one tag per use. Block tables:
:mod:`tarindex.plan.blocks`. What is left of an interrupted epoch dealt over another world size:
:mod:`tarindex.plan.resume`; several sources mixed: :mod:`tarindex.plan.mix`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from .blocks import BLOCK_DTYPE, Blocks, IntArray, blocks_to_indices, cut_blocks, slice_blocks
from .checks import check_int
from .seeds import MASK32, TAG_BLOCKS, TAG_CUTS, TAG_SHARDS, TAG_WINDOW, make_rng

__all__ = [
    "WorkerPlan",
    "shard_order",
    "epoch_blocks",
    "rank_share",
    "worker_shares",
    "slot_span",
    "batch_span",
    "window_order",
    "plan_worker",
    "plan_span",
]


def shard_order(n_shards: int, seed: int, epoch: int, shuffle: bool = True) -> NDArray[np.int64]:
    """Return the order in which shards are cut into blocks this epoch.

    Args:
        n_shards: Number of shards, ``>= 0``.
        seed: Base seed, ``0 <= seed < 2**64``.
        epoch: Epoch, ``0 <= epoch < 2**64``.
        shuffle: Permute. Defaults to ``True``.

    Returns:
        ``int64`` array of shape ``(n_shards,)``: a permutation of ``range(n_shards)``
        (the identity when ``shuffle`` is false).

    Raises:
        ValueError: If ``shuffle`` and ``seed`` or ``epoch`` is out of range.
    """
    if not shuffle:
        return np.arange(n_shards, dtype=np.int64)
    return make_rng(seed, epoch, TAG_SHARDS).permutation(n_shards).astype(np.int64)


def epoch_blocks(
    counts: IntArray,
    seed: int,
    epoch: int,
    block_size: int,
    shuffle: bool = True,
) -> Blocks:
    """Return the epoch's stream: all blocks of all shards in the order they are dealt.

    With ``shuffle``: shard order permuted (:func:`shard_order`), first-block sizes drawn
    uniformly from ``[1, block_size]`` per shard, then the blocks permuted globally. Without:
    shards in stored order, cut at multiples of ``block_size``, not permuted.

    Args:
        counts: Samples per shard, shape ``(n_shards,)``.
        seed: Base seed, ``>= 0``.
        epoch: Epoch, ``>= 0``.
        block_size: Samples per block, ``>= 1``.
        shuffle: Permute (see above). Defaults to ``True``.

    Returns:
        ``int64`` array of shape ``(n_blocks, 3)`` of ``(shard, start, stop)`` rows; the row
        lengths sum to ``sum(counts)``.

    Raises:
        ValueError: Bad ``block_size``, ``seed`` or ``epoch``.
    """
    cnt = np.asarray(counts, dtype=np.int64)
    order = shard_order(len(cnt), seed, epoch, shuffle)
    offsets = None
    if shuffle and int(block_size) > 1:
        offsets = make_rng(seed, epoch, TAG_CUTS).integers(1, int(block_size) + 1, len(cnt))
    blocks = cut_blocks(cnt, order, block_size, offsets)
    if shuffle and len(blocks) > 1:
        blocks = blocks[make_rng(seed, epoch, TAG_BLOCKS).permutation(len(blocks))]
    return blocks


def rank_share(n_samples: int, world_size: int, drop_last: bool = False) -> int:
    """Return ``P``, the number of samples every rank yields per epoch.

    ``ceil(n_samples / world_size)`` (padding by repeating) or, with ``drop_last``,
    ``n_samples // world_size`` (dropping the remainder). ``0`` when ``n_samples == 0``.

    Raises:
        ValueError: If ``world_size < 1`` or ``n_samples < 0``, or either is not an integer.
    """
    w = check_int("world_size", world_size, 1)
    n = check_int("n_samples", n_samples, 0)
    return n // w if drop_last else -(-n // w)


def worker_shares(per_rank: int, num_workers: int) -> NDArray[np.int64]:
    """Split one rank's ``per_rank`` samples over its DataLoader workers.

    Returns:
        ``int64`` array of shape ``(num_workers,)``: worker ``w`` gets
        ``per_rank // num_workers + (w < per_rank % num_workers)``. The vector depends only on
        ``(per_rank, num_workers)``, hence is the same on every rank: worker ``w`` yields the
        same count on every rank, so every rank yields the same number of batches.

    Raises:
        ValueError: If ``num_workers`` is not an integer ``>= 1``.
    """
    nw = check_int("num_workers", num_workers, 1)
    q, r = divmod(int(per_rank), nw)
    return q + (np.arange(nw, dtype=np.int64) < r).astype(np.int64)


def slot_span(
    n_samples: int,
    rank: int,
    world_size: int,
    worker: int = 0,
    num_workers: int = 1,
    drop_last: bool = False,
) -> tuple[int, int]:
    """Return the half-open stream positions ``[start, stop)`` dealt to ``(rank, worker)``.

    Positions ``>= n_samples`` (only with ``drop_last=False``) wrap: position ``p`` means
    stream position ``p % n_samples``. ``worker`` defaults to ``0``, ``num_workers`` to ``1``,
    ``drop_last`` to ``False`` (module docstring, steps 4 and 5).

    Raises:
        ValueError: If ``rank`` or ``worker`` is out of range, ``world_size`` or
            ``num_workers`` is below 1, or ``n_samples`` is negative.
    """
    if not 0 <= int(rank) < int(world_size):
        raise ValueError(f"rank={rank!r}: expected 0 <= rank < world_size={world_size}")
    if not 0 <= int(worker) < int(num_workers):
        raise ValueError(f"worker={worker!r}: expected 0 <= worker < num_workers={num_workers}")
    p = rank_share(n_samples, world_size, drop_last)
    shares = worker_shares(p, num_workers)
    start = int(rank) * p + int(shares[: int(worker)].sum())
    return start, start + int(shares[int(worker)])


def batch_span(
    n_samples: int,
    rank: int,
    world_size: int,
    worker: int,
    num_workers: int,
    batch_size: int,
    drop_last: bool = False,
) -> tuple[int, int]:
    """Return the stream positions ``[start, stop)`` of ``(rank, worker)`` when dealing batches.

    The rank's ``P`` positions (:func:`rank_share`, the same as unbatched) are cut into
    ``ceil(P / batch_size)`` batches, the last one short; the batches go whole to the workers,
    ``nb // num_workers`` or one more each (the first ``nb % num_workers`` one more), so only
    the worker holding the rank's last batch yields a short batch, and every rank yields the
    same number of batches whatever ``num_workers``. Positions wrap as in :func:`slot_span`.

    Raises:
        ValueError: If ``rank``/``worker`` is out of range, ``batch_size`` not an integer
            ``>= 1``, or as
            :func:`slot_span`.
    """
    check_int("batch_size", batch_size, 1)
    base, stop = slot_span(n_samples, rank, world_size, 0, 1, drop_last)  # validates rank
    if not 0 <= int(worker) < int(num_workers):
        raise ValueError(f"worker={worker!r}: expected 0 <= worker < num_workers={num_workers}")
    p, bsz = stop - base, int(batch_size)
    shares = worker_shares(-(-p // bsz), num_workers)
    b0 = int(shares[: int(worker)].sum())
    return base + min(b0 * bsz, p), base + min((b0 + int(shares[int(worker)])) * bsz, p)


def window_order(
    length: int, seed: int, epoch: int, rank: int, worker: int, window: int
) -> NDArray[np.int64]:
    """Return the order in which a worker yields the samples of one buffer window.

    Returns:
        ``int64`` permutation of ``range(length)``, shape ``(length,)``, a pure function of
        all arguments (``SeedSequence`` of ``(seed, epoch, rank, worker, window)``).

    Raises:
        ValueError: If ``seed`` or ``epoch`` is not in ``[0, 2**64)``, or ``rank``,
            ``worker`` or ``window`` is not in ``[0, 2**32)``.
    """
    rng = make_rng(seed, epoch, TAG_WINDOW, rank, worker, window)
    return rng.permutation(int(length)).astype(np.int64, copy=False)


@dataclass(frozen=True)
class WorkerPlan:
    """What one (rank, worker) yields in one epoch, and in what order.

    Built by :func:`plan_worker`. Holds ``O(blocks dealt to this worker)`` integers, never a
    per-sample list unless :meth:`order` is called.
    """

    segments: Blocks
    """``int64 (m, 3)``: rows ``(shard, start, stop)``, this worker's share of the stream in
    stream order (padding included); each row is read as one sequential byte range."""
    n_samples: int
    """Samples this worker yields this epoch (sum of segment lengths)."""
    seed: int
    """Base seed."""
    epoch: int
    """Epoch."""
    rank: int
    """Rank of this worker's process group member."""
    worker: int
    """DataLoader worker id within the rank."""
    buffer_size: int
    """Window length of the mixing permutation (``<= 1``: no mixing)."""
    shuffle: bool
    """Whether windows are permuted."""

    @property
    def n_windows(self) -> int:
        """Number of buffer windows (the last may be short)."""
        w = max(self.buffer_size, 1)
        return -(-self.n_samples // w)

    def window(self, k: int) -> tuple[Blocks, NDArray[np.int64] | None]:
        """Return window ``k``: its segments and its yield order.

        Returns:
            ``(pieces, perm)``: ``pieces`` is ``int64 (p, 3)``, the segment rows covering
            positions ``[k * B, min((k + 1) * B, n_samples))`` (``B = buffer_size``); ``perm``
            is the ``int64`` permutation of the window's positions in yield order, or ``None``
            for stored order.
        """
        w = max(self.buffer_size, 1)
        a, b = k * w, min((k + 1) * w, self.n_samples)
        pieces = slice_blocks(self.segments, a, b)
        if not self.shuffle or w <= 1:
            return pieces, None
        return pieces, window_order(b - a, self.seed, self.epoch, self.rank, self.worker, k)

    def order(self, starts: IntArray) -> NDArray[np.int64]:
        """Return the global sample indices in the exact order this worker yields them.

        Args:
            starts: ``ShardSet.starts``, shape ``(n_shards + 1,)``.

        Returns:
            ``int64`` array of shape ``(n_samples,)``.
        """
        idx = blocks_to_indices(self.segments, starts)
        if not self.shuffle or self.buffer_size <= 1:
            return idx
        out = np.empty_like(idx)
        w = self.buffer_size
        for k in range(self.n_windows):
            a, b = k * w, min((k + 1) * w, self.n_samples)
            out[a:b] = idx[a:b][
                window_order(b - a, self.seed, self.epoch, self.rank, self.worker, k)
            ]
        return out


def plan_worker(
    counts: IntArray,
    seed: int,
    epoch: int,
    block_size: int,
    rank: int = 0,
    world_size: int = 1,
    worker: int = 0,
    num_workers: int = 1,
    *,
    buffer_size: int = 0,
    shuffle: bool = True,
    drop_last: bool = False,
    blocks: Blocks | None = None,
    batch_size: int | None = None,
) -> WorkerPlan:
    """Plan one epoch for one (rank, worker).

    Args:
        counts: Samples per shard, shape ``(n_shards,)``, integers ``>= 0``.
        seed: Base seed, ``>= 0``.
        epoch: Epoch, ``>= 0``.
        block_size: Contiguous samples per block, ``>= 1``.
        rank: This process's rank, ``0 <= rank < world_size``. Defaults to ``0``.
        world_size: Number of ranks. Defaults to ``1``.
        worker: DataLoader worker id, ``0 <= worker < num_workers``. Defaults to ``0``.
        num_workers: DataLoader workers per rank (``1`` for in-process loading). Defaults to ``1``.
        buffer_size: Mixing window in samples; ``<= 1`` disables mixing. Defaults to ``0``.
        shuffle: Permute shards, blocks and windows. Defaults to ``True``.
        drop_last: Remainder policy (module docstring, step 5). Defaults to ``False`` (pad).
        blocks: The epoch's stream if already computed (:func:`epoch_blocks` with the same
            arguments); saves recomputing it per worker.
        batch_size: Deal the rank's share in whole batches of this many samples
            (:func:`batch_span`) instead of samples (:func:`slot_span`). The rank's samples
            are the same either way. Defaults to ``None`` (samples).

    Returns:
        The :class:`WorkerPlan`.

    Raises:
        ValueError: For out-of-range arguments.
    """
    cnt = np.asarray(counts, dtype=np.int64)
    if blocks is None:
        blocks = epoch_blocks(cnt, seed, epoch, block_size, shuffle)
    n = int(cnt.sum())
    if batch_size is None:
        a, b = slot_span(n, rank, world_size, worker, num_workers, drop_last)
    else:
        a, b = batch_span(n, rank, world_size, worker, num_workers, batch_size, drop_last)
    segs = slice_blocks(blocks, a, b, wrap=True) if b > a else np.empty((0, 3), dtype=BLOCK_DTYPE)
    return WorkerPlan(
        segments=segs,
        n_samples=b - a,
        seed=int(seed),
        epoch=int(epoch),
        rank=int(rank),
        worker=int(worker),
        buffer_size=int(buffer_size),
        shuffle=bool(shuffle),
    )


def plan_span(
    counts: IntArray,
    seed: int,
    epoch: int,
    block_size: int,
    start: int,
    stop: int,
    *,
    buffer_size: int = 0,
    shuffle: bool = True,
    blocks: Blocks | None = None,
) -> WorkerPlan:
    """Plan positions ``[start, stop)`` of one epoch's stream as a worker of their own.

    The segments are that slice of :func:`epoch_blocks` (one sequential read per piece) and
    the mixing windows are cut from ``start`` on, so a reader of just this range reads no
    sample outside it (a window straddling ``start`` would otherwise be read by two workers).
    Window ``k`` is permuted by :func:`window_order` with ``rank=0, worker=start mod 2**32``.
    A source of a mix reads its share this way (:func:`tarindex.plan.mix.mix_spans` gives the
    ranges).

    Args:
        counts: Samples per shard, shape ``(n_shards,)``.
        seed: Base seed, ``>= 0``.
        epoch: Epoch, ``>= 0``.
        block_size: Contiguous samples per block, ``>= 1``.
        start: First stream position, ``0 <= start <= stop``.
        stop: End position, ``<= sum(counts)``.
        buffer_size: Mixing window; ``<= 1`` disables mixing. Defaults to ``0``.
        shuffle: Permute shards, blocks and windows. Defaults to ``True``.
        blocks: The epoch's stream if already computed. Defaults to computing it.

    Returns:
        The :class:`WorkerPlan` of ``stop - start`` samples.

    Raises:
        ValueError: For out-of-range arguments.
    """
    if blocks is None:
        blocks = epoch_blocks(counts, seed, epoch, block_size, shuffle)
    a, b = int(start), int(stop)
    if b < a:
        raise ValueError(f"positions [{a}, {b}): expected start <= stop")
    segs = slice_blocks(blocks, a, b) if b > a else np.empty((0, 3), dtype=BLOCK_DTYPE)
    return WorkerPlan(
        segments=segs,
        n_samples=b - a,
        seed=int(seed),
        epoch=int(epoch),
        rank=0,
        worker=a & MASK32,
        buffer_size=int(buffer_size),
        shuffle=bool(shuffle),
    )
