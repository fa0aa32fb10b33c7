"""Decode member bytes to values (readers), by extension; encoding is :mod:`tarindex.encode`.

The codec is chosen by the *last* dot-component of the extension (``"seg.png"`` -> ``png``),
as webdataset does; a trailing ``.zst`` means zstandard-compressed bytes of the inner
extension (``"npy.zst"``). Images go through Pillow. Unpickling (``pickle``, ``pyd``) happens
only with ``allow_pickle=True``: pickle runs arbitrary code.

**Hostile members.** Member bytes are untrusted, and decoding stays bounded:

- An image member is opened only as the Pillow format its extension names
  (:data:`IMAGE_FORMATS`: ``jpg`` -> ``JPEG``, ``png`` -> ``PNG``, ...), never sniffed, so EPS
  or PostScript bytes named ``.jpg`` are refused and Ghostscript (or any other program) is
  never started. A ``.jpg`` that holds PNG bytes is refused too.
- An image of more than :data:`MAX_IMAGE_PIXELS` pixels (``width * height``, read from its
  header) is refused before its pixels are decoded.
- The bytes that ``.zst`` frames and ``.npz`` entries expand to count against one budget per
  sample, :data:`ZSTD_MAX_OUTPUT`, shared by all its members, and are checked before the
  output is allocated.
- A ``.npy`` header that declares more data than the member holds is refused before
  allocating.

To raise a bound, pass a decoder to the dataset, e.g.
``TarDataset(src, decode=ExtDecoder("rgb8", max_image_pixels=1 << 27))``, or set the module
constant before the dataset is constructed (an :class:`ExtDecoder` takes the constants'
values when it is created and carries them to DataLoader workers). To decode images above
Pillow's own bound (``PIL.Image.MAX_IMAGE_PIXELS``, 89,478,485 pixels, with an error at
twice that), raise that too.

Every failure to decode a member raises :class:`tarindex.DecodeError` (a ``ValueError``)
naming the shard, sample key and extension, with the decoder's exception chained as
``__cause__``; a failure of the zstandard stage raises its subclass
``tarindex.codecs.ZstdDecodeError``, which is also a ``zstandard.ZstdError``.
``MemoryError`` propagates unchanged.
"""

from __future__ import annotations

import io
import json
import math
import sys
import threading
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any

import numpy as np

from .errors import DecodeError

__all__ = [
    "IMAGE_EXTS",
    "IMAGE_FORMATS",
    "IMAGE_MODES",
    "MAX_IMAGE_PIXELS",
    "ZSTD_MAX_OUTPUT",
    "DecodeError",
    "decode_value",
    "Decoder",
    "ExtDecoder",
    "make_decoder",
]

IMAGE_FORMATS: Mapping[str, str] = MappingProxyType(
    {
        "jpg": "JPEG",
        "jpeg": "JPEG",
        "png": "PNG",
        "ppm": "PPM",
        "pgm": "PPM",
        "pbm": "PPM",
        "pnm": "PPM",
        "bmp": "BMP",
        "tif": "TIFF",
        "tiff": "TIFF",
        "webp": "WEBP",
        "gif": "GIF",
    }
)
"""Image extension -> the one Pillow format a member with it is written and opened as."""
IMAGE_EXTS = frozenset(IMAGE_FORMATS)
_INT_EXTS = frozenset({"cls", "cls2", "index", "idx", "id", "label"})
_TEXT_EXTS = frozenset({"txt", "text", "caption"})
_JSON_EXTS = frozenset({"json", "jsn"})
_PICKLE_EXTS = frozenset({"pickle", "pyd", "pkl"})
IMAGE_MODES = ("pil", "rgb8", "l8")
MAX_IMAGE_PIXELS = 1 << 25
"""Largest image decoded, in pixels (``width * height``): 33,554,432, e.g. 8192 x 4096.

A quarter of Pillow's own warning bound (``PIL.Image.MAX_IMAGE_PIXELS``, 89,478,485). At
this size Pillow holds at most 128 MiB of pixels (4 bytes per pixel), and decoding to
``"rgb8"`` peaks at about 320 MiB (measured, PNG of any mode); a bigger image raises
:class:`tarindex.DecodeError` after its header is read, before its pixels are decoded (a
48 KB PNG of 20000 x 20000 pixels, 4 GiB as ``"rgb8"``, costs 1 MiB). Read by
:func:`decode_value` at each call and by :class:`ExtDecoder` when it is created.
"""
ZSTD_MAX_OUTPUT = 1 << 30
"""Decompressed bytes one sample may produce, all its members together: 1 GiB.

Counts the output of ``.zst`` frames and ``.npz`` entries, checked before it is allocated
(from the frame header's size, else by a first counting pass in 1 MiB steps). A 100 KB tar
sample of three members that each expand to 1 GiB costs 1 GiB (measured), not 3: the
second member is refused. Read by
:func:`decode_value` at each call (a budget for that one member) and by
:class:`ExtDecoder` when it is created.
"""
_NPY_MAGIC = b"\x93NUMPY"
_COUNT_STEP = 1 << 20


