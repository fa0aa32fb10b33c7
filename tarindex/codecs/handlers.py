"""Decoding the webdataset way: image specs, ``(key, data)`` handlers, ``{ext: f}`` tables.

``decode=`` (docs/DECODING.md) takes webdataset's image specs (:data:`IMAGE_SPECS`:
``"rgb8"``, ``"rgb"``, ``"torchrgb8"``, ``"pil"``, ...), handlers ``f(key, data)`` called
with ``key = "." + extension`` (``None``: not mine, try the next), dicts ``{extension:
f(data)}`` (:class:`ExtTable`) and lists of those, tried in order before the built-in
decoders of :func:`tarindex.codecs.decode_value`; :func:`decode_steps` normalises them,
:func:`tarindex.codecs.make_decoder` makes the sample decoder. torch is imported only when a
``torch*`` spec is decoded, so ``import tarindex`` works without it.

Images are opened as the Pillow format their extension names
(:data:`~tarindex.codecs.exts.IMAGE_FORMATS`) or, by content as webdataset does, another of
the :data:`~tarindex.codecs.exts.SAFE_IMAGE_FORMATS` (never EPS: no other program is ever
started), and refused past a pixel bound before their pixels are decoded (:func:`open_image`).
"""

from __future__ import annotations

import io
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any

import numpy as np

from .compress import Refused
from .exts import IMAGE_FORMATS, SAFE_IMAGE_FORMATS
from .image import ImageDecode

__all__ = [
    "IMAGE_MODES",
    "IMAGE_SPECS",
    "DecodeSpec",
    "ExtTable",
    "Handler",
    "check_spec",
    "decode_image",
    "decode_steps",
    "import_optional",
    "is_handler",
    "open_image",
]

IMAGE_SPECS: Mapping[str, tuple[str, str, str]] = MappingProxyType(
    {
        "l8": ("numpy", "uint8", "L"),
        "rgb8": ("numpy", "uint8", "RGB"),
        "rgba8": ("numpy", "uint8", "RGBA"),
        "l": ("numpy", "float32", "L"),
        "rgb": ("numpy", "float32", "RGB"),
        "rgba": ("numpy", "float32", "RGBA"),
        "torchl8": ("torch", "uint8", "L"),
        "torchrgb8": ("torch", "uint8", "RGB"),
        "torchrgba8": ("torch", "uint8", "RGBA"),
        "torchl": ("torch", "float32", "L"),
        "torchrgb": ("torch", "float32", "RGB"),
        "torch": ("torch", "float32", "RGB"),
        "torchrgba": ("torch", "float32", "RGBA"),
        "pill": ("pil", "", "L"),
        "pil": ("pil", "", "RGB"),
        "pilrgb": ("pil", "", "RGB"),
        "pilrgba": ("pil", "", "RGBA"),
    }
)
"""webdataset's image specs (``webdataset.autodecode.imagespecs``): spec -> (kind, dtype, mode).

The image is converted to ``mode`` with Pillow (``L``: ITU-R 601-2 luma), then: ``numpy``
gives an array ``(H, W)`` for ``L`` or ``(H, W, C)``; ``torch`` a tensor ``(H, W)`` for
``L`` or ``(C, H, W)``, contiguous; ``uint8`` keeps ``0..255``, ``float32`` is the ``uint8``
value divided by 255 (in ``[0, 1]``); ``pil`` a loaded ``PIL.Image.Image`` in ``mode``. Equal
to webdataset's output element for element (``tests/codecs/test_decode_webdataset.py``).
"""
IMAGE_MODES = tuple(IMAGE_SPECS)
"""The spec names of :data:`IMAGE_SPECS`, in order."""

Handler = Callable[[str, bytes], Any]
"""A webdataset-style member decoder ``f(key, data) -> value | None``.

``key`` is a dot plus the member's extension (``".jpg"``, ``".seg.png"``; for ``EXT.zst``
and ``EXT.gz`` members the inner ``".EXT"``, with ``data`` already decompressed); ``None``
means "not mine, try the next handler".
"""

DecodeSpec = Any
"""What ``decode=`` takes; see :func:`tarindex.codecs.make_decoder`."""

_PIP = {"cbor2": "cbor2", "msgpack": "msgpack", "torch": "torch"}
_F255 = np.float32(255)


def import_optional(module: str, what: str) -> Any:
    """Import an optional package for decoding ``what``, or refuse naming the package.

    Raises:
        Refused: ``module`` is not installed (the message says what to ``pip install``).
    """
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError as e:
        raise Refused(
            f"decoding {what} needs the {_PIP.get(module, module)!r} package, which is not "
            f"installed: pip install {_PIP.get(module, module)}"
        ) from e


