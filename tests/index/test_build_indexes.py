"""tarindex.index.build.build_indexes, without the CLI: many tars, in parallel processes, local
and remote; up-to-date indexes skipped, a bad tar never stopping the others."""

from __future__ import annotations

import io
import os
import tarfile
from pathlib import Path

import pytest

import tarindex
from tarindex.format.index import decode_index
from tarindex.index.build import IndexResult, build_indexes
from tarindex.read import is_up_to_date
from tests.conftest import MakeShards
from tests.remote_server import serve


def _drop_indexes(paths: list[str]) -> list[bytes]:
    written = [Path(tarindex.storage.indexfile.index_path_for(p)).read_bytes() for p in paths]
    for p in paths:
        os.unlink(tarindex.storage.indexfile.index_path_for(p))
    return written


@pytest.mark.parametrize("jobs", [1, 2])
def test_builds_every_tar_and_skips_the_up_to_date(make_shards: MakeShards, jobs: int) -> None:
    paths = make_shards([5, 7, 3], seed=2)
    written = _drop_indexes(paths)
    seen: list[IndexResult] = []
    res = build_indexes(paths, jobs=jobs, up_to_date=is_up_to_date, on_result=seen.append)
    assert [(r.path, r.status, r.n_samples) for r in res] == [
        (p, "built", n) for p, n in zip(paths, [5, 7, 3], strict=True)
    ]
    assert sorted(r.path for r in seen) == sorted(paths)  # each reported once, as it finished
    for p, w in zip(paths, written, strict=True):  # the tables equal the writer's
        got = decode_index(Path(tarindex.storage.indexfile.index_path_for(p)).read_bytes())
        assert got.tables_bytes() == decode_index(w).tables_bytes()
    os.unlink(tarindex.storage.indexfile.index_path_for(paths[1]))
    res = build_indexes(paths, jobs=jobs, up_to_date=is_up_to_date)
    assert [r.status for r in res] == ["skipped", "built", "skipped"]
    res = build_indexes(paths + paths[:1], jobs=jobs)  # no check: all rebuilt; a repeat once
    assert [r.status for r in res] == ["built"] * 4 and res[3] is res[0]


@pytest.mark.parametrize("jobs", [1, 2])
def test_a_bad_tar_does_not_stop_the_others(
    make_shards: MakeShards, tmp_path: Path, jobs: int
) -> None:
    paths = make_shards([5, 7], seed=3)
    _drop_indexes(paths)
    cut = tmp_path / "cut.tar"
    cut.write_bytes(Path(paths[0]).read_bytes()[:3000])
    junk = tmp_path / "junk.tar"
    junk.write_bytes(b"not a tar at all" * 64)
    gone = str(tmp_path / "gone.tar")
    res = build_indexes([str(cut), paths[0], str(junk), gone, paths[1]], jobs=jobs)
    assert [r.status for r in res] == ["failed", "built", "failed", "failed", "built"]
    assert res[0].error == "TruncatedError" and res[0].message.startswith(f"{cut}: byte ")
    assert res[2].error == "NotATarError" and res[2].message.startswith(f"{junk}: byte 0")
    assert res[3].error == "FileNotFoundError" and gone in res[3].message
    for r in (res[0], res[2]):
        assert not os.path.exists(r.index_path)
    assert [p for p in os.listdir(tmp_path) if p.endswith(".tmp")] == []
    for p in paths:
        assert tarindex.ShardReader(p).n_samples > 0


def test_warnings_are_returned_per_tar(tmp_path: Path) -> None:
    p = tmp_path / "mixed.tar"
    with tarfile.open(p, "w", format=tarfile.USTAR_FORMAT) as tf:
        for name in ("a.png", "b.png", "a.cls", "b.cls"):
            info = tarfile.TarInfo(name)
            info.size = 1
            tf.addfile(info, io.BytesIO(b"x"))
    (res,) = build_indexes([str(p)], jobs=2)
    assert res.status == "built" and res.n_samples == 2
    assert len(res.warnings) == 1 and "not adjacent" in res.warnings[0]
    assert "\n" not in res.warnings[0]


def test_out_dir_and_urls(make_shards: MakeShards, tmp_path: Path) -> None:
    paths = make_shards([4, 6], seed=4)
    out = tmp_path / "idx" / "deeper"
    res = build_indexes(paths, jobs=2, out=str(out))
    assert [r.index_path for r in res] == [
        str(out / (os.path.basename(p) + ".tidx")) for p in paths
    ]
    assert sorted(os.listdir(out)) == sorted(os.path.basename(p) + ".tidx" for p in paths)
    with pytest.raises(ValueError, match="--out DIR"):
        build_indexes(["https://example.invalid/a.tar"])
    with pytest.raises(ValueError, match="jobs=0"):
        build_indexes(paths, jobs=0)


def test_remote_tars_are_streamed_once_into_out(make_shards: MakeShards, tmp_path: Path) -> None:
    paths = make_shards([30, 20], seed=5)
    _drop_indexes(paths)
    out = tmp_path / "remote-idx"
    with serve(os.path.dirname(paths[0])) as srv:
        urls = [f"{srv.url}/{os.path.basename(p)}" for p in paths]
        missing = f"{srv.url}/nope.tar"
        res = build_indexes([*urls, missing], jobs=1, out=str(out))
        assert [r.status for r in res] == ["built", "built", "failed"]
        assert [r.n_samples for r in res[:2]] == [30, 20]
        assert missing in res[2].message and ".tarindex-" not in res[2].message
        assert srv.bytes_for(".tar") == sum(os.path.getsize(p) for p in paths)  # once each
        assert sorted(os.listdir(out)) == sorted(os.path.basename(p) + ".tidx" for p in paths)
        srv.reset()
        res = build_indexes(urls, out=str(out), up_to_date=is_up_to_date)
        assert [r.status for r in res] == ["skipped", "skipped"]
        ss = tarindex.ShardSet(urls, options=tarindex.OpenOptions(index_dir=str(out)))
        assert ss.sample(31)["__key__"] == f"{31:08d}" and ss.sample(31)["txt"] == b"sample 31"
        ss.close()
