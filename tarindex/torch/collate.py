"""Packers: read-kernel blocks (or sample dicts) into one :class:`BatchedSamples` per batch.

A ``DataLoader`` over per-sample dicts pays per sample twice: the fetch builds a dict of
``bytes`` for each sample, and the worker pickles every one of them to the main process.
A :class:`~tarindex.torch.batch.BatchedSamples` holds a whole batch in a few objects instead:
one ``uint8`` tensor with the bytes of every member (in shared memory inside a worker, see
:mod:`tarindex.torch.transport`), an ``int64`` offset table per extension, and ``int64``
arrays for the global index and the integer labels (``cls``).

Every batched path packs with :func:`pack_blocks`: ``TarDataset(batched=True).__getitems__``
(:func:`fetch_batched`, one :meth:`~tarindex.reader.ShardSet.gather` per batch) and
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
from ..reader import Block, Sample, ShardSet
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


def _parse_int(data: Any, off: int, size: int, blk: Block, k: int, key: str) -> int:
    try:
        return int(bytes(data[off : off + size]))
    except ValueError:
        raise FormatError(
            f"{blk.path}: byte {int(blk.tar_offset[k])}: member {key}.{blk.exts[int(blk.ext_id[k])]} "
            f"is not a decimal integer; pass int_fields=() to keep it as bytes"
        ) from None


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
        The batch (``fields`` in order of first appearance in the parts).

    Raises:
        FormatError: If an integer field does not hold a decimal integer (names the shard,
            the byte offset and the member).
        ValueError: If a block was read with ``data=False``.
    """
    int_set = frozenset(int_fields)
    names: list[str] = []
    code_of: dict[str, int] = {}
    m_part, m_k, m_code, m_row, m_size, m_off = [], [], [], [], [], []
    keys: list[str] = []
    index: list[NDArray[np.int64]] = []
    shards: list[str | None] = []
    n = 0
    for p, (blk, sel) in enumerate(parts):
        if blk.data is None or blk.offset is None:
            raise ValueError(f"{blk.path}: block read with data=False has no member bytes")
        if sel is None:
            sel = np.arange(len(blk), dtype=np.int64)
        ms = blk.member_ptr[sel]
        cnt = blk.member_ptr[sel + 1] - ms
        tot = int(cnt.sum())
        first = np.cumsum(cnt) - cnt
        mem = np.repeat(ms - first, cnt) + np.arange(tot, dtype=np.int64)
        emap = np.asarray([code_of.setdefault(e, len(code_of)) for e in blk.exts], np.int64)
        if len(code_of) > len(names):
            names.extend(list(code_of)[len(names) :])
        m_part.append(np.full(tot, p, np.int64))
        m_k.append(mem)
        m_code.append(emap[blk.ext_id[mem]] if tot else mem)
        m_row.append(np.repeat(np.arange(n, n + len(sel), dtype=np.int64), cnt))
        m_size.append(blk.size[mem])
        m_off.append(blk.offset[mem])
        ks = blk.keys
        keys.extend([ks[i] for i in sel.tolist()])
        index.append(blk.index[sel])
        shards.extend([blk.path] * len(sel))
        n += len(sel)

    def cat(xs: list[NDArray[np.int64]]) -> NDArray[np.int64]:
        return np.concatenate(xs) if xs else np.zeros(0, np.int64)

    part, k, code, row = cat(m_part), cat(m_k), cat(m_code), cat(m_row)
    size, off = cat(m_size), cat(m_off)
    idx = cat(index)
    if rows is not None:
        row = rows[row]
        inv = np.empty(n, np.int64)
        inv[rows] = np.arange(n, dtype=np.int64)
        order = inv.tolist()
        keys = [keys[i] for i in order]
        shards = [shards[i] for i in order]
        idx = idx[inv]
    is_int = np.asarray([nm in int_set for nm in names], np.bool_)[code]
    ints: dict[str, NDArray[np.int64]] = {}
    if is_int.any():
        for m in np.flatnonzero(is_int).tolist():
            blk = parts[int(part[m])][0]
            r = int(row[m])
            col = ints.get(names[int(code[m])])
            if col is None:
                col = ints[names[int(code[m])]] = np.full(n, -1, np.int64)
            col[r] = _parse_int(blk.data, int(off[m]), int(size[m]), blk, int(k[m]), keys[r])
        keep = ~is_int
        part, code, row, size, off = part[keep], code[keep], row[keep], size[keep], off[keep]
    # fields in order of first appearance among the byte members
    uc, firsts = np.unique(code, return_index=True)
    used = uc[np.argsort(firsts)]
    fmap = np.zeros(len(names), np.int64)
    fmap[used] = np.arange(len(used), dtype=np.int64)
    offsets, present, dest = field_major(fmap[code], row, size, len(used), n)
    data = alloc_buffer(int(offsets[-1, -1]) if len(used) else 0)
    out = memoryview(data.numpy())  # type: ignore[arg-type]
    # The one copy: source buffer (mapped tar or pread bytes) -> batch buffer, in file order.
    views = [memoryview(blk.data) for blk, _ in parts]  # type: ignore[arg-type]
    try:
        srt = np.lexsort((off, part))
        for pi, o, sz, d in zip(
            part[srt].tolist(),
            off[srt].tolist(),
            size[srt].tolist(),
            dest[srt].tolist(),
            strict=True,
        ):
            out[d : d + sz] = views[pi][o : o + sz]
    finally:
        for v in views:
            v.release()
    return BatchedSamples(
        [names[c] for c in used.tolist()], data, offsets, present, keys, idx, ints, shards
    )


def fetch_batched(
    shards: ShardSet,
    indices: Sequence[int],
    int_fields: Collection[str] = INT_FIELDS,
    fields: Collection[str] | None = None,
) -> BatchedSamples:
    """Read samples ``indices`` of ``shards`` straight into one :class:`BatchedSamples`.

    One :meth:`~tarindex.reader.ShardSet.gather` (a kernel read per shard of the batch), then
    :func:`pack_blocks`: no per-sample dict and no per-member ``bytes`` object is made.

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
    blocks, rows = shards.gather(indices, fields)
    return pack_blocks([(b, None) for b in blocks], rows, int_fields)


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
    sizes = np.asarray([v.nbytes for v in values], np.int64)
    offsets, present, dest = field_major(
        np.asarray(m_field, np.int64), np.asarray(m_row, np.int64), sizes, len(fields), n
    )
    data = alloc_buffer(int(offsets[-1, -1]) if fields else 0)
    out = memoryview(data.numpy())  # type: ignore[arg-type]
    for v, d in zip(values, dest.tolist(), strict=True):
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
