"""The torch layer: the only part of tarindex that imports torch."""

from .dataset import TarDataset

__all__ = ["TarDataset"]
