"""BatchedSamples / collate_batched / TarDataset(batched=True), with real DataLoader workers."""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from torch.utils.data import DataLoader  # noqa: E402

from tarindex import TarDataset  # noqa: E402
from tarindex.torch.collate import BatchedSamples, collate_batched, fetch_batched  # noqa: E402
from tests.conftest import MakeShards  # noqa: E402

pytestmark = pytest.mark.timeout(120)


def _check_batch(batch: BatchedSamples, ds: TarDataset) -> None:
    """Every sample of the batch equals ds[i] byte for byte."""
    assert isinstance(batch, BatchedSamples)
    idx = batch.index.tolist()
    assert batch.index.dtype == torch.int64 and batch.cls.dtype == torch.int64
    for b, i in enumerate(idx):
        want = ds[i]
        assert batch.keys[b] == want["__key__"]
        assert batch.shards[b] == want["__shard__"]
        assert batch.bytes("bin", b) == want["bin"]
        assert bytes(batch.view("txt", b)) == want["txt"]
        assert batch.tensor("bin", b).numel() == len(want["bin"])
        assert int(batch.cls[b]) == int(want["cls"]) == i % 10
        got = batch.sample(b)
        assert got == want


def test_fetch_batched_matches_getitem(make_shards: MakeShards) -> None:
    paths = make_shards([5, 0, 7, 3], seed=1)
    ds = TarDataset(paths)
    order = [14, 0, 3, 7, 7, -1, 5, 11]
    batch = fetch_batched(ds.shards, order)
    assert len(batch) == len(order)
    assert batch.index.tolist() == [i % len(ds) for i in order]
    _check_batch(batch, ds)
    # offsets/lengths per field are consistent with the data buffer
    off = batch.offsets("bin")
    assert off.shape == (len(order) + 1,) and int(off[-1]) <= batch.data.numel()
    assert batch.lengths("bin").tolist() == [len(ds[i]["bin"]) for i in order]
    assert batch.present("bin").all() and batch.present("cls").all()
    # pickles (what a worker sends) and round-trips
    again = pickle.loads(pickle.dumps(batch))
    _check_batch(again, ds)


def test_out_of_range_and_missing_fields(make_shards: MakeShards) -> None:
    ds = TarDataset(make_shards([4]))
    with pytest.raises(IndexError):
        fetch_batched(ds.shards, [0, 4])
    batch = fetch_batched(ds.shards, [1])
    with pytest.raises(KeyError):
        batch.bytes("png", 0)
    with pytest.raises(KeyError):
        batch.ints("label")
    empty = fetch_batched(ds.shards, [])
    assert len(empty) == 0 and empty.data.numel() == 0


def test_pack_samples_from_dicts(make_shards: MakeShards) -> None:
    ds = TarDataset(make_shards([6]))
    samples = [ds[i] for i in (5, 2, 0)]
    samples[1] = {k: v for k, v in samples[1].items() if k != "txt"}  # a missing member
    batch = collate_batched(samples)
    assert batch.index.tolist() == [5, 2, 0]
    assert batch.present("txt").tolist() == [True, False, True]
    assert batch.sample(1) == samples[1]
    assert batch.sample(0) == samples[0]
    with pytest.raises(TypeError):
        collate_batched([{"__key__": "a", "bin": 3.5}])
    with pytest.raises(TypeError):
        collate_batched(42)


def test_batched_refuses_decode(make_shards: MakeShards) -> None:
    with pytest.raises(ValueError):
        TarDataset(make_shards([2]), decode="pil", batched=True)


def test_default_collate_fails_loudly(make_shards: MakeShards) -> None:
    ds = TarDataset(make_shards([3]), batched=True)
    loader = DataLoader(ds, batch_size=2)  # forgot collate_fn=collate_batched
    with pytest.raises(TypeError):
        next(iter(loader))


@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_dataloader_two_workers_exactly_once(make_shards: MakeShards, context: str) -> None:
    sizes = [37, 0, 64, 1, 90]
    ds = TarDataset(make_shards(sizes, seed=3), batched=True)
    n = len(ds)
    g = torch.Generator().manual_seed(0)
    loader = DataLoader(
        ds,
        batch_size=16,
        shuffle=True,
        num_workers=2,
        collate_fn=collate_batched,
        multiprocessing_context=context,
        generator=g,
    )
    for _epoch in range(2):
        seen: list[int] = []
        for batch in loader:
            assert isinstance(batch, BatchedSamples)
            seen += batch.index.tolist()
            labels = batch.cls
            assert labels.tolist() == [i % 10 for i in batch.index.tolist()]
        counts = np.bincount(np.asarray(seen), minlength=n)
        assert len(seen) == n and (counts == 1).all(), "duplicates or missing samples"
    # content check on one batch from a worker, against the dataset in the main process
    plain = TarDataset(ds.paths)
    batch = next(iter(loader))
    _check_batch(batch, plain)


def test_dataloader_per_sample_path_with_collate(make_shards: MakeShards) -> None:
    """collate_batched also works for the plain (list of dicts) fetch, workers included."""
    ds = TarDataset(make_shards([20, 21], seed=4))
    loader = DataLoader(
        ds,
        batch_size=8,
        shuffle=True,
        num_workers=2,
        collate_fn=collate_batched,
        generator=torch.Generator().manual_seed(1),
    )
    seen = [i for batch in loader for i in batch.index.tolist()]
    assert sorted(seen) == list(range(len(ds)))


def _segment(data: Any) -> tuple[bytes, bytes]:
    """(manager, name) of the shared-memory segment a batch's bytes arrived in."""
    manager, name, _ = data.untyped_storage()._share_filename_cpu_()
    return bytes(manager), bytes(name)


