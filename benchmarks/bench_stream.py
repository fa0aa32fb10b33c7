"""Streaming benchmark: samples/s of one shuffled epoch, and shuffle quality.

Part 1 (throughput): one epoch over the same samples, in one process, warm page cache (the
data is written just before and read once to warm up), no decoding:

* ``tarindex.TarIterableDataset(paths, shuffle=True)`` (block shuffle; default block and buffer
  sizes, plus a larger-block variant),
* ``webdataset.WebDataset(urls, shardshuffle=True).shuffle(1000)`` on the very same tar shards,
* litdata ``StreamingDataset(dir, shuffle=True)`` on the same samples written with litdata's
  own ``BinaryWriter`` (its chunk format).

A peer that is not installed or fails prints ``FAILED: <reason>`` instead of a rate.

Part 2 (shuffle quality, no data read): for one epoch of ``N`` samples in equal shards, the
order one worker yields is compared with the stored order and with a full random permutation:

* ``disp``: mean ``|position in epoch - stored index|`` divided by ``N`` (random: ~0.333),
* ``adj``: fraction of stored neighbours ``(i, i+1)`` that are still adjacent (random: ~2/N),
* ``near16``: fraction of stored neighbours at most 16 positions apart (random: ~32/N), a proxy
  for how correlated a batch is.

Run: ``python benchmarks/bench_stream.py [--samples 40000] [--size 4000] [--shards 16]``.
Importable: :func:`make_data`, :func:`bench_tarindex`, :func:`bench_webdataset`,
:func:`bench_litdata`, :func:`shuffle_quality`, :func:`run`.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import numpy as np

import tarindex
from tarindex.plan.epoch import plan_worker


def make_data(root: str, n_samples: int, mean_size: int, n_shards: int, seed: int = 0) -> list[str]:
    """Write ``n_shards`` tar shards (+ indexes) of ``n_samples`` samples under ``root``.

    Each sample: ``bin`` of random bytes, size uniform in ``[mean_size/2, 3*mean_size/2]``,
    and ``cls`` (an int). Returns the shard paths.
    """
    rng = np.random.default_rng(seed)
    os.makedirs(root, exist_ok=True)
    per = -(-n_samples // n_shards)
    pattern = os.path.join(root, "bench-%06d.tar")
    pool = rng.integers(0, 256, 2 * mean_size + 1, dtype=np.uint8).tobytes()
    with tarindex.ShardWriter(pattern, maxcount=per, mtime=0) as w:
        for i in range(n_samples):
            n = int(rng.integers(mean_size // 2, mean_size * 3 // 2 + 1))
            off = int(rng.integers(0, len(pool) - n + 1))
            w.write({"__key__": f"{i:09d}", "bin": pool[off : off + n], "cls": i % 1000})
    return sorted(os.path.join(root, f) for f in os.listdir(root) if f.endswith(".tar"))


def make_litdata(paths: Sequence[str], out: str) -> str:
    """Write the samples of ``paths`` in litdata's chunk format under ``out``; return ``out``."""
    from litdata.streaming.writer import BinaryWriter

    w = BinaryWriter(cache_dir=out, chunk_bytes="16MB")
    ds = tarindex.TarDataset(list(paths))
    for i in range(len(ds)):
        s = ds[i]
        w[i] = {"__key__": s["__key__"], "bin": s["bin"], "cls": int(s["cls"])}
    w.done()
    w.merge()
    return out


def count_batch(batch: list[Any]) -> int:
    """``collate_fn`` for worker runs: the batch size (no tensor conversion, tiny to send back)."""
    return len(batch)


def _loader(ds: Any, workers: int) -> Iterable[int]:
    from torch.utils.data import DataLoader

    return DataLoader(ds, batch_size=64, num_workers=workers, collate_fn=count_batch)


def _time_epoch(
    make_iter: Callable[[], Iterable[Any]], repeats: int, workers: int = 0
) -> tuple[float, int]:
    """Best samples/s over ``repeats`` epochs (after one warm-up epoch) and the sample count.

    ``workers > 0``: through a ``DataLoader`` with that many workers, batches of 64.
    """
    best, count = 0.0, 0
    for r in range(repeats + 1):
        t = time.perf_counter()
        n = 0
        if workers:
            for b in _loader(make_iter(), workers):
                n += b
        else:
            for _ in make_iter():
                n += 1
        dt = time.perf_counter() - t
        if r > 0:
            best = max(best, n / dt)
        count = n
    return best, count


