"""tarindex: random access and deterministic streaming over standard tar shards.

The public API is these names; everything else lives in the subpackages (docs/ARCHITECTURE.md):
every exception in :mod:`tarindex.errors`, manifests in :mod:`tarindex.read.manifest`, the
header walk in :mod:`tarindex.index.scan`, the torch layer in :mod:`tarindex.torch`.

- write: :class:`ShardWriter`, :class:`TarWriter`, :func:`write_shards`
- index existing tars, check them: :func:`build_index`, :func:`verify`
- read: :class:`ShardSet` (many shards as one sequence of samples), :class:`ShardReader`
  (one shard), :class:`OpenOptions` (how shards open and are checked),
  :class:`RemoteOptions` (how URLs are fetched), :func:`read_kernel`
- datasets (need torch, imported on first use): :class:`TarDataset`,
  :class:`TarIterableDataset`, :class:`BlockSampler`, :class:`MixedDataset`,
  :class:`MixSampler`, :func:`collate_batched`
- many shards: :func:`write_manifest`, :func:`split_by_key`; webdataset's
  ``.to_tuple``: :func:`to_tuple`; images decoded to the size a model eats:
  :class:`ImageDecode` (its backend: :func:`tarindex.codecs.image_backend`)
- the exceptions people catch: :class:`TarIndexError` (the base of all),
  :class:`FormatError` (bytes that break the tar or index spec), :class:`StaleIndexError`
  (an index that no longer describes its tar), :class:`DecodeError`
"""

from __future__ import annotations

from typing import Any

from ._version import __version__
from .codecs.image import ImageDecode
from .codecs.select import to_tuple
from .errors import DecodeError, FormatError, StaleIndexError, TarIndexError
from .index.build import build_index
from .read import OpenOptions, ShardReader, ShardSet, read_kernel
from .read.manifest import write_manifest
from .read.split import split_by_key
from .read.verify import verify
from .storage.remote import RemoteOptions
from .write.parallel import write_shards
from .write.shards import ShardWriter, TarWriter

_TORCH_NAMES = {
    "TarDataset": "dataset",
    "TarIterableDataset": "iterable",
    "BlockSampler": "sampler",
    "collate_batched": "collate",
    "MixedDataset": "mix",
    "MixSampler": "mix",
}

__all__ = [
    "__version__",
    "ShardWriter",
    "TarWriter",
    "write_shards",
    "build_index",
    "verify",
    "ShardReader",
    "ShardSet",
    "OpenOptions",
    "RemoteOptions",
    "read_kernel",
    "write_manifest",
    "split_by_key",
    "to_tuple",
    "ImageDecode",
    "TarIndexError",
    "FormatError",
    "StaleIndexError",
    "DecodeError",
    *_TORCH_NAMES,
]


def __getattr__(name: str) -> Any:
    """Import the torch layer lazily, so ``import tarindex`` works without torch."""
    mod = _TORCH_NAMES.get(name)
    if mod is None:
        raise AttributeError(f"module 'tarindex' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(f"tarindex.torch.{mod}"), name)
