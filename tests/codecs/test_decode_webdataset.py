"""Every webdataset image spec and built-in decoder, compared with webdataset on the same shard."""

from __future__ import annotations

import io
import json
import pickle
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from PIL import Image

import tarindex
from tarindex.codecs import IMAGE_SPECS

wds = pytest.importorskip("webdataset")


def _img(mode: str, h: int, w: int, seed: int) -> Image.Image:
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:h, 0:w]
    rgb = np.stack([x * 255 // w, y * 255 // h, (x + y) * 127 // (h + w)], -1)
    rgb = np.clip(rgb + rng.integers(-30, 30, rgb.shape), 0, 255).astype(np.uint8)
    img = Image.fromarray(rgb)
    if mode == "RGBA":
        a = Image.fromarray(rng.integers(0, 256, (h, w), dtype=np.uint8))
        img = img.convert("RGBA")
        img.putalpha(a)
        return img
    return img.convert(mode)


def _encoded(img: Image.Image, fmt: str) -> bytes:
    buf = io.BytesIO()
    img.save(buf, format=fmt)
    return buf.getvalue()


# one sample per image kind: photo JPEG, grey JPEG, grey/RGBA/palette/LA PNG, 16-bit PNG, PPM
_KINDS = [
    ("jpg", "RGB", "JPEG"),
    ("jpeg", "L", "JPEG"),
    ("png", "L", "PNG"),
    ("png", "RGBA", "PNG"),
    ("png", "P", "PNG"),
    ("png", "LA", "PNG"),
    ("png", "I;16", "PNG"),
    ("ppm", "RGB", "PPM"),
]


@pytest.fixture(scope="module")
def shard(tmp_path_factory: pytest.TempPathFactory) -> str:
    d = tmp_path_factory.mktemp("wds")
    path = str(d / "s-000000.tar")
    with tarindex.ShardWriter(str(d / "s-%06d.tar"), maxcount=100, mtime=0) as w:
        for i, (ext, mode, fmt) in enumerate(_KINDS):
            w.write(
                {
                    "__key__": f"{i:04d}",
                    ext: _encoded(_img(mode, 13 + i, 17 + 2 * i, i), fmt),
                    "cls": str(i).encode(),
                    "json": json.dumps({"i": i, "mode": mode}).encode(),
                    "txt": f"caption {i} é".encode(),
                }
            )
    return path


def _wds_samples(path: str, *args: Any) -> dict[str, dict[str, Any]]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ds = wds.WebDataset(path, shardshuffle=False).decode(*args)
        return {s["__key__"]: s for s in ds}


def _same(ours: Any, theirs: Any, what: str) -> None:
    assert type(ours) is type(theirs) or (
        isinstance(ours, Image.Image) and isinstance(theirs, Image.Image)
    ), (what, type(ours), type(theirs))
    if isinstance(theirs, torch.Tensor):
        assert ours.dtype == theirs.dtype and ours.shape == theirs.shape, what
        assert ours.is_contiguous(), what
        assert torch.equal(ours, theirs), what
    elif isinstance(theirs, np.ndarray):
        assert ours.dtype == theirs.dtype and ours.shape == theirs.shape, what
        np.testing.assert_array_equal(ours, theirs, err_msg=what)
    elif isinstance(theirs, Image.Image):
        assert (ours.mode, ours.size) == (theirs.mode, theirs.size), what
        np.testing.assert_array_equal(np.asarray(ours), np.asarray(theirs), err_msg=what)
    else:
        assert ours == theirs, what


@pytest.mark.parametrize("spec", list(IMAGE_SPECS))
def test_every_image_spec_equals_webdataset(shard: str, spec: str) -> None:
    theirs = _wds_samples(shard, spec)
    ds = tarindex.TarDataset(shard, decode=spec)
    assert len(ds) == len(theirs) == len(_KINDS)
    for i in range(len(ds)):
        ours = ds[i]
        want = theirs[ours["__key__"]]
        exts = {k for k in ours if not k.startswith("__")}
        assert exts == {k for k in want if not k.startswith("__")}
        for ext in sorted(exts):
            _same(ours[ext], want[ext], f"{spec} {ours['__key__']} {ext} {_KINDS[i]}")
    # the dtype/shape/range contract itself, on the RGB photo and the grey PNG
    kind, dtype, mode = IMAGE_SPECS[spec]
    for i in (0, 2):
        img = ds[i]["jpg" if i == 0 else "png"]
        h, w = 13 + i, 17 + 2 * i
        c = len(mode)
        if kind == "pil":
            assert isinstance(img, Image.Image) and img.mode == mode and img.size == (w, h)
            continue
        want_shape = (h, w) if c == 1 else ((h, w, c) if kind == "numpy" else (c, h, w))
        assert tuple(img.shape) == want_shape, (spec, img.shape)
        arr = img.numpy() if kind == "torch" else img
        assert arr.dtype == np.dtype(dtype)
        if dtype == "float32":
            assert 0.0 <= float(arr.min()) and float(arr.max()) <= 1.0
            assert float(arr.max()) > 0.5  # in [0, 1], not [0, 1/255]


def test_builtin_decoders_equal_webdatasets_defaults(tmp_path: Path) -> None:
    """cls/cls2/index/inx/id, txt/text/transcript, json/jsn, npy, npz, pth, pyd/pickle, mp."""
    msgpack = pytest.importorskip("msgpack")
    arr = np.arange(12, dtype=np.int16).reshape(3, 4)
    npy, npz, pth = io.BytesIO(), io.BytesIO(), io.BytesIO()
    np.save(npy, arr)
    np.savez(npz, a=arr, b=np.ones(3))
    torch.save({"w": torch.arange(4)}, pth)
    members = {
        "cls": b"7",
        "cls2": b" 8\n",
        "index": b"9",
        "inx": b"10",
        "id": b"11",
        "txt": "héllo".encode(),
        "text": b"t",
        "transcript": b"tr",
        "json": b'{"a": [1, 2]}',
        "jsn": b"[3]",
        "npy": npy.getvalue(),
        "npz": npz.getvalue(),
        "pth": pth.getvalue(),
        "pyd": pickle.dumps({"x": (1, 2)}),
        "pickle": pickle.dumps([4]),
        "mp": msgpack.packb({"m": [1, "x"]}),
        "msg": msgpack.packb(5),
        "bin": b"\x00raw",
    }
    with tarindex.ShardWriter(str(tmp_path / "b-%06d.tar"), mtime=0) as w:
        w.write({"__key__": "k", **members})
    path = str(tmp_path / "b-000000.tar")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        theirs = next(iter(wds.WebDataset(path, shardshuffle=False).decode()))
    ours = tarindex.TarDataset(path, decode=True, allow_pickle=True)[0]
    for ext in members:
        if ext == "pth":  # webdataset: torch.load(weights_only=False) unless an env variable
            assert torch.equal(ours[ext]["w"], theirs[ext]["w"])
        elif ext == "npz":
            assert ours[ext].keys() == theirs[ext].keys()
            for k in ours[ext]:
                np.testing.assert_array_equal(ours[ext][k], theirs[ext][k])
        elif ext == "npy":
            _same(ours[ext], theirs[ext], ext)
        else:
            assert ours[ext] == theirs[ext] and type(ours[ext]) is type(theirs[ext]), ext
    # without allow_pickle: a pickle member is an error naming it (webdataset's WDS_SECURE=1
    # refuses it too); left out by fields=, the rest decodes; pth loads with weights_only=True
    with pytest.raises(tarindex.DecodeError, match=r"b-000000.tar: sample 'k', extension 'p"):
        tarindex.TarDataset(path, decode="rgb8")[0]
    keep = [e for e in members if e not in ("pyd", "pickle")]
    safe = tarindex.TarDataset(path, decode="rgb8", fields=keep)[0]
    assert "pyd" not in safe and "pickle" not in safe
    assert torch.equal(safe["pth"]["w"], torch.arange(4))


def test_every_spec_in_both_datasets_and_in_dataloader_workers(shard: str) -> None:
    """The same values from TarIterableDataset, and from TarDataset in worker processes."""
    specs = list(IMAGE_SPECS)
    theirs = {spec: _wds_samples(shard, spec) for spec in specs}
    for spec in specs:
        got = list(tarindex.TarIterableDataset(shard, shuffle=False, decode=spec))
        assert len(got) == len(_KINDS)
        for s in got:
            for ext in s:
                if not ext.startswith("__"):
                    _same(s[ext], theirs[spec][s["__key__"]][ext], f"iterable {spec} {ext}")
    # one DataLoader over a dataset per spec (one worker start for all of them)
    parts = [tarindex.TarDataset(shard, decode=spec) for spec in specs]
    both: torch.utils.data.ConcatDataset[Any] = torch.utils.data.ConcatDataset(parts)
    loader = torch.utils.data.DataLoader(
        both, batch_size=None, num_workers=2, collate_fn=lambda s: s
    )
    n = 0
    for k, s in enumerate(loader):
        spec = specs[k // len(_KINDS)]
        for ext in s:
            if not ext.startswith("__"):
                _same(s[ext], theirs[spec][s["__key__"]][ext], f"worker {spec} {ext}")
        n += 1
    assert n == len(specs) * len(_KINDS)
