"""ShardSubset: a view of some samples of a ShardSet, one numbering contract for every method.

The contract (tarindex/read/sample_source.py): positions ``0 <= i < len(src)`` for the
per-sample operations and key lookups, shard positions ``(s, j)`` with ``starts[s] + j == i``
for the block operations, and ``__index__`` / ``Block.index`` the source's global index. A
``ShardSet`` and a ``ShardSubset`` are both checked against it, and every method of a view
against the same call on its base.
"""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from numpy.typing import NDArray

import tarindex
from tarindex.errors import SampleIndexError
from tarindex.read.sample_source import SampleSource
from tarindex.read.split import split_by_key
from tarindex.read.subset import ShardSubset, shard_of_index
from tarindex.read.takes import Takes

IDX = [1, 5, 9, 59, 61, 62, 130, 199]  # shard 0: 4, shard 1: 2, shard 2: 1, shard 3: 1


def write(root: Path, n: int = 200, per: int = 60) -> list[str]:
    with tarindex.ShardWriter(str(root / "s-%06d.tar"), maxcount=per, durable=False) as w:
        for i in range(n):
            w.write({"__key__": f"k{i:05d}", "cls": i, "txt": f"sample {i}" * (i % 5)})
    return list(w.paths)


def items(smp: dict[str, Any]) -> dict[str, Any]:
    """A sample as comparable values (members as bytes)."""
    return {k: bytes(v) if isinstance(v, memoryview) else v for k, v in smp.items()}


def alloc(nbytes: int) -> tuple[Any, Any]:
    buf = np.empty(nbytes, np.uint8)
    return buf, buf


def packed(got: tuple[Any, ...] | None) -> Any:
    if got is None:
        return None
    keep, *rest = got
    return (bytes(keep), *(x.tolist() if isinstance(x, np.ndarray) else x for x in rest))


