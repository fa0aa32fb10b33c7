"""Hostile JPEGs against the image decode path (issue 21): every backend agrees with Pillow.

libjpeg-turbo only *warns* on a stream cut short (it fills the missing rows with grey) and
on a marker inside the entropy-coded data; the compiled region decoder stops reading at the
box's last row, and simplejpeg decodes with ``strict=False``. Pillow raises on both. These
tests hold every backend (compiled ``libjpeg``, ``simplejpeg``, ``pil``) and the compiled and
pure stream walks to Pillow's answer, and the datasets to a :class:`DecodeError` naming the
shard, the sample and the extension.
"""

from __future__ import annotations

import io
import random
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from PIL import Image, ImageFile

import tarindex
from tarindex.codecs import jpeg
from tarindex.codecs.compress import Refused
from tarindex.errors import DecodeError

from ..photos import photo_jpegs

pytest.importorskip("sklearn")

BACKENDS = jpeg.available_backends()


def _photo(**save: object) -> bytes:
    src = Image.open(io.BytesIO(photo_jpegs(1, (320, 240), seed=5)[0]))
    out = io.BytesIO()
    src.convert(str(save.pop("mode", "RGB"))).save(out, "JPEG", quality=90, **save)
    return out.getvalue()


def _pil_loads(data: bytes) -> bool:
    try:
        with Image.open(io.BytesIO(data)) as im:
            im.load()
        return True
    except (OSError, SyntaxError, ValueError):
        return False


def _ours_loads(data: bytes, backend: str) -> bool:
    try:
        jpeg.decode_region(data, 1, (0, 0, 8, 8), 1 << 25, backend)  # the top-left corner only
        return True
    except (Refused, OSError, ValueError):
        return False


def _corruptions(base: bytes, seed: int) -> Iterator[bytes]:
    """Cuts every 97 bytes, and 40 runs of random bytes in the scan data."""
    sos = base.index(b"\xff\xda")
    yield from (base[:c] for c in range(0, len(base), 97))
    rng = random.Random(seed)
    for _ in range(40):
        b = bytearray(base)
        at = rng.randrange(sos + 20, len(base) - 100)
        for i in range(at, at + rng.choice((1, 4, 50))):
            b[i] = rng.randrange(256)
        yield bytes(b)


@pytest.fixture(scope="module", params=["baseline", "progressive"])
def base(request: pytest.FixtureRequest) -> bytes:
    """A baseline JPEG, and a progressive one (10 scans: every scan must be read whole)."""
    return _photo(progressive=request.param == "progressive")


