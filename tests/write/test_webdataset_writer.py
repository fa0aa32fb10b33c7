"""Our writer against webdataset 1.0.2's ``TarWriter``/``ShardWriter`` on the same samples.

Issue 22 item 8: member order, ``_meta`` entries, ``post=``, ``.tgz`` names, ``pipe:`` names,
``cls=True`` and keys with dots (the last two differ on purpose: README "Coming from
webdataset").
"""

from __future__ import annotations

import gzip
import os
import tarfile
import warnings
from pathlib import Path
from typing import Any

import pytest

import tarindex
from tarindex.errors import WriterError

wds = pytest.importorskip("webdataset")

SAMPLES: list[dict[str, Any]] = [
    {"__key__": "b", "txt": "hello", "cls": 3, "json": b'{"a": 1}', "_meta": "m", "a.bin": b"x"},
    {"__key__": "a", "zzz": b"z" * 700, "aaa": b"a", "_note": "n", "cls": 4},
]


def _members(path: str | Path) -> list[tuple[str, bytes]]:
    with tarfile.open(path) as tf:  # r:* (gzip too)
        out = []
        for m in tf.getmembers():
            f = tf.extractfile(m)
            assert f is not None
            out.append((m.name, f.read()))
        return out


def _theirs(path: Path, samples: list[dict[str, Any]], **kw: Any) -> list[tuple[str, bytes]]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with wds.TarWriter(str(path), **kw) as w:
            for s in samples:
                w.write(dict(s))
    return _members(path)


def _ours(path: Path, samples: list[dict[str, Any]], **kw: Any) -> list[tuple[str, bytes]]:
    with tarindex.TarWriter(path, mtime=0, **kw) as w:
        for s in samples:
            w.write(dict(s))
    return _members(path)


def test_members_sorted_and_meta_skipped_as_webdataset(tmp_path: Path) -> None:
    theirs = _theirs(tmp_path / "w.tar", SAMPLES)
    ours = _ours(tmp_path / "t.tar", SAMPLES)
    assert [n for n, _ in ours] == [n for n, _ in theirs] == [
        "b.a.bin", "b.cls", "b.json", "b.txt", "a.aaa", "a.cls", "a.zzz"
    ]
    assert ours == theirs  # same payload bytes too
    # the same sample in another dict order gives the same bytes (seeded shard id)
    rev = [dict(reversed(list(s.items()))) for s in SAMPLES]
    a, b = tmp_path / "x.tar", tmp_path / "y.tar"
    for p, ss in ((a, SAMPLES), (b, rev)):
        with tarindex.TarWriter(p, mtime=0, seed=1) as w:
            for s in ss:
                w.write(dict(s))
    assert a.read_bytes() == b.read_bytes()
    assert tarindex.TarDataset(str(a))[0]["txt"] == b"hello"


def test_keep_meta_writes_single_underscore_as_webdataset(tmp_path: Path) -> None:
    theirs = _theirs(tmp_path / "w.tar", SAMPLES, keep_meta=True)
    ours = _ours(tmp_path / "t.tar", SAMPLES, keep_meta=True)
    # webdataset also writes b.__key__ with keep_meta; we never write '__' entries
    assert [m for m in theirs if not m[0].endswith(".__key__")] == ours
    assert ("b._meta", b"m") in ours


def test_only_meta_entries_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(WriterError, match="keep_meta"):
        with tarindex.TarWriter(tmp_path / "t.tar") as w:
            w.write({"__key__": "a", "_meta": "m"})


