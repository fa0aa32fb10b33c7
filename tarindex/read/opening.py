"""How a shard is opened: its index (mapped, read, fetched or cached) and its tar's source.

:class:`ShardOpener` is the opening half of :class:`~tarindex.read.shard.ShardReader`: a local
index is mapped, a remote one (or one kept apart from a remote tar) comes from memory, the
cache or the network; the tar is a mapping, a ``pread`` descriptor or a
:class:`~tarindex.storage.remote.RemoteSource`; then its size and fingerprint are checked
against the index (FORMAT.md §3, :mod:`tarindex.read.checks`). A remote tar's open-time
checks are read in one concurrent batch, and an index from memory or the cache that does not
match its tar is fetched again once before the error is raised.
"""

from __future__ import annotations

import mmap
import os
import warnings
from functools import partial
from typing import Any

from ..errors import FormatError, StaleIndexError, TruncatedError
from ..format.gzindex import GzipIndex
from ..format.index import IndexTables, decode_index
from ..format.packed import PackedFile, packed_of
from ..format.spec import HEADER
from ..storage.bytesource import ByteSource, PreadSource, open_source
from ..storage.gzsource import GzipSource
from ..storage.remote import (
    Pin,
    RemoteOptions,
    RemoteSource,
    find_copy,
    forget_index,
    is_url,
    learns_versions,
    load_indexes,
    local_path,
    open_copy,
    pinned,
)
from ..storage.tarcache import copy_fix, drop_copy, unpacked_copy
from . import checks
from .mapped import MappedSource
from .paths import open_regular_file, read_local_index

__all__ = ["ShardOpener"]


