"""Blocks of samples as the read kernel returns them, the batch copy pass and the crc checks.

A :class:`Block` holds some samples of one or more shards as tables (extension ids, sizes,
tar offsets, offsets into source buffers, keys) plus the buffers; consumers only pack it
(dicts, one shared buffer). :func:`copy_members` is the copy pass of a batch (FORMAT.md §2);
:func:`crc_mismatches` the one data-checksum check (FORMAT.md §2.8.2).
"""

from __future__ import annotations

import zlib
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
from numpy.typing import NDArray

from ..errors import ChecksumError
from ..storage.bytesource import Buffer
from ..storage.tarcache import copy_fix, drop_copy
from . import kernel

__all__ = [
    "Sample",
    "Block",
    "copy_members",
    "crc_mismatches",
    "data_error",
    "joined",
]

Sample = dict[str, Any]
"""A sample: ``__key__``, ``__shard__``, ``__index__`` and one entry per extension."""


def _uniform_layout(mp: NDArray[np.int64], ext_id: NDArray[np.int64]) -> list[int] | None:
    """The extension ids every sample has, in order, if all samples have the same; else None."""
    n = len(mp) - 1
    if n <= 0:
        return None
    k = int(mp[1])
    if mp[0] != 0 or k == 0 or int(mp[-1]) != n * k or not (np.diff(mp) == k).all():
        return None
    ids = ext_id[: n * k].reshape(n, k)
    if not (ids == ids[0]).all():
        return None
    return [int(e) for e in ids[0]]


def _uniform_samples(
    data: Any,
    path: str,
    keys: list[str],
    idx: list[int],
    names: list[str],
    offs: list[int],
    ends: list[int],
) -> list[Sample]:
    """Sample dicts of a one-buffer block whose samples all have members ``names``, in order."""
    k = len(names)
    if k == 1:
        (n0,) = names
        return [
            {"__key__": key, "__shard__": path, "__index__": i, n0: data[a:b]}
            for key, i, a, b in zip(keys, idx, offs, ends, strict=True)
        ]
    if k == 2:
        n0, n1 = names
        return [
            {"__key__": key, "__shard__": path, "__index__": i, n0: data[a0:b0], n1: data[a1:b1]}
            for key, i, a0, b0, a1, b1 in zip(
                keys, idx, offs[0::2], ends[0::2], offs[1::2], ends[1::2], strict=True
            )
        ]
    n0, n1, n2 = names
    return [
        {
            "__key__": key,
            "__shard__": path,
            "__index__": i,
            n0: data[a0:b0],
            n1: data[a1:b1],
            n2: data[a2:b2],
        }
        for key, i, a0, b0, a1, b1, a2, b2 in zip(
            keys,
            idx,
            offs[0::3],
            ends[0::3],
            offs[1::3],
            ends[1::3],
            offs[2::3],
            ends[2::3],
            strict=True,
        )
    ]


def joined(parts: list[bytes]) -> tuple[bytes, NDArray[np.int64]]:
    """Concatenate member bytes into one buffer; return it and each part's offset in it."""
    at = np.zeros(len(parts), np.int64)
    if parts:
        np.cumsum([len(x) for x in parts[:-1]], out=at[1:])
    return b"".join(parts), at


def copy_members(
    out: Any,
    datas: Sequence[Buffer],
    src: NDArray[np.int64],
    offset: NDArray[np.int64],
    size: NDArray[np.int64],
    dest: NDArray[np.int64],
) -> tuple[NDArray[np.int64], int]:
    """Copy members into one buffer and parse the integer ones: the copy pass of a batch.

    Member ``k`` is ``datas[src[k]][offset[k] : offset[k] + size[k]]``. With ``dest[k] >= 0``
    its bytes go to ``out[dest[k]:]``; with ``dest[k] < 0`` it is parsed as a decimal integer
    (``int(bytes)``: ASCII whitespace, sign, digits). One pass in the given order.

    Args:
        out: Writable buffer (``uint8``) the byte members go to.
        datas: Source buffers (mapped tars or read bytes).
        src: ``int64 (n,)``: each member's buffer in ``datas``.
        offset: ``int64 (n,)``: where it starts there (bytes).
        size: ``int64 (n,)``: its length (bytes); every member must lie inside its buffer.
        dest: ``int64 (n,)``: where it goes in ``out``, or ``< 0`` to parse it.

    Returns:
        ``(vals, bad)``: ``int64 (n,)`` with each integer member's value (0 elsewhere), and
        the first member that is not a decimal integer (``-1`` if none; members after it
        are not processed).
    """
    n = len(src)
    vals = np.zeros(n, np.int64)
    src, offset, size, dest = (np.ascontiguousarray(a, np.int64) for a in (src, offset, size, dest))
    k = 0
    srcs = tuple(datas)
    while True:  # the kernel's loop hands back integers it does not parse itself
        hb = kernel.kernel.pack(out, srcs, src, offset, size, dest, vals, k)
        if hb is None:
            return vals, -1
        k = hb.at  # the member it stopped at: parsed here, then the loop goes on after it
        if dest[k] >= 0:
            break  # a bound the caller should have kept: the loop below raises
        try:
            vals[k] = int(datas[int(src[k])][int(offset[k]) : int(offset[k] + size[k])])
        except (ValueError, OverflowError):
            return vals, k
        k += 1
    view = memoryview(out).cast("B")
    try:
        for j, (sr, o, e, d) in enumerate(
            zip(
                src[k:].tolist(),
                offset[k:].tolist(),
                (offset + size)[k:].tolist(),
                dest[k:].tolist(),
                strict=True,
            ),
            k,
        ):
            if d < 0:
                try:
                    vals[j] = int(datas[sr][o:e])
                except (ValueError, OverflowError):
                    return vals, j
            else:
                view[d : d + e - o] = datas[sr][o:e]  # a Mapped: a guarded copy
    finally:
        view.release()
    return vals, -1


