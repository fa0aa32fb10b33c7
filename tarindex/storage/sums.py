"""Checksums of cache entries: nothing a cache file holds is served before it is checked.

A cache file can change after it was written (bit rot, another program, a file cut then
extended, a file of another entry copied in its place); its length alone proves nothing. The
rules (docs/REMOTE.md, "Cache"):

- **Bytes entries** (:meth:`DirCache.put <tarindex.storage.cache.DirCache.put>`: a chunk of a
  remote tar, an index) start with a :data:`ENTRY_HEAD` record: magic, the data's length, a
  crc of the data seeded with the crc of the entry's ``key/name``, and a zlib crc32 of the
  record itself. The key holds the object's URL, size, index fingerprint and pinned version
  (ETag, ...), so bytes of another entry or version fail the check. The magic names the
  data's crc: ``TIENTRY2`` crc32c (Castagnoli, RFC 3720 §B.4; google-crc32c, in hardware:
  about 4x zlib's crc32, benchmarks/README.md), written when google-crc32c's compiled
  implementation is installed (the ``remote`` extra); else ``TIENTRY1`` zlib's crc32, as
  tarindex wrote before. Both are read; a ``TIENTRY2`` entry in a process without
  google-crc32c cannot be checked and is dropped as a failed one (fetched again).
- **File entries** (a whole shard: :meth:`DirCache.put_file` with ``sums``) keep a
  ``<name>.sum`` file beside them: magic, the file's size, the grain, the crc32 of
  ``key/name``, one crc per :data:`~tarindex.storage.pieces.GRAIN` bytes (computed as the
  download writes them), and a zlib crc32 of the record. The magic names the grains' crc by
  the same rule as bytes entries (:func:`grain_kind`): ``TISUMS02`` crc32c when
  google-crc32c's compiled implementation is installed, else ``TISUMS01`` zlib's crc32 (as
  tarindex wrote before; still read). A ``TISUMS02`` copy in a process without
  google-crc32c cannot be checked: it is dropped with a warning and fetched again. The
  progress record of a download (:mod:`tarindex.storage.pieces`) carries the same rule.
- **Bytes entries are checked on every read** (they are read whole anyway): a store through
  another process's shared writable mapping changes a file's bytes without a ``ctime`` (it is
  stamped only when a clean page faults; on ext4 not again while the page stays mapped).
- **File entries are checked on first use in a process.** One is checked when a process first
  opens it (it is mapped, not read, after);
  the process then remembers that this file (device, inode, size, ``ctime``) passed, while
  its ``ctime`` stays the same. Every ``write``, truncation or ``utime`` sets ``ctime`` (no
  one can set it back), so a file changed so after its check is checked again (a store
  through a mapping may not be seen: a reader maps a file entry after its check, and sees
  such stores as it would in any local tar). As in git's "racy"
  rule, a pass is remembered only for a file whose ``ctime`` is over :data:`RACY_S` seconds
  old, so a change within the same clock tick as the last one is never missed. The cache
  therefore touches an entry for its LRU order at most every ``DirCache.TOUCH_S`` seconds.
- **A failed check** deletes the entry, warns (``RuntimeWarning`` naming the cache file and
  the bytes that differ) and reports a miss: the caller fetches the bytes again. A failed
  entry is never served.
"""

from __future__ import annotations

import os
import struct
import threading
import time
import zlib
from array import array
from collections.abc import Callable, Sequence
from typing import Any

Crc = Callable[[bytes, int], int]
"""A grain crc: ``crc(data, running)`` -> the crc of the bytes before ``data`` and ``data``
(``running``: ``0`` at a grain's start). ``data`` is ``bytes`` (google-crc32c takes no views)."""

__all__ = [
    "GRAIN",
    "ENTRY_HEAD",
    "RACY_S",
    "SUM_SUFFIX",
    "Grains",
    "CRC32",
    "CRC32C",
    "Crc",
    "bind",
    "crc_of",
    "grain_kind",
    "check_bytes",
    "check_head",
    "check_file",
    "decode_sums",
    "encode_sums",
    "file_crcs",
    "forget",
    "head_of",
    "sums_size",
    "is_known",
    "remember",
    "vouch",
    "forget_own",
]

GRAIN = 1 << 20
"""Bytes per crc of a file entry (and per progress flag of its download)."""

ENTRY_HEAD = struct.Struct("<8sQII")
"""The record before a bytes entry's data (24 bytes): magic, length, data crc, record crc."""

