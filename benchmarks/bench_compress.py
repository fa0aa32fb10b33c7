"""Compressed members: bytes on disk and read speed, in one run.

Two datasets, four ways of storing each:

- ``text``: one ~300-byte JSON member per sample, captions (sentences from the docstrings of
  Python's standard library) with LAION-like metadata (url, width, height, similarity,
  license).
- ``images``: one 8-bit grayscale image per sample, 32 x 32 ``uint8`` as ``.npy`` (1,152
  bytes), sklearn's handwritten digits upscaled and shifted (synthetic smooth images if
  sklearn is missing).

Ways: ``plain`` members; ``zstd`` (``ShardWriter(compress=(ext,))``, one frame per member);
``zstd+dict`` (``zstd_dict=True``: a dictionary trained per shard on its first 1,000
samples); ``whole-shard zstd`` (the plain tar through the ``zstd`` CLI at level 3: no random
access, read sequentially with ``tarfile`` over a zstd stream).

Reported per way: member payload bytes per sample, bytes on disk per sample (tar + index,
or the .tar.zst), random-access samples/s (``TarDataset(decode=True)[i]``, random ``i``; raw
``ds.raw(i)`` too), sequential decoded samples/s (``TarIterableDataset`` in one process, or
the tarfile stream). Ratios are against ``plain`` of the same run.

    python benchmarks/bench_compress.py [--quick] [--n N] [--root DIR]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import tempfile
import time
from typing import Any

import numpy as np

import tarindex
from tarindex.codecs.decode import ExtDecoder

PER_SHARD = 10_000


def sentences() -> list[str]:
    out: list[str] = []
    root = sysconfig.get_paths()["stdlib"]
    for d, _, files in sorted(os.walk(root)):
        if "test" in d or "site-packages" in d:
            continue
        for f in sorted(files):
            if not f.endswith(".py"):
                continue
            try:
                text = open(os.path.join(d, f), encoding="utf-8").read()
            except (OSError, UnicodeDecodeError):
                continue
            for m in re.finditer(r'"""(.*?)"""', text, re.S):
                for s in re.split(r"(?<=[.!?])\s+", " ".join(m.group(1).split())):
                    if 60 <= len(s) <= 220 and not any(c in s for c in "{}()[]=>_\\`"):
                        out.append(s)
    return out


def text_samples(n: int) -> list[dict[str, Any]]:
    sents = sentences()
    rng = np.random.default_rng(0)
    lic = ["CC-BY-4.0", "CC0-1.0", "CC-BY-SA-4.0", "unknown"]
    out = []
    for i in range(n):
        s = sents[int(rng.integers(len(sents)))]
        h = hashlib.md5(str(i).encode()).hexdigest()
        slug = re.sub("[^a-z0-9-]", "", "-".join(s.lower().split()[:4]))
        meta = {
            "caption": s,
            "url": f"https://images.example.com/{h[:2]}/{h[2:12]}/{slug}.jpg",
            "width": int(rng.integers(200, 2000)),
            "height": int(rng.integers(200, 2000)),
            "similarity": round(float(rng.uniform(0.28, 0.4)), 4),
            "license": lic[int(rng.integers(4))],
            "nsfw": "UNLIKELY",
        }
        out.append({"__key__": f"{i:09d}", "json": meta})
    return out


def image_samples(n: int) -> list[dict[str, Any]]:
    from PIL import Image

    rng = np.random.default_rng(1)
    try:
        from sklearn.datasets import load_digits  # type: ignore[import-untyped]

        base = [(im * (255 / 16)).astype(np.uint8) for im in load_digits().images]
        kind = "sklearn digits"
    except ImportError:  # smooth synthetic images
        yy, xx = np.mgrid[0:8, 0:8]
        base = [
            ((np.sin(xx * f) + np.cos(yy * f)) * 60 + 128).astype(np.uint8)
            for f in np.linspace(0.2, 1.5, 50)
        ]
        kind = "synthetic"
    out = []
    for i in range(n):
        im = Image.fromarray(base[i % len(base)]).resize((28, 28), Image.BILINEAR)
        a = np.zeros((32, 32), np.uint8)
        dy, dx = rng.integers(0, 5, 2)
        a[dy : dy + 28, dx : dx + 28] = np.asarray(im)
        out.append({"__key__": f"{i:09d}", "npy": a})
    print(f"images: {kind}, 32x32 uint8", file=sys.stderr)
    return out


def write(root: str, name: str, data: list[dict[str, Any]], **kw: Any) -> list[str]:
    d = os.path.join(root, name)
    shutil.rmtree(d, ignore_errors=True)
    with tarindex.ShardWriter(
        os.path.join(d, "s-%04d.tar"), maxcount=PER_SHARD, mtime=0, durable=False, **kw
    ) as w:
        for s in data:
            w.write(s)
    return w.paths


def disk(paths: list[str]) -> int:
    return sum(os.path.getsize(p) + os.path.getsize(p + ".tidx") for p in paths)


def payload(paths: list[str]) -> int:
    n = 0
    for p in paths:
        r = tarindex.ShardReader(p)
        n += int(r.index.size.sum())
        d = r.index.meta.get("zstd_dict")
        n += d["size"] if d else 0
    return n


def random_access(paths: list[str], order: np.ndarray, decode: bool, seconds: float) -> float:
    from tarindex.torch.dataset import TarDataset

    ds = TarDataset(paths, decode=True if decode else None)
    get = ds.__getitem__ if decode else ds.raw
    for i in order[:200].tolist():  # open the shards, warm the page cache
        get(i)
    t0 = time.perf_counter()
    k = 0
    for i in order.tolist():
        get(i)
        k += 1
        if k % 512 == 0 and time.perf_counter() - t0 > seconds:
            break
    return k / (time.perf_counter() - t0)


def sequential(paths: list[str]) -> float:
    it = tarindex.TarIterableDataset(paths, shuffle=False, decode=True)
    t0 = time.perf_counter()
    n = sum(1 for _ in it)
    return n / (time.perf_counter() - t0)


def whole_shard(plain: list[str], root: str, ext: str) -> tuple[int, float, str]:
    """Size of the plain shards through ``zstd -3`` (or the module), and a sequential read."""
    import zstandard

    outs = []
    how = "zstd CLI -3"
    for p in plain:
        z = p + ".zst"
        if shutil.which("zstd"):
            subprocess.run(["zstd", "-q", "-f", "-3", p, "-o", z], check=True)
        else:
            how = "zstandard module, level 3"
            with open(p, "rb") as f, open(z, "wb") as g:
                zstandard.ZstdCompressor(level=3).copy_stream(f, g)
        outs.append(z)
    size = sum(os.path.getsize(z) for z in outs)
    dec = ExtDecoder()
    t0 = time.perf_counter()
    n = 0
    for z in outs:
        with open(z, "rb") as f, zstandard.ZstdDecompressor().stream_reader(f) as r:
            with tarfile.open(fileobj=r, mode="r|") as tf:
                for m in tf:
                    fo = tf.extractfile(m)
                    if fo is None or not m.name.endswith("." + ext):
                        continue
                    dec({"__key__": m.name, ext: fo.read()})
                    n += 1
    return size, n / (time.perf_counter() - t0), how


def run_dataset(
    name: str, ext: str, data: list[dict[str, Any]], root: str, seconds: float
) -> list[dict[str, Any]]:
    n = len(data)
    order = np.random.default_rng(2).permutation(n)
    ways = {
        "plain": write(root, f"{name}-plain", data),
        "zstd": write(root, f"{name}-zstd", data, compress=(ext,)),
        "zstd+dict": write(root, f"{name}-dict", data, compress=(ext,), zstd_dict=True),
    }
    rows = [
        {"data": name, "way": way, "payload": payload(p) / n, "disk": disk(p) / n}
        for way, p in ways.items()
    ]
    for _ in range(2):  # two rounds, interleaved; the best of each (the machine is shared)
        for row, paths in zip(rows, ways.values(), strict=True):
            for k, f in (
                ("ra_decoded", lambda p: random_access(p, order, True, seconds)),
                ("ra_raw", lambda p: random_access(p, order, False, seconds)),
                ("seq_decoded", sequential),
            ):
                row[k] = max(row.get(k, 0.0), f(paths))
    size, seq, how = whole_shard(ways["plain"], root, ext)
    rows.append(
        {
            "data": name,
            "way": f"whole-shard zstd ({how})",
            "payload": None,
            "disk": size / n,
            "ra_decoded": None,
            "ra_raw": None,
            "seq_decoded": seq,
        }
    )
    return rows


def fmt(x: float | None, digits: int = 0) -> str:
    return "-" if x is None else f"{x:,.{digits}f}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="5,000 samples, 2 s per timing")
    ap.add_argument("--n", type=int, default=None, help="samples per dataset (default 50,000)")
    ap.add_argument("--root", default=None, help="scratch directory (default: a temp dir)")
    ap.add_argument("--json", default=None, help="also write the rows to this JSON file")
    args = ap.parse_args()
    n = args.n or (5_000 if args.quick else 50_000)
    seconds = 1.0 if args.quick else 3.0
    root = args.root or tempfile.mkdtemp(prefix="bench_compress-")
    rows: list[dict[str, Any]] = []
    try:
        rows += run_dataset("text", "json", text_samples(n), root, seconds)
        rows += run_dataset("images", "npy", image_samples(n), root, seconds)
    finally:
        if args.root is None:
            shutil.rmtree(root, ignore_errors=True)
    print(
        f"\n{n:,} samples per dataset, {PER_SHARD:,} per shard; ratios against plain of the same run\n"
    )
    head = (
        "| data | way | payload B/sample | on disk B/sample | random access decoded /s | "
        "vs plain | random access raw /s | sequential decoded /s |"
    )
    print(head)
    print("|---|---|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        base = next(b for b in rows if b["data"] == r["data"] and b["way"] == "plain")
        ratio = "-" if r["ra_decoded"] is None else f"{r['ra_decoded'] / base['ra_decoded']:.2f}x"
        print(
            f"| {r['data']} | {r['way']} | {fmt(r['payload'])} | {fmt(r['disk'])} | "
            f"{fmt(r['ra_decoded'])} | {ratio} | {fmt(r['ra_raw'])} | {fmt(r['seq_decoded'])} |"
        )
    for data in ("text", "images"):
        z = next(r for r in rows if r["data"] == data and r["way"] == "zstd")
        d = next(r for r in rows if r["data"] == data and r["way"] == "zstd+dict")
        p = next(r for r in rows if r["data"] == data and r["way"] == "plain")
        print(
            f"\n{data}: dictionary payload {z['payload'] / d['payload']:.2f}x smaller than plain "
            f"zstd (goal >= 2 on text); random access with the dictionary at "
            f"{d['ra_decoded'] / p['ra_decoded']:.2f}x plain's samples/s (goal >= 0.5); on disk "
            f"{p['disk'] / d['disk']:.2f}x smaller than plain"
        )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