def bench_tarindex(
    paths: Sequence[str], repeats: int = 2, workers: int = 0, **kw: Any
) -> tuple[float, int]:
    """Samples/s of one shuffled ``TarIterableDataset`` epoch, and the sample count."""
    ds = tarindex.TarIterableDataset(list(paths), shuffle=True, seed=0, **kw)
    return _time_epoch(lambda: ds, repeats, workers)  # each __iter__ plays the next epoch


def bench_webdataset(paths: Sequence[str], repeats: int = 2, workers: int = 0) -> tuple[float, int]:
    """Samples/s of one ``WebDataset(urls, shardshuffle=...).shuffle(1000)`` epoch."""
    import webdataset as wds

    def make() -> Iterable[Any]:
        return wds.WebDataset(list(paths), shardshuffle=len(paths), empty_check=False).shuffle(1000)

    return _time_epoch(make, repeats, workers)


def bench_litdata(litdir: str, repeats: int = 2, workers: int = 0) -> tuple[float, int]:
    """Samples/s of one litdata ``StreamingDataset(dir, shuffle=True)`` epoch."""
    from litdata import StreamingDataset

    def make() -> Iterable[Any]:
        return StreamingDataset(litdir, shuffle=True, seed=0)

    return _time_epoch(make, repeats, workers)


def _reservoir(order: np.ndarray, bufsize: int, initial: int, seed: int) -> np.ndarray:
    """webdataset's ``shuffle(bufsize)`` algorithm (``filters._shuffle``) applied to ``order``."""
    rng = random.Random(seed)
    buf: list[int] = []
    out: list[int] = []
    it = iter(order.tolist())

    def pick() -> int:
        k = rng.randint(0, len(buf) - 1)
        x = buf[k]
        buf[k] = buf[-1]
        buf.pop()
        return x

    for x in it:
        buf.append(x)
        if len(buf) < bufsize:
            nxt = next(it, None)
            if nxt is not None:
                buf.append(nxt)
        if len(buf) >= initial:
            out.append(pick())
    while buf:
        out.append(pick())
    return np.asarray(out, dtype=np.int64)


def quality(order: np.ndarray) -> dict[str, float]:
    """Shuffle metrics of ``order`` (a permutation of ``range(N)``, int64 ``(N,)``)."""
    n = len(order)
    pos = np.empty(n, dtype=np.int64)
    pos[order] = np.arange(n)
    gap = np.abs(np.diff(pos))
    return {
        "disp": float(np.mean(np.abs(pos - np.arange(n)))) / n,
        "adj": float(np.mean(gap == 1)),
        "near16": float(np.mean(gap <= 16)),
    }


