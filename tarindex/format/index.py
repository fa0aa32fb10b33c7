"""Encode and decode the sidecar index (docs/FORMAT.md §2). Bytes in, bytes out: no file IO.

Layout (little-endian; every section starts on an 8-byte boundary)::

    +-----------------------------------------------+ 0
    | header  <8sHHIQQQQQQQII>  (80 bytes)           |  §2.1
    | sample_ptr  <u8[n_samples + 1]                 |  §2.2  CSR: sample i owns members
    | offset      <u8[n_members]                     |  §2.3  sample_ptr[i]:sample_ptr[i+1]
    | size        <u8[n_members]                     |  §2.3
    | ext_id      <u4[n_members]   (+pad)            |  §2.4
    | key_ptr     <u8[n_samples + 1]                 |  §2.5  key i = key_blob[key_ptr[i]:...]
    | key_blob    u8[key_bytes]    (+pad)            |  §2.5
    | ext_ptr     <u8[n_exts + 1]                    |  §2.4
    | ext_blob    u8[ext_bytes]    (+pad)            |  §2.4
    | meta        JSON, meta_bytes (+pad)            |  §2.6
    | records (1.1+): TARX, DCRC, KHSH (1.2), GZIX   |  §2.8
    |   (1.3)                                        |
    | footer  <I4s>: crc32 of all bytes above, TIDX  |  §2.7
    +-----------------------------------------------+
"""

from __future__ import annotations

import json
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from numpy.typing import NDArray

from ..errors import (
    BadMagicError,
    ChecksumError,
    FormatError,
    TruncatedError,
    UnsupportedVersionError,
)
from .guards import check_samples
from .gzindex import GzipIndex, decode_gzip_record, encode_gzip_record
from .hints import rebuild_hint
from .keytable import check_key_table, key_table_of
from .spec import (
    ALIGN,
    CRC_DTYPE,
    END_MAGIC,
    EXT_ID_DTYPE,
    FINGERPRINT_BYTES,
    FOOTER,
    FORMAT_MAJOR,
    FORMAT_MINOR,
    HEADER,
    KEY_HASH_DTYPE,
    MAGIC,
    MAX_BLOB_BYTES,
    MAX_MEMBERS,
    MAX_META_BYTES,
    MAX_SAMPLES,
    OFFSET_DTYPE,
    RECORD,
    SHARD_ID_BYTES,
    TAG_DATA_CRC,
    TAG_GZIP,
    TAG_KEY_HASH,
    TAG_TAR,
    TAR_RECORD,
)

__all__ = [
    "fingerprint",
    "IndexTables",
    "IndexHeader",
    "encode_index",
    "decode_index",
    "read_header",
    "index_size",
    "layout",
]


def _pad(n: int) -> int:
    return (n + ALIGN - 1) & ~(ALIGN - 1)


@dataclass
class IndexHeader:
    """The fixed 80-byte header of an index file (FORMAT.md §2.1)."""

    major: int
    """Format major version; readers refuse one they do not know."""
    minor: int
    """Format minor version; only adds fields."""
    flags: int
    """Reserved, 0 in version 1.0."""
    n_samples: int
    """Number of samples in the shard."""
    n_members: int
    """Number of indexed members (regular files that belong to a sample)."""
    n_exts: int
    """Number of distinct extensions."""
    key_bytes: int
    """Length of the key blob in bytes."""
    ext_bytes: int
    """Length of the extension blob in bytes."""
    meta_bytes: int
    """Length of the JSON metadata in bytes."""
    tar_size: int
    """Size of the tar in bytes when it was indexed (fingerprint, FORMAT.md §3)."""
    head_crc: int
    """crc32 of the tar's first min(4096, tar_size) bytes (fingerprint, FORMAT.md §3)."""
    tail_crc: int
    """crc32 of the tar's last min(4096, tar_size) bytes (fingerprint, FORMAT.md §3)."""


