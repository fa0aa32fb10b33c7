"""Stable splits by a seeded hash of the key, and subsets of a dataset as views (docs/SCALE.md).

A key's part is a pure function of ``(key, seed, fractions)``: the key hash of FORMAT.md §7
under ``seed``, compared with the fractions' cumulative thresholds. Re-sharding (another
``maxcount``), re-ordering or adding shards never moves a key to another part, and every
process computes the same split from the keys alone. Hashing is vectorised over the key blobs
of the indexes (1M keys in about 0.1-0.2 s).

:func:`split_by_key` returns each part's global sample indices; ``subset=`` on
:class:`~tarindex.torch.dataset.TarDataset` and
:class:`~tarindex.torch.iterable.TarIterableDataset` (or :class:`ShardSubset` directly) makes a
view of just those samples that works with both access patterns: map-style (``ds[i]``,
samplers, batched fetches) and streaming (the same plan, exactly-once and equal-count rules
over the subset's samples).
"""

from __future__ import annotations

import operator
from collections.abc import Collection, Mapping, Sequence
from typing import Any

import numpy as np
from numpy.typing import NDArray

from ..errors import AmbiguousKeyError, KeyNotFoundError, SampleIndexError
from ..format.keyhash import key_hashes
from .block import Block, Fields, Sample
from .shard import ShardReader
from .shardset import ShardSet
from .sources import Source
from .spanner import sample_indices

__all__ = [
    "thresholds",
    "split_parts",
    "split_keys",
    "split_by_key",
    "ShardSubset",
]

_TOL = 1e-9


def thresholds(fractions: Sequence[float]) -> list[int]:
    """Return the upper key-hash bound of each part (``bounds[-1] == 2**64``).

    Key hash ``h`` is in part ``k`` iff ``bounds[k-1] <= h < bounds[k]``;
    ``bounds[k] = floor((f_0 + ... + f_k) * 2**64)`` with the sums in float64, the last one
    ``2**64`` (docs/SCALE.md, "Splits").

    Raises:
        ValueError: If a fraction is negative or not finite, or they do not sum to 1
            (within ``1e-9``).
    """
    fs = [float(f) for f in fractions]
    if not fs or any(not np.isfinite(f) or f < 0 for f in fs):
        raise ValueError(f"fractions {fractions!r}: expected non-negative numbers")
    total = float(np.sum(fs))
    if abs(total - 1.0) > _TOL:
        raise ValueError(f"fractions {fractions!r} sum to {total}, expected 1")
    cum = np.cumsum(fs)
    out = [min(int(c * 2.0**64), 2**64) for c in cum[:-1].tolist()]
    return [*out, 2**64]


def split_parts(hashes: NDArray[np.uint64], fractions: Sequence[float]) -> NDArray[np.int64]:
    """Return each key's part number, ``int64 (n,)``, from its key hash (``uint64 (n,)``)."""
    # part = how many bounds h reaches; a bound of 2**64 is never reached (h < 2**64)
    bounds = np.asarray([b for b in thresholds(fractions)[:-1] if b < 2**64], np.uint64)
    return np.searchsorted(bounds, np.asarray(hashes, np.uint64), side="right").astype(np.int64)


def _names(fractions: Mapping[str, float] | Sequence[float]) -> tuple[list[str], list[float]]:
    if isinstance(fractions, Mapping):
        return [str(k) for k in fractions], [float(v) for v in fractions.values()]
    fs = [float(f) for f in fractions]
    return [str(k) for k in range(len(fs))], fs


