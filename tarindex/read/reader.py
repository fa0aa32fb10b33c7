"""Read samples from indexed shards: one shard (ShardReader) or many (ShardSet).

The read kernel lives here. A :class:`ShardReader` maps the sidecar index (zero-copy numpy
views), checks it against the tar at open (FORMAT.md §3), and serves every consumer through
one guarded kernel:

- :meth:`ShardReader.read_block` (a run of samples ``j0..j1``) and
  :meth:`ShardReader.gather` (any samples) return a :class:`Block`: the selected members'
  extension ids, sizes, tar offsets and offsets into one source buffer, plus the keys;
- :meth:`ShardReader.sample` is the one-sample form, for ``ds[i]``.

All three check the index tables with :func:`tarindex.format.index.check_samples` (one set
of guards) before their first read of each chunk of :data:`CHUNK` samples, so a corrupt table
is refused with a :class:`FormatError` the same way whatever reads it, and every later read
of that chunk is plain slicing. Bytes come from a :mod:`tarindex.bytesource` (mmap or
``os.pread``). ``fields=`` projects a read onto some extensions: members left out are not
read at all.

A :class:`ShardSet` maps a global sample index to ``(shard, j)`` from the per-shard counts in
the index headers, and keeps a bounded, per-process LRU of open readers sized from the
process's descriptor limit, so it pickles small and is safe under fork, spawn and forkserver
worker processes.
"""

from __future__ import annotations

import bisect
import errno
import importlib.util
import mmap
import operator
import os
import sys
import warnings
import weakref
import zlib
from collections import OrderedDict
from collections.abc import Collection, Iterator, Sequence
from typing import Any

import numpy as np
from numpy.typing import NDArray

from ..errors import (
    AmbiguousKeyError,
    ChecksumError,
    FormatError,
    IndexMissingError,
    KeyNotFoundError,
    SampleIndexError,
    StaleIndexError,
    StaleManifestError,
    TarHeaderError,
    TarIndexError,
    TruncatedError,
)
from ..format.index import (
    IndexTables,
    KeyTable,
    check_samples,
    decode_index,
    fingerprint,
    key_table,
    read_header,
)
from ..format.keyhash import LOOKUP_SEED, key_hashes
from ..format.keys import normalize_name
from ..format.spec import (
    BLOCK,
    END_CHECK_BYTES,
    EXT_ID_DTYPE,
    FINGERPRINT_BYTES,
    HEADER,
    HEADER_CHECKS,
    INDEX_SUFFIX,
    OFFSET_DTYPE,
    REGULAR_TYPES,
    TAR_SIZE,
    TAR_TYPEFLAG,
    USTAR_MAX_SIZE,
)
from ..format.tar import checksum_ok, header_name, parse_number
from ..format.zstd_dict import check_dict, dict_entry
from ..storage.bytesource import (
    Buffer,
    ByteSource,
    MmapSource,
    cold_cache,
    open_regular,
    open_source,
)
from ..storage.indexfile import index_path_for
from ..storage.remote import (
    RemoteOptions,
    RemoteSource,
    forget_index,
    is_url,
    load_indexes,
    local_path,
    prefetch_many,
)
from .sources import ShardList, Source, expand_shards

__all__ = [
    "Sample",
    "Block",
    "ShardReader",
    "ShardSet",
    "read_sample_count",
    "is_up_to_date",
    "CHUNK",
    "copy_members",
    "sample_indices",
    "DEFAULT_MAX_OPEN",
    "crc_mismatches",
    "data_error",
]

Sample = dict[str, Any]
_UNREAD = object()  # ShardReader.zstd_dict() not called yet


def _load_kernel() -> tuple[Any, str]:
    """The compiled loops (``tarindex/read/_kernel.c``) or ``None``, and what :func:`read_kernel` says.

    ``None`` (the same loops then run in Python) when the extension was not built (no C
    compiler at install), on a big-endian host (the tables are little-endian), or with
    ``TARINDEX_PURE_PYTHON=1`` in the environment.
    """
    if os.environ.get("TARINDEX_PURE_PYTHON", "") not in ("", "0"):
        return None, "python (TARINDEX_PURE_PYTHON is set)"
    if sys.byteorder != "little":
        return None, "python (big-endian host)"
    if importlib.util.find_spec(f"{__package__}._kernel") is None:  # no C compiler at install
        return None, "python (the extension tarindex.read._kernel is not built: reinstall with gcc)"
    try:
        from . import _kernel
    except ImportError as e:  # built for another Python, or damaged
        return None, f"python (tarindex.read._kernel failed to load: {e}; reinstall it)"
    return _kernel, "compiled"


_kernel, _KERNEL = _load_kernel()


def read_kernel() -> str:
    """Which per-sample loops this process runs: ``"compiled"`` or ``"python (<why>)"``.

    Both give the same samples, batches and errors; the compiled ones are faster
    (docs/READING.md, "Compiled loops"). ``tarindex --version`` prints it too.
    """
    return _KERNEL

CHUNK_SHIFT = 10
CHUNK = 1 << CHUNK_SHIFT
"""Samples whose index tables are checked together, once per open reader, before a read."""

COALESCE_GAP = 4 * BLOCK
"""Largest gap in bytes (headers, pax records, padding) a ``pread`` of two members spans."""

DEFAULT_MAX_OPEN = 48
"""Default bound on open shards per :class:`ShardSet` and process (2 descriptors each)."""

FDS_PER_SHARD = 2
"""Descriptors an open :class:`ShardReader` holds: the index mapping and the tar source."""

_FD_RESERVE = 16
"""Descriptors left free for everything else when the bound is sized from the limit."""

Fields = Collection[str] | None


_fork_generation = [0]
"""Bumped in the child after every ``os.fork``: a ShardSet whose generation differs was
inherited from the parent and must drop the parent's readers (cheaper than ``os.getpid()``
on every read)."""


_live_sets: weakref.WeakSet[ShardSet] = weakref.WeakSet()
"""Every ShardSet of this process: a forked child closes their inherited readers at once."""


def _bump_fork_generation() -> None:
    _fork_generation[0] += 1
    # The child's copies of the parent's descriptors and mappings count against the child's
    # descriptor limit even if it never reads those shards (a DataLoader worker forked while
    # the parent holds open shards): release them now; the parent's stay open.
    for ss in list(_live_sets):
        ss._drop_inherited()


os.register_at_fork(after_in_child=_bump_fork_generation)


def _missing(tar_path: str, index_path: str) -> IndexMissingError:
    return IndexMissingError(
        f"{index_path}: no index for shard {tar_path}; build it with: tarindex index {tar_path}"
    )


def _open_regular(path: str) -> int:
    return open_regular(path, "a tar or index")


def _read_local_index(tar_path: str, index_path: str) -> bytes:
    """The bytes of a local index file (for a remote tar whose index is kept locally)."""
    try:
        with open(_open_regular(index_path), "rb") as f:
            return f.read()
    except FileNotFoundError:
        raise _missing(tar_path, index_path) from None


def index_for(tar_path: str, index_dir: str | None = None) -> str:
    """The index of a tar: ``<tar>.tidx`` beside it, or ``<index_dir>/<basename>.tidx``.

    ``index_dir`` holds indexes kept apart from their tars (``tarindex index URL --out DIR``
    for a remote tar one cannot write beside); it may be a local directory or a URL.
    """
    if index_dir is None:
        return index_path_for(tar_path)
    base = tar_path.rstrip("/").rsplit("/", 1)[-1]
    if is_url(index_dir):
        return index_dir.rstrip("/") + "/" + index_path_for(base)
    return os.path.join(local_path(index_dir), index_path_for(base))


def _decode_keys(blob: bytes, ptr: list[int]) -> list[str]:
    """Split ``blob`` at ``ptr`` (``len(ptr) - 1`` keys) and decode each (FORMAT.md §2.5)."""
    n = len(ptr) - 1
    if blob.isascii():
        text = blob.decode("ascii")
        return [text[ptr[i] : ptr[i + 1]] for i in range(n)]
    return [blob[ptr[i] : ptr[i + 1]].decode("utf-8", "surrogateescape") for i in range(n)]


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


def _joined(parts: list[bytes]) -> tuple[bytes, NDArray[np.int64]]:
    """Concatenate member bytes into one buffer; return it and each part's offset in it."""
    at = np.zeros(len(parts), np.int64)
    if parts:
        np.cumsum([len(x) for x in parts[:-1]], out=at[1:])
    return b"".join(parts), at


def sample_indices(
    indices: Sequence[int] | NDArray[np.integer[Any]], total: int
) -> NDArray[np.int64]:
    """Batch indices as ``int64 (n,)`` in ``[0, total)``: negative ones count from the end.

    Raises:
        TypeError: If an index is not an integer (``1.5``, ``"3"``), as list indexing does.
        SampleIndexError: If an index is out of range.
    """
    idx = np.asarray(indices).reshape(-1)
    if idx.dtype.kind not in "iu" and idx.size:
        idx = np.asarray([operator.index(i) for i in idx.tolist()], np.int64)
    idx = idx.astype(np.int64, copy=False)
    idx = np.where(idx < 0, idx + total, idx)
    if idx.size and (int(idx.min()) < 0 or int(idx.max()) >= total):
        bad = int(idx[(idx < 0) | (idx >= total)][0])
        raise SampleIndexError(f"sample index {bad} out of range for {total} samples")
    return idx


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
    if _kernel is not None:
        srcs = tuple(datas)
        while True:  # the compiled loop hands back integers it does not parse itself
            k = _kernel.pack(out, srcs, src, offset, size, dest, vals, k)
            if k < 0:
                return vals, -1
            if dest[k] >= 0:
                break  # a bound the caller should have kept: the Python loop raises
            try:
                vals[k] = int(datas[int(src[k])][int(offset[k]) : int(offset[k] + size[k])])
            except (ValueError, OverflowError):
                return vals, k
            k += 1
    view = memoryview(out).cast("B")
    views = [memoryview(d) for d in datas]
    try:
        for j, (sr, o, e, d) in enumerate(
            zip(src[k:].tolist(), offset[k:].tolist(), (offset + size)[k:].tolist(),
                dest[k:].tolist(), strict=True),
            k,
        ):
            if d < 0:
                try:
                    vals[j] = int(datas[sr][o:e])
                except (ValueError, OverflowError):
                    return vals, j
            else:
                view[d : d + e - o] = views[sr][o:e]
    finally:
        for v in views:
            v.release()
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
    views = [memoryview(d) for d in blk.data]
    try:
        for b in range(len(mp) - 1):
            for k in range(mp[b], mp[b + 1]):
                table = tables[src[k]]
                if table is None:
                    continue
                got, want = (
                    zlib.crc32(views[src[k]][off[k] : off[k] + size[k]]),
                    int(table[mids[k]]),
                )
                if got != want:
                    yield b, k, got, want
    finally:
        for v in views:
            v.release()


