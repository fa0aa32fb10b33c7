"""webdataset's tenbin format (``.ten``, ``.tb`` members): a list of numpy arrays, both ways.

The layout (webdataset ``tenbin.py``): a sequence of chunks, each ``magic (8 bytes
"~TenBin~") | nbytes (int64) | nbytes of payload, zero-padded to a multiple of 64``. Arrays
come in pairs of chunks, a header then the data; a header is int64 words ``dtype code (8
ASCII bytes, e.g. "f4") | name (8 ASCII bytes) | ndim | dim[0] ... dim[ndim-1]``. webdataset
writes the integers in the machine's byte order; this module reads and writes little-endian
(what every machine webdataset runs on writes). Member bytes are untrusted: every length,
rank and shape is checked against the bytes present before anything is allocated.
"""

from __future__ import annotations

import math
import struct
from typing import Any

import numpy as np

__all__ = ["tenbin_decode", "tenbin_encode"]

_MAGIC = b"~TenBin~"
_CODES = {
    "f2": "float16",
    "f4": "float32",
    "f8": "float64",
    "i1": "int8",
    "i2": "int16",
    "i4": "int32",
    "i8": "int64",
    "u1": "uint8",
    "u2": "uint16",
    "u4": "uint32",
    "u8": "uint64",
}
"""The dtypes tenbin knows (webdataset spells ``uint32`` ``unit32`` in its table, so it
cannot write one; it reads ``u4`` here)."""
_NAMES = {v: k for k, v in _CODES.items()}
_MAX_RANK = 9  # webdataset's encode_header refuses ndim >= 10


def _pad64(n: int) -> int:
    return -(-n // 64) * 64


def _chunks(buf: bytes) -> list[memoryview]:
    out: list[memoryview] = []
    mv = memoryview(buf)
    pos, total = 0, len(buf)
    while pos < total:
        if pos + 16 > total:
            raise ValueError(f"tenbin: a chunk header cut at byte {pos} of {total}")
        if bytes(mv[pos : pos + 8]) != _MAGIC:
            raise ValueError(f"tenbin: no magic {_MAGIC!r} at byte {pos}")
        (n,) = struct.unpack_from("<q", buf, pos + 8)
        if n < 0 or pos + 16 + n > total:
            raise ValueError(f"tenbin: chunk at byte {pos} declares {n} bytes, {total - pos - 16} left")
        out.append(mv[pos + 16 : pos + 16 + n])
        pos += 16 + _pad64(n)
    return out


def _word(v: int) -> str:
    return struct.pack("<q", v).rstrip(b"\0").decode("ascii")


def tenbin_decode(data: bytes) -> list[np.ndarray[Any, Any]]:
    """Decode a tenbin buffer to its list of arrays (read-only views of ``data``).

    Raises:
        ValueError: A chunk without the magic, a length past the end, an odd number of
            chunks, an unknown dtype code, a rank above 9 or a negative dimension, or a data
            chunk whose size is not the header's shape times the dtype's size.
    """
    chunks = _chunks(bytes(data))
    if len(chunks) % 2:
        raise ValueError(f"tenbin: {len(chunks)} chunks; arrays are header + data pairs")
    out: list[np.ndarray[Any, Any]] = []
    for k in range(0, len(chunks), 2):
        head, body = chunks[k], chunks[k + 1]
        if len(head) < 24 or len(head) % 8:
            raise ValueError(f"tenbin: array {k // 2}: a header of {len(head)} bytes")
        words = struct.unpack(f"<{len(head) // 8}q", head)
        try:
            code = _word(words[0])
        except UnicodeDecodeError:
            code = "?"
        if code not in _CODES:
            raise ValueError(f"tenbin: array {k // 2}: unknown dtype code {code!r}")
        rank = words[2]
        if not 0 <= rank <= _MAX_RANK or len(words) < 3 + rank:
            raise ValueError(f"tenbin: array {k // 2}: rank {rank} with {len(words) - 3} dims")
        shape = tuple(words[3 : 3 + rank])
        if any(d < 0 for d in shape):
            raise ValueError(f"tenbin: array {k // 2}: negative dimension in {shape}")
        dtype = np.dtype(_CODES[code]).newbyteorder("<")
        need = math.prod(shape) * dtype.itemsize
        if need != len(body):
            raise ValueError(
                f"tenbin: array {k // 2}: shape {shape} of {dtype} is {need} bytes, the data "
                f"chunk holds {len(body)}"
            )
        out.append(np.frombuffer(body, dtype=dtype).reshape(shape))
    return out


def tenbin_encode(value: Any) -> bytes:
    """Encode one numpy array, or a list of them, as webdataset's writer does for ``.ten``.

    Raises:
        TypeError: Not an array or a list of arrays.
        ValueError: A dtype tenbin does not know (e.g. ``bool``, ``object``) or a rank above 9.
    """
    arrays = value if isinstance(value, list) else [value]
    out = bytearray()
    for a in arrays:
        if not isinstance(a, np.ndarray):
            raise TypeError(f"tenbin takes numpy arrays or a list of them, got {type(a).__name__}")
        name = _NAMES.get(a.dtype.name)
        if name is None:
            raise ValueError(f"tenbin: dtype {a.dtype} not one of {', '.join(_NAMES)}")
        if a.ndim > _MAX_RANK:
            raise ValueError(f"tenbin: {a.ndim} dimensions, at most {_MAX_RANK}")
        code = struct.unpack("<q", name.encode("ascii").ljust(8, b"\0"))[0]
        head = np.array([code, 0, a.ndim, *a.shape], "<i8").tobytes()
        body = np.ascontiguousarray(a, a.dtype.newbyteorder("<")).tobytes()
        for chunk in (head, body):
            out += _MAGIC + struct.pack("<q", len(chunk)) + chunk
            out += bytes(_pad64(len(chunk)) - len(chunk))
    return bytes(out)
