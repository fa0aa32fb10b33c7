"""ShardWriter: write standard tar shards and their sidecar indexes in one pass, atomically."""

from __future__ import annotations

import hashlib
import os
import pickle
import time
import zlib
from collections import deque
from collections.abc import Callable, Collection, Iterable
from typing import Any

import numpy as np

from .._version import __version__
from ..codecs import encode_value, zstd_compressor
from ..errors import WriterError
from ..format.group import group_members
from ..format.index import encode_index, fingerprint
from ..format.keys import check_ext, check_key
from ..format.spec import (
    BLOCK,
    FINGERPRINT_BYTES,
    MAX_ZSTD_DICT_BYTES,
    SHARD_ID_BYTES,
    USTAR_MAX_SIZE,
    ZSTD_DICT_MEMBER,
    ZSTD_DICT_META,
)
from ..format.tar import ZERO_BLOCK, build_global_header, build_member_header, padded
from ..format.zstd_dict import DictEntry, entry_for
from ..storage.indexfile import index_path_for, temp_path_for, write_atomic

__all__ = [
    "ShardWriter",
    "TarWriter",
    "TarShardWriter",
    "check_pattern",
    "lock_path_for",
    "PatternLock",
    "plan_shard_sizes",
    "ZSTD_DICT_BYTES",
]

_RECORD = 20 * BLOCK  # GNU tar and Python tarfile pad archives to 10240-byte records


# what an encoder raises for a value it cannot encode (json nested too deep: RecursionError;
# pickle of a lambda: PicklingError; of a local object: AttributeError; pth/msgpack/cbor
# without their package: ImportError)
_ENCODE_ERRORS = (
    TypeError,
    ValueError,
    RecursionError,
    ImportError,
    AttributeError,
    pickle.PicklingError,
)


def _check_mtime(mtime: int | None) -> int:
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
        self.mtime = _check_mtime(mtime)
        self.durable = durable
        self.shard_id = os.urandom(SHARD_ID_BYTES) if shard_id is None else bytes(shard_id)
        if len(self.shard_id) != SHARD_ID_BYTES:
            raise WriterError(f"shard_id must be {SHARD_ID_BYTES} bytes, got {len(self.shard_id)}")
        os.makedirs(os.path.dirname(os.path.abspath(self.path)), exist_ok=True)
        self._f = open(self.tmp, "wb")
        self.pos = 0
        self.count = 0
        self._head = bytearray()
        self._tail = b""
        self._names: list[bytes] = []
        self._offsets: list[int] = []
        self._sizes: list[int] = []
        self._crcs: list[int] = []
        self._keys: set[str] = set()
        self.zstd_dict: DictEntry | None = None
        """Where the shard's zstd dictionary was written (:meth:`write_zstd_dict`), or None."""

    def _write(self, data: bytes) -> None:
        try:
            self._f.write(data)
        except OSError as e:  # ENOSPC, EFBIG, EIO: name the shard (the caller aborts it)
            raise OSError(
                e.errno, f"{self.path}: byte {self.pos}: writing the shard failed: {e.strerror}"
            ) from e
        self.pos += len(data)
        if len(self._head) < FINGERPRINT_BYTES:
            self._head += data[: FINGERPRINT_BYTES - len(self._head)]
        self._tail = (self._tail + data[-FINGERPRINT_BYTES:])[-FINGERPRINT_BYTES:]

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
        out = [
            (name, build_member_header(name, len(data), self.mtime), data) for name, data in named
        ]
        n = sum(len(h) + padded(len(d)) for _, h, d in out)
        if self.pos == 0:
            n += 2 * BLOCK  # the shard-id header
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
            self._write(build_global_header([(b"comment", sid)], self.mtime))

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
        self._write(build_member_header(ZSTD_DICT_MEMBER, len(data), self.mtime))
        self.zstd_dict = entry_for(data, self.pos)
        self._write(data)
        self._write(bytes(padded(len(data)) - len(data)))

    def write_prepared(self, key: str, prepared: list[tuple[bytes, bytes, bytes]]) -> None:
        """Append one sample built by :meth:`prepare` (for the same ``key``)."""
        self._start()
        self._keys.add(key)
        for name, header, data in prepared:
            size = len(data)
            self._write(header)
            self._names.append(name)
            self._offsets.append(self.pos)
            self._sizes.append(size)
            self._crcs.append(zlib.crc32(data))
            self._write(data)
            pad = padded(size) - size
            if pad:
                self._write(bytes(pad))
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
            self._write(ZERO_BLOCK * 2 + bytes(padded_to(stop, _RECORD) - stop))
            if self.durable:
                self._f.flush()
                os.fsync(self._f.fileno())
            self._f.close()
            size = self.pos
            # the first and last 4 KiB were kept while writing: no second read of the tar
            head, tail = fingerprint(
                lambda off, n: (
                    bytes(self._head[:n]) if off == 0 else self._tail[len(self._tail) - n :]
                ),
                size,
            )
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

    def abort(self) -> None:
        """Discard the shard being written (delete the temp file)."""
        try:
            self._f.close()
        finally:
            try:
                os.unlink(self.tmp)
            except FileNotFoundError:
                pass