def data_error(
    tar_path: str, index_path: str, key: str, ext: str, off: int, got: int, want: int
) -> ChecksumError:
    """The ``ChecksumError`` for one member whose bytes differ from its recorded crc32."""
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
        if not any(isinstance(d, mmap.mmap) for d in self.data) or self.offset is None:
            return self
        data, offset = self.data, self.offset
        ends = offset + self.size
        buf, new = _joined(
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


class ShardReader:
    """One open shard: its index (mapped) and its tar (a :mod:`~tarindex.bytesource`).

    Holds at most :data:`FDS_PER_SHARD` (2) file descriptors: the index mapping and the tar's
    mapping or ``pread`` descriptor.

    Args:
        tar_path: Path of the tar.
        index_path: Path of its index. Defaults to ``<tar_path>.tidx``.
        use_mmap: Map the tar into memory (fast). ``False`` reads with ``os.pread``: no SIGBUS
            if the file is truncated while open. Defaults to ``True``.
        full_check: Also check every table entry now, O(n). Defaults to ``False`` (the
            tables of each chunk of samples are checked before its first read).
        check_crc: Check the index's crc32 footer at open (about 1 ms per MB of index).
            ``False`` skips it for huge indexes that ``verify`` has checked. Defaults to
            ``True``.
        verify_data: Check every member read against the crc32 the index records
            (FORMAT.md §2.8.2); a mismatch raises ``ChecksumError``. Catches bytes changed in
            place, at the cost of hashing every byte read. Defaults to ``False``.
        remote: How a remote tar or index (a URL) is read
            (:class:`tarindex.remote.RemoteOptions`); the open-time checks then run through
            ranged reads. Defaults to ``RemoteOptions()``.

    Raises:
        IndexMissingError: No index file.
        FormatError: The index is truncated or corrupt (its subclasses say how, FORMAT.md
            §2.1, §2.7), or the index or tar is a FIFO, socket or device.
        StaleIndexError: The tar does not match the index: size, first/last 4 KiB, bytes after
            the archive's end, or a re-read member header differ (FORMAT.md §3).
        ChecksumError: The index's crc32 footer does not match (``check_crc``).
        FileNotFoundError: The tar itself is missing (its index exists).
        IsADirectoryError: The tar or index path is a directory.
        OSError: ``EMFILE`` and other errors of opening or mapping the files.
    """

    def __init__(
        self,
        tar_path: str,
        index_path: str | None = None,
        *,
        use_mmap: bool = True,
        full_check: bool = False,
        check_crc: bool = True,
        verify_data: bool = False,
        remote: RemoteOptions | None = None,
    ) -> None:
        self.tar_path = tar_path
        self.index_path = index_path or index_path_for(tar_path)
        self.verify_data = verify_data
        self._imm: mmap.mmap | None = None
        self._src: ByteSource | None = None
        self._checks: dict[tuple[int, int], bytes] | None = None  # remote: check bytes
        if is_url(self.index_path) or is_url(tar_path):
            self._open_remote(remote or RemoteOptions(), full_check, check_crc)
        else:
            self._open_local(use_mmap, full_check, check_crc)
        t = self.index
        self.n_samples = t.n_samples
        self.exts = [e.decode("utf-8", "surrogateescape") for e in t.exts]
        self._mm: mmap.mmap | None = getattr(self._src, "mm", None)
        # chunk c's tables passed check_samples (numpy view of the same bytes for gather)
        self._checked = bytearray(((self.n_samples + CHUNK - 1) >> CHUNK_SHIFT) or 1)
        self._checked_np = np.frombuffer(self._checked, np.uint8)
        if full_check:
            self._checked[:] = b"\x01" * len(self._checked)
        self._want: dict[frozenset[str], NDArray[np.bool_]] = {}
        self._want_b: dict[Collection[str], bytes] = {}
        self._zstd_dict: Any = _UNREAD  # zstd_dict(): read on first use
        # Hot-path views: memoryview.cast("Q") indexes to Python ints ~3x faster than numpy
        # scalars. The tables are little-endian (FORMAT.md §2); on a big-endian host fall back
        # to numpy views (indexing them also yields ints via int()).
        self._sample_ptr = _fast(t.sample_ptr)
        self._offset = _fast(t.offset)
        self._size = _fast(t.size)
        self._ext_id = _fast(t.ext_id)
        self._key_ptr = _fast(t.key_ptr)
        self._key_blob = memoryview(t.key_blob)
        self._exts_key = tuple(self.exts)
        # keys are sliced from the index mapping (bytes.decode beats str(memoryview)); an
        # index read into memory (remote) keeps a bytes copy of its key blob instead
        keys: Any = self._imm if self._imm is not None else bytes(t.key_blob)
        kbase = t.sections["key_blob"][0] if self._imm is not None else 0
        # for ShardSet.gather: chunk flags, key tables, and the member tables as raw
        # little-endian bytes (a sample's run of them is copied with one slice)
        self._gather: tuple[Any, ...] = (
            self._checked,
            self._key_ptr,
            self._sample_ptr,
            keys,
            kbase,
            memoryview(t.offset).cast("B"),  # type: ignore[arg-type]
            memoryview(t.size).cast("B"),  # type: ignore[arg-type]
            memoryview(t.ext_id).cast("B"),  # type: ignore[arg-type]
        )
        # for ShardSet.get, the one-sample hot path: everything it needs in one lookup, or
        # None when a read needs more than slices of a mapping (pread, verify_data)
        self._scalar: tuple[Any, ...] | None = (
            None
            if self._mm is None or verify_data
            else (
                self._checked,
                self._key_ptr,
                self._sample_ptr,
                keys,
                kbase,
                self.exts,
                self._ext_id,
                self._offset,
                self._size,
                self._mm,
            )
        )
        # the compiled one-sample and batch loops over the same validated tables (and the
        # mapping they read), or None: pure Python (_load_kernel), pread, remote, verify_data
        self._ck: tuple[Any, mmap.mmap, int] | None = None
        if _kernel is not None and self._scalar is not None and self._imm is not None:
            self._ck = (
                _kernel.Tables(
                    t.key_ptr,
                    t.sample_ptr,
                    self._imm,
                    kbase,
                    kbase + len(t.key_blob),
                    t.ext_id,
                    t.offset,
                    t.size,
                    self._mm,
                    tuple(self.exts),
                    self._checked,
                ),
                self._mm,
                self.tar_size,
            )
        try:
            self._check_end()
            self._check_headers()
        except BaseException:
            self.close()
            raise
        self._checks = None

    def _open_local(self, use_mmap: bool, full_check: bool, check_crc: bool) -> None:
        """Map the index, open the tar's source and check the fingerprint (FORMAT.md §3)."""
        tar_path = self.tar_path
        try:
            fi = open(_open_regular(self.index_path), "rb")
        except FileNotFoundError:
            raise _missing(tar_path, self.index_path) from None
        with fi:
            isize = os.fstat(fi.fileno()).st_size
            if isize < HEADER.size:
                raise TruncatedError(
                    f"{self.index_path}: index is {isize} bytes, shorter than its {HEADER.size}-byte "
                    f"header at byte 0; rebuild it with: tarindex index --force {tar_path}"
                )
            self._imm = mmap.mmap(fi.fileno(), 0, access=mmap.ACCESS_READ)
        try:
            self._decode(memoryview(self._imm), full_check, check_crc)
            fd = _open_regular(tar_path)
            try:
                self.tar_size = os.fstat(fd).st_size
                self._check_size()
            except BaseException:
                os.close(fd)
                raise
            self._src = open_source(tar_path, fd, self.tar_size, use_mmap)
            self._check_fingerprint()
        except BaseException:
            self.close()
            raise

    def _open_remote(self, opts: RemoteOptions, full_check: bool, check_crc: bool) -> None:
        """The index from memory, the cache or the network; the tar as a :class:`RemoteSource`.

        The open-time checks (FORMAT.md §3) read the tar with ranged reads, fetched together
        in one batch. An index taken from memory or the cache that does not match the tar is
        fetched again once (it may have been rebuilt) before the error is raised.
        """
        for attempt in (0, 1):
            fresh = True
            try:
                if is_url(self.index_path):
                    data, fresh = load_indexes([self.index_path], [self.tar_path], opts)[0]
                else:
                    data = _read_local_index(self.tar_path, self.index_path)
                self._decode(memoryview(data), full_check, check_crc)
                if is_url(self.tar_path):
                    t = self.index
                    ident = f"{t.tar_size}:{t.head_crc}:{t.tail_crc}"
                    self._src = RemoteSource.open(self.tar_path, opts, ident)
                else:
                    fd = _open_regular(local_path(self.tar_path))
                    self._src = open_source(self.tar_path, fd, os.fstat(fd).st_size, False)
                self.tar_size = self._src.size
                self._check_size()
                starts, ends = self._check_ranges()  # one concurrent batch for all checks
                src = self._src
                rs = list(zip(starts.tolist(), ends.tolist(), strict=True))
                if isinstance(src, RemoteSource):  # from the server, never from the cache
                    got = src.fetch_fresh(rs)
                else:
                    buf, bases = src.read_ranges(starts, ends)
                    got = [buf[o : o + b - a] for (a, b), o in zip(rs, bases.tolist(), strict=True)]
                self._checks = {(a, b - a): g for (a, b), g in zip(rs, got, strict=True)}
                self._check_fingerprint()
                return
            except StaleIndexError:
                self.close()
                if fresh or attempt or not is_url(self.index_path):
                    raise
                forget_index(self.index_path, opts)
            except BaseException:
                self.close()
                raise

    def _read_check(self, offset: int, size: int) -> bytes:
        """Bytes for an open-time check: from the batch read ahead (remote), else the source."""
        got = self._checks.get((offset, size)) if self._checks else None
        return got if got is not None else self.source.read(offset, size)

    def _decode(self, buf: memoryview, full_check: bool, check_crc: bool) -> None:
        self.index: IndexTables = decode_index(
            buf, self.index_path, full_check=full_check, check_crc=check_crc
        )
        if self.verify_data and self.index.member_crc is None:
            raise FormatError(
                f"{self.index_path}: verify_data=True but the index records no data "
                f"checksums (FORMAT.md §2.8.2); add them with: tarindex index --force "
                f"--checksums {self.tar_path}"
            )

    def _check_ranges(self) -> tuple[NDArray[np.int64], NDArray[np.int64]]:
        """The byte ranges the open-time checks read: fingerprint, end, headers (FORMAT.md §3)."""
        size, t = self.tar_size, self.index
        n = min(FINGERPRINT_BYTES, size)
        rs = [(0, n), (size - n, size)]
        if 0 <= t.end < size:
            rs.append((t.end, t.end + min(END_CHECK_BYTES, size - t.end)))
        for k in self._header_checks():
            off = int(t.offset[k])
            if BLOCK <= off <= size:
                rs.append((off - BLOCK, off))
        a = np.asarray(rs, np.int64).reshape(-1, 2)
        return a[:, 0].copy(), a[:, 1].copy()

    def _header_checks(self) -> list[int]:
        """Members whose headers are re-read at open: first, quartiles, last (FORMAT.md §3)."""
        m = self.index.n_members
        if not m:
            return []
        return sorted({(m - 1) * q // (HEADER_CHECKS - 1) for q in range(HEADER_CHECKS)})

    @property
    def source(self) -> ByteSource:
        """The tar's byte source (:class:`~tarindex.bytesource.MmapSource` or ``PreadSource``).

        Raises:
            ValueError: If the reader is closed.
        """
        if self._src is None:
            raise ValueError(f"{self.tar_path}: reader is closed")
        return self._src

    def _check_size(self) -> None:
        t = self.index
        if self.tar_size != t.tar_size:
            raise StaleIndexError(
                f"{self.tar_path}: tar is {self.tar_size} bytes, its index {self.index_path} was "
                f"made for {t.tar_size} bytes (the tar was replaced, appended to or cut); "
                f"rebuild it with: tarindex index --force {self.tar_path}"
            )

    def _check_fingerprint(self) -> None:
        t = self.index
        fix = f"rebuild it with: tarindex index --force {self.tar_path}"
        head, tail = fingerprint(self._read_check, self.tar_size)
        if head != t.head_crc or tail != t.tail_crc:
            n = min(FINGERPRINT_BYTES, self.tar_size)
            where = 0 if head != t.head_crc else self.tar_size - n
            raise StaleIndexError(
                f"{self.tar_path}: bytes {where}..{where + n} differ from when {self.index_path} "
                f"was made (the tar was replaced or rewritten); {fix}"
            )

    def _check_end(self) -> None:
        """Check that the bytes after the archive's data are still zeros (FORMAT.md §3).

        Catches ``tar -r`` and concatenation even when the size did not change.
        """
        end = self.index.end
        if end < 0 or end >= self.tar_size:
            return
        n = min(END_CHECK_BYTES, self.tar_size - end)
        data = self._read_check(end, n)
        tail = data.lstrip(b"\0")
        if tail or len(data) != n:
            at = end + len(data) - len(tail)
            raise StaleIndexError(
                f"{self.tar_path}: byte {at}: data after the end of the archive ({end}) that "
                f"{self.index_path} recorded: members were appended (tar -r, concatenation) or "
                f"the tar was rewritten; rebuild it with: tarindex index --force {self.tar_path}"
            )

    def _check_headers(self) -> None:
        """Re-read a few member headers (first, quartiles, last) (FORMAT.md §3).

        Their checksum, type and size must still match the index.
        """
        t = self.index
        for k in self._header_checks():
            off, size = int(t.offset[k]), int(t.size[k])
            if (
                off < BLOCK
                or off % BLOCK
                or off + size > self.tar_size
                or t.ext_id[k] >= len(t.exts)
            ):
                continue  # a corrupt entry: the table guards refuse it before any read
            j = int(np.searchsorted(t.sample_ptr, np.uint64(k), side="right")) - 1
            j = min(max(j, 0), self.n_samples - 1)
            block = self._read_check(off - BLOCK, BLOCK)
            what = None
            try:
                stored = parse_number(block[TAR_SIZE]) if block[TAR_SIZE].strip(b" \0") else size
            except ValueError:
                self._range(j, j + 1)
                raise TarHeaderError(
                    f"{self.tar_path}: byte {off - BLOCK + TAR_SIZE.start}: the size field of "
                    f"member {k}'s header ({bytes(block[TAR_SIZE])!r}) is not a number; the tar "
                    f"is damaged: copy it again, or re-index it (tarindex index --force "
                    f"{self.tar_path})"
                ) from None
            if len(block) < BLOCK or not checksum_ok(block):
                what = "is no longer a valid tar header (checksum)"
            elif block[TAR_TYPEFLAG] not in REGULAR_TYPES:
                what = f"has type {bytes([block[TAR_TYPEFLAG]])!r}, not a regular file"
            elif size <= USTAR_MAX_SIZE and stored != size:
                what = f"says size {stored}, the index {size}"
            else:
                what = self._name_mismatch(block, j, int(t.ext_id[k]))
            if what is not None:
                # a corrupt index is a FormatError about the index, not a "rewritten tar":
                # the guards of this sample's chunk decide (they run only on a mismatch)
                self._range(j, j + 1)
                raise StaleIndexError(
                    f"{self.tar_path}: byte {off - BLOCK}: the header of member {k} {what}: the "
                    f"tar and {self.index_path} do not match (the tar was rewritten since it "
                    f"was indexed, or the index was damaged); rebuild it with: tarindex index "
                    f"--force {self.tar_path}"
                )

    def _name_mismatch(self, block: bytes, j: int, ext: int) -> str | None:
        """How the header's name differs from sample ``j``'s key and extension, or None.

        ASCII names only (a pax ``path`` may hold a non-ASCII name the ustar field cannot);
        a name field cut at 100 bytes (GNU LongName, pax ``path``) need only be a prefix.
        """
        t = self.index
        kp = t.key_ptr
        want = bytes(t.key_blob[int(kp[j]) : int(kp[j + 1])]) + b"." + t.exts[ext]
        raw = header_name(block)
        got = normalize_name(raw)
        if got == want or not (got.isascii() and want.isascii()):
            return None
        if len(raw) >= 99 and want.startswith(got):
            return None
        return f"names {got[:120]!r}, the index {want[:120]!r}"

    # -- guards ---------------------------------------------------------------------------
    def _check_chunk(self, c: int) -> None:
        j0 = c << CHUNK_SHIFT
        check_samples(self.index, j0, min(j0 + CHUNK, self.n_samples), self.index_path)
        self._checked[c] = 1

    def _ready(self, j0: int, j1: int) -> tuple[int, int]:
        """A compiled reader's ``0 <= j0 < j1 <= n_samples``: check their tables' chunks once.

        Returns the byte range ``(a, b)`` of the tar its members span (``a == b``: none), for
        a read-ahead hint. Raises FormatError (a corrupt chunk: FORMAT.md §2.2-2.5).
        """
        hot = self._scalar
        assert hot is not None  # a reader with _ck has _scalar
        checked = hot[0]
        for c in range(j0 >> CHUNK_SHIFT, ((j1 - 1) >> CHUNK_SHIFT) + 1):
            if not checked[c]:
                self._check_chunk(c)  # FormatError if corrupt
        sp, offs, sizes = hot[2], hot[7], hot[8]
        m0, m1 = sp[j0], sp[j1]
        return (offs[m0], offs[m1 - 1] + sizes[m1 - 1]) if m1 > m0 else (0, 0)

    def _range(self, j0: int, j1: int) -> None:
        """Refuse ``[j0, j1)`` outside the shard; check the tables of its chunks once."""
        if not 0 <= j0 <= j1 <= self.n_samples:
            raise SampleIndexError(
                f"{self.tar_path}: samples {j0}..{j1} out of range [0, {self.n_samples})"
            )
        checked = self._checked
        for c in range(j0 >> CHUNK_SHIFT, ((j1 - 1) >> CHUNK_SHIFT) + 1 if j1 > j0 else 0):
            if not checked[c]:
                self._check_chunk(c)

    def validate(self, j0: int = 0, j1: int | None = None) -> None:
        """Check the index tables of samples ``j0 <= j < j1`` now (default: all), O(j1 - j0).

        Raises:
            SampleIndexError: If the range is outside ``[0, n_samples]``.
            FormatError: If a table entry is corrupt (see
                :func:`tarindex.format.index.check_samples`).
        """
        self._range(j0, self.n_samples if j1 is None else j1)

    def _wanted(self, fields: Collection[str]) -> NDArray[np.bool_]:
        key = frozenset(fields)
        w = self._want.get(key)
        if w is None:
            w = self._want[key] = np.asarray([e in key for e in self.exts], np.bool_)
        return w

    def _want_flags(self, fields: Collection[str]) -> bytes:
        """:meth:`_wanted` as one flag byte per extension id (the compiled loops' form)."""
        try:
            w = self._want_b.get(fields)
        except TypeError:  # an unhashable collection (a list): made each time
            return self._wanted(fields).tobytes()
        if w is None:
            w = self._want_b[fields] = self._wanted(fields).tobytes()
        return w

    def zstd_dict(self) -> Any:
        """The shard's zstd dictionary (FORMAT.md §7), or ``None`` if it has none.

        Read from the tar and checked (the index's entry, crc32, dictionary id) on the first
        call in this reader, then kept: decoders get it from here, per shard, through the
        datasets (``ExtDecoder(sample, zstd_dict=...)``), never by path.

        Returns:
            A ``zstandard.ZstdCompressionDict``, or ``None``.

        Raises:
            FormatError: The index's ``zstd_dict`` entry is malformed or out of the tar's
                range, or the bytes there are not a dictionary with the recorded id.
            ChecksumError: The dictionary's bytes changed since the shard was indexed.
        """
        if self._zstd_dict is _UNREAD:
            entry = dict_entry(self.index.meta, self.index_path, self.tar_size)
            zd = None
            if entry is not None:
                import zstandard

                data = check_dict(self.read(entry.offset, entry.size), entry, self.tar_path)
                zd = zstandard.ZstdCompressionDict(data)
            self._zstd_dict = zd
        return self._zstd_dict

    # -- the kernel -----------------------------------------------------------------------
    def read(self, offset: int, size: int) -> bytes:
        """Return ``size`` bytes of the tar at byte ``offset`` (a copy).

        Raises:
            TruncatedError: If the range is negative or runs past the end of the tar
                (FORMAT.md §2.7), or the tar was cut while open (``use_mmap=False``).
        """
        return self.source.read(offset, size)

    def read_block(
        self,
        j0: int,
        j1: int,
        fields: Fields = None,
        *,
        data: bool = True,
        prefetch: bool = False,
    ) -> Block:
        """Read samples ``j0 <= j < j1`` of this shard: the kernel every dataset path uses.

        The tables of those samples are checked first (once per chunk, vectorised; see
        :func:`tarindex.format.index.check_samples`). With mmap the buffer is the mapping
        (nothing is copied); with ``pread`` the selected members are read with one read per
        run of neighbouring members (one for a whole block when nothing is projected away).

        Args:
            j0: First sample, ``0 <= j0 <= j1``.
            j1: End sample (exclusive), ``<= n_samples``.
            fields: Extensions to read (e.g. ``("jpg", "cls")``); others are left out of the
                block and their bytes are not read. Defaults to ``None`` (all members).
            data: Read member bytes. ``False`` returns the tables only. Defaults to ``True``.
            prefetch: Ask the source to read the block's byte range ahead (sequential
                streaming). Defaults to ``False``.

        Returns:
            The :class:`Block`.

        Raises:
            SampleIndexError: If the range is outside the shard.
            FormatError: If the index tables of those samples are corrupt.
            TruncatedError: If the tar was cut while open (``pread``).
        """
        self._range(j0, j1)
        t = self.index
        sp = t.sample_ptr[j0 : j1 + 1].astype(np.int64)
        lo, hi = int(sp[0]), int(sp[-1])
        kp = t.key_ptr[j0 : j1 + 1].astype(np.int64)
        k0 = int(kp[0])
        keys = _decode_keys(bytes(t.key_blob[k0 : int(kp[-1])]), (kp - k0).tolist())
        return self._finish(
            np.arange(j0, j1, dtype=np.int64),
            keys,
            sp - lo,
            t.ext_id[lo:hi].astype(np.int64),
            t.size[lo:hi].astype(np.int64),
            t.offset[lo:hi].astype(np.int64),
            fields,
            data,
            prefetch,
            lo,
        )

    def gather(
        self,
        js: Sequence[int] | NDArray[np.integer[Any]],
        fields: Fields = None,
        *,
        data: bool = True,
    ) -> Block:
        """Read samples ``js`` (any order, repeats allowed) of this shard as one :class:`Block`.

        Same guards and sources as :meth:`read_block`; neighbouring members are read together
        with ``pread``.

        Args:
            js: Shard-local sample numbers, each in ``[0, n_samples)``.
            fields: As :meth:`read_block`.
            data: As :meth:`read_block`.

        Raises:
            SampleIndexError: If a sample number is out of range.
            FormatError: If the index tables of those samples are corrupt.
        """
        j = np.asarray(js, dtype=np.int64).reshape(-1)
        if j.size and (int(j.min()) < 0 or int(j.max()) >= self.n_samples):
            bad = int(j[(j < 0) | (j >= self.n_samples)][0])
            raise SampleIndexError(
                f"{self.tar_path}: sample {bad} out of range [0, {self.n_samples})"
            )
        chunks = j >> CHUNK_SHIFT
        todo = chunks[self._checked_np[chunks] == 0]
        for c in np.unique(todo).tolist():
            self._check_chunk(c)
        t = self.index
        lo = t.sample_ptr[j].astype(np.int64)
        cnt = t.sample_ptr[j + 1].astype(np.int64) - lo
        mp = np.zeros(len(j) + 1, np.int64)
        np.cumsum(cnt, out=mp[1:])
        members = np.repeat(lo - mp[:-1], cnt) + np.arange(int(mp[-1]), dtype=np.int64)
        blob = t.key_blob
        kp = t.key_ptr
        keys = [
            str(blob[a:b], "utf-8", "surrogateescape")
            for a, b in zip(kp[j].tolist(), kp[j + 1].tolist(), strict=True)
        ]
        return self._finish(
            j,
            keys,
            mp,
            t.ext_id[members].astype(np.int64),
            t.size[members].astype(np.int64),
            t.offset[members].astype(np.int64),
            fields,
            data,
            False,
            members,
        )

    def _finish(
        self,
        samples: NDArray[np.int64],
        keys: list[str],
        mp: NDArray[np.int64],
        eid: NDArray[np.int64],
        size: NDArray[np.int64],
        toff: NDArray[np.int64],
        fields: Fields,
        data: bool,
        prefetch: bool,
        members: NDArray[np.int64] | int,
    ) -> Block:
        """Project onto ``fields`` and fetch the selected members' bytes from the source.

        ``members`` gives the selected members' numbers in the index (an array, or the first
        of a contiguous run), for ``verify_data``.
        """
        keep: NDArray[np.bool_] | None = None
        if fields is not None:
            keep = self._wanted(fields)[eid]
            if keep.all():
                keep = None
        all_off, all_size = toff, size
        if keep is not None:
            kc = np.zeros(len(keep) + 1, np.int64)
            np.cumsum(keep, out=kc[1:])
            mp = kc[mp]
            eid, size, toff = eid[keep], size[keep], toff[keep]
        buf: Buffer | None = None
        offset: NDArray[np.int64] | None = None
        if data:
            src = self.source
            if src.zero_copy:
                if self._mm is not None and self._mm.size() < self.tar_size:
                    raise self._cut(self._mm.size())
                buf, offset = src.read_ranges(toff, toff + size)
                if prefetch and len(toff):
                    src.prefetch(int(toff.min()), int((toff + size).max()))
            elif len(toff) == 0:
                buf, offset = b"", toff
            else:
                buf, offset = self._read_runs(src, all_off, all_off + all_size, keep)
        blk = Block.of_shard(
            self.tar_path, samples, keys, mp, eid, size, toff, offset, buf, self.exts
        )
        if self.verify_data and data and len(toff):
            mids = (
                np.arange(members, members + len(all_off)) if isinstance(members, int) else members
            )
            self.verify_block(blk, mids if keep is None else mids[keep])
        return blk

    def verify_block(self, blk: Block, members: NDArray[np.int64]) -> None:
        """Check the bytes of ``blk``'s members against the crc32s the index records.

        Args:
            blk: A block of this shard with data (one buffer).
            members: ``int64 (m,)``: the index member number of each of ``blk``'s members.

        Raises:
            ChecksumError: Naming the shard, key, extension and byte offset of the first
                member whose bytes differ (FORMAT.md §2.8.2).
        """
        for b, k, got, want in crc_mismatches(blk, members, [self.index.member_crc]):
            raise self._data_error(
                blk.keys[b], blk.exts[int(blk.ext_id[k])], int(blk.tar_offset[k]), got, want
            )

    def _cut(self, now: int) -> TruncatedError:
        return TruncatedError(
            f"{self.tar_path}: byte {now}: the tar was cut to {now} bytes while open (it had "
            f"{self.tar_size}); reading it mapped would kill the process (SIGBUS): re-open it "
            f"once it is complete, or copy it again and re-index it (tarindex index --force "
            f"{self.tar_path})"
        )

    def _data_error(self, key: str, ext: str, off: int, got: int, want: int) -> ChecksumError:
        return data_error(self.tar_path, self.index_path, key, ext, off, got, want)

    @staticmethod
    def _read_runs(
        src: ByteSource,
        all_off: NDArray[np.int64],
        all_end: NDArray[np.int64],
        keep: NDArray[np.bool_] | None,
    ) -> tuple[Buffer, NDArray[np.int64]]:
        """Read the kept members in runs: neighbours in the tar with nothing left out between.

        ``all_off``/``all_end`` are the data ranges of every member of the selected samples,
        ``keep`` which of them are wanted (``None``: all). A run breaks at a member that is not
        kept or at a gap over :data:`COALESCE_GAP` bytes, so no byte of a left-out member is
        read. Returns the buffer and each kept member's offset in it.
        """
        order = np.argsort(all_off, kind="stable")
        so, se = all_off[order], all_end[order]
        w = np.ones(len(so), np.bool_) if keep is None else keep[order]
        brk = np.ones(len(so), np.bool_)
        brk[1:] = ~w[:-1] | (so[1:] - np.maximum.accumulate(se)[:-1] > COALESCE_GAP)
        new = (brk & w)[w]  # run starts, among the kept members in offset order
        ko, ke = so[w], se[w]
        first = np.flatnonzero(new)
        starts = ko[first]
        ends = np.maximum.reduceat(ke, first)
        run = np.cumsum(new) - 1
        buf, bases = src.read_ranges(starts, ends)
        at_sorted = np.zeros(len(so), np.int64)
        at_sorted[w] = bases[run] + (ko - starts[run])
        at = np.empty(len(so), np.int64)
        at[order] = at_sorted
        return buf, at if keep is None else at[keep]

    def sample(self, j: int, fields: Fields = None) -> Sample:
        """Return sample ``j`` as ``{"__key__": str, ext: bytes, ...}`` (no ``__shard__``/``__index__``).

        The one-sample form of :meth:`read_block`, with the same guards (the sample's chunk of
        the index tables is checked before its first read) and sources.

        Args:
            j: Shard-local sample number, ``0 <= j < n_samples``.
            fields: Extensions to return (others are not read). Defaults to ``None`` (all).

        Raises:
            SampleIndexError: If ``j`` is out of range.
            FormatError: If the index tables of sample ``j``'s chunk are corrupt.
            TruncatedError: If the tar was cut while open (``pread``).
        """
        if not 0 <= j < self.n_samples:
            raise SampleIndexError(
                f"{self.tar_path}: sample {j} out of range [0, {self.n_samples})"
            )
        if not self._checked[j >> CHUNK_SHIFT]:
            self._check_chunk(j >> CHUNK_SHIFT)
        kp, sp = self._key_ptr, self._sample_ptr
        out: Sample = {
            "__key__": str(self._key_blob[kp[j] : kp[j + 1]], "utf-8", "surrogateescape")
        }
        exts, offs, sizes, eids = self.exts, self._offset, self._size, self._ext_id
        mm = self._mm
        if mm is not None and mm.size() < self.tar_size:  # cut while mapped: SIGBUS otherwise
            raise self._cut(mm.size())
        verify = self.verify_data
        for m in range(sp[j], sp[j + 1]):
            name = exts[eids[m]]
            if fields is not None and name not in fields:
                continue
            off = offs[m]
            out[name] = mm[off : off + sizes[m]] if mm is not None else self.read(off, sizes[m])
            if verify:
                crc = self.index.member_crc
                got, want = zlib.crc32(out[name]), -1 if crc is None else int(crc[m])
                if got != want:
                    raise self._data_error(out["__key__"], name, off, got, want)
        return out

    def key(self, j: int) -> str:
        """Return the key of sample ``j`` (``0 <= j < n_samples``), decoded as in FORMAT.md §2.5.

        Raises:
            SampleIndexError: If ``j`` is out of range.
            FormatError: If the index tables of sample ``j``'s chunk are corrupt.
        """
        self._range(j, j + 1)
        kp = self._key_ptr
        return str(self._key_blob[kp[j] : kp[j + 1]], "utf-8", "surrogateescape")

    _keytab: KeyTable | None = None

    def key_table(self) -> KeyTable:
        """Return this shard's key table (FORMAT.md §2.8.3), made on first use.

        The index's ``KHSH`` record (format 1.2), checked once (vectorised), or for an older
        index the same table computed from its keys (about 0.4 s per 1M keys; two ``n``-long
        integer arrays, no per-sample Python object).

        Raises:
            FormatError: If the record is corrupt (unsorted, a sample out of range).
        """
        kt = self._keytab
        if kt is None:
            kt = self._keytab = key_table(self.index, self.index_path)
        return kt

    def find_key(self, key: str) -> int | None:
        """Return the sample number whose key is ``key`` (FORMAT.md §4 normalisation), or None.

        The one key lookup: two binary searches in the key table (:meth:`key_table`,
        O(log n)), then each candidate's key bytes compared, so a hit is never a hash
        collision; the candidate's chunk of the tables passes the guards first.

        Raises:
            FormatError: If the key table, or the index tables of a candidate's chunk, are
                corrupt.
        """
        kb = normalize_name(key.encode("utf-8", "surrogateescape"))
        return self._find(kb) if kb else None

    def _find(self, kb: bytes) -> int | None:
        kp, blob = self._key_ptr, self._key_blob
        for j in self.key_table().candidates(kb):
            self._range(j, j + 1)
            if blob[kp[j] : kp[j + 1]] == kb:
                return int(j)
        return None

    def member_slice(self, j: int) -> tuple[int, int]:
        """Return the half-open member range ``[lo, hi)`` of sample ``j`` (FORMAT.md §2.2).

        Raises:
            SampleIndexError: If ``j`` is out of range.
            FormatError: If the index tables of sample ``j``'s chunk are corrupt.
        """
        self._range(j, j + 1)
        return int(self._sample_ptr[j]), int(self._sample_ptr[j + 1])

    def close(self) -> None:
        """Release the mappings and descriptors (idempotent)."""
        # drop our views first so the index mmap has no exports left when it is closed
        for attr in (
            "_sample_ptr",
            "_offset",
            "_size",
            "_ext_id",
            "_key_ptr",
            "_key_blob",
            "index",
            "_mm",
            "_keytab",
            "_scalar",
            "_gather",
            "_ck",  # holds buffers of the mappings: released before they are closed
        ):
            if hasattr(self, attr):
                setattr(self, attr, None)
        src = getattr(self, "_src", None)
        if src is not None:
            src.close()
            self._src = None
        m = getattr(self, "_imm", None)
        if m is not None:
            try:
                m.close()
            except BufferError:
                pass  # views still alive (numpy arrays handed out); GC closes it later
            self._imm = None

    def __enter__(self) -> ShardReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass


def _fast(a: np.ndarray[Any, Any]) -> Any:
    """A zero-copy view of a little-endian table that indexes to Python ints quickly."""
    if sys.byteorder == "little" and a.dtype.itemsize in (4, 8) and len(a):
        return memoryview(a).cast("B").cast("Q" if a.dtype.itemsize == 8 else "I")  # type: ignore[arg-type]
    return a  # big-endian host or empty table: numpy scalars still work as indices


def is_up_to_date(tar_path: str | os.PathLike[str], index_path: str | None = None) -> bool:
    """Return True if an index exists for the tar and passes the open-time checks.

    Those are the cheap checks (FORMAT.md §2.7, §3): header, size, end magic, fingerprint. A
    corrupt table inside an otherwise intact index still counts as up to date; ``tarindex
    verify`` catches that.
    """
    try:
        ShardReader(os.fspath(tar_path), index_path).close()
        return True
    except (TarIndexError, OSError):
        return False


def read_sample_count(tar_path: str, index_path: str | None = None) -> int:
    """Read only the 80-byte index header of a shard and return its sample count.

    The header's counts are checked against the index file's real size first, so a corrupt
    count (``n_samples = 2**40`` in a small file) is refused before anything is sized from it.

    Raises:
        IndexMissingError: No index file.
        FormatError: Bad magic, unknown version, truncated header, counts that do not match
            the file's size (FORMAT.md §2.1), or the index is not a regular file.
    """
    ip = index_path or index_path_for(tar_path)
    try:
        with open(_open_regular(ip), "rb") as f:
            head = f.read(HEADER.size)
            size = os.fstat(f.fileno()).st_size
    except FileNotFoundError:
        raise _missing(tar_path, ip) from None
    return read_header(head, ip, file_size=size).n_samples


def open_shard_bound(requested: int | None = None) -> int:
    """Return how many shards this process may keep open at once (at least 1).

    ``requested`` (default :data:`DEFAULT_MAX_OPEN`), lowered so that
    :data:`FDS_PER_SHARD` descriptors per shard fit under the soft ``RLIMIT_NOFILE`` with the
    descriptors already open and a reserve of 16 left free.
    """
    want = DEFAULT_MAX_OPEN if requested is None else max(1, int(requested))
    try:
        import resource

        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    except (ImportError, OSError, ValueError):
        return want
    if soft < 0 or soft == getattr(resource, "RLIM_INFINITY", -1):
        return want
    try:
        in_use = len(os.listdir("/proc/self/fd"))
    except OSError:
        in_use = _FD_RESERVE
    return max(1, min(want, (soft - in_use - _FD_RESERVE) // FDS_PER_SHARD))


class ShardSet:
    """Many shards as one sequence of samples; global index ``i`` -> ``(shard, j)``.

    Construction reads only the 80-byte header of every index (no tar scan, no per-sample
    objects), or from a dataset manifest (FORMAT.md §9) nothing but the manifest: one read
    whatever the shard count. Each shard a manifest lists is checked against it when first
    opened in a process (samples, members, tar size, fingerprint, shard id): a missing or
    changed shard raises :class:`~tarindex.errors.StaleManifestError` naming it. Readers open
    lazily in the process that reads, and are never pickled. At most
    ``max_open`` are open at a time per process (least recently used closed first), lowered
    to what the descriptor limit allows (:func:`open_shard_bound`, computed in each process);
    if opening still fails with ``EMFILE``, half the open readers are closed, the bound is
    lowered and a ``ResourceWarning`` says so.

    Args:
        source: Shards: a path, list, brace pattern, glob, directory or manifest (``.json``)
            (see :func:`tarindex.sources.expand_source`).
        max_open: Bound on simultaneously open shards per process (each holds 2 file
            descriptors). Defaults to :data:`DEFAULT_MAX_OPEN` (48).
        use_mmap: See :class:`ShardReader`. Defaults to ``True``.
        check_crc: See :class:`ShardReader`. Defaults to ``True``.
        verify_data: See :class:`ShardReader`. Defaults to ``False``.
        index_dir: A directory (or URL) holding the indexes as ``<tar name>.tidx``, for tars
            whose index is not beside them (``tarindex index URL --out DIR``). Defaults to
            ``None`` (beside each tar).
        remote: How remote shards (URLs) are read: storage options, retries, read-ahead,
            cache (:class:`tarindex.remote.RemoteOptions`). Defaults to ``RemoteOptions()``.

    Raises:
        FileNotFoundError: No shard matches ``source``.
        IndexMissingError: A shard has no index (the message gives the command).
        FormatError: An index header is bad or its counts do not match its size (FORMAT.md
            §2.1), or a manifest is not valid (FORMAT.md §9).
    """

    def __init__(
        self,
        source: Source,
        *,
        max_open: int | None = None,
        use_mmap: bool = True,
        check_crc: bool = True,
        verify_data: bool = False,
        index_dir: str | None = None,
        remote: RemoteOptions | None = None,
    ) -> None:
        self.remote_options = remote or RemoteOptions()
        listing = expand_shards(source, self.remote_options)
        self.paths = listing.paths
        self.index_dir = index_dir
        self.index_paths = (  # (the common case without index_dir, ~3x faster at 100k shards)
            [p + INDEX_SUFFIX for p in self.paths]
            if index_dir is None
            else [index_for(p, index_dir) for p in self.paths]
        )
        self.check_crc = check_crc
        self.verify_data = verify_data
        self.remote = any(is_url(p) for p in self.paths if "://" in p)
        """``True`` if some shards are remote URLs (reads then go through fsspec)."""
        self._listing: ShardList | None = listing if listing.listed else None
        counts = self._counts(listing.samples)  # from manifests: no index read at all
        self.counts = np.asarray(counts, dtype=np.int64)
        self.starts = np.zeros(len(counts) + 1, dtype=np.int64)
        np.cumsum(self.counts, out=self.starts[1:])
        self._starts_list: list[int] = self.starts.tolist()
        self._starts_bytes = self.starts.tobytes()  # the compiled get's (immutable) copy
        c0 = counts[0] if counts else 0  # equal counts but maybe the last: i // c0 finds i
        self._per = c0 if c0 > 0 and all(c == c0 for c in counts[:-1]) else 0
        self._last = len(counts) - 1
        self.max_open = DEFAULT_MAX_OPEN if max_open is None else max(1, int(max_open))
        self.use_mmap = use_mmap
        self._readers: OrderedDict[int, ShardReader] = OrderedDict()
        self._gen = _fork_generation[0]
        self._bound = 0  # this process's bound, sized on first open
        self._evicts = True  # more shards than the bound: keep the LRU order on hits
        _live_sets.add(self)

    def _counts(self, known: NDArray[np.int64]) -> list[int]:
        """Sample counts from the index headers; remote indexes fetched together, once.

        ``known[k] >= 0`` (from a manifest) is taken as it is: that index is not read.
        """
        ips = self.index_paths
        counts: list[int] = [int(c) for c in known.tolist()]
        todo = [k for k, c in enumerate(counts) if c < 0]
        far = [k for k in todo if is_url(ips[k])]
        for k in todo:
            if not is_url(ips[k]):
                counts[k] = read_sample_count(self.paths[k], ips[k])
        if far:
            got = load_indexes(
                [ips[k] for k in far], [self.paths[k] for k in far], self.remote_options
            )
            for k, (data, _) in zip(far, got, strict=True):
                counts[k] = read_header(data[: HEADER.size], ips[k], file_size=len(data)).n_samples
        return counts

    def prefetch(
        self,
        indices: Sequence[int] | NDArray[np.integer[Any]],
        fields: Fields = None,
        *,
        wait: bool = True,
    ) -> None:
        """Fetch the members of global samples ``indices`` ahead, for remote shards.

        Local shards: nothing. Remote: the selected members' byte ranges, coalesced, go into
        each source's read-ahead store, so the kernel's reads that follow take them from
        memory. ``wait=True`` fetches the whole batch now in one concurrent round trip across
        shards (``ds[i]``: one ranged read per sample; ``__getitems__``: one batch);
        ``False`` queues them to background threads within the read-ahead budget.
        Out-of-range indices are left for the read to refuse.

        Raises:
            RemoteError: As :func:`tarindex.remote.fetch` (``wait=True``).
            FormatError, StaleIndexError: As :meth:`reader` for a shard opened here.
        """
        if not self.remote:
            return
        idx = np.asarray(indices).reshape(-1)
        if not idx.size or idx.dtype.kind not in "iu":
            return
        total = len(self)
        idx = idx.astype(np.int64, copy=False)
        idx = np.where(idx < 0, idx + total, idx)
        idx = idx[(idx >= 0) & (idx < total)]
        sid = np.searchsorted(self.starts, idx, side="right") - 1
        items = []
        shards = np.unique(sid).tolist()
        self._open_many(shards)
        for s in shards:
            r = self.reader(s)
            src = r.source
            if isinstance(src, RemoteSource):
                b = r.gather(idx[sid == s] - self.starts[s], fields, data=False)
                items.append((src, b.tar_offset, b.tar_offset + b.size))
        if wait:
            prefetch_many([(src, a.tolist(), e.tolist()) for src, a, e in items])
        else:
            for src, a, e in items:
                src.prefetch_ranges(a, e)

    def prefetch_blocks(self, pieces: Sequence[Sequence[int]], fields: Fields = None) -> int:
        """Queue blocks ``(shard, j0, j1)`` for background read-ahead, in order (remote only).

        Stops at the first block the per-process budget
        (:attr:`tarindex.remote.RemoteOptions.readahead_bytes`) has no room for.

        Returns:
            How many of ``pieces`` were queued (all of them for local shards: nothing to do).
        """
        if not self.remote:
            return len(pieces)
        self._open_many([p[0] for p in pieces])
        for n, (s, j0, j1) in enumerate(pieces):
            r = self.reader(s)
            src = r.source
            if not isinstance(src, RemoteSource) or j1 <= j0:
                continue
            b = r.read_block(j0, j1, fields, data=False)
            if not len(b.size):
                continue
            if not src.queue_ahead(b.tar_offset, b.tar_offset + b.size):
                return n
        return len(pieces)

    def _open_many(self, shards: Sequence[int]) -> None:
        """Open the remote shards of ``shards`` that are not open, concurrently.

        Each open waits on a few network round trips (index, size, the open-time checks);
        threads overlap them. Within :attr:`open_bound`; a shard that fails to open here is
        left for :meth:`reader` to open (and raise) in order.
        """
        if self._gen != _fork_generation[0] or len(shards) < 2:
            return  # reader() drops what a fork inherited first
        room = self.open_bound - len(self._readers)
        todo = [s for s in dict.fromkeys(shards) if s not in self._readers]
        todo = [s for s in todo if is_url(self.paths[s])][: max(0, room)]
        if len(todo) < 2:
            return
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(min(16, len(todo)), thread_name_prefix="tarindex-open") as ex:
            futs = [(s, ex.submit(self._open, s)) for s in todo]
        for s, f in futs:
            try:
                r = f.result()
            except Exception:
                continue
            n = self._starts_list[s + 1] - self._starts_list[s]
            if r.n_samples != n or s in self._readers:
                r.close()
                continue
            self._readers[s] = r

    def drop_prefetched(self) -> None:
        """Drop the bytes fetched ahead and not read yet, in this process's open remote shards."""
        if not self.remote or self._gen != _fork_generation[0]:
            return
        for r in self._readers.values():
            src = r.source
            if isinstance(src, RemoteSource):
                src.drop_ahead()

    def _drop_inherited(self) -> None:
        readers, self._readers = self._readers, OrderedDict()
        self._gen = _fork_generation[0]
        self._set_bound(0)
        for r in readers.values():
            try:
                r.close()
            except Exception:
                pass

    def __len__(self) -> int:
        return self._starts_list[-1]

    @property
    def n_shards(self) -> int:
        """Number of shards."""
        return len(self.paths)

    @property
    def open_bound(self) -> int:
        """Open shards this process keeps at most (``max_open`` within the descriptor limit)."""
        if not self._bound:
            self._set_bound(open_shard_bound(self.max_open))
        return self._bound

    def _set_bound(self, bound: int) -> None:
        self._bound = bound
        self._evicts = not bound or len(self.paths) > bound

    def locate(self, i: int) -> tuple[int, int]:
        """Map global sample index ``i`` (negative counts from the end) to ``(shard, j)``.

        Raises:
            SampleIndexError: If ``i`` is out of range.
            TypeError: If ``i`` is not an integer.
        """
        i = operator.index(i)  # TypeError for 1.5 or "3", as list indexing
        n = self._starts_list[-1]
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise SampleIndexError(f"sample index {i} out of range for {n} samples")
        s = bisect.bisect_right(self._starts_list, i) - 1
        return s, i - self._starts_list[s]

    def _open(self, s: int) -> ShardReader:
        while True:
            try:
                return ShardReader(
                    self.paths[s],
                    self.index_paths[s],
                    use_mmap=self.use_mmap,
                    check_crc=self.check_crc,
                    verify_data=self.verify_data,
                    remote=self.remote_options,
                )
            except OSError as e:
                if e.errno not in (errno.EMFILE, errno.ENFILE) or not self._readers:
                    raise
                n = max(1, len(self._readers) // 2)
                self._set_bound(max(1, len(self._readers) - n))
                warnings.warn(
                    f"{self.paths[s]}: too many open files ({e.strerror}) with "
                    f"{len(self._readers)} shards open; closing {n} and keeping at most "
                    f"{self._bound} open in this process (raise `ulimit -n` or pass a smaller "
                    f"max_open)",
                    ResourceWarning,
                    stacklevel=4,
                )
                for _ in range(n):
                    self._readers.popitem(last=False)[1].close()

    def reader(self, s: int) -> ShardReader:
        """Return the open reader of shard ``s``, opening it (and closing the LRU one) if needed.

        Raises:
            StaleIndexError: If the shard's index changed since this ShardSet was made, or
                no longer matches its tar.
            StaleManifestError: If the ShardSet was made from a manifest and the shard is
                missing or differs from its row (FORMAT.md §9).
            FormatError: If the index is corrupt (see :class:`ShardReader`).
        """
        if self._gen != _fork_generation[0]:  # forked: the parent's mmaps and fds are not ours
            self._readers = OrderedDict()
            self._gen = _fork_generation[0]
            self._set_bound(0)
        r = self._readers.get(s)
        if r is not None:
            self._readers.move_to_end(s)
            return r
        bound = self.open_bound
        while len(self._readers) >= bound:
            self._readers.popitem(last=False)[1].close()
        listed = self._listing is not None and self._listing.samples[s] >= 0
        try:
            r = self._open(s)
        except FileNotFoundError as e:
            if not listed:
                raise
            raise self._unlisted(s, str(e.strerror or e), missing=True) from e
        if listed:
            self._check_listed(s, r)
        if r.n_samples != self._starts_list[s + 1] - self._starts_list[s]:
            r.close()
            raise StaleIndexError(
                f"{r.index_path}: now holds {r.n_samples} samples, this ShardSet counted "
                f"{self._starts_list[s + 1] - self._starts_list[s]} when it was made (the index was "
                f"rebuilt meanwhile); make a new ShardSet"
            )
        self._readers[s] = r
        return r

    def _unlisted(self, s: int, what: str, missing: bool = False) -> StaleManifestError:
        assert self._listing is not None
        m = self._listing.origin[s]
        if missing:  # the manifest cannot be made again from itself: name the shards
            return StaleManifestError(
                f"{self.paths[s]}: shard {s} of manifest {m} is missing ({what}); restore it, "
                f"or make the manifest again from the shards there are: tarindex manifest "
                f"SHARDS... -o {m}"
            )
        return StaleManifestError(
            f"{self.paths[s]}: shard {s} of manifest {m} changed since the manifest was made "
            f"({what}); if the new shard is the one you want, rebuild the manifest over the same "
            f"shards: tarindex manifest {m} -o {m}; otherwise restore the shard"
        )

    def _check_listed(self, s: int, r: ShardReader) -> None:
        """Compare shard ``s``'s index with what its manifest recorded (FORMAT.md §9)."""
        lst, t = self._listing, r.index
        assert lst is not None
        for name, want, got in (
            ("samples", int(lst.samples[s]), t.n_samples),
            ("members", int(lst.members[s]), t.n_members),
            ("tar bytes", int(lst.tar_bytes[s]), t.tar_size),
            ("head crc32", int(lst.head_crc[s]), t.head_crc),
            ("tail crc32", int(lst.tail_crc[s]), t.tail_crc),
            ("shard id", lst.shard_id[s], t.shard_id.hex()),
        ):
            if want != got and (name != "shard id" or (want and got)):  # `index` records none
                r.close()
                if "crc32" in name:
                    got, want = f"0x{got:08x}", f"0x{want:08x}"
                raise self._unlisted(s, f"{name} now {got}, the manifest says {want}")

    _keyidx: KeyTable | None = None

    def _key_index(self) -> KeyTable:
        """Every shard's key table in one: hashes ascending, global indices (made once)."""
        ki = self._keyidx
        if ki is None:
            hs, gs = [], []
            for s in range(self.n_shards):
                kt = self.reader(s).key_table()
                hs.append(np.array(kt.hash, np.uint32))  # copies: the reader may close
                gs.append(np.asarray(kt.order, np.int64) + self._starts_list[s])
            h = np.concatenate(hs) if hs else np.empty(0, np.uint32)
            g = np.concatenate(gs) if gs else np.empty(0, np.int64)
            if len(hs) > 1:
                order = np.argsort(h, kind="stable")  # equal hashes stay in global order
                h, g = h[order], g[order]
            ki = self._keyidx = KeyTable(h, g)
        return ki

    def indices_of(self, key: str) -> list[int]:
        """Return the global index of every sample whose key is ``key``, ascending.

        Keys are unique within a shard (FORMAT.md §4), not across shards. One shard: its
        key table (:meth:`ShardReader.find_key`). Several: on first call the shards' key
        tables are joined into one (each shard opened once; 12 bytes per sample, per
        process, not pickled), then each lookup is a binary search, O(log n), and each
        candidate's key bytes are compared.

        Raises:
            FormatError, StaleIndexError: As :meth:`reader`.
        """
        kb = normalize_name(key.encode("utf-8", "surrogateescape"))
        if not kb:
            return []
        if self.n_shards == 1:
            j = self.reader(0)._find(kb)
            return [] if j is None else [j]
        out = []
        for i in self._key_index().candidates(kb):
            s, j = self.locate(i)
            r = self.reader(s)
            r._range(j, j + 1)
            kp = r._key_ptr
            if r._key_blob[kp[j] : kp[j + 1]] == kb:
                out.append(i)
        return sorted(out)

    def index_of(self, key: str) -> int:
        """Return the global index of the sample whose key is ``key``.

        See :meth:`indices_of` for the cost.

        Raises:
            KeyNotFoundError: (a ``KeyError``) If no sample has this key.
            AmbiguousKeyError: (a ``LookupError``) If several shards hold the key; the message
                names each place; :meth:`indices_of` returns them all.
            FormatError, StaleIndexError: As :meth:`reader`.
        """
        hits = self.indices_of(key)
        if len(hits) == 1:
            return hits[0]
        if not hits:
            raise KeyNotFoundError(
                f"no sample with key {key!r} in {self.n_shards} shard(s) ({self.paths[0]}"
                f"{', ...' if self.n_shards > 1 else ''})"
            )
        where = []
        for i in hits[:5]:
            s, j = self.locate(i)
            where.append(f"{i} ({self.paths[s]}, sample {j})")
        raise AmbiguousKeyError(
            f"key {key!r} is in {len(hits)} samples: {', '.join(where)}"
            f"{', ...' if len(hits) > 5 else ''}; keys are unique only within a shard: use "
            f"indices_of(key) for every one, or a source of fewer shards"
        )

    def index_of_many(self, keys: Sequence[str]) -> NDArray[np.int64]:
        """Return the global index of each key's sample, ``-1`` for a key no sample has.

        The batch form of :meth:`index_of`, for joins with metadata: the keys are hashed
        together (vectorised, FORMAT.md §8), looked up with one ``searchsorted`` in the key
        table, and the candidates' key bytes compared shard by shard (their chunks of the
        tables pass the guards first).

        Args:
            keys: The keys (FORMAT.md §4 normalisation, as :meth:`index_of`).

        Returns:
            ``int64 (len(keys),)``.

        Raises:
            AmbiguousKeyError: If a key is held by samples of several shards (the first such
                key, with every place); :meth:`indices_of` returns them all.
            FormatError, StaleIndexError: As :meth:`reader`.
        """
        raw = [k.encode("utf-8", "surrogateescape") for k in keys]
        raw = [normalize_name(b) if b.startswith((b"./", b"/")) else b for b in raw]
        out = np.full(len(raw), -1, np.int64)
        if not raw:
            return out
        ptr = np.zeros(len(raw) + 1, np.int64)
        np.cumsum([len(k) for k in raw], out=ptr[1:])
        hv = (key_hashes(b"".join(raw), ptr, LOOKUP_SEED) >> np.uint64(32)).astype(np.uint32)
        kt = self._key_index() if self.n_shards > 1 else self.reader(0).key_table()
        by = np.argsort(hv, kind="stable")  # sorted needles: searchsorted walks forward
        lo = np.empty(len(raw), np.int64)
        hi = np.empty(len(raw), np.int64)
        lo[by] = np.searchsorted(kt.hash, hv[by], side="left")
        hi[by] = np.searchsorted(kt.hash, hv[by], side="right")
        q = np.repeat(np.arange(len(raw), dtype=np.int64), hi - lo)  # (query, candidate) pairs
        at = np.arange(len(q), dtype=np.int64) - np.repeat(np.cumsum(hi - lo) - (hi - lo), hi - lo)
        cand = np.asarray(kt.order, np.int64)[np.repeat(lo, hi - lo) + at]
        sid = np.searchsorted(self.starts, cand, side="right") - 1
        found: list[int] = []  # (query, global index) of every confirmed candidate, flat
        ql, cl = q.tolist(), cand.tolist()
        for s in np.unique(sid).tolist():
            sel = np.flatnonzero(sid == s)
            js = cand[sel] - self.starts[s]
            r = self.reader(s)
            chunks = np.unique(js >> CHUNK_SHIFT)
            for c in chunks[r._checked_np[chunks] == 0].tolist():
                r._check_chunk(c)
            kp, blob = r._key_ptr, r._key_blob
            for k, j in zip(sel.tolist(), js.tolist(), strict=True):
                if blob[kp[j] : kp[j + 1]] == raw[ql[k]]:
                    found += (ql[k], cl[k])
        f = np.asarray(found, np.int64).reshape(-1, 2)
        out[f[:, 0]] = f[:, 1]
        dup = np.bincount(f[:, 0], minlength=len(raw)) > 1
        if dup.any():
            self.index_of(keys[int(np.argmax(dup))])  # raises, naming every place
        return out

    def get(self, i: int, fields: Fields = None) -> Sample:
        """Return global sample ``i`` with ``__key__``, ``__shard__``, ``__index__`` and raw bytes.

        Args:
            i: Global sample index (negative counts from the end).
            fields: Extensions to return, see :meth:`ShardReader.sample`. Defaults to all.

        Raises:
            SampleIndexError: If ``i`` is out of range.
            StaleIndexError: As :meth:`reader`.
            FormatError: As :meth:`ShardReader.sample`.
        """
        # locate(), the LRU hit of reader() and ShardReader.sample() on a mapping, inlined:
        # this is the per-sample hot path (every step costs ~1% of a small sample's read).
        # Compiled, in one call, for every member of a mapped shard; None: the steps below
        if fields is None and _kernel is not None:
            got = _kernel.get(
                i, self._starts_bytes, self._per, self._readers, self.paths, self._evicts
            )
            if got is not None:
                return got  # type: ignore[no-any-return]
        starts = self._starts_list
        if type(i) is not int:
            i = operator.index(i)  # TypeError for 1.5 or "3", as list indexing
        if i < 0:
            i += starts[-1]
        if not 0 <= i < starts[-1]:
            raise SampleIndexError(f"sample index {i} out of range for {starts[-1]} samples")
        per = self._per
        if per:  # shards of equal counts (the writer's maxcount): no search
            s = i // per
            if s > self._last:
                s = self._last
        else:
            s = bisect.bisect_right(starts, i) - 1
        r = self._readers.get(s)  # a forked child dropped its parent's (_bump_fork_generation)
        if r is None:
            r = self.reader(s)
        elif self._evicts:
            self._readers.move_to_end(s)
        j = i - starts[s]
        ck = r._ck
        if ck is not None:  # the compiled loop; None back: the Python path below decides
            tabs, mm, size = ck
            # the flags first: hashing `fields` runs Python code, which must not come between
            # the size check and the read
            want = None if fields is None else r._want_flags(fields)
            if mm.size() < size:  # cut while mapped: SIGBUS otherwise (READING.md)
                raise r._cut(mm.size())
            got = tabs.sample(j, want, self.paths[s], i)
            if got is not None:
                return got  # type: ignore[no-any-return]
        hot = r._scalar
        if hot is None:  # pread or verify_data: the reader's own path
            out = r.sample(j, fields)
        else:
            checked, kp, sp, imm, kb, exts, eids, offs, sizes, mm = hot
            if not checked[j >> CHUNK_SHIFT]:
                r._check_chunk(j >> CHUNK_SHIFT)
            if mm.size() < r.tar_size:  # cut while mapped: SIGBUS otherwise (READING.md)
                raise r._cut(mm.size())
            out = {"__key__": imm[kb + kp[j] : kb + kp[j + 1]].decode("utf-8", "surrogateescape")}
            if fields is None:
                for m in range(sp[j], sp[j + 1]):
                    o = offs[m]
                    out[exts[eids[m]]] = mm[o : o + sizes[m]]
            else:
                for m in range(sp[j], sp[j + 1]):
                    name = exts[eids[m]]
                    if name in fields:
                        o = offs[m]
                        out[name] = mm[o : o + sizes[m]]
        out["__shard__"] = self.paths[s]
        out["__index__"] = i
        return out

    def read_block(
        self,
        s: int,
        j0: int,
        j1: int,
        fields: Fields = None,
        *,
        data: bool = True,
        prefetch: bool = False,
    ) -> Block:
        """:meth:`ShardReader.read_block` on shard ``s``, with global indices in the block.

        Raises:
            SampleIndexError, FormatError, StaleIndexError, TruncatedError: As
                :meth:`ShardReader.read_block` and :meth:`reader`.
        """
        b = self.reader(s).read_block(j0, j1, fields, data=data, prefetch=prefetch)
        b.paths = [self.paths[s]]
        b.index = b.samples + self._starts_list[s]
        return b

    def read_samples(
        self, s: int, j0: int, j1: int, fields: Fields = None, *, prefetch: bool = False
    ) -> list[Sample]:
        """Samples ``j0 <= j < j1`` of shard ``s`` as dicts: ``read_block(...).to_samples()``.

        The streaming read of a block. Over a mapping one compiled call builds the dicts from
        the validated tables (``tarindex/read/_kernel.c``); otherwise (pread, remote, ``verify_data``,
        no compiled loops, anything it hands back) the block is read and unpacked.

        Raises:
            SampleIndexError, FormatError, StaleIndexError, TruncatedError: As
                :meth:`read_block`.
        """
        r = self.reader(s)
        ck = r._ck
        if ck is not None and 0 <= j0 < j1 <= r.n_samples:
            tabs, mm, size = ck
            a, b = r._ready(j0, j1)
            want = None if fields is None else r._want_flags(fields)
            if mm.size() < size:  # cut while mapped: SIGBUS otherwise (READING.md)
                raise r._cut(mm.size())
            if prefetch and fields is None and b > a:  # projected: no left-out members' pages
                r.source.prefetch(a, b)
            got = tabs.samples(j0, j1, want, self.paths[s], self._starts_list[s] + j0)
            if got is not None:
                return got  # type: ignore[no-any-return]
        return self.read_block(s, j0, j1, fields, prefetch=prefetch).to_samples()

    def take_ready(self, pieces: Sequence[Sequence[int]], fields: Fields = None) -> int | None:
        """Prepare blocks ``(shard, j0, j1)`` for :meth:`take`: open them and check their tables.

        A streaming window then holds where its samples are, not their bytes, and copies each
        out as it is yielded. An ``int`` (the bytes the blocks span in their tars, headers
        included) when :meth:`take` reads these samples through the compiled loops from
        mappings: every member (``fields`` ``None``), local mapped shards, no more of them than
        may stay open. The blocks also get the ``MADV_WILLNEED`` hint while reads fault
        (:func:`tarindex.bytesource.cold_cache`), since the window reads them in its shuffled
        order. ``None``: read the blocks with :meth:`read_samples`.

        Raises:
            FormatError, StaleIndexError: As :meth:`read_block` (a corrupt chunk of tables).
        """
        if _kernel is None or fields is not None or self.remote:
            return None
        shards = {int(p[0]) for p in pieces}
        if len(shards) > self.open_bound:
            return None
        mapped: dict[int, tuple[ShardReader, MmapSource]] = {}
        for s in shards:
            r = self.reader(s)
            src = r.source
            if r._ck is None or not isinstance(src, MmapSource):
                return None
            mapped[s] = (r, src)
        hint = cold_cache()
        span = 0
        for s, j0, j1 in pieces:
            r, src = mapped[s]
            if not 0 <= j0 < j1 <= r.n_samples:
                return None  # read_samples says what is wrong
            a, b = r._ready(j0, j1)
            span += b - a
            if hint and b > a:
                src.willneed(a, b)
        return span

    def take(self, indices: list[int]) -> list[Sample]:
        """Global samples ``indices`` as :meth:`read_samples` gives them (a window's, in order).

        One compiled call over mappings, after :meth:`take_ready`; otherwise each sample is
        read with :meth:`read_samples`. Each tar's size is checked once per call, before its
        first byte is copied, so a tar cut since (while the consumer held earlier samples)
        raises :class:`TruncatedError`, not ``SIGBUS``.

        Raises:
            SampleIndexError, FormatError, StaleIndexError, TruncatedError: As :meth:`get`.
        """
        if _kernel is not None:
            got = _kernel.take(
                indices, self._starts_bytes, self._per, self._readers, self.paths, self._evicts
            )
            if got is not None:
                return got  # type: ignore[no-any-return]
        out: list[Sample] = []
        for i in indices:
            s, j = self.locate(i)
            out.extend(self.read_samples(s, j, j + 1))
        return out

    def gather(
        self, indices: Sequence[int] | NDArray[np.integer[Any]], fields: Fields = None
    ) -> Block:
        """Read global samples ``indices`` (a batch, any order, repeats allowed) as one block.

        One pass over the batch with scalar reads of each shard's tables (the per-sample cost
        of ``ds[i]``, without its dict): every sample's chunk of the tables passes the guards
        first, as in :meth:`ShardReader.read_block`. With mmap the block's buffers are the
        mappings; with ``pread`` each shard's selected members are read in runs. When the
        batch spans more shards than may stay open (:attr:`open_bound`) the members' bytes
        are copied out at once, so descriptors stay within the bound.

        Args:
            indices: Global sample indices; negative ones count from the end.
            fields: Extensions to read (others are not read). Defaults to ``None`` (all).

        Returns:
            A :class:`Block` of ``len(indices)`` samples in the order of ``indices``.

        Raises:
            SampleIndexError: If an index is out of range.
            TypeError: If an index is not an integer.
            FormatError, StaleIndexError: As :meth:`ShardReader.read_block` and :meth:`reader`.
        """
        idx, sid, local = self._locate_many(indices)
        uniq, col = np.unique(sid, return_inverse=True)  # slot: rank among the batch's shards
        slots: list[int] = uniq.tolist()
        n_slots = len(slots)
        copy = n_slots > self.open_bound  # more shards than may stay open: copy out
        slot_exts: list[tuple[str, ...]] = [()] * n_slots
        crcs: list[Any] = [None] * n_slots  # with verify_data: the recorded member crc32s
        tables: dict[int, tuple[Any, ...]] = {}
        seen = bytearray(n_slots)
        if not copy:
            for slot, s in enumerate(slots):
                r = self.reader(s)
                if r._mm is not None and r._mm.size() < r.tar_size:
                    raise r._cut(r._mm.size())  # cut while mapped: SIGBUS otherwise
                tables[s] = (r, *r._gather)
                slot_exts[slot], crcs[slot] = r._exts_key, r.index.member_crc
        col = col.astype(np.int64, copy=False)
        got = None if copy else self._gather_compiled(slots, tables, col, local)
        if got is not None:
            return self._assemble(
                slots, slot_exts, crcs, got[0], local, idx, *got[1:], col, fields, copy
            )
        # One scalar pass: per sample its key and member count; its run of member offsets,
        # sizes and extension ids is appended as raw little-endian table bytes (one memcpy
        # each whatever the member count). Everything per member is vectorised afterwards.
        keys: list[str] = []
        cnts: list[int] = []
        off_b, size_b, ext_b = bytearray(), bytearray(), bytearray()
        for s, j, slot in zip(sid.tolist(), local.tolist(), col.tolist(), strict=True):
            if copy:  # readers come and go: the open one (its tables stay valid while open)
                r = self.reader(s)
                h = (r, *r._gather)
                if not seen[slot]:
                    seen[slot] = 1
                    slot_exts[slot], crcs[slot] = r._exts_key, r.index.member_crc
            else:
                h = tables[s]
            r, checked, kp, sp, imm, kb, ob, sb, eb = h
            if not checked[j >> CHUNK_SHIFT]:
                r._check_chunk(j >> CHUNK_SHIFT)
            keys.append(imm[kb + kp[j] : kb + kp[j + 1]].decode("utf-8", "surrogateescape"))
            lo, hi = sp[j], sp[j + 1]
            off_b += ob[lo << 3 : hi << 3]
            size_b += sb[lo << 3 : hi << 3]
            ext_b += eb[lo << 2 : hi << 2]
            cnts.append(hi - lo)
        return self._assemble(
            slots, slot_exts, crcs, keys, local, idx, cnts, off_b, size_b, ext_b, col, fields, copy
        )

    def _locate_many(
        self, indices: Sequence[int] | NDArray[np.integer[Any]]
    ) -> tuple[NDArray[np.int64], NDArray[np.int64], NDArray[np.int64]]:
        """:meth:`locate` for a batch: ``int64`` global indices (normalised), shards, locals."""
        idx = sample_indices(indices, len(self))
        if self._per:
            sid = np.minimum(idx // self._per, self._last)
        else:
            sid = np.searchsorted(self.starts, idx, side="right") - 1
        return idx, sid, idx - self.starts[sid]

    def gather_packed(
        self,
        indices: Sequence[int] | NDArray[np.integer[Any]],
        fields: Fields,
        int_fields: Collection[str],
        alloc: Any,
    ) -> tuple[Any, ...] | None:
        """:meth:`gather` and the batch packing in one compiled pass, or ``None``.

        The layout is ``tarindex.torch.batch.field_major``'s: byte fields (in order of first
        appearance in batch order) one after the other, each sample's member in batch order;
        ``int_fields`` members parsed as decimal integers instead. ``None`` means: use
        :meth:`gather` and pack its block (no compiled loops, ``pread``, ``verify_data``,
        more shards than may stay open, or a sample they hand back: the Python path then
        raises the error that names it).

        Args:
            indices: Global sample indices; negative ones count from the end.
            fields: Extensions to read. ``None``: all.
            int_fields: Extensions parsed as decimal integers.
            alloc: ``alloc(nbytes) -> (keep, writable buffer)``: the batch buffer.

        Returns:
            ``(keep, keys, byte_fields, int_fields, offsets, present, ints, index, shards)``:
            ``offsets`` ``int64 (nf, n + 1)``, ``present`` ``bool (nf, n)``, ``ints`` ``int64
            (ni, n)`` (``-1`` where missing), ``index`` ``int64 (n,)``, ``shards`` paths.

        Raises:
            SampleIndexError, TypeError: As :meth:`gather`.
            FormatError, StaleIndexError, TruncatedError: As :meth:`gather`.
        """
        if _kernel is None:
            return None
        if type(indices) is not list:
            indices = list(indices)
        fkey = None if fields is None else frozenset(fields)
        ikey = frozenset(int_fields)
        for _ in range(len(indices) + 2):  # each hand-back opens a reader or checks a chunk
            got = _kernel.batch(
                indices, self.starts, self._per, self._readers, self.paths, fkey, ikey, alloc
            )
            if len(got) == 9:
                break
            what, s, c = got
            if what == "open" and len(self._readers) < self.open_bound:
                self.reader(s)  # StaleIndexError, FormatError: as gather
            elif what == "check":
                self._readers[s]._check_chunk(c)  # FormatError if corrupt
            else:
                return None  # the Python path raises the error or reads the batch
        else:
            return None
        keep, keys, bnames, inames, offs, pres, ints, index, shards = got
        n, nf, ni = len(keys), len(bnames), len(inames)
        return (
            keep,
            keys,
            bnames,
            inames,
            np.frombuffer(offs, np.int64).reshape(nf, n + 1),
            np.frombuffer(pres, np.bool_).reshape(nf, n),
            np.frombuffer(ints, np.int64).reshape(ni, n),
            np.frombuffer(index, np.int64),
            shards,
        )

    def _gather_compiled(
        self,
        slots: list[int],
        tables: dict[int, tuple[Any, ...]],
        col: NDArray[np.int64],
        local: NDArray[np.int64],
    ) -> tuple[list[str], bytes, bytes, bytes, bytes] | None:
        """:meth:`gather`'s scalar pass in the compiled loop, or ``None`` (the Python pass).

        Returns keys, member counts and the members' raw table bytes. A sample handed back
        in an unchecked chunk gets the chunk checked (``FormatError`` if corrupt) and the pass
        runs again; handed back in a checked one, the Python pass decides.
        """
        cks = [tables[s][0]._ck for s in slots]
        if _kernel is None or any(c is None for c in cks):
            return None
        tabs = tuple(c[0] for c in cks)
        while True:
            got = _kernel.gather(tabs, col, local)
            if type(got) is not int:
                return got  # type: ignore[no-any-return]
            r, c = tables[slots[int(col[got])]][0], int(local[got]) >> CHUNK_SHIFT
            if r._checked[c]:
                return None
            r._check_chunk(c)

    def _assemble(
        self,
        slots: list[int],
        slot_exts: list[tuple[str, ...]],
        crcs: list[Any],
        keys: list[str],
        local: NDArray[np.int64],
        idx: NDArray[np.int64],
        cnts: list[int] | bytes,
        off_b: bytes | bytearray,
        size_b: bytes | bytearray,
        ext_b: bytes | bytearray,
        shard_col: NDArray[np.int64],
        fields: Fields,
        copy: bool,
    ) -> Block:
        """The vectorised half of :meth:`gather`: member arrays, projection, reads, the block."""
        cnt = (
            np.asarray(cnts, np.int64) if isinstance(cnts, list) else np.frombuffer(cnts, np.int64)
        )
        tar_off = np.frombuffer(off_b, OFFSET_DTYPE).astype(np.int64)
        size = np.frombuffer(size_b, OFFSET_DTYPE).astype(np.int64)
        eid = np.frombuffer(ext_b, EXT_ID_DTYPE).astype(np.int64)
        src = np.repeat(shard_col, cnt)
        mp = np.zeros(len(keys) + 1, np.int64)
        np.cumsum(cnt, out=mp[1:])
        ext_code: dict[str, int] = {}  # global extension codes; equal tables share a range
        ebase_of: dict[tuple[str, ...], int] = {}
        codes: list[int] = []
        ebase: list[int] = []
        for exts in slot_exts:
            eb = ebase_of.get(exts)
            if eb is None:
                eb = ebase_of[exts] = len(codes)
                codes.extend([ext_code.setdefault(e, len(ext_code)) for e in exts])
            ebase.append(eb)
        if len(ebase_of) > 1:
            eid = np.asarray(codes, np.int64)[eid + np.asarray(ebase, np.int64)[src]]
        names = list(ext_code)
        mid = None  # with verify_data: each member's number in its index
        if self.verify_data:  # each member's number in its index: sample_ptr[j] + rank
            sps = [self.reader(s).index.sample_ptr for s in slots] if copy else None
            first = np.empty(len(keys), np.int64)
            for c in range(len(slots)):
                at = shard_col == c
                sp = sps[c] if sps is not None else self._readers[slots[c]].index.sample_ptr
                first[at] = sp[local[at]]
            mid = np.arange(len(eid), dtype=np.int64) + np.repeat(first - mp[:-1], cnt)
        keep = None  # members kept by fields (pread reads no byte of the others)
        if fields is not None:
            keep = np.asarray([e in fields for e in names], np.bool_)[eid]
            if keep.all():
                keep = None
        maps = [None if copy else getattr(self._readers.get(s), "_mm", None) for s in slots]
        offset = tar_off if all(m is not None for m in maps) else tar_off.copy()
        datas: list[Buffer] = []
        for slot, s in enumerate(slots):
            mm = maps[slot]
            if mm is not None:
                datas.append(mm)  # mapped: the buffer is the mapping
                continue
            mine = src == slot
            want = np.flatnonzero(mine if keep is None else mine & keep)
            left = np.flatnonzero(mine & ~keep) if keep is not None else want[:0]
            datas.append(self._fetch(s, want, tar_off, size, left, offset) if len(want) else b"")
        if keep is not None:
            kc = np.zeros(len(keep) + 1, np.int64)
            np.cumsum(keep, out=kc[1:])
            mp = kc[mp]
            tar_off, size, eid, src, offset = (
                tar_off[keep],
                size[keep],
                eid[keep],
                src[keep],
                offset[keep],
            )
            if mid is not None:
                mid = mid[keep]
        paths = [self.paths[s] for s in slots]
        blk = Block(
            paths, shard_col, local, idx, keys, mp, eid, size, tar_off, offset, src, datas, names
        )
        if mid is not None:
            for b, k, got, recorded in crc_mismatches(blk, mid, crcs):
                slot = int(src[k])
                raise data_error(
                    paths[slot],
                    self.index_paths[slots[slot]],  # beside the tar, or in index_dir
                    keys[b],
                    names[int(eid[k])],
                    int(tar_off[k]),
                    got,
                    recorded,
                )
        return blk

    def _fetch(
        self,
        s: int,
        want: NDArray[np.int64],
        tar_off: NDArray[np.int64],
        size: NDArray[np.int64],
        left: NDArray[np.int64],
        offset: NDArray[np.int64],
    ) -> Buffer:
        """Read members ``want`` (positions in ``tar_off``/``size``) of shard ``s`` into a buffer.

        Sets ``offset[want]`` to where they are in it. With ``pread`` the reads are runs that
        read no byte of the members ``left`` (left out by ``fields``).
        """
        r = self.reader(s)
        toff, sz = tar_off[want], size[want]
        src = r.source
        if src.zero_copy:  # mapped, but more shards than may stay open: copy the members out
            mm = r._mm
            assert mm is not None
            if mm.size() < r.tar_size:
                raise r._cut(mm.size())  # cut while mapped: SIGBUS otherwise
            joined, offset[want] = _joined(
                [mm[a : a + n] for a, n in zip(toff.tolist(), sz.tolist(), strict=True)]
            )
            return joined
        buf: Buffer
        if len(left):
            all_off = np.concatenate([toff, tar_off[left]])
            all_end = np.concatenate([toff + sz, tar_off[left] + size[left]])
            keep = np.zeros(len(all_off), np.bool_)
            keep[: len(toff)] = True
            buf, at = r._read_runs(src, all_off, all_end, keep)
        else:
            buf, at = r._read_runs(src, toff, toff + sz, None)
        offset[want] = at
        return buf

    def close(self) -> None:
        """Close every open reader of this process."""
        for r in self._readers.values():
            r.close()
        self._readers.clear()

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_readers"] = OrderedDict()  # handles are reopened lazily, never pickled
        state["_bound"] = 0  # sized again from the receiving process's descriptor limit
        state.pop("_keyidx", None)  # per process, made again on first lookup
        state["_evicts"] = True
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._gen = _fork_generation[0]
        _live_sets.add(self)
