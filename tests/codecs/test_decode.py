"""decode= the webdataset way: handlers f(key, data), lists, dicts, sample functions, errors."""

from __future__ import annotations

import functools
import io
import pickle
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import zstandard
from PIL import Image

import tarindex
from tarindex.codecs import ExtDecoder, ExtTable, decode_value, is_handler, make_decoder

wds = pytest.importorskip("webdataset")


def _png(h: int = 4, w: int = 5) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(np.arange(h * w * 3, dtype=np.uint8).reshape(h, w, 3)).save(buf, "PNG")
    return buf.getvalue()


MEMBERS = {
    "png": _png(),
    "seg.png": _png(2, 3),
    "cls": b"3",
    "json": b'{"a": 1}',
    "meta.json.zst": b'{"z": 2}',  # the writer compresses it
    "bin": b"\x00\x01",
}


@pytest.fixture
def shard(tmp_path: Path) -> str:
    with tarindex.ShardWriter(str(tmp_path / "h-%06d.tar"), mtime=0) as w:
        w.write({"__key__": "k0", **MEMBERS})
        w.write({"__key__": "k1", **MEMBERS})
    return str(tmp_path / "h-000000.tar")


class Recorder:
    """A picklable handler that records its calls and handles nothing."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, bytes]] = []

    def __call__(self, key: str, data: bytes) -> Any:
        self.calls.append((key, bytes(data)))
        return None


def test_handlers_get_the_keys_webdataset_passes(shard: str) -> None:
    theirs, ours = Recorder(), Recorder()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ds = wds.WebDataset(shard, shardshuffle=False).decode(theirs)
        wsample = next(iter(ds))
    sample = tarindex.TarDataset(shard, decode=ours)[0]
    # webdataset hands .zst members to handlers compressed; tarindex decompresses them first
    # and passes the inner key (as webdataset does for .gz): the rest is the same, call for call
    stored = tarindex.TarDataset(shard).raw(0)["meta.json.zst"]
    assert zstandard.ZstdDecompressor().decompress(stored) == b'{"z": 2}'
    zst = [(k, d) for k, d in theirs.calls if k.endswith(".zst")]
    assert zst == [(".meta.json.zst", stored)]
    assert sorted(c for c in theirs.calls if c not in zst) == sorted(
        c for c in ours.calls if c[0] != ".meta.json"
    )
    assert (".meta.json", b'{"z": 2}') in ours.calls
    assert all(k.startswith(".") for k, _ in ours.calls)
    # a handler that handles nothing: images stay bytes, the built-ins decode the rest
    assert sample["png"] == MEMBERS["png"] == wsample["png"]
    assert sample["cls"] == 3 == wsample["cls"] and sample["json"] == {"a": 1}
    assert sample["meta.json"] == {"z": 2} and "meta.json.zst" not in sample


def test_first_non_none_wins_in_list_order(shard: str) -> None:
    def seg(key: str, data: bytes) -> Any:
        return ("seg", len(data)) if key.endswith(".seg.png") else None

    def png(key: str, data: bytes) -> Any:
        return "any png" if key.endswith(".png") else None

    got = tarindex.TarDataset(shard, decode=[seg, png, "rgb8"])[0]
    assert got["seg.png"] == ("seg", len(MEMBERS["seg.png"])) and got["png"] == "any png"
    got = tarindex.TarDataset(shard, decode=["rgb8", seg])[0]  # the spec first: it takes all
    assert got["seg.png"].shape == (2, 3, 3) and got["png"].shape == (4, 5, 3)
    # a dict {extension: f(data)}: "seg.png" only matches x.seg.png, "png" any png
    table = {"seg.png": len, "json cls": lambda d: b"x" + d}
    got = tarindex.TarDataset(shard, decode=[table, "l8"])[0]
    assert got["seg.png"] == len(MEMBERS["seg.png"]) and got["png"].shape == (4, 5)
    assert got["json"] == b'x{"a": 1}' and got["cls"] == b"x3" and got["bin"] == b"\x00\x01"
    assert tarindex.TarDataset(shard, decode={".PNG": len})[0]["seg.png"] == len(MEMBERS["seg.png"])


def test_webdatasets_own_handlers_work_unchanged(shard: str) -> None:
    got = tarindex.TarDataset(shard, decode=wds.imagehandler("torchrgb8"))[0]
    assert tuple(got["png"].shape) == (3, 4, 5) and got["cls"] == 3
    only_seg = wds.handle_extension("seg.png", lambda data: "seg!")
    got = tarindex.TarDataset(shard, decode=[only_seg, "l8"])[0]
    assert got["seg.png"] == "seg!" and got["png"].shape == (4, 5)


def test_sample_functions_and_handlers_told_apart_by_signature(shard: str) -> None:
    def sample_fn(sample: dict[str, Any]) -> dict[str, Any]:
        sample["seen"] = sorted(k for k in sample if not k.startswith("__"))
        return sample

    got = tarindex.TarDataset(shard, decode=sample_fn)[0]
    assert got["png"] == MEMBERS["png"] and "seen" in got  # called once, on the raw sample
    ext = ExtDecoder("l8", max_image_pixels=100)
    assert make_decoder(ext) is ext and make_decoder(sample_fn) is sample_fn
    assert is_handler(lambda key, data: None) and not is_handler(lambda s: s)
    assert is_handler(functools.partial(lambda a, key, data: None, 1))
    assert is_handler(wds.imagehandler("rgb8")) and not is_handler(ext)
    assert is_handler(ExtTable({"png": len}))

    def either(*args: Any) -> Any:
        return None

    def three(a: Any, b: Any, c: Any) -> Any:
        return None

    def optional(sample: dict[str, Any], size: int = 2) -> dict[str, Any]:
        return sample

    assert not is_handler(optional)
    for f in (either, three):
        with pytest.raises(ValueError, match=r"decode=\[f\] for a \(key, data\) handler"):
            tarindex.TarDataset(shard, decode=f)
    # in a list a callable is a handler whatever its signature
    assert tarindex.TarDataset(shard, decode=[either])[0]["cls"] == 3
    with pytest.raises(ValueError, match="cannot take two arguments"):
        tarindex.TarDataset(shard, decode=[sample_fn])
    with pytest.raises(ValueError, match="expected image specs"):
        tarindex.TarDataset(shard, decode=["rgb8", 3])
    with pytest.raises(ValueError, match="image mode 'bgr'"):
        tarindex.TarDataset(shard, decode=["bgr"])
    with pytest.raises(ValueError, match="expected a callable"):
        tarindex.TarDataset(shard, decode={"png": "nope"})


def boom(key: str, data: bytes) -> Any:
    if key == ".json":
        raise KeyError("no field")
    return None


def test_a_failing_handler_is_a_decode_error_naming_the_member(shard: str) -> None:
    ds = tarindex.TarDataset(shard, decode=boom)
    with pytest.raises(tarindex.DecodeError) as ei:
        ds[1]
    msg = str(ei.value)
    assert msg.startswith(f"{shard}: sample 'k1', extension 'json': handler boom failed on 8 ")
    assert "KeyError" in msg and isinstance(ei.value.__cause__, KeyError)
    # the built-ins' failures as before: named, chained
    with pytest.raises(tarindex.DecodeError, match=r"extension 'cls': cannot decode 1 bytes as an"):
        make_decoder(True)({"__shard__": "s.tar", "__key__": "k", "cls": b"x"})  # type: ignore[misc]
    with pytest.raises(tarindex.DecodeError, match="as a torch.save file") as e2:
        decode_value("pth", b"not a zip")
    assert e2.value.__cause__ is not None


def test_decoders_with_handlers_pickle(shard: str) -> None:
    d = ExtDecoder([{"seg.png": len}, Recorder(), "rgba"], allow_pickle=True)
    again = pickle.loads(pickle.dumps(d))
    assert again.image == "rgba" and again.allow_pickle
    s = again({"__key__": "k", "seg.png": MEMBERS["seg.png"], "png": MEMBERS["png"]})
    assert s["seg.png"] == len(MEMBERS["seg.png"]) and s["png"].dtype == np.float32
    assert "rgba" in repr(d)


def test_cbor_and_msgpack_and_a_clear_error_when_missing(tmp_path: Path) -> None:
    cbor2 = pytest.importorskip("cbor2")
    msgpack = pytest.importorskip("msgpack")
    assert decode_value("cbor", cbor2.dumps({"c": [1, 2.5]})) == {"c": [1, 2.5]}
    assert decode_value("mp", msgpack.packb([1, "x"])) == [1, "x"]
    code = (
        "import sys; sys.modules['cbor2'] = None; sys.modules['torch'] = None\n"
        "import tarindex\n"
        "from tarindex.codecs.decode import decode_value, ExtDecoder\n"
        "png = sys.stdin.buffer.read()\n"
        "for ext, data, spec in (('cbor', b'\\xa0', 'rgb8'), ('png', png, 'torchrgb8')):\n"
        "    try:\n"
        "        decode_value(ext, data, spec)\n"
        "    except tarindex.DecodeError as e:\n"
        "        print(type(e.__cause__).__name__, e)\n"
        "try:\n"
        "    ExtDecoder('torchrgb8')\n"
        "except ModuleNotFoundError as e:\n"
        "    print(e)\n"
        "print(ExtDecoder('rgb8')({'png': png})['png'].shape)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], input=_png(), capture_output=True, timeout=60
    )
    assert out.returncode == 0, out.stderr.decode()
    lines = out.stdout.decode().splitlines()
    assert lines[0].startswith("ModuleNotFoundError extension 'cbor': decoding a .cbor member")
    assert "needs the 'cbor2' package, which is not installed: pip install cbor2" in lines[0]
    assert "needs the 'torch' package" in lines[1] and "image spec 'torchrgb8'" in lines[1]
    assert "torch is not installed: pip install torch" in lines[2]
    assert lines[3] == "(4, 5, 3)"


class Big:
    """A decoded value whose lifetime the test watches."""


_ALIVE: list[Any] = []


def _big(key: str, data: bytes) -> Any:
    import weakref

    if key != ".bin":
        return None
    b = Big()
    _ALIVE.append(weakref.ref(b))
    return b


@pytest.mark.parametrize("shuffle", [False, True], ids=["in-order", "mixed"])
def test_streaming_holds_no_decoded_sample_once_yielded(make_shards: Any, shuffle: bool) -> None:
    """A decoded image is freed when the consumer drops it, not when its block or window ends."""
    paths = make_shards([40, 30])
    ds = tarindex.TarIterableDataset(
        paths, shuffle=shuffle, block_size=16, buffer_size=32, decode=_big
    )
    _ALIVE.clear()
    most = n = 0
    for s in ds:
        assert isinstance(s["bin"], Big)
        n += 1
        del s
        most = max(most, sum(r() is not None for r in _ALIVE))
    assert n == 70 and len(_ALIVE) == 70
    assert most <= 1, most  # before: a block's (16) or a window's (32) decoded values stayed