def crc_mismatches(
    blk: Block, members: Sequence[int] | NDArray[np.int64], tables: Sequence[Any]
) -> Iterator[tuple[int, int, int, int]]:
    """Yield the members of ``blk`` whose bytes differ from their recorded crc32.

    The one data-checksum check (FORMAT.md §2.8.2), for reads with ``verify_data`` and for
    ``verify --data``.

    Args:
        blk: A block with data.
        members: Index member number of each of ``blk``'s members, shape ``(m,)``.
        tables: Per buffer of ``blk`` (``blk.src``), the index's ``member_crc`` (``<u4``) or
            ``None`` (not recorded: not checked).

    Yields:
        ``(b, k, got, want)``: sample position, member position, crc32 of the bytes, crc32
        recorded.
    """
    if blk.offset is None:
        return
    mp = blk.member_ptr.tolist()
    off, size, src = blk.offset.tolist(), blk.size.tolist(), blk.src.tolist()
    mids = members.tolist() if isinstance(members, np.ndarray) else list(members)
    datas = blk.data  # slices: a mapped tar's (a Mapped) are read with the fault guard
    for b in range(len(mp) - 1):
        for k in range(mp[b], mp[b + 1]):
            table = tables[src[k]]
            if table is None:
                continue
            got = zlib.crc32(datas[src[k]][off[k] : off[k] + size[k]])
            want = int(table[mids[k]])
            if got != want:
                yield b, k, got, want


def data_error(
    tar_path: str,
    index_path: str,
    key: str,
    ext: str,
    off: int,
    got: int,
    want: int,
    copy: str | None = None,
) -> ChecksumError:
    """The ``ChecksumError`` for one member whose bytes differ from its recorded crc32.

    ``copy``: the decompressed copy the bytes came from (a zstd/xz/bzip2/lz4 shard, FORMAT.md
    §11); it is deleted from the tar cache, so the shard's next open decompresses it again.
    """
    if copy is not None:
        drop_copy(copy)
        return ChecksumError(
            f"{tar_path}: decompressed byte {off}: member {key}.{ext} has crc32 0x{got:08x}, "
            f"its index {index_path} recorded 0x{want:08x}; {copy_fix(tar_path, copy)}"
        )
    return ChecksumError(
        f"{tar_path}: byte {off}: member {key}.{ext} has crc32 0x{got:08x}, its index "
        f"{index_path} recorded 0x{want:08x}: the bytes changed since it was indexed "
        f"(in-place rewrite, bad disk or copy); copy the shard again, or re-index it "
        f"(tarindex index --force --checksums {tar_path})"
    )


