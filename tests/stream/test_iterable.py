"""TarIterableDataset and BlockSampler: real DataLoaders, spawn workers, StatefulDataLoader."""

from __future__ import annotations

import json
import warnings
from collections import Counter
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from torch.utils.data import DataLoader  # noqa: E402

import tarindex  # noqa: E402
from tarindex import BlockSampler, OpenOptions, TarDataset, TarIterableDataset  # noqa: E402

pytestmark = pytest.mark.filterwarnings(
    "ignore:This DataLoader will create", "ignore:'set_vital' is deprecated"
)

SIZES = [13, 5, 11, 1, 9, 17, 10]  # 7 uneven shards, 66 samples (divisible by 2 and 3)
N = sum(SIZES)
BS = 4


def indices(batch: list[dict[str, Any]]) -> list[int]:
    """collate_fn: a batch as the list of its global indices (module level: picklable)."""
    return [int(s["__index__"]) for s in batch]


def full_check(batch: list[dict[str, Any]]) -> list[tuple[int, str, int, bytes]]:
    return [(int(s["__index__"]), s["__key__"], int(s["cls"]), bytes(s["bin"])) for s in batch]


def loader_batches(ds: TarIterableDataset, epoch: int, nw: int, bs: int = BS) -> list[list[int]]:
    """The batches a DataLoader yields, from the plan alone: workers take turns, batch by batch."""
    starts = ds.shards.starts
    per = [ds.plan(epoch, w, max(nw, 1)).order(starts).tolist() for w in range(max(nw, 1))]
    batches = [[o[i : i + bs] for i in range(0, len(o), bs)] for o in per]
    out: list[list[int]] = []
    for k in range(max(len(b) for b in batches)):
        for b in batches:
            if k < len(b):
                out.append(b[k])
    return out


@pytest.fixture
def shards(make_shards: Any) -> list[str]:
    paths: list[str] = make_shards(SIZES)
    return paths


def keys_of(ds: Any) -> list[int]:
    return [int(s["__index__"]) for s in ds]


def test_values_match_map_style(shards: list[str]) -> None:
    ref = TarDataset(shards)
    for use_mmap in (True, False):
        ds = TarIterableDataset(shards, block_size=4, buffer_size=8, options=OpenOptions(use_mmap=use_mmap))
        got = list(ds)
        assert len(got) == len(ds) == N
        assert sorted(s["__index__"] for s in got) == list(range(N))
        for s in got:
            want = ref[s["__index__"]]
            assert s == want
        assert [s["__index__"] for s in got] == ds.plan(0).order(ds.shards.starts).tolist()


@pytest.mark.timeout(60)
@pytest.mark.parametrize("nw", [0, 2, 3])
def test_dataloader_workers(shards: list[str], nw: int) -> None:
    ds = TarIterableDataset(shards, block_size=4, buffer_size=8)
    ds.set_epoch(1)
    got = list(DataLoader(ds, batch_size=BS, num_workers=nw, collate_fn=indices))
    assert got == loader_batches(ds, 1, nw)
    assert sorted(i for b in got for i in b) == list(range(N))
    assert len(ds) == N


@pytest.mark.timeout(60)
def test_shuffle_false_order_with_workers(shards: list[str]) -> None:
    ds = TarIterableDataset(shards, shuffle=False, block_size=4)
    assert keys_of(ds) == list(range(N))
    got = list(DataLoader(ds, batch_size=BS, num_workers=2, collate_fn=indices))
    # worker 0 reads samples 0..32, worker 1 samples 33..65; batches alternate between them
    w0 = [list(range(i, min(i + BS, 33))) for i in range(0, 33, BS)]
    w1 = [list(range(i, min(i + BS, 66))) for i in range(33, 66, BS)]
    want = [b for pair in zip(w0, w1, strict=True) for b in pair]
    assert got == want


@pytest.mark.parametrize("drop_last", [False, True])
def test_ranks_in_process(make_shards: Any, drop_last: bool) -> None:
    for sizes in (SIZES, [5, 7, 5]):  # 66 samples, and 17 (not divisible by 2 or 3)
        paths = make_shards(sizes, name=f"s{len(sizes)}")
        n = sum(sizes)
        for ws in (2, 3):
            per = []
            for r in range(ws):
                ds = TarIterableDataset(
                    paths, block_size=3, buffer_size=5, rank=r, world_size=ws, drop_last=drop_last
                )
                per.append(keys_of(ds))
                assert len(per[-1]) == len(ds)
            assert len({len(p) for p in per}) == 1
            c = Counter(i for p in per for i in p)
            if n % ws == 0:
                assert sorted(c) == list(range(n)) and set(c.values()) == {1}
            elif drop_last:
                assert len(c) == n - n % ws and set(c.values()) == {1}
            else:
                assert sorted(c) == list(range(n)) and sum(c.values()) == n + (ws - n % ws)


