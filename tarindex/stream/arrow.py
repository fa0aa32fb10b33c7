"""Contiguous sample ranges as Arrow tables: what every engine's read task runs (docs/SCALE.md).

A dataset of ``n`` samples is cut into read tasks of contiguous *global* sample ranges
(:func:`cut_ranges`), not into shards, so 4 shards can feed 64 tasks and a task may span the
end of one shard and the start of the next. A task reads its range in blocks of ``block_rows``
samples through the read kernel (:meth:`~tarindex.read.ShardSet.read_block`, only the members
``fields`` names), lays each block out field-major (:func:`~tarindex.stream.pack.pack_layout`),
wraps Arrow columns around the buffer and then copies each member byte into it once
(:meth:`~tarindex.stream.pack.PackLayout.fill`): no other copy, one table per block, never
one per sample.

Columns (:func:`arrow_schema`): ``__key__`` (``string``), ``__index__`` (``int64``, the global
sample index), then one column per extension: ``int64`` for ``int_fields`` (decimal text, as
``cls`` is written), ``binary`` (the member's bytes as stored) for the others; null where a
sample has no such member. Needs ``pyarrow`` (imported when called).
"""

from __future__ import annotations

import os
import secrets
import threading
from collections import OrderedDict
from collections.abc import Callable, Collection, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import NDArray

from ..errors import FormatError
from ..format.url import is_url
from ..plan.checks import check_int
from ..plan.epoch import worker_shares
from ..read import Block, OpenOptions, ShardSet
from ..read.fields import Fields, check_fields
from ..read.keys import key_bytes
from ..storage.remote import RemoteOptions
from .pack import INT_FIELDS, numpy_alloc, pack_layout

__all__ = [
    "BLOCK_ROWS",
    "INT_FIELDS",
    "KEY",
    "INDEX",
    "OpenSpec",
    "arrow_schema",
    "block_table",
    "bytes_per_sample",
    "columns_of",
    "cut_ranges",
    "read_range",
    "samples_of",
]

BLOCK_ROWS = 1024
"""Default samples per Arrow table a read task yields."""
KEY = "__key__"
"""The key column (``string``)."""
INDEX = "__index__"
"""The global sample index column (``int64``)."""
_MAX_BINARY = (1 << 31) - 1  # Arrow ``binary`` offsets are int32
_INT64: Any = None  # pyarrow's int64, binary and string types, made once (pyarrow imported
_BINARY: Any = None  # when called)
_STRING: Any = None


@dataclass(frozen=True)
class OpenSpec:
    """How an engine's read task opens the dataset in its worker: small, pickled per task.

    Made on the driver (:meth:`of`: local paths made absolute, since workers run in other
    directories); :meth:`open` returns the worker process's :class:`~tarindex.read.ShardSet`
    of it, opened once per process (a worker runs many tasks) and never shared with another
    read (each spec has its own token: a later read of a rewritten dataset reopens it).
    """

    token: str
    """Unique per spec."""
    source: Any
    """The shards, as :class:`~tarindex.read.ShardSet` takes them (local paths absolute)."""
    remote: RemoteOptions
    """How remote shards are read."""
    options: OpenOptions
    """How the ShardSet opens and checks the shards."""

    @classmethod
    def of(
        cls, source: Any, remote: RemoteOptions | None = None, options: OpenOptions | None = None
    ) -> OpenSpec:
        """A new spec (a new token) of ``source``, its local paths made absolute."""
        src = [_absolute(p) for p in source] if isinstance(source, (list, tuple)) else _absolute(source)
        return cls(
            secrets.token_hex(8), src, remote or RemoteOptions(), options or OpenOptions()
        )

    def open(self) -> ShardSet:
        """This process's ShardSet of this spec (the last :data:`KEEP_OPEN` specs stay open)."""
        with _OPEN_LOCK:
            got = _OPEN.get(self.token)
            if got is None:
                got = _OPEN[self.token] = ShardSet(self.source, options=self.options, remote=self.remote)
                while len(_OPEN) > KEEP_OPEN:
                    _OPEN.popitem(last=False)[1].close()
            _OPEN.move_to_end(self.token)
            return got


KEEP_OPEN = 4
"""Datasets a worker process keeps open (each holds at most ShardSet's ``max_open`` shards)."""
_OPEN: OrderedDict[str, ShardSet] = OrderedDict()
_OPEN_LOCK = threading.Lock()