def fingerprint(read: Callable[[int, int], bytes], tar_size: int) -> tuple[int, int]:
    """Return ``(head_crc, tail_crc)`` of a tar: crc32 of its first and last 4096 bytes.

    The one definition of the fingerprint (FORMAT.md §3), for the scanner (mmap slices), the
    reader (``os.pread``) and tests. Tars shorter than 4096 bytes use all their bytes for both.

    Args:
        read: ``read(offset, n)`` returns ``n`` bytes of the tar at byte ``offset``.
        tar_size: Size of the tar in bytes.
    """
    n = min(FINGERPRINT_BYTES, tar_size)
    return zlib.crc32(read(0, n)), zlib.crc32(read(tar_size - n, n))


def layout(h: IndexHeader) -> dict[str, tuple[int, int]]:
    """Return ``{section: (start, length)}`` in bytes for every section, plus ``"footer"``."""
    out: dict[str, tuple[int, int]] = {}
    pos = HEADER.size
    for name, length in (
        ("sample_ptr", 8 * (h.n_samples + 1)),
        ("offset", 8 * h.n_members),
        ("size", 8 * h.n_members),
        ("ext_id", 4 * h.n_members),
        ("key_ptr", 8 * (h.n_samples + 1)),
        ("key_blob", h.key_bytes),
        ("ext_ptr", 8 * (h.n_exts + 1)),
        ("ext_blob", h.ext_bytes),
        ("meta", h.meta_bytes),
    ):
        out[name] = (pos, length)
        pos += _pad(length)
    out["footer"] = (pos, FOOTER.size)
    return out


@dataclass
class IndexTables:
    """The content of one index: what the writer records and what a scan rebuilds.

    Arrays may be numpy views into an mmapped index file (read-only).
    """

    sample_ptr: NDArray[np.uint64]
    """Shape ``(n_samples + 1,)``, ``<u8``: sample i owns members ``sample_ptr[i]:sample_ptr[i+1]``."""
    offset: NDArray[np.uint64]
    """Shape ``(n_members,)``, ``<u8``: byte offset of each member's data in the tar."""
    size: NDArray[np.uint64]
    """Shape ``(n_members,)``, ``<u8``: each member's data size in bytes."""
    ext_id: NDArray[np.uint32]
    """Shape ``(n_members,)``, ``<u4``: index into ``exts``."""
    key_ptr: NDArray[np.uint64]
    """Shape ``(n_samples + 1,)``, ``<u8``: key i is ``key_blob[key_ptr[i]:key_ptr[i+1]]``."""
    key_blob: bytes | memoryview
    """Concatenated raw key bytes (member-name bytes as stored in the tar)."""
    exts: list[bytes]
    """Extension names in order of first appearance in the shard."""
    tar_size: int
    """Size of the tar in bytes."""
    head_crc: int
    """crc32 of the first 4096 bytes of the tar (FORMAT.md §3)."""
    tail_crc: int
    """crc32 of the last 4096 bytes of the tar (FORMAT.md §3)."""
    meta: dict[str, Any] = field(default_factory=dict)
    """Producer and version metadata (FORMAT.md §2.6); not part of table equality."""
    sections: dict[str, tuple[int, int]] = field(default_factory=dict)
    """``{section: (start, length)}`` in bytes within the index file, when decoded from one
    (:func:`layout`); used to name the byte of a bad entry. Not part of table equality."""
    shard_id: bytes = b""
    """The 16-byte id the writer put into the shard (FORMAT.md §1); empty for other tars."""
    end: int = -1
    """Byte offset in the tar where the archive's data ends (the end-of-archive marker, or
    the end of the last non-zero block); every byte from there to the end of the tar is zero.
    ``-1`` if unknown (a v1.0 index). FORMAT.md §2.8.1, §3."""
    member_crc: NDArray[np.uint32] | None = None
    """Shape ``(n_members,)``, ``<u4``: zlib crc32 of each member's data, or ``None`` if not
    recorded. FORMAT.md §2.8.2."""
    key_hash: NDArray[np.uint32] | None = None
    """Shape ``(n_samples,)``, ``<u4``: the index's key table (FORMAT.md §2.8.3), sorted key
    hashes, or ``None`` if the index has none (before 1.2). Set when decoded; the encoder
    always computes it from the keys."""
    key_order: NDArray[np.uint32] | None = None
    """Shape ``(n_samples,)``, ``<u4``: the sample numbers in the order of :attr:`key_hash`."""
    gzip: GzipIndex | None = None
    """A gzip-compressed shard's fingerprint and seek points (FORMAT.md §2.8.4), or ``None``
    for a plain tar. When set, every offset and ``tar_size`` are of the decompressed tar."""
    crc: int = -1
    """The index file's crc32 (its footer, FORMAT.md §2.7) when decoded from one, else -1."""
    index_bytes: int = -1
    """The index file's size in bytes when decoded from one, else -1."""

    @property
    def n_samples(self) -> int:
        """Number of samples."""
        return len(self.sample_ptr) - 1

    @property
    def n_members(self) -> int:
        """Number of indexed members."""
        return len(self.offset)

    def tables_bytes(self) -> bytes:
        """The encoded tables without metadata and records: equal for writer and scan."""
        enc = encode_index(
            IndexTables(**{**self.__dict__, "meta": {}, "sections": {}}), records=False
        )
        return enc[: -FOOTER.size]