def test_epochs(shards: list[str]) -> None:
    ds = TarIterableDataset(shards, block_size=4, buffer_size=8, seed=3)
    e0 = keys_of(ds)
    e1 = keys_of(ds)  # no set_epoch: each __iter__ is the next epoch
    assert e0 != e1 and sorted(e0) == sorted(e1)
    ds.set_epoch(0)
    assert keys_of(ds) == e0
    ds.set_epoch(1)
    assert keys_of(ds) == e1
    other = TarIterableDataset(shards, block_size=4, buffer_size=8, seed=4)
    assert keys_of(other) != e0


@pytest.mark.timeout(60)
def test_persistent_workers_advance_epoch(shards: list[str]) -> None:
    ds = TarIterableDataset(shards, block_size=4, buffer_size=8)
    loader = DataLoader(
        ds, batch_size=BS, num_workers=2, collate_fn=indices, persistent_workers=True
    )
    epochs = []
    for e in range(3):
        ds.set_epoch(e)  # never reaches the persistent workers; they count __iter__ calls
        epochs.append(list(loader))
        assert epochs[-1] == loader_batches(ds, e, 2)
    assert epochs[0] != epochs[1] != epochs[2]


@pytest.mark.timeout(60)
def test_more_workers_and_ranks_than_shards(make_shards: Any) -> None:
    paths = make_shards([12], name="one")
    seen: Counter[int] = Counter()
    counts = []
    for r in range(4):
        ds = TarIterableDataset(paths, block_size=4, buffer_size=4, rank=r, world_size=4)
        got = list(DataLoader(ds, batch_size=2, num_workers=8, collate_fn=indices))
        assert got == loader_batches(ds, 0, 8, 2)
        counts.append((len(got), sum(map(len, got))))
        seen.update(i for b in got for i in b)
    assert counts == [(3, 3)] * 4
    assert sorted(seen) == list(range(12)) and set(seen.values()) == {1}


@pytest.mark.timeout(120)
def test_spawn_after_read_in_parent(shards: list[str]) -> None:
    mp = TarDataset(shards)
    assert mp[0]["__index__"] == 0 and mp[N - 1]["__index__"] == N - 1  # opens shards (mmaps)
    want = full_check([mp[i] for i in range(N)])
    # one spawned worker here (each imports torch: seconds on 2 busy cores); two below
    got = list(
        DataLoader(
            mp, batch_size=BS, num_workers=1, collate_fn=full_check, multiprocessing_context="spawn"
        )
    )
    assert [x for b in got for x in b] == want

    it = TarIterableDataset(shards, block_size=4, buffer_size=8)
    first = next(iter(it))  # read in the parent: open readers, an active epoch
    assert isinstance(first["bin"], bytes)
    it.set_epoch(2)
    got = list(
        DataLoader(
            it, batch_size=BS, num_workers=2, collate_fn=full_check, multiprocessing_context="spawn"
        )
    )
    assert [[x[0] for x in b] for b in got] == loader_batches(it, 2, 2)
    assert sorted(x for b in got for x in b) == want