def check_pattern(pattern: str, start_shard: int = 0) -> bool:
    """Check a shard path pattern before anything is written (the one pattern check).

    Shard ``k`` goes to ``pattern % k`` (printf style, e.g. ``"out/train-%06d.tar"``). A
    pattern without any ``%`` is a plain path: one shard only.

    Args:
        pattern: The pattern.
        start_shard: Number of the first shard. Defaults to ``0``.

    Returns:
        True if ``pattern`` has one integer field (one path per shard); False if it is a
        plain path without ``%``.

    Raises:
        WriterError: If ``pattern`` has a ``%`` but not exactly one integer field (``%d%d``,
            ``%(n)d``, a lone ``%``, only ``%%``), or gives the same path for two shards
            (``%.0s``). The message names the pattern and the fix.
    """
    try:
        p0, p1 = pattern % start_shard, pattern % (start_shard + 1)
    except TypeError as e:
        if "%" not in pattern:
            return False
        raise WriterError(
            f"pattern {pattern!r}: {e}; it needs exactly one integer field such as %06d "
            f"(write %% for a literal percent sign)"
        ) from None
    except ValueError as e:  # "100%.tar"
        raise WriterError(
            f"pattern {pattern!r}: {e}; use one integer field such as %06d and write a literal "
            f"'%' as '%%'"
        ) from None
    if p0 == p1:
        raise WriterError(
            f"pattern {pattern!r} gives the same path {p0!r} for every shard; use one integer "
            f"field such as %06d"
        )
    return True


def plan_shard_sizes(
    samples: Iterable[list[tuple[bytes, int]]], maxcount: int, maxsize: float
) -> list[int]:
    """Samples per shard that :class:`ShardWriter` would write, from member names and sizes.

    The same cut as :meth:`ShardWriter.write` (``maxcount`` samples, or a finished tar larger
    than ``maxsize`` bytes: headers, padding, end blocks and the shard-id header counted;
    a single larger sample alone), planned before writing, so writers in several processes
    (``tarindex pack --jobs``) cut the shards where one writer would. No ``compress=``.

    Args:
        samples: Per sample, ``[(member name bytes, data size in bytes), ...]``.
        maxcount: Samples per shard at most.
        maxsize: Bytes per shard at most.

    Returns:
        The sample counts, in order.
    """
    out: list[int] = []
    count = pos = 0
    for members in samples:
        n = sum(len(build_member_header(name, size, 0)) + padded(size) for name, size in members)
        if count and (count >= maxcount or _finished_size(pos + n) > maxsize):
            out.append(count)
            count = pos = 0
        if pos == 0:
            pos = 2 * BLOCK  # the shard-id header (TarShardWriter.prepare counts it too)
        pos += n
        count += 1
    if count:
        out.append(count)
    return out


