"""A whole shard read while it downloads (tarindex/storage/pieces.py, docs/REMOTE.md "One
download per machine"): readers in other threads and processes read the grains already
written, wait for the others, and learn when the writer failed or died (a real ``kill -9``);
over a real HTTP server, a dataset reads a shard whose download another holder runs."""

from __future__ import annotations

import contextlib
import errno
import multiprocessing as mp
import os
import signal
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from multiprocessing.synchronize import Event
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import tarindex
from tarindex.storage import remote, sums
from tarindex.storage.cache import DirCache
from tarindex.storage.pieces import GRAIN, HEAD, PieceReader, PieceWriter, attach
from tarindex.storage.remote import RemoteOptions
from tarindex.storage.remote.fetch import stat
from tarindex.storage.remote.whole import WHOLE, tar_key

from ..remote_server import RangeServer

KEY = "ab" * 32
SIZE = 3 * GRAIN + 5


def _data() -> bytes:
    return np.random.default_rng(0).bytes(SIZE)


def _writer(root: str, ready: mp.synchronize.Event) -> None:  # a child process
    c = DirCache(root, 1 << 30)
    lk = c.lock(KEY, "whole")
    assert lk is not None
    w = PieceWriter(c, lk, SIZE)
    w.sink(0, GRAIN)(0, _data()[:GRAIN])
    w.flush()  # (written by the writer thread)
    ready.set()
    signal.pause()  # killed here, mid-download


def test_a_reader_in_another_process_reads_written_grains_and_sees_the_writer_die(
    tmp_path: Path,
) -> None:
    root = str(tmp_path / "c")
    DirCache(root, 1 << 30)
    ctx = mp.get_context("fork")
    ready = ctx.Event()
    p = ctx.Process(target=_writer, args=(root, ready))
    p.start()
    try:
        assert ready.wait(30)
        c = DirCache(root, 1 << 30)
        got = attach(c, KEY, "whole", SIZE)
        assert got is not None
        fd, rd = got
        data = _data()
        assert rd.ready(0, GRAIN) and not rd.ready(GRAIN - 1, GRAIN + 1)
        assert os.pread(fd, GRAIN, 0) == data[:GRAIN]
        assert attach(c, KEY, "whole", SIZE + 1) is None  # another size: not this download
    finally:
        assert p.pid is not None
        os.kill(p.pid, signal.SIGKILL)
        p.join(10)
    # the writer is dead: waiting for a grain it never wrote ends, and says so
    assert rd.wait(GRAIN, 2 * GRAIN) is False
    assert rd.failed and not rd.complete
    assert rd.wait(0, GRAIN) is True  # what it wrote stays readable
    rd.close()
    os.close(fd)


def test_a_reader_sees_every_grain_then_the_entry(tmp_path: Path) -> None:
    c = DirCache(str(tmp_path / "c"), 1 << 30)
    lk = c.lock(KEY, "whole")
    assert lk is not None
    w = PieceWriter(c, lk, SIZE)
    fd, rd = attach(c, KEY, "whole", SIZE) or pytest.fail("no record")
    data = _data()
    waited: list[bool] = []
    t = threading.Thread(target=lambda: waited.append(rd.wait(2 * GRAIN, SIZE)))
    t.start()
    t.join(0.2)
    assert t.is_alive()  # the last grains are not written yet
    for a in range(0, SIZE, GRAIN):  # in pieces of one grain, each body in 3 chunks
        sink = w.sink(a, min(a + GRAIN, SIZE))
        body = data[a : a + GRAIN]
        for k in range(0, len(body), 400_000):
            sink(k, body[k : k + 400_000])
    t.join(10)
    assert waited == [True]
    assert w.commit(KEY, "whole")
    c.unlock(lk)
    assert rd.wait(0, SIZE) and rd.complete
    # the reader's descriptor is the entry now (renamed, same inode)
    assert os.fstat(fd).st_ino == os.stat(c.path(KEY, "whole")).st_ino
    assert os.pread(fd, SIZE, 0) == data
    assert attach(c, KEY, "whole", SIZE) is None  # the record is cleared
    rd.close()
    os.close(fd)


