"""TarIterableDataset(batched=True): BatchedSamples per batch, real DataLoaders, ranks, resume."""

from __future__ import annotations

import os
import shutil
import warnings
from collections import Counter
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from torch.utils.data import DataLoader  # noqa: E402

from tarindex import OpenOptions, TarDataset, TarIterableDataset  # noqa: E402
from tarindex.torch.collate import BatchedSamples  # noqa: E402

pytestmark = [
    pytest.mark.timeout(120),
    pytest.mark.filterwarnings("ignore:This DataLoader will create", "ignore:'set_vital'"),
]

SIZES = [13, 5, 11, 1, 9, 17, 10]  # 66 samples in 7 uneven shards
N = sum(SIZES)
KW: dict[str, Any] = dict(block_size=4, buffer_size=8, batched=True)


@pytest.fixture
def shards(make_shards: Any) -> list[str]:
    paths: list[str] = make_shards(SIZES)
    return paths


def worker_batches(ds: TarIterableDataset, epoch: int, worker: int, nw: int) -> list[list[int]]:
    """The batches worker ``worker`` of ``nw`` yields, from its plan alone."""
    order = ds.plan(epoch, worker, nw).order(ds.shards.starts).tolist()
    b = ds.batch_size
    assert b is not None
    return [order[i : i + b] for i in range(0, len(order), b)]


def loader_batches(ds: TarIterableDataset, epoch: int, nw: int) -> list[list[int]]:
    """What DataLoader(batch_size=None) yields: the workers' batches in turn."""
    per = [worker_batches(ds, epoch, w, max(nw, 1)) for w in range(max(nw, 1))]
    out: list[list[int]] = []
    for k in range(max(map(len, per))):
        out += [b[k] for b in per if k < len(b)]
    return out


def ids(batches: list[BatchedSamples]) -> list[list[int]]:
    return [b.index.tolist() for b in batches]


def check_content(batches: list[BatchedSamples], ref: TarDataset) -> None:
    for batch in batches:
        assert isinstance(batch, BatchedSamples)
        assert batch.cls.tolist() == [i % 10 for i in batch.index.tolist()]
        for b, i in enumerate(batch.index.tolist()):
            assert batch.sample(b) == ref[i]


