"""MixedDataset and MixSampler: proportions over windows, exactly-once, resume, real DataLoaders."""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from torch.utils.data import ConcatDataset, DataLoader  # noqa: E402

import tarindex  # noqa: E402
from tarindex import MixedDataset, MixSampler, TarDataset, TarIterableDataset  # noqa: E402
from tarindex.plan.epoch import rank_share  # noqa: E402
from tarindex.plan.mix import mix_bound  # noqa: E402

from ..plan.test_mix_schedule import window_excess  # noqa: E402

pytestmark = pytest.mark.filterwarnings(
    "ignore:This DataLoader will create", "ignore:'set_vital' is deprecated"
)

SIZES = {"big": [300, 200, 100], "mid": [40, 20], "tiny": [6]}  # 600, 60 and 6 samples
BS = 4


def ids(batch: list[dict[str, Any]]) -> list[tuple[int, int]]:
    """collate_fn: a batch as (source, index-in-source) pairs (module level: picklable)."""
    return [(int(s["__source__"]), int(s["__index__"])) for s in batch]


@pytest.fixture
def paths(make_shards: Any) -> dict[str, list[str]]:
    return {
        name: make_shards(sizes, name=name, seed=i) for i, (name, sizes) in enumerate(SIZES.items())
    }


def sources(paths: dict[str, list[str]], **kw: Any) -> list[TarIterableDataset]:
    return [TarIterableDataset(paths[name], block_size=8, buffer_size=16, **kw) for name in SIZES]


def keys(batch: list[dict[str, Any]]) -> list[str]:
    return [str(s["__key__"]) for s in batch]


def mixed(srcs: list[TarIterableDataset], **kw: Any) -> MixedDataset:
    """A MixedDataset whose samples carry ``__source__``."""
    return MixedDataset(srcs, source_key="__source__", **kw)


def flat(batches: list[list[tuple[int, int]]]) -> list[tuple[int, int]]:
    return [x for b in batches for x in b]


def test_weights_windows_and_exactly_once(paths: dict[str, list[str]]) -> None:
    mix = mixed(sources(paths), weights=[0.6, 0.3, 0.1], seed=1)
    # default epoch: the largest without repeating a sample: tiny (6 at weight 0.1) -> 60
    assert mix.counts.tolist() == [36, 18, 6] and len(mix) == 60
    full = mixed(sources(paths), counts=[600, 60, 6], seed=1)
    got = [(s["__source__"], s["__index__"], s["__key__"], s["cls"]) for s in full]
    assert len(got) == len(full) == 666
    pairs = [(a, b) for a, b, _, _ in got]
    assert sorted(pairs) == [(s, i) for s, n in enumerate((600, 60, 6)) for i in range(n)]
    for s, i, key, cls in got[:50]:  # the samples are the sources' own
        ref = TarDataset(paths[list(SIZES)[s]])[i]
        assert key == ref["__key__"] and cls == ref["cls"]
    src = np.asarray([a for a, _ in pairs])
    assert (window_excess(src, [600, 60, 6]) <= mix_bound([600, 60, 6]) + 1e-9).all()
    assert (mix.order(0)[0] == np.asarray([s["__source__"] for s in mix])).all()
    o_src, o_idx = full.order(0)
    assert list(zip(o_src.tolist(), o_idx.tolist(), strict=True)) == pairs
    # epochs: same (seed, epoch) same order, another epoch another order, same set
    full.set_epoch(0)
    again = [(s["__source__"], s["__index__"]) for s in full]
    nxt = [(s["__source__"], s["__index__"]) for s in full]
    assert again == pairs and nxt != pairs and sorted(nxt) == sorted(pairs)


