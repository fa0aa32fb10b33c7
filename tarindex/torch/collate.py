"""Packers: read-kernel blocks (or sample dicts) into one :class:`BatchedSamples` per batch.

A ``DataLoader`` over per-sample dicts pays per sample twice: the fetch builds a dict of
``bytes`` for each sample, and the worker pickles every one of them to the main process.
A :class:`~tarindex.torch.batch.BatchedSamples` holds a whole batch in a few objects instead:
one ``uint8`` tensor with the bytes of every member (in shared memory inside a worker, see
:mod:`tarindex.torch.transport`), an ``int64`` offset table per extension, and ``int64``
arrays for the global index and the integer labels (``cls``).

Every batched path packs with :func:`pack_blocks`: ``TarDataset(batched=True).__getitems__``
(:func:`fetch_batched`, one :meth:`~tarindex.read.reader.ShardSet.gather` per batch) and
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
from typing import Any

import numpy as np
from numpy.typing import NDArray

from ..errors import FormatError
from ..read import Block, Sample, ShardSet, copy_members
from .batch import BatchedSamples, field_major
from .transport import alloc_buffer

__all__ = [
    "BatchedSamples",
    "INT_FIELDS",
    "collate_batched",
    "fetch_batched",
    "pack_blocks",
    "pack_samples",
]

INT_FIELDS: tuple[str, ...] = ("cls",)
"""Extensions parsed to ``int64`` (decimal text, as webdataset and tarindex write labels)."""


def pack_blocks(
    parts: Sequence[tuple[Block, NDArray[np.int64] | None]],
    rows: NDArray[np.int64] | None = None,
    int_fields: Collection[str] = INT_FIELDS,
) -> BatchedSamples:
    """Pack samples of kernel blocks into one batch, one copy per member byte.

    Args:
        parts: ``(block, sel)`` pairs: samples ``sel`` (``int64`` positions in the block, any
            order; ``None`` for all) of each block, concatenated in this order.
        rows: ``int64`` of the concatenated sample count: the batch row of each concatenated
            sample (a permutation). Defaults to ``None`` (rows in concatenated order).
        int_fields: Extensions parsed as decimal integers into ``int64`` columns. Defaults to
            :data:`INT_FIELDS`.

    Returns:
        The batch (``fields`` in order of first appearance among the byte members).

    Raises:
        FormatError: If an integer field does not hold a decimal integer (names the shard,
            the byte offset and the member).
        ValueError: If a block was read with ``data=False``.
    """
    blocks: list[Block] = []
    for blk, sel in parts:
        if blk.offset is None:
            raise ValueError(f"{blk.paths}: block read with data=False has no member bytes")
        blocks.append(blk if sel is None else blk.take(sel))
    whole = Block.concat(blocks) if blocks else None
    if whole is None or whole.offset is None:
        return pack_samples([], int_fields)
    blk, off = whole, whole.offset
    n = len(blk)
    names, datas, keys = blk.exts, blk.data, blk.keys
    paths = blk.paths
    shards: list[str | None] = (
        [paths[0]] * n if len(paths) == 1 else [paths[k] for k in blk.shard.tolist()]
    )
    code, src, size, tar_off, idx = blk.ext_id, blk.src, blk.size, blk.tar_offset, blk.index
    row = np.repeat(np.arange(n, dtype=np.int64), np.diff(blk.member_ptr))
    if rows is not None:
        row = rows[row]
        inv = np.empty(n, np.int64)
        inv[rows] = np.arange(n, dtype=np.int64)
        order = inv.tolist()
        keys = [keys[i] for i in order]
        shards = [shards[i] for i in order]
        idx = idx[inv]
    int_set = frozenset(int_fields)
    is_int = np.asarray([nm in int_set for nm in names] or [False], np.bool_)[code]
    byte = ~is_int
    # byte fields in order of first appearance; field-major layout (batch.field_major)
    bcode, brow = code[byte], row[byte]
    used = list(dict.fromkeys(bcode.tolist()))
    fmap = np.zeros(len(names), np.int64)
    fmap[used] = np.arange(len(used), dtype=np.int64)
    f = fmap[bcode]
    lens = np.full((len(used), n), -1, np.int64)
    lens[f, brow] = size[byte]
    offsets, present = field_major(lens)
    dest = np.full(len(code), -1, np.int64)  # -1: an integer member, parsed instead
    dest[byte] = offsets[f, brow]
    data = alloc_buffer(int(offsets[-1, -1]) if used else 0)
    # One pass in member order, where a sample's members are neighbours in its tar (pages
    # touched once, as a per-item read does): each byte member copied once, source buffer
    # (mapped tar or pread bytes) -> batch buffer; each integer member parsed.
    vals, bad = copy_members(data.numpy(), datas, src, off, size, dest)
    if bad >= 0:
        r, c = int(row[bad]), int(code[bad])
        raise FormatError(
            f"{shards[r]}: byte {int(tar_off[bad])}: member {keys[r]}.{names[c]} is not a "
            f"decimal integer within int64; pass int_fields=() to keep it as bytes"
        )
    ints: dict[str, NDArray[np.int64]] = {}
    if is_int.any():
        isel = np.flatnonzero(is_int)
        icode, irow, ival = code[isel], row[isel], vals[isel]
        for c in dict.fromkeys(icode.tolist()):
            m = icode == c
            col = ints[names[c]] = np.full(n, -1, np.int64)
            col[irow[m]] = ival[m]
    return BatchedSamples([names[c] for c in used], data, offsets, present, keys, idx, ints, shards)


def fetch_batched(
    shards: ShardSet,
    indices: Sequence[int],
    int_fields: Collection[str] = INT_FIELDS,
    fields: Collection[str] | None = None,
) -> BatchedSamples:
    """Read samples ``indices`` of ``shards`` straight into one :class:`BatchedSamples`.

    One :meth:`~tarindex.read.reader.ShardSet.gather_packed` (the kernel's batch read and packing
    in one compiled pass) or, where that hands back, :meth:`~tarindex.read.reader.ShardSet.gather`
    then :func:`pack_blocks`: no per-sample dict and no per-member ``bytes`` object is made.

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
    got = shards.gather_packed(indices, fields, int_fields, _alloc)
    if got is None:  # the Python path (see ShardSet.gather_packed), same batch
        return pack_blocks([(shards.gather(indices, fields), None)], None, int_fields)
    data, keys, byte_fields, int_names, offsets, present, ints, index, paths = got
    return BatchedSamples(
        byte_fields, data, offsets, present, keys, index, dict(zip(int_names, ints, strict=True)), paths
    )


