"""The pure streaming planner (tarindex.plan.epoch, .blocks, .seeds): no data, no torch."""

from __future__ import annotations

import subprocess
import sys
from collections import Counter

import numpy as np
import pytest
from numpy.typing import NDArray

from tarindex.plan.blocks import blocks_to_indices, slice_blocks
from tarindex.plan.epoch import (
    batch_span,
    epoch_blocks,
    plan_worker,
    rank_share,
    slot_span,
    window_order,
)
from tarindex.plan.seeds import make_rng


def starts_of(counts: list[int]) -> NDArray[np.int64]:
    out = np.zeros(len(counts) + 1, dtype=np.int64)
    np.cumsum(counts, out=out[1:])
    return out


def all_orders(
    counts: list[int],
    ws: int,
    nw: int,
    *,
    seed: int = 0,
    epoch: int = 0,
    block: int = 4,
    buf: int = 5,
    shuffle: bool = True,
    drop_last: bool = False,
) -> dict[tuple[int, int], list[int]]:
    st = starts_of(counts)
    return {
        (r, w): plan_worker(
            counts,
            seed,
            epoch,
            block,
            r,
            ws,
            w,
            nw,
            buffer_size=buf,
            shuffle=shuffle,
            drop_last=drop_last,
        )
        .order(st)
        .tolist()
        for r in range(ws)
        for w in range(nw)
    }


CONFIGS = [
    # counts, world_size, num_workers
    ([60], 1, 1),
    ([13, 5, 11, 1, 9, 17, 10], 3, 2),  # 7 uneven shards, 3 ranks, 2 workers; 66 samples
    ([30, 30], 2, 3),
    ([12], 4, 8),  # one shard, more ranks x workers than shards (and than samples per rank)
    ([0, 8, 0, 4], 2, 2),  # empty shards
    ([1] * 12, 3, 2),  # many one-sample shards
]


