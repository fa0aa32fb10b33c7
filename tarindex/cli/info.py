"""``tarindex info``: shards, samples, members, extensions (counts) and bytes.

``tar bytes`` are those of the tar, decompressed for a compressed shard (FORMAT.md §10, §11);
``gzip bytes`` and ``zstd/xz/... bytes`` (only when there are such shards) are their
compressed sizes.
"""

from __future__ import annotations

import argparse
import json
import os
from collections import Counter

import numpy as np

from ..format.packed import packed_of
from ..format.url import is_url
from ..storage.remote import load_indexes
from .common import EXIT_OK, blocks, each_reader

__all__ = ["command", "human"]


def human(n: float) -> str:
    """A byte count for people: ``"512 B"``, ``"1.5 KiB"``, ... ``"2.0 TiB"``."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def command(args: argparse.Namespace) -> int:
    """Print the totals of every shard of the sources (``--json``: one JSON object)."""
    n_shards = n_samples = n_members = data_bytes = tar_bytes = index_bytes = 0
    n_gzip = gzip_bytes = 0
    packed: Counter[str] = Counter()  # compressed bytes of zstd/xz/bzip2/lz4 shards, by format
    n_packed: Counter[str] = Counter()
    exts: Counter[str] = Counter()
    for p, r in each_reader(args.sources, args):
        n_shards += 1
        counts = np.zeros(len(r.exts), np.int64)
        for blk in blocks(r):
            counts += np.bincount(blk.ext_id, minlength=len(r.exts))
            data_bytes += int(blk.size.sum())
            n_members += len(blk.ext_id)
        n_samples += r.n_samples
        tar_bytes += r.tar_size
        gz = r.index.gzip
        if gz is not None:
            n_gzip += 1
            gzip_bytes += gz.gz_size
        pf = packed_of(r.index.meta, r.index_path)
        if pf is not None:
            n_packed[pf.format] += 1
            packed[pf.format] += pf.size
        index_bytes += (
            len(load_indexes([r.index_path], [p])[0][0])
            if is_url(r.index_path)
            else os.path.getsize(r.index_path)
        )
        for name, c in zip(r.exts, counts.tolist(), strict=True):
            exts[name] += c
    info = {
        "shards": n_shards,
        "samples": n_samples,
        "members": n_members,
        "extensions": dict(sorted(exts.items())),
        "data_bytes": data_bytes,
        "tar_bytes": tar_bytes,
        "index_bytes": index_bytes,
        "gzip_shards": n_gzip,
        "gzip_bytes": gzip_bytes,
        "compressed_shards": dict(sorted(n_packed.items())),
        "compressed_bytes": dict(sorted(packed.items())),
    }
    if args.json:
        print(json.dumps(info, indent=2))
        return EXIT_OK
    print(f"shards:      {n_shards}")
    print(f"samples:     {n_samples}")
    print(f"members:     {n_members}")
    print("extensions:  " + (", ".join(f"{e} ({c})" for e, c in sorted(exts.items())) or "-"))
    print(f"data bytes:  {data_bytes} ({human(data_bytes)}, member contents)")
    print(f"tar bytes:   {tar_bytes} ({human(tar_bytes)})")
    if n_gzip:
        print(
            f"gzip bytes:  {gzip_bytes} ({human(gzip_bytes)}, compressed, {n_gzip} gzip shard(s); "
            f"their tar bytes are decompressed)"
        )
    for fmt, n in sorted(packed.items()):
        print(
            f"{fmt} bytes:{' ' * max(1, 6 - len(fmt))}{n} ({human(n)}, compressed, "
            f"{n_packed[fmt]} {fmt} shard(s), read through decompressed copies)"
        )
    print(f"index bytes: {index_bytes} ({human(index_bytes)})")
    return EXIT_OK
