"""ImageDecode: decode to the model's size, against a full decode + the same crop done with Pillow.

Tolerance (docs/DECODING.md, "Decoding to the model's size"), on 40 JPEGs of each size cut
from real photos (tests/photos.py), quality 90, output 224x224 uint8: per image, the mean
absolute difference to the reference is at most 2.5 (of 255), its mean over the set at most
1.0, and no pixel differs by more than 40; where no DCT scale applies (every 500x375 photo)
the output equals the reference exactly. The reference is what torchvision's PIL path does:
a full Pillow decode, ``crop(box)``, ``resize((224, 224), BILINEAR)``, the same flip.
Measured (both JPEG backends alike, both resize backends exactly alike): 1024x768
random-resized mean 0.50, worst image 1.43, worst pixel 25; center 0.82 / 1.49 / 18; whole
image 0.44 / 0.68 / 9.
"""

from __future__ import annotations

import io
import os
from pathlib import Path
from typing import Any

import numpy as np
import PIL
import pytest
from PIL import Image

import tarindex
from tarindex.codecs.decode import ExtDecoder
from tarindex.codecs.image import RESIZERS, ImageDecode, crop_box, draws
from tarindex.codecs.jpeg import available_backends, decode_region, decode_scaled

from ..photos import photo_jpegs

pytest.importorskip("sklearn")

AVAILABLE = list(available_backends())
HAVE_SJ = "simplejpeg" in AVAILABLE
HAVE_EXT = "libjpeg" in AVAILABLE
SIZES = [(500, 375), (1024, 768)]


def reference(spec: ImageDecode, data: bytes, epoch: int, index: int) -> np.ndarray[Any, Any]:
    """Full decode + the same box + Pillow's bilinear (antialiased) resize + the same flip."""
    im = Image.open(io.BytesIO(data)).convert("RGB")
    (left, top, w, h), flipped = spec.box(im.size[0], im.size[1], epoch, index)
    th, tw = spec.hw
    out = im.crop((left, top, left + w, top + h)).resize((tw, th), Image.Resampling.BILINEAR)
    if flipped:
        out = out.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
    return np.asarray(out).transpose(2, 0, 1)


@pytest.fixture(scope="module")
def photos() -> dict[tuple[int, int], list[bytes]]:
    return {size: photo_jpegs(40, size, quality=90, seed=1) for size in SIZES}


@pytest.fixture(scope="module")
def progressive() -> dict[tuple[int, int], list[bytes]]:
    """The same photos as progressive JPEGs (10 scans each)."""
    out = {size: photo_jpegs(40, size, quality=90, seed=1, progressive=True) for size in SIZES}
    assert all(d.count(b"\xff\xda") == 10 for ds in out.values() for d in ds)
    return out


def _resizers() -> list[str]:
    return list(RESIZERS)


# tarindex's resize follows Pillow 13's rule (its pass order); an older Pillow differs by 1 at most
EXACT = 0 if int(PIL.__version__.split(".")[0]) >= 13 else 1


def _within_tolerance(spec: ImageDecode, photos: list[bytes]) -> int:
    """Assert the tolerance over ``photos``; return the largest pixel difference."""
    worst = 0
    mads = []
    for i, data in enumerate(photos):
        got = spec.decode("jpg", data, epoch=3, index=i)
        assert got.shape == (3, 224, 224) and got.dtype == np.uint8 and got.flags.c_contiguous
        diff = np.abs(got.astype(np.int16) - reference(spec, data, 3, i).astype(np.int16))
        mads.append(float(diff.mean()))
        worst = max(worst, int(diff.max()))
        assert diff.mean() <= 2.5, (i, diff.mean())
        assert diff.max() <= 40, (i, diff.max())
    assert np.mean(mads) <= 1.0
    return worst


@pytest.mark.parametrize("resize", _resizers())
@pytest.mark.parametrize("backend", AVAILABLE)
@pytest.mark.parametrize("crop", ["random-resized", "center", None])
@pytest.mark.parametrize("size", SIZES)
def test_within_tolerance_of_full_decode(
    photos: dict[tuple[int, int], list[bytes]],
    size: tuple[int, int],
    crop: str | None,
    backend: str,
    resize: str,
) -> None:
    spec = ImageDecode(224, crop=crop, backend=backend, resize=resize)
    worst = _within_tolerance(spec, photos[size])
    if size == (500, 375):  # no box of a 375-pixel-high image is >= 2 x 224: full size
        # Pillow's resize is the reference's; tarindex's gives Pillow's pixels, bit for bit
        assert worst <= (0 if resize == "pil" else EXACT)