class Block:
    """Some samples of one or more shards, as the read kernel returns them: tables + buffers.

    Made by :meth:`ShardReader.read_block` / :meth:`ShardReader.gather` (one shard) and
    :meth:`ShardSet.gather` (a batch across shards) after the index tables of those samples
    passed the guards. ``n`` samples, ``m`` selected members; the members of sample ``b`` are
    ``member_ptr[b] <= k < member_ptr[b + 1]``, and member ``k``'s bytes are
    ``data[src[k]][offset[k] : offset[k] + size[k]]`` (``bytes``).

    Attributes:
        paths: The shards (tar paths) the samples come from.
        shard: ``int64 (n,)``: each sample's shard, an index into :attr:`paths`.
        samples: ``int64 (n,)``: shard-local sample numbers, in the order asked for.
        index: ``int64 (n,)``: global sample indices (shard-local for a bare reader).
        keys: The ``n`` sample keys (str, FORMAT.md §2.5).
        member_ptr: ``int64 (n + 1,)``: CSR pointers into the member arrays.
        ext_id: ``int64 (m,)``: extension of each member, an index into :attr:`exts`.
        size: ``int64 (m,)``: member sizes in bytes.
        tar_offset: ``int64 (m,)``: member data offsets in their tar, in bytes.
        offset: ``int64 (m,)``: member data offsets in their buffer, or ``None`` if no data
            was read (``data=False``).
        src: ``int64 (m,)``: each member's buffer, an index into :attr:`data`.
        data: The source buffers (mapped tars, or bytes read with ``pread``); slices of them
            are ``bytes``. Empty with ``data=False``.
        exts: Extension names (FORMAT.md §2.4).
    """

    __slots__ = (
        "paths",
        "shard",
        "samples",
        "index",
        "keys",
        "member_ptr",
        "ext_id",
        "size",
        "tar_offset",
        "offset",
        "src",
        "data",
        "exts",
    )

    def __init__(
        self,
        paths: list[str],
        shard: NDArray[np.int64],
        samples: NDArray[np.int64],
        index: NDArray[np.int64],
        keys: list[str],
        member_ptr: NDArray[np.int64],
        ext_id: NDArray[np.int64],
        size: NDArray[np.int64],
        tar_offset: NDArray[np.int64],
        offset: NDArray[np.int64] | None,
        src: NDArray[np.int64],
        data: list[Buffer],
        exts: list[str],
    ) -> None:
        self.paths = paths
        self.shard = shard
        self.samples = samples
        self.index = index
        self.keys = keys
        self.member_ptr = member_ptr
        self.ext_id = ext_id
        self.size = size
        self.tar_offset = tar_offset
        self.offset = offset
        self.src = src
        self.data = data
        self.exts = exts

    @classmethod
    def of_shard(
        cls,
        path: str,
        samples: NDArray[np.int64],
        keys: list[str],
        member_ptr: NDArray[np.int64],
        ext_id: NDArray[np.int64],
        size: NDArray[np.int64],
        tar_offset: NDArray[np.int64],
        offset: NDArray[np.int64] | None,
        data: Buffer | None,
        exts: list[str],
    ) -> Block:
        """A block of one shard and (at most) one buffer."""
        return cls(
            [path],
            np.zeros(len(samples), np.int64),
            samples,
            samples,
            keys,
            member_ptr,
            ext_id,
            size,
            tar_offset,
            offset,
            np.zeros(len(size), np.int64),
            [] if data is None else [data],
            exts,
        )

    def __len__(self) -> int:
        return len(self.keys)

    def __repr__(self) -> str:
        where = self.paths[0] if len(self.paths) == 1 else f"{len(self.paths)} shards"
        return f"Block({where!r}, {len(self)} samples, {len(self.size)} members)"

    def _need_data(self) -> NDArray[np.int64]:
        if self.offset is None:
            raise ValueError(f"{self.paths}: block read with data=False has no member bytes")
        return self.offset

    @staticmethod
    def concat(blocks: Sequence[Block]) -> Block:
        """Return one block holding the samples of ``blocks``, in order (no bytes copied).

        Paths, buffers and extension tables are joined; member arrays are concatenated with
        their pointers shifted (a handful of array operations whatever the block count).

        Raises:
            ValueError: If ``blocks`` is empty, or some blocks have data and others do not.
        """
        if len(blocks) == 1:
            return blocks[0]
        if not blocks:
            raise ValueError("Block.concat: no blocks")
        if len({b.offset is None for b in blocks}) > 1:
            raise ValueError("Block.concat: blocks with and without data")
        nb = [len(b) for b in blocks]
        mb = [len(b.size) for b in blocks]
        code_of: dict[str, int] = {}
        codes: list[int] = []
        ebase, sbase, pbase = [], [], []
        paths: list[str] = []
        data: list[Buffer] = []
        keys: list[str] = []
        for b in blocks:
            ebase.append(len(codes))
            codes.extend([code_of.setdefault(e, len(code_of)) for e in b.exts])
            sbase.append(len(data))
            data.extend(b.data)
            pbase.append(len(paths))
            paths.extend(b.paths)
            keys.extend(b.keys)

        def cat(xs: list[NDArray[np.int64]]) -> NDArray[np.int64]:
            return np.concatenate(xs)

        def shift(xs: list[NDArray[np.int64]], base: list[int], counts: list[int]) -> Any:
            return cat(xs) + np.repeat(np.asarray(base, np.int64), counts)

        mp = np.zeros(sum(nb) + 1, np.int64)
        mp[1:] = shift([b.member_ptr[1:] for b in blocks], np.cumsum([0, *mb[:-1]]).tolist(), nb)
        offsets = [b.offset for b in blocks]
        return Block(
            paths,
            shift([b.shard for b in blocks], pbase, nb),
            cat([b.samples for b in blocks]),
            cat([b.index for b in blocks]),
            keys,
            mp,
            np.asarray(codes, np.int64)[shift([b.ext_id for b in blocks], ebase, mb)],
            cat([b.size for b in blocks]),
            cat([b.tar_offset for b in blocks]),
            None if offsets[0] is None else cat(offsets),  # type: ignore[arg-type]
            shift([b.src for b in blocks], sbase, mb),
            data,
            list(code_of),
        )

    def take(self, sel: NDArray[np.int64]) -> Block:
        """Return the samples at positions ``sel`` (``int64``, any order) of this block.

        The member arrays are gathered; the buffers are shared (no copy).
        """
        ms = self.member_ptr[sel]
        cnt = self.member_ptr[sel + 1] - ms
        mp = np.zeros(len(sel) + 1, np.int64)
        np.cumsum(cnt, out=mp[1:])
        mem = np.repeat(ms - mp[:-1], cnt) + np.arange(int(mp[-1]), dtype=np.int64)
        keys = self.keys
        return Block(
            self.paths,
            self.shard[sel],
            self.samples[sel],
            self.index[sel],
            [keys[i] for i in sel.tolist()],
            mp,
            self.ext_id[mem],
            self.size[mem],
            self.tar_offset[mem],
            None if self.offset is None else self.offset[mem],
            self.src[mem],
            self.data,
            self.exts,
        )

    def detach(self) -> Block:
        """Return this block with its members' bytes copied out of mapped tars, else itself.

        A block read from a mapping keeps the mapping (and its descriptor) alive after the
        reader is closed; readers that hold more blocks than shards may be open detach them.
        """
        if not any(isinstance(d, kernel.kernel.Mapped) for d in self.data) or self.offset is None:
            return self
        data, offset = self.data, self.offset
        ends = offset + self.size
        buf, new = joined(
            [
                data[s][a:b]
                for s, a, b in zip(self.src.tolist(), offset.tolist(), ends.tolist(), strict=True)
            ]
        )
        return Block(
            self.paths,
            self.shard,
            self.samples,
            self.index,
            self.keys,
            self.member_ptr,
            self.ext_id,
            self.size,
            self.tar_offset,
            new,
            np.zeros(len(offset), np.int64),
            [buf],
            self.exts,
        )

    def to_samples(self) -> list[Sample]:
        """The samples as dicts: ``__key__``, ``__shard__``, ``__index__`` and ``ext: bytes``.

        Raises:
            ValueError: If the block was read with ``data=False``.
        """
        offset = self._need_data()
        offs = offset.tolist()
        ends = (offset + self.size).tolist()
        exts = self.exts
        idx = self.index.tolist()
        if len(self.data) == 1 and len(self.paths) == 1:  # one shard: the common case
            uniform = _uniform_layout(self.member_ptr, self.ext_id)
            if uniform is not None and len(uniform) <= 3:  # one dict display per sample
                return _uniform_samples(
                    self.data[0],
                    self.paths[0],
                    self.keys,
                    idx,
                    [exts[e] for e in uniform],
                    offs,
                    ends,
                )
        names = [exts[e] for e in self.ext_id.tolist()]
        mp = self.member_ptr.tolist()
        out: list[Sample] = []
        append = out.append
        if len(self.data) == 1 and len(self.paths) == 1:
            data, path = self.data[0], self.paths[0]
            for i, key in enumerate(self.keys):
                d: Sample = {"__key__": key, "__shard__": path, "__index__": idx[i]}
                for k in range(mp[i], mp[i + 1]):
                    d[names[k]] = data[offs[k] : ends[k]]
                append(d)
            return out
        datas, paths = self.data, self.paths
        src, shard = self.src.tolist(), self.shard.tolist()
        for i, key in enumerate(self.keys):
            d = {"__key__": key, "__shard__": paths[shard[i]], "__index__": idx[i]}
            for k in range(mp[i], mp[i + 1]):
                d[names[k]] = datas[src[k]][offs[k] : ends[k]]
            append(d)
        return out
