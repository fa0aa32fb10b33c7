"""The cache directory's bound under concurrent writers in real processes (storage/cache.py)."""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from tarindex.storage.cache import DirCache
from tarindex.storage.cachetmp import temp_bytes

CHUNK = 1 << 20
WRITER = textwrap.dedent(
    """
    import hashlib, os, sys
    from tarindex.storage.cache import DirCache
    root, limit, who, n = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4])
    c = DirCache(root, limit)
    data = os.urandom(1 << 20)
    for i in range(n):
        c.put(hashlib.sha256(f"{who}-{i}".encode()).hexdigest(), "0", data)
    """
)


def _held(root: Path) -> int:
    """Bytes the cache holds now (entries and temp files), measured under its lock."""
    with open(root / "lock", "a+b") as lk:
        fcntl.flock(lk.fileno(), fcntl.LOCK_EX)
        try:
            return DirCache(str(root), 1 << 40).usage() + temp_bytes(str(root / "tmp"))
        finally:
            fcntl.flock(lk.fileno(), fcntl.LOCK_UN)


def test_concurrent_inserts_never_hold_more_than_the_limit(tmp_path: Path) -> None:
    """Issue 24's note: ``put`` wrote its temp file before taking the cache's lock, so four
    processes inserting 1 MiB chunks into a full 6 MiB cache held up to 4 MiB more between
    their writes and their commits. Each insert now reserves its room first."""
    root = tmp_path / "cache"
    limit = 6 * (CHUNK + 24) + 100
    DirCache(str(root), limit).put("00" * 32, "0", b"x")  # the directory and its lock file
    procs = [
        subprocess.Popen([sys.executable, "-c", WRITER, str(root), str(limit), str(w), "60"])
        for w in range(4)
    ]
    peak = 0
    try:
        while any(p.poll() is None for p in procs):
            peak = max(peak, _held(root))
            time.sleep(0.001)
    finally:
        for p in procs:
            p.wait(60)
    assert [p.returncode for p in procs] == [0] * 4
    assert peak <= limit, f"held {peak} bytes, the limit is {limit}"
    assert 0 < _held(root) <= limit
    assert not os.listdir(root / "tmp")