def test_the_downloading_process_does_not_read_back_its_own_grains(tmp_path: Path) -> None:
    """Issue 24 item 4 (the stream's CPU): a reader in the process that runs the download
    trusts the grains that process wrote (their crc was taken from the reply's bytes on the
    way in), before and after the commit: it reads none of them back. A reader in a forked
    child (another process: the parent's grains are not its own) reads and checks every
    grain, as does a reader of another download's file. The old code read every grain back."""
    c = DirCache(str(tmp_path / "c"), 1 << 30)
    lk = c.lock(KEY, "whole")
    assert lk is not None
    w = PieceWriter(c, lk, SIZE)
    fd, rd = attach(c, KEY, "whole", SIZE) or pytest.fail("no record")
    fd2, child = attach(c, KEY, "whole", SIZE) or pytest.fail("no record")
    data = _data()
    reads: list[int] = []

    def read(o: int, n: int) -> bytes:
        reads.append(o)
        return os.pread(fd, n, o)

    w.sink(0, 2 * GRAIN)(0, data[: 2 * GRAIN])
    w.flush()
    assert rd.wait(0, 2 * GRAIN) and rd.check(read, 0, 2 * GRAIN)
    assert reads == []  # written here: not read back
    w.sink(2 * GRAIN, SIZE)(0, data[2 * GRAIN :])
    assert w.commit(KEY, "whole")
    c.unlock(lk)
    assert rd.wait(0, SIZE) and rd.check(read, 0, SIZE) and rd.checked
    assert reads == []  # the last grain too, after the commit
    pid = os.fork()
    if pid == 0:  # pragma: no cover (the child reports by its exit code)
        ok = child.check(read, 0, SIZE)
        os._exit(0 if ok and reads == [g * GRAIN for g in range(4)] else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0  # the child read and checked all 4 grains
    for r, f in ((rd, fd), (child, fd2)):
        r.close()
        os.close(f)


def test_the_downloading_process_does_not_check_its_own_entry_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 24 item 4 (the stream's CPU): the process that ran a download takes the entry it
    renamed into place as checked (its grains' crcs came from the replies' bytes), so opening
    it reads nothing back (18 MB shards: ~9 ms each on the stream's main thread before). A
    forked child checks it on its first open; a change after the commit (a new ``ctime``)
    is checked again in this process too, and refused."""
    c = DirCache(str(tmp_path / "c"), 1 << 30)
    lk = c.lock(KEY, "whole")
    assert lk is not None
    w = PieceWriter(c, lk, SIZE)
    data = _data()
    w.sink(0, SIZE)(0, data)
    assert w.commit(KEY, "whole")
    c.unlock(lk)
    checked: list[int] = []  # the sizes of the files read back to check them
    real = sums.file_crcs

    def file_crcs(fd: int, size: int, grain: int, kind: str | None = None) -> Any:
        checked.append(size)
        return real(fd, size, grain, kind)

    monkeypatch.setattr(sums, "file_crcs", file_crcs)
    fd = c.open_checked(KEY, "whole", SIZE, "the test's copy")
    assert fd is not None and os.pread(fd, SIZE, 0) == data
    os.close(fd)
    assert checked == []  # its own entry: not read back
    pid = os.fork()
    if pid == 0:  # pragma: no cover (the child reports by its exit code)
        f = c.open_checked(KEY, "whole", SIZE, "the test's copy")
        os._exit(0 if f is not None and checked == [SIZE] else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0  # the child read it back and checked it
    time.sleep(0.05)  # past the rename's clock tick: the write below stamps another ctime
    with open(c.path(KEY, "whole"), "r+b") as f2:
        f2.seek(5)
        f2.write(bytes([data[5] ^ 1]))
    with pytest.warns(RuntimeWarning, match="failed its check"):
        assert c.open_checked(KEY, "whole", SIZE, "the test's copy") is None
    assert checked == [SIZE]


def test_a_sinks_chunks_are_written_off_the_callers_thread_in_order(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 24 item 4 (the stream's CPU): a reply's chunks are handed to the download's
    writer thread: the caller (the event loop's thread) never runs the ``pwrite``, the
    chunks land in the order they came (a retry's after the first try's: its bytes win),
    and each grain is flagged only once its bytes are in. The old code wrote on the caller's
    thread."""
    c = DirCache(str(tmp_path / "c"), 1 << 30)
    lk = c.lock(KEY, "whole")
    assert lk is not None
    w = PieceWriter(c, lk, SIZE)
    fd, rd = attach(c, KEY, "whole", SIZE) or pytest.fail("no record")
    writers: list[int] = []
    pwrite = os.pwrite

    def counted(f: int, data: bytes, at: int) -> int:
        if f == w.fd:
            writers.append(threading.get_ident())
        return pwrite(f, data, at)

    monkeypatch.setattr(os, "pwrite", counted)
    data = _data()
    sink = w.sink(0, SIZE)
    sink(0, bytes(GRAIN // 2))  # a first try, cut off ...
    sink(0, data[: GRAIN // 2])  # ... and its retry from 0: the retry's bytes win
    for k in range(GRAIN // 2, SIZE, 300_000):
        sink(k, data[k : k + 300_000])
    w.flush()
    assert writers and threading.get_ident() not in writers
    assert len(set(writers)) == 1  # one writer thread: in order
    assert rd.ready(0, SIZE) and os.pread(fd, SIZE, 0) == data
    assert w.commit(KEY, "whole")
    c.unlock(lk)
    rd.close()
    os.close(fd)
    got = c.open_checked(KEY, "whole", SIZE, "the test's copy")  # the crcs of the retry's bytes
    assert got is not None and os.pread(got, SIZE, 0) == data
    os.close(got)


def test_a_chunk_that_fails_to_be_written_fails_the_download(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A write error on the writer thread (``EIO``) is not lost: the caller's next chunk is
    refused with it, the download's commit raises it, and the grain is never flagged (a
    reader reads those bytes another way). The old code raised it on the caller's thread
    at once."""
    c = DirCache(str(tmp_path / "c"), 1 << 30)
    lk = c.lock(KEY, "whole")
    assert lk is not None
    w = PieceWriter(c, lk, SIZE)
    fd, rd = attach(c, KEY, "whole", SIZE) or pytest.fail("no record")
    pwrite = os.pwrite

    def failing(f: int, data: bytes, at: int) -> int:
        if f == w.fd:
            raise OSError(errno.EIO, "Input/output error")
        return pwrite(f, data, at)

    monkeypatch.setattr(os, "pwrite", failing)
    sink = w.sink(0, SIZE)
    sink(0, _data()[:GRAIN])  # queued: the caller goes on
    with pytest.raises(OSError) as e:
        w.commit(KEY, "whole")
    assert e.value.errno == errno.EIO
    with pytest.raises(OSError):
        sink(GRAIN, _data()[GRAIN : 2 * GRAIN])
    assert not rd.ready(0, 1)
    w.abort()
    c.unlock(lk)
    assert c.local_file(KEY, "whole", SIZE) is None
    rd.close()
    os.close(fd)


def test_bytes_in_memory_and_ranges_cut_inside_grains_make_a_sound_entry(
    tmp_path: Path,
) -> None:
    """Issue 24 (streaming): a download writes the bytes a stream's first window fetched by
    ranges (``fill``) and fetches only the rest, in ranges that start and end inside grains.
    Each grain is flagged once all its bytes are in, whoever wrote them; a grain written by
    two of them gets its crc32 from the file (a retried range, which writes its bytes again,
    counts them once); the entry's ``.sum`` record then passes. A reader in another thread
    sees the grains as they complete and checks each against the crc32 in the record."""
    c = DirCache(str(tmp_path / "c"), 1 << 30)
    lk = c.lock(KEY, "whole")
    assert lk is not None
    w = PieceWriter(c, lk, SIZE)
    fd, rd = attach(c, KEY, "whole", SIZE) or pytest.fail("no record")
    data = _data()
    a, b = GRAIN // 3, GRAIN + GRAIN // 2  # the first window's bytes: 2 grains, partly
    w.fill(a, data[a:b])
    assert not rd.ready(0, 1) and not rd.ready(b - 1, b)  # grains 0, 1 lack bytes
    head = w.sink(0, a)
    head(0, data[: a // 2])
    head(0, data[: a // 2])  # a retry from the start: the same bytes again
    w.flush()
    assert not rd.ready(0, 1)  # counted once: bytes a // 2 .. a are still missing
    head(a // 2, data[a // 2 : a])
    w.flush()
    assert rd.ready(0, GRAIN) and not rd.ready(GRAIN, GRAIN + 1)
    assert rd.check(lambda o, n: os.pread(fd, n, o), 0, GRAIN)  # crc32 from the file
    w.sink(b, SIZE)(0, data[b:])
    w.flush()
    assert rd.ready(0, SIZE) and w.complete
    assert rd.check(lambda o, n: os.pread(fd, n, o), 0, SIZE)
    assert w.commit(KEY, "whole")
    c.unlock(lk)
    rd.close()
    os.close(fd)
    got = c.open_checked(KEY, "whole", SIZE, "the test's copy")  # its .sum record passes
    assert got is not None
    assert os.pread(got, SIZE, 0) == data
    os.close(got)


def _committer(root: str, ready: Event, go: Event, done: Event) -> None:  # a child process
    """Write every grain, then commit once told to: a download in another process."""
    c = DirCache(root, 1 << 30)
    lk = c.lock(KEY, "whole")
    assert lk is not None
    w = PieceWriter(c, lk, SIZE)
    w.sink(0, SIZE)(0, _data())
    w.flush()  # (written by the writer thread)
    ready.set()
    go.wait(30)
    w.commit(KEY, "whole")
    c.unlock(lk)
    done.set()


@contextlib.contextmanager
def _other_process_download(
    tmp_path: Path,
) -> Iterator[tuple[DirCache, int, PieceReader, Callable[[], None]]]:
    """A download another process runs, written whole, not committed; a reader of it here
    (not this process's own download: it checks every grain), and the commit, run on call."""
    root = str(tmp_path / "c")
    DirCache(root, 1 << 30)
    ctx = mp.get_context("fork")
    ready, go, done = ctx.Event(), ctx.Event(), ctx.Event()
    p = ctx.Process(target=_committer, args=(root, ready, go, done))
    p.start()

    def commit() -> None:
        go.set()
        assert done.wait(30)

    try:
        assert ready.wait(30)
        c = DirCache(root, 1 << 30)
        fd, rd = attach(c, KEY, "whole", SIZE) or pytest.fail("no record")
        yield c, fd, rd, commit
        rd.close()
        os.close(fd)
    finally:
        go.set()
        p.join(30)


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="names a descriptor's file")
def test_a_commit_between_a_readers_reads_of_the_record_loses_no_crc(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 24 (a piece fetched twice, 1 stream epoch in 15-50 under load): a reader read
    a grain's flag, the download committed (its record cleared), then the reader read the
    grain's crc: nothing. It warned that good bytes "fail their check (no crc to check
    them with ...)" and the stream fetched them again by ranges (1.05x the tars). The
    interleaving is forced here (the other process's commit runs at this reader's first
    read of the record's crcs, after its header and one flag a grain): the reader takes
    each grain's crc with its flag, or the entry's ``.sum`` once the record is cleared, and
    checks every grain, no warning."""
    with _other_process_download(tmp_path) as (c, fd, rd, commit):
        lock_path = os.path.realpath(c.lock_path(KEY, "whole"))
        crcs_at = HEAD.size + -(-SIZE // GRAIN)
        pread = os.pread
        hooked: list[int] = []

        def at_crcs(f: int, n: int, offset: int) -> bytes:
            here = offset >= crcs_at and os.readlink(f"/proc/self/fd/{f}") == lock_path
            if here and not hooked:
                hooked.append(offset)
                commit()
            return pread(f, n, offset)

        monkeypatch.setattr(os, "pread", at_crcs)
        assert rd.wait(0, SIZE)
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # a warning is a failure here
            assert rd.check(lambda o, n: os.pread(fd, n, o), 0, SIZE)
        assert hooked  # the commit ran between two reads of the record
        assert rd.checked and rd.settled
        assert attach(c, KEY, "whole", SIZE) is None  # committed: the record is cleared


def test_a_reader_checks_grains_it_saw_after_their_entry_is_evicted(tmp_path: Path) -> None:
    """The other way a reader lost a grain's crc: it saw the grain flagged, the download
    committed and its entry was evicted (with its ``.sum``) before the reader checked the
    grain (a tight cache evicts a shard a stream is done with while its reads are in
    flight). The reader took the crc with the flag: its descriptor still reads the bytes
    (the evicted file lives until it is closed), checked, never fetched again."""
    with _other_process_download(tmp_path) as (c, fd, rd, commit):
        assert rd.wait(0, SIZE) and rd.complete  # every flag seen, no grain checked yet
        commit()
        c.discard(KEY, "whole")  # evicted, .sum and all
        assert not os.path.exists(c.path(KEY, "whole"))
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            assert rd.check(lambda o, n: os.pread(fd, n, o), 0, SIZE)
        assert rd.checked
        assert os.pread(fd, SIZE, 0) == _data()


@pytest.mark.timeout(60)
def test_a_dataset_reads_a_shard_while_another_holder_downloads_it(
    big: tuple[RangeServer, str], tmp_path: Path
) -> None:
    srv, path = big
    opts = RemoteOptions(whole_cache_dir=str(tmp_path / "c"), fetch="shard", shards_ahead=0)
    url = f"{srv.url}/big-000000.tar"
    local = tarindex.ShardReader(path)
    t = local.index
    ident = f"{t.tar_size}:{t.head_crc}:{t.tail_crc}"
    pin = stat(url, opts)
    c = opts.whole_cache()
    key = tar_key(url, pin.size, ident, pin)
    lk = c.lock(key, WHOLE)  # another worker's download: its lock, its record, one grain
    assert lk is not None
    w = PieceWriter(c, lk, pin.size)
    data = Path(path).read_bytes()
    w.sink(0, GRAIN)(0, data[:GRAIN])
    w.flush()
    srv.reset()
    ds = tarindex.TarDataset(url, remote=opts)
    # sample 0 lies in the written grain: read now (the old code waited for the whole
    # download, here forever), from the copy, not from the server
    assert ds[0]["bin"] == local.sample(0)["bin"]
    lo, hi = local.member_slice(0)
    a = int(local.index.offset[lo:hi].min())
    with srv.lock:
        tar_gets = [(s, e) for m, p, s, e in srv.log if m == "GET" and p.endswith(".tar")]
    assert not any(s <= a < e and e - s > 8192 for s, e in tar_gets)  # only the open checks
    # a sample in grain 1, next to the written grain 0: the download is on it, so it waits
    nxt = next(j for j in range(len(ds)) if int(local.index.offset[local.member_slice(j)[0]]) > GRAIN)
    got: list[bytes] = []
    th = threading.Thread(target=lambda: got.append(ds[nxt]["bin"]))
    th.start()
    th.join(0.3)
    assert th.is_alive()  # its grain is not written yet, and is the next one: it waits for it
    # the last sample, 3 grains past what is written: not reached, read from the server at
    # once (one ranged read about it), not after the download's earlier grains
    last = len(ds) - 1
    lo, hi = local.member_slice(last)
    a = int(local.index.offset[lo:hi].min())
    srv.reset()
    assert ds[last]["bin"] == local.sample(last)["bin"]
    with srv.lock:
        gets = [(s, e) for m, p, s, e in srv.log if m == "GET" and p.endswith(".tar")]
    assert any(s <= a < e for s, e in gets) and sum(e - s for s, e in gets) < 3 * 65536, gets
    assert th.is_alive()
    w.sink(GRAIN, len(data))(0, data[GRAIN:])
    th.join(30)
    assert got == [local.sample(nxt)["bin"]]
    assert w.commit(key, WHOLE)
    c.unlock(lk)
    with srv.lock:
        sent = sum(e - s for m, p, s, e in srv.log if m == "GET" and p.endswith(".tar"))
    assert sent < len(data) // 10  # the dataset downloaded nothing itself
    # once complete, the next read reopens the shard from the entry, mapped
    assert ds[1]["bin"] == local.sample(1)["bin"]
    assert ds[2]["bin"] == local.sample(2)["bin"]
    assert not isinstance(ds.shards.pool.reader(0).source, remote.RemoteSource)
    local.close()


@pytest.mark.timeout(60)
def test_a_download_that_fails_leaves_its_readers_correct(
    big: tuple[RangeServer, str], tmp_path: Path
) -> None:
    srv, path = big
    opts = RemoteOptions(whole_cache_dir=str(tmp_path / "c"), fetch="shard", shards_ahead=0)
    url = f"{srv.url}/big-000000.tar"
    local = tarindex.ShardReader(path)
    t = local.index
    pin = stat(url, opts)
    c = opts.whole_cache()
    key = tar_key(url, pin.size, f"{t.tar_size}:{t.head_crc}:{t.tail_crc}", pin)
    lk = c.lock(key, WHOLE)
    assert lk is not None
    w = PieceWriter(c, lk, pin.size)
    w.sink(0, GRAIN)(0, Path(path).read_bytes()[:GRAIN])
    w.flush()
    ds = tarindex.TarDataset(url, remote=opts)
    assert ds[0]["bin"] == local.sample(0)["bin"]
    w.abort()  # the other holder's download failed
    c.unlock(lk)
    for i in (len(ds) - 1, 5, len(ds) // 2):  # read by ranges, or from the next download
        assert ds[i]["bin"] == local.sample(i)["bin"]
    local.close()


@pytest.mark.timeout(60)
def test_a_shard_changed_since_its_index_is_refused_while_it_downloads(
    big: tuple[RangeServer, str], tmp_path: Path
) -> None:
    srv, path = big
    local = tarindex.ShardReader(path)
    t = local.index  # the index beside the tar describes it as it is now
    ident = f"{t.tar_size}:{t.head_crc}:{t.tail_crc}"
    local.close()
    data = bytearray(Path(path).read_bytes())
    data[100] ^= 0xFF  # inside the first 4 KiB: the index's fingerprint no longer matches
    Path(path + ".new").write_bytes(bytes(data))
    os.replace(path + ".new", path)
    opts = RemoteOptions(whole_cache_dir=str(tmp_path / "c"), fetch="shard", shards_ahead=0)
    url = f"{srv.url}/big-000000.tar"
    pin = stat(url, opts)
    c = opts.whole_cache()
    key = tar_key(url, pin.size, ident, pin)
    lk = c.lock(key, WHOLE)
    assert lk is not None
    w = PieceWriter(c, lk, pin.size)
    w.sink(0, GRAIN)(0, bytes(data[:GRAIN]))  # sample 0's grain is there, of the new tar
    w.flush()
    ds = tarindex.TarDataset(url, remote=opts)
    # the open-time checks run in the background from the open; no byte before they pass
    with pytest.raises(tarindex.StaleIndexError, match=r"big-000000\.tar"):
        ds[0]
    w.abort()
    c.unlock(lk)