@pytest.mark.parametrize("backend", AVAILABLE)
@pytest.mark.parametrize("crop", ["random-resized", "center", None])
@pytest.mark.parametrize("size", SIZES)
def test_progressive_jpegs_within_tolerance_of_full_decode(
    progressive: dict[tuple[int, int], list[bytes]],
    size: tuple[int, int],
    crop: str | None,
    backend: str,
) -> None:
    """A progressive JPEG's region (every scan read, then only the box transformed) too."""
    worst = _within_tolerance(ImageDecode(224, crop=crop, backend=backend), progressive[size])
    if size == (500, 375):
        assert worst <= EXACT


def test_scaled_decode_is_used_for_large_photos(photos: dict[tuple[int, int], list[bytes]]) -> None:
    # a 1024x768 photo to 224 whole: 1/2 scale (512x384 >= 224), a quarter of the pixels
    for backend in AVAILABLE:
        arr = decode_scaled(photos[(1024, 768)][0], 512, 384, 1 << 25, backend)
        assert arr.shape == (384, 512, 3)
        assert decode_scaled(photos[(500, 375)][0], 500, 375, 1 << 25, backend).shape == (
            375,
            500,
            3,
        )


@pytest.mark.skipif(len(AVAILABLE) < 2, reason="simplejpeg not installed, libjpeg not built")
def test_backends_agree(photos: dict[tuple[int, int], list[bytes]]) -> None:
    for size in SIZES:
        for i, data in enumerate(photos[size][:20]):
            b = ImageDecode(224, backend="pil", resize="pil").decode("jpg", data, index=i)
            for other in AVAILABLE[:-1]:
                a = ImageDecode(224, backend=other, resize="pil").decode("jpg", data, index=i)
                assert np.abs(a.astype(np.int16) - b.astype(np.int16)).max() <= 2


