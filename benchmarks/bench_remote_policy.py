"""Remote training at the server's bandwidth (issue 24): the fetch policy against wids.

Data: ``--samples`` seeded samples (``bin`` of ~``--size`` random bytes, ``cls``) in
``--shards`` tarindex shards, served by (a) tests/remote_server.py (HTTP with Range, its own
process on 127.0.0.1, ``--latency`` seconds added to every request, counting requests and
bytes) and (b) moto's S3 server (``s3fs``; requests and bytes counted by tarindex itself).
Every row runs in a fresh Python process with a fresh directory for whole shards
(``whole_cache_dir``; no ``cache_dir``, so ranged reads are exact) and fresh indexes, after
one ranged request that warms the connection pool.

Rows (per server and latency):

* ``limit``: the server's sequential limit, every shard in one GET, all at once (fsspec);
* ``ceiling``: the ``DataLoader`` (``BlockSampler``) and ``stream`` rows over the local tars
  (no network): what this machine's processes do with the bytes once they are here;
* ``DataLoader``: one shuffled epoch, 2 workers, batch 64 (``tarindex.BlockSampler``, which
  hands its plan to the dataset; ``shuffle=True`` with no plan; wids'
  ``ShardListDataset`` with ``DistributedChunkedSampler``, its documented sampler; every
  row's batches reach the main process with their samples' bytes);
* ``dl-block-2``: that ``BlockSampler`` DataLoader with ``persistent_workers=True``; the first
  epoch (forks, torch's shm manager, downloads) is untimed, the second is timed and counted
  alone (requests, bytes, the workers' CPU; the server's CPU covers both): the steady state
  with the copies here; ``dl-block-2-gone``: the same after the copies were deleted, so the
  second epoch downloads every shard again with no start-up in the clock (the transfer
  alone); ``local-dl-block-2``: over the local tars (the steady-state ceiling);
* ``ds[i] epoch``: every sample once in a random order, one process (tarindex with the
  order handed by ``ds.shards.follow(perm)``, and without; wids);
* ``sparse 1%``: 1% of the samples at random, one process: bytes fetched / bytes asked
  (the members' bytes), counted after the shards were opened (indexes and open-time
  checks, ~17 KiB per shard, reported apart);
* ``stream``: one ``TarIterableDataset`` epoch in one process; ``stream-gone``: a second
  epoch in the same process after its whole copies were deleted (a tmp cleaner, another
  process's eviction), timed and counted alone;
* ``first sample``: construction and the first sample, on a warm connection: the process
  has talked to the server once before the clock starts (one 512-byte ranged GET of shard 0
  through tarindex's pool, which keeps that one connection open and notes that the server
  honours Range; it learns no index, size or version; every other request opens its own
  connection). webdataset and wids start their own ``curl``/HTTP clients, as they always do
  (they reuse nothing; plain HTTP on loopback, so no TLS for anyone). Imports are outside
  the clock for every row: ``TarDataset(url)[0]``, ``next(iter(TarIterableDataset(url)))``,
  webdataset ``next(iter(WebDataset(urls)))`` (no shard shuffle), wids
  ``ShardListDataset(spec)[0]``; the stream also with ``shuffle=False`` (webdataset's row
  reads its first shard in order too); ``open_ms`` in the JSON is the construction alone.

Each row also gives the CPU seconds of its processes (``cpu s``): the reader's main process,
its DataLoader workers (and any other child it waited for), and the HTTP server.

Run: ``python benchmarks/bench_remote_policy.py [--quick] [--latency 0 0.02] [--no-s3]
[--rows first first-stream first-stream-ordered wds-first wids-first] [--repeat 5]``
(``--repeat``: the median of fresh processes per row).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from typing import Any

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import tarindex  # noqa: E402

CHILD = r"""
import dataclasses, json, os, shutil, sys, time, urllib.request
sys.path.insert(0, sys.argv[1])
cfg = json.loads(sys.argv[2])
import numpy as np, torch, tarindex
from tarindex.storage import remote
urls, kind, so = cfg["urls"], cfg["kind"], cfg["so"]


