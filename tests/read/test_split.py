"""Stable splits by key hash, and subsets as views for map-style and streaming access."""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import tarindex
from tarindex.errors import KeyNotFoundError, SampleIndexError
from tarindex.format.keyhash import key_hash, key_hashes
from tarindex.plan.split import split_keys, split_parts, thresholds
from tarindex.read.sample_source import SampleSource
from tarindex.read.split import split_by_key
from tarindex.read.subset import ShardSubset

FRACTIONS = {"train": 0.8, "val": 0.1, "test": 0.1}


def key(i: int) -> str:
    return f"k/{i * 7919 % 100_003:06d}"


def write(root: Path, ids: range | list[int], per: int, name: str = "s") -> list[str]:
    with tarindex.ShardWriter(str(root / f"{name}-%06d.tar"), maxcount=per, durable=False) as w:
        for i in ids:
            w.write({"__key__": key(i), "cls": i})
    return list(w.paths)


def parts_by_key(ss: tarindex.ShardSet, parts: dict[str, Any]) -> dict[str, set[str]]:
    return {p: {ss.sample(int(i))["__key__"] for i in idx} for p, idx in parts.items()}


def test_thresholds_and_parts() -> None:
    assert thresholds([0.5, 0.5]) == [2**63, 2**64]
    assert thresholds([1.0]) == [2**64]
    assert split_parts(
        np.asarray([0, 2**63 - 1, 2**63, 2**64 - 1], np.uint64), [0.5, 0.5]
    ).tolist() == [
        0,
        0,
        1,
        1,
    ]
    assert split_parts(np.asarray([5, 2**64 - 1], np.uint64), [0.0, 1.0, 0.0]).tolist() == [1, 1]
    for bad in ([0.5, 0.4], [1.2, -0.2], [float("nan"), 1.0], []):
        with pytest.raises(ValueError):
            thresholds(bad)
    keys = [key(i) for i in range(2000)]
    got = split_keys(keys, FRACTIONS, seed=3)
    bounds = thresholds(list(FRACTIONS.values()))  # the rule, key by key
    want = [next(k for k, b in enumerate(bounds) if key_hash(x.encode(), 3) < b) for x in keys]
    assert got.tolist() == want
    assert split_keys(keys, FRACTIONS, seed=4).tolist() != want  # the seed matters


def test_split_is_stable_across_resharding_and_added_shards(tmp_path: Path) -> None:
    a = write(tmp_path / "a", range(3000), 100)  # 30 shards
    b = write(tmp_path / "b", range(3000), 700)  # the same samples in 5 shards
    sa, sb = tarindex.ShardSet(a), tarindex.ShardSet(b)
    pa = parts_by_key(sa, split_by_key(sa, FRACTIONS, seed=11))
    pb = parts_by_key(sb, split_by_key(sb, FRACTIONS, seed=11))
    assert pa == pb
    assert sum(map(len, pa.values())) == 3000 and not (pa["train"] & pa["val"])
    n = {p: len(v) for p, v in pa.items()}
    assert 2300 < n["train"] < 2500 and 220 < n["val"] < 380 and 220 < n["test"] < 380
    # shards in another order, plus new shards: old keys stay where they were
    c = write(tmp_path / "c", range(3000, 3600), 250)
    sc = tarindex.ShardSet(c + b[::-1])
    pc = parts_by_key(sc, split_by_key(sc, FRACTIONS, seed=11))
    for p in FRACTIONS:
        assert pa[p] <= pc[p]  # every old key, same part
        assert {x for x in pc[p] if x not in pa[p]} <= {key(i) for i in range(3000, 3600)}
    # and the same through a manifest
    m = str(tmp_path / "b" / "data.json")
    tarindex.write_manifest(b, m)
    parts = split_by_key(m, FRACTIONS, seed=11)
    assert parts_by_key(tarindex.ShardSet(m), parts) == pa


def test_a_million_keys_split_fast() -> None:
    n = 1_000_000
    keys = b"".join(f"img/{i:09d}".encode() for i in range(n))
    ptr = np.arange(0, 13 * n + 1, 13, dtype=np.int64)
    t0 = time.perf_counter()
    parts = split_parts(key_hashes(keys, ptr, seed=1), [0.8, 0.1, 0.1])
    dt = time.perf_counter() - t0
    c = np.bincount(parts, minlength=3)
    assert abs(int(c[0]) - 800_000) < 3000 and abs(int(c[1]) - 100_000) < 1500
    assert dt < 30  # a hang guard; benchmarks/bench_scale.py measures it (~0.1-0.2 s)


