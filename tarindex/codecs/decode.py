"""Decode member bytes to values (readers), by extension; encoding is :mod:`tarindex.encode`.

The codec is chosen by the *last* dot-component of the extension (``"seg.png"`` -> ``png``),
as webdataset does. A trailing compression suffix (:data:`COMPRESSION_SUFFIXES`, one table
used by every reader-side rule) means compressed bytes of the inner extension: ``.zst``
zstandard (``"npy.zst"``), possibly with the shard's trained dictionary (docs/FORMAT.md §7,
passed by the datasets as ``ExtDecoder(sample, zstd_dict)``), and ``.gz`` gzip
(``"json.gz"``, webdataset's ``gzfilter``); a decoded sample names such an entry without the
suffix. Images go through Pillow. Unpickling
(``pickle``, ``pyd``) happens only with ``allow_pickle=True``: pickle runs arbitrary code.

**Decoding the webdataset way** (docs/DECODING.md): ``decode=`` takes webdataset's image
specs (:data:`IMAGE_SPECS`: ``"rgb8"``, ``"rgb"``, ``"torchrgb8"``, ``"pil"``, ...), handlers
``f(key, data)`` called with ``key = "." + extension`` (``None``: not mine, try the next), dicts
``{extension: f(data)}`` and lists of those, tried in order before the built-in decoders of
:func:`decode_value`; see :func:`make_decoder`. torch is imported only when a ``torch*`` spec
or a ``.pth`` member is decoded, so ``import tarindex`` works without it.

**Hostile members.** Member bytes are untrusted, and decoding stays bounded:

- An image member is opened only as the Pillow format its extension names
  (:data:`IMAGE_FORMATS`: ``jpg`` -> ``JPEG``, ``png`` -> ``PNG``, ...), never sniffed, so EPS
  or PostScript bytes named ``.jpg`` are refused and Ghostscript (or any other program) is
  never started. A ``.jpg`` that holds PNG bytes is refused too.
- An image of more than :data:`MAX_IMAGE_PIXELS` pixels (``width * height``, read from its
  header) is refused before its pixels are decoded.
- The bytes that ``.zst`` frames, ``.gz`` streams and ``.npz`` entries expand to count
  against one budget per sample, :data:`ZSTD_MAX_OUTPUT`, shared by all its members: checked
  before the output is allocated (``.zst``, ``.npz``), or counted while inflating and refused
  once past the budget (``.gz``, holding at most 64 MiB of output until it is known to fit).
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
``tarindex.codecs.ZstdDecodeError``, which is also a ``zstandard.ZstdError`` (a failure of
the gzip stage is a plain ``DecodeError``, its ``zlib.error`` chained).
``MemoryError`` propagates unchanged.
"""

from __future__ import annotations

import io
import json
import math
import sys
import threading
import zlib
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any

import numpy as np

from ..errors import DecodeError