def check_spec(image: str) -> None:
    """Refuse an image spec that is neither in :data:`IMAGE_SPECS` nor ``"raw"``.

    Raises:
        ValueError: The message lists the specs.
    """
    if image not in IMAGE_SPECS and image != "raw":
        raise ValueError(
            f"image mode {image!r}: expected one of {', '.join(IMAGE_SPECS)} or raw "
            f"(webdataset's image specs)"
        )


_FORMATS_FOR: dict[str, list[str]] = {}  # format -> the Pillow formats tried, it first


def open_image(last: str, data: bytes, max_pixels: int) -> Any:
    """Open an image member, refuse it past ``max_pixels``, load it.

    Tried as the Pillow format ``last`` names first, then by content as the other
    :data:`~tarindex.codecs.exts.SAFE_IMAGE_FORMATS` (a ``.jpg`` holding PNG bytes opens as
    PNG, as in webdataset); never as EPS or any format that starts another program.

    Raises:
        Refused: None of those formats, or more than ``max_pixels`` pixels (``width *
            height``, from the header, before the pixels are decoded), or over Pillow's own
            bound.
    """
    from PIL import Image, UnidentifiedImageError

    fmt = IMAGE_FORMATS[last]
    formats = _FORMATS_FOR.get(fmt)
    if formats is None:
        formats = _FORMATS_FOR[fmt] = [fmt, *(f for f in SAFE_IMAGE_FORMATS if f != fmt)]
    try:
        img = Image.open(io.BytesIO(data), formats=formats)
    except UnidentifiedImageError as e:
        raise Refused(
            f"not an image in any of {', '.join(formats)} (starts {bytes(data[:12])!r}); "
            f"other formats (EPS, ...) are never opened"
        ) from e
    except Image.DecompressionBombError as e:
        raise Refused(
            f"{e} (Pillow's own bound, PIL.Image.MAX_IMAGE_PIXELS; tarindex's is "
            f"max_image_pixels = {max_pixels})"
        ) from e
    w, h = img.size
    if w * h > max_pixels:
        img.close()
        raise Refused(
            f"image is {w}x{h} = {w * h} pixels, more than max_image_pixels = {max_pixels} "
            f"(tarindex.codecs.decode.MAX_IMAGE_PIXELS); if such images are real, decode with "
            f"tarindex.codecs.ExtDecoder(mode, max_image_pixels=N)"
        )
    img.load()
    return img


def decode_image(last: str, data: bytes, spec: str, max_pixels: int) -> Any:
    """Decode an image member as ``spec`` says (:data:`IMAGE_SPECS`; ``"raw"``: bytes).

    Args:
        last: The member's image extension (a key of ``IMAGE_FORMATS``).
        data: Its bytes.
        spec: An image spec or ``"raw"``.
        max_pixels: Largest image decoded, in pixels.

    Raises:
        Refused: As :func:`open_image`, or torch not installed for a ``torch*`` spec.
    """
    if spec == "raw":
        return data
    kind, dtype, mode = IMAGE_SPECS[spec]
    img = open_image(last, data, max_pixels)
    if img.mode != mode:  # else no convert() copy; the source is freed once converted
        img = img.convert(mode)
    if kind == "pil":
        return img
    if kind == "numpy":
        arr = np.array(img)  # (H, W) or (H, W, C) uint8, a writable copy (torch warns on read-only)
        del img
        # one pass, rounded as webdataset's astype(float32) / 255.0 (IEEE division, float32)
        return arr if dtype == "uint8" else np.divide(arr, _F255, dtype=np.float32)
    torch = import_optional("torch", f"the image spec {spec!r}")
    if mode == "L":
        arr = np.array(img)  # (H, W)
    else:  # (C, H, W) from Pillow's bands: half the time of an HWC array plus a transpose
        w, h = img.size
        planes = bytearray().join([band.tobytes() for band in img.split()])
        arr = np.frombuffer(planes, np.uint8).reshape(len(mode), h, w)  # writable, contiguous
    del img
    if dtype != "uint8":
        arr = np.divide(arr, _F255, dtype=np.float32)
    return torch.from_numpy(arr)


