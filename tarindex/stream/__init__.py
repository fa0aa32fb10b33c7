"""The streaming and mixing executors, the packers and the planned samplers, torch-free.

``tarindex.torch`` adapts these to torch's base classes (rank from ``torch.distributed``,
worker from ``get_worker_info``, batches as tensors in shared memory); here they run, and are
tested, without torch:

- :class:`StreamDataset`: one worker's share of an epoch plan (``TarIterableDataset``).
- :class:`MixedStream`: several of those mixed by weight or count (``MixedDataset``).
- :mod:`~tarindex.stream.pack`: batches in one field-major buffer (``BatchedSamples``).
- :mod:`~tarindex.stream.samplers`: index plans of map-style samplers (``BlockSampler``).
- :class:`Env`: where rank, world size and worker come from.
"""

from .dataset import StreamDataset
from .epochs import LOCAL, Env
from .mix import MixedStream
from .pack import INT_FIELDS, Packed, pack_blocks, pack_samples
from .samplers import BlockPlanSampler, MixPlanSampler

__all__ = [
    "StreamDataset",
    "MixedStream",
    "Env",
    "LOCAL",
    "Packed",
    "pack_blocks",
    "pack_samples",
    "INT_FIELDS",
    "BlockPlanSampler",
    "MixPlanSampler",
]
