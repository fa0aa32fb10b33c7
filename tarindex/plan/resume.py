"""Resuming an epoch on another world size: what is left, dealt over the new ranks.

Pure (docs/STREAMING.md, "Resuming"): the positions a rank still owes are a function of the
epoch's size, the interrupted legs ``(world_size, consumed)`` and the new rank; the samples at
those positions come from the epoch's plan (:mod:`tarindex.plan.epoch`).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from .blocks import BLOCK_DTYPE, Blocks, slice_blocks
from .epoch import rank_share

__all__ = ["resume_segments"]


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
    next leg's ranks (finally ``world_size``) exactly as :func:`tarindex.plan.epoch.slot_span`
    deals an epoch: equal contiguous shares of ``rank_share(left, W)`` positions, padding by wrapping to the
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