@pytest.mark.parametrize(
    "shuffle,drop_last,ws", [(True, False, 1), (False, False, 1), (True, True, 4)]
)
def test_resume_in_process(shards: list[str], shuffle: bool, drop_last: bool, ws: int) -> None:
    kw = dict(
        shuffle=shuffle,
        block_size=4,
        buffer_size=8,
        drop_last=drop_last,
        rank=ws - 1,
        world_size=ws,
        seed=11,
    )
    ref = TarIterableDataset(shards, **kw)
    ref.set_epoch(5)
    full = keys_of(ref)
    sizes = set()
    for k in sorted({0, 1, 7, 8, 9, len(full) // 2, len(full) - 1, len(full)}):
        ds = TarIterableDataset(shards, **kw)
        ds.set_epoch(5)
        it = iter(ds)
        head = [next(it)["__index__"] for _ in range(k)]
        state = ds.state_dict()
        assert state["epoch"] == 5 and state["consumed"] == k
        sizes.add(len(json.dumps(state)))
        fresh = TarIterableDataset(shards, **{**kw, "seed": 0})  # the seed comes from the state
        fresh.load_state_dict(state)
        assert fresh.state_dict() == state
        assert head + keys_of(fresh) == full
        # the resumed epoch is consumed once; the next __iter__ plays the next epoch
        ref.set_epoch(6)
        assert keys_of(fresh) == keys_of(ref)
    assert max(sizes) < 400  # O(1): a few ints, no per-sample lists


@pytest.mark.timeout(120)
def test_stateful_dataloader_resume(shards: list[str]) -> None:
    sdl = pytest.importorskip("torchdata.stateful_dataloader")

    def make() -> Any:
        ds = TarIterableDataset(shards, block_size=4, buffer_size=8, seed=1)
        ds.set_epoch(2)
        return sdl.StatefulDataLoader(ds, batch_size=BS, num_workers=2, collate_fn=indices)

    full = list(make())
    assert full == loader_batches(
        TarIterableDataset(shards, block_size=4, buffer_size=8, seed=1), 2, 2
    )
    for k in (1, 6, len(full) - 1):
        loader = make()
        head = []
        for b in loader:
            head.append(b)
            if len(head) == k:
                break
        state = loader.state_dict()
        del loader
        restored = make()  # a fresh dataset and a fresh loader
        restored.load_state_dict(state)
        rest = list(restored)
        assert head + rest == full, k


def test_world_size_env_without_rank_raises(
    shards: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("WORLD_SIZE", "2")
    ds = TarIterableDataset(shards)
    with pytest.raises(RuntimeError, match="WORLD_SIZE=2"):
        len(ds)
    with pytest.raises(RuntimeError, match="init_process_group"):
        iter(ds)
    with pytest.raises(RuntimeError, match="WORLD_SIZE"):
        len(BlockSampler(N))
    ok = TarIterableDataset(shards, rank=1, world_size=2)
    assert len(ok) == N // 2
    with pytest.raises(ValueError, match="both"):
        TarIterableDataset(shards, rank=1)


def test_decode_transform_on_error(shards: list[str]) -> None:
    ds = TarIterableDataset(shards, decode=True)
    for s in ds:
        assert s["cls"] == s["__index__"] % 10 and s["txt"] == f"sample {s['__index__']}"

    def picky(s: dict[str, Any]) -> int:
        if s["__index__"] % 5 == 0:
            raise KeyError("no fives")
        return int(s["__index__"])

    skip = TarIterableDataset(shards, transform=picky, on_error="skip")
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        got = list(skip)
    assert sorted(got) == [i for i in range(N) if i % 5]
    assert len(w) == len(range(0, N, 5)) and "skipped" in str(w[0].message)
    with pytest.raises(KeyError):
        list(TarIterableDataset(shards, transform=picky))
    with pytest.raises(ValueError, match="on_error"):
        TarIterableDataset(shards, on_error="ignore")


def test_state_mismatch(shards: list[str]) -> None:
    ds = TarIterableDataset(shards, block_size=4)
    state = ds.state_dict()
    with pytest.raises(ValueError, match="block_size"):
        TarIterableDataset(shards, block_size=8).load_state_dict(state)
    other = TarIterableDataset(shards, block_size=4)
    other.load_state_dict({**state, "worker": 1, "num_workers": 2})
    with pytest.raises(ValueError, match="worker 1 of 2"):
        iter(other)


def test_block_sampler(shards: list[str]) -> None:
    ds = TarDataset(shards)
    for ws in (2, 3):
        for drop_last in (False, True):
            per = [
                list(BlockSampler(ds, block_size=4, rank=r, world_size=ws, drop_last=drop_last))
                for r in range(ws)
            ]
            assert [len(p) for p in per] == [N // ws] * ws
            assert sorted(i for p in per for i in p) == list(range(N))
    s = BlockSampler(ds, block_size=4, seed=2)
    e0 = list(s)
    # locality: runs of consecutive indices of at most block_size, never across a shard boundary
    bounds = set(ds.shards.starts.tolist())
    runs = sum(1 for a, b in zip(e0, e0[1:], strict=False) if b != a + 1 or b in bounds) + 1
    assert N / 4 <= runs <= N / 4 + 2 * len(SIZES)
    s.set_epoch(1)
    e1 = list(s)
    assert e1 != e0 and sorted(e1) == sorted(e0)
    s.set_epoch(0)
    assert list(s) == e0
    assert list(BlockSampler(10, shuffle=False, rank=1, world_size=3)) == [4, 5, 6, 7]
    assert len(BlockSampler(10, rank=1, world_size=3, drop_last=True)) == 3
    got = list(DataLoader(ds, batch_size=BS, sampler=s, collate_fn=indices))
    assert [i for b in got for i in b] == s.indices(1).tolist()
    assert tarindex.BlockSampler is BlockSampler
