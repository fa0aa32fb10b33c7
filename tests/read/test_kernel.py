"""The read kernel: blocks, gathers and samples agree; projection reads nothing left out;
descriptors stay bounded; the shared-memory transport's public fallback works."""

from __future__ import annotations

import mmap
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any, cast

import numpy as np
import pytest

import tarindex
import tarindex.read._kernel_py
import tarindex.read.kernel
from tarindex.storage.bytesource import MmapSource, PreadSource
from tests.conftest import MakeShards

pytestmark = pytest.mark.timeout(240)


def _ref(paths: list[str]) -> list[dict[str, Any]]:
    ss = tarindex.ShardSet(paths)
    return [ss.sample(i) for i in range(len(ss))]


def _project(s: dict[str, Any], fields: tuple[str, ...] | None) -> dict[str, Any]:
    return {k: v for k, v in s.items() if k.startswith("__") or fields is None or k in fields}


@pytest.mark.parametrize("use_mmap", [True, False])
@pytest.mark.parametrize("fields", [None, ("cls",), ("bin", "txt"), ("nope",)])
def test_block_gather_sample_agree(
    make_shards: MakeShards, use_mmap: bool, fields: tuple[str, ...] | None
) -> None:
    paths = make_shards([1500, 40])
    ref = _ref(paths)
    ss = tarindex.ShardSet(paths, options=tarindex.OpenOptions(use_mmap=use_mmap))
    src = ss.reader(0).source
    assert isinstance(src, MmapSource if use_mmap else PreadSource)
    rng = np.random.default_rng(0)
    for _ in range(20):
        s = int(rng.integers(0, 2))
        n = int(ss.counts[s])
        j0 = int(rng.integers(0, n))
        j1 = int(rng.integers(j0, n + 1))
        blk = ss.read_block(s, j0, j1, fields)
        base = int(ss.starts[s])
        assert blk.to_samples() == [_project(ref[base + j], fields) for j in range(j0, j1)]
        js = rng.integers(0, n, 9)
        g = ss.reader(s).gather(js, fields)
        got = g.to_samples()
        for k, j in enumerate(js.tolist()):
            want = _project(ref[base + j], fields)
            want["__index__"] = j  # a bare reader's block has base 0
            want["__shard__"] = paths[s]
            assert got[k] == want
    for i in rng.integers(0, len(ss), 50).tolist():
        assert ss.sample(i, fields) == _project(ref[i], fields)
    # ShardSet.gather: one block across shards, in the order asked (repeats, negatives)
    order = rng.integers(-len(ss), len(ss), 64)
    g = ss.gather(order, fields)
    assert len(g.paths) == 2 and len(g.data) == 2
    assert g.to_samples() == [_project(ref[int(i) % len(ss)], fields) for i in order]
    assert g.take(np.array([3, 1])).to_samples() == [
        _project(ref[int(order[k]) % len(ss)], fields) for k in (3, 1)
    ]
    # joined blocks, and detached ones (bytes copied out of the mappings) read the same
    two = tarindex.read.Block.concat([ss.read_block(1, 5, 9, fields), g])
    assert two.to_samples() == ss.read_block(1, 5, 9, fields).to_samples() + g.to_samples()
    assert two.detach().to_samples() == two.to_samples()
    # tables only
    blk = ss.read_block(0, 0, 10, fields, data=False)
    assert blk.data == [] and blk.offset is None and len(blk) == 10
    with pytest.raises(IndexError):
        ss.gather([len(ss)])


def _left_out_read(ss: tarindex.ShardSet, fields: tuple[str, ...]) -> list[str]:
    """Members not in ``fields`` whose data bytes some logged pread touched."""
    bad = []
    for r in ss._readers.values():
        log = np.asarray(cast(PreadSource, r.source).log, np.int64).reshape(-1, 2)
        t = r.index
        names = np.asarray(r.exts)[t.ext_id.astype(np.int64)]
        out = ~np.isin(names, fields)
        a = t.offset.astype(np.int64)[out]
        e = a + t.size.astype(np.int64)[out]
        for o, n in log.tolist():
            hit = (a < o + n) & (e > o)
            bad += [f"{r.tar_path}@{x}" for x in a[hit].tolist()]
    return bad


def _logging(ss: tarindex.ShardSet) -> None:
    """Open every shard, then log the reads from now on (the open's own checks not counted)."""
    for s in range(ss.n_shards):
        src = cast(PreadSource, ss.reader(s).source)
        src.log, src.bytes_read = [], 0


