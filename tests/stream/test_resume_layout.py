"""A resume state pins the shard layout (issue 19, item 14; docs/STREAMING.md, "Resume").

The same 100 samples written as 4 shards of 25 and as 2 shards of 50: a shuffled plan cuts
blocks per shard and permutes the shards, so position ``k`` of an epoch is another sample on
the other layout. A state saved on one layout is refused on the other (naming both), accepted
on the same one (exact), and accepted where the plan does not depend on the layout
(``shuffle=False``: the stream is the samples in order). States of version 1 (saved before
the layout was recorded) load only where the layout cannot matter.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from tarindex import (  # noqa: E402
    BlockSampler,
    MixedDataset,
    MixSampler,
    TarDataset,
    TarIterableDataset,
)
from tarindex.plan.state import shard_layout  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore:This DataLoader will create")

N = 100
KW: dict[str, Any] = {"block_size": 8, "buffer_size": 16, "seed": 5}
LAYOUT = "shard layout"


@pytest.fixture
def four(make_shards: Any) -> list[str]:
    return list(make_shards([25] * 4, name="four"))  # samples 0..99, 4 x 25


@pytest.fixture
def two(make_shards: Any) -> list[str]:
    return list(make_shards([50] * 2, name="two"))  # the same samples (same seed), 2 x 50


def keys(samples: Any) -> list[str]:
    return [str(s["__key__"]) for s in samples]


def key_batches(batch: list[dict[str, Any]]) -> list[str]:
    """collate_fn: a batch as its keys (module level: picklable)."""
    return keys(batch)


def v1(state: dict[str, Any]) -> dict[str, Any]:
    """The state as version 1 saved it: the same keys without ``layout``."""
    old = {k: v for k, v in state.items() if k != "layout"}
    old["version"] = 1
    return old


def head_and_state(ds: Any, k: int) -> tuple[list[str], dict[str, Any]]:
    it = iter(ds)
    head = [str(next(it)["__key__"]) for _ in range(k)]
    return head, ds.state_dict()


def test_same_samples_resharded_are_another_plan(four: list[str], two: list[str]) -> None:
    """Why the layout is pinned: the two layouts' epochs differ at every resume point."""
    a, b = TarIterableDataset(four, **KW), TarIterableDataset(two, **KW)
    assert keys(TarDataset(four)) == keys(TarDataset(two))  # the same samples, in order
    ea, eb = keys(a), keys(b)
    assert sorted(ea) == sorted(eb) and ea != eb
    assert len(set(ea[:50]) & set(eb[50:])) > 0  # resuming one on the other repeats samples
    assert shard_layout(a.shards.counts) != shard_layout(b.shards.counts)
    assert shard_layout(a.shards.counts) == [4, shard_layout(np.full(4, 25))[1]]


def test_streaming_state_refused_on_another_layout(four: list[str], two: list[str]) -> None:
    ds = TarIterableDataset(four, **KW)
    ds.set_epoch(1)
    head, state = head_and_state(ds, 50)
    assert state["layout"] == shard_layout([25] * 4)
    other = TarIterableDataset(two, **KW)
    with pytest.raises(ValueError, match=LAYOUT) as e:
        other.load_state_dict(state)
    msg = str(e.value)
    assert "4 shards" in msg and "2 shards" in msg and "set_epoch" in msg, msg
    assert "100 samples" in msg, msg
    # refused before anything is armed: the next epoch plays normally
    assert sorted(keys(other)) == sorted(keys(TarDataset(two)))
    # the same layout (a fresh dataset over the same shards) resumes exactly
    fresh = TarIterableDataset(four, **{**KW, "seed": 0})
    fresh.load_state_dict(state)
    rest = keys(fresh)
    assert head + rest == keys_epoch(four, 1)
    assert Counter(head + rest) == Counter(keys(TarDataset(four)))


def keys_epoch(paths: list[str], epoch: int, **kw: Any) -> list[str]:
    ds = TarIterableDataset(paths, **{**KW, **kw})
    ds.set_epoch(epoch)
    return keys(ds)


def test_unshuffled_state_resumes_on_any_layout(four: list[str], two: list[str]) -> None:
    """shuffle=False: position k is sample k on every layout, so any layout resumes exactly."""
    ds = TarIterableDataset(four, **{**KW, "shuffle": False})
    head, state = head_and_state(ds, 37)
    other = TarIterableDataset(two, **{**KW, "shuffle": False})
    other.load_state_dict(state)
    assert head + keys(other) == [f"{i:08d}" for i in range(N)]
    legacy = TarIterableDataset(two, **{**KW, "shuffle": False})
    legacy.load_state_dict(v1(state))  # a version-1 state where the layout cannot matter
    assert head + keys(legacy) == [f"{i:08d}" for i in range(N)]


def test_version_1_state_of_a_shuffled_plan_is_refused(four: list[str]) -> None:
    ds = TarIterableDataset(four, **KW)
    _, state = head_and_state(ds, 10)
    with pytest.raises(ValueError, match="version 1") as e:
        TarIterableDataset(four, **KW).load_state_dict(v1(state))
    assert "layout" in str(e.value) and "set_epoch" in str(e.value)