def _last(ext: str) -> str:
    return ext.rsplit(".", 1)[-1].lower()


# -- decoding -------------------------------------------------------------------------------


class _Refused(Exception):
    """A bound or a format check refused a member; ``zstd``: at the zstandard stage."""

    def __init__(self, msg: str, zstd: bool = False) -> None:
        super().__init__(msg)
        self.zstd = zstd


class _Budget:
    """Decompressed bytes a sample may still produce, shared by its members."""

    __slots__ = ("left", "limit")

    def __init__(self, limit: int) -> None:
        self.limit = self.left = limit

    def take(self, n: int, what: str, zstd: bool) -> None:
        if n > self.left:
            raise _Refused(
                f"{what} {n} bytes, more than the {self.left} left of the sample's "
                f"decompression budget of {self.limit} bytes (tarindex.codecs.ZSTD_MAX_OUTPUT, "
                f"or ExtDecoder(max_decompressed_bytes=N); raise it if this is real)",
                zstd,
            )
        self.left -= n


_ZSTD_DECODE_ERROR: type[DecodeError] | None = None
_ZSTD_LOCK = threading.Lock()


def _zstd_decode_error() -> type[DecodeError]:
    """``ZstdDecodeError``: a DecodeError that is also a ``zstandard.ZstdError``.

    Made on first use, so ``import tarindex`` does not import zstandard; the module
    ``__getattr__`` below resolves the name, so instances pickle (DataLoader workers).
    """
    global _ZSTD_DECODE_ERROR
    with _ZSTD_LOCK:  # one class only: pickle checks the name resolves to the same object
        if _ZSTD_DECODE_ERROR is None:
            import zstandard

            class ZstdDecodeError(DecodeError, zstandard.ZstdError):
                """A ``.zst`` member cannot be decompressed, or not within its bounds."""

            ZstdDecodeError.__qualname__ = "ZstdDecodeError"  # pickled by name, as a global
            _ZSTD_DECODE_ERROR = ZstdDecodeError
        return _ZSTD_DECODE_ERROR


def __getattr__(name: str) -> Any:
    """Resolve ``ZstdDecodeError`` lazily (it subclasses ``zstandard.ZstdError``).

    ``encode_value`` is :func:`tarindex.encode.encode_value` (moved there; imported on use).
    """
    if name == "ZstdDecodeError":
        return _zstd_decode_error()
    if name == "encode_value":
        from .encode import encode_value

        return encode_value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _unzstd(data: bytes, budget: _Budget) -> bytes:
    """Decompress the first zstd frame of ``data``, charging its size to ``budget`` first."""
    import zstandard

    try:
        declared = zstandard.frame_content_size(data)  # -1: not in the frame header
    except zstandard.ZstdError:
        declared = -1  # not a frame: decompress() below says so
    dctx = zstandard.ZstdDecompressor()
    if declared >= 0:
        # a 40-byte frame may declare 16 GiB, allocated up front by decompress(): check first
        budget.take(declared, "zstd frame declares", True)
        return dctx.decompress(data)
    # no size in the header: count the output with one 1 MiB buffer, stopping past the
    # budget, then decompress into one allocation of exactly that size
    buf = bytearray(min(budget.left + 1, _COUNT_STEP))
    n = 0
    with dctx.stream_reader(data) as r:
        while n <= budget.left:
            k = r.readinto(buf)
            if not k:
                break
            n += k
    what = "to at least" if n > budget.left else "to"
    budget.take(n, f"zstd frame (no size in its header) expands {what}", True)
    # max_output_size=0 would mean "unbounded"; a truncated frame raises ZstdError here
    return dctx.decompress(data, max_output_size=max(n, 1))


