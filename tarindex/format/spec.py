"""Constants of the tarindex on-disk format (docs/FORMAT.md) and of the tar specs we rely on.

Every constant is defined here only; each cites the section of docs/FORMAT.md or the tar
spec (POSIX.1-2001 pax/ustar, GNU tar manual "Basic Tar Format") it comes from.
"""

from __future__ import annotations

import struct

import numpy as np

__all__ = [
    "MAGIC",
    "END_MAGIC",
    "FORMAT_MAJOR",
    "FORMAT_MINOR",
    "HEADER",
    "FOOTER",
    "ALIGN",
    "OFFSET_DTYPE",
    "EXT_ID_DTYPE",
    "MAX_SAMPLES",
    "MAX_MEMBERS",
    "MAX_BLOB_BYTES",
    "FINGERPRINT_BYTES",
    "INDEX_SUFFIX",
    "BLOCK",
    "USTAR_MAX_SIZE",
]

# --- sidecar index (FORMAT.md §2) -------------------------------------------------------------
MAGIC = b"\x89TIDX\r\n\x1a"  # §2.1: non-ASCII first byte and CR/LF/^Z, as PNG does
END_MAGIC = b"TIDX"  # §2.7: last 4 bytes of every index file
FORMAT_MAJOR = 1  # §2.1: readers refuse an unknown major version
FORMAT_MINOR = 0  # §2.1: minor versions only add fields; readers ignore what they do not know

# §2.1: magic, major, minor, flags, n_samples, n_members, n_exts, key_bytes, ext_bytes,
#       meta_bytes, tar_size, head_crc32, tail_crc32
HEADER = struct.Struct("<8sHHIQQQQQQQII")
FOOTER = struct.Struct("<I4s")  # §2.7: crc32 of all preceding bytes, END_MAGIC
ALIGN = 8  # §2: every section starts on an 8-byte boundary (numpy memmaps it in place)
OFFSET_DTYPE = np.dtype("<u8")  # §2.2-2.5: offsets, sizes and pointers, never native order
EXT_ID_DTYPE = np.dtype("<u4")  # §2.4
MAX_SAMPLES = 1 << 40  # §2.1: checked before allocating anything
MAX_MEMBERS = 1 << 42  # §2.1
MAX_BLOB_BYTES = 1 << 44  # key/ext/meta lengths: a reader limit, not stated in FORMAT.md
FINGERPRINT_BYTES = 4096  # §3: crc32 of the first and of the last 4096 bytes of the tar
INDEX_SUFFIX = ".tidx"  # §1: the index of ``x.tar`` is ``x.tar.tidx``

# --- tar (POSIX.1-1988 ustar, POSIX.1-2001 pax, GNU tar manual) --------------------------------
BLOCK = 512  # every tar header and every member's padded data is a multiple of 512 bytes
USTAR_MAX_SIZE = 8**11 - 1  # 11 octal digits in the ustar size field; larger sizes need pax
