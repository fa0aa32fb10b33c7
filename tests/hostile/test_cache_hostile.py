"""A cache directory changed behind tarindex's back: its files are checked, never trusted.

Against the real loopback server of ``remote_server.py`` and real cache files: bytes flipped
in a cached chunk or a whole-shard copy, a file cut then extended to its old length, a chunk
of another entry copied in its place, a checksum record damaged or gone. Each is a warning
naming the cache file and the bytes, a refetch, and the right bytes; never wrong bytes
(tarindex.storage.sums; docs/REMOTE.md, "Cache").
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
import warnings
from collections.abc import Callable
from pathlib import Path

import pytest

import tarindex
from tarindex.errors import StaleIndexError
from tarindex.storage import remote, sums
from tarindex.storage.cache import DirCache
from tarindex.storage.pieces import GRAIN
from tarindex.storage.remote import RemoteOptions
from tarindex.storage.remote.fetch import DOWNLOAD_CHUNK, stat
from tarindex.storage.remote.whole import WHOLE, tar_key

from ..conftest import ServeShards
from ..remote_server import RangeServer

pytest.importorskip("fsspec")
pytest.importorskip("aiohttp")

SIZES = [60, 50]
CHUNK = 4096


@pytest.fixture
def served(serve_shards: ServeShards) -> tuple[RangeServer, list[str]]:
    return serve_shards(SIZES)


def _all(ss: tarindex.ShardSet) -> list[bytes]:
    return [ss.sample(i)["bin"] for i in range(len(ss))]


def _key(url: str, path: str) -> str:
    t = tarindex.ShardReader(path).index
    ident = f"{t.tar_size}:{t.head_crc}:{t.tail_crc}"
    pin = stat(url)
    return tar_key(url, pin.size, ident, pin)


def _flip(p: Path) -> None:
    data = bytearray(p.read_bytes())
    data[len(data) // 2] ^= 0x01  # one bit, inside the data (after any record)
    p.write_bytes(bytes(data))


def _cut_and_extend(p: Path) -> None:
    n = p.stat().st_size
    with open(p, "r+b") as f:  # in place: same inode, same length, a zero tail
        f.truncate(n // 2)
        f.truncate(n)


def _cut(p: Path) -> None:
    with open(p, "r+b") as f:
        f.truncate(p.stat().st_size - 100)


def _flip_record(p: Path) -> None:
    data = bytearray(p.read_bytes())
    data[9] ^= 0x01  # the length field of the checksum record
    p.write_bytes(bytes(data))


DAMAGE: dict[str, Callable[[Path], None]] = {
    "bit flipped": _flip,
    "cut then extended": _cut_and_extend,
    "cut": _cut,
    "record damaged": _flip_record,
}


@pytest.mark.parametrize("how", sorted(DAMAGE))
def test_a_damaged_cached_chunk_is_refetched_never_served(
    served: tuple[RangeServer, list[str]], tmp_path: Path, how: str
) -> None:
    srv, paths = served
    cache = tmp_path / "cache"
    opts = RemoteOptions(cache_dir=str(cache), chunk_bytes=CHUNK)
    url = f"{srv.url}/train-000000.tar"
    want = _all(tarindex.ShardSet(paths[0]))
    assert _all(tarindex.ShardSet(url, remote=opts)) == want  # every chunk cached
    key = _key(url, paths[0])
    chunks = sorted((cache / key[:2] / key).iterdir(), key=lambda p: int(p.name))
    victim = chunks[len(chunks) // 2]
    i = int(victim.name)
    DAMAGE[how](victim)
    remote.forget_process_state()
    srv.reset()
    span = f"bytes {i * CHUNK}..{(i + 1) * CHUNK} of {re.escape(url)}"
    match = rf"{re.escape(str(victim))}: this cache entry \({span}\) failed its check"
    with pytest.warns(RuntimeWarning, match=match):
        got = _all(tarindex.ShardSet(url, remote=opts))
    assert got == want
    # fetched again (that chunk alone, beside the open-time checks) and stored again, sound
    assert any(m == "GET" and a <= i * CHUNK < b for m, _, a, b in srv.log)
    data = Path(paths[0]).read_bytes()
    assert victim.read_bytes()[sums.ENTRY_HEAD.size :] == data[i * CHUNK : (i + 1) * CHUNK]


def test_a_chunk_of_another_entry_put_in_its_place_is_refused(
    served: tuple[RangeServer, list[str]], tmp_path: Path
) -> None:
    """Same length, sound bytes of the same tar, another offset: its checksum is tied to its
    name (and key: URL, size, index fingerprint, pinned ETag), so it is not served."""
    srv, paths = served
    cache = tmp_path / "cache"
    opts = RemoteOptions(cache_dir=str(cache), chunk_bytes=CHUNK)
    url = f"{srv.url}/train-000000.tar"
    want = _all(tarindex.ShardSet(paths[0]))
    assert _all(tarindex.ShardSet(url, remote=opts)) == want
    key = _key(url, paths[0])
    d = cache / key[:2] / key
    (d / "2").write_bytes((d / "1").read_bytes())  # both full chunks: same length
    remote.forget_process_state()
    with pytest.warns(RuntimeWarning, match=r"/2: this cache entry \(bytes 8192\.\.12288 of "):
        assert _all(tarindex.ShardSet(url, remote=opts)) == want


def test_a_chunk_checked_once_is_checked_again_after_any_change(
    served: tuple[RangeServer, list[str]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A chunk's crc is checked on every get (no pass remembered: a store through another
    process's mapping changes bytes without a ctime, test_cache_sums_hostile.py): a write
    after the check is caught at the next read."""
    monkeypatch.setattr(sums, "RACY_S", 0.0)  # a pass of a file written just now would count
    c = DirCache(str(tmp_path / "c"), 1 << 20)
    c.put("ab" * 32, "0", b"x" * 5000)
    assert c.get("ab" * 32, "0", 5000) == b"x" * 5000
    p = Path(c.path("ab" * 32, "0"))
    assert not sums.is_known(str(p), os.stat(p))  # not remembered: every hit is checked
    assert c.get("ab" * 32, "0", 5000) == b"x" * 5000
    time.sleep(0.05)  # a later clock tick than the pass remembered (RACY_S is 0 here)
    with open(p, "r+b") as f:  # in place, same length
        f.seek(100)
        f.write(b"y")
    assert not sums.is_known(str(p), os.stat(p))
    with pytest.warns(RuntimeWarning, match="bytes 24..5024 differ from their checksum"):
        assert c.get("ab" * 32, "0", 5000) is None
    assert not p.exists() and c.corrupt == 1