def children_cpu():  # CPU seconds so far of the live children (persistent DataLoader workers)
    tot = 0.0
    for d in os.listdir("/proc"):
        try:
            with open(f"/proc/{d}/stat") as f:
                x = f.read().rsplit(")", 1)[1].split()
        except (OSError, ValueError):
            continue
        if int(x[1]) == os.getpid():
            tot += (int(x[11]) + int(x[12])) / os.sysconf("SC_CLK_TCK")
    return tot


opts = tarindex.RemoteOptions(storage_options=so, whole_cache_dir=cfg["cache"], cache_bytes=8 << 30)
fs = remote.filesystem(urls[0], opts)
remote.fetch([(urls[0], 0, 512)], opts)  # warm the connection pool
tarindex.TarDataset, tarindex.TarIterableDataset  # imported (lazily) before the clock starts
if kind.startswith("wids"):
    import wids
if kind.startswith("wds"):
    import webdataset as wds
remote.stats(reset=True)
n = cfg["n"]
out = {}
t0 = time.perf_counter()
c0 = time.process_time()
if kind == "limit":
    got = fs.cat([remote.transport.fs_path(u) for u in urls])
    out["samples"] = n
elif kind.startswith("dl-block-2"):  # epoch 2 on persistent workers, timed alone
    ds = tarindex.TarDataset(urls, remote=opts, batched=True)
    sampler = tarindex.BlockSampler(ds, block_size=64, seed=0)
    loader = torch.utils.data.DataLoader(ds, batch_size=64, sampler=sampler, num_workers=2,
        collate_fn=tarindex.collate_batched, multiprocessing_context="fork",
        persistent_workers=True)
    out["first_samples"] = sum(len(b) for b in loader)  # forks, shm manager, downloads
    out["first_seconds"] = time.perf_counter() - t0
    if kind == "dl-block-2-gone":  # the copies deleted: the transfer again, no start-up
        shutil.rmtree(cfg["cache"])
    if cfg["reset"]:
        urllib.request.urlopen(cfg["reset"]).read()
    sampler.set_epoch(1)
    w0 = children_cpu()
    t0, c0 = time.perf_counter(), time.process_time()
    out["samples"] = sum(len(b) for b in loader)
    out["workers_epoch2"] = children_cpu() - w0  # the workers are still alive
elif kind.startswith("dl-"):
    ds = tarindex.TarDataset(urls, remote=opts, batched=True)
    if kind == "dl-block":
        sampler = tarindex.BlockSampler(ds, block_size=64, seed=0)
        loader = torch.utils.data.DataLoader(ds, batch_size=64, sampler=sampler, num_workers=2,
            collate_fn=tarindex.collate_batched, multiprocessing_context="fork")
    else:
        loader = torch.utils.data.DataLoader(ds, batch_size=64, shuffle=True, num_workers=2,
            collate_fn=tarindex.collate_batched, multiprocessing_context="fork",
            generator=torch.Generator().manual_seed(0))
    out["samples"] = sum(len(b) for b in loader)