def padded_to(n: int, multiple: int) -> int:
    """Return ``n`` rounded up to a multiple of ``multiple``."""
    return -(-n // multiple) * multiple


def _finished_size(pos: int) -> int:
    """Size in bytes of a tar whose members end at ``pos`` once its end blocks are written."""
    return padded_to(pos + 2 * BLOCK, _RECORD)


def lock_path_for(pattern: str) -> str:
    """The lock file a writer of ``pattern`` holds: ``.<pattern name>.lock`` beside the shards."""
    d, base = os.path.split(os.path.abspath(pattern))
    return os.path.join(d, "." + base.replace("%", "_") + ".lock")


class PatternLock:
    """An exclusive, non-blocking ``flock`` on ``.<pattern name>.lock`` beside the shards.

    The file exists only while a writer holds it: the holder removes it before unlocking,
    and a writer that locked a file someone removed meanwhile (it checks the inode) tries
    again, so two writers never both hold a lock. The file holds the holder's pid.

    Raises:
        WriterError: If another writer (this process or another) holds the lock.
    """

    def __init__(self, pattern: str) -> None:
        os.makedirs(os.path.dirname(os.path.abspath(pattern)), exist_ok=True)
        self.path = lock_path_for(pattern)
        self.fd = -1
        try:
            import fcntl
        except ImportError:  # no flock (Windows): no lock
            return
        while True:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o666)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                holder = os.pread(fd, 32, 0).decode("ascii", "replace").strip() or "?"
                os.close(fd)
                raise WriterError(
                    f"{pattern}: another ShardWriter (pid {holder}) is writing this pattern "
                    f"(lock {self.path} is held); wait for it to finish, or write to another "
                    f"pattern"
                ) from None
            try:
                same = os.stat(self.path).st_ino == os.fstat(fd).st_ino
            except FileNotFoundError:
                same = False
            if same:
                break
            os.close(fd)  # the holder removed it between our open and our lock: again
        self.fd = fd
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)

    def release(self) -> None:
        """Remove the lock file, then unlock (closing the descriptor releases the flock)."""
        fd, self.fd = self.fd, -1
        if fd >= 0:
            try:
                os.unlink(self.path)
            except FileNotFoundError:
                pass
            os.close(fd)