def _whole_copy(cache: Path) -> Path:
    """The one whole copy in ``cache``, once its download (in the background) committed it."""
    deadline = time.monotonic() + 30
    while True:
        found = [p for p in cache.glob(f"??/*/{WHOLE}") if p.is_file()]
        if found or time.monotonic() > deadline:
            break
        time.sleep(0.01)
    (p,) = found
    return p


WHOLE_DAMAGE: dict[str, Callable[[Path], None]] = {
    "bit flipped": _flip,
    "cut then extended": _cut_and_extend,
    "cut": _cut,
    "record damaged": lambda p: _flip_record(Path(str(p) + sums.SUM_SUFFIX)),
    "record missing": lambda p: Path(str(p) + sums.SUM_SUFFIX).unlink(),
}


@pytest.mark.parametrize("how", sorted(WHOLE_DAMAGE))
def test_a_damaged_whole_shard_copy_is_downloaded_again_never_served(
    served: tuple[RangeServer, list[str]], tmp_path: Path, how: str
) -> None:
    """A plain tar read whole (``fetch="shard"``), without ``verify_data``: its copy is
    checked against the crc32s written at its download when a process first opens it."""
    srv, paths = served
    cache = tmp_path / "cache"
    opts = RemoteOptions(cache_dir=str(cache), fetch="shard", shards_ahead=0)
    url = f"{srv.url}/train-000000.tar"
    want = _all(tarindex.ShardSet(paths[0]))
    assert _all(tarindex.ShardSet(url, remote=opts)) == want
    copy = _whole_copy(cache)
    assert Path(str(copy) + sums.SUM_SUFFIX).exists()
    WHOLE_DAMAGE[how](copy)
    remote.forget_process_state()
    srv.reset()
    match = rf"{re.escape(str(copy))}: this cache entry \(the whole copy of {re.escape(url)}\) failed"
    with pytest.warns(RuntimeWarning, match=match):
        got = _all(tarindex.ShardSet(url, remote=opts))
    assert got == want
    size = os.path.getsize(paths[0])
    assert any(m == "GET" and (a, b) == (0, size) for m, _, a, b in srv.log)  # again
    assert _whole_copy(cache).read_bytes() == Path(paths[0]).read_bytes()
    remote.forget_process_state()
    srv.reset()
    assert _all(tarindex.ShardSet(url, remote=opts)) == want  # sound now: no download
    assert not any(m == "GET" and (a, b) == (0, size) for m, _, a, b in srv.log)


