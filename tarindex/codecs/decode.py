"""Decode member bytes to values (readers), by extension; encoding is :mod:`tarindex.codecs.encode`.

The codec is chosen by the *last* dot-component of the extension (``"seg.png"`` -> ``png``),
as webdataset does, from the one extension table (:mod:`tarindex.codecs.exts`). A trailing
compression suffix (``.zst``, ``.gz``: :data:`tarindex.codecs.COMPRESSION_SUFFIXES`) means
compressed bytes of the inner extension, taken off first (:mod:`tarindex.codecs.compress`,
``.zst`` possibly with the shard's trained dictionary, docs/FORMAT.md §7, passed by the
datasets as ``ExtDecoder(sample, zstd_dict)``); a decoded sample names such an entry without
the suffix. Images go through Pillow. Unpickling (``pickle``, ``pyd``) happens only with
``allow_pickle=True``: pickle runs arbitrary code.

``decode=`` takes webdataset's image specs, handlers ``f(key, data)``, dicts ``{extension:
f(data)}`` and lists of those (:mod:`tarindex.codecs.handlers`, docs/DECODING.md), tried in
order before the built-in decoders of :func:`decode_value`; see :func:`make_decoder`. torch is
imported only when a ``torch*`` spec or a ``.pth`` member is decoded, so ``import tarindex``
works without it.

**Hostile members.** Member bytes are untrusted, and decoding stays bounded:

- An image member is opened only as the Pillow format its extension names
  (:data:`tarindex.codecs.IMAGE_FORMATS`: ``jpg`` -> ``JPEG``, ``png`` -> ``PNG``, ...),
  never sniffed, so EPS or PostScript bytes named ``.jpg`` are refused and Ghostscript (or
  any other program) is never started. A ``.jpg`` that holds PNG bytes is refused too.
- An image of more than :data:`MAX_IMAGE_PIXELS` pixels (``width * height``, read from its
  header) is refused before its pixels are decoded.
- The bytes that ``.zst`` frames, ``.gz`` streams and ``.npz`` entries expand to count
  against one budget per sample, :data:`ZSTD_MAX_OUTPUT`, shared by all its members: checked
  before the output is allocated (``.zst``, ``.npz``), or counted while inflating and refused
  once past the budget (``.gz``, holding at most 64 MiB of output until it is known to fit).
- A ``.npy`` header that declares more data than the member holds is refused before
  allocating.

To raise a bound, pass a decoder to the dataset, e.g.
``TarDataset(src, decode=ExtDecoder("rgb8", max_image_pixels=1 << 27))``, or set this
module's constant (``tarindex.codecs.decode.MAX_IMAGE_PIXELS``) before the dataset is
constructed (an :class:`ExtDecoder` takes the constants' values when it is created and
carries them to DataLoader workers). To decode images above Pillow's own bound
(``PIL.Image.MAX_IMAGE_PIXELS``, 89,478,485 pixels, with an error at twice that), raise that
too.

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
from collections.abc import Callable, Collection, Mapping
from typing import Any

import numpy as np

from ..errors import DecodeError
from .compress import (
    Budget,
    Refused,
    decoded_name,
    decompress_layers,
    strip_compression,
    zstd_decode_error,
)
from .exts import (
    CBOR_EXTS,
    IMAGE_EXTS,
    IMAGE_FORMATS,
    INT_EXTS,
    JSON_EXTS,
    MSGPACK_EXTS,
    NPY_EXTS,
    NPZ_EXTS,
    PICKLE_EXTS,
    RENAMED_SUFFIXES,
    TENBIN_EXTS,
    TEXT_EXTS,
    TORCH_EXTS,
    last_ext,
)
from .handlers import (
    IMAGE_SPECS,
    DecodeSpec,
    check_spec,
    decode_image,
    decode_steps,
    import_optional,
    is_handler,
)
from .image import ImageDecode

__all__ = [
    "MAX_IMAGE_PIXELS",
    "ZSTD_MAX_OUTPUT",
    "Decoder",
    "ExtDecoder",
    "decode_value",
    "make_decoder",
]

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
``.gz``: counted while inflating in 1 MiB steps, see :func:`tarindex.codecs.compress.gunzip`).
A 100 KB tar sample of three members that each expand to 1 GiB costs 1 GiB (measured), not 3:
the second member is refused. Read by :func:`decode_value` at each call (a budget for that
one member) and by :class:`ExtDecoder` when it is created.
"""
_NPY_MAGIC = b"\x93NUMPY"


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
            raise Refused(
                f".npy header declares shape {shape} of {dtype} = {need} bytes, but the "
                f"member holds {have} bytes of data"
            )
    bio.seek(0)
    return np.load(bio, allow_pickle=allow_pickle)


