"""The whole-shard download path (docs/REMOTE.md, "Whole shards") against a faulty machine
and a hostile server: real processes, real resource limits, the real loopback server.

Each case ends in the right bytes (the download fails over to ranged reads, or is made
again) or a clear error naming the URL; never wrong bytes, never a crash of the reader.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

import tarindex
from tarindex.errors import RemoteError
from tarindex.storage.remote import RemoteOptions
from tarindex.storage.remote.fetch import fetch, stat
from tarindex.storage.remote.whole import WHOLE

from ..remote_server import RangeServer

pytest.importorskip("fsspec")
pytest.importorskip("aiohttp")


_LIMITED = r"""
import resource, sys
import tarindex
from tarindex.storage.remote import RemoteOptions
from tarindex.storage.remote.fetch import fetch, stat
url, path, cache, where, limit = sys.argv[1:]
local = tarindex.ShardSet(path)
want = [local.sample(i)["bin"] for i in range(len(local))]
resource.setrlimit(resource.RLIMIT_FSIZE, (int(limit), int(limit)))  # after the local reads
ss = tarindex.ShardSet(url, remote=RemoteOptions(**{where: cache}, fetch="shard", shards_ahead=0))
assert [ss.sample(i)["bin"] for i in range(len(ss))] == want
print("ok", flush=True)
"""


@pytest.mark.parametrize("where", ["cache_dir", "whole_cache_dir"])
def test_a_file_size_limit_below_the_shard_reads_by_ranges_not_an_error(
    big: tuple[RangeServer, str], tmp_path: Path, where: str
) -> None:
    """A process whose files may not grow past 2 MiB (``RLIMIT_FSIZE``; a FAT32 cache disk's
    4 GiB is the same ``EFBIG``) reads a 4 MiB shard with ``fetch="shard"``: its copy cannot
    be preallocated, so the shard is read by ranges, as with a full disk (``ENOSPC``). The
    old code raised the bare ``OSError: [Errno 27] File too large`` from the first read."""
    srv, path = big
    url = f"{srv.url}/big-000000.tar"
    cache = tmp_path / "c"
    r = subprocess.run(
        [sys.executable, "-c", _LIMITED, url, path, str(cache), where, str(2 << 20)],
        capture_output=True, text=True, timeout=60,
    )
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr[-2000:]
    assert not list(cache.rglob(WHOLE))  # no copy: it never fit


def test_an_error_page_in_reply_to_a_piece_is_never_handed_out(
    big: tuple[RangeServer, str], tmp_path: Path
) -> None:
    """A proxy answers the download's pieces (ranged reads of 1 MiB or more; the open-time
    checks' small reads pass) with a ``200`` HTML page of 1.5 MiB and no version: the old
    code wrote it into the copy as the reply arrived and flagged its first grain, so the
    read of sample 0 (in that grain) returned the page's bytes. A ``200`` to a ranged read
    must be the whole pinned object (its ``Content-Length`` the pinned size, its ETag)
    before any of its body is written: the piece is refused (the URL, the bytes, the
    reply), the download fails, and the samples are read by ranges (or, if it failed before
    the open joined it, the open raises its error)."""
    srv, path = big
    local = tarindex.ShardReader(path)
    url = f"{srv.url}/big-000000.tar"
    opts = RemoteOptions(
        whole_cache_dir=str(tmp_path / "c"), fetch="shard", shards_ahead=0, retries=1,
        backoff=0.5,
    )
    page = b"<html><body>" + b"x" * (3 << 19) + b"</body></html>"
    srv.page = (page, 1 << 20, None)
    ds = tarindex.TarDataset(url, remote=opts)
    said = rf"{re.escape(url)}: asked for bytes 0\.\.\d+, the server answered 200 with "
    for i in (0, 1, 30, 63):
        try:  # the right bytes (by ranges), or the download's error if it ended first
            assert ds[i]["bin"] == local.sample(i)["bin"], i
        except RemoteError as e:
            assert re.match(said, str(e)), e
    assert not list((tmp_path / "c").rglob(WHOLE))
    pin = stat(url, opts)
    msg = rf"{re.escape(url)}: asked for bytes 0\.\.{2 << 20}, the server answered 200 with "
    for length in (None, pin.size):  # its own length, or the object's (a lie): no version
        srv.page = (page, 1 << 20, length)
        with pytest.raises(RemoteError, match=msg):
            fetch([(url, 0, 2 << 20)], opts, [pin])
    srv.page = None
    assert fetch([(url, 0, 2 << 20)], opts, [pin])[0] == Path(path).read_bytes()[: 2 << 20]


_FIFOS = r"""
import os, sys, time
import tarindex
from tarindex.storage.remote import RemoteOptions, forget_process_state
from tarindex.storage.remote.fetch import stat
from tarindex.storage.remote.whole import WHOLE, tar_key
url, path, root = sys.argv[1:]
local = tarindex.ShardSet(path)
want = [local.sample(i)["bin"] for i in range(len(local))]
t = tarindex.ShardReader(path).index
ident = f"{t.tar_size}:{t.head_crc}:{t.tail_crc}"
for where in ("entry", "sum", "lock", "tmp"):
    forget_process_state()
    opts = RemoteOptions(whole_cache_dir=os.path.join(root, where), fetch="shard", shards_ahead=0)
    c = opts.whole_cache()
    pin = stat(url, opts)
    key = tar_key(url, pin.size, ident, pin)
    p = {"entry": c.path(key, WHOLE), "sum": c.path(key, WHOLE) + ".sum",
         "lock": c.lock_path(key, WHOLE), "tmp": os.path.join(c.root, "tmp", "1.planted")}[where]
    os.makedirs(os.path.dirname(p), exist_ok=True)
    os.mkfifo(p)
    ss = tarindex.ShardSet(url, remote=opts)
    assert [ss.sample(i)["bin"] for i in range(len(ss))] == want, where
    ss.close()
    print(where, flush=True)
"""


def test_a_fifo_planted_in_the_cache_is_removed_never_waited_on(
    big: tuple[RangeServer, str], tmp_path: Path
) -> None:
    """A FIFO where a whole copy, its ``.sum``, its lock file (the progress record) or a temp
    file of a dead process lies: the old code's ``open`` of it waited for a writer forever
    (the entry's and the lock's at the first read, the temp file's at the cache's clean-up).
    Now each is opened ``O_NONBLOCK`` and refused or removed as any file that is not a
    regular one, and the shard is read (a child process: a hang fails, never hangs the run)."""
    srv, path = big
    url = f"{srv.url}/big-000000.tar"
    try:
        r = subprocess.run(
            [sys.executable, "-c", _FIFOS, url, path, str(tmp_path / "c")],
            capture_output=True, text=True, timeout=30,
        )
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"hung after {e.stdout!r}")
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.split() == ["entry", "sum", "lock", "tmp"]
