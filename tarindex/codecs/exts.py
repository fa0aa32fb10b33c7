"""The one extension table: which member extensions are images, text, json, arrays, pickles...

Both sides read it: the decoders (:mod:`tarindex.codecs.decode`) and the encoders
(:mod:`tarindex.codecs.encode`), so ``decode(encode(x))`` gives ``x`` back, as webdataset's
``autodecode`` and writer agree. A member's codec is chosen by the *last* dot-component of its
extension (:func:`last_ext`: ``"seg.png"`` -> ``png``), after its compression suffixes
(:data:`COMPRESSION_SUFFIXES`) are taken off (docs/DECODING.md, docs/FORMAT.md §7).
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

__all__ = [
    "CBOR_EXTS",
    "COMPRESSION_SUFFIXES",
    "GZ_SUFFIX",
    "IMAGE_EXTS",
    "IMAGE_FORMATS",
    "INT_EXTS",
    "JSON_EXTS",
    "MSGPACK_EXTS",
    "MSGPACK_WRITE_EXTS",
    "NPY_EXTS",
    "NPZ_EXTS",
    "PICKLE_EXTS",
    "RENAMED_SUFFIXES",
    "SAFE_IMAGE_FORMATS",
    "SERIALIZER_EXTS",
    "TENBIN_EXTS",
    "TEXT_EXTS",
    "TORCH_EXTS",
    "ZST_SUFFIX",
    "last_ext",
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
        "jfif": "JPEG",
        "jpe": "JPEG",
        "tga": "TGA",
        "ico": "ICO",
    }
)
"""Image extension -> the Pillow format a member with it is written as, and tried first when
it is opened (then the other :data:`SAFE_IMAGE_FORMATS`, by content, as webdataset does)."""
SAFE_IMAGE_FORMATS = ("JPEG", "PNG", "WEBP", "GIF", "BMP", "TIFF", "PPM", "ICO")
"""The Pillow formats an image member may turn out to be by its content (a ``.jpg`` holding
PNG bytes is decoded as PNG, as webdataset's ``PIL.Image.open`` does): decoders inside Pillow,
each recognised by a magic number. EPS and PostScript are never among them (Pillow would start
Ghostscript), nor formats whose plugins are stubs, nor TGA: it has no magic number, so corrupt
bytes of another format could pass for a TGA image (wrong pixels instead of an error); a
``.tga`` member is opened as TGA, its extension's format, first."""
IMAGE_EXTS = frozenset(IMAGE_FORMATS)
"""The image extensions (keys of :data:`IMAGE_FORMATS`)."""
INT_EXTS = frozenset({"cls", "cls2", "index", "inx", "id"})
"""Decimal integers (``b"3"`` <-> ``3``): webdataset 1.0's ``basichandlers`` set (``idx``,
``label`` stay bytes there, so here too)."""
TEXT_EXTS = frozenset({"txt", "text", "transcript"})
"""UTF-8 text (webdataset's set: ``caption`` stays bytes)."""
JSON_EXTS = frozenset({"json", "jsn"})
"""JSON (UTF-8)."""
NPY_EXTS = frozenset({"npy"})
"""One numpy array (``np.save``, never pickled)."""
NPZ_EXTS = frozenset({"npz"})
"""A dict of numpy arrays (``np.savez_compressed``)."""
PICKLE_EXTS = frozenset({"pyd", "pickle", "pkl"})
"""Pickles: any value on the writer side; read back only with ``allow_pickle=True``."""
TORCH_EXTS = frozenset({"pth"})
"""``torch.save`` files (torch is imported only to encode or decode one)."""
MSGPACK_EXTS = frozenset({"mp", "msg"})
"""msgpack (the ``msgpack`` package), decoded: webdataset's decoders know ``mp`` and ``msg``."""
MSGPACK_WRITE_EXTS = MSGPACK_EXTS | {"msgpack"}
"""msgpack, encoded: webdataset's writer also encodes ``msgpack`` (which its readers, and
ours, then leave as bytes unless a handler decodes them)."""
TENBIN_EXTS = frozenset({"ten", "tb"})
"""webdataset's tenbin format (:mod:`tarindex.codecs.tenbin`): a list of numpy arrays."""
CBOR_EXTS = frozenset({"cbor"})
"""CBOR (the ``cbor2`` package)."""
SERIALIZER_EXTS = PICKLE_EXTS | TORCH_EXTS | MSGPACK_WRITE_EXTS | CBOR_EXTS
"""Extensions whose encoder serializes any value (``str`` and ``int`` too); bytes stay as is."""

ZST_SUFFIX = ".zst"
"""zstandard frames (RFC 8878), possibly with the shard's dictionary (FORMAT.md §7)."""
GZ_SUFFIX = ".gz"
"""gzip members (RFC 1952), webdataset's ``gzfilter``."""
COMPRESSION_SUFFIXES = (ZST_SUFFIX, GZ_SUFFIX)
RENAMED_SUFFIXES = (ZST_SUFFIX,)
"""Compression suffixes a decoded sample drops from the entry's name: ``json.zst`` is served
as ``json`` (tarindex's own compressed members, FORMAT.md §7), while ``txt.gz`` keeps its
name, decompressed, as webdataset serves it (:func:`tarindex.codecs.compress.decoded_name`)."""
"""Extension suffixes that mean compressed bytes of the inner extension: ``.zst``, ``.gz``.

The one table of both sides: readers decompress them (:func:`tarindex.codecs.compression_layers`),
decoded samples name the entry without them (:func:`tarindex.codecs.strip_compression`),
selection finds ``EXT`` stored as ``EXT.zst`` or ``EXT.gz`` (:class:`tarindex.codecs.select.ToTuple`), and
the encoder compresses with them (:data:`tarindex.codecs.compress.COMPRESSORS`). Case-sensitive,
as webdataset's ``.gz`` rule; layers may nest (``npy.gz.zst``); an extension that is only the
suffix (a member ``x.gz``) is not a compressed member (it stays bytes).
"""


def last_ext(ext: str) -> str:
    """The dot-component that chooses the codec, lower-cased: ``"seg.PNG"`` -> ``"png"``."""
    return ext.rsplit(".", 1)[-1].lower()
