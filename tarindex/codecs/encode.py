"""Encode sample values to member bytes by extension: the writer's side of :mod:`tarindex.codecs`.

The encoder is chosen by the *last* dot-component of the extension (``"seg.png"`` -> ``png``),
from the one extension table (:mod:`tarindex.codecs.exts`), symmetric with the decoders of
:mod:`tarindex.codecs.decode` and with webdataset's writer
(``webdataset/writer.py``, ``make_handlers``), so ``decode(encode(x))`` gives ``x`` back:

=====================================  ====================================================
extension (last component)             value -> bytes
=====================================  ====================================================
any                                    ``bytes``/``bytearray``/``memoryview``: as they are
``pyd`` ``pickle`` ``pkl``             anything else: ``pickle.dumps`` (reading it back is
                                       opt-in: ``allow_pickle=True``)
``pth``                                anything else: ``torch.save`` (needs torch)
``msgpack`` ``mp`` ``msg``             anything else: ``msgpack.packb`` (needs msgpack)
``cbor``                               anything else: ``cbor2.dumps`` (needs cbor2)
``json`` ``jsn``                       ``dict``/``list``/``tuple``/numbers/``bool``/``None``:
                                       ``json.dumps`` (UTF-8, ``ensure_ascii=False``)
``npy``                                a numpy array or scalar: ``np.save`` (no pickle)
``npz``                                a ``dict`` of arrays: ``np.savez_compressed``
``ten`` ``tb``                         a numpy array or a list of them: webdataset's tenbin
                                       (:mod:`tarindex.codecs.tenbin`)
image extensions (:data:`IMAGE_FORMATS`)  a PIL image, or a ``uint8`` array ``(H, W)``,
                                       ``(H, W, 1|3|4)`` (float arrays in ``[0, 1]`` are
                                       scaled to ``uint8`` as webdataset does), saved by
                                       Pillow in the format the extension names
any other                              ``str``: UTF-8; ``int``: decimal text (``cls``)
=====================================  ====================================================

A trailing ``.zst`` (``"json.zst"``) zstd-compresses the encoded bytes of the inner extension
(:func:`tarindex.codecs.zstd_compress`); :class:`tarindex.ShardWriter` does that itself,
with the shard's trained dictionary when it has one (docs/FORMAT.md §7). A trailing ``.gz``
(``"json.gz"``) gzips them (:func:`tarindex.codecs.gzip_compress`, one member, mtime 0: the
same bytes every run), as webdataset's writer does; readers decompress both
(:data:`tarindex.codecs.COMPRESSION_SUFFIXES`, one table for both sides,
:mod:`tarindex.codecs.exts`; :mod:`tarindex.codecs.compress` holds both directions).
"""

from __future__ import annotations

import io
import json
import pickle
from typing import Any

import numpy as np

from .compress import COMPRESSORS
from .exts import (
    IMAGE_FORMATS,
    JSON_EXTS,
    MSGPACK_WRITE_EXTS,
    NPY_EXTS,
    NPZ_EXTS,
    PICKLE_EXTS,
    SERIALIZER_EXTS,
    TENBIN_EXTS,
    TORCH_EXTS,
    last_ext,
)

__all__ = ["JPEG_QUALITY", "ImageEncoder", "encode_value", "image_from_array", "shrink_image"]

JPEG_QUALITY = 95
"""Default JPEG/WebP quality (Pillow's 1-100 scale). webdataset's writer uses 100 for JPEG;
Pillow's own default is 75. Pass ``encode_value(..., quality=N)`` (e.g. through
``functools.partial`` as a writer's ``encoder``) for another."""


def _need(package: str, ext: str, pip: str | None = None) -> Any:
    """Import ``package`` for extension ``ext``, or say which package to install."""
    import importlib

    try:
        return importlib.import_module(package)
    except ImportError as e:
        raise ModuleNotFoundError(
            f"extension {ext!r} is encoded with the {package!r} package, which is not "
            f"installed: pip install {pip or package}",
            name=package,
        ) from e


