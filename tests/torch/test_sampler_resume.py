"""BlockSampler resume: exact, O(1), through StatefulDataLoader, onto another world size."""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from tarindex import BlockSampler, TarDataset, TarIterableDataset  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore:This DataLoader will create")

SIZES = [13, 5, 11, 1, 9, 17, 10, 24]  # 90 samples: divisible by 2, 3, 5 and 6
N = sum(SIZES)
BS = 4


def keys(batch: list[dict[str, Any]]) -> list[str]:
    return [str(s["__key__"]) for s in batch]


@pytest.fixture
def ds(make_shards: Any) -> TarDataset:
    return TarDataset(make_shards(SIZES))


@pytest.mark.parametrize("ws,drop_last,buffer_size", [(1, False, 0), (3, False, 8), (4, True, 0)])
def test_resume_in_process(ds: TarDataset, ws: int, drop_last: bool, buffer_size: int) -> None:
    kw: dict[str, Any] = {"block_size": 4, "buffer_size": buffer_size, "drop_last": drop_last}
    for rank in range(ws):
        ref = BlockSampler(ds, seed=7, rank=rank, world_size=ws, **kw)
        ref.set_epoch(4)
        full = list(ref)
        sizes = set()
        for k in sorted({0, 1, 5, len(full) // 2, len(full) - 1, len(full)}):
            s = BlockSampler(ds, seed=7, rank=rank, world_size=ws, **kw)
            s.set_epoch(4)
            it = iter(s)
            head = [next(it) for _ in range(k)]
            state = s.state_dict()
            assert (state["epoch"], state["consumed"], state["world_size"]) == (4, k, ws)
            sizes.add(len(json.dumps(state)))
            fresh = BlockSampler(ds, seed=0, rank=rank, world_size=ws, **kw)  # seed from the state
            fresh.load_state_dict(state)
            assert fresh.state_dict() == state
            assert head + list(fresh) == full
            ref.set_epoch(5)
            assert list(fresh) == list(ref)  # the resumed epoch is played once, then epoch 5
        assert max(sizes) < 400  # O(1): a few ints


def test_state_errors(ds: TarDataset) -> None:
    state = BlockSampler(ds, block_size=4).state_dict()
    with pytest.raises(ValueError, match="block_size"):
        BlockSampler(ds, block_size=8).load_state_dict(state)
    with pytest.raises(ValueError, match="n_samples"):
        BlockSampler(N + 1, block_size=4).load_state_dict(state)
    with pytest.raises(ValueError, match="consumed"):
        BlockSampler(ds, block_size=4).load_state_dict({**state, "consumed": N + 1})
    with pytest.raises(ValueError, match="version"):
        BlockSampler(ds, block_size=4).load_state_dict({**state, "version": 99})


@pytest.mark.parametrize(
    "w_old,w_new,drop_last",
    [(2, 3, False), (3, 2, False), (6, 5, True), (2, 4, False), (5, 1, False)],
)
def test_world_size_change_resumes_what_is_left(
    ds: TarDataset, w_old: int, w_new: int, drop_last: bool
) -> None:
    kw: dict[str, Any] = {"block_size": 4, "buffer_size": 6, "drop_last": drop_last, "seed": 3}
    old = [BlockSampler(ds, rank=r, world_size=w_old, **kw) for r in range(w_old)]
    k = 7
    heads = []
    for s in old:
        s.set_epoch(2)
        it = iter(s)
        heads.append([next(it) for _ in range(k)])
    state = old[1 % w_old].state_dict()  # any rank's state: all ranks drew the same count
    assert state == {**old[0].state_dict(), "rank": state["rank"]}
    new = [BlockSampler(ds, rank=r, world_size=w_new, **kw) for r in range(w_new)]
    rests = []
    for s in new:
        s.load_state_dict(state)
        rests.append(list(s))
    left = N - w_old * k
    assert {len(r) for r in rests} == {left // w_new if drop_last else -(-left // w_new)}
    c = Counter(i for p in heads + rests for i in p)
    if left % w_new == 0:
        assert sorted(c) == list(range(N)) and set(c.values()) == {1}  # exactly once
    elif drop_last:
        assert set(c.values()) == {1} and len(c) == N - left % w_new
    else:
        assert sorted(c) == list(range(N)) and sum(c.values()) == N + w_new - left % w_new
    # what is left is the old ranks' rests in plan order, dealt contiguously
    want = [i for s, h in zip(old, heads, strict=True) for i in s.indices(2)[len(h) :].tolist()]
    assert [i for r in rests for i in r][: len(want) - len(want) % w_new] == want[
        : len(want) - len(want) % w_new
    ]
    # a state saved during the resumed epoch resumes again, on yet another world size
    again = BlockSampler(ds, rank=0, world_size=w_new, **kw)
    again.load_state_dict(state)
    it = iter(again)
    for _ in range(3):
        next(it)
    st2 = again.state_dict()
    assert st2["legs"] == [[w_old, k]] and st2["consumed"] == 3
    third = []
    for r in range(3):
        s3 = BlockSampler(ds, rank=r, world_size=3, **kw)
        s3.load_state_dict(st2)
        third.append(list(s3))
    taken = [i for p in heads for i in p] + [i for r in rests for i in r[:3]]
    left2 = sum(len(r) - 3 for r in rests)
    assert {len(t) for t in third} == {left2 // 3 if drop_last else -(-left2 // 3)}
    c = Counter(taken + [i for t in third for i in t])
    if not drop_last:
        assert sorted(c) == list(range(N))
    assert sum(c.values()) == len(taken) + 3 * len(third[0])
    # the epoch after the resumed one is a normal epoch on the new world size
    nxt = BlockSampler(ds, rank=0, world_size=w_new, **kw)
    nxt.load_state_dict(state)
    list(nxt)
    assert list(nxt) == BlockSampler(ds, rank=0, world_size=w_new, **kw).indices(3).tolist()


@pytest.mark.timeout(120)
def test_stateful_dataloader_resume(ds: TarDataset) -> None:
    sdl = pytest.importorskip("torchdata.stateful_dataloader")

    def make(ws: int = 1, rank: int = 0) -> Any:
        s = BlockSampler(ds, block_size=4, buffer_size=8, seed=1, rank=rank, world_size=ws)
        s.set_epoch(2)
        return sdl.StatefulDataLoader(ds, batch_size=BS, sampler=s, num_workers=2, collate_fn=keys)

    full = list(make())
    s = BlockSampler(ds, block_size=4, buffer_size=8, seed=1)
    assert [k for b in full for k in b] == [ds[i]["__key__"] for i in s.indices(2).tolist()]
    for k in (1, 9, len(full) - 1):
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
    # two ranks' loaders, 5 batches each, then the rest on 3 ranks through fresh loaders
    heads = []
    for r in range(2):
        loader = make(2, r)
        it = iter(loader)
        heads.append([next(it) for _ in range(5)])
        if r == 0:
            state = loader.state_dict()
        del it, loader
    rests = []
    for r in range(3):
        loader = make(3, r)
        loader.load_state_dict(state)
        rests.append(list(loader))
    c = Counter(k for p in heads + rests for b in p for k in b)
    assert {sum(map(len, r)) for r in rests} == {17}  # 90 - 2 * 20 = 50 left: 17 each
    assert len(c) == N and sum(c.values()) == N + 1  # every sample, one padded twice


def test_streaming_refuses_another_world_size(make_shards: Any) -> None:
    paths = make_shards([10, 10], name="st")
    state = TarIterableDataset(paths, rank=0, world_size=2).state_dict()
    with pytest.raises(ValueError, match="world_size=2, this run has world_size=3.*BlockSampler"):
        TarIterableDataset(paths, rank=0, world_size=3).load_state_dict(state)


@pytest.mark.timeout(60)
def test_dataloader_workers_play_the_set_epoch(ds: TarDataset) -> None:
    """A DataLoader with workers calls iter(sampler) twice per epoch: still epoch e, not e+1."""
    s = BlockSampler(ds, block_size=4, seed=2)
    loader = torch.utils.data.DataLoader(
        ds, batch_size=BS, sampler=s, num_workers=2, collate_fn=keys
    )
    for e in (0, 1, 1):
        s.set_epoch(e)
        got = [k for b in loader for k in b]
        assert got == [ds[i]["__key__"] for i in s.indices(e).tolist()]
