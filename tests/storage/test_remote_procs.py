"""Remote shards across processes: DataLoader workers (fork, spawn), a cache shared by several
training processes, a reader killed with SIGKILL. Real HTTP server on 127.0.0.1."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import tarindex
from tarindex.storage import remote
from tarindex.storage.cache import DirCache
from tarindex.storage.remote import RemoteOptions
from tarindex.storage.remote.fetch import stat
from tarindex.storage.sums import ENTRY_HEAD

from ..conftest import ServeShards
from ..remote_server import RangeServer

pytest.importorskip("fsspec")
pytest.importorskip("aiohttp")

SIZES = [30, 30, 30, 30]
PAT = "train-{000000..000003}.tar"
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def served(serve_shards: ServeShards) -> tuple[RangeServer, list[str]]:
    return serve_shards(SIZES)


def who(sample: dict[str, Any]) -> tuple[str, bytes, int, list[int]]:
    """Transform run in the workers: the key, the bytes, the worker's pid, whose fs exist."""
    return (
        sample["__key__"],
        sample["bin"],
        os.getpid(),
        remote.filesystem_pids(),
    )


def _collate(batch: list[Any]) -> list[Any]:
    return batch


@pytest.mark.timeout(120)
@pytest.mark.parametrize("ctx", ["fork", pytest.param("spawn", marks=pytest.mark.slow)])
def test_dataloader_workers_build_their_own_filesystem(
    served: tuple[RangeServer, list[str]], ctx: str
) -> None:
    torch = pytest.importorskip("torch")
    srv, paths = served
    ds = tarindex.TarDataset(f"{srv.url}/{PAT}", transform=who)
    ds[0]  # the parent made a filesystem (and fsspec's loop thread) before the workers start
    assert os.getpid() in remote.filesystem_pids()
    loader = torch.utils.data.DataLoader(
        ds,
        batch_size=8,
        shuffle=True,
        num_workers=2,
        multiprocessing_context=ctx,
        collate_fn=_collate,
        generator=torch.Generator().manual_seed(0),
    )
    local = tarindex.ShardSet(paths)
    ref = {local.sample(i)["__key__"]: local.sample(i)["bin"] for i in range(len(local))}
    got: dict[str, bytes] = {}
    pids = set()
    for batch in loader:
        for key, data, pid, owners in batch:
            got[key] = data
            pids.add(pid)
            assert pid in owners  # this worker's own filesystem served the read
    assert got == ref
    assert len(pids) == 2 and os.getpid() not in pids


@pytest.mark.timeout(120)
def test_streaming_through_two_workers_reads_each_sample_once(
    served: tuple[RangeServer, list[str]],
) -> None:
    torch = pytest.importorskip("torch")
    srv, paths = served
    it = tarindex.TarIterableDataset(f"{srv.url}/{PAT}", shuffle=True, seed=1, block_size=8)
    loader = torch.utils.data.DataLoader(
        it, batch_size=None, num_workers=2, multiprocessing_context="fork"
    )
    keys = [s["__key__"] for s in loader]
    assert sorted(keys) == [f"{i:08d}" for i in range(sum(SIZES))]
    tar_bytes = sum(os.path.getsize(p) for p in paths)
    # every byte once per worker that opens the shard's checks, data bytes once overall
    assert srv.bytes_for(".tar") <= tar_bytes + 2 * len(paths) * 32 * 1024


_CHILD = r"""
import sys, numpy as np, torch, tarindex
url, cache, limit, seed = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
opts = tarindex.RemoteOptions(cache_dir=cache, cache_bytes=limit, chunk_bytes=16384)
ds = tarindex.TarDataset(url, remote=opts)
loader = torch.utils.data.DataLoader(ds, batch_size=4, shuffle=True, num_workers=2,
    multiprocessing_context="fork", collate_fn=lambda b: b,
    generator=torch.Generator().manual_seed(seed))
rounds = int(sys.argv[5]) if len(sys.argv) > 5 else 1
n = 0
for _ in range(rounds):
    for batch in loader:
        for s in batch:
            n += 1
            print(s["__key__"], s["bin"].hex(), flush=True)
"""


def _expected(paths: list[str]) -> dict[str, str]:
    local = tarindex.ShardSet(paths)
    return {s["__key__"]: s["bin"].hex() for s in (local.sample(i) for i in range(len(local)))}


