"""Datasets at scale: opening many shards with and without a manifest, key lookups, splits.

One run, warm page cache, each measurement in a fresh child process (memory from its own
``tracemalloc`` peak and ``ru_maxrss``):

* **open**: ``ShardSet(source)`` over 1k / 10k / 100k synthetic shards (hard links of one real
  3-sample shard and its index, so generating 100k costs seconds), from the directory (one
  index header read per shard) and from a manifest (one read); also the time to write the
  manifest (every shard opened once) and ``len()`` of a ``TarIterableDataset`` over it.
* **lookup**: ``ShardReader.find_key`` on one shard, ``ShardSet.index_of`` over many shards (the
  first call joins their key tables), absent keys, an old index without the key table (computed
  on first use); against a Python ``dict`` of every key (its build time and memory): the ratio
  is what the key table costs or saves.
* **split**: ``split_by_key`` over every sample (keys read from the indexes, hashed together).

Usage: ``python benchmarks/bench_scale.py [--quick] [--root DIR]``. ``--quick``: 1k and 10k
shards, 200k samples for lookups; full: 1k / 10k / 100k shards and 1M samples.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from typing import Any

import tarindex

HERE = os.path.dirname(os.path.abspath(__file__))


def make_many(root: str, n: int) -> str:
    """``n`` shards in ``root/many-n`` (hard links of one 3-sample shard) and a manifest."""
    d = os.path.join(root, f"many-{n}")
    m = os.path.join(d, "data.json")
    if os.path.exists(m):
        return d
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(d)
    one = os.path.join(root, "one.tar")
    if not os.path.exists(one + ".tidx"):
        with tarindex.ShardWriter(one, maxcount=10, durable=False, seed=0) as w:
            for i in range(3):
                w.write({"__key__": f"{i:04d}", "cls": i})
    for k in range(n):
        p = os.path.join(d, f"s-{k:06d}.tar")
        src = f"{one}.{k // 50_000}"  # a filesystem allows ~65k links per file: one copy each
        if not os.path.exists(src + ".tidx"):
            shutil.copyfile(one, src)
            shutil.copyfile(one + ".tidx", src + ".tidx")
        os.link(src, p)
        os.link(src + ".tidx", p + ".tidx")
    return d


def make_keyed(root: str, n: int, per: int) -> str:
    """``n`` samples with unique keys in shards of ``per`` (real writes), one directory."""
    d = os.path.join(root, f"keyed-{n}-{per}")
    if os.path.exists(os.path.join(d, "done")):
        return d
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(d)
    with tarindex.ShardWriter(os.path.join(d, "k-%06d.tar"), maxcount=per, durable=False) as w:
        for i in range(n):
            w.write({"__key__": f"img/{i * 7919 % (10 * n):09d}", "cls": b"1"})
    open(os.path.join(d, "done"), "w").close()
    return d


CHILD = r"""
import gc, json, os, resource, sys, time, tracemalloc
import numpy as np
import tarindex
from tarindex.read.split import split_by_key
job = json.loads(sys.argv[1])
gc.freeze()
out = {}
kind = job["kind"]
if kind == "open":
    t = time.perf_counter()
    ss = tarindex.ShardSet(job["source"])
    out["s"] = time.perf_counter() - t
    del ss
    gc.collect()
    tracemalloc.start()  # memory from a second construction (tracemalloc slows allocations)
    ss = tarindex.ShardSet(job["source"])
    out["peak_mb"] = tracemalloc.get_traced_memory()[1] / 2**20
    out["kept_mb"] = tracemalloc.get_traced_memory()[0] / 2**20
    tracemalloc.stop()
    out["n"] = len(ss)
    if job.get("iterable"):
        import tarindex.torch.iterable as it
        t = time.perf_counter()
        ds = it.TarIterableDataset(job["source"], rank=0, world_size=1)
        out["iter_len"] = len(ds)
        out["iter_s"] = time.perf_counter() - t
elif kind == "manifest":
    t = time.perf_counter()
    tarindex.write_manifest(job["source"], job["out"])
    out["s"] = time.perf_counter() - t
