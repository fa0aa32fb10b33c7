"""Walk the headers of an existing tar and list its members, whatever tool made it.

The walk reads only header blocks (via mmap; member data is skipped, never read) and
understands: v7, old GNU, GNU and POSIX ustar headers; the ustar prefix field; GNU
LongName ('L') and LongLink ('K') records; pax extended ('x', Solaris 'X') and global ('g')
headers, including ``path`` and ``size`` overrides; base-256 numbers; every octal terminator
style; the signed-checksum variant; concatenated archives (zero blocks in the middle, as
``tar --ignore-zeros`` reads them); GNU volume labels and multi-volume parts.
Sources: POSIX.1-2001 "pax Interchange Format", GNU tar manual "Basic Tar Format".
The decisions (links, sparse files, duplicates, name decoding, ...) are in docs/TAR_DIALECTS.md.

What is listed: regular files (typeflag '0', NUL, '7'). Not samples: directories (also the
v7 form, a regular-file header whose name ends in '/'), symlinks, hard links, character and
block devices, fifos, GNU volume labels, dumpdirs and unknown typeflags. GNU sparse members
('S', or pax ``GNU.sparse.*``) and multi-volume continuations ('M') are not contiguous bytes in
the tar: they are skipped with a warning.

Speed: the walk is a linked list (each header gives the size that leads to the next), so it is
a Python loop; it does the least possible per header (the typeflag byte, the size field) and
defers everything else to numpy over batches of gathered header blocks: the checksum of every
header, the names of plain members and the ustar prefix. A header whose checksum fails is
reported at its own offset even when the walk had already passed it (the earliest bad header
wins over any later error). The same walk, while the tar is mapped, takes its fingerprint
(FORMAT.md §3), so building an index (:func:`tarindex.build.build_index`) opens the tar once.
Tar field offsets and typeflags are the named constants of :mod:`tarindex.format.spec`.
Beside the walk: :mod:`tarindex.index.members` builds the member table from what it recorded,
:mod:`tarindex.index.damage` words the errors of a cut or damaged file, and
:mod:`tarindex.index.paxfast` reads the common pax-header-plus-member pair in one step.
"""

from __future__ import annotations

import mmap
import os
import re
import warnings

import numpy as np
from numpy.typing import NDArray

from ..errors import (
    NotATarError,
    TarHeaderError,
    TarIndexError,
    TruncatedError,
)
from ..format.spec import (
    AREGTYPE,
    BLKTYPE,
    BLOCK,
    CHRTYPE,
    CONTTYPE,
    DIRTYPE,
    FIFOTYPE,
    GNU_SPARSE_EXT_ISEXTENDED,
    GNU_SPARSE_ISEXTENDED,
    GNUTYPE_DUMPDIR,
    GNUTYPE_LONGLINK,
    GNUTYPE_LONGNAME,
    GNUTYPE_MULTIVOL,
    GNUTYPE_NAMES,
    GNUTYPE_SPARSE,
    GNUTYPE_VOLHDR,
    LNKTYPE,
    NO_DATA_TYPES,
    REGTYPE,
    REGULAR_TYPES,
    SOLARIS_XHDTYPE,
    SYMTYPE,
    TAR_LINKNAME,
    TAR_NAME,
    TAR_PREFIX,
    TAR_SIZE,
    TAR_TYPEFLAG,
    XGLTYPE,
    XHDTYPE,
)
from ..format.tar import (
    ZERO_BLOCK,
    checksum_ok,
    header_checksums,
    header_name,
    padded,
    parse_number,
    parse_pax,
    record_size_problem,
)
from ..storage.bytesource import open_regular
from .damage import (
    after_zeros,
    checksum_error,
    cut_member_error,
    eof_error,
    eof_warning,
    fail_head,
)
from .members import Members, assemble_members
from .paxfast import plain_pax_member

__all__ = ["Members", "scan", "scan_members"]

_BATCH = 2048  # headers checked together: their blocks are still in the CPU cache (~1 MiB)
_VOLUME_RE = re.compile(rb" Volume [0-9]+\Z")  # GNU tar -M -V: "LABEL Volume N"

