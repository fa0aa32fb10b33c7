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

Seeds: every generator is ``numpy.random.SeedSequence([seed_lo, seed_hi, epoch_lo, epoch_hi,
tag, ...])`` with ``seed`` and ``epoch`` split into fixed-width 32-bit words and a distinct
``tag`` per use. Passing ``[seed, epoch, ...]`` directly would collide for values ``>= 2**32``
(``SeedSequence`` splits big ints into a variable number of words, so ``[2**32, 0]`` hashes as
``[0, 1, 0]``) and for trailing zeros; ``seed + epoch`` collides for ``(0, 1)`` and ``(1, 0)``.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

import numpy as np
from numpy.typing import NDArray

__all__ = [
    "BLOCK_DTYPE",
    "WorkerPlan",
    "make_rng",
    "shard_order",
    "cut_blocks",
    "epoch_blocks",
    "rank_share",
    "worker_shares",
    "slot_span",
    "batch_span",
    "slice_blocks",
    "blocks_to_indices",
    "window_order",
    "plan_worker",
    "source_seed",
    "apportion",
    "mix_total",
    "mix_bound",
    "mix_schedule",
    "mix_sources",
    "mix_offsets",
    "mix_spans",
    "resume_segments",
    "mix_counts",
    "plan_span",
]

BLOCK_DTYPE = np.dtype(np.int64)
"""dtype of every block table: rows of ``(shard, start, stop)``, half-open sample ranges."""

_MASK32 = (1 << 32) - 1
_LIMIT = 1 << 64
_TAG_SHARDS = 1
_TAG_CUTS = 2
_TAG_BLOCKS = 3
_TAG_WINDOW = 4
_TAG_MIX = 5
_TAG_MIX_SOURCE = 6
_MIX_LIMIT = 1 << 31

Blocks = NDArray[np.int64]
IntArray = NDArray[np.integer[Any]] | Sequence[int]


def _check_nonneg(name: str, value: int, limit: int = _LIMIT) -> int:
    v = int(value)
    if not 0 <= v < limit:
        raise ValueError(f"{name}={value!r}: expected an integer in [0, {limit})")
    return v


def make_rng(seed: int, epoch: int, tag: int, *keys: int) -> np.random.Generator:
    """Return the generator for one use of the plan.

    Args:
        seed: Base seed, ``0 <= seed < 2**64``.
        epoch: Epoch, ``0 <= epoch < 2**64``.
        tag: Which use (shard order, cuts, block order, window); distinct tags never share a
            stream.
        *keys: Further non-negative 32-bit integers (rank, worker, window index).

    Returns:
        A PCG64 generator seeded from ``SeedSequence([seed_lo, seed_hi, epoch_lo, epoch_hi, tag,
        *keys])``; the entropy list has a fixed length per tag, so no two inputs collide.

    Raises:
        ValueError: If ``seed``, ``epoch`` or a key is negative or too large.
    """
    s = _check_nonneg("seed", seed)
    e = _check_nonneg("epoch", epoch)
    words = [s & _MASK32, s >> 32, e & _MASK32, e >> 32, int(tag)]
    words += [_check_nonneg("key", k, 1 << 32) for k in keys]
    return np.random.Generator(np.random.PCG64(np.random.SeedSequence(words)))


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
    return make_rng(seed, epoch, _TAG_SHARDS).permutation(n_shards).astype(np.int64)


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
    if int(block_size) < 1:
        raise ValueError(f"block_size={block_size!r}: expected an integer >= 1")
    bs = int(block_size)
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
        offsets = make_rng(seed, epoch, _TAG_CUTS).integers(1, int(block_size) + 1, len(cnt))
    blocks = cut_blocks(cnt, order, block_size, offsets)
    if shuffle and len(blocks) > 1:
        blocks = blocks[make_rng(seed, epoch, _TAG_BLOCKS).permutation(len(blocks))]
    return blocks