def split_keys(
    keys: Sequence[str], fractions: Mapping[str, float] | Sequence[float], seed: int = 0
) -> NDArray[np.int64]:
    """Return the part number of each key (the same rule as :func:`split_by_key`).

    For keys that live elsewhere (a metadata table to join). ``int64 (len(keys),)``; part
    ``k`` is the ``k``-th entry of ``fractions``.

    Raises:
        ValueError: As :func:`thresholds`, or a seed outside ``[0, 2**64)``.
    """
    raw = [k.encode("utf-8", "surrogateescape") for k in keys]
    ptr = np.zeros(len(raw) + 1, np.int64)
    np.cumsum([len(k) for k in raw], out=ptr[1:])
    return split_parts(key_hashes(b"".join(raw), ptr, seed), _names(fractions)[1])


def split_by_key(
    source: Source | ShardSet,
    fractions: Mapping[str, float] | Sequence[float],
    seed: int = 0,
) -> dict[str, NDArray[np.int64]]:
    """Split a dataset's samples into parts by a seeded hash of their keys.

    Key ``k`` goes to part ``p`` when its key hash (FORMAT.md §7, under ``seed``) falls in
    ``p``'s share of ``[0, 2**64)`` (:func:`thresholds`): a pure function of the key, so the
    split is the same however the samples are sharded, in whatever shard order, with shards
    added (their keys are split the same way; the old keys do not move). Each part holds about
    ``fraction * n`` samples (binomially: within a few ``sqrt(n * fraction)``).

    Every shard's keys are read from its index (each shard opened once) and hashed together,
    vectorised.

    Args:
        source: The dataset: a source (paths, globs, a manifest) or a ``ShardSet``.
        fractions: ``{"train": 0.8, "val": 0.1, "test": 0.1}`` (or a list: parts ``"0"``,
            ``"1"``, ...), non-negative, summing to 1.
        seed: ``0 <= seed < 2**64``. Defaults to ``0``.

    Returns:
        ``{part: int64 array}``: the global sample indices of each part, ascending; together
        every sample exactly once.

    Raises:
        ValueError: Bad fractions or seed.
        FormatError, StaleIndexError: As opening the shards (:meth:`ShardSet.reader`).
    """
    names, fs = _names(fractions)
    thresholds(fs)  # validate before reading anything
    ss = source if isinstance(source, ShardSet) else ShardSet(source)
    blobs: list[bytes] = []
    ptrs: list[NDArray[np.int64]] = []
    base = 0
    for s in range(ss.n_shards):
        if not ss.counts[s]:
            continue
        r = ss.reader(s)
        t = r.index
        blobs.append(bytes(t.key_blob))
        ptrs.append(np.asarray(t.key_ptr[:-1], np.int64) + base)
        base += len(t.key_blob)
    ptr = np.concatenate([*ptrs, np.asarray([base], np.int64)])
    nonempty = np.flatnonzero(ss.counts > 0)
    # global index of each hashed key: shards with samples, in order
    glob = np.concatenate(
        [np.arange(ss.starts[s], ss.starts[s + 1], dtype=np.int64) for s in nonempty.tolist()]
        or [np.empty(0, np.int64)]
    )
    parts = split_parts(key_hashes(b"".join(blobs), ptr, seed), fs)
    return {name: glob[parts == k] for k, name in enumerate(names)}