def encode_index(t: IndexTables, records: bool = True, key_table: bool = True) -> bytes:
    """Serialize ``t`` to the bytes of an index file (FORMAT.md §2).

    Args:
        t: The tables.
        records: Write the records of FORMAT.md §2.8 (``TARX`` when ``t.end >= 0`` or a shard
            id is set, ``DCRC`` when ``t.member_crc`` is set, and ``KHSH``, the key table
            computed from the keys, when the shard has fewer than ``2**32`` samples, and
            ``GZIX`` when ``t.gzip`` is set). Defaults to ``True``.
        key_table: Write the ``KHSH`` record (with ``records``). ``False`` writes what a
            format 1.1 writer wrote. Defaults to ``True``.

    Returns:
        The whole index file, footer included; its length is a multiple of 8 bytes.

    Raises:
        ValueError: If the tables are inconsistent (pointer ends, array lengths).
    """
    n_samples = len(t.sample_ptr) - 1
    m = len(t.offset)
    if len(t.size) != m or len(t.ext_id) != m:
        raise ValueError("offset, size and ext_id must have the same length")
    if len(t.key_ptr) != n_samples + 1 or (n_samples >= 0 and int(t.sample_ptr[-1]) != m):
        raise ValueError("sample_ptr/key_ptr do not match the member and sample counts")
    ext_blob = b"".join(t.exts)
    ext_ptr = np.zeros(len(t.exts) + 1, OFFSET_DTYPE)
    np.cumsum([len(e) for e in t.exts], out=ext_ptr[1:])
    meta = json.dumps(t.meta, sort_keys=True, separators=(",", ":")).encode()
    key_blob = bytes(t.key_blob)
    h = IndexHeader(
        FORMAT_MAJOR,
        FORMAT_MINOR,
        0,
        n_samples,
        m,
        len(t.exts),
        len(key_blob),
        len(ext_blob),
        len(meta),
        t.tar_size,
        t.head_crc,
        t.tail_crc,
    )
    parts = {
        "sample_ptr": np.asarray(t.sample_ptr, OFFSET_DTYPE).tobytes(),
        "offset": np.asarray(t.offset, OFFSET_DTYPE).tobytes(),
        "size": np.asarray(t.size, OFFSET_DTYPE).tobytes(),
        "ext_id": np.asarray(t.ext_id, EXT_ID_DTYPE).tobytes(),
        "key_ptr": np.asarray(t.key_ptr, OFFSET_DTYPE).tobytes(),
        "key_blob": key_blob,
        "ext_ptr": ext_ptr.tobytes(),
        "ext_blob": ext_blob,
        "meta": meta,
    }
    out = bytearray(
        HEADER.pack(
            MAGIC,
            h.major,
            h.minor,
            h.flags,
            h.n_samples,
            h.n_members,
            h.n_exts,
            h.key_bytes,
            h.ext_bytes,
            h.meta_bytes,
            h.tar_size,
            h.head_crc,
            h.tail_crc,
        )
    )
    for name, (start, _length) in layout(h).items():
        if name == "footer":
            break
        out += bytes(start - len(out))
        out += parts[name]
    out += bytes(_pad(len(out)) - len(out))
    if records and (t.end >= 0 or t.shard_id):
        sid = bytes(t.shard_id).ljust(SHARD_ID_BYTES, b"\0")[:SHARD_ID_BYTES]
        out += _record(TAG_TAR, TAR_RECORD.pack(sid, t.end if t.end >= 0 else 2**64 - 1, 0))
    if records and t.member_crc is not None:
        if len(t.member_crc) != m:
            raise ValueError("member_crc must have one entry per member")
        out += _record(TAG_DATA_CRC, np.asarray(t.member_crc, CRC_DTYPE).tobytes())
    kptr = np.asarray(t.key_ptr, np.int64)
    if (
        records
        and key_table
        and n_samples < 1 << 32
        and (n_samples <= 0 or (kptr[0] == 0 and kptr[-1] == len(key_blob)))
        and not (kptr[1:] < kptr[:-1]).any()
    ):  # (tables the guards refuse, as tests write them, get no key table)
        kt = key_table_of(key_blob, kptr)
        data = kt.hash.astype(KEY_HASH_DTYPE).tobytes() + kt.order.astype(KEY_HASH_DTYPE).tobytes()
        out += _record(TAG_KEY_HASH, data)
    if records and t.gzip is not None:
        out += _record(TAG_GZIP, encode_gzip_record(t.gzip))
    out += FOOTER.pack(zlib.crc32(out), END_MAGIC)
    return bytes(out)


