"""Stable splits of a dataset's samples by a seeded hash of their keys (docs/SCALE.md).

The rule is :mod:`tarindex.plan.split` (pure: a key's part is a function of ``(key, seed,
fractions)``); this module reads the keys from the shards' indexes (each shard opened once,
its key blob hashed with the others, vectorised) and returns each part's sample indices, for
``subset=`` on the datasets or :class:`~tarindex.read.subset.ShardSubset`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
from numpy.typing import NDArray

from ..format.keyhash import key_hashes
from ..plan.split import part_names, split_parts, thresholds
from .shardset import ShardSet
from .sources import Source
from .subset import ShardSubset

__all__ = ["split_by_key"]


def split_by_key(
    source: Source | ShardSet | ShardSubset,
    fractions: Mapping[str, float] | Sequence[float],
    seed: int = 0,
) -> dict[str, NDArray[np.int64]]:
    """Split a dataset's samples into parts by a seeded hash of their keys.

    Key ``k`` goes to part ``p`` when its key hash (FORMAT.md §7, under ``seed``) falls in
    ``p``'s share of ``[0, 2**64)`` (:func:`tarindex.plan.split.thresholds`): a pure function
    of the key, so the split is the same however the samples are sharded, in whatever shard
    order, with shards added (their keys are split the same way; the old keys do not move).
    Each part holds about ``fraction * n`` samples (binomially: within a few ``sqrt(n * fraction)``).

    Every shard's keys are read from its index (each shard opened once) and hashed together,
    vectorised.

    Args:
        source: The dataset: a source (paths, globs, a manifest), a ``ShardSet``, or a
            ``ShardSubset`` (its samples split by the same rule: each part holds the view's
            samples of the base's part, as positions of the view).
        fractions: ``{"train": 0.8, "val": 0.1, "test": 0.1}`` (or a list: parts ``"0"``,
            ``"1"``, ...), non-negative, summing to 1.
        seed: ``0 <= seed < 2**64``. Defaults to ``0``.

    Returns:
        ``{part: int64 array}``: the global sample indices (positions, for a view) of each
        part, ascending; together every sample exactly once.

    Raises:
        ValueError: Bad fractions or seed.
        FormatError, StaleIndexError: As opening the shards (:meth:`ShardSet.reader`).
    """
    names, fs = part_names(fractions)
    thresholds(fs)  # validate before reading anything
    if isinstance(source, ShardSubset):  # the base's parts, as positions of the view
        whole = split_by_key(source.base, fractions, seed)
        return {
            k: np.flatnonzero(np.isin(source.indices, v)).astype(np.int64) for k, v in whole.items()
        }
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