_MAGIC = b"TIENTRY1"  # the data's crc: zlib crc32
_MAGIC_C = b"TIENTRY2"  # the data's crc: crc32c
_SUM_MAGIC = b"TISUMS01"  # grains' crc: zlib crc32
_SUM_MAGIC_C = b"TISUMS02"  # grains' crc: crc32c
CRC32 = "crc32"
"""zlib's crc32 (ISO 3309), the grains' crc of a process without google-crc32c."""
CRC32C = "crc32c"
"""crc32c (Castagnoli, RFC 3720 §B.4) by google-crc32c, the grains' crc when it is compiled."""
_SUM_HEAD = struct.Struct("<8sQQII")  # magic, size, grain, bind, crc32 of the crcs
SUM_SUFFIX = ".sum"
"""The suffix of a file entry's checksum record (``<name>.sum`` beside ``<name>``)."""

RACY_S = 2.0
"""A pass is remembered only for a file whose ``ctime`` is older than this (seconds)."""

_MEMO_MAX = 1 << 16

_memo: dict[str, tuple[int, int, int, int]] = {}
_own: dict[str, tuple[int, tuple[int, int, int, int]]] = {}
"""Files this process wrote and computed the crcs of (:func:`vouch`): pid, identity."""
_memo_lock = threading.Lock()


def bind(key: str, name: str) -> int:
    """The crc32 of ``key/name``: the seed that ties a checksum to its entry."""
    return zlib.crc32(f"{key}/{name}".encode())


_crc32c: list[Any] = []  # google_crc32c once imported (None: not installed)


def _castagnoli() -> Any:
    """The ``google_crc32c`` module, or ``None`` (imported at first use: not by ``import tarindex``)."""
    if not _crc32c:
        try:
            import google_crc32c
        except ImportError:
            _crc32c.append(None)
        else:
            _crc32c.append(google_crc32c)
    return _crc32c[0]


def _writes_c() -> bool:
    """Whether this process writes crc32c (google-crc32c's compiled implementation is installed)."""
    c = _castagnoli()
    return c is not None and c.implementation == "c"


def grain_kind() -> str:
    """The grain crc this process writes (module docs).

    :data:`CRC32C` if google-crc32c computes it in compiled code, else :data:`CRC32`.
    """
    return CRC32C if _writes_c() else CRC32


def _extend_c(data: bytes, crc: int) -> int:
    c = _castagnoli()
    return int(c.extend(crc, data if type(data) is bytes else bytes(data)))


def crc_of(kind: str) -> Crc | None:
    """The grain crc named ``kind`` (:data:`CRC32` or :data:`CRC32C`), or ``None``.

    ``None``: this process cannot compute it (crc32c without google-crc32c, an unknown name).
    """
    if kind == CRC32:
        return zlib.crc32
    if kind == CRC32C and _castagnoli() is not None:
        return _extend_c
    return None


def _data_crc(magic: bytes, key: str, name: str, data: bytes) -> int | None:
    """The crc of a bytes entry's data by the rule ``magic`` names; ``None``: not computable."""
    if magic == _MAGIC:
        return zlib.crc32(data, bind(key, name))
    c = _castagnoli()
    if magic != _MAGIC_C or c is None:
        return None
    return int(c.extend(c.value(f"{key}/{name}".encode()), data))


def head_of(key: str, name: str, data: bytes | memoryview) -> bytes:
    """The :data:`ENTRY_HEAD` record of bytes entry ``(key, name)`` holding ``data``.

    Its crc is a crc32c when google-crc32c's compiled implementation is installed, else
    zlib's crc32 (module docs).
    """
    magic = _MAGIC_C if _writes_c() else _MAGIC
    crc = _data_crc(magic, key, name, data if isinstance(data, bytes) else bytes(data))
    n = len(data)
    return ENTRY_HEAD.pack(magic, n, crc, zlib.crc32(struct.pack("<8sQI", magic, n, crc)))


def check_bytes(key: str, name: str, head: bytes, data: bytes, known: bool) -> str | None:
    """Why the bytes entry ``(key, name)`` read as ``head`` + ``data`` is bad, or ``None``.

    Args:
        key: The entry's key.
        name: The entry's name.
        head: Its first :data:`ENTRY_HEAD` ``.size`` bytes.
        data: The rest of it.
        known: The file passed its check earlier in this process (:func:`is_known`) and
            has not changed since: only the record's fields are compared, not the crc of
            ``data``.
    """
    bad = check_head(head, len(data))
    if bad is not None or known:
        return bad
    magic, n, crc = ENTRY_HEAD.unpack(head)[:3]
    got = _data_crc(magic, key, name, data)
    if got is None:
        return "its checksum is a crc32c, which this process cannot compute: pip install google-crc32c"
    if got != crc:
        return f"bytes {ENTRY_HEAD.size}..{ENTRY_HEAD.size + n} differ from their checksum"
    return None


