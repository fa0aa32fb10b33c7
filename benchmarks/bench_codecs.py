"""Codec speed: tarindex against webdataset on the same data, one run, ratios printed.

Sections (one function each, ``SECTIONS`` maps a name to it; add yours there):

* ``decode``: image decode throughput for the ``rgb8`` and ``torchrgb8`` specs (and the
  float ``rgb``), on the same seeded JPEGs: webdataset's decoder
  (``autodecode.Decoder([imagehandler(spec)])``, what ``.decode(spec)`` runs) against
  tarindex's (``ExtDecoder(spec)``, what ``decode=spec`` runs), each called on the same
  sample dicts in one process; next to the limit, Pillow's JPEG decode alone
  (``Image.open(...).load()``, no conversion to an array), which every decoder pays. Then the
  same specs end to end over one shard in one process: ``WebDataset(tar).decode(spec)``
  against ``TarIterableDataset(tar, shuffle=False, decode=spec)`` (read + group + decode).
  Last, samples of three small members (``cls``, ``txt``, ``json``) through the built-in
  decoders of both. Rounds are interleaved (every contender once per round) and the best round is reported,
  in CPU seconds of the one thread that runs them all (``time.thread_time``), so load from
  other processes on a shared machine does not enter the ratios. Warm page cache.

Usage: ``python benchmarks/bench_codecs.py [--quick] [--sections decode] [--root DIR]``.
"""

from __future__ import annotations

import argparse
import gc
import io
import os
import shutil
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np


@dataclass
class Row:
    """One measured line: ``rate`` items per second (best round)."""

    section: str
    case: str
    contender: str
    rate: float
    mb_s: float
    note: str = ""


# -- data -----------------------------------------------------------------------------------


