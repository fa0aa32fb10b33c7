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

Before any backend decodes, the stream's markers are walked (:func:`stream_fault`): a JPEG
cut short (no end-of-image marker after its last scan) or with a marker that has no place
inside its entropy-coded data is refused, as Pillow refuses it ("image file is truncated",
"broken data stream"). libjpeg-turbo itself only warns there and fills the missing rows with
grey, and the region decoder never reads past the box, so without this walk the same bytes
decoded to made-up pixels on one backend and raised on another. With Pillow's
``ImageFile.LOAD_TRUNCATED_IMAGES = True`` a missing end is let through, as Pillow lets it.
"""

from __future__ import annotations

import io
import os
from typing import Any

import numpy as np
from numpy.typing import NDArray

from .._extensions import load_extension
from .compress import Refused

__all__ = [
    "BACKENDS",
    "available_backends",
    "backend_name",
    "check_stream",
    "decode_region",
    "decode_scaled",
    "image_backend",
    "jpeg_size",
    "stream_fault",
]

BACKENDS = ("libjpeg", "simplejpeg", "pil")
"""The JPEG backends, fastest first."""

_CMYK = (4, 5)  # libjpeg's JCS_CMYK, JCS_YCCK: Pillow converts those


def _extension() -> tuple[Any, str]:
    """The compiled region decoder (``tarindex.codecs._jpeg``) or ``None``, and why."""
    name = f"{__package__}._jpeg"
    ext, why = load_extension(name, f"{name} not built (needs libjpeg-turbo's headers)", form="{}")
    if ext is None:
        return None, why
    v = int(getattr(ext, "TURBO_VERSION", 0))
    return ext, f"libjpeg-turbo {v // 1000000}.{v // 1000 % 1000}.{v % 1000}"


def _choose() -> tuple[str, str, Any, Any]:
    """``(name, why, simplejpeg or None, extension or None)`` of the backend this process uses."""
    asked = os.environ.get("TARINDEX_JPEG_BACKEND", "").strip().lower()
    ext, ext_why = _extension()
    try:
        import simplejpeg  # type: ignore[import-untyped,unused-ignore]
    except ImportError:
        simplejpeg = None
    if asked and asked not in BACKENDS:
        return "pil", f"TARINDEX_JPEG_BACKEND={asked!r} is not one of {BACKENDS}", None, None
    if asked == "pil":
        return "pil", "TARINDEX_JPEG_BACKEND=pil", None, None
    if ext is not None and asked in ("", "libjpeg"):
        why = f"{ext_why}: region and DCT-scaled decode, GIL released"
        return "libjpeg", why, simplejpeg, ext
    if simplejpeg is None:
        return "pil", f"{ext_why}; simplejpeg is not installed (pip install simplejpeg)", None, None
    version = getattr(simplejpeg, "__version__", "?")
    why = f"simplejpeg {version} (libjpeg-turbo, GIL released)"
    if ext is None:
        why += f"; {ext_why}"
    return "simplejpeg", why, simplejpeg, None


_NAME, _WHY, _SJ, _EXT = _choose()


def available_backends() -> tuple[str, ...]:
    """The backends this process can use (:data:`BACKENDS` order): ``"pil"`` always."""
    return tuple(
        b for b in BACKENDS if (b != "libjpeg" or _EXT is not None) and (b != "simplejpeg" or _SJ is not None)
    )


def backend_name() -> str:
    """``"libjpeg"``, ``"simplejpeg"`` or ``"pil"``: the JPEG backend of this process."""
    return _NAME


def image_backend() -> str:
    """Which JPEG decoder runs, and why: e.g. ``"libjpeg (libjpeg-turbo 2.1.5: ...)"``.

    ``"libjpeg"``: tarindex's own region decoder (``tarindex/codecs/_jpeg.c``, built at install
    against libjpeg-turbo's headers, e.g. Debian's ``libjpeg62-turbo-dev``); else
    ``"simplejpeg (...)"`` (a wheel bundling libjpeg-turbo), else ``"pil (...)"``. All give
    the same pixels within the tolerance docs/DECODING.md states ("Decoding to the model's
    size").
    """
    return f"{_NAME} ({_WHY})"


def _pil_open(data: Any) -> Any:
    from PIL import Image, UnidentifiedImageError

    try:
        return Image.open(io.BytesIO(data), formats=["JPEG"])
    except UnidentifiedImageError as e:
        why = ""
        if bytes(data[:2]) == b"\xff\xd8" and _EXT is not None:
            try:  # a JPEG's start: say what libjpeg finds wrong (12-bit, zero width, ...)
                _EXT.header(data)
            except ValueError as lib:
                why = f": {lib}"
        raise Refused(
            f"not a JPEG image Pillow can open (starts {bytes(data[:12])!r}){why}; a member is "
            f"opened only as the format its extension names, never by content"
        ) from e


_SEGMENTS = frozenset([0xC4, 0xCC, 0xDA, 0xDB, 0xDC, 0xDD, 0xFE, *range(0xE0, 0xF0)])
"""Markers with a length that may stand between scans: DHT, DAC, SOS, DQT, DNL, DRI, COM, APPn."""


def stream_fault(data: Any) -> tuple[int, int, int] | None:
    """Walk a JPEG's markers: ``None`` when whole, else ``(kind, offset, marker)``.

    Kind 1: cut (no end-of-image marker ``0xFFD9`` after the first scan; ``offset`` is the
    length). Kind 2: ``marker`` (``0xFFxx``) at byte ``offset`` inside the entropy-coded data,
    where ITU-T T.81 B.1.1.5 allows only byte stuffing (``0xFF00``), restart markers and the
    segments between scans (an undefined marker below ``0xFFC0`` is let through in an image
    with restart markers: libjpeg, and so Pillow, discards it and resyncs). Kind 3: the
    segment of ``marker`` at ``offset`` runs past the end (random bytes in the scan data
    that happen to form one: Pillow then gives the rows after it as zeros, libjpeg-turbo as
    grey; refused here, either is made up). The header before the first scan is libjpeg's
    to check (:func:`jpeg_size`). The pure-Python twin of ``tarindex.codecs._jpeg.stream_fault``.
    """
    b = data if isinstance(data, bytes) else bytes(data)
    n, i, scan, restarts = len(b), 2, False, False
    if b[:2] != b"\xff\xd8":
        return None  # not a JPEG: the decoder says so
    while True:
        j = b.find(b"\xff", i)  # libjpeg skips bytes before a marker too
        if j < 0 or j + 1 >= n:
            return (1, n, 0)
        m = b[j + 1]
        if m == 0xFF or m == 0 or 0xD0 <= m <= 0xD7 or (not scan and m in (0x01, 0xD8)):
            i = j + 1 if m == 0xFF else j + 2  # fill, stuffing, restarts, TEM, SOI
            continue
        if m == 0xD9:
            return None if scan else (1, n, 0)
        if scan and m not in _SEGMENTS:
            if m < 0xC0 and restarts:  # libjpeg resyncs at the next restart marker
                i = j + 2
                continue
            return (2, j, 0xFF00 | m)
        if j + 4 > n:
            return (1, n, 0)
        if m == 0xDD and j + 6 <= n:
            restarts = (b[j + 4] << 8 | b[j + 5]) != 0
        i = j + 2 + (b[j + 2] << 8 | b[j + 3])
        if i > n:
            return (3, j, 0xFF00 | m)
        scan = scan or m == 0xDA


def check_stream(data: Any) -> None:
    """Refuse a JPEG :func:`stream_fault` finds cut or corrupt (the compiled walk if built).

    Run by :func:`decode_scaled` and :func:`decode_region` before any backend decodes, and by
    the batched device path in the workers before the bytes travel. Costs ~30 us on a
    200 KB JPEG (a memchr walk; the decode costs milliseconds).

    Raises:
        Refused: The stream is cut before its end-of-image marker (unless Pillow's
            ``ImageFile.LOAD_TRUNCATED_IMAGES`` is set), or has a marker inside its scan data.
    """
    fault = _EXT.stream_fault(data) if _EXT is not None else stream_fault(data)
    if fault is None:
        return
    kind, at, marker = fault
    if kind == 1:
        from PIL import ImageFile

        if ImageFile.LOAD_TRUNCATED_IMAGES:
            return
        raise Refused(
            f"JPEG is cut: its {at} bytes end before the end-of-image marker (0xFFD9) "
            f"(a truncated file; Pillow raises 'image file is truncated' too)"
        )
    if kind == 3:
        raise Refused(
            f"corrupt JPEG: the segment of marker 0x{marker:04X} at byte {at} runs past the "
            f"end of its {len(data)} bytes"
        )
    raise Refused(
        f"corrupt JPEG: marker 0x{marker:04X} at byte {at} inside the compressed scan data "
        f"(Pillow raises 'broken data stream' too)"
    )


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
    name = backend or _NAME
    if name == "libjpeg" and _EXT is not None:
        try:
            w, h, _ = _EXT.header(data)
            return int(w), int(h)
        except ValueError:
            pass  # let Pillow say what is wrong
    if name in ("simplejpeg", "libjpeg") and _SJ is not None:
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
        Refused: Not a JPEG, more than ``max_pixels`` pixels, or cut short or corrupt
            (:func:`stream_fault`).
        ValueError: ``backend`` unknown or not installed.
    """
    name = backend or _NAME
    if name not in BACKENDS:
        raise ValueError(f"backend={backend!r}: expected one of {BACKENDS}")
    check_stream(data)
    return _scaled(data, min_w, min_h, max_pixels, name)


def _scaled(data: Any, min_w: int, min_h: int, max_pixels: int, name: str) -> NDArray[np.uint8]:
    """:func:`decode_scaled` of a checked stream on backend ``name``."""
    if name == "pil":
        return _pil_scaled(data, min_w, min_h, max_pixels)
    if name == "libjpeg":
        got = _ext_header(data, max_pixels)
        if got is None:
            return _pil_scaled(data, min_w, min_h, max_pixels)
        w, h = got
        fits = (k for k in (8, 4, 2) if -(-w // k) >= min_w and -(-h // k) >= min_h)
        k = next(fits, 1)  # a minimum above the image's size: full size
        return _region(data, k, (0, 0, -(-w // k), -(-h // k)), max_pixels, name)
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


def _ext_header(data: Any, max_pixels: int) -> tuple[int, int] | None:
    """``(width, height)`` from the compiled header read, or ``None``: let Pillow decode it."""
    if _EXT is None:
        raise ValueError(f"backend='libjpeg': not available here ({_WHY})")
    try:
        w, h, cs = _EXT.header(data)
    except ValueError:
        return None  # Pillow refuses, or reads it
    _check_pixels(int(w), int(h), max_pixels)
    return None if cs in _CMYK else (int(w), int(h))


def decode_region(
    data: Any,
    k: int,
    region: tuple[int, int, int, int],
    max_pixels: int,
    backend: str | None = None,
) -> NDArray[np.uint8]:
    """Decode the ``region`` of a JPEG scaled by ``1/k``: ``uint8 (y1 - y0, x1 - x0, 3)`` RGB.

    The image at ``1/k`` is ``ceil(width / k) x ceil(height / k)`` pixels (the DCT scale);
    ``region = (x0, y0, x1, y1)`` is a box of it, ``0 <= x0 < x1 <= ceil(width / k)``, likewise
    ``y``. The ``"libjpeg"`` backend decodes only that box (``tarindex/codecs/_jpeg.c``:
    rows below it are not read, rows above it and columns beside it are not transformed; the
    GIL released); its twin, every other backend, decodes the whole image at ``1/k`` and
    slices the box. Both give the same pixels (tests/codecs/test_image_decode.py).

    Args:
        data: The JPEG's bytes (any bytes-like object).
        k: The DCT scale's denominator: 1, 2, 4 or 8.
        region: ``(x0, y0, x1, y1)`` in pixels of the scaled image.
        max_pixels: Largest image accepted (``width * height`` from the header).
        backend: Defaults to this process's (:func:`image_backend`).

    Returns:
        A view (rows may be strided) of the decoded pixels.

    Raises:
        Refused: Not a JPEG, more than ``max_pixels`` pixels, or cut short or corrupt
            (:func:`stream_fault`).
        ValueError: ``k`` not a power of two up to 8, or a region outside the scaled image.
    """
    if k not in (1, 2, 4, 8):
        raise ValueError(f"k={k!r}: expected 1, 2, 4 or 8")
    name = backend or _NAME
    if name not in BACKENDS:
        raise ValueError(f"backend={backend!r}: expected one of {BACKENDS}")
    check_stream(data)
    return _region(data, k, region, max_pixels, name)


def _region(
    data: Any, k: int, region: tuple[int, int, int, int], max_pixels: int, name: str
) -> NDArray[np.uint8]:
    """:func:`decode_region` of a checked stream on backend ``name``."""
    x0, y0, x1, y1 = (int(v) for v in region)
    got = _ext_header(data, max_pixels) if name == "libjpeg" else None
    if got is not None:
        w, h = got
        if not (0 <= x0 < x1 <= -(-w // k) and 0 <= y0 < y1 <= -(-h // k)):
            raise ValueError(
                f"region={region!r}: outside the {-(-w // k)}x{-(-h // k)} image at 1/{k}"
            )
        # a pixel more on each side (libjpeg-turbo widens that to the iMCU holding it): an
        # edge column's chroma is upsampled from its neighbour, which a crop ending there
        # would not decode (the output then differed from a whole decode by up to 16 of 255
        # in the box's first or last column)
        xs, xe = max(x0 - 1, 0), min(x1 + 1, -(-w // k))
        out = np.empty((y1 - y0) * (xe - xs + 64) * 3, np.uint8)
        try:
            xoff, cw = _EXT.decode(data, k, xs, y0, xe, y1, out)
        except ValueError:
            pass  # a stream libjpeg refuses: Pillow reads it or says why
        else:
            rows = out[: (y1 - y0) * cw * 3].reshape(y1 - y0, cw, 3)
            return rows[:, x0 - xoff : x1 - xoff]
        name = "pil"
    if name == "libjpeg":
        name = "simplejpeg" if _SJ is not None else "pil"
    w, h = jpeg_size(data, name)
    sw, sh = -(-w // k), -(-h // k)
    # simplejpeg picks the smallest n/8 giving at least the size asked: ask the exact 1/k
    # size (below 8 pixels a side, another n/8 gives it too). Pillow's draft takes the scale
    # min(w // asked_w, h // asked_h): ask w // k.
    sj = name == "simplejpeg" and min(w, h) >= 8
    whole = _scaled(data, sw, sh, max_pixels, name) if sj else None
    if whole is None or whole.shape[:2] != (sh, sw):
        whole = _scaled(data, w // k, h // k, max_pixels, "pil")
    if whole.shape[:2] != (sh, sw):  # was: a region sliced from another scale, silently
        raise ValueError(
            f"a {w}x{h} JPEG at 1/{k} is {sw}x{sh}; this backend decoded {whole.shape[1]}x"
            f"{whole.shape[0]} (a side under 8 pixels: decode at k=1)"
        )
    if not (0 <= x0 < x1 <= whole.shape[1] and 0 <= y0 < y1 <= whole.shape[0]):
        raise ValueError(
            f"region={region!r}: outside the {whole.shape[1]}x{whole.shape[0]} image at 1/{k}"
        )
    return whole[y0:y1, x0:x1]