def _npz(data: bytes, allow_pickle: bool, budget: Budget) -> dict[str, Any]:
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


def _numpy_globals() -> list[Any]:
    """What ``torch.load(weights_only=True)`` needs for numpy arrays and scalars.

    The array reconstructor, ``ndarray``, ``dtype``, the scalar constructor and every numeric
    dtype class: never ``object`` arrays (their items would be pickles). torch's own advice
    for numpy in checkpoints (``torch.serialization.safe_globals``).
    """
    import importlib

    try:  # the names torch's docs list for numpy arrays
        names = vars(importlib.import_module("numpy._core.multiarray"))  # numpy 2
    except ImportError:
        names = vars(importlib.import_module("numpy.core.multiarray"))  # numpy 1
    out: list[Any] = [np.ndarray, np.dtype, names["_reconstruct"], names["scalar"]]
    dtypes = getattr(np, "dtypes", None)  # numpy >= 1.25
    if dtypes is not None:
        out += [
            getattr(dtypes, n)
            for n in dir(dtypes)
            if n.endswith("DType") and n != "ObjectDType"
        ]
    else:
        out += list({type(np.dtype(c)) for c in "?bhilqBHILQefdgFDGSUVMm"})
    return out


def _torch_load(data: bytes, allow_pickle: bool) -> Any:
    torch = import_optional("torch", "a .pth member")
    if allow_pickle:
        return torch.load(io.BytesIO(data), weights_only=False, map_location="cpu")
    safe = getattr(torch.serialization, "safe_globals", None)  # torch >= 2.5
    if safe is None:
        return torch.load(io.BytesIO(data), weights_only=True, map_location="cpu")
    with safe(_numpy_globals()):
        return torch.load(io.BytesIO(data), weights_only=True, map_location="cpu")


def _refuse_pickle(last: str) -> None:
    raise Refused(
        f"a .{last} member is a pickle, and unpickling runs code from the file; pass "
        f"allow_pickle=True if you trust this shard, or leave the member out "
        f"(fields=, select=, or decode only= others)"
    )


def _builtin(last: str, data: bytes, allow_pickle: bool, budget: Budget) -> Any:
    """The built-in decoder of extension ``last`` (webdataset's ``basichandlers``); else bytes."""
    if last in INT_EXTS:
        return int(data)
    if last in TEXT_EXTS:
        return data.decode("utf-8")
    if last in JSON_EXTS:
        return json.loads(data)  # nesting too deep: RecursionError, wrapped like the rest
    if last in NPY_EXTS:
        return _npy(data, allow_pickle)
    if last in NPZ_EXTS:
        return _npz(data, allow_pickle, budget)
    if last in PICKLE_EXTS:
        if not allow_pickle:
            _refuse_pickle(last)
        import pickle

        return pickle.loads(data)
    if last in TORCH_EXTS:
        return _torch_load(data, allow_pickle)
    if last in TENBIN_EXTS:
        from .tenbin import tenbin_decode

        return tenbin_decode(data)
    if last in MSGPACK_EXTS:
        return import_optional("msgpack", f"a .{last} member").unpackb(data)
    if last in CBOR_EXTS:
        return import_optional("cbor2", f"a .{last} member").loads(data)
    return _NO_DECODER


_NO_DECODER: Any = object()
"""What :func:`_builtin` returns for an extension it has no decoder for (the bytes stay)."""


