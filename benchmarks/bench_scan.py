"""Header-walk speed: tarindex scan against tarfile, ratarmountcore and GNU ``tar -tf``.

Same tars for every lister, warm page cache (each tar is read once before timing), best of
``repeat`` runs for the fast listers, one run for the slow ones (tarfile, ratarmountcore).

* small: ``n_small`` members of 1 KiB (default 100,000; 154 MB of tar)
* large: ``n_large`` members of 1 MiB (default 300; 315 MB of tar)

Prints members/s and GB/s (tar bytes listed per second) per lister and the ratios
``tarindex / other``; then ``tarindex index --jobs 1`` vs ``--jobs 2`` over 4 shards.
Usage: ``python benchmarks/bench_scan.py [--small N] [--large N] [--root DIR]``.
The functions are importable (``make_tars``, ``time_listers``, ``time_jobs``, ``main``).
"""

from __future__ import annotations

import argparse
import io
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Callable

import numpy as np

from tarindex.index.build import build_index
from tarindex.index.scan import scan_members

GNU_TAR = shutil.which("tar")


def write_tar(path: str, n: int, size: int, seed: int = 0) -> str:
    """Write ``n`` members of ``size`` bytes each (plain ustar, integer mtimes) to ``path``."""
    rng = np.random.default_rng(seed)
    pool = rng.integers(0, 256, size + 4096, dtype=np.uint8).tobytes()
    with open(path, "wb") as f, tarfile.open(fileobj=f, mode="w", format=tarfile.USTAR_FORMAT) as tf:
        for i in range(n):
            ti = tarfile.TarInfo(f"{i // 1000:05d}/{i:08d}.bin")
            ti.size = size
            ti.mtime = 0
            s = i % 4096
            tf.addfile(ti, io.BytesIO(pool[s : s + size]))
    return path


def make_tars(root: str, n_small: int = 100_000, n_large: int = 300) -> dict[str, str]:
    """Create (or reuse) the small-member and large-member tars under ``root``."""
    os.makedirs(root, exist_ok=True)
    out = {}
    for name, n, size in (("small", n_small, 1024), ("large", n_large, 1 << 20)):
        p = os.path.join(root, f"{name}-{n}.tar")
        if not os.path.exists(p):
            write_tar(p + ".part", n, size)
            os.replace(p + ".part", p)
        out[name] = p
    return out


def warm(path: str) -> None:
    """Read the file once so every lister sees a warm page cache."""
    with open(path, "rb") as f:
        while f.read(1 << 24):
            pass


def _best(fn: Callable[[], int], repeat: int) -> tuple[float, int]:
    best, n = float("inf"), 0
    for _ in range(repeat):
        t = time.perf_counter()
        n = fn()
        best = min(best, time.perf_counter() - t)
    return best, n


def lister_tarindex(p: str) -> int:
    return len(scan_members(p))


def lister_tarfile(p: str) -> int:
    with tarfile.open(p) as tf:
        return sum(1 for m in tf.getmembers() if m.isreg())


def lister_gnu_tar(p: str) -> int:
    if GNU_TAR is None:
        raise RuntimeError("GNU tar not found")
    r = subprocess.run([GNU_TAR, "-tf", p], stdout=subprocess.PIPE, check=True)
    return r.stdout.count(b"\n")


def lister_ratarmount(p: str) -> int:
    import contextlib

    from ratarmountcore.mountsource.formats.tar import SQLiteIndexedTar

    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        with SQLiteIndexedTar(p, writeIndex=False, indexFilePath=":memory:") as src:
            return int(src.index.file_count())


LISTERS: dict[str, tuple[Callable[[str], int], bool]] = {
    # name: (function, fast: best of `repeat` runs, else one run)
    "tarindex scan": (lister_tarindex, True),
    "GNU tar -tf": (lister_gnu_tar, True),
    "tarfile getmembers": (lister_tarfile, False),
    "ratarmountcore index": (lister_ratarmount, False),
}


