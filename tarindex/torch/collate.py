"""Batch-shaped results for the DataLoader: a batch packed into one uint8 buffer plus offsets.

A ``DataLoader`` over per-sample dicts pays per sample twice: the fetch builds a dict of
``bytes`` for each sample, and the worker pickles every one of them to the main process.
:class:`BatchedSamples` holds a whole batch in a few objects instead: one ``uint8`` tensor
with the bytes of every member (allocated in shared memory inside a worker, so it crosses to
the main process without a copy), an ``int64`` offset table per extension, and ``int64``
arrays for the global index and the integer labels (``cls``). Per-sample bytes are views into
the buffer, made only when asked for.

Use it through :class:`tarindex.TarDataset` with ``batched=True`` (its ``__getitems__`` then
reads the batch straight from the mmapped shards into the buffer, with no per-sample dict)
and :func:`collate_batched` as the ``collate_fn``::

    ds = TarDataset("train-{000000..000009}.tar", batched=True)
    loader = DataLoader(ds, batch_size=64, shuffle=True, num_workers=2,
                        collate_fn=collate_batched)
    for batch in loader:            # a BatchedSamples
        labels = batch.cls          # torch.int64, shape (B,)
        first = batch.bytes("png", 0)

For streaming, ``TarIterableDataset(..., batched=True, batch_size=64)`` yields the same
:class:`BatchedSamples`, packed from its block reads; use it with ``DataLoader(ds,
batch_size=None)``.

:func:`collate_batched` also packs a list of sample dicts (any map-style dataset that returns
``{"__key__": str, ext: bytes, ...}``), so it works without ``batched=True`` too, only slower.
"""

from __future__ import annotations

import mmap
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import torch
import torch.utils.data
from numpy.typing import NDArray

from ..errors import SampleIndexError
from ..reader import Sample, ShardSet

__all__ = ["BatchedSamples", "collate_batched", "fetch_batched", "pack_samples", "INT_FIELDS"]

INT_FIELDS: tuple[str, ...] = ("cls",)
"""Extensions parsed to ``int64`` (decimal text, as webdataset and tarindex write labels)."""


def _alloc(nbytes: int) -> torch.Tensor:
    """A ``uint8`` tensor of ``nbytes``, in shared memory when called in a DataLoader worker.

    In a worker the buffer is a torch shared-memory segment *named by file* (torch's
    ``file_system`` sharing), whatever the global sharing strategy: the main process then
    opens it by name. With the default ``file_descriptor`` strategy every tensor a worker
    sends costs a round trip to a descriptor-serving thread in that worker, which waits for
    the worker's GIL while it fetches the next batch; by name, a batch of 64 x 19 KB samples
    moved ~1.5x faster on 2 cores. Cleanup is torch's: the segment is unlinked when the last
    process holding it frees it, and torch's shm manager removes what a dead process leaked.
    """
    if torch.utils.data.get_worker_info() is not None and nbytes > 0:
        new = getattr(torch.UntypedStorage, "_new_using_filename_cpu", None)
        if new is not None:
            t = torch.empty(0, dtype=torch.uint8).set_(new(nbytes))
            _BY_NAME.add(t.untyped_storage().data_ptr())
            return t
        # Like default_collate: fill shared memory directly (no copy when it is sent).
        storage = torch.UntypedStorage._new_shared(nbytes)  # type: ignore[no-untyped-call]
        return torch.empty(0, dtype=torch.uint8).set_(storage)
    return torch.empty(nbytes, dtype=torch.uint8)


_BY_NAME: set[int] = set()
"""data_ptr of the buffers :func:`_alloc` made by name in this worker, not sent yet."""


def _share_by_name(data: torch.Tensor) -> tuple[str, bytes, bytes, int] | None:
    """Pickle-time: the by-name handle of a worker-made buffer (torch's file_system protocol).

    The sender takes one reference on the segment; :func:`_open_by_name` drops it once the
    receiver holds its own mapping, as ``torch.multiprocessing.reductions`` does.
    """
    storage = data.untyped_storage()
    ptr = storage.data_ptr()
    if ptr not in _BY_NAME:
        return None
    _BY_NAME.discard(ptr)
    manager, handle, size = storage._share_filename_cpu_()
    storage._shared_incref()  # type: ignore[no-untyped-call]
    return ("tarindex-shm-v1", manager, handle, int(size))