def check_contract(src: SampleSource, whole: tarindex.ShardSet, index: NDArray[np.int64]) -> None:
    """Every SampleSource operation of ``src``, and of its executor reads ``src.takes()``
    (``Takes``), in the one numbering.

    ``index[i]`` is the global index in ``whole`` of position ``i`` of ``src``.
    """
    n = len(src)
    t, tw = src.takes(), whole.takes()
    assert isinstance(t, Takes) and not isinstance(src, Takes)
    assert len(index) == n and int(src.counts.sum()) == n and src.starts[-1] == n
    assert src.starts.tolist() == [0, *np.cumsum(src.counts).tolist()]
    assert src.paths == whole.paths and src.n_shards == whole.n_shards == len(src.counts)
    assert src.remote is whole.remote and t.open_bound == tw.open_bound
    for i in [*range(n), -1, -n]:
        want = items(whole.sample(int(index[i])))
        assert items(src.sample(i)) == want and want["__index__"] == int(index[i])
        s, j = src.locate(i)
        assert s == whole.locate(int(index[i]))[0] == shard_of_index(src, int(index[i]))
        assert src.starts[s] + j == i % n and 0 <= j < src.counts[s]
        assert [items(x) for x in t.read_samples(s, j, j + 1)] == [want]
        assert src.reader(s) is whole.reader(s)
        assert items(src.sample(i, {"cls"})) == items(whole.sample(int(index[i]), {"cls"}))
    assert [items(x) for x in src] == [items(src.sample(i)) for i in range(n)]  # iter(src)
    pos = [n // 2, 0, n - 1, n // 2, -min(2, n)]
    assert [items(x) for x in t.take(pos)] == [items(src.sample(i)) for i in pos]
    blk = src.gather(pos)
    assert blk.index.tolist() == index[pos].tolist()
    assert [items(x) for x in blk.to_samples()] == [items(src.sample(i)) for i in pos]
    got = packed(t.gather_packed(pos, None, ("cls",), alloc))
    assert got == packed(tw.gather_packed(index[pos], None, ("cls",), alloc))
    if got is not None:
        assert got[-2] == index[pos].tolist()  # the packed batch's index: the source's
    for s in range(src.n_shards):
        c = int(src.counts[s])
        rows = list(range(int(src.starts[s]), int(src.starts[s]) + c))
        want_s = [items(src.sample(i)) for i in rows]
        assert [items(x) for x in t.read_samples(s, 0, c)] == want_s
        b = src.read_block(s, 0, c)
        assert b.index.tolist() == index[rows].tolist() and b.paths == [src.paths[s]]
        assert [items(x) for x in b.to_samples()] == want_s
        meta = src.read_block(s, 0, c, data=False)
        assert meta.index.tolist() == b.index.tolist() and meta.keys == b.keys
        if c > 1:
            assert [items(x) for x in t.read_samples(s, 1, c)] == want_s[1:]
        with pytest.raises(SampleIndexError):
            src.read_block(s, 0, c + 1)
        with pytest.raises(SampleIndexError):
            t.read_samples(s, 0, c + 1)
    pieces = [[s, 0, int(c)] for s, c in enumerate(src.counts.tolist()) if c]
    span = t.take_ready(pieces)
    if span is not None:
        assert span > 0
    # take_ready or not, take of the pieces' positions is their read_samples
    flat = [i for s, j0, j1 in pieces for i in range(src.starts[s] + j0, src.starts[s] + j1)]
    want_all = [items(x) for s, j0, j1 in pieces for x in t.read_samples(s, j0, j1)]
    assert [items(x) for x in t.take([int(i) for i in flat])] == want_all
    assert t.prefetch_blocks(pieces) == len(pieces)  # local shards: nothing to fetch
    src.prefetch(pos)
    t.drop_prefetched()
    for i in (0, n // 2, n - 1):
        k = src.sample(i)["__key__"]
        assert src.index_of(k) == i and src.indices_of(k) == [i]
    keys = [src.sample(i)["__key__"] for i in range(n)]
    assert src.index_of_many([*keys, "nope"]).tolist() == [*range(n), -1]
    for bad in (n, -n - 1):
        with pytest.raises(SampleIndexError):
            src.sample(bad)
        with pytest.raises(SampleIndexError):
            src.locate(bad)
        with pytest.raises(SampleIndexError):
            t.take([bad])
        with pytest.raises(SampleIndexError):
            src.gather([0, bad])
    with pytest.raises(TypeError):
        src.locate(1.5)  # type: ignore[arg-type]
    src.close()
    assert items(src.sample(0)) == items(whole.sample(int(index[0])))  # reopened lazily


EXECUTOR_ONLY = (
    "take_ready", "take", "read_samples", "prefetch_blocks", "drop_prefetched",
    "gather_packed", "open_bound", "plan_blocks", "passed_blocks",
)


def test_the_executor_reads_are_not_on_the_sources(tmp_path: Path) -> None:
    """Issue 18: the streaming executors' plumbing was public on ``ShardSet``, ``ShardSubset``
    and ``SampleSource``; it is on the handle ``takes()`` returns, and only there."""
    ss = tarindex.ShardSet(write(tmp_path))
    sub = ShardSubset(ss, IDX)
    for obj in (tarindex.ShardSet, ShardSubset, SampleSource, ss, sub):
        assert [m for m in EXECUTOR_ONLY if hasattr(obj, m)] == [], obj
    for src in (ss, sub):
        t = src.takes()
        assert isinstance(t, Takes) and all(hasattr(t, m) for m in EXECUTOR_ONLY)


def test_locate_names_what_read_samples_reads(tmp_path: Path) -> None:
    """Once broken: ``sub.locate(1)`` gave ``(0, 5)``, the base's number of view sample 1 in
    its shard, and ``sub.read_samples(0, 5, 6)`` (now ``sub.takes().read_samples``) then
    raised ``samples 5..6 out of range [0, 4)``: locate spoke the base's numbering, the block
    reads the view's."""
    ss = tarindex.ShardSet(write(tmp_path))
    sub = ShardSubset(ss, IDX)
    assert sub.locate(1) == (0, 1) and sub.locate(4) == (1, 0) and sub.locate(-1) == (3, 0)
    for i, g in enumerate(IDX):
        s, j = sub.locate(i)
        (got,) = sub.takes().read_samples(s, j, j + 1)
        assert got["__index__"] == g and got["__key__"] == f"k{g:05d}"
        assert sub.read_block(s, j, j + 1).index.tolist() == [g]


@pytest.mark.parametrize("use_mmap", [True, False])
def test_a_set_and_its_subsets_keep_one_contract(tmp_path: Path, use_mmap: bool) -> None:
    ss = tarindex.ShardSet(write(tmp_path), options=tarindex.OpenOptions(use_mmap=use_mmap))
    assert isinstance(ss, SampleSource)
    check_contract(ss, ss, np.arange(len(ss), dtype=np.int64))
    sub = ShardSubset(ss, IDX[::-1] + IDX[:2])  # any order, repeats dropped
    assert isinstance(sub, SampleSource) and not isinstance(sub, tarindex.ShardSet)
    assert sub.indices.tolist() == IDX and sub.counts.tolist() == [4, 2, 1, 1]
    check_contract(sub, ss, sub.indices)
    # a shard holding none of the view's samples, and a view of a view
    gap = ShardSubset(ss, [0, 2, 130, 131])
    assert gap.counts.tolist() == [2, 0, 2, 0]
    assert gap.takes().read_samples(1, 0, 0) == [] and gap.read_block(3, 0, 0).index.tolist() == []
    check_contract(gap, ss, gap.indices)
    inner = ShardSubset(sub, [0, 4, -1])
    assert inner.base is ss and inner.indices.tolist() == [IDX[0], IDX[4], IDX[-1]]
    check_contract(inner, ss, inner.indices)
    with pytest.raises(SampleIndexError):
        ShardSubset(sub, [len(IDX)])
    with pytest.raises(SampleIndexError):
        sub.read_block(4, 0, 0)  # no shard 4


def test_subset_pickles_small_and_reads_the_same(tmp_path: Path) -> None:
    ss = tarindex.ShardSet(write(tmp_path))
    sub = ShardSubset(ss, IDX)
    sub.sample(0)  # a reader open: not pickled
    back = pickle.loads(pickle.dumps(sub))
    assert back.indices.tolist() == IDX and back.counts.tolist() == sub.counts.tolist()
    assert [items(back.sample(i)) for i in range(len(IDX))] == [
        items(sub.sample(i)) for i in range(len(IDX))
    ]
    assert repr(back) == "ShardSubset(8 of 200 samples, 4 shards)"


def test_split_of_a_subset_is_the_base_split_within_it(tmp_path: Path) -> None:
    ss = tarindex.ShardSet(write(tmp_path))
    fr = {"a": 0.5, "b": 0.5}
    whole = split_by_key(ss, fr, seed=3)
    sub = ShardSubset(ss, range(40, 170))
    parts = split_by_key(sub, fr, seed=3)
    assert sorted(np.concatenate(list(parts.values())).tolist()) == list(range(len(sub)))
    for k, pos in parts.items():  # positions of the view, in the base's part
        assert sub.indices[pos].tolist() == [g for g in whole[k].tolist() if 40 <= g < 170]


def test_decoding_a_subset_finds_each_sample_shard(tmp_path: Path) -> None:
    """Once broken: decoding located ``__index__`` (the base's index) as a view position, so
    a ``.zst`` member of a sample past the view's length raised SampleIndexError."""
    pytest.importorskip("zstandard")
    pytest.importorskip("torch")
    with tarindex.ShardWriter(
        str(tmp_path / "z-%02d.tar"), maxcount=100, durable=False, compress=("json",)
    ) as w:
        for i in range(200):
            w.write({"__key__": f"k{i:05d}", "json": {"i": i, "words": ["a", "b"] * (i % 9)}})
    idx = [3, 150, 160, 199]
    ds = tarindex.TarDataset(list(w.paths), subset=idx, decode=True)
    assert [ds[i]["json"]["i"] for i in range(len(idx))] == idx
    it = tarindex.TarIterableDataset(list(w.paths), subset=idx, decode=True, shuffle=False)
    assert [s["json"]["i"] for s in it] == idx
