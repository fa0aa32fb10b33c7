"""Mixing several sources in one epoch: per-epoch counts, the schedule, its bound (pure).

The mixed stream of one epoch has ``N = sum(counts)`` positions; source ``s`` fills
``counts[s]`` of them. Occurrence ``j`` of source ``s`` has the key ``(j + 1/2) / counts[s]``
and the base stream is all occurrences sorted by key (ties: by a per-epoch tie order of the
sources). This is the Sainte-Lague divisor sequence: after any prefix of ``t`` positions each
source has ``n_s(t) = t * p_s + D_s(t)`` with ``|D_s| <= ((1 - p_s) + p_s * (m - 1)) / 2``
(``p_s = counts[s] / N``, ``m`` sources with a non-zero count), so any window of ``k``
consecutive positions holds ``k * p_s`` occurrences of ``s`` up to ``max D - min D <=
1 + (m - 2) * p_s`` (:func:`mix_bound`). Since ``D_s(N) = 0`` the sequence may be rotated
cyclically without changing that range: with ``shuffle`` the epoch's stream is the base
stream rotated by a seeded offset, with a seeded tie order. Positions are computed exactly
in integers (no sort, no floating point): position of occurrence ``j`` of ``s`` is ``j``
plus, for every other source ``r``, the number of its occurrences with a smaller key.

Each source reads its own occurrences from its own block plan (:func:`mix_spans`,
:func:`tarindex.plan.epoch.plan_span`, :func:`source_seed`); docs/STREAMING.md, "Mixing".
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from fractions import Fraction

import numpy as np
from numpy.typing import NDArray

from .blocks import IntArray
from .checks import check_int
from .seeds import TAG_MIX, TAG_MIX_SOURCE, make_rng

__all__ = [
    "source_seed",
    "apportion",
    "mix_total",
    "mix_counts",
    "mix_bound",
    "mix_schedule",
    "mix_sources",
    "mix_offsets",
    "mix_spans",
    "base_position",
    "first_occurrence",
]

_MIX_LIMIT = 1 << 31


def source_seed(seed: int, source: int) -> int:
    """Return the seed of source ``source``'s own plan inside a mix seeded with ``seed``.

    Two sources built from the same shards and seed are therefore still shuffled
    independently, and the whole mixed order is a pure function of ``(seed, epoch)``.

    Returns:
        An integer in ``[0, 2**63)``.

    Raises:
        ValueError: If ``seed`` is not in ``[0, 2**64)`` or ``source`` not in ``[0, 2**32)``.
    """
    return _source_seed(int(seed), int(source))


@functools.lru_cache(maxsize=256)
def _source_seed(seed: int, source: int) -> int:
    return int(make_rng(seed, 0, TAG_MIX_SOURCE, source).integers(0, 1 << 63))


def _fractions(weights: Sequence[float]) -> list[Fraction]:
    try:  # a float is read as its shortest decimal (0.1 -> 1/10, not 0.1000000000000000055)
        w = [Fraction(repr(float(x))) if isinstance(x, float) else Fraction(x) for x in weights]
    except (ValueError, OverflowError, TypeError) as e:
        raise ValueError(f"weights={list(weights)!r}: expected finite numbers >= 0 ({e})") from e
    if not w or any(x < 0 for x in w) or sum(w) <= 0:
        raise ValueError(
            f"weights={list(weights)!r}: expected numbers >= 0, at least one of them > 0"
        )
    return w


def apportion(
    weights: Sequence[float], total: int, caps: Sequence[int | None] | None = None
) -> NDArray[np.int64]:
    """Split ``total`` samples over sources in proportion to ``weights`` (largest remainder).

    Each source gets ``floor(total * w_s / sum(w))`` (at most its cap), and the samples left
    over go one each to the sources with the largest fractional remainders (ties: lower index
    first), skipping sources at their cap, in passes until none is left. Exact: weights are
    converted to fractions (a float as its shortest decimal, so ``0.1`` is ``1/10``).

    Args:
        weights: Non-negative weights, at least one positive, shape ``(m,)``.
        total: Samples to split, ``>= 0``.
        caps: Per source the most it may get (``None``: no cap), e.g. its size when it is
            sampled without replacement. Defaults to no caps.

    Returns:
        ``int64`` array of shape ``(m,)`` summing to ``total``; ``|c_s - total * w_s / sum(w)|
        < 1`` when no cap binds; a source of weight 0 gets 0.

    Raises:
        ValueError: Bad weights, a negative total, or caps too small to hold ``total``.
    """
    w = _fractions(weights)
    if int(total) < 0:
        raise ValueError(f"total={total!r}: expected >= 0")
    t = int(total)
    cap = [None] * len(w) if caps is None else list(caps)
    if len(cap) != len(w):
        raise ValueError(f"caps: {len(cap)} values for {len(w)} weights")
    big = t + 1
    lim = [0 if x == 0 else (big if c is None else int(c)) for x, c in zip(w, cap, strict=True)]
    quota = [t * x / sum(w) for x in w]
    out = [min(math.floor(q), m) for q, m in zip(quota, lim, strict=True)]
    order = sorted(range(len(w)), key=lambda i: (-(quota[i] - math.floor(quota[i])), i))
    left = t - sum(out)
    while left > 0:
        room = [i for i in order if out[i] < lim[i]]
        if not room:
            raise ValueError(
                f"cannot place {t} samples: the sources hold at most {sum(lim)} without "
                f"replacement (caps {cap}); lower the total or allow replacement"
            )
        for i in room[:left]:
            out[i] += 1
        left = t - sum(out)
    return np.asarray(out, dtype=np.int64)


def mix_total(weights: Sequence[float], sizes: Sequence[int], replacement: Sequence[bool]) -> int:
    """Return the default samples per epoch of a weighted mix.

    The largest ``N`` for which no source sampled without replacement needs more samples than
    it has: ``min over those sources of floor(size_s * sum(w) / w_s)`` (sources of weight 0
    left out). When every weighted source is sampled with replacement, ``sum(sizes)``.

    Raises:
        ValueError: Bad weights, or ``weights``/``sizes``/``replacement`` of different lengths.
    """
    w = _fractions(weights)
    if not len(w) == len(sizes) == len(replacement):
        raise ValueError("weights, sizes and replacement need one entry per source")
    lims = [
        math.floor(int(n) * sum(w) / x)
        for x, n, rep in zip(w, sizes, replacement, strict=True)
        if x > 0 and not rep
    ]
    return min(lims) if lims else int(sum(int(n) for n in sizes))


def mix_counts(
    sizes: Sequence[int],
    weights: Sequence[float] | None = None,
    counts: Sequence[int] | None = None,
    total: int | None = None,
    replacement: bool | Sequence[bool] = False,
) -> tuple[NDArray[np.int64], list[bool]]:
    """Resolve a mix's per-epoch sample counts from weights or explicit counts.

    Args:
        sizes: Samples in each source, shape ``(m,)``.
        weights: Relative weights (exclusive with ``counts``): ``total`` (default
            :func:`mix_total`) samples are split by :func:`apportion`, capped at the sizes of
            sources sampled without replacement.
        counts: Samples per epoch from each source (exclusive with ``weights``): Python or
            numpy integers ``>= 0`` (``5.5`` is refused, not truncated).
        total: Samples per epoch, only with ``weights``; an integer (the datasets'
            ``samples_per_epoch``).
        replacement: One flag for all sources or one per source; see :func:`mix_spans`.
            Defaults to ``False``.

    Returns:
        ``(counts, replacement)``: ``int64 (m,)`` counts and one flag per source.

    Raises:
        ValueError: Neither or both of ``weights``/``counts``, lengths that differ from
            ``sizes``, ``total`` with ``counts``, a count or ``total`` that is not an integer
            (the message names it, e.g. ``counts[0]=5.5``), a count above its source's size without
            replacement, a positive count from an empty source, or no sample at all.
    """
    m = len(sizes)
    if m == 0:
        raise ValueError("a mix needs at least one source")
    rep = [bool(replacement)] * m if isinstance(replacement, bool) else list(map(bool, replacement))
    if len(rep) != m:
        raise ValueError(f"replacement: {len(rep)} flags for {m} sources")
    if (weights is None) == (counts is None):
        raise ValueError("pass exactly one of weights= and counts=")
    if counts is not None:
        if total is not None:
            raise ValueError("samples_per_epoch/total goes with weights=, not counts=")
        c = np.asarray(
            [check_int(f"counts[{i}]", x, 0, _MIX_LIMIT) for i, x in enumerate(counts)],
            dtype=np.int64,
        )
        if len(c) != m:
            raise ValueError(f"counts: {len(c)} values for {m} sources")
    else:
        weights = list(weights or ())
        if len(weights) != m:
            raise ValueError(f"weights: {len(weights)} values for {m} sources")
        t = (
            mix_total(weights, sizes, rep)
            if total is None
            else check_int("samples_per_epoch", total, 0, _MIX_LIMIT)
        )
        c = apportion(weights, t, [None if r else int(n) for r, n in zip(rep, sizes, strict=True)])
    for s, (cs, n, r) in enumerate(zip(c.tolist(), sizes, rep, strict=True)):
        if cs > 0 and int(n) == 0:
            raise ValueError(f"source {s} is empty but is asked for {cs} samples per epoch")
        if cs > int(n) and not r:
            raise ValueError(
                f"source {s}: {cs} samples per epoch from {n} without replacement; pass "
                f"replacement=True (or a per-source list) or lower its count or weight"
            )
    if int(c.sum()) == 0:
        raise ValueError("the mix has no sample per epoch (all counts are 0)")
    _mix_counts(c)
    return c, rep


def _mix_counts(counts: IntArray) -> NDArray[np.int64]:
    c = np.asarray(counts, dtype=np.int64).reshape(-1)
    if c.size and int(c.min()) < 0:
        raise ValueError(f"counts={c.tolist()}: expected integers >= 0")
    if int(c.sum()) >= _MIX_LIMIT:
        raise ValueError(
            f"counts sum to {int(c.sum())}: a mixed epoch holds fewer than 2**31 samples "
            "(split it into several epochs)"
        )
    return c


def mix_bound(counts: IntArray) -> NDArray[np.float64]:
    """Return, per source, the bound of the mixing schedule over any window.

    For any ``k`` consecutive positions of one epoch's mixed stream (:func:`mix_schedule`,
    rotated or not, so also any contiguous share of a rank or worker), the number of
    positions of source ``s`` differs from ``k * p_s`` by at most ``1 + (m - 2) * p_s``,
    where ``p_s = counts[s] / sum(counts)`` and ``m`` is the number of sources with a non-zero
    count: at most 1 for two sources, below 2 for three, ``0`` for a single source.

    Returns:
        ``float64`` array of shape ``(len(counts),)`` (``0`` for a source of count 0).
    """
    c = _mix_counts(counts)
    n = int(c.sum())
    if n == 0:
        return np.zeros(len(c), dtype=np.float64)
    m = int((c > 0).sum())
    p = c / n
    out: NDArray[np.float64] = np.where(c > 0, 1.0 + (m - 2) * p, 0.0)
    return out


def base_position(c: list[int], tie: list[int], s: int, j: int) -> int:
    """Return the position of occurrence ``j`` of source ``s`` in the base (unrotated) stream.

    ``j`` plus, for every other source ``r``, the number of its occurrences whose key
    ``(i + 1/2) / c[r]`` is below ``(j + 1/2) / c[s]`` (equal keys: the lower ``tie`` first).
    Exact, in Python ints; strictly increasing in ``j``.

    Args:
        c: Positions per source, ``counts`` as a list of ints.
        tie: The epoch's tie order: ``tie[r] < tie[s]`` puts ``r`` first on equal keys.
        s: The source, ``0 <= s < len(c)``, ``c[s] > 0``.
        j: Its occurrence, ``0 <= j < c[s]``.

    Returns:
        The base position, in ``[0, sum(c))``.
    """
    pos, x, cs = j, 2 * j + 1, c[s]
    for r, cr in enumerate(c):
        if r != s and cr:
            big = x * cr
            m = big // cs if tie[r] < tie[s] else (big - 1) // cs
            pos += min((m + 1) // 2, cr)
    return pos


def first_occurrence(c: list[int], tie: list[int], s: int, x: int) -> int:
    """Return the first occurrence ``j`` of source ``s`` at base position ``>= x``.

    :func:`base_position` is strictly increasing in ``j`` and within ``m`` of
    ``(j + 1/2) N / c[s]``, so the search starts there and brackets outward (a few
    :func:`base_position` calls, not ``log2 c[s]``).

    Args:
        c: Positions per source, as :func:`base_position`.
        tie: The epoch's tie order, as :func:`base_position`.
        s: The source.
        x: A base position, ``0 <= x <= sum(c)``.

    Returns:
        The smallest such ``j``, or ``c[s]`` if none (``0`` when ``c[s] == 0``).
    """
    cs = c[s]
    if cs == 0:
        return 0
    # base_position(lo) < x <= base_position(hi), with base_position(-1) = -inf and
    # base_position(cs) = +inf
    lo, hi = -1, cs
    g = min(max((2 * x + 1) * cs // (2 * sum(c)), 0), cs - 1)
    step = 1
    if base_position(c, tie, s, g) >= x:
        hi = g
        while (t := hi - step) > lo:
            if base_position(c, tie, s, t) < x:
                lo = t
                break
            hi, step = t, 2 * step
    else:
        lo = g
        while (t := lo + step) < hi:
            if base_position(c, tie, s, t) >= x:
                hi = t
                break
            lo, step = t, 2 * step
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if base_position(c, tie, s, mid) >= x:
            hi = mid
        else:
            lo = mid
    return hi


def _mix_base(
    c: NDArray[np.int64], tie: list[int], x: int, y: int, occ: NDArray[np.int64] | None
) -> NDArray[np.int64]:
    """Source of base positions ``[x, y)``, ``0 <= x <= y <= N``; occurrences into ``occ``."""
    cl = c.tolist()
    src = np.empty(y - x, dtype=np.int64)
    for s, cs in enumerate(cl):
        if not cs:
            continue
        j = np.arange(
            first_occurrence(cl, tie, s, x), first_occurrence(cl, tie, s, y), dtype=np.int64
        )
        pos = j - x
        odd = 2 * j + 1
        for r, cr in enumerate(cl):
            if r != s and cr:
                big = odd * cr
                m = big // cs if tie[r] < tie[s] else (big - 1) // cs
                m += 1
                m >>= 1  # m >= 0: (m + 1) // 2, as in base_position
                pos += np.minimum(m, cr, out=m)
        src[pos] = s
        if occ is not None:
            occ[pos] = j
    return src


def _mix_epoch(c: NDArray[np.int64], seed: int, epoch: int, shuffle: bool) -> tuple[int, list[int]]:
    n = int(c.sum())
    if not shuffle or n == 0:
        return 0, list(range(len(c)))
    phi, tie = _mix_epoch_rng(tuple(c.tolist()), n, int(seed), int(epoch))
    return phi, list(tie)


@functools.lru_cache(maxsize=64)
def _mix_epoch_rng(
    c: tuple[int, ...], n: int, seed: int, epoch: int
) -> tuple[int, tuple[int, ...]]:
    """The epoch's rotation and tie order (memoised: a mix asks for them a few times an epoch)."""
    rng = make_rng(seed, epoch, TAG_MIX)
    tie = np.empty(len(c), dtype=np.int64)
    tie[rng.permutation(len(c))] = np.arange(len(c))
    return int(rng.integers(0, n)), tuple(tie.tolist())