def image_from_array(ext: str, value: np.ndarray[Any, Any]) -> Any:
    """A ``PIL.Image`` from a ``uint8`` array ``(H, W)`` or ``(H, W, C)``, ``C`` in 1, 3, 4.

    ``float32``/``float64`` arrays with values in ``[0, 1]`` are scaled by 255 and truncated
    to ``uint8``, as webdataset's ``imageencoder`` does.

    Raises:
        TypeError: Another dtype or shape, or floats outside ``[0, 1]`` (the message names
            ``ext`` and what was given).
    """
    from PIL import Image

    a = value
    if a.dtype in (np.float32, np.float64):
        if a.size and (float(np.amin(a)) <= -0.001 or float(np.amax(a)) >= 1.001):
            raise TypeError(
                f"extension {ext!r}: float image values must lie in [0, 1], got "
                f"[{float(np.amin(a))}, {float(np.amax(a))}]; pass uint8 pixels instead"
            )
        a = (np.clip(a, 0.0, 1.0) * 255.0).astype(np.uint8)
    if a.dtype != np.uint8:
        raise TypeError(
            f"extension {ext!r}: image arrays must be uint8 (or float in [0, 1]), got "
            f"{a.dtype}; convert with arr.astype(np.uint8) after scaling to 0..255"
        )
    if a.ndim == 3 and a.shape[2] == 1:
        a = a[:, :, 0]
    if not (a.ndim == 2 or (a.ndim == 3 and a.shape[2] in (3, 4))):
        raise TypeError(
            f"extension {ext!r}: image arrays are (H, W) or (H, W, C) with C in 1, 3, 4, got "
            f"shape {a.shape}; a CHW tensor becomes HWC with .permute(1, 2, 0)"
        )
    mode = "L" if a.ndim == 2 else ("RGB" if a.shape[2] == 3 else "RGBA")
    return Image.fromarray(np.ascontiguousarray(a), mode)


def _check_side(max_side: int | None) -> int | None:
    if max_side is None:
        return None
    if isinstance(max_side, bool) or not isinstance(max_side, (int, np.integer)) or max_side < 1:
        raise ValueError(f"max_side={max_side!r}: expected None or an integer >= 1")
    return int(max_side)


def shrink_image(img: Any, max_side: int | None, *, own: bool = False) -> Any:
    """``img`` (a ``PIL.Image``) scaled down so that its longer side is ``max_side``, else as is.

    The aspect ratio is kept (each side rounded, at least 1 pixel), resized with Pillow's
    Lanczos filter and ``reducing_gap=2.0`` (a box reduction first, to at least twice the
    target), as FFCV's ``max_resolution``. With ``own`` (an image opened from bytes that
    nobody else holds) it is ``Image.thumbnail`` in place, which also decodes a JPEG at a DCT
    scale of at least twice the target. An image whose sides are both ``<= max_side`` is
    returned unchanged.

    Raises:
        ValueError: ``max_side`` not ``None`` or an integer ``>= 1``.
    """
    from PIL import Image

    side = _check_side(max_side)
    w, h = img.size
    if side is None or max(w, h) <= side:
        return img
    r = side / max(w, h)
    size = (max(1, round(w * r)), max(1, round(h * r)))
    if own:
        img.thumbnail(size, Image.Resampling.LANCZOS, reducing_gap=2.0)
        return img
    return img.resize(size, Image.Resampling.LANCZOS, reducing_gap=2.0)


def _open_stored(ext: str, last: str, data: bytes) -> Any:
    """Encoded image bytes opened as the format ``last`` names (for ``max_side``)."""
    from PIL import Image, UnidentifiedImageError

    try:
        return Image.open(io.BytesIO(data), formats=[IMAGE_FORMATS[last]])
    except UnidentifiedImageError as e:
        raise TypeError(
            f"extension {ext!r}: max_side= re-encodes a larger image, and these bytes are not "
            f"a {IMAGE_FORMATS[last]} image (starts {data[:12]!r})"
        ) from e