def test_subset_view_map_style(tmp_path: Path) -> None:
    paths = write(tmp_path, range(500), 60)
    ss = tarindex.ShardSet(paths)
    parts = split_by_key(ss, FRACTIONS, seed=0)
    val = ShardSubset(ss, parts["val"])
    # a sample source of its own over the base's shards (tests/test_subset.py: its contract)
    assert isinstance(val, SampleSource) and not isinstance(val, tarindex.ShardSet)
    assert val.paths == ss.paths and val.takes().open_bound == ss.takes().open_bound
    assert len(val) == len(parts["val"]) and int(val.counts.sum()) == len(val)
    for i in (0, 7, -1):
        smp = val.sample(i)
        assert (
            smp["__index__"] == int(parts["val"][i])
            and smp["__key__"] == ss.sample(int(parts["val"][i]))["__key__"]
        )
    blk = val.gather([3, 0, 3])
    assert blk.index.tolist() == [int(parts["val"][j]) for j in (3, 0, 3)]
    k = val.sample(5)["__key__"]
    assert val.index_of(k) == 5
    outside = ss.sample(int(parts["train"][0]))["__key__"]
    assert val.index_of_many([k, outside, "nope"]).tolist() == [5, -1, -1]
    with pytest.raises(KeyNotFoundError):
        val.index_of(ss.sample(int(parts["train"][0]))["__key__"])  # in the dataset, not the part
    with pytest.raises(SampleIndexError):
        val.sample(len(val))
    with pytest.raises(SampleIndexError):
        ShardSubset(ss, [500])
    twice = ShardSubset(val, [1, 2])  # a subset of a subset is a subset of the base
    assert twice.base is ss and twice.indices.tolist() == parts["val"][1:3].tolist()
    torch = pytest.importorskip("torch")
    ds = tarindex.TarDataset(paths, subset=parts["test"], decode=True)
    assert len(ds) == len(parts["test"])
    got = [
        s["__index__"]
        for s in torch.utils.data.DataLoader(ds, batch_size=8, collate_fn=list, num_workers=2)
        for s in s
    ]
    assert got == parts["test"].tolist()
    bds = tarindex.TarDataset(paths, subset=parts["test"], batched=True)
    batch = bds.__getitems__([0, 1, 2])
    assert batch.index.tolist() == parts["test"][:3].tolist()
    sampler = tarindex.BlockSampler(ds, block_size=4, shuffle=True, seed=1)
    assert sorted(ds[i]["__index__"] for i in sampler) == parts["test"].tolist()


@pytest.mark.parametrize("drop_last", [False, True])
def test_subset_streaming_exactly_once_equal_counts(tmp_path: Path, drop_last: bool) -> None:
    pytest.importorskip("torch")
    paths = write(tmp_path, range(700), 90)
    m = str(tmp_path / "data.json")
    tarindex.write_manifest(paths, m)
    parts = split_by_key(m, FRACTIONS, seed=2)
    for part, ws in (("train", 3), ("val", 2)):
        want = parts[part].tolist()
        per_rank = []
        for r in range(ws):
            it = tarindex.TarIterableDataset(
                m,
                subset=parts[part],
                rank=r,
                world_size=ws,
                drop_last=drop_last,
                seed=9,
                block_size=8,
                buffer_size=32,
            )
            got = [s["__index__"] for s in it]
            assert len(got) == len(it)
            per_rank.append(got)
        assert len({len(g) for g in per_rank}) == 1  # equal counts on every rank
        c = Counter(i for g in per_rank for i in g)
        assert set(c) <= set(want)
        n = len(want)
        if drop_last:
            assert set(c.values()) == {1} and len(c) == n - n % ws
        else:
            assert sorted(c) == want and sum(c.values()) == -(-n // ws) * ws
    # the plan is over the subset: the same order as a plan over its counts computed anywhere
    it = tarindex.TarIterableDataset(m, subset=parts["val"], seed=9, block_size=8, buffer_size=32)
    order = it.plan(0).order(it.shards.starts)
    assert [s["__index__"] for s in it] == parts["val"][order].tolist()


def test_subset_streaming_through_workers_and_resume(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    paths = write(tmp_path, range(400), 50)
    parts = split_by_key(paths, [0.7, 0.3], seed=5)
    ds = tarindex.TarIterableDataset(paths, subset=parts["0"], seed=1, block_size=4, buffer_size=16)
    loader = torch.utils.data.DataLoader(ds, batch_size=10, num_workers=2, collate_fn=list)
    got = [s["__index__"] for b in loader for s in b]
    assert sorted(got) == parts["0"].tolist()
    # exact resume in-process; a state from another subset of the same size is refused
    it = iter(ds)
    head = [next(it)["__index__"] for _ in range(37)]
    st = ds.state_dict()
    ds2 = tarindex.TarIterableDataset(
        paths, subset=parts["0"], seed=1, block_size=4, buffer_size=16
    )
    ds2.load_state_dict(st)
    assert head + [s["__index__"] for s in ds2] == [
        s["__index__"]
        for s in tarindex.TarIterableDataset(
            paths, subset=parts["0"], seed=1, block_size=4, buffer_size=16
        )
    ]
    other = np.sort(np.random.default_rng(0).choice(400, len(parts["0"]), replace=False))
    ds3 = tarindex.TarIterableDataset(paths, subset=other, seed=1, block_size=4, buffer_size=16)
    with pytest.raises(ValueError, match="subset"):
        ds3.load_state_dict(st)
    batched = tarindex.TarIterableDataset(
        paths, subset=parts["1"], shuffle=False, batched=True, batch_size=16
    )
    idx = [i for b in batched for i in b.index.tolist()]
    assert idx == parts["1"].tolist()


def test_subset_take_reads_the_view_samples(tmp_path: Path) -> None:
    """Once wrong samples: the inherited ShardSet.take (now ``takes().take``) located a view
    index in the base's numbering and read it back in the view's (view sample 0 came back as
    base sample 5, the others as SampleIndexError)."""
    paths = write(tmp_path, range(200), 60)
    ss = tarindex.ShardSet(paths)
    idx = [1, 5, 9, 61, 62, 130, 199]
    val = ShardSubset(ss, idx)
    order = [0, 3, -1, 2, 2, 6, 1, 4, 5]
    got = val.takes().take(order)
    assert [s["__index__"] for s in got] == [idx[i] for i in order]
    assert [s["cls"] for s in got] == [ss.sample(idx[i])["cls"] for i in order]
    with pytest.raises(SampleIndexError):
        val.takes().take([7])
