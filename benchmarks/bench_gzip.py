"""Random access into a ``.tar.gz`` without recompressing: tarindex ``ds[i]`` vs ratarmount.

One gzip-compressed tar (``--n`` samples, each ``bin``: 2-12 KB of seeded random bytes,
``txt``: 1-3 KB of text, ``cls``; about 60% of it compresses), in one process, warm page cache:

* **index**: ``tarindex index`` (seek points every ``--spacing`` bytes, 1 MiB by default) vs
  ratarmountcore's ``SQLiteIndexedTar`` building its SQLite index and gzip seek points, with
  its default backend (rapidgzip when installed) and with indexed_gzip, each at the same
  spacing and at ratarmount's default (16 MiB);
* **random sample**: ``ds[i]`` (all three members) over the same random samples vs
  ratarmount reading the same three members (``lookup`` + ``read`` each);
* **limits**: ``ds[i]`` of the same tar uncompressed (mmap, the plain-tar path), and the
  inflate bound: ``spacing / 2`` bytes inflated per random read at zlib's single-core speed
  (``gzip.decompress`` of the whole file);
* **stream**: one epoch in shard order, tarindex ``TarIterableDataset`` vs webdataset 1.0.2's
  ``WebDataset`` over the same ``.tar.gz``, against ``gzip.decompress`` of the whole file.

Prints samples/s and the ratios. Timings on a shared machine are noisy (best of
``--passes``). Usage: ``python benchmarks/bench_gzip.py [--n 20000] [--reads 2000]
[--spacing 1048576] [--passes 3] [--root DIR]``.
"""

from __future__ import annotations

import argparse
import contextlib
import gzip
import io
import os
import random
import shutil
import tarfile
import tempfile
import time
from collections.abc import Callable

import numpy as np

import tarindex


def make(root: str, n: int) -> tuple[str, str, list[str]]:
    """Write ``root/data.tar`` and ``root/data.tar.gz`` (level 6); return them and the keys."""
    rng = np.random.default_rng(0)
    words = [w.encode() for w in "the of a to in is on for it with as by at from this".split()]
    plain = os.path.join(root, "data.tar")
    keys = []
    with tarfile.open(plain, "w", format=tarfile.USTAR_FORMAT) as tf:
        for i in range(n):
            k = f"{i:08d}"
            keys.append(k)
            txt = b" ".join(words[j] for j in rng.integers(0, len(words), 400))
            txt = txt[: int(rng.integers(1000, 3000))]
            for ext, data in (
                ("bin", rng.integers(0, 256, int(rng.integers(2000, 12000)), np.uint8).tobytes()),
                ("txt", txt),
                ("cls", str(i % 1000).encode()),
            ):
                ti = tarfile.TarInfo(f"{k}.{ext}")
                ti.size = len(data)
                ti.mtime = 0
                tf.addfile(ti, io.BytesIO(data))
    gz = plain + ".gz"
    with open(plain, "rb") as f, open(gz, "wb") as raw:
        with gzip.GzipFile(fileobj=raw, mode="wb", compresslevel=6, mtime=0) as g:
            shutil.copyfileobj(f, g, 4 << 20)
    return plain, gz, keys


def best(f: Callable[[], int], passes: int) -> tuple[float, int, float]:
    """Best wall time of ``passes`` runs of ``f``, the count it returned, the first run's time."""
    t, n, first = float("inf"), 0, 0.0
    for k in range(passes):
        t0 = time.perf_counter()
        n = f()
        dt = time.perf_counter() - t0
        first = dt if k == 0 else first
        t = min(t, dt)
    return t, n, first


