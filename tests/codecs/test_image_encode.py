"""Shrink at write time: ``max_side=`` (and quality) in the writer's image encoder, and ``pack``."""

from __future__ import annotations

import io
import pickle
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

import tarindex
from tarindex.cli.main import main
from tarindex.codecs import ImageEncoder, encode_value, shrink_image

from ..photos import photo_jpegs

pytest.importorskip("sklearn")


def _size(data: bytes) -> tuple[int, int]:
    with Image.open(io.BytesIO(data)) as im:
        return im.size


def test_max_side_scales_arrays_and_images_down_keeping_aspect() -> None:
    rng = np.random.default_rng(0)
    arr = rng.integers(0, 256, (600, 1000, 3), dtype=np.uint8)
    assert _size(encode_value("jpg", arr, max_side=256)) == (256, 154)
    assert _size(encode_value("png", arr[:, :500], max_side=300)) == (250, 300)  # 600 tall
    assert _size(encode_value("png", arr[:100, :120], max_side=300)) == (120, 100)  # kept
    img = Image.fromarray(arr)
    assert _size(encode_value("webp", img, max_side=64, quality=80)) == (64, 38)
    assert img.size == (1000, 600)  # the caller's image is not changed
    assert shrink_image(img, None) is img and shrink_image(img, 1000) is img
    with pytest.raises(ValueError, match="max_side"):
        encode_value("jpg", arr, max_side=0)


def test_max_side_reencodes_only_larger_image_bytes() -> None:
    big, small = photo_jpegs(1, (1024, 768))[0], photo_jpegs(1, (320, 240))[0]
    out = encode_value("jpg", big, max_side=512, quality=90)
    assert _size(out) == (512, 384) and len(out) < len(big) / 2
    # content kept: against the source scaled the usual way
    ref = np.asarray(
        Image.open(io.BytesIO(big)).convert("RGB").resize((512, 384), Image.Resampling.LANCZOS)
    )
    got = np.asarray(Image.open(io.BytesIO(out)).convert("RGB"))
    assert np.abs(got.astype(int) - ref.astype(int)).mean() < 3.0
    assert encode_value("jpg", small, max_side=512) == small  # byte for byte
    assert encode_value("jpg", big) == big  # no max_side: as they are
    lower = encode_value("jpg", big, max_side=512, quality=50)
    assert len(lower) < len(out)
    png = io.BytesIO()
    Image.open(io.BytesIO(big)).save(png, "PNG")
    assert _size(encode_value("png", png.getvalue(), max_side=100)) == (100, 75)
    with pytest.raises(TypeError, match="not a JPEG"):
        encode_value("jpg", png.getvalue(), max_side=100)
    assert encode_value("bin", png.getvalue(), max_side=100) == png.getvalue()  # not an image ext


def test_image_encoder_in_writers(tmp_path: Path) -> None:
    enc = ImageEncoder(quality=85, max_side=200)
    assert pickle.loads(pickle.dumps(enc)).max_side == 200
    with pytest.raises(ValueError, match="quality"):
        ImageEncoder(quality=0)
    jpegs = photo_jpegs(6, (500, 375))
    with tarindex.ShardWriter(str(tmp_path / "a-%06d.tar"), maxcount=4, encoder=enc) as sink:
        for i, data in enumerate(jpegs):
            sink.write({"__key__": f"{i:03d}", "jpg": data, "cls": i})
    samples = [{"__key__": f"{i:03d}", "jpg": d, "cls": i} for i, d in enumerate(jpegs)]
    tarindex.write_shards(samples, str(tmp_path / "b-%06d.tar"), jobs=2, maxcount=4, encoder=enc)
    for pattern in ("a-*.tar", "b-*.tar"):
        ds = tarindex.TarDataset(str(tmp_path / pattern), decode="rgb8")
        assert [ds[i]["jpg"].shape for i in range(6)] == [(150, 200, 3)] * 6
        assert [ds[i]["cls"] for i in range(6)] == list(range(6))


def test_pack_max_side(tmp_path: Path) -> None:
    src = tmp_path / "src"
    for c, name in enumerate(("cat", "dog")):
        (src / name).mkdir(parents=True)
        for i, data in enumerate(photo_jpegs(3, (1024, 768), seed=c)):
            (src / name / f"{i}.jpg").write_bytes(data)
    out = str(tmp_path / "out" / "s-%06d.tar")
    assert main(["pack", str(src), out, "--max-side", "256", "--quality", "90", "-q"]) == 0
    ds = tarindex.TarDataset(str(tmp_path / "out" / "s-*.tar"))
    assert len(ds) == 6 and all(_size(ds[i]["jpg"]) == (256, 192) for i in range(6))
    assert main(["pack", str(src), str(tmp_path / "o2" / "s-%06d.tar"), "-q"]) == 0
    ds2 = tarindex.TarDataset(str(tmp_path / "o2" / "s-*.tar"))
    assert all(_size(ds2[i]["jpg"]) == (1024, 768) for i in range(6))  # as they are
    bad = str(tmp_path / "o3" / "s-%06d.tar")
    assert main(["pack", str(src), bad, "--max-side", "256", "--quality", "101", "-q"]) == 2
