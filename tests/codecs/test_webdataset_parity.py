"""Extensions, keys and pickles against webdataset 1.0.2 on the same GNU tar (issue 22 items 3, 4, 7).

Each test builds a tar with GNU tar from files on disk, reads it with webdataset's
``WebDataset(...).decode(...)`` and with ours, and compares; where we differ on purpose the
test says so (README, "Coming from webdataset").
"""

from __future__ import annotations

import gzip
import io
import pickle
import subprocess
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image

import tarindex
from tarindex.errors import FormatError

wds = pytest.importorskip("webdataset")
torch = pytest.importorskip("torch")
msgpack = pytest.importorskip("msgpack")


def _gnu_tar(tmp: Path, files: dict[str, bytes], name: str = "s.tar") -> str:
    src = tmp / "src"
    src.mkdir()
    for n, data in files.items():
        (src / n).parent.mkdir(parents=True, exist_ok=True)
        (src / n).write_bytes(data)
    tar = tmp / name
    # names in the order given (GNU tar keeps the command line's order)
    subprocess.run(["tar", "--format=gnu", "-cf", str(tar), "-C", str(src), *files], check=True)
    tarindex.build_index(str(tar))
    return str(tar)


def _theirs(path: str, *args: Any, **kw: Any) -> list[dict[str, Any]]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return list(wds.WebDataset(path, shardshuffle=False).decode(*args, **kw))


def _members(s: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in s.items() if not k.startswith("__")}


def _same(a: Any, b: Any, what: str) -> None:
    if isinstance(b, np.ndarray):
        assert isinstance(a, np.ndarray) and a.dtype == b.dtype, what
        np.testing.assert_array_equal(a, b, err_msg=what)
    elif isinstance(b, list) and b and isinstance(b[0], np.ndarray):
        assert len(a) == len(b), what
        for x, y in zip(a, b, strict=True):
            _same(x, y, what)
    elif isinstance(b, Image.Image):
        assert (a.mode, a.size) == (b.mode, b.size), what
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b), err_msg=what)
    else:
        assert type(a) is type(b) and a == b, (what, a, b)


def _compare(path: str, spec: Any = "rgb8", **ours_kw: Any) -> list[dict[str, Any]]:
    theirs = _theirs(path, *([] if spec is None else [spec]))
    ds = tarindex.TarDataset(path, decode=[] if spec is None else spec, **ours_kw)
    ours = [ds[i] for i in range(len(ds))]
    assert [s["__key__"] for s in ours] == [s["__key__"] for s in theirs]
    for o, t in zip(ours, theirs, strict=True):
        assert sorted(_members(o)) == sorted(_members(t)), o["__key__"]
        for k in _members(t):
            _same(o[k], t[k], f"{o['__key__']}.{k}")
    return ours


def _img(fmt: str, mode: str = "RGB", size: tuple[int, int] = (5, 4)) -> bytes:
    rng = np.random.default_rng(len(fmt))
    arr = rng.integers(0, 256, (size[1], size[0], 3), dtype=np.uint8)
    buf = io.BytesIO()
    Image.fromarray(arr).convert(mode).save(buf, format=fmt)
    return buf.getvalue()


def test_extension_case_is_lowered_as_webdataset(tmp_path: Path) -> None:
    path = _gnu_tar(
        tmp_path, {"a.JPG": _img("JPEG"), "a.Cls": b"3", "b.jpg": _img("JPEG"), "b.cls": b"4"}
    )
    ours = _compare(path)
    assert sorted(_members(ours[0])) == ["cls", "jpg"] and ours[0]["cls"] == 3
    for ds in (
        tarindex.TarDataset(path, decode="rgb8", select=("jpg", "cls")),
        tarindex.TarIterableDataset(path, shuffle=False, decode="rgb8", select=("jpg", "cls")),
    ):
        got = list(ds)
        assert [c for _, c in got] == [3, 4] and got[0][0].shape == (4, 5, 3)
    # fields= matches the served (lower-case) name and reads just that member
    assert list(_members(tarindex.TarDataset(path, fields=("cls",))[0])) == ["cls"]
    # the index keeps the tar's names: nothing about the format changed
    assert tarindex.ShardReader(path).index.exts == [b"JPG", b"Cls", b"jpg", b"cls"]


