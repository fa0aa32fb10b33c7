"""What the datasets, samplers and the streaming code read samples from: :class:`SampleSource`.

Two kinds satisfy it: a :class:`~tarindex.read.ShardSet` (every sample of its shards)
and a :class:`~tarindex.read.subset.ShardSubset` (a view of some of them). The protocol is
exactly the operations ``tarindex.torch`` calls on either, so a dataset is typed against it
and never asks which one it holds.

Numbering, one contract for every operation:

- A *position* ``i``, ``0 <= i < len(src)`` (negative counts from the end where a single
  index is taken), numbers the source's samples shard by shard in shard order, within a
  shard in the shard's sample order. :meth:`~SampleSource.sample`,
  :meth:`~SampleSource.gather`, :meth:`~SampleSource.gather_packed`,
  :meth:`~SampleSource.take`, :meth:`~SampleSource.prefetch` and
  :meth:`~SampleSource.locate` take positions; the key lookups return them.
- A *shard position* ``(s, j)``, ``0 <= j < counts[s]``, is position ``starts[s] + j``:
  :meth:`~SampleSource.locate` returns it, and the block operations
  (:meth:`~SampleSource.read_block`, :meth:`~SampleSource.read_samples`,
  :meth:`~SampleSource.take_ready`, :meth:`~SampleSource.prefetch_blocks`) take rows
  ``(s, j0, j1)`` of them, as the planner (:mod:`tarindex.plan.epoch`) deals them over
  :attr:`~SampleSource.counts`.
- What comes out names the *source index* of each sample: ``__index__`` of a sample dict and
  ``Block.index`` are the sample's global index in the whole :class:`ShardSet` (for a
  ``ShardSet`` its position; for a view, the position in the set it views), and
  ``__shard__`` its shard's path. Shard ``s`` is the same shard, and
  :meth:`~SampleSource.reader` the same reader, in a view as in its set.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import numpy as np
from numpy.typing import NDArray

if TYPE_CHECKING:
    from .block import Block, Sample
    from .fields import Fields
    from .shard import ShardReader

__all__ = ["SampleSource"]


@runtime_checkable
class SampleSource(Protocol):
    """Samples of indexed tar shards, by position, by block and by key (module docstring).

    Satisfied by :class:`~tarindex.read.ShardSet` and
    :class:`~tarindex.read.subset.ShardSubset`.
    """

    @property
    def paths(self) -> list[str]:
        """The shards' paths (or URLs), shard ``s`` at ``paths[s]``."""
        ...

    @property
    def counts(self) -> NDArray[np.int64]:
        """``int64 (n_shards,)``: this source's samples in each shard."""
        ...

    @property
    def starts(self) -> NDArray[np.int64]:
        """``int64 (n_shards + 1,)``: position of each shard's first sample, then ``len``."""
        ...

    @property
    def remote(self) -> bool:
        """``True`` if some shards are remote URLs (reads go through fsspec)."""
        ...

    @property
    def n_shards(self) -> int:
        """Number of shards (``len(paths)``)."""
        ...

    @property
    def open_bound(self) -> int:
        """Open shards this process keeps at most."""
        ...

    def __len__(self) -> int:
        """Number of samples (positions)."""
        ...

    def locate(self, i: int) -> tuple[int, int]:
        """Map position ``i`` (negative counts from the end) to its shard position ``(s, j)``.

        ``read_samples(s, j, j + 1)`` is then ``[sample(i)]``.

        Raises:
            SampleIndexError: If ``i`` is out of range.
            TypeError: If ``i`` is not an integer.
        """
        ...

    def reader(self, s: int) -> ShardReader:
        """The open reader of shard ``s`` (its own numbering: every sample of the shard).

        Raises:
            StaleIndexError, FormatError: As :meth:`ShardSet.reader`.
        """
        ...

    def get(self, key: str, fields: Fields = None) -> Sample:
        """The sample whose key is ``key``: ``sample(index_of(key), fields)``.

        Raises:
            TypeError: If ``key`` is not a ``str``.
            KeyNotFoundError, AmbiguousKeyError: As :meth:`index_of`.
        """
        ...

    def sample(self, i: int, fields: Fields = None) -> Sample:
        """Sample at position ``i``: ``__key__``, ``__shard__``, ``__index__`` and raw bytes.

        Raises:
            SampleIndexError: If ``i`` is out of range.
            StaleIndexError, FormatError: As :meth:`ShardSet.sample`.
        """
        ...

    def gather(
        self, indices: Sequence[int] | NDArray[np.integer[Any]], fields: Fields = None
    ) -> Block:
        """Samples at positions ``indices`` (any order, repeats allowed) as one block.

        Raises:
            SampleIndexError, TypeError, FormatError, StaleIndexError: As
                :meth:`ShardSet.gather`.
        """
        ...

    def gather_packed(
        self,
        indices: Sequence[int] | NDArray[np.integer[Any]],
        fields: Fields,
        int_fields: Collection[str],
        alloc: Any,
    ) -> tuple[Any, ...] | None:
        """:meth:`gather` of positions ``indices`` packed in one compiled pass, or ``None``.

        See :meth:`ShardSet.gather_packed` for the layout.
        """
        ...

    def prefetch(
        self,
        indices: Sequence[int] | NDArray[np.integer[Any]],
        fields: Fields = None,
        *,
        wait: bool = True,
    ) -> None:
        """Fetch the members of positions ``indices`` ahead (remote shards; else nothing)."""
        ...

    def prefetch_blocks(self, pieces: Sequence[Sequence[int]], fields: Fields = None) -> int:
        """Queue blocks ``(s, j0, j1)`` of shard positions for read-ahead; how many queued."""
        ...

    def drop_prefetched(self) -> None:
        """Drop what open remote shards fetched ahead and did not read yet."""
        ...

    def take_ready(self, pieces: Sequence[Sequence[int]], fields: Fields = None) -> int | None:
        """Prepare blocks ``(s, j0, j1)`` for :meth:`take`: the bytes they span, or ``None``.

        ``None``: read the blocks with :meth:`read_samples` instead.
        """
        ...

    def take(self, indices: list[int]) -> list[Sample]:
        """Samples at positions ``indices``, in order (a streaming window's).

        Raises:
            SampleIndexError, FormatError, StaleIndexError, TruncatedError: As :meth:`sample`.
        """
        ...

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
        """Shard positions ``j0 <= j < j1`` of shard ``s`` as one block (one kernel read).

        Raises:
            SampleIndexError: If the range is outside ``[0, counts[s]]``.
            FormatError, StaleIndexError, TruncatedError: As :meth:`ShardSet.read_block`.
        """
        ...

    def read_samples(
        self, s: int, j0: int, j1: int, fields: Fields = None, *, prefetch: bool = False
    ) -> list[Sample]:
        """Shard positions ``j0 <= j < j1`` of shard ``s`` as sample dicts.

        Raises:
            SampleIndexError, FormatError, StaleIndexError, TruncatedError: As
                :meth:`read_block`.
        """
        ...

    def index_of(self, key: str) -> int:
        """The position of the sample whose key is ``key``.

        Raises:
            KeyNotFoundError: If no sample has it.
            AmbiguousKeyError: If several do.
        """
        ...

    def indices_of(self, key: str) -> list[int]:
        """The positions of every sample whose key is ``key``, ascending (maybe empty)."""
        ...

    def index_of_many(self, keys: Sequence[str]) -> NDArray[np.int64]:
        """``int64 (len(keys),)``: each key's position, ``-1`` where no sample has it.

        Raises:
            AmbiguousKeyError: As :meth:`index_of`.
        """
        ...

    def close(self) -> None:
        """Close the open readers of this process."""
        ...
