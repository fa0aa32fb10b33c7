"""Encode values to member bytes (writer) and decode member bytes to values (readers), by extension.

The codec is chosen by the *last* dot-component of the extension (``"seg.png"`` -> ``png``),
as webdataset does; a trailing ``.zst`` means zstandard-compressed bytes of the inner
extension (``"npy.zst"``). Images go through Pillow. Unpickling (``pickle``, ``pyd``) happens
only with ``allow_pickle=True``: pickle runs arbitrary code.
"""

from __future__ import annotations

import io
import json
from collections.abc import Callable
from typing import Any

import numpy as np

__all__ = ["IMAGE_EXTS", "encode_value", "decode_value", "Decoder", "ExtDecoder", "make_decoder"]

IMAGE_EXTS = frozenset(
    {"jpg", "jpeg", "png", "ppm", "pgm", "pbm", "pnm", "bmp", "tif", "tiff", "webp", "gif"}
)
_PIL_FORMAT = {
    "jpg": "JPEG",
    "jpeg": "JPEG",
    "tif": "TIFF",
    "pgm": "PPM",
    "pbm": "PPM",
    "pnm": "PPM",
}
_INT_EXTS = frozenset({"cls", "cls2", "index", "idx", "id", "label"})
_TEXT_EXTS = frozenset({"txt", "text", "caption"})
_JSON_EXTS = frozenset({"json", "jsn"})
_PICKLE_EXTS = frozenset({"pickle", "pyd", "pkl"})
IMAGE_MODES = ("pil", "rgb8", "l8")
ZSTD_MAX_OUTPUT = 1 << 30
"""Largest decompressed ``.zst`` member :func:`decode_value` accepts (decompression bombs)."""


def _last(ext: str) -> str:
    return ext.rsplit(".", 1)[-1].lower()


def encode_value(ext: str, value: Any) -> bytes:
    """Encode one sample value for extension ``ext`` (writer side).

    bytes-like as is; ``str`` as UTF-8; ``int`` as decimal text; ``dict``/``list`` as JSON for
    json extensions; numpy arrays as ``.npy`` (``np.save``, no pickle); PIL images encoded by
    Pillow in the format the extension names. A ``.zst`` suffix compresses the encoded bytes.

    Raises:
        TypeError: If ``value`` has no encoding for ``ext`` (the message names both).
    """
    if ext.endswith(".zst") and ext.count(".") >= 1:
        import zstandard

        return zstandard.ZstdCompressor(level=3).compress(encode_value(ext[:-4], value))
    last = _last(ext)
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value)
    if isinstance(value, str):
        return value.encode("utf-8")
    if isinstance(value, (bool, np.bool_)):
        raise TypeError(f"extension {ext!r}: bool is ambiguous; pass int(value) or str(value)")
    if isinstance(value, (int, np.integer)):
        return str(int(value)).encode()
    if last in _JSON_EXTS and isinstance(value, (dict, list, tuple, int, float)):
        return json.dumps(value, ensure_ascii=False).encode("utf-8")
    if isinstance(value, np.ndarray):
        if last not in ("npy",):
            raise TypeError(f"extension {ext!r}: numpy arrays are written as .npy; use ext 'npy'")
        if value.dtype.hasobject:
            raise TypeError(
                f"extension {ext!r}: object arrays need pickle; convert the array first"
            )
        buf = io.BytesIO()
        np.save(buf, value, allow_pickle=False)
        return buf.getvalue()
    if last in IMAGE_EXTS:
        from PIL import Image

        if isinstance(value, Image.Image):
            buf = io.BytesIO()
            value.save(buf, format=_PIL_FORMAT.get(last, last.upper()))
            return buf.getvalue()
    raise TypeError(
        f"extension {ext!r}: cannot encode a {type(value).__name__}; pass bytes, str, int, a "
        f"dict/list for json, a numpy array for npy, or a PIL image for an image extension"
    )