def test_a_damaged_copy_of_a_server_without_ranges_is_downloaded_again(
    served: tuple[RangeServer, list[str]], tmp_path: Path
) -> None:
    """``download_whole=True`` (a server that ignores Range): the same check."""
    srv, paths = served
    srv.ignore_range = True
    cache = tmp_path / "cache"
    opts = RemoteOptions(cache_dir=str(cache), download_whole=True)
    url = f"{srv.url}/train-000001.tar"
    want = _all(tarindex.ShardSet(paths[1]))
    assert _all(tarindex.ShardSet(url, remote=opts)) == want
    copy = _whole_copy(cache)
    _flip(copy)
    remote.forget_process_state()
    with pytest.warns(RuntimeWarning, match=rf"{re.escape(str(copy))}: this cache entry"):
        assert _all(tarindex.ShardSet(url, remote=opts)) == want
    assert _whole_copy(cache).read_bytes() == Path(paths[1]).read_bytes()


def test_a_shard_replaced_while_it_is_downloaded_whole_is_not_trusted(
    big: tuple[RangeServer, str], tmp_path: Path
) -> None:
    """``download_whole``: the plain GET is not pinned, so a shard rewritten in place after
    the first MiB of its reply went out reached the cache as a mix of two versions and was
    served (sample 2 of the old bytes, sample 40 of the new). The version after the download
    is compared with the one before: the copy is discarded and the shard opened again."""
    srv, path = big
    srv.ignore_range = True
    url = f"{srv.url}/big-000000.tar"
    cache = tmp_path / "cache"
    opts = RemoteOptions(cache_dir=str(cache), download_whole=True)
    old = _all(tarindex.ShardSet(path))
    data = Path(path).read_bytes()
    at = [data.index(old[j]) + 1000 for j in (2, 40)]  # inside payloads: no check covers them
    assert at[0] < 1 << 20 < at[1]
    rewrites = [1]  # how many downloads see the file rewritten under them

    def rewrite(p: str, rng: str, offset: int) -> None:
        if p.endswith(".tar") and not rng and offset == 1 << 20 and rewrites[0] > 0:
            rewrites[0] -= 1
            with open(path, "r+b") as f:
                for a in at:
                    f.seek(a)
                    f.write(os.urandom(16))

    srv.on_body = rewrite
    got = _all(tarindex.ShardSet(url, remote=opts))
    assert rewrites == [0]
    assert got == _all(tarindex.ShardSet(path))  # the object as it is now, never a mix
    assert got[2] != old[2] and got[40] != old[40]
    assert _whole_copy(cache).read_bytes() == Path(path).read_bytes()
    # rewritten under every download: refused, naming the URL and the fix; nothing cached
    remote.forget_process_state()
    rewrites[0] = 1000
    other = RemoteOptions(cache_dir=str(tmp_path / "other"), download_whole=True)
    msg = r"big-000000\.tar: the remote object changed while it was downloaded whole .*open the"
    with pytest.raises(StaleIndexError, match=msg):
        _all(tarindex.ShardSet(url, remote=other))
    assert not list((tmp_path / "other").rglob(WHOLE))


