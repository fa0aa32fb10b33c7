"""Manifests with remote shards, and a manifest read from a URL (a real HTTP server on 127.0.0.1)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

import tarindex
from tarindex.errors import StaleManifestError
from tarindex.storage import remote

from ..conftest import MakeShards
from ..remote_server import serve

pytest.importorskip("fsspec")
pytest.importorskip("aiohttp")


def test_remote_shards_in_a_manifest_and_a_remote_manifest(
    make_shards: MakeShards, tmp_path: Path
) -> None:
    paths = make_shards([30, 25, 20])
    d = tmp_path / "train"
    remote.forget_process_state()
    with serve(str(d)) as srv:
        # 1. a local manifest of URL shards records the URLs
        m = str(tmp_path / "urls.json")
        t = tarindex.write_manifest(f"{srv.url}/train-{{000000..000002}}.tar", m)
        assert t.paths[0] == f"{srv.url}/train-000000.tar" and t.n_samples == 75
        srv.reset()
        ss = tarindex.ShardSet(m)
        assert srv.bytes_for(".tidx") == 0  # counts from the manifest: no index fetched
        assert len(ss) == 75 and ss.sample(31)["__key__"] == "00000031"
        # 2. a manifest beside the shards, read through its URL: relative names resolve
        tarindex.write_manifest(paths, str(d / "data.json"))
        assert json.loads((d / "data.json").read_text())["shards"]["path"][0] == "train-000000.tar"
        srv.reset()
        ss = tarindex.ShardSet(f"{srv.url}/data.json")
        assert ss.paths[2] == f"{srv.url}/train-000002.tar"
        assert srv.bytes_for(".tidx") == 0
        local = tarindex.ShardSet(paths)
        for i in (0, 40, 74):
            got, ref = ss.sample(i), local.sample(i)
            assert got["__key__"] == ref["__key__"] and got["bin"] == ref["bin"]
        assert ss.index_of("00000060") == 60
        # 3. a remote shard changed since: named when opened
        with tarindex.ShardWriter(paths[1], maxcount=100, durable=False) as w:
            for i in range(25):
                w.write({"__key__": f"x{i}", "cls": i})
        remote.forget_process_state()
        fresh = tarindex.ShardSet(f"{srv.url}/data.json")
        with pytest.raises(StaleManifestError, match=r"train-000001\.tar: shard 1 of manifest"):
            fresh.sample(30)
        assert os.path.exists(paths[1])
