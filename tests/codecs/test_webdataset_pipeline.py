"""webdataset 1.0.2's pipeline stages against our ``select=``/``decode=`` (issue 22 items 5, 6).

``rename``, ``rename_keys``, ``extract_keys`` (glob fields), ``to_tuple(missing_is_error=,
none_is_error=)``, ``decode(only=)``, ``xdecode(must_decode=)`` with file-object decoders,
and the errors they raise (a ``ValueError`` in both).
"""

from __future__ import annotations

import io
import json
import subprocess
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image

import tarindex
from tarindex.codecs import rename, rename_keys, xdecode
from tarindex.errors import MissingFieldError

wds = pytest.importorskip("webdataset")


def _png(v: int) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(np.full((3, 4, 3), v, np.uint8)).save(buf, format="PNG")
    return buf.getvalue()


@pytest.fixture(scope="module")
def shard(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A GNU tar: 0 has png+cls+json, 1 jpg (PNG bytes)+cls+json, 2 png+cls only."""
    d = tmp_path_factory.mktemp("pipe")
    src = d / "src"
    src.mkdir()
    files = {
        "0.cls": b"0", "0.json": b'{"i": 0}', "0.png": _png(10),
        "1.cls": b"1", "1.jpg": _png(20), "1.json": b'{"i": 1}',
        "2.cls": b"2", "2.png": _png(30),
    }
    for n, b in files.items():
        (src / n).write_bytes(b)
    tar = d / "p.tar"
    subprocess.run(["tar", "--format=gnu", "-cf", str(tar), "-C", str(src), *files], check=True)
    tarindex.build_index(str(tar))
    return str(tar)


def _wds(path: str) -> Any:
    return wds.WebDataset(path, shardshuffle=False)


def _run(pipe: Any) -> list[Any]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return list(pipe)


def _clean(x: Any) -> Any:
    if isinstance(x, dict):
        return {k: _clean(v) for k, v in x.items() if k not in ("__url__", "__local_path__",
                                                                  "__shard__", "__index__")}
    if isinstance(x, (tuple, list)):
        return type(x)(_clean(v) for v in x)
    if isinstance(x, np.ndarray):
        return ("array", x.dtype.str, x.shape, x.tobytes())
    return x


def _ours(path: str, **kw: Any) -> list[Any]:
    both = [list(tarindex.TarIterableDataset(path, shuffle=False, **kw))]
    ds = tarindex.TarDataset(path, **kw)
    both.append([ds[i] for i in range(len(ds))])
    assert _clean(both[0]) == _clean(both[1])
    return both[0]


def test_rename_keep_and_drop(shard: str) -> None:
    theirs = _run(_wds(shard).decode("rgb8").rename(image="jpg;png", label="cls"))
    ours = _ours(shard, decode="rgb8", select=rename(image="jpg;png", label="cls"))
    assert _clean(ours) == _clean(theirs)
    assert sorted(ours[1]) == [
        "__index__", "__key__", "__local_path__", "__shard__", "__url__", "image", "json", "label"
    ]
    theirs = _run(_wds(shard).decode("rgb8").rename(image="jpg;png", keep=False))
    sel = rename(image="jpg;png", keep=False)
    assert sel.fields is not None and "cls" not in sel.fields  # reads only the images
    # webdataset drops __key__ too; we keep the __ entries (errors name the sample by them)
    assert _clean(_ours(shard, decode="rgb8", select=sel)) == [
        {"__key__": str(i), **t} for i, t in enumerate(_clean(theirs))
    ]
    with pytest.raises(ValueError, match="txt"):
        _run(_wds(shard).rename(t="txt"))
    with pytest.raises(ValueError, match="rename t='txt'"):
        _ours(shard, select=rename(t="txt"))


def test_rename_keys_by_glob(shard: str) -> None:
    args: list[tuple[str, str]] = [("image", "*png"), ("image", "*jpg")]
    kw: dict[str, Any] = {"keep_unselected": True, "must_match": False, "label": "cls"}
    theirs = _run(_wds(shard).decode().rename_keys(*args, **kw))
    ours = _ours(shard, decode=[], select=rename_keys(*args, **kw))
    assert _clean(ours) == _clean(theirs)
    with pytest.raises(ValueError, match="Not all patterns"):
        _run(_wds(shard).rename_keys(j="json"))
    with pytest.raises(MissingFieldError, match="matched no member"):
        _ours(shard, select=rename_keys(j="json"))
    lax = _ours(shard, select=rename_keys(j="json", must_match=False))
    theirs = _run(_wds(shard).rename_keys(j="json", must_match=False))  # no __key__ there
    assert _clean(lax) == [{"__key__": str(i), **t} for i, t in enumerate(theirs)]


def test_glob_fields_as_extract_keys(shard: str) -> None:
    theirs = _run(_wds(shard).decode("l8").extract_keys("*.png;*.jpg", "*.cls"))
    sel = tarindex.to_tuple("*.png;*.jpg", "*.cls")
    assert sel.fields is None  # a glob reads every member
    assert _clean(_ours(shard, decode="l8", select=sel)) == _clean(theirs)
    with pytest.raises(ValueError, match="Multiple sample keys"):
        _run(_wds(shard).extract_keys("*"))
    with pytest.raises(MissingFieldError, match="matches"):
        _ours(shard, select=tarindex.to_tuple("*"))


def test_missing_and_none_is_error_as_webdataset(shard: str, tmp_path: Path) -> None:
    # missing_is_error=False: None for the missing field, as webdataset (not a shorter tuple)
    theirs = _run(_wds(shard).decode().to_tuple("cls", "json", missing_is_error=False))
    ours = _ours(shard, decode=[], select=tarindex.to_tuple("cls", "json", missing_is_error=False))
    assert ours == theirs == [(0, {"i": 0}), (1, {"i": 1}), (2, None)]
    # none_is_error: a None value is an error (webdataset's default follows missing_is_error)
    with pytest.raises(ValueError, match="to_tuple"):
        _run(_wds(shard).decode().to_tuple("json", missing_is_error=False, none_is_error=True))
    with pytest.raises(ValueError, match="none_is_error"):
        _ours(shard, decode=True, select=tarindex.to_tuple("json", missing_is_error=False,
                                                             none_is_error=True))
    # a JSON null decodes to None here; webdataset keeps the bytes b"null" (its decoders take
    # None for "not decoded"): a difference on purpose, so none_is_error=False keeps it
    with tarindex.TarWriter(tmp_path / "n.tar") as w:
        w.write({"__key__": "a", "json": b"null", "cls": 1})
    npath = str(tmp_path / "n.tar")
    assert _run(_wds(npath).decode().to_tuple("cls", "json")) == [(1, b"null")]
    with pytest.raises(MissingFieldError, match="is None"):
        _ours(npath, decode=True, select=tarindex.to_tuple("cls", "json"))
    keep = tarindex.to_tuple("cls", "json", none_is_error=False)
    assert _ours(npath, decode=True, select=keep) == [(1, None)]


def test_missing_field_error_is_a_value_error_as_webdatasets(shard: str) -> None:
    with pytest.raises(ValueError) as theirs:
        _run(_wds(shard).to_tuple("txt"))
    with pytest.raises(ValueError) as ours:
        _ours(shard, select="txt")
    assert isinstance(ours.value, (MissingFieldError, KeyError, tarindex.TarIndexError))
    assert "txt" in str(theirs.value) and "'txt'" in str(ours.value)


def test_decode_only(shard: str) -> None:
    theirs = _run(_wds(shard).decode("rgb8", only=["png", "cls"]))
    ours = _ours(shard, decode=tarindex.codecs.ExtDecoder("rgb8", only=["png", "cls"]))
    assert _clean(ours) == _clean(theirs)
    assert isinstance(ours[1]["jpg"], bytes) and isinstance(ours[0]["png"], np.ndarray)
    theirs = _run(_wds(shard).decode("rgb8", only="png cls"))
    ours = _ours(shard, decode=tarindex.codecs.ExtDecoder("rgb8", only="png cls"))
    assert _clean(ours) == _clean(theirs)


def test_xdecode_file_objects_and_must_decode(shard: str) -> None:
    def cls(s: Any) -> int:
        return int(s.read())

    def js(s: Any) -> Any:
        return json.load(s)

    theirs = _run(_wds(shard).xdecode(("*.cls", cls), json=js, must_decode=False))
    ours = _ours(shard, decode=xdecode(("*.cls", cls), json=js, must_decode=False))
    assert _clean(ours) == _clean(theirs)
    assert ours[0]["cls"] == 0 and isinstance(ours[0]["png"], bytes)
    with pytest.raises(ValueError, match="No decoder found"):
        _run(_wds(shard).xdecode(cls=cls))
    with pytest.raises(tarindex.DecodeError, match="extension 'json': no decoder matches it"):
        _ours(shard, decode=xdecode(cls=cls))
    # a decode= handler list still takes file-object style through xdecode only: a plain
    # (key, data) handler gets bytes
    assert _ours(shard, decode=[lambda k, d: len(d) if k == ".cls" else None])[0]["cls"] == 1


def test_xdecode_pyd_is_gated_by_allow_pickle(tmp_path: Path) -> None:
    import pickle

    with tarindex.TarWriter(tmp_path / "p.tar") as w:
        w.write({"__key__": "a", "pyd": pickle.dumps([1]), "bin": b"\x00"})
    path = str(tmp_path / "p.tar")
    with pytest.raises(tarindex.DecodeError, match="allow_pickle=True"):
        tarindex.TarDataset(path, decode=xdecode())[0]
    s = tarindex.TarDataset(path, decode=xdecode(allow_pickle=True))[0]
    assert s["pyd"] == [1] and s["bin"] == b"\x00"
    assert _clean(s) == _clean(_run(_wds(path).xdecode())[0])