def _npy(data: bytes, allow_pickle: bool) -> Any:
    """``np.load`` of ``.npy`` bytes, refusing a header that declares more than the data."""
    fmt: Any = np.lib.format  # untyped in numpy's stubs
    bio = io.BytesIO(data)
    version = fmt.read_magic(bio)
    # 3.0 differs from 2.0 only in the header's text encoding (utf-8 field names)
    read = fmt.read_array_header_1_0 if version == (1, 0) else fmt.read_array_header_2_0
    shape, _, dtype = read(bio)
    if not dtype.hasobject:
        need = math.prod(shape) * dtype.itemsize
        have = len(data) - bio.tell()
        if need > have:
            raise _Refused(
                f".npy header declares shape {shape} of {dtype} = {need} bytes, but the "
                f"member holds {have} bytes of data"
            )
    bio.seek(0)
    return np.load(bio, allow_pickle=allow_pickle)


def _npz(data: bytes, allow_pickle: bool, budget: _Budget) -> dict[str, Any]:
    """``dict(np.load(npz))``, with the entries' declared sizes charged to ``budget`` first.

    ``zipfile`` never returns more than an entry's declared size, so the charge bounds the
    output of deflate bombs.
    """
    import zipfile

    out: dict[str, Any] = {}
    with zipfile.ZipFile(io.BytesIO(data)) as zf:
        infos = zf.infolist()
        budget.take(sum(i.file_size for i in infos), ".npz entries declare", False)
        for info in infos:
            raw = zf.read(info)
            name = info.filename
            key = name[:-4] if name.endswith(".npy") else name
            out[key] = _npy(raw, allow_pickle) if raw.startswith(_NPY_MAGIC) else raw
    return out


def _image(last: str, data: bytes, image: str, max_pixels: int) -> Any:
    if image == "raw":
        return data
    from PIL import Image, UnidentifiedImageError

    fmt = IMAGE_FORMATS[last]
    try:
        img = Image.open(io.BytesIO(data), formats=[fmt])
    except UnidentifiedImageError as e:
        raise _Refused(
            f"not a {fmt} image (starts {bytes(data[:12])!r}); a member is opened only as the "
            f"format its extension names, never by content"
        ) from e
    except Image.DecompressionBombError as e:
        raise _Refused(
            f"{e} (Pillow's own bound, PIL.Image.MAX_IMAGE_PIXELS; tarindex's is "
            f"max_image_pixels = {max_pixels})"
        ) from e
    w, h = img.size
    if w * h > max_pixels:
        img.close()
        raise _Refused(
            f"image is {w}x{h} = {w * h} pixels, more than max_image_pixels = {max_pixels} "
            f"(tarindex.codecs.MAX_IMAGE_PIXELS); if such images are real, decode with "
            f"tarindex.codecs.ExtDecoder(mode, max_image_pixels=N)"
        )
    img.load()
    if image == "pil":
        return img
    want = "RGB" if image == "rgb8" else "L"
    pixels: Image.Image = img
    del img
    if pixels.mode != want:  # else no convert() copy; the source is freed once converted
        pixels = pixels.convert(want)
    return np.array(pixels)  # a writable copy: torch warns on read-only arrays


def _decode(
    ext: str, data: bytes, image: str, allow_pickle: bool, max_pixels: int, budget: _Budget
) -> Any:
    if ext.endswith(".zst"):
        inner = _unzstd(data, budget)
        return _decode(ext[:-4], inner, image, allow_pickle, max_pixels, budget)
    last = _last(ext)
    if last in IMAGE_EXTS:
        return _image(last, data, image, max_pixels)
    if last in _INT_EXTS:
        return int(data)
    if last in _TEXT_EXTS:
        return data.decode("utf-8")
    if last in _JSON_EXTS:
        return json.loads(data)  # nesting too deep: RecursionError, wrapped like the rest
    if last == "npy":
        return _npy(data, allow_pickle)
    if last == "npz":
        return _npz(data, allow_pickle, budget)
    if last in _PICKLE_EXTS and allow_pickle:
        import pickle

        return pickle.loads(data)
    return data


