"""Tar header bytes: build the writer's headers, parse headers from any common tool.

Sources: POSIX.1-1988 ustar and POSIX.1-2001 pax (IEEE Std 1003.1, "pax" utility,
"ustar Interchange Format" and "pax Interchange Format"), and the GNU tar manual,
"Basic Tar Format" (GNU LongName/LongLink, base-256 numbers, old GNU header).

The layout of the 512-byte header block (``TAR_NAME`` ... ``TAR_PREFIX``), the typeflags
(``REGTYPE`` ...) and the magic are defined once, in :mod:`tarindex.format.spec` (tar section).

The header checksum (POSIX ustar "chksum"; GNU tar manual, "Basic Tar Format") is one rule:
the sum of the 512 header bytes taken as unsigned 8-bit values, the chksum field counted as
eight spaces. :func:`header_checksum` is that rule for one block (the writer and error
messages use it), :func:`header_checksums` the same rule for ``k`` blocks at once (the scan's
batch check), and :func:`checksum_ok` what a reader accepts: the stored value equals that sum,
or the same sum with bytes >= 128 taken as signed (``b - 256``; historic Sun and old GNU tar).
"""

from __future__ import annotations

import functools

__all__ = [
    "ZERO_BLOCK",
    "build_member_header",
    "build_global_header",
    "parse_number",
    "header_name",
    "header_checksum",
    "header_checksums",
    "checksum_ok",
    "parse_pax",
    "compression_of",
    "padded",
    "parse_octal_rows",
    "MAX_NAME_BYTES",
    "MAX_PAX_HEADER_BYTES",
    "record_size_problem",
]

import numpy as np
from numpy.typing import NDArray

from .spec import (
    BLOCK,
    CHKSUM_BLANK,
    GNUTYPE_LONGLINK,
    GNUTYPE_LONGNAME,
    NO_DATA_TYPES,
    REGTYPE,
    SOLARIS_XHDTYPE,
    TAR_CHKSUM,
    TAR_DEVMAJOR,
    TAR_DEVMINOR,
    TAR_GID,
    TAR_MAGIC,
    TAR_MODE,
    TAR_MTIME,
    TAR_NAME,
    TAR_PREFIX,
    TAR_SIZE,
    TAR_TYPEFLAG,
    TAR_UID,
    TAR_VERSION,
    USTAR_MAGIC,
    USTAR_MAX_SIZE,
    USTAR_VERSION,
    XGLTYPE,
    XHDTYPE,
)

ZERO_BLOCK = bytes(BLOCK)

# Bounds on header records (docs/TAR_DIALECTS.md, "Bounds"), so that a hostile size costs a
# clear error at once, not minutes or gigabytes.
MAX_PAX_HEADER_BYTES = 16 << 20
"""Largest pax extended or global header ('x', 'X', 'g') data. 16 MiB: libarchive's largest
single attribute (``xattr_limit``; it reads bodies up to 1 GiB), above Go's 1 MiB, so the
8,000,000-byte header of libarchive's ``test_read_format_tar_pax_large_attr`` reads."""
MAX_NAME_BYTES = MAX_PAX_HEADER_BYTES
"""Longest member name or link target: a GNU LongName/LongLink ('L'/'K') record's data, a pax
``path``/``linkpath`` value. 16 MiB, the pax header bound: libarchive (``pathname_limit``,
ignored with a warning) and Go (``maxSpecialFileSize``, ``ErrFieldTooLong``) stop at 1 MiB, but
tarindex indexes and verifies names over 1 MiB (tests/read/test_integrity.py), so a longer name
costs seconds (a 16 MB name: ~2.5 s to index), never minutes."""
_RECORD_KINDS = {
    GNUTYPE_LONGNAME: ("GNU long name record ('L')", MAX_NAME_BYTES, "names"),
    GNUTYPE_LONGLINK: ("GNU long link record ('K')", MAX_NAME_BYTES, "names"),
    XHDTYPE: ("pax extended header ('x')", MAX_PAX_HEADER_BYTES, "pax headers"),
    SOLARIS_XHDTYPE: ("pax extended header ('X')", MAX_PAX_HEADER_BYTES, "pax headers"),
    XGLTYPE: ("pax global header ('g')", MAX_PAX_HEADER_BYTES, "pax headers"),
}


