"""Batches as tensors: the torch-free packers' batches in shared memory, as :class:`BatchedSamples`.

A ``DataLoader`` over per-sample dicts pays per sample twice: the fetch builds a dict of
``bytes`` for each sample, and the worker pickles every one of them to the main process.
A :class:`~tarindex.torch.batch.BatchedSamples` holds a whole batch in a few objects instead:
one ``uint8`` tensor with the bytes of every member (in shared memory inside a worker, see
:mod:`tarindex.torch.transport`), an ``int64`` offset table per extension, and ``int64``
arrays for the global index and the integer labels (``cls``).

Every batched path packs with :func:`tarindex.stream.pack.pack_blocks` (torch-free: the
layout, the copy and the integer parsing) into a buffer from :func:`tensor_alloc`:
``TarDataset(batched=True).__getitems__`` (:func:`fetch_batched`, one
:meth:`~tarindex.read.ShardSet.gather` per batch) and
``TarIterableDataset(batched=True)`` (its block reads). Use the map-style one with
:func:`collate_batched` as the ``collate_fn``::

    ds = TarDataset("train-{000000..000009}.tar", batched=True)
    loader = DataLoader(ds, batch_size=64, shuffle=True, num_workers=2,
                        collate_fn=collate_batched)
    for batch in loader:            # a BatchedSamples
        labels = batch.cls          # torch.int64, shape (B,)
        first = batch.bytes("png", 0)

For streaming, ``TarIterableDataset(..., batched=True, batch_size=64)`` yields the same
:class:`BatchedSamples`; use it with ``DataLoader(ds, batch_size=None)``.

:func:`collate_batched` also packs a list of sample dicts (any map-style dataset that returns
``{"__key__": str, ext: bytes, ...}``), so it works without ``batched=True`` too, only slower.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import Any, overload

import numpy as np
from numpy.typing import NDArray

from ..read import Block, Sample
from ..read.sample_source import SampleSource
from ..stream import pack as core
from ..stream.pack import INT_FIELDS
from .batch import BatchedSamples
from .images import ImageBatch
from .transport import alloc_buffer

__all__ = [
    "BatchedSamples",
    "INT_FIELDS",
    "collate_batched",
    "fetch_batched",
    "pack_blocks",
    "pack_samples",
    "tensor_alloc",
]


def tensor_alloc(nbytes: int) -> tuple[Any, NDArray[np.uint8]]:
    """The batch buffer: a ``torch.uint8`` tensor (shared memory in a worker) and its view."""
    t = alloc_buffer(nbytes)
    return t, t.numpy()


def pack_blocks(
    parts: Sequence[tuple[Block, NDArray[np.int64] | None]],
    rows: NDArray[np.int64] | None = None,
    int_fields: Collection[str] = INT_FIELDS,
) -> BatchedSamples:
    """:func:`tarindex.stream.pack.pack_blocks` into a :class:`BatchedSamples`.

    Args:
        parts: ``(block, sel)`` pairs: samples ``sel`` (``int64`` positions in the block, any
            order; ``None`` for all) of each block, concatenated in this order.
        rows: ``int64`` of the concatenated sample count: the batch row of each concatenated
            sample (a permutation). Defaults to ``None`` (rows in concatenated order).
        int_fields: Extensions parsed as decimal integers into ``int64`` columns. Defaults to
            :data:`INT_FIELDS`.

    Raises:
        FormatError: If an integer field does not hold a decimal integer (names the shard,
            the byte offset and the member).
        ValueError: If a block was read with ``data=False``.
    """
    return BatchedSamples(*core.pack_blocks(parts, rows, int_fields, tensor_alloc))


def fetch_batched(
    shards: SampleSource,
    indices: Sequence[int],
    int_fields: Collection[str] = INT_FIELDS,
    fields: Collection[str] | None = None,
) -> BatchedSamples:
    """Read samples ``indices`` of ``shards`` straight into one :class:`BatchedSamples`.

    :func:`tarindex.stream.pack.fetch_packed` (one compiled gather-and-pack, or a gather and
    :func:`pack_blocks`) into a tensor buffer, shared memory inside a worker.

    Args:
        shards: The shards (``TarDataset.shards``).
        indices: Global sample indices; negative ones count from the end.
        int_fields: Extensions parsed as decimal integers into ``int64`` columns instead of
            being stored as bytes. Defaults to :data:`INT_FIELDS` (``("cls",)``).
        fields: Extensions to read (others are not read). Defaults to ``None`` (all).

    Returns:
        The batch, samples in the order of ``indices``.

    Raises:
        SampleIndexError: If an index is out of range.
        FormatError: If an index table is corrupt, or an integer field is not a decimal integer.
    """
    return BatchedSamples(*core.fetch_packed(shards, indices, int_fields, fields, tensor_alloc))


def pack_samples(
    samples: Sequence[Sample], int_fields: Collection[str] = INT_FIELDS
) -> BatchedSamples:
    """Pack a list of sample dicts (``{"__key__": str, ext: bytes | int, ...}``) into one batch.

    See :func:`tarindex.stream.pack.pack_samples`.

    Raises:
        TypeError: If a value is neither bytes-like nor, for an integer field, an integer.
    """
    return BatchedSamples(*core.pack_samples(samples, int_fields, tensor_alloc))


@overload
def collate_batched(batch: ImageBatch | Sequence[ImageBatch]) -> ImageBatch: ...
@overload
def collate_batched(batch: Any) -> BatchedSamples: ...
def collate_batched(batch: Any) -> BatchedSamples | ImageBatch:
    """``collate_fn`` for raw tarindex samples: returns a :class:`BatchedSamples`.

    Accepts what ``TarDataset(batched=True).__getitems__`` returns (passed through as is: a
    :class:`BatchedSamples`, or with ``decode=ImageDecode(...)`` an
    :class:`~tarindex.torch.images.ImageBatch`, so collating costs no copy), or a list of
    sample dicts (packed with :func:`pack_samples`, one copy per member).

    Raises:
        TypeError: If ``batch`` is neither.
    """
    if isinstance(batch, (BatchedSamples, ImageBatch)):
        return batch
    if isinstance(batch, (list, tuple)):
        if len(batch) == 1 and isinstance(batch[0], (BatchedSamples, ImageBatch)):
            return batch[0]
        if all(isinstance(s, dict) for s in batch):
            return pack_samples(batch)
    raise TypeError(
        f"collate_batched: expected a BatchedSamples or a list of sample dicts, got "
        f"{type(batch).__name__}"
    )
