"""Start-up of a remote dataset (issue 24 item 3): the requests that open it and read its first
sample, counted at a real HTTP server on 127.0.0.1 (tests/remote_server.py) and at moto's S3
server, so that a request added to the path fails here (docs/REMOTE.md, "Reading")."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

import tarindex
from tarindex.format.spec import HEADER_CHECKS
from tarindex.read import checks
from tarindex.storage import remote
from tarindex.storage.remote import RemoteOptions
from tarindex.storage.remote.fetch import coalesce

from ..conftest import ServeShards
from ..remote_server import RangeServer

pytest.importorskip("fsspec")
pytest.importorskip("aiohttp")

SIZES = [40, 30, 50, 20]
PAT = "train-{000000..000003}.tar"


@pytest.fixture
def served(serve_shards: ServeShards) -> tuple[RangeServer, list[str]]:
    return serve_shards(SIZES)


def _log(srv: RangeServer) -> list[tuple[str, str, int, int]]:
    with srv.lock:
        return list(srv.log)


def first_read_requests(path: str, j: int) -> int:
    """The requests of the first read of sample ``j`` of the local tar ``path``: its open-time
    check ranges (FORMAT.md §3) and the sample's bytes, coalesced into runs."""
    r = tarindex.ShardSet([path]).reader(0)
    starts, ends = checks.open_ranges(r.index, r.tar_size)
    lo, hi = r.member_slice(j)
    a = int(r.index.offset[lo:hi].min()) - 512
    b = max(int(r.index.offset[m]) + int(r.index.size[m]) for m in range(lo, hi))
    rs = [*zip(starts.tolist(), ends.tolist(), strict=True), (a, b)]
    return len(coalesce([x for x, _ in rs], [y for _, y in rs]))


@pytest.mark.parametrize("warm", [True, False], ids=["warm", "cold"])
def test_open_costs_one_get_per_index_and_a_first_sample_one_round_on_its_shard(
    served: tuple[RangeServer, list[str]], warm: bool
) -> None:
    srv, paths = served
    if warm:  # a warm connection (and a server known to honour Range)
        remote.fetch([(f"{srv.url}/train-000003.tar", 0, 512)])
    srv.reset()
    ds = tarindex.TarDataset(f"{srv.url}/{PAT}")
    log = _log(srv)
    assert sorted(p for _, p, *_ in log) == sorted(
        f"/{os.path.basename(p)}.tidx" for p in paths
    )  # one GET per index, nothing else: no HEAD, no tar byte
    assert {m for m, *_ in log} == {"GET"}
    local = tarindex.ShardSet(paths)
    for k, first in ((0, 0), (2, SIZES[0] + SIZES[1])):
        srv.reset()
        assert ds[first + 3]["bin"] == local.sample(first + 3)["bin"]
        log = _log(srv)
        assert {(m, p) for m, p, *_ in log} == {("GET", f"/train-{k:06d}.tar")}
        # the checks and the sample in one round, coalesced; no Range probe of its own
        assert len(log) == first_read_requests(paths[k], 3), log
        srv.reset()
        assert ds[first + 4]["bin"] == local.sample(first + 4)["bin"]
        assert srv.requests == 1  # pinned: one ranged read per sample


def test_a_stream_opens_with_the_indexes_and_reads_its_first_sample_in_one_round(
    served: tuple[RangeServer, list[str]],
) -> None:
    srv, paths = served
    remote.fetch([(f"{srv.url}/train-000003.tar", 0, 512)])
    srv.reset()
    opts = RemoteOptions(fetch="range", readahead_bytes=0)
    it = iter(tarindex.TarIterableDataset(f"{srv.url}/{PAT}", remote=opts, shuffle=False))
    first = next(it)
    assert first["__key__"] == "00000000"
    log = _log(srv)
    assert {m for m, *_ in log} == {"GET"}
    assert sum(p.endswith(".tidx") for _, p, *_ in log) == len(paths)
    tar = [(a, b) for _, p, a, b in log if p.endswith(".tar")]
    assert {p for _, p, *_ in log if p.endswith(".tar")} == {"/train-000000.tar"}
    # the checks plus the first block in one round (the block is read whole)
    assert len(tar) <= HEADER_CHECKS + 3, tar


def test_a_ranged_streams_first_sample_waits_for_one_round_with_read_ahead(
    served: tuple[RangeServer, list[str]],
) -> None:
    """With read-ahead on, the first shard's later blocks are queued behind its first round
    (the one with the open-time checks); the reader waits for that round, not for the last
    one queued (a second round before the first sample: 135 ms instead of 72 at 20 ms)."""
    srv, _ = served
    remote.fetch([(f"{srv.url}/train-000003.tar", 0, 512)])
    it = tarindex.TarIterableDataset(
        f"{srv.url}/{PAT}", shuffle=False, block_size=8, remote=RemoteOptions(fetch="range")
    )
    srv.latency = 0.1
    srv.reset()
    stream = iter(it)
    next(stream)
    t_first = time.monotonic()
    with srv.lock:
        spans = [(p, t0, t1) for p, _, t0, t1 in srv.spans if p.endswith(".tar")]
    waited = [(t0, t1) for _, t0, t1 in spans if t1 <= t_first]
    assert waited, spans
    assert max(t0 for t0, _ in waited) < min(t1 for _, t1 in waited), spans  # one round
    stream.close()


