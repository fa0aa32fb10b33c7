"""The pure mixing schedule (tarindex.plan.mix): no data, no torch."""

from __future__ import annotations

from collections import Counter
from itertools import pairwise

import numpy as np
import pytest
from numpy.typing import NDArray

from tarindex.plan.blocks import blocks_to_indices
from tarindex.plan.epoch import epoch_blocks, plan_span, plan_worker, rank_share, slot_span
from tarindex.plan.mix import (
    apportion,
    base_position,
    first_occurrence,
    mix_bound,
    mix_counts,
    mix_offsets,
    mix_schedule,
    mix_sources,
    mix_spans,
    mix_total,
)
from tarindex.plan.resume import resume_segments

# very different sizes: 2 and 3 sources, a tiny one, a prime one, equal ones, and empty ones
CASES = [
    [5000, 50],
    [4000, 300, 7],
    [1, 999],
    [333, 333, 334],
    [6, 4, 2],
    [0, 17, 0, 5],
    [40],
]


def window_excess(src: NDArray[np.int64], counts: list[int]) -> NDArray[np.float64]:
    """Per source, the largest |count in window - k * p_s| over ALL windows of the sequence.

    With D(t) = (count in the first t positions) - t * p_s, a window [a, b) has error
    D(b) - D(a), so the largest over all windows is max(D) - min(D) over t = 0..len.
    """
    n = sum(counts)
    out = np.zeros(len(counts))
    t = np.arange(len(src) + 1)
    for s, c in enumerate(counts):
        d = np.concatenate([[0], np.cumsum(src == s)]) - t * (c / n)
        out[s] = d.max() - d.min()
    return out


def brute_excess(src: list[int], counts: list[int]) -> NDArray[np.float64]:
    n, m = sum(counts), len(src)
    out = np.zeros(len(counts))
    for s, c in enumerate(counts):
        for a in range(m):
            k = 0
            for b in range(a, m):
                k += src[b] == s
                out[s] = max(out[s], abs(k - (b - a + 1) * c / n))
    return out


@pytest.mark.parametrize("counts", CASES)
def test_schedule_is_a_permutation_within_the_bound(counts: list[int]) -> None:
    n = sum(counts)
    bound = mix_bound(counts)
    for seed, epoch, shuffle in ((0, 0, False), (1, 0, True), (1, 1, True), (7, 2**40, True)):
        src, occ = mix_schedule(counts, seed, epoch, 0, n, shuffle)
        assert len(src) == n and Counter(src.tolist()) == {s: c for s, c in enumerate(counts) if c}
        for s, c in enumerate(counts):  # occurrences 0..c-1 once each, in order
            assert occ[src == s].tolist() == list(range(c))
        assert (window_excess(src, counts) <= bound + 1e-9).all(), (seed, epoch)
        # the bound holds across the wrap too (padding reads the stream's start again)
        twice, _ = mix_schedule(counts, seed, epoch, 0, 2 * n, shuffle)
        assert twice[:n].tolist() == twice[n:].tolist() == src.tolist()
        assert (window_excess(twice, counts) <= bound + 1e-9).all()