def photo_jpegs(n: int, h: int, w: int, seed: int = 0, quality: int = 90) -> list[bytes]:
    """``n`` seeded photo-like JPEGs (gradients, blobs, noise) of ``h x w`` RGB pixels."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:h, 0:w].astype(np.float32)
    out = []
    for _ in range(n):
        img = np.zeros((h, w, 3), np.float32)
        for c in range(3):
            a, b, p = rng.uniform(-1, 1, 3)
            img[:, :, c] = 128 + 60 * np.sin(a * x / 23 + b * y / 17 + p * 6)
        for _ in range(6):  # soft blobs
            cy, cx, r = rng.uniform(0, h), rng.uniform(0, w), rng.uniform(8, h / 3)
            blob = np.exp(-((y - cy) ** 2 + (x - cx) ** 2) / (2 * r * r))
            img += blob[:, :, None] * rng.uniform(-90, 90, 3)
        img += rng.normal(0, 8, img.shape)
        buf = io.BytesIO()
        Image.fromarray(np.clip(img, 0, 255).astype(np.uint8)).save(
            buf, format="JPEG", quality=quality
        )
        out.append(buf.getvalue())
    return out


def _best(fns: dict[str, Callable[[], int]], rounds: int) -> dict[str, float]:
    """Best CPU seconds of this thread per contender over ``rounds`` interleaved rounds.

    CPU time (``time.thread_time``), not wall time: the machine is shared, and every
    contender here runs in this one thread (Pillow decodes in the calling thread), so other
    processes' load does not enter the ratio.
    """
    best = {k: float("inf") for k in fns}
    for _ in range(rounds):
        for k, f in fns.items():
            t0 = time.thread_time()
            f()
            best[k] = min(best[k], time.thread_time() - t0)
    return best


# -- decode ---------------------------------------------------------------------------------


def bench_decode(args: argparse.Namespace) -> list[Row]:
    """Image decode throughput, tarindex vs webdataset, rgb8 / torchrgb8 / rgb."""
    import torch  # noqa: F401  (imported before timing: the torch specs use it)
    import webdataset as wds
    from PIL import Image

    import tarindex
    from tarindex.codecs.decode import ExtDecoder

    n, (h, w) = (120, (240, 320)) if args.quick else (400, (384, 512))
    rounds = 5 if args.quick else 7
    jpegs = photo_jpegs(n, h, w)
    mb = sum(map(len, jpegs)) / 1e6
    samples = [{"__key__": f"{i:06d}", "jpg": d} for i, d in enumerate(jpegs)]
    root = tempfile.mkdtemp(prefix="bench_codecs_", dir=args.root)
    try:
        with tarindex.ShardWriter(os.path.join(root, "img-%06d.tar"), maxcount=n) as sink:
            for s in samples:
                sink.write(s)
        shard = os.path.join(root, "img-000000.tar")
        with open(shard, "rb") as f:  # warm the page cache
            while f.read(1 << 20):
                pass
        gc.collect()
        gc.freeze()

        def pillow() -> int:
            for d in jpegs:
                Image.open(io.BytesIO(d), formats=["JPEG"]).load()
            return n

        rows: list[Row] = []
        specs = ("rgb8", "torchrgb8") if args.quick else ("rgb8", "torchrgb8", "rgb")
        for spec in specs:
            theirs = wds.autodecode.Decoder([wds.autodecode.imagehandler(spec)])
            ours = ExtDecoder(spec)
            # the same values, checked once before timing
            a, b = theirs(dict(samples[0]))["jpg"], ours(dict(samples[0]))["jpg"]
            assert type(a) is type(b) and np.array_equal(np.asarray(a), np.asarray(b)), spec

            def run(dec: Callable[[dict[str, Any]], Any]) -> Callable[[], int]:
                def f() -> int:
                    for s in samples:
                        dec(dict(s))
                    return n

                return f

            def stream_wds(spec: str = spec) -> int:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    return sum(1 for _ in wds.WebDataset(shard, shardshuffle=False).decode(spec))

            def stream_ours(spec: str = spec) -> int:
                ds = tarindex.TarIterableDataset(shard, shuffle=False, decode=spec)
                return sum(1 for _ in ds)

            got = _best(
                {
                    "pillow": pillow,
                    "wds": run(theirs),
                    "ours": run(ours),
                    "wds stream": stream_wds,
                    "ours stream": stream_ours,
                },
                rounds,
            )
            limit = n / got["pillow"]
            for k, name in (
                ("pillow", "Pillow JPEG decode alone (limit)"),
                ("wds", "webdataset Decoder([imagehandler])"),
                ("ours", "tarindex ExtDecoder"),
                ("wds stream", "webdataset WebDataset(tar).decode(spec)"),
                ("ours stream", "tarindex TarIterableDataset(decode=spec)"),
            ):
                rate = n / got[k]
                if k.startswith("ours"):
                    peer = n / got[k.replace("ours", "wds")]
                    note = f"{rate / peer:.2f}x webdataset, {rate / limit:.2f} of the limit"
                elif k != "pillow":
                    note = f"{rate / limit:.2f} of the limit"
                else:
                    note = f"{n} JPEGs {w}x{h}, {mb / n * 1e3:.0f} KB each"
                rows.append(Row("decode", spec, name, rate, mb * rate / n, note))
        # small members: a caption-with-metadata sample (cls, txt, json), the built-ins only
        rng = np.random.default_rng(1)
        small = [
            {
                "__key__": f"{i:06d}",
                "cls": str(i % 1000).encode(),
                "txt": ("a photo of " + "x" * int(rng.integers(20, 120))).encode(),
                "json": (
                    f'{{"id": {i}, "width": 512, "height": 384, "tags": ["a", "b"], '
                    f'"score": {rng.random():.4f}}}'
                ).encode(),
            }
            for i in range(2000 if args.quick else 20000)
        ]
        nb = sum(len(v) for s in small for k, v in s.items() if k != "__key__") / 1e6
        theirs = wds.autodecode.Decoder([wds.autodecode.imagehandler("rgb8")])
        ours = ExtDecoder("rgb8")

        def small_run(dec: Callable[[dict[str, Any]], Any]) -> Callable[[], int]:
            def f() -> int:
                for s in small:
                    dec(dict(s))
                return len(small)

            return f

        got = _best({"wds": small_run(theirs), "ours": small_run(ours)}, rounds)
        m = len(small)
        rows.append(
            Row(
                "decode",
                "cls+txt+json",
                "webdataset Decoder (default handlers)",
                m / got["wds"],
                nb / got["wds"],
                f"{m} samples of 3 small members, {nb / m * 1e6:.0f} B each",
            )
        )
        rows.append(
            Row(
                "decode",
                "cls+txt+json",
                "tarindex ExtDecoder (built-ins)",
                m / got["ours"],
                nb / got["ours"],
                f"{got['wds'] / got['ours']:.2f}x webdataset",
            )
        )
        return rows
    finally:
        shutil.rmtree(root, ignore_errors=True)


SECTIONS: dict[str, Callable[[argparse.Namespace], list[Row]]] = {"decode": bench_decode}
"""Section name -> function(args) -> rows; ``--sections`` picks some (default: all)."""


def print_table(rows: list[Row]) -> None:
    print("| section | case | contender | items/s | MB/s | note |")
    print("|---|---|---|---:|---:|---|")
    for r in rows:
        print(
            f"| {r.section} | {r.case} | {r.contender} | {r.rate:,.0f} | {r.mb_s:,.1f} | {r.note} |"
        )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="small data, fewer rounds (CI smoke)")
    p.add_argument("--sections", default=",".join(SECTIONS), help="comma-separated sections")
    p.add_argument("--root", default=None, help="scratch directory (default: system temp)")
    args = p.parse_args(argv)
    rows: list[Row] = []
    for name in args.sections.split(","):
        if name not in SECTIONS:
            p.error(f"unknown section {name!r}: choose from {', '.join(SECTIONS)}")
        t0 = time.perf_counter()
        rows += SECTIONS[name](args)
        print(f"# {name}: {time.perf_counter() - t0:.1f} s", file=sys.stderr)
    print_table(rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