def _open_by_name(ref: tuple[str, bytes, bytes, int]) -> torch.Tensor:
    from torch.multiprocessing.reductions import rebuild_storage_filename

    _, manager, handle, size = ref
    storage = rebuild_storage_filename(  # type: ignore[no-untyped-call]
        torch.UntypedStorage, manager, handle, size
    )
    return torch.empty(0, dtype=torch.uint8).set_(storage)


class BatchedSamples:
    """A batch of raw samples: one ``uint8`` buffer, offsets per extension, ``int64`` labels.

    Made by :func:`fetch_batched` (via ``TarDataset(batched=True)``) or :func:`collate_batched`;
    picklable, and cheap to send from a DataLoader worker (one shared-memory tensor plus small
    numpy arrays). It deliberately has no ``__getitem__``: passing it to the default collate by
    mistake fails loudly instead of producing a wrong batch.

    Attributes:
        fields: Extensions stored in :attr:`data`, in order of first appearance in the batch.
        data: ``torch.uint8`` tensor of shape ``(nbytes,)``: the members' bytes, field by field
            (all samples of ``fields[0]``, then of ``fields[1]``, ...).
        keys: Sample keys, ``len(batch)`` strings.
        shards: Shard path of each sample (``None`` when unknown).
    """

    __slots__ = ("fields", "data", "keys", "shards", "_offsets", "_present", "_index", "_ints")

    def __init__(
        self,
        fields: Sequence[str],
        data: torch.Tensor,
        offsets: NDArray[np.int64],
        present: NDArray[np.bool_],
        keys: list[str],
        index: NDArray[np.int64],
        ints: dict[str, NDArray[np.int64]],
        shards: list[str | None],
    ) -> None:
        self.fields = tuple(fields)
        self.data = data
        self.keys = keys
        self.shards = shards
        self._offsets = offsets
        self._present = present
        self._index = index
        self._ints = ints

    # -- shape -------------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self.keys)

    def __repr__(self) -> str:
        ints = ", ".join(self._ints)
        return (
            f"BatchedSamples({len(self)} samples, fields={list(self.fields)}, ints=[{ints}], "
            f"{int(self.data.numel())} bytes)"
        )

    # -- columns -----------------------------------------------------------------------------
    @property
    def index(self) -> torch.Tensor:
        """Global index of each sample: ``torch.int64``, shape ``(B,)`` (``-1`` if unknown)."""
        return torch.from_numpy(self._index)

    @property
    def cls(self) -> torch.Tensor:
        """The ``cls`` labels: ``torch.int64``, shape ``(B,)``; ``-1`` where a sample has none.

        Raises:
            KeyError: If no sample of the batch has a ``cls`` member.
        """
        return self.ints("cls")

    def ints(self, ext: str) -> torch.Tensor:
        """An integer field (:data:`INT_FIELDS`): ``torch.int64``, ``(B,)``, ``-1`` if missing.

        Raises:
            KeyError: If the field is not an integer field of this batch.
        """
        return torch.from_numpy(self._ints[ext])

    @property
    def int_fields(self) -> tuple[str, ...]:
        """Names of the integer fields of this batch."""
        return tuple(self._ints)

    def offsets(self, ext: str) -> torch.Tensor:
        """Byte offsets of field ``ext`` in :attr:`data`: ``torch.int64``, shape ``(B + 1,)``.

        Sample ``b``'s member is ``data[offsets[b]:offsets[b + 1]]`` (empty where missing).

        Raises:
            KeyError: If no sample of the batch has that extension.
        """
        return torch.from_numpy(self._offsets[self._field(ext)])

    def lengths(self, ext: str) -> torch.Tensor:
        """Byte length of field ``ext`` per sample: ``torch.int64``, shape ``(B,)``."""
        o = self._offsets[self._field(ext)]
        return torch.from_numpy(o[1:] - o[:-1])

    def present(self, ext: str) -> torch.Tensor:
        """Which samples have a member ``ext``: ``torch.bool``, shape ``(B,)``."""
        if ext in self._ints:
            return torch.from_numpy(self._ints[ext] >= 0)
        return torch.from_numpy(self._present[self._field(ext)].copy())

    # -- per sample --------------------------------------------------------------------------
    def tensor(self, ext: str, b: int) -> torch.Tensor:
        """Sample ``b``'s member ``ext`` as a zero-copy ``torch.uint8`` view of :attr:`data`.

        Raises:
            KeyError: If sample ``b`` has no member ``ext``.
        """
        f = self._field(ext)
        if not self._present[f, b]:
            raise KeyError(f"sample {b} ({self.keys[b]!r}) has no member {ext!r}")
        o = self._offsets[f]
        return self.data[int(o[b]) : int(o[b + 1])]

    def view(self, ext: str, b: int) -> memoryview:
        """Sample ``b``'s member ``ext`` as a zero-copy read-only ``memoryview``.

        Raises:
            KeyError: If sample ``b`` has no member ``ext``.
        """
        view: memoryview = memoryview(self.tensor(ext, b).numpy()).toreadonly()  # type: ignore[arg-type]
        return view

    def bytes(self, ext: str, b: int) -> bytes:
        """Sample ``b``'s member ``ext`` as ``bytes`` (a copy).

        Raises:
            KeyError: If sample ``b`` has no member ``ext``.
        """
        return self.tensor(ext, b).numpy().tobytes()

    def sample(self, b: int) -> Sample:
        """Sample ``b`` as the dict :class:`TarDataset` would return (``bytes`` per extension).

        Integer fields come back as their decimal text, as stored in the tar.
        """
        out: Sample = {"__key__": self.keys[b]}
        if self.shards[b] is not None:
            out["__shard__"] = self.shards[b]
        if self._index[b] >= 0:
            out["__index__"] = int(self._index[b])
        for f, ext in enumerate(self.fields):
            if self._present[f, b]:
                o = self._offsets[f]
                out[ext] = self.data[int(o[b]) : int(o[b + 1])].numpy().tobytes()
        for ext, vals in self._ints.items():
            if vals[b] >= 0:
                out[ext] = str(int(vals[b])).encode()
        return out

    def __iter__(self) -> Iterator[Sample]:
        """Iterate over the samples as dicts (see :meth:`sample`)."""
        return (self.sample(b) for b in range(len(self)))

    def pin_memory(self) -> BatchedSamples:
        """Return a copy with :attr:`data` in pinned memory (``DataLoader(pin_memory=True)``)."""
        return BatchedSamples(
            self.fields,
            self.data.pin_memory(),
            self._offsets,
            self._present,
            self.keys,
            self._index,
            self._ints,
            self.shards,
        )

    def _field(self, ext: str) -> int:
        try:
            return self.fields.index(ext)
        except ValueError:
            fields = list(self.fields)
            raise KeyError(f"no field {ext!r} in this batch (fields: {fields})") from None

    # -- pickling (slots) --------------------------------------------------------------------
    def __getstate__(self) -> dict[str, Any]:
        state = {k: getattr(self, k) for k in self.__slots__}
        ref = _share_by_name(self.data)  # a worker's buffer goes by name, see _alloc
        if ref is not None:
            state["data"] = ref
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        if isinstance(state["data"], tuple):
            state["data"] = _open_by_name(state["data"])
        for k, v in state.items():
            object.__setattr__(self, k, v)