__all__ = [
    "COMPRESSION_SUFFIXES",
    "IMAGE_EXTS",
    "IMAGE_FORMATS",
    "IMAGE_MODES",
    "IMAGE_SPECS",
    "MAX_IMAGE_PIXELS",
    "ZSTD_MAX_OUTPUT",
    "DecodeError",
    "compression_layers",
    "decode_value",
    "Decoder",
    "DecodeSpec",
    "ExtDecoder",
    "ExtTable",
    "Handler",
    "is_handler",
    "make_decoder",
    "strip_compression",
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
_INT_EXTS = frozenset({"cls", "cls2", "index", "inx", "id", "idx", "label"})
_TEXT_EXTS = frozenset({"txt", "text", "transcript", "caption"})
_JSON_EXTS = frozenset({"json", "jsn"})
_PICKLE_EXTS = frozenset({"pickle", "pyd", "pkl"})
_MSGPACK_EXTS = frozenset({"mp", "msg", "msgpack"})
_CBOR_EXTS = frozenset({"cbor"})
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
to webdataset's output element for element (``tests/test_decode_webdataset.py``).
"""
IMAGE_MODES = tuple(IMAGE_SPECS)
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

Counts the output of ``.zst`` frames, ``.gz`` streams and ``.npz`` entries, checked before
it is allocated (from the frame header's size, else by a first counting pass in 1 MiB steps;
``.gz``: counted while inflating in 1 MiB steps, see :func:`_gunzip`). A 100 KB tar
sample of three members that each expand to 1 GiB costs 1 GiB (measured), not 3: the
second member is refused. Read by
:func:`decode_value` at each call (a budget for that one member) and by
:class:`ExtDecoder` when it is created.
"""
_NPY_MAGIC = b"\x93NUMPY"
_COUNT_STEP = 1 << 20
_GZ_KEEP = 1 << 26  # .gz output held while inflating; past it, count first, inflate again


def _last(ext: str) -> str:
    return ext.rsplit(".", 1)[-1].lower()


# -- decoding -------------------------------------------------------------------------------


class _Refused(Exception):
    """A bound or a format check refused a member; ``zstd``: at the zstandard stage."""

    def __init__(self, msg: str, zstd: bool = False) -> None:
        super().__init__(msg)
        self.zstd = zstd


class _Budget:
    """Decompressed bytes a sample may still produce, shared by its members.

    Also carries the sample's shard's zstd dictionary (``zstandard.ZstdCompressionDict`` or
    None, FORMAT.md §7): the per-sample decode context.
    """

    __slots__ = ("left", "limit", "zstd_dict")

    def __init__(self, limit: int, zstd_dict: Any = None) -> None:
        self.limit = self.left = limit
        self.zstd_dict = zstd_dict

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


_DCTX = threading.local()  # per thread: {id(dictionary) or 0: (dictionary, ZstdDecompressor)}
_DCTX_KEEP = 8  # decompressors kept per thread (one per shard dictionary in use)


def _decompressor(zstd_dict: Any) -> Any:
    """This thread's ``ZstdDecompressor`` for ``zstd_dict`` (None: no dictionary).

    Making one costs ~60 us (its context), decompressing a small member ~1 us: they are kept,
    per thread (a decompressor is not thread-safe), keyed by the dictionary object (held, so
    its id stays unique), never by shard path.
    """
    cache: dict[int, tuple[Any, Any]] | None = getattr(_DCTX, "cache", None)
    if cache is None:
        cache = _DCTX.cache = {}
    k = 0 if zstd_dict is None else id(zstd_dict)
    hit = cache.get(k)
    if hit is not None and hit[0] is zstd_dict:
        return hit[1]
    import zstandard

    dctx = zstandard.ZstdDecompressor(dict_data=zstd_dict)
    if len(cache) >= _DCTX_KEEP:
        cache.pop(next(iter(cache)))
    cache[k] = (zstd_dict, dctx)
    return dctx


def _unzstd(data: bytes, budget: _Budget) -> bytes:
    """Decompress the first zstd frame of ``data``, charging its size to ``budget`` first.

    A frame compressed with a dictionary (its header names the dictionary id) is
    decompressed with ``budget.zstd_dict``, the shard's (FORMAT.md §7), whose id must match.
    """
    import zstandard

    try:
        declared = zstandard.frame_content_size(data)  # -1: not in the frame header
        dict_id = zstandard.get_frame_parameters(data).dict_id
    except zstandard.ZstdError:
        declared, dict_id = -1, 0  # not a frame: decompress() below says so
    zd = None
    if dict_id:
        zd = budget.zstd_dict
        have = None if zd is None else zd.dict_id()
        if have != dict_id:
            got = "has no zstd dictionary" if zd is None else f"has dictionary {have}"
            raise _Refused(
                f"zstd frame was compressed with dictionary {dict_id}, and the shard {got} "
                f"(FORMAT.md §7); decode through TarDataset/TarIterableDataset, or pass "
                f"zstd_dict=ShardReader(tar).zstd_dict()",
                True,
            )
    dctx = _decompressor(zd)
    if declared >= 0:
        # a 40-byte frame may declare 16 GiB, allocated up front by decompress(): check first
        budget.take(declared, "zstd frame declares", True)
        out: bytes = dctx.decompress(data)
        return out
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
    out = dctx.decompress(data, max_output_size=max(n, 1))
    return out


def _inflate(data: bytes, left: int, keep: int) -> tuple[int, list[bytes] | None]:
    """Inflate every gzip member of ``data`` in 1 MiB steps: ``(bytes out, chunks)``.

    Stops as soon as the output passes ``left`` (the count returned is then ``> left``).
    The chunks are kept while the output is at most ``keep`` bytes, else ``None``.
    """
    parts: list[bytes] | None = []
    n = 0
    rest: Any = data
    member = 0
    while True:
        d = zlib.decompressobj(wbits=31)  # gzip wrapper: header, crc32 and size are checked
        buf = rest
        try:
            while not d.eof:
                chunk = d.decompress(buf, min(left - n + 1, _COUNT_STEP))  # max_length >= 1
                buf = d.unconsumed_tail
                n += len(chunk)
                if n > left:
                    return n, None
                if not chunk and not buf and not d.eof:  # input used up, no trailer
                    raise _Refused(
                        f"gzip stream is truncated: member {member + 1} ends after "
                        f"{len(rest)} bytes, without its end of stream and trailer"
                    )
                if parts is not None and chunk:
                    if n > keep:
                        parts = None
                    else:
                        parts.append(chunk)
        except zlib.error as e:
            at = len(data) - len(rest)
            raise _Refused(
                f"cannot inflate gzip member {member + 1} at byte {at} of {len(data)}: {e} "
                f"(starts {bytes(rest[:12])!r}; a gzip member starts b'\\x1f\\x8b')"
            ) from e
        member += 1
        rest = d.unused_data.lstrip(b"\0")  # zero padding after a member: skipped, as gzip does
        if not rest:
            return n, parts


def _gunzip(data: bytes, budget: _Budget) -> bytes:
    """Decompress a gzip stream (RFC 1952) within ``budget``: all its members, concatenated.

    As Python's ``gzip`` (webdataset's ``gzfilter``) and ``gunzip`` do: members follow one
    another (``cat a.gz b.gz``), zero bytes between or after them are skipped, any other
    trailing bytes are an error, each member's crc32 and size are checked; empty data is
    empty output. The output is counted while it is inflated and refused once past the
    budget, holding at most :data:`_GZ_KEEP` bytes of it (a stream that inflates to more is
    counted first, then inflated again). The trailer's size field is not used to refuse
    early: it is only mod 2**32, and in a truncated or corrupt stream it is noise.
    """
    if not data:
        return b""
    n, parts = _inflate(data, budget.left, _GZ_KEEP)
    what = "to at least" if n > budget.left else "to"
    budget.take(n, f"gzip stream expands {what}", False)
    if parts is None:  # more than _GZ_KEEP: counted only; inflate again, keeping it all
        n, parts = _inflate(data, n, n)
    return b"".join(parts or ())


_DECOMPRESS: Mapping[str, Callable[[bytes, _Budget], bytes]] = MappingProxyType(
    {".zst": _unzstd, ".gz": _gunzip}
)
COMPRESSION_SUFFIXES = tuple(_DECOMPRESS)
"""Extension suffixes that mean compressed bytes of the inner extension: ``.zst``, ``.gz``.

The one table of the reader side: decoding decompresses them (:func:`compression_layers`),
decoded samples name the entry without them (:func:`strip_compression`), selection finds
``EXT`` stored as ``EXT.zst`` or ``EXT.gz`` (:class:`tarindex.ToTuple`). Case-sensitive, as
webdataset's ``.gz`` rule; layers may nest (``npy.gz.zst``); an extension that is only the
suffix (a member ``x.gz``) is not a compressed member (it stays bytes).
"""


def compression_layers(ext: str) -> tuple[str, ...]:
    """The compression suffixes ending ``ext``, outermost first.

    ``"npy.gz.zst"`` -> ``(".zst", ".gz")``; ``"json"`` -> ``()``.
    """
    if not ext.endswith(COMPRESSION_SUFFIXES):  # the common case, one C call
        return ()
    out: list[str] = []
    while True:
        for sfx in COMPRESSION_SUFFIXES:
            if ext.endswith(sfx) and len(ext) > len(sfx):
                out.append(sfx)
                ext = ext[: -len(sfx)]
                break
        else:
            return tuple(out)


def strip_compression(ext: str) -> str:
    """``ext`` without its compression suffixes: ``"meta.json.gz"`` -> ``"meta.json"``."""
    for sfx in compression_layers(ext):
        ext = ext[: -len(sfx)]
    return ext


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


def _import(module: str, what: str) -> Any:
    """Import an optional package for decoding ``what``, or refuse naming the package."""
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError as e:
        raise _Refused(
            f"decoding {what} needs the {_PIP.get(module, module)!r} package, which is not "
            f"installed: pip install {_PIP.get(module, module)}"
        ) from e


_PIP = {"cbor2": "cbor2", "msgpack": "msgpack", "torch": "torch"}


def _open_image(last: str, data: bytes, max_pixels: int) -> Any:
    """Open ``data`` as the one Pillow format ``last`` names, refuse it past ``max_pixels``, load."""
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
    return img


def _image(last: str, data: bytes, spec: str, max_pixels: int) -> Any:
    """Decode an image member as ``spec`` says (:data:`IMAGE_SPECS`; ``"raw"``: bytes)."""
    if spec == "raw":
        return data
    kind, dtype, mode = IMAGE_SPECS[spec]
    img = _open_image(last, data, max_pixels)
    if img.mode != mode:  # else no convert() copy; the source is freed once converted
        img = img.convert(mode)
    if kind == "pil":
        return img
    if kind == "numpy":
        arr = np.array(img)  # (H, W) or (H, W, C) uint8, a writable copy (torch warns on read-only)
        del img
        # one pass, rounded as webdataset's astype(float32) / 255.0 (IEEE division, float32)
        return arr if dtype == "uint8" else np.divide(arr, _F255, dtype=np.float32)
    torch = _import("torch", f"the image spec {spec!r}")
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


_F255 = np.float32(255)


def _torch_load(data: bytes, allow_pickle: bool) -> Any:
    torch = _import("torch", "a .pth member")
    return torch.load(io.BytesIO(data), weights_only=not allow_pickle, map_location="cpu")


def _builtin(last: str, data: bytes, allow_pickle: bool, budget: _Budget) -> Any:
    """The built-in decoder of extension ``last`` (webdataset's ``basichandlers``); else bytes."""
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
    if last in _PICKLE_EXTS:
        if not allow_pickle:
            return data
        import pickle

        return pickle.loads(data)
    if last == "pth":
        return _torch_load(data, allow_pickle)
    if last in _MSGPACK_EXTS:
        return _import("msgpack", f"a .{last} member").unpackb(data)
    if last in _CBOR_EXTS:
        return _import("cbor2", f"a .{last} member").loads(data)
    return data


def _kind(ext: str) -> str:
    last = _last(strip_compression(ext))
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
    if last == "pth":
        return "a torch.save file"
    if last in _MSGPACK_EXTS:
        return "msgpack"
    if last in _CBOR_EXTS:
        return "CBOR"
    return "a pickle" if last in _PICKLE_EXTS else "bytes"


# -- handlers -------------------------------------------------------------------------------

Handler = Callable[[str, bytes], Any]
"""A webdataset-style member decoder ``f(key, data) -> value | None``.

``key`` is a dot plus the member's extension (``".jpg"``, ``".seg.png"``; for ``EXT.zst``
and ``EXT.gz`` members the inner ``".EXT"``, with ``data`` already decompressed); ``None``
means "not mine, try the next handler".
"""

DecodeSpec = Any
"""What ``decode=`` takes; see :func:`make_decoder`."""


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
    f(sample)``, ``def f(sample, size=224)``, :class:`ExtDecoder`) a sample function. Put a
    callable in a list (``decode=[f]``) to have it taken as a handler whatever its signature.

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


