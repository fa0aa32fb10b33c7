"""Threads sharing one dataset (issue 19 item 16): right bytes or a clear error, never another.

Four threads read one dataset at random (``ds[i]``, ``__getitems__``, ``fields=``, batched,
``gather``) while one of them closes it now and then, over mapped and ``pread`` shards,
evicting (``max_open=2``) or not, local and over HTTP; four threads read one bare
``ShardReader`` while another closes it; four threads each iterate one streaming dataset.
The thread switch interval is cut to 1 us so the interleavings a real thread pool meets in
hours happen in a second. Before the fix these gave ``KeyError``, ``AttributeError``,
``IndexError``, ``EBADF``, "the tar was cut" on untouched tars and, with ``pread``, another
sample's bytes.
"""

from __future__ import annotations

import functools
import gzip
import os
import random
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import tarindex
from tarindex.errors import ClosedError
from tarindex.read import OpenOptions, ShardReader, ShardSet

from ..conftest import MakeShards
from ..remote_server import serve

torch = pytest.importorskip("torch")

SIZES = [40, 35, 45, 30, 50, 38]
N = sum(SIZES)


@pytest.fixture
def fast_switch() -> Iterator[None]:
    """Switch threads every 1 us (default 5 ms): races show up in a short run."""
    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        yield
    finally:
        sys.setswitchinterval(old)


def _expected(paths: list[str]) -> list[dict[str, bytes]]:
    """Every sample's members, read alone in this thread before any thread starts."""
    ss = ShardSet(paths, options=OpenOptions(use_mmap=False))
    try:
        out = []
        for i in range(len(ss)):
            s = ss.sample(i)
            out.append({k: bytes(v) for k, v in s.items() if not k.startswith("__")})
        return out
    finally:
        ss.close()


def _run(workers: list[Callable[[], None]]) -> list[str]:
    """Run each worker in its own thread; return every exception they raised, as text."""
    errors: list[str] = []

    def guard(fn: Callable[[], None]) -> None:
        try:
            fn()
        except BaseException as e:  # noqa: BLE001 (reported, the test fails on any)
            errors.append(f"{type(e).__name__}: {e}")

    ts = [threading.Thread(target=guard, args=(fn,)) for fn in workers]
    for t in ts:
        t.start()
    for t in ts:
        t.join(120)
    assert not any(t.is_alive() for t in ts), "a reader thread hangs"
    return errors


def _hammer(ss: ShardSet, want: list[dict[str, bytes]], rounds: int, close_every: int) -> None:
    """4 threads of random reads through every dataset path over ``ss``; one also closes it."""
    ds = tarindex.TarDataset(ss)
    dsf = tarindex.TarDataset(ss, fields="bin")
    dsb = tarindex.TarDataset(ss, batched=True)

    def check(i: int, got: dict[str, Any], fields: tuple[str, ...] | None = None) -> None:
        i %= N
        assert got["__index__"] == i, (got["__index__"], i)
        exp = want[i]
        names = tuple(exp) if fields is None else fields
        assert {k for k in got if not k.startswith("__")} == set(names), (i, sorted(got))
        for k in names:
            assert bytes(got[k]) == exp[k], f"sample {i} .{k}: wrong bytes"

    def worker(seed: int) -> Callable[[], None]:
        def go() -> None:
            r = random.Random(seed)
            for step in range(rounds):
                op = r.randrange(6)
                if op == 0:
                    i = r.randrange(-N, N)
                    check(i, ds[i])
                elif op == 1:
                    js = [r.randrange(N) for _ in range(r.randrange(1, 9))]
                    for i, got in zip(js, ds.__getitems__(js), strict=True):
                        check(i, got)
                elif op == 2:
                    i = r.randrange(N)
                    check(i, dsf[i], ("bin",))
                elif op == 3:
                    js = [r.randrange(N) for _ in range(r.randrange(1, 9))]
                    for i, got in zip(js, dsf.__getitems__(js), strict=True):
                        check(i, got, ("bin",))
                elif op == 4:
                    js = [r.randrange(N) for _ in range(r.randrange(1, 9))]
                    bs: Any = dsb.__getitems__(js)
                    assert bs.index.tolist() == js
                    for k, i in enumerate(js):
                        assert bs.bytes("bin", k) == want[i]["bin"], f"batched {i}: wrong bytes"
                else:
                    js = [r.randrange(N) for _ in range(r.randrange(1, 9))]
                    blk = ss.gather(js, fields=("bin", "cls"))
                    for i, got in zip(js, blk.to_samples(), strict=True):
                        check(i, got, ("bin", "cls"))
                if close_every and seed == 0 and step % close_every == 0:
                    ss.close()  # while the others read: theirs finish, later reads reopen

        return go

    errors = _run([worker(k) for k in range(4)])
    assert not errors, f"{len(errors)} errors, e.g. {sorted(set(errors))[:5]}"


