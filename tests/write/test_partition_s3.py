"""write_partition to S3 (moto's server on 127.0.0.1): bounded local disk, random access back."""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import tarindex
from tarindex.read.manifest import prune, write_manifest_rows
from tarindex.storage import remote
from tarindex.storage.remote import RemoteOptions
from tarindex.write.partition import write_partition

from ..storage.test_remote_s3 import BUCKET, s3  # noqa: F401  (the moto server fixture)

S3 = tuple[RemoteOptions, list[str]]


def sample(i: int) -> dict[str, Any]:
    rng = np.random.default_rng(i)
    n = int(rng.integers(10_000, 30_000))
    return {"__key__": f"{i:06d}", "bin": rng.integers(0, 256, n, dtype=np.uint8).tobytes(), "cls": i}


def disk_bytes(d: str) -> int:
    total = 0
    for here, _, files in os.walk(d):
        for f in files:
            try:
                total += os.stat(os.path.join(here, f)).st_size
            except FileNotFoundError:
                pass
    return total


def test_s3_output_holds_two_shards_locally_and_reads_back(s3: S3, tmp_path: Path) -> None:  # noqa: F811
    opts, _ = s3
    out = f"s3://{BUCKET}/out"
    maxsize = 256 * 1024
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    peak = 0
    stop = threading.Event()

    def watch() -> None:  # the task's local disk, sampled while it writes and uploads
        nonlocal peak
        while not stop.is_set():
            peak = max(peak, disk_bytes(str(scratch)))

    t = threading.Thread(target=watch)
    t.start()
    try:
        rows = write_partition(
            (sample(i) for i in range(80)), out, 0, maxsize=maxsize, remote=opts, tmp_dir=str(scratch)
        )
        rows += write_partition(
            (sample(i) for i in range(80, 100)), out, 1, maxsize=maxsize, remote=opts,
            tmp_dir=str(scratch),
        )
    finally:
        stop.set()
        t.join()
    assert len(rows) >= 8 and all(r.path.startswith(out + "/attempt-0000") for r in rows)
    assert max(r.tar_bytes for r in rows) <= maxsize
    # measured: at least one whole shard was on local disk at some point, never over two
    assert maxsize // 2 < peak <= 2 * maxsize, peak
    assert os.listdir(scratch) == []  # the temp space is gone
    m = f"{out}/data.json"
    table = write_manifest_rows(rows, m, remote=opts)
    assert table.n_samples == 100 and table.paths[0].startswith("attempt-00000-")
    remote.forget_process_state()
    ss = tarindex.ShardSet(m, remote=opts)
    assert len(ss) == 100
    for s in range(ss.n_shards):
        ss.reader(s)  # the open-time checks (FORMAT.md §3), over ranged reads
    before = remote.stats()["requests"]
    picks = np.random.default_rng(1).choice(100, 10, replace=False).tolist()
    for i in picks:
        ss.prefetch([i])  # as a DataLoader batch does: the sample's members in one read
        got = ss.sample(i)
        assert got["__key__"] == sample(i)["__key__"] and got["bin"] == sample(i)["bin"]
    assert remote.stats()["requests"] - before == len(picks)  # one ranged read per sample
    assert prune(out, m, remote=opts) == []
    ss.close()


def test_s3_failed_and_duplicate_attempts(s3: S3, tmp_path: Path) -> None:  # noqa: F811
    import s3fs  # type: ignore[import-untyped]

    opts, _ = s3
    fs = s3fs.S3FileSystem(skip_instance_cache=True, **opts.storage_options["s3"])
    out = f"s3://{BUCKET}/dup"

    def boom(j: int, i: int) -> dict[str, Any]:
        if j == 30:
            raise RuntimeError("task killed")
        return sample(i)

    with pytest.raises(RuntimeError, match="task killed"):
        write_partition(range(40), out, 0, attempt="x0", maxcount=8, to_sample=boom, remote=opts)
    assert not fs.exists(f"{BUCKET}/dup/attempt-00000-x0")  # its uploads were removed
    a = write_partition((sample(i) for i in range(40)), out, 0, attempt="x1", maxcount=8, remote=opts)
    b = write_partition((sample(i) for i in range(40)), out, 0, attempt="x2", maxcount=8, remote=opts)
    m = f"{out}/data.json"
    write_manifest_rows(a + b, m, remote=opts)
    left = prune(out, m, dry_run=True, remote=opts)
    assert left == sorted([r.path for r in b] + [r.path + ".tidx" for r in b])
    assert prune(out, m, remote=opts) == left
    assert not fs.exists(f"{BUCKET}/dup/attempt-00000-x2/part-00000-000000.tar")
    remote.forget_process_state()
    ss = tarindex.ShardSet(m, remote=opts)
    assert [ss.sample(i)["__key__"] for i in range(40)] == [f"{i:06d}" for i in range(40)]
    ss.close()
