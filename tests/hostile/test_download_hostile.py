"""The whole-shard download path (docs/REMOTE.md, "Whole shards") against a faulty machine
and a hostile server: real processes, real resource limits, the real loopback server.

Each case ends in the right bytes (the download fails over to ranged reads, or is made
again) or a clear error naming the URL; never wrong bytes, never a crash of the reader.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tarindex.storage.remote.whole import WHOLE

from ..remote_server import RangeServer

pytest.importorskip("fsspec")
pytest.importorskip("aiohttp")


_LIMITED = r"""
import resource, sys
import tarindex
from tarindex.storage.remote import RemoteOptions
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