def rank_share(n_samples: int, world_size: int, drop_last: bool = False) -> int:
    """Return ``P``, the number of samples every rank yields per epoch.

    ``ceil(n_samples / world_size)`` (padding by repeating) or, with ``drop_last``,
    ``n_samples // world_size`` (dropping the remainder). ``0`` when ``n_samples == 0``.

    Raises:
        ValueError: If ``world_size < 1`` or ``n_samples < 0``.
    """
    if int(world_size) < 1:
        raise ValueError(f"world_size={world_size!r}: expected >= 1")
    if int(n_samples) < 0:
        raise ValueError(f"n_samples={n_samples!r}: expected >= 0")
    n, w = int(n_samples), int(world_size)
    return n // w if drop_last else -(-n // w)


def worker_shares(per_rank: int, num_workers: int) -> NDArray[np.int64]:
    """Split one rank's ``per_rank`` samples over its DataLoader workers.

    Returns:
        ``int64`` array of shape ``(num_workers,)``: worker ``w`` gets
        ``per_rank // num_workers + (w < per_rank % num_workers)``. The vector depends only on
        ``(per_rank, num_workers)``, hence is the same on every rank: worker ``w`` yields the
        same count on every rank, so every rank yields the same number of batches.

    Raises:
        ValueError: If ``num_workers < 1``.
    """
    if int(num_workers) < 1:
        raise ValueError(f"num_workers={num_workers!r}: expected >= 1")
    q, r = divmod(int(per_rank), int(num_workers))
    return q + (np.arange(int(num_workers), dtype=np.int64) < r).astype(np.int64)


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
        ValueError: If ``rank``/``worker`` is out of range, ``batch_size < 1``, or as
            :func:`slot_span`.
    """
    if int(batch_size) < 1:
        raise ValueError(f"batch_size={batch_size!r}: expected an integer >= 1")
    base, stop = slot_span(n_samples, rank, world_size, 0, 1, drop_last)  # validates rank
    if not 0 <= int(worker) < int(num_workers):
        raise ValueError(f"worker={worker!r}: expected 0 <= worker < num_workers={num_workers}")
    p, bsz = stop - base, int(batch_size)
    shares = worker_shares(-(-p // bsz), num_workers)
    b0 = int(shares[: int(worker)].sum())
    return base + min(b0 * bsz, p), base + min((b0 + int(shares[int(worker)])) * bsz, p)


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
    rng = make_rng(seed, epoch, _TAG_WINDOW, rank, worker, window)
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


# -- mixing several sources (docs/STREAMING.md, "Mixing") ------------------------------------
#
# The mixed stream of one epoch has ``N = sum(counts)`` positions; source ``s`` fills
# ``counts[s]`` of them. Occurrence ``j`` of source ``s`` has the key ``(j + 1/2) / counts[s]``
# and the base stream is all occurrences sorted by key (ties: by a per-epoch tie order of the
# sources). This is the Sainte-Lague divisor sequence: after any prefix of ``t`` positions each
# source has ``n_s(t) = t * p_s + D_s(t)`` with ``|D_s| <= ((1 - p_s) + p_s * (m - 1)) / 2``
# (``p_s = counts[s] / N``, ``m`` sources with a non-zero count), so any window of ``k``
# consecutive positions holds ``k * p_s`` occurrences of ``s`` up to ``max D - min D <=
# 1 + (m - 2) * p_s`` (:func:`mix_bound`). Since ``D_s(N) = 0`` the sequence may be rotated
# cyclically without changing that range: with ``shuffle`` the epoch's stream is the base
# stream rotated by a seeded offset, with a seeded tie order. Positions are computed exactly
# in integers (no sort, no floating point): position of occurrence ``j`` of ``s`` is ``j``
# plus, for every other source ``r``, the number of its occurrences with a smaller key.


def source_seed(seed: int, source: int) -> int:
    """Return the seed of source ``source``'s own plan inside a mix seeded with ``seed``.

    Two sources built from the same shards and seed are therefore still shuffled
    independently, and the whole mixed order is a pure function of ``(seed, epoch)``.

    Returns:
        An integer in ``[0, 2**63)``.

    Raises:
        ValueError: If ``seed`` is not in ``[0, 2**64)`` or ``source`` not in ``[0, 2**32)``.
    """
    return _source_seed(int(seed), int(source))


@functools.lru_cache(maxsize=256)
def _source_seed(seed: int, source: int) -> int:
    return int(make_rng(seed, 0, _TAG_MIX_SOURCE, source).integers(0, 1 << 63))


def _fractions(weights: Sequence[float]) -> list[Fraction]:
    try:  # a float is read as its shortest decimal (0.1 -> 1/10, not 0.1000000000000000055)
        w = [Fraction(repr(float(x))) if isinstance(x, float) else Fraction(x) for x in weights]
    except (ValueError, OverflowError, TypeError) as e:
        raise ValueError(f"weights={list(weights)!r}: expected finite numbers >= 0 ({e})") from e
    if not w or any(x < 0 for x in w) or sum(w) <= 0:
        raise ValueError(
            f"weights={list(weights)!r}: expected numbers >= 0, at least one of them > 0"
        )
    return w


def apportion(
    weights: Sequence[float], total: int, caps: Sequence[int | None] | None = None
) -> NDArray[np.int64]:
    """Split ``total`` samples over sources in proportion to ``weights`` (largest remainder).

    Each source gets ``floor(total * w_s / sum(w))`` (at most its cap), and the samples left
    over go one each to the sources with the largest fractional remainders (ties: lower index
    first), skipping sources at their cap, in passes until none is left. Exact: weights are
    converted to fractions (a float as its shortest decimal, so ``0.1`` is ``1/10``).

    Args:
        weights: Non-negative weights, at least one positive, shape ``(m,)``.
        total: Samples to split, ``>= 0``.
        caps: Per source the most it may get (``None``: no cap), e.g. its size when it is
            sampled without replacement. Defaults to no caps.

    Returns:
        ``int64`` array of shape ``(m,)`` summing to ``total``; ``|c_s - total * w_s / sum(w)|
        < 1`` when no cap binds; a source of weight 0 gets 0.

    Raises:
        ValueError: Bad weights, a negative total, or caps too small to hold ``total``.
    """
    w = _fractions(weights)
    if int(total) < 0:
        raise ValueError(f"total={total!r}: expected >= 0")
    t = int(total)
    cap = [None] * len(w) if caps is None else list(caps)
    if len(cap) != len(w):
        raise ValueError(f"caps: {len(cap)} values for {len(w)} weights")
    big = t + 1
    lim = [0 if x == 0 else (big if c is None else int(c)) for x, c in zip(w, cap, strict=True)]
    quota = [t * x / sum(w) for x in w]
    out = [min(math.floor(q), m) for q, m in zip(quota, lim, strict=True)]
    order = sorted(range(len(w)), key=lambda i: (-(quota[i] - math.floor(quota[i])), i))
    left = t - sum(out)
    while left > 0:
        room = [i for i in order if out[i] < lim[i]]
        if not room:
            raise ValueError(
                f"cannot place {t} samples: the sources hold at most {sum(lim)} without "
                f"replacement (caps {cap}); lower the total or allow replacement"
            )
        for i in room[:left]:
            out[i] += 1
        left = t - sum(out)
    return np.asarray(out, dtype=np.int64)


def mix_total(weights: Sequence[float], sizes: Sequence[int], replacement: Sequence[bool]) -> int:
    """Return the default samples per epoch of a weighted mix.

    The largest ``N`` for which no source sampled without replacement needs more samples than
    it has: ``min over those sources of floor(size_s * sum(w) / w_s)`` (sources of weight 0
    left out). When every weighted source is sampled with replacement, ``sum(sizes)``.

    Raises:
        ValueError: Bad weights, or ``weights``/``sizes``/``replacement`` of different lengths.
    """
    w = _fractions(weights)
    if not len(w) == len(sizes) == len(replacement):
        raise ValueError("weights, sizes and replacement need one entry per source")
    lims = [
        math.floor(int(n) * sum(w) / x)
        for x, n, rep in zip(w, sizes, replacement, strict=True)
        if x > 0 and not rep
    ]
    return min(lims) if lims else int(sum(int(n) for n in sizes))


def _mix_counts(counts: IntArray) -> NDArray[np.int64]:
    c = np.asarray(counts, dtype=np.int64).reshape(-1)
    if c.size and int(c.min()) < 0:
        raise ValueError(f"counts={c.tolist()}: expected integers >= 0")
    if int(c.sum()) >= _MIX_LIMIT:
        raise ValueError(
            f"counts sum to {int(c.sum())}: a mixed epoch holds fewer than 2**31 samples "
            "(split it into several epochs)"
        )
    return c


def mix_bound(counts: IntArray) -> NDArray[np.float64]:
    """Return, per source, the bound of the mixing schedule over any window.

    For any ``k`` consecutive positions of one epoch's mixed stream (:func:`mix_schedule`,
    rotated or not, so also any contiguous share of a rank or worker), the number of
    positions of source ``s`` differs from ``k * p_s`` by at most ``1 + (m - 2) * p_s``,
    where ``p_s = counts[s] / sum(counts)`` and ``m`` is the number of sources with a non-zero
    count: at most 1 for two sources, below 2 for three, ``0`` for a single source.

    Returns:
        ``float64`` array of shape ``(len(counts),)`` (``0`` for a source of count 0).
    """
    c = _mix_counts(counts)
    n = int(c.sum())
    if n == 0:
        return np.zeros(len(c), dtype=np.float64)
    m = int((c > 0).sum())
    p = c / n
    out: NDArray[np.float64] = np.where(c > 0, 1.0 + (m - 2) * p, 0.0)
    return out


def _pos1(c: list[int], tie: list[int], s: int, j: int) -> int:
    """Base position of occurrence ``j`` of source ``s`` (Python ints, exact)."""
    pos, x, cs = j, 2 * j + 1, c[s]
    for r, cr in enumerate(c):
        if r != s and cr:
            big = x * cr
            m = big // cs if tie[r] < tie[s] else (big - 1) // cs
            pos += min((m + 1) // 2, cr)
    return pos


def _first_at(c: list[int], tie: list[int], s: int, x: int) -> int:
    """Smallest occurrence ``j`` of source ``s`` whose base position is ``>= x`` (or ``c[s]``).

    ``_pos1`` is strictly increasing in ``j`` and within ``m`` of ``(j + 1/2) N / c[s]``, so
    the search starts there and brackets outward (a few ``_pos1`` calls, not ``log2 c[s]``).
    """
    cs = c[s]
    if cs == 0:
        return 0
    lo, hi = -1, cs  # _pos1(lo) < x <= _pos1(hi), with _pos1(-1) = -inf and _pos1(cs) = +inf
    g = min(max((2 * x + 1) * cs // (2 * sum(c)), 0), cs - 1)
    step = 1
    if _pos1(c, tie, s, g) >= x:
        hi = g
        while (t := hi - step) > lo:
            if _pos1(c, tie, s, t) < x:
                lo = t
                break
            hi, step = t, 2 * step
    else:
        lo = g
        while (t := lo + step) < hi:
            if _pos1(c, tie, s, t) >= x:
                hi = t
                break
            lo, step = t, 2 * step
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if _pos1(c, tie, s, mid) >= x:
            hi = mid
        else:
            lo = mid
    return hi


def _mix_base(
    c: NDArray[np.int64], tie: list[int], x: int, y: int, occ: NDArray[np.int64] | None
) -> NDArray[np.int64]:
    """Source of base positions ``[x, y)``, ``0 <= x <= y <= N``; occurrences into ``occ``."""
    cl = c.tolist()
    src = np.empty(y - x, dtype=np.int64)
    for s, cs in enumerate(cl):
        if not cs:
            continue
        j = np.arange(_first_at(cl, tie, s, x), _first_at(cl, tie, s, y), dtype=np.int64)
        pos = j - x
        odd = 2 * j + 1
        for r, cr in enumerate(cl):
            if r != s and cr:
                big = odd * cr
                m = big // cs if tie[r] < tie[s] else (big - 1) // cs
                m += 1
                m >>= 1  # m >= 0: (m + 1) // 2, as in _pos1
                pos += np.minimum(m, cr, out=m)
        src[pos] = s
        if occ is not None:
            occ[pos] = j
    return src


def _mix_epoch(c: NDArray[np.int64], seed: int, epoch: int, shuffle: bool) -> tuple[int, list[int]]:
    n = int(c.sum())
    if not shuffle or n == 0:
        return 0, list(range(len(c)))
    phi, tie = _mix_epoch_rng(tuple(c.tolist()), n, int(seed), int(epoch))
    return phi, list(tie)


@functools.lru_cache(maxsize=64)
def _mix_epoch_rng(c: tuple[int, ...], n: int, seed: int, epoch: int) -> tuple[int, tuple[int, ...]]:
    """The epoch's rotation and tie order (memoised: a mix asks for them a few times an epoch)."""
    rng = make_rng(seed, epoch, _TAG_MIX)
    tie = np.empty(len(c), dtype=np.int64)
    tie[rng.permutation(len(c))] = np.arange(len(c))
    return int(rng.integers(0, n)), tuple(tie.tolist())


