"""The fetch policy of remote shards (docs/REMOTE.md, "Fetch policy"), against a real HTTP
server on 127.0.0.1 that honours Range (tests/remote_server.py): which policy runs for each
access pattern, the bounded cache, one download per machine, stale objects still refused."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import tarindex
from tarindex.errors import StaleIndexError
from tarindex.read import fetchpolicy
from tarindex.read.fetchpolicy import ADAPT_MIN, SPREAD, SPREAD_MIN
from tarindex.storage import remote
from tarindex.storage.remote import RemoteOptions
from tarindex.storage.remote.fetch import stat
from tarindex.storage.remote.whole import WHOLE, tar_key

from ..cache_watch import CacheWatch
from ..conftest import ServeShards, check_bytes, sent_ranges
from ..remote_server import RangeServer

pytest.importorskip("fsspec")
pytest.importorskip("aiohttp")

SIZES = [150, 120, 130, 140]
PAT = "train-{000000..000003}.tar"


@pytest.fixture
def served(serve_shards: ServeShards) -> tuple[RangeServer, list[str]]:
    return serve_shards(SIZES)


def _whole_downloads(srv: RangeServer, paths: list[str]) -> dict[str, int]:
    """Per tar, how many times it was sent whole (one ranged read from 0 to its end: these
    shards are smaller than one 8 MiB piece); tars never sent whole are left out."""
    sizes = {os.path.basename(p): os.path.getsize(p) for p in paths}
    out: dict[str, int] = {}
    for name, rs in sent_ranges(srv).items():
        n = sum(1 for a, b in rs if a == 0 and b == sizes[name])
        if n:
            out[name] = n
    return out


def _whole_and_checks(paths: list[str]) -> int:
    """The tars' bytes plus the bytes of their open-time checks (FORMAT.md §3)."""
    return sum(os.path.getsize(p) for p in paths) + check_bytes(paths)


def test_sparse_random_access_stays_on_ranges(served: tuple[RangeServer, list[str]]) -> None:
    srv, paths = served
    ds = tarindex.TarDataset(f"{srv.url}/{PAT}")
    rng = np.random.default_rng(0)
    for i in rng.choice(len(ds), 20, replace=False).tolist():
        ds[i]
    assert ds.shards.pool.whole == set()
    assert _whole_downloads(srv, paths) == {}
    assert not os.path.isdir(os.environ["TARINDEX_CACHE_DIR"]) or not any(
        f.endswith("whole") for _, _, fs in os.walk(os.environ["TARINDEX_CACHE_DIR"]) for f in fs
    )


