"""Tar header bytes: build the writer's headers, parse headers from any common tool.

Sources: POSIX.1-1988 ustar and POSIX.1-2001 pax (IEEE Std 1003.1, "pax" utility,
"ustar Interchange Format" and "pax Interchange Format"), and the GNU tar manual,
"Basic Tar Format" (GNU LongName/LongLink, base-256 numbers, old GNU header).

Layout of the 512-byte header block (offset, length):
name 0/100, mode 100/8, uid 108/8, gid 116/8, size 124/12, mtime 136/12, chksum 148/8,
typeflag 156/1, linkname 157/100, magic 257/6, version 263/2, uname 265/32, gname 297/32,
devmajor 329/8, devminor 337/8, prefix 345/155 (ustar only; GNU uses the area differently).
"""

from __future__ import annotations

__all__ = [
    "BLOCK",
    "ZERO_BLOCK",
    "build_member_header",
    "parse_number",
    "header_name",
    "USTAR_MAGIC",
    "checksum_ok",
    "parse_pax",
    "compression_of",
    "padded",
    "parse_octal_rows",
    "header_checksums",
    "SPARSE_EXT_FLAG",
]

import numpy as np
from numpy.typing import NDArray

from .spec import BLOCK, USTAR_MAX_SIZE

SPARSE_EXT_FLAG = (
    482  # old GNU sparse header: "isextended" byte (GNU tar manual, "Basic Tar Format")
)

ZERO_BLOCK = bytes(BLOCK)
_USTAR_MAGIC = b"ustar\x0000"  # POSIX ustar: magic "ustar\0" + version "00"

# Leading bytes of compressed streams (RFC 1952, bzip2, xz, RFC 8878, lz4 frame).
_COMPRESSION_MAGIC = (
    (b"\x1f\x8b", "gzip", "gunzip"),
    (b"BZh", "bzip2", "bunzip2"),
    (b"\xfd7zXZ\x00", "xz", "unxz"),
    (b"\x28\xb5\x2f\xfd", "zstd", "unzstd"),
    (b"\x04\x22\x4d\x18", "lz4", "unlz4"),
)


def padded(size: int) -> int:
    """Return ``size`` rounded up to a whole number of 512-byte blocks (bytes)."""
    return (size + BLOCK - 1) & ~(BLOCK - 1)


USTAR_MAGIC = b"ustar\x00"  # POSIX ustar magic (GNU headers have "ustar  \0": no prefix field)


def header_name(block: bytes) -> bytes:
    r"""Return the member name stored in a header block: ``name``, with the ustar ``prefix``.

    POSIX ustar: when the magic is ``"ustar\0"`` and ``prefix`` (bytes 345-500) is not empty,
    the path is ``prefix + "/" + name``. GNU headers use that area for other fields. pax
    ``path`` and GNU LongName records override this name; the caller applies them.
    """
    name = block[0:100].split(b"\0", 1)[0]
    if block[345] and block[257:263] == USTAR_MAGIC:
        name = block[345:500].split(b"\0", 1)[0] + b"/" + name
    return name


def compression_of(head: bytes) -> tuple[str, str] | None:
    """Return ``(format, decompress command)`` if ``head`` starts a compressed stream, else None."""
    for magic, fmt, cmd in _COMPRESSION_MAGIC:
        if head.startswith(magic):
            return fmt, cmd
    return None


def parse_number(field: bytes) -> int:
    """Parse a numeric header field: octal with any NUL/space terminators, or GNU base-256.

    GNU tar manual, "Basic Tar Format": if the first byte has its high bit set, the field is
    a big-endian two's-complement binary number (0x80 positive, 0xff negative).

    Args:
        field: The raw field bytes (for example ``block[124:136]``, the size).

    Returns:
        The value; ``0`` for an empty or all-NUL/space field.

    Raises:
        ValueError: If the field is neither (the caller adds the file and offset).
    """
    if field and field[0] & 0x80:
        value = int.from_bytes(field[1:], "big")
        if field[0] == 0xFF:  # negative (only for times; never valid for sizes)
            value -= 1 << (8 * (len(field) - 1))
        return value
    # leading spaces, octal digits, then a NUL or space terminator (or the end of the field);
    # bytes after the first NUL are ignored, as GNU tar and tarfile do
    text = field.split(b"\0", 1)[0].strip(b" ")
    if not text:
        return 0
    if text.translate(None, b"01234567"):
        raise ValueError(f"not an octal number: {field!r}")
    return int(text, 8)