def mix_schedule(
    counts: IntArray,
    seed: int,
    epoch: int,
    start: int,
    stop: int,
    shuffle: bool = True,
) -> tuple[NDArray[np.int64], NDArray[np.int64]]:
    """Return which source fills each position ``[start, stop)`` of an epoch's mixed stream.

    The epoch's stream has ``N = sum(counts)`` positions, ``counts[s]`` of them source ``s``,
    spread as evenly as :func:`mix_bound` states over every window. With ``shuffle`` it is
    rotated by a seeded offset and ties are broken in a seeded source order; both are pure
    functions of ``(seed, epoch)`` and keep the bound. Positions ``>= N`` wrap (``p`` means
    ``p % N``), for the padding of :func:`tarindex.plan.epoch.slot_span`. Cost:
    ``O((stop - start) * m)`` time and memory plus ``O(m^2 log N)``, whatever ``N``.

    Args:
        counts: Positions per source this epoch, shape ``(m,)``, integers ``>= 0``, summing
            to less than ``2**31``.
        seed: Base seed, ``0 <= seed < 2**64``.
        epoch: Epoch, ``0 <= epoch < 2**64``.
        start: First position, ``>= 0``.
        stop: End position (exclusive).
        shuffle: Rotate and permute ties (see above). Defaults to ``True``.

    Returns:
        ``(src, occ)``, two ``int64`` arrays of shape ``(max(stop - start, 0),)``: the source
        of each position, and its occurrence number within that source this epoch (in
        ``[0, counts[src])``; the occurrences of a source appear in increasing order, ``0``
        first, except where positions wrap).

    Raises:
        ValueError: Negative counts, a sum of ``2**31`` or more, a negative ``start``, a
            non-empty range over zero samples, or bad ``seed``/``epoch``.
    """
    src, occ = _mix_positions(counts, seed, epoch, start, stop, shuffle, True)
    assert occ is not None  # with_occ
    return src, occ