def test_two_extensions_differing_in_case_in_one_sample_are_refused(tmp_path: Path) -> None:
    path = _gnu_tar(tmp_path, {"a.jpg": b"1", "a.JPG": b"2", "b.cls": b"1"})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(ValueError, match="duplicate file name"):  # webdataset refuses too
            list(wds.WebDataset(path, shardshuffle=False))
    ds = tarindex.TarDataset(path)
    with pytest.raises(FormatError, match=r"sample 'a' .*holds both a\.jpg and a\.JPG"):
        ds[0]
    with pytest.raises(FormatError, match="case-insensitively"):
        list(tarindex.TarIterableDataset(path, shuffle=False))


def test_gz_member_keeps_its_name_decompressed_and_sits_beside_the_plain_one(
    tmp_path: Path,
) -> None:
    path = _gnu_tar(
        tmp_path,
        {
            "a.txt": b"plain",
            "a.txt.gz": gzip.compress(b"zipped"),
            "a.json.gz": gzip.compress(b'{"x": 1}'),
            "b.cls.gz": gzip.compress(b"7"),
        },
    )
    ours = _compare(path)
    assert ours[0]["txt"] == "plain" and ours[0]["txt.gz"] == "zipped"
    assert ours[0]["json.gz"] == {"x": 1} and ours[1]["cls.gz"] == 7
    # select= finds "txt.gz" by its name, and "cls" stored gzipped (a tarindex extension)
    assert tarindex.TarDataset(path, decode=True, select=("txt.gz",))[0] == ("zipped",)
    assert tarindex.TarDataset(path, decode=True, select=("cls",))[1] == (7,)


def test_images_decoded_by_content_and_the_new_extensions(tmp_path: Path) -> None:
    files = {
        "a.jpg": _img("PNG"),  # PNG bytes named .jpg: webdataset decodes them by content
        "b.tga": _img("TGA"),
        "c.jfif": _img("JPEG"),
        "d.jpe": _img("JPEG"),
        "e.ico": _img("ICO", size=(16, 16)),
        "f.png": _img("BMP"),
    }
    path = _gnu_tar(tmp_path, files)
    for spec in ("rgb8", "pil", "l", "torchrgb8"):
        ours = _compare(path, spec) if spec != "torchrgb8" else None
        if ours is not None:
            assert all(not isinstance(v, bytes) for s in ours for v in _members(s).values())
    theirs = {s["__key__"]: s for s in _theirs(path, "torchrgb8")}
    ds = tarindex.TarDataset(path, decode="torchrgb8")
    for i in range(len(ds)):
        s = ds[i]
        for k, v in _members(s).items():
            assert torch.equal(v, theirs[s["__key__"]][k])


def test_eps_named_jpg_is_still_refused(tmp_path: Path) -> None:
    eps = b"%!PS-Adobe-3.0 EPSF-3.0\n%%BoundingBox: 0 0 1 1\nshowpage\n"
    path = _gnu_tar(tmp_path, {"a.jpg": eps})
    with pytest.raises(tarindex.DecodeError, match="EPS.*never opened"):
        tarindex.TarDataset(path, decode="rgb8")[0]