def ratarmount(gz: str, spacing: int, backend: str | None) -> object:
    """A ratarmountcore ``SQLiteIndexedTar`` over ``gz`` (index in memory, not written)."""
    from ratarmountcore.mountsource.formats.tar import SQLiteIndexedTar

    kw: dict[str, object] = {"gzipSeekPointSpacing": spacing, "parallelization": 1}
    if backend is not None:
        kw["prioritizedBackends"] = [backend]
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        return SQLiteIndexedTar(gz, writeIndex=False, indexFilePath=":memory:", **kw)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=20_000)
    ap.add_argument("--reads", type=int, default=2_000)
    ap.add_argument("--spacing", type=int, default=1 << 20)
    ap.add_argument("--passes", type=int, default=3)
    ap.add_argument("--root", default=None)
    a = ap.parse_args()
    root = a.root or tempfile.mkdtemp(prefix="bench-gzip-")
    os.makedirs(root, exist_ok=True)
    plain, gz, keys = make(root, a.n)
    tb, gb = os.path.getsize(plain), os.path.getsize(gz)
    print(f"{a.n} samples; tar {tb / 1e6:.1f} MB, tar.gz {gb / 1e6:.1f} MB; warm page cache")
    order = random.Random(1).sample(range(a.n), min(a.reads, a.n))

    # -- index ----------------------------------------------------------------------------
    rows: list[tuple[str, float]] = []
    t0 = time.perf_counter()
    tarindex.build_index(gz, gzip_spacing=a.spacing)
    rows.append((f"tarindex index (indexed_gzip, {a.spacing >> 20} MiB)", time.perf_counter() - t0))
    tarindex.build_index(plain)
    rams: dict[str, object] = {}
    for name, spacing, backend in (
        (f"ratarmount default backend, {a.spacing >> 20} MiB", a.spacing, None),
        (f"ratarmount indexed_gzip, {a.spacing >> 20} MiB", a.spacing, "indexed_gzip"),
        ("ratarmount default backend, 16 MiB (its default)", 16 << 20, None),
    ):
        t0 = time.perf_counter()
        try:
            rams[name] = ratarmount(gz, spacing, backend)
        except Exception as e:  # a backend that is not installed
            print(f"  {name}: not run ({type(e).__name__}: {e})")
            continue
        rows.append((name, time.perf_counter() - t0))
    print("\nindex build (s)")
    for name, t in rows:
        print(f"  {name:<52} {t:8.2f}")

    # -- random samples -------------------------------------------------------------------
    ds_gz, ds_tar = tarindex.TarDataset(gz), tarindex.TarDataset(plain)

    def ours(ds: tarindex.TarDataset) -> Callable[[], int]:
        def run() -> int:
            for i in order:
                ds[i]
            return len(order)

        return run

    def theirs(src: object) -> Callable[[], int]:
        infos = [
            [src.lookup(f"/{keys[i]}.{e}") for e in ("bin", "txt", "cls")]  # type: ignore[attr-defined]
            for i in order
        ]

        def run() -> int:
            for three in infos:
                for fi in three:
                    src.read(fi, fi.size, 0)  # type: ignore[attr-defined]
            return len(order)

        return run

    print(
        f"\nrandom samples ({len(order)} reads of all 3 members; samples/s: first pass, "
        f"best of {a.passes})"
    )
    rates: dict[str, float] = {}
    for name, f in [
        ("tarindex ds[i], .tar.gz", ours(ds_gz)),
        *[(name, theirs(src)) for name, src in rams.items()],
        ("tarindex ds[i], same tar uncompressed (mmap)", ours(ds_tar)),
    ]:
        t, n, first = best(f, a.passes)
        rates[name] = n / t
        print(f"  {name:<52} {n / first:10.0f} {n / t:10.0f}")
    t, _, _ = best(lambda: len(gzip.decompress(open(gz, "rb").read())), 1)
    inflate = tb / t
    bound = inflate / (a.spacing / 2)
    print(f"  {'inflate bound: spacing/2 per read at zlib speed':<52} {bound:10.0f}")
    ref = rates["tarindex ds[i], .tar.gz"]
    for name, r in rates.items():
        if name.startswith("ratarmount"):
            print(f"  tarindex / {name}: {ref / r:.2f}x")
    print(f"  tarindex .tar.gz / inflate bound: {ref / bound:.2f}")

    # -- streaming ------------------------------------------------------------------------
    print(f"\nstream one epoch in order (samples/s); gzip.decompress: {inflate / 1e6:.0f} MB/s")

    def ours_stream() -> int:
        return sum(1 for _ in tarindex.TarIterableDataset(gz, shuffle=False))

    srow = [("tarindex TarIterableDataset, .tar.gz", ours_stream)]
    try:
        import webdataset as wds

        srow.append(
            (
                "webdataset WebDataset, .tar.gz",
                lambda: sum(1 for _ in wds.WebDataset(gz, shardshuffle=False)),
            )
        )
    except ImportError:
        pass
    for name, f in srow:
        t, n, _ = best(f, a.passes)
        print(f"  {name:<52} {n / t:10.0f}")
    print(f"  {'inflate limit (whole file, zlib)':<52} {a.n * inflate / tb:10.0f}")
    for src in rams.values():
        src.close()  # type: ignore[attr-defined]
    if a.root is None:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