def mix_schedule(
    counts: IntArray,
    seed: int,
    epoch: int,
    start: int,
    stop: int,
    shuffle: bool = True,
) -> tuple[NDArray[np.int64], NDArray[np.int64]]:
    """Return which source fills each position ``[start, stop)`` of an epoch's mixed stream.

    The epoch's stream has ``N = sum(counts)`` positions, ``counts[s]`` of them source ``s``,
    spread as evenly as :func:`mix_bound` states over every window. With ``shuffle`` it is
    rotated by a seeded offset and ties are broken in a seeded source order; both are pure
    functions of ``(seed, epoch)`` and keep the bound. Positions ``>= N`` wrap (``p`` means
    ``p % N``), for the padding of :func:`slot_span`. Cost: ``O((stop - start) * m)`` time and
    memory plus ``O(m^2 log N)``, whatever ``N``.

    Args:
        counts: Positions per source this epoch, shape ``(m,)``, integers ``>= 0``, summing
            to less than ``2**31``.
        seed: Base seed, ``0 <= seed < 2**64``.
        epoch: Epoch, ``0 <= epoch < 2**64``.
        start: First position, ``>= 0``.
        stop: End position (exclusive).
        shuffle: Rotate and permute ties (see above). Defaults to ``True``.

    Returns:
        ``(src, occ)``, two ``int64`` arrays of shape ``(max(stop - start, 0),)``: the source
        of each position, and its occurrence number within that source this epoch (in
        ``[0, counts[src])``; the occurrences of a source appear in increasing order, ``0``
        first, except where positions wrap).

    Raises:
        ValueError: Negative counts, a sum of ``2**31`` or more, a negative ``start``, a
            non-empty range over zero samples, or bad ``seed``/``epoch``.
    """
    src, occ = _mix_positions(counts, seed, epoch, start, stop, shuffle, True)
    assert occ is not None  # with_occ
    return src, occ