def test_re_reading_a_few_samples_stays_on_ranges(served: tuple[RangeServer, list[str]]) -> None:
    """Issue 24: without a plan the policy counts the distinct samples read per shard. A job
    that reads the same few samples again and again (a fixed validation batch, the same keys
    through ``get``) stays on ranges: counting reads switched the shard to a whole download
    once ADAPT_MIN reads had gone by."""
    srv, paths = served
    ds = tarindex.TarDataset(f"{srv.url}/{PAT}")
    local = tarindex.ShardSet(paths)
    keys = [local.sample(i)["__key__"] for i in range(5)]
    for _ in range(3 * ADAPT_MIN // 5):
        for i in range(5):
            assert ds[i]["bin"] == local.sample(i)["bin"]
        for k in keys:
            assert ds.get(k)["bin"] == local.get(k)["bin"]
    assert ds.shards.pool.whole == set()
    assert _whole_downloads(srv, paths) == {}
    # distinct samples do switch it (the rule of the next test)
    for i in range(ADAPT_MIN + 5):
        ds[i]
    assert ds.shards.pool.whole == {0}


def test_reading_most_of_a_shard_switches_it_to_a_whole_download(
    served: tuple[RangeServer, list[str]],
) -> None:
    srv, paths = served
    ds = tarindex.TarDataset(f"{srv.url}/{PAT}")
    local = tarindex.ShardSet(paths)
    for i in range(ADAPT_MIN + 5):  # shard 0 only
        got = ds[i]
        assert got["bin"] == local.sample(i)["bin"]
    assert ds.shards.pool.whole == {0}
    assert _whole_downloads(srv, paths) == {"train-000000.tar": 1}
    srv.reset()
    for i in range(ADAPT_MIN + 5, SIZES[0]):  # the rest of shard 0: from its local copy
        assert ds[i]["bin"] == local.sample(i)["bin"]
    assert sent_ranges(srv) == {}


def test_a_sparse_subset_never_switches(served: tuple[RangeServer, list[str]]) -> None:
    srv, paths = served
    # every 4th sample of shard 0: at most a quarter of it, so ranges even when all are read
    ds = tarindex.TarDataset(f"{srv.url}/{PAT}", subset=list(range(0, SIZES[0], 4)) * 1)
    for _ in range(3):
        for i in range(len(ds)):
            ds[i]
    assert ds.shards.base.pool.whole == set()
    assert _whole_downloads(srv, paths) == {}


def test_a_shuffled_pass_without_a_plan_switches_every_shard_early(
    served: tuple[RangeServer, list[str]],
) -> None:
    """Issue 24: a uniform shuffle reads a few samples of every shard at a time; switching a
    shard only at 1/16 of its distinct samples (ADAPT_MIN at least) cost one ranged request
    per sample until then (1,137 requests for the benchmark's DataLoader epoch). Reads spread
    over the shards switch them all once SPREAD_MIN distinct samples are read."""
    srv, paths = served
    ds = tarindex.TarDataset(f"{srv.url}/{PAT}")
    local = tarindex.ShardSet(paths)
    perm = np.random.default_rng(1).permutation(len(ds)).tolist()
    assert SPREAD_MIN >= SPREAD * len(ds)
    for i in perm[: SPREAD_MIN - 1]:
        assert ds[i]["bin"] == local.sample(i)["bin"]
    assert ds.shards.pool.whole == set()
    for i in perm[SPREAD_MIN - 1 :]:
        assert ds[i]["bin"] == local.sample(i)["bin"]
    assert ds.shards.pool.whole == {0, 1, 2, 3}
    assert _whole_downloads(srv, paths) == {os.path.basename(p): 1 for p in paths}
    gets = sum(len(rs) for rs in sent_ranges(srv).values())
    # the reads before the switch, the downloads, the open-time checks (with the first read;
    # a few more where a shard reopens on its copy); the old rule: 4 x ADAPT_MIN = 256 first
    assert gets < SPREAD_MIN + 4 * 12, gets


def test_sparse_reads_and_get_by_key_stay_on_ranges_over_many_samples(
    serve_shards: ServeShards,
) -> None:
    """1% of the samples at random, and keys through ``get``, over shards holding enough that
    1% is more than SPREAD_MIN: ranges only, and no more bytes than the members' and the
    open-time checks' (the benchmark's bound: 1.2x the bytes asked)."""
    srv, paths = serve_shards([1100, 1000, 1050, 950])
    ds = tarindex.TarDataset(f"{srv.url}/train-{{000000..000003}}.tar")
    local = tarindex.ShardSet(paths)
    n = len(ds) // 100
    assert n > SPREAD_MIN
    picked = np.random.default_rng(2).choice(len(ds), n, replace=False).tolist()
    for i in picked[: n // 2]:
        assert ds[i]["bin"] == local.sample(i)["bin"]
    for i in picked[n // 2 :]:
        key = local.sample(i)["__key__"]
        assert ds.get(key)["bin"] == local.get(key)["bin"]
    assert ds.shards.pool.whole == set()
    assert _whole_downloads(srv, paths) == {}
    sent = sum(b - a for rs in sent_ranges(srv).values() for a, b in rs)
    assert sent < 0.05 * sum(os.path.getsize(p) for p in paths)


def test_forced_range_and_forced_shard(served: tuple[RangeServer, list[str]]) -> None:
    srv, paths = served
    url = f"{srv.url}/{PAT}"
    it = tarindex.TarIterableDataset(url, remote=RemoteOptions(fetch="range"), seed=0)
    assert len(list(it)) == sum(SIZES)
    assert _whole_downloads(srv, paths) == {}
    srv.reset()
    ds = tarindex.TarDataset(url, remote=RemoteOptions(fetch="shard", shards_ahead=0))
    ds[0]  # one sample: its shard downloaded whole, the others left alone (no read-ahead)
    assert _whole_downloads(srv, paths) == {"train-000000.tar": 1}
    with pytest.raises(ValueError, match="fetch='all'"):
        RemoteOptions(fetch="all")


def test_a_streaming_epoch_downloads_each_shard_once_in_plan_order(
    served: tuple[RangeServer, list[str]], monkeypatch: pytest.MonkeyPatch
) -> None:
    srv, paths = served
    monkeypatch.setattr(fetchpolicy, "SHARD_UNIT", 1)  # each counts as one of shards_ahead
    it = tarindex.TarIterableDataset(
        f"{srv.url}/{PAT}", seed=3, block_size=16, buffer_size=16,
        remote=RemoteOptions(shards_ahead=2),
    )
    keys = [s["__key__"] for s in it]
    assert sorted(keys) == [f"{i:08d}" for i in range(sum(SIZES))]
    # every shard downloaded: its bytes all sent, in one range from 0 to its end, or around
    # the first window's block (read by ranges before the downloads start, and written into
    # the download's copy instead of being fetched again)
    got = sent_ranges(srv)
    for p in paths:
        pos = 0
        for a, b in sorted(got[os.path.basename(p)]):
            assert a <= pos, (p, sorted(got[os.path.basename(p)]))
            pos = max(pos, b)
        assert pos == os.path.getsize(p)
    # nothing else of the tars was read but the downloads, the open-time checks and the
    # blocks read before their download reached them (by ranges: a download's first grain
    # is 1 MiB, these shards ~0.5 MiB), a tenth of the bytes at most
    tars = sum(os.path.getsize(p) for p in paths)
    assert sum(b - a for rs in got.values() for a, b in rs) <= (
        _whole_and_checks(paths) + tars // 10
    )
    # the downloads follow the plan's first-need order (two run at once:
    # shards_ahead=2, and the next two start as those end, at once if they end together),
    # not the shards' order: the tars' first requests past the first window's block (the
    # first request longer than the checks' 4 KiB)
    first = list(dict.fromkeys(it.plan(0).segments[:, 0].tolist()))
    with srv.lock:
        big = [os.path.basename(p) for m, p, a, b in srv.log if m == "GET" and p.endswith(".tar")
               and b - a > 8192]
    order = list(dict.fromkeys(big[1:]))
    want = [os.path.basename(paths[s]) for s in first]
    assert set(order[:2]) == set(want[:2]) and set(order[2:]) == set(want[2:])
    # each shard's version learnt once: the first window's shard from the replies of its
    # first round (no HEAD), the others ahead of their downloads, by pin_ahead (the open
    # that needs one first waits for that answer instead of sending its own HEAD)
    with srv.lock:
        heads = [os.path.basename(p) for m, p, _, _ in srv.log if m == "HEAD"]
    assert sorted(heads) == sorted(want[1:])


def test_a_block_sampler_hands_its_plan_to_the_dataset(
    served: tuple[RangeServer, list[str]],
) -> None:
    srv, paths = served
    ds = tarindex.TarDataset(f"{srv.url}/{PAT}")
    sampler = tarindex.BlockSampler(ds, block_size=16, seed=0)
    order = list(sampler)
    batches = [order[a : a + 32] for a in range(0, len(order), 32)]
    ds.__getitems__(batches[0])
    # the plan reads every shard wholly: all are fetched whole from the first batch on
    assert ds.shards.pool.whole == set(range(len(paths)))
    for b in batches[1:]:
        ds.__getitems__(b)
    assert _whole_downloads(srv, paths) == {os.path.basename(p): 1 for p in paths}


def test_a_planned_samplers_epochs_are_drawn_only_as_they_are_tried(
    served: tuple[RangeServer, list[str]],
) -> None:
    """Issue 24 (dl25): the policy drew every epoch a sampler might be on (the one running,
    the next two: ``planned_epochs``) before trying the first; a DataLoader worker spent ~4 ms
    per epoch drawn over 8,000 samples, a quarter of a persistent worker's Python time on
    local copies. Now an epoch is drawn when it is tried: one for the first epoch's reads,
    the next when a persistent worker's next epoch comes (the old one no longer fits)."""
    srv, paths = served
    ds = tarindex.TarDataset(f"{srv.url}/{PAT}")
    sampler = tarindex.BlockSampler(ds, block_size=16, seed=0)
    drawn: list[int] = []

    class Counting:
        def planned_epochs(self) -> list[int]:
            return [0, 1, 2]

        def indices(self, epoch: int) -> Any:
            drawn.append(epoch)
            return sampler.indices(epoch)

    ds.shards.follow(Counting())
    for epoch in (0, 1):
        order = sampler.indices(epoch).tolist()
        for a in range(0, len(order), 32):
            ds.__getitems__(order[a : a + 32])
        if epoch == 0:
            assert drawn == [0]  # the old code: [0, 1, 2]
    assert drawn == [0, 1]
    assert _whole_downloads(srv, paths) == {os.path.basename(p): 1 for p in paths}


def test_an_order_handed_with_follow(served: tuple[RangeServer, list[str]]) -> None:
    srv, paths = served
    ds = tarindex.TarDataset(f"{srv.url}/{PAT}")
    half = [i for i in range(len(ds)) if i < SIZES[0] or i % 10 == 0]  # shard 0 wholly
    perm = np.random.default_rng(0).permutation(half)
    ds.shards.follow(perm)
    for i in perm.tolist():
        ds[i]
    assert ds.shards.pool.whole == {0}  # the others are read a tenth: ranges
    assert _whole_downloads(srv, paths) == {"train-000000.tar": 1}


def test_the_cache_stays_within_its_bound(
    served: tuple[RangeServer, list[str]], tmp_path: Path
) -> None:
    srv, paths = served
    sizes = [os.path.getsize(p) for p in paths]
    limit = max(sizes) * 2 + 1  # two shards at most
    cache = tmp_path / "bounded"
    opts = RemoteOptions(cache_dir=str(cache), cache_bytes=limit, fetch="shard", shards_ahead=1)
    it = tarindex.TarIterableDataset(f"{srv.url}/{PAT}", seed=0, block_size=200, shuffle=False,
                                     remote=opts)
    seen = 0
    for _ in it:
        seen += 1
        used = sum(f.stat().st_size for f in cache.rglob("whole"))
        assert used <= limit
    assert seen == sum(SIZES)
    # auto: a plan whose working set is larger than the cache stays on ranges
    remote.forget_process_state()
    before = remote.stats()["shards"]
    auto = RemoteOptions(cache_dir=str(cache), cache_bytes=limit)
    assert len(list(tarindex.TarIterableDataset(f"{srv.url}/{PAT}", remote=auto))) == seen
    assert remote.stats()["shards"] == before  # (its cached chunks span these small tars)


def test_downloads_in_flight_count_against_the_cache_bound(
    served: tuple[RangeServer, list[str]], tmp_path: Path
) -> None:
    """Issue 24: a whole-shard download reserves its size when it starts (its preallocated
    temp file), so the entries and the downloads in flight together stay within
    ``cache_bytes``: 4 downloads ahead of a 2-shard cache used to hold 4 shards at once."""
    srv, paths = served
    sizes = [os.path.getsize(p) for p in paths]
    limit = max(sizes) * 2 + 1  # two shards at most
    cache = tmp_path / "bounded"
    # whole shards only (no ranged chunk cache: its inserts are not downloads)
    opts = RemoteOptions(
        whole_cache_dir=str(cache), cache_bytes=limit, fetch="shard", shards_ahead=4
    )
    srv.latency = 0.1  # downloads stay in flight a while
    # (sampled under the cache's lock: a download renamed into place during a walk of the
    # directory was counted twice, as its temp file and as its entry)
    with CacheWatch(cache, sizes) as w:
        it = tarindex.TarIterableDataset(
            f"{srv.url}/{PAT}", seed=0, block_size=8, buffer_size=8, remote=opts
        )
        keys = [s["__key__"] for s in it]
    assert sorted(keys) == [f"{i:08d}" for i in range(sum(SIZES))]
    # whole shards were downloaded (two at once at least), never more than the bound holds
    # (the entries' .sum records, 4 bytes per MiB, are written beside a reserved download)
    assert 2 * min(sizes) <= w.peak_bytes <= limit + 4096 < 4 * min(sizes), (w.peak_bytes, limit)


@pytest.mark.timeout(180)
def test_two_dataloader_workers_download_each_shard_once(
    served: tuple[RangeServer, list[str]],
) -> None:
    torch = pytest.importorskip("torch")
    srv, paths = served
    srv.latency = 0.01
    ds = tarindex.TarDataset(f"{srv.url}/{PAT}", remote=RemoteOptions(fetch="shard"))
    loader = torch.utils.data.DataLoader(
        ds, batch_size=16, shuffle=True, num_workers=2, multiprocessing_context="fork",
        collate_fn=_keys, generator=torch.Generator().manual_seed(0),
    )
    keys = sorted(k for b in loader for k in b)
    assert keys == [f"{i:08d}" for i in range(sum(SIZES))]
    # each byte of each tar sent once: two workers wanting one shard joined one download
    # (beside it, each worker's open-time checks of a shard it opened while it downloaded)
    assert _whole_downloads(srv, paths) == {os.path.basename(p): 1 for p in paths}
    tar_bytes = sum(os.path.getsize(p) for p in paths)
    checks = _whole_and_checks(paths) - tar_bytes
    assert sum(b - a for rs in sent_ranges(srv).values() for a, b in rs) <= tar_bytes + 2 * checks


@pytest.mark.timeout(180)
def test_a_plan_less_shuffled_dataloader_downloads_each_shard_once_early(
    served: tuple[RangeServer, list[str]],
) -> None:
    """``DataLoader(shuffle=True)`` with no plan (``fetch="auto"``): two workers, each seeing
    its batches spread over all shards, switch them whole after two batches; each shard is
    sent whole once (a worker joins the other's download), and the ranged reads before the
    switch are a few per worker, not 1/16 of every shard."""
    torch = pytest.importorskip("torch")
    srv, paths = served
    srv.latency = 0.01
    ds = tarindex.TarDataset(f"{srv.url}/{PAT}")
    loader = torch.utils.data.DataLoader(
        ds, batch_size=16, shuffle=True, num_workers=2, multiprocessing_context="fork",
        collate_fn=_keys, generator=torch.Generator().manual_seed(0),
    )
    keys = sorted(k for b in loader for k in b)
    assert keys == [f"{i:08d}" for i in range(sum(SIZES))]
    assert _whole_downloads(srv, paths) == {os.path.basename(p): 1 for p in paths}
    gets = sum(len(rs) for rs in sent_ranges(srv).values())
    assert gets < 2 * SPREAD_MIN + 2 * 4 * 12, gets  # 2 x 4 x ADAPT_MIN before


def _keys(batch: list[Any]) -> list[str]:
    return [s["__key__"] for s in batch]


def test_a_replaced_object_is_stale_through_whole_shard_fetches(
    served: tuple[RangeServer, list[str]], tmp_path: Path
) -> None:
    srv, paths = served
    cache = tmp_path / "c"
    opts = RemoteOptions(cache_dir=str(cache), fetch="shard", shards_ahead=0)
    url = f"{srv.url}/train-000001.tar"
    ident = "test-ident"
    pin = stat(url, opts)
    key = tar_key(url, pin.size, ident, pin)
    dc = opts.whole_cache()
    held = dc.lock(key, WHOLE)  # another process is downloading it
    assert held is not None
    got: list[BaseException | None] = []

    def download() -> None:
        try:
            copy = remote.local_copy(url, opts, ident)  # pins, then waits for the lock
            assert copy is not None
            os.close(copy[0])
            got.append(None)
        except BaseException as e:
            got.append(e)

    t = threading.Thread(target=download)
    t.start()
    deadline = time.monotonic() + 10
    while sum(m == "HEAD" for m, *_ in srv.log) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    data = bytearray(Path(paths[1]).read_bytes())
    data[5000] ^= 0xFF  # same size, other bytes: a new version (new ETag)
    tmp = paths[1] + ".new"
    Path(tmp).write_bytes(bytes(data))
    os.replace(tmp, paths[1])
    dc.unlock(held)  # the other download "failed": this one downloads, pinned to the old
    t.join(30)
    assert len(got) == 1 and isinstance(got[0], StaleIndexError), got
    assert "train-000001.tar" in str(got[0])
    assert not list(cache.rglob("whole"))  # nothing of either version kept
    # through a dataset: a replaced tar whose first 4 KiB changed is downloaded (a new
    # version, a new entry), and the open-time checks on the local copy refuse it
    remote.forget_process_state()
    data[0:100] = bytes(100)
    Path(tmp).write_bytes(bytes(data))
    os.replace(tmp, paths[1])
    ds = tarindex.TarDataset(f"{srv.url}/{PAT}", remote=opts)
    assert ds[0]["__key__"] == "00000000"
    with pytest.raises(StaleIndexError, match=r"train-000001\.tar"):
        ds[SIZES[0]]


def test_opening_sends_no_request_and_the_first_read_carries_the_checks(
    served: tuple[RangeServer, list[str]],
) -> None:
    srv, paths = served
    url = f"{srv.url}/{PAT}"
    remote.fetch([(f"{srv.url}/train-000000.tar", 0, 512)])  # a warm connection
    srv.reset()
    ds = tarindex.TarDataset(url)
    assert srv.requests == len(paths)  # the indexes, nothing else
    srv.reset()
    ds.shards.pool.reader(0)  # the read path's open: no request
    assert srv.requests == 0
    local = tarindex.ShardSet(paths)
    assert ds[3]["bin"] == local.sample(3)["bin"]
    with srv.lock:
        log = list(srv.log)
    assert [m for m, *_ in log] == ["GET"] * len(log)  # no HEAD: the replies name the version
    r = local.reader(0)
    lo, hi = r.member_slice(3)
    a = int(r.index.offset[lo:hi].min())
    assert any(s <= a < e for _, _, s, e in log)  # the sample ...
    assert any(s == 0 for _, _, s, _ in log)  # ... and the checks (first 4 KiB), one round
    srv.reset()
    assert ds[4]["bin"] == local.sample(4)["bin"]
    assert srv.requests == 1  # pinned now: one ranged read per sample


def test_a_tar_changed_since_its_index_is_refused_at_its_first_read(
    served: tuple[RangeServer, list[str]],
) -> None:
    srv, paths = served
    data = bytearray(Path(paths[2]).read_bytes())
    data[100] ^= 0xFF  # inside the first 4 KiB: the fingerprint differs
    Path(paths[2] + ".new").write_bytes(bytes(data))
    os.replace(paths[2] + ".new", paths[2])
    ds = tarindex.TarDataset(f"{srv.url}/{PAT}")
    assert ds[0]["__key__"] == "00000000"  # other shards read
    with pytest.raises(StaleIndexError, match=r"train-000002\.tar"):
        ds[SIZES[0] + SIZES[1]]
    with pytest.raises(StaleIndexError, match=r"train-000002\.tar"):  # and never later
        ds.__getitems__([SIZES[0] + SIZES[1] + 1, 1])


@pytest.mark.timeout(120)
def test_a_process_exits_promptly_with_a_download_running(
    served: tuple[RangeServer, list[str]], tmp_path: Path
) -> None:
    """Issue 24: exit does not wait for whole-shard downloads in flight (they ran on
    ``ThreadPoolExecutor`` threads, joined at exit: a process that finished its epoch waited
    for every download), and leaves the cache consistent: the cut download is never
    trusted, the next process downloads the shard again and reads the right bytes."""
    import subprocess
    import sys

    srv, paths = served
    cache = tmp_path / "whole"
    url = f"{srv.url}/train-000000.tar"
    t = tarindex.ShardReader(paths[0]).index
    ident = f"{t.tar_size}:{t.head_crc}:{t.tail_crc}"
    code = (
        "import sys, time, tarindex\n"
        "from tarindex.storage import remote\n"
        f"opts = tarindex.RemoteOptions(whole_cache_dir={str(cache)!r})\n"
        f"f = remote.fetch_ahead({url!r}, opts, {ident!r})\n"
        "time.sleep(1.0)\n"
        "assert not f.done()\n"
        "print('exiting', flush=True)\n"
    )
    srv.trickle = 0.0005  # a body takes minutes
    t0 = time.monotonic()
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    took = time.monotonic() - t0
    srv.trickle = 0.0
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "exiting"
    assert took < 20, took  # the old code waited for the download (minutes here)
    remote.forget_process_state()
    opts = RemoteOptions(whole_cache_dir=str(cache))
    got = remote.local_copy(url, opts, ident)  # the cut one is not an entry: downloaded again
    assert got is not None
    fd, size, _ = got
    try:
        assert os.pread(fd, size, 0) == Path(paths[0]).read_bytes()
    finally:
        os.close(fd)


def test_the_next_shards_of_a_plan_from_any_position() -> None:
    """The downloads' order from a plan position (``_next_need``, searched in the plan's
    positions grouped by shard) is the first-need order of the plan's rest: it sorted the
    whole rest of the plan at every read (0.45 ms a ``ds[i]`` over 8,000 samples)."""
    from tarindex.read.fetchpolicy import _first_need, _next_need

    rng = np.random.default_rng(3)
    for _ in range(200):
        shards, n = int(rng.integers(1, 12)), int(rng.integers(1, 150))
        sid = rng.integers(0, shards, n)
        if rng.random() < 0.3:  # shard by shard, as a sequential plan
            sid = np.sort(sid)
        last = np.full(shards, -1, np.int64)
        last[sid] = np.arange(n)
        occ = np.argsort(sid, kind="stable")
        plan = {"sid": sid, "last": last, "occ": sid[occ] * (n + 1) + occ}
        for pos in range(n + 1):
            assert _next_need(plan, pos) == _first_need(sid[pos:]), (sid.tolist(), pos)


@pytest.mark.timeout(180)
def test_each_worker_weighs_its_reads_by_the_workers_sharing_the_epoch(
    serve_shards: ServeShards,
) -> None:
    """Two workers each read about half of a shuffled epoch: a worker's first batch of 40 is
    80 of the job's samples, past SPREAD (64 of these 4,100), so it switches the shards at
    once; counting its own 40 alone it read a second batch by ranges first."""
    torch = pytest.importorskip("torch")
    from tarindex.torch.dataset import TarDataset

    class _Probe(TarDataset):
        """Each batch: the shards this worker read whole when it read the batch, then keys."""

        def __getitems__(self, indices: Any) -> Any:
            got = super().__getitems__(indices)
            assert isinstance(self.shards, tarindex.ShardSet)
            return [len(self.shards.pool.whole)] + [s["__key__"] for s in got]

    srv, paths = serve_shards([1100, 1000, 1050, 950])
    ds = _Probe(f"{srv.url}/train-{{000000..000003}}.tar")
    assert 40 < SPREAD * len(ds) <= 2 * 40 and SPREAD_MIN <= 40
    loader = torch.utils.data.DataLoader(
        ds, batch_size=40, shuffle=True, num_workers=2, multiprocessing_context="fork",
        collate_fn=lambda b: b, generator=torch.Generator().manual_seed(0),
    )
    it = iter(loader)
    first = [next(it), next(it)]  # worker 0's first batch, then worker 1's
    assert [b[0] for b in first] == [4, 4]
    keys = sorted(k for b in [*first, *it] for k in b[1:])
    assert keys == [f"{i:08d}" for i in range(len(ds))]
    assert _whole_downloads(srv, paths) == {os.path.basename(p): 1 for p in paths}


def test_a_whole_download_takes_the_chunks_read_before_it_from_the_cache(
    served: tuple[RangeServer, list[str]], tmp_path: Path
) -> None:
    """A job read part of a shard by ranges into ``cache_dir`` (chunks) before the shard went
    whole (the spread rule, ``fetch="shard"`` later): its download writes the cached chunks
    into the copy and fetches only the rest, so no byte comes twice. Before, the download
    fetched the whole tar again (a plan-less 2-worker DataLoader over small shards sent 2.6x
    their bytes: test_remote_procs)."""
    srv, paths = served
    cache = str(tmp_path / "cache")
    url = f"{srv.url}/{PAT}"
    chunk = 16384
    ranged = tarindex.TarDataset(
        url, remote=RemoteOptions(cache_dir=cache, chunk_bytes=chunk, fetch="range")
    )
    first = int(ranged.shards.starts[1])
    for i in range(0, first, 2):  # the first shard's samples, every other one
        ranged[i]
    size0 = os.path.getsize(paths[0])
    assert not _whole_downloads(srv, paths)
    remote.forget_process_state()  # a fresh process: the same cache, switched whole
    srv.reset()
    whole = tarindex.TarDataset(
        url, remote=RemoteOptions(cache_dir=cache, chunk_bytes=chunk, fetch="shard", shards_ahead=0)
    )
    local = tarindex.ShardSet(paths)
    for i in range(first):
        assert whole[i]["bin"] == local.sample(i)["bin"]
    sent = sent_ranges(srv).get(os.path.basename(paths[0]), [])
    assert not _whole_downloads(srv, paths[:1])  # the holes only
    cached = [f for f in Path(cache).glob("??/*/*") if f.name.isdigit()]
    assert len(cached) >= 3
    hole_bytes = sum(b - a for a, b in sent)
    checks = _whole_and_checks(paths[:1]) - size0  # the new open's checks
    assert hole_bytes <= size0 - (len(cached) - 1) * chunk + checks