class ShardSubset(ShardSet):
    """Some samples of a :class:`ShardSet`, as a ``ShardSet`` of its own (a view).

    Sample ``i`` of the view is sample ``indices[i]`` of ``base`` (``indices`` sorted, no
    repeats), so the view keeps the base's shard order and, within a shard, its sample order;
    shard ``s`` of the view holds ``counts[s]`` samples. Every read goes to the base's readers
    (one kernel: :meth:`ShardReader.gather` for a run of the view's samples, which reads only
    those members), and a sample's ``__index__`` is its index in ``base`` (stable across
    splits, joinable). The datasets take it as ``subset=``; the streaming planner plans over
    the view's counts, so its exactly-once and equal-count rules hold for the subset.

    Args:
        base: The whole dataset.
        indices: Global sample indices of ``base`` (any order, repeats dropped).

    Raises:
        SampleIndexError: If an index is outside ``base``.
    """

    def __init__(self, base: ShardSet, indices: Sequence[int] | NDArray[np.integer[Any]]) -> None:
        if isinstance(base, ShardSubset):  # a subset of a subset: one level
            outer: ShardSubset = base
            indices = outer.indices[np.asarray(indices, np.int64)]
            base = outer.base
        idx = np.unique(np.asarray(indices, np.int64).reshape(-1))
        n = len(base)
        if idx.size and (int(idx[0]) < 0 or int(idx[-1]) >= n):
            bad = int(idx[0]) if int(idx[0]) < 0 else int(idx[-1])
            raise SampleIndexError(f"subset index {bad} out of range for {n} samples")
        # Everything a ShardSet has (configuration, listing, reader bookkeeping, and whatever
        # ShardSet.__init__ sets later), as a pickled copy of the base would have it; then the
        # view's own numbering. The copy's reader cache stays empty: reads go to the base's.
        self.__setstate__(base.__getstate__())
        self.base: ShardSet = base
        self.indices: NDArray[np.int64] = idx
        sid = np.searchsorted(base.starts, idx, side="right") - 1
        self.local = idx - base.starts[sid]
        self.counts = np.bincount(sid, minlength=base.n_shards).astype(np.int64)
        self.starts = np.zeros(len(self.counts) + 1, np.int64)
        np.cumsum(self.counts, out=self.starts[1:])
        self._starts_list = self.starts.tolist()
        self._starts_bytes = self.starts.tobytes()
        self._per = 0  # no equal-count shortcut in the view's numbering
        self._last = len(self.counts) - 1

    @property
    def open_bound(self) -> int:
        """The base's bound on open shards."""
        return self.base.open_bound

    def reader(self, s: int) -> ShardReader:
        """The base's reader of shard ``s`` (its sample numbers are the shard's own)."""
        return self.base.reader(s)

    def locate(self, i: int) -> tuple[int, int]:
        """Map view index ``i`` to ``(shard, j)`` with ``j`` the shard's own sample number."""
        return self.base.locate(self.base_index(i))

    def base_index(self, i: int) -> int:
        """The base's global index of view sample ``i`` (negative counts from the end).

        Raises:
            SampleIndexError: If ``i`` is out of range.
        """
        i = operator.index(i)
        n = len(self.indices)
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise SampleIndexError(f"sample index {i} out of range for {n} samples")
        return int(self.indices[i])

    def get(self, i: int, fields: Fields = None) -> Sample:
        """Sample ``i`` of the view (``__index__``: its index in the base)."""
        return self.base.get(self.base_index(i), fields)

    def _to_base(self, indices: Sequence[int] | NDArray[np.integer[Any]]) -> NDArray[np.int64]:
        """The base's indices of view samples ``indices`` (negative count from the end)."""
        out: NDArray[np.int64] = self.indices[sample_indices(indices, len(self.indices))]
        return out

    def gather(
        self, indices: Sequence[int] | NDArray[np.integer[Any]], fields: Fields = None
    ) -> Block:
        """:meth:`ShardSet.gather` of view samples ``indices`` (``index``: the base's)."""
        return self.base.gather(self._to_base(indices), fields)

    def gather_packed(
        self,
        indices: Sequence[int] | NDArray[np.integer[Any]],
        fields: Fields,
        int_fields: Collection[str],
        alloc: Any,
    ) -> tuple[Any, ...] | None:
        """:meth:`ShardSet.gather_packed` of view samples ``indices`` (``index``: the base's)."""
        return self.base.gather_packed(self._to_base(indices), fields, int_fields, alloc)

    def prefetch(
        self,
        indices: Sequence[int] | NDArray[np.integer[Any]],
        fields: Fields = None,
        *,
        wait: bool = True,
    ) -> None:
        """:meth:`ShardSet.prefetch` of view samples ``indices`` (remote shards only)."""
        if not self.remote:
            return
        idx = np.asarray(indices, np.int64).reshape(-1)
        n = len(self.indices)
        idx = np.where(idx < 0, idx + n, idx)
        idx = idx[(idx >= 0) & (idx < n)]
        self.base.prefetch(self.indices[idx], fields, wait=wait)

    def prefetch_blocks(self, pieces: Sequence[Sequence[int]], fields: Fields = None) -> int:
        """Queue the view's blocks ``(shard, j0, j1)`` for read-ahead (remote only)."""
        if self.remote and len(pieces):
            a = self._starts_list
            idx = [np.arange(a[s] + j0, a[s] + j1, dtype=np.int64) for s, j0, j1 in pieces]
            self.prefetch(np.concatenate(idx), fields, wait=False)
        return len(pieces)

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
        """The view's samples ``j0 <= j < j1`` of shard ``s``, one kernel read of just those.

        :meth:`ShardReader.gather` of the shard's own sample numbers (with ``pread``, runs of
        neighbouring members in one read); ``index`` holds the base's global indices.

        Raises:
            SampleIndexError: If the range is outside the view's shard ``s``.
        """
        c = int(self.counts[s])
        if not 0 <= j0 <= j1 <= c:
            raise SampleIndexError(f"{self.paths[s]}: samples {j0}..{j1} out of range [0, {c})")
        a = self._starts_list[s]
        local = self.local[a + j0 : a + j1]
        b = self.base.reader(s).gather(local, fields, data=data)
        b.paths = [self.paths[s]]
        b.index = local + self.base.starts[s]
        return b

    def take_ready(self, pieces: Sequence[Sequence[int]], fields: Fields = None) -> int | None:
        """``None``: a view's windows read their blocks (:meth:`read_samples`)."""
        return None

    def take(self, indices: list[int]) -> list[Sample]:
        """:meth:`ShardSet.take` of view samples ``indices`` (``__index__``: the base's).

        Raises:
            SampleIndexError: If an index is outside the view.
        """
        return self.base.take(self._to_base(indices).tolist())

    def read_samples(
        self, s: int, j0: int, j1: int, fields: Fields = None, *, prefetch: bool = False
    ) -> list[Sample]:
        """The view's samples ``j0 <= j < j1`` of shard ``s``: ``read_block(...).to_samples()``.

        Raises:
            SampleIndexError: As :meth:`read_block`.
        """
        return self.read_block(s, j0, j1, fields, prefetch=prefetch).to_samples()

    def indices_of(self, key: str) -> list[int]:
        """View indices of the samples whose key is ``key`` (see :meth:`ShardSet.indices_of`)."""
        hits = np.asarray(self.base.indices_of(key), np.int64)
        at = np.searchsorted(self.indices, hits)
        ok = (at < len(self.indices)) & (
            self.indices[np.minimum(at, len(self.indices) - 1)] == hits
        )
        return at[ok].tolist() if len(self.indices) else []

    def index_of_many(self, keys: Sequence[str]) -> NDArray[np.int64]:
        """View indices of each key's sample, ``-1`` where none in the view (vectorised)."""
        g = self.base.index_of_many(keys)
        n = len(self.indices)
        at = np.searchsorted(self.indices, g)
        ok = (g >= 0) & (at < n)
        ok[ok] = self.indices[at[ok]] == g[ok]
        return np.where(ok, at, -1).astype(np.int64)

    def index_of(self, key: str) -> int:
        """The view index of the sample whose key is ``key`` (see :meth:`ShardSet.index_of`).

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

    def drop_prefetched(self) -> None:
        """Drop what the base's open remote shards fetched ahead and did not read yet."""
        self.base.drop_prefetched()

    def close(self) -> None:
        """Close the base's readers."""
        self.base.close()

    def __repr__(self) -> str:
        return f"ShardSubset({len(self)} of {len(self.base)} samples, {self.n_shards} shards)"