def record_size_problem(typeflag: int, size: int) -> str | None:
    """Say why a metadata record of ``size`` data bytes is refused, or None if it is not.

    The bounds :data:`MAX_NAME_BYTES` (GNU 'L'/'K' records) and :data:`MAX_PAX_HEADER_BYTES`
    (pax 'x'/'X'/'g' headers), checked from the header alone, before any of the data is read.
    Other typeflags are never refused here.

    Returns:
        ``"<what> of <size> bytes is over the <bound>-byte bound on <kind> (...)"``, or None.
    """
    kind = _RECORD_KINDS.get(typeflag)
    if kind is None or size <= kind[1]:
        return None
    what, bound, of = kind
    return (
        f"{what} of {size} bytes is over the {bound}-byte bound on {of} (docs/TAR_DIALECTS.md, "
        f"\"Bounds\"; libarchive and Go's archive/tar refuse such records too)"
    )
_NAME_LEN = TAR_NAME.stop - TAR_NAME.start  # 100
_PREFIX_LEN = TAR_PREFIX.stop - TAR_PREFIX.start  # 155
_HIGH_BYTES = bytes(range(128, 256))  # bytes whose signed value is b - 256
_NUL_FREE_KEYS = frozenset((b"path", b"linkpath"))  # pax values that are names: no NUL allowed

# Leading bytes of compressed streams (RFC 1952, bzip2, xz, RFC 8878, lz4 frame).
_COMPRESSION_MAGIC = (
    (b"\x1f\x8b", "gzip", "gunzip"),
    (b"BZh", "bzip2", "bunzip2"),
    (b"\xfd7zXZ\x00", "xz", "unxz"),
    (b"\x28\xb5\x2f\xfd", "zstd", "unzstd"),
    (b"\x04\x22\x4d\x18", "lz4", "unlz4"),
)
_SKIP = b"\x2a\x4d\x18"
"""Bytes 1-3 of a skippable frame's magic (byte 0 is ``0x50``-``0x5F``)."""


def padded(size: int) -> int:
    """Return ``size`` rounded up to a whole number of 512-byte blocks (bytes)."""
    return (size + BLOCK - 1) & ~(BLOCK - 1)


def header_name(block: bytes) -> bytes:
    r"""Return the member name stored in a header block: ``name``, with the ustar ``prefix``.

    POSIX ustar: when the magic is ``"ustar\0"`` and ``prefix`` (``TAR_PREFIX``, bytes
    345-500) is not empty, the path is ``prefix + "/" + name``. GNU headers use that area for
    other fields. pax ``path`` and GNU LongName records override this name; the caller
    applies them.
    """
    name = block[TAR_NAME].split(b"\0", 1)[0]
    if block[TAR_PREFIX.start] and block[TAR_MAGIC] == USTAR_MAGIC:
        name = block[TAR_PREFIX].split(b"\0", 1)[0] + b"/" + name
    return name