def _kind(ext: str) -> str:
    last = last_ext(strip_compression(ext))
    if last in IMAGE_EXTS:
        return f"a {IMAGE_FORMATS[last]} image"
    if last in INT_EXTS:
        return "an integer"
    if last in TEXT_EXTS:
        return "UTF-8 text"
    if last in JSON_EXTS:
        return "JSON"
    if last in NPY_EXTS or last in NPZ_EXTS:
        return f"a .{last} file"
    if last in TORCH_EXTS:
        return "a torch.save file"
    if last in TENBIN_EXTS:
        return "tenbin"
    if last in MSGPACK_EXTS:
        return "msgpack"
    if last in CBOR_EXTS:
        return "CBOR"
    return "a pickle" if last in PICKLE_EXTS else "bytes"


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
    budget: Budget,
    at: tuple[int, int] = (0, 0),
    must: bool = False,
) -> Any:
    """Decode one member: decompress (``.zst``, ``.gz``), the steps in order, the built-ins.

    ``at`` is ``(epoch, index)`` of the sample, for :class:`ImageDecode` steps. ``must``:
    an extension nothing decodes is an error (webdataset's ``must_decode``), else its bytes.
    """
    ext, data = decompress_layers(ext, data, budget)
    last = last_ext(ext)
    for step in steps:
        if step.__class__ is str:
            if last in IMAGE_EXTS:
                return decode_image(last, data, step, max_pixels)
            continue
        if step.__class__ is ImageDecode:
            if last in IMAGE_EXTS:
                return step.decode(
                    last, data, epoch=at[0], index=at[1], max_pixels=max_pixels
                )
            continue
        try:
            out = step("." + ext, data)
        except MemoryError:
            raise
        except Exception as e:
            raise _HandlerFailed(step, e) from e
        if out is not None:
            return out
    out = _builtin(last, data, allow_pickle, budget)
    if out is _NO_DECODER:
        if must:
            raise Refused(
                f"no decoder for extension {last!r} (must_decode=True): add a handler or "
                f"an xdecode pattern for it, or pass must_decode=False to keep its bytes"
            )
        return data
    return out


def _decode_member(
    ext: str,
    data: bytes,
    steps: tuple[Any, ...],
    allow_pickle: bool,
    max_pixels: int,
    budget: Budget,
    shard: str | None,
    key: str | None,
    at: tuple[int, int] = (0, 0),
    must: bool = False,
) -> Any:
    """:func:`_run`, every failure but MemoryError raised as a DecodeError naming the member."""
    try:
        return _run(ext, data, steps, allow_pickle, max_pixels, budget, at, must)
    except MemoryError:
        raise
    except Exception as e:
        where = (f"{shard}: " if shard is not None else "") + (
            f"sample {key!r}, " if key is not None else ""
        )
        zs = sys.modules.get("zstandard")
        if isinstance(e, Refused):
            cls = zstd_decode_error() if e.zstd else DecodeError
            raise cls(f"{where}extension {ext!r}: {e}") from e.__cause__
        if isinstance(e, _HandlerFailed):
            cause: Exception = e.exc
            cls, head = DecodeError, f"handler {_name(e.handler)} failed on {len(data)} bytes"
        else:
            cause = e
            if zs is not None and isinstance(e, zs.ZstdError):
                cls, kind = zstd_decode_error(), "zstandard data"
            else:
                cls, kind = DecodeError, _kind(ext)
            head = f"cannot decode {len(data)} bytes as {kind}"
        msg = str(cause)
        if len(msg) > 300:
            msg = msg[:300] + "..."
        raise cls(f"{where}extension {ext!r}: {head}: {type(cause).__name__}: {msg}") from cause