elif kind == "lookup":
    ss = tarindex.ShardSet(job["source"])
    rng = np.random.default_rng(0)
    t = time.perf_counter()
    keys = []
    for s in range(ss.n_shards):
        keys.extend(ss.reader(s).read_block(0, ss.reader(s).n_samples, data=False).keys)
    out["keys_read_s"] = time.perf_counter() - t
    probe = [keys[i] for i in rng.integers(0, len(keys), job["probes"]).tolist()]
    absent = [k + "x" for k in probe[: job["probes"] // 4]]
    if job["where"] == "reader":
        r = ss.reader(0)
        probe = [keys[i] for i in rng.integers(0, r.n_samples, job["probes"]).tolist()]
        t = time.perf_counter(); r.key_table(); out["table_s"] = time.perf_counter() - t
        t = time.perf_counter(); hits = [r.find_key(k) for k in probe]; dt = time.perf_counter() - t
        out["per_s"] = len(probe) / dt
        t = time.perf_counter(); miss = [r.find_key(k) for k in absent]; dt = time.perf_counter() - t
        out["absent_per_s"] = len(absent) / dt
        assert None not in hits and set(miss) == {None}
        out["record"] = r.index.key_hash is not None
    else:
        t = time.perf_counter(); ss.indices_of(probe[0]); out["table_s"] = time.perf_counter() - t
        ss2 = tarindex.ShardSet(job["source"])  # the joined table's memory, shards already open
        for s in range(ss2.n_shards):
            ss2.reader(s).key_table()
        tracemalloc.start()
        ss2.indices_of(probe[0])
        out["table_mb"] = tracemalloc.get_traced_memory()[1] / 2**20
        tracemalloc.stop()
        del ss2
        t = time.perf_counter(); hits = [ss.index_of(k) for k in probe]; dt = time.perf_counter() - t
        out["per_s"] = len(probe) / dt
        t = time.perf_counter(); miss = [ss.indices_of(k) for k in absent]; dt = time.perf_counter() - t
        out["absent_per_s"] = len(absent) / dt
        assert all(miss == [] for miss in miss)
        t = time.perf_counter(); many = ss.index_of_many(probe); dt = time.perf_counter() - t
        out["many_per_s"] = len(probe) / dt
        assert many.tolist() == hits
        # the baseline: a dict of every key (what a per-sample index costs)
        tracemalloc.start()
        t = time.perf_counter(); d = {k: i for i, k in enumerate(keys)}
        out["dict_build_s"] = time.perf_counter() - t
        out["dict_mb"] = tracemalloc.get_traced_memory()[0] / 2**20
        tracemalloc.stop()
        t = time.perf_counter(); got = [d[k] for k in probe]; dt = time.perf_counter() - t
        out["dict_per_s"] = len(probe) / dt
        assert got == hits
    out["n"] = len(ss)
elif kind == "split":
    ss = tarindex.ShardSet(job["source"])
    t = time.perf_counter()
    parts = split_by_key(ss, {"train": 0.8, "val": 0.1, "test": 0.1}, seed=0)
    out["s"] = time.perf_counter() - t
    out["sizes"] = {k: len(v) for k, v in parts.items()}
    out["n"] = len(ss)
out["rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
print(json.dumps(out))
"""


def child(job: dict[str, Any]) -> dict[str, Any]:
    """Run one measurement in a fresh interpreter; return its JSON result."""
    res = subprocess.run(
        [sys.executable, "-c", CHILD, json.dumps(job)], capture_output=True, text=True, check=False
    )
    if res.returncode != 0:
        raise RuntimeError(f"child {job} failed:\n{res.stderr[-3000:]}")
    return dict(json.loads(res.stdout.strip().splitlines()[-1]))


def strip_key_tables(d: str) -> str:
    """A copy of directory ``d`` whose indexes are format 1.1 (no key table record)."""
    from tarindex.format.index import decode_index, encode_index

    out = d + "-v11"
    if os.path.exists(os.path.join(out, "done")):
        return out
    shutil.rmtree(out, ignore_errors=True)
    os.makedirs(out)
    for name in sorted(os.listdir(d)):
        src = os.path.join(d, name)
        if name.endswith(".tar"):
            os.link(src, os.path.join(out, name))
            with open(src + ".tidx", "rb") as f:
                raw = f.read()
            with open(os.path.join(out, name + ".tidx"), "wb") as f:
                f.write(encode_index(decode_index(raw), key_table=False))
    open(os.path.join(out, "done"), "w").close()
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="1k and 10k shards, 200k samples")
    ap.add_argument("--root", default=None, help="data directory (default: a temp dir)")
    args = ap.parse_args(argv)
    root = args.root or tempfile.mkdtemp(prefix="bench_scale-")
    os.makedirs(root, exist_ok=True)
    sizes = [1_000, 10_000] if args.quick else [1_000, 10_000, 100_000]
    rows = []
    print(f"# open ({'quick' if args.quick else 'full'} mode, warm cache, data in {root})")
    print(
        "| shards | write manifest | open dir | open manifest | ratio | peak MB dir "
        "| peak MB manifest | TarIterableDataset + len (manifest) |"
    )
    print("|---:|---:|---:|---:|---:|---:|---:|---:|")
    for n in sizes:
        d = make_many(root, n)
        m = os.path.join(d, "data.json")
        if not os.path.exists(m):
            wm = child({"kind": "manifest", "source": d, "out": m})["s"]
        else:
            wm = float("nan")  # made by an earlier run (--root): not timed
        child({"kind": "open", "source": d})  # warm the page cache of every index
        a = child({"kind": "open", "source": d})
        b = child({"kind": "open", "source": m, "iterable": True})
        assert a["n"] == b["n"] == 3 * n
        rows.append((n, wm, a, b))
        print(
            f"| {n:,} | {wm:.2f} s | {a['s'] * 1e3:.1f} ms | {b['s'] * 1e3:.1f} ms | "
            f"{a['s'] / b['s']:.1f}x | {a['peak_mb']:.1f} | {b['peak_mb']:.1f} | "
            f"{b['iter_s'] * 1e3:.1f} ms |",
            flush=True,
        )
    n_keys, per = (200_000, 100_000) if args.quick else (1_000_000, 100_000)
    cached = os.path.exists(os.path.join(root, f"keyed-{n_keys}-{per}", "done"))
    t = time.perf_counter()
    kd = make_keyed(root, n_keys, per)
    print(
        f"\n# key lookup ({n_keys:,} samples in {n_keys // per} shards; written in "(
            f"{time.perf_counter() - t:.1f} s)" if not cached else "an earlier run)"
        )
    )
    probes = 20_000
    r1 = child(
        {
            "kind": "lookup",
            "source": sorted(os.path.join(kd, f) for f in os.listdir(kd) if f.endswith(".tar"))[0],
            "where": "reader",
            "probes": probes,
        }
    )
    old = strip_key_tables(kd)
    r0 = child(
        {
            "kind": "lookup",
            "source": sorted(os.path.join(old, f) for f in os.listdir(old) if f.endswith(".tar"))[
                0
            ],
            "where": "reader",
            "probes": probes,
        }
    )
    rs = child({"kind": "lookup", "source": kd, "where": "set", "probes": probes})
    print("| what | table ready | lookups/s | absent keys/s | notes |")
    print("|---|---:|---:|---:|---|")
    print(
        f"| ShardReader.find_key, 1.2 index ({per:,} samples) | {r1['table_s'] * 1e3:.1f} ms | "
        f"{r1['per_s']:,.0f} | {r1['absent_per_s']:,.0f} | KHSH record |"
    )
    print(
        f"| ShardReader.find_key, 1.1 index ({per:,} samples) | {r0['table_s'] * 1e3:.1f} ms | "
        f"{r0['per_s']:,.0f} | {r0['absent_per_s']:,.0f} | table computed on first use |"
    )
    print(
        f"| ShardSet.index_of ({n_keys:,} samples) | {rs['table_s'] * 1e3:.0f} ms | "
        f"{rs['per_s']:,.0f} | {rs['absent_per_s']:,.0f} | joined table peak "
        f"{rs['table_mb']:.1f} MB |"
    )
    print(
        f"| ShardSet.index_of_many ({n_keys:,} samples, {probes:,} keys per call) | (same) | "
        f"{rs['many_per_s']:,.0f} | | vectorised hashing and search |"
    )
    print(
        f"| dict of every key (baseline) | {rs['dict_build_s'] * 1e3:.0f} ms | "
        f"{rs['dict_per_s']:,.0f} | | {rs['dict_mb']:.1f} MB; reading the keys took "
        f"{rs['keys_read_s'] * 1e3:.0f} ms more |"
    )
    print(
        f"\nindex_of / dict lookups: {rs['per_s'] / rs['dict_per_s']:.2f}x; index_of_many / dict: "
        f"{rs['many_per_s'] / rs['dict_per_s']:.2f}x; table memory / dict memory: "
        f"{rs['table_mb'] / rs['dict_mb']:.2f}x; table ready / dict ready (keys read + dict "
        f"built): {rs['table_s'] / (rs['dict_build_s'] + rs['keys_read_s']):.2f}x"
    )
    sp = child({"kind": "split", "source": kd})
    print(
        f"\n# split_by_key over {sp['n']:,} samples: {sp['s']:.2f} s "
        f"({sp['n'] / sp['s'] / 1e6:.2f} M keys/s), parts {sp['sizes']}"
    )
    if args.root is None:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
