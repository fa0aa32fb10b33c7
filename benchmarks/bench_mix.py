"""Mixing benchmark: samples/s of a weighted mix against one source over the same samples.

Data: three sources of very different sizes (80%, 15% and 5% of ``--samples``), ``bin`` members
of ``--size`` bytes on average plus a ``cls``, written just before (warm page cache, each
configuration read once to warm up). Every configuration reads the same block and buffer sizes
(64 / 1024), no decoding. The configurations run in interleaved rounds; each round gives a
ratio to the ``single`` run of the same round (paired, so a burst of load from other processes
hits both), and the table prints the median rate and the median of the paired ratios.
Rates are per CPU second (``time.process_time``; for DataLoader rows plus the workers' CPU
time, from ``RUSAGE_CHILDREN`` once the epoch has joined them), which other processes on a
shared machine disturb much less than wall time:

* ``single``: one ``TarIterableDataset`` over all shards of the three sources (one epoch);
* ``mix counts=sizes``: ``MixedDataset`` of the three sources, each sample once (same epoch);
* ``mix weights=1:1:1, replacement``: the same ``N`` per epoch, the small sources upsampled;
* ``mix counts=sizes, source_key``: each sample dict also gets ``__source__``;
* the same ``single`` / ``mix`` pair through a ``DataLoader`` with 2 workers (batch 64);
* map-style: ``ds[i]`` over one ``TarDataset`` of all shards (the three sources' shards in
  order: the concatenation the samplers index) for the indices of a ``BlockSampler`` against
  those of a ``MixSampler counts=sizes`` (each sample once either way), and indices/s of the
  samplers alone (``list(BlockSampler)`` against ``list(MixSampler)``).

Also printed: the largest deviation ``|count - k * p_s|`` over all windows of the mixed epoch
per source, against the stated bound (``tarindex.plan.mix.mix_bound``).

Run: ``python benchmarks/bench_mix.py [--quick] [--samples 60000] [--size 2000] [--rounds 15]``
(``--size 100000 --samples 6000``: image-sized samples).
"""

from __future__ import annotations

import argparse
import gc
import os
import resource
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np

import tarindex
from tarindex.plan.mix import mix_bound

SHARES = (0.80, 0.15, 0.05)