class ShardWriter:
    """Write samples into a sequence of tar shards, each with its sidecar index.

    A context manager. Shard ``k`` goes to ``pattern % k`` (e.g. ``"out/train-%06d.tar"``). A new
    shard starts before a sample when the current one holds ``maxcount`` samples, or when the
    sample would make the finished tar (headers, padding and end blocks included) larger than
    ``maxsize`` bytes; a single sample larger than that gets a shard of its own. On an
    exception inside the ``with`` block the shard in progress is deleted; shards already
    finished stay complete with their indexes.

    Values are encoded by extension (:func:`tarindex.encode.encode_value`: webdataset's
    writer conventions). **Compressed members** (docs/FORMAT.md §7): a member whose extension
    ends in ``.zst`` (``"json.zst"``), or whose extension's last component is in
    ``compress`` (then stored as ``EXT.zst``), is the zstd frame of the encoded value; readers
    decompress it when decoding, so ``ds[i]["json"]`` is the same object either way. With
    ``zstd_dict``, each shard trains a zstd dictionary on its first ``zstd_dict_samples``
    samples (held in memory until then), stores it as the member ``__tarindex_zstd_dict__``
    before its first sample (the tar stays a tar that ``tar -x`` and webdataset read), and
    compresses its ``.zst`` members with it; small members compress 2x better than without.

    Only one writer at a time may write a pattern: from its first sample to :meth:`close` or
    :meth:`abort` a writer holds an exclusive lock on ``.<pattern name>.lock`` beside the
    shards (``fcntl.flock``, where the platform has it; the file is removed on release); a
    second writer's first :meth:`write` raises ``WriterError``.

    Args:
        pattern: printf-style pattern with one integer field, or a plain path if only one
            shard will be written.
        maxcount: Samples per shard at most. Defaults to ``100_000``.
        maxsize: Size bound of each shard file in bytes, padding and end blocks included (a
            single larger sample still goes in one shard, alone). Defaults to ``3e9``.
        start_shard: Number of the first shard. Defaults to ``0``.
        mtime: Integer mtime for every member header. Defaults to the time of construction.
        encoder: ``(ext, value) -> bytes``, called with the extension without ``.zst``;
            ``True`` is the default; ``False`` writes ``bytes``, ``bytearray`` and
            ``memoryview`` values as they are and ``str`` as UTF-8, and refuses anything else
            (webdataset 1.0's ``encoder=False`` refuses ``str`` too). Defaults to
            :func:`tarindex.encode.encode_value`.
        durable: ``fsync`` every tar, index and the directory when a shard is finished, so
            finished shards survive a power loss. ``False`` for scratch data. Defaults to
            ``True``.
        seed: ``None`` (the default) embeds a random shard id in every shard, so a shard
            written by another run (a crashed or concurrent writer) never matches an older
            index. An integer makes the ids a function of ``(seed, shard number)``: the same
            samples give the same bytes (reproducible builds); use it only where rewriting a
            shard with different samples under the same seed cannot happen.
        compress: Extensions to store zstd-compressed as ``EXT.zst``, matched on their last
            dot-component (``("json", "txt")``); ``True`` for every member. Defaults to
            ``False`` (only members named ``EXT.zst``).
        zstd_level: zstd compression level. Defaults to ``3``.
        zstd_dict: ``True`` (a dictionary of at most :data:`ZSTD_DICT_BYTES`, 32 KiB) or a
            size in bytes (``>= 1024``): train one per shard. A shard whose first samples hold
            too little to train on (fewer than 8 compressed members or 4 KiB) gets none; its
            members are still compressed. Defaults to ``False``.
        zstd_dict_samples: Samples a shard's dictionary is trained on, its first ones
            (``>= 1``). Defaults to ``1000``.

    Raises:
        WriterError: If ``maxcount`` or ``maxsize`` is not a finite number ``>= 1``, ``mtime``
            does not fit a ustar header, ``pattern`` fails :func:`check_pattern` (a ``%``
            that is not exactly one integer field, the same path for two shards), or a
            compression option is invalid.

    Example:
        >>> with ShardWriter("out/train-%06d.tar", maxcount=10_000) as sink:  # doctest: +SKIP
        ...     sink.write({"__key__": "00000001", "png": png_bytes, "cls": 3})
    """

    _single_file = False  # TarWriter: the pattern is a path, '%' included

    def __init__(
        self,
        pattern: str | os.PathLike[str],
        maxcount: int = 100_000,
        maxsize: float = 3e9,
        *,
        start_shard: int = 0,
        mtime: int | None = None,
        encoder: Callable[[str, Any], bytes] | bool = encode_value,
        durable: bool = True,
        seed: int | None = None,
        compress: bool | str | Collection[str] = False,
        zstd_level: int = 3,
        zstd_dict: bool | int = False,
        zstd_dict_samples: int = 1000,
    ) -> None:
        self._lock: PatternLock | None = None
        self.pattern = os.fspath(pattern)
        try:
            if not (maxcount >= 1 and 1 <= maxsize < float("inf")):  # False for NaN too
                raise ValueError
            self.maxcount = int(maxcount)
            self.maxsize = int(maxsize)
        except (TypeError, ValueError, OverflowError):
            raise WriterError(
                f"maxcount ({maxcount!r}) and maxsize ({maxsize!r}) must be finite numbers >= 1"
            ) from None
        self.shard = start_shard
        self.mtime = _check_mtime(mtime)
        # a bad pattern fails here, not after the first shard is written
        self._has_field = False if self._single_file else check_pattern(self.pattern, start_shard)
        self.encoder: Callable[[str, Any], bytes] = (
            encode_value if encoder is True else _bytes_only if encoder is False else encoder
        )
        self.durable = durable
        self.seed = seed
        self._compress_all, self._compress = _compress_set(compress)
        self.zstd_level = _int_option("zstd_level", zstd_level, -(1 << 17), 22)
        if zstd_dict is True:
            zstd_dict = ZSTD_DICT_BYTES
        self._dict_size = (
            0
            if zstd_dict is False
            else _int_option("zstd_dict", zstd_dict, 1024, MAX_ZSTD_DICT_BYTES)
        )
        self._train_n = _int_option("zstd_dict_samples", zstd_dict_samples, 1, 1 << 40)
        self._first = start_shard
        self.paths: list[str] = []
        self.total = 0
        self._cur: TarShardWriter | None = None
        self._cctx: Any = None  # the current shard's zstd compressor (with its dictionary)
        # samples encoded but not yet in a shard: (key, [(stored ext, data, compress?), ...]);
        # with zstd_dict, a shard's first samples wait here until its dictionary is trained
        self._pending: deque[tuple[str, list[tuple[str, bytes, bool]]]] = deque()
        self._pending_keys: set[str] = set()
        self._pending_bytes = 0

    def _path(self, k: int) -> str:
        if self._has_field:
            return self.pattern % k
        if k == self._first:
            return self.pattern
        raise WriterError(
            f"pattern {self.pattern!r} has no %d field but more than one shard is needed "
            f"(maxcount={self.maxcount}, maxsize={self.maxsize}); use e.g. 'out-%06d.tar'"
        )

    def _encode(self, sample: dict[str, Any]) -> tuple[str, list[tuple[str, bytes, bool]]]:
        """Check and encode one sample: ``(key, [(stored ext, bytes, compress?), ...])``."""
        if not isinstance(sample, dict):
            raise WriterError(
                f"a sample is a dict {{'__key__': str, ext: value}}, not a {type(sample).__name__}"
            )
        key = sample.get("__key__")
        if not isinstance(key, str):
            raise WriterError(f"sample has no str '__key__' (got {key!r})")
        try:
            check_key(key)
        except ValueError as e:
            raise WriterError(str(e)) from None
        members: list[tuple[str, bytes, bool]] = []
        for ext, value in sample.items():
            if not isinstance(ext, str):
                raise WriterError(
                    f"sample {key!r}: extension {ext!r} is a {type(ext).__name__}, not a str"
                )
            if ext.startswith("__"):
                continue
            inner, stored, z = ext, ext, True
            if ext.endswith(".zst") and len(ext) > 4:
                inner = ext[:-4]
            elif self._compress_all or ext.rsplit(".", 1)[-1].lower() in self._compress:
                stored = ext + ".zst"
            else:
                z = False
            try:
                check_ext(stored)
                data = self.encoder(inner, value)
            except _ENCODE_ERRORS as e:
                raise WriterError(f"sample {key!r}: {type(e).__name__}: {e}") from e
            if not isinstance(data, (bytes, bytearray, memoryview)):
                raise WriterError(
                    f"sample {key!r}: encoder returned a {type(data).__name__} for {ext!r}, not bytes"
                )
            if any(stored == m[0] for m in members):
                raise WriterError(
                    f"sample {key!r}: extension {stored!r} twice (from {ext!r} and compress=); "
                    f"give one of them another extension"
                )
            members.append((stored, bytes(data), z))
        if not members:
            raise WriterError(f"sample {key!r} has no members (only '__' entries)")
        return key, members

    def write(self, sample: dict[str, Any]) -> None:
        """Write one sample: ``{"__key__": str, ext: value, ...}`` (keys starting ``__`` skipped).

        With ``zstd_dict``, a shard's first samples are held until its dictionary is trained
        (or :meth:`close`), then written in order.

        Raises:
            WriterError: Missing or invalid key (a dot in its basename, see FORMAT.md §4), a key
                repeated within the shard, a bad extension, a value that cannot be encoded
                (its exception chained; nothing of the sample is written), a second shard is
                needed but ``pattern`` has no ``%d`` field, or another writer holds the
                pattern's lock.
        """
        key, members = self._encode(sample)
        if key in self._pending_keys:
            raise WriterError(
                f"{self._path(self.shard)}: key {key!r} written twice in this shard; keys must "
                f"be unique within a shard (FORMAT.md §4): give each sample its own key"
            )
        if self._lock is None:
            self._lock = PatternLock(self.pattern)
        self._pending.append((key, members))
        self._pending_keys.add(key)
        self._pending_bytes += sum(len(d) for _, d, z in members if z)
        self._drain(final=False)

    def _drain(self, final: bool) -> None:
        """Write the pending samples that can be written now, in order."""
        pending = self._pending
        while pending:
            cur = self._cur
            if cur is None:
                if (
                    self._dict_size
                    and not final
                    and len(pending) < self._train_n
                    and self._pending_bytes < _TRAIN_MAX_BYTES
                ):
                    return  # the next shard's dictionary needs more samples
                try:
                    cur = self._open()
                except WriterError:  # no path for another shard: this sample is not written
                    self._pop()
                    raise
            key, members = pending[0]
            cctx = self._cctx
            data = [(e, cctx.compress(d) if z else d) for e, d, z in members]
            try:
                prepared, n = cur.prepare(key, data)
            except WriterError:
                self._pop()
                raise
            if cur.count and (
                cur.count >= self.maxcount or _finished_size(cur.pos + n) > self.maxsize
            ):
                self._finish()
                continue
            cur.write_prepared(key, prepared)
            self._pop()
            self.total += 1

    def _pop(self) -> None:
        key, members = self._pending.popleft()
        self._pending_keys.discard(key)
        self._pending_bytes -= sum(len(d) for _, d, z in members if z)

    def _open(self) -> TarShardWriter:
        """Start the next shard, with a dictionary trained on the pending samples if asked."""
        sid = None
        if self.seed is not None:
            sid = hashlib.blake2b(
                f"tarindex:{self.seed}:{self.shard}".encode(), digest_size=SHARD_ID_BYTES
            ).digest()
        cur = TarShardWriter(self._path(self.shard), self.mtime, durable=self.durable, shard_id=sid)
        self._cur = cur
        zd = self._train() if self._dict_size else None
        if zd is not None:
            cur.write_zstd_dict(zd.as_bytes())
        self._cctx = zstd_compressor(self.zstd_level, zd)
        return cur

    def _train(self) -> Any:
        """A dictionary trained on the first pending samples' compressed members, or None."""
        import zstandard

        samples: list[Any] = [
            d for _, ms in list(self._pending)[: self._train_n] for _, d, z in ms if z and d
        ]
        total = sum(len(d) for d in samples)
        if len(samples) < _TRAIN_MIN_SAMPLES or total < _TRAIN_MIN_BYTES:
            return None
        size = min(self._dict_size, max(total // 4, 1024))
        try:
            return zstandard.train_dictionary(size, samples, level=self.zstd_level)
        except zstandard.ZstdError:  # too little or too uniform data to train on
            return None

    def _finish(self) -> None:
        if self._cur is not None:
            self._cur.close()
            self.paths.append(self._cur.path)
            self._cur = None
            self._cctx = None
            self.shard += 1

    def close(self) -> None:
        """Write the held samples, finish the current shard (end blocks, rename, index), unlock.

        Later writes start a new shard (and take the lock again).
        """
        try:
            self._drain(final=True)
            self._finish()
        except BaseException:
            self.abort()
            raise
        finally:
            self._release()

    def abort(self) -> None:
        """Discard the shard in progress and the samples held for it; release the pattern lock."""
        try:
            self._pending.clear()
            self._pending_keys.clear()
            self._pending_bytes = 0
            if self._cur is not None:
                self._cur.abort()
                self._cur = None
        finally:
            self._release()

    def _release(self) -> None:
        if self._lock is not None:
            self._lock.release()
            self._lock = None

    def __del__(self) -> None:
        try:
            self._release()
        except Exception:
            pass

    def __enter__(self) -> ShardWriter:
        return self

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        if exc_type is None:
            self.close()
        else:
            self.abort()


def _bytes_only(ext: str, value: Any) -> bytes:
    """``encoder=False``: bytes as they are, str as UTF-8, nothing else."""
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value)
    if isinstance(value, str):
        return value.encode("utf-8")
    raise TypeError(
        f"extension {ext!r}: encoder=False takes bytes or str, got a {type(value).__name__} "
        f"(drop encoder=False to encode it by extension)"
    )


ZSTD_DICT_BYTES = 32 * 1024
"""Default size bound of a shard's trained zstd dictionary (``zstd_dict=True``): 32 KiB.

On ~300-byte JSON captions (benchmarks/bench_compress.py) 32 KiB trained on 1000 samples
gives ~108 bytes per member against ~244 without a dictionary; 110 KiB gains 4% more."""
_TRAIN_MIN_SAMPLES = 8
_TRAIN_MIN_BYTES = 4096
_TRAIN_MAX_BYTES = 64 << 20  # stop holding samples for training past 64 MiB of them


def _int_option(name: str, value: object, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise WriterError(f"{name}={value!r}: expected an integer in [{low}, {high}]")
    return value


def _compress_set(compress: bool | str | Collection[str]) -> tuple[bool, frozenset[str]]:
    if compress is True or compress is False or compress is None:
        return bool(compress), frozenset()
    items = [compress] if isinstance(compress, str) else compress
    if not isinstance(items, Collection) or not all(
        isinstance(e, str) and e and "." not in e for e in items
    ):
        raise WriterError(
            f"compress={compress!r}: expected True, False or extensions without dots, e.g. "
            f"('json', 'txt') (matched on a member's last extension component)"
        )
    return False, frozenset(e.lower() for e in items)


_UNBOUNDED = 1 << 62


class TarWriter(ShardWriter):
    """Write one tar and its index: webdataset's ``TarWriter("mnist.tar")``, with no numbering.

    A :class:`ShardWriter` whose pattern is the path itself (a ``%`` in it is a literal
    character) and whose shard never fills: every sample goes into ``path``. Same
    :meth:`write`, atomic close and pattern lock; the keyword arguments are
    :class:`ShardWriter`'s (``encoder``, ``mtime``, ``durable``, ``seed``, ``compress``, ...).
    Unlike webdataset's, it takes a path, not an open stream (the index and the atomic rename
    need one).

    Example:
        >>> with TarWriter("mnist.tar") as sink:  # doctest: +SKIP
        ...     sink.write({"__key__": "sample000000", "input.pyd": image, "output.pyd": 5})
    """

    _single_file = True

    def __init__(self, path: str | os.PathLike[str], **kw: Any) -> None:
        super().__init__(path, maxcount=_UNBOUNDED, maxsize=float(_UNBOUNDED), **kw)
