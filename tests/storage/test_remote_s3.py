"""Remote shards on S3: s3fs against moto's standalone S3 server on 127.0.0.1."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import tarindex
from tarindex.storage import remote
from tarindex.storage.remote import RemoteOptions

from ..conftest import MakeShards

pytest.importorskip("s3fs", reason="s3fs is not installed (pip install -e '.[test]')")
moto_server = pytest.importorskip(
    "moto.server", reason="moto[server] is not installed (pip install -e '.[test]')"
)

SIZES = [30, 25, 35]
BUCKET = "shards"


@pytest.fixture
def s3(make_shards: MakeShards, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[RemoteOptions, list[str]]]:
    for k in ("AWS_PROFILE", "AWS_DEFAULT_PROFILE", "AWS_SESSION_TOKEN"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:
        host, port = server.get_host_and_port()
        endpoint = f"http://{host}:{port}"
        so: dict[str, Any] = {
            "s3": {
                "key": "testing",
                "secret": "testing",
                "client_kwargs": {"endpoint_url": endpoint, "region_name": "us-east-1"},
            }
        }
        opts = RemoteOptions(storage_options=so, backoff=0.01)
        import boto3  # type: ignore[import-untyped]
        import s3fs  # type: ignore[import-untyped]

        boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1").create_bucket(
            Bucket=BUCKET
        )
        fs = s3fs.S3FileSystem(skip_instance_cache=True, **so["s3"])
        paths = make_shards(SIZES)
        for p in paths:
            for f in (p, p + ".tidx"):
                fs.put_file(f, f"{BUCKET}/data/{os.path.basename(f)}")
        yield opts, paths
    finally:
        server.stop()


def test_s3_random_access_reads_only_the_samples_bytes(s3: tuple[RemoteOptions, list[str]]) -> None:
    opts, paths = s3
    remote.forget_process_state()
    ss = tarindex.ShardSet(f"s3://{BUCKET}/data/train-{{000000..000002}}.tar", remote=opts)
    assert len(ss) == sum(SIZES)
    local = tarindex.ShardSet(paths)
    for s in range(ss.n_shards):
        ss.reader(s)
    before = remote.stats()
    picks = np.random.default_rng(0).choice(len(ss), 12, replace=False).tolist()
    span = 0
    for i in picks:
        ss.prefetch([i])
        got = ss.sample(i)
        assert got["bin"] == local.sample(i)["bin"]
        s, j = local.locate(i)
        r = local.reader(s)
        lo, hi = r.member_slice(j)
        off = r.index.offset[lo:hi].astype(np.int64)
        span += int((off + r.index.size[lo:hi].astype(np.int64)).max() - off.min())
    after = remote.stats()
    assert after["requests"] - before["requests"] == len(picks)
    assert after["bytes"] - before["bytes"] == span


def test_s3_glob_and_streaming_read_each_shard_once(s3: tuple[RemoteOptions, list[str]]) -> None:
    pytest.importorskip("torch")
    opts, paths = s3
    remote.forget_process_state()
    it = tarindex.TarIterableDataset(
        f"s3://{BUCKET}/data/train-*.tar", shuffle=True, seed=2, block_size=8, remote=opts
    )
    assert [os.path.basename(p) for p in it.shards.paths] == [os.path.basename(p) for p in paths]
    before = remote.stats()["bytes"]
    seen = {s["__key__"]: s["bin"] for s in it}
    local = tarindex.ShardSet(paths)
    assert seen == {local.sample(i)["__key__"]: local.sample(i)["bin"] for i in range(len(local))}
    tar_bytes = sum(os.path.getsize(p) for p in paths)
    checks = len(paths) * (2 * 4096 + 10 * 1024 + 5 * 512)
    assert remote.stats()["bytes"] - before <= tar_bytes + checks


def test_s3_directory_source_and_missing_object(s3: tuple[RemoteOptions, list[str]], tmp_path: Path) -> None:
    opts, _ = s3
    ss = tarindex.ShardSet(f"s3://{BUCKET}/data/", remote=opts)
    assert ss.n_shards == len(SIZES)
    with pytest.raises(tarindex.errors.IndexMissingError, match="no index for remote shard"):
        tarindex.ShardSet(
            f"s3://{BUCKET}/data/nope.tar", remote=opts, options=tarindex.OpenOptions(index="require")
        )
    with pytest.raises(FileNotFoundError, match="nope.tar"):  # index="auto": no tar to index
        tarindex.ShardSet(f"s3://{BUCKET}/data/nope.tar", remote=opts)


def test_s3_object_overwritten_after_open_is_stale(s3: tuple[RemoteOptions, list[str]]) -> None:
    import s3fs

    opts, paths = s3
    remote.forget_process_state()
    url = f"s3://{BUCKET}/data/train-000000.tar"
    ss = tarindex.ShardSet(url, remote=opts)
    local = tarindex.ShardSet(paths[0])
    assert ss.sample(0)["bin"] == local.sample(0)["bin"]
    data = bytearray(open(paths[0], "rb").read())
    for k in range(8192, len(data) - 8192):
        data[k] ^= 0xFF  # same size, other bytes
    fs = s3fs.S3FileSystem(skip_instance_cache=True, **opts.storage_options["s3"])
    fs.pipe_file(f"{BUCKET}/data/train-000000.tar", bytes(data))
    j = SIZES[0] // 2
    with pytest.raises(tarindex.StaleIndexError, match=r"s3://shards/data/train-000000\.tar: "):
        ss.sample(j)


def test_s3_open_costs_one_get_per_index_and_a_first_sample_one_round(
    s3: tuple[RemoteOptions, list[str]],
) -> None:
    from .test_remote_startup import first_read_requests

    opts, paths = s3
    remote.forget_process_state()
    url = f"s3://{BUCKET}/data/train-{{000000..000002}}.tar"
    remote.stats(reset=True)
    ds = tarindex.TarDataset(url, remote=opts)
    assert remote.stats()["requests"] == len(paths)  # the indexes: no HeadObject
    local = tarindex.ShardSet(paths)
    k0 = SIZES[0]
    remote.stats(reset=True)
    assert ds[k0 + 2]["bin"] == local.sample(k0 + 2)["bin"]
    assert remote.stats()["requests"] == first_read_requests(paths[1], 2)  # checks + sample
    remote.stats(reset=True)
    assert ds[k0 + 3]["bin"] == local.sample(k0 + 3)["bin"]
    assert remote.stats()["requests"] == 1