def check_head(head: bytes, n: int) -> str | None:
    """Why a bytes entry with record ``head`` and ``n`` bytes of data is bad, or ``None``.

    The record's fields only, before the data are read: a file grown past its record is
    refused without reading it (:meth:`DirCache.get <tarindex.storage.cache.DirCache.get>`).

    Args:
        head: Its first :data:`ENTRY_HEAD` ``.size`` bytes.
        n: The length of its data (the file's size less the record), in bytes.
    """
    if len(head) != ENTRY_HEAD.size:
        return f"its checksum record is cut ({len(head)} of {ENTRY_HEAD.size} bytes)"
    magic, want, crc, rcrc = ENTRY_HEAD.unpack(head)
    if magic not in (_MAGIC, _MAGIC_C):
        return (
            "it does not start with a checksum record (its first bytes were changed, or an "
            "older tarindex wrote it)"
        )
    if rcrc != zlib.crc32(struct.pack("<8sQI", magic, want, crc)):
        return "its checksum record (bytes 0..24) is damaged"
    if want != n:
        return f"it holds {n} bytes, its record says {want}"
    return None


class Grains:
    """The crc of each grain of a file being written in order, range by range.

    Args:
        size: The file's size in bytes.
        grain: Bytes per crc.
        kind: The crc (:data:`CRC32` or :data:`CRC32C`). Defaults to :func:`grain_kind`.

    Raises:
        ValueError: ``kind`` cannot be computed in this process (:func:`crc_of`).
    """

    def __init__(self, size: int, grain: int, kind: str | None = None) -> None:
        self.size = size
        self.grain = grain
        self.kind = grain_kind() if kind is None else kind
        crc = crc_of(self.kind)
        if crc is None:
            raise ValueError(f"no {self.kind} in this process: pip install google-crc32c")
        self.crc: Crc = crc
        """The grains' crc function."""
        self.crcs = array("I", bytes(4 * (-(-size // grain) if size else 0)))

    def feed(self, pos: int, chunk: bytes | memoryview, crc: int) -> int:
        """Add ``chunk``; return the running crc of the grain it ends in.

        ``chunk`` is at byte ``pos`` of the file, right after the bytes ``crc`` ran over
        since the start of their grain (``0`` at a grain's start).
        """
        g, f = self.grain, self.crc
        if type(chunk) is not bytes:
            chunk = bytes(chunk)
        k, n = 0, len(chunk)
        while k < n:
            room = g - pos % g
            part = chunk if k == 0 and n <= room else chunk[k : k + room]  # (a copy: crossing)
            crc = f(part, crc)
            k += len(part)
            pos += len(part)
            if pos % g == 0 or pos == self.size:
                self.crcs[(pos - 1) // g] = crc
                crc = 0
        return crc


def file_crcs(fd: int, size: int, grain: int, kind: str | None = None) -> array[int]:
    """The crc of each ``grain`` bytes of the first ``size`` bytes of file ``fd``.

    ``kind``: the crc (:data:`CRC32` or :data:`CRC32C`); defaults to :func:`grain_kind`.

    Raises:
        OSError: The file is shorter than ``size`` (``EIO``) or cannot be read.
        ValueError: ``kind`` cannot be computed in this process.
    """
    f = crc_of(grain_kind() if kind is None else kind)
    if f is None:
        raise ValueError(f"no {kind} in this process: pip install google-crc32c")
    out = array("I")
    pos = 0
    while pos < size:  # a read per grain: google-crc32c takes bytes, not views of a larger read
        want = min(grain, size - pos)
        buf = os.pread(fd, want, pos)
        if len(buf) != want:
            raise OSError(5, f"short read: {len(buf)} of {want} bytes at byte {pos}")
        out.append(f(buf, 0))
        pos += want
    return out


def encode_sums(
    key: str, name: str, size: int, grain: int, crcs: Sequence[int], kind: str | None = None
) -> bytes:
    """The ``<name>.sum`` record of file entry ``(key, name)``.

    ``crcs``: one per grain, by ``kind`` (:data:`CRC32` or :data:`CRC32C`; defaults to
    :func:`grain_kind`).
    """
    kind = grain_kind() if kind is None else kind
    magic = _SUM_MAGIC_C if kind == CRC32C else _SUM_MAGIC
    body = array("I", crcs).tobytes()
    return _SUM_HEAD.pack(magic, size, grain, bind(key, name), zlib.crc32(body)) + body


def sums_size(size: int, grain: int = GRAIN) -> int:
    """The length in bytes of the ``.sum`` record of a file of ``size`` bytes."""
    return _SUM_HEAD.size + 4 * (-(-size // grain) if size else 0)


def decode_sums(
    key: str, name: str, rec: bytes, size: int
) -> tuple[int, array[int], str] | str:
    """``(grain, crcs, kind)`` of a ``.sum`` record of entry ``(key, name)``, or why it is bad.

    ``size``: the entry's size in bytes, as its caller expects it. ``kind``: the grains'
    crc (:data:`CRC32` or :data:`CRC32C`), one this process can compute (a crc32c record
    in a process without google-crc32c is bad: it cannot be checked).
    """
    if len(rec) < _SUM_HEAD.size:
        return "its checksum record is cut"
    magic, n, grain, b, crc = _SUM_HEAD.unpack_from(rec)
    body = rec[_SUM_HEAD.size :]
    if magic not in (_SUM_MAGIC, _SUM_MAGIC_C) or grain <= 0 or zlib.crc32(body) != crc:
        return "its checksum record is damaged"
    kind = CRC32C if magic == _SUM_MAGIC_C else CRC32
    if crc_of(kind) is None:
        return "its checksums are crc32c, which this process cannot compute (pip install google-crc32c)"
    if b != bind(key, name):
        return "its checksum record belongs to another entry"
    if n != size or len(body) != 4 * (-(-size // grain) if size else 0):
        return f"its checksum record is of a file of {n} bytes, not {size}"
    crcs = array("I")
    crcs.frombytes(body)
    return grain, crcs, kind


def check_file(fd: int, size: int, grain: int, crcs: array[int], kind: str) -> str | None:
    """Why file ``fd`` differs from its grain crcs (naming the first bad bytes), or ``None``.

    ``kind``: the crcs' rule (:func:`decode_sums`).
    """
    try:
        got = file_crcs(fd, size, grain, kind)
    except OSError as e:
        return f"it cannot be read whole ({e})"
    for g, (a, b) in enumerate(zip(got, crcs, strict=True)):
        if a != b:
            return f"bytes {g * grain}..{min((g + 1) * grain, size)} differ from their checksum"
    return None


def _ident(st: os.stat_result) -> tuple[int, int, int, int]:
    return (st.st_dev, st.st_ino, st.st_size, st.st_ctime_ns)


def is_known(path: str, st: os.stat_result) -> bool:
    """Whether ``path`` passed its check in this process and is unchanged (``st``: now)."""
    ident = _ident(st)
    return _memo.get(path) == ident or _own.get(path) == (os.getpid(), ident)


def remember(path: str, before: os.stat_result, after: os.stat_result) -> None:
    """Remember that ``path`` passed its check (see the module docs).

    ``before``/``after``: its stat around the read that was checked; the pass is kept only
    if it did not change meanwhile and its ``ctime`` is older than :data:`RACY_S`.
    """
    ident = _ident(after)
    if ident != _ident(before) or time.time_ns() - after.st_ctime_ns < RACY_S * 1e9:
        return
    with _memo_lock:
        if len(_memo) >= _MEMO_MAX:
            _memo.clear()
        _memo[path] = ident


def vouch(path: str, st: os.stat_result) -> None:
    """Take ``path`` (now ``st``) as checked: this process wrote it and computed its crcs.

    For a download's entry, whose grain crcs this process computed from the replies' bytes
    as it wrote them: reading the file back to check it against those crcs would only
    check this process's own writes (18 MB shards: ~9 ms each, a sixth of a streaming
    epoch's main thread). Unlike :func:`remember`, no ``ctime`` age is asked: a change by
    another program in the same clock tick as the rename is not seen by this process (as
    a change to the download's temp file is not, docs/REMOTE.md "The trust boundary is
    the process"); any later change sets a new ``ctime`` and the file is checked again;
    other processes, forked children included, check it on their first open as always.
    """
    with _memo_lock:
        if len(_own) >= _MEMO_MAX:
            _own.clear()
        _own[path] = (os.getpid(), _ident(st))


def forget_own() -> None:
    """Forget every file :func:`vouch` took as checked (for tests of a cold process).

    Each is checked at its next open in this process, as in another process.
    """
    with _memo_lock:
        _own.clear()


def forget(path: str) -> None:
    """Forget a pass of ``path`` (its entry was deleted or replaced)."""
    _memo.pop(path, None)
    _own.pop(path, None)
