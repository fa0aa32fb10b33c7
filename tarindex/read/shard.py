"""One open shard: :class:`ShardReader`, the read kernel over one tar and its index.

A reader maps the sidecar index (zero-copy numpy views), checks it against the tar at open
(FORMAT.md §3, :mod:`tarindex.read.checks`), and serves every consumer through one guarded
kernel: :meth:`ShardReader.read_block` (a run of samples ``j0..j1``) and
:meth:`ShardReader.gather` (any samples) return a :class:`~tarindex.read.block.Block`;
:meth:`ShardReader.sample` is the one-sample form. All of them run the chunk guard
(:func:`tarindex.read.checks.check_chunk`) before their first read of each chunk of
:data:`~tarindex.read.checks.CHUNK` samples. Bytes come from a
:mod:`tarindex.storage.bytesource` (mmap or ``os.pread``) or a remote source. Its hot tables
(:class:`~tarindex.read.hot.HotTables`, :attr:`ShardReader.hot`) are what the per-sample
loops of a :class:`~tarindex.read.shardset.ShardSet` read.

Threads: a reader may be read from several threads at once (its lazily made caches are
made idempotently). ``close()`` may come from any thread: a read in flight then finishes with
the right bytes or raises :class:`~tarindex.errors.ClosedError`, never wrong bytes or another
error; a read begun after it raises ``ClosedError`` (docs/READING.md, "Threads").
"""

from __future__ import annotations

import mmap
import os
import zlib
from collections.abc import Collection, Sequence
from typing import Any

import numpy as np
from numpy.typing import NDArray

from ..errors import ChecksumError, SampleIndexError, TarIndexError
from ..format.keys import lookup_key, served_ext
from ..format.keytable import KeyTable, key_table
from ..format.zstd_dict import check_dict, dict_entry
from ..storage.bytesource import ByteSource, closed_error
from ..storage.indexfile import index_path_for
from ..storage.remote import RemoteOptions, is_url
from . import checks, kernel
from .block import Block, Sample, crc_mismatches, data_error
from .checks import CHUNK, CHUNK_SHIFT
from .fields import Fields, field_set
from .hot import CLOSED, HotTables, Mapped, fast_view, raw_view
from .opening import ShardOpener
from .runs import read_runs
from .spanner import check_index, check_indices

__all__ = ["ShardReader", "is_up_to_date"]

_UNREAD = object()  # ShardReader.zstd_dict() not called yet


class _ClosedIndex:
    """A closed reader's ``index``: any use raises :class:`~tarindex.errors.ClosedError`."""

    __slots__ = ("path",)

    def __init__(self, path: str) -> None:
        self.path = path

    def __getattr__(self, name: str) -> Any:
        raise closed_error(self.path)


def _decode_keys(blob: bytes, ptr: list[int]) -> list[str]:
    """Split ``blob`` at ``ptr`` (``len(ptr) - 1`` keys) and decode each (FORMAT.md §2.5)."""
    n = len(ptr) - 1
    if blob.isascii():
        text = blob.decode("ascii")
        return [text[ptr[i] : ptr[i + 1]] for i in range(n)]
    return [blob[ptr[i] : ptr[i + 1]].decode("utf-8", "surrogateescape") for i in range(n)]