def _absolute(p: Any) -> Any:
    p = os.fspath(p) if isinstance(p, os.PathLike) else p
    return os.path.abspath(p) if isinstance(p, str) and not is_url(p) else p


def cut_ranges(n_samples: int, tasks: int, min_rows: int = BLOCK_ROWS) -> list[tuple[int, int]]:
    """Cut samples ``0 .. n_samples - 1`` into contiguous ``[start, stop)`` ranges, one per task.

    ``k = min(tasks, ceil(n_samples / min_rows))`` ranges (at least one when there are
    samples), of equal sizes up to one sample (the first ``n_samples % k`` one larger). Shard
    boundaries play no part: read parallelism is not capped by the number of shards.

    Args:
        n_samples: Samples in the dataset, ``>= 0``.
        tasks: Ranges wanted, ``>= 1`` (an engine's requested parallelism).
        min_rows: Samples a range should hold at least (so a task yields full blocks),
            ``>= 1``. Defaults to :data:`BLOCK_ROWS`.

    Returns:
        The ranges in order; ``[]`` when ``n_samples == 0``.

    Raises:
        ValueError: If an argument is not an integer in its range.
    """
    n = check_int("n_samples", n_samples, 0)
    t = check_int("tasks", tasks, 1)
    m = check_int("min_rows", min_rows, 1)
    if n == 0:
        return []
    k = max(1, min(t, -(-n // m)))
    stops = np.cumsum(worker_shares(n, k)).tolist()
    return list(zip([0, *stops[:-1]], stops, strict=True))


def columns_of(shards: ShardSet, fields: Fields = None) -> list[str]:
    """The member columns of a dataset: ``fields`` in order, or the first shard's extensions.

    Without ``fields``, the extensions of the first non-empty shard's index (in its
    extension table's order, FORMAT.md §2.4): opening that one shard is the only read. A
    read task that meets a member outside these columns raises (:func:`block_table`).

    Raises:
        ValueError: If a field name starts with ``__`` (those are the key and index columns).
    """
    got = check_fields(fields)
    if got is not None:
        names = list(got)
        bad = [f for f in names if f.startswith("__")]
        if bad:
            raise ValueError(f"fields={bad!r}: names starting with '__' are not member fields")
        return names
    for s in range(shards.n_shards):
        if shards.counts[s]:
            return [e for e in shards.reader(s).exts if not e.startswith("__")]
    return []


def bytes_per_sample(shards: ShardSet, columns: Sequence[str]) -> float:
    """Estimated bytes of one sample's ``columns`` (plus key and index), from the first shard.

    The first non-empty shard's index only (no member read): its selected members' bytes
    per sample. ``0.0`` for an empty dataset. An engine's estimate of its in-memory size.
    """
    for s in range(shards.n_shards):
        n = int(shards.counts[s])
        if n:
            r = shards.reader(s)
            blk = r.read_block(0, n, list(columns), data=False)
            return (float(blk.size.sum()) + sum(map(len, blk.keys))) / n + 16.0
    return 0.0


def arrow_schema(columns: Sequence[str], int_fields: Collection[str] = INT_FIELDS) -> Any:
    """The ``pyarrow.Schema`` of :func:`block_table`'s tables for these member columns."""
    import pyarrow as pa  # type: ignore[import-untyped,unused-ignore]

    ints = frozenset(int_fields)
    return pa.schema(
        [pa.field(KEY, pa.string(), nullable=False), pa.field(INDEX, pa.int64(), nullable=False)]
        + [pa.field(c, pa.int64() if c in ints else pa.binary()) for c in columns]
    )


def block_table(
    shards: ShardSet,
    start: int,
    stop: int,
    columns: Sequence[str],
    int_fields: Collection[str] = INT_FIELDS,
    every_member: bool = False,
    schema: Any = None,
) -> Any:
    """Read global samples ``start <= i < stop`` into one ``pyarrow.Table`` (:func:`arrow_schema`).

    Each shard's part is one :meth:`~tarindex.read.ShardSet.read_block` of ``columns`` only
    (the other members' bytes are not read), or of every member with ``every_member`` (the
    columns were not asked for but taken from the first shard: a member outside them is
    reported, not dropped). The parts are laid out field-major
    (:func:`~tarindex.stream.pack.pack_layout`) and every column is made from buffers, with
    no Python object per sample: each binary column is a zero-copy view of the batch buffer
    with its ``int32`` offsets, the key column one UTF-8 buffer and its offsets, an
    ``int_fields`` column the ``int64`` array the copy pass parses into. The copy pass
    (one copy per member byte, :meth:`~tarindex.stream.pack.PackLayout.fill`) runs last, so
    the wrapping runs before the caches hold the block's bytes rather than after.

    Args:
        shards: The dataset.
        start: First global sample.
        stop: End global sample (exclusive).
        columns: The member columns, in order (:func:`columns_of`).
        int_fields: Extensions read as ``int64``. Defaults to :data:`INT_FIELDS`.
        every_member: Read every member and refuse one outside ``columns``. Defaults to
            ``False``.
        schema: ``arrow_schema(columns, int_fields)``, made once by a caller that reads many
            blocks. Defaults to ``None`` (made here).

    Raises:
        SampleIndexError: If the range is outside the dataset.
        FormatError: A member whose extension is not a column (the message names the shard,
            the extension and the fix: ``fields=``), an ``int_fields`` member that is not a
            decimal integer (names the shard, the byte offset and the fix: ``int_fields=()``),
            a column of one table over 2 GiB (lower ``block_rows``), a key that is not UTF-8,
            or a corrupt index (as the read kernel).
    """
    import pyarrow as pa

    global _INT64, _BINARY, _STRING
    if _INT64 is None:
        _INT64, _BINARY, _STRING = pa.int64(), pa.binary(), pa.string()
    parts = []
    key_parts = []
    want = None if every_member else frozenset(columns)  # one hash lookup per read_block
    i = start
    while i < stop:
        s, j = shards.locate(i)
        j1 = min(int(shards.counts[s]), j + (stop - i))
        parts.append(shards.read_block(s, j, j1, want))
        key_parts.append(key_bytes(shards.reader(s), j, j1))
        i += j1 - j
    blk = Block.concat(parts)
    key_col = _keys(key_parts, blk)  # while the key bytes read_block decoded are in the caches
    ints = frozenset(int_fields)
    lay = pack_layout([(blk, None)], None, ints, columns)  # no sort for the fields' order
    if lay is None:
        raise ValueError(f"block_table: no samples in {start}..{stop - 1}")
    extra = [f for f in [*lay.fields, *lay.ints] if f not in columns]
    if extra:
        k = int(np.flatnonzero(_has(blk, extra[0]))[0])
        raise FormatError(
            f"{lay.shards[k]}: sample {lay.keys[k]!r} has a {extra[0]!r} member, not one of the "
            f"columns {list(columns)} (taken from the first shard); pass fields=(...) naming "
            f"every extension to read"
        )
    # Every column is wrapped around its buffer first and the members are copied into it
    # last (lay.fill): these small steps then run on warm caches, not on the ones the copy
    # of the block's megabytes has just emptied (measured 21 us against 125 us a block).
    n = len(lay.keys)
    keep, view = numpy_alloc(lay.nbytes)
    buf = pa.py_buffer(keep)
    off = lay.offsets
    bounds = off[:, ::n].tolist()  # each byte column's [lo, hi) in the buffer (n + 1 columns)
    for f, (lo, hi) in enumerate(bounds):
        if hi - lo > _MAX_BINARY:
            raise FormatError(
                f"{lay.shards[0]}: column {lay.fields[f]!r} of samples {start}..{stop - 1} "
                f"holds {hi - lo} bytes, over Arrow binary's 2 GiB; pass a smaller block_rows"
            )
    # each column's offsets from 0, as int32 in one pass (in range: no column is over 2 GiB)
    rel = pa.py_buffer(np.subtract(off, off[:, :1], dtype=np.int32, casting="same_kind"))
    full = [k == n for k in lay.field_counts()]
    step = 4 * (n + 1)
    arrays: list[Any] = [  # pa.array of the index measured ~1 ms a block here, this ~10 us
        key_col,
        pa.Array.from_buffers(
            _INT64, n, [None, pa.py_buffer(np.ascontiguousarray(lay.global_index, np.int64))]
        ),
    ]
    for c in columns:
        if c in lay.ints:  # lay.fill parses the members into this buffer
            has = lay.int_present(c)
            valid = None if has is None else _validity(has)
            arrays.append(pa.Array.from_buffers(_INT64, n, [valid, pa.py_buffer(lay.ints[c])]))
        elif c not in lay.fields:
            arrays.append(pa.nulls(n, _INT64 if c in ints else _BINARY))
        else:
            f = lay.fields.index(c)
            lo, hi = bounds[f]
            valid = None if full[f] else _validity(lay.present[f])
            arrays.append(
                pa.Array.from_buffers(
                    _BINARY, n, [valid, rel.slice(f * step, step), buf.slice(lo, hi - lo)]
                )
            )
    table = pa.Table.from_arrays(arrays, schema=schema or arrow_schema(columns, int_fields))
    lay.fill(keep, view)
    return table


def _has(blk: Block, ext: str) -> NDArray[np.bool_]:
    """``bool (len(blk),)``: which samples of ``blk`` have an ``ext`` member."""
    got = np.zeros(len(blk), np.bool_)
    rows = np.repeat(np.arange(len(blk)), np.diff(blk.member_ptr))
    got[rows[blk.ext_id == blk.exts.index(ext)]] = True
    return got


def _validity(present: NDArray[np.bool_]) -> Any:
    """Arrow's validity bitmap of ``present`` (``None`` when every value is there)."""
    import pyarrow as pa

    return None if present.all() else pa.py_buffer(np.packbits(present, bitorder="little"))


def _keys(parts: list[tuple[bytes, NDArray[np.int64]]], blk: Block) -> Any:
    """The ``string`` key column: one UTF-8 buffer and its offsets, no Arrow object per key.

    Made from the keys' stored bytes (:func:`~tarindex.read.keys.key_bytes` of each
    part, in order; ``blk`` their samples), checked to be UTF-8 (ASCII, the usual case, at once).

    Raises:
        FormatError: If a key is not UTF-8 (read with ``surrogateescape``, FORMAT.md §2.5).
    """
    import pyarrow as pa

    if len(parts) == 1:
        data, off = parts[0]
    else:
        data = b"".join(b for b, _ in parts)
        base = np.cumsum([0] + [len(b) for b, _ in parts[:-1]])
        off = np.concatenate([parts[0][1][:1]] + [o[1:] + b for (_, o), b in zip(parts, base, strict=True)])
    if not data.isascii():
        try:
            data.decode("utf-8")
        except UnicodeDecodeError as e:
            k = int(np.searchsorted(off, e.start, side="right")) - 1
            raise FormatError(
                f"{blk.paths[int(blk.shard[k])]}: key {blk.keys[k]!r} is not UTF-8; an Arrow "
                f"string column cannot hold it: rename the sample"
            ) from None
    return pa.Array.from_buffers(
        _STRING, len(blk.keys), [None, pa.py_buffer(off.astype(np.int32)), pa.py_buffer(data)]
    )


def read_range(
    shards: ShardSet,
    start: int,
    stop: int,
    columns: Sequence[str],
    int_fields: Collection[str] = INT_FIELDS,
    block_rows: int = BLOCK_ROWS,
    every_member: bool = False,
) -> Iterator[Any]:
    """Yield global samples ``start <= i < stop`` as tables of ``block_rows`` samples.

    An engine's read task: the last table may be shorter. Raises as :func:`block_table`.
    """
    b = check_int("block_rows", block_rows, 1)
    schema = arrow_schema(columns, int_fields)
    for a in range(start, stop, b):
        yield block_table(shards, a, min(stop, a + b), columns, int_fields, every_member, schema)


def samples_of(
    batches: Iterable[Any], key: str = KEY, to_sample: Callable[[int, Any], Any] | None = None
) -> Iterator[Any]:
    """Arrow record batches (or tables) of rows as sample dicts: what an engine's write task writes.

    Column ``key`` is the sample's ``__key__``, every other column one member named by the
    column (encoded by extension when written: ``int`` for ``cls``, ``bytes`` as they are,
    ``str`` UTF-8, dicts as JSON); a null leaves that member out, and columns starting with
    ``__`` (``__index__`` of a table :func:`read_range` made) are not members. With
    ``to_sample``, each row as a dict of its columns instead (``to_sample`` converts it).
    """
    for b in batches:  # column by column: one Python object per value, no Arrow row dict
        names = list(b.schema.names)
        cols = [b.column(i).to_pylist() for i in range(len(names))]
        if to_sample is not None:
            yield from (dict(zip(names, vals, strict=True)) for vals in zip(*cols, strict=True))
            continue
        keys = cols[names.index(key)] if key in names else [None] * b.num_rows
        members = [(n, c) for n, c in zip(names, cols, strict=True) if n != key and not n.startswith("__")]
        for r, k in enumerate(keys):
            s = {"__key__": k}
            for n, c in members:
                v = c[r]
                if v is not None:
                    s[n] = v
            yield s