def _record(tag: bytes, data: bytes) -> bytes:
    """One record of FORMAT.md §2.8: header, data, zero padding to 8 bytes."""
    return RECORD.pack(tag, 0, len(data)) + data + bytes(_pad(len(data)) - len(data))


def read_header(
    buf: bytes | memoryview, path: str = "<index>", file_size: int | None = None
) -> IndexHeader:
    """Parse and check the 80-byte header (FORMAT.md §2.1).

    Args:
        buf: The index bytes, at least the first 80 (more is ignored).
        path: Path of the index, for messages. Defaults to ``"<index>"``.
        file_size: The index file's real size in bytes, if known: the counts in the header
            must then describe exactly that many bytes, so a corrupt count is refused before
            anything is sized from it. Defaults to ``None`` (not checked).

    Returns:
        The header fields.

    Raises:
        TruncatedError: If ``buf`` is shorter than the header, or the header's counts do not
            add up to ``file_size``.
        BadMagicError: If the magic is wrong.
        UnsupportedVersionError: If the major version is not ``FORMAT_MAJOR``.
        FormatError: If a count exceeds the format's limits (FORMAT.md §2.1; ``key_bytes``,
            ``ext_bytes`` and ``meta_bytes`` at most ``2**44``, a reader limit).
    """
    if len(buf) < HEADER.size:
        raise TruncatedError(
            f"{path}: index is {len(buf)} bytes, shorter than its {HEADER.size}-byte header "
            f"at byte 0; rebuild it with: {rebuild_hint(path)}"
        )
    fields = HEADER.unpack_from(buf, 0)
    if fields[0] != MAGIC:
        raise BadMagicError(
            f"{path}: byte 0: expected index magic {MAGIC!r}, found {bytes(fields[0])!r}; "
            f"not a tarindex index (rebuild it with: {rebuild_hint(path)})"
        )
    h = IndexHeader(*fields[1:])
    if h.major != FORMAT_MAJOR:
        raise UnsupportedVersionError(
            f"{path}: byte 8: index format version {h.major}.{h.minor}, this tarindex reads "
            f"{FORMAT_MAJOR}.x; upgrade tarindex or rebuild with: {rebuild_hint(path)}"
        )
    for at, name, value, limit in (
        (16, "n_samples", h.n_samples, MAX_SAMPLES),
        (24, "n_members", h.n_members, MAX_MEMBERS),
        (32, "n_exts", h.n_exts, min(h.n_members, MAX_MEMBERS) + 1),
        (40, "key_bytes", h.key_bytes, MAX_BLOB_BYTES),
        (48, "ext_bytes", h.ext_bytes, MAX_BLOB_BYTES),
        (56, "meta_bytes", h.meta_bytes, MAX_META_BYTES),
    ):
        if value > limit:
            raise FormatError(
                f"{path}: byte {at}: header field {name} = {value} exceeds its limit {limit} "
                f"(FORMAT.md §2.1); the index is corrupt; rebuild it with: "
                f"{rebuild_hint(path)}"
            )
    if file_size is not None:
        expected = index_size(h)
        if file_size < expected or (h.minor == 0 and file_size != expected):
            raise TruncatedError(
                f"{path}: index is {file_size} bytes, its header's counts (n_samples "
                f"{h.n_samples}, n_members {h.n_members}) describe {expected} bytes (truncated, "
                f"appended to or a corrupt count at byte {min(file_size, expected)}); rebuild it "
                f"with: {rebuild_hint(path)}"
            )
    return h