def test_counts_with_and_without_replacement(paths: dict[str, list[str]]) -> None:
    # tiny upsampled 10x with replacement, big downsampled without
    mix = mixed(sources(paths), counts=[100, 60, 60], replacement=[False, False, True])
    seen: dict[int, Counter[int]] = {0: Counter(), 1: Counter(), 2: Counter()}
    for e in range(3):
        mix.set_epoch(e)
        epoch = [(s["__source__"], s["__index__"]) for s in mix]
        c = Counter(s for s, _ in epoch)
        assert c == {0: 100, 1: 60, 2: 60}
        per = {s: [i for t, i in epoch if t == s] for s in range(3)}
        assert len(set(per[0])) == 100 and sorted(per[1]) == list(range(60))
        assert set(Counter(per[2]).values()) == {10}  # each tiny sample 10x, never 9 and 11
        for s in range(3):
            seen[s].update(per[s])
        src = np.asarray([s for s, _ in epoch])
        assert (window_excess(src, [100, 60, 60]) <= mix_bound([100, 60, 60]) + 1e-9).all()
    assert len(seen[0]) > 200  # a different subset of big each epoch
    with pytest.raises(ValueError, match="without replacement"):
        mixed(sources(paths), counts=[10, 10, 7])
    # by default the samples are the sources' own; source_key reaches a transform too
    plain = next(iter(MixedDataset(sources(paths), counts=[1, 1, 1])))
    assert "__source__" not in plain and set(plain) == {
        "__key__",
        "__shard__",
        "__index__",
        "bin",
        "cls",
        "txt",
    }
    tsrc = [TarIterableDataset(paths[n], transform=lambda d: d["__source__"]) for n in SIZES]
    got_t = list(MixedDataset(tsrc, counts=[5, 5, 5], source_key="__source__"))
    assert sorted(got_t) == [0] * 5 + [1] * 5 + [2] * 5
    with pytest.raises(TypeError, match="TarIterableDataset"):
        MixedDataset([TarDataset(paths["big"])], counts=[1])
    batched = TarIterableDataset(paths["big"], batched=True, batch_size=4)
    with pytest.raises(ValueError, match="batched"):
        MixedDataset([batched], counts=[1])


@pytest.mark.parametrize("drop_last", [False, True])
def test_ranks_equal_counts_in_process(paths: dict[str, list[str]], drop_last: bool) -> None:
    for counts in ([600, 60, 6], [600, 60, 7]):  # 666 = 2*3*111, 667 = 23*29
        n = sum(counts)
        for ws in (2, 3):
            per = [
                [
                    (s["__source__"], s["__index__"])
                    for s in mixed(
                        sources(paths, shuffle=True),
                        counts=counts,
                        rank=r,
                        world_size=ws,
                        drop_last=drop_last,
                        replacement=[False, False, counts[2] > 6],
                    )
                ]
                for r in range(ws)
            ]
            assert {len(p) for p in per} == {rank_share(n, ws, drop_last)}
            c = Counter(x for p in per for x in p)
            if n % ws == 0:
                assert set(c.values()) == {1} and len(c) == n


@pytest.mark.timeout(90)
def test_dataloader_workers_windows(paths: dict[str, list[str]]) -> None:
    counts = [600, 60, 6]
    mix = mixed(sources(paths), counts=counts, seed=4)
    mix.set_epoch(2)
    got = list(DataLoader(mix, batch_size=BS, num_workers=2, collate_fn=ids))
    pairs = flat(got)
    assert sorted(pairs) == [(s, i) for s, n in enumerate(counts) for i in range(n)]
    # each worker's part is exactly its planned share, in order
    w = [list(zip(*mix.order(2, k, 2), strict=True)) for k in range(2)]
    assert [x for b in got[0::2] for x in b] == w[0] and [x for b in got[1::2] for x in b] == w[1]
    # the loader interleaves two contiguous shares: any window within 2x the bound
    src = np.asarray([s for s, _ in pairs])
    assert (window_excess(src, counts) <= 2 * mix_bound(counts) + 1e-9).all()