def mix_sources(
    counts: IntArray,
    seed: int,
    epoch: int,
    start: int,
    stop: int,
    shuffle: bool = True,
) -> NDArray[np.int64]:
    """Return :func:`mix_schedule`'s ``src`` alone (cheaper: no occurrence numbers).

    Arguments, result and errors as :func:`mix_schedule`'s first array.
    """
    return _mix_positions(counts, seed, epoch, start, stop, shuffle, False)[0]


def _mix_positions(
    counts: IntArray, seed: int, epoch: int, start: int, stop: int, shuffle: bool, with_occ: bool
) -> tuple[NDArray[np.int64], NDArray[np.int64] | None]:
    c = _mix_counts(counts)
    n = int(c.sum())
    a, b = int(start), int(stop)
    if b <= a:
        return np.empty(0, dtype=np.int64), np.empty(0, dtype=np.int64)
    if a < 0 or n == 0:
        raise ValueError(f"positions [{a}, {b}) out of range for a mix of {n} samples")
    phi, tie = _mix_epoch(c, seed, epoch, shuffle)
    srcs: list[NDArray[np.int64]] = []
    occs: list[NDArray[np.int64]] = []
    t = a
    while t < b:
        x = (t + phi) % n
        y = min(n, x + (b - t))
        o = np.empty(y - x, dtype=np.int64) if with_occ else None
        srcs.append(_mix_base(c, tie, x, y, o))
        if o is not None:
            occs.append(o)
        t += y - x
    src = srcs[0] if len(srcs) == 1 else np.concatenate(srcs)
    if not with_occ:
        return src, None
    cl = c.tolist()
    jphi = np.asarray([_first_at(cl, tie, s, phi) for s in range(len(cl))], dtype=np.int64)
    occ = occs[0] if len(occs) == 1 else np.concatenate(occs)
    cs = np.maximum(c, 1)[src]
    occ = (occ - jphi[src]) % cs
    return src, occ


