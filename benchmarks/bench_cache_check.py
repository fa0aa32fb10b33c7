"""The cost of checking cache entries before they are served (tarindex.storage.sums), paired.

Two source trees (``--trees NEW OLD``: this tree and one before the checks), each with its
own cache directory filled by its own code, measured in alternating fresh processes
(which tree goes first alternates from round to round), ``--rounds`` times. Data:
``--samples`` seeded samples of ``--size`` random bytes in ``--shards`` shards, served by
tests/remote_server.py (a thread of the measuring process, no added latency). Rows:

* ``ds[i] first pass``: every sample once in a shuffled order, through a ``cache_dir`` whose
  chunks (1 MiB, the default) were all cached by an earlier process: each chunk read is
  checked (its crc32c, or zlib crc32 without google-crc32c) on every get;
* ``ds[i] second pass``: the same again in the same process;
* ``whole-copy reopen``: a fresh process (torch and fsspec imported, a connection made) opens a shard
  whose whole copy (``fetch="shard"``, 32 MiB) is cached and reads one sample: the first
  open checks the copy's per-MiB crc32s (its open-time checks and ``HEAD`` go to the server
  either way).

``--get``: instead, ``DirCache.get`` of one entry of ``--chunk`` bytes (1 MiB: a chunk, the
default; 8 MiB) alone, both trees' ``DirCache`` in one process, interleaved (64 entries x 5
per round, the order alternating), beside a bare ``os.pread`` of the same files (the read
alone) and the checksums alone (zlib's crc32; crc32c by google-crc32c, when installed). Every
get checks its entry's crc (a store through a shared mapping changes bytes without a ctime).

Each figure is the median over the rounds; the ratio is NEW / OLD time (lower is faster).
The cache files were written more than 2 s before the runs (a pass is remembered only for
files older than that: git's "racy" rule).

Run: ``python benchmarks/bench_cache_check.py --trees /work/wt/cache19 /work/main``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

CHILD = r"""
import json, os, sys, time
sys.path.insert(0, sys.argv[1])
cfg = json.loads(sys.argv[2])
import numpy as np, tarindex
from tests.remote_server import serve
from tarindex.storage import remote
with serve(cfg["data"]) as srv:
    urls = [f"{srv.url}/{n}" for n in cfg["names"]]
    remote.fetch([(urls[0], 0, 512)])  # fsspec, aiohttp and a connection: before any clock
    tarindex.TarDataset  # (and torch, imported lazily)
    out = {}
    if cfg["kind"] == "chunks":
        opts = tarindex.RemoteOptions(cache_dir=cfg["cache"], fetch="range")
        ds = tarindex.TarDataset(urls, remote=opts)
        order = np.random.default_rng(cfg["seed"]).permutation(len(ds)).tolist()
        for name in ("first", "second"):
            t0 = time.perf_counter()
            for i in order:
                ds[i]
            out[name] = (time.perf_counter() - t0) / len(order) * 1e6
    else:
        opts = tarindex.RemoteOptions(whole_cache_dir=cfg["cache"], fetch="shard", shards_ahead=0)
        t0 = time.perf_counter()
        ds = tarindex.TarDataset(urls[0], remote=opts)
        ds[0]
        out["reopen"] = (time.perf_counter() - t0) * 1e3