def name_after(records: bytes) -> bytes:
    """The name of the member whose header is the last block of ``records``.

    ``records`` are whole tar records from a header up to that member's header (its data
    left out): a GNU LongName (``L``), pax (``x``, ``X``) or global pax (``g``) ``path``
    before it applies as the scanner applies it (``tarindex.index.scan``: the last ``x``
    applies, ``path`` over LongName over the header's fields); other records are skipped.

    Raises:
        ValueError: A size field that is not a number, a malformed pax record, or records
            that do not end at the last block.
    """
    last = len(records) - BLOCK
    pos, longname = 0, None
    pax: dict[bytes, bytes] = {}
    gpax: dict[bytes, bytes] = {}
    while pos < last:
        block = records[pos : pos + BLOCK]
        tf, size = block[TAR_TYPEFLAG], parse_number(block[TAR_SIZE])
        data = records[pos + BLOCK : pos + BLOCK + size]
        if tf == GNUTYPE_LONGNAME:
            longname = data.split(b"\0", 1)[0]
        elif tf in (XHDTYPE, SOLARIS_XHDTYPE):
            pax = parse_pax(data)
        elif tf == XGLTYPE:
            gpax.update(parse_pax(data))
        elif tf != GNUTYPE_LONGLINK:  # a member the index skips: its records are spent
            pax, longname = {}, None
        pos += BLOCK + (0 if tf in NO_DATA_TYPES else padded(size))
    if pos != last:
        raise ValueError(f"records end at byte {pos}, not at the header at byte {last}")
    path = pax.get(b"path") or gpax.get(b"path")
    return path or longname or header_name(records[last:])


def compression_of(head: bytes) -> tuple[str, str] | None:
    """Return ``(format, decompress command)`` if ``head`` starts a compressed stream, else None.

    Skippable frames first (magic ``0x184D2A50``-``5F``, a 4-byte length, that many bytes:
    zstd's RFC 8878 §3.1.2 and lz4's frame format share them, as ``zstd -t`` reads them) are
    stepped over; the frame after them decides, zstd when ``head`` ends before it.
    """
    at = 0
    while len(head) >= at + 8 and head[at] & 0xF0 == 0x50 and head[at + 1 : at + 4] == _SKIP:
        at += 8 + int.from_bytes(head[at + 4 : at + 8], "little")
    if at:
        if at >= len(head):
            return "zstd", "unzstd"
        found = compression_of(head[at:])
        return found if found is not None and found[0] in ("zstd", "lz4") else None
    for magic, fmt, cmd in _COMPRESSION_MAGIC:
        if head.startswith(magic):
            return fmt, cmd
    return None