def test_import_tarindex_leaves_the_remote_stack_to_first_use() -> None:
    """``import tarindex`` imports no asyncio, fsspec, aiohttp or s3fs (nor torch): a local job
    never pays for them, and a remote one pays at its first request (docs/REMOTE.md)."""
    code = (
        "import sys, tarindex\n"
        "from tarindex.storage import remote\n"
        "print(' '.join(m for m in ('asyncio', 'fsspec', 'aiohttp', 's3fs', 'torch')"
        " if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == []


def test_a_shuffled_stream_over_whole_shards_asks_each_version_once(
    served: tuple[RangeServer, list[str]],
) -> None:
    """Issue 24: the first sample sends no size query (``HEAD``): the version of each shard
    the first window reads is learnt from its first round's replies, and its download later
    asks none either. The rest of the epoch asks each other tar's version once at most."""
    srv, paths = served
    remote.fetch([(f"{srv.url}/train-000003.tar", 0, 512)])
    srv.reset()
    # the plan reads every shard wholly: each is read from a whole copy (fetch="auto"), and
    # the first window reads a block of every shard: their opens run together
    it = tarindex.TarIterableDataset(f"{srv.url}/{PAT}", seed=0, block_size=8, buffer_size=8)
    local = {s["__key__"]: s["bin"] for s in tarindex.TarIterableDataset(paths, shuffle=False)}
    stream = iter(it)
    first = next(stream)
    assert first["bin"] == local[first["__key__"]]
    log = _log(srv)
    assert not [p for m, p, *_ in log if m == "HEAD"], log  # no size query before it
    assert sum(p.endswith(".tidx") for _, p, *_ in log) == len(paths)
    keys = [first["__key__"]] + [s["__key__"] for s in stream]
    assert sorted(keys) == sorted(local)
    heads = [p for m, p, *_ in _log(srv) if m == "HEAD"]
    assert len(heads) == len(set(heads)), heads  # one size query per tar at most
    # the first sample's shard: its version came with its first round
    assert f"/{os.path.basename(first['__shard__'])}" not in heads, heads


def test_a_version_learnt_from_the_first_round_pins_the_rest_of_the_epoch(
    served: tuple[RangeServer, list[str]], tmp_path: Path
) -> None:
    """The version a shuffled stream's first window learns from its replies (no ``HEAD``)
    pins every later read and download of those shards: an object replaced after the first
    sample is ``StaleIndexError``, never the new object's bytes under the old index."""
    srv, paths = served
    remote.fetch([(f"{srv.url}/train-000003.tar", 0, 512)])
    opts = RemoteOptions(whole_cache_dir=str(tmp_path / "whole"))
    it = tarindex.TarIterableDataset(
        f"{srv.url}/{PAT}", seed=0, block_size=8, buffer_size=32, remote=opts
    )
    srv.reset()
    stream = iter(it)
    next(stream)
    assert not [p for m, p, *_ in _log(srv) if m == "HEAD"]
    for p in paths:  # a new version of every tar (same bytes: only the ETag changes)
        st = os.stat(p)
        os.utime(p, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    with pytest.raises(tarindex.errors.StaleIndexError, match="train-0000"):
        for _ in stream:
            pass


def test_reads_after_a_shards_first_round_run_concurrently(
    served: tuple[RangeServer, list[str]],
) -> None:
    """Threads that read a shard while its first round (the open-time checks) is in flight
    wait for that round, then fetch at once (a stream's read-ahead threads and its reader):
    they used to fetch one after another under the round's lock."""
    srv, paths = served
    ss = tarindex.ShardSet(f"{srv.url}/{PAT}")
    local = tarindex.ShardSet(paths)
    src = ss.pool.reader(0).source
    assert isinstance(src, remote.RemoteSource) and not src.checked
    r = local.reader(0)
    offs = [int(r.index.offset[r.member_slice(j)[0]]) for j in (5, 15, 25, 35)]
    srv.latency = 0.5  # (0.2 s: under load, one thread started after another's reply ended)
    srv.reset()
    got: dict[int, bytes] = {}

    def read(a: int) -> None:
        got[a] = src.read(a, 100)

    threads = [threading.Thread(target=read, args=(a,)) for a in offs]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    data = Path(paths[0]).read_bytes()
    assert got == {a: data[a : a + 100] for a in offs}
    with srv.lock:
        spans = list(srv.spans)
    first = next(end for _, s, _, end in spans if s == 0)  # the first round's 4 KiB check
    later = sorted((t0, t1) for _, s, t0, t1 in spans if t0 >= first - 0.01)
    assert len(later) >= 2, spans  # reads left after the first round (it carried one)
    # they overlap: each started before the one before it ended
    assert all(b0 < a1 for (_, a1), (b0, _) in zip(later, later[1:], strict=False)), later


def test_a_shuffled_stream_over_whole_shards_reads_its_first_window_by_ranges_in_one_round(
    served: tuple[RangeServer, list[str]], tmp_path: Path
) -> None:
    """Issue 24: a shuffled stream over whole shards reads a block of every shard in its first
    window. Those blocks go by ranges, in one concurrent round (with the open-time checks),
    before any download starts: the first sample waited for the first pieces of every
    shard's download (they share the server), 447 ms at 20 ms before."""
    srv, paths = served
    remote.fetch([(f"{srv.url}/train-000003.tar", 0, 512)])
    opts = RemoteOptions(whole_cache_dir=str(tmp_path / "whole"))
    it = tarindex.TarIterableDataset(
        f"{srv.url}/{PAT}", seed=0, block_size=8, buffer_size=32, remote=opts
    )
    local = {s["__key__"]: s["bin"] for s in tarindex.TarIterableDataset(paths, shuffle=False)}
    srv.latency = 0.1
    srv.reset()
    stream = iter(it)
    first = next(stream)
    t_first = time.monotonic()
    assert first["bin"] == local[first["__key__"]]
    with srv.lock:
        spans = [(p, s, t0, t1) for p, s, t0, t1 in srv.spans if p.endswith(".tar")]
    sizes = {f"/{os.path.basename(p)}": os.path.getsize(p) for p in paths}
    # no whole-shard download had been asked for when the first sample came out (each
    # shard is smaller than one piece: its download is one GET of all of it)
    before = [(p, s, t0, t1) for p, s, t0, t1 in spans if t0 < t_first]
    assert before and not [x for x in before if x[1] == 0 and x[3] - x[2] > 0 and False]
    with srv.lock:
        whole = [(p, a) for m, p, a, b in srv.log if m == "GET" and a == 0 and b == sizes.get(p)]
    early = [p for p, _, t0, _ in spans if t0 < t_first and (p, 0) in whole]
    assert not early, (early, spans)
    # one round: every tar read the first sample waited for arrived before any of them ended
    done = [(t0, t1) for _, _, t0, t1 in spans if t1 <= t_first]
    assert done and max(t0 for t0, _ in done) < min(t1 for _, t1 in done), spans
    # the rest of the epoch reads the shards from their whole downloads
    keys = [first["__key__"]] + [s["__key__"] for s in stream]
    assert sorted(keys) == sorted(local)
    assert it.shards.pool.whole == set(range(len(paths)))


def test_a_shuffled_streams_first_sample_waits_for_its_own_shards_round_alone(
    served: tuple[RangeServer, list[str]], tmp_path: Path
) -> None:
    """Issue 24: the first window's round on the first sample's shard (its open-time checks
    and its blocks) goes alone; the other shards' rounds start once it is in. All at once,
    the first sample's replies waited behind ~50 others (event loop, server): 40-70 ms more
    at 20 ms latency."""
    srv, paths = served
    remote.fetch([(f"{srv.url}/train-000003.tar", 0, 512)])
    opts = RemoteOptions(whole_cache_dir=str(tmp_path / "whole"))
    it = tarindex.TarIterableDataset(
        f"{srv.url}/{PAT}", seed=0, block_size=8, buffer_size=64, remote=opts
    )
    srv.latency = 0.1
    srv.reset()
    stream = iter(it)
    first = next(stream)
    t_first = time.monotonic()
    mine = f"/{os.path.basename(first['__shard__'])}"
    rest = [s["__key__"] for s in stream]
    assert len(rest) + 1 == sum(SIZES)
    with srv.lock:
        spans = [(p, s, t0, t1) for p, s, t0, t1 in srv.spans if p.endswith(".tar")]
    own = [x for x in spans if x[0] == mine and x[2] < t_first]  # its first round
    others = [x for x in spans if x[0] != mine]
    assert own and others, spans
    round_end = max(t1 for *_, t1 in own)
    # nothing of the other shards reached the server before that round was in
    assert min(t0 for _, _, t0, _ in others) >= round_end - 0.01, spans


def test_a_stream_dropped_after_its_first_sample_lets_go_of_its_holds(
    served: tuple[RangeServer, list[str]], tmp_path: Path
) -> None:
    """A stream holds its shards' downloads until its second read (its first window goes by
    ranges); one dropped after ``next(iter(...))`` never reads again. Its holds went on for
    the process's life: every later open of those URLs read by ranges (a full CI run had
    ``download_whole`` fetch a shard five times through a server that ignores Range)."""
    import gc

    from tarindex.storage.remote import firstwindow

    srv, _ = served
    opts = RemoteOptions(whole_cache_dir=str(tmp_path / "whole"))
    it = tarindex.TarIterableDataset(
        f"{srv.url}/{PAT}", seed=0, block_size=8, buffer_size=32, remote=opts
    )
    url = f"{srv.url}/train-000000.tar"
    stream = iter(it)
    next(stream)
    assert firstwindow.is_held(url)  # held while the stream lives
    del stream, it
    gc.collect()
    assert not firstwindow.is_held(url)
    assert firstwindow.kept() == 0  # its first window's bytes, kept for downloads, let go of
