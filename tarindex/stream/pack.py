"""Packers: read-kernel blocks (or sample dicts) into one field-major batch buffer, torch-free.

A batch is a :class:`Packed`: one ``uint8`` buffer with the bytes of every member, laid out
field-major (:func:`field_major`, defined here only), an ``int64`` offset table per field, and
``int64`` arrays for the global index and the integer labels (``cls``). The buffer comes from
an ``alloc(nbytes) -> (keep, writable uint8 view)`` callback, so the caller decides where it
lives: :func:`numpy_alloc` (ordinary memory) here, a shared-memory tensor in
``tarindex.torch.collate``, which wraps a :class:`Packed` as a ``BatchedSamples``
(same fields, same order).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from typing import Any, NamedTuple

import numpy as np
from numpy.typing import NDArray

from ..errors import FormatError
from ..read import Block, Sample, copy_members
from ..read.sample_source import SampleSource

__all__ = [
    "INT_FIELDS",
    "Alloc",
    "PackLayout",
    "Packed",
    "field_major",
    "numpy_alloc",
    "pack_blocks",
    "pack_layout",
    "pack_samples",
    "fetch_packed",
]

INT_FIELDS: tuple[str, ...] = ("cls",)
"""Extensions parsed to ``int64`` (decimal text, as webdataset and tarindex write labels)."""

Alloc = Callable[[int], tuple[Any, NDArray[np.uint8]]]
"""``alloc(nbytes) -> (keep, view)``: the batch buffer (kept in the batch) and a writable
``uint8`` numpy view of shape ``(nbytes,)`` of it (what the packer copies into)."""


class Packed(NamedTuple):
    """One batch of raw samples, field-major; the arguments of ``BatchedSamples`` in order."""

    fields: list[str]
    """Byte fields stored in :attr:`data`, in order of first appearance in the batch."""
    data: Any
    """The buffer ``alloc`` returned as ``keep``: ``offsets[-1, -1]`` bytes, field by field."""
    offsets: NDArray[np.int64]
    """``int64 (n_fields, B + 1)``: field ``f`` of sample ``b`` is ``[offsets[f, b], offsets[f, b + 1])``."""
    present: NDArray[np.bool_]
    """``bool (n_fields, B)``: which samples have the field."""
    keys: list[str]
    """Sample keys, ``B`` strings."""
    global_index: NDArray[np.int64]
    """``int64 (B,)``: global index of each sample (``-1`` if unknown)."""
    ints: dict[str, NDArray[np.int64]]
    """Integer fields: ``int64 (B,)`` columns, ``-1`` where a sample has none."""
    shards: list[str | None]
    """Shard path of each sample (``None`` when unknown)."""


def numpy_alloc(nbytes: int) -> tuple[NDArray[np.uint8], NDArray[np.uint8]]:
    """An ordinary ``uint8`` numpy buffer of shape ``(nbytes,)``, as ``(keep, view)``."""
    a = np.empty(max(int(nbytes), 0), np.uint8)
    return a, a


def field_major(
    lengths: NDArray[np.int64],
) -> tuple[NDArray[np.int64], NDArray[np.bool_]]:
    """The field-major layout of a batch: where each field's member of each sample goes.

    The members of field ``fields[0]`` for samples ``0..B-1``, then those of ``fields[1]``,
    and so on.

    Args:
        lengths: ``int64 (n_fields, n)``: the byte length of field ``f``'s member of sample
            ``b``, or ``-1`` where sample ``b`` has none.

    Returns:
        ``(offsets, present)``: ``int64 (n_fields, n + 1)`` byte offsets of each field's
        samples in the buffer (field ``f`` of sample ``b`` is
        ``[offsets[f, b], offsets[f, b + 1])``; the buffer is ``offsets[-1, -1]`` bytes) and
        ``bool (n_fields, n)``, which samples have the field.
    """
    nf, n = lengths.shape
    present = lengths >= 0
    cum = np.zeros(nf * n + 1, np.int64)
    np.cumsum(np.where(present, lengths, 0).ravel(), out=cum[1:])
    offsets = np.empty((nf, n + 1), np.int64)
    offsets[:, :n] = cum[:-1].reshape(nf, n)
    offsets[:, n] = cum[n::n] if n else 0
    return offsets, present


def pack_blocks(
    parts: Sequence[tuple[Block, NDArray[np.int64] | None]],
    rows: NDArray[np.int64] | None = None,
    int_fields: Collection[str] = INT_FIELDS,
    alloc: Alloc = numpy_alloc,
) -> Packed:
    """Pack samples of kernel blocks into one batch, one copy per member byte.

    :func:`pack_layout`, then the buffer from ``alloc``, then :meth:`PackLayout.fill`.

    Args:
        parts: ``(block, sel)`` pairs: samples ``sel`` (``int64`` positions in the block, any
            order; ``None`` for all) of each block, concatenated in this order.
        rows: ``int64`` of the concatenated sample count: the batch row of each concatenated
            sample (a permutation). Defaults to ``None`` (rows in concatenated order).
        int_fields: Extensions parsed as decimal integers into ``int64`` columns. Defaults to
            :data:`INT_FIELDS`.
        alloc: The batch buffer (see :data:`Alloc`). Defaults to :func:`numpy_alloc`.

    Returns:
        The batch (``fields`` in order of first appearance among the byte members).

    Raises:
        FormatError: If an integer field does not hold a decimal integer (names the shard,
            the byte offset and the member).
        ValueError: If a block was read with ``data=False``.
    """
    layout = pack_layout(parts, rows, int_fields)
    if layout is None:
        return pack_samples([], int_fields, alloc)
    keep, view = alloc(layout.nbytes)
    return layout.fill(keep, view)


class PackLayout:
    """Where each member of a batch goes, worked out before any member byte is copied.

    Made by :func:`pack_layout`; :meth:`fill` then runs the copy pass into a buffer of
    :attr:`nbytes`. A caller may wrap that buffer (and the arrays of :attr:`ints`, which
    :meth:`fill` writes in place) before the copy, as :func:`tarindex.stream.arrow.block_table`
    builds its Arrow columns: the copy of a block's megabytes then comes last, and the
    small steps of wrapping do not run on the caches the copy has just emptied.
    """

    __slots__ = (
        "fields",
        "offsets",
        "present",
        "keys",
        "global_index",
        "ints",
        "shards",
        "nbytes",
        "_counts",
        "_copy",
        "_int_at",
        "_names",
        "_member_row",
        "_member_code",
        "_tar_off",
        "_filled",
    )

    def __init__(
        self,
        packed: Packed,
        copy: tuple[Sequence[Any], NDArray[np.int64], NDArray[np.int64], NDArray[np.int64],
                    NDArray[np.int64]],
        int_at: list[tuple[NDArray[np.int64], NDArray[np.int64] | None]],
        names: list[str],
        member_row: NDArray[np.int64],
        member_code: NDArray[np.int64],
        tar_off: NDArray[np.int64],
        counts: list[int] | None,
    ) -> None:
        self.fields = packed.fields
        """Byte fields, in order of first appearance (:attr:`Packed.fields`)."""
        self.offsets = packed.offsets
        """``int64 (n_fields, B + 1)`` (:attr:`Packed.offsets`)."""
        self.present = packed.present
        """``bool (n_fields, B)`` (:attr:`Packed.present`)."""
        self.keys = packed.keys
        """Sample keys (:attr:`Packed.keys`)."""
        self.global_index = packed.global_index
        """``int64 (B,)`` (:attr:`Packed.global_index`)."""
        self.ints = packed.ints
        """Integer fields: ``int64 (B,)`` columns :meth:`fill` fills in place (``-1`` where a
        sample has none; undefined before :meth:`fill`)."""
        self.shards = packed.shards
        """Shard path of each sample (:attr:`Packed.shards`)."""
        self.nbytes = int(self.offsets[-1, -1]) if self.fields else 0
        """Bytes of the batch buffer :meth:`fill` needs."""
        self._counts = counts  # members of each byte field, when pack_layout counted them
        self._copy = copy
        self._int_at = int_at  # per field of ints: (its members, their rows; None: row b is b)
        self._names = names
        self._member_row = member_row
        self._member_code = member_code
        self._tar_off = tar_off
        self._filled = False

    def field_counts(self) -> list[int]:
        """Members of each byte field, in :attr:`fields`' order (the sums of :attr:`present`'s rows).

        ``B`` where every sample has the field: an extension appears at most once among a
        sample's members (FORMAT.md §2.2, checked with the tables). Counted by
        :func:`pack_layout` when given an ``order`` (no further pass), else summed here.
        """
        if self._counts is None:
            self._counts = self.present.sum(axis=1).tolist()
        return self._counts

    def int_present(self, name: str) -> NDArray[np.bool_] | None:
        """``bool (B,)``: which samples have a ``name`` member (one of :attr:`ints`).

        ``None`` when every sample has one: an extension appears at most once among a
        sample's members (FORMAT.md §2.2, checked with the tables), so ``B`` members of it
        mean every sample.
        """
        rows = self._int_at[list(self.ints).index(name)][1]
        if rows is None or len(rows) == len(self.keys):
            return None
        got = np.zeros(len(self.keys), np.bool_)
        got[rows] = True
        return got

    def fill(self, keep: Any, view: NDArray[np.uint8]) -> Packed:
        """Run the copy pass: every byte member into ``view``, every integer member parsed.

        One pass in member order, where a sample's members are neighbours in its tar (pages
        touched once, as a per-item read does): each byte member copied once, source buffer
        (mapped tar or pread bytes) -> ``view``; each integer member parsed into its
        :attr:`ints` column. Runs once.

        Args:
            keep: What the batch keeps as its buffer (:attr:`Packed.data`).
            view: Its writable ``uint8`` view, at least :attr:`nbytes` long.

        Returns:
            The batch.

        Raises:
            FormatError: If an integer member is not a decimal integer within ``int64``
                (names the shard, the byte offset and the member).
            RuntimeError: If called twice.
        """
        if self._filled:
            raise RuntimeError("PackLayout.fill: this layout was filled already")
        self._filled = True
        vals, bad = copy_members(view, *self._copy)
        if bad >= 0:
            r, c = int(self._member_row[bad]), int(self._member_code[bad])
            raise FormatError(
                f"{self.shards[r]}: byte {int(self._tar_off[bad])}: member "
                f"{self.keys[r]}.{self._names[c]} is not a decimal integer within int64; "
                f"pass int_fields=() to keep it as bytes"
            )
        for (members, rows), col in zip(self._int_at, self.ints.values(), strict=True):
            if rows is None:  # one per sample, in order
                np.take(vals, members, out=col, mode="clip")  # in range: no buffer
            else:
                col[rows] = vals[members]
        return Packed(
            self.fields, keep, self.offsets, self.present, self.keys, self.global_index,
            self.ints, self.shards,
        )


def pack_layout(
    parts: Sequence[tuple[Block, NDArray[np.int64] | None]],
    rows: NDArray[np.int64] | None = None,
    int_fields: Collection[str] = INT_FIELDS,
    order: Sequence[str] | None = None,
) -> PackLayout | None:
    """The layout of :func:`pack_blocks`' batch (arguments as there), nothing copied yet.

    Args:
        parts: As :func:`pack_blocks`.
        rows: As :func:`pack_blocks`.
        int_fields: As :func:`pack_blocks`.
        order: The byte fields in this order (those the batch has), any others after them
            in the order of the extension table. Defaults to ``None``: in order of first
            appearance, as :func:`pack_blocks` lays them out (a sort of the members).

    Returns:
        The layout, or ``None`` when ``parts`` holds no block.

    Raises:
        ValueError: If a block was read with ``data=False``.
    """
    blocks: list[Block] = []
    for blk, sel in parts:
        if blk.offset is None:
            raise ValueError(f"{blk.paths}: block read with data=False has no member bytes")
        blocks.append(blk if sel is None else blk.take(sel))
    whole = Block.concat(blocks) if blocks else None
    if whole is None or whole.offset is None:
        return None
    blk, off = whole, whole.offset
    n = len(blk)
    names, keys = blk.exts, blk.keys
    paths = blk.paths
    shards: list[str | None] = (
        [paths[0]] * n if len(paths) == 1 else [paths[k] for k in blk.shard.tolist()]
    )
    code, src, size, idx = blk.ext_id, blk.src, blk.size, blk.index
    row = np.repeat(np.arange(n, dtype=np.int64), np.diff(blk.member_ptr))
    if rows is not None:
        row = rows[row]
        inv = np.empty(n, np.int64)
        inv[rows] = np.arange(n, dtype=np.int64)
        perm = inv.tolist()
        keys = [keys[i] for i in perm]
        shards = [shards[i] for i in perm]
        idx = idx[inv]
    int_set = frozenset(int_fields)
    is_int = np.asarray([nm in int_set for nm in names] or [False], np.bool_)[code]
    byte = ~is_int
    # byte fields in order of first appearance or in `order`; field-major layout (field_major)
    bcode, brow = code[byte], row[byte]
    if order is None:
        used, counts = _first_seen(bcode), None
    else:
        seen = np.bincount(bcode, minlength=len(names)).tolist()
        pos = {nm: c for c, nm in enumerate(names)}
        used = [pos[nm] for nm in order if nm in pos and seen[pos[nm]]]
        used += [c for c, k in enumerate(seen) if k and c not in used]
        counts = [seen[c] for c in used]
    fmap = np.zeros(len(names), np.int64)
    fmap[used] = np.arange(len(used), dtype=np.int64)
    f = fmap[bcode]
    lens = np.full((len(used), n), -1, np.int64)
    lens[f, brow] = size[byte]
    offsets, present = field_major(lens)
    dest = np.full(len(code), -1, np.int64)  # -1: an integer member, parsed instead
    dest[byte] = offsets[f, brow]
    ints: dict[str, NDArray[np.int64]] = {}
    int_at: list[tuple[NDArray[np.int64], NDArray[np.int64] | None]] = []
    named = [c for c, nm in enumerate(names) if nm in int_set]
    isel = np.flatnonzero(is_int) if named else np.zeros(0, np.int64)
    if len(named) == 1 and len(isel):  # one integer field: no sort, no mask
        if rows is None and len(isel) == n:  # in every sample (FORMAT.md §2.2), in order
            ints[names[named[0]]] = np.empty(n, np.int64)
            int_at.append((isel, None))
        else:
            ints[names[named[0]]] = np.full(n, -1, np.int64)
            int_at.append((isel, row[isel]))
    elif len(isel):
        icode, irow = code[isel], row[isel]
        for c in _first_seen(icode):
            m = icode == c
            ints[names[c]] = np.full(n, -1, np.int64)
            int_at.append((isel[m], irow[m]))
    packed = Packed([names[c] for c in used], None, offsets, present, keys, idx, ints, shards)
    return PackLayout(
        packed, (blk.data, src, off, size, dest), int_at, list(names), row, code, blk.tar_offset,
        counts,
    )


def _first_seen(codes: NDArray[np.int64]) -> list[int]:
    """The distinct values of ``codes`` in order of first appearance (no Python object per item)."""
    u, first = np.unique(codes, return_index=True)
    return [int(c) for c in u[np.argsort(first)]]


def fetch_packed(
    shards: SampleSource,
    indices: Sequence[int],
    int_fields: Collection[str] = INT_FIELDS,
    fields: Collection[str] | None = None,
    alloc: Alloc = numpy_alloc,
) -> Packed:
    """Read samples ``indices`` of ``shards`` straight into one batch.

    One :meth:`~tarindex.read.takes.Takes.gather_packed` (the kernel's batch read and
    packing in one compiled pass) or, where that hands back,
    :meth:`~tarindex.read.ShardSet.gather` then :func:`pack_blocks`: no per-sample dict
    and no per-member ``bytes`` object is made.

    Args:
        shards: The shards.
        indices: Global sample indices; negative ones count from the end.
        int_fields: Extensions parsed as decimal integers into ``int64`` columns instead of
            being stored as bytes. Defaults to :data:`INT_FIELDS` (``("cls",)``).
        fields: Extensions to read (others are not read). Defaults to ``None`` (all).
        alloc: The batch buffer (see :data:`Alloc`). Defaults to :func:`numpy_alloc`.

    Returns:
        The batch, samples in the order of ``indices``.

    Raises:
        SampleIndexError: If an index is out of range.
        FormatError: If an index table is corrupt, or an integer field is not a decimal integer.
    """
    got = shards.takes().gather_packed(indices, fields, int_fields, alloc)
    if got is None:  # the Python path (see read.batch.gather_packed), same batch
        return pack_blocks([(shards.gather(indices, fields), None)], None, int_fields, alloc)
    data, keys, byte_fields, int_names, offsets, present, ints, index, paths = got
    return Packed(
        byte_fields, data, offsets, present, keys, index, dict(zip(int_names, ints, strict=True)), paths
    )


def pack_samples(
    samples: Sequence[Sample],
    int_fields: Collection[str] = INT_FIELDS,
    alloc: Alloc = numpy_alloc,
) -> Packed:
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
    keep, view = alloc(int(offsets[-1, -1]) if fields else 0)
    out = memoryview(view)  # type: ignore[arg-type]
    at = offsets.tolist()
    for f, b, v in zip(m_field, m_row, values, strict=True):
        d = at[f][b]
        out[d : d + v.nbytes] = v
    return Packed(fields, keep, offsets, present, keys, index, ints, shards)