def parse_number(field: bytes) -> int:
    """Parse a numeric header field: octal with any NUL/space terminators, or GNU base-256.

    GNU tar manual, "Basic Tar Format": if the first byte has its high bit set, the field is
    a big-endian two's-complement binary number (0x80 positive, 0xff negative).

    Args:
        field: The raw field bytes (for example ``block[TAR_SIZE]``, the size).

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


def header_checksum(block: bytes | bytearray) -> int:
    """Return the checksum of one 512-byte header block (the one rule, see the module docs).

    POSIX ustar "chksum" (GNU tar manual, "Basic Tar Format"): the sum of the 512 header
    bytes as unsigned 8-bit values, the chksum field (``TAR_CHKSUM``, bytes 148-156) counted as
    eight spaces whatever it holds. :func:`header_checksums` is the same rule over many blocks.

    Args:
        block: One header block, 512 bytes.

    Returns:
        The checksum, ``0 <= value <= 512 * 255``.
    """
    return sum(block) - sum(block[TAR_CHKSUM]) + CHKSUM_BLANK


def checksum_ok(block: bytes) -> bool:
    """Return True if a header's stored checksum matches, unsigned (POSIX) or signed (old Sun).

    The stored value is the chksum field (octal or base-256, :func:`parse_number`). It must
    equal :func:`header_checksum`, or the same sum with every byte >= 128 outside the chksum
    field taken as ``b - 256`` (historic tars that summed signed chars).

    Args:
        block: One header block, 512 bytes.
    """
    try:
        want = parse_number(block[TAR_CHKSUM])
    except ValueError:
        return False
    unsigned = header_checksum(block)
    if want == unsigned:
        return True
    chk = block[TAR_CHKSUM]
    high = len(block) - len(block.translate(None, _HIGH_BYTES))
    high -= len(chk) - len(chk.translate(None, _HIGH_BYTES))
    return want == unsigned - 256 * high


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
    """Return ``(computed, stored)`` checksums of ``k`` header blocks at once.

    ``computed`` is :func:`header_checksum` of every row (the same rule, vectorised: the
    unsigned byte sum with the chksum field counted as eight spaces; POSIX ustar "chksum").

    Args:
        rows: Shape ``(k, 512)``, uint8: header blocks.

    Returns:
        Two arrays of shape ``(k,)``, int64: the computed checksum of each block; and the
        stored chksum value (``-1`` if it is not a plain octal field). Rows where they differ
        may still pass the signed variant or hold a base-256 field: check them with
        :func:`checksum_ok`.
    """
    total = np.add.reduce(rows, axis=1, dtype=np.uint32).astype(np.int64)
    chk = np.ascontiguousarray(rows[:, TAR_CHKSUM])
    total -= chk.astype(np.int64).sum(axis=1)
    total += CHKSUM_BLANK
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
        ValueError: If a record's length field or layout is malformed, a record has no
            ``=`` or an empty keyword, a keyword contains a NUL byte, a ``path`` or
            ``linkpath`` value is longer than :data:`MAX_NAME_BYTES`, or contains one (Go's
            archive/tar and bsdtar refuse these; GNU tar reads keywords as C strings and
            reports "missing equal sign" or cuts the name at the NUL, so the archive means
            different things to different readers).
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
        key = data[sp + 1 : eq]
        value = data[eq + 1 : end - 1]
        if not key or b"\0" in key:
            raise ValueError(f"pax record at +{pos}: keyword {key[:40]!r} is empty or holds a NUL")
        if key in _NUL_FREE_KEYS and len(value) > MAX_NAME_BYTES:
            raise ValueError(
                f"pax record at +{pos}: {key.decode()} value is {len(value)} bytes, over the "
                f"{MAX_NAME_BYTES}-byte bound on names (docs/TAR_DIALECTS.md, \"Bounds\"; "
                f"libarchive ignores such a name, Go's archive/tar refuses it)"
            )
        if key in _NUL_FREE_KEYS and b"\0" in value:
            raise ValueError(
                f"pax record at +{pos}: {key.decode()} value holds a NUL byte at +{value.index(0)} "
                f"({value[:40]!r}); readers disagree on such a name"
            )
        out[key] = value
        pos = end
    return out


def _pax_record(key: bytes, value: bytes) -> bytes:
    body = b" " + key + b"=" + value + b"\n"
    n = len(body) + 1
    while len(str(n).encode()) + len(body) != n:
        n = len(str(n).encode()) + len(body)
    return str(n).encode() + body


def _octal(value: int, field: slice) -> bytes:
    # the field's width - 1 octal digits, then NUL (POSIX ustar numeric field)
    return b"%0*o\0" % (field.stop - field.start - 1, value)


@functools.lru_cache(maxsize=32)
def _ustar_fixed(mtime: int, mode: int, typeflag: int) -> tuple[bytes, bytes, bytes, int]:
    """The fields of a ustar header that do not depend on the name, size or prefix.

    Returns ``(mode..gid, mtime, typeflag..devminor, byte sum)``: bytes 100-124, 136-148 and
    156-345 of the block, and the checksum of a block holding only them (the chksum field
    counted as spaces, name, size and prefix as NULs).
    """
    block = bytearray(BLOCK)
    block[TAR_MODE] = _octal(mode, TAR_MODE)
    block[TAR_UID] = _octal(0, TAR_UID)
    block[TAR_GID] = _octal(0, TAR_GID)
    block[TAR_MTIME] = _octal(mtime, TAR_MTIME)
    block[TAR_TYPEFLAG] = typeflag
    block[TAR_MAGIC] = USTAR_MAGIC
    block[TAR_VERSION] = USTAR_VERSION
    block[TAR_DEVMAJOR] = _octal(0, TAR_DEVMAJOR)
    block[TAR_DEVMINOR] = _octal(0, TAR_DEVMINOR)
    return (
        bytes(block[TAR_MODE.start : TAR_SIZE.start]),
        bytes(block[TAR_MTIME]),
        bytes(block[TAR_TYPEFLAG : TAR_PREFIX.start]),
        header_checksum(block),
    )


_PREFIX_TAIL = BLOCK - TAR_PREFIX.start  # prefix field and the 12 unused bytes after it


def _ustar_block(
    name: bytes, size: int, mtime: int, mode: int, typeflag: int, prefix: bytes = b""
) -> bytes:
    """One POSIX ustar header block; ``name`` <= 100 bytes, ``prefix`` <= 155 (caller checks).

    The writer's hot path (one per member): the fixed fields and their byte sum come from
    :func:`_ustar_fixed` (cached per ``mtime, mode, typeflag``), and the checksum adds the
    sums of the name, size and prefix fields, the same rule as :func:`header_checksum`.
    """
    ids, mt, rest, fixed_sum = _ustar_fixed(mtime, mode, typeflag)
    size_field = _octal(size, TAR_SIZE)
    chk = fixed_sum + sum(name) + sum(size_field) + sum(prefix)
    # 6 octal digits, NUL, space: the layout GNU tar and tarfile write
    return b"".join(
        (
            name,
            bytes(_NAME_LEN - len(name)),
            ids,
            size_field,
            mt,
            b"%06o\0 " % chk,
            rest,
            prefix,
            bytes(_PREFIX_TAIL - len(prefix)),
        )
    )


def _split_prefix(name: bytes) -> tuple[bytes, bytes] | None:
    """Split a long name into ustar (prefix <= 155, name <= 100) at a '/', or None."""
    if len(name) > _PREFIX_LEN + 1 + _NAME_LEN:
        return None
    # the rightmost '/' such that the name part fits in 100 bytes and the prefix in 155
    start = max(0, len(name) - _NAME_LEN - 1)
    i = name.find(b"/", start)
    while i != -1:
        if i <= _PREFIX_LEN and len(name) - i - 1 <= _NAME_LEN and i > 0 and i < len(name) - 1:
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
    if len(name) > _NAME_LEN:
        split = _split_prefix(name)
        if split is not None:
            prefix, field_name = split
        else:
            pax.append(_pax_record(b"path", name))
            # keep the truncated name decodable on its own (no dangling UTF-8 lead byte)
            field_name = name[:_NAME_LEN].decode("utf-8", "ignore").encode("utf-8")
    field_size = size
    if size > USTAR_MAX_SIZE:
        pax.append(_pax_record(b"size", str(size).encode()))
        field_size = 0
    main = _ustar_block(field_name, field_size, mtime, mode, REGTYPE, prefix)
    if not pax:
        return main
    body = b"".join(pax)
    pax_name = b"PaxHeaders/" + field_name[:80]
    head = _ustar_block(pax_name, len(body), mtime, 0o644, XHDTYPE)
    return head + body + bytes(padded(len(body)) - len(body)) + main


def build_global_header(records: list[tuple[bytes, bytes]], mtime: int) -> bytes:
    """Return a pax global extended header (typeflag 'g') carrying ``records``.

    POSIX.1-2001 pax: a 'g' header's records apply to every later member; readers skip
    keywords they do not know. The writer puts its shard id here as a ``comment`` record (as
    ``git archive`` does with the commit id): GNU tar, bsdtar, Python's tarfile and webdataset
    list no member for it and print no warning.

    Args:
        records: ``(keyword, value)`` pairs, e.g. ``[(b"comment", b"tarindex-shard ...")]``.
        mtime: Modification time for the header, integer seconds since the epoch.

    Returns:
        The header block and its padded data: ``512 * k`` bytes.
    """
    body = b"".join(_pax_record(k, v) for k, v in records)
    head = _ustar_block(b"pax_global_header", len(body), mtime, 0o666, XGLTYPE)
    return head + body + bytes(padded(len(body)) - len(body))