def mix_sources(
    counts: IntArray,
    seed: int,
    epoch: int,
    start: int,
    stop: int,
    shuffle: bool = True,
) -> NDArray[np.int64]:
    """Return :func:`mix_schedule`'s ``src`` alone (cheaper: no occurrence numbers).

    Arguments, result and errors as :func:`mix_schedule`'s first array.
    """
    return _mix_positions(counts, seed, epoch, start, stop, shuffle, False)[0]


def _mix_positions(
    counts: IntArray, seed: int, epoch: int, start: int, stop: int, shuffle: bool, with_occ: bool
) -> tuple[NDArray[np.int64], NDArray[np.int64] | None]:
    c = _mix_counts(counts)
    n = int(c.sum())
    a, b = int(start), int(stop)
    if b <= a:
        return np.empty(0, dtype=np.int64), np.empty(0, dtype=np.int64)
    if a < 0 or n == 0:
        raise ValueError(f"positions [{a}, {b}) out of range for a mix of {n} samples")
    phi, tie = _mix_epoch(c, seed, epoch, shuffle)
    srcs: list[NDArray[np.int64]] = []
    occs: list[NDArray[np.int64]] = []
    t = a
    while t < b:
        x = (t + phi) % n
        y = min(n, x + (b - t))
        o = np.empty(y - x, dtype=np.int64) if with_occ else None
        srcs.append(_mix_base(c, tie, x, y, o))
        if o is not None:
            occs.append(o)
        t += y - x
    src = srcs[0] if len(srcs) == 1 else np.concatenate(srcs)
    if not with_occ:
        return src, None
    cl = c.tolist()
    jphi = np.asarray([first_occurrence(cl, tie, s, phi) for s in range(len(cl))], dtype=np.int64)
    occ = occs[0] if len(occs) == 1 else np.concatenate(occs)
    cs = np.maximum(c, 1)[src]
    occ = (occ - jphi[src]) % cs
    return src, occ


