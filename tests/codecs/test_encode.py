"""Encoders by extension: write with our writer, read back with our decoders and webdataset's."""

from __future__ import annotations

import io
import pickle
import subprocess
import sys
import tarfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image

import tarindex
from tarindex.codecs.decode import ExtDecoder
from tarindex.codecs.encode import encode_value
from tests.conftest import have

RNG = np.random.default_rng(7)
RGB = RNG.integers(0, 256, (12, 10, 3), dtype=np.uint8)
RGBA = RNG.integers(0, 256, (12, 10, 4), dtype=np.uint8)
GRAY = RNG.integers(0, 256, (12, 10), dtype=np.uint8)
# smooth pixels, so a lossy codec's error stays small and the check is meaningful
SMOOTH = np.add.outer(np.arange(32) * 4, np.arange(24) * 5).astype(np.uint8)
SMOOTH_RGB = np.stack([SMOOTH, SMOOTH[::-1], 255 - SMOOTH], axis=-1)


def _write_one(path: Path, sample: dict[str, Any]) -> str:
    with tarindex.TarWriter(str(path), mtime=0) as w:
        w.write({"__key__": "s0", **sample})
    return str(path)


def _ours(path: str, image: str = "pil", allow_pickle: bool = True) -> dict[str, Any]:
    raw = tarindex.ShardSet(path).sample(0)
    return ExtDecoder(image, allow_pickle=allow_pickle)(raw)


def _wds(path: str, spec: str = "pil") -> dict[str, Any]:
    wds: Any = pytest.importorskip("webdataset")
    ds = wds.WebDataset(path, shardshuffle=False, empty_check=False).decode(spec)
    (sample,) = list(ds)
    return dict(sample)