_KIND = {
    LNKTYPE: "hard link",
    SYMTYPE: "symlink",
    CHRTYPE: "character device",
    BLKTYPE: "block device",
    DIRTYPE: "directory",
    FIFOTYPE: "fifo",
    GNUTYPE_VOLHDR: "GNU volume label",
    GNUTYPE_DUMPDIR: "GNU dumpdir",
    GNUTYPE_NAMES: "GNU old long-name record",
}
_FIX = ": re-copy or re-create the tar"
_PAX_TYPES = frozenset((XHDTYPE, SOLARIS_XHDTYPE, XGLTYPE))  # pax 'size' never applies to these
_MAX_SIZE_DIGITS = 18  # a pax size of 19+ significant digits is >= 10**18 bytes: refused
# Header offsets the fast paths index directly (relative to the header's first byte): the
# size field's 11 octal digits end where its terminator byte (NUL or space) sits.
_TF = TAR_TYPEFLAG
_SIZE_AT = TAR_SIZE.start
_SIZE_TERM = TAR_SIZE.stop - 1
_NAME_LEN = TAR_NAME.stop - TAR_NAME.start
_SLASH = ord("/")


def scan_members(
    path: str | os.PathLike[str], *, require_end: bool = True, checksums: bool = False
) -> Members:
    """Walk the tar's headers and return its regular-file members (see module docs).

    Args:
        path: Path of a plain (uncompressed) tar (a regular file: a FIFO or device is
            refused at once, never read).
        require_end: Refuse a file that ends right after a member's data or padding without
            the end-of-archive zero blocks (``TruncatedError``): a copy cut at a member
            boundary looks exactly like that. ``False`` accepts such a file with a warning
            (every member listed is complete; a cut inside a header or a member's data is
            still an error). Defaults to ``True``. docs/TAR_DIALECTS.md, "End of archive".
        checksums: Also compute each member's crc32 (reads all the data; FORMAT.md
            §2.8.2). Defaults to ``False``.

    Returns:
        :class:`Members` in archive order, with the tar's fingerprint (FORMAT.md §3) taken
        from the same mapping.

    Raises:
        NotATarError: Empty file, or the first block is not a tar header.
        CompressedTarError: The file is gzip/bzip2/xz/zstd/lz4 data.
        ChecksumError: A header block's checksum is wrong (offset given).
        TarHeaderError: A numeric field is not a number, a pax record is malformed, or a pax
            or long-name record is not followed by a member.
        TruncatedError: The file ends inside a header or a member's data, or (unless
            ``require_end=False``) before the end-of-archive marker.
        TrailingGarbageError: Non-zero bytes that are not a header follow the end marker.
        NotATarError: Also when ``path`` is a FIFO, socket or device.
        OSError: The file cannot be opened (``FileNotFoundError``, ``IsADirectoryError``, ...).
    """
    path = os.fspath(path)
    fd = open_regular(path, "a tar", NotATarError)
    try:
        size = os.fstat(fd).st_size
        if size == 0:
            raise NotATarError(f"{path}: byte 0: empty file (0 bytes), expected a tar header")
        mm = mmap.mmap(fd, 0, access=mmap.ACCESS_READ)
    finally:
        os.close(fd)
    try:
        return _Walk(path, mm, size, require_end, checksums).run()
    finally:
        try:
            mm.close()
        except BufferError:  # a numpy view is still referenced by a traceback: GC closes it
            pass


class _Rewind(Exception):
    """The fast loop jumped over the data of member ``k``, a v7 directory: resume after it."""

    def __init__(self, k: int) -> None:
        super().__init__(k)
        self.k = k