def decode_value(ext: str, data: bytes, image: str = "pil", allow_pickle: bool = False) -> Any:
    """Decode member bytes by extension (reader side).

    Args:
        ext: The member's extension (``"png"``, ``"seg.png"``, ``"npy.zst"`` ...).
        data: The member's bytes.
        image: ``"pil"`` (a loaded ``PIL.Image.Image``), ``"rgb8"`` (``uint8`` array of shape
            ``(H, W, 3)``), ``"l8"`` (``uint8`` array of shape ``(H, W)``) or ``"raw"`` (bytes).
            Defaults to ``"pil"``.
        allow_pickle: Unpickle ``pickle``/``pyd``/``pkl`` members. Defaults to ``False``
            (left as bytes), because unpickling runs code from the file.

    Returns:
        ``int`` for ``cls``-like extensions, ``str`` for ``txt``, objects for ``json``,
        ``numpy.ndarray`` for ``npy``, a ``dict`` of arrays for ``npz``, images as asked;
        other extensions stay bytes.

    Raises:
        ValueError: An unknown ``image`` mode (for an image member); a ``.zst`` frame that
            declares or expands to more than ``ZSTD_MAX_OUTPUT`` bytes; and what the decoders
            raise on bad bytes (``int()``, ``json.JSONDecodeError``, ``UnicodeDecodeError``,
            ``numpy.load``).
        PIL.UnidentifiedImageError: Image bytes Pillow cannot read.
        zstandard.ZstdError: A ``.zst`` member that is not valid zstandard data.
    """
    if ext.endswith(".zst"):
        import zstandard

        # a 40-byte frame may declare 16 GiB (allocated up front) or expand to it: cap both
        try:
            declared = zstandard.frame_content_size(data)  # -1: not in the frame header
        except zstandard.ZstdError:
            declared = -1  # not a frame: decompress() below says so
        if declared > ZSTD_MAX_OUTPUT:
            raise ValueError(
                f"extension {ext!r}: zstd frame declares {declared} bytes, more than "
                f"tarindex.codecs.ZSTD_MAX_OUTPUT = {ZSTD_MAX_OUTPUT} (raise it if this is real)"
            )
        return decode_value(
            ext[:-4],
            zstandard.ZstdDecompressor().decompress(data, max_output_size=ZSTD_MAX_OUTPUT),
            image,
            allow_pickle,
        )
    last = _last(ext)
    if last in IMAGE_EXTS:
        if image == "raw":
            return data
        from PIL import Image

        img = Image.open(io.BytesIO(data))
        img.load()
        if image == "pil":
            return img
        if image == "rgb8":
            return np.array(img.convert("RGB"))  # writable: torch warns on read-only arrays
        if image == "l8":
            return np.array(img.convert("L"))
        raise ValueError(f"image mode {image!r}: expected one of pil, rgb8, l8, raw")
    if last in _INT_EXTS:
        return int(data)
    if last in _TEXT_EXTS:
        return data.decode("utf-8")
    if last in _JSON_EXTS:
        return json.loads(data)
    if last == "npy":
        return np.load(io.BytesIO(data), allow_pickle=allow_pickle)
    if last == "npz":
        return dict(np.load(io.BytesIO(data), allow_pickle=allow_pickle))
    if last in _PICKLE_EXTS and allow_pickle:
        import pickle

        return pickle.loads(data)
    return data


Decoder = Callable[[dict[str, Any]], dict[str, Any]]


def make_decoder(decode: None | str | bool | Decoder, allow_pickle: bool = False) -> Decoder | None:
    """Return a function that decodes a sample dict in place, or None for raw bytes.

    Args:
        decode: ``None``/``False``/``"raw"``: no decoding. ``True`` or ``"pil"``/``"rgb8"``/``"l8"``:
            decode every member by extension, images in that mode (``True`` means ``"pil"``).
            A callable: used as is (sample dict -> sample dict).
        allow_pickle: See :func:`decode_value`.

    Raises:
        ValueError: For an unknown mode string.
    """
    if decode is None or decode is False or decode == "raw":
        return None
    if callable(decode):
        return decode
    mode = "pil" if decode is True else decode
    if mode not in IMAGE_MODES:
        raise ValueError(f"decode={decode!r}: expected None, 'pil', 'rgb8', 'l8' or a callable")

    return ExtDecoder(mode, allow_pickle)


class ExtDecoder:
    """Picklable decoder: decodes every non-``__`` entry of a sample by its extension.

    Args:
        image: Image mode, see :func:`decode_value`.
        allow_pickle: See :func:`decode_value`.
    """

    def __init__(self, image: str = "pil", allow_pickle: bool = False) -> None:
        self.image = image
        self.allow_pickle = allow_pickle

    def __call__(self, sample: dict[str, Any]) -> dict[str, Any]:
        """Decode ``sample`` in place and return it."""
        for k, v in sample.items():
            if not k.startswith("__"):
                sample[k] = decode_value(k, v, self.image, self.allow_pickle)
        return sample
