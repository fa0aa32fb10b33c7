"""ShardWriter: write standard tar shards and their sidecar indexes in one pass, atomically."""

from __future__ import annotations

import hashlib
import os
import pickle
import time
import zlib
from collections.abc import Callable
from typing import Any

import numpy as np

from ._version import __version__
from .encode import encode_value
from .errors import WriterError
from .format.group import group_members
from .format.index import encode_index, fingerprint
from .format.keys import check_ext, check_key
from .format.spec import BLOCK, FINGERPRINT_BYTES, SHARD_ID_BYTES, USTAR_MAX_SIZE
from .format.tar import ZERO_BLOCK, build_global_header, build_member_header, padded
from .indexfile import index_path_for, temp_path_for, write_atomic

__all__ = ["ShardWriter", "TarWriter", "TarShardWriter", "check_pattern"]

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

    def write_prepared(self, key: str, prepared: list[tuple[bytes, bytes, bytes]]) -> None:
        """Append one sample built by :meth:`prepare` (for the same ``key``)."""
        if self.pos == 0:
            sid = SHARD_ID_COMMENT + self.shard_id.hex().encode()
            self._write(build_global_header([(b"comment", sid)], self.mtime))
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


def padded_to(n: int, multiple: int) -> int:
    """Return ``n`` rounded up to a multiple of ``multiple``."""
    return -(-n // multiple) * multiple


def _finished_size(pos: int) -> int:
    """Size in bytes of a tar whose members end at ``pos`` once its end blocks are written."""
    return padded_to(pos + 2 * BLOCK, _RECORD)


class _PatternLock:
    """An exclusive, non-blocking ``flock`` on ``.<pattern name>.lock`` beside the shards.

    The file exists only while a writer holds it: the holder removes it before unlocking,
    and a writer that locked a file someone removed meanwhile (it checks the inode) tries
    again, so two writers never both hold a lock. The file holds the holder's pid.

    Raises:
        WriterError: If another writer (this process or another) holds the lock.
    """

    def __init__(self, pattern: str) -> None:
        d, base = os.path.split(os.path.abspath(pattern))
        os.makedirs(d, exist_ok=True)
        self.path = os.path.join(d, "." + base.replace("%", "_") + ".lock")
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
        encoder: ``(ext, value) -> bytes``. Defaults to :func:`tarindex.encode.encode_value`.
        durable: ``fsync`` every tar, index and the directory when a shard is finished, so
            finished shards survive a power loss. ``False`` for scratch data. Defaults to
            ``True``.
        seed: ``None`` (the default) embeds a random shard id in every shard, so a shard
            written by another run (a crashed or concurrent writer) never matches an older
            index. An integer makes the ids a function of ``(seed, shard number)``: the same
            samples give the same bytes (reproducible builds); use it only where rewriting a
            shard with different samples under the same seed cannot happen.

    Raises:
        WriterError: If ``maxcount`` or ``maxsize`` is not a finite number ``>= 1``, ``mtime``
            does not fit a ustar header, ``pattern`` fails :func:`check_pattern` (a ``%``
            that is not exactly one integer field, the same path for two shards).

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
        encoder: Callable[[str, Any], bytes] = encode_value,
        durable: bool = True,
        seed: int | None = None,
    ) -> None:
        self._lock: _PatternLock | None = None
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
        self.encoder = encoder
        self.durable = durable
        self.seed = seed
        self._first = start_shard
        self.paths: list[str] = []
        self.total = 0
        self._cur: TarShardWriter | None = None

    def _path(self, k: int) -> str:
        if self._has_field:
            return self.pattern % k
        if k == self._first:
            return self.pattern
        raise WriterError(
            f"pattern {self.pattern!r} has no %d field but more than one shard is needed "
            f"(maxcount={self.maxcount}, maxsize={self.maxsize}); use e.g. 'out-%06d.tar'"
        )

    def write(self, sample: dict[str, Any]) -> None:
        """Write one sample: ``{"__key__": str, ext: value, ...}`` (keys starting ``__`` skipped).

        Raises:
            WriterError: Missing or invalid key (a dot in its basename, see FORMAT.md §4), a key
                repeated within the shard, a bad extension, a value that cannot be encoded,
                a second shard is needed but ``pattern`` has no ``%d`` field, or another
                writer holds the pattern's lock.
        """
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
        members: list[tuple[str, bytes]] = []
        for ext, value in sample.items():
            if not isinstance(ext, str):
                raise WriterError(
                    f"sample {key!r}: extension {ext!r} is a {type(ext).__name__}, not a str"
                )
            if ext.startswith("__"):
                continue
            try:
                check_ext(ext)
                data = self.encoder(ext, value)
            except _ENCODE_ERRORS as e:
                raise WriterError(f"sample {key!r}: {type(e).__name__}: {e}") from e
            if not isinstance(data, (bytes, bytearray, memoryview)):
                raise WriterError(
                    f"sample {key!r}: encoder returned a {type(data).__name__} for {ext!r}, not bytes"
                )
            members.append((ext, bytes(data)))
        if not members:
            raise WriterError(f"sample {key!r} has no members (only '__' entries)")
        cur = self._cur
        if cur is not None:
            prepared, n = cur.prepare(key, members)
            if cur.count >= self.maxcount or _finished_size(cur.pos + n) > self.maxsize:
                self._finish()
                cur = None
        if cur is None:
            if self._lock is None:
                self._lock = _PatternLock(self.pattern)
            sid = None
            if self.seed is not None:
                sid = hashlib.blake2b(
                    f"tarindex:{self.seed}:{self.shard}".encode(), digest_size=SHARD_ID_BYTES
                ).digest()
            cur = self._cur = TarShardWriter(
                self._path(self.shard), self.mtime, durable=self.durable, shard_id=sid
            )
            prepared, _ = cur.prepare(key, members)
        cur.write_prepared(key, prepared)
        self.total += 1

    def _finish(self) -> None:
        if self._cur is not None:
            self._cur.close()
            self.paths.append(self._cur.path)
            self._cur = None
            self.shard += 1

    def close(self) -> None:
        """Finish the current shard (end blocks, rename, index) and release the pattern lock.

        Later writes start a new shard (and take the lock again).
        """
        try:
            self._finish()
        finally:
            self._release()

    def abort(self) -> None:
        """Discard the shard in progress and release the pattern lock."""
        try:
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
