"""Dataset manifests (FORMAT.md §9): one read to open, moved directories, shards that changed."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest

import tarindex
from tarindex.cli.main import main
from tarindex.errors import FormatError, StaleManifestError
from tarindex.format.manifest import decode_manifest, relative_path, resolve_path
from tarindex.format.url import is_url, url_scheme
from tarindex.read.manifest import check_manifest, write_manifest


def write(root: Path, n: int, per: int, name: str = "train", seed: int | None = None) -> list[str]:
    root.mkdir(parents=True, exist_ok=True)
    pattern = str(root / f"{name}-%06d.tar")
    with tarindex.ShardWriter(pattern, maxcount=per, durable=False, seed=seed) as w:
        for i in range(n):
            w.write({"__key__": f"{name}{i:06d}", "cls": i, "txt": f"{name} {i}"})
    return list(w.paths)


def syscr() -> int:
    """read(2)-family calls this process made so far (Linux ``/proc/self/io``)."""
    with open("/proc/self/io") as f:
        for line in f:
            if line.startswith("syscr:"):
                return int(line.split()[1])
    raise AssertionError("no syscr in /proc/self/io")


def test_a_manifest_over_10000_shards_opens_in_one_read(tmp_path: Path) -> None:
    d = tmp_path / "big"
    (one,) = write(tmp_path / "src", 3, 10)
    d.mkdir()
    for k in range(10_000):  # synthetic shards: hard links of one real shard and its index
        os.link(one, d / f"s-{k:06d}.tar")
        os.link(one + ".tidx", d / f"s-{k:06d}.tar.tidx")
    m = str(d / "data.json")
    t = write_manifest(str(d), m)
    assert t.n_shards == 10_000 and t.n_samples == 30_000
    assert t.paths[:2] == ["s-000000.tar", "s-000001.tar"]  # relative to the manifest
    tarindex.ShardSet(m)  # warm (imports, caches)

    before = syscr()
    ss = tarindex.ShardSet(m)
    reads = syscr() - before
    assert reads <= 4, reads  # the manifest (read + EOF) and the /proc/self/io reads
    assert len(ss) == 30_000 and ss.n_shards == 10_000
    before = syscr()
    tarindex.ShardSet(str(d))  # without the manifest: every index header is read
    assert syscr() - before >= 10_000

    # no shard is touched at construction: it works with every shard gone
    for k in range(10_000):
        os.unlink(d / f"s-{k:06d}.tar")
    ss = tarindex.ShardSet(m)
    assert len(ss) == 30_000 and ss.paths[1234].endswith("s-001234.tar")
    with pytest.raises(StaleManifestError, match=r"s-000003\.tar: shard 3 of manifest .*missing"):
        ss.sample(10)


def test_relative_paths_survive_moving_the_dataset(tmp_path: Path) -> None:
    write(tmp_path / "ds", 50, 20)
    write_manifest(str(tmp_path / "ds" / "train-*.tar"), str(tmp_path / "ds" / "data.json"))
    shutil.move(str(tmp_path / "ds"), str(tmp_path / "moved"))
    cwd = os.getcwd()
    try:
        os.chdir(tmp_path)  # a relative manifest path resolves too
        ss = tarindex.ShardSet("moved/data.json")
        assert ss.paths[0] == "moved/train-000000.tar"
        assert [ss.sample(i)["__key__"] for i in (0, 25, 49)] == [
            "train000000",
            "train000025",
            "train000049",
        ]
    finally:
        os.chdir(cwd)
    # absolute paths on request; a manifest of shards in another directory uses ".."
    t = write_manifest(str(tmp_path / "moved"), str(tmp_path / "m" / "abs.json"), absolute=True)
    assert t.paths[0] == str(tmp_path / "moved" / "train-000000.tar")
    t = write_manifest(str(tmp_path / "moved"), str(tmp_path / "m" / "rel.json"))
    assert t.paths[0] == "../moved/train-000000.tar"
    assert len(tarindex.ShardSet(str(tmp_path / "m" / "rel.json"))) == 50


def test_paths_and_urls() -> None:
    assert resolve_path("/d/data.json", "x.tar") == "/d/x.tar"
    assert resolve_path("/d/data.json", "../e/x.tar") == "/e/x.tar"
    assert resolve_path("data.json", "x.tar") == "x.tar"
    assert resolve_path("/d/data.json", "/abs/x.tar") == "/abs/x.tar"
    assert resolve_path("/d/data.json", "https://h/p/x.tar") == "https://h/p/x.tar"
    assert resolve_path("s3://b/d/data.json", "x.tar") == "s3://b/d/x.tar"
    assert resolve_path("s3://b/d/data.json", "sub/../y.tar") == "s3://b/d/y.tar"
    assert relative_path("s3://b/d/data.json", "s3://b/d/sub/x.tar") == "sub/x.tar"
    assert relative_path("s3://b/d/data.json", "s3://other/x.tar") == "s3://other/x.tar"
    assert relative_path("/d/data.json", "https://h/x.tar") == "https://h/x.tar"
    assert relative_path("/d/data.json", "/d/a/x.tar") == "a/x.tar"
    # file:// is a scheme for the path arithmetic (not collapsed to "file:/d"), yet local
    assert resolve_path("file:///d/data.json", "sub/../x.tar") == "file:///d/x.tar"
    assert url_scheme("S3://b/x.tar") == "s3" and url_scheme("file:///d") == "file"
    assert url_scheme("d/x.tar") is None and url_scheme("1s://x") is None
    assert is_url("hf://d/x.tar") and not is_url("file:///d/x.tar") and not is_url("/a://b")


def test_a_changed_or_missing_shard_is_reported_by_name(tmp_path: Path) -> None:
    paths = write(tmp_path / "ds", 100, 25)
    m = str(tmp_path / "ds" / "data.json")
    write_manifest(paths, m)
    pytest.importorskip("torch")
    # shard 1 re-written with other samples (same count), shard 2 deleted, shard 3 re-indexed
    with tarindex.ShardWriter(paths[1], maxcount=25, durable=False) as w:
        for i in range(25):
            w.write({"__key__": f"other{i}", "cls": i})
    os.unlink(paths[2])
    tarindex.build_index(paths[3])  # same tar, a new index: the manifest still holds
    ds = tarindex.TarDataset(m)
    assert len(ds) == 100 and ds[0]["__key__"] == "train000000" and ds[99]["cls"] == b"99"
    with pytest.raises(
        StaleManifestError, match=r"train-000001\.tar: shard 1 of manifest .*changed"
    ):
        ds[30]
    with pytest.raises(StaleManifestError, match=r"train-000002\.tar: shard 2 .* missing"):
        ds[60]
    problems = check_manifest(m)
    assert len(problems) == 2
    assert "train-000001.tar" in problems[0] and "train-000002.tar" in problems[1]
    assert main(["manifest", "--check", m]) == 1
    # streaming skips (and names) the bad shards under on_error="skip"
    it = tarindex.TarIterableDataset(m, shuffle=False, on_error="skip")
    with pytest.warns(RuntimeWarning, match="train-00000[12].tar"):
        got = [s["__key__"] for s in it]
    assert got == [f"train{i:06d}" for i in (*range(25), *range(75, 100))]


def test_stale_manifest_samples_count(tmp_path: Path) -> None:
    paths = write(tmp_path / "ds", 40, 20)
    m = str(tmp_path / "ds" / "data.json")
    write_manifest(paths, m)
    with tarindex.ShardWriter(paths[0], maxcount=30, durable=False) as w:  # now 21 samples
        for i in range(21):
            w.write({"__key__": f"n{i}", "cls": i})
    ss = tarindex.ShardSet(m)
    with pytest.raises(StaleManifestError, match=r"\(samples now 21, the manifest says 20\)"):
        ss.sample(0)
    assert ss.sample(20)["__key__"] == "train000020"


def test_bad_manifests_are_refused_with_the_field(tmp_path: Path) -> None:
    paths = write(tmp_path / "ds", 10, 5)
    m = tmp_path / "ds" / "data.json"
    write_manifest(paths, str(m))
    doc = json.loads(m.read_text())
    assert doc["format"] == "tarindex-manifest" and doc["version"] == 1

    def bad(mut: dict[str, object], match: str) -> None:
        d = json.loads(json.dumps(doc))
        for k, v in mut.items():
            if k.startswith("shards."):
                d["shards"][k[7:]] = v
            else:
                d[k] = v
        with pytest.raises(FormatError, match=match):
            decode_manifest(json.dumps(d).encode(), "x.json")

    bad({"format": "other"}, "field 'format'")
    bad({"version": 2}, "manifest version 2, this tarindex reads version 1")
    bad({"shards.samples": [5]}, "column 'samples' has 1 entries")
    bad({"shards.samples": [5, -1]}, "negative")
    bad({"shards.samples": [5, 5.5]}, "integers")
    bad({"shards.samples": [6, 5]}, "n_samples")
    bad({"shards.members": [4, 5]}, "fewer members than samples")
    bad({"shards.head_crc": [2**32, 0]}, "crc32")
    bad({"shards.path": ["", "x.tar"]}, "column 'path': shard 0")
    bad({"shards.shard_id": ["zz", ""]}, "shard_id")
    with pytest.raises(FormatError, match="not UTF-8 JSON"):
        decode_manifest(b"{", "x.json")
    d = dict(doc, extra_field={"later": 1})  # unknown fields: a later version's, ignored
    t = decode_manifest(json.dumps(d).encode(), "x.json")
    assert t.meta["extra_field"] == {"later": 1} and t.n_samples == 10


def test_counts_that_wrap_int64_are_refused_naming_the_shard(tmp_path: Path) -> None:
    """Row counts summing past int64 (to 0) were accepted: each is bounded as in its index."""
    paths = write(tmp_path / "ds", 20, 5)
    m = tmp_path / "ds" / "data.json"
    write_manifest(paths, str(m))
    doc = json.loads(m.read_text())
    huge = dict(doc, n_samples=0)  # 4 * 2**62 == 2**64: 0 in int64
    huge["shards"] = dict(doc["shards"], samples=[2**62] * 4, members=[2**62] * 4)
    m.write_text(json.dumps(huge))
    with pytest.raises(FormatError, match=r"data\.json: column 'samples': shard 0 has "):
        tarindex.ShardSet(str(m))
    with pytest.raises(FormatError, match=r"data\.json: column 'samples'"):
        tarindex.TarDataset(str(m))
    cases = {  # one count past its index's bound (FORMAT.md §2.1), the rest fine
        "samples": ([5, 5, 2**40 + 1, 5], "shard 2 has 1099511627777 samples"),
        "members": ([10, 2**42 + 1, 10, 10], "shard 1 has 4398046511105 members"),
    }
    for col, (values, match) in cases.items():
        d = json.loads(json.dumps(doc))
        d["shards"][col] = values
        if col == "samples":
            d["shards"]["members"] = [2**41] * 4
            d["n_samples"] = sum(values)
        with pytest.raises(FormatError, match=match):
            decode_manifest(json.dumps(d).encode(), "x.json")


@pytest.mark.parametrize("change", ["rewritten", "deleted"])
def test_cli_info_ls_verify_check_shards_against_the_manifest(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], change: str
) -> None:
    """As the datasets do: a shard changed or missing since the manifest is an error (exit 1)."""
    paths = write(tmp_path / "ds", 40, 10)
    m = str(tmp_path / "ds" / "data.json")
    write_manifest(paths, m)
    if change == "rewritten":  # fewer samples: ls would renumber every later index
        with tarindex.ShardWriter(paths[1], maxcount=10, durable=False) as w:
            w.write({"__key__": "x", "cls": 1})
        said = "changed since the manifest"
    else:
        os.unlink(paths[1])
        said = "missing"
    for cmd in (["info", m], ["info", "--json", m], ["ls", m], ["verify", m]):
        code = main(cmd)
        out, err = capsys.readouterr()
        assert code == 1, (cmd, out, err)
        assert "train-000001.tar" in err and said in err and "data.json" in err, (cmd, err)
        assert "x\t" not in out and "\nx\t" not in out  # no line from the changed shard
    # a plain glob over the same shards is no manifest: nothing to check them against
    assert main(["info", str(tmp_path / "ds" / "*.tar")]) == 0
    assert f"samples:     {31 if change == 'rewritten' else 30}" in capsys.readouterr().out


def test_cli_manifest_and_commands_taking_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    write(tmp_path / "ds", 30, 10)
    m = str(tmp_path / "ds" / "data.json")
    assert main(["manifest", str(tmp_path / "ds" / "*.tar"), "-o", m]) == 0
    assert "3 shard(s), 30 sample(s)" in capsys.readouterr().out
    # a glob over the directory does not take the manifest for a shard
    assert main(["manifest", str(tmp_path / "ds" / "*"), "-o", m]) == 0
    assert "3 shard(s)" in capsys.readouterr().out
    assert main(["info", "--json", m]) == 0
    assert json.loads(capsys.readouterr().out)["samples"] == 30
    assert main(["ls", m]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 30 and lines[12].split("\t")[:2] == ["12", "train000012"]
    assert main(["cat", m, "train000017", "txt"]) == 0
    assert capsys.readouterr().out == "train 17"
    assert main(["manifest", "--check", m]) == 0
    assert main(["manifest", str(tmp_path / "ds"), "-o", str(tmp_path / "x.txt")]) == 2
    assert main(["manifest", str(tmp_path / "ds")]) == 2
    assert main(["verify", m]) == 0


def test_every_rank_sees_the_same_shards_from_a_manifest(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    write(tmp_path / "ds", 37, 8)
    m = str(tmp_path / "ds" / "data.json")
    write_manifest(str(tmp_path / "ds"), m)
    seen: list[int] = []
    for r in range(3):
        it = tarindex.TarIterableDataset(m, rank=r, world_size=3, drop_last=True, seed=3)
        got = [s["__index__"] for s in it]
        assert len(got) == len(it) == 12
        seen += got
    assert len(set(seen)) == 36 and set(seen) <= set(range(37))
    ref = tarindex.TarIterableDataset(
        str(tmp_path / "ds"), rank=1, world_size=3, drop_last=True, seed=3
    )
    it = tarindex.TarIterableDataset(m, rank=1, world_size=3, drop_last=True, seed=3)
    assert [s["__key__"] for s in it] == [s["__key__"] for s in ref]  # the same plan
    assert np.array_equal(tarindex.ShardSet(m).counts, ref.shards.counts)


def test_a_bytes_source_is_refused_by_both_expanders(tmp_path: Path) -> None:
    from tarindex.read.sources import expand_shards, expand_source

    paths = write(tmp_path / "ds", 10, 5)
    raw = os.fsencode(paths[0])
    for expand in (expand_source, expand_shards):
        with pytest.raises(TypeError, match="pass a str path"):
            expand(raw)  # type: ignore[arg-type]
    assert expand_source(Path(paths[0])) == expand_shards([paths[0]]).paths == [paths[0]]
