"""Stable splits by a seeded hash of the key: the thresholds and each key's part (pure).

A key's part is a pure function of ``(key, seed, fractions)``: the key hash of FORMAT.md §7
under ``seed``, compared with the fractions' cumulative thresholds. Re-sharding (another
``maxcount``), re-ordering or adding shards never moves a key to another part, and every
process computes the same split from the keys alone (docs/SCALE.md, "Splits"). Hashing is
vectorised over a key blob (1M keys in about 0.1-0.2 s). Reading the keys of a dataset's
shards is :func:`tarindex.read.split.split_by_key`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
from numpy.typing import NDArray

from ..format.keyhash import key_hashes
from .checks import check_u64

__all__ = ["thresholds", "split_parts", "part_names", "split_keys"]

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


def part_names(fractions: Mapping[str, float] | Sequence[float]) -> tuple[list[str], list[float]]:
    """Return the parts' names and fractions, in part order.

    A mapping names its parts (``{"train": 0.9, "val": 0.1}``); a sequence's parts are
    ``"0"``, ``"1"``, ... Part ``k`` is the ``k``-th entry either way.
    """
    if isinstance(fractions, Mapping):
        return [str(k) for k in fractions], [float(v) for v in fractions.values()]
    fs = [float(f) for f in fractions]
    return [str(k) for k in range(len(fs))], fs


def split_keys(
    keys: Sequence[str], fractions: Mapping[str, float] | Sequence[float], seed: int = 0
) -> NDArray[np.int64]:
    """Return the part number of each key (the rule of :func:`tarindex.read.split.split_by_key`).

    For keys that live elsewhere (a metadata table to join). ``int64 (len(keys),)``; part
    ``k`` is the ``k``-th entry of ``fractions``.

    Raises:
        ValueError: As :func:`thresholds`, or a seed that is not an integer in ``[0, 2**64)``.
    """
    seed = check_u64("seed", seed)
    raw = [k.encode("utf-8", "surrogateescape") for k in keys]
    ptr = np.zeros(len(raw) + 1, np.int64)
    np.cumsum([len(k) for k in raw], out=ptr[1:])
    return split_parts(key_hashes(b"".join(raw), ptr, seed), part_names(fractions)[1])
