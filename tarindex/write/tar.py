"""One tar shard and its sidecar index, written in one pass, atomically (FORMAT.md §1, §2).

:class:`TarShardWriter` knows members, not samples: it writes the headers (plain ustar, pax
only where a name or size needs it), each member's data and padding, the shard id and the
zstd dictionary member, and on :meth:`TarShardWriter.close` the end blocks, the rename and the
index. :class:`tarindex.ShardWriter` (:mod:`tarindex.write.shards`) turns sample dicts into
members and rolls from one shard to the next.
"""

from __future__ import annotations

import bisect
import errno
import gzip
import os
import time
import zlib
from typing import Any, BinaryIO

import numpy as np

from .._version import __version__
from ..errors import WriterError
from ..format.group import group_members
from ..format.index import encode_index, fingerprint
from ..format.manifest import ManifestRow
from ..format.spec import (
    BLOCK,
    MAX_ZSTD_DICT_BYTES,
    SHARD_ID_BYTES,
    TAR_RECORD_BYTES,
    USTAR_MAX_SIZE,
    ZSTD_DICT_MEMBER,
    ZSTD_DICT_META,
)
from ..format.tar import ZERO_BLOCK, build_global_header, build_member_header, padded
from ..format.zstd_dict import DictEntry, entry_for
from ..storage.indexfile import fsync_dir, index_path_for, temp_path_for, write_atomic

__all__ = [
    "DIRECT_WRITE_BYTES",
    "GZIP_SUFFIXES",
    "SHARD_ID_COMMENT",
    "TarShardWriter",
    "WRITE_BUFFER_BYTES",
    "check_mtime",
    "finished_size",
    "padded_to",
]

_ZEROS = bytes(BLOCK)  # a member's zero padding is a slice of it

WRITE_BUFFER_BYTES = 1 << 20
"""A shard's writes gather up to this many bytes (1 MiB) before going to the file."""
DIRECT_WRITE_BYTES = 64 << 10
"""A sample (or other write) of this many bytes (64 KiB) or more goes to the file at once,
behind the buffered bytes, in one ``os.writev``: its data is not copied into the buffer."""


GZIP_SUFFIXES = (".tar.gz", ".tgz")
"""Shard names written gzip-compressed (the whole tar, one gzip stream), as webdataset's
``TarWriter`` does for a name ending in ``gz``."""


def check_mtime(mtime: int | None) -> int:
    """Now, or ``mtime`` if it fits the 11 octal digits of the ustar mtime field."""
    t = int(time.time()) if mtime is None else int(mtime)
    if not 0 <= t <= USTAR_MAX_SIZE:  # same 12-byte field width as size
        raise WriterError(
            f"mtime {mtime!r} does not fit a ustar header (0 <= mtime <= {USTAR_MAX_SIZE}); a wider "
            f"value would shift every byte after it and corrupt the tar"
        )
    return t


SHARD_ID_COMMENT = b"tarindex-shard "
"""Prefix of the pax ``comment`` record that carries the shard id (FORMAT.md §1)."""


