"""tarindex: random access and deterministic streaming over standard tar shards.

Public API (torch is imported only by the torch layer, on first use of its names)::

    ShardWriter, TarWriter, write_shards, build_index, scan, ShardReader, ShardSet,
    read_kernel, write_manifest, read_manifest, check_manifest, task_pattern,
    split_by_key, split_keys, ShardSubset,
    TarDataset, TarIterableDataset, BlockSampler, BatchedSamples, collate_batched,
    MixedDataset, MixSampler (need torch)
"""

from __future__ import annotations

from typing import Any

from ._version import __version__
from .codecs.select import ToTuple, to_tuple
from .errors import (
    AmbiguousKeyError,
    BadMagicError,
    ChecksumError,
    CompressedTarError,
    DecodeError,
    FormatError,
    IndexMissingError,
    KeyNotFoundError,
    MissingFieldError,
    NotATarError,
    PackError,
    ParallelWriteError,
    RangeNotSupportedError,
    RemoteError,
    SampleIndexError,
    StaleIndexError,
    StaleManifestError,
    TarHeaderError,
    TarIndexError,
    TrailingGarbageError,
    TruncatedError,
    UnsupportedVersionError,
    WriterError,
)
from .index.build import build_index
from .index.scan import Members, scan
from .plan.split import split_keys
from .read.manifest import check_manifest, read_manifest, write_manifest
from .read.reader import ShardReader, ShardSet, read_kernel
from .read.sources import expand_source
from .read.split import split_by_key
from .read.subset import ShardSubset
from .storage.indexfile import index_path_for
from .storage.remote import RemoteOptions
from .write.parallel import WriteResult, write_shards
from .write.partition import task_pattern
from .write.shards import ShardWriter, TarWriter

_TORCH_NAMES = {
    "TarDataset": "dataset",
    "TarIterableDataset": "iterable",
    "BlockSampler": "sampler",
    "BatchedSamples": "batch",
    "collate_batched": "collate",
    "MixedDataset": "mix",
    "MixSampler": "mix",
}

__all__ = [
    "__version__",
    "ShardWriter",
    "TarWriter",
    "write_shards",
    "WriteResult",
    "build_index",
    "index_path_for",
    "scan",
    "Members",
    "ShardReader",
    "ShardSet",
    "read_kernel",
    "RemoteOptions",
    "expand_source",
    "write_manifest",
    "read_manifest",
    "check_manifest",
    "task_pattern",
    "split_by_key",
    "split_keys",
    "ShardSubset",
    "TarIndexError",
    "FormatError",
    "BadMagicError",
    "UnsupportedVersionError",
    "ChecksumError",
    "TruncatedError",
    "TarHeaderError",
    "NotATarError",
    "CompressedTarError",
    "TrailingGarbageError",
    "IndexMissingError",
    "StaleIndexError",
    "StaleManifestError",
    "KeyNotFoundError",
    "AmbiguousKeyError",
    "SampleIndexError",
    "WriterError",
    "PackError",
    "ParallelWriteError",
    "DecodeError",
    "RemoteError",
    "RangeNotSupportedError",
    "MissingFieldError",
    "ToTuple",
    "to_tuple",
    *_TORCH_NAMES,
]


def __getattr__(name: str) -> Any:
    """Import the torch layer lazily, so ``import tarindex`` works without torch."""
    mod = _TORCH_NAMES.get(name)
    if mod is None:
        raise AttributeError(f"module 'tarindex' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(f"tarindex.torch.{mod}"), name)