print(json.dumps(out))
"""


def _run(tree: str, cfg: dict[str, object]) -> dict[str, float]:
    env = dict(os.environ, PYTHONPATH=tree)
    r = subprocess.run(
        [sys.executable, "-c", CHILD, tree, json.dumps(cfg)],
        env=env, capture_output=True, text=True,
    )
    if r.returncode:
        raise RuntimeError(f"{tree}: {r.stderr[-3000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def _cache_class(tree: str) -> Any:
    """``DirCache`` of ``tree`` (its ``tarindex`` imported afresh)."""
    for m in [k for k in sys.modules if k == "tarindex" or k.startswith("tarindex.")]:
        del sys.modules[m]
    sys.path.insert(0, tree)
    try:
        from tarindex.storage.cache import DirCache

        return DirCache
    finally:
        sys.path.pop(0)


def get_rows(trees: list[str], rounds: int, chunk: int) -> None:
    """The ``--get`` rows (module docs)."""
    import zlib

    old = _cache_class(trees[1])
    new = _cache_class(trees[0])
    data = os.urandom(chunk)
    key = "ab" * 32
    n = 64 if chunk <= 1 << 20 else 16
    with tempfile.TemporaryDirectory() as tmp:
        caches = {"new": new(tmp + "/n", 1 << 34), "old": old(tmp + "/o", 1 << 34)}
        for c in caches.values():
            for i in range(n):
                c.put(key, str(i), data)
        fds = [os.open(caches["new"].path(key, str(i)), os.O_RDONLY) for i in range(n)]
        steps: dict[str, Any] = {
            name: (lambda c=c: [c.get(key, str(i), chunk) for i in range(n)])
            for name, c in caches.items()
        }
        steps["pread"] = lambda: [os.pread(fd, chunk + 24, 0) for fd in fds]
        steps["zlib crc32"] = lambda: [zlib.crc32(data) for _ in range(n)]
        try:
            import google_crc32c

            steps["crc32c"] = lambda: [google_crc32c.value(data) for _ in range(n)]
        except ImportError:
            pass
        got: dict[str, list[float]] = {k: [] for k in steps}
        for name in steps:  # warm
            steps[name]()
        for r in range(rounds):
            for name in list(steps) if r % 2 == 0 else list(steps)[::-1]:
                t0 = time.perf_counter()
                for _ in range(5):
                    steps[name]()
                got[name].append((time.perf_counter() - t0) / (5 * n) * 1e6)
        for fd in fds:
            os.close(fd)
    med = {k: statistics.median(v) for k, v in got.items()}
    print(f"DirCache.get of {chunk >> 20} MiB, {rounds} interleaved rounds (median us per get)")
    print(f"  new {med['new']:.0f} us, old {med['old']:.0f} us: {med['new'] / med['old']:.2f}x")
    for k in ("pread", "zlib crc32", "crc32c"):
        if k in med:
            print(f"  {k:<11}{med[k]:>8.0f} us")
    print(f"(load average {os.getloadavg()[0]:.1f})")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--trees", nargs=2, required=True, metavar=("NEW", "OLD"))
    ap.add_argument("--samples", type=int, default=2000)
    ap.add_argument("--size", type=int, default=64 << 10)
    ap.add_argument("--shards", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--get", action="store_true", help="DirCache.get alone (module docs)")
    ap.add_argument("--chunk", type=int, default=1 << 20, help="--get: bytes per entry")
    a = ap.parse_args()
    if a.get:
        get_rows(a.trees, 2 * a.rounds, a.chunk)
        return
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    sys.path.insert(0, here)
    import numpy as np

    import tarindex

    with tempfile.TemporaryDirectory() as tmp:
        data = os.path.join(tmp, "data")
        os.mkdir(data)
        rng = np.random.default_rng(0)
        per = -(-a.samples // a.shards)
        with tarindex.ShardWriter(os.path.join(data, "c-%06d.tar"), maxcount=per, mtime=0) as w:
            for i in range(a.samples):
                w.write({"__key__": f"{i:08d}", "bin": rng.bytes(a.size)})
        names = sorted(n for n in os.listdir(data) if n.endswith(".tar"))
        base = {"data": data, "names": names, "seed": 1}
        caches = {}
        for k, tree in enumerate(a.trees):  # fill each tree's caches with its own code
            for kind in ("chunks", "whole"):
                caches[k, kind] = os.path.join(tmp, f"cache-{k}-{kind}")
                _run(tree, {**base, "kind": kind, "cache": caches[k, kind]})
        time.sleep(2.5)  # older than the racy window
        got: dict[tuple[int, str], list[float]] = {}
        for r in range(a.rounds):
            order = list(enumerate(a.trees))
            for k, tree in order if r % 2 == 0 else order[::-1]:  # (no first-child bias)
                for kind in ("chunks", "whole"):
                    for name, v in _run(tree, {**base, "kind": kind, "cache": caches[k, kind]}).items():
                        got.setdefault((k, name), []).append(v)
    load = os.getloadavg()[0]
    print(f"{a.samples} samples x {a.size} B in {a.shards} shards, {a.rounds} paired rounds, "
          f"load average {load:.1f}")
    print(f"{'row':<28}{'new':>12}{'old':>12}{'new/old':>10}")
    rows = [("ds[i] first pass (us)", "first"), ("ds[i] second pass (us)", "second"),
            ("whole-copy reopen (ms)", "reopen")]
    for label, name in rows:
        n, o = statistics.median(got[0, name]), statistics.median(got[1, name])
        print(f"{label:<28}{n:>12.1f}{o:>12.1f}{n / o:>9.2f}x")


if __name__ == "__main__":
    main()