elif kind.startswith("idx-"):
    ds = tarindex.TarDataset(urls, remote=opts)
    perm = np.random.default_rng(0).permutation(len(ds))
    if kind == "idx-sparse":
        perm = perm[: max(1, len(ds) // 100)]
    if kind == "idx-follow":
        ds.shards.follow(perm)
    if kind == "idx-sparse":  # the bytes of the reads alone: indexes and checks first
        for s in range(ds.shards.n_shards):
            ds.shards.reader(s)
        out["open_requests"], out["open_bytes"] = remote.stats()["requests"], remote.stats()["bytes"]
        if cfg["reset"]:
            urllib.request.urlopen(cfg["reset"]).read()
        remote.stats(reset=True)
        t0 = time.perf_counter()
    asked = 0
    for i in perm.tolist():
        s = ds[i]
        asked += sum(len(v) for k, v in s.items() if not k.startswith("__"))
        del s
    out["samples"] = len(perm)
    out["asked"] = asked
elif kind == "stream":
    it = tarindex.TarIterableDataset(urls, remote=opts, seed=0)
    out["samples"] = sum(1 for _ in it)
elif kind == "stream-gone":  # a second epoch in this process, its copies deleted underneath
    out["first_samples"] = sum(1 for _ in tarindex.TarIterableDataset(urls, remote=opts, seed=0))
    shutil.rmtree(cfg["cache"])  # a tmp cleaner, another process's eviction
    if cfg["reset"]:
        urllib.request.urlopen(cfg["reset"]).read()
    remote.stats(reset=True)
    t0, c0 = time.perf_counter(), time.process_time()  # the second epoch alone
    it = tarindex.TarIterableDataset(urls, remote=opts, seed=1)
    out["samples"] = sum(1 for _ in it)
elif kind == "first":
    ds = tarindex.TarDataset(urls, remote=opts)
    out["open_ms"] = (time.perf_counter() - t0) * 1e3
    ds[0]
    out["samples"] = 1
elif kind.startswith("first-stream"):  # -ordered: no shuffle, as webdataset's row
    if "-range" in kind:  # ranged reads, no whole shards
        opts = dataclasses.replace(opts, fetch="range")
    it = iter(tarindex.TarIterableDataset(urls, remote=opts, seed=0,
                                          shuffle=not kind.endswith("-ordered")))
    out["open_ms"] = (time.perf_counter() - t0) * 1e3
    next(it)
    out["samples"] = 1
elif kind == "wds-first":
    it = iter(wds.WebDataset(urls, shardshuffle=False, empty_check=False))
    out["open_ms"] = (time.perf_counter() - t0) * 1e3
    next(it)
    out["samples"] = 1
elif kind.startswith("wids"):
    spec = [{"url": u, "nsamples": c} for u, c in zip(urls, cfg["counts"])]
    ds = wids.ShardListDataset(spec, cache_dir=cfg["cache"], keep=True)
    if kind == "wids-first":
        out["open_ms"] = (time.perf_counter() - t0) * 1e3
        ds[0]
        out["samples"] = 1
    elif kind == "wids-dl":
        sampler = wids.DistributedChunkedSampler(ds, chunksize=1000, shuffle=True)
        # the batch's samples go to the main process, as tarindex's batches do (a collate
        # returning len(b) would leave every byte in the workers)
        loader = torch.utils.data.DataLoader(ds, batch_size=64, sampler=sampler, num_workers=2,
            collate_fn=lambda b: b, multiprocessing_context="fork")
        out["samples"] = sum(len(b) for b in loader)
    else:
        perm = np.random.default_rng(0).permutation(len(ds))
        for i in perm.tolist():
            ds[i]
        out["samples"] = len(perm)
out["seconds"] = time.perf_counter() - t0
import resource  # CPU seconds: this process, and its workers (joined when the loader ended)
out["cpu_main"] = time.process_time() - c0
ch = resource.getrusage(resource.RUSAGE_CHILDREN)
out["cpu_workers"] = out.pop("workers_epoch2", ch.ru_utime + ch.ru_stime)
st = remote.stats()
out["client_requests"], out["client_bytes"] = st["requests"], st["bytes"]
print(json.dumps(out))
"""


def make_data(root: str, n: int, size: int, shards: int) -> list[str]:
    rng = np.random.default_rng(0)
    pool = rng.integers(0, 256, 2 * size + 1, dtype=np.uint8).tobytes()
    per = -(-n // shards)
    with tarindex.ShardWriter(os.path.join(root, "r-%06d.tar"), maxcount=per, mtime=0) as w:
        for i in range(n):
            k = int(rng.integers(size // 2, size * 3 // 2 + 1))
            o = int(rng.integers(0, len(pool) - k + 1))
            w.write({"__key__": f"{i:09d}", "bin": pool[o : o + k], "cls": i % 1000})
    return sorted(os.path.join(root, f) for f in os.listdir(root) if f.endswith(".tar"))


class Http:
    def __init__(self, root: str, latency: float) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.remote_server", root, str(latency)],
            cwd=ROOT, stdout=subprocess.PIPE, text=True,
        )
        assert self.proc.stdout is not None
        self.url = self.proc.stdout.readline().strip()

    def cpu(self) -> float:
        """The server process's CPU seconds so far."""
        with open(f"/proc/{self.proc.pid}/stat") as f:
            x = f.read().rsplit(")", 1)[1].split()
        return (int(x[11]) + int(x[12])) / os.sysconf("SC_CLK_TCK")

    def stats(self, reset: bool = False) -> dict[str, int]:
        import urllib.request

        with urllib.request.urlopen(self.url + ("/__reset" if reset else "/__stats")) as r:
            out: dict[str, int] = json.loads(r.read())
        return out

    def close(self) -> None:
        self.proc.terminate()
        self.proc.wait(10)


def s3_server(paths: list[str]) -> tuple[Any, dict[str, Any], list[str]]:
    from moto.server import ThreadedMotoServer

    for k, v in (("AWS_ACCESS_KEY_ID", "testing"), ("AWS_SECRET_ACCESS_KEY", "testing"),
                 ("AWS_DEFAULT_REGION", "us-east-1")):
        os.environ[k] = v
    srv = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    srv.start()
    host, port = srv.get_host_and_port()
    ep = f"http://{host}:{port}"
    so = {"s3": {"key": "testing", "secret": "testing",
                 "client_kwargs": {"endpoint_url": ep, "region_name": "us-east-1"}}}
    import boto3
    import s3fs

    boto3.client("s3", endpoint_url=ep, region_name="us-east-1").create_bucket(Bucket="shards")
    fs = s3fs.S3FileSystem(skip_instance_cache=True, **so["s3"])
    for p in paths:
        for f in (p, p + ".tidx"):
            fs.put_file(f, f"shards/{os.path.basename(f)}")
    return srv, so, [f"s3://shards/{os.path.basename(p)}" for p in paths]


def child(cfg: dict[str, Any]) -> dict[str, Any]:
    r = subprocess.run([sys.executable, "-c", CHILD, ROOT, json.dumps(cfg)], capture_output=True,
                       text=True, timeout=900, cwd=ROOT)
    if r.returncode:
        return {"error": r.stderr.strip().splitlines()[-1] if r.stderr.strip() else "failed"}
    out: dict[str, Any] = json.loads(r.stdout.strip().splitlines()[-1])
    return out


ROWS = [
    ("limit", "server limit: every shard in one GET, all at once"),
    ("local-dl-block", "ceiling: that DataLoader over the local tars"),
    ("local-stream", "ceiling: that streaming epoch over the local tars"),
    ("dl-block", "DataLoader 2w b64: tarindex + BlockSampler (plan)"),
    ("dl-shuffle", "DataLoader 2w b64: tarindex shuffle=True (no plan)"),
    ("local-dl-block-2", "ceiling: epoch 2 on persistent workers, local tars"),
    ("dl-block-2", "DataLoader epoch 2, persistent workers, copies here"),
    ("dl-block-2-gone", "DataLoader epoch 2, persistent workers, copies gone"),
    ("wids-dl", "DataLoader 2w b64: wids + DistributedChunkedSampler"),
    ("idx-follow", "ds[i] epoch: tarindex, order handed (follow)"),
    ("idx-auto", "ds[i] epoch: tarindex, no plan"),
    ("wids-idx", "ds[i] epoch: wids"),
    ("idx-sparse", "sparse 1% ds[i]: tarindex"),
    ("stream", "streaming epoch: tarindex TarIterableDataset"),
    ("stream-gone", "streaming epoch 2, its copies deleted: tarindex"),
    ("first", "first sample, warm: TarDataset(url)[0]"),
    ("first-stream", "first sample, warm: next(iter(TarIterableDataset(url)))"),
    ("first-stream-ordered", "first sample, warm: same, shuffle=False"),
    ("first-stream-range", "first sample, warm: same, shuffled, fetch='range'"),
    ("first-stream-range-ordered", "first sample, warm: same, shuffle=False, fetch='range'"),
    ("wds-first", "first sample, warm: webdataset next(iter(WebDataset(url)))"),
    ("wids-first", "first sample, warm: wids ShardListDataset(spec)[0]"),
]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true")
    p.add_argument("--samples", type=int, default=8000)
    p.add_argument("--size", type=int, default=16384)
    p.add_argument("--shards", type=int, default=8)
    p.add_argument("--latency", type=float, nargs="+", default=[0.0, 0.02])
    p.add_argument("--no-s3", action="store_true")
    p.add_argument("--json", default=None)
    p.add_argument("--rows", nargs="+", default=None, metavar="KEY",
                   help="run only these rows (keys: " + ", ".join(k for k, _ in ROWS) + ")")
    p.add_argument("--repeat", type=int, default=1,
                   help="runs per row (fresh processes); the median's row is kept")
    a = p.parse_args()
    if a.quick:
        a.samples = 2000
    tmp = tempfile.mkdtemp(prefix="bench-policy-")
    results: list[dict[str, Any]] = []
    try:
        data = os.path.join(tmp, "data")
        os.makedirs(data)
        paths = make_data(data, a.samples, a.size, a.shards)
        counts = [len(tarindex.ShardSet([x])) for x in paths]
        tar_bytes = sum(os.path.getsize(x) for x in paths)
        servers: list[tuple[str, float]] = [("http", lat) for lat in a.latency]
        if not a.no_s3:
            servers.append(("s3", 0.0))
        s3 = None
        for kind_srv, lat in servers:
            http = None
            if kind_srv == "http":
                http = Http(data, lat)
                urls, so = [f"{http.url}/{os.path.basename(x)}" for x in paths], {}
            else:
                if s3 is None:
                    s3 = s3_server(paths)
                _, so, urls = s3
            limit_rate = 0.0
            for key, label in ROWS:
                if key.startswith(("wids", "wds", "local-")) and kind_srv != "http":
                    continue
                if a.rows and key not in a.rows and key != "limit":
                    continue
                runs = []
                for _ in range(max(1, a.repeat)):
                    cache = os.path.join(tmp, f"cache-{len(results)}")
                    if http is not None:
                        http.stats(reset=True)
                    cpu0 = http.cpu() if http is not None else 0.0
                    local = key.startswith("local-")  # the same row, no network
                    got = child({"urls": paths if local else urls,
                                 "kind": key.removeprefix("local-"), "so": so, "cache": cache,
                                 "n": a.samples, "counts": counts,
                                 "reset": f"{http.url}/__reset" if http is not None else None})
                    shutil.rmtree(cache, ignore_errors=True)
                    if http is not None:
                        got["cpu_server"] = http.cpu() - cpu0
                        st = http.stats()
                        reqs, nbytes = st["requests"], st["bytes_sent"]
                    else:
                        reqs, nbytes = got.get("client_requests", -1), got.get("client_bytes", -1)
                        if key.startswith("dl-"):
                            reqs = nbytes = -1  # the workers' counters stay in the workers
                    runs.append((got.get("seconds", float("inf")), got, reqs, nbytes))
                runs.sort(key=lambda r: r[0])
                _, got, reqs, nbytes = runs[len(runs) // 2]
                rate = got.get("samples", 0) / got["seconds"] if "seconds" in got else 0.0
                if key == "limit":
                    limit_rate = rate
                row = {"server": kind_srv, "latency_ms": lat * 1e3, "row": label, "key": key,
                       "samples_per_s": rate, "seconds": got.get("seconds"),
                       "of_limit": rate / limit_rate if limit_rate else 0.0,
                       "requests": reqs, "bytes": nbytes,
                       "bytes_per_dataset": nbytes / tar_bytes if nbytes >= 0 else None,
                       "open_ms": got.get("open_ms"), "error": got.get("error")}
                cpu: dict[str, float] = {k[4:]: got[k] for k in ("cpu_main", "cpu_workers",
                                                                  "cpu_server") if k in got}
                row["cpu_s"] = cpu
                if key == "idx-sparse" and got.get("asked"):
                    row["bytes_per_asked"] = nbytes / got["asked"]
                results.append(row)
                extra = (f" fetched/asked {row['bytes_per_asked']:.2f}"
                         if "bytes_per_asked" in row else "")
                print(f"{kind_srv:4s} {lat * 1e3:3.0f} ms  {label:52s} "
                      f"{rate:9,.0f}/s  {row['of_limit']:5.2f}x limit  "
                      f"{got.get('seconds', 0) * 1e3:8.0f} ms  req {reqs:6d}  "
                      f"bytes {nbytes / tar_bytes if nbytes >= 0 else -1:5.2f}x{extra}"
                      f"  cpu s {' '.join(f'{k} {v:.2f}' for k, v in cpu.items())}"
                      f"{'  ERROR ' + str(row['error']) if row['error'] else ''}", flush=True)
            if http is not None:
                http.close()
        if s3 is not None:
            s3[0].stop()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"args": vars(a), "rows": results}, f, indent=2)


if __name__ == "__main__":
    main()
