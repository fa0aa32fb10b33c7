"""Some samples of a :class:`ShardSet` as a sample source of their own: :class:`ShardSubset`.

``subset=`` on :class:`~tarindex.torch.dataset.TarDataset` and
:class:`~tarindex.torch.iterable.TarIterableDataset` (or :class:`ShardSubset` directly) makes a
view of just those samples that works with both access patterns: map-style (``ds[i]``,
samplers, batched fetches) and streaming (the same plan, exactly-once and equal-count rules
over the view's samples). The parts of :func:`tarindex.read.split.split_by_key` are such index
lists.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
from numpy.typing import NDArray

from ..errors import AmbiguousKeyError, KeyNotFoundError, SampleIndexError
from .block import Block, Sample
from .fields import Fields
from .sample_source import SampleSource, in_order
from .shard import ShardReader
from .shardset import ShardSet
from .spanner import check_index, check_indices, locate, shards_of
from .takes import SubsetTakes

__all__ = ["ShardSubset", "shard_of_index"]


class ShardSubset:
    """Some samples of a :class:`ShardSet`, as a :class:`SampleSource` of their own (a view).

    Position ``i`` of the view is sample ``indices[i]`` of ``base`` (``indices`` sorted, no
    repeats), so the view keeps the base's shard order and, within a shard, its sample order.
    Numbering (the contract of :mod:`tarindex.read.sample_source`, the same for every method):

    - positions ``0 <= i < len(view)``: :meth:`sample`, :meth:`gather`, :meth:`prefetch`,
      :meth:`locate` (and the executors' ``take``, ``gather_packed`` of :meth:`takes`) take
      them, the key lookups return them;
    - shard positions ``(s, j)``, ``0 <= j < counts[s]``, are position ``starts[s] + j``
      (``counts``, ``starts``: the view's); :meth:`locate` returns them and the block reads
      (:meth:`read_block`, :meth:`positions`, and the executors' ``read_samples``,
      ``prefetch_blocks``, ``take_ready``) take rows ``(s, j0, j1)`` of them, so the
      streaming planner plans over the view's counts and its exactly-once and equal-count
      rules hold for the view;
    - a sample's ``__index__`` and ``Block.index`` are its index in ``base`` (stable across
      splits, joinable; :meth:`base_index` maps a position to it), and ``Block.samples``
      the shard's own sample numbers, as the shard's reader (:meth:`reader`, the base's)
      numbers them.

    Every read goes to the base's readers through the base's public methods (one kernel:
    :meth:`ShardReader.gather` for a run of the view's samples, which reads only those
    members). Shard ``s`` of the view is shard ``s`` of the base (``paths``, ``remote`` are
    the base's); a shard may hold no sample of the view.

    Args:
        base: The whole dataset, or a view of it (its view: a view of the same base).
        indices: Global sample indices of ``base`` (positions when ``base`` is a view), any
            order, repeats dropped.

    Raises:
        SampleIndexError: If an index is outside ``base``.
    """

    def __init__(
        self, base: ShardSet | ShardSubset, indices: Sequence[int] | NDArray[np.integer[Any]]
    ) -> None:
        if isinstance(base, ShardSubset):  # a subset of a subset: one level
            indices = base.indices[check_indices(indices, len(base))]
            base = base.base
        idx = np.unique(check_indices(indices, len(base), negative=False))
        self.base: ShardSet = base
        """The whole dataset the view's samples come from."""
        self.indices: NDArray[np.int64] = idx
        """``int64 (len(view),)``: the base's global index of each position, ascending."""
        sid = shards_of(base.starts, 0, idx)
        self.local: NDArray[np.int64] = idx - base.starts[sid]
        """``int64 (len(view),)``: each position's sample number in its shard (the reader's)."""
        self.counts: NDArray[np.int64] = np.bincount(sid, minlength=base.n_shards).astype(np.int64)
        """``int64 (n_shards,)``: the view's samples in each shard."""
        self.starts: NDArray[np.int64] = np.zeros(len(self.counts) + 1, np.int64)
        """``int64 (n_shards + 1,)``: the position of each shard's first sample, then ``len``."""
        np.cumsum(self.counts, out=self.starts[1:])
        self._starts_list: list[int] = self.starts.tolist()

    # -- the shards: the base's ----------------------------------------------------------------
    @property
    def paths(self) -> list[str]:
        """The base's shard paths (shard ``s`` of the view is shard ``s`` of the base)."""
        return self.base.paths

    @property
    def remote(self) -> bool:
        """Whether some shards are remote URLs (the base's)."""
        return self.base.remote

    @property
    def n_shards(self) -> int:
        """Number of shards (the base's, also those holding no sample of the view)."""
        return self.base.n_shards

    def __len__(self) -> int:
        return len(self.indices)

    def __iter__(self) -> Iterator[Sample]:
        """The view's samples in position order, as :meth:`sample` gives them, a block at a time.

        See :func:`tarindex.read.sample_source.in_order`; each block reads only the view's
        members (:meth:`read_block`).
        """
        return in_order(self)

    def reader(self, s: int) -> ShardReader:
        """The base's reader of shard ``s`` (its sample numbers are the shard's own).

        Raises:
            StaleIndexError, FormatError: As :meth:`ShardSet.reader`.
        """
        return self.base.reader(s)

    # -- positions -----------------------------------------------------------------------------
    def _position(self, i: int) -> int:
        return check_index(i, len(self.indices))

    def base_index(self, i: int) -> int:
        """The base's global index of position ``i`` (negative counts from the end).

        Raises:
            SampleIndexError: If ``i`` is out of range.
            TypeError: If ``i`` is not an integer.
        """
        return int(self.indices[self._position(i)])

    def locate(self, i: int) -> tuple[int, int]:
        """Map position ``i`` to its shard position ``(s, j)``: ``j`` counts the view's samples.

        ``read_block(s, j, j + 1)`` holds ``sample(i)``, as does the executors'
        ``takes().read_samples(s, j, j + 1)``; ``s`` is also the base's shard.

        Raises:
            SampleIndexError: If ``i`` is out of range.
            TypeError: If ``i`` is not an integer.
        """
        return locate(self._starts_list, 0, i)  # the one index -> (shard, j) rule

    def base_indices(self, indices: Sequence[int] | NDArray[np.integer[Any]]) -> NDArray[np.int64]:
        """``int64 (len(indices),)``: the base's global index of each of positions ``indices``.

        Negative positions count from the end.

        Raises:
            SampleIndexError, TypeError: If a position is out of range or not an integer.
        """
        out: NDArray[np.int64] = self.indices[check_indices(indices, len(self.indices))]
        return out

    def get(self, key: str, fields: Fields = None) -> Sample:
        """The view's sample whose key is ``key``: ``sample(index_of(key), fields)``.

        Raises:
            TypeError: If ``key`` is not a ``str``.
            KeyNotFoundError, AmbiguousKeyError: As :meth:`index_of` (a key outside the view
                is not found).
        """
        return self.sample(self.index_of(key), fields)

    def sample(self, i: int, fields: Fields = None) -> Sample:
        """Sample at position ``i`` (``__index__``: its index in the base).

        Raises:
            SampleIndexError: If ``i`` is out of range.
            StaleIndexError, FormatError: As :meth:`ShardSet.sample`.
        """
        return self.base.sample(self.base_index(i), fields)

    def gather(
        self, indices: Sequence[int] | NDArray[np.integer[Any]], fields: Fields = None
    ) -> Block:
        """:meth:`ShardSet.gather` of positions ``indices`` (``index``: the base's).

        Raises:
            SampleIndexError, TypeError: If a position is out of range or not an integer.
            FormatError, StaleIndexError: As :meth:`ShardSet.gather`.
        """
        return self.base.gather(self.base_indices(indices), fields)

    def prefetch(
        self,
        indices: Sequence[int] | NDArray[np.integer[Any]],
        fields: Fields = None,
        *,
        wait: bool = True,
    ) -> None:
        """:meth:`ShardSet.prefetch` of positions ``indices`` (remote shards only).

        Out-of-range positions are left for the read to refuse.
        """
        if not self.remote:
            return
        idx = np.asarray(indices, np.int64).reshape(-1)
        n = len(self.indices)
        idx = np.where(idx < 0, idx + n, idx)
        idx = idx[(idx >= 0) & (idx < n)]
        self.base.prefetch(self.indices[idx], fields, wait=wait, reach=self.counts)

    # -- blocks of shard positions -------------------------------------------------------------
    def positions(self, s: int, j0: int, j1: int) -> NDArray[np.int64]:
        """``int64 (j1 - j0,)``: the positions of shard positions ``j0 <= j < j1`` of shard ``s``.

        Raises:
            SampleIndexError: If ``s`` is not a shard or the range is outside
                ``[0, counts[s]]`` (names the shard).
        """
        if not 0 <= s < len(self.counts):
            raise SampleIndexError(f"shard {s} out of range for {len(self.counts)} shards")
        c = int(self.counts[s])
        if not 0 <= j0 <= j1 <= c:
            raise SampleIndexError(f"{self.paths[s]}: samples {j0}..{j1} out of range [0, {c})")
        a = self._starts_list[s]
        return np.arange(a + j0, a + j1, dtype=np.int64)

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
        """Shard positions ``j0 <= j < j1`` of shard ``s``, one kernel read of just those.

        :meth:`ShardReader.gather` of the shard's own sample numbers (with ``pread``, runs of
        neighbouring members in one read); ``index`` holds the base's global indices,
        ``samples`` the shard's own sample numbers. ``prefetch`` is a hint (ignored).

        Raises:
            SampleIndexError: If the range is outside the view's shard ``s``.
            FormatError, StaleIndexError, TruncatedError: As :meth:`ShardSet.read_block`.
        """
        local = self.local[self.positions(s, j0, j1)]
        b = self.base.reader(s).gather(local, fields, data=data)
        b.paths = [self.paths[s]]
        b.index = local + self.base.starts[s]
        return b

    # -- keys ----------------------------------------------------------------------------------
    def indices_of(self, key: str) -> list[int]:
        """Positions of the samples whose key is ``key`` (see :meth:`ShardSet.indices_of`)."""
        hits = np.asarray(self.base.indices_of(key), np.int64)
        at = np.searchsorted(self.indices, hits)
        ok = (at < len(self.indices)) & (
            self.indices[np.minimum(at, len(self.indices) - 1)] == hits
        )
        return at[ok].tolist() if len(self.indices) else []

    def index_of_many(self, keys: Sequence[str]) -> NDArray[np.int64]:
        """Positions of each key's sample, ``-1`` where none in the view (vectorised).

        Raises:
            AmbiguousKeyError: As :meth:`ShardSet.index_of_many` (over the base).
        """
        g = self.base.index_of_many(keys)
        n = len(self.indices)
        at = np.searchsorted(self.indices, g)
        ok = (g >= 0) & (at < n)
        ok[ok] = self.indices[at[ok]] == g[ok]
        return np.where(ok, at, -1).astype(np.int64)

    def index_of(self, key: str) -> int:
        """The position of the sample whose key is ``key`` (see :meth:`ShardSet.index_of`).

        Raises:
            KeyNotFoundError: If no sample of the view has this key.
            AmbiguousKeyError: If several samples of the view do.
        """
        hits = self.indices_of(key)
        if len(hits) == 1:
            return hits[0]
        if not hits:
            raise KeyNotFoundError(f"no sample with key {key!r} in this subset of {self!r}")
        places = ", ".join(f"{i} (sample {int(self.indices[i])} of the dataset)" for i in hits[:5])
        raise AmbiguousKeyError(
            f"key {key!r} is in {len(hits)} samples of the subset: {places}; keys are unique "
            f"only within a shard: use indices_of(key) for every one"
        )

    def takes(self) -> SubsetTakes:
        """The reads the streaming executors need, in the view's numbering.

        See :meth:`ShardSet.takes` and :class:`~tarindex.read.takes.SubsetTakes`.
        """
        return SubsetTakes(self)

    def close(self) -> None:
        """Close the base's readers."""
        self.base.close()

    def __repr__(self) -> str:
        return f"ShardSubset({len(self)} of {len(self.base)} samples, {self.n_shards} shards)"


def shard_of_index(source: SampleSource, index: int) -> int:
    """Return the shard of ``source`` holding the sample whose ``__index__`` is ``index``.

    ``__index__`` is the sample's index in the whole set (a view's base), not a position of
    the view; the shard is the same in both.

    Raises:
        SampleIndexError: If ``index`` is outside the set.
    """
    whole = source.base if isinstance(source, ShardSubset) else source
    return whole.locate(index)[0]