def mix_offsets(
    counts: IntArray, seed: int, epoch: int, pos: int, shuffle: bool = True
) -> NDArray[np.int64]:
    """Return how many positions of each source come before position ``pos`` of the stream.

    The same stream as :func:`mix_schedule`; past ``N = sum(counts)`` the count keeps growing
    (``counts`` per wrap), so the occurrences of source ``s`` in positions ``[a, b)`` are
    ``mix_offsets(.., a)[s] .. mix_offsets(.., b)[s] - 1``, each taken modulo ``counts[s]``.
    Cost ``O(m^2 log N)``, no per-position work.

    Returns:
        ``int64`` array of shape ``(m,)``.

    Raises:
        ValueError: As :func:`mix_schedule`, or a negative ``pos``.
    """
    c = _mix_counts(counts)
    n, p = int(c.sum()), int(pos)
    if p < 0:
        raise ValueError(f"pos={pos!r}: expected >= 0")
    if n == 0:
        return np.zeros(len(c), dtype=np.int64)
    phi, tie = _mix_epoch(c, seed, epoch, shuffle)
    cl = c.tolist()
    cyc, x = divmod(phi + p, n)
    return np.asarray(
        [
            _first_at(cl, tie, s, x) + cs * cyc - _first_at(cl, tie, s, phi)
            for s, cs in enumerate(cl)
        ],
        dtype=np.int64,
    )