def _steps(decode: Any) -> tuple[Any, ...]:
    """Normalise ``decode`` to a tuple of steps: spec strings, handlers, :class:`ExtTable`."""
    items = list(decode) if isinstance(decode, (list, tuple)) else [decode]
    out: list[Any] = []
    for d in items:
        if isinstance(d, str):
            _check_mode(d)
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


def _need_torch(spec: str) -> None:
    import importlib.util

    if importlib.util.find_spec("torch") is None:
        raise ModuleNotFoundError(
            f"decode spec {spec!r} makes torch tensors, and torch is not installed: "
            f"pip install torch (or use the numpy spec {spec[5:] or 'rgb'!r})"
        )


class _HandlerFailed(Exception):
    def __init__(self, handler: Any, exc: Exception) -> None:
        super().__init__(str(exc))
        self.handler, self.exc = handler, exc


def _name(f: Any) -> str:
    return str(getattr(f, "__qualname__", None) or getattr(f, "__name__", None) or repr(f))


def _run(
    ext: str,
    data: bytes,
    steps: tuple[Any, ...],
    allow_pickle: bool,
    max_pixels: int,
    budget: _Budget,
) -> Any:
    """Decode one member: decompress (``.zst``, ``.gz``), the steps in order, the built-ins."""
    for sfx in compression_layers(ext):
        data = _DECOMPRESS[sfx](data, budget)
        ext = ext[: -len(sfx)]
    last = _last(ext)
    for step in steps:
        if step.__class__ is str:
            if last in IMAGE_EXTS:
                return _image(last, data, step, max_pixels)
            continue
        try:
            out = step("." + ext, data)
        except MemoryError:
            raise
        except Exception as e:
            raise _HandlerFailed(step, e) from e
        if out is not None:
            return out
    return _builtin(last, data, allow_pickle, budget)