def _encode_image(
    ext: str, last: str, value: Any, quality: int, max_side: int | None = None
) -> bytes | None:
    from PIL import Image

    if isinstance(value, np.ndarray):
        img = image_from_array(ext, value)
    elif isinstance(value, Image.Image):
        img = value
    else:
        return None
    img = shrink_image(img, max_side)
    fmt = IMAGE_FORMATS[last]
    opts: dict[str, Any] = {}
    if fmt in ("JPEG", "WEBP"):
        opts["quality"] = quality
        if img.mode not in ("RGB", "L", "CMYK") and fmt == "JPEG":
            raise TypeError(
                f"extension {ext!r}: JPEG cannot store a {img.mode} image; convert it first "
                f"(img.convert('RGB')) or use png/webp"
            )
    elif fmt == "PPM" and img.mode not in ("1", "L", "RGB", "I"):
        raise TypeError(
            f"extension {ext!r}: PPM/PGM cannot store a {img.mode} image; convert it first "
            f"(img.convert('RGB') or 'L') or use png"
        )
    buf = io.BytesIO()
    try:
        img.save(buf, format=fmt, **opts)
    except OSError as e:  # "cannot write mode RGBA as JPEG" and the like
        raise TypeError(f"extension {ext!r}: Pillow cannot save this image as {fmt}: {e}") from e
    return buf.getvalue()


def _encode_npy(ext: str, value: Any) -> bytes:
    a = np.asarray(value)
    if a.dtype.hasobject:
        raise TypeError(
            f"extension {ext!r}: object arrays need pickle (readers load .npy without it); "
            f"convert the array, or store it under 'pyd'"
        )
    buf = io.BytesIO()
    np.save(buf, a, allow_pickle=False)
    return buf.getvalue()


def _encode_npz(ext: str, value: Any) -> bytes:
    if not isinstance(value, dict) or not all(isinstance(k, str) for k in value):
        raise TypeError(
            f"extension {ext!r}: .npz takes a dict of str -> numpy array, got a "
            f"{type(value).__name__}"
        )
    arrays = {k: np.asarray(v) for k, v in value.items()}
    for k, a in arrays.items():
        if a.dtype.hasobject:
            raise TypeError(f"extension {ext!r}: entry {k!r} is an object array (needs pickle)")
    buf = io.BytesIO()
    savez: Any = np.savez_compressed  # numpy's stubs type **kwds against allow_pickle: bool
    savez(buf, **arrays)
    return buf.getvalue()


def _serialize(ext: str, last: str, value: Any) -> bytes:
    if last in PICKLE_EXTS:
        return pickle.dumps(value)
    if last in TORCH_EXTS:
        torch = _need("torch", ext)
        buf = io.BytesIO()
        torch.save(value, buf)
        return buf.getvalue()
    if last in MSGPACK_WRITE_EXTS:
        out: bytes = _need("msgpack", ext).packb(value, use_bin_type=True)
        return out
    cbor: bytes = _need("cbor2", ext).dumps(value)
    return cbor


