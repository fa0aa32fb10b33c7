"""The torch layer: the only part of tarindex that imports torch."""

from .batch import BatchedSamples
from .collate import collate_batched
from .dataset import TarDataset
from .images import ImageBatch
from .iterable import TarIterableDataset
from .mix import MixedDataset, MixSampler
from .sampler import BlockSampler

__all__ = [
    "TarDataset",
    "TarIterableDataset",
    "BlockSampler",
    "BatchedSamples",
    "ImageBatch",
    "collate_batched",
    "MixedDataset",
    "MixSampler",
]