class ShardOpener:
    """Opens a shard's index and tar source into ``self`` (the base of ``ShardReader``)."""

    tar_path: str
    index_path: str
    verify_data: bool
    index: IndexTables
    tar_size: int
    _imm: mmap.mmap | None
    _src: ByteSource | None
    _mapped: Any = None
    """The kernel's ``Mapped`` of a mapped tar (:class:`MappedSource`), else ``None``."""
    tar_ident: checks.Ident = (0, 0, 0)
    """The local tar's device, inode and mtime (ns) when opened (``(0, 0, 0)``: remote)."""
    _checks: dict[tuple[int, int], bytes] | None
    _packed: PackedFile | None = None
    """A zstd/xz/bzip2/lz4 shard's compressed file (FORMAT.md §11), else ``None``."""
    copy_path: str | None = None
    """The decompressed copy in the tar cache that a zstd/xz/bzip2/lz4 shard is read from
    (FORMAT.md §11), else ``None``."""
    _remote_opts: RemoteOptions

    def close(self) -> None:
        """Release what was opened: defined by ``ShardReader.close``."""
        raise NotImplementedError

    @property
    def source(self) -> ByteSource:
        """The tar's byte source: defined by ``ShardReader.source``."""
        raise NotImplementedError

    def _open_local(self, use_mmap: bool, full_check: bool, check_crc: bool) -> None:
        """Map the index, open the tar's source and check the fingerprint (FORMAT.md §3)."""
        tar_path = self.tar_path
        try:
            fi = open(open_regular_file(self.index_path), "rb")
        except FileNotFoundError:
            raise checks.missing_index(tar_path, self.index_path) from None
        with fi:
            isize = os.fstat(fi.fileno()).st_size
            if isize < HEADER.size:
                raise TruncatedError(
                    f"{self.index_path}: index is {isize} bytes, shorter than its {HEADER.size}-byte "
                    f"header at byte 0; rebuild it with: tarindex index --force {tar_path}"
                )
            self._imm = mmap.mmap(fi.fileno(), 0, access=mmap.ACCESS_READ)
        try:
            self._decode(memoryview(self._imm), full_check, check_crc)
            fd = open_regular_file(tar_path)
            if self.index.gzip is not None:  # the tar inside a gzip file (FORMAT.md §10)
                self._open_gzip(PreadSource(tar_path, fd, os.fstat(fd).st_size), self.index.gzip)
                return
            if self._packed is not None:  # a decompressed copy (FORMAT.md §11)
                raw = PreadSource(tar_path, fd, os.fstat(fd).st_size)
                self._open_packed(self._packed, raw, None, use_mmap)
                return
            try:
                st = os.fstat(fd)
                self.tar_size, self.tar_ident = st.st_size, checks.ident_of(st)
                checks.check_size(self.index, self.tar_size, self.tar_path, self.index_path)
                if use_mmap and self.tar_size > 0:  # mapped by the kernel: guarded reads
                    src = MappedSource(tar_path, fd, self.tar_size, self.tar_ident)
                    self._src, self._mapped = src, src.mapped
            except BaseException:
                if self._src is None:
                    os.close(fd)
                raise
            if self._src is None:
                self._src = open_source(tar_path, fd, self.tar_size, False)
            self._check_fingerprint()
        except BaseException:
            self.close()
            raise

    def _open_remote(self, opts: RemoteOptions, full_check: bool, check_crc: bool) -> None:
        """The index from memory, the cache or the network; the tar as a :class:`RemoteSource`.

        The open-time checks (FORMAT.md §3) read the tar with ranged reads, fetched together
        in one batch. An index taken from memory or the cache that does not match the tar is
        fetched again once (it may have been rebuilt) before the error is raised.
        """
        for attempt in (0, 1):
            fresh = True
            try:
                if is_url(self.index_path):
                    data, fresh = load_indexes([self.index_path], [self.tar_path], opts)[0]
                else:
                    data = read_local_index(self.tar_path, self.index_path)
                self._decode(memoryview(data), full_check, check_crc)
                gz = self.index.gzip
                pf = self._packed
                if pf is not None:  # a decompressed copy (FORMAT.md §11)
                    if is_url(self.tar_path):
                        self._open_packed(pf, None, opts, True)
                    else:
                        fd = open_regular_file(local_path(self.tar_path))
                        raw = PreadSource(self.tar_path, fd, os.fstat(fd).st_size)
                        self._open_packed(pf, raw, None, True)
                    return
                if is_url(self.tar_path):
                    t = self.index
                    ident = f"{t.tar_size}:{t.head_crc}:{t.tail_crc}"
                    if gz is not None:  # the compressed file is the object read
                        ident = f"gz:{gz.gz_size}:{gz.head_crc}:{gz.tail_crc}"
                    copy = find = None
                    if opts.fetch == "shard" and gz is None:  # the whole tar, from the cache
                        # complete, or downloading (started now unless held: else ranges
                        # until it runs, find); the version learnt once per process
                        find = partial(find_copy, self.tar_path, opts, ident)
                        copy = open_copy(self.tar_path, opts, ident)
                    if copy is not None and copy.pieces is None:
                        # complete: mapped (cache entries are replaced whole, never cut)
                        self._src = self._map_copy(copy.fd, copy.size)
                    elif copy is not None:
                        # being downloaded: reads wait for their pieces; the open-time checks
                        # read the server (not the pieces still to come), in a round started
                        # now and awaited by the first read
                        self.tar_size = copy.size
                        starts, ends = checks.open_ranges(t, t.tar_size)
                        rs = list(zip(starts.tolist(), ends.tolist(), strict=True))
                        whole = RemoteSource(
                            self.tar_path,
                            copy.size,
                            opts,
                            ident,
                            copy.pin,
                            (rs, self._deferred_checks),
                        )
                        self._src, self._remote_opts = whole, opts
                        whole.read_copy(copy.fd, copy.pieces)
                        return
                    elif gz is None and not opts.download_whole and learns_versions(self.tar_path):
                        # no request now: the checks go with the first read (docs/REMOTE.md)
                        self.tar_size = t.tar_size
                        starts, ends = checks.open_ranges(t, t.tar_size)
                        rs = list(zip(starts.tolist(), ends.tolist(), strict=True))
                        # a whole shard not downloading yet: its version is known, so its
                        # checks run now beside its first (pinned) reads
                        pin = pinned(self.tar_path) if find is not None else None
                        self._src = ranged = RemoteSource(
                            self.tar_path, t.tar_size, opts, ident,
                            pin if pin is not None and pin.size == t.tar_size else None,
                            (rs, self._deferred_checks),
                        )
                        self._remote_opts = opts
                        if find is not None:
                            ranged.join_copy(find)
                        return
                    else:
                        self._src = ranged = RemoteSource.open(self.tar_path, opts, ident)
                        if find is not None:
                            ranged.join_copy(find)
                    if gz is not None:
                        self._open_gzip(self._src, gz)
                        return
                elif gz is not None:
                    fd = open_regular_file(local_path(self.tar_path))
                    self._open_gzip(PreadSource(self.tar_path, fd, os.fstat(fd).st_size), gz)
                    return
                else:
                    fd = open_regular_file(local_path(self.tar_path))
                    st = os.fstat(fd)
                    self.tar_ident = checks.ident_of(st)
                    self._src = open_source(self.tar_path, fd, st.st_size, False)
                self.tar_size = self._src.size
                checks.check_size(self.index, self.tar_size, self.tar_path, self.index_path)
                # one concurrent batch for all the open-time checks
                starts, ends = checks.open_ranges(self.index, self.tar_size)
                src = self._src
                rs = list(zip(starts.tolist(), ends.tolist(), strict=True))
                if isinstance(src, RemoteSource):  # from the server, never from the cache
                    got = src.fetch_fresh(rs)
                else:
                    buf, bases = src.read_ranges(starts, ends)
                    got = [buf[o : o + b - a] for (a, b), o in zip(rs, bases.tolist(), strict=True)]
                self._checks = {(a, b - a): g for (a, b), g in zip(rs, got, strict=True)}
                self._check_fingerprint()
                return
            except StaleIndexError:
                self.close()
                if fresh or attempt or not is_url(self.index_path):
                    raise
                forget_index(self.index_path, opts)
            except BaseException:
                self.close()
                raise

    def _map_copy(self, fd: int, size: int) -> ByteSource:
        """A local copy of a remote tar (descriptor ``fd``, owned), mapped by the kernel.

        Its mtime is not compared (:data:`checks.Ident`): the cache writes a copy's pieces
        while it is read (the remote layer pins each piece it serves).
        """
        try:
            self.tar_ident = (*checks.ident_of(os.fstat(fd))[:2], -1)
            if size > 0:
                src = MappedSource(self.tar_path, fd, size, self.tar_ident)
                self._mapped = src.mapped
                return src
        except BaseException:
            os.close(fd)
            raise
        return open_source(self.tar_path, fd, size, False)

    def _open_gzip(self, raw: ByteSource, gz: GzipIndex) -> None:
        """Serve the tar inside the gzip file ``raw`` through its seek points (FORMAT.md §10).

        The compressed file is checked against the ``GZIX`` record first, then the tar
        inside against the index as any tar (FORMAT.md §3), through the decompressing source.
        """
        try:
            self._src = raw
            checks.check_gzip(self.index, raw.size, raw.read, self.tar_path, self.index_path)
            self._src = GzipSource(self.tar_path, raw, gz, self.index.tar_size)
        except BaseException:
            raw.close()
            raise
        self.tar_size = self.index.tar_size
        self._check_fingerprint()

    def _open_packed(
        self, pf: PackedFile, raw: ByteSource | None, opts: RemoteOptions | None, use_mmap: bool
    ) -> None:
        """Serve the tar inside a zstd/xz/bzip2/lz4 file through its decompressed copy (§11).

        The compressed file (``raw``, local; closed here) is checked against the index's
        ``compressed`` metadata first; then the copy in the tar cache
        (:func:`~tarindex.storage.tarcache.unpacked_copy`: made once per machine if missing,
        a remote file downloaded once for it, ``opts``) is mapped by the kernel and checked
        against the index as any tar (FORMAT.md §3), or read with ``pread`` when not
        ``use_mmap``. Its mtime is not compared (the cache touches an entry it serves).
        """
        want = (pf.size, pf.head_crc, pf.tail_crc)

        def check(src: ByteSource) -> None:
            checks.check_compressed(want, src.size, src.read, self.tar_path, self.index_path)

        if raw is not None:
            try:
                check(raw)
            finally:
                raw.close()
        for attempt in (0, 1):
            fd, size, copy = unpacked_copy(
                self.tar_path, pf.format, self.index.tar_size, opts, None if raw else check
            )
            self.copy_path = copy
            if use_mmap:
                self._src = self._map_copy(fd, size)
            else:
                self.tar_ident = (*checks.ident_of(os.fstat(fd))[:2], -1)
                self._src = open_source(self.tar_path, fd, size, False)
            self.tar_size = size
            try:
                checks.check_size(self.index, self.tar_size, self.tar_path, self.index_path)
                self._check_fingerprint()
                return
            except StaleIndexError as e:
                # the compressed file matched the index: its copy is damaged or not its own
                self._src.close()
                self._src = self._mapped = None
                drop_copy(copy)
                if attempt:
                    raise StaleIndexError(
                        f"{e} [read from the decompressed copy {copy}, made again from "
                        f"{self.tar_path} after the same check failed: the compressed file "
                        f"changed since it was indexed]"
                    ) from None
                warnings.warn(
                    f"{self.tar_path}: its decompressed copy {copy} in the tar cache differs from "
                    f"its index ({e}); deleted and made again",
                    RuntimeWarning,
                    stacklevel=2,
                )

    def _check_opened(self) -> None:
        """The open-time checks after the fingerprint (:func:`checks.check_opened`), now.

        A deferred remote source runs them at its first read (:meth:`_deferred_checks`).
        """
        src = self._src
        if isinstance(src, RemoteSource) and not src.checked:
            return
        try:
            checks.check_opened(
                self.index,
                self.tar_size,
                self._read_check,
                self._guard,
                self.tar_path,
                self.index_path,
            )
        except StaleIndexError as e:
            self.close()
            if self.copy_path is None:
                raise
            drop_copy(self.copy_path)
            raise StaleIndexError(f"{e} [{copy_fix(self.tar_path, self.copy_path)}]") from None
        except BaseException:
            self.close()
            raise
        self._checks = None

    def _deferred_checks(self, got: dict[tuple[int, int], bytes], pin: Pin) -> None:
        """The open-time checks of a deferred remote source, on its first round's bytes.

        Raises:
            StaleIndexError: The tar does not match the index (its size, fingerprint, end,
                headers: FORMAT.md §3); the index is dropped from memory and the cache, so
                opening the dataset again fetches it again.
        """
        self._checks = got
        try:
            checks.check_size(self.index, pin.size, self.tar_path, self.index_path)
            self._check_fingerprint()
            checks.check_opened(
                self.index,
                self.tar_size,
                self._read_check,
                self._guard,
                self.tar_path,
                self.index_path,
            )
        except StaleIndexError:
            if is_url(self.index_path):
                forget_index(self.index_path, self._remote_opts)
            raise
        finally:
            self._checks = None

    def _guard(self, j: int) -> None:
        """The chunk guard of sample ``j``: defined by ``ShardReader``."""
        raise NotImplementedError

    def _check_fingerprint(self) -> None:
        checks.check_fingerprint(
            self.index, self.tar_size, self._read_check, self.tar_path, self.index_path
        )

    def _read_check(self, offset: int, size: int) -> bytes:
        """Bytes for an open-time check: from the batch read ahead (remote), else the source."""
        got = self._checks.get((offset, size)) if self._checks else None
        return got if got is not None else self.read(offset, size)

    def read(self, offset: int, size: int) -> bytes:
        """Bytes of the tar: defined by ``ShardReader.read``."""
        raise NotImplementedError

    def _decode(self, buf: memoryview, full_check: bool, check_crc: bool) -> None:
        self.index: IndexTables = decode_index(
            buf, self.index_path, full_check=full_check, check_crc=check_crc
        )
        self._packed = packed_of(self.index.meta, self.index_path)
        if self.index.gzip is not None or self._packed is not None:
            # a compressed shard's members are always checked against their crc32s: bytes
            # changed inside the compressed stream may inflate without an error (FORMAT.md §10),
            # a decompressed copy in the cache may be damaged or swapped after it was made (§11)
            self.verify_data = True
        if self.verify_data and self.index.member_crc is None:
            raise FormatError(
                f"{self.index_path}: verify_data=True (OpenOptions) but the index records no data "
                f"checksums (FORMAT.md §2.8.2); add them with: tarindex index --force "
                f"--checksums {self.tar_path}"
            )
