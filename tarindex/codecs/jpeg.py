"""JPEG decoding at a DCT scale: libjpeg-turbo through simplejpeg when installed, else Pillow.

A JPEG can be decoded at a fraction of its size in the DCT domain, for much less work than a
full decode plus a resize: libjpeg-turbo offers ``n/8`` for ``n = 1 .. 8`` (simplejpeg picks the
smallest ``n`` whose output is at least ``min_width x min_height``), Pillow's ``Image.draft``
the scales ``1/1, 1/2, 1/4, 1/8`` (the smallest whose output is at least the size asked).
:func:`decode_scaled` returns the decoded ``uint8 (h, w, 3)`` RGB array; the scale actually
used is ``w / width`` (``ceil(width * n / 8)`` pixels wide).

Which one runs is decided once at import (:func:`image_backend` says which and why):
``simplejpeg`` (``pip install simplejpeg``, or this package's ``images`` extra: a wheel that
bundles libjpeg-turbo, which decodes with the GIL released), unless the environment sets
``TARINDEX_JPEG_BACKEND=pil``; else ``pil``. Both are opened only as JPEG (bytes that are not
a baseline or progressive JPEG are refused), and refuse an image over ``max_pixels`` from its
header, before its pixels are decoded. A JPEG that libjpeg-turbo cannot give as RGB (CMYK,
YCCK) goes through Pillow, which can.
"""

from __future__ import annotations

import io
import os
from typing import Any

import numpy as np
from numpy.typing import NDArray

from .compress import Refused

__all__ = ["BACKENDS", "backend_name", "decode_scaled", "image_backend", "jpeg_size"]

BACKENDS = ("simplejpeg", "pil")
"""The JPEG backends, fastest first."""


def _choose() -> tuple[str, str, Any]:
    """``(name, why, module or None)`` of the backend this process uses."""
    asked = os.environ.get("TARINDEX_JPEG_BACKEND", "").strip().lower()
    if asked and asked not in BACKENDS:
        return "pil", f"TARINDEX_JPEG_BACKEND={asked!r} is not one of {BACKENDS}", None
    if asked == "pil":
        return "pil", "TARINDEX_JPEG_BACKEND=pil", None
    try:
        import simplejpeg  # type: ignore[import-untyped,unused-ignore]
    except ImportError:
        return "pil", "simplejpeg is not installed (pip install simplejpeg)", None
    version = getattr(simplejpeg, "__version__", "?")
    return "simplejpeg", f"simplejpeg {version} (libjpeg-turbo, GIL released)", simplejpeg


_NAME, _WHY, _SJ = _choose()


def backend_name() -> str:
    """``"simplejpeg"`` or ``"pil"``: the JPEG backend of this process."""
    return _NAME


def image_backend() -> str:
    """Which JPEG decoder runs, and why: e.g. ``"simplejpeg (simplejpeg 1.9.0 ...)"``.

    ``"pil (simplejpeg is not installed ...)"`` when Pillow decodes. Both give the same pixels
    within the tolerance docs/DECODING.md states ("Decoding to the model's size").
    """
    return f"{_NAME} ({_WHY})"


def _pil_open(data: Any) -> Any:
    from PIL import Image, UnidentifiedImageError

    try:
        return Image.open(io.BytesIO(data), formats=["JPEG"])
    except UnidentifiedImageError as e:
        raise Refused(
            f"not a JPEG image (starts {bytes(data[:12])!r}); a member is opened only as the "
            f"format its extension names, never by content"
        ) from e


def _check_pixels(w: int, h: int, max_pixels: int) -> None:
    if w * h > max_pixels:
        raise Refused(
            f"image is {w}x{h} = {w * h} pixels, more than max_image_pixels = {max_pixels} "
            f"(tarindex.codecs.decode.MAX_IMAGE_PIXELS); if such images are real, decode with "
            f"tarindex.codecs.ExtDecoder(spec, max_image_pixels=N)"
        )


def jpeg_size(data: Any, backend: str | None = None) -> tuple[int, int]:
    """``(width, height)`` of a JPEG from its header, without decoding any pixel.

    Raises:
        Refused: ``data`` is not a JPEG.
    """
    if (backend or _NAME) == "simplejpeg" and _SJ is not None:
        try:
            h, w, _, _ = _SJ.decode_jpeg_header(data)
            return int(w), int(h)
        except ValueError:
            pass  # let Pillow say what is wrong (or read what libjpeg-turbo will not)
    img = _pil_open(data)
    w, h = img.size
    img.close()
    return int(w), int(h)


def _pil_scaled(data: Any, min_w: int, min_h: int, max_pixels: int) -> NDArray[np.uint8]:
    img = _pil_open(data)
    w, h = img.size
    _check_pixels(w, h, max_pixels)
    img.draft("RGB", (max(1, min_w), max(1, min_h)))
    if img.mode != "RGB":
        img = img.convert("RGB")
    return np.asarray(img)


def decode_scaled(
    data: Any, min_w: int, min_h: int, max_pixels: int, backend: str | None = None
) -> NDArray[np.uint8]:
    """Decode a JPEG at the smallest DCT scale whose output is at least ``min_w x min_h``.

    Args:
        data: The JPEG's bytes (any bytes-like object).
        min_w: Smallest output width in pixels (``<= 0``: any; above the image's width:
            full size).
        min_h: Smallest output height in pixels, likewise.
        max_pixels: Largest image accepted (``width * height`` from the header).
        backend: ``"simplejpeg"`` or ``"pil"``. Defaults to this process's
            (:func:`image_backend`).

    Returns:
        ``uint8`` array ``(h, w, 3)``, RGB, C-contiguous (read-only when Pillow made it).

    Raises:
        Refused: Not a JPEG, or more than ``max_pixels`` pixels.
        ValueError: ``backend`` unknown or not installed.
    """
    name = backend or _NAME
    if name not in BACKENDS:
        raise ValueError(f"backend={backend!r}: expected one of {BACKENDS}")
    if name == "pil":
        return _pil_scaled(data, min_w, min_h, max_pixels)
    if _SJ is None:
        raise ValueError(f"backend='simplejpeg': not available here ({_WHY})")
    try:
        h, w, colorspace, _ = _SJ.decode_jpeg_header(data)
    except ValueError:
        return _pil_scaled(data, min_w, min_h, max_pixels)  # Pillow refuses, or reads it
    _check_pixels(int(w), int(h), max_pixels)
    if colorspace not in ("Gray", "YCbCr", "RGB"):  # CMYK, YCCK: Pillow converts those
        return _pil_scaled(data, min_w, min_h, max_pixels)
    try:
        out: NDArray[np.uint8] = _SJ.decode_jpeg(
            data,
            "RGB",
            min_height=min(int(min_h), int(h)),
            min_width=min(int(min_w), int(w)),
            strict=False,
        )
    except ValueError:
        return _pil_scaled(data, min_w, min_h, max_pixels)
    return out
