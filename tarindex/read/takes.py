"""What the streaming and mixing executors read through: :class:`Takes`.

A :class:`~tarindex.read.sample_source.SampleSource` (a :class:`~tarindex.read.ShardSet` or a
:class:`~tarindex.read.subset.ShardSubset`) is what a user reads samples from: ``sample``,
``get``, ``gather``, ``read_block``, the key lookups. The executors
(:mod:`tarindex.stream.executor`, :mod:`tarindex.stream.readahead`,
:func:`tarindex.stream.pack.fetch_packed`) need more: a window's blocks made ready and its
samples copied out a few at a time, blocks read as dicts, remote blocks queued ahead, a
batch read and packed in one pass, the bound on open shards. Those operations are this
module's :class:`Takes`, the handle :meth:`SampleSource.takes` returns; they are not on the
user-facing objects.

The numbering is the source's (tarindex/read/sample_source.py): positions for :meth:`Takes.take`
and :meth:`Takes.gather_packed`, shard positions ``(s, j0, j1)`` (the view's, over its
``counts``) for the block operations; ``__index__`` of what comes out is the sample's index
in the whole set. A handle holds no state of its own beyond its source's: make one per
iteration (:meth:`SampleSource.takes` is cheap), never pickle it.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import numpy as np
from numpy.typing import NDArray

from ..storage.bytesource import MmapSource, cold_cache
from . import batch, kernel, prefetch
from .fields import Fields, field_set
from .hot import HandBack
from .spanner import check_indices, locate

if TYPE_CHECKING:
    from .block import Sample
    from .pool import ReaderPool
    from .shard import ShardReader
    from .shardset import ShardSet
    from .subset import ShardSubset

__all__ = ["SetTakes", "SubsetTakes", "Takes"]


@runtime_checkable
class Takes(Protocol):
    """The executor-facing reads of a sample source (module docstring).

    Made by :meth:`SampleSource.takes`: :class:`SetTakes` over a ``ShardSet``,
    :class:`SubsetTakes` over a ``ShardSubset``.
    """

    @property
    def open_bound(self) -> int:
        """Open shards this process keeps at most (``max_open`` within the descriptor limit)."""
        ...

    def take_ready(self, pieces: Sequence[Sequence[int]], fields: Fields = None) -> int | None:
        """Prepare blocks ``(s, j0, j1)`` for :meth:`take`: the bytes they span, or ``None``.

        ``None``: read the blocks with :meth:`read_samples` instead.

        Raises:
            FormatError, StaleIndexError: A corrupt chunk of tables.
        """
        ...

    def take(self, indices: list[int]) -> list[Sample]:
        """Samples at positions ``indices``, in order (a streaming window's), as dicts.

        Raises:
            SampleIndexError, FormatError, StaleIndexError, TruncatedError: As
                :meth:`SampleSource.sample`.
        """
        ...

    def read_samples(
        self, s: int, j0: int, j1: int, fields: Fields = None, *, prefetch: bool = False
    ) -> list[Sample]:
        """Shard positions ``j0 <= j < j1`` of shard ``s`` as sample dicts.

        ``read_samples(*src.locate(i), j + 1)`` is ``[src.sample(i)]``: the same numbering.

        Raises:
            SampleIndexError: If the range is outside ``[0, counts[s]]``.
            FormatError, StaleIndexError, TruncatedError: As :meth:`SampleSource.read_block`.
        """
        ...

    def prefetch_blocks(self, pieces: Sequence[Sequence[int]], fields: Fields = None) -> int:
        """Queue blocks ``(s, j0, j1)`` for background read-ahead; how many were queued.

        Remote shards only (all of them count as queued for local shards). Stops at the
        first block the per-process budget (``RemoteOptions.readahead_bytes``) has no room for.
        """
        ...

    def drop_prefetched(self) -> None:
        """Drop what open remote shards fetched ahead and did not read yet."""
        ...

    def gather_packed(
        self,
        indices: Sequence[int] | NDArray[np.integer[Any]],
        fields: Fields,
        int_fields: Collection[str],
        alloc: Any,
    ) -> tuple[Any, ...] | None:
        """``gather(indices, fields)`` and the batch packing in one compiled pass, or ``None``.

        See :func:`tarindex.read.batch.gather_packed` for the layout, when ``None`` comes
        back, and the errors; ``indices`` are positions (negative count from the end).
        """
        ...

    def plan_blocks(self, pieces: NDArray[np.int64], first: int = 0) -> None:
        """A streaming plan's blocks ``int64 (m, 3)`` in read order, for the fetch policy.

        ``first``: samples read before the first one comes out (a shuffled window).
        """
        ...

    def passed_blocks(self, shards: Sequence[int]) -> None:
        """The streaming plan has read its last block of ``shards`` (remote: released)."""
        ...

    def reading(self, s: int) -> None:
        """The streaming plan reads a block of shard ``s`` next (remote: the fetch policy)."""
        ...


class SetTakes:
    """:class:`Takes` over a :class:`~tarindex.read.ShardSet` (made by ``ShardSet.takes()``).

    Args:
        shards: The set.
        pool: Its reader pool.
        per: Its samples per shard if all are equal, else ``0`` (:func:`spanner.equal_count`).
        starts: ``shards.starts`` as a list.
        starts_bytes: ``shards.starts`` as bytes (the compiled loops' copy).
    """

    def __init__(
        self, shards: ShardSet, pool: ReaderPool, per: int, starts: list[int], starts_bytes: bytes
    ) -> None:
        self.shards = shards
        self.pool = pool
        self.per = per
        self.starts = starts
        self.starts_bytes = starts_bytes

    @property
    def open_bound(self) -> int:
        """The pool's bound on open shards."""
        return self.pool.open_bound

    def read_samples(
        self, s: int, j0: int, j1: int, fields: Fields = None, *, prefetch: bool = False
    ) -> list[Sample]:
        """Samples ``j0 <= j < j1`` of shard ``s`` as dicts: ``read_block(...).to_samples()``.

        The streaming read of a block. Over a mapping one compiled call builds the dicts from
        the validated tables (``tarindex/read/_kernel.c``); otherwise (pread, remote,
        ``verify_data``, no compiled loops, anything it hands back) the block is read and
        unpacked.

        Raises:
            SampleIndexError, FormatError, StaleIndexError, TruncatedError: As
                :meth:`ShardSet.read_block`.
        """
        ss = self.shards
        r, fields = ss.reader(s), field_set(fields)  # "bin" is one field
        tabs = r.hot.tables
        if tabs is not None and 0 <= j0 < j1 <= r.n_samples:
            a, b = r.ready(j0, j1)
            want = None if fields is None else r.want_flags(fields)
            r.check_tar()  # cut or changed since opened: its error (READING.md)
            if prefetch and fields is None and b > a:  # projected: no left-out members' pages
                r.source.prefetch(a, b)
            got = tabs.samples(j0, j1, want, ss.paths[s], self.starts[s] + j0)
            if not isinstance(got, HandBack):
                return got
        return ss.read_block(s, j0, j1, fields, prefetch=prefetch).to_samples()

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
            FormatError, StaleIndexError: As :meth:`ShardSet.read_block` (a corrupt chunk of
                tables).
        """
        if fields is not None or self.shards.remote:
            return None
        shards = {int(p[0]) for p in pieces}
        if len(shards) > self.open_bound:
            return None
        mapped: dict[int, tuple[ShardReader, MmapSource]] = {}
        for s in shards:
            r = self.shards.reader(s)
            src = r.source
            if r.hot.tables is None or not isinstance(src, MmapSource):
                return None
            mapped[s] = (r, src)
        hint = cold_cache()
        span = 0
        for s, j0, j1 in pieces:
            r, src = mapped[s]
            if not 0 <= j0 < j1 <= r.n_samples:
                return None  # read_samples says what is wrong
            a, b = r.ready(j0, j1)
            span += b - a
            if hint and b > a:
                src.willneed(a, b)
        return span

    def take(self, indices: list[int]) -> list[Sample]:
        """Global samples ``indices`` as :meth:`read_samples` gives them (a window's, in order).

        One compiled call over mappings, after :meth:`take_ready`; otherwise each sample is
        read with :meth:`read_samples`. Each tar's size is checked once per call, before its
        first byte is copied, so a tar cut since (while the consumer held earlier samples)
        raises :class:`TruncatedError`, not ``SIGBUS``. The compiled call takes only ``int``
        indices in range (an executor's, by construction); it hands anything else back and
        :func:`~tarindex.read.spanner.check_indices` then raises the index rule's error, before
        a shard is opened for the call.

        Raises:
            SampleIndexError, FormatError, StaleIndexError, TruncatedError: As
                :meth:`ShardSet.sample`.
        """
        starts, per, pool = self.starts, self.per, self.pool
        checked = False
        for _ in range(4):  # take_ready opened and checked all: a hand-back is rare (a reader
            # another thread let go of); twice more and the samples are read one by one
            got = kernel.kernel.take(indices, self.starts_bytes, per, pool.readers, pool.paths)
            if not isinstance(got, HandBack):
                if pool.evicts:  # in order of first use, as the reads went
                    pool.touch(dict.fromkeys(locate(starts, per, i)[0] for i in indices))
                return got
            if not checked:  # the loop took only ints in range: the index rule (its errors) now
                indices, checked = check_indices(indices, starts[-1]).tolist(), True
                if got.why == "python":  # maybe numpy integers, as ints now: once more
                    continue
            if not pool.settle(got):
                break
        out: list[Sample] = []  # indices checked: the loop handed back at least once
        for i in indices:
            s, j = locate(starts, per, i)
            out.extend(self.read_samples(s, j, j + 1))
        return out

    def gather_packed(
        self,
        indices: Sequence[int] | NDArray[np.integer[Any]],
        fields: Fields,
        int_fields: Collection[str],
        alloc: Any,
    ) -> tuple[Any, ...] | None:
        """:meth:`ShardSet.gather` and the batch packing in one compiled pass, or ``None``.

        See :func:`tarindex.read.batch.gather_packed` (the layout, when ``None`` comes back,
        the arguments and the errors); ``indices`` are global sample indices, negative ones
        counting from the end.
        """
        return batch.gather_packed(
            self.pool, self.shards.starts, self.per, indices, fields, int_fields, alloc
        )

    def prefetch_blocks(self, pieces: Sequence[Sequence[int]], fields: Fields = None) -> int:
        """Queue blocks ``(shard, j0, j1)`` for background read-ahead, in order (remote only).

        Stops at the first block the per-process budget
        (:attr:`tarindex.remote.RemoteOptions.readahead_bytes`) has no room for.

        Returns:
            How many of ``pieces`` were queued (all of them for local shards: nothing to do).
        """
        if not self.shards.remote:
            return len(pieces)
        return prefetch.prefetch_blocks(self.pool, pieces, fields, self.shards.fetch_policy)

    def drop_prefetched(self) -> None:
        """Drop the bytes fetched ahead and not read yet, in this process's open remote shards."""
        if self.shards.remote:
            prefetch.drop_prefetched(self.pool)

    def plan_blocks(self, pieces: NDArray[np.int64], first: int = 0) -> None:
        """Hand a streaming plan's blocks ``(shard, j0, j1)``, in read order, to the fetch policy.

        It decides which shards are read whole and starts their downloads (remote only);
        ``first``: samples read before the first one comes out (a shuffled window).
        """
        if self.shards.remote:
            self.shards.fetch_policy.follow_blocks(pieces, first)

    def passed_blocks(self, shards: Sequence[int]) -> None:
        """The streaming plan has read its last block of ``shards`` (remote: released)."""
        if self.shards.remote:
            self.shards.fetch_policy.passed_blocks(shards)

    def reading(self, s: int) -> None:
        """The streaming plan reads a block of shard ``s`` next (remote: the fetch policy).

        The policy starts the plan's whole-shard downloads after the first block, and ``s``'s
        if not started.
        """
        if self.shards.remote:
            self.shards.fetch_policy.reading(s)


class SubsetTakes:
    """:class:`Takes` over a :class:`~tarindex.read.subset.ShardSubset` (``view.takes()``).

    Every read goes to the base's :class:`SetTakes` or the view's public reads, in the
    view's numbering: positions map to the base's indices (``view.indices``), blocks
    ``(s, j0, j1)`` are the view's shard positions.

    Args:
        view: The view.
    """

    def __init__(self, view: ShardSubset) -> None:
        self.view = view
        self.base = view.base.takes()

    @property
    def open_bound(self) -> int:
        """The base's bound on open shards."""
        return self.base.open_bound

    def take_ready(self, pieces: Sequence[Sequence[int]], fields: Fields = None) -> int | None:
        """``None``: a view's windows read their blocks (:meth:`read_samples`)."""
        return None

    def take(self, indices: list[int]) -> list[Sample]:
        """:meth:`SetTakes.take` of positions ``indices`` (``__index__``: the base's).

        Raises:
            SampleIndexError: If a position is outside the view.
        """
        return self.base.take(self.view.base_indices(indices).tolist())

    def read_samples(
        self, s: int, j0: int, j1: int, fields: Fields = None, *, prefetch: bool = False
    ) -> list[Sample]:
        """Shard positions ``j0 <= j < j1`` of shard ``s``: ``view.read_block(...).to_samples()``.

        Raises:
            SampleIndexError, FormatError, StaleIndexError, TruncatedError: As
                :meth:`ShardSubset.read_block`.
        """
        return self.view.read_block(s, j0, j1, fields, prefetch=prefetch).to_samples()

    def gather_packed(
        self,
        indices: Sequence[int] | NDArray[np.integer[Any]],
        fields: Fields,
        int_fields: Collection[str],
        alloc: Any,
    ) -> tuple[Any, ...] | None:
        """:meth:`SetTakes.gather_packed` of positions ``indices`` (``index``: the base's).

        Raises:
            SampleIndexError, TypeError: If a position is out of range or not an integer.
        """
        return self.base.gather_packed(self.view.base_indices(indices), fields, int_fields, alloc)

    def prefetch_blocks(self, pieces: Sequence[Sequence[int]], fields: Fields = None) -> int:
        """Queue the view's blocks ``(s, j0, j1)`` for read-ahead (remote only): all of them.

        Raises:
            SampleIndexError: If a block is outside the view (remote shards).
        """
        view = self.view
        if view.remote and len(pieces):
            rows = [view.positions(int(s), int(j0), int(j1)) for s, j0, j1 in pieces]
            view.prefetch(np.concatenate(rows), fields, wait=False)
        return len(pieces)

    def drop_prefetched(self) -> None:
        """Drop what the base's open remote shards fetched ahead and did not read yet."""
        self.base.drop_prefetched()

    def plan_blocks(self, pieces: NDArray[np.int64], first: int = 0) -> None:
        """Nothing: a view's blocks are ranged reads of some samples (no whole-shard fetch)."""

    def passed_blocks(self, shards: Sequence[int]) -> None:
        """Nothing (see :meth:`plan_blocks`)."""

    def reading(self, s: int) -> None:
        """Nothing (see :meth:`plan_blocks`)."""