@pytest.mark.parametrize("fields", [("cls",), ("bin", "txt"), ("txt",)])
def test_projection_reads_no_bytes_of_members_left_out(
    make_shards: MakeShards, fields: tuple[str, ...]
) -> None:
    paths = make_shards([300, 200])
    ref = _ref(paths)
    want = sum(len(v) for s in ref for k, v in s.items() if k in fields)

    def read_by(ss: tarindex.ShardSet) -> int:
        return sum(cast(PreadSource, r.source).bytes_read for r in ss._readers.values())

    # block reads, per shard
    ss = tarindex.ShardSet(paths, options=tarindex.OpenOptions(use_mmap=False))
    _logging(ss)
    for s in range(ss.n_shards):
        blk = ss.read_block(s, 0, int(ss.counts[s]), fields)
        assert int(blk.size.sum()) == sum(
            len(v)
            for x in ref[int(ss.starts[s]) : int(ss.starts[s + 1])]
            for k, v in x.items()
            if k in fields
        )
    assert _left_out_read(ss, fields) == []
    assert want <= read_by(ss)
    # gathers of random samples
    ss = tarindex.ShardSet(paths, options=tarindex.OpenOptions(use_mmap=False))
    _logging(ss)
    g = ss.gather(np.random.default_rng(0).permutation(len(ss)), fields)
    assert int(g.size.sum()) == want
    assert _left_out_read(ss, fields) == []
    # a single label member per sample: exactly its bytes are read, nothing else
    if fields == ("cls",):
        assert read_by(ss) == want
    # everything: one pread per block covers the headers in between too
    ss = tarindex.ShardSet(paths, options=tarindex.OpenOptions(use_mmap=False))
    _logging(ss)
    ss.read_block(0, 0, 300)
    assert len(cast(PreadSource, ss.reader(0).source).log or ()) == 1


def test_projection_through_both_datasets(make_shards: MakeShards) -> None:
    pytest.importorskip("torch")
    paths = make_shards([120, 80])
    ref = _ref(paths)
    cls_bytes = sum(len(s["cls"]) for s in ref)
    pread8 = tarindex.OpenOptions(use_mmap=False, max_open=8)
    ds = tarindex.TarDataset(paths, fields=("cls",), options=pread8)
    _logging(ds.shards)
    got = [ds[i] for i in range(len(ds))]
    assert got == [_project(s, ("cls",)) for s in ref]
    assert sum(r.source.bytes_read for r in ds.shards._readers.values()) == cls_bytes
    pread = tarindex.OpenOptions(use_mmap=False)
    batched = tarindex.TarDataset(paths, fields=("cls",), batched=True, options=pread)
    b = batched.__getitems__([5, 150, 3])
    assert b.fields == () and b.cls.tolist() == [5 % 10, 150 % 10, 3 % 10]
    stream = tarindex.TarIterableDataset(
        paths, fields=("cls",), shuffle=True, seed=1, options=pread, block_size=16
    )
    _logging(stream.shards)
    seen = list(stream)
    assert sorted(s["__index__"] for s in seen) == list(range(len(ref)))
    assert all(set(s) == {"__key__", "__shard__", "__index__", "cls"} for s in seen)
    assert sum(r.source.bytes_read for r in stream.shards._readers.values()) == cls_bytes
    bs = tarindex.TarIterableDataset(
        paths, fields=("cls", "txt"), batched=True, batch_size=32, shuffle=False
    )
    for batch in bs:
        assert batch.fields == ("txt",)
        for k, i in enumerate(batch.index.tolist()):
            assert batch.bytes("txt", k) == ref[i]["txt"]
            assert int(batch.cls[k]) == i % 10


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="needs /proc/self/fd")
def test_open_shard_costs_at_most_two_descriptors(make_shards: MakeShards) -> None:
    paths = make_shards([3] * 4)
    for use_mmap in (True, False):
        before = _open_fds()
        readers = [tarindex.ShardReader(p, use_mmap=use_mmap) for p in paths]
        assert _open_fds() - before <= 2 * len(paths)
        for r in readers:
            r.close()
        assert _open_fds() == before


_COUNT_FDS = textwrap.dedent(
    """
    import os, sys
    import numpy as np
    import tarindex

    ds = tarindex.ShardSet(sys.argv[1])
    assert ds.n_shards == 200
    peak = 0
    for n, i in enumerate(np.random.default_rng(0).permutation(len(ds)).tolist()):
        assert ds.sample(i)["cls"] == str(i).encode()
        if n % 10 == 0:
            peak = max(peak, len(os.listdir("/proc/self/fd")))
    print(peak)
    """
)


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="needs /proc/self/fd")
def test_200_shards_at_random_stay_under_150_descriptors(tmp_path: Path) -> None:
    with tarindex.ShardWriter(str(tmp_path / "s-%06d.tar"), maxcount=2) as w:
        for i in range(400):
            w.write({"__key__": f"k{i:05d}", "bin": b"x" * (i % 50), "cls": i})
    script = tmp_path / "fds.py"
    script.write_text(_COUNT_FDS)
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[2])}
    out = subprocess.run(
        [sys.executable, str(script), str(tmp_path)],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )  # a fresh process: the count is tarindex's, not what earlier tests left open
    assert out.returncode == 0, out.stderr[-2000:]
    assert int(out.stdout) < 150