def _kind(ext: str) -> str:
    while ext.endswith(".zst"):
        ext = ext[:-4]
    last = _last(ext)
    if last in IMAGE_EXTS:
        return f"a {IMAGE_FORMATS[last]} image"
    if last in _INT_EXTS:
        return "an integer"
    if last in _TEXT_EXTS:
        return "UTF-8 text"
    if last in _JSON_EXTS:
        return "JSON"
    if last in ("npy", "npz"):
        return f"a .{last} file"
    return "a pickle" if last in _PICKLE_EXTS else "bytes"


def _decode_member(
    ext: str,
    data: bytes,
    image: str,
    allow_pickle: bool,
    max_pixels: int,
    budget: _Budget,
    shard: str | None,
    key: str | None,
) -> Any:
    """:func:`_decode`, every failure but MemoryError raised as a DecodeError naming the member."""
    try:
        return _decode(ext, data, image, allow_pickle, max_pixels, budget)
    except MemoryError:
        raise
    except Exception as e:
        where = (f"{shard}: " if shard is not None else "") + (
            f"sample {key!r}, " if key is not None else ""
        )
        zs = sys.modules.get("zstandard")
        if isinstance(e, _Refused):
            cls = _zstd_decode_error() if e.zstd else DecodeError
            raise cls(f"{where}extension {ext!r}: {e}") from e.__cause__
        if zs is not None and isinstance(e, zs.ZstdError):
            cls, kind = _zstd_decode_error(), "zstandard data"
        else:
            cls, kind = DecodeError, _kind(ext)
        msg = str(e)
        if len(msg) > 300:
            msg = msg[:300] + "..."
        raise cls(
            f"{where}extension {ext!r}: cannot decode {len(data)} bytes as {kind}: "
            f"{type(e).__name__}: {msg}"
        ) from e


def _check_mode(image: str) -> None:
    if image not in IMAGE_MODES and image != "raw":
        raise ValueError(f"image mode {image!r}: expected one of pil, rgb8, l8, raw")