@pytest.mark.parametrize("name", ["x.tgz", "x.tar.gz"])
def test_tgz_name_writes_gzip_as_webdataset(tmp_path: Path, name: str) -> None:
    theirs = _theirs(tmp_path / ("w-" + name), SAMPLES)
    path = tmp_path / name
    ours = _ours(path, SAMPLES)
    assert path.read_bytes()[:2] == b"\x1f\x8b"  # gzip magic (RFC 1952)
    assert ours == theirs
    gzip.decompress(path.read_bytes())  # one complete stream
    assert not os.path.exists(str(path) + ".tidx")  # compressed tars: index built by readers
    # webdataset streams it back
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        got = list(wds.WebDataset(str(path), shardshuffle=False))
    assert [s["__key__"] for s in got] == ["b", "a"] and got[0]["txt"] == b"hello"
    # indexed afterwards (seek points), it reads like any shard
    tarindex.build_index(str(path))
    ds = tarindex.TarDataset(str(path))
    assert [ds[i]["__key__"] for i in range(len(ds))] == ["b", "a"] and ds[0]["txt"] == b"hello"
    # same samples, same bytes (gzip header mtime 0)
    again = tmp_path / ("again-" + name)
    with tarindex.TarWriter(again, mtime=0, seed=0) as w:
        for s in SAMPLES:
            w.write(dict(s))
    with tarindex.TarWriter(path, mtime=0, seed=0) as w:
        for s in SAMPLES:
            w.write(dict(s))
    assert again.read_bytes() == path.read_bytes()
    assert not os.path.exists(str(path) + ".tidx")  # rewriting removed the earlier index


def test_post_called_after_each_complete_shard(tmp_path: Path) -> None:
    seen: list[tuple[str, bool, int]] = []

    def post(path: str) -> None:  # the shard and its index are in place when post runs
        ds = tarindex.TarDataset(path)
        seen.append((os.path.basename(path), os.path.exists(path + ".tidx"), len(ds)))

    pattern = str(tmp_path / "s-%06d.tar")
    with tarindex.ShardWriter(pattern, maxcount=2, post=post) as w:
        for i in range(5):
            w.write({"__key__": f"{i:03d}", "cls": i})
            if i == 2:  # the first shard was finished by this write
                assert seen == [("s-000000.tar", True, 2)]
    assert seen == [("s-000000.tar", True, 2), ("s-000001.tar", True, 2), ("s-000002.tar", True, 1)]
    # webdataset calls post with the same paths
    wseen: list[str] = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with wds.ShardWriter(str(tmp_path / "w-%06d.tar"), maxcount=2, post=wseen.append, verbose=0) as w:
            for i in range(5):
                w.write({"__key__": f"{i:03d}", "cls": i})
    assert [os.path.basename(p) for p in wseen] == ["w-000000.tar", "w-000001.tar", "w-000002.tar"]


def test_post_must_be_callable(tmp_path: Path) -> None:
    with pytest.raises(WriterError, match="post="):
        tarindex.ShardWriter(str(tmp_path / "s-%06d.tar"), post="upload")  # type: ignore[arg-type]


@pytest.mark.parametrize("name", ["pipe:cat > out.tar", "pipe:gsutil cp - gs://b/s-%06d.tar"])
def test_pipe_name_refused_and_no_file_made(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str
) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(WriterError, match="never starts another program"):
        tarindex.TarWriter(name)
    with pytest.raises(WriterError, match="post="):
        tarindex.ShardWriter(name)
    assert os.listdir(tmp_path) == []


def test_cls_true_and_dotted_key_differ_on_purpose(tmp_path: Path) -> None:
    # webdataset writes cls=True as b"True", which its own reader then fails to decode as an int
    theirs = _theirs(tmp_path / "w.tar", [{"__key__": "a", "cls": True}])
    assert theirs == [("a.cls", b"True")]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(wds.autodecode.DecodingError):
            list(wds.WebDataset(str(tmp_path / "w.tar"), shardshuffle=False).decode())
    with pytest.raises(WriterError, match="bool is ambiguous"):
        with tarindex.TarWriter(tmp_path / "t.tar") as w:
            w.write({"__key__": "a", "cls": True})
    # a key "a.b": webdataset writes a.b.cls, read back (by webdataset too) as key "a", "b.cls"
    _theirs(tmp_path / "k.tar", [{"__key__": "a.b", "cls": 1}])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        back = list(wds.WebDataset(str(tmp_path / "k.tar"), shardshuffle=False))
    assert back[0]["__key__"] == "a" and "b.cls" in back[0]
    with pytest.raises(WriterError, match="dot in its basename"):
        with tarindex.TarWriter(tmp_path / "t2.tar") as w:
            w.write({"__key__": "a.b", "cls": 1})


def test_gzip_writer_abort_leaves_nothing(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError):
        with tarindex.TarWriter(tmp_path / "x.tgz") as w:
            w.write({"__key__": "a", "cls": 1})
            raise RuntimeError("stop")
    assert os.listdir(tmp_path) == []