def _in_scan_data(data: bytes) -> int:
    """A byte in the middle of the longest scan's entropy-coded data."""
    best, at = 0, 0
    for sos in (i for i in range(len(data) - 1) if data[i : i + 2] == b"\xff\xda"):
        start = sos + 2 + (data[sos + 2] << 8 | data[sos + 3])
        end = start
        while not (data[end] == 0xFF and data[end + 1] not in (0x00, *range(0xD0, 0xD8))):
            end += 1
        if end - start > best:
            best, at = end - start, (start + end) // 2
    return at


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("where", ["mid-scan", "before-eoi", "first-scan-bytes"])
def test_a_cut_jpeg_is_refused_by_every_backend(base: bytes, backend: str, where: str) -> None:
    """Was: libjpeg and simplejpeg returned the box (grey below the cut), Pillow raised."""
    sos = base.index(b"\xff\xda")
    cut = {"mid-scan": len(base) // 2, "before-eoi": len(base) - 2, "first-scan-bytes": sos + 40}
    data = base[: cut[where]]
    assert not _pil_loads(data)
    with pytest.raises(Refused, match=rf"JPEG is cut: its {len(data)} bytes end before"):
        jpeg.decode_region(data, 1, (0, 0, 8, 8), 1 << 25, backend)
    with pytest.raises(Refused, match="JPEG is cut"):
        jpeg.decode_scaled(data, 8, 8, 1 << 25, backend)


def test_a_cut_jpeg_loads_when_pillow_is_told_to_load_truncated_images(base: bytes) -> None:
    data = base[: len(base) // 2]
    ImageFile.LOAD_TRUNCATED_IMAGES = True
    try:
        assert _pil_loads(data)
        for backend in BACKENDS:
            assert jpeg.decode_region(data, 1, (0, 0, 8, 8), 1 << 25, backend).shape == (8, 8, 3)
    finally:
        ImageFile.LOAD_TRUNCATED_IMAGES = False


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("marker", [0xC9, 0x02, 0xD8])
def test_a_marker_inside_the_scan_data_is_refused(base: bytes, backend: str, marker: int) -> None:
    """A SOF, an undefined marker or a second SOI in the entropy-coded data: Pillow raises."""
    at = _in_scan_data(base)
    data = base[:at] + bytes([0xFF, marker]) + base[at + 2 :]
    assert not _pil_loads(data)
    with pytest.raises(Refused, match=rf"corrupt JPEG: marker 0xFF{marker:02X} at byte {at}"):
        jpeg.decode_region(data, 1, (0, 0, 8, 8), 1 << 25, backend)


@pytest.mark.parametrize(
    "kind", ["baseline", "progressive", "gray", "444", "optimized", "restarts", "exif"]
)
def test_every_backend_and_both_walks_agree_with_pillow(kind: str) -> None:
    """Success or failure as Pillow's, on cuts and corruptions; the same pixels where it loads."""
    save: dict[str, object] = {
        "baseline": {},
        "progressive": {"progressive": True},
        "gray": {"mode": "L"},
        "444": {"subsampling": 0},
        "optimized": {"optimize": True},
        "restarts": {"restart_marker_blocks": 4},
        "exif": {"exif": _exif_with_thumbnail()},
    }[kind]  # type: ignore[assignment]
    base = _photo(**save)
    ext = getattr(jpeg, "_EXT", None)
    for n, data in enumerate(_corruptions(base, seed=len(kind))):
        fault = jpeg.stream_fault(data)
        if ext is not None:
            assert ext.stream_fault(data) == fault, n
        want = _pil_loads(data)
        got = {b: _ours_loads(data, b) for b in BACKENDS}
        if fault is not None and fault[0] == 3:  # Pillow zero-fills after such a segment
            want = False
        assert set(got.values()) == {want}, (n, len(data), fault, got)
        if want:
            boxes = [jpeg.decode_region(data, 1, (0, 0, 320, 240), 1 << 25, b) for b in BACKENDS]
            for b, arr in zip(BACKENDS[1:], boxes[1:], strict=True):
                np.testing.assert_array_equal(arr, boxes[0], err_msg=f"{n} {b}")


def _exif_with_thumbnail() -> bytes:
    """An EXIF block holding a JPEG thumbnail (its own SOI .. EOI before the main scan)."""
    thumb = io.BytesIO()
    Image.new("RGB", (16, 16), (200, 10, 10)).save(thumb, "JPEG")
    exif = Image.Exif()
    exif[0x0112] = 6  # orientation: not applied, as Pillow's decode does not apply it
    exif[0x010E] = "thumb " + "x" * 10
    out: bytes = exif.tobytes()
    return out + thumb.getvalue()


def _shards(tmp_path: Path, bad: bytes) -> str:
    good = photo_jpegs(2, (320, 240), seed=6)
    with tarindex.ShardWriter(str(tmp_path / "h-%06d.tar"), maxcount=10) as sink:
        sink.write({"__key__": "good0", "jpg": good[0], "cls": 0})
        sink.write({"__key__": "cut", "jpg": bad, "cls": 1})
        sink.write({"__key__": "good1", "jpg": good[1], "cls": 2})
    return str(tmp_path / "h-*.tar")


def test_a_cut_jpeg_in_a_dataset_is_a_decode_error_naming_it(tmp_path: Path, base: bytes) -> None:
    """ds[i], a CPU batch and a device batch: DecodeError naming shard, sample and extension."""
    pytest.importorskip("torch")
    from tarindex.torch.images import decode_on_device

    src = _shards(tmp_path, base[: len(base) // 2])
    named = r"h-000000\.tar: sample 'cut', extension 'jpg'.*JPEG is cut"
    one = tarindex.TarDataset(src, decode=tarindex.ImageDecode(64))
    assert one[0]["jpg"].shape == (3, 64, 64)
    with pytest.raises(DecodeError, match=named):
        one[1]
    cpu = tarindex.TarDataset(src, batched=True, decode=tarindex.ImageDecode(64))
    with pytest.raises(DecodeError, match=named):
        cpu.__getitems__([0, 1, 2])
    dev = tarindex.TarDataset(src, batched=True, decode=tarindex.ImageDecode(64, device="cuda"))
    with pytest.raises(DecodeError, match=named):  # refused in the worker, before it travels
        dev.__getitems__([0, 1, 2])
    batch = dev.__getitems__([0, 2])
    assert tuple(decode_on_device(batch, "cpu").shape) == (2, 3, 64, 64)


@pytest.mark.parametrize(
    ("kw", "match"),
    [
        ({"ratio": (1.0, float("inf"))}, r"ratio=.*expected finite"),  # was OverflowError at decode
        ({"scale": (0.5, float("nan"))}, r"scale=.*expected finite"),
        ({"size": 100_000}, r"height \* width <= 2\*\*25"),  # was MemoryError at decode
        ({"size": (1, 10**9)}, r"height \* width <= 2\*\*25"),
        ({"size": 0}, r"sides >= 1"),
        ({"size": -3}, r"sides >= 1"),
        ({"size": True}, "integer sides, not bool"),  # was a 1x1 output
        ({"size": 2.7}, "integer sides, not float"),  # was 2x2
        ({"size": (224, 22.5)}, "integer sides, not float"),
    ],
)
def test_odd_image_decode_arguments_are_refused_when_made(kw: dict[str, object], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        tarindex.ImageDecode(**kw)  # type: ignore[arg-type]


def test_extreme_but_valid_arguments_decode(base: bytes) -> None:
    kws: list[dict[str, object]] = [
        {"scale": (1e-300, 1e-300)},
        {"ratio": (1e-300, 1e300)},
        {"seed": 2**64 - 1},
        {"size": np.int64(32)},
    ]
    for kw in kws:
        spec = tarindex.ImageDecode(**{"size": 32, **kw})  # type: ignore[arg-type]
        assert spec.decode("jpg", base, index=3).shape == (3, 32, 32)


@pytest.mark.parametrize("backend", [b for b in BACKENDS if b != "libjpeg"])
def test_the_pure_region_decode_gives_the_scale_asked_or_refuses(backend: str) -> None:
    """Was: Pillow's draft (1x50 asked at 1/2: full size) and simplejpeg (5x5 at 1/4: 1/8)
    decoded at another scale and the region was sliced from it: wrong pixels, no error."""
    checked = 0
    for w, h in ((1, 50), (50, 1), (5, 5), (3, 3), (9, 17), (61, 37), (8, 8)):
        data = _photo_sized(w, h)
        for k in (2, 4, 8):
            sw, sh = -(-w // k), -(-h // k)
            try:
                got = jpeg.decode_region(data, k, (0, 0, sw, sh), 1 << 25, backend)
            except ValueError as e:
                assert min(w, h) < 8 * k and f"at 1/{k} is {sw}x{sh}" in str(e)
                continue
            assert got.shape == (sh, sw, 3)
            if "libjpeg" in BACKENDS:
                want = jpeg.decode_region(data, k, (0, 0, sw, sh), 1 << 25, "libjpeg")
                np.testing.assert_array_equal(got, want, err_msg=f"{w}x{h} at 1/{k}")
            checked += 1
    assert checked >= 8


def test_image_decode_of_tiny_images_is_the_same_on_every_backend() -> None:
    for w, h in ((1, 50), (50, 1), (5, 5), (1, 1), (12, 9)):
        data = _photo_sized(w, h)
        for size in (1, 2, (3, 1), 224):
            outs = [
                tarindex.ImageDecode(size, backend=b, resize="pil").decode("jpg", data, index=w * h)
                for b in BACKENDS
            ]
            for b, o in zip(BACKENDS, outs, strict=True):
                np.testing.assert_array_equal(o, outs[0], err_msg=f"{w}x{h} {size} {b}")


def _photo_sized(w: int, h: int) -> bytes:
    src = Image.open(io.BytesIO(photo_jpegs(1, (320, 240), seed=5)[0])).resize((w, h))
    out = io.BytesIO()
    src.save(out, "JPEG", quality=90)
    return out.getvalue()


def _sof(data: bytes, at: int, value: bytes) -> bytes:
    """``value`` at byte ``at`` of the frame header (SOF0 baseline, SOF2 progressive)."""
    p = min(i for i in (data.find(b"\xff\xc0"), data.find(b"\xff\xc2")) if i >= 0)
    return data[: p + at] + value + data[p + at + len(value) :]


@pytest.mark.parametrize(
    ("what", "at", "value", "libjpeg_says"),
    [
        ("12-bit", 4, b"\x0c", "Unsupported JPEG data precision 12"),
        ("zero height", 5, b"\x00\x00", "Empty JPEG image"),
        ("zero width", 7, b"\x00\x00", "Empty JPEG image"),
    ],
)
def test_a_jpeg_header_no_backend_reads_is_named_as_such(
    base: bytes, what: str, at: int, value: bytes, libjpeg_says: str
) -> None:
    """Was: 'not a JPEG image' for a JPEG with a 12-bit or zero-sized frame."""
    data = _sof(base, at, value)
    for backend in BACKENDS:
        with pytest.raises(Refused, match="not a JPEG image Pillow can open") as e:
            tarindex.ImageDecode(32, backend=backend).decode("jpg", data)
        if "libjpeg" in BACKENDS:
            assert libjpeg_says in str(e.value), what


def test_a_huge_frame_in_a_small_file_is_refused_before_any_pixel(base: bytes) -> None:
    """65535x65535 (and 6000x6000, within libjpeg's limit) in a 27 KB file: no allocation."""
    for w, h in ((65535, 65535), (6000, 6000), (65000, 1000)):
        data = _sof(_sof(base, 5, h.to_bytes(2, "big")), 7, w.to_bytes(2, "big"))
        for backend in BACKENDS:
            with pytest.raises(Exception, match=r"pixels|exceeds limit") as e:
                jpeg.decode_region(data, 1, (0, 0, 8, 8), 1 << 25, backend)
            assert not isinstance(e.value, MemoryError)


@pytest.mark.parametrize("batch_size", [1, 2, 4])
def test_streaming_batches_skip_a_bad_image_under_on_error_skip(
    tmp_path: Path, base: bytes, batch_size: int
) -> None:
    """Was: batched=True with ImageDecode raised the DecodeError despite on_error='skip'."""
    torch = pytest.importorskip("torch")
    good = photo_jpegs(2, (320, 240), seed=6)
    with tarindex.ShardWriter(str(tmp_path / "s-%06d.tar"), maxcount=10) as sink:
        sink.write({"__key__": "g0", "jpg": good[0], "cls": 0})
        sink.write({"__key__": "empty", "jpg": b"", "cls": 1})
        sink.write({"__key__": "cut", "jpg": base[: len(base) // 2], "cls": 2})
        sink.write({"__key__": "g1", "jpg": good[1], "cls": 3})
    ds = tarindex.TarIterableDataset(
        str(tmp_path / "s-*.tar"), batched=True, batch_size=batch_size,
        decode=tarindex.ImageDecode(32), on_error="skip", shuffle=False,
    )
    with pytest.warns(RuntimeWarning) as rec:
        batches = list(ds)
    msgs = [str(w.message) for w in rec if "skipped" in str(w.message)]
    assert len(msgs) == 2
    assert any("sample 'empty', extension 'jpg'" in m for m in msgs)
    assert any("sample 'cut', extension 'jpg'" in m and "JPEG is cut" in m for m in msgs)
    assert [k for b in batches for k in b.keys] == ["g0", "g1"]
    assert [c for b in batches for c in b.cls.tolist()] == [0, 3]
    one = tarindex.TarDataset(str(tmp_path / "s-*.tar"), decode=tarindex.ImageDecode(32))
    got = torch.cat([b.decode() for b in batches])
    assert torch.equal(got[0], torch.from_numpy(one[0]["jpg"]))
    assert torch.equal(got[1], torch.from_numpy(one[3]["jpg"]))
    strict = tarindex.TarIterableDataset(
        str(tmp_path / "s-*.tar"), batched=True, batch_size=batch_size,
        decode=tarindex.ImageDecode(32), shuffle=False,
    )
    with pytest.raises(DecodeError, match="sample 'empty'"):
        list(strict)