def shuffle_quality(
    n_samples: int = 100_000,
    n_shards: int = 20,
    configs: Sequence[tuple[int, int]] = (
        (16, 256),
        (64, 1024),
        (64, 4096),
        (256, 1024),
        (256, 4096),
    ),
    seed: int = 0,
) -> list[tuple[str, dict[str, float]]]:
    """Rows ``(label, metrics)`` for tarindex plans, a webdataset-like reservoir and baselines."""
    counts = [n_samples // n_shards] * n_shards
    counts[-1] += n_samples - sum(counts)
    starts = np.zeros(n_shards + 1, dtype=np.int64)
    np.cumsum(counts, out=starts[1:])
    rows: list[tuple[str, dict[str, float]]] = []
    rows.append(("stored order", quality(np.arange(n_samples))))
    for block, buf in configs:
        p = plan_worker(counts, seed, 0, block, buffer_size=buf)
        rows.append((f"tarindex block={block} buffer={buf}", quality(p.order(starts))))
    shard_perm = np.random.default_rng(seed).permutation(n_shards)
    sharded = np.concatenate([np.arange(starts[s], starts[s + 1]) for s in shard_perm])
    rows.append(
        (
            "webdataset-like: shard shuffle + shuffle(1000)",
            quality(_reservoir(sharded, 1000, 100, seed)),
        )
    )
    rows.append(
        ("full random permutation", quality(np.random.default_rng(seed).permutation(n_samples)))
    )
    return rows


def run(
    n_samples: int = 40_000,
    mean_size: int = 4000,
    n_shards: int = 16,
    repeats: int = 2,
    workdir: str | None = None,
    workers: Sequence[int] = (0,),
) -> dict[str, Any]:
    """Run both parts, print tables, and return the figures."""
    tmp = workdir or tempfile.mkdtemp(prefix="bench_stream_")
    results: dict[str, Any] = {"rates": {}, "quality": None}
    try:
        t = time.perf_counter()
        paths = make_data(os.path.join(tmp, "tars"), n_samples, mean_size, n_shards)
        mb = sum(os.path.getsize(p) for p in paths) / 1e6
        print(
            f"data: {n_samples} samples, {len(paths)} shards, {mb:.0f} MB of tar, ~{mean_size} B "
            f"per sample ({time.perf_counter() - t:.1f}s to write); warm page cache, no decode"
        )
        litdir: list[str] = []

        def lit(w: int) -> tuple[float, int]:
            if not litdir:
                litdir.append(make_litdata(paths, os.path.join(tmp, "litdata")))
            return bench_litdata(litdir[0], repeats, w)

        contenders: list[tuple[str, Callable[[int], tuple[float, int]]]] = [
            ("tarindex (block=64, buffer=1024)", lambda w: bench_tarindex(paths, repeats, w)),
            (
                "tarindex (block=256, buffer=4096)",
                lambda w: bench_tarindex(paths, repeats, w, block_size=256, buffer_size=4096),
            ),
            ("webdataset shuffle(1000)", lambda w: bench_webdataset(paths, repeats, w)),
            ("litdata StreamingDataset(shuffle=True)", lit),
        ]
        for w in workers:
            rates: dict[str, float | str] = {}
            results["rates"][w] = rates
            for name, fn in contenders:
                try:
                    rate, count = fn(w)
                    if count != n_samples:
                        print(f"  note: {name} yielded {count} of {n_samples} samples")
                    rates[name] = rate
                except Exception as e:  # a peer that cannot install or run is reported, not dropped
                    rates[name] = f"FAILED: {type(e).__name__}: {e}"
            where = "in-process" if w == 0 else f"DataLoader, {w} workers, batch 64"
            print(f"\n{'loader (' + where + ')':50s} {'samples/s':>12s}")
            for name, r in rates.items():
                print(f"{name:50s} {r:12,.0f}" if isinstance(r, float) else f"{name:50s} {r}")
            base = rates.get("tarindex (block=64, buffer=1024)")
            if isinstance(base, float):
                for peer in ("webdataset shuffle(1000)", "litdata StreamingDataset(shuffle=True)"):
                    r = rates.get(peer)
                    if isinstance(r, float):
                        print(f"ratio tarindex / {peer}: {base / r:.2f}x")
                    else:
                        print(f"ratio tarindex / {peer}: n/a ({peer} failed)")
    finally:
        if workdir is None:
            shutil.rmtree(tmp, ignore_errors=True)

    rows = shuffle_quality()
    results["quality"] = rows
    print("\nshuffle quality, one epoch of 100,000 samples in 20 shards, one worker")
    print(f"{'order':48s} {'disp':>7s} {'adj':>9s} {'near16':>9s}")
    for label, m in rows:
        print(f"{label:48s} {m['disp']:7.3f} {m['adj']:9.5f} {m['near16']:9.5f}")
    return results


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--samples", type=int, default=40_000)
    ap.add_argument("--size", type=int, default=4000, help="mean sample size in bytes")
    ap.add_argument("--shards", type=int, default=16)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--workdir", default=None, help="keep the data here (default: a temp dir)")
    ap.add_argument(
        "--workers",
        default="0,2",
        help="comma-separated DataLoader worker counts; 0 = in-process (default: 0,2)",
    )
    a = ap.parse_args(argv)
    run(a.samples, a.size, a.shards, a.repeats, a.workdir, [int(x) for x in a.workers.split(",")])
    return 0


if __name__ == "__main__":
    sys.exit(main())