def test_raw_batches_of_other_sizes_reuse_the_workers_segments(make_shards: MakeShards) -> None:
    """A raw batch's size differs from batch to batch: a free segment up to twice the size
    serves (each was a new segment, and an old one dropped: 37% of a worker's CPU)."""
    from tarindex.torch import transport

    assert transport.by_name_available()
    ds = TarDataset(make_shards([120, 80], seed=6), batched=True)
    plain = TarDataset(ds.paths)
    loader = DataLoader(
        ds,
        batch_size=8,
        shuffle=True,
        num_workers=1,
        collate_fn=collate_batched,
        generator=torch.Generator().manual_seed(2),
    )
    names, sizes = [], set()
    for batch in loader:
        names.append(_segment(batch.data)[1])
        used = max(int(batch.offsets(f)[-1]) for f in batch.fields)
        assert batch.data.numel() == used  # the batch's bytes, not its segment's tail
        sizes.add(used)
        _check_batch(batch, plain)
        again = pickle.loads(pickle.dumps(batch))  # passed on by name: the same bytes
        assert again.data.numel() == used
        _check_batch(again, plain)
    assert len(names) == 25 and len(sizes) > 20
    assert len(set(names)) <= transport.POOL_SEGMENTS


_MANAGER_SCRIPT = """
import sys, torch, tarindex
from tarindex.torch.collate import collate_batched

def managers(loader):
    return {bytes(b.data.untyped_storage()._share_filename_cpu_()[0]) for b in loader}

ds = tarindex.TarDataset(sys.argv[1:], batched=True)
loader = torch.utils.data.DataLoader(ds, batch_size=8, shuffle=True, num_workers=2,
                                     collate_fn=collate_batched, multiprocessing_context="fork")
first = managers(loader)
print(len(first), len(first | managers(loader)))
"""


def test_forked_workers_share_the_shm_manager_started_before_the_fork(
    make_shards: MakeShards, tmp_path: Path
) -> None:
    """Each worker started torch's shm manager (~0.2 s, 0.5-1 s with 2 at once on 2 cores)
    before its first batch; a batched dataset's process starts it once, at its first fork.

    In a fresh process: one that received segments before has their managers to hand down.
    """
    import subprocess
    import sys

    script = tmp_path / "managers.py"
    script.write_text(_MANAGER_SCRIPT)
    paths = make_shards([40, 40], seed=7)
    out = subprocess.run(
        [sys.executable, str(script), *paths], check=True, timeout=120, capture_output=True
    ).stdout.decode()
    assert out.split() == ["1", "1"], out  # "2 ..." before: one manager per worker


_LEAK_SCRIPT = """
import os, sys, torch, tarindex
from tarindex.torch.collate import collate_batched

def say_pid(_):
    os.write(1, f"pid {os.getpid()}\\n".encode())  # one write: workers' lines never interleave

if __name__ == "__main__":
    say_pid(0)
    ds = tarindex.TarDataset(sys.argv[1:], batched=True)
    dl = torch.utils.data.DataLoader(ds, batch_size=4, shuffle=True, num_workers=2,
                                     collate_fn=collate_batched, prefetch_factor=4,
                                     worker_init_fn=say_pid)
    it = iter(dl)
    keep = [next(it) for _ in range(2)]   # stop early: batches still in flight
    assert all(b.data.untyped_storage().is_shared() for b in keep)
    del it
"""


def test_shared_buffers_are_released_after_early_stop(
    make_shards: MakeShards, tmp_path: Path
) -> None:
    """Worker buffers go by name (torch file_system sharing); none outlives the processes."""
    import os
    import subprocess
    import sys
    import time

    if not os.path.isdir("/dev/shm"):
        pytest.skip("no /dev/shm")
    paths = make_shards([40, 40], seed=5)
    script = tmp_path / "early.py"
    script.write_text(_LEAK_SCRIPT)
    out = subprocess.run(
        [sys.executable, str(script), *paths], check=True, timeout=120, capture_output=True
    ).stdout.decode()
    # segments are named torch_<pid of the creating process>_...: only this script's count
    # (other test runs on the machine may hold segments of their own meanwhile)
    pids = {ln.split()[1] for ln in out.splitlines() if ln.startswith("pid ")}
    assert len(pids) == 3, out
    deadline = time.time() + 30
    left = set()
    while time.time() < deadline:
        left = {
            f
            for f in os.listdir("/dev/shm")
            if f.startswith("torch_") and f.split("_")[1] in pids
        }
        if not left:
            break
        time.sleep(0.5)
    assert not left, f"shared-memory segments left behind: {sorted(left)}"


def test_a_label_that_is_not_a_decimal_integer_names_shard_offset_and_member(
    tmp_path: Path,
) -> None:
    import tarindex
    from tarindex.errors import FormatError

    pattern = str(tmp_path / "s-%03d.tar")
    with tarindex.ShardWriter(pattern, maxcount=10) as w:
        for i in range(6):
            w.write({"__key__": f"k{i}", "bin": bytes([i]) * 700, "cls": b"x7" if i == 4 else i})
    ds = tarindex.TarDataset(str(tmp_path / "s-000.tar"), batched=True)
    got = fetch_batched(ds.shards, [0, 1, 2, 3, 5])  # the good ones pack
    assert got.cls.tolist() == [0, 1, 2, 3, 5]
    r = tarindex.ShardReader(str(tmp_path / "s-000.tar"))
    off = int(r.index.offset[9])  # sample 4's cls member (bin, cls per sample)
    with pytest.raises(FormatError, match=rf"s-000\.tar: byte {off}: member k4\.cls is not a"):
        fetch_batched(ds.shards, [3, 4, 1])
    assert fetch_batched(ds.shards, [4], int_fields=()).bytes("cls", 0) == b"x7"