@pytest.mark.parametrize("kind", ["baseline", "progressive"])
@pytest.mark.parametrize("backend", AVAILABLE)
def test_region_decode_is_the_whole_decodes_pixels(
    photos: dict[tuple[int, int], list[bytes]],
    progressive: dict[tuple[int, int], list[bytes]],
    backend: str,
    kind: str,
) -> None:
    """A box decoded alone (libjpeg: crop_scanline, skip_scanlines) equals the whole decode's."""
    rng = np.random.default_rng(0)
    for size in SIZES:
        for data in (photos if kind == "baseline" else progressive)[size][:8]:
            for k in (1, 2, 4, 8):
                whole = decode_scaled(data, size[0] // k, size[1] // k, 1 << 25, "pil")
                h, w = whole.shape[:2]
                assert (w, h) == (-(-size[0] // k), -(-size[1] // k))
                for _ in range(4):
                    x0, y0 = int(rng.integers(0, w // 2)), int(rng.integers(0, h // 2))
                    x1, y1 = int(rng.integers(x0 + 1, w + 1)), int(rng.integers(y0 + 1, h + 1))
                    got = decode_region(data, k, (x0, y0, x1, y1), 1 << 25, backend)
                    np.testing.assert_array_equal(got, whole[y0:y1, x0:x1])
    src = Image.open(io.BytesIO(photos[SIZES[0]][0]))
    for mode, sub in (("RGB", 0), ("RGB", 1), ("L", 2)):  # 4:4:4, 4:2:2, grayscale
        buf = io.BytesIO()
        src.convert(mode).save(buf, "JPEG", quality=90, subsampling=sub, progressive=kind != "baseline")
        for k in (1, 2):
            whole = decode_scaled(buf.getvalue(), 500 // k, 375 // k, 1 << 25, "pil")
            h, w = whole.shape[:2]
            for x0, y0, x1, y1 in ((16 // k, 3, w - 16 // k, h - 1), (1, 0, 17, 9), (0, 5, w, 6)):
                got = decode_region(buf.getvalue(), k, (x0, y0, x1, y1), 1 << 25, backend)
                np.testing.assert_array_equal(got, whole[y0:y1, x0:x1])
    with pytest.raises(ValueError, match="outside"):
        decode_region(photos[SIZES[0]][0], 2, (0, 0, 251, 10), 1 << 25, backend)
    with pytest.raises(ValueError, match="k=3"):
        decode_region(photos[SIZES[0]][0], 3, (0, 0, 10, 10), 1 << 25, backend)


def test_crop_box_follows_random_resized_crop() -> None:
    seen_fallback = False
    for index in range(300):
        u = draws(7, 0, index)
        left, top, w, h = crop_box(500, 375, u)
        assert 0 <= left and left + w <= 500 and 0 <= top and top + h <= 375
        area = w * h / (500 * 375)
        # rounding of w, h moves the area and ratio a little past the drawn ones
        assert 0.08 * 0.95 <= area <= 1.0
        assert 3 / 4 * 0.95 <= w / h <= 4 / 3 * 1.05
    for index in range(50):  # a 1000x10 strip: no box of ratio 3/4..4/3 and area >= 8 % fits
        left, top, w, h = crop_box(1000, 10, draws(0, 0, index))
        assert (left, top, w, h) == ((1000 - 13) // 2, 0, 13, 10)  # centre, ratio 4/3
        seen_fallback = True
    assert seen_fallback
    # the first try that fits wins: u all 0.5 is try 0: area 54 % (sqrt(101250) -> 318),
    # ratio 1, left int(0.5 * (500 - 318 + 1)) = 91, top int(0.5 * (375 - 318 + 1)) = 29
    left, top, w, h = crop_box(500, 375, [0.5] * 42)
    assert (w, h) == (318, 318) and (left, top) == (91, 29)


def test_draws_are_a_pure_function_of_seed_epoch_index() -> None:
    assert draws(0, 1, 2) == draws(0, 1, 2)
    for s, e, i in [(0, 0, 0), (7, 3, 12345), (2**64 - 1, 2**40, 2**63)]:  # the words' top 53 bits
        words = np.random.SeedSequence(
            [s & 0xFFFFFFFF, s >> 32, e & 0xFFFFFFFF, e >> 32, 0x494D47, i & 0xFFFFFFFF, i >> 32]
        ).generate_state(42, np.uint64)
        assert draws(s, e, i) == [(int(w) >> 11) / 2**53 for w in words]
    assert len({tuple(draws(s, e, i)) for s, e, i in [(0, 1, 2), (1, 0, 2), (0, 2, 1)]}) == 3
    assert draws(0, 0, 2**32) != draws(0, 1, 0)  # words do not collide
    with pytest.raises(ValueError, match="epoch"):
        draws(0, -1, 0)
    spec = ImageDecode(64)
    boxes = {spec.box(500, 375, 0, i) for i in range(20)}
    assert len(boxes) == 20
    flips = [spec.box(500, 375, 0, i)[1] for i in range(200)]
    assert 60 < sum(flips) < 140


def test_options_and_errors() -> None:
    data = photo_jpegs(1, (500, 375))[0]
    hwc = ImageDecode((96, 128), crop="center", layout="HWC", dtype="float32").decode("jpg", data)
    assert hwc.shape == (96, 128, 3) and hwc.dtype == np.float32
    assert 0.0 <= hwc.min() and hwc.max() <= 1.0
    chw = ImageDecode((96, 128), crop="center").decode("jpg", data)
    np.testing.assert_array_equal(hwc, chw.transpose(1, 2, 0) / np.float32(255))
    assert ImageDecode(crop="center").flip is False and ImageDecode().flip is True
    for bad in (
        {"crop": "random"},
        {"dtype": "int16"},
        {"layout": "NCHW"},
        {"scale": (0.5, 0.1)},
        {"ratio": (0, 1)},
        {"size": 0},
        {"backend": "turbo"},
        {"seed": -1},
    ):
        with pytest.raises(ValueError):
            ImageDecode(**bad)
    dec = ExtDecoder(ImageDecode(32))
    png = io.BytesIO()
    Image.new("RGB", (40, 30)).save(png, "PNG")
    with pytest.raises(tarindex.DecodeError, match="not a JPEG"):
        dec({"__key__": "k", "__index__": 0, "jpg": png.getvalue()})
    small = ExtDecoder(ImageDecode(32), max_image_pixels=500 * 375 - 1)
    with pytest.raises(tarindex.DecodeError, match="max_image_pixels"):
        small({"__key__": "k", "__index__": 0, "jpg": data})


def test_png_and_webp_through_pillow() -> None:
    src = Image.open(io.BytesIO(photo_jpegs(1, (500, 375))[0])).convert("RGB")
    for resize in _resizers():
        spec = ImageDecode(224, resize=resize)
        for fmt, ext in (("PNG", "png"), ("WEBP", "webp")):
            buf = io.BytesIO()
            src.save(buf, fmt, lossless=True) if fmt == "WEBP" else src.save(buf, fmt)
            got = spec.decode(ext, buf.getvalue(), epoch=0, index=5)
            want = reference(spec, buf.getvalue(), 0, 5)
            diff = np.abs(got.astype(np.int16) - want.astype(np.int16))
            assert diff.max() <= (0 if resize == "pil" else EXACT)  # Pillow's pixels, both


def _write(tmp_path: Path, n: int) -> str:
    jpegs = photo_jpegs(n, (320, 240), seed=3)
    with tarindex.ShardWriter(str(tmp_path / "img-%06d.tar"), maxcount=n // 3 + 1) as sink:
        for i, data in enumerate(jpegs):
            sink.write({"__key__": f"{i:05d}", "jpg": data, "cls": i % 7})
    return str(tmp_path / "img-*.tar")


def test_map_style_epochs_replay_with_any_workers(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    src = _write(tmp_path, 24)
    ds = tarindex.TarDataset(src, decode=tarindex.ImageDecode(64, seed=5, tensor=True))

    def run(epoch: int, workers: int) -> dict[int, Any]:
        ds.set_epoch(epoch)
        loader = torch.utils.data.DataLoader(ds, batch_size=5, shuffle=True, num_workers=workers)
        out: dict[int, Any] = {}
        for batch in loader:
            assert batch["jpg"].shape[1:] == (3, 64, 64) and batch["jpg"].dtype == torch.uint8
            for k, img in zip(batch["__index__"].tolist(), batch["jpg"], strict=True):
                out[k] = img
        return out

    e0, e0_w2, e1 = run(0, 0), run(0, 2), run(1, 2)
    assert sorted(e0) == list(range(24))
    assert all(torch.equal(e0[k], e0_w2[k]) for k in e0)  # same epoch, other workers: same
    assert sum(not torch.equal(e0[k], e1[k]) for k in e0) >= 20  # another epoch: new crops
    assert all(torch.equal(ds[k]["jpg"], e1[k]) for k in (0, 7, 23))  # ds[i] in epoch 1


def test_streaming_epochs_replay_with_any_workers(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    src = _write(tmp_path, 24)
    ds = tarindex.TarIterableDataset(src, decode=tarindex.ImageDecode(48, seed=2), seed=1)

    def run(epoch: int, workers: int) -> dict[int, np.ndarray[Any, Any]]:
        ds.set_epoch(epoch)
        loader = torch.utils.data.DataLoader(ds, batch_size=None, num_workers=workers)
        return {int(s["__index__"]): s["jpg"].numpy() for s in loader}

    e0, e0_w2, e1 = run(0, 0), run(0, 2), run(1, 2)
    assert sorted(e0) == list(range(24))
    assert all(np.array_equal(e0[k], e0_w2[k]) for k in e0)
    assert sum(not np.array_equal(e0[k], e1[k]) for k in e0) >= 20
    spec = tarindex.ImageDecode(48, seed=2)  # the epoch the stream played: pure function
    raw = tarindex.TarDataset(src)
    for k in (0, 11, 23):
        assert np.array_equal(e1[k], spec.decode("jpg", raw[k]["jpg"], epoch=1, index=k))


def test_backend_choice_is_introspectable() -> None:
    import subprocess
    import sys

    code = "import tarindex.codecs; print(tarindex.codecs.image_backend())"
    env = {**os.environ, "TARINDEX_JPEG_BACKEND": "pil"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert out.stdout.strip() == "pil (TARINDEX_JPEG_BACKEND=pil)", out.stderr
    resize = "from tarindex.codecs.image import resize_backend; print(resize_backend())"
    out = subprocess.run([sys.executable, "-c", resize], env=env, capture_output=True, text=True)
    assert out.stdout.strip() == "tarindex", out.stderr
    env2 = {**env, "TARINDEX_RESIZE": "pil"}
    out = subprocess.run([sys.executable, "-c", resize], env=env2, capture_output=True, text=True)
    assert out.stdout.strip() == "pil", out.stderr
    env["TARINDEX_JPEG_BACKEND"] = "turbo"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert out.stdout.startswith("pil (TARINDEX_JPEG_BACKEND='turbo' is not one of")
    env["TARINDEX_JPEG_BACKEND"] = "simplejpeg"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    if HAVE_SJ:
        assert out.stdout.startswith("simplejpeg (simplejpeg "), out.stderr
    if HAVE_EXT:
        assert tarindex.codecs.image_backend().startswith("libjpeg (libjpeg-turbo ")
        env = {**os.environ, "TARINDEX_PURE_PYTHON": "1"}  # no compiled code: not the extension
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
        assert not out.stdout.startswith("libjpeg"), out.stdout


@pytest.mark.parametrize("backend", AVAILABLE)
def test_cmyk_and_gray_jpegs(backend: str) -> None:
    src = Image.open(io.BytesIO(photo_jpegs(1, (320, 240))[0]))
    spec = ImageDecode(64, crop=None, backend=backend)
    for mode in ("CMYK", "L"):
        buf = io.BytesIO()
        src.convert(mode).save(buf, "JPEG", quality=90)
        got = spec.decode("jpg", buf.getvalue())
        want = reference(spec, buf.getvalue(), 0, 0)
        assert got.shape == (3, 64, 64)
        diff = np.abs(got.astype(np.int16) - want.astype(np.int16))  # decoded at 1/2 here
        assert diff.mean() <= 2.5 and diff.max() <= 40