def mix_spans(
    first: int, stop: int, count: int, size: int, epoch: int, replacement: bool
) -> list[tuple[int, int, int]]:
    """Map occurrences ``[first, stop)`` of one source in a mixed epoch to its own epochs.

    Occurrences are numbered as :func:`mix_offsets` does (occurrence ``u`` is the source's
    ``u mod count``-th sample of the epoch; ``u >= count`` only in the padding). Without
    replacement, occurrence ``o`` of mixed epoch ``e`` is position ``o`` of the source's epoch
    ``e`` (so ``count <= size``: a different random subset each epoch when ``count <
    size``). With replacement the source's stream is its epochs ``0, 1, 2, ...`` concatenated
    and mixed epoch ``e`` takes its positions ``[e * count, (e + 1) * count)``: a sample
    repeats only after every sample of the source has been seen, and a source sampled below
    its size is still seen whole over the epochs.

    Args:
        first: First occurrence, ``>= 0``.
        stop: End occurrence (exclusive).
        count: The source's positions per mixed epoch.
        size: Samples in the source, ``>= 1`` when ``count > 0``.
        epoch: Mixed epoch.
        replacement: See above.

    Returns:
        Rows ``(source_epoch, start, stop)`` of Python ints, in order: half-open ranges of
        positions in the yield order of the source's plan of ``source_epoch``; their lengths
        sum to ``max(stop - first, 0)``.

    Raises:
        ValueError: Without replacement and ``count > size``.
    """
    u0, u1, cnt, n = int(first), int(stop), int(count), int(size)
    if u1 <= u0:
        return []
    if not replacement and cnt > n:
        raise ValueError(
            f"{cnt} samples per epoch from a source of {n} without replacement; "
            "pass replacement=True for that source or lower its count or weight"
        )
    rows: list[tuple[int, int, int]] = []
    while u0 < u1:  # one piece per wrap of the padding
        o0 = u0 % cnt
        o1 = o0 + min(u1 - u0, cnt - o0)
        u0 += o1 - o0
        if not replacement:
            rows.append((int(epoch), o0, o1))
            continue
        g0, g1 = int(epoch) * cnt + o0, int(epoch) * cnt + o1
        while g0 < g1:
            q = g0 // n
            e = min(g1, (q + 1) * n)
            rows.append((q, g0 - q * n, e - q * n))
            g0 = e
    return rows


