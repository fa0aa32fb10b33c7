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
from tarindex.storage.pieces import GRAIN, PieceReader, PieceWriter, attach

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


def _flip(path: str | Path, at: int) -> None:
    with open(path, "r+b") as fh:
        fh.seek(at)
        b = fh.read(1)
        fh.seek(at)
        fh.write(bytes([b[0] ^ 1]))


def _download(
    c: DirCache, key: str, data: bytes
) -> tuple[PieceWriter, int, int, PieceReader]:
    """A download of ``data`` as entry ``(key, "whole")`` written through its sinks, joined."""
    lk = c.lock(key, "whole")
    assert lk is not None
    w = PieceWriter(c, lk, len(data))
    fd, rd = attach(c, key, "whole", len(data)) or pytest.fail("no record")
    for a in range(0, len(data), GRAIN):  # each body in chunks that cross grains
        sink = w.sink(a, min(a + GRAIN, len(data)))
        body = data[a : a + GRAIN]
        for k in range(0, len(body), 300_000):
            sink(k, body[k : k + 300_000])
    w.flush()  # (written by the writer thread)
    return w, lk, fd, rd


def test_whole_copies_carry_crc32c_grains_and_older_zlib_copies_still_pass(
    tmp_path: Path,
) -> None:
    """Issue 24 (streaming): a whole-shard copy's grains (its download's progress record,
    ``TIPIECE3``, and its ``.sum``, ``TISUMS02``) are crc32c now, as bytes entries (the
    reading process paid zlib's crc32 on each MiB as it arrived, again at the reader's check
    and at a remap). A byte changed on disk in a grain is refused, while the download runs
    (by a reader in another process: the downloading process trusts its own grains) and in
    the copy. A copy an older tarindex wrote (``TISUMS01``: zlib crc32 per MiB) is
    still read without a warning, and refused once a byte changes."""
    pytest.importorskip("google_crc32c")
    c = DirCache(str(tmp_path / "cache"), 1 << 30)
    data = os.urandom(3 * GRAIN + 7)
    w, lk, fd, rd = _download(c, KEY, data)
    assert Path(c.lock_path(KEY, "whole")).read_bytes()[:8] == b"TIPIECE3"
    read = lambda o, n: os.pread(fd, n, o)  # noqa: E731
    _flip(w.tmp, GRAIN + 5)  # a byte of grain 1, after its crc was recorded
    # a reader in another process checks each grain: the changed one is refused
    code = textwrap.dedent(
        """
        import os, sys, warnings
        from tarindex.storage.cache import DirCache
        from tarindex.storage.pieces import attach
        root, key, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
        fd, rd = attach(DirCache(root, 1 << 30), key, "whole", n)
        read = lambda o, k: os.pread(fd, k, o)
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            print(rd.check(read, 0, 1), rd.check(read, 1 << 20, (1 << 20) + 1))
        print(str(w[0].message))
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", code, c.root, KEY, str(len(data))],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    ok, why = out.stdout.splitlines()
    assert ok == "True False"
    assert f"bytes {GRAIN}..{2 * GRAIN} " in why and "fail their check" in why
    _flip(w.tmp, GRAIN + 5)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert rd.check(read, 0, len(data))  # (this process wrote them: trusted, docs)
    assert w.commit(KEY, "whole")
    c.unlock(lk)
    rd.close()
    os.close(fd)
    p = c.path(KEY, "whole")
    assert Path(p + sums.SUM_SUFFIX).read_bytes()[:8] == b"TISUMS02"
    got = c.open_checked(KEY, "whole", len(data))
    assert got is not None and os.pread(got, len(data), 0) == data
    os.close(got)
    _flip(p, 2 * GRAIN + 3)  # in the copy now (its ctime changes: checked again)
    with pytest.warns(RuntimeWarning, match=f"bytes {2 * GRAIN}..{3 * GRAIN} differ"):
        assert c.open_checked(KEY, "whole", len(data)) is None
    assert not os.path.exists(p)

    old = "0" + KEY[1:]  # a copy as tarindex wrote it before: zlib crc32 per grain
    tmp = c.temp_path()
    Path(tmp).write_bytes(data)
    assert c.put_file(old, "whole", tmp)  # (no record yet: written below, as before)
    body = b"".join(
        struct.pack("<I", zlib.crc32(data[k : k + GRAIN])) for k in range(0, len(data), GRAIN)
    )
    bind = zlib.crc32(f"{old}/whole".encode())
    head = struct.pack("<8sQQII", b"TISUMS01", len(data), GRAIN, bind, zlib.crc32(body))
    Path(c.path(old, "whole") + sums.SUM_SUFFIX).write_bytes(head + body)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got = c.open_checked(old, "whole", len(data))
    assert got is not None and os.pread(got, len(data), 0) == data
    os.close(got)
    _flip(c.path(old, "whole"), 5)
    with pytest.warns(RuntimeWarning, match=f"bytes 0..{GRAIN} differ"):
        assert c.open_checked(old, "whole", len(data)) is None


def test_a_process_without_google_crc32c_writes_zlib_grains_and_drops_crc32c_copies(
    tmp_path: Path,
) -> None:
    """The grains' fallback: a process without google-crc32c cannot check a crc32c copy, so
    it drops it with a warning naming the fix (and fetches it again), never trusts it
    unchecked; a crc32c download it joins is not read (one warning; its bytes go by the
    server); its own downloads write zlib records (``TIPIECE2``, ``TISUMS01``), which a
    process with google-crc32c reads."""
    pytest.importorskip("google_crc32c")
    root = tmp_path / "cache"
    c = DirCache(str(root), 1 << 30)
    data = os.urandom(2 * GRAIN + 3)
    w, lk0, fd, rd = _download(c, KEY, data)
    assert w.commit(KEY, "whole")
    c.unlock(lk0)
    rd.close()
    os.close(fd)
    joined = "1" + KEY[1:]  # a crc32c download running in this process
    lk = c.lock(joined, "whole")
    assert lk is not None
    w2 = PieceWriter(c, lk, len(data))
    w2.sink(0, len(data))(0, data)
    w2.flush()
    code = textwrap.dedent(
        """
        import os, sys, warnings
        sys.modules["google_crc32c"] = None  # not installed
        from tarindex.storage.cache import DirCache
        from tarindex.storage.pieces import PieceWriter, attach
        root, key, joined, new, n = sys.argv[1:]
        n = int(n)
        c = DirCache(root, 1 << 30)
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            print(c.open_checked(key, "whole", n) is None, str(w[0].message))
            fd, rd = attach(c, joined, "whole", n)
            read = lambda o, k: os.pread(fd, k, o)
            print(rd.check(read, 0, 1), rd.check(read, 0, n), len(w), str(w[1].message))
        lk = c.lock(new, "whole")
        pw = PieceWriter(c, lk, n)
        pw.sink(0, n)(0, os.pread(fd, n, 0))
        print(open(c.lock_path(new, "whole"), "rb").read(8).decode())
        print(pw.commit(new, "whole"))
        """
    )
    new = "2" + KEY[1:]
    out = subprocess.run(
        [sys.executable, "-c", code, str(root), KEY, joined, new, str(len(data))],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0].startswith("True ") and "pip install google-crc32c" in lines[0], lines
    assert not os.path.exists(c.path(KEY, "whole"))  # dropped: fetched again when next wanted
    assert lines[1].startswith("False False 2 ") and "google-crc32c" in lines[1], lines
    assert lines[2:] == ["TIPIECE2", "True"], lines
    assert Path(c.path(new, "whole") + sums.SUM_SUFFIX).read_bytes()[:8] == b"TISUMS01"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got = c.open_checked(new, "whole", len(data))
    assert got is not None and os.pread(got, len(data), 0) == data
    os.close(got)
    w2.abort()
    c.unlock(lk)