@pytest.mark.timeout(180)
def test_through_stateful_dataloader_workers(four: list[str], two: list[str]) -> None:
    """Per-worker states (2 workers): another layout is refused, the same one resumes."""
    sdl = pytest.importorskip("torchdata.stateful_dataloader")

    def loader(paths: list[str]) -> Any:
        return sdl.StatefulDataLoader(
            TarIterableDataset(paths, **KW), batch_size=5, num_workers=2, collate_fn=key_batches
        )

    full = list(loader(four))
    first = loader(four)
    head = []
    for b in first:
        head.append(b)
        if len(head) == 7:
            break
    state = first.state_dict()
    del first
    wrong = loader(two)
    wrong.load_state_dict(state)
    with pytest.raises(ValueError, match=LAYOUT):
        list(wrong)
    same = loader(four)
    same.load_state_dict(state)
    assert head + list(same) == full


def test_block_sampler(four: list[str], two: list[str]) -> None:
    kw: dict[str, Any] = {"block_size": 8, "buffer_size": 4, "seed": 2}
    s = BlockSampler(TarDataset(four), **kw)
    it = iter(s)
    head = [next(it) for _ in range(50)]
    state = s.state_dict()
    for target in (TarDataset(two), N):  # 2 x 50, and a bare length (one block run)
        with pytest.raises(ValueError, match=LAYOUT) as e:
            BlockSampler(target, **kw).load_state_dict(state)
        assert "4 shards" in str(e.value), str(e.value)
    same = BlockSampler(TarDataset(four), **kw)
    same.load_state_dict(state)
    assert sorted(head + list(same)) == list(range(N))
    # on another world size too: what is left, dealt over 2 ranks, same layout only
    with pytest.raises(ValueError, match=LAYOUT):
        BlockSampler(TarDataset(two), rank=0, world_size=2, **kw).load_state_dict(state)
    rest = []
    for r in range(2):
        t = BlockSampler(TarDataset(four), rank=r, world_size=2, **kw)
        t.load_state_dict(state)
        rest += list(t)
    assert sorted(head + rest) == list(range(N))
    # unshuffled: any layout; a version-1 state only there
    flat = BlockSampler(TarDataset(four), shuffle=False, **kw)
    it = iter(flat)
    head = [next(it) for _ in range(30)]
    st = flat.state_dict()
    for loaded in (st, v1(st)):
        t = BlockSampler(TarDataset(two), shuffle=False, **kw)
        t.load_state_dict(loaded)
        assert head + list(t) == list(range(N))
    with pytest.raises(ValueError, match="version 1"):
        BlockSampler(TarDataset(four), **kw).load_state_dict(v1(state))


def test_mixed_dataset(four: list[str], two: list[str], make_shards: Any) -> None:
    other = make_shards([10, 6], name="other", seed=9)

    def mix(first: list[str], shuffle: bool = True, second: bool = True) -> MixedDataset:
        srcs = [
            TarIterableDataset(first, block_size=8, buffer_size=16, shuffle=shuffle),
            TarIterableDataset(other, block_size=4, buffer_size=4, shuffle=second),
        ]
        return MixedDataset(srcs, counts=[60, 16], seed=3, source_key="__source__")

    def ids(items: Any) -> list[tuple[int, str]]:
        return [(int(s["__source__"]), str(s["__key__"])) for s in items]

    full = ids(mix(four))
    m = mix(four)
    it = iter(m)
    head = ids(next(it) for _ in range(30))
    state = m.state_dict()
    assert state["layout"] == [shard_layout([25] * 4), shard_layout([10, 6])]
    with pytest.raises(ValueError, match=LAYOUT) as e:
        mix(two).load_state_dict(state)
    assert "source 0" in str(e.value) and "4 shards" in str(e.value), str(e.value)
    same = mix(four)
    same.load_state_dict(state)
    assert head + ids(same) == full
    with pytest.raises(ValueError, match="version 1"):
        mix(four).load_state_dict(v1(state))
    # source 0 unshuffled: its layout cannot matter, source 1's still must match (it does)
    m = mix(four, shuffle=False)
    it = iter(m)
    head = ids(next(it) for _ in range(30))
    st = m.state_dict()
    t = mix(two, shuffle=False)
    t.load_state_dict(st)
    assert head + ids(t) == ids(mix(two, shuffle=False))
    with pytest.raises(ValueError, match="version 1"):  # source 1 shuffles: layout unknown
        mix(two, shuffle=False).load_state_dict(v1(st))
    m = mix(four, shuffle=False, second=False)  # no source shuffles: version 1 loads too
    it = iter(m)
    head = ids(next(it) for _ in range(30))
    t = mix(two, shuffle=False, second=False)
    t.load_state_dict(v1(m.state_dict()))
    assert head + ids(t) == ids(mix(two, shuffle=False, second=False))


def test_mix_sampler(four: list[str], two: list[str]) -> None:
    kw: dict[str, Any] = {"counts": [80, 20], "block_size": 8, "seed": 4}
    s = MixSampler([TarDataset(four), 30], **kw)
    it = iter(s)
    head = [next(it) for _ in range(40)]
    state = s.state_dict()
    with pytest.raises(ValueError, match=LAYOUT) as e:
        MixSampler([TarDataset(two), 30], **kw).load_state_dict(state)
    assert "source 0" in str(e.value), str(e.value)
    same = MixSampler([TarDataset(four), 30], **kw)
    same.load_state_dict(state)
    ref = MixSampler([TarDataset(four), 30], **kw)
    assert head + list(same) == list(ref)
    with pytest.raises(ValueError, match="version 1"):
        MixSampler([TarDataset(four), 30], **kw).load_state_dict(v1(state))