def test_idx_label_caption_msgpack_stay_bytes_and_mp_msg_decode(tmp_path: Path) -> None:
    files = {
        "a.idx": b"5",
        "a.label": b"6",
        "a.caption": b"a cat",
        "a.msgpack": msgpack.packb([1]),
        "a.mp": msgpack.packb({"m": 1}),
        "a.msg": msgpack.packb(2),
        "a.cls": b"1",
        "a.cls2": b"2",
        "a.index": b"3",
        "a.inx": b"4",
        "a.id": b"5",
        "a.text": b"t",
        "a.transcript": b"tr",
        "a.jsn": b"[1]",
    }
    path = _gnu_tar(tmp_path, files)
    (s,) = _compare(path)
    assert s["idx"] == b"5" and s["label"] == b"6" and s["caption"] == b"a cat"
    assert s["msgpack"] == files["a.msgpack"] and s["mp"] == {"m": 1}
    # .decode() with no arguments: built-ins only, images stay bytes (webdataset's too)
    (tmp_path / "x").mkdir()
    path2 = _gnu_tar(tmp_path / "x", {"a.jpg": _img("JPEG"), "a.cls": b"1"})
    (s2,) = _compare(path2, None)
    assert isinstance(s2["jpg"], bytes) and s2["cls"] == 1


def test_tenbin_read_and_written_as_webdataset(tmp_path: Path) -> None:
    arrays = [np.arange(6, dtype=np.float32).reshape(2, 3), np.arange(4, dtype=np.uint16)]
    wpath = str(tmp_path / "w.tar")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with wds.TarWriter(wpath) as w:
            w.write({"__key__": "a", "ten": arrays, "tb": arrays[0]})
    tarindex.build_index(wpath)
    (s,) = _compare(wpath)
    assert isinstance(s["ten"], list) and len(s["ten"]) == 2 and len(s["tb"]) == 1
    # our writer writes the same bytes, which webdataset decodes
    opath = tmp_path / "o.tar"
    with tarindex.TarWriter(opath, mtime=0) as tw:
        tw.write({"__key__": "a", "ten": arrays, "tb": arrays[0]})
    theirs = _theirs(str(opath))[0]
    raw = tarindex.TarDataset(str(opath))[0]
    wraw = tarindex.TarDataset(wpath)[0]
    assert raw["ten"] == wraw["ten"] and raw["tb"] == wraw["tb"]
    _same(theirs["ten"], arrays, "ten")
    with pytest.raises(tarindex.errors.WriterError, match="tenbin"):
        with tarindex.TarWriter(tmp_path / "bad.tar") as tw:
            tw.write({"__key__": "a", "ten": np.zeros(2, bool)})


@pytest.mark.parametrize("bad", [b"~TenBin~" + b"\xff" * 8, b"junk", b"~TenBin~\x08" + bytes(7)])
def test_tenbin_hostile_bytes_are_a_decode_error(bad: bytes) -> None:
    with pytest.raises(tarindex.DecodeError, match="tenbin"):
        tarindex.codecs.decode_value("ten", bad)


def test_pickle_members_need_allow_pickle_and_name_the_member(tmp_path: Path) -> None:
    files = {
        "a.pyd": pickle.dumps({"x": 1}),
        "a.cls": b"1",
        "b.pickle": pickle.dumps([2]),
        "b.cls": b"2",
        "c.pkl": pickle.dumps(3),
        "c.cls": b"3",
    }
    path = _gnu_tar(tmp_path, files)
    _compare(path, allow_pickle=True)  # opted in: the same objects as webdataset
    for j, ext in enumerate(("pyd", "pickle", "pkl")):
        for ds in (
            tarindex.TarDataset(path, decode=True),
            tarindex.TarIterableDataset(path, shuffle=False, decode=True),
        ):
            with pytest.raises(tarindex.DecodeError) as ei:
                ds[j] if isinstance(ds, tarindex.TarDataset) else list(ds)
            msg = str(ei.value)
            assert f"{path}: sample 'a'" in msg or isinstance(ds, tarindex.TarDataset), msg
            assert "allow_pickle=True" in msg and "unpickling runs code" in msg
            if isinstance(ds, tarindex.TarDataset):
                assert f"{path}: sample {'abc'[j]!r}, extension {ext!r}" in msg
    # left out by fields= or select=, or not decoded (only=): no error
    assert [tarindex.TarDataset(path, decode=True, fields=("cls",))[j]["cls"] for j in range(3)] == [
        1, 2, 3
    ]
    assert list(tarindex.TarIterableDataset(path, shuffle=False, decode=True, select="cls")) == [
        (1,), (2,), (3,)
    ]
    only = tarindex.codecs.ExtDecoder(only="cls")
    s = tarindex.TarDataset(path, decode=only)[0]
    assert s["cls"] == 1 and s["pyd"] == files["a.pyd"]
    # webdataset's WDS_SECURE=1 (enforce_security) refuses the same member
    code = (
        "import warnings, webdataset as wds; warnings.simplefilter('ignore')\n"
        f"list(wds.WebDataset({path!r}, shardshuffle=False).decode())\n"
    )
    r = subprocess.run(
        ["python", "-c", code], env={**__import__("os").environ, "WDS_SECURE": "1"},
        capture_output=True, text=True,
    )
    assert r.returncode != 0 and "not allowed for security reasons" in r.stderr