def checksum_ok(block: bytes) -> bool:
    """Return True if a header's checksum matches, unsigned (POSIX) or signed (old Sun).

    The checksum is the sum of all 512 bytes with the chksum field (148:156) taken as spaces
    (POSIX ustar, "chksum"; GNU tar manual, "Basic Tar Format").
    """
    try:
        want = parse_number(block[148:156])
    except ValueError:
        return False
    unsigned = sum(block) - sum(block[148:156]) + 8 * 32
    if want == unsigned:
        return True
    signed = sum((b - 256 if b > 127 else b) for b in block[:148] + block[156:]) + 8 * 32
    return want == signed


def parse_octal_rows(fields: NDArray[np.uint8]) -> NDArray[np.int64]:
    """Parse a column of octal header fields at once (the vectorised :func:`parse_number`).

    Args:
        fields: Shape ``(k, w)``, uint8: one numeric field per row (for example the 8-byte
            chksum field of ``k`` headers).

    Returns:
        Shape ``(k,)``, int64: each field's value, or ``-1`` where the field is not leading
        spaces + octal digits + NUL/space terminator (base-256 or malformed: the caller falls
        back to :func:`parse_number` for those rows).
    """
    k, w = fields.shape
    val = np.zeros(k, np.int64)
    state = np.zeros(k, np.int8)  # 0 leading spaces, 1 in digits, 2 terminated, 3 bad
    for j in range(w):
        c = fields[:, j]
        dig = (c >= 0x30) & (c <= 0x37)
        term = (c == 0) | (c == 0x20)
        s0 = state == 0
        s1 = state == 1
        acc = (s0 | s1) & dig
        val = np.where(acc, val * 8 + (c.astype(np.int64) - 0x30), val)
        state[acc] = 1
        state[s0 & (c == 0)] = 2
        state[s1 & term] = 2
        state[(s0 | s1) & ~dig & ~term] = 3
    val[state == 3] = -1
    return val


_POW8_6 = 8 ** np.arange(5, -1, -1, dtype=np.int64)


def header_checksums(rows: NDArray[np.uint8]) -> tuple[NDArray[np.int64], NDArray[np.int64]]:
    """Return ``(computed, stored)`` unsigned header checksums of ``k`` header blocks at once.

    Args:
        rows: Shape ``(k, 512)``, uint8: header blocks.

    Returns:
        Two arrays of shape ``(k,)``, int64: the POSIX (unsigned) checksum of each block, the
        chksum field taken as 8 spaces; and the stored chksum value (``-1`` if it is not a
        plain octal field). Rows where they differ may still pass the signed variant: check
        them with :func:`checksum_ok`.
    """
    total = np.add.reduce(rows, axis=1, dtype=np.uint32).astype(np.int64)
    chk = np.ascontiguousarray(rows[:, 148:156])
    total -= chk.astype(np.int64).sum(axis=1)
    total += 8 * 32
    # common layout first: 6 octal digits then NUL or space (GNU tar, tarfile, libarchive)
    digits = chk[:, :6].astype(np.int64) - 0x30
    t6 = chk[:, 6]
    plain = ((digits >= 0) & (digits <= 7)).all(axis=1) & ((t6 == 0) | (t6 == 0x20))
    stored = digits @ _POW8_6
    other = np.flatnonzero(~plain)
    if len(other):
        stored[other] = parse_octal_rows(chk[other])
    return total, stored


def parse_pax(data: bytes) -> dict[bytes, bytes]:
    r"""Parse pax extended-header records ``"%d %s=%s\\n"`` (POSIX.1-2001 pax, "pax Header Block").

    Args:
        data: The record bytes (the data of a typeflag ``x``/``g`` member), NUL padding allowed
            after the last record.

    Returns:
        Mapping of keyword to value bytes, later records overriding earlier ones.

    Raises:
        ValueError: If a record's length field or layout is malformed.
    """
    out: dict[bytes, bytes] = {}
    pos = 0
    n = len(data)
    while pos < n:
        if data[pos] == 0:  # NUL padding after the last record
            break
        sp = data.find(b" ", pos, pos + 24)
        if sp < 0:
            raise ValueError(f"pax record at +{pos}: no length field")
        digits = data[pos:sp]
        if not digits.isdigit():
            raise ValueError(f"pax record at +{pos}: length field {digits!r} is not a number")
        length = int(digits)
        end = pos + length
        if length <= 0 or end > n or data[end - 1] != 0x0A:
            raise ValueError(f"pax record at +{pos}: length {length} does not end at a newline")
        eq = data.find(b"=", sp + 1, end)
        if eq < 0:
            raise ValueError(f"pax record at +{pos}: no '='")
        out[data[sp + 1 : eq]] = data[eq + 1 : end - 1]
        pos = end
    return out