def test_a_tar_replaced_while_it_is_streamed_to_a_file_is_refused(
    big: tuple[RangeServer, str], tmp_path: Path
) -> None:
    """:func:`remote.download` (``tarindex index URL``, compressed remote tars) reads a server
    that ignores Range with one plain GET (once its first ranged read of ``DOWNLOAD_CHUNK``
    bytes came back longer): a tar rewritten in place during that GET is refused."""
    srv, _ = big
    srv.ignore_range = True
    path = os.path.join(srv.root, "huge-000000.tar")
    with tarindex.ShardWriter(path, maxcount=1, mtime=0) as w:
        w.write({"__key__": "0", "bin": os.urandom(DOWNLOAD_CHUNK + (1 << 20))})
    url = f"{srv.url}/huge-000000.tar"

    def rewrite(p: str, rng: str, offset: int) -> None:
        if p.endswith(".tar") and not rng and offset == 1 << 20:
            with open(path, "r+b") as f:
                f.seek(DOWNLOAD_CHUNK)
                f.write(os.urandom(16))

    srv.on_body = rewrite
    with pytest.raises(StaleIndexError, match=r"huge-000000\.tar: the remote object changed "
                       r"while it was downloaded \("):
        remote.download(url, str(tmp_path / "copy.tar"))
    srv.on_body = None
    assert remote.download(url, str(tmp_path / "copy.tar")) == os.path.getsize(path)
    assert (tmp_path / "copy.tar").read_bytes() == Path(path).read_bytes()


def _in_grain(r: tarindex.ShardReader, g: int) -> int:
    """A sample whose members lie inside grain ``g``."""
    for j in range(r.n_samples):
        lo, hi = r.member_slice(j)
        a = int(r.index.offset[lo:hi].min())
        b = int((r.index.offset[lo:hi] + r.index.size[lo:hi]).max())
        if g * GRAIN <= a and b <= (g + 1) * GRAIN:
            return j
    raise AssertionError(f"no sample inside grain {g}")