def index_size(h: IndexHeader) -> int:
    """Return the size in bytes of the index file header ``h`` describes, without records.

    A v1.0 index is exactly this long; from v1.1 on, records (FORMAT.md §2.8) may follow.
    """
    return layout(h)["footer"][0] + FOOTER.size


def decode_index(
    buf: bytes | memoryview,
    path: str = "<index>",
    full_check: bool = False,
    check_crc: bool = False,
) -> IndexTables:
    """Decode an index from ``buf`` (bytes or a memoryview of an mmap); arrays are zero-copy views.

    Cheap checks always run, O(1) in the sample count: header, total length, end magic,
    pointer ends, the records of FORMAT.md §2.8 (unknown ones skipped). ``check_crc`` adds
    the crc32 footer (about 1 ms per MB of index); ``full_check`` adds the crc32 and the
    O(n) table checks of :func:`check_samples` (used by ``verify``; FORMAT.md §2.7).

    Args:
        buf: The whole index file.
        path: Path of the index, for messages; when it ends in ``.tidx`` the messages name
            the tar to re-index. Defaults to ``"<index>"``.
        full_check: Also run the crc32 and the O(n) checks above. Defaults to ``False``.
        check_crc: Also check the crc32 footer. Defaults to ``False``.

    Returns:
        The tables; the arrays are read-only views into ``buf`` (no copy).

    Raises:
        TruncatedError: If ``buf`` is shorter or longer than the header says.
        BadMagicError: On a bad start or end magic.
        UnsupportedVersionError: If the major version is not ``FORMAT_MAJOR``.
        ChecksumError: With ``check_crc`` or ``full_check``, if the crc32 footer does not match.
        FormatError: If tables are inconsistent (pointer ends, extension table, metadata
            that is not a JSON object; with ``full_check`` the O(n) checks).
    """
    h = read_header(buf, path, file_size=len(buf))
    lay = layout(h)
    rstart, _ = lay["footer"]  # records (§2.8), if any, run from here to the footer
    fstart = len(buf) - FOOTER.size
    crc, end = FOOTER.unpack_from(buf, fstart)
    if end != END_MAGIC:
        raise BadMagicError(
            f"{path}: byte {fstart + 4}: expected end magic {END_MAGIC!r}, found {bytes(end)!r}; "
            f"rebuild it with: {rebuild_hint(path)}"
        )
    if full_check or check_crc:
        got = zlib.crc32(buf[:fstart])
        if got != crc:
            raise ChecksumError(
                f"{path}: footer crc32 0x{got:08x} != 0x{crc:08x} at byte {fstart}; the index "
                f"is corrupt; rebuild it with: {rebuild_hint(path)}"
            )

    def arr(name: str, dtype: np.dtype[Any], count: int) -> NDArray[Any]:
        start, _ = lay[name]
        return np.frombuffer(buf, dtype=dtype, count=count, offset=start)

    def blob(name: str) -> memoryview:
        start, length = lay[name]
        return memoryview(buf)[start : start + length]

    sample_ptr = arr("sample_ptr", OFFSET_DTYPE, h.n_samples + 1)
    key_ptr = arr("key_ptr", OFFSET_DTYPE, h.n_samples + 1)
    ext_ptr = arr("ext_ptr", OFFSET_DTYPE, h.n_exts + 1)
    if (
        int(sample_ptr[0]) != 0
        or int(sample_ptr[-1]) != h.n_members
        or int(key_ptr[0]) != 0
        or int(key_ptr[-1]) != h.key_bytes
        or int(ext_ptr[0]) != 0
        or int(ext_ptr[-1]) != h.ext_bytes
    ):
        raise FormatError(
            f"{path}: byte {lay['sample_ptr'][0]}: pointer tables do not end at the counts in "
            f"the header; the index is corrupt; rebuild it with: {rebuild_hint(path)}"
        )
    ext_blob = bytes(blob("ext_blob"))
    eps = ext_ptr.tolist()
    # O(n_exts), like the decoding below: extensions are few, and a reader that trusted a
    # decreasing ext_ptr or a repeated name would silently drop members (FORMAT.md §2.4)
    exts = [ext_blob[eps[i] : eps[i + 1]] for i in range(h.n_exts)]
    seen: set[bytes] = set()
    for i, e in enumerate(exts):
        what = None
        if eps[i + 1] <= eps[i]:
            what = "is empty or decreases"
        elif e.startswith(b"__"):
            what = f"names extension {e!r}, reserved for sample metadata ('__' prefix)"
        elif e in seen:
            what = f"repeats extension {e!r}"
        seen.add(e)
        if what is not None:
            raise FormatError(
                f"{path}: byte {lay['ext_ptr'][0] + 8 * (i + 1)}: ext_ptr[{i + 1}] {what}; the "
                f"index is corrupt; rebuild it with: {rebuild_hint(path)}"
            )
    meta_raw = bytes(blob("meta"))
    try:
        meta = json.loads(meta_raw) if meta_raw else {}
    except (ValueError, RecursionError) as e:  # RecursionError: "[[[[..." nested too deep
        raise FormatError(
            f"{path}: byte {lay['meta'][0]}: metadata is not JSON ({type(e).__name__}: {e}); "
            f"rebuild it with: {rebuild_hint(path)}"
        ) from None
    if not isinstance(meta, dict):
        raise FormatError(
            f"{path}: byte {lay['meta'][0]}: metadata is a JSON {type(meta).__name__}, not an "
            f"object (FORMAT.md §2.6); rebuild it with: {rebuild_hint(path)}"
        )
    records = _records(buf, rstart, fstart, path)
    shard_id, tar_end, member_crc = b"", -1, None
    rec = records.get(TAG_TAR)
    if rec is not None:
        at, data = rec
        if len(data) != TAR_RECORD.size:
            raise FormatError(
                f"{path}: byte {at}: TARX record is {len(data)} bytes, expected "
                f"{TAR_RECORD.size} (FORMAT.md §2.8.1); rebuild it with: {rebuild_hint(path)}"
            )
        sid, tend, _ = TAR_RECORD.unpack(data)
        shard_id = bytes(sid) if bytes(sid).strip(b"\0") else b""
        if tend != 2**64 - 1:
            if tend > h.tar_size:
                raise FormatError(
                    f"{path}: byte {at + 16}: TARX end {tend} is past the tar's {h.tar_size} bytes "
                    f"(FORMAT.md §2.8.1); rebuild it with: {rebuild_hint(path)}"
                )
            tar_end = int(tend)
    rec = records.get(TAG_DATA_CRC)
    if rec is not None:
        at, data = rec
        if len(data) != CRC_DTYPE.itemsize * h.n_members:
            raise FormatError(
                f"{path}: byte {at}: DCRC record is {len(data)} bytes, expected "
                f"{CRC_DTYPE.itemsize * h.n_members} (4 per member, FORMAT.md §2.8.2); rebuild "
                f"it with: {rebuild_hint(path)}"
            )
        member_crc = np.frombuffer(data, dtype=CRC_DTYPE)
    khash = korder = None
    rec = records.get(TAG_KEY_HASH)
    if rec is not None:
        at, data = rec
        if len(data) != 2 * KEY_HASH_DTYPE.itemsize * h.n_samples:
            raise FormatError(
                f"{path}: byte {at}: KHSH record is {len(data)} bytes, expected "
                f"{2 * KEY_HASH_DTYPE.itemsize * h.n_samples} (8 per sample, FORMAT.md §2.8.3); "
                f"rebuild it with: {rebuild_hint(path)}"
            )
        khash = np.frombuffer(data, dtype=KEY_HASH_DTYPE, count=h.n_samples)
        korder = np.frombuffer(
            data, dtype=KEY_HASH_DTYPE, count=h.n_samples, offset=4 * h.n_samples
        )
    rec = records.get(TAG_GZIP)
    gz = None if rec is None else decode_gzip_record(rec[1], rec[0], path)
    t = IndexTables(
        sample_ptr=sample_ptr,
        offset=arr("offset", OFFSET_DTYPE, h.n_members),
        size=arr("size", OFFSET_DTYPE, h.n_members),
        ext_id=arr("ext_id", EXT_ID_DTYPE, h.n_members),
        key_ptr=key_ptr,
        key_blob=blob("key_blob"),
        exts=exts,
        tar_size=h.tar_size,
        head_crc=h.head_crc,
        tail_crc=h.tail_crc,
        meta=meta,
        sections=lay,
        shard_id=shard_id,
        end=tar_end,
        member_crc=member_crc,
        key_hash=khash,
        key_order=korder,
        gzip=gz,
        crc=int(crc),
        index_bytes=len(buf),
    )
    if full_check:
        check_samples(t, 0, t.n_samples, path)
        if khash is not None:
            check_key_table(t, path)
    return t


