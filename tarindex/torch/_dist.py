"""What the planned streams and samplers need from torch: the process group and the worker.

Everything else about ranks, epochs and resume is torch-free, in
:mod:`tarindex.stream.epochs`; :data:`TORCH` is the :class:`~tarindex.stream.epochs.Env` the
torch layer's classes use.
"""

from __future__ import annotations

import torch.utils.data

from ..stream.epochs import Env

__all__ = ["TorchEnv", "TORCH"]


class TorchEnv(Env):
    """``torch.distributed``'s rank when initialised, and ``get_worker_info``'s worker."""

    def dist(self) -> tuple[int, int] | None:
        """``(rank, world_size)`` of ``torch.distributed`` if initialised, else ``None``."""
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            return dist.get_rank(), dist.get_world_size()
        return None

    def worker(self) -> tuple[int, int] | None:
        """``(id, num_workers)`` inside a DataLoader worker, ``None`` in the main process."""
        info = torch.utils.data.get_worker_info()
        return None if info is None else (info.id, info.num_workers)


TORCH = TorchEnv()
"""The torch layer's :class:`~tarindex.stream.epochs.Env`."""