@pytest.mark.timeout(60)
@pytest.mark.parametrize("how", ["flag set by someone else", "written bytes changed"])
def test_a_download_s_record_or_temp_file_changed_never_hands_out_wrong_bytes(
    big: tuple[RangeServer, str], tmp_path: Path, how: str
) -> None:
    """A shard read while another holder downloads it (docs/REMOTE.md, "One download per
    machine"): a grain flagged in the progress record though never written (zeros), or a
    written grain changed in the temp file, fails its crc32 (published in the record) and is
    read from the server instead, with a warning naming the temp file and the bytes. The
    holder is another process (a reader in the downloading process trusts the grains its own
    writer wrote: the trust boundary is the process)."""
    srv, path = big
    opts = RemoteOptions(whole_cache_dir=str(tmp_path / "c"), fetch="shard", shards_ahead=0)
    url = f"{srv.url}/big-000000.tar"
    local = tarindex.ShardReader(path)
    t = local.index
    pin = stat(url, opts)
    c = opts.whole_cache()
    key = tar_key(url, pin.size, f"{t.tar_size}:{t.head_crc}:{t.tail_crc}", pin)
    g = 2 if how == "flag set by someone else" else 1
    holder = subprocess.Popen(  # another worker's download: its lock, its record, its bytes
        [sys.executable, "-c", _HOLDER, c.root, str(c.limit), key, WHOLE, path, str(pin.size), how],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdin is not None
        tmp = holder.stdout.readline().strip()
        assert tmp, "the holder did not start its download"
        j = _in_grain(local, g)
        ds = tarindex.TarDataset(url, remote=opts)
        match = rf"{re.escape(tmp)}: bytes {g * GRAIN}\.\.{(g + 1) * GRAIN} of the download"
        with pytest.warns(RuntimeWarning, match=match):
            got = ds[j]["bin"]
        assert got == local.sample(j)["bin"]
        assert ds[0]["bin"] == local.sample(0)["bin"]  # a sound grain, from the copy
    finally:  # (the dataset's own download waits for this lock in a background thread)
        if holder.stdin is not None:
            holder.stdin.close()  # the holder aborts its download and exits
        assert holder.wait(30) == 0
        local.close()


_HOLDER = r"""
import sys
from tarindex.storage.cache import DirCache
from tarindex.storage.pieces import GRAIN, HEAD, PieceWriter
root, limit, key, name, path, size, how = sys.argv[1:]
c = DirCache(root, int(limit))
lk = c.lock(key, name)
w = PieceWriter(c, lk, int(size))
data = open(path, "rb").read(2 * GRAIN)
w.sink(0, GRAIN)(0, data[:GRAIN])
w.sink(GRAIN, 2 * GRAIN)(0, data[GRAIN:])
w.flush()
if how == "flag set by someone else":
    with open(c.lock_path(key, name), "r+b") as f:
        f.seek(HEAD.size + 2)
        f.write(b"\x01")  # grain 2 "written": its bytes are the preallocated zeros
else:
    with open(w.tmp, "r+b") as f:
        f.seek(GRAIN + GRAIN // 2)
        f.write(b"\xff" * 16)
print(w.tmp, flush=True)
sys.stdin.read()
w.abort()
c.unlock(lk)
"""


@pytest.mark.parametrize("mode", ["range", "shard"])
def test_a_directory_planted_where_an_entry_belongs_is_removed_not_an_error(
    served: tuple[RangeServer, list[str]], tmp_path: Path, mode: str
) -> None:
    """A directory (with a file in it) where a chunk, a whole copy, its ``.sum`` or its lock
    file belongs: the old code's insert (or lock) failed with ``IsADirectoryError``, so every
    read of those bytes failed ("the cache never makes a read fail"); now it is removed and
    the entry stored."""
    srv, paths = served
    cache = tmp_path / "cache"
    opts = RemoteOptions(cache_dir=str(cache), chunk_bytes=CHUNK, fetch=mode, shards_ahead=0)
    url = f"{srv.url}/train-000000.tar"
    kd = cache / (key := _key(url, paths[0]))[:2] / key
    names = ["3"] if mode == "range" else [WHOLE, WHOLE + sums.SUM_SUFFIX]
    planted = [kd / n for n in names]
    if mode == "shard":
        planted.append(cache / "locks" / f"{key}.{WHOLE}")  # where its lock and record go
    for d in planted:
        (d / "x").mkdir(parents=True)
        (d / "x" / "f").write_bytes(b"planted")
    assert _all(tarindex.ShardSet(url, remote=opts)) == _all(tarindex.ShardSet(paths[0]))
    if mode == "shard":
        _whole_copy(cache)
    assert all(d.is_file() for d in planted)


def test_a_whole_download_whose_replies_are_cut_keeps_sound_checksums(
    served: tuple[RangeServer, list[str]], tmp_path: Path
) -> None:
    """Replies cut mid-body are retried from their start (the sink sees ``at == 0`` again):
    the crc32s written with the copy are those of its bytes, so the next process's check
    passes (no warning, no second download). ``whole_cache_dir``, not ``cache_dir``: no chunk
    cache, whose chunks of the open-time checks the download would take instead of asking."""
    srv, paths = served
    cache = tmp_path / "cache"
    opts = RemoteOptions(whole_cache_dir=str(cache), fetch="shard", shards_ahead=0, backoff=0.01)
    url = f"{srv.url}/train-000001.tar"
    want = _all(tarindex.ShardSet(paths[1]))
    tarindex.ShardSet(url, remote=RemoteOptions(fetch="range"))  # the index, in memory now
    srv.reset()
    srv.drop = 4  # the download's reply (and the open-time checks') cut half-way
    assert _all(tarindex.ShardSet(url, remote=opts)) == want
    assert _whole_copy(cache).read_bytes() == Path(paths[1]).read_bytes()
    size = os.path.getsize(paths[1])
    whole = [b for m, _, a, b in srv.log if m == "GET" and a == 0 and b > 8192]
    assert size in whole and min(whole) < size  # cut (the server logs what it sent), retried
    remote.forget_process_state()
    srv.reset()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert _all(tarindex.ShardSet(url, remote=opts)) == want
    assert not any(m == "GET" and (a, b) == (0, size) for m, _, a, b in srv.log)