def _records(
    buf: bytes | memoryview, start: int, stop: int, path: str
) -> dict[bytes, tuple[int, memoryview]]:
    """Parse the records between the sections and the footer (FORMAT.md §2.8).

    Returns:
        ``{tag: (byte offset of the record's data, data)}``; unknown tags are kept too (the
        caller ignores them), a tag seen twice keeps its first record.

    Raises:
        FormatError: If a record header or its data runs past the footer.
    """
    out: dict[bytes, tuple[int, memoryview]] = {}
    view = memoryview(buf)
    pos = start
    while pos < stop:
        if pos + RECORD.size > stop:
            raise FormatError(
                f"{path}: byte {pos}: {stop - pos} bytes before the footer are not a record "
                f"(FORMAT.md §2.8); rebuild it with: {rebuild_hint(path)}"
            )
        tag, _, length = RECORD.unpack_from(buf, pos)
        data_at = pos + RECORD.size
        if length > stop - data_at:
            raise FormatError(
                f"{path}: byte {pos}: record {bytes(tag)!r} of {length} bytes runs past the "
                f"footer at byte {stop} (FORMAT.md §2.8); rebuild it with: {rebuild_hint(path)}"
            )
        out.setdefault(bytes(tag), (data_at, view[data_at : data_at + length]))
        pos = data_at + _pad(length)
    if pos != stop:
        raise FormatError(
            f"{path}: byte {stop}: the last record's padding runs past the footer "
            f"(FORMAT.md §2.8); rebuild it with: {rebuild_hint(path)}"
        )
    return out
