"""Decode and encode member bytes by extension: one extension table, compression, selection.

Modules, lowest first (each imports only those above it; decode and encode never each other):

- :mod:`~tarindex.codecs.exts`: the one extension table (images, text, json, arrays, pickles,
  torch, msgpack, cbor, the compression suffixes), read by both sides.
- :mod:`~tarindex.codecs.compress`: the ``.zst`` and ``.gz`` layers, both ways, within a
  per-sample decompression budget; the shard's zstd dictionary (docs/FORMAT.md §7).
- :mod:`~tarindex.codecs.handlers`: webdataset's image specs (``"rgb8"``, ``"torchrgb"``,
  ``"pil"``, ...) and ``(key, data)`` handlers.
- :mod:`~tarindex.codecs.jpeg`: JPEG decoding at a DCT scale (simplejpeg/libjpeg-turbo or
  Pillow, :func:`image_backend`); :mod:`~tarindex.codecs.image`: :class:`ImageDecode`, images
  decoded straight to the model's size (crop box, scaled decode, resize, flip).
- :mod:`~tarindex.codecs.decode`: the built-in decoders by extension, :func:`decode_value`,
  :class:`ExtDecoder`, :func:`make_decoder`; its bounds ``MAX_IMAGE_PIXELS`` and
  ``ZSTD_MAX_OUTPUT`` are module constants there (set ``tarindex.codecs.decode.X``).
- :mod:`~tarindex.codecs.encode`: :func:`encode_value`, the writer's side.
- :mod:`~tarindex.codecs.select`: webdataset's ``to_tuple``/``extract_keys`` (:class:`ToTuple`),
  ``rename`` (:class:`Rename`), ``rename_keys`` (:class:`RenameKeys`).
- :mod:`~tarindex.codecs.xdecode`: webdataset's ``xdecode`` (:class:`XDecode`), decoders by
  glob that read a file object; :mod:`~tarindex.codecs.tenbin`: the ``.ten`` format.

``ZstdDecodeError`` (a :class:`tarindex.DecodeError` that is also a ``zstandard.ZstdError``)
is resolved on first use, so ``import tarindex`` does not import zstandard.
"""

from __future__ import annotations

from typing import Any

from ..errors import DecodeError
from .compress import (
    compression_layers,
    gzip_compress,
    strip_compression,
    zstd_compress,
    zstd_compressor,
    zstd_decode_error,
)
from .decode import Decoder, ExtDecoder, decode_value, make_decoder
from .encode import JPEG_QUALITY, ImageEncoder, encode_value, image_from_array, shrink_image
from .exts import COMPRESSION_SUFFIXES, IMAGE_EXTS, IMAGE_FORMATS, PICKLE_EXTS, SERIALIZER_EXTS
from .handlers import IMAGE_MODES, IMAGE_SPECS, DecodeSpec, ExtTable, Handler, is_handler
from .image import ImageDecode
from .jpeg import image_backend
from .select import (
    Rename,
    RenameKeys,
    Selection,
    ToTuple,
    make_select,
    rename,
    rename_keys,
    select_fields,
    to_tuple,
)
from .xdecode import XDecode, xdecode

__all__ = [
    "COMPRESSION_SUFFIXES",
    "IMAGE_EXTS",
    "IMAGE_FORMATS",
    "IMAGE_MODES",
    "IMAGE_SPECS",
    "JPEG_QUALITY",
    "PICKLE_EXTS",
    "SERIALIZER_EXTS",
    "DecodeError",
    "DecodeSpec",
    "Decoder",
    "ExtDecoder",
    "ExtTable",
    "Handler",
    "ImageDecode",
    "ImageEncoder",
    "Rename",
    "RenameKeys",
    "Selection",
    "ToTuple",
    "XDecode",
    "ZstdDecodeError",
    "compression_layers",
    "decode_value",
    "encode_value",
    "gzip_compress",
    "image_backend",
    "image_from_array",
    "is_handler",
    "make_decoder",
    "make_select",
    "rename",
    "rename_keys",
    "select_fields",
    "shrink_image",
    "strip_compression",
    "to_tuple",
    "xdecode",
    "zstd_compress",
    "zstd_compressor",
]


def __getattr__(name: str) -> Any:
    """Resolve ``ZstdDecodeError`` lazily (it subclasses ``zstandard.ZstdError``)."""
    if name == "ZstdDecodeError":
        return zstd_decode_error()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
