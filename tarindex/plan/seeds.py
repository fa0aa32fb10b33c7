"""The seeds of every plan: one generator per use, from ``(seed, epoch, tag, *keys)``.

Every generator of :mod:`tarindex.plan` is ``numpy.random.SeedSequence([seed_lo, seed_hi,
epoch_lo, epoch_hi, tag, ...])`` with ``seed`` and ``epoch`` split into fixed-width 32-bit words
and a distinct ``tag`` per use (the ``TAG_*`` constants below, each defined here only, so no two
uses share a stream). Passing ``[seed, epoch, ...]`` directly would collide for values
``>= 2**32`` (``SeedSequence`` splits big ints into a variable number of words, so ``[2**32, 0]``
hashes as ``[0, 1, 0]``) and for trailing zeros; ``seed + epoch`` collides for ``(0, 1)`` and
``(1, 0)``.
"""

from __future__ import annotations

import numpy as np
import numpy.random  # noqa: F401  (numpy loads it lazily: at import, not at a stream's first plan)

from .checks import check_int, check_u64

__all__ = [
    "MASK32",
    "TAG_SHARDS",
    "TAG_CUTS",
    "TAG_BLOCKS",
    "TAG_WINDOW",
    "TAG_MIX",
    "TAG_MIX_SOURCE",
    "make_rng",
]

MASK32 = (1 << 32) - 1
"""The low 32-bit word of an integer (seeds, epochs and keys are fed in such words)."""
TAG_SHARDS = 1
"""Tag of the epoch's shard order (:func:`tarindex.plan.epoch.shard_order`)."""
TAG_CUTS = 2
"""Tag of the per-shard first-block sizes (:func:`tarindex.plan.epoch.epoch_blocks`)."""
TAG_BLOCKS = 3
"""Tag of the epoch's block order (:func:`tarindex.plan.epoch.epoch_blocks`)."""
TAG_WINDOW = 4
"""Tag of a mixing window's order (:func:`tarindex.plan.epoch.window_order`)."""
TAG_MIX = 5
"""Tag of a mixed epoch's rotation and tie order (:mod:`tarindex.plan.mix`)."""
TAG_MIX_SOURCE = 6
"""Tag of a mixed source's own seed (:func:`tarindex.plan.mix.source_seed`)."""


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
        ValueError: If ``seed``, ``epoch`` or a key is not an integer (a Python or numpy
            one: :func:`tarindex.plan.checks.check_int`), or negative or too large.
    """
    s = check_u64("seed", seed)
    e = check_u64("epoch", epoch)
    words = [s & MASK32, s >> 32, e & MASK32, e >> 32, int(tag)]
    words += [check_int("key", k, 0, 1 << 32) for k in keys]
    return np.random.Generator(np.random.PCG64(np.random.SeedSequence(words)))