def test_resume_in_process(paths: dict[str, list[str]]) -> None:
    kw: dict[str, Any] = {"counts": [600, 60, 6], "seed": 9, "rank": 2, "world_size": 3}
    ref = mixed(sources(paths), **kw)
    ref.set_epoch(3)
    full = [(s["__source__"], s["__index__"]) for s in ref]
    sizes = set()
    for k in sorted({0, 1, 15, 16, 17, len(full) // 2, len(full) - 1, len(full)}):
        mix = mixed(sources(paths), **kw)
        mix.set_epoch(3)
        it = iter(mix)
        head = [(s["__source__"], s["__index__"]) for s in (next(it) for _ in range(k))]
        state = mix.state_dict()
        assert state["epoch"] == 3 and state["consumed"] == k
        sizes.add(len(json.dumps(state)))
        fresh = mixed(sources(paths), **{**kw, "seed": 0})  # the seed comes from the state
        fresh.load_state_dict(state)
        assert fresh.state_dict() == state
        assert head + [(s["__source__"], s["__index__"]) for s in fresh] == full
        ref.set_epoch(4)
        assert [s["__index__"] for s in fresh] == [s["__index__"] for s in ref]  # then epoch 4
    assert max(sizes) < 600  # a few ints per source, no per-sample list
    state = mixed(sources(paths), **kw).state_dict()
    with pytest.raises(ValueError, match="world_size"):
        mixed(sources(paths), **{**kw, "rank": 0, "world_size": 2}).load_state_dict(state)
    with pytest.raises(ValueError, match="counts"):
        mixed(sources(paths), **{**kw, "counts": [600, 60, 5]}).load_state_dict(state)


@pytest.mark.timeout(150)
def test_stateful_dataloader_resume(paths: dict[str, list[str]]) -> None:
    sdl = pytest.importorskip("torchdata.stateful_dataloader")

    def make() -> Any:
        mix = mixed(
            sources(paths), weights=[5, 3, 2], replacement=True, samples_per_epoch=200, seed=2
        )
        mix.set_epoch(1)
        return sdl.StatefulDataLoader(mix, batch_size=BS, num_workers=2, collate_fn=ids)

    full = list(make())
    assert len(flat(full)) == 200
    for k in (1, 20, len(full) - 1):
        loader = make()
        head = []
        for b in loader:
            head.append(b)
            if len(head) == k:
                break
        state = loader.state_dict()
        del loader
        restored = make()
        restored.load_state_dict(state)
        assert head + list(restored) == full, k


def test_mix_sampler(paths: dict[str, list[str]]) -> None:
    dss = [TarDataset(paths[name]) for name in SIZES]
    cat: ConcatDataset[Any] = ConcatDataset(dss)
    counts = [600, 60, 6]
    s = MixSampler(dss, counts=counts, block_size=8, seed=3)
    idx = list(s)
    assert len(idx) == len(s) == 666 and sorted(idx) == list(range(666))
    src = s.sources_of(np.asarray(idx))
    assert (window_excess(src, counts) <= mix_bound(counts) + 1e-9).all()
    s.set_epoch(0)
    got = list(DataLoader(cat, batch_size=BS, sampler=s, collate_fn=list))
    # the concatenated index maps to (source, sample): the right dataset and sample
    for i, smp in zip(idx[:40], [x for b in got for x in b][:40], strict=False):
        k = int(s.sources_of(np.asarray([i]))[0])
        assert smp["__key__"] == dss[k][i - int(s.offsets[k])]["__key__"]
    # ranks: equal counts, exactly once
    for ws in (2, 3):
        per = [list(MixSampler(dss, counts=counts, rank=r, world_size=ws)) for r in range(ws)]
        assert {len(p) for p in per} == {666 // ws}
        assert sorted(i for p in per for i in p) == list(range(666))
    # weights with replacement on the tiny one, blocks stay within a source's shards
    w = MixSampler(dss, weights=[0.5, 0.25, 0.25], replacement=[False, False, True], seed=1)
    assert w.counts.tolist() == [120, 60, 60] and len(list(w)) == 240  # mid (60) limits it
    assert tarindex.MixSampler is MixSampler and tarindex.MixedDataset is MixedDataset


@pytest.mark.timeout(120)
def test_mix_sampler_resume_and_world_size_change(paths: dict[str, list[str]]) -> None:
    sdl = pytest.importorskip("torchdata.stateful_dataloader")
    dss = [TarDataset(paths[name]) for name in SIZES]
    cat: ConcatDataset[Any] = ConcatDataset(dss)

    def sampler(rank: int = 0, ws: int = 1) -> MixSampler:
        s = MixSampler(dss, counts=[600, 60, 6], seed=5, rank=rank, world_size=ws)
        s.set_epoch(2)
        return s

    def make() -> Any:
        return sdl.StatefulDataLoader(
            cat, batch_size=BS, sampler=sampler(), num_workers=2, collate_fn=keys
        )

    full = list(make())
    for k in (1, 60, len(full) - 1):
        loader = make()
        head = []
        for b in loader:
            head.append(b)
            if len(head) == k:
                break
        state = loader.state_dict()
        restored = make()
        restored.load_state_dict(state)
        assert head + list(restored) == full, k
    # 2 ranks draw 100 indices each, then the rest of the epoch goes to 3 ranks
    old = [sampler(r, 2) for r in range(2)]
    heads = []
    for s in old:
        it = iter(s)
        heads.append([next(it) for _ in range(100)])
    state = old[0].state_dict()
    assert state["consumed"] == 100 and state["world_size"] == 2
    new = [MixSampler(dss, counts=[600, 60, 6], seed=0, rank=r, world_size=3) for r in range(3)]
    rests = []
    for s in new:
        s.load_state_dict(state)
        rests.append(list(s))
    assert {len(r) for r in rests} == {(666 - 200) // 3 + 1}  # 466 left: 156 each, 2 repeated
    c = Counter(i for p in heads + rests for i in p)
    assert sorted(c) == list(range(666)) and sum(c.values()) == 668


def drop_sevens(s: dict[str, Any]) -> tuple[int, int]:
    """A transform that fails on every index divisible by 7."""
    if s["__index__"] % 7 == 0:
        raise ValueError("no sevens")
    return int(s["__source__"]), int(s["__index__"])


def test_skipped_samples_keep_the_schedule(paths: dict[str, list[str]]) -> None:
    srcs = [
        TarIterableDataset(
            paths[n], block_size=8, buffer_size=16, transform=drop_sevens, on_error="skip"
        )
        for n in SIZES
    ]
    kw: dict[str, Any] = {"counts": [600, 60, 6], "seed": 2, "source_key": "__source__"}
    with pytest.warns(RuntimeWarning, match="skipped"):
        got = list(MixedDataset(srcs, **kw))
    src, idx = MixedDataset(srcs, **kw).order(0)
    want = [(int(a), int(b)) for a, b in zip(src, idx, strict=True) if b % 7]
    assert got == want  # the others in schedule order, none replaced
    mix = MixedDataset(srcs, **kw)
    it = iter(mix)
    with pytest.warns(RuntimeWarning):
        head = [next(it) for _ in range(100)]
    state = mix.state_dict()
    assert state["consumed"] > 100  # positions passed, skipped ones included
    fresh = MixedDataset(srcs, **kw)
    fresh.load_state_dict(state)
    with pytest.warns(RuntimeWarning):
        assert head + list(fresh) == want


@pytest.mark.timeout(90)
def test_persistent_workers_advance_epochs(paths: dict[str, list[str]]) -> None:
    mix = mixed(sources(paths), counts=[600, 60, 6], seed=6)
    loader = DataLoader(mix, batch_size=BS, num_workers=2, collate_fn=ids, persistent_workers=True)
    for e in range(2):
        got = list(loader)  # persistent workers never see set_epoch: they count __iter__ calls
        w = [list(zip(*mix.order(e, k, 2), strict=True)) for k in range(2)]
        assert [x for b in got[0::2] for x in b] == w[0], e
        assert [x for b in got[1::2] for x in b] == w[1], e
