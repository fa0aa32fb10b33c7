"""Remote shards over HTTP: random access, batches, streaming, next to webdataset, one run.

Setup: seeded samples (``bin`` of random bytes, size uniform in ``[size/2, 3*size/2]``, plus
``cls``) written as tarindex shards; a Range-honouring HTTP server (tests/remote_server.py) in
its own process on 127.0.0.1 adds ``--latency`` seconds (default 20 ms) to every request and
counts requests and body bytes. Client: this process, no decoding. Rows:

* server bandwidth: one sequential GET of all the shards concatenated (``all.bin``), one
  concurrent GET per whole shard, and all the shards in 4 MiB ranged GETs 64 in flight, all
  through fsspec; the best of the three is the limit streaming is compared with;
* random access ``ds[i]`` (one ranged read per sample) and ``ds.shards.sample(i)`` without the
  sample prefetch (one request per member: no coalescing);
* random batches of 64 through ``__getitems__`` (one concurrent round of coalesced ranges
  per batch), list of dicts and ``batched=True``;
* streaming one shuffled epoch with read-ahead (default budget) and without
  (``readahead_bytes=0``); shards opened inside the epoch (first epoch of a process);
* webdataset ``WebDataset(urls)`` streaming the same URLs (whole-shard downloads with curl).
  Its random access would download a whole shard per sample: the bytes column says so.

Bytes per sample = body bytes the server sent / samples read; the ratio ``x`` is against the
members' bytes of the samples asked for (random access) or the shards' bytes (streaming,
bandwidth rows). Random-access rows are measured after the shards were opened (each index is
fetched once, and the open-time checks read ~17 KiB per shard: reported as "open"). The
server's bandwidth is the best of the three bandwidth rows.

Run: ``python benchmarks/bench_remote.py [--quick] [--samples N] [--size BYTES]
[--shards S] [--latency SECONDS] [--json PATH]``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from typing import Any

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import tarindex  # noqa: E402
from tarindex.storage import remote  # noqa: E402


def make_data(root: str, n: int, size: int, shards: int, seed: int = 0) -> list[str]:
    rng = np.random.default_rng(seed)
    pool = rng.integers(0, 256, 2 * size + 1, dtype=np.uint8).tobytes()
    per = -(-n // shards)
    with tarindex.ShardWriter(os.path.join(root, "r-%06d.tar"), maxcount=per, mtime=0) as w:
        for i in range(n):
            k = int(rng.integers(size // 2, size * 3 // 2 + 1))
            o = int(rng.integers(0, len(pool) - k + 1))
            w.write({"__key__": f"{i:09d}", "bin": pool[o : o + k], "cls": i % 1000})
    paths = sorted(os.path.join(root, f) for f in os.listdir(root) if f.endswith(".tar"))
    with open(os.path.join(root, "all.bin"), "wb") as out:
        for p in paths:
            with open(p, "rb") as f:
                shutil.copyfileobj(f, out)
    return paths


class Server:
    """tests/remote_server.py in a child process; counters over its control URLs."""

    def __init__(self, root: str, latency: float) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.remote_server", root, str(latency)],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.proc.stdout is not None
        self.url = self.proc.stdout.readline().strip()

    def stats(self, reset: bool = False) -> dict[str, int]:
        with urllib.request.urlopen(self.url + ("/__reset" if reset else "/__stats")) as r:
            out: dict[str, int] = json.loads(r.read())
        return out

    def close(self) -> None:
        self.proc.terminate()
        self.proc.wait(10)
        if self.proc.stdout is not None:
            self.proc.stdout.close()


def _fresh() -> None:
    remote.forget_process_state()


def members_bytes(local: tarindex.ShardSet, idx: list[int]) -> int:
    tot = 0
    for i in idx:
        s, j = local.locate(i)
        r = local.reader(s)
        lo, hi = r.member_slice(j)
        tot += int(r.index.size[lo:hi].astype(np.int64).sum())
    return tot


def run(args: argparse.Namespace) -> list[dict[str, Any]]:
    import torch  # noqa: F401  (the datasets need it)

    tmp = tempfile.mkdtemp(prefix="bench-remote-")
    rows: list[dict[str, Any]] = []
    srv: Server | None = None
    try:
        paths = make_data(tmp, args.samples, args.size, args.shards)
        local = tarindex.ShardSet(paths)
        n = len(local)
        tar_bytes = sum(os.path.getsize(p) for p in paths)
        data_bytes = members_bytes(local, list(range(n)))
        srv = Server(tmp, args.latency)
        names = [os.path.basename(p) for p in paths]
        pattern = f"{srv.url}/r-{{000000..{len(paths) - 1:06d}}}.tar"

        def row(name: str, samples: int, dt: float, fetched: int, want: int, note: str = "") -> None:
            rows.append(
                {
                    "row": name,
                    "samples_per_s": samples / dt if dt else 0.0,
                    "bytes_per_sample": fetched / max(samples, 1),
                    "bytes_ratio": fetched / want if want else 0.0,
                    "MB_per_s": fetched / dt / 1e6 if dt else 0.0,
                    "note": note,
                }
            )
            r = rows[-1]
            print(
                f"{name:58s} {r['samples_per_s']:10,.0f}/s {r['bytes_per_sample']:10,.0f} B/sample "
                f"x{r['bytes_ratio']:5.2f} {r['MB_per_s']:8.1f} MB/s  {note}",
                flush=True,
            )

        # the physical limit: one sequential GET
        fs = remote.filesystem(srv.url)
        srv.stats(reset=True)
        t = time.perf_counter()
        big = fs.cat_file(f"{srv.url}/all.bin")
        dt = time.perf_counter() - t
        bw1 = len(big) / dt
        del big
        row("server bandwidth: one GET of all shards", n, dt, srv.stats()["bytes_sent"], tar_bytes)
        srv.stats(reset=True)
        t = time.perf_counter()
        whole = fs.cat([f"{srv.url}/{nm}" for nm in names])  # concurrent, one GET per shard
        dt = time.perf_counter() - t
        assert sum(len(v) for v in whole.values()) == tar_bytes
        del whole
        bw2 = tar_bytes / dt
        row(f"server bandwidth: {len(names)} concurrent GETs (whole shards)", n, dt,
            srv.stats()["bytes_sent"], tar_bytes)
        step = 4 << 20
        reqs = [(f"{srv.url}/{nm}", a, min(a + step, os.path.getsize(p)))
                for nm, p in zip(names, paths, strict=True)
                for a in range(0, os.path.getsize(p), step)]
        srv.stats(reset=True)
        t = time.perf_counter()
        got_b = sum(len(g) for g in remote.fetch(reqs, tarindex.RemoteOptions(concurrency=64)))
        dt = time.perf_counter() - t
        assert got_b == tar_bytes
        bws = [bw1, bw2, tar_bytes / dt]
        row(f"server bandwidth: {len(reqs)} ranged GETs of 4 MiB, 64 in flight", n, dt,
            srv.stats()["bytes_sent"], tar_bytes)

        def ranged_bw() -> None:
            """The 4 MiB ranged-GET limit again (the machine is shared: taken next to each row)."""
            t = time.perf_counter()
            remote.fetch(reqs, tarindex.RemoteOptions(concurrency=64))
            bws.append(tar_bytes / (time.perf_counter() - t))

        streamed: list[tuple[int, float]] = []  # (row, MB/s)

        rng = np.random.default_rng(1)
        k = args.random
        picks = rng.choice(n, k, replace=False).tolist()
        want = members_bytes(local, picks)

        # random access, ds[i]
        _fresh()
        srv.stats(reset=True)
        t = time.perf_counter()
        ds = tarindex.TarDataset(pattern)
        for s in range(len(paths)):
            ds.shards.reader(s)
        t_open = time.perf_counter() - t
        st = srv.stats(reset=True)
        open_note = (
            f"open: {t_open * 1e3:.0f} ms, {st['requests']} requests, "
            f"{st['bytes_sent'] / len(paths) / 1024:.1f} KiB/shard (index + checks)"
        )
        t = time.perf_counter()
        for i in picks:
            ds[i]
        dt = time.perf_counter() - t
        row("random access ds[i] (one ranged read per sample)", k, dt, srv.stats()["bytes_sent"],
            want, open_note)

        srv.stats(reset=True)
        t = time.perf_counter()
        for i in picks:
            ds.shards.sample(i)
        dt = time.perf_counter() - t
        st = srv.stats()
        row("random access, no coalescing (a request per member)", k, dt, st["bytes_sent"], want,
            f"{st['requests'] / k:.1f} requests/sample")

        # batches
        bs = 64
        batches = [picks[a : a + bs] for a in range(0, k, bs)]
        srv.stats(reset=True)
        t = time.perf_counter()
        for b in batches:
            ds.__getitems__(b)
        dt = time.perf_counter() - t
        st = srv.stats()
        row(f"random batches of {bs} (__getitems__, concurrent)", k, dt, st["bytes_sent"], want,
            f"{st['requests'] / len(batches):.1f} requests/batch")
        dsb = tarindex.TarDataset(pattern, batched=True)
        for s in range(len(paths)):
            dsb.shards.reader(s)
        srv.stats(reset=True)
        t = time.perf_counter()
        for b in batches:
            dsb.__getitems__(b)
        dt = time.perf_counter() - t
        row(f"random batches of {bs} (batched=True)", k, dt, srv.stats()["bytes_sent"], want)

        # streaming
        for label, opts in (
            ("streaming epoch, read-ahead (64 MiB)", tarindex.RemoteOptions()),
            ("streaming epoch, no read-ahead", tarindex.RemoteOptions(readahead_bytes=0)),
        ):
            _fresh()  # the pool too: made again with this row's budget
            it = tarindex.TarIterableDataset(pattern, shuffle=True, seed=0, remote=opts)
            ranged_bw()
            srv.stats(reset=True)
            t = time.perf_counter()
            got = sum(1 for _ in it)
            dt = time.perf_counter() - t
            fetched = srv.stats()["bytes_sent"]
            assert got == n, (got, n)
            row(label, n, dt, fetched, tar_bytes, "opens included")
            streamed.append((len(rows) - 1, fetched / dt))
            it2_t = time.perf_counter()
            srv.stats(reset=True)
            it.set_epoch(1)
            got = sum(1 for _ in it)
            dt2 = time.perf_counter() - it2_t
            fetched = srv.stats()["bytes_sent"]
            row(label + ", 2nd epoch (shards open)", n, dt2, fetched, tar_bytes)
            streamed.append((len(rows) - 1, fetched / dt2))
            ranged_bw()

        # webdataset on the same URLs
        try:
            import webdataset as wds

            urls = [f"{srv.url}/{nm}" for nm in names]
            ranged_bw()
            srv.stats(reset=True)
            t = time.perf_counter()
            got = sum(1 for _ in wds.WebDataset(urls, shardshuffle=False, empty_check=False))
            dt = time.perf_counter() - t
            fetched = srv.stats()["bytes_sent"]
            row("webdataset WebDataset(urls) epoch (whole shards)", got, dt, fetched, tar_bytes)
            streamed.append((len(rows) - 1, fetched / dt))
            ranged_bw()
            rows.append(
                {
                    "row": "webdataset random access (a whole shard per sample)",
                    "samples_per_s": 0.0,
                    "bytes_per_sample": tar_bytes / len(paths),
                    "bytes_ratio": (tar_bytes / len(paths)) / (data_bytes / n),
                    "MB_per_s": 0.0,
                    "note": "not run: reading one sample means downloading its shard",
                }
            )
            print(f"webdataset random access: {tar_bytes / len(paths):,.0f} B/sample (one shard)")
        except Exception as e:  # a peer that fails does not stop the run
            print(f"webdataset: FAILED: {type(e).__name__}: {e}")
        bw = max(bws)
        print(
            f"\nsamples {n}, mean member bytes/sample {data_bytes / n:,.0f}, {len(paths)} shards, "
            f"latency {args.latency * 1e3:.0f} ms/request; server bandwidth (best of "
            f"{len(bws)} measurements through the run): {bw / 1e6:.0f} MB/s "
            f"(all: {', '.join(f'{b / 1e6:.0f}' for b in bws)})"
        )
        for k, rate in streamed:
            rows[k]["of_bandwidth"] = rate / bw
            print(f"{rows[k]['row']:58s} {rate / bw:5.2f} of the server's bandwidth")
        for r in rows:
            if r["row"].startswith("random") and r["bytes_ratio"]:
                print(f"{r['row']:58s} fetched {r['bytes_ratio']:.3f}x the members' bytes")
    finally:
        if srv is not None:
            srv.close()
        shutil.rmtree(tmp, ignore_errors=True)
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="small data (a few seconds)")
    p.add_argument("--samples", type=int, default=20_000)
    p.add_argument("--size", type=int, default=16_384, help="mean sample size in bytes")
    p.add_argument("--shards", type=int, default=8)
    p.add_argument("--random", type=int, default=2048, help="random accesses per row")
    p.add_argument("--latency", type=float, default=0.02, help="seconds added per request")
    p.add_argument("--json", default=None, help="write the rows here")
    args = p.parse_args()
    if args.quick:
        args.samples, args.random = 4000, 512
    rows = run(args)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "rows": rows}, f, indent=2)


if __name__ == "__main__":
    main()