def _entries_are_exact(cache: str, paths: list[str], url: str) -> int:
    """Every chunk file in the cache holds the tar's bytes at its offset; return their count."""
    keys = {}
    for p in paths:
        t = tarindex.ShardReader(p).index
        ident = f"{t.tar_size}:{t.head_crc}:{t.tail_crc}"
        u = f"{url}/{os.path.basename(p)}"
        pin = stat(u)  # the cache keys hold the version the server reports (ETag)
        keys[remote.RemoteSource(u, pin.size, RemoteOptions(), ident, pin).key] = Path(p).read_bytes()
    n = 0
    for d2 in Path(cache).glob("??/*"):
        if d2.name not in keys:
            continue
        data = keys[d2.name]
        for f in d2.iterdir():
            i = int(f.name)
            # after the entry's checksum record (tarindex.storage.sums.ENTRY_HEAD)
            assert f.read_bytes()[ENTRY_HEAD.size :] == data[i * 16384 : (i + 1) * 16384], f
            n += 1
    return n


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_cache_shared_by_two_processes_with_two_workers_stays_within_its_limit(
    served: tuple[RangeServer, list[str]], tmp_path: Path
) -> None:
    pytest.importorskip("torch")
    srv, paths = served
    cache = str(tmp_path / "cache")
    tar_bytes = sum(os.path.getsize(p) for p in paths)
    limit = tar_bytes // 2  # the data do not fit: eviction runs all the time
    script = tmp_path / "child.py"
    script.write_text(_CHILD)
    url = f"{srv.url}/{PAT}"
    procs = [
        subprocess.Popen(
            [sys.executable, str(script), url, cache, str(limit), str(seed)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=ROOT,
        )
        for seed in (1, 2)
    ]
    want = _expected(paths)
    for p in procs:
        out, err = p.communicate(timeout=150)
        assert p.returncode == 0, err[-3000:]
        got = dict(line.split(" ", 1) for line in out.splitlines())
        assert got == want
    c = DirCache(cache, limit)
    assert 0 < c.usage() <= limit
    assert _entries_are_exact(cache, paths, srv.url) > 0
    assert not list((Path(cache) / "tmp").iterdir())
    # a later run with room for everything: the second pass is served from the cache
    big = str(tmp_path / "cache2")
    script_args = [sys.executable, str(script), url, big, str(4 * tar_bytes), "3", "2"]
    srv.reset()
    done = subprocess.run(script_args, capture_output=True, text=True, cwd=ROOT, timeout=150)
    assert done.returncode == 0, done.stderr[-3000:]
    assert srv.bytes_for(".tar") <= tar_bytes + 2 * len(paths) * 32 * 1024 * 2


_KILLED = r"""
import sys, tarindex
url, cache = sys.argv[1], sys.argv[2]
opts = tarindex.RemoteOptions(cache_dir=cache, cache_bytes=60000, chunk_bytes=16384)
ds = tarindex.TarDataset(url, remote=opts)
print("ready", flush=True)
while True:
    for i in range(len(ds)):
        ds[i]
"""


@pytest.mark.timeout(120)
def test_a_reader_killed_mid_write_leaves_nothing_a_later_run_trusts(
    served: tuple[RangeServer, list[str]], tmp_path: Path
) -> None:
    pytest.importorskip("torch")
    srv, paths = served
    cache = str(tmp_path / "cache")
    script = tmp_path / "killed.py"
    script.write_text(_KILLED)
    url = f"{srv.url}/{PAT}"
    for delay in (0.3, 0.7):
        p = subprocess.Popen(
            [sys.executable, str(script), url, cache],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=ROOT,
        )
        assert p.stdout is not None
        assert p.stdout.readline().strip() == "ready"
        time.sleep(delay)
        os.kill(p.pid, signal.SIGKILL)
        p.wait(10)
        p.stdout.close()
        p.stderr.close()  # type: ignore[union-attr]
        _entries_are_exact(cache, paths, srv.url)  # every entry complete and exact
        assert DirCache(cache, 60000).usage() <= 60000
    # a later run: byte-exact, and the dead writer's temp files are gone
    remote.forget_process_state()
    opts = RemoteOptions(cache_dir=cache, cache_bytes=60000, chunk_bytes=16384)
    ds = tarindex.TarDataset(url, remote=opts)
    local = tarindex.ShardSet(paths)
    for i in np.random.default_rng(0).choice(len(ds), 20).tolist():
        assert ds[i]["bin"] == local.sample(i)["bin"]
    assert not [f for f in (Path(cache) / "tmp").iterdir()]