def _decode_member(
    ext: str,
    data: bytes,
    steps: tuple[Any, ...],
    allow_pickle: bool,
    max_pixels: int,
    budget: _Budget,
    shard: str | None,
    key: str | None,
) -> Any:
    """:func:`_run`, every failure but MemoryError raised as a DecodeError naming the member."""
    try:
        return _run(ext, data, steps, allow_pickle, max_pixels, budget)
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
        if isinstance(e, _HandlerFailed):
            cause: Exception = e.exc
            cls, head = DecodeError, f"handler {_name(e.handler)} failed on {len(data)} bytes"
        else:
            cause = e
            if zs is not None and isinstance(e, zs.ZstdError):
                cls, kind = _zstd_decode_error(), "zstandard data"
            else:
                cls, kind = DecodeError, _kind(ext)
            head = f"cannot decode {len(data)} bytes as {kind}"
        msg = str(cause)
        if len(msg) > 300:
            msg = msg[:300] + "..."
        raise cls(f"{where}extension {ext!r}: {head}: {type(cause).__name__}: {msg}") from cause


def _strip_compressed(sample: dict[str, Any], shard: str | None, key: str | None) -> None:
    """Rename each decoded ``EXT.zst``/``EXT.gz`` entry of ``sample`` to ``EXT``, in place."""
    items = list(sample.items())
    sample.clear()
    for k, v in items:
        name = k if k.startswith("__") else strip_compression(k)
        if name in sample:
            where = (f"{shard}: " if shard is not None else "") + (
                f"sample {key!r}, " if key is not None else ""
            )
            raise DecodeError(
                f"{where}extensions {name!r} and {k!r} both decode to {name!r}; rename one "
                f"(or read the sample undecoded)"
            )
        sample[name] = v


