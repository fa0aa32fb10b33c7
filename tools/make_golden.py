"""Make tests/golden/vX/: a tiny shard and its index. Run once per format version; never edit.

    python tools/make_golden.py tests/golden/v1.3

v1 was made by tarindex 0.1.0 (format 1.0); v1.1 by format 1.1 (shard id from ``seed=0``, so
a re-run gives the same bytes); v1.2 by format 1.2 (the KHSH key table, FORMAT.md §2.8.3);
v1.3 by format 1.3 (also ``tiny.tar.gz``, the same tar gzip-compressed with mtime 0, and its
index with the GZIX record, FORMAT.md §2.8.4, §10).
"""

from __future__ import annotations

import gzip
import sys

import tarindex


def main(out: str) -> None:
    with tarindex.ShardWriter(f"{out}/tiny.tar", maxcount=100, mtime=1_700_000_000, seed=0) as w:
        for i in range(5):
            w.write({"__key__": f"s{i:03d}", "txt": f"golden {i}", "cls": i, "bin": bytes(range(i * 7))})
        w.write({"__key__": "dir/" + "long" * 30, "txt": "a long name"})
    with open(f"{out}/tiny.tar", "rb") as f:
        data = f.read()
    with open(f"{out}/tiny.tar.gz", "wb") as f:
        f.write(gzip.compress(data, 9, mtime=0))
    tarindex.build_index(f"{out}/tiny.tar.gz", gzip_spacing=1 << 16)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "tests/golden/v1.3")