class _Walk:
    """One header walk over a mapped tar (state for the slow path; the fast loop is in run)."""

    def __init__(
        self,
        path: str,
        mm: mmap.mmap,
        size: int,
        require_end: bool = True,
        checksums: bool = False,
    ) -> None:
        self.path = path
        self.mm = mm
        self.size = size
        self.require_end = require_end
        self.checksums = checksums
        nb = size // BLOCK
        self.blocks = np.frombuffer(mm, np.uint8, count=nb * BLOCK).reshape(nb, BLOCK)
        self.mpos: list[int] = []  # header offset of every member (archive order)
        self.msize: list[int] = []
        self.names: dict[int, bytes] = {}  # member number -> name resolved by the slow path
        self.deferred: list[int] = []  # slow-path header offsets whose checksum is not checked yet
        self.checked = 0  # members mpos[:checked] have had their checksum verified
        self.skipped: list[tuple[int, str, str]] = []  # (header offset, name, reason)
        self.pax: dict[bytes, bytes] = {}
        self.gpax: dict[bytes, bytes] = {}
        self.longname: bytes | None = None
        self.longlink: bytes | None = None  # GNU 'K' record: the next link member's target
        self.pending_at = -1  # offset of a pax/long-name record still waiting for its member
        self.volume_label: bytes | None = None
        self.fast_names: list[bytes] = []  # names of mpos[:checked], from the name/prefix fields
        self.dirs: list[int] = []  # member numbers that turned out to be v7 directories

    # -- checksums and names, in batches ---------------------------------------------------
    def flush(self) -> None:
        """Verify every deferred header checksum; raise ChecksumError at the earliest bad one.

        Also extracts the names of the members the fast path recorded since the last flush,
        while their header blocks are still in the CPU cache.

        Raises ``_Rewind`` when one of these members is a v7 directory whose size field is
        not zero and whose header is good: the fast loop jumped over its "data", which is the
        next header (a directory has no data; libarchive, Go and tarfile read it so).
        """
        lo = self.checked
        fast = np.array(self.mpos[lo:], np.int64)
        bad_at = -1
        rows = self.blocks[fast >> 9]
        if len(fast):
            bad_at = self._first_bad(rows, fast)
        if self.deferred:
            slow = np.array(self.deferred, np.int64)
            b = self._first_bad(self.blocks[slow >> 9], slow)
            if b >= 0 and (bad_at < 0 or b < bad_at):
                bad_at = b
        self.deferred = []
        cut = self._v7_dir_with_size(rows, fast, lo, bad_at) if len(fast) else -1
        if cut >= 0:  # every header before it is good; the walk after it was misaligned
            self.checked = lo + cut + 1
            self._names_of(rows[: cut + 1], fast[: cut + 1], lo)
            raise _Rewind(lo + cut)
        self.checked = len(self.mpos)
        if bad_at >= 0:
            self._raise_checksum(bad_at)
        if len(fast):
            self._names_of(rows, fast, lo)

    def _v7_dir_with_size(
        self, rows: NDArray[np.uint8], pos: NDArray[np.int64], lo: int, bad_at: int
    ) -> int:
        """Return the first row that is a v7 directory with a non-zero size field, or -1.

        v7 directory: typeflag NUL, header name ending in ``/`` (and no pax or long name
        replacing it). Only rows before the first bad header (``bad_at``) count.
        """
        nul = np.flatnonzero(rows[:, _TF] == 0)  # old archives only: '0' is what tools write
        if len(nul) == 0:
            return -1
        sub = rows[nul]
        fields = np.zeros((len(nul), _NAME_LEN + 1), np.uint8)
        fields[:, :_NAME_LEN] = sub[:, TAR_NAME]
        la = (fields == 0).argmax(axis=1)
        last = fields[np.arange(len(nul)), np.maximum(la - 1, 0)]
        sizes = np.array(self.msize[lo:], np.int64)[nul]
        for i in nul[(last == _SLASH) & (sizes > 0)].tolist():
            if 0 <= bad_at <= int(pos[i]):
                return -1
            if lo + i not in self.names:
                return int(i)
        return -1

    def _rewind(self, k: int) -> int:
        """Forget everything after member ``k`` (a v7 directory); return where to resume.

        The fast loop records a member only with no pax, long-name or global record
        pending, so that is the state to resume in.
        """
        p = self.mpos[k]
        del self.mpos[k + 1 :], self.msize[k + 1 :], self.fast_names[k + 1 :]
        self.msize[k] = 0
        self.names = {i: n for i, n in self.names.items() if i <= k}
        self.dirs = [i for i in self.dirs if i <= k]
        self.skipped = [e for e in self.skipped if e[0] < p]
        self.pax, self.gpax = {}, {}
        self.longname = self.longlink = None
        self.pending_at = -1
        return p + BLOCK

    def _first_bad(self, rows: NDArray[np.uint8], pos: NDArray[np.int64]) -> int:
        computed, stored = header_checksums(rows)
        for i in np.flatnonzero(computed != stored).tolist():
            p = int(pos[i])
            if not checksum_ok(self.mm[p : p + BLOCK]):
                return p  # positions are ascending within one batch
        return -1

    def _names_of(self, rows: NDArray[np.uint8], pos: NDArray[np.int64], lo: int) -> None:
        m = len(pos)
        fields = np.zeros((m, _NAME_LEN + 1), np.uint8)  # the name field plus one NUL column
        fields[:, :_NAME_LEN] = rows[:, TAR_NAME]
        la = (fields == 0).argmax(axis=1)  # length = index of the first NUL
        blob = fields.tobytes()
        w = _NAME_LEN + 1
        names = [blob[s : s + n] for s, n in zip(range(0, w * m, w), la.tolist(), strict=False)]
        # ustar prefix: only headers with the POSIX magic and a non-empty prefix field
        for i in np.flatnonzero(rows[:, TAR_PREFIX.start]).tolist():
            p = int(pos[i])
            block = self.mm[p : p + BLOCK]
            names[i] = header_name(block)
        # v7 directories: a regular-file header whose name ends in '/'
        last = fields[np.arange(m), np.maximum(la - 1, 0)]
        dirs = np.flatnonzero(last == _SLASH)
        if len(dirs):
            self.dirs.extend((dirs + lo).tolist())
        self.fast_names.extend(names)

    def _raise_checksum(self, pos: int) -> None:
        raise checksum_error(self.path, self.mm[pos : pos + BLOCK], pos)

    def fail(self, exc: TarIndexError) -> TarIndexError:
        """Return ``exc`` unless an earlier header already fails its checksum (then raise that)."""
        self.flush()
        return exc

    # -- the walk --------------------------------------------------------------------------
    def run(self) -> Members:
        path, mm, size = self.path, self.mm, self.size
        if size < BLOCK:
            fail_head(path, mm[:size])
            raise NotATarError(
                f"{path}: byte 0: file is {size} bytes, shorter than one 512-byte tar header "
                f"(found {mm[:16]!r})"
            )
        if not checksum_ok(mm[:BLOCK]) and mm[:BLOCK] != ZERO_BLOCK:
            self._raise_checksum(0)
        pos = 0
        while True:
            try:
                self.walk(pos)
                self.flush()
                return self.finish()
            except _Rewind as r:  # a v7 directory with a size field (rare): resume after it
                pos = self._rewind(r.k)

    def walk(self, pos: int) -> None:
        """The header loop from ``pos`` to the end of the file (the fast path inline)."""
        mm, size = self.mm, self.size
        mpos, msize = self.mpos, self.msize
        mapp, sapp = mpos.append, msize.append
        slow = self.slow
        # the named offsets and typeflags as locals: as cheap as the literals in this loop
        o_tf, o_size, o_term, reg, areg, xhd = _TF, _SIZE_AT, _SIZE_TERM, REGTYPE, AREGTYPE, XHDTYPE
        mask = BLOCK - 1
        pending = False
        limit = size - BLOCK
        while pos <= limit:
            tf = mm[pos + o_tf]
            # AREGTYPE is 0: a NUL typeflag is a member only if the name is not empty
            if (tf == reg or tf == areg) and not pending and (tf or mm[pos]):
                f = mm[pos + o_size : pos + o_term]
                t = mm[pos + o_term]
                if (t == 0 or t == 0x20) and f.isdigit():  # NUL or space terminator
                    try:
                        ms = int(f, 8)
                    except ValueError:  # digits 8 or 9: the slow path reports it
                        ms = -1
                    end = pos + BLOCK + ms
                    if ms >= 0 and end <= size:
                        mapp(pos)
                        sapp(ms)
                        pos = end + (-ms & mask)
                        if len(mpos) - self.checked >= _BATCH:
                            self.flush()
                        continue
            elif tf == xhd and not pending:  # pax header + regular member (webdataset, tarfile)
                nxt = self.fast_pax(pos)
                if nxt >= 0:
                    pos = nxt
                    if len(mpos) - self.checked >= _BATCH:
                        self.flush()
                    continue
            pos = slow(pos)
            if pos < 0:
                break
            pending = self.pending_at >= 0 or bool(self.gpax)
        else:
            self.at_eof(pos)

    def fast_pax(self, pos: int) -> int:
        """Record a pax 'x' header at ``pos`` and the plain regular member it describes.

        Returns the offset of the next header, or -1 (nothing recorded) whenever anything is
        unusual (:func:`tarindex.index.paxfast.plain_pax_member`; data past EOF too): the slow
        path then handles and reports it. Both header checksums are verified in the next
        batch, like the fast loop's.
        """
        got = plain_pax_member(self.mm[pos : pos + 3 * BLOCK])
        if got is None:
            return -1
        ms, path = got
        hdr = pos + 2 * BLOCK
        if hdr + BLOCK + ms > self.size:
            return -1  # cut short: the slow path names the member
        return self._fast_pax_commit(pos, hdr, ms, path)

    def _fast_pax_commit(self, pos: int, hdr: int, ms: int, path: bytes | None) -> int:
        self.deferred.append(pos)
        if path is not None:
            self.names[len(self.mpos)] = path
        self.mpos.append(hdr)
        self.msize.append(ms)
        return hdr + BLOCK + ms + (-ms & (BLOCK - 1))

    def finish(self) -> Members:
        """The member table of the finished walk (:func:`tarindex.index.members.assemble_members`)."""
        self.blocks = np.empty((0, BLOCK), np.uint8)  # release the view of the mmap
        return assemble_members(
            self.path,
            self.mm,
            self.size,
            self.mpos,
            self.msize,
            self.fast_names,
            self.names,
            self.dirs,
            self.skipped,
            self.checksums,
        )

    def at_eof(self, pos: int) -> None:
        """The walk reached ``pos`` >= size - 511 without an end-of-archive marker.

        Raises ``TruncatedError``; with ``require_end=False``, a file that ends right after
        a member's data or inside its zero padding is accepted with a warning instead
        (:func:`tarindex.index.damage.eof_error`).
        """
        exc = eof_error(self.path, self.mm, pos, self.size, self.require_end, self.pending_at)
        if exc is not None:
            raise self.fail(exc)
        self.flush()  # never warn about a file whose headers are garbage
        warnings.warn(eof_warning(self.path, pos, self.size), stacklevel=5)

    def slow(self, pos: int) -> int:
        """Handle the header at ``pos`` in full; return the next header's offset, or -1 at the end."""
        path, mm, size = self.path, self.mm, self.size
        block = mm[pos : pos + BLOCK]
        if block == ZERO_BLOCK:
            if self.pending_at >= 0:
                raise self.fail(
                    TarHeaderError(
                        f"{path}: byte {self.pending_at}: a pax or GNU long-name record is followed "
                        f"by the end-of-archive marker at byte {pos}, not by a member; the archive "
                        f"is damaged{_FIX}"
                    )
                )
            nxt = self.after_end(pos)
            self.gpax = {}
            return -1 if nxt >= size else nxt
        self.deferred.append(pos)
        tf = block[_TF]
        try:
            hsize = parse_number(block[TAR_SIZE])
        except ValueError:
            raise self.fail(
                TarHeaderError(
                    f"{path}: byte {pos + _SIZE_AT}: size field of the header at byte {pos} is "
                    f"{block[TAR_SIZE]!r}, not an octal or base-256 number; the header is "
                    f"corrupt{_FIX}"
                )
            ) from None
        too_big = record_size_problem(tf, hsize)
        if too_big is not None:  # before any of its data is read
            raise self.fail(
                TarHeaderError(
                    f"{path}: byte {pos}: {too_big}; the archive is damaged or hostile: "
                    f"re-create it with shorter names and smaller pax records"
                )
            )
        pax = self.pax
        if self.gpax:
            pax = {**self.gpax, **pax}
        msize = hsize
        if tf not in _PAX_TYPES and pax.get(b"size"):
            sv = pax[b"size"]
            if not sv.isdigit() or len(sv.lstrip(b"0")) > _MAX_SIZE_DIGITS:
                raise self.fail(
                    TarHeaderError(
                        f"{path}: byte {pos}: pax size {sv[:40]!r} ({len(sv)} bytes) is not a "
                        f"decimal number below 10**18 (POSIX pax 'size' keyword); the pax header "
                        f"is corrupt{_FIX}"
                    )
                )
            msize = int(sv.lstrip(b"0") or b"0")  # int() refuses > 4300 digits, zeros too
        if msize < 0:
            raise self.fail(
                TarHeaderError(
                    f"{path}: byte {pos + _SIZE_AT}: negative size {msize} (base-256), expected a "
                    f"size >= 0; the header is corrupt{_FIX}"
                )
            )
        if tf in _PAX_TYPES and hsize == 0:
            raise self.fail(
                TarHeaderError(
                    f"{path}: byte {pos}: empty pax {'global ' if tf == XGLTYPE else ''}extended "
                    f"header (size 0, no records); a pax header carries at least one record "
                    f"(bsdtar refuses it too); the archive is damaged{_FIX}"
                )
            )
        data = pos + BLOCK
        if tf in NO_DATA_TYPES:
            has_data = False
        elif tf == AREGTYPE and self._name(block, pax).endswith(b"/"):
            has_data = False  # v7 directory: its size field is not the length of any data
        elif tf == LNKTYPE:  # hard link: data only in pax, or when no header follows (libarchive)
            has_data = msize > 0 and (bool(self.pax) or not self._header_at(data))
        else:
            has_data = True
        if tf == GNUTYPE_SPARSE:  # 'S' old GNU sparse: extension blocks before the data
            data = self._sparse_ext(pos, block)
        end = data + (msize if has_data else 0)
        if end > size:
            self.truncated_member(pos, block, msize, end)
            return -1
        nxt = data + (padded(msize) if has_data else 0)
        if tf == GNUTYPE_LONGNAME:  # 'L' GNU LongName
            self.longname = mm[data:end].split(b"\0", 1)[0]
            self.pending_at = pos
        elif tf == GNUTYPE_LONGLINK:  # 'K' GNU LongLink (target of the next link member)
            self.longlink = mm[data:end].split(b"\0", 1)[0]
            self.pending_at = pos
        elif tf == XHDTYPE or tf == SOLARIS_XHDTYPE:  # 'x' pax extended header ('X': Solaris)
            # several in a row: the last one applies, whole (GNU tar, Go, bsdtar)
            self.pax = self._pax(data, end, "pax extended header")
            self.pending_at = pos
        elif tf == XGLTYPE:  # 'g' pax global header: applies to every later member of this archive
            for k, v in self._pax(data, end, "pax global header").items():
                if v:
                    self.gpax[k] = v
                else:
                    self.gpax.pop(k, None)
            self.gpax = {k: v for k, v in self.gpax.items() if k in (b"path", b"size")}
        else:
            self.member(pos, block, tf, pax, msize, data)
            self.pax = {}
            self.longname = self.longlink = None
            self.pending_at = -1
        return nxt

    def _header_at(self, pos: int) -> bool:
        b = self.mm[pos : pos + BLOCK]
        return len(b) < BLOCK or b == ZERO_BLOCK or checksum_ok(b)

    def _pax(self, data: int, end: int, what: str) -> dict[bytes, bytes]:
        try:
            return parse_pax(self.mm[data:end])
        except ValueError as e:
            raise self.fail(
                TarHeaderError(f"{self.path}: byte {data}: malformed {what}: {e}{_FIX}")
            ) from None

    def _sparse_ext(self, pos: int, block: bytes) -> int:
        """Skip the extension blocks of an old GNU sparse header; return where its data starts."""
        data = pos + BLOCK
        ext = block[GNU_SPARSE_ISEXTENDED]
        while ext:
            if data + BLOCK > self.size:
                raise self.fail(
                    TruncatedError(
                        f"{self.path}: byte {data}: file ends inside the sparse map of the member at "
                        f"byte {pos}; it was cut short: copy it again"
                    )
                )
            ext = self.mm[data + GNU_SPARSE_EXT_ISEXTENDED]
            data += BLOCK
        return data

    def member(
        self, pos: int, block: bytes, tf: int, pax: dict[bytes, bytes], msize: int, data: int
    ) -> None:
        """Record the non-metadata header at ``pos``: a regular member, or a skipped entry."""
        name = self._name(block, pax)
        if tf in REGULAR_TYPES:
            # v7 directory: a regular-file header whose name ends in '/'
            if name.endswith(b"/") and tf != CONTTYPE:
                self._skip(pos, name, "directory")
            elif any(k.startswith(b"GNU.sparse.") for k in pax):
                self._warn_skip(pos, pax.get(b"GNU.sparse.name", name), "pax sparse file")
            else:
                if name != header_name(block):
                    self.names[len(self.mpos)] = name
                self.mpos.append(pos)
                self.msize.append(msize)
        elif tf == GNUTYPE_SPARSE:
            self._warn_skip(pos, name, "GNU sparse file")
        elif tf == GNUTYPE_MULTIVOL:
            self._warn_skip(
                pos, name, "multi-volume continuation (its start is in the previous volume)"
            )
        elif tf == GNUTYPE_VOLHDR:
            if pos == 0:
                self.volume_label = name
            self._skip(pos, name, _KIND[tf])
        elif tf in _KIND:
            kind = _KIND[tf]
            if tf == LNKTYPE or tf == SYMTYPE:
                # pax linkpath, else a GNU LongLink ('K') record, else the 100-byte field
                target = pax.get(b"linkpath") or self.longlink
                if target is None:
                    target = block[TAR_LINKNAME].split(b"\0", 1)[0]
                kind += " to " + target.decode("utf-8", "surrogateescape")
            self._skip(pos, name, kind)
        else:
            self._warn_skip(pos, name, f"member of unknown type {chr(tf)!r}")

    def _skip(self, pos: int, name: bytes, why: str) -> None:
        self.skipped.append((pos, name.decode("utf-8", "surrogateescape"), why))

    def _warn_skip(self, pos: int, name: bytes, what: str) -> None:
        self.flush()  # never warn about a header that is really garbage
        self._skip(pos, name, what)
        warnings.warn(
            f"{self.path}: byte {pos}: member {self.skipped[-1][1]!r} is a {what}, not stored as "
            f"contiguous bytes; skipped (extract and re-pack it to include it)",
            stacklevel=6,
        )

    def _name(self, block: bytes, pax: dict[bytes, bytes]) -> bytes:
        if pax.get(b"path"):
            return pax[b"path"]
        if self.longname is not None:
            return self.longname
        return header_name(block)

    def truncated_member(self, pos: int, block: bytes, msize: int, end: int) -> None:
        """The member at ``pos`` runs past EOF: a cut file, or the end of one multi-volume part."""
        name = self._name(block, self.pax)
        if (
            self.volume_label is not None
            and _VOLUME_RE.search(self.volume_label)
            and self.size % BLOCK == 0
            and block[_TF] in REGULAR_TYPES
        ):
            self._warn_skip(
                pos, name, "member continued in the next volume of a multi-volume archive"
            )
            return
        raise self.fail(cut_member_error(self.path, self.size, name, pos, msize, end))

    def after_end(self, pos: int) -> int:
        """Skip zero blocks at ``pos``; return where the next archive starts, or ``size`` at the end.

        Concatenated archives continue after the zeros (GNU ``--ignore-zeros``); anything else
        non-zero after the end marker is trailing garbage (:func:`tarindex.index.damage.after_zeros`).
        """
        nxt = after_zeros(self.path, self.mm, pos, self.size)
        if isinstance(nxt, TarIndexError):
            raise self.fail(nxt)
        return nxt


def scan(path: str | os.PathLike[str], *, require_end: bool = True) -> Members:
    """List the regular-file members of a tar: names, data offsets (bytes) and sizes (bytes).

    Returns:
        :class:`Members`: ``raw_names`` (list of ``m`` bytes), ``offset`` and ``size`` (shape
        ``(m,)``, dtype ``<u8``, bytes from the start of the tar), in archive order.

    Same as :func:`scan_members` (``require_end`` as there).

    Raises:
        FormatError: As :func:`scan_members` (:class:`~tarindex.errors.NotATarError`,
            :class:`~tarindex.errors.CompressedTarError`, :class:`~tarindex.errors.ChecksumError`,
            :class:`~tarindex.errors.TarHeaderError`, :class:`~tarindex.errors.TruncatedError`,
            :class:`~tarindex.errors.TrailingGarbageError`).
    """
    return scan_members(path, require_end=require_end)