def _layout(
    fields: list[str], members: list[tuple[int, int, int]], n: int
) -> tuple[NDArray[np.int64], NDArray[np.bool_], NDArray[np.int64]]:
    """Field-major layout: ``(offsets (F, n+1), present (F, n), dst cum (F*n+1,))``.

    ``members`` is ``[(field, sample, size), ...]``.
    """
    nf = len(fields)
    lengths = np.zeros((nf, n), np.int64)
    present = np.zeros((nf, n), np.bool_)
    if members:
        arr = np.asarray(members, np.int64)
        lengths[arr[:, 0], arr[:, 1]] = arr[:, 2]
        present[arr[:, 0], arr[:, 1]] = True
    cum = np.zeros(nf * n + 1, np.int64)
    np.cumsum(lengths.ravel(), out=cum[1:])
    offsets = np.empty((nf, n + 1), np.int64)
    for f in range(nf):
        offsets[f] = cum[f * n : f * n + n + 1]
    return offsets, present, cum


def fetch_batched(
    shards: ShardSet, indices: Sequence[int], int_fields: Sequence[str] = INT_FIELDS
) -> BatchedSamples:
    """Read samples ``indices`` of ``shards`` straight into one :class:`BatchedSamples`.

    No per-sample dict and no per-member ``bytes`` object is made: member ranges come from the
    index tables and are copied once, from the mmapped tar into the batch buffer (in shared
    memory when called in a DataLoader worker).

    Args:
        shards: The shards (``TarDataset.shards``).
        indices: Global sample indices; negative ones count from the end.
        int_fields: Extensions parsed as decimal integers into ``int64`` columns instead of
            being stored as bytes. Defaults to :data:`INT_FIELDS` (``("cls",)``).

    Returns:
        The batch, samples in the order of ``indices``.

    Raises:
        SampleIndexError: If an index is out of range.
        TruncatedError: If a member's byte range runs past the end of its tar.
        ValueError: If an integer field does not hold a decimal integer.
    """
    n_total = len(shards)
    idx = np.asarray(indices, dtype=np.int64).reshape(-1)
    idx = np.where(idx < 0, idx + n_total, idx)
    if idx.size and (int(idx.min()) < 0 or int(idx.max()) >= n_total):
        bad = int(idx[(idx < 0) | (idx >= n_total)][0])
        raise SampleIndexError(f"sample index {bad} out of range for {n_total} samples")
    n = int(idx.size)
    sid = np.searchsorted(shards.starts, idx, side="right") - 1
    local = idx - shards.starts[sid]
    int_set = frozenset(int_fields)
    fields: list[str] = []
    bufs: list[list[Any]] = []  # one per field: views of its members, sample after sample
    lens: list[list[int]] = []  # one per field: member length per sample (-1: missing)
    ints: dict[str, NDArray[np.int64]] = {}
    keys: list[str] = []
    # Per shard of the batch: its reader, a view of its mmap, its ext id -> (field, name) map.
    # Readers are looked up once per shard when every shard fits in the open-shard bound
    # (nothing can be evicted mid-batch), else through the LRU for every sample. A view kept
    # on a reader the LRU closes keeps that mmap alive (close() leaves an exported mmap open).
    cached = shards.n_shards <= shards.max_open
    readers: dict[int, Any] = {}
    srcs: dict[int, memoryview | None] = {}
    emaps: dict[int, list[tuple[int, str]]] = {}
    try:
        for b, (s, j) in enumerate(zip(sid.tolist(), local.tolist(), strict=True)):
            r = readers.get(s) if cached else None
            if r is None:
                r = shards.reader(s)
                readers[s] = r
            emap = emaps.get(s)
            if emap is None:
                emap = emaps[s] = []
                for ext in r.exts:
                    if ext in int_set:
                        emap.append((-1, ext))
                        if ext not in ints:
                            ints[ext] = np.full(n, -1, np.int64)
                    else:
                        if ext not in fields:
                            fields.append(ext)
                            bufs.append([])
                            lens.append([-1] * n)
                        emap.append((fields.index(ext), ext))
                srcs[s] = memoryview(r._mm) if r._mm is not None else None
            src = srcs[s]
            limit = r.tar_size
            kp = r._key_ptr
            key = bytes(r._key_blob[kp[j] : kp[j + 1]])
            keys.append(key.decode("utf-8", "surrogateescape"))
            sp, offs, sizes, eids = r._sample_ptr, r._offset, r._size, r._ext_id
            for m in range(sp[j], sp[j + 1]):
                f, ext = emap[eids[m]]
                off = offs[m]
                end = off + sizes[m]
                if src is not None and end <= limit:
                    chunk: Any = src[off:end]
                else:
                    chunk = r.read(off, end - off)  # pread path, or TruncatedError
                if f >= 0:
                    bufs[f].append(chunk)
                    lens[f][b] = end - off
                else:
                    try:
                        ints[ext][b] = int(bytes(chunk))
                    except ValueError:
                        raise ValueError(
                            f"{r.tar_path}: byte {off}: member {keys[b]}.{ext} is not a decimal "
                            f"integer; pass int_fields=() to keep it as bytes"
                        ) from None
        chunk = None
        nf = len(fields)
        length = np.asarray(lens, np.int64).reshape(nf, n)
        present = length >= 0
        np.maximum(length, 0, out=length)
        cum = np.zeros(nf * n + 1, np.int64)
        np.cumsum(length.ravel(), out=cum[1:])
        offsets = np.empty((nf, n + 1), np.int64)
        for f in range(nf):
            offsets[f] = cum[f * n : f * n + n + 1]
        data = _alloc(int(cum[-1]))
        out = memoryview(data.numpy())  # type: ignore[arg-type]
        # The one copy: mmapped tar -> batch buffer (shared memory in a worker).
        d = 0
        for views in bufs:
            for v in views:
                e = d + len(v)
                out[d:e] = v
                d = e
        bufs.clear()
    finally:
        for v in srcs.values():
            if v is not None:
                v.release()
    paths = shards.paths
    return BatchedSamples(
        fields, data, offsets, present, keys, idx, ints, [paths[s] for s in sid.tolist()]
    )


