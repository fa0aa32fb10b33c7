"""TarDataset, TarIterableDataset and MixedDataset's sources over a ready ShardSet.

The same samples, in the same order, as over the source paths; the ShardSet is read through
as it is (not reopened) and pickles to DataLoader workers (spawn: pickled, nothing inherited).
"""

from __future__ import annotations

import pickle
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from torch.utils.data import DataLoader  # noqa: E402

from tarindex import (  # noqa: E402
    MixedDataset,
    OpenOptions,
    RemoteOptions,
    ShardSet,
    TarDataset,
    TarIterableDataset,
)
from tarindex.read.subset import ShardSubset  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore:This DataLoader will create")

SIZES = [13, 5, 11, 1, 9, 17, 10]


def ids(batch: list[dict[str, Any]]) -> list[tuple[int, str, bytes]]:
    """collate_fn (module level: picklable): index, key and bytes of each sample."""
    return [(int(s["__index__"]), s["__key__"], bytes(s["bin"])) for s in batch]


def flat(batches: list[list[Any]]) -> list[Any]:
    return [x for b in batches for x in b]


def test_map_style_over_a_shardset(make_shards: Any) -> None:
    paths = make_shards(SIZES)
    ss = ShardSet(paths, options=OpenOptions(max_open=3))
    ds, ref = TarDataset(ss, decode=True), TarDataset(paths, decode=True)
    assert ds.shards is ss and len(ds) == len(ref) == sum(SIZES)
    for i in (0, 12, 13, 65):
        assert ds[i] == ref[i]
    back = pickle.loads(pickle.dumps(ds))
    assert back.shards.max_open == 3 and back[40] == ref[40]
    loader = DataLoader(TarDataset(ss), batch_size=8, shuffle=False, num_workers=2,
                        collate_fn=ids, multiprocessing_context="spawn")
    want = DataLoader(TarDataset(paths), batch_size=8, collate_fn=ids)
    assert flat(list(loader)) == flat(list(want))
    sub = TarDataset(ss, subset=[3, 20, 7])
    assert [s["__index__"] for s in sub] == [3, 7, 20]
    assert TarDataset(ShardSubset(ss, [3, 20, 7]))[1]["__index__"] == 7


@pytest.mark.parametrize("opt", [{"options": OpenOptions(max_open=4)},
                                 {"options": OpenOptions(use_mmap=False)},
                                 {"options": OpenOptions(verify_data=True)},
                                 {"options": OpenOptions(check_crc=False)},
                                 {"options": OpenOptions(index_dir="x")},
                                 {"options": OpenOptions()},
                                 {"remote": RemoteOptions(retries=1)}])
def test_open_options_with_a_shardset_are_refused(make_shards: Any, opt: dict[str, Any]) -> None:
    ss = ShardSet(make_shards([3]))
    for cls in (TarDataset, TarIterableDataset):
        with pytest.raises(ValueError, match=f"{next(iter(opt))} given with a ready ShardSet"):
            cls(ss, **opt)


@pytest.mark.timeout(120)
def test_streaming_over_a_shardset_through_spawned_workers(make_shards: Any) -> None:
    paths = make_shards(SIZES)
    ss = ShardSet(paths)
    ds = TarIterableDataset(ss, block_size=4, buffer_size=8, seed=3)
    ref = TarIterableDataset(paths, block_size=4, buffer_size=8, seed=3)
    assert ds.shards is ss
    assert [s["__index__"] for s in ds] == [s["__index__"] for s in ref]  # epoch 0
    ds.set_epoch(1)
    ref.set_epoch(1)
    got = DataLoader(ds, batch_size=4, num_workers=2, collate_fn=ids,
                     multiprocessing_context="spawn")
    want = DataLoader(ref, batch_size=4, num_workers=2, collate_fn=ids)
    g = list(got)
    assert g == list(want)
    assert sorted(i for i, _, _ in flat(g)) == list(range(sum(SIZES)))
    batched = TarIterableDataset(ss, batched=True, batch_size=5, block_size=4)
    assert [b.index.tolist() for b in batched] == [
        b.index.tolist() for b in TarIterableDataset(paths, batched=True, batch_size=5, block_size=4)
    ]


@pytest.mark.timeout(120)
def test_mix_of_sources_over_shardsets(make_shards: Any) -> None:
    a, b = make_shards([30, 20], name="a"), make_shards([12], name="b", seed=1)

    def mix(over_sets: bool) -> MixedDataset:
        srcs = [
            TarIterableDataset(ShardSet(p) if over_sets else p, block_size=4, buffer_size=8)
            for p in (a, b)
        ]
        return MixedDataset(srcs, counts=[50, 6], seed=2, source_key="__source__")

    def pairs(m: Any) -> list[tuple[int, int]]:
        return [(int(s["__source__"]), int(s["__index__"])) for s in m]

    assert pairs(mix(True)) == pairs(mix(False))
    assert pairs(pickle.loads(pickle.dumps(mix(True)))) == pairs(mix(False))
    loader = DataLoader(mix(True), batch_size=4, num_workers=2, collate_fn=pairs)
    want = DataLoader(mix(False), batch_size=4, num_workers=2, collate_fn=pairs)
    assert list(loader) == list(want)