@pytest.mark.parametrize("counts,ws,nw", CONFIGS)
@pytest.mark.parametrize("shuffle", [True, False])
def test_exactly_once_and_equal_counts(counts: list[int], ws: int, nw: int, shuffle: bool) -> None:
    n = sum(counts)
    assert n % ws == 0
    orders = all_orders(counts, ws, nw, shuffle=shuffle)
    flat = [i for o in orders.values() for i in o]
    assert sorted(flat) == list(range(n))
    per_rank = [sum(len(orders[r, w]) for w in range(nw)) for r in range(ws)]
    assert per_rank == [n // ws] * ws
    # worker w yields the same count on every rank (=> same batch count per rank)
    for w in range(nw):
        assert len({len(orders[r, w]) for r in range(ws)}) == 1


@pytest.mark.parametrize(
    "counts,ws,nw", [([5, 7, 5], 2, 2), ([5, 7, 5], 3, 2), ([3], 4, 2), ([1], 4, 8)]
)
@pytest.mark.parametrize("shuffle", [True, False])
def test_remainder_policy(counts: list[int], ws: int, nw: int, shuffle: bool) -> None:
    n = sum(counts)
    blocks = epoch_blocks(counts, 0, 0, 4, shuffle)
    stream = blocks_to_indices(blocks, starts_of(counts)).tolist()
    # pad: every sample at least once; the first (ws*P - n) of the stream twice
    pad = all_orders(counts, ws, nw, shuffle=shuffle, drop_last=False)
    p = -(-n // ws)
    assert all(sum(len(pad[r, w]) for w in range(nw)) == p for r in range(ws))
    got = Counter(i for o in pad.values() for i in o)
    extra = ws * p - n
    want = Counter(stream) + Counter(stream[i % n] for i in range(extra))
    assert got == want
    # drop: the last (n - ws*P) of the stream are not yielded, the rest exactly once
    drop = all_orders(counts, ws, nw, shuffle=shuffle, drop_last=True)
    p = n // ws
    assert all(sum(len(drop[r, w]) for w in range(nw)) == p for r in range(ws))
    flat = [i for o in drop.values() for i in o]
    assert sorted(flat) == sorted(stream[: ws * p])


def test_determinism_and_epochs() -> None:
    counts = [13, 5, 11, 1, 9, 17, 10]
    a = all_orders(counts, 3, 2, seed=7, epoch=3)
    assert a == all_orders(counts, 3, 2, seed=7, epoch=3)
    assert a != all_orders(counts, 3, 2, seed=7, epoch=4)
    assert a != all_orders(counts, 3, 2, seed=8, epoch=3)
    # seed + epoch would collide here; the SeedSequence words do not
    assert all_orders(counts, 1, 1, seed=0, epoch=1) != all_orders(counts, 1, 1, seed=1, epoch=0)
    assert all_orders(counts, 1, 1, seed=2**32, epoch=0) != all_orders(
        counts, 1, 1, seed=0, epoch=1
    )
    # every rank ends up with different samples in different epochs
    e0 = all_orders(counts, 3, 2, epoch=0)
    e1 = all_orders(counts, 3, 2, epoch=1)
    assert all(set(e0[k]) != set(e1[k]) for k in e0)


def test_shuffle_false_is_stored_order() -> None:
    counts = [5, 7, 5, 3]  # 20 samples
    o = all_orders(counts, 2, 3, shuffle=False)
    assert o[0, 0] + o[0, 1] + o[0, 2] == list(range(10))
    assert o[1, 0] + o[1, 1] + o[1, 2] == list(range(10, 20))
    assert [len(o[0, w]) for w in range(3)] == [4, 3, 3]


def test_blocks_cover_shards() -> None:
    counts = [13, 0, 5, 64, 1]
    for shuffle in (True, False):
        for bs in (1, 4, 16, 100):
            b = epoch_blocks(counts, 3, 1, bs, shuffle)
            assert b.dtype == np.int64 and b.shape[1] == 3
            lens = b[:, 2] - b[:, 1]
            assert lens.min() >= 1 and lens.max() <= bs
            for s, c in enumerate(counts):
                rows = sorted(map(tuple, b[b[:, 0] == s, 1:].tolist()))
                assert [j for a, e in rows for j in range(a, e)] == list(range(c))
    # shuffled cut points move between epochs
    b0 = epoch_blocks([64], 0, 0, 8)
    b1 = epoch_blocks([64], 0, 1, 8)
    assert set(b0[:, 1].tolist()) != set(b1[:, 1].tolist())


def test_window_is_a_pure_function_and_resume_is_exact() -> None:
    counts = [13, 5, 11, 1, 9, 17, 10]
    st = starts_of(counts)
    p = plan_worker(counts, 5, 2, 4, 1, 3, 1, 2, buffer_size=4)
    full = p.order(st).tolist()
    assert p.n_samples == len(full) == 11
    for k in range(p.n_samples + 1):
        # resume at position k: re-read window k // B and skip k % B of it
        tail: list[int] = []
        for w in range(k // 4, p.n_windows):
            pieces, perm = p.window(w)
            idx = blocks_to_indices(pieces, st)
            assert perm is not None
            ordered = idx[perm].tolist()
            tail += ordered[k - w * 4 :] if w == k // 4 else ordered
        assert tail == full[k:]
    np.testing.assert_array_equal(window_order(9, 1, 2, 3, 4, 5), window_order(9, 1, 2, 3, 4, 5))
    assert window_order(9, 1, 2, 3, 4, 5).tolist() != window_order(9, 1, 2, 3, 4, 6).tolist()


def test_mixing_moves_samples_across_blocks() -> None:
    counts = [1000]
    st = starts_of(counts)
    o = plan_worker(counts, 0, 0, 10, buffer_size=100).order(st)
    # not block order any more: few consecutive pairs stay consecutive
    keep = np.mean(np.abs(np.diff(o)) == 1)
    assert keep < 0.1
    nobuf = plan_worker(counts, 0, 0, 10, buffer_size=0).order(st)
    assert np.mean(np.abs(np.diff(nobuf)) == 1) > 0.8


def test_slice_blocks_wrap() -> None:
    b = np.array([[0, 0, 3], [1, 2, 4]], dtype=np.int64)  # 5 positions
    assert slice_blocks(b, 1, 4).tolist() == [[0, 1, 3], [1, 2, 3]]
    assert slice_blocks(b, 4, 7, wrap=True).tolist() == [[1, 3, 4], [0, 0, 2]]
    assert slice_blocks(b, 3, 3).shape == (0, 3)
    with pytest.raises(ValueError, match="out of range"):
        slice_blocks(b, 4, 7)


def test_bad_arguments() -> None:
    with pytest.raises(ValueError, match="block_size"):
        epoch_blocks([5], 0, 0, 0)
    with pytest.raises(ValueError, match="seed"):
        make_rng(-1, 0, 0)
    with pytest.raises(ValueError, match="rank"):
        slot_span(10, 2, 2)
    with pytest.raises(ValueError, match="worker"):
        slot_span(10, 0, 2, 3, 3)
    with pytest.raises(ValueError, match="world_size"):
        rank_share(10, 0)


def test_planner_imports_no_torch() -> None:
    code = (
        "import sys, tarindex.plan.blocks, tarindex.plan.epoch, tarindex.plan.mix, "
        "tarindex.plan.resume, tarindex.plan.seeds, tarindex.plan.split; "
        "assert 'torch' not in sys.modules, 'torch imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.parametrize(
    "n,ws,nw,bsz,drop_last",
    [
        (100, 2, 3, 8, False),
        (101, 3, 2, 5, True),
        (7, 4, 3, 2, False),
        (64, 1, 4, 64, False),
        (1000, 3, 5, 7, False),
        (5, 2, 8, 4, True),
    ],
)
def test_batches_dealt_whole_equal_on_every_rank(
    n: int, ws: int, nw: int, bsz: int, drop_last: bool
) -> None:
    counts = [n // 3, n - 2 * (n // 3), n // 3]
    per_rank_batches = set()
    seen: Counter[int] = Counter()
    for r in range(ws):
        a0, b0 = slot_span(n, r, ws, 0, 1, drop_last)
        spans = [batch_span(n, r, ws, w, nw, bsz, drop_last) for w in range(nw)]
        # the workers' spans tile the rank's share, in order, and start on the batch grid
        assert spans[0][0] == a0 and spans[-1][1] == b0
        assert all(spans[k][1] == spans[k + 1][0] for k in range(nw - 1))
        assert all((a - a0) % bsz == 0 for a, b in spans if b > a)
        # only the worker holding the rank's last batch has a short one
        short = [w for w, (a, b) in enumerate(spans) if b > a and (b - a) % bsz]
        assert len(short) <= 1 and all(spans[w][1] == b0 for w in short)
        per_rank_batches.add(sum(-(-(b - a) // bsz) for a, b in spans))
        for w in range(nw):
            p = plan_worker(
                counts, 3, 1, 4, r, ws, w, nw, buffer_size=6, drop_last=drop_last, batch_size=bsz
            )
            assert p.n_samples == spans[w][1] - spans[w][0]
            seen.update(p.order(starts_of(counts)).tolist())
    assert len(per_rank_batches) == 1  # every rank yields the same number of batches
    if n % ws == 0:
        assert sorted(seen) == list(range(n)) and set(seen.values()) == {1}
    with pytest.raises(ValueError):
        batch_span(n, 0, ws, nw, nw, bsz)
    with pytest.raises(ValueError):
        batch_span(n, 0, ws, 0, nw, 0)