def _alloc(nbytes: int) -> tuple[Any, Any]:
    """The batch buffer for :meth:`ShardSet.gather_packed`: the tensor and its numpy view."""
    t = alloc_buffer(nbytes)
    return t, t.numpy()


def pack_samples(
    samples: Sequence[Sample], int_fields: Collection[str] = INT_FIELDS
) -> BatchedSamples:
    """Pack a list of sample dicts (``{"__key__": str, ext: bytes | int, ...}``) into one batch.

    Entries whose name starts with ``__`` other than ``__key__``, ``__index__`` and
    ``__shard__`` are ignored; values of ``int_fields`` may be ``int`` or decimal bytes/str;
    other values must be bytes-like.

    Raises:
        TypeError: If a value is neither bytes-like nor, for an integer field, an integer.
    """
    n = len(samples)
    int_set = frozenset(int_fields)
    fields: list[str] = []
    field_id: dict[str, int] = {}
    ints: dict[str, NDArray[np.int64]] = {}
    m_field: list[int] = []
    m_row: list[int] = []
    values: list[memoryview] = []
    keys: list[str] = []
    index = np.full(n, -1, np.int64)
    shards: list[str | None] = []
    for b, smp in enumerate(samples):
        keys.append(str(smp.get("__key__", "")))
        shards.append(smp.get("__shard__"))
        if "__index__" in smp:
            index[b] = int(smp["__index__"])
        for ext, v in smp.items():
            if ext.startswith("__"):
                continue
            if ext in int_set:
                col = ints.get(ext)
                if col is None:
                    col = ints[ext] = np.full(n, -1, np.int64)
                col[b] = int(v) if isinstance(v, (int, np.integer, str)) else int(bytes(v))
                continue
            if isinstance(v, str):
                v = v.encode("utf-8")
            if not isinstance(v, (bytes, bytearray, memoryview, np.ndarray)):
                raise TypeError(
                    f"sample {keys[-1]!r}: {ext!r} is {type(v).__name__}, not bytes; "
                    f"collate_batched packs raw samples (use decode=None)"
                )
            f = field_id.get(ext)
            if f is None:
                f = field_id[ext] = len(fields)
                fields.append(ext)
            m_field.append(f)
            m_row.append(b)
            values.append(memoryview(v).cast("B"))  # type: ignore[arg-type]
    lens = np.full((len(fields), n), -1, np.int64)
    for f, b, v in zip(m_field, m_row, values, strict=True):
        lens[f, b] = v.nbytes
    offsets, present = field_major(lens)
    data = alloc_buffer(int(offsets[-1, -1]) if fields else 0)
    out = memoryview(data.numpy())  # type: ignore[arg-type]
    at = offsets.tolist()
    for f, b, v in zip(m_field, m_row, values, strict=True):
        d = at[f][b]
        out[d : d + v.nbytes] = v
    return BatchedSamples(fields, data, offsets, present, keys, index, ints, shards)


def collate_batched(batch: Any) -> BatchedSamples:
    """``collate_fn`` for raw tarindex samples: returns a :class:`BatchedSamples`.

    Accepts what ``TarDataset(batched=True).__getitems__`` returns (passed through as is), or
    a list of sample dicts (packed with :func:`pack_samples`, one copy per member).

    Raises:
        TypeError: If ``batch`` is neither.
    """
    if isinstance(batch, BatchedSamples):
        return batch
    if isinstance(batch, (list, tuple)):
        if len(batch) == 1 and isinstance(batch[0], BatchedSamples):
            return batch[0]
        if all(isinstance(s, dict) for s in batch):
            return pack_samples(batch)
    raise TypeError(
        f"collate_batched: expected a BatchedSamples or a list of sample dicts, got "
        f"{type(batch).__name__}"
    )
