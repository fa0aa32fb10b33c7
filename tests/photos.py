"""Real photographs as ImageNet-like JPEGs, for the image tests and benchmarks/bench_images.py.

The sources are the photos that ship in packages: scikit-learn's sample images (``china.jpg``
and ``flower.jpg``, 640x427) and, when Pillow's test suite is installed beside it, its
``Tests/images/*.jpg`` of at least 256x256 pixels. Each JPEG made is a seeded crop of one
source (40..100 % of each side, any position), scaled to the asked size with Lanczos and
saved at the asked quality: distinct images with real photographic content (edges, texture,
smooth areas), as a dataset of photos has.
"""

from __future__ import annotations

import glob
import io
import os
from functools import lru_cache

import numpy as np
from numpy.typing import NDArray
from PIL import Image

__all__ = ["photo_jpegs", "source_photos"]


@lru_cache(maxsize=1)
def source_photos() -> tuple[NDArray[np.uint8], ...]:
    """The source photos, ``uint8 (H, W, 3)`` each (needs scikit-learn)."""
    from sklearn.datasets import load_sample_images  # type: ignore[import-untyped,unused-ignore]

    out = [np.asarray(im, dtype=np.uint8) for im in load_sample_images().images]
    import PIL

    tests = os.path.join(os.path.dirname(os.path.dirname(PIL.__file__)), "Tests", "images")
    for path in sorted(glob.glob(os.path.join(tests, "*.jpg"))):
        try:
            with Image.open(path) as im:
                if min(im.size) >= 256 and im.mode in ("RGB", "L"):
                    out.append(np.asarray(im.convert("RGB")))
        except OSError:
            continue
    return tuple(out)


def photo_jpegs(
    n: int,
    size: tuple[int, int] = (500, 375),
    quality: int = 90,
    seed: int = 0,
    progressive: bool = False,
) -> list[bytes]:
    """``n`` distinct JPEGs of ``size`` (width, height), cut from the source photos.

    Args:
        n: How many.
        size: ``(width, height)`` of each. Defaults to ``(500, 375)``.
        quality: JPEG quality. Defaults to ``90``.
        seed: Seed of the crops. Defaults to ``0``.
        progressive: Progressive JPEGs (libjpeg's ``jpeg_simple_progression``, through
            Pillow's ``progressive=True``: 10 scans, spectral selection and successive
            approximation, what cameras' "progressive" and most web images hold) instead
            of baseline ones; the same pixels before the encoding. Defaults to ``False``.
    """
    photos = source_photos()
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        src = photos[i % len(photos)]
        h, w = src.shape[:2]
        aspect = size[0] / size[1]
        cw = int(w * rng.uniform(0.4, 1.0))
        ch = min(h, int(round(cw / aspect)))
        cw = int(round(ch * aspect))
        x = int(rng.integers(0, w - cw + 1))
        y = int(rng.integers(0, h - ch + 1))
        im = Image.fromarray(src[y : y + ch, x : x + cw]).resize(size, Image.Resampling.LANCZOS)
        buf = io.BytesIO()
        im.save(buf, "JPEG", quality=quality, progressive=progressive)
        out.append(buf.getvalue())
    return out