def mix_offsets(
    counts: IntArray, seed: int, epoch: int, pos: int, shuffle: bool = True
) -> NDArray[np.int64]:
    """Return how many positions of each source come before position ``pos`` of the stream.

    The same stream as :func:`mix_schedule`; past ``N = sum(counts)`` the count keeps growing
    (``counts`` per wrap), so the occurrences of source ``s`` in positions ``[a, b)`` are
    ``mix_offsets(.., a)[s] .. mix_offsets(.., b)[s] - 1``, each taken modulo ``counts[s]``.
    Cost ``O(m^2 log N)``, no per-position work.

    Returns:
        ``int64`` array of shape ``(m,)``.

    Raises:
        ValueError: As :func:`mix_schedule`, or a negative ``pos``.
    """
    c = _mix_counts(counts)
    n, p = int(c.sum()), int(pos)
    if p < 0:
        raise ValueError(f"pos={pos!r}: expected >= 0")
    if n == 0:
        return np.zeros(len(c), dtype=np.int64)
    phi, tie = _mix_epoch(c, seed, epoch, shuffle)
    cl = c.tolist()
    cyc, x = divmod(phi + p, n)
    return np.asarray(
        [
            first_occurrence(cl, tie, s, x) + cs * cyc - first_occurrence(cl, tie, s, phi)
            for s, cs in enumerate(cl)
        ],
        dtype=np.int64,
    )