class ExtTable:
    """Picklable handler made of a dict ``{extension: f(data) -> value}``.

    Each extension (case-insensitive; ``"jpg jpeg"`` lists several; a leading dot is ignored)
    matches a member whose extension ends with those dot-components, as webdataset's
    ``handle_extension`` does: ``"jpg"`` matches ``x.jpg`` and ``x.seg.jpg``, ``"seg.jpg"``
    only the latter. The first matching entry (in dict order) is called with the bytes; a
    ``None`` result passes the member on to the next handler.

    Raises:
        ValueError: An extension that is not a non-empty string, or a value not callable.
    """

    def __init__(self, table: Mapping[str, Callable[[bytes], Any]]) -> None:
        rows: list[tuple[tuple[str, ...], Callable[[bytes], Any]]] = []
        for exts, f in table.items():
            if not isinstance(exts, str) or not exts.strip():
                raise ValueError(f"decode={{{exts!r}: ...}}: expected an extension string")
            if not callable(f):
                raise ValueError(f"decode={{{exts!r}: {f!r}}}: expected a callable f(data)")
            for ext in exts.lower().split():
                rows.append((tuple(ext.lstrip(".").split(".")), f))
        self.rows = tuple(rows)

    def __call__(self, key: str, data: bytes) -> Any:
        """Decode with the first entry matching ``key`` (``".seg.jpg"``), else ``None``."""
        parts = key.lower().split(".")
        for target, f in self.rows:
            if len(target) < len(parts) and tuple(parts[-len(target) :]) == target:
                return f(data)
        return None

    def __repr__(self) -> str:
        return "ExtTable({" + ", ".join(f"{'.'.join(t)!r}: {f!r}" for t, f in self.rows) + "})"


def _positional(f: Callable[..., Any]) -> tuple[int, int] | None:
    """``(required, most)`` positional parameters of ``f`` (``most`` -1: ``*args``), or None."""
    import inspect

    try:
        sig = inspect.signature(f)
    except (TypeError, ValueError):
        return None
    req = most = 0
    for p in sig.parameters.values():
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD):
            most += 1
            req += p.default is p.empty
        elif p.kind is p.VAR_POSITIONAL:
            most = -1 if most >= 0 else most
        elif p.kind is p.KEYWORD_ONLY and p.default is p.empty:
            return None  # callable by nobody without that keyword
    return req, most


def _takes(f: Callable[..., Any], n: int) -> bool | None:
    got = _positional(f)
    if got is None:
        return None
    req, most = got
    return req <= n and (most < 0 or most >= n)


def is_handler(f: Callable[..., Any]) -> bool:
    """Tell a ``(key, data)`` handler from a ``sample -> sample`` function, by its signature.

    The number of *required* positional parameters decides: two (``def f(key, data)``,
    webdataset's handlers and ``ImageHandler`` objects) make a handler, one (``def
    f(sample)``, ``def f(sample, size=224)``, :class:`tarindex.codecs.ExtDecoder`) a sample
    function. Put a callable in a list (``decode=[f]``) to have it taken as a handler whatever
    its signature.

    Raises:
        ValueError: Any other signature (``def f(*args)``, ``def f(a, b, c)``, a builtin
            without one); the message says how to choose.
    """
    got = _positional(f)
    if got is not None and got[0] in (1, 2) and _takes(f, got[0]):
        return got[0] == 2
    raise ValueError(
        f"decode={f!r}: cannot tell from its signature whether it decodes members, "
        f"f(key, data) -> value or None, or whole samples, f(sample) -> sample; pass "
        f"decode=[f] for a (key, data) handler, or transform=f for a sample function"
    )


def _need_torch(spec: str) -> None:
    import importlib.util

    if importlib.util.find_spec("torch") is None:
        raise ModuleNotFoundError(
            f"decode spec {spec!r} makes torch tensors, and torch is not installed: "
            f"pip install torch (or use the numpy spec {spec[5:] or 'rgb'!r})"
        )


def decode_steps(decode: DecodeSpec) -> tuple[Any, ...]:
    """Normalise ``decode`` to a tuple of steps: specs, handlers, :class:`ExtTable`.

    Specs are image spec strings and :class:`~tarindex.codecs.image.ImageDecode` objects.

    Raises:
        ValueError: An unknown spec string or list item, or a callable in a list that cannot
            take ``(key, data)``.
        ModuleNotFoundError: A ``torch*`` spec without torch installed.
    """
    items = list(decode) if isinstance(decode, (list, tuple)) else [decode]
    out: list[Any] = []
    for d in items:
        if isinstance(d, ImageDecode):
            if d.tensor:
                import importlib.util

                if importlib.util.find_spec("torch") is None:
                    raise ModuleNotFoundError(
                        f"{d!r} makes torch tensors (tensor=True), and torch is not "
                        f"installed: pip install torch (or pass tensor=False for arrays)"
                    )
            out.append(d)
        elif isinstance(d, str):
            check_spec(d)
            if IMAGE_SPECS.get(d, ("",))[0] == "torch":
                _need_torch(d)
            out.append(d)
        elif isinstance(d, Mapping):
            out.append(ExtTable(d))
        elif callable(d):
            if _takes(d, 2) is False:
                raise ValueError(
                    f"decode=[..., {d!r}, ...]: a handler in a list is called as f(key, data), "
                    f"and this one cannot take two arguments; pass a sample function as "
                    f"transform= instead"
                )
            out.append(d)
        else:
            raise ValueError(
                f"decode=[..., {d!r}, ...]: expected image specs (e.g. 'rgb8'), handlers "
                f"f(key, data) or dicts {{extension: f(data)}}"
            )
    return tuple(out)