def make_source(
    root: str, name: str, n: int, mean_size: int, per_shard: int, seed: int
) -> list[str]:
    """Write ``n`` samples as shards of ``per_shard`` under ``root/name``; return the paths."""
    rng = np.random.default_rng(seed)
    d = os.path.join(root, name)
    os.makedirs(d, exist_ok=True)
    pool = rng.integers(0, 256, 2 * mean_size + 1, dtype=np.uint8).tobytes()
    with tarindex.ShardWriter(
        os.path.join(d, f"{name}-%06d.tar"), maxcount=per_shard, mtime=0
    ) as w:
        for i in range(n):
            k = int(rng.integers(mean_size // 2, mean_size * 3 // 2 + 1))
            off = int(rng.integers(0, len(pool) - k + 1))
            w.write({"__key__": f"{i:09d}", "bin": pool[off : off + k], "cls": i % 1000})
    return sorted(os.path.join(d, f) for f in os.listdir(d) if f.endswith(".tar"))


def count_batch(batch: list[Any]) -> int:
    """``collate_fn`` for worker runs: the batch size (tiny to send back)."""
    return len(batch)


def cpu_all() -> float:
    """CPU seconds of this process and of its finished children (the DataLoader's workers)."""
    ch = resource.getrusage(resource.RUSAGE_CHILDREN)
    return time.process_time() + ch.ru_utime + ch.ru_stime


def epoch_rate(
    make: Callable[[], Iterable[Any]], counted: Callable[[Any], int], cpu: bool = True
) -> float:
    """Samples per CPU second of one pass (this process, plus workers when ``cpu`` is false).

    A DataLoader joins its (non-persistent) workers at the end of the epoch, so their CPU
    time is in ``RUSAGE_CHILDREN`` by then.
    """
    clock = time.process_time if cpu else cpu_all
    it = make()
    t0 = clock()
    n = 0
    for x in it:
        n += counted(x)
    return n / (clock() - t0)


def window_excess(src: np.ndarray, counts: list[int]) -> list[float]:
    """Per source, max over all windows of |count - k * p_s| (= max D - min D of the prefix)."""
    n, t = sum(counts), np.arange(len(src) + 1)
    out = []
    for s, c in enumerate(counts):
        d = np.concatenate([[0], np.cumsum(src == s)]) - t * (c / n)
        out.append(float(d.max() - d.min()))
    return out


def run(samples: int, size: int, rounds: int, workers: int = 2) -> int:
    import torch
    from torch.utils.data import DataLoader

    root = tempfile.mkdtemp(prefix="bench_mix_")
    try:
        sizes = [int(samples * f) for f in SHARES]
        per_shard = max(1, samples // 20)
        paths = [
            make_source(root, name, n, size, per_shard, seed)
            for seed, (name, n) in enumerate(zip("abc", sizes, strict=True))
        ]
        allp = [p for ps in paths for p in ps]
        kw: dict[str, Any] = {"block_size": 64, "buffer_size": 1024, "seed": 0}

        def single() -> tarindex.TarIterableDataset:
            return tarindex.TarIterableDataset(allp, **kw)

        def mix(**mk: Any) -> tarindex.MixedDataset:
            srcs = [tarindex.TarIterableDataset(p, **kw) for p in paths]
            return tarindex.MixedDataset(srcs, seed=0, **mk)

        def loader(ds: Any) -> Any:
            return DataLoader(ds, batch_size=64, num_workers=workers, collate_fn=count_batch)

        n_all = sum(sizes)
        configs: dict[str, tuple[Callable[[], Iterable[Any]], Callable[[Any], int]]] = {
            "single TarIterableDataset": (single, lambda _: 1),
            "mix counts=sizes": (lambda: mix(counts=sizes), lambda _: 1),
            "mix weights=1:1:1, replacement": (
                lambda: mix(weights=[1, 1, 1], replacement=True, samples_per_epoch=n_all),
                lambda _: 1,
            ),
            "mix counts=sizes, source_key": (
                lambda: mix(counts=sizes, source_key="__source__"),
                lambda _: 1,
            ),
            f"single, DataLoader {workers} workers": (lambda: loader(single()), int),
            f"mix counts=sizes, DataLoader {workers} workers": (
                lambda: loader(mix(counts=sizes)),
                int,
            ),
        }
        ds_all = [tarindex.TarDataset(p) for p in paths]
        ds_cat = tarindex.TarDataset(allp)  # the concatenation the samplers index
        configs["map-style ds[i], BlockSampler"] = (
            lambda: map(ds_cat.__getitem__, tarindex.BlockSampler(ds_cat, block_size=64, seed=0)),
            lambda _: 1,
        )
        configs["map-style ds[i], MixSampler counts=sizes"] = (
            lambda: map(
                ds_cat.__getitem__,
                tarindex.MixSampler(ds_all, counts=sizes, block_size=64, seed=0),
            ),
            lambda _: 1,
        )

        class _Cat:
            def __len__(self) -> int:
                return n_all

        samplers: dict[str, Callable[[], Iterable[Any]]] = {
            "BlockSampler over the concatenation (indices only)": lambda: tarindex.BlockSampler(
                _Cat(), block_size=64, seed=0
            ),
            "MixSampler counts=sizes (indices only)": lambda: tarindex.MixSampler(
                ds_all, counts=sizes, block_size=64, seed=0
            ),
        }
        for make, counted in configs.values():  # warm the page cache and the imports
            epoch_rate(make, counted)
        gc.collect()
        gc.freeze()
        base_of = {}
        for name in [*configs, *samplers]:
            base_of[name] = (
                "map-style ds[i], BlockSampler"
                if "map-style" in name
                else f"single, DataLoader {workers} workers"
                if "DataLoader" in name
                else "BlockSampler over the concatenation (indices only)"
                if "Sampler" in name
                else "single TarIterableDataset"
            )
        rates: dict[str, list[float]] = {k: [] for k in base_of}
        for _ in range(rounds):
            for name, (make, counted) in configs.items():
                rates[name].append(epoch_rate(make, counted, cpu="DataLoader" not in name))
            for name, mk in samplers.items():
                rates[name].append(epoch_rate(mk, lambda _: 1))
        med = {k: statistics.median(v) for k, v in rates.items()}
        ratio = {
            k: statistics.median(a / b for a, b in zip(v, rates[base_of[k]], strict=True))
            for k, v in rates.items()
        }
        print(
            f"# {n_all} samples ({'/'.join(map(str, sizes))}), ~{size} B each, "
            f"{len(allp)} shards, {rounds} interleaved rounds, torch {torch.__version__}"
        )
        print("| configuration | samples/s (median) | vs single (median of paired ratios) |")
        print("|---|---|---|")
        for name, r in med.items():
            unit = "CPU, with workers" if "DataLoader" in name else "CPU"
            print(f"| {name} | {r:,.0f} ({unit}) | {ratio[name]:.2f}x |")
        m = mix(counts=sizes)
        src, _ = m.order(0)
        exc = window_excess(src, sizes)
        bound = mix_bound(sizes).tolist()
        print(
            "\nwindow deviation |count - k*p| over all windows of the epoch, per source: "
            + ", ".join(f"{e:.3f} (bound {b:.3f})" for e, b in zip(exc, bound, strict=True))
        )
        ok = all(e <= b + 1e-9 for e, b in zip(exc, bound, strict=True))
        goal = ratio["mix counts=sizes"]
        print(
            f"goal: mix within 10% of a single source: {goal:.2f}x -> "
            f"{'met' if goal >= 0.9 else 'OPEN'}; bound {'holds' if ok else 'BROKEN'}"
        )
        return 0 if ok else 1
    finally:
        shutil.rmtree(root, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--samples", type=int, default=60_000)
    ap.add_argument("--size", type=int, default=2000, help="mean bytes per sample")
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--quick", action="store_true", help="12,000 samples, 5 rounds")
    a = ap.parse_args(argv)
    if a.quick:
        a.samples, a.rounds = 12_000, 5
    return run(a.samples, a.size, a.rounds)


if __name__ == "__main__":
    sys.exit(main())