def resume_segments(
    n_samples: int,
    legs: Sequence[tuple[int, int]],
    rank: int,
    world_size: int,
    drop_last: bool = False,
) -> Blocks:
    """Deal what is left of an epoch over a new world size (a resume on other ranks).

    An epoch started on ``legs[0][0]`` ranks, each rank ``r`` holding the sequence ``L_r`` of
    ``rank_share(n_samples, legs[0][0])`` positions its plan gives it. Each leg ``(W_i, k_i)``
    says that all ``W_i`` ranks of that leg had consumed ``k_i`` items of their share (ranks
    advance in lockstep under DDP) when the state was saved. What is left after a leg, each
    rank's share after its first ``k_i`` items, concatenated in rank order, is dealt over the
    next leg's ranks (finally ``world_size``) exactly as :func:`slot_span` deals an epoch:
    equal contiguous shares of ``rank_share(left, W)`` positions, padding by wrapping to the
    start of what is left (``drop_last=False``) or dropping its end (``drop_last=True``), so
    fewer than ``W`` items are repeated or left out.

    Args:
        n_samples: Positions in the epoch's plan (all ranks), ``>= 0``.
        legs: ``(world_size, consumed per rank)`` of each interrupted leg, oldest first.
        rank: Rank in the current leg, ``0 <= rank < world_size``.
        world_size: Ranks in the current leg.
        drop_last: Remainder policy. Defaults to ``False``.

    Returns:
        ``int64 (m, 3)`` rows ``(old_rank, start, stop)``: this rank's share, as ranges of
        positions of ``L_old_rank`` (ranks of ``legs[0]``); lengths sum to its share.

    Raises:
        ValueError: No legs, a world size below 1, a consumed count out of range, a bad rank.
    """
    if not legs:
        raise ValueError("legs: expected at least one (world_size, consumed) pair")
    if not 0 <= int(rank) < int(world_size):
        raise ValueError(f"rank={rank!r}: expected 0 <= rank < world_size={world_size}")
    w0 = int(legs[0][0])
    p0 = rank_share(n_samples, w0, drop_last)
    shares = [np.asarray([[r, 0, p0]], dtype=BLOCK_DTYPE) for r in range(w0)]
    sizes = [int(w) for w, _ in legs[1:]] + [int(world_size)]
    for (_, k), w_next in zip(legs, sizes, strict=True):
        have = int(shares[0][:, 2].sum() - shares[0][:, 1].sum()) if shares else 0
        if not 0 <= int(k) <= have:
            raise ValueError(f"legs: consumed={k} outside [0, {have}] of a rank's share")
        rest = np.concatenate(
            [slice_blocks(b, int(k), have) for b in shares] or [np.empty((0, 3), BLOCK_DTYPE)]
        ).reshape(-1, 3)
        left = int((rest[:, 2] - rest[:, 1]).sum())
        p = rank_share(left, w_next, drop_last)
        shares = [
            slice_blocks(rest, r * p, (r + 1) * p, wrap=True)
            if p
            else np.empty((0, 3), dtype=BLOCK_DTYPE)
            for r in range(w_next)
        ]
    return shares[int(rank)]