def _strip_compressed(
    sample: dict[str, Any], shard: str | None, key: str | None, done: set[str]
) -> None:
    """Rename each decoded (in ``done``) ``EXT.zst`` entry of ``sample`` to ``EXT``, in place.

    ``EXT.gz`` keeps its name, as in webdataset (:func:`tarindex.codecs.compress.decoded_name`);
    an entry left undecoded (``only=``) keeps its name, its bytes still compressed.
    """
    items = list(sample.items())
    sample.clear()
    for k, v in items:
        name = decoded_name(k) if k in done else k
        if name in sample:
            where = (f"{shard}: " if shard is not None else "") + (
                f"sample {key!r}, " if key is not None else ""
            )
            raise DecodeError(
                f"{where}extensions {name!r} and {k!r} both decode to {name!r}; rename one "
                f"(or read the sample undecoded)"
            )
        sample[name] = v


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
    check_spec(image)
    pixels = _bound(
        "max_image_pixels", MAX_IMAGE_PIXELS if max_image_pixels is None else max_image_pixels, 1
    )
    limit = ZSTD_MAX_OUTPUT if max_decompressed_bytes is None else max_decompressed_bytes
    limit = _bound("max_decompressed_bytes", limit, 0)
    budget = Budget(limit, zstd_dict)
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
    - an :class:`~tarindex.codecs.image.ImageDecode` spec: images decoded straight to the
      model's size (crop, DCT-scaled decode, resize, flip), drawn per ``(seed, epoch,
      __index__)``; the epoch is the decoder's (:meth:`ExtDecoder.set_epoch`).
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
        only: Decode only the members with these extensions (names as the sample has them
            or as decoding serves them: ``"json"`` selects a ``json.zst`` member too; e.g.
            ``["jpg", "json"]``, or one space-separated string), webdataset's
            ``decode(..., only=...)``; the others stay as stored, name and bytes (a
            ``json.zst`` left out stays compressed under that name; a pickle left out is not
            an error). Defaults to ``None`` (every member).
        must_decode: A member that no step and no built-in decodes (it would stay bytes)
            raises :class:`tarindex.DecodeError`, webdataset's ``xdecode(must_decode=True)``.
            Defaults to ``False``.

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
        only: str | Collection[str] | None = None,
        must_decode: bool = False,
    ) -> None:
        self.steps = decode_steps(decode)
        self.allow_pickle = allow_pickle
        if isinstance(only, str):
            only = only.split()
        if only is not None and not all(isinstance(e, str) and e for e in only):
            raise ValueError(f"only={only!r}: expected extensions, e.g. ['jpg', 'json']")
        self.only: frozenset[str] | None = None if only is None else frozenset(only)
        """The extensions decoded (``None``: all)."""
        self.must_decode = bool(must_decode)
        """Whether a member no decoder takes is an error (else its bytes stay)."""
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
        self.epoch = 0
        """The epoch :class:`ImageDecode` steps draw their random choices for (:meth:`set_epoch`)."""

    def set_epoch(self, epoch: int) -> None:
        """Draw the random crops and flips of :class:`ImageDecode` steps for ``epoch``.

        The datasets call it: ``set_epoch`` of the map-style dataset, and each ``__iter__`` of
        a streaming one (with the epoch its plan plays). Without such steps it changes
        nothing.

        Raises:
            ValueError: If ``epoch`` is negative or ``>= 2**64``.
        """
        if not 0 <= int(epoch) < 1 << 64:
            raise ValueError(f"epoch={epoch!r}: expected an integer in [0, 2**64)")
        self.epoch = int(epoch)

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
        budget = Budget(self.max_decompressed_bytes, zstd_dict)
        shard, key = sample.get("__shard__"), sample.get("__key__")
        shard = None if shard is None else str(shard)
        key = None if key is None else str(key)
        steps, pickle_ok, pixels = self.steps, self.allow_pickle, self.max_image_pixels
        at = (self.epoch, int(sample.get("__index__", 0)))
        only, must = self.only, self.must_decode
        renamed: set[str] = set()
        for k, v in sample.items():
            if not k.startswith("__") and (only is None or k in only or decoded_name(k) in only):
                sample[k] = _decode_member(
                    k, v, steps, pickle_ok, pixels, budget, shard, key, at, must
                )
                if k.endswith(RENAMED_SUFFIXES):
                    renamed.add(k)
        if renamed:
            _strip_compressed(sample, shard, key, renamed)
        return sample

    def __repr__(self) -> str:
        steps = self.steps[0] if len(self.steps) == 1 else list(self.steps)
        extra = "" if self.only is None else f", only={sorted(self.only)!r}"
        extra += ", must_decode=True" if self.must_decode else ""
        return (
            f"ExtDecoder({steps!r}, allow_pickle={self.allow_pickle}, "
            f"max_image_pixels={self.max_image_pixels}, "
            f"max_decompressed_bytes={self.max_decompressed_bytes}{extra})"
        )