_LOW_LIMIT = textwrap.dedent(
    """
    import os, resource, sys
    import numpy as np
    import tarindex
    from torch.utils.data import DataLoader


    def labels(batch):
        return [int(s["cls"]) for s in batch]


    def main(src):
        resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64))
        ds = tarindex.TarDataset(src)
        n = len(ds)
        for i in np.random.default_rng(0).permutation(n).tolist():
            assert ds[i]["cls"] == str(i).encode(), i
        print("bound", ds.shards.takes().open_bound, "fds", len(os.listdir("/proc/self/fd")))
        loader = DataLoader(ds, batch_size=16, shuffle=True, num_workers=2, collate_fn=labels)
        assert sorted(c for batch in loader for c in batch) == list(range(n)), "loader"
        it = tarindex.TarIterableDataset(src, shuffle=True, seed=0, block_size=3)
        loader = DataLoader(it, batch_size=16, num_workers=2, collate_fn=labels)
        assert sorted(c for batch in loader for c in batch) == list(range(n)), "stream"
        print("ok")


    if __name__ == "__main__":
        main(sys.argv[1])
    """
)


@pytest.mark.skipif(sys.platform != "linux", reason="RLIMIT_NOFILE and /proc on Linux")
def test_500_shards_under_ulimit_64(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    with tarindex.ShardWriter(str(tmp_path / "s-%06d.tar"), maxcount=2) as w:
        for i in range(1000):
            w.write({"__key__": f"k{i:05d}", "cls": i})
    script = tmp_path / "low.py"
    script.write_text(_LOW_LIMIT)
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[2])}
    out = subprocess.run(
        [sys.executable, str(script), str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=200,
        env=env,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert "ok" in out.stdout
    assert "Too many open files" not in out.stderr


def test_emfile_closes_readers_and_warns(make_shards: MakeShards) -> None:
    resource = pytest.importorskip("resource")
    paths = make_shards([2] * 40)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    ss = tarindex.ShardSet(paths, options=tarindex.OpenOptions(max_open=1000))
    ss.pool.set_bound(1000)  # as if the limit had been raised meanwhile
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (_open_fds() + 20, hard))
        with pytest.warns(ResourceWarning, match="too many open files"):
            for i in range(len(ss)):
                assert ss.sample(i)["cls"] == str(i % 10).encode()
    finally:
        ss.close()
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


_PUBLIC = textwrap.dedent(
    """
    import sys
    import tarindex
    from torch.utils.data import DataLoader
    from tarindex.torch import transport


    def main(src):
        assert not transport.by_name_available()
        ds = tarindex.TarDataset(src, batched=True)
        ref = tarindex.TarDataset(src)
        loader = DataLoader(ds, batch_size=8, shuffle=True, num_workers=2,
                            collate_fn=tarindex.collate_batched)
        n = 0
        for batch in loader:
            for b, i in enumerate(batch.index.tolist()):
                assert batch.sample(b) == ref[i]
                n += 1
        assert n == len(ref)
        it = tarindex.TarIterableDataset(src, batched=True, batch_size=8, seed=3)
        assert sum(len(b) for b in DataLoader(it, batch_size=None, num_workers=2)) == len(ref)
        print("ok")


    if __name__ == "__main__":
        main(sys.argv[1])
    """
)


def test_shared_memory_public_fallback(make_shards: MakeShards, tmp_path: Path) -> None:
    pytest.importorskip("torch")
    paths = make_shards([30, 20])
    script = tmp_path / "public.py"
    script.write_text(_PUBLIC)
    env = {
        **os.environ,
        "TARINDEX_PUBLIC_SHM": "1",
        "PYTHONPATH": str(Path(__file__).parents[2]),
    }
    out = subprocess.run(
        [sys.executable, str(script), os.path.dirname(paths[0])],
        capture_output=True,
        text=True,
        timeout=200,
        env=env,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip().endswith("ok")


@pytest.mark.parametrize("use_mmap", [True, False])
def test_gather_over_more_shards_than_may_stay_open(
    make_shards: MakeShards, use_mmap: bool
) -> None:
    paths = make_shards([3] * 12)
    ref = _ref(paths)
    ss = tarindex.ShardSet(paths, options=tarindex.OpenOptions(max_open=2, use_mmap=use_mmap))
    order = np.random.default_rng(2).integers(0, len(ss), 80)
    for fields in (None, ("txt", "cls")):
        g = ss.gather(order, fields)
        assert len(ss._readers) <= 2
        assert not any(isinstance(d, mmap.mmap) for d in g.data)  # copied out, not held
        assert g.to_samples() == [_project(ref[int(i)], fields) for i in order]


def _evict(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


@pytest.mark.skipif(not hasattr(os, "posix_fadvise"), reason="no posix_fadvise to drop pages")
def test_willneed_hint_only_while_reads_fault(tmp_path: Path) -> None:
    """The block hint (MADV_WILLNEED) follows the page cache: given after an unhinted block took
    a major fault (cold), for the next run of blocks; not given while blocks read warm."""
    from tarindex.storage import bytesource

    if bytesource._RUSAGE_THREAD is None:
        pytest.skip("no per-thread fault counts (RUSAGE_THREAD): every block is hinted")
    p = tmp_path / "cold.bin"
    p.write_bytes(os.urandom(8 << 20))
    _evict(str(p))  # before it is mapped: mapped pages stay
    cold = bytesource._ColdCache()
    with open(p, "rb") as f, mm_of(f) as mm:
        assert cold.hint() is False  # this block goes unhinted ...
        mm[:]  # ... and faults its pages in from disk
        got = [cold.hint() for _ in range(bytesource._HINTED_RUN + 1)]
        if not any(got):
            pytest.skip("the page cache kept the file (no major fault after POSIX_FADV_DONTNEED)")
        assert got == [True] * bytesource._HINTED_RUN + [False]  # a run hinted, then a look
        warm = [cold.hint() for _ in range(3) if mm[:] is not None]
        assert warm == [False, False, False]  # resident pages: no fault, no hint


def mm_of(f: Any) -> mmap.mmap:
    return mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)


@pytest.mark.skipif(
    tarindex.read.kernel.compiled is None,
    reason=f"needs the compiled loops: {tarindex.read.kernel.read_kernel()}",
)
def test_a_shuffle_window_holds_where_its_samples_are_not_their_bytes(tmp_path: Path) -> None:
    """A window of 1024 samples of 20 KB would hold 20 MB of sample bytes; taken out as they
    are yielded (``Takes.take``), about 256 KB of them exist at a time."""
    import tracemalloc

    with tarindex.ShardWriter(str(tmp_path / "w-%06d.tar"), maxcount=1024, mtime=0) as w:
        for i in range(2048):
            w.write({"__key__": f"k{i:05d}", "bin": bytes([i % 251]) * 20_000, "cls": i})
    paths = sorted(str(p) for p in tmp_path.glob("w-*.tar"))
    ds = tarindex.TarIterableDataset(paths, buffer_size=1024, block_size=64, seed=0)
    seen = []
    tracemalloc.start()
    try:
        for s in ds:
            seen.append(s["__index__"])
            assert s["bin"] == bytes([s["__index__"] % 251]) * 20_000
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert sorted(seen) == list(range(2048)) and seen != sorted(seen)
    assert peak < 2 << 20, f"peak {peak / 2**20:.1f} MiB: the window holds its samples' bytes"


@pytest.mark.parametrize("twin", [False, True])
def test_a_kernel_read_keeps_the_pools_lru_order(
    make_shards: MakeShards, monkeypatch: pytest.MonkeyPatch, twin: bool
) -> None:
    """The kernel only looks readers up; the pool keeps the LRU order (``ReaderPool.touch``).

    Three shards, two may stay open: shard 0 read again through the kernel (``get``, then
    ``take``) is the most recently used, so opening shard 2 lets go of shard 1, not shard 0.
    """
    if twin:
        monkeypatch.setattr(tarindex.read.kernel, "kernel", tarindex.read._kernel_py)
    paths = make_shards([4, 4, 4])
    for read in ("get", "take"):
        ds = tarindex.ShardSet(paths, options=tarindex.OpenOptions(max_open=2))
        r0, r1 = ds.reader(0), ds.reader(1)  # opens shards 0, 1
        ds.sample(0), ds.sample(4)  # checks their chunks; shard 0 the least recently used
        assert r0.hot.tables is not None  # mapped: the kernel reads it
        again = ds.sample(1) if read == "get" else ds.takes().take([1, 2])[0]  # a kernel hit on shard 0
        assert again["__shard__"] == paths[0]
        ds.sample(8)  # opens shard 2: the least recently used (shard 1) is let go of
        assert sorted(ds.pool.readers) == [0, 2], read
        assert ds.pool.readers[0] is r0 and r1 not in ds.pool.open_readers(), read
        ds.close()