def _check_mode(image: str) -> None:
    if image not in IMAGE_SPECS and image != "raw":
        raise ValueError(
            f"image mode {image!r}: expected one of {', '.join(IMAGE_SPECS)} or raw "
            f"(webdataset's image specs)"
        )


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
    zstd_dict: Any = None,
) -> Any:
    """Decode one member's bytes by extension (reader side), within the bounds.

    Args:
        ext: The member's extension (``"png"``, ``"seg.png"``, ``"npy.zst"``, ``"json.gz"``
            ...).
        data: The member's bytes.
        image: An image spec of :data:`IMAGE_SPECS` (webdataset's: ``"rgb8"`` is a ``uint8``
            array ``(H, W, 3)``, ``"rgb"`` a ``float32`` one in ``[0, 1]``, ``"torchrgb8"`` a
            ``uint8`` tensor ``(3, H, W)``, ``"pil"`` a loaded RGB ``PIL.Image.Image``, ...)
            or ``"raw"`` (images stay bytes). Defaults to ``"pil"``.
        allow_pickle: Unpickle ``pickle``/``pyd``/``pkl`` members (else they stay bytes) and
            load ``pth`` with ``torch.load(weights_only=False)`` (else ``weights_only=True``).
            Defaults to ``False``, because unpickling runs code from the file.
        max_image_pixels: Largest image decoded, in pixels (``width * height``), ``>= 1``.
            Defaults to :data:`MAX_IMAGE_PIXELS` (``2**25``), read at this call.
        max_decompressed_bytes: Bytes the ``.zst`` frames, ``.gz`` streams and ``.npz``
            entries of this member may expand to, ``>= 0``. Defaults to
            :data:`ZSTD_MAX_OUTPUT` (1 GiB), read at this call. (:class:`ExtDecoder` shares
            one such budget among a sample's members.)
        shard: Shard path, for error messages only. Defaults to ``None`` (not named).
        key: Sample key, for error messages only. Defaults to ``None`` (not named).
        zstd_dict: The shard's zstd dictionary (:meth:`tarindex.ShardReader.zstd_dict`), for
            ``.zst`` members compressed with one (FORMAT.md §7). Defaults to ``None``.

    Returns:
        ``int`` for ``cls``-like extensions, ``str`` for ``txt``, objects for ``json``,
        ``msgpack`` and ``cbor``, ``numpy.ndarray`` for ``npy``, a ``dict`` of arrays (bytes
        for non-``.npy`` entries) for ``npz``, ``torch.load``'s result for ``pth``, images as
        ``image`` says; other extensions stay bytes (see docs/DECODING.md for the table).

    Raises:
        DecodeError: The bytes do not decode as ``ext`` says (bad integer, UTF-8, JSON,
            nesting too deep for the JSON parser, ``.npy``/``.npz``, pickle); an image that is
            not in the format its extension names (:data:`IMAGE_FORMATS`) or has more than
            ``max_image_pixels`` pixels; a ``.npy`` header declaring more data than the member
            holds; a corrupt or truncated ``.gz`` stream; ``.zst``, ``.gz`` or ``.npz``
            output over ``max_decompressed_bytes``; a package
            needed for the extension (``torch``, ``msgpack``, ``cbor2``) not installed. The
            message names ``shard``, ``key`` and ``ext``; the decoder's exception is
            ``__cause__``. Zstandard failures raise ``ZstdDecodeError``, a subclass that is
            also a ``zstandard.ZstdError``.
        ValueError: An unknown ``image`` spec, or a bound below its minimum.
        MemoryError: Passed through unchanged.
    """
    _check_mode(image)
    pixels = _bound(
        "max_image_pixels", MAX_IMAGE_PIXELS if max_image_pixels is None else max_image_pixels, 1
    )
    limit = ZSTD_MAX_OUTPUT if max_decompressed_bytes is None else max_decompressed_bytes
    limit = _bound("max_decompressed_bytes", limit, 0)
    budget = _Budget(limit, zstd_dict)
    return _decode_member(ext, data, (image,), allow_pickle, pixels, budget, shard, key)


