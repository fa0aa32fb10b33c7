"""The per-sample loops' typed structures: a reader's hot tables, and a hand-back.

:class:`HotTables` is everything a read of sample ``j`` of one open shard needs, as
zero-copy views of the mapped index (FORMAT.md §2) and the tar's mapping: the whole
interface between the Python read path (``shardset``, ``batch``) and the per-sample loops
(``kernel.kernel``: ``_kernel.c`` or its twin ``_kernel_py``, chosen once at import; the
loops get the same tables as a ``kernel.kernel.Tables`` and the tar as a
``kernel.kernel.Mapped``, of whichever module runs). A ``NamedTuple``: as fast to unpack as
a plain tuple, typed field by field.

:class:`HandBack` is the one value every loop returns instead of its result when it does not
decide a case itself (the compiled module fetches this class at import and builds its
instances; the twin builds the same), and
:meth:`tarindex.read.pool.ReaderPool.settle` is the one place a caller acts on it.
"""

from __future__ import annotations

import mmap
import sys
from typing import TYPE_CHECKING, Any, Literal, NamedTuple

import numpy as np
from numpy.typing import NDArray

if TYPE_CHECKING:
    from ._kernel import Mapped, Tables
else:
    Mapped = Tables = object

__all__ = ["HotTables", "HandBack", "Mapped", "Packed", "fast_view", "CLOSED"]


class HotTables(NamedTuple):
    """One open shard's tables for the per-sample loops (FORMAT.md §2.2-2.5).

    The ``u8``/``u4`` views index to Python ints (``memoryview.cast``: about 3x faster than
    numpy scalars); the ``*_raw`` views are the same tables as bytes, so a sample's run of
    entries is copied with one slice. Every entry of a chunk is trusted only once its flag in
    :attr:`checked` is set (the chunk guard, :func:`tarindex.read.checks.check_chunk`).
    """

    checked: bytearray
    """One flag per chunk of ``CHUNK`` samples: 1 once its tables passed the guards."""
    key_ptr: memoryview
    """``u8 (n + 1,)``: key ``j`` is ``keys[key_base + key_ptr[j] : key_base + key_ptr[j + 1]]``."""
    sample_ptr: memoryview
    """``u8 (n + 1,)``: sample ``j`` owns members ``sample_ptr[j] <= m < sample_ptr[j + 1]``."""
    keys: bytes | mmap.mmap
    """The buffer holding the key blob (the index mapping, or a copy of the blob)."""
    key_base: int
    """Where the key blob starts in :attr:`keys` (bytes)."""
    exts: tuple[str, ...]
    """Extension names by id (FORMAT.md §2.4)."""
    ext_id: memoryview
    """``u4 (m,)``: each member's extension id."""
    offset: memoryview
    """``u8 (m,)``: each member's data offset in the tar (bytes)."""
    size: memoryview
    """``u8 (m,)``: each member's size (bytes)."""
    mm: Mapped | None  # noqa: UP007 (a runtime alias under TYPE_CHECKING only)
    """The tar's mapping as the kernel's ``Mapped`` (``kernel.kernel.Mapped``: slices are
    copies made in the fault guard, or ``pread`` in the twin; ``check()`` is the cut and
    change check), or ``None`` (``pread``, remote)."""
    tar_size: int
    """The tar's size when opened (bytes)."""
    offset_raw: memoryview
    """:attr:`offset` as little-endian bytes."""
    size_raw: memoryview
    """:attr:`size` as little-endian bytes."""
    ext_id_raw: memoryview
    """:attr:`ext_id` as little-endian bytes."""
    scalar: bool
    """Reads are slices of :attr:`mm` (mapped, no ``verify_data``): the one-sample loops apply."""
    tables: Tables | None  # noqa: UP007 (a runtime alias under TYPE_CHECKING only)
    """The same tables as ``kernel.kernel.Tables`` (compiled or twin) for the one-sample loops,
    or ``None`` (pread, remote, ``verify_data``: the reader's own path)."""


class HandBack(NamedTuple):
    """What a kernel loop returns instead of its result: the case it leaves to Python.

    Every entry point of ``kernel.kernel`` (``sample``, ``take``, ``batch``, ``gather``,
    ``pack``, ``Tables.samples``) returns its result or one of these;
    :meth:`tarindex.read.pool.ReaderPool.settle` acts on it (opens the shard, checks the chunk)
    and says whether to run the loop again or take the Python path, which reads the case or
    raises the error that names it (docs/READING.md, "Compiled loops").
    """

    why: Literal["open", "check", "python"]
    """``"open"``: shard :attr:`shard` has no open reader; ``"check"``: chunk :attr:`chunk` of
    shard :attr:`shard` has not passed the chunk guard yet; ``"python"``: anything else (not
    mapped, an index out of range or not an ``int``, a bound that does not hold, an integer
    member that is not a plain decimal): the Python path decides."""
    shard: int
    """The shard to open or whose chunk to check; ``-1`` with ``"python"``."""
    chunk: int
    """The chunk to check (samples ``chunk << CHUNK_SHIFT`` on); ``-1`` unless ``"check"``."""
    at: int
    """Where the loop stopped: the position in the call's input (an index of ``take``'s and
    ``batch``'s ``indices``, a sample of ``gather``'s batch, a member of ``pack``'s, a sample
    of ``Tables.samples``' block counted from ``j0``); ``0`` for a one-sample call."""


Packed = tuple[
    Any, list[str], list[str], list[str], bytearray, bytearray, bytearray, bytearray, list[str]
]
"""The kernel's ``batch`` result: ``(keep, keys, byte_fields, int_fields, offsets, present,
ints, index, shards)`` (:func:`tarindex.read.batch.gather_packed` says what each holds)."""


def fast_view(a: NDArray[np.unsignedinteger[Any]]) -> memoryview:
    """A zero-copy view of a little-endian ``u8``/``u4`` table that indexes to Python ints."""
    if sys.byteorder != "little":  # a native copy (big-endian hosts: the Python loops only)
        a = a.astype(a.dtype.newbyteorder("="))
    return memoryview(a).cast("B").cast("Q" if a.dtype.itemsize == 8 else "I")  # type: ignore[arg-type]


def raw_view(a: NDArray[np.unsignedinteger[Any]]) -> memoryview:
    """The bytes of a table (little-endian, as in the index file)."""
    return memoryview(a).cast("B")  # type: ignore[arg-type]


_EMPTY = memoryview(b"")
CLOSED = HotTables(
    bytearray(1),
    _EMPTY,
    _EMPTY,
    b"",
    0,
    (),
    _EMPTY,
    _EMPTY,
    _EMPTY,
    None,
    0,
    _EMPTY,
    _EMPTY,
    _EMPTY,
    False,
    None,
)
"""The tables of a closed reader: no buffer held, every chunk unchecked."""
