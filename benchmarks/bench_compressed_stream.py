"""Streaming compressed shards: shuffled ``.tar.gz``, and ``.tar.zst``/``.tar.xz`` through the copy.

The tar of ``bench_gzip.make`` (``--n`` samples of ``bin`` 2-12 KB random, ``txt`` 1-3 KB text,
``cls``), in one process, warm page cache:

* **.tar.gz, in order vs shuffled**: one ``TarIterableDataset`` epoch with ``shuffle=False``
  and with ``shuffle=True`` (blocks of ``--block`` samples in a permuted order), samples/s
  and their ratio: a block that does not start where the previous read ended resumes at the
  seek point before it, inflating up to one ``spacing`` (1 MiB) it then skips (FORMAT.md §10).
  Printed beside it: that bound, blocks x spacing / 2 extra bytes on average.
* **.tar.zst (level 3) / .tar.xz (preset 1)**: the first open (index + decompressed copy in
  the tar cache, FORMAT.md §11), then shuffled epochs from the copy, against webdataset 1.0.2
  streaming the same file (``pipe:zstd -dc`` for zstd, its ``tarfile`` ``r|*`` for xz), and
  tarindex on the plain tar.

Prints samples/s (best of ``--passes``). Timings on a shared machine are noisy. Usage:
``python benchmarks/bench_compressed_stream.py [--n 10000] [--block 64] [--passes 2] [--root DIR]``.
"""

from __future__ import annotations

import argparse
import lzma
import os
import random
import shutil
import sys
import tempfile
import time
from collections.abc import Callable

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from bench_gzip import make  # noqa: E402

import tarindex  # noqa: E402


def best(f: Callable[[], int], passes: int) -> tuple[float, int]:
    """``(seconds, samples)`` of the fastest of ``passes`` runs of ``f``."""
    out = (float("inf"), 0)
    for _ in range(passes):
        t0 = time.perf_counter()
        n = f()
        out = min(out, (time.perf_counter() - t0, n))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=10_000)
    ap.add_argument("--block", type=int, default=64)
    ap.add_argument("--passes", type=int, default=2)
    ap.add_argument("--root", default=None)
    ap.add_argument("--gzip-only", action="store_true", help="skip the .tar.zst/.tar.xz part")
    a = ap.parse_args()
    root = a.root or tempfile.mkdtemp(prefix="bench-compressed-")
    os.makedirs(root, exist_ok=True)
    os.environ.setdefault("TARINDEX_TAR_CACHE", os.path.join(root, "tar-cache"))
    plain, gz, _ = make(root, a.n)
    tb = os.path.getsize(plain)
    print(f"{a.n} samples; tar {tb / 1e6:.1f} MB, tar.gz {os.path.getsize(gz) / 1e6:.1f} MB")
    tarindex.build_index(plain)
    tarindex.build_index(gz)

    # -- .tar.gz: in order vs shuffled blocks ---------------------------------------------------
    print(f"\n.tar.gz, one epoch (samples/s, best of {a.passes})")
    rate = {}
    for shuffle in (False, True):
        ds = tarindex.TarIterableDataset(gz, shuffle=shuffle, block_size=a.block, seed=0)
        t, n = best(lambda ds=ds: sum(1 for _ in ds), a.passes)
        rate[shuffle] = n / t
        print(f"  {f'shuffle={shuffle}, block_size={a.block}':<40} {n / t:10.0f}")
    blocks = -(-a.n // a.block)
    print(
        f"  shuffled / in order: {rate[True] / rate[False]:.2f}x; bound: {blocks} blocks x "
        f"0.5 MiB = {blocks / 2 / (tb / 2**20):.2f}x the tar inflated again"
    )
    # the read alone, without the executor: every block of the shard, in order then permuted,
    # alternating (rounds) so neither order is always the warmer one
    read_samples = tarindex.TarDataset(gz).shards.takes().read_samples  # the executor's read
    spans = [(j, min(j + a.block, a.n)) for j in range(0, a.n, a.block)]
    perm = [spans[k] for k in random.Random(0).sample(range(len(spans)), len(spans))]
    took = {"in order": 0.0, "permuted": 0.0}
    cpu = {"in order": 0.0, "permuted": 0.0}
    for _ in range(a.passes):
        for name, order in (("in order", spans), ("permuted", perm)):
            t0, c0 = time.perf_counter(), time.process_time()
            for j0, j1 in order:
                read_samples(0, j0, j1)
            took[name] += time.perf_counter() - t0
            cpu[name] += time.process_time() - c0
    per = a.passes * blocks
    print(
        f"  read_samples per block ({blocks} blocks of {a.block}, one thread): wall in order "
        f"{1e3 * took['in order'] / per:.2f} ms, permuted {1e3 * took['permuted'] / per:.2f} ms "
        f"({took['permuted'] / took['in order']:.2f}x); CPU in order "
        f"{1e3 * cpu['in order'] / per:.2f} ms, permuted {1e3 * cpu['permuted'] / per:.2f} ms "
        f"({cpu['permuted'] / cpu['in order']:.2f}x)"
    )
    ds = tarindex.TarIterableDataset(plain, shuffle=True, block_size=a.block, seed=0)
    t, n = best(lambda: sum(1 for _ in ds), a.passes)
    print(f"  {'same tar uncompressed, shuffled':<40} {n / t:10.0f}")

    if a.gzip_only:
        return
    # -- .tar.zst / .tar.xz: through the decompressed copy --------------------------------------
    import zstandard

    data = open(plain, "rb").read()
    zst, xz = plain + ".zst", plain + ".xz"
    with open(zst, "wb") as f:
        f.write(zstandard.ZstdCompressor(level=3, write_checksum=True).compress(data))
    with open(xz, "wb") as f:
        f.write(lzma.compress(data, preset=1))
    del data
    try:
        import webdataset as wds
    except ImportError:
        wds = None
    zstd_cmd = shutil.which("zstd")
    for path, url in ((zst, f"pipe:{zstd_cmd} -dc {zst}" if zstd_cmd else None), (xz, xz)):
        kind = path.rsplit(".", 1)[1]
        print(f"\n.tar.{kind} ({os.path.getsize(path) / 1e6:.1f} MB; samples/s)")
        t0 = time.perf_counter()
        tarindex.build_index(path)  # index + the copy in the tar cache
        t_first = time.perf_counter() - t0
        print(f"  {'first open: index + decompressed copy (s)':<40} {t_first:10.2f}")
        ds = tarindex.TarIterableDataset(path, shuffle=True, block_size=a.block, seed=0)
        t, n = best(lambda ds=ds: sum(1 for _ in ds), a.passes)
        print(f"  {'tarindex shuffled epoch, from the copy':<40} {n / t:10.0f}")
        print(f"  {'tarindex first epoch, open included':<40} {n / (t + t_first):10.0f}")
        if wds is not None and url is not None:
            t, n = best(lambda url=url: sum(1 for _ in wds.WebDataset(url, shardshuffle=False)), a.passes)
            print(f"  {'webdataset 1.0.2, in order (every epoch)':<40} {n / t:10.0f}")


if __name__ == "__main__":
    main()