def mix_counts(
    sizes: Sequence[int],
    weights: Sequence[float] | None = None,
    counts: Sequence[int] | None = None,
    total: int | None = None,
    replacement: bool | Sequence[bool] = False,
) -> tuple[NDArray[np.int64], list[bool]]:
    """Resolve a mix's per-epoch sample counts from weights or explicit counts.

    Args:
        sizes: Samples in each source, shape ``(m,)``.
        weights: Relative weights (exclusive with ``counts``): ``total`` (default
            :func:`mix_total`) samples are split by :func:`apportion`, capped at the sizes of
            sources sampled without replacement.
        counts: Samples per epoch from each source (exclusive with ``weights``).
        total: Samples per epoch, only with ``weights``.
        replacement: One flag for all sources or one per source; see :func:`mix_spans`.
            Defaults to ``False``.

    Returns:
        ``(counts, replacement)``: ``int64 (m,)`` counts and one flag per source.

    Raises:
        ValueError: Neither or both of ``weights``/``counts``, lengths that differ from
            ``sizes``, ``total`` with ``counts``, a count above its source's size without
            replacement, a positive count from an empty source, or no sample at all.
    """
    m = len(sizes)
    if m == 0:
        raise ValueError("a mix needs at least one source")
    rep = [bool(replacement)] * m if isinstance(replacement, bool) else list(map(bool, replacement))
    if len(rep) != m:
        raise ValueError(f"replacement: {len(rep)} flags for {m} sources")
    if (weights is None) == (counts is None):
        raise ValueError("pass exactly one of weights= and counts=")
    if counts is not None:
        if total is not None:
            raise ValueError("samples_per_epoch/total goes with weights=, not counts=")
        c = np.asarray([int(x) for x in counts], dtype=np.int64)
        if len(c) != m:
            raise ValueError(f"counts: {len(c)} values for {m} sources")
        if c.size and int(c.min()) < 0:
            raise ValueError(f"counts={c.tolist()}: expected integers >= 0")
    else:
        weights = list(weights or ())
        if len(weights) != m:
            raise ValueError(f"weights: {len(weights)} values for {m} sources")
        t = mix_total(weights, sizes, rep) if total is None else int(total)
        c = apportion(weights, t, [None if r else int(n) for r, n in zip(rep, sizes, strict=True)])
    for s, (cs, n, r) in enumerate(zip(c.tolist(), sizes, rep, strict=True)):
        if cs > 0 and int(n) == 0:
            raise ValueError(f"source {s} is empty but is asked for {cs} samples per epoch")
        if cs > int(n) and not r:
            raise ValueError(
                f"source {s}: {cs} samples per epoch from {n} without replacement; pass "
                f"replacement=True (or a per-source list) or lower its count or weight"
            )
    if int(c.sum()) == 0:
        raise ValueError("the mix has no sample per epoch (all counts are 0)")
    _mix_counts(c)
    return c, rep


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
    A source of a mix reads its share this way (:func:`mix_spans` gives the ranges).

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
        worker=a & _MASK32,
        buffer_size=int(buffer_size),
        shuffle=bool(shuffle),
    )