def _pax_record(key: bytes, value: bytes) -> bytes:
    body = b" " + key + b"=" + value + b"\n"
    n = len(body) + 1
    while len(str(n).encode()) + len(body) != n:
        n = len(str(n).encode()) + len(body)
    return str(n).encode() + body


def _octal(value: int, width: int) -> bytes:
    # width-1 octal digits, then NUL (POSIX ustar numeric field)
    return b"%0*o\0" % (width - 1, value)


def _ustar_block(
    name: bytes, size: int, mtime: int, mode: int, typeflag: bytes, prefix: bytes = b""
) -> bytes:
    block = bytearray(BLOCK)
    block[0 : len(name)] = name
    block[100:108] = _octal(mode, 8)
    block[108:116] = _octal(0, 8)
    block[116:124] = _octal(0, 8)
    block[124:136] = _octal(size, 12)
    block[136:148] = _octal(mtime, 12)
    block[148:156] = b" " * 8
    block[156:157] = typeflag
    block[257:265] = _USTAR_MAGIC
    block[329:337] = _octal(0, 8)
    block[337:345] = _octal(0, 8)
    block[345 : 345 + len(prefix)] = prefix
    block[148:156] = b"%06o\0 " % sum(block)
    return bytes(block)


def _split_prefix(name: bytes) -> tuple[bytes, bytes] | None:
    """Split a long name into ustar (prefix <= 155, name <= 100) at a '/', or None."""
    if len(name) > 256:
        return None
    # the rightmost '/' such that the name part fits in 100 bytes and the prefix in 155
    start = max(0, len(name) - 101)
    i = name.find(b"/", start)
    while i != -1:
        if i <= 155 and len(name) - i - 1 <= 100 and i > 0 and i < len(name) - 1:
            return name[:i], name[i + 1 :]
        i = name.find(b"/", i + 1)
    return None


def build_member_header(name: bytes, size: int, mtime: int, mode: int = 0o644) -> bytes:
    """Return the header block(s) for one regular-file member, as the writer emits them.

    Plain ustar when the name fits in 100 bytes (or splits into the 155-byte prefix and
    100-byte name at a '/') and the size fits in 11 octal digits; otherwise one pax extended
    header (typeflag 'x') carrying ``path`` and/or ``size``, then the ustar block (FORMAT.md §1).
    GNU tar, bsdtar, Python's tarfile and webdataset read all of these.

    Args:
        name: Member path, UTF-8 bytes.
        size: Data size in bytes (the data and its zero padding follow the header).
        mtime: Modification time, integer seconds since the epoch.
        mode: Permission bits. Defaults to ``0o644``.

    Returns:
        ``512 * k`` bytes: the header blocks; the data starts right after them.
    """
    pax: list[bytes] = []
    field_name, prefix = name, b""
    if len(name) > 100:
        split = _split_prefix(name)
        if split is not None:
            prefix, field_name = split
        else:
            pax.append(_pax_record(b"path", name))
            # keep the truncated name decodable on its own (no dangling UTF-8 lead byte)
            field_name = name[:100].decode("utf-8", "ignore").encode("utf-8")
    field_size = size
    if size > USTAR_MAX_SIZE:
        pax.append(_pax_record(b"size", str(size).encode()))
        field_size = 0
    main = _ustar_block(field_name, field_size, mtime, mode, b"0", prefix)
    if not pax:
        return main
    body = b"".join(pax)
    pax_name = b"PaxHeaders/" + field_name[:80]
    head = _ustar_block(pax_name, len(body), mtime, 0o644, b"x")
    return head + body + bytes(padded(len(body)) - len(body)) + main
