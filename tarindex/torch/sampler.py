"""BlockSampler: a shuffling, rank-splitting sampler for map-style datasets that keeps locality."""

from __future__ import annotations

from collections.abc import Iterator, Sized
from typing import Any

import numpy as np
import torch.utils.data
from numpy.typing import NDArray

from .. import shuffle as plan_mod
from ._dist import RankEpoch

__all__ = ["BlockSampler"]


class BlockSampler(torch.utils.data.Sampler[int]):
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

    def __init__(
        self,
        dataset_or_len: int | Sized | Any,
        *,
        block_size: int = 64,
        shuffle: bool = True,
        seed: int = 0,
        rank: int | None = None,
        world_size: int | None = None,
        drop_last: bool = False,
        buffer_size: int = 0,
    ) -> None:
        if int(block_size) < 1:
            raise ValueError(f"block_size={block_size!r}: expected an integer >= 1")
        plan_mod.make_rng(seed, 0, 0)  # validates seed
        if isinstance(dataset_or_len, (int, np.integer)):
            if int(dataset_or_len) < 0:
                raise ValueError(f"dataset_or_len={dataset_or_len!r}: expected >= 0")
            counts = np.asarray([int(dataset_or_len)], dtype=np.int64)
        else:
            shard_counts = getattr(getattr(dataset_or_len, "shards", None), "counts", None)
            if shard_counts is not None and int(np.sum(shard_counts)) == len(dataset_or_len):
                counts = np.asarray(shard_counts, dtype=np.int64)
            else:
                counts = np.asarray([len(dataset_or_len)], dtype=np.int64)
        self.counts = counts
        self.starts = np.zeros(len(counts) + 1, dtype=np.int64)
        np.cumsum(counts, out=self.starts[1:])
        self.block_size = int(block_size)
        self.shuffle = bool(shuffle)
        self.seed = int(seed)
        self.drop_last = bool(drop_last)
        self.buffer_size = max(int(buffer_size), 0)
        self._re = RankEpoch(rank, world_size, "BlockSampler")

    def _rank(self) -> tuple[int, int]:
        return self._re.get()

    @property
    def epoch(self) -> int:
        """The last :meth:`set_epoch` value (``0`` initially)."""
        return self._re.epoch

    def set_epoch(self, epoch: int) -> None:
        """Use ``epoch`` for the next ``__iter__``.

        Raises:
            ValueError: If ``epoch`` is negative or ``>= 2**64``.
        """
        self._re.set_epoch(epoch)

    def __getstate__(self) -> dict[str, Any]:
        self._re.before_pickle()
        return self.__dict__.copy()

    def __len__(self) -> int:
        """Indices this rank yields per epoch; the same on every rank."""
        return plan_mod.rank_share(int(self.starts[-1]), self._rank()[1], self.drop_last)

    def indices(self, epoch: int) -> NDArray[np.int64]:
        """Return this rank's indices for ``epoch``: ``int64`` array of shape ``(len(self),)``."""
        rank, ws = self._rank()
        p = plan_mod.plan_worker(
            self.counts,
            self.seed,
            epoch,
            self.block_size,
            rank,
            ws,
            0,
            1,
            buffer_size=self.buffer_size,
            shuffle=self.shuffle,
            drop_last=self.drop_last,
        )
        return p.order(self.starts)

    def __iter__(self) -> Iterator[int]:
        return iter(self.indices(self._re.next_epoch()).tolist())