@pytest.mark.parametrize("use_mmap", [True, False], ids=["mmap", "pread"])
@pytest.mark.parametrize("max_open", [2, 48], ids=["evicting", "all-open"])
def test_threads_share_a_dataset_local(
    make_shards: MakeShards, fast_switch: None, use_mmap: bool, max_open: int
) -> None:
    paths = make_shards(SIZES)
    want = _expected(paths)
    ss = ShardSet(paths, options=OpenOptions(use_mmap=use_mmap, max_open=max_open))
    _hammer(ss, want, rounds=250, close_every=25)
    # afterwards the set still reads, and holds no more readers than its bound
    assert bytes(ss.sample(7)["bin"]) == want[7]["bin"]
    assert len(ss.pool.open_readers()) <= max_open
    ss.close()
    assert ss.pool.open_readers() == []


def test_threads_share_a_dataset_remote(
    make_shards: MakeShards, tmp_path: Path, fast_switch: None
) -> None:
    pytest.importorskip("fsspec")
    pytest.importorskip("aiohttp")
    from tarindex.storage import remote

    paths = make_shards(SIZES)
    want = _expected(paths)
    with serve(str(tmp_path / "train")) as srv:
        remote.forget_process_state()
        urls = [f"{srv.url}/{os.path.basename(p)}" for p in paths]
        ss = ShardSet(urls, options=OpenOptions(max_open=3))
        sys.setswitchinterval(1e-4)  # the event loop thread of fsspec must keep up
        _hammer(ss, want, rounds=30, close_every=8)
        ss.close()


def test_close_while_a_remote_read_waits(make_shards: MakeShards, tmp_path: Path) -> None:
    """close() during a read: the read in flight finishes (right bytes), later reads reopen."""
    pytest.importorskip("fsspec")
    pytest.importorskip("aiohttp")
    from tarindex.storage import remote

    paths = make_shards(SIZES)
    want = _expected(paths)
    with serve(str(tmp_path / "train")) as srv:
        remote.forget_process_state()
        ss = ShardSet([f"{srv.url}/{os.path.basename(p)}" for p in paths])
        assert bytes(ss.sample(3)["bin"]) == want[3]["bin"]  # shard 0 open
        srv.latency = 0.4
        got: list[Any] = []
        t = threading.Thread(target=lambda: got.append(ss.sample(5)))
        t.start()
        time.sleep(0.15)  # the read waits on the server
        ss.close()
        assert ss.pool.open_readers() == []
        t.join(30)
        srv.latency = 0.0
        assert got and bytes(got[0]["bin"]) == want[5]["bin"]
        assert bytes(ss.sample(6)["bin"]) == want[6]["bin"]  # reopened
        ss.close()


def _close_under_readers(
    path: str, want: list[dict[str, bytes]], use_mmap: bool, delay: float
) -> list[str]:
    """4 threads read one ShardReader at random; a fifth closes it after ``delay`` seconds."""
    r = ShardReader(path, use_mmap=use_mmap)
    n = r.n_samples
    stop = threading.Event()

    def reader(seed: int) -> None:
        rng = random.Random(seed)
        while not stop.is_set():
            j = rng.randrange(n)
            try:
                op = rng.randrange(4)
                if op == 0:
                    got = r.sample(j)
                    assert bytes(got["bin"]) == want[j]["bin"], f"sample {j}: wrong bytes"
                elif op == 1:
                    blk = r.gather([j, (j + 7) % n], ("bin",))
                    assert bytes(blk.to_samples()[0]["bin"]) == want[j]["bin"], j
                elif op == 2:
                    blk = r.read_block(j, min(j + 3, n))
                    assert bytes(blk.to_samples()[0]["bin"]) == want[j]["bin"], j
                else:
                    assert r.key(j) == f"{j:08d}"
            except ClosedError as e:
                assert path in str(e)
                return

    def closer() -> None:
        time.sleep(delay)
        r.close()
        # descriptors opened now take the numbers close() frees: a read still using an old
        # number would read this file instead
        fds = [os.open(path + ".tidx", os.O_RDONLY) for _ in range(4)]
        time.sleep(0.01)
        stop.set()
        for fd in fds:
            os.close(fd)

    workers: list[Callable[[], None]] = [functools.partial(reader, k) for k in range(4)]
    errors = _run([*workers, closer])
    with pytest.raises(ClosedError, match="read after close"):
        r.sample(0)
    with pytest.raises(ClosedError, match="read after close"):
        r.read_block(0, 1)
    return errors