def _bound(name: str, value: int, low: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < low:
        raise ValueError(f"{name}={value!r}: expected an integer >= {low}")
    return int(value)


def decode_value(
    ext: str,
    data: bytes,
    image: str = "pil",
    allow_pickle: bool = False,
    *,
    max_image_pixels: int | None = None,
    max_decompressed_bytes: int | None = None,
    shard: str | None = None,
    key: str | None = None,
) -> Any:
    """Decode one member's bytes by extension (reader side), within the bounds.

    Args:
        ext: The member's extension (``"png"``, ``"seg.png"``, ``"npy.zst"`` ...).
        data: The member's bytes.
        image: ``"pil"`` (a loaded ``PIL.Image.Image``), ``"rgb8"`` (``uint8`` array of shape
            ``(H, W, 3)``), ``"l8"`` (``uint8`` array of shape ``(H, W)``) or ``"raw"`` (bytes).
            Defaults to ``"pil"``.
        allow_pickle: Unpickle ``pickle``/``pyd``/``pkl`` members. Defaults to ``False``
            (left as bytes), because unpickling runs code from the file.
        max_image_pixels: Largest image decoded, in pixels (``width * height``), ``>= 1``.
            Defaults to :data:`MAX_IMAGE_PIXELS` (``2**25``), read at this call.
        max_decompressed_bytes: Bytes the ``.zst`` frames and ``.npz`` entries of this member
            may expand to, ``>= 0``. Defaults to :data:`ZSTD_MAX_OUTPUT` (1 GiB), read at this
            call. (:class:`ExtDecoder` shares one such budget among a sample's members.)
        shard: Shard path, for error messages only. Defaults to ``None`` (not named).
        key: Sample key, for error messages only. Defaults to ``None`` (not named).

    Returns:
        ``int`` for ``cls``-like extensions, ``str`` for ``txt``, objects for ``json``,
        ``numpy.ndarray`` for ``npy``, a ``dict`` of arrays (bytes for non-``.npy`` entries)
        for ``npz``, images as asked; other extensions stay bytes.

    Raises:
        DecodeError: The bytes do not decode as ``ext`` says (bad integer, UTF-8, JSON,
            nesting too deep for the JSON parser, ``.npy``/``.npz``, pickle); an image that is
            not in the format its extension names (:data:`IMAGE_FORMATS`) or has more than
            ``max_image_pixels`` pixels; a ``.npy`` header declaring more data than the member
            holds; ``.zst`` or ``.npz`` output over ``max_decompressed_bytes``. The message
            names ``shard``, ``key`` and ``ext``; the decoder's exception is ``__cause__``.
            Zstandard failures raise ``ZstdDecodeError``, a subclass that is also a
            ``zstandard.ZstdError``.
        ValueError: An unknown ``image`` mode, or a bound below its minimum.
        MemoryError: Passed through unchanged.
    """
    _check_mode(image)
    pixels = _bound(
        "max_image_pixels", MAX_IMAGE_PIXELS if max_image_pixels is None else max_image_pixels, 1
    )
    limit = ZSTD_MAX_OUTPUT if max_decompressed_bytes is None else max_decompressed_bytes
    limit = _bound("max_decompressed_bytes", limit, 0)
    return _decode_member(ext, data, image, allow_pickle, pixels, _Budget(limit), shard, key)


Decoder = Callable[[dict[str, Any]], dict[str, Any]]


def make_decoder(decode: None | str | bool | Decoder, allow_pickle: bool = False) -> Decoder | None:
    """Return a function that decodes a sample dict in place, or None for raw bytes.

    Args:
        decode: ``None``/``False``/``"raw"``: no decoding. ``True`` or ``"pil"``/``"rgb8"``/``"l8"``:
            an :class:`ExtDecoder` with the default bounds, images in that mode (``True``
            means ``"pil"``). A callable (e.g. an :class:`ExtDecoder` with other bounds): used
            as is (sample dict -> sample dict).
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

    Each member goes through :func:`decode_value`, named in errors by the sample's
    ``__shard__`` and ``__key__``. The sample's ``.zst`` and ``.npz`` members share one budget
    of ``max_decompressed_bytes``, so a sample of many small compressed members cannot expand
    past it either.

    Args:
        image: Image mode, see :func:`decode_value`. Defaults to ``"pil"``.
        allow_pickle: See :func:`decode_value`. Defaults to ``False``.
        max_image_pixels: Largest image decoded, in pixels (``width * height``), ``>= 1``.
            Defaults to :data:`MAX_IMAGE_PIXELS` (``2**25``) at construction.
        max_decompressed_bytes: Bytes all ``.zst`` frames and ``.npz`` entries of one sample
            may expand to together, ``>= 0``. Defaults to :data:`ZSTD_MAX_OUTPUT` (1 GiB) at
            construction.

    Raises:
        ValueError: An unknown ``image`` mode, or a bound below its minimum. Calls raise
            :class:`tarindex.DecodeError` as :func:`decode_value` does.
    """

    def __init__(
        self,
        image: str = "pil",
        allow_pickle: bool = False,
        *,
        max_image_pixels: int | None = None,
        max_decompressed_bytes: int | None = None,
    ) -> None:
        _check_mode(image)
        self.image = image
        self.allow_pickle = allow_pickle
        self.max_image_pixels = _bound(
            "max_image_pixels",
            MAX_IMAGE_PIXELS if max_image_pixels is None else max_image_pixels,
            1,
        )
        self.max_decompressed_bytes = _bound(
            "max_decompressed_bytes",
            ZSTD_MAX_OUTPUT if max_decompressed_bytes is None else max_decompressed_bytes,
            0,
        )

    def __call__(self, sample: dict[str, Any]) -> dict[str, Any]:
        """Decode ``sample`` in place and return it.

        Raises:
            DecodeError: A member cannot be decoded within the bounds (see
                :func:`decode_value`); the message names shard, key and extension.
        """
        budget = _Budget(self.max_decompressed_bytes)
        shard, key = sample.get("__shard__"), sample.get("__key__")
        shard = None if shard is None else str(shard)
        key = None if key is None else str(key)
        for k, v in sample.items():
            if not k.startswith("__"):
                sample[k] = _decode_member(
                    k, v, self.image, self.allow_pickle, self.max_image_pixels, budget, shard, key
                )
        return sample

    def __repr__(self) -> str:
        return (
            f"ExtDecoder({self.image!r}, allow_pickle={self.allow_pickle}, "
            f"max_image_pixels={self.max_image_pixels}, "
            f"max_decompressed_bytes={self.max_decompressed_bytes})"
        )