def mix_spans(
    first: int, stop: int, count: int, size: int, epoch: int, replacement: bool
) -> list[tuple[int, int, int]]:
    """Map occurrences ``[first, stop)`` of one source in a mixed epoch to its own epochs.

    Occurrences are numbered as :func:`mix_offsets` does (occurrence ``u`` is the source's
    ``u mod count``-th sample of the epoch; ``u >= count`` only in the padding). Without
    replacement, occurrence ``o`` of mixed epoch ``e`` is position ``o`` of the source's epoch
    ``e`` (so ``count <= size``: a different random subset each epoch when ``count <
    size``). With replacement the source's stream is its epochs ``0, 1, 2, ...`` concatenated
    and mixed epoch ``e`` takes its positions ``[e * count, (e + 1) * count)``: a sample
    repeats only after every sample of the source has been seen, and a source sampled below
    its size is still seen whole over the epochs.

    Args:
        first: First occurrence, ``>= 0``.
        stop: End occurrence (exclusive).
        count: The source's positions per mixed epoch.
        size: Samples in the source, ``>= 1`` when ``count > 0``.
        epoch: Mixed epoch.
        replacement: See above.

    Returns:
        Rows ``(source_epoch, start, stop)`` of Python ints, in order: half-open ranges of
        positions in the yield order of the source's plan of ``source_epoch``; their lengths
        sum to ``max(stop - first, 0)``.

    Raises:
        ValueError: Without replacement and ``count > size``.
    """
    u0, u1, cnt, n = int(first), int(stop), int(count), int(size)
    if u1 <= u0:
        return []
    if not replacement and cnt > n:
        raise ValueError(
            f"{cnt} samples per epoch from a source of {n} without replacement; "
            "pass replacement=True for that source or lower its count or weight"
        )
    rows: list[tuple[int, int, int]] = []
    while u0 < u1:  # one piece per wrap of the padding
        o0 = u0 % cnt
        o1 = o0 + min(u1 - u0, cnt - o0)
        u0 += o1 - o0
        if not replacement:
            rows.append((int(epoch), o0, o1))
            continue
        g0, g1 = int(epoch) * cnt + o0, int(epoch) * cnt + o1
        while g0 < g1:
            q = g0 // n
            e = min(g1, (q + 1) * n)
            rows.append((q, g0 - q * n, e - q * n))
            g0 = e
    return rows
