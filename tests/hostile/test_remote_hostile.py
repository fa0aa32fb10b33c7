"""Remote replies that lie, objects that change, bodies without end, a hostile cache dir.

Issue 19, items 1, 2, 9-13, against the real loopback server of ``remote_server.py`` (its
hostile knobs) and real files: wrong bytes are refused with an error naming the URL, never
returned; every wait and every body is bounded.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import numpy as np
import pytest

import tarindex
from tarindex.errors import RemoteError, StaleIndexError
from tarindex.storage import remote
from tarindex.storage.cache import DirCache
from tarindex.storage.remote import RemoteOptions, read_whole
from tarindex.storage.remote.options import cache_key

from ..conftest import ServeShards
from ..remote_server import RangeServer

pytest.importorskip("fsspec")
pytest.importorskip("aiohttp")

SIZES = [40, 35]


@pytest.fixture
def served(serve_shards: ServeShards) -> tuple[RangeServer, list[str]]:
    return serve_shards(SIZES)


@pytest.fixture(autouse=True)
def _fresh() -> None:
    """Forget what this process fetched (indexes in memory, Range-checked hosts)."""
    remote.forget_process_state()


def _middle_sample(path: str) -> int:
    """A sample whose members lie well inside the tar (not in its first or last 8 KiB)."""
    r = tarindex.ShardReader(path)
    size = os.path.getsize(path)
    for j in range(r.n_samples // 2, r.n_samples):
        lo, hi = r.member_slice(j)
        off = r.index.offset[lo:hi].astype(np.int64)
        end = off + r.index.size[lo:hi].astype(np.int64)
        if off.min() > 8192 and end.max() < size - 8192 and (end - off).sum() > 0:
            return j
    raise AssertionError("no sample in the middle")


def _replace_same_size(path: str) -> None:
    """Another object of the same size at ``path`` (new inode): bytes inside it inverted."""
    data = bytearray(Path(path).read_bytes())
    for k in range(8192, len(data) - 8192):
        data[k] ^= 0xFF
    tmp = path + ".new"
    Path(tmp).write_bytes(bytes(data))
    os.replace(tmp, path)


def test_a_reply_for_another_range_of_the_right_length_is_refused(
    served: tuple[RangeServer, list[str]],
) -> None:
    srv, paths = served
    url = f"{srv.url}/train-000000.tar"
    ss = tarindex.ShardSet(url)
    local = tarindex.ShardSet(paths[0])
    assert ss.sample(3)["bin"] == local.sample(3)["bin"]
    srv.shift = 512  # 206, Content-Range "bytes a+512-b+511/size", that many bytes
    msg = r"train-000000\.tar: asked for bytes \d+\.\.\d+, the reply says it holds bytes"
    with pytest.raises(RemoteError, match=msg):
        ss.sample(5)
    with pytest.raises(RemoteError, match=msg):
        ss.prefetch([7, 9])
        ss.sample(7)


@pytest.mark.parametrize("honours_if_match", [True, False])
def test_an_object_replaced_after_open_is_stale_not_read(
    served: tuple[RangeServer, list[str]], honours_if_match: bool
) -> None:
    srv, paths = served
    srv.ignore_if_match = not honours_if_match  # then the reply's ETag gives it away
    url = f"{srv.url}/train-000000.tar"
    ss = tarindex.ShardSet(url)
    j = _middle_sample(paths[0])
    assert ss.sample(0)["__key__"] == "00000000"
    _replace_same_size(paths[0])
    with pytest.raises(StaleIndexError, match=r"train-000000\.tar: the remote object changed"):
        ss.sample(j)


def test_weak_etags_and_servers_without_head_are_read_and_still_pinned(
    served: tuple[RangeServer, list[str]],
) -> None:
    srv, paths = served
    srv.weak_etag = True  # If-Match would never match: Last-Modified and the ETag compared
    srv.no_head = True  # 405: the size from a one-byte ranged GET
    url = f"{srv.url}/train-000000.tar"
    ss = tarindex.ShardSet(url)
    local = tarindex.ShardSet(paths[0])
    assert [ss.sample(i)["bin"] for i in range(0, SIZES[0], 7)] == [
        local.sample(i)["bin"] for i in range(0, SIZES[0], 7)
    ]
    pin = ss.reader(0).source.pin  # type: ignore[attr-defined]
    assert pin.size == os.path.getsize(paths[0]) and pin.etag.startswith("W/")
    j = _middle_sample(paths[0])
    _replace_same_size(paths[0])
    with pytest.raises(StaleIndexError, match=r"train-000000\.tar: the remote object changed"):
        ss.sample(j)


def test_a_replaced_object_is_stale_through_the_cache_too(
    served: tuple[RangeServer, list[str]], tmp_path: Path
) -> None:
    srv, paths = served
    opts = RemoteOptions(cache_dir=str(tmp_path / "cache"), chunk_bytes=4096)
    url = f"{srv.url}/train-000000.tar"
    local = tarindex.ShardSet(paths[0])
    ss = tarindex.ShardSet(url, remote=opts)
    j = _middle_sample(paths[0])
    assert ss.sample(0)["bin"] == local.sample(0)["bin"]
    key_before = ss.reader(0).source.key  # type: ignore[attr-defined]
    _replace_same_size(paths[0])
    with pytest.raises(StaleIndexError, match=r"train-000000\.tar: the remote object changed"):
        ss.sample(j)
    assert ss.sample(0)["bin"] == local.sample(0)["bin"]  # a chunk of the version opened
    # a new open pins the new version: its bytes are cached under another key
    src = remote.RemoteSource.open(url, opts, "same index")
    assert src.key != key_before and src.pin is not None


def test_an_endless_index_body_is_cut_at_what_its_header_allows(
    served: tuple[RangeServer, list[str]],
) -> None:
    srv, _ = served
    srv.endless = ".tidx"
    t0 = time.monotonic()
    with pytest.raises(RemoteError, match=r"train-000000\.tar\.tidx: .*longer than the \d+ bytes"):
        tarindex.ShardSet(f"{srv.url}/train-000000.tar", remote=RemoteOptions(backoff=0.01))
    assert time.monotonic() - t0 < 20
    assert srv.bytes_sent < 32 << 20  # of 256 MiB on offer


def test_a_whole_file_read_has_a_bound(served: tuple[RangeServer, list[str]]) -> None:
    srv, paths = served
    srv.endless = ".tar"
    with pytest.raises(RemoteError, match=r"longer than the 100000 bytes"):
        read_whole(f"{srv.url}/train-000000.tar", RemoteOptions(), 100_000)
    assert srv.bytes_sent < 32 << 20
    assert remote.MANIFEST_MAX_BYTES == 256 << 20  # documented in docs/REMOTE.md


def test_a_trickling_server_meets_the_deadline(served: tuple[RangeServer, list[str]]) -> None:
    srv, _ = served
    opts = RemoteOptions(deadline=1.0, retries=1, backoff=0.01)
    ss = tarindex.ShardSet(f"{srv.url}/train-000000.tar", remote=opts)
    ss.reader(0)
    srv.trickle = 0.3  # one byte every 0.3 s: never a read timeout, never done
    t0 = time.monotonic()
    with pytest.raises(RemoteError, match=r"train-000000\.tar: bytes \d+\.\.\d+: still failing.*deadline"):
        ss.sample(5)
    assert time.monotonic() - t0 < 10


def test_a_503_on_the_size_request_is_retried(served: tuple[RangeServer, list[str]]) -> None:
    srv, paths = served
    url = f"{srv.url}/train-000000.tar"
    srv.fail_head = 2
    # the size request: a whole-shard download asks for it (a ranged reader learns the size
    # from its first replies' Content-Range instead)
    ss = tarindex.ShardSet(url, remote=RemoteOptions(backoff=0.01, fetch="shard"))
    assert ss.sample(4)["bin"] == tarindex.ShardSet(paths[0]).sample(4)["bin"]
    assert srv.fail_head == 0
    srv.fail_head = 100
    remote.forget_process_state()
    ss2 = tarindex.ShardSet(url, remote=RemoteOptions(backoff=0.01, retries=2, fetch="shard"))
    with pytest.raises(RemoteError, match=r"train-000000\.tar: cannot get its size: .*503"):
        ss2.sample(4)


def test_a_corrupt_cached_index_is_dropped_and_fetched_again(
    served: tuple[RangeServer, list[str]], tmp_path: Path
) -> None:
    srv, paths = served
    opts = RemoteOptions(cache_dir=str(tmp_path / "cache"))
    url = f"{srv.url}/train-000000.tar"
    assert len(tarindex.ShardSet(url, remote=opts)) == SIZES[0]
    entry = DirCache(opts.cache_dir or "", opts.cache_bytes).path(
        cache_key("index", url + ".tidx"), "tidx"
    )
    data = bytearray(Path(entry).read_bytes())
    data[-1] ^= 0xFF  # the end magic
    Path(entry).write_bytes(bytes(data))
    remote.forget_process_state()
    # the entry's checksum (tarindex.storage.sums) fails before the index is decoded
    with pytest.warns(
        RuntimeWarning, match=f"{entry}: this cache entry \\(the cached index of .*\\) failed"
    ):
        ss = tarindex.ShardSet(url, remote=opts)
    assert ss.sample(2)["bin"] == tarindex.ShardSet(paths[0]).sample(2)["bin"]
    # fetched again (after the entry's 24-byte checksum record)
    assert Path(entry).read_bytes()[24:] == Path(paths[0] + ".tidx").read_bytes()


def _files_outside(d: Path) -> list[str]:
    return sorted(str(p) for p in d.rglob("*"))


def test_links_planted_in_the_cache_directory_are_never_followed(tmp_path: Path) -> None:
    root, outside = tmp_path / "cache", tmp_path / "outside"
    (root / "ab").parent.mkdir()
    outside.mkdir()
    (outside / "dir").mkdir()
    secret = outside / "secret"
    secret.write_bytes(b"not the cache's")
    os.symlink(outside / "dir", root / "ab")  # a key directory
    os.symlink(outside / "lock-target", root / "lock")
    os.symlink(outside / "usage-target", root / "usage")
    os.symlink(outside / "dir", root / "tmp")
    cd = root / "cd" / ("cd" + "0" * 62)
    cd.mkdir(parents=True)
    os.symlink(secret, cd / "entry")
    limit = 128 << 10
    c = DirCache(str(root), limit)
    for k in range(12):  # 768 KiB offered to a 128 KiB cache
        assert c.put("ab" + f"{k:062x}", "0", bytes([k]) * (64 << 10))
    assert c.get("cd" + "0" * 62, "entry") is None  # not the secret's bytes
    assert _files_outside(outside) == [str(outside / "dir"), str(secret)]
    assert secret.read_bytes() == b"not the cache's"
    held = sum(p.stat().st_size for p in root.rglob("*") if p.is_file() and p.parent.name != "tmp"
               and p.name not in ("lock", "usage"))
    assert held <= limit
    assert c.usage() <= limit
    assert c.get("ab" + f"{11:062x}", "0") == bytes([11]) * (64 << 10)
    assert not any(p.is_symlink() for p in root.rglob("*"))
