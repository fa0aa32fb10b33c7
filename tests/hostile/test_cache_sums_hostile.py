"""Hostile writers against the cache's checksums (storage/sums.py, 5636dc8).

A process remembers that an entry passed its check while the file's ``ctime`` stays the same.
Another process can change a file's bytes without changing its ``ctime``: a write through a
shared writable mapping faults (and stamps ``ctime``) only on a clean page, and on this
machine's ext4 no later store stamps it again. A bytes entry (a chunk of a remote tar, an
index) remembered so was served with the bytes changed since, unchecked: silent wrong bytes.
Its bytes are read whole on every get anyway, so their crc32 is now checked on every get.
"""

from __future__ import annotations

import os
import re
import struct
import subprocess
import sys
import textwrap
import time
import tracemalloc
import warnings
import zlib
from pathlib import Path

import pytest

from tarindex.storage import sums
from tarindex.storage.cache import DirCache

KEY = "5f" + "0123456789abcdef" * 3 + "0123456789abcd"  # an entry key: a hex digest
WRITER = textwrap.dedent(
    """
    import mmap, os, sys, time
    fd = os.open(sys.argv[1], os.O_RDWR)
    m = mmap.mmap(fd, os.fstat(fd).st_size)
    m[100:101] = m[100:101]  # dirty the page with the same byte: ctime stamped now
    print("ready", flush=True)
    sys.stdin.readline()  # the reader checked and remembered the entry meanwhile
    m[100:101] = bytes([m[100] ^ 0x40])  # the same page, another byte: no fault, no ctime
    print("written", flush=True)
    sys.stdin.readline()
    """
)


def test_bytes_changed_through_a_shared_mapping_are_never_served(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sums, "RACY_S", 0.2)  # a pass is remembered 0.2 s after the ctime
    cache = DirCache(str(tmp_path / "cache"), 1 << 30)
    data = bytes(range(256)) * 64
    assert cache.put(KEY, "chunk-0", data)
    path = cache.path(KEY, "chunk-0")
    w = subprocess.Popen(
        [sys.executable, "-c", WRITER, path],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert w.stdout is not None and w.stdin is not None
        assert w.stdout.readline() == "ready\n"
        time.sleep(0.5)  # the ctime the writer's first store stamped is now over RACY_S old
        ctime = os.stat(path).st_ctime_ns
        assert cache.get(KEY, "chunk-0") == data  # checked, remembered
        w.stdin.write("go\n")
        w.stdin.flush()
        assert w.stdout.readline() == "written\n"
        if os.stat(path).st_ctime_ns != ctime:
            pytest.skip("this filesystem stamps ctime on every store through a mapping")
        with pytest.warns(RuntimeWarning, match="failed its check"):
            got = cache.get(KEY, "chunk-0")
        assert got is None, "bytes changed under the cache were served"
    finally:
        w.kill()
        w.wait()


@pytest.mark.parametrize("how", ["grown past its record", "its record says the planted length"])
def test_a_planted_huge_entry_is_refused_without_being_read(tmp_path: Path, how: str) -> None:
    """A cached index is read by ``get`` without an expected size: a file of 64 MiB (sparse)
    planted in its place was read whole before its record was looked at (and one larger than
    memory would have failed the read). Its record's length, and the cache's bound, are now
    checked first: refused and deleted, with the warning, after reading 24 bytes."""
    big = 64 << 20
    # grown past its record: the record refuses it, within a cache that could hold it
    c = DirCache(str(tmp_path / "cache"), 1 << 30 if how == "grown past its record" else 1 << 20)
    assert c.put(KEY, "tidx", b"an index" * 100)
    p = c.path(KEY, "tidx")
    if how == "its record says the planted length":  # a sound record: the cache's bound
        magic = sums.head_of(KEY, "tidx", b"")[:8]
        rec = struct.pack("<8sQI", magic, big - sums.ENTRY_HEAD.size, 0)
        Path(p).write_bytes(rec + struct.pack("<I", zlib.crc32(rec)))
    os.truncate(p, big)
    tracemalloc.start()
    try:
        with pytest.warns(RuntimeWarning, match=re.escape(p)):
            assert c.get(KEY, "tidx", what="the cached index of URL") is None
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20, f"{peak} bytes allocated"
    assert not os.path.exists(p)


def _old_entry(key: str, name: str, data: bytes) -> bytes:
    """A bytes entry as tarindex wrote it before crc32c (``TIENTRY1``: zlib's crc32)."""
    crc = zlib.crc32(data, zlib.crc32(f"{key}/{name}".encode()))
    rec = struct.pack("<8sQI", b"TIENTRY1", len(data), crc)
    return rec + struct.pack("<I", zlib.crc32(rec)) + data


def test_bytes_entries_carry_a_crc32c_and_older_entries_still_pass(tmp_path: Path) -> None:
    """The per-get check of a bytes entry is a crc32c now (google-crc32c, in hardware: ~4x
    zlib's crc32, benchmarks/README.md); a changed byte is still never served, and the
    entries an older tarindex wrote (zlib crc32) are still read, not fetched again."""
    pytest.importorskip("google_crc32c")
    c = DirCache(str(tmp_path / "cache"), 1 << 30)
    data = os.urandom(3 << 20)
    assert c.put(KEY, "0", data)
    p = Path(c.path(KEY, "0"))
    assert p.read_bytes()[:8] == b"TIENTRY2"
    old = Path(c.path(KEY, "1"))
    old.write_bytes(_old_entry(KEY, "1", data))
    time.sleep(0.01)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert c.get(KEY, "0") == data
        assert c.get(KEY, "1") == data
    for f in (p, old):  # one bit anywhere in the data
        with open(f, "r+b") as fh:
            fh.seek(2 << 20)
            b = fh.read(1)
            fh.seek(2 << 20)
            fh.write(bytes([b[0] ^ 1]))
        with pytest.warns(RuntimeWarning, match="differ from their checksum"):
            assert c.get(KEY, f.name) is None
        assert not f.exists()


def test_a_process_without_google_crc32c_reads_and_writes_zlib_entries(tmp_path: Path) -> None:
    """google-crc32c is a dependency of the ``remote`` extra, with a fallback: a process
    without it writes zlib crc32 entries (read by every process) and drops a crc32c entry
    it cannot check (with the warning and the fix), as any entry failing its check."""
    pytest.importorskip("google_crc32c")
    root = tmp_path / "cache"
    c = DirCache(str(root), 1 << 30)
    data = os.urandom(1 << 20)
    assert c.put(KEY, "new", data)
    code = textwrap.dedent(
        """
        import sys, warnings
        sys.modules["google_crc32c"] = None  # not installed
        from tarindex.storage.cache import DirCache
        c = DirCache(sys.argv[1], 1 << 30)
        c.put(sys.argv[2], "fallback", b"z" * 1000)
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            print(c.get(sys.argv[2], "new") is None, str(w[0].message))
        """
    )
    out = subprocess.run([sys.executable, "-c", code, str(root), KEY], capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("True ") and "pip install google-crc32c" in out.stdout
    assert Path(c.path(KEY, "fallback")).read_bytes()[:8] == b"TIENTRY1"
    assert c.get(KEY, "fallback") == b"z" * 1000