@pytest.mark.parametrize("shuffle", [True, False])
@pytest.mark.parametrize("use_mmap", [True, False])
def test_batches_follow_the_plan(shards: list[str], shuffle: bool, use_mmap: bool) -> None:
    """In process: batches are consecutive runs of the unbatched yield order, byte-exact."""
    ref = TarDataset(shards)
    for bsz, buf in ((4, 8), (7, 8), (3, 0), (100, 8)):
        kw = {**KW, "buffer_size": buf, "shuffle": shuffle, "options": OpenOptions(use_mmap=use_mmap)}
        ds = TarIterableDataset(shards, batch_size=bsz, **kw)
        got = list(ds)
        plain = TarIterableDataset(shards, **{**kw, "batched": False})
        assert [i for b in got for i in b.index.tolist()] == [s["__index__"] for s in plain]
        assert [len(b) for b in got] == [bsz] * (N // bsz) + ([N % bsz] if N % bsz else [])
        assert len(ds) == ds.num_batches == len(got) and ds.num_samples == N
        check_content(got, ref)
    b = got[0]
    assert b.fields == ("bin", "txt") and b.int_fields == ("cls",)
    assert all(isinstance(x, BatchedSamples) for x in got)


@pytest.mark.parametrize("nw", [0, 2])
def test_dataloader_exactly_once(shards: list[str], nw: int) -> None:
    ds = TarIterableDataset(shards, batch_size=4, **KW)
    loader = DataLoader(ds, batch_size=None, num_workers=nw)
    assert len(loader) == len(ds) == 17  # ceil(66 / 4), whatever num_workers
    for epoch in (0, 1):
        ds.set_epoch(epoch)
        with warnings.catch_warnings():
            warnings.simplefilter("error", UserWarning)  # no "Length of IterableDataset" warning
            got = list(loader)
        assert ids(got) == loader_batches(ds, epoch, nw)
        flat = [i for b in ids(got) for i in b]
        assert sorted(flat) == list(range(N))
        assert len(got) == len(loader)
        assert sorted(map(len, got)) == [2] + [4] * 16  # one short batch per rank, not per worker
    check_content(got, TarDataset(shards))


def test_spawn_workers(shards: list[str]) -> None:
    ds = TarIterableDataset(shards, batch_size=5, **KW)
    next(iter(ds))  # read in the parent first: open readers and an active epoch must not travel
    ds.set_epoch(3)
    got = list(DataLoader(ds, batch_size=None, num_workers=2, multiprocessing_context="spawn"))
    assert ids(got) == loader_batches(ds, 3, 2)
    assert all(b.data.untyped_storage().is_shared() for b in got if b.data.numel())
    check_content(got, TarDataset(shards))


@pytest.mark.parametrize("drop_last", [False, True])
def test_ranks_equal_batch_counts(make_shards: Any, drop_last: bool) -> None:
    """Every rank yields len(ds) batches, and worker w the same number on every rank."""
    for sizes in (SIZES, [5, 7, 5]):  # 66 samples, and 17 (not divisible by 2 or 3)
        paths = make_shards(sizes, name=f"s{len(sizes)}")
        n = sum(sizes)
        for ws in (2, 3):
            for bsz in (1, 4, 5):
                for nw in (1, 2, 3):
                    seen: Counter[int] = Counter()
                    counts = []
                    for r in range(ws):
                        ds = TarIterableDataset(
                            paths,
                            batch_size=bsz,
                            rank=r,
                            world_size=ws,
                            drop_last=drop_last,
                            block_size=3,
                            buffer_size=5,
                            batched=True,
                        )
                        per_w = []
                        for w in range(nw):
                            # what worker w of nw yields, run in process
                            got = ids(list(ds.iter_batches(ds.plan(0, w, nw))))
                            assert got == worker_batches(ds, 0, w, nw)
                            per_w.append(len(got))
                            seen.update(i for b in got for i in b)
                        assert sum(per_w) == len(ds)
                        counts.append(per_w)
                    assert all(c == counts[0] for c in counts), counts
                    if n % ws == 0 or drop_last:
                        assert set(seen.values()) == {1} and len(seen) == n - n % ws * drop_last
                    else:
                        assert sorted(seen) == list(range(n))
    # and through a real DataLoader: two ranks, two workers each
    per_rank = []
    for r in range(2):
        ds = TarIterableDataset(
            make_shards([5, 7, 5], name="dl"), batch_size=2, rank=r, world_size=2, **KW
        )
        loaded = list(DataLoader(ds, batch_size=None, num_workers=2))
        assert ids(loaded) == loader_batches(ds, 0, 2) and len(loaded) == len(ds) == 5
        per_rank.append(ids(loaded))
    c = Counter(i for p in per_rank for b in p for i in b)
    assert sorted(c) == list(range(17)) and sum(c.values()) == 18  # 17 padded to 2 x 9


def test_resume_in_process(shards: list[str]) -> None:
    kw = dict(batch_size=4, seed=11, rank=1, world_size=2, **KW)
    ref = TarIterableDataset(shards, **kw)
    ref.set_epoch(5)
    full = ids(list(ref))
    for k in (0, 1, 4, len(full) - 1, len(full)):
        ds = TarIterableDataset(shards, **kw)
        ds.set_epoch(5)
        it = iter(ds)
        head = [next(it).index.tolist() for _ in range(k)]
        state = ds.state_dict()
        assert state["consumed"] == min(4 * k, 33) and state["batch_size"] == 4
        fresh = TarIterableDataset(shards, **{**kw, "seed": 0})
        fresh.load_state_dict(state)
        assert head + ids(list(fresh)) == full
        ref.set_epoch(6)
        assert ids(list(fresh)) == ids(list(ref))  # then the next epoch
    # off the batch grid: the first batch runs to the next multiple of batch_size
    ds = TarIterableDataset(shards, **kw)
    ds.set_epoch(5)
    state = {**ds.state_dict(), "consumed": 9}
    fresh = TarIterableDataset(shards, **kw)
    fresh.load_state_dict(state)
    rest = ids(list(fresh))
    assert rest[0] == full[2][1:] and rest[1:] == full[3:]


def test_stateful_dataloader_resume(shards: list[str]) -> None:
    sdl = pytest.importorskip("torchdata.stateful_dataloader")

    def make() -> Any:
        ds = TarIterableDataset(shards, batch_size=4, seed=1, **KW)
        ds.set_epoch(2)
        return sdl.StatefulDataLoader(ds, batch_size=None, num_workers=2)

    full = ids(list(make()))
    assert full == loader_batches(TarIterableDataset(shards, batch_size=4, seed=1, **KW), 2, 2)
    for k in (1, 6, len(full) - 1):
        loader = make()
        head = []
        for b in loader:
            head.append(b.index.tolist())
            if len(head) == k:
                break
        state = loader.state_dict()
        del loader
        restored = make()  # a fresh dataset and a fresh loader
        restored.load_state_dict(state)
        assert head + ids(list(restored)) == full, k


def test_arguments_and_state_mismatch(shards: list[str]) -> None:
    with pytest.raises(ValueError, match="decode/transform"):
        TarIterableDataset(shards, decode=True, batched=True, batch_size=4)
    with pytest.raises(ValueError, match="decode/transform"):
        TarIterableDataset(shards, transform=len, batched=True, batch_size=4)
    with pytest.raises(ValueError, match="batch_size"):
        TarIterableDataset(shards, batched=True)
    with pytest.raises(ValueError, match="batch_size"):
        TarIterableDataset(shards, batched=True, batch_size=0)
    with pytest.raises(ValueError, match="without batched=True"):
        TarIterableDataset(shards, batch_size=4)
    with pytest.raises(ValueError, match="num_batches"):
        TarIterableDataset(shards).num_batches  # noqa: B018
    plain = TarIterableDataset(shards, block_size=4, buffer_size=8)
    batched = TarIterableDataset(shards, batch_size=4, **KW)
    with pytest.raises(ValueError, match="batch_size"):
        batched.load_state_dict(plain.state_dict())
    with pytest.raises(ValueError, match="batch_size"):
        TarIterableDataset(shards, batch_size=8, **KW).load_state_dict(batched.state_dict())
    # a state saved before batch_size existed (version 1: no layout either) still loads where
    # the shard layout cannot matter (shuffle=False); shuffled, it is refused (issue 19, 14)
    def old(ds: TarIterableDataset) -> dict[str, Any]:
        st = ds.state_dict()
        return {**{k: v for k, v in st.items() if k not in ("batch_size", "layout")}, "version": 1}

    with pytest.raises(ValueError, match="version 1 does not record the shard layout"):
        plain.load_state_dict(old(plain))
    flat = TarIterableDataset(shards, block_size=4, buffer_size=8, shuffle=False)
    flat.load_state_dict(old(flat))
    assert flat.state_dict()["batch_size"] is None
    # the default collate refuses a BatchedSamples list: DataLoader(batch_size=...) by mistake
    with pytest.raises(TypeError):
        next(iter(DataLoader(batched, batch_size=2)))


def test_int_fields_and_on_error(shards: list[str], tmp_path: Any) -> None:
    ds = TarIterableDataset(shards, batch_size=8, int_fields=(), **KW)
    b = next(iter(ds))
    assert b.int_fields == () and "cls" in b.fields
    assert [int(b.bytes("cls", k)) for k in range(len(b))] == [i % 10 for i in b.index.tolist()]
    # a shard replaced after indexing: skipped with a warning, or raised
    copies = []
    for p in shards:
        q = str(tmp_path / os.path.basename(p))
        shutil.copy(p, q)
        shutil.copy(p + ".tidx", q + ".tidx")
        copies.append(q)
    with open(copies[2], "ab") as f:
        f.write(b"\0" * 512)
    bad = range(sum(SIZES[:2]), sum(SIZES[:3]))
    skip = TarIterableDataset(copies, batch_size=4, on_error="skip", **KW)
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        got = [i for b in skip for i in b.index.tolist()]
    assert sorted(got) == [i for i in range(N) if i not in bad]
    assert w and all("skipped" in str(x.message) for x in w)
    with pytest.raises(Exception, match="tar"):
        list(TarIterableDataset(copies, batch_size=4, **KW))