def pack_samples(
    samples: Sequence[Sample], int_fields: Sequence[str] = INT_FIELDS
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
    members: list[tuple[int, int, int]] = []
    values: list[tuple[int, int, Any]] = []
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
            mv = memoryview(v).cast("B")  # type: ignore[arg-type]
            members.append((f, b, mv.nbytes))
            values.append((f, b, mv))
    offsets, present, cum = _layout(fields, members, n)
    data = _alloc(int(cum[-1]))
    out = data.numpy()
    for f, b, mv in values:
        d = int(cum[f * n + b])
        out[d : d + mv.nbytes] = np.frombuffer(mv, np.uint8)
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


# -- streaming: batches packed straight from block reads ---------------------------------------


class _Window:
    """Index rows and source buffers of consecutive stream positions, read piece by piece.

    Built by :meth:`_PiecePacker.read` for one window of a :class:`TarIterableDataset` worker
    (or one batch when not mixing). Per member: source buffer, offset in it, size, field code
    and parsed integer (integer fields only); per position: member range, key, global index,
    shard, and whether it could be read. No member bytes are copied here.
    """

    __slots__ = (
        "srcs",
        "m_src",
        "m_off",
        "m_size",
        "m_code",
        "m_int",
        "mptr",
        "keys",
        "index",
        "sid",
        "valid",
        "all_valid",
    )

    m_src: NDArray[np.int64]
    m_off: NDArray[np.int64]
    m_size: NDArray[np.int64]
    m_code: NDArray[np.int64]
    m_int: NDArray[np.int64]
    mptr: NDArray[np.int64]
    keys: list[str]
    index: NDArray[np.int64]
    sid: NDArray[np.int64]
    valid: NDArray[np.bool_]
    all_valid: bool

    def __init__(self) -> None:
        self.srcs: list[Any] = []

    def release(self) -> None:
        """Drop the source views (an mmap with live views cannot be closed by the LRU)."""
        for v in self.srcs:
            if isinstance(v, memoryview):
                v.release()
        self.srcs = []


class _PiecePacker:
    """Reads planned pieces into :class:`_Window` tables and packs them into batches.

    Pieces are ``(shard, j0, j1)``; :meth:`pack` makes a :class:`BatchedSamples` from window
    positions with one copy per member byte.

    Process-local (field codes, per-shard extension maps); not pickled.
    """

    def __init__(self, shards: ShardSet, int_fields: Sequence[str] = INT_FIELDS) -> None:
        self.shards = shards
        self.int_set = frozenset(int_fields)
        self.names: list[str] = []
        self.is_int: list[bool] = []
        self._codes: dict[str, int] = {}
        self._emaps: dict[int, NDArray[np.int64]] = {}
        self._is_int_arr = np.zeros(0, np.bool_)

    def _code(self, ext: str) -> int:
        c = self._codes.get(ext)
        if c is None:
            c = self._codes[ext] = len(self.names)
            self.names.append(ext)
            self.is_int.append(ext in self.int_set)
            self._is_int_arr = np.asarray(self.is_int, np.bool_)
        return c

    def _emap(self, s: int, exts: list[str]) -> NDArray[np.int64]:
        m = self._emaps.get(s)
        if m is None:
            m = self._emaps[s] = np.asarray([self._code(e) for e in exts], np.int64)
        return m

    def read(
        self,
        pieces: list[list[int]],
        on_error: Any = None,
        willneed: bool = False,
    ) -> _Window:
        """Index rows of ``pieces`` (stream order) plus their source buffers.

        With mmap the source is a view of the mapping (nothing read yet; ``willneed`` asks the
        kernel to read each piece's byte range ahead, sequentially); otherwise one ``pread``
        per piece. A piece that fails raises, or, if ``on_error(s, j0, j1, exc)`` returns,
        becomes positions marked invalid.
        """
        win = _Window()
        m_src, m_off, m_size, m_code, m_int, counts = [], [], [], [], [], []
        keys: list[str] = []
        index, sid, valid = [], [], []
        views: dict[int, int] = {}  # shard -> position of its mmap view in win.srcs
        starts = self.shards.starts
        for s, j0, j1 in pieces:
            k = j1 - j0
            try:
                got = self._read_piece(win, views, s, j0, j1, willneed)
            except Exception as e:
                if on_error is None:
                    raise
                on_error(s, j0, j1, e)
                counts.append(np.zeros(k, np.int64))
                keys.extend([""] * k)
                index.append(np.full(k, -1, np.int64))
                sid.append(np.full(k, s, np.int64))
                valid.append(np.zeros(k, np.bool_))
                continue
            src_id, off, size, code, ints, cnt, ks = got
            m_src.append(np.full(len(off), src_id, np.int64))
            m_off.append(off)
            m_size.append(size)
            m_code.append(code)
            m_int.append(ints)
            counts.append(cnt)
            keys.extend(ks)
            index.append(int(starts[s]) + j0 + np.arange(k, dtype=np.int64))
            sid.append(np.full(k, s, np.int64))
            valid.append(np.ones(k, np.bool_))

        def cat(xs: list[Any], dt: Any) -> Any:
            return np.concatenate(xs) if xs else np.zeros(0, dt)

        win.m_src, win.m_off, win.m_size = (
            cat(m_src, np.int64),
            cat(m_off, np.int64),
            cat(m_size, np.int64),
        )
        win.m_code, win.m_int = cat(m_code, np.int64), cat(m_int, np.int64)
        cnt_all = cat(counts, np.int64)
        win.mptr = np.zeros(len(cnt_all) + 1, np.int64)
        np.cumsum(cnt_all, out=win.mptr[1:])
        win.keys = keys
        win.index, win.sid = cat(index, np.int64), cat(sid, np.int64)
        win.valid = cat(valid, np.bool_)
        win.all_valid = bool(win.valid.all())
        return win

    def _read_piece(
        self, win: _Window, views: dict[int, int], s: int, j0: int, j1: int, willneed: bool
    ) -> tuple[int, Any, Any, Any, Any, Any, list[str]]:
        r = self.shards.reader(s)
        t = r.index
        sp = t.sample_ptr[j0 : j1 + 1].astype(np.int64)
        lo, hi = int(sp[0]), int(sp[-1])
        off = t.offset[lo:hi].astype(np.int64)
        size = t.size[lo:hi].astype(np.int64)
        code = self._emap(s, r.exts)[t.ext_id[lo:hi].astype(np.int64)]
        a = int(off.min()) if hi > lo else 0
        b = int((off + size).max()) if hi > lo else 0
        mm = r._mm
        if mm is not None and b <= r.tar_size:
            src_id = views.get(s)
            if src_id is None:
                src_id = views[s] = len(win.srcs)
                win.srcs.append(memoryview(mm))
            if willneed and b > a:
                try:
                    p0 = a - a % mmap.PAGESIZE
                    mm.madvise(mmap.MADV_WILLNEED, p0, b - p0)
                except (AttributeError, OSError, ValueError):
                    pass
        else:
            src_id = len(win.srcs)
            win.srcs.append(memoryview(r.read(a, b - a)))  # one pread, or TruncatedError
            off = off - a
        kp = t.key_ptr[j0 : j1 + 1].astype(np.int64)
        k0 = int(kp[0])
        kpl = (kp - k0).tolist()
        blob = bytes(t.key_blob[k0 : int(kp[-1])])
        n = j1 - j0
        if blob.isascii():
            text = blob.decode("ascii")
            ks = [text[kpl[i] : kpl[i + 1]] for i in range(n)]
        else:
            ks = [blob[kpl[i] : kpl[i + 1]].decode("utf-8", "surrogateescape") for i in range(n)]
        ints = np.full(hi - lo, -1, np.int64)
        if self.int_set and hi > lo:
            src = win.srcs[src_id]
            for m in np.flatnonzero(self._is_int_arr[code]).tolist():
                o = int(off[m])
                try:
                    ints[m] = int(bytes(src[o : o + int(size[m])]))
                except ValueError:
                    j = j0 + int(np.searchsorted(sp, lo + m, side="right")) - 1
                    raise ValueError(
                        f"{r.tar_path}: byte {int(t.offset[lo + m])}: member "
                        f"{ks[j - j0]}.{self.names[int(code[m])]} is not a decimal integer; "
                        f"pass int_fields=() to keep it as bytes"
                    ) from None
        return src_id, off, size, code, ints, np.diff(sp), ks

    def pack(self, parts: list[tuple[_Window, NDArray[np.int64]]]) -> BatchedSamples | None:
        """One batch: positions ``idx`` of each window, in that order (invalid ones left out).

        Returns ``None`` when no position of the batch could be read.
        """
        srcs: list[Any] = []
        mem_src, mem_off, mem_size, mem_code, mem_int, mem_b = [], [], [], [], [], []
        keys: list[str] = []
        index, sid = [], []
        n = 0
        for win, idx in parts:
            if not win.all_valid:
                idx = idx[win.valid[idx]]
            if not len(idx):
                continue
            ms, me = win.mptr[idx], win.mptr[idx + 1]
            cnt = me - ms
            tot = int(cnt.sum())
            first = np.cumsum(cnt) - cnt
            mem = np.repeat(ms - first, cnt) + np.arange(tot, dtype=np.int64)
            mem_src.append(win.m_src[mem] + len(srcs))
            mem_off.append(win.m_off[mem])
            mem_size.append(win.m_size[mem])
            mem_code.append(win.m_code[mem])
            mem_int.append(win.m_int[mem])
            mem_b.append(np.repeat(np.arange(n, n + len(idx), dtype=np.int64), cnt))
            srcs.extend(win.srcs)
            il = idx.tolist()
            wk = win.keys
            keys.extend([wk[i] for i in il])
            index.append(win.index[idx])
            sid.append(win.sid[idx])
            n += len(idx)
        if n == 0:
            return None
        src = np.concatenate(mem_src)
        off = np.concatenate(mem_off)
        size = np.concatenate(mem_size)
        code = np.concatenate(mem_code)
        ival = np.concatenate(mem_int)
        bs = np.concatenate(mem_b)
        is_int = self._is_int_arr[code]
        ints: dict[str, NDArray[np.int64]] = {}
        if is_int.any():
            ic, ib, iv = code[is_int], bs[is_int], ival[is_int]
            for c in sorted(set(ic.tolist()), key=ic.tolist().index):
                col = ints[self.names[c]] = np.full(n, -1, np.int64)
                sel = ic == c
                col[ib[sel]] = iv[sel]
            keep = ~is_int
            src, off, size, code, bs = src[keep], off[keep], size[keep], code[keep], bs[keep]
        uc, firsts = np.unique(code, return_index=True)
        order = uc[np.argsort(firsts)]
        row = np.zeros(len(self.names), np.int64)
        row[order] = np.arange(len(order), dtype=np.int64)
        f = row[code]
        nf = len(order)
        lengths = np.zeros((nf, n), np.int64)
        present = np.zeros((nf, n), np.bool_)
        lengths[f, bs] = size
        present[f, bs] = True
        cum = np.zeros(nf * n + 1, np.int64)
        np.cumsum(lengths.ravel(), out=cum[1:])
        offsets = np.empty((nf, n + 1), np.int64)
        for i in range(nf):
            offsets[i] = cum[i * n : i * n + n + 1]
        dest = cum[f * n + bs]
        data = _alloc(int(cum[-1]))
        out = memoryview(data.numpy())  # type: ignore[arg-type]
        # The one copy: tar (mmap view or block read) -> batch buffer, in file order per source.
        srt = np.lexsort((off, src))
        for si, o, sz, d in zip(
            src[srt].tolist(),
            off[srt].tolist(),
            size[srt].tolist(),
            dest[srt].tolist(),
            strict=True,
        ):
            out[d : d + sz] = srcs[si][o : o + sz]
        paths = self.shards.paths
        return BatchedSamples(
            [self.names[c] for c in order.tolist()],
            data,
            offsets,
            present,
            keys,
            np.concatenate(index),
            ints,
            [paths[s] for s in np.concatenate(sid).tolist()],
        )