def test_first_occurrence_search_and_sources_alone() -> None:
    """``first_occurrence`` (guess, then bracket) is its definition: the first j at or past x."""
    rng = np.random.default_rng(4)
    for counts in [*CASES, [3, 1], [1, 1, 1, 1], [9999, 2, 1], [17, 5000, 0, 1]]:
        n, m = sum(counts), len(counts)
        for tie in ([*range(m)], rng.permutation(m).tolist()):
            for s, cs in enumerate(counts):
                base = [base_position(counts, tie, s, j) for j in range(cs)]
                xs = range(-1, n + 2) if n < 400 else rng.integers(-1, n + 2, 300).tolist()
                for x in xs:
                    want = next((j for j, p in enumerate(base) if p >= x), cs)
                    assert first_occurrence(counts, tie, s, x) == want, (counts, tie, s, x)
        for a, b in ((0, n), (n // 3, 2 * n + 5)):
            src, _ = mix_schedule(counts, 2, 5, a, b)
            assert mix_sources(counts, 2, 5, a, b).tolist() == src.tolist()


def test_bound_values_and_brute_force() -> None:
    assert mix_bound([10, 30]).tolist() == [1.0, 1.0]
    b3 = mix_bound([50, 30, 20])
    assert np.allclose(b3, [1.5, 1.3, 1.2]) and mix_bound([9]).tolist() == [0.0]
    assert mix_bound([0, 4, 0]).tolist() == [0.0, 0.0, 0.0]
    for counts in ([7, 3], [5, 4, 2], [1, 1, 9]):
        n = sum(counts)
        src, _ = mix_schedule(counts, 3, 1, 0, n)
        brute = brute_excess(src.tolist(), counts)
        assert np.allclose(brute, window_excess(src, counts))
        assert (brute <= mix_bound(counts) + 1e-9).all()


def test_a_random_schedule_breaks_the_bound() -> None:
    """The window check has teeth: i.i.d. order of the same counts drifts far beyond it."""
    counts = [4000, 300, 7]
    rng = np.random.default_rng(0)
    src = rng.permutation(np.repeat(np.arange(3), counts))
    assert (window_excess(src, counts)[:2] > 5 * mix_bound(counts)[:2]).all()


def test_ranges_offsets_and_purity() -> None:
    counts = [4000, 300, 7]
    n = sum(counts)
    full, focc = mix_schedule(counts, 5, 3, 0, 3 * n)
    for a, b in ((0, 1), (17, 4000), (n - 5, n + 9), (n, 2 * n + 3), (1234, 1234)):
        src, occ = mix_schedule(counts, 5, 3, a, b)
        assert src.tolist() == full[a:b].tolist() and occ.tolist() == focc[a:b].tolist()
        before = mix_offsets(counts, 5, 3, a)
        assert before.tolist() == [int((full[:a] == s).sum()) for s in range(3)]
        for s in range(3):  # occurrence = count before, modulo the source's count
            at = np.flatnonzero(src == s)
            assert (occ[at] == (before[s] + np.arange(len(at))) % counts[s]).all()
    e3, _ = mix_schedule(counts, 5, 3, 0, n)
    e4, _ = mix_schedule(counts, 5, 4, 0, n)
    assert e3.tolist() == mix_schedule(counts, 5, 3, 0, n)[0].tolist()  # pure
    assert e3.tolist() != e4.tolist()  # each epoch its own rotation
    plain, _ = mix_schedule(counts, 5, 3, 0, n, shuffle=False)
    assert plain.tolist() == mix_schedule(counts, 6, 9, 0, n, shuffle=False)[0].tolist()
    big = [10**9, 3 * 10**8, 10**6]  # near the 2**31 limit: exact integers, no sort
    src, occ = mix_schedule(big, 1, 0, 7 * 10**8, 7 * 10**8 + 50_000)
    assert (window_excess(src, big) <= mix_bound(big) + 1e-9).all()
    with pytest.raises(ValueError, match="2\\*\\*31"):
        mix_schedule([2**30, 2**30], 0, 0, 0, 1)
    with pytest.raises(ValueError, match="out of range"):
        mix_schedule([0, 0], 0, 0, 0, 1)


def test_spans_without_and_with_replacement() -> None:
    assert mix_spans(2, 5, 5, 9, 3, False) == [(3, 2, 5)]
    assert mix_spans(3, 7, 5, 9, 3, False) == [(3, 3, 5), (3, 0, 2)]  # padding wraps
    with pytest.raises(ValueError, match="replacement"):
        mix_spans(0, 1, 10, 9, 0, False)
    # with replacement the source's epochs follow each other across mixed epochs
    got = [mix_spans(0, 10, 10, 7, e, True) for e in range(7)]
    flat = [(q, j) for rows in got for q, a, b in rows for j in range(a, b)]
    assert flat == [(q, j) for q in range(10) for j in range(7)]
    assert sum(b - a for _, a, b in mix_spans(0, 4, 4, 100, 2, True)) == 4


def test_apportion_counts_and_totals() -> None:
    assert apportion([0.5, 0.3, 0.2], 10).tolist() == [5, 3, 2]
    assert apportion([1, 1, 1], 10).tolist() == [4, 3, 3]
    assert apportion([1, 2], 10, [2, None]).tolist() == [2, 8]
    assert apportion([1, 0, 1], 5).tolist() == [3, 0, 2]
    for w, t in (([0.1, 0.7, 0.2], 1001), ([3, 1e-9, 5], 77), ([1 / 3, 2 / 3], 999_999)):
        c = apportion(w, t)
        assert int(c.sum()) == t
        assert all(abs(int(ci) - t * wi / sum(w)) < 1 for ci, wi in zip(c, w, strict=True))
    with pytest.raises(ValueError, match="cannot place"):
        apportion([1, 1], 10, [2, 3])
    for bad in ([], [0, 0], [-1, 2], [float("nan"), 1], [float("inf"), 1]):
        with pytest.raises(ValueError, match="weights"):
            apportion(bad, 3)
    # default epoch: the largest in which no source without replacement repeats a sample
    assert mix_total([0.7, 0.3], [100, 1000], [False, False]) == 142
    assert mix_total([0.7, 0.3], [100, 1000], [True, False]) == 3333
    assert mix_total([1, 1], [100, 1000], [True, True]) == 1100
    c, rep = mix_counts([100, 1000], weights=[0.7, 0.3])
    assert c.tolist() == [99, 43] and rep == [False, False]
    c, rep = mix_counts([5, 8], counts=[9, 8], replacement=[True, False])
    assert c.tolist() == [9, 8]
    for kw, msg in (
        ({"counts": [6, 1]}, "without replacement"),
        ({"counts": [1, 1], "weights": [1, 1]}, "exactly one"),
        ({}, "exactly one"),
        ({"counts": [1]}, "1 values for 2"),
        ({"counts": [0, 0]}, "no sample"),
        ({"weights": [1, 1], "replacement": [True]}, "flags"),
    ):
        with pytest.raises(ValueError, match=msg):
            mix_counts([5, 8], **kw)
    with pytest.raises(ValueError, match="empty"):
        mix_counts([0, 8], counts=[1, 1], replacement=True)


def test_resume_segments_deal_what_is_left() -> None:
    n = 60
    for w0, k0, w1 in ((2, 7, 3), (3, 0, 2), (4, 15, 1), (2, 30, 5), (3, 11, 4)):
        p0 = rank_share(n, w0)
        left = [(r, j) for r in range(w0) for j in range(k0, p0)]  # rank order, plan order
        shares = [resume_segments(n, [(w0, k0)], r, w1) for r in range(w1)]
        got = [[(r, j) for r, a, b in sh.tolist() for j in range(a, b)] for sh in shares]
        assert len({len(g) for g in got}) == 1  # equal shares
        flat = [x for g in got for x in g]
        assert flat[: len(left)] == left  # exactly what was left, in order, dealt contiguously
        assert len(flat) - len(left) < w1  # padding: fewer than w1 repeated
        dropped = [
            [
                (r, j)
                for r, a, b in resume_segments(n, [(w0, k0)], q, w1, True).tolist()
                for j in range(a, b)
            ]
            for q in range(w1)
        ]
        assert [x for g in dropped for x in g] == left[: len(left) // w1 * w1]
    # two changes within one epoch: 2 ranks -> 5 -> 2 (no padding: 50 and 30 left)
    two = [resume_segments(n, [(2, 5), (5, 4)], r, 2) for r in range(2)]
    first = [resume_segments(n, [(2, 5)], r, 5) for r in range(5)]
    seen = {(r, j) for r in range(2) for j in range(5)}
    for f in first:
        seen |= set([(r, j) for r, a, b in f.tolist() for j in range(a, b)][:4])
    rest = [(r, j) for t in two for r, a, b in t.tolist() for j in range(a, b)]
    assert sorted(seen | set(rest)) == [(r, j) for r in range(2) for j in range(30)]
    assert not seen & set(rest) and len(rest) == 60 - len(seen)
    for bad in ([], [(2, 31)], [(2, -1)], [(0, 1)]):
        with pytest.raises(ValueError):
            resume_segments(n, bad, 0, 2)


def test_shares_are_contiguous_windows() -> None:
    """Each rank's and worker's share is a contiguous piece of the stream: the bound holds."""
    counts = [3000, 200, 9]
    n = sum(counts)
    bound = mix_bound(counts)
    for ws, nw in ((2, 2), (3, 2), (5, 3)):
        for r in range(ws):
            for w in range(nw):
                a, b = slot_span(n, r, ws, w, nw)
                src, _ = mix_schedule(counts, 2, 0, a, b)
                assert (window_excess(src, counts) <= bound + 1e-9).all()


def test_plan_span_reads_only_its_range() -> None:
    counts = [130, 7, 64, 99]
    starts = np.concatenate([[0], np.cumsum(counts)])
    n = sum(counts)
    kw: dict[str, int | bool] = {"buffer_size": 16, "shuffle": True}
    whole = plan_span(counts, 4, 2, 8, 0, n, **kw)  # type: ignore[arg-type]
    ref = plan_worker(counts, 4, 2, 8, buffer_size=16)
    assert whole.order(starts).tolist() == ref.order(starts).tolist()
    stream = blocks_to_indices(epoch_blocks(counts, 4, 2, 8), starts)
    cuts = [0, 37, 38, 200, n]
    parts = []
    for a, b in pairwise(cuts):
        p = plan_span(counts, 4, 2, 8, a, b, **kw)  # type: ignore[arg-type]
        got = p.order(starts)
        assert sorted(got.tolist()) == sorted(stream[a:b].tolist())  # only its own samples
        assert p.n_samples == b - a and p.n_windows == -(-(b - a) // 16)
        parts.append(got)
    assert sorted(np.concatenate(parts).tolist()) == list(range(n))
    with pytest.raises(ValueError):
        plan_span(counts, 4, 2, 8, 5, 4)
