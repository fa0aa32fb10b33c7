"""The key hash (FORMAT.md §8): a seeded 64-bit hash of a sample key's bytes, vectorised.

One definition for the index's key table (FORMAT.md §2.8.3, seed 0) and for stable splits
(:mod:`tarindex.split`, the user's seed), so a key hashes the same way in every shard, in every
tarindex version and in any language that follows §8:

1. ``h = 0xcbf29ce484222325`` (the FNV-1a 64-bit offset basis);
2. FNV-1a over the 8 little-endian bytes of ``seed``, then over the key's bytes (as stored in
   the index, FORMAT.md §2.5): for each byte ``h = ((h ^ byte) * 0x100000001b3) mod 2**64``;
3. the MurmurHash3 ``fmix64`` finaliser: ``h ^= h >> 33; h *= 0xff51afd7ed558ccd;
   h ^= h >> 33; h *= 0xc4ceb9fe1a85ec53; h ^= h >> 33`` (all mod ``2**64``).

:func:`key_hashes` computes it for every key of a key blob at once: one numpy pass per byte
position (keys grouped by length), no Python object per key.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from numpy.typing import NDArray

__all__ = ["key_hash", "key_hashes", "LOOKUP_SEED"]

LOOKUP_SEED = 0
"""Seed of the key table in the index (FORMAT.md §2.8.3)."""

_BASIS = 0xCBF29CE484222325
_PRIME = 0x100000001B3
_M1 = 0xFF51AFD7ED558CCD
_M2 = 0xC4CEB9FE1A85EC53
_MASK = (1 << 64) - 1
_TAIL_KEYS = 8  # at most this many keys still running: a Python loop per byte beats a numpy pass


def _seeded(seed: int) -> int:
    s = int(seed)
    if not 0 <= s <= _MASK:
        raise ValueError(f"seed={seed!r}: expected an integer in [0, 2**64)")
    h = _BASIS
    for b in s.to_bytes(8, "little"):
        h = ((h ^ b) * _PRIME) & _MASK
    return h


def _fmix(h: int) -> int:
    h ^= h >> 33
    h = (h * _M1) & _MASK
    h ^= h >> 33
    h = (h * _M2) & _MASK
    return h ^ (h >> 33)


_SEEDED0 = _seeded(0)


def key_hash(key: bytes, seed: int = 0) -> int:
    """Return the 64-bit key hash of ``key`` (FORMAT.md §8), as a Python int.

    Args:
        key: The key's bytes (FORMAT.md §2.5: UTF-8, ``surrogateescape`` for other bytes).
        seed: ``0 <= seed < 2**64``. Defaults to ``0``.

    Raises:
        ValueError: If ``seed`` is out of range.
    """
    h = _SEEDED0 if seed == 0 else _seeded(seed)
    for b in key:
        h = ((h ^ b) * _PRIME) & _MASK
    return _fmix(h)


def key_hashes(
    blob: bytes | memoryview | NDArray[np.uint8],
    ptr: NDArray[np.integer[Any]] | list[int],
    seed: int = 0,
) -> NDArray[np.uint64]:
    """Return the key hash (FORMAT.md §8) of every key ``blob[ptr[i]:ptr[i+1]]``, vectorised.

    Cost: one numpy pass over the keys still that long per byte position, so about
    ``total key bytes`` element operations (1M keys of 8 bytes: ~0.1 s), no Python object per
    key; the last few keys still running (a handful of long names) are finished one by one,
    so one 1 MiB key costs ~0.2 s, not a numpy pass per byte (~5 s).

    Args:
        blob: Concatenated key bytes (``key_blob`` of an index, or several joined).
        ptr: Key boundaries, shape ``(n + 1,)``, non-decreasing, within ``blob``.
        seed: ``0 <= seed < 2**64``. Defaults to ``0``.

    Returns:
        ``uint64`` array of shape ``(n,)``.

    Raises:
        ValueError: If ``seed`` is out of range or ``ptr`` does not fit ``blob``.
    """
    b = np.frombuffer(blob, np.uint8) if not isinstance(blob, np.ndarray) else blob
    p = np.asarray(ptr, np.int64)
    n = len(p) - 1
    h0 = _seeded(seed)
    if n <= 0:
        return np.empty(0, np.uint64)
    start = p[:-1]
    length = p[1:] - start
    if int(length.min()) < 0 or int(p[0]) < 0 or int(p[-1]) > len(b):
        raise ValueError("key_hashes: ptr must be non-decreasing and within the blob")
    prime = np.uint64(_PRIME)
    lo, hi = int(length.min()), int(length.max())
    if lo == hi:  # every key the same length (the common case): no grouping
        order = None
        st = start
        active = np.full(hi, n, np.int64)
    else:  # longest first, so the keys still running at byte k are a prefix
        order = np.argsort(-length, kind="stable")
        st = start[order]
        desc = length[order]
        active = np.searchsorted(-desc, -np.arange(hi, dtype=np.int64), side="left")
    h = np.full(n, h0, np.uint64)
    pos = st.copy()
    for k in range(hi):
        c = int(active[k])
        if c <= _TAIL_KEYS:  # a few long keys left: finish them one by one (same rule)
            ends = (st[:c] + (length if order is None else length[order])[:c]).tolist()
            for i, (p0, p1) in enumerate(zip(pos[:c].tolist(), ends, strict=True)):
                hv = int(h[i])
                for byte in b[p0:p1].tobytes():
                    hv = ((hv ^ byte) * _PRIME) & _MASK
                h[i] = hv
            break
        hk = h[:c]
        hk ^= b[pos[:c]]
        hk *= prime
        pos[:c] += 1
    h ^= h >> np.uint64(33)
    h *= np.uint64(_M1)
    h ^= h >> np.uint64(33)
    h *= np.uint64(_M2)
    h ^= h >> np.uint64(33)
    if order is None:
        return h
    out = np.empty(n, np.uint64)
    out[order] = h
    return out