Decoder = Callable[[dict[str, Any]], dict[str, Any]]


def make_decoder(decode: DecodeSpec, allow_pickle: bool = False) -> Decoder | None:
    """Return a function that decodes a sample dict in place, or None for raw bytes.

    ``decode`` is what the datasets' ``decode=`` takes, webdataset's ``.decode(...)``
    arguments one for one:

    - ``None``, ``False``, ``"raw"``: no decoding (``bytes``).
    - an image spec of :data:`IMAGE_SPECS` (``"rgb8"``, ``"rgb"``, ``"torchrgb8"``, ``"pil"``,
      ...): images decoded so, every other member by the built-in decoder of its extension;
      ``True`` is ``"pil"``.
    - a handler ``f(key, data)`` (two required positional parameters): called first for each
      member with ``key`` = ``"." + extension`` (``".jpg"``); ``None`` means "not mine", and
      the built-ins come last (images stay bytes unless a spec or handler decodes them).
    - a dict ``{extension: f(data)}`` (:class:`ExtTable`).
    - a list (or tuple) of the three above, tried in order, then the built-ins; a callable in
      a list is always a handler.
    - a sample function ``f(sample) -> sample`` (one required positional parameter, e.g. an
      :class:`ExtDecoder` with other bounds): used as is.

    Args:
        decode: See above.
        allow_pickle: See :func:`decode_value`. Defaults to ``False``.

    Raises:
        ValueError: An unknown spec string or list item, or a callable whose signature is
            neither (see :func:`is_handler`).
        ModuleNotFoundError: A ``torch*`` spec without torch installed.
    """
    if decode is None or decode is False or decode == "raw":
        return None
    if decode is True:
        decode = "pil"
    if isinstance(decode, str) and decode not in IMAGE_SPECS:
        raise ValueError(
            f"decode={decode!r}: expected None, an image spec ({', '.join(IMAGE_SPECS)}), a "
            f"handler f(key, data), a dict {{extension: f(data)}}, a list of those, or a "
            f"sample function"
        )
    if callable(decode) and not isinstance(decode, (list, tuple, Mapping)):
        if not is_handler(decode):
            return decode  # type: ignore[no-any-return]
    return ExtDecoder(decode, allow_pickle)


