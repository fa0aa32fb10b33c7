"""BlockSampler: a shuffling, rank-splitting sampler for map-style datasets that keeps locality.

The plan, epochs, ranks and resume are torch-free (:mod:`tarindex.stream.samplers`); this is
that sampler as a ``torch.utils.data.Sampler``, its rank from ``torch.distributed``.
"""

from __future__ import annotations

import torch.utils.data

from ..stream.samplers import BlockPlanSampler
from ._dist import TORCH

__all__ = ["BlockSampler"]


class BlockSampler(BlockPlanSampler, torch.utils.data.Sampler[int]):
    """Sample indices in shuffled blocks of contiguous indices, split over ranks.

    A drop-in for ``DistributedSampler`` (or ``shuffle=True``) over a map-style dataset such as
    :class:`tarindex.TarDataset`, when reading whole regions of a shard together matters (cold
    disks, network filesystems, object stores, a bounded cache of open shards): the indices
    ``0..n-1`` are cut into blocks of ``block_size`` contiguous indices (never across a shard
    boundary when the dataset is a ``TarDataset``), the blocks are permuted and the stream
    is dealt to ranks in equal contiguous parts, exactly as :mod:`tarindex.shuffle` plans a
    streaming epoch with one worker per rank. Optionally, indices are mixed in windows of
    ``buffer_size`` (a pure function of seed, epoch and rank).

    Every rank yields ``len(sampler)`` indices: ``ceil(n / world_size)`` with
    ``drop_last=False`` (the first ``world_size * len - n`` indices of the plan are repeated)
    or ``n // world_size`` with ``drop_last=True`` (``n mod world_size`` indices are not
    yielded this epoch). When ``world_size`` divides ``n``, each index appears exactly once
    across ranks.

    Epochs: ``__iter__`` uses ``e + k`` where ``e`` is the last :meth:`set_epoch` value
    (``0`` initially) and ``k`` the number of ``__iter__`` calls since; calling ``set_epoch``
    every epoch, as with ``DistributedSampler``, gives exactly that epoch.

    Resume: :meth:`state_dict` / :meth:`load_state_dict` (``O(1)``, exact, also through
    torchdata's ``StatefulDataLoader``, and onto another world size: see
    :class:`~tarindex.stream.samplers.PlanSampler` and docs/STREAMING.md, "Resume").

    Args:
        dataset_or_len: A sized dataset or the number of samples ``n``. For a dataset with
            ``shards.counts`` (``TarDataset``), blocks follow its shard boundaries.
        block_size: Contiguous indices per block, ``>= 1``. Defaults to ``64``.
        shuffle: Permute blocks (and windows). ``False``: rank ``r`` yields indices
            ``[r * len, (r + 1) * len)`` (modulo ``n`` for the padding) in order.
            Defaults to ``True``.
        seed: Base seed, ``>= 0``. Defaults to ``0``.
        rank: This process's rank (with ``world_size``). Defaults to ``torch.distributed``'s.
        world_size: Number of ranks. Defaults to ``torch.distributed``'s, else ``1``.
        drop_last: Remainder policy, see above. Defaults to ``False``.
        buffer_size: Window of the per-rank mixing permutation; ``<= 1`` keeps blocks intact
            (maximum locality). Defaults to ``0``.

    Raises:
        ValueError: Bad ``block_size``, ``seed``, ``rank``/``world_size``.
        RuntimeError: ``WORLD_SIZE > 1`` in the environment but no rank could be resolved
            (from ``len()`` or ``__iter__``).
    """

    default_env = TORCH