class ShardReader(ShardOpener):
    """One open shard: its index (mapped) and its tar (a :mod:`~tarindex.bytesource`).

    Holds at most :data:`FDS_PER_SHARD` (2) file descriptors: the index mapping and the tar's.

    Args:
        tar_path: Path of the tar.
        index_path: Path of its index. Defaults to ``<tar_path>.tidx``.
        use_mmap: Map the tar (fast; a tar cut while mapped is ``TruncatedError``, not SIGBUS:
            :mod:`tarindex.read.mapped`). ``False`` reads with ``os.pread``. Defaults to ``True``.
        full_check: Also check every table entry now, O(n). Defaults to ``False`` (the
            tables of each chunk of samples are checked before its first read).
        check_crc: Check the index's crc32 footer at open (about 1 ms per MB of index).
            ``False`` skips it for huge indexes that ``verify`` has checked. Defaults to
            ``True``.
        verify_data: Check every member read against the crc32 the index records
            (FORMAT.md §2.8.2); a mismatch raises ``ChecksumError``. Catches bytes changed in
            place, at the cost of hashing every byte read. Defaults to ``False``.
        remote: How a remote tar or index (a URL) is read
            (:class:`tarindex.storage.remote.RemoteOptions`); the open-time checks then run through
            ranged reads. Defaults to ``RemoteOptions()``.

    Raises:
        IndexMissingError: No index file.
        FormatError: The index is truncated or corrupt (its subclasses say how, FORMAT.md
            §2.1, §2.7), or the index or tar is a FIFO, socket or device.
        StaleIndexError: The tar does not match the index: size, first/last 4 KiB, bytes after
            the archive's end, or a re-read member header differ (FORMAT.md §3).
        ChecksumError: The index's crc32 footer does not match (``check_crc``).
        FileNotFoundError: The tar itself is missing (its index exists).
        IsADirectoryError: The tar or index path is a directory.
        OSError: ``EMFILE`` and other errors of opening or mapping the files.
    """

    def __init__(
        self,
        tar_path: str,
        index_path: str | None = None,
        *,
        use_mmap: bool = True,
        full_check: bool = False,
        check_crc: bool = True,
        verify_data: bool = False,
        remote: RemoteOptions | None = None,
    ) -> None:
        self.tar_path = tar_path
        self.index_path = index_path or index_path_for(tar_path)
        self.verify_data = verify_data
        self._imm: mmap.mmap | None = None
        self._src: ByteSource | None = None
        self._checks: dict[tuple[int, int], bytes] | None = None  # remote: check bytes
        if is_url(self.index_path) or is_url(tar_path):
            self._open_remote(remote or RemoteOptions(), full_check, check_crc)
        else:
            self._open_local(use_mmap, full_check, check_crc)
        t = self.index
        self.n_samples = t.n_samples
        self.exts = [served_ext(e.decode("utf-8", "surrogateescape")) for e in t.exts]
        self._fold = checks.fold_exts(self.exts)  # lower-cased names: None unless one repeats
        self._mm: Mapped | None = self._mapped  # every read of the mapping goes through it
        # chunk c's tables passed check_samples (numpy view of the same bytes for gather)
        self._checked = bytearray(((self.n_samples + CHUNK - 1) >> CHUNK_SHIFT) or 1)
        self.checked_np = np.frombuffer(self._checked, np.uint8)
        """``uint8``: one flag per chunk of samples, 1 once its tables passed the guards."""
        if full_check:
            self._checked[:] = b"\x01" * len(self._checked)
        self._want: dict[frozenset[str], NDArray[np.bool_]] = {}
        self._want_b: dict[Collection[str], bytes] = {}
        self._zstd_dict: Any = _UNREAD  # zstd_dict(): read on first use
        # keys are sliced from the index mapping (bytes.decode beats str(memoryview)); an
        # index read into memory (remote) keeps a bytes copy of its key blob instead
        keys: bytes | mmap.mmap = self._imm if self._imm is not None else bytes(t.key_blob)
        kbase = t.sections["key_blob"][0] if self._imm is not None else 0
        scalar = self._mm is not None and not self.verify_data  # (forced for compressed shards)
        # the kernel's one-sample and batch loops over the same validated tables (and the
        # mapping they read), or None: pread, remote, verify_data
        tables = None
        if scalar:  # a local tar, or a remote one read from its whole copy in the cache
            tables = kernel.kernel.Tables(
                t.key_ptr,
                t.sample_ptr,
                keys,
                kbase,
                kbase + len(t.key_blob),
                t.ext_id,
                t.offset,
                t.size,
                self._mm,
                tuple(self.exts),
                self._checked,
            )
        self.hot: HotTables = HotTables(
            self._checked,
            fast_view(t.key_ptr),
            fast_view(t.sample_ptr),
            keys,
            kbase,
            tuple(self.exts),
            fast_view(t.ext_id),
            fast_view(t.offset),
            fast_view(t.size),
            self._mm,
            self.tar_size,
            raw_view(t.offset),
            raw_view(t.size),
            raw_view(t.ext_id),
            scalar,
            tables,
        )
        """The tables the per-sample loops read (:class:`~tarindex.read.hot.HotTables`); the
        compiled ``get``, ``take`` and ``batch`` look a reader's tables up here."""
        self._check_opened()  # (deferred to the first read for a deferred remote source)

    @property
    def source(self) -> ByteSource:
        """The tar's byte source (:class:`~tarindex.bytesource.MmapSource` or ``PreadSource``).

        Raises:
            ClosedError: (a ``ValueError``) If the reader is closed.
        """
        src = self._src
        if src is None:
            raise closed_error(self.tar_path)
        return src

    # -- guards ---------------------------------------------------------------------------
    def check_chunk(self, c: int) -> None:
        """Run the chunk guard of chunk ``c`` now (:func:`~tarindex.read.checks.check_chunk`).

        Raises:
            FormatError: If an entry of the chunk's tables is corrupt (FORMAT.md §2.2-2.5).
        """
        checks.check_chunk(self.index, self._checked, c, self.index_path, self._fold, self.tar_path)

    def _guard(self, j: int) -> None:
        self.check_range(j, j + 1)

    def check_tar(self) -> None:
        """The cut and change check (:func:`~tarindex.read.checks.tar_fault`: one ``fstat``).

        Raises:
            TruncatedError: If the tar is now shorter than when opened.
            StaleIndexError: If it was rewritten, appended to or touched since.
        """
        mm = self._mm  # once: close() in another thread drops it
        src = mm if mm is not None else self._src
        checks.check_open_tar(src, self.tar_size, self.tar_ident, self.tar_path)

    def ready(self, j0: int, j1: int) -> tuple[int, int]:
        """Check the tables' chunks of samples ``0 <= j0 < j1 <= n_samples`` (once each).

        Returns the byte range ``(a, b)`` of the tar their members span (``a == b``: none),
        for a read-ahead hint.

        Raises:
            FormatError: A corrupt chunk (FORMAT.md §2.2-2.5).
        """
        checked = self._checked
        for c in range(j0 >> CHUNK_SHIFT, ((j1 - 1) >> CHUNK_SHIFT) + 1):
            if not checked[c]:
                self.check_chunk(c)  # FormatError if corrupt
        h = self.hot
        if h is CLOSED:
            raise closed_error(self.tar_path)
        sp, offs, sizes = h.sample_ptr, h.offset, h.size
        m0, m1 = sp[j0], sp[j1]
        return (offs[m0], offs[m1 - 1] + sizes[m1 - 1]) if m1 > m0 else (0, 0)

    def check_range(self, j0: int, j1: int) -> None:
        """Refuse ``[j0, j1)`` outside the shard; run the chunk guard of its chunks once.

        Raises:
            SampleIndexError: If the range is outside ``[0, n_samples]``.
            FormatError: If the tables of a chunk are corrupt.
        """
        if type(j0) is not int or type(j1) is not int:  # the one index rule: no bool, no float
            j0, j1 = (check_index(j, self.n_samples + 1, negative=False) for j in (j0, j1))
        if not 0 <= j0 <= j1 <= self.n_samples:
            raise SampleIndexError(
                f"{self.tar_path}: samples {j0}..{j1} out of range [0, {self.n_samples})"
            )
        checked = self._checked
        for c in range(j0 >> CHUNK_SHIFT, ((j1 - 1) >> CHUNK_SHIFT) + 1 if j1 > j0 else 0):
            if not checked[c]:
                self.check_chunk(c)

    def check_samples(self, js: NDArray[np.int64]) -> None:
        """Run the chunk guard of every chunk of samples ``js`` (each in range) not yet checked.

        Raises:
            FormatError: If the tables of such a chunk are corrupt.
        """
        chunks = js >> CHUNK_SHIFT
        todo = chunks[self.checked_np[chunks] == 0]
        for c in np.unique(todo).tolist():
            self.check_chunk(c)

    def validate(self, j0: int = 0, j1: int | None = None) -> None:
        """Check the index tables of samples ``j0 <= j < j1`` now (default: all), O(j1 - j0).

        Raises:
            SampleIndexError: If the range is outside ``[0, n_samples]``.
            FormatError: If a table entry is corrupt (see
                :func:`tarindex.format.guards.check_samples`).
        """
        self.check_range(j0, self.n_samples if j1 is None else j1)

    def _wanted(self, fields: Collection[str]) -> NDArray[np.bool_]:
        key = frozenset(fields)
        w = self._want.get(key)
        if w is None:
            w = self._want[key] = np.asarray([e in key for e in self.exts], np.bool_)
        return w

    def want_flags(self, fields: Collection[str]) -> bytes:
        """Flags of ``fields``: one byte per extension id, 1 if wanted (the compiled loops' form)."""
        fields = field_set(fields)  # type: ignore[assignment]
        try:
            w = self._want_b.get(fields)
        except TypeError:  # an unhashable collection (a list): made each time
            return self._wanted(fields).tobytes()
        if w is None:
            w = self._want_b[fields] = self._wanted(fields).tobytes()
        return w

    def zstd_dict(self) -> Any:
        """The shard's zstd dictionary (FORMAT.md §7), or ``None`` if it has none.

        Read from the tar and checked (the index's entry, crc32, dictionary id) on the first
        call in this reader, then kept: decoders get it from here, per shard, through the
        datasets (``ExtDecoder(sample, zstd_dict=...)``), never by path.

        Returns:
            A ``zstandard.ZstdCompressionDict``, or ``None``.

        Raises:
            FormatError: The index's ``zstd_dict`` entry is malformed or out of the tar's
                range, or the bytes there are not a dictionary with the recorded id.
            ChecksumError: The dictionary's bytes changed since the shard was indexed.
        """
        if self._zstd_dict is _UNREAD:
            entry = dict_entry(self.index.meta, self.index_path, self.tar_size)
            zd = None
            if entry is not None:
                import zstandard

                data = check_dict(self.read(entry.offset, entry.size), entry, self.tar_path)
                zd = zstandard.ZstdCompressionDict(data)
            self._zstd_dict = zd
        return self._zstd_dict

    # -- the kernel -----------------------------------------------------------------------
    def read(self, offset: int, size: int) -> bytes:
        """Return ``size`` bytes of the tar at byte ``offset`` (a copy).

        Raises:
            TruncatedError: If the range is negative or runs past the end of the tar
                (FORMAT.md §2.7), or the tar was cut while open (``use_mmap=False``).
        """
        return self.source.read(offset, size)  # a mapped tar's: guarded (MappedSource)

    def read_block(
        self,
        j0: int,
        j1: int,
        fields: Fields = None,
        *,
        data: bool = True,
        prefetch: bool = False,
    ) -> Block:
        """Read samples ``j0 <= j < j1`` of this shard: the kernel every dataset path uses.

        The tables of those samples are checked first (once per chunk, vectorised; see
        :func:`tarindex.format.guards.check_samples`). With mmap the buffer is the mapping
        (nothing is copied); with ``pread`` the selected members are read with one read per
        run of neighbouring members (one for a whole block when nothing is projected away).

        Args:
            j0: First sample, ``0 <= j0 <= j1``.
            j1: End sample (exclusive), ``<= n_samples``.
            fields: Extensions to read (e.g. ``("jpg", "cls")``); others are left out of the
                block and their bytes are not read. Defaults to ``None`` (all members).
            data: Read member bytes. ``False`` returns the tables only. Defaults to ``True``.
            prefetch: Ask the source to read the block's byte range ahead (sequential
                streaming). Defaults to ``False``.

        Returns:
            The :class:`Block`.

        Raises:
            SampleIndexError: If the range is outside the shard.
            FormatError: If the index tables of those samples are corrupt.
            TruncatedError: If the tar was cut while open (``pread``).
        """
        fields = field_set(fields)
        self.check_range(j0, j1)
        t = self.index
        sp = t.sample_ptr[j0 : j1 + 1].astype(np.int64)
        lo, hi = int(sp[0]), int(sp[-1])
        kp = t.key_ptr[j0 : j1 + 1].astype(np.int64)
        k0 = int(kp[0])
        keys = _decode_keys(bytes(t.key_blob[k0 : int(kp[-1])]), (kp - k0).tolist())
        return self._finish(
            np.arange(j0, j1, dtype=np.int64),
            keys,
            sp - lo,
            t.ext_id[lo:hi].astype(np.int64),
            t.size[lo:hi].astype(np.int64),
            t.offset[lo:hi].astype(np.int64),
            fields,
            data,
            prefetch,
            lo,
        )

    def gather(
        self,
        js: Sequence[int] | NDArray[np.integer[Any]],
        fields: Fields = None,
        *,
        data: bool = True,
    ) -> Block:
        """Read samples ``js`` (any order, repeats allowed) of this shard as one :class:`Block`.

        Same guards and sources as :meth:`read_block`; neighbouring members are read together
        with ``pread``.

        Args:
            js: Shard-local sample numbers, each in ``[0, n_samples)``.
            fields: As :meth:`read_block`.
            data: As :meth:`read_block`.

        Raises:
            SampleIndexError: If a sample number is out of range.
            FormatError: If the index tables of those samples are corrupt.
        """
        fields = field_set(fields)
        try:  # the one index rule: a uint64 or float sample number neither wraps nor truncates
            j = check_indices(js, self.n_samples, negative=False)
        except SampleIndexError as e:
            raise SampleIndexError(f"{self.tar_path}: {e}") from None
        self.check_samples(j)
        t = self.index
        lo = t.sample_ptr[j].astype(np.int64)
        cnt = t.sample_ptr[j + 1].astype(np.int64) - lo
        mp = np.zeros(len(j) + 1, np.int64)
        np.cumsum(cnt, out=mp[1:])
        members = np.repeat(lo - mp[:-1], cnt) + np.arange(int(mp[-1]), dtype=np.int64)
        blob = t.key_blob
        kp = t.key_ptr
        keys = [
            str(blob[a:b], "utf-8", "surrogateescape")
            for a, b in zip(kp[j].tolist(), kp[j + 1].tolist(), strict=True)
        ]
        return self._finish(
            j,
            keys,
            mp,
            t.ext_id[members].astype(np.int64),
            t.size[members].astype(np.int64),
            t.offset[members].astype(np.int64),
            fields,
            data,
            False,
            members,
        )

    def _finish(
        self,
        samples: NDArray[np.int64],
        keys: list[str],
        mp: NDArray[np.int64],
        eid: NDArray[np.int64],
        size: NDArray[np.int64],
        toff: NDArray[np.int64],
        fields: Fields,
        data: bool,
        prefetch: bool,
        members: NDArray[np.int64] | int,
    ) -> Block:
        """Project onto ``fields`` and fetch the selected members' bytes from the source.

        ``members`` gives the selected members' numbers in the index (an array, or the first
        of a contiguous run), for ``verify_data``.
        """
        keep: NDArray[np.bool_] | None = None
        if fields is not None and not (want := self._wanted(fields)).all():  # else keep all
            keep = want[eid]
            if keep.all():
                keep = None
        all_off, all_size = toff, size
        if keep is not None:
            kc = np.zeros(len(keep) + 1, np.int64)
            np.cumsum(keep, out=kc[1:])
            mp = kc[mp]
            eid, size, toff = eid[keep], size[keep], toff[keep]
        buf: Any = None  # a Buffer, or the tar's Mapped
        offset: NDArray[np.int64] | None = None
        if data:
            src = self.source
            self.check_tar()
            if src.zero_copy and self._mm is not None:
                buf, offset = self._mm, toff  # sliced later, guarded (Mapped)
                if prefetch and len(toff):
                    src.prefetch(int(toff.min()), int((toff + size).max()))
            elif len(toff) == 0:
                buf, offset = b"", toff
            else:
                buf, offset = read_runs(src, all_off, all_off + all_size, keep)
        blk = Block.of_shard(
            self.tar_path, samples, keys, mp, eid, size, toff, offset, buf, self.exts
        )
        if self.verify_data and data and len(toff):
            mids = (
                np.arange(members, members + len(all_off)) if isinstance(members, int) else members
            )
            self.verify_block(blk, mids if keep is None else mids[keep])
        return blk

    def verify_block(self, blk: Block, members: NDArray[np.int64]) -> None:
        """Check the bytes of ``blk``'s members against the crc32s the index records.

        Args:
            blk: A block of this shard with data (one buffer).
            members: ``int64 (m,)``: the index member number of each of ``blk``'s members.

        Raises:
            ChecksumError: Naming the shard, key, extension and byte offset of the first
                member whose bytes differ (FORMAT.md §2.8.2).
        """
        for b, k, got, want in crc_mismatches(blk, members, [self.index.member_crc]):
            raise self._data_error(
                blk.keys[b], blk.exts[int(blk.ext_id[k])], int(blk.tar_offset[k]), got, want
            )

    def _data_error(self, key: str, ext: str, off: int, got: int, want: int) -> ChecksumError:
        p, i, c = self.tar_path, self.index_path, self.copy_path
        return data_error(p, i, key, ext, off, got, want, c)

    def sample(self, j: int, fields: Fields = None) -> Sample:
        """Return sample ``j`` as ``{"__key__": str, ext: bytes, ...}`` (no ``__shard__``/``__index__``).

        The one-sample form of :meth:`read_block`, with the same guards (the sample's chunk of
        the index tables is checked before its first read) and sources.

        Args:
            j: Shard-local sample number, ``0 <= j < n_samples``.
            fields: Extensions to return (others are not read). Defaults to ``None`` (all).

        Raises:
            SampleIndexError: If ``j`` is out of range.
            FormatError: If the index tables of sample ``j``'s chunk are corrupt.
            TruncatedError: If the tar was cut while open (``pread``).
        """
        fields = field_set(fields)
        if type(j) is not int:  # the one index rule: no bool, no float
            j = check_index(j, self.n_samples, negative=False)
        if not 0 <= j < self.n_samples:
            raise SampleIndexError(
                f"{self.tar_path}: sample {j} out of range [0, {self.n_samples})"
            )
        if not self._checked[j >> CHUNK_SHIFT]:
            self.check_chunk(j >> CHUNK_SHIFT)
        h = self.hot  # once: close() in another thread swaps it for CLOSED
        if h is CLOSED:
            raise closed_error(self.tar_path)
        kp, sp, kb = h.key_ptr, h.sample_ptr, h.key_base
        out: Sample = {
            "__key__": h.keys[kb + kp[j] : kb + kp[j + 1]].decode("utf-8", "surrogateescape")
        }
        exts, offs, sizes, eids = self.exts, h.offset, h.size, h.ext_id
        mm = h.mm  # cut or changed since opened: its error, not its bytes
        if mm is not None:
            mm.check()
        else:
            self.check_tar()
        verify = self.verify_data
        for m in range(sp[j], sp[j + 1]):
            name = exts[eids[m]]
            if fields is not None and name not in fields:
                continue
            off = offs[m]
            out[name] = mm[off : off + sizes[m]] if mm is not None else self.read(off, sizes[m])
            if verify:
                crc = self.index.member_crc  # ClosedError once closed
                got, want = zlib.crc32(out[name]), -1 if crc is None else int(crc[m])
                if got != want:
                    raise self._data_error(out["__key__"], name, off, got, want)
        return out

    def key(self, j: int) -> str:
        """Return the key of sample ``j`` (``0 <= j < n_samples``), decoded as in FORMAT.md §2.5.

        Raises:
            SampleIndexError: If ``j`` is out of range.
            FormatError: If the index tables of sample ``j``'s chunk are corrupt.
        """
        self.check_range(j, j + 1)
        h = self.hot
        if h is CLOSED:
            raise closed_error(self.tar_path)
        kp, kb = h.key_ptr, h.key_base
        return h.keys[kb + kp[j] : kb + kp[j + 1]].decode("utf-8", "surrogateescape")

    _keytab: KeyTable | None = None

    def key_table(self) -> KeyTable:
        """Return this shard's key table (FORMAT.md §2.8.3), made on first use.

        The index's ``KHSH`` record (format 1.2), checked once (vectorised), or for an older
        index the same table computed from its keys (about 0.4 s per 1M keys; two ``n``-long
        integer arrays, no per-sample Python object).

        Raises:
            FormatError: If the record is corrupt (unsorted, a sample out of range).
        """
        kt = self._keytab
        if kt is None:
            kt = self._keytab = key_table(self.index, self.index_path)
        return kt

    def find_key(self, key: str) -> int | None:
        """Return the sample number whose key is ``key`` (FORMAT.md §4 normalisation), or None.

        The one key lookup: two binary searches in the key table (:meth:`key_table`,
        O(log n)), then each candidate's key bytes compared, so a hit is never a hash
        collision; the candidate's chunk of the tables passes the guards first.

        Raises:
            TypeError: If ``key`` is not a ``str``.
            FormatError: If the key table, or the index tables of a candidate's chunk, are
                corrupt.
        """
        kb = lookup_key(key)
        return self.find_normalized(kb) if kb else None

    def find_normalized(self, kb: bytes) -> int | None:
        """:meth:`find_key` of a key already normalised and encoded (FORMAT.md §4)."""
        for j in self.key_table().candidates(kb):
            if self.key_is(j, kb):
                return int(j)
        return None

    def key_is(self, j: int, kb: bytes) -> bool:
        """Whether sample ``j``'s key bytes are ``kb`` (the chunk guard runs first).

        Raises:
            SampleIndexError: If ``j`` is out of range.
            FormatError: If the index tables of sample ``j``'s chunk are corrupt.
        """
        self.check_range(j, j + 1)
        h = self.hot
        if h is CLOSED:
            raise closed_error(self.tar_path)
        kp, kb0 = h.key_ptr, h.key_base
        return h.keys[kb0 + kp[j] : kb0 + kp[j + 1]] == kb

    def member_slice(self, j: int) -> tuple[int, int]:
        """Return the half-open member range ``[lo, hi)`` of sample ``j`` (FORMAT.md §2.2).

        Raises:
            SampleIndexError: If ``j`` is out of range.
            FormatError: If the index tables of sample ``j``'s chunk are corrupt.
        """
        self.check_range(j, j + 1)
        h = self.hot
        if h is CLOSED:
            raise closed_error(self.tar_path)
        return int(h.sample_ptr[j]), int(h.sample_ptr[j + 1])

    def close(self) -> None:
        """Release the mappings and descriptors (idempotent; any thread).

        A read another thread has in flight in this reader finishes with the right bytes or
        raises :class:`~tarindex.errors.ClosedError`; the mappings and the descriptor are
        released once no read uses them. Reads begun after ``close`` raise ``ClosedError``.
        """
        # drop our views first so the index mmap has no exports left when it is closed
        if hasattr(self, "hot"):
            self.hot = CLOSED  # holds buffers of the mappings: released before they are closed
        if hasattr(self, "index"):
            self.index = _ClosedIndex(self.tar_path)  # type: ignore[assignment]
        for attr in ("_mm", "_mapped", "_keytab"):
            if hasattr(self, attr):
                setattr(self, attr, None)
        src = getattr(self, "_src", None)
        if src is not None:
            src.close()
            self._src = None
        m = getattr(self, "_imm", None)
        if m is not None:
            try:
                m.close()
            except BufferError:
                pass  # views still alive (numpy arrays handed out); GC closes it later
            self._imm = None

    def __enter__(self) -> ShardReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass


def is_up_to_date(
    tar_path: str | os.PathLike[str], index_path: str | None = None, *, checksums: bool = False
) -> bool:
    """Return True if an index exists for the tar and passes the open-time checks.

    Those are the cheap checks (FORMAT.md §2.7, §3): header, size, end magic, fingerprint. A
    corrupt table inside an otherwise intact index still counts as up to date; ``tarindex
    verify`` catches that. With ``checksums=True`` an index must also record each member's
    crc32 (FORMAT.md §2.8.2), as ``tarindex index --checksums`` asks.
    """
    try:
        r = ShardReader(os.fspath(tar_path), index_path)
    except (TarIndexError, OSError):
        return False
    try:
        return not checksums or r.index.member_crc is not None
    finally:
        r.close()
