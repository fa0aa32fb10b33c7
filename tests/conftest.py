"""Shared fixtures: shards written by tarindex with seeded, varied samples."""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest

import tarindex
from tarindex.storage import remote
from tarindex.write.tar import TarShardWriter

from .remote_server import RangeServer, serve

os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
# processes the tests start (Ray and Spark workers, spawned DataLoader workers) unpickle the
# tests' functions by reference (cloudpickle): the repository root must be importable there
# too, whatever their working directory (seen: "No module named 'tests'" in a Ray worker)
_ROOT = str(Path(__file__).resolve().parents[1])
os.environ["PYTHONPATH"] = os.pathsep.join(
    p for p in (_ROOT, os.environ.get("PYTHONPATH", "")) if p
)


@pytest.fixture(autouse=True)
def _whole_shard_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Whole remote shards (the fetch policy) and decompressed copies of zstd/xz/bzip2 shards
    (the tar cache) go under the test's tmp_path, not ``/tmp`` or ``~/.cache``."""
    monkeypatch.setenv("TARINDEX_CACHE_DIR", str(tmp_path / "tarindex-cache"))
    monkeypatch.setenv("TARINDEX_TAR_CACHE", str(tmp_path / "tarindex-tar-cache"))


def sample_payload(i: int, rng: np.random.Generator) -> dict[str, object]:
    """A sample of varied shape: raw bytes of random size (0..3000), a label, text."""
    n = int(rng.integers(0, 3000))
    return {
        "__key__": f"{i:08d}",
        "bin": rng.integers(0, 256, n, dtype=np.uint8).tobytes(),
        "cls": i % 10,
        "txt": f"sample {i}",
    }


MakeShards = Callable[..., list[str]]


@pytest.fixture
def make_shards(tmp_path: Path) -> MakeShards:
    """Factory: ``make_shards(sizes=[5, 7, 3], seed=0, name="train")`` -> shard paths.

    Sample ``i`` (global) has key ``f"{i:08d}"``, ``cls = i % 10``, ``txt = f"sample {i}"``
    and ``bin`` of seeded random bytes; ``sizes`` gives the samples per shard.
    """

    def make(sizes: list[int], seed: int = 0, name: str = "train") -> list[str]:
        rng = np.random.default_rng(seed)
        out: list[str] = []
        i = 0
        d = tmp_path / name
        d.mkdir(exist_ok=True)
        for s, n in enumerate(sizes):
            if n == 0:  # an empty shard: valid tar, valid index, zero samples
                TarShardWriter(str(d / f"{name}-{s:06d}.tar"), mtime=0).close()
                out.append(str(d / f"{name}-{s:06d}.tar"))
                continue
            with tarindex.ShardWriter(
                str(d / f"{name}-{s:06d}.tar"), maxcount=max(n, 1), mtime=0
            ) as w:
                for _ in range(n):
                    w.write(sample_payload(i, rng))
                    i += 1
            out.append(str(d / f"{name}-{s:06d}.tar"))
        return out

    return make


ServeShards = Callable[[list[int]], tuple[RangeServer, list[str]]]


@pytest.fixture
def serve_shards(make_shards: MakeShards, tmp_path: Path) -> Iterator[ServeShards]:
    """Factory: ``serve_shards(sizes)`` -> ``(server, shard paths)``.

    :func:`make_shards`'s ``train`` shards (``sizes`` samples each) served over HTTP on
    127.0.0.1 (tests/remote_server.py) until the test ends; what the process learnt of remote
    shards (indexes, pins, Range checks) is forgotten before and after.
    """
    remote.forget_process_state()
    with contextlib.ExitStack() as servers:

        def start(sizes: list[int]) -> tuple[RangeServer, list[str]]:
            paths = make_shards(sizes)
            return servers.enter_context(serve(str(tmp_path / "train"))), paths

        yield start
    remote.forget_process_state()


def sent_ranges(srv: RangeServer) -> dict[str, list[tuple[int, int]]]:
    """The byte ranges of ``.tar`` bodies ``srv`` sent (GETs), per file name, in order."""
    out: dict[str, list[tuple[int, int]]] = {}
    with srv.lock:
        for m, p, a, b in srv.log:
            if m == "GET" and p.endswith(".tar"):
                out.setdefault(os.path.basename(p), []).append((a, b))
    return out


def check_bytes(paths: list[str]) -> int:
    """Bytes of the open-time checks (FORMAT.md §3) of the tars ``paths``."""
    from tarindex.read.checks import open_ranges

    n = 0
    for p in paths:
        r = tarindex.ShardReader(p)
        a, b = open_ranges(r.index, r.tar_size)
        n += int((b - a).sum())
        r.close()
    return n


def have(tool: str) -> bool:
    return shutil.which(tool) is not None


@pytest.fixture
def big(tmp_path: Path) -> Iterator[tuple[RangeServer, str]]:
    """One shard of 64 samples x 64 KiB (~4 MiB: 5 grains) served over HTTP."""
    remote.forget_process_state()
    d = tmp_path / "srv"
    d.mkdir()
    rng = np.random.default_rng(0)
    with tarindex.ShardWriter(str(d / "big-%06d.tar"), maxcount=64, mtime=0) as w:
        for i in range(64):
            w.write({"__key__": f"{i:04d}", "bin": rng.bytes(65536)})
    with serve(str(d)) as srv:
        yield srv, str(d / "big-000000.tar")
    remote.forget_process_state()
