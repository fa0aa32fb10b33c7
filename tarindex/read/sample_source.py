"""What the datasets, samplers and the streaming code read samples from: :class:`SampleSource`.

Two kinds satisfy it: a :class:`~tarindex.read.ShardSet` (every sample of its shards)
and a :class:`~tarindex.read.subset.ShardSubset` (a view of some of them). The protocol is
exactly the operations ``tarindex.torch`` calls on either, so a dataset is typed against it
and never asks which one it holds.

Numbering, one contract for every operation:

- A *position* ``i``, ``0 <= i < len(src)`` (negative counts from the end where a single
  index is taken), numbers the source's samples shard by shard in shard order, within a
  shard in the shard's sample order. :meth:`~SampleSource.sample`,
  :meth:`~SampleSource.gather`, :meth:`~SampleSource.prefetch` and
  :meth:`~SampleSource.locate` take positions; the key lookups return them.
- A *shard position* ``(s, j)``, ``0 <= j < counts[s]``, is position ``starts[s] + j``:
  :meth:`~SampleSource.locate` returns it, and :meth:`~SampleSource.read_block` takes
  rows ``(s, j0, j1)`` of them, as the planner (:mod:`tarindex.plan.epoch`) deals them over
  :attr:`~SampleSource.counts`.
- The streaming executors read through :meth:`~SampleSource.takes`
  (:class:`~tarindex.read.takes.Takes`), in the same numbering: its ``take`` and
  ``gather_packed`` take positions, its ``read_samples``, ``take_ready`` and
  ``prefetch_blocks`` rows of shard positions. Those reads are not on the source itself:
  they are the executors' plumbing, not what a user reads with.
- What comes out names the *source index* of each sample: ``__index__`` of a sample dict and
  ``Block.index`` are the sample's global index in the whole :class:`ShardSet` (for a
  ``ShardSet`` its position; for a view, the position in the set it views), and
  ``__shard__`` its shard's path. Shard ``s`` is the same shard, and
  :meth:`~SampleSource.reader` the same reader, in a view as in its set.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import numpy as np
from numpy.typing import NDArray

if TYPE_CHECKING:
    from .block import Block, Sample
    from .fields import Fields
    from .shard import ShardReader
    from .takes import Takes

__all__ = ["ITER_BLOCK", "SampleSource", "in_order"]

ITER_BLOCK = 1024
"""Samples of one shard that iterating a source reads in one call (:func:`in_order`)."""


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

    def __len__(self) -> int:
        """Number of samples (positions)."""
        ...

    def __iter__(self) -> Iterator[Sample]:
        """Every sample in position order, as :meth:`sample` gives it (:func:`in_order`)."""
        ...

    def locate(self, i: int) -> tuple[int, int]:
        """Map position ``i`` (negative counts from the end) to its shard position ``(s, j)``.

        ``read_block(s, j, j + 1)`` (and ``takes().read_samples(s, j, j + 1)``) then holds
        ``sample(i)``.

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

    def prefetch(
        self,
        indices: Sequence[int] | NDArray[np.integer[Any]],
        fields: Fields = None,
        *,
        wait: bool = True,
    ) -> None:
        """Fetch the members of positions ``indices`` ahead (remote shards; else nothing)."""
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

    def takes(self) -> Takes:
        """The reads the streaming executors need, in this source's numbering.

        See :class:`~tarindex.read.takes.Takes`: not for users; cheap; one per iteration.
        """
        ...

    def close(self) -> None:
        """Close the open readers of this process."""
        ...


def in_order(src: SampleSource) -> Iterator[Sample]:
    """Every sample of ``src`` in position order: ``src.sample(0)``, ``src.sample(1)``, ...

    Read shard by shard, :data:`ITER_BLOCK` samples per call of the executors'
    ``read_samples`` (one sequential read, or one compiled pass over a mapping), so a pass
    over the whole source costs what streaming it without a shuffle does, not one ``ds[i]``
    per sample. What ``iter(ShardSet)`` and ``iter(ShardSubset)`` do.

    Raises:
        FormatError, StaleIndexError, TruncatedError: As :meth:`SampleSource.read_block`, when
            the block holding the failing sample is reached.
    """
    t = src.takes()
    for s, c in enumerate(src.counts.tolist()):
        for j0 in range(0, c, ITER_BLOCK):
            yield from t.read_samples(s, j0, min(j0 + ITER_BLOCK, c))