class TarShardWriter:
    """Write one shard: a plain ustar tar (pax only where a name or size needs it) + its index.

    The tar starts with a pax global header whose ``comment`` record carries a random 16-byte
    shard id (1 KiB; every tool skips it), so a tar written by another run never matches an
    older index, even with the same members and mtimes (FORMAT.md §1, §3). Each member's crc32
    is recorded in the same pass (FORMAT.md §2.8.2).

    Data goes to ``<path>.<pid>.<random>.tmp``. :meth:`close` writes the end-of-archive
    blocks, fsyncs the tar, removes the old index of ``path`` (if any), renames the tar into
    place, then writes the new index atomically and fsyncs the directory. A crash at any step
    leaves either the old pair, or a tar without an index (``IndexMissingError``), or the new
    pair: never a tar beside an index that does not describe it. :meth:`abort` deletes the
    temp file.

    Args:
        path: Final path of the tar.
        mtime: Modification time stored in every header, integer seconds since the epoch,
            ``0 <= mtime < 8**11``. Defaults to now.
        durable: ``fsync`` the tar, the index and the directory (FORMAT.md §1). ``False``
            skips that for scratch data. Defaults to ``True``.
        shard_id: The 16-byte id to embed. Defaults to ``None`` (random).

    A ``path`` ending in ``.tar.gz`` or ``.tgz`` (:data:`GZIP_SUFFIXES`) is written as one
    gzip stream of the same tar (gzip header mtime 0, so the same samples give the same
    bytes), without a sidecar index: the index format of compressed tars belongs to the
    readers that build one (``tarindex index``); :attr:`row` stays ``None``.

    Raises:
        WriterError: If ``mtime`` does not fit the 12-byte ustar mtime field, or
            ``shard_id`` is not 16 bytes.
    """

    def __init__(
        self,
        path: str,
        mtime: int | None = None,
        *,
        durable: bool = True,
        shard_id: bytes | None = None,
    ) -> None:
        self.path = os.fspath(path)
        self.tmp = temp_path_for(self.path)
        self.mtime = check_mtime(mtime)
        self.durable = durable
        self.shard_id = os.urandom(SHARD_ID_BYTES) if shard_id is None else bytes(shard_id)
        if len(self.shard_id) != SHARD_ID_BYTES:
            raise WriterError(f"shard_id must be {SHARD_ID_BYTES} bytes, got {len(self.shard_id)}")
        os.makedirs(os.path.dirname(os.path.abspath(self.path)), exist_ok=True)
        self.gzip = self.path.endswith(GZIP_SUFFIXES)
        """Whether the tar is written gzip-compressed (a ``.tar.gz``/``.tgz`` path)."""
        self.pos = 0
        """Bytes of the tar so far, the ones still in the write buffer included."""
        self.count = 0
        self._buf = bytearray()  # bytes after ``_flushed``, not yet in the file
        self._flushed = 0  # bytes in the file
        # (tar offset, sample key, or what else) of each write in the buffer, to name a failure
        self._marks: list[tuple[int, str, str | None]] = []
        self._error: OSError | None = None  # a failed flush: the shard takes no more bytes
        self._names: list[bytes] = []
        self._offsets: list[int] = []
        self._sizes: list[int] = []
        self._crcs: list[int] = []
        self._keys: set[str] = set()
        self.zstd_dict: DictEntry | None = None
        """Where the shard's zstd dictionary was written (:meth:`write_zstd_dict`), or None."""
        self.row: ManifestRow | None = None
        """After :meth:`close`: the shard's manifest row (FORMAT.md §9), from what was written."""
        # opened last: nothing in this constructor runs after the temp file exists, so a signal
        # (Ctrl-C, a write_shards worker's Stop) cannot leave a temp file no writer object knows
        self._raw, self._f = _open_temp(self.tmp, self.gzip)

    def _write(self, pieces: list[Any], key: str, what: str | None = None) -> None:
        """Append ``pieces`` (bytes-like) to the tar: the sample ``key``, or ``what`` else.

        Small writes gather in a buffer of up to :data:`WRITE_BUFFER_BYTES` that goes to the
        file in one system call; a write of :data:`DIRECT_WRITE_BYTES` or more goes at once,
        behind the buffer, in one ``os.writev`` (its data is not copied). :attr:`pos` counts
        both; :meth:`close` flushes the buffer before the end blocks and the fsync, and any
        failure there aborts the shard, so an index never describes bytes not in the file.

        Raises:
            OSError: As :meth:`_flush`, when this write flushes or an earlier flush failed.
        """
        if self._error is not None:  # the file stops short of earlier bytes: never append
            raise self._error
        self._marks.append((self.pos, key, what))
        n = 0
        for p in pieces:
            n += len(p)
        if n >= DIRECT_WRITE_BYTES:
            self._flush(pieces)
        else:
            buf = self._buf
            for p in pieces:
                buf += p
            if len(buf) >= WRITE_BUFFER_BYTES:
                self._flush([])
        self.pos += n

    def _flush(self, extra: list[Any]) -> None:
        """Write the buffer, then ``extra``, to the file (one ``os.writev``, resumed if short).

        Raises:
            OSError: ``ENOSPC``, ``EFBIG``, ``EIO``...: the message names the shard, the byte
                the file stopped at and the sample (or shard id, dictionary, end blocks) whose
                bytes those are; the caller aborts the shard. Every later flush (and so
                :meth:`close`) raises the same error: the file never gets bytes after a gap.
        """
        if self._error is not None:  # the file stops short of earlier bytes: never append
            raise self._error
        rest: list[Any] = [self._buf, *extra] if self._buf else list(extra)
        done = 0
        try:
            if self.gzip:
                for p in rest:
                    self._f.write(p)
                    done += len(p)
            else:
                fd = self._raw.fileno()
                while rest:
                    n = os.writev(fd, rest[:_IOV_MAX])
                    if n == 0:  # not seen on a file; never spin
                        raise OSError(errno.EIO, os.strerror(errno.EIO))
                    done += n
                    i = 0
                    while i < len(rest) and n >= len(rest[i]):
                        n -= len(rest[i])
                        i += 1
                    rest = rest[i:]
                    if n:
                        rest[0] = memoryview(rest[0])[n:]
        except OSError as e:
            at = self._flushed + done
            starts = [m[0] for m in self._marks]
            _, key, what = self._marks[max(bisect.bisect_right(starts, at) - 1, 0)]
            failed = what or f"sample {key!r}"
            self._error = OSError(
                e.errno,
                f"{self.path}: byte {at}: writing the shard failed ({failed}): {e.strerror}",
            )
            raise self._error from e
        self._flushed += done
        self._buf = bytearray()
        self._marks.clear()

    def prepare(
        self, key: str, members: list[tuple[str, bytes]]
    ) -> tuple[list[tuple[bytes, bytes, bytes]], int]:
        """Build the headers of one sample: ``([(name, header, data), ...], bytes it adds)``.

        The byte count includes the shard-id header before the first sample and each
        member's zero padding, so a caller can keep a shard under a size bound.

        Raises:
            WriterError: If ``key`` was already written to this shard, or a member name is
                not encodable as UTF-8 (nothing of the sample is written then).
        """
        if key in self._keys:
            raise WriterError(
                f"{self.path}: key {key!r} written twice in this shard (byte {self.pos}); keys "
                f"must be unique within a shard (FORMAT.md §4): give each sample its own key"
            )
        try:  # every name before any byte: a failure never leaves half a sample in the tar
            named = [(f"{key}.{ext}".encode(), data) for ext, data in members]
        except UnicodeEncodeError as e:
            raise WriterError(
                f"{self.path}: sample {key!r}: name not encodable as UTF-8 ({e})"
            ) from None
        out = []
        n = 2 * BLOCK if self.pos == 0 else 0  # the shard-id header
        mtime = self.mtime
        for name, data in named:
            header = build_member_header(name, len(data), mtime)
            out.append((name, header, data))
            n += len(header) + padded(len(data))
        return out, n

    def write(self, key: str, members: list[tuple[str, bytes]]) -> None:
        """Append one sample: ``members`` is ``[(ext, data), ...]`` already encoded.

        The caller has checked ``key`` and the extensions (:func:`tarindex.format.keys.check_key`,
        :func:`~tarindex.format.keys.check_ext`); the members are written adjacently, in order
        (FORMAT.md §1).

        Raises:
            WriterError: As :meth:`prepare`.
        """
        self.write_prepared(key, self.prepare(key, members)[0])

    def _start(self) -> None:
        if self.pos == 0:
            sid = SHARD_ID_COMMENT + self.shard_id.hex().encode()
            header = build_global_header([(b"comment", sid)], self.mtime)
            self._write([header], "", "the shard id header")

    def write_zstd_dict(self, data: bytes) -> None:
        """Store the shard's zstd dictionary: a member in no sample, before the first sample.

        The member is named ``ZSTD_DICT_MEMBER`` (FORMAT.md §7); the index records its
        offset, size, crc32 and dictionary id in its metadata.

        Raises:
            WriterError: If a sample or a dictionary was already written, or ``data`` is
                larger than ``MAX_ZSTD_DICT_BYTES``.
        """
        if self.count or self.zstd_dict is not None:
            raise WriterError(f"{self.path}: the zstd dictionary goes before the first sample")
        if not 0 < len(data) <= MAX_ZSTD_DICT_BYTES:
            raise WriterError(
                f"{self.path}: a zstd dictionary of {len(data)} bytes; FORMAT.md §7 allows 1 to "
                f"{MAX_ZSTD_DICT_BYTES}"
            )
        self._start()
        header = build_member_header(ZSTD_DICT_MEMBER, len(data), self.mtime)
        entry = entry_for(data, self.pos + len(header))
        self._write([header, data, _ZEROS[: -len(data) % BLOCK]], "", "the zstd dictionary")
        self.zstd_dict = entry

    def write_prepared(self, key: str, prepared: list[tuple[bytes, bytes, bytes]]) -> None:
        """Append one sample built by :meth:`prepare` (for the same ``key``).

        Its headers, data and padding go to the write buffer, or straight to the file if
        large (see :meth:`_write`).

        Raises:
            OSError: If a flush fails; the message names the shard, the byte and the sample.
        """
        self._start()
        pieces: list[bytes] = []
        offsets: list[int] = []
        pos = self.pos
        for _, header, data in prepared:
            size = len(data)
            pieces.append(header)
            pos += len(header)
            offsets.append(pos)
            pieces.append(data)
            pad = -size % BLOCK
            if pad:
                pieces.append(_ZEROS[:pad])
            pos += size + pad
        self._write(pieces, key)
        self._keys.add(key)
        crc32 = zlib.crc32
        for (name, _, data), off in zip(prepared, offsets, strict=True):
            self._names.append(name)
            self._offsets.append(off)
            self._sizes.append(len(data))
            self._crcs.append(crc32(data))
        self.count += 1

    def close(self) -> None:
        """Finish the tar and put the pair in place (see the class docstring for the order).

        The tar ends with two 512-byte zero blocks, padded with zeros to a multiple of 10240
        bytes.

        Raises:
            OSError: If writing or renaming fails (``ENOSPC``, ...); the temp file is removed.
        """
        try:
            end = self.pos
            stop = end + 2 * BLOCK
            end_blocks = ZERO_BLOCK * 2 + bytes(padded_to(stop, TAR_RECORD_BYTES) - stop)
            self._write([end_blocks], "", "the end-of-archive blocks")
            self._flush([])  # every byte in the file before the fsync and the index
            if self.gzip:
                self._f.close()  # the gzip trailer; the file itself stays open
            self._raw.flush()
            if self.durable:
                os.fsync(self._raw.fileno())
            if self.gzip:  # an index of an earlier tar of this name never stays beside it
                self._raw.close()
                try:
                    os.unlink(index_path_for(self.path))
                except FileNotFoundError:
                    pass
                os.replace(self.tmp, self.path)
                if self.durable:
                    fsync_dir(self.path)
                return
            size = self.pos
            # the first and last 4 KiB, read back from the page cache (not tracked per write)
            fd = self._raw.fileno()
            head, tail = fingerprint(lambda off, n: os.pread(fd, n, off), size)
            self._raw.close()
            res = group_members(
                self._names,
                self._offsets,
                self._sizes,
                tar_size=size,
                head_crc=head,
                tail_crc=tail,
                meta={"producer": "tarindex.writer", "version": __version__},
            )
            t = res.tables
            t.end = end
            t.shard_id = self.shard_id if self.count else b""
            if self.zstd_dict is not None:
                t.meta[ZSTD_DICT_META] = self.zstd_dict.meta()
            crc_at = dict(zip(self._offsets, self._crcs, strict=True))  # index order may differ
            t.member_crc = np.asarray([crc_at[o] for o in t.offset.tolist()], np.uint32)
            index = encode_index(t)
            ipath = index_path_for(self.path)
            try:  # an old index must never sit beside the new tar, even for a moment
                os.unlink(ipath)
            except FileNotFoundError:
                pass
            os.replace(self.tmp, self.path)
        except BaseException:
            self.abort()
            raise
        write_atomic(ipath, index, durable=self.durable)
        self.row = ManifestRow(
            self.path, t.n_samples, t.n_members, size, len(index), head, tail, t.shard_id.hex()
        )

    def abort(self) -> None:
        """Discard the shard being written (delete the temp file)."""
        try:
            try:
                self._f.close()
            finally:
                self._raw.close()
        finally:
            try:
                os.unlink(self.tmp)
            except FileNotFoundError:
                pass


def _open_temp(tmp: str, gz: bool) -> tuple[BinaryIO, Any]:
    """Create the temp file and the stream written to it (gzip for a ``.tar.gz``).

    The file is opened for reading too (the fingerprint is read back at close). On any
    exception here, a signal included, the file is removed.
    """
    raw: BinaryIO | None = None
    try:
        # unbuffered for a plain tar: TarShardWriter buffers itself and writes with os.writev
        raw = open(tmp, "w+b", buffering=-1 if gz else 0)
        return raw, (gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0) if gz else raw)
    except BaseException:  # also after open returned, before ``raw`` was stored
        if raw is not None:
            raw.close()
        try:
            os.unlink(tmp)  # a fresh pid + random name: if it exists, it is this one's
        except FileNotFoundError:
            pass
        raise


_IOV_MAX = 1024  # os.writev's pieces per call (IOV_MAX on Linux and macOS)


def padded_to(n: int, multiple: int) -> int:
    """Return ``n`` rounded up to a multiple of ``multiple``."""
    return -(-n // multiple) * multiple


def finished_size(pos: int) -> int:
    """Size in bytes of a tar whose members end at ``pos`` once its end blocks are written."""
    return padded_to(pos + 2 * BLOCK, TAR_RECORD_BYTES)