def encode_value(
    ext: str, value: Any, *, quality: int = JPEG_QUALITY, max_side: int | None = None
) -> bytes:
    """Encode one sample value for extension ``ext`` (writer side); see the module table.

    Args:
        ext: The member's extension (``"png"``, ``"input.pyd"``, ``"json.zst"``, ``"json.gz"``
            ...).
        value: The value.
        quality: JPEG/WebP quality, 1-100. Defaults to :data:`JPEG_QUALITY` (95).
        max_side: Images (of an image extension) whose longer side is above this many
            pixels are scaled down to it first (:func:`shrink_image`), as FFCV's
            ``max_resolution``: a dataset stored at training resolution. Image *bytes* then
            are opened as the format the extension names and, only when larger, re-encoded
            at ``quality``; smaller ones stay byte for byte. Defaults to ``None`` (sizes kept).

    Returns:
        The member's bytes.

    Raises:
        TypeError: ``value`` has no encoding for ``ext`` (the message names both and what to
            pass), e.g. a ``bool`` outside json/serializer extensions (ambiguous), an object
            array for ``npy``, a CHW or ``int64`` array for an image extension.
        ModuleNotFoundError: ``pth``, ``msgpack`` or ``cbor`` without torch, msgpack or cbor2
            installed (the message names the package to install).
        ValueError: ``max_side`` not ``None`` or an integer ``>= 1``.
    """
    for sfx, compress in COMPRESSORS.items():
        if ext.endswith(sfx) and len(ext) > len(sfx):
            inner = encode_value(ext[: -len(sfx)], value, quality=quality, max_side=max_side)
            return compress(inner)
    last = last_ext(ext)
    if isinstance(value, (bytes, bytearray, memoryview)):
        if max_side is None or last not in IMAGE_FORMATS:
            return bytes(value)
        side = _check_side(max_side)
        img = _open_stored(ext, last, bytes(value))
        if side is None or max(img.size) <= side:
            return bytes(value)
        img = shrink_image(img, side, own=True)
        return _encode_image(ext, last, img, quality) or bytes(value)
    if last in SERIALIZER_EXTS:
        return _serialize(ext, last, value)
    if last in JSON_EXTS and not isinstance(value, str):
        if isinstance(value, (dict, list, tuple, int, float, bool, type(None))):
            return json.dumps(value, ensure_ascii=False).encode("utf-8")
        if isinstance(value, np.generic):
            return json.dumps(value.item(), ensure_ascii=False).encode("utf-8")
    if isinstance(value, str):
        return value.encode("utf-8")
    if isinstance(value, (bool, np.bool_)):
        raise TypeError(f"extension {ext!r}: bool is ambiguous; pass int(value) or str(value)")
    if isinstance(value, (int, np.integer)):
        return str(int(value)).encode()
    if last in TENBIN_EXTS and isinstance(value, (np.ndarray, list)):
        from .tenbin import tenbin_encode

        return tenbin_encode(value)
    if last in NPY_EXTS and isinstance(value, (np.ndarray, np.generic)):
        return _encode_npy(ext, value)
    if last in NPZ_EXTS:
        return _encode_npz(ext, value)
    if last in IMAGE_FORMATS:
        data = _encode_image(ext, last, value, quality, max_side)
        if data is not None:
            return data
    if isinstance(value, np.ndarray):
        raise TypeError(
            f"extension {ext!r}: numpy arrays are written as npy, npz (a dict of arrays), an "
            f"image extension (uint8 (H, W[, C])) or pyd; use one of those"
        )
    raise TypeError(
        f"extension {ext!r}: cannot encode a {type(value).__name__}; pass bytes, str, int, a "
        f"dict/list for json, a numpy array for npy, a PIL image or uint8 array for an image "
        f"extension, or any object for pyd/pickle/pth/msgpack/cbor"
    )


class ImageEncoder:
    """A writer's encoder with other image settings: ``ShardWriter(..., encoder=ImageEncoder(...))``.

    :func:`encode_value` with ``quality`` and ``max_side`` fixed; picklable, so it also goes
    to :func:`tarindex.write_shards`' worker processes. ``tarindex pack --max-side N
    --quality Q`` uses it.

    Args:
        quality: JPEG/WebP quality, 1-100. Defaults to :data:`JPEG_QUALITY` (95).
        max_side: Longest image side stored, in pixels (see :func:`encode_value`). Defaults
            to ``None`` (sizes kept).

    Raises:
        ValueError: ``quality`` outside 1-100, or ``max_side`` not ``None`` or ``>= 1``.
    """

    def __init__(self, quality: int = JPEG_QUALITY, max_side: int | None = None) -> None:
        if isinstance(quality, bool) or not isinstance(quality, int) or not 1 <= quality <= 100:
            raise ValueError(f"quality={quality!r}: expected an integer in [1, 100]")
        self.quality = quality
        self.max_side = _check_side(max_side)

    def __call__(self, ext: str, value: Any) -> bytes:
        """Encode ``value`` for ``ext`` (:func:`encode_value`)."""
        return encode_value(ext, value, quality=self.quality, max_side=self.max_side)

    def __repr__(self) -> str:
        return f"ImageEncoder(quality={self.quality}, max_side={self.max_side})"