@pytest.mark.parametrize("kind", ["mmap", "pread", "gzip"])
def test_a_reader_closed_while_threads_read_it(
    make_shards: MakeShards, fast_switch: None, kind: str
) -> None:
    """A bare ShardReader closed under readers: right bytes or ClosedError, nothing else."""
    paths = make_shards([200])
    want = _expected(paths)
    path = paths[0]
    if kind == "gzip":  # GzipSource: one inflate position under a lock
        pytest.importorskip("indexed_gzip")
        path += ".gz"
        Path(path).write_bytes(gzip.compress(Path(paths[0]).read_bytes(), mtime=0))
        tarindex.build_index(path)
    for trial in range(20):
        errors = _close_under_readers(path, want, kind == "mmap", 0.002 * (trial % 5))
        assert not errors, f"trial {trial}: {sorted(set(errors))[:5]}"


def test_an_evicted_reader_is_released_at_once(make_shards: MakeShards) -> None:
    """Eviction lets go of a reader: unused, its descriptors close now (the bound holds)."""
    paths = make_shards([5] * 6)
    ss = ShardSet(paths, options=OpenOptions(max_open=2, use_mmap=False))

    def fds() -> int:
        return len(os.listdir("/proc/self/fd"))

    ss.sample(0)
    ss.sample(5)
    base = fds()
    for i in range(10, 30):  # shards 2..5, each evicting the LRU one
        ss.sample(i)
        assert fds() == base
    ss.close()
    assert fds() == base - 2 * 2  # 2 readers, 2 descriptors each


def test_threads_each_iterate_a_streaming_dataset(
    make_shards: MakeShards, fast_switch: None
) -> None:
    """Four threads, each with its own iterator of one TarIterableDataset: a whole epoch each."""
    paths = make_shards(SIZES)
    want = _expected(paths)
    ss = ShardSet(paths, options=OpenOptions(max_open=2))
    ds = tarindex.TarIterableDataset(ss, shuffle=True, seed=3, block_size=8, buffer_size=16)
    seen: list[list[int]] = [[] for _ in range(4)]

    def go(k: int) -> None:
        for smp in ds:
            i = smp["__index__"]
            assert bytes(smp["bin"]) == want[i]["bin"], f"sample {i}: wrong bytes"
            seen[k].append(i)

    errors = _run([functools.partial(go, k) for k in range(4)])
    assert not errors, sorted(set(errors))[:5]
    for got in seen:
        assert sorted(got) == list(range(N))


@pytest.mark.parametrize("use_mmap", [True, False], ids=["mmap", "pread"])
def test_fork_while_threads_read(make_shards: MakeShards, use_mmap: bool) -> None:
    """A fork (a DataLoader worker) while other threads read: the child reads, never hangs.

    A lock another thread holds at the fork (the pool's, a ``pread`` source's) would stay
    held forever in the child, whose only thread then waits on it.
    """
    paths = make_shards(SIZES)
    want = _expected(paths)
    ss = ShardSet(paths, options=OpenOptions(use_mmap=use_mmap, max_open=2))
    stop = threading.Event()

    def reader(seed: int) -> None:
        rng = random.Random(seed)
        while not stop.is_set():
            ss.sample(rng.randrange(N))

    ts = [threading.Thread(target=reader, args=(k,)) for k in range(3)]
    for t in ts:
        t.start()
    try:
        for k in range(15):
            pid = os.fork()
            if pid == 0:  # the child: read, then leave at once (no atexit, no pytest)
                ok = bytes(ss.sample(k)["bin"]) == want[k]["bin"]
                os._exit(0 if ok else 3)
            deadline = time.monotonic() + 20
            while True:
                done, status = os.waitpid(pid, os.WNOHANG)
                if done:
                    break
                if time.monotonic() > deadline:
                    os.kill(pid, 9)
                    os.waitpid(pid, 0)
                    pytest.fail(f"fork {k}: the child hangs (a lock held at the fork)")
                time.sleep(0.005)
            assert os.waitstatus_to_exitcode(status) == 0, f"fork {k}: wrong bytes in the child"
    finally:
        stop.set()
        for t in ts:
            t.join(30)
    ss.close()
