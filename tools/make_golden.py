"""Make tests/golden/vX/: a tiny shard and its index. Run once per format version; never edit.

    python tools/make_golden.py tests/golden/v1.2

v1 was made by tarindex 0.1.0 (format 1.0); v1.1 by format 1.1 (shard id from ``seed=0``, so
a re-run gives the same bytes); v1.2 by format 1.2 (the KHSH key table, FORMAT.md §2.8.3).
"""

from __future__ import annotations

import sys

import tarindex


def main(out: str) -> None:
    with tarindex.ShardWriter(f"{out}/tiny.tar", maxcount=100, mtime=1_700_000_000, seed=0) as w:
        for i in range(5):
            w.write({"__key__": f"s{i:03d}", "txt": f"golden {i}", "cls": i, "bin": bytes(range(i * 7))})
        w.write({"__key__": "dir/" + "long" * 30, "txt": "a long name"})


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "tests/golden/v1.2")