class ExtDecoder:
    """Picklable decoder: decodes every non-``__`` entry of a sample, webdataset's way.

    For each member: ``.zst`` and ``.gz`` layers are decompressed, then ``decode``'s steps
    are tried in order (an image spec decodes the image extensions of :data:`IMAGE_FORMATS`;
    a handler is called as ``f("." + ext, data)``, ``None`` passing it on), then the built-in
    decoder of the extension (``cls`` -> ``int``, ``json`` -> objects, ...); see
    :func:`make_decoder` and :func:`decode_value`. Errors name the sample's ``__shard__`` and
    ``__key__``. The sample's ``.zst``, ``.gz`` and ``.npz`` members share one budget of
    ``max_decompressed_bytes``, so a sample of many small compressed members cannot expand
    past it either.

    Args:
        decode: An image spec, a handler, a dict ``{extension: f(data)}``, or a list of those
            (see :func:`make_decoder`). Defaults to ``"pil"``.
        allow_pickle: See :func:`decode_value`. Defaults to ``False``.
        max_image_pixels: Largest image decoded, in pixels (``width * height``), ``>= 1``.
            Defaults to :data:`MAX_IMAGE_PIXELS` (``2**25``) at construction.
        max_decompressed_bytes: Bytes all ``.zst`` frames, ``.gz`` streams and ``.npz``
            entries of one sample may expand to together, ``>= 0``. Defaults to
            :data:`ZSTD_MAX_OUTPUT` (1 GiB) at construction.

    Raises:
        ValueError: An unknown image spec or list item, or a bound below its minimum. Calls
            raise :class:`tarindex.DecodeError` as :func:`decode_value` does, also when a
            handler raises (its exception chained).
        ModuleNotFoundError: A ``torch*`` spec without torch installed.
    """

    def __init__(
        self,
        decode: DecodeSpec = "pil",
        allow_pickle: bool = False,
        *,
        max_image_pixels: int | None = None,
        max_decompressed_bytes: int | None = None,
    ) -> None:
        self.steps = _steps(decode)
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

    @property
    def image(self) -> str | None:
        """The first image spec among the steps (``None``: images stay bytes unless handled)."""
        return next((s for s in self.steps if isinstance(s, str)), None)

    def __call__(self, sample: dict[str, Any], zstd_dict: Any = None) -> dict[str, Any]:
        """Decode ``sample`` in place and return it.

        A ``EXT.zst`` or ``EXT.gz`` member is decompressed and decoded as ``EXT``, and its
        entry renamed ``EXT``: ``sample["json"]`` is the same object whether the shard stored
        ``json``, ``json.zst`` or ``json.gz`` (FORMAT.md §7; webdataset keeps the name
        ``json.gz`` for the decoded value).

        Args:
            sample: A raw sample (``__key__``, ``__shard__``, extension -> bytes).
            zstd_dict: The sample's shard's zstd dictionary
                (:meth:`tarindex.ShardReader.zstd_dict`; the datasets pass it). Defaults to
                ``None``.

        Raises:
            DecodeError: A member cannot be decoded within the bounds, or a handler raised
                (see :func:`decode_value`), or a sample holds both ``EXT`` and ``EXT.zst``
                (or ``EXT.gz``); the message names shard, key and extension.
        """
        budget = _Budget(self.max_decompressed_bytes, zstd_dict)
        shard, key = sample.get("__shard__"), sample.get("__key__")
        shard = None if shard is None else str(shard)
        key = None if key is None else str(key)
        steps, pickle_ok, pixels = self.steps, self.allow_pickle, self.max_image_pixels
        compressed = False
        for k, v in sample.items():
            if not k.startswith("__"):
                sample[k] = _decode_member(k, v, steps, pickle_ok, pixels, budget, shard, key)
                compressed = compressed or bool(compression_layers(k))
        if compressed:
            _strip_compressed(sample, shard, key)
        return sample

    def __repr__(self) -> str:
        steps = self.steps[0] if len(self.steps) == 1 else list(self.steps)
        return (
            f"ExtDecoder({steps!r}, allow_pickle={self.allow_pickle}, "
            f"max_image_pixels={self.max_image_pixels}, "
            f"max_decompressed_bytes={self.max_decompressed_bytes})"
        )