def test_pth_with_numpy_loads_under_weights_only(tmp_path: Path) -> None:
    buf = io.BytesIO()
    value = {"a": np.arange(3, dtype=np.float32), "s": np.float64(2.5), "t": torch.ones(2)}
    torch.save(value, buf)
    obj = io.BytesIO()
    torch.save({"o": np.array([{"x": 1}], dtype=object)}, obj)
    path = _gnu_tar(tmp_path, {"a.pth": buf.getvalue(), "b.pth": obj.getvalue()})
    s = tarindex.TarDataset(path, decode=True)[0]  # allow_pickle=False: weights_only=True
    np.testing.assert_array_equal(s["pth"]["a"], value["a"])
    assert s["pth"]["s"] == 2.5 and torch.equal(s["pth"]["t"], value["t"])
    theirs = _theirs(path)[0]  # webdataset loads with weights_only=False
    np.testing.assert_array_equal(theirs["pth"]["a"], s["pth"]["a"])
    # an object array is a pickle: refused without allow_pickle, loaded with it
    with pytest.raises(tarindex.DecodeError, match="'pth'"):
        tarindex.TarDataset(path, decode=True)[1]
    assert tarindex.TarDataset(path, decode=True, allow_pickle=True)[1]["pth"]["o"][0] == {"x": 1}


def test_leading_dot_slash_key_differs_on_purpose(tmp_path: Path) -> None:
    # GNU tar -C src . writes ./a.cls: webdataset's key is "./a", ours "a" (FORMAT.md §4)
    src = tmp_path / "src"
    src.mkdir()
    (src / "a.cls").write_bytes(b"1")
    tar = tmp_path / "d.tar"
    subprocess.run(["tar", "--format=gnu", "-cf", str(tar), "-C", str(src), "."], check=True)
    tarindex.build_index(str(tar))
    assert [s["__key__"] for s in _theirs(str(tar))] == ["./a"]
    assert tarindex.TarDataset(str(tar))[0]["__key__"] == "a"


def test_url_and_local_path_as_webdataset(tmp_path: Path) -> None:
    path = _gnu_tar(tmp_path, {"a.cls": b"1", "b.cls": b"2"})
    theirs = _theirs(path)
    for ds in (
        tarindex.TarDataset(path, decode=True),
        tarindex.TarIterableDataset(path, shuffle=False, decode=True),
        tarindex.TarDataset(path, transform=lambda s: s),
    ):
        ours = list(ds)
        assert [(s["__url__"], s["__local_path__"]) for s in ours] == [
            (t["__url__"], t["__local_path__"]) for t in theirs
        ] == [(path, path)] * 2
        assert all(s["__url__"] == s["__shard__"] for s in ours)
    # selectable like any sample entry
    assert tarindex.TarDataset(path, select=("cls", "__url__"))[1] == (b"2", path)
    # raw samples stay as the read kernel makes them (no per-sample work added)
    assert "__url__" not in tarindex.TarDataset(path)[0]