def _eq(a: Any, b: Any) -> bool:
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return bool(np.asarray(a).dtype == np.asarray(b).dtype and np.array_equal(a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_eq(a[k], b[k]) for k in a)
    return bool(a == b)


# (ext, value, what reading it back must give)
DATA_CASES: list[tuple[str, Any, Any]] = [
    ("pyd", {"a": [1, 2], "t": (3, "x"), "b": b"\x00"}, None),
    ("input.pyd", "a str is pickled under pyd", None),
    ("pickle", RNG.standard_normal((3, 2)), None),
    ("npy", RNG.standard_normal((4, 3)).astype(np.float32), None),
    ("seg.npy", np.arange(5, dtype=np.int16), None),
    ("npz", {"a": np.arange(3), "b": np.ones((2, 2), np.float32)}, None),
    ("json", {"é": [1, 2.5, None, True], "n": {"x": "y"}}, None),
    ("json", [1, "two"], None),
    ("txt", "héllo\nworld", None),
    ("cls", 7, None),
    ("cls", np.int64(3), 3),
]


@pytest.mark.parametrize(("ext", "value", "want"), DATA_CASES, ids=lambda x: str(x)[:12])
def test_data_roundtrip_ours_and_webdataset(
    tmp_path: Path, ext: str, value: Any, want: Any
) -> None:
    want = value if want is None else want
    path = _write_one(tmp_path / "one.tar", {ext: value})
    assert _eq(_ours(path)[ext], want)
    assert _eq(_wds(path)[ext], want)
    # the member is exactly what encode_value gives
    with tarfile.open(path) as tf:
        assert tf.extractfile(f"s0.{ext}").read() == encode_value(ext, value)  # type: ignore[union-attr]


def test_pth_roundtrip(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    value = {"w": torch.arange(6, dtype=torch.float32).reshape(2, 3), "step": 4}
    path = _write_one(tmp_path / "one.tar", {"pth": value})
    raw = tarindex.ShardSet(path).sample(0)["pth"]
    got = torch.load(io.BytesIO(raw), weights_only=True)
    assert torch.equal(got["w"], value["w"]) and got["step"] == 4
    ours = _ours(path, allow_pickle=False)["pth"]  # torch.load(weights_only=True)
    assert torch.equal(ours["w"], value["w"]) and ours["step"] == 4
    wgot = _wds(path)["pth"]
    assert torch.equal(wgot["w"], value["w"])


@pytest.mark.parametrize("ext", ["msgpack", "mp", "msg"])
def test_msgpack_roundtrip(tmp_path: Path, ext: str) -> None:
    msgpack = pytest.importorskip("msgpack")
    value = {"a": [1, 2], "b": b"\x01\x02", "s": "é"}
    path = _write_one(tmp_path / "one.tar", {ext: value})
    raw = tarindex.ShardSet(path).sample(0)[ext]
    assert msgpack.unpackb(raw) == value
    # webdataset decodes mp and msg; its writer also writes msgpack, which its decoders (and
    # ours, for parity: issue 22 item 3) leave as bytes
    want = raw if ext == "msgpack" else value
    assert _ours(path)[ext] == want
    assert _wds(path)[ext] == want


def test_cbor_roundtrip(tmp_path: Path) -> None:
    cbor2 = pytest.importorskip("cbor2")
    value = {"a": [1, 2], "b": b"\x01", "f": 1.5}
    path = _write_one(tmp_path / "one.tar", {"cbor": value})
    assert cbor2.loads(tarindex.ShardSet(path).sample(0)["cbor"]) == value
    assert _ours(path)["cbor"] == value


def test_missing_package_is_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # an import that fails the way a missing package does (sys.modules[name] = None)
    for pkg, ext in (("msgpack", "msgpack"), ("cbor2", "cbor"), ("torch", "pth")):
        monkeypatch.setitem(sys.modules, pkg, None)
        with tarindex.TarWriter(str(tmp_path / f"{pkg}.tar"), mtime=0) as w:
            with pytest.raises(tarindex.errors.WriterError, match=rf"{pkg}.*pip install {pkg}"):
                w.write({"__key__": "a", "txt": "kept out too", ext: {"x": 1}})
            w.write({"__key__": "b", "txt": "fine"})
        got = tarindex.ShardSet(str(tmp_path / f"{pkg}.tar")).read_block(0, 0, 1).to_samples()
        assert [s["__key__"] for s in got] == ["b"]


# (ext, pixels given, decode mode, max mean abs error)
IMAGE_CASES: list[tuple[str, Any, str, float]] = [
    ("png", RGB, "rgb8", 0),
    ("png", GRAY, "l8", 0),
    ("png", GRAY[:, :, None], "l8", 0),
    ("png", RGBA, "pilrgba", 0),
    ("ppm", RGB, "rgb8", 0),
    ("pgm", GRAY, "l8", 0),
    ("tiff", RGB, "rgb8", 0),
    ("tif", GRAY, "l8", 0),
    ("bmp", RGB, "rgb8", 0),
    ("webp", SMOOTH_RGB, "rgb8", 4),
    ("jpg", SMOOTH_RGB, "rgb8", 4),
    ("jpeg", SMOOTH, "l8", 4),
    ("out.jpg", SMOOTH_RGB, "rgb8", 4),
]


@pytest.mark.parametrize(("ext", "pixels", "mode", "tol"), IMAGE_CASES, ids=lambda x: str(x)[:8])
@pytest.mark.parametrize("as_pil", [False, True], ids=["array", "pil"])
def test_image_roundtrip(
    tmp_path: Path, ext: str, pixels: Any, mode: str, tol: float, as_pil: bool
) -> None:
    value = Image.fromarray(pixels.squeeze()) if as_pil else pixels
    path = _write_one(tmp_path / "img.tar", {ext: value})
    want = pixels.squeeze().astype(np.int16)
    got = np.asarray(_ours(path, mode)[ext]).astype(np.int16)
    assert got.shape == want.shape
    assert float(np.abs(got - want).mean()) <= tol
    # the member is the format the extension names, and webdataset reads it
    fmt = {"jpg": "JPEG", "jpeg": "JPEG", "tif": "TIFF", "pgm": "PPM", "ppm": "PPM"}
    last = ext.rsplit(".", 1)[-1]
    with Image.open(io.BytesIO(tarindex.ShardSet(path).sample(0)[ext])) as im:
        assert im.format == fmt.get(last, last.upper())
    if last != "webp":  # webdataset's image decoder opens webp too, but check the common ones
        spec = {"rgb8": "rgb8", "l8": "l8", "pilrgba": "rgba8"}[mode]
        assert np.array_equal(np.asarray(_wds(path, spec)[ext]).astype(np.int16), got)


def test_float_image_scaled_like_webdataset(tmp_path: Path) -> None:
    imageencoder = pytest.importorskip("webdataset.writer").imageencoder
    f = RNG.random((8, 9, 3))
    ours = encode_value("png", f)
    assert ours == encode_value("png", (f * 255).astype(np.uint8))
    theirs = np.asarray(Image.open(io.BytesIO(imageencoder(f, "PNG"))))
    assert np.array_equal(np.asarray(Image.open(io.BytesIO(ours))), theirs)


@pytest.mark.parametrize(
    ("ext", "value", "match"),
    [
        ("jpg", RGB.astype(np.int64), "must be uint8"),
        ("png", np.zeros((3, 8, 8), np.uint8), r"shape \(3, 8, 8\).*permute"),
        ("png", RNG.random((4, 4)) * 3, r"\[0, 1\]"),
        ("jpg", Image.fromarray(RGBA), "JPEG cannot store a RGBA"),
        ("npy", np.array([object()]), "object arrays"),
        ("npz", [1, 2], "dict of str"),
        ("cls", True, "bool is ambiguous"),
        ("json", {1, 2}, "cannot encode a set"),
        ("pyd", lambda: 0, "PicklingError|AttributeError"),
        ("bin", np.zeros(3), "numpy arrays are written as"),
    ],
    ids=lambda x: str(x)[:10],
)
def test_unencodable_value_is_refused_and_nothing_written(
    tmp_path: Path, ext: str, value: Any, match: str
) -> None:
    path = tmp_path / "bad.tar"
    with tarindex.TarWriter(str(path), mtime=0) as w:
        with pytest.raises(tarindex.errors.WriterError, match=match) as ei:
            w.write({"__key__": "bad", "txt": "first member", ext: value})
        assert "'bad'" in str(ei.value) and ei.value.__cause__ is not None
        w.write({"__key__": "good", "txt": "ok"})
    with tarfile.open(path) as tf:
        assert [m.name for m in tf.getmembers() if m.isfile()] == ["good.txt"]


def test_tarwriter_single_file_any_name(tmp_path: Path) -> None:
    path = tmp_path / "100% data.tar"  # a '%' is a plain character for TarWriter
    with tarindex.TarWriter(path, mtime=0) as sink:
        for i in range(2500):
            sink.write({"__key__": f"sample{i:06d}", "cls": i % 10})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["100% data.tar", "100% data.tar.tidx"]
    assert sink.paths == [str(path)]
    ds = tarindex.ShardSet(str(path))
    assert len(ds) == 2500 and int(ds.sample(2499)["cls"]) == 9
    if have("tar"):
        out = subprocess.run(["tar", "-tf", str(path)], capture_output=True, check=True, text=True)
        assert out.stdout.split()[:2] == ["sample000000.cls", "sample000001.cls"]


def test_tutorial_tarwriter_with_pyd(tmp_path: Path) -> None:
    """webdataset's tutorial, "Creating a WebDataset", line for line (MNIST -> sklearn digits)."""
    import os

    digits = pytest.importorskip("sklearn.datasets").load_digits()
    # the tutorial's dataset yields (PIL image, int label) pairs, as torchvision's MNIST does
    dataset = [
        (Image.fromarray((img * 255 / 16).astype(np.uint8)), int(t))
        for img, t in zip(digits.images[:300], digits.target[:300], strict=True)
    ]
    os.chdir(tmp_path)

    with tarindex.TarWriter("mnist.tar") as sink:
        for index, (input, output) in enumerate(dataset):
            sink.write(
                {
                    "__key__": "sample%06d" % index,  # noqa: UP031 (the tutorial's line)
                    "input.pyd": input,
                    "output.pyd": output,
                }
            )

    # tar -x and webdataset read it; our dataset reads it back (pickle is opt-in on read)
    wds: Any = pytest.importorskip("webdataset")
    theirs = list(wds.WebDataset("mnist.tar", shardshuffle=False).decode())
    assert [s["output.pyd"] for s in theirs] == [t for _, t in dataset]
    ours = tarindex.ShardSet("mnist.tar")
    dec = ExtDecoder(allow_pickle=True)
    for i in (0, 157, 299):
        s = dec(ours.sample(i))
        assert s["__key__"] == f"sample{i:06d}" and s["output.pyd"] == dataset[i][1]
        assert np.array_equal(np.asarray(s["input.pyd"]), np.asarray(dataset[i][0]))
    # without allow_pickle a pickle member is an error naming it (issue 22 item 7)
    with pytest.raises(tarindex.DecodeError, match="'input.pyd'.*allow_pickle=True"):
        ExtDecoder()(ours.sample(0))
    assert ExtDecoder(only=["__key__"])(ours.sample(0))["input.pyd"] == ours.sample(0)["input.pyd"]
    assert pickle.loads(ours.sample(0)["output.pyd"]) == dataset[0][1]


def test_encoder_true_and_false_as_webdataset(tmp_path: Path) -> None:
    with tarindex.TarWriter(str(tmp_path / "f.tar"), encoder=False) as w:
        w.write({"__key__": "a", "txt": "é", "bin": b"\x00"})
        with pytest.raises(tarindex.errors.WriterError, match="encoder=False takes bytes or str"):
            w.write({"__key__": "b", "cls": 3})
    assert tarindex.ShardSet(str(tmp_path / "f.tar")).sample(0)["txt"] == "é".encode()
    with tarindex.TarWriter(str(tmp_path / "t.tar"), encoder=True) as w:
        w.write({"__key__": "a", "cls": 3})
    assert tarindex.ShardSet(str(tmp_path / "t.tar")).sample(0)["cls"] == b"3"