def time_listers(path: str, repeat: int = 5) -> dict[str, dict[str, float | str]]:
    """Time every lister on one tar; return ``{name: {seconds, members, members_s, gb_s}}``.

    The fast listers alternate run by run (so load from other processes hits them alike).
    A lister that is missing or fails gets ``{"error": message}``.
    """
    warm(path)
    nbytes = os.path.getsize(path)
    res: dict[str, dict[str, float | str]] = {}
    best: dict[str, float] = {}
    count: dict[str, int] = {}
    for _ in range(repeat):
        for name, (fn, fast) in LISTERS.items():
            if not fast or name in res:
                continue
            try:
                t, n = _best(lambda fn=fn: fn(path), 1)  # type: ignore[misc]
            except Exception as e:  # noqa: BLE001 - report and go on
                res[name] = {"error": f"{type(e).__name__}: {e}"}
                continue
            best[name] = min(best.get(name, t), t)
            count[name] = n
    for name, (fn, fast) in LISTERS.items():
        if name in res:
            continue
        if not fast:
            try:
                best[name], count[name] = _best(lambda fn=fn: fn(path), 1)  # type: ignore[misc]
            except Exception as e:  # noqa: BLE001
                res[name] = {"error": f"{type(e).__name__}: {e}"}
                continue
        t = best[name]
        res[name] = {"seconds": t, "members": count[name], "members_s": count[name] / t,
                     "gb_s": nbytes / t / 1e9}
    return res


def time_jobs(root: str, n_shards: int = 4, per_shard: int = 25_000) -> dict[str, float]:
    """Index ``n_shards`` tars with ``tarindex index --jobs 1`` and ``--jobs 2``; seconds each."""
    paths = []
    for s in range(n_shards):
        p = os.path.join(root, f"jobs-{s}-{per_shard}.tar")
        if not os.path.exists(p):
            write_tar(p + ".part", per_shard, 1024, seed=s)
            os.replace(p + ".part", p)
        warm(p)
        paths.append(p)
    out = {}
    try:
        import tarindex.cli.main  # noqa: F401

        for jobs in (1, 2):
            t = time.perf_counter()
            subprocess.run([sys.executable, "-m", "tarindex", "index", "--force", "--jobs", str(jobs),
                            *paths], check=True, stdout=subprocess.DEVNULL)
            out[f"jobs={jobs}"] = time.perf_counter() - t
    except (ImportError, subprocess.CalledProcessError):
        from multiprocessing import Pool

        t = time.perf_counter()
        for p in paths:
            build_index(p)
        out["jobs=1"] = time.perf_counter() - t
        t = time.perf_counter()
        with Pool(2) as pool:
            pool.map(build_index, paths)
        out["jobs=2"] = time.perf_counter() - t
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--small", type=int, default=100_000, help="1 KiB members in the small tar")
    ap.add_argument("--large", type=int, default=300, help="1 MiB members in the large tar")
    ap.add_argument("--root", default=None, help="where the tars go (default: a temp dir)")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--no-jobs", action="store_true", help="skip the --jobs scaling run")
    a = ap.parse_args(argv)
    root = a.root or tempfile.mkdtemp(prefix="bench_scan-")
    tars = make_tars(root, a.small, a.large)
    print(f"tars in {root}; warm page cache; best of {a.repeat} (tarfile, ratarmountcore: 1 run)")
    for kind, path in tars.items():
        res = time_listers(path, a.repeat)
        print(f"\n{kind}: {os.path.basename(path)} ({os.path.getsize(path) / 1e6:.0f} MB)")
        for name, r in res.items():
            if "error" in r:
                print(f"  {name:22s} unavailable: {r['error']}")
            else:
                print(f"  {name:22s} {r['seconds']:8.3f} s {r['members_s']:12,.0f} members/s "
                      f"{r['gb_s']:7.2f} GB/s")
        ours = res["tarindex scan"]
        for name, r in res.items():
            if name != "tarindex scan" and "error" not in r and "error" not in ours:
                print(f"  tarindex scan is {float(r['seconds']) / float(ours['seconds']):6.2f}x "
                      f"the speed of {name}")
    if not a.no_jobs:
        j = time_jobs(root)
        print(f"\ntarindex index over 4 shards x 25,000 members: jobs=1 {j['jobs=1']:.2f} s, "
              f"jobs=2 {j['jobs=2']:.2f} s, speed-up {j['jobs=1'] / j['jobs=2']:.2f}x "
              f"(2 cores, shared)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
