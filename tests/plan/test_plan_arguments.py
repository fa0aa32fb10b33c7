"""Counts, sizes, seeds and saved states are checked once, clearly (issue 19, item 18).

Integer arguments (counts, block/buffer/batch sizes, seeds, epochs, ranks) take Python or
numpy integers and refuse anything else (``5.5`` was truncated to ``5``); a saved state with a
missing key, a field of the wrong type or a ``consumed`` past its epoch is a ``ValueError``
naming it; ``fields="bin"`` is one field.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from torch.utils.data import DataLoader  # noqa: E402

from tarindex import (  # noqa: E402
    BlockSampler,
    MixedDataset,
    MixSampler,
    TarDataset,
    TarIterableDataset,
    collate_batched,
)
from tarindex.plan.checks import check_int  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore:This DataLoader will create")

SIZES = [13, 7, 20]
N = sum(SIZES)


@pytest.fixture
def shards(make_shards: Any) -> list[str]:
    return list(make_shards(SIZES))


@pytest.fixture
def small(make_shards: Any) -> list[str]:
    return list(make_shards([6, 4], name="small", seed=1))


# -- integer arguments --------------------------------------------------------------------
def test_check_int() -> None:
    assert check_int("n", np.int32(3), 0) == 3 and type(check_int("n", np.uint64(3))) is int
    for bad in (2.5, 3.0, "3", True, None, np.float64(2.0), [1]):
        with pytest.raises(ValueError, match=r"n=.*expected an integer"):
            check_int("n", bad)
    with pytest.raises(ValueError, match=r"n=-1: expected an integer >= 0"):
        check_int("n", -1, 0)
    with pytest.raises(ValueError, match=r"n=4: expected an integer in \[0, 4\)"):
        check_int("n", 4, 0, 4)


def test_mix_counts_must_be_integers(shards: list[str], small: list[str]) -> None:
    srcs = [TarIterableDataset(shards), TarIterableDataset(small)]
    with pytest.raises(ValueError, match=r"counts\[0\]=5\.5") as e:
        MixedDataset(srcs, counts=[5.5, 1])
    assert "integer" in str(e.value)
    with pytest.raises(ValueError, match=r"counts\[1\]='2'"):
        MixSampler([N, 10], counts=[3, "2"])
    with pytest.raises(ValueError, match=r"counts\[0\]=True"):
        MixSampler([N, 10], counts=[True, 2])
    m = MixedDataset(srcs, counts=[np.int64(5), np.int32(2)])
    assert m.counts.tolist() == [5, 2] and len(list(m)) == 7
    s = MixSampler([N, 10], counts=np.asarray([5, 2]))
    assert s.counts.tolist() == [5, 2] and len(list(s)) == 7
    with pytest.raises(ValueError, match=r"samples_per_epoch=7\.5"):
        MixedDataset(srcs, weights=[1, 1], samples_per_epoch=7.5)
    with pytest.raises(ValueError, match=r"samples_per_epoch=7\.5"):
        MixSampler([N, 10], weights=[1, 1], samples_per_epoch=7.5)


FLOATS = [
    ("block_size", 2.5),
    ("buffer_size", 1.5),
    ("seed", 1.5),
    ("seed", -1),
    ("rank", 0.0),
    ("world_size", 2.0),
]


@pytest.mark.parametrize("name,value", FLOATS)
def test_count_arguments_refuse_non_integers(
    shards: list[str], small: list[str], name: str, value: Any
) -> None:
    kw: dict[str, Any] = {name: value}
    if name == "rank":
        kw["world_size"] = 2
    if name == "world_size":
        kw["rank"] = 0
    pat = rf"{name}={value!r}"
    with pytest.raises(ValueError, match=pat):
        TarIterableDataset(shards, **kw)
    with pytest.raises(ValueError, match=pat):
        BlockSampler(N, **kw)
    with pytest.raises(ValueError, match=pat):
        MixSampler([N, 10], counts=[3, 2], **kw)
    if name not in ("block_size", "buffer_size"):  # a mix's own arguments
        with pytest.raises(ValueError, match=pat):
            MixedDataset([TarIterableDataset(shards)], counts=[3], **kw)


def test_split_keys_seed_must_be_an_integer() -> None:
    from tarindex.plan.split import split_keys

    keys = [f"{i:08d}" for i in range(50)]
    with pytest.raises(ValueError, match=r"seed=1\.5"):
        split_keys(keys, [0.5, 0.5], seed=1.5)  # type: ignore[arg-type]
    seed: Any = np.int64(1)  # a numpy integer is an integer
    assert split_keys(keys, [0.5, 0.5], seed=seed).tolist() == (
        split_keys(keys, [0.5, 0.5], seed=1).tolist()
    )


def test_batch_size_and_epoch_refuse_non_integers(shards: list[str]) -> None:
    with pytest.raises(ValueError, match=r"batch_size=2\.5"):
        TarIterableDataset(shards, batched=True, batch_size=2.5)
    for owner in (TarIterableDataset(shards), BlockSampler(N)):
        with pytest.raises(ValueError, match=r"epoch=1\.5"):
            owner.set_epoch(1.5)
    with pytest.raises(ValueError, match=r"dataset_or_len=2\.5"):
        BlockSampler(2.5)
    # numpy integers are integers
    ds = TarIterableDataset(
        shards, block_size=np.int64(4), buffer_size=np.int32(8), seed=np.uint8(3)
    )
    assert (ds.block_size, ds.buffer_size, ds.seed) == (4, 8, 3)
    assert type(ds.block_size) is int and len(list(ds)) == N
    ds.set_epoch(np.int64(2))
    assert ds.epoch == 2


# -- saved states -------------------------------------------------------------------------
def owners(shards: list[str], small: list[str]) -> dict[str, Any]:
    """A fresh one of each resumable kind, by name."""
    return {
        "stream": lambda: TarIterableDataset(shards, block_size=4, buffer_size=8),
        "batched": lambda: TarIterableDataset(shards, block_size=4, batched=True, batch_size=4),
        "mix": lambda: MixedDataset(
            [TarIterableDataset(shards), TarIterableDataset(small)], counts=[30, 10]
        ),
        "block": lambda: BlockSampler(TarDataset(shards), block_size=4),
        "mixsampler": lambda: MixSampler([TarDataset(shards), 10], counts=[30, 10]),
    }


KINDS = ["stream", "batched", "mix", "block", "mixsampler"]


def saved(make: Any, k: int = 5) -> dict[str, Any]:
    o = make()
    it = iter(o)
    for _ in range(k):
        next(it)
    return dict(o.state_dict())


@pytest.mark.parametrize("kind", KINDS)
def test_state_consumed_beyond_the_epoch(shards: list[str], small: list[str], kind: str) -> None:
    make = owners(shards, small)[kind]
    state = saved(make, 2)
    n = 40 if kind.startswith("mix") else N  # positions one worker plays this epoch
    for bad in (10**9, n + 1, -1):
        with pytest.raises(ValueError, match=rf"consumed={bad}") as e:
            make().load_state_dict({**state, "consumed": bad})
        assert f"0..{n}" in str(e.value), str(e.value)
    last = make()
    last.load_state_dict({**state, "consumed": n})  # after the last sample: an empty tail
    assert list(last) == []


@pytest.mark.parametrize("kind", KINDS)
def test_state_missing_keys(shards: list[str], small: list[str], kind: str) -> None:
    make = owners(shards, small)[kind]
    state = saved(make)
    for key in state:
        broken = {k: v for k, v in state.items() if k != key}
        with pytest.raises(ValueError, match=rf"missing '{key}'") as e:
            make().load_state_dict(broken)
        msg = str(e.value)
        assert "expected the keys" in msg and all(repr(k) in msg for k in state), msg
    with pytest.raises(ValueError, match="missing 'epoch', 'seed'"):
        make().load_state_dict({k: v for k, v in state.items() if k not in ("seed", "epoch")})
    with pytest.raises(ValueError, match="expected a dict"):
        make().load_state_dict([1, 2])


@pytest.mark.parametrize("kind", KINDS)
def test_state_fields_out_of_range(shards: list[str], small: list[str], kind: str) -> None:
    make = owners(shards, small)[kind]
    state = saved(make)
    bad: list[tuple[str, Any]] = [
        ("epoch", -1),
        ("epoch", 1.5),
        ("seed", 1.5),
        ("seed", -3),
        ("seed", "7"),
        ("consumed", 2.0),
        ("world_size", 0),
        ("rank", 5),
    ]
    if "worker" in state:
        bad += [("worker", 2), ("num_workers", 0)]
    for key, value in bad:
        with pytest.raises(ValueError, match=rf"state {key}={value!r}"):
            make().load_state_dict({**state, key: value})
    ok = make()
    ok.load_state_dict({**state, "seed": np.int64(state["seed"]), "epoch": np.uint32(0)})
    got = list(ok)
    n = sum(len(b) for b in got) if kind == "batched" else len(got)
    assert n == (40 if kind.startswith("mix") else N) - (20 if kind == "batched" else 5)


def test_mix_world_size_mismatch_says_what_to_do(shards: list[str], small: list[str]) -> None:
    state = saved(owners(shards, small)["mix"])
    two = MixedDataset(
        [TarIterableDataset(shards), TarIterableDataset(small)],
        counts=[30, 10],
        rank=0,
        world_size=2,
    )
    with pytest.raises(ValueError, match="world_size=1, this run has world_size=2") as e:
        two.load_state_dict(state)
    assert "set_epoch" in str(e.value) and "MixSampler" in str(e.value)


# -- fields= ------------------------------------------------------------------------------
def test_fields_bare_string_is_one_field(shards: list[str], small: list[str]) -> None:
    ds = TarDataset(shards, fields="bin")
    assert set(ds[0]) == {"__key__", "__shard__", "__index__", "bin"}
    assert set(TarDataset(shards, fields=("bin",))[0]) == set(ds[0])
    assert [set(s) for s in ds.__getitems__([1, 2])] == [set(ds[0])] * 2
    assert ds.raw(3)["bin"] == TarDataset(shards)[3]["bin"]
    batch = TarDataset(shards, fields="bin", batched=True).__getitems__([0, 1])
    assert batch.bytes("bin", 1) == ds[1]["bin"]
    it = TarIterableDataset(shards, fields="bin", shuffle=False)
    got = list(it)
    assert len(got) == N and all(set(s) == set(ds[0]) for s in got)
    assert [s["bin"] for s in got[:3]] == [ds[i]["bin"] for i in range(3)]
    b = next(iter(TarIterableDataset(shards, fields="bin", batched=True, batch_size=4)))
    assert b.bytes("bin", 0) == ds[b.index[0].item()]["bin"]
    mix = MixedDataset(
        [TarIterableDataset(shards, fields="bin"), TarIterableDataset(small, fields="cls")],
        counts=[5, 5],
    )
    assert sorted(sorted(k for k in s if not k.startswith("__")) for s in mix) == (
        [["bin"]] * 5 + [["cls"]] * 5
    )
    ints = TarIterableDataset(shards, batched=True, batch_size=4, int_fields="cls", shuffle=False)
    assert next(iter(ints)).ints("cls").tolist() == [0, 1, 2, 3]
    loader = DataLoader(
        TarDataset(shards, fields="bin", batched=True),
        batch_size=4,
        num_workers=2,
        collate_fn=collate_batched,
    )
    assert sum(len(b) for b in loader) == N
    for bad in (("bin", 3), [b"bin"]):
        with pytest.raises(ValueError, match="fields="):
            TarDataset(shards, fields=bad)
        with pytest.raises(ValueError, match="fields="):
            TarIterableDataset(shards, fields=bad)
