"""ShardWriter: write standard tar shards and their sidecar indexes in one pass, atomically."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any

from ._version import __version__
from .codecs import encode_value
from .errors import WriterError
from .format.group import group_members
from .format.index import encode_index, fingerprint
from .format.keys import check_ext, check_key
from .format.spec import BLOCK, FINGERPRINT_BYTES, USTAR_MAX_SIZE
from .format.tar import ZERO_BLOCK, build_member_header, padded
from .indexfile import index_path_for, write_atomic

__all__ = ["ShardWriter", "TarShardWriter", "check_pattern"]

_RECORD = 20 * BLOCK  # GNU tar and Python tarfile pad archives to 10240-byte records


def _check_mtime(mtime: int | None) -> int:
    """Now, or ``mtime`` if it fits the 11 octal digits of the ustar mtime field."""
    t = int(time.time()) if mtime is None else int(mtime)
    if not 0 <= t <= USTAR_MAX_SIZE:  # same 12-byte field width as size
        raise WriterError(
            f"mtime {mtime!r} does not fit a ustar header (0 <= mtime <= {USTAR_MAX_SIZE}); a wider "
            f"value would shift every byte after it and corrupt the tar"
        )
    return t


class TarShardWriter:
    """Write one shard: a plain ustar tar (pax only where a name or size needs it) + its index.

    Data goes to ``<path>.<pid>.tmp``; :meth:`close` writes the end-of-archive blocks, renames
    the tar into place, then writes the index atomically. :meth:`abort` deletes the temp file.
    So a crash or an exception never leaves a tar or index that looks complete (FORMAT.md §1).

    Args:
        path: Final path of the tar.
        mtime: Modification time stored in every header, integer seconds since the epoch,
            ``0 <= mtime < 8**11``. Defaults to now.

    Raises:
        WriterError: If ``mtime`` does not fit the 12-byte ustar mtime field.
    """

    def __init__(self, path: str, mtime: int | None = None) -> None:
        self.path = os.fspath(path)
        self.tmp = f"{self.path}.{os.getpid()}.tmp"
        self.mtime = _check_mtime(mtime)
        os.makedirs(os.path.dirname(os.path.abspath(self.path)), exist_ok=True)
        self._f = open(self.tmp, "wb")
        self.pos = 0
        self.count = 0
        self._head = bytearray()
        self._tail = b""
        self._names: list[bytes] = []
        self._offsets: list[int] = []
        self._sizes: list[int] = []
        self._keys: set[str] = set()

    def _write(self, data: bytes) -> None:
        self._f.write(data)
        self.pos += len(data)
        if len(self._head) < FINGERPRINT_BYTES:
            self._head += data[: FINGERPRINT_BYTES - len(self._head)]
        self._tail = (self._tail + data[-FINGERPRINT_BYTES:])[-FINGERPRINT_BYTES:]

    def write(self, key: str, members: list[tuple[str, bytes]]) -> None:
        """Append one sample: ``members`` is ``[(ext, data), ...]`` already encoded.

        The caller has checked ``key`` and the extensions (:func:`tarindex.format.keys.check_key`,
        :func:`~tarindex.format.keys.check_ext`); the members are written adjacently, in order
        (FORMAT.md §1).

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
        self._keys.add(key)
        for name, data in named:
            size = len(data)
            self._write(build_member_header(name, size, self.mtime))
            self._names.append(name)
            self._offsets.append(self.pos)
            self._sizes.append(size)
            self._write(data)
            pad = padded(size) - size
            if pad:
                self._write(bytes(pad))
        self.count += 1

    def close(self) -> None:
        """Finish the tar, rename it into place, then write its index (FORMAT.md §1).

        The tar ends with two 512-byte zero blocks, padded with zeros to a multiple of 10240
        bytes; the index is written atomically after the rename.
        """
        end = self.pos + 2 * BLOCK
        self._write(ZERO_BLOCK * 2 + bytes(padded_to(end, _RECORD) - end))
        self._f.close()
        size = self.pos
        # the first and last 4 KiB were kept while writing: no second read of the tar
        head, tail = fingerprint(
            lambda off, n: bytes(self._head[:n]) if off == 0 else self._tail[len(self._tail) - n :],
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
        index = encode_index(res.tables)
        os.replace(self.tmp, self.path)
        write_atomic(index_path_for(self.path), index)

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


class ShardWriter:
    """Write samples into a sequence of tar shards, each with its sidecar index.

    A context manager. Shard ``k`` goes to ``pattern % k`` (e.g. ``"out/train-%06d.tar"``). A new
    shard starts before a sample when the current one holds ``maxcount`` samples or
    ``maxsize`` bytes. On an exception inside the ``with`` block the shard in progress is
    deleted; shards already finished stay complete with their indexes.

    Args:
        pattern: printf-style pattern with one integer field, or a plain path if only one
            shard will be written.
        maxcount: Samples per shard at most. Defaults to ``100_000``.
        maxsize: Bytes per shard at most (a single larger sample still goes in one shard).
            Defaults to ``3e9``.
        start_shard: Number of the first shard. Defaults to ``0``.
        mtime: Integer mtime for every member header. Defaults to the time of construction.
        encoder: ``(ext, value) -> bytes``. Defaults to :func:`tarindex.codecs.encode_value`.

    Raises:
        WriterError: If ``maxcount`` or ``maxsize`` is not a finite number ``>= 1``, ``mtime``
            does not fit a ustar header, or ``pattern`` fails :func:`check_pattern` (a ``%``
            that is not exactly one integer field, the same path for two shards).

    Example:
        >>> with ShardWriter("out/train-%06d.tar", maxcount=10_000) as sink:  # doctest: +SKIP
        ...     sink.write({"__key__": "00000001", "png": png_bytes, "cls": 3})
    """

    def __init__(
        self,
        pattern: str | os.PathLike[str],
        maxcount: int = 100_000,
        maxsize: float = 3e9,
        *,
        start_shard: int = 0,
        mtime: int | None = None,
        encoder: Callable[[str, Any], bytes] = encode_value,
    ) -> None:
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
        self._has_field = check_pattern(self.pattern, start_shard)
        self.encoder = encoder
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
                repeated within the shard, a bad extension, a value that cannot be encoded, or
                a second shard is needed but ``pattern`` has no ``%d`` field.
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
            except (TypeError, ValueError, RecursionError) as e:  # deep json nests: RecursionError
                raise WriterError(f"sample {key!r}: {type(e).__name__}: {e}") from None
            if not isinstance(data, (bytes, bytearray, memoryview)):
                raise WriterError(
                    f"sample {key!r}: encoder returned a {type(data).__name__} for {ext!r}, not bytes"
                )
            members.append((ext, bytes(data)))
        if not members:
            raise WriterError(f"sample {key!r} has no members (only '__' entries)")
        cur = self._cur
        if cur is not None and (cur.count >= self.maxcount or cur.pos >= self.maxsize):
            self._finish()
            cur = None
        if cur is None:
            cur = self._cur = TarShardWriter(self._path(self.shard), self.mtime)
        cur.write(key, members)
        self.total += 1

    def _finish(self) -> None:
        if self._cur is not None:
            self._cur.close()
            self.paths.append(self._cur.path)
            self._cur = None
            self.shard += 1

    def close(self) -> None:
        """Finish the current shard (end blocks, rename, index); later writes start a new one."""
        self._finish()

    def abort(self) -> None:
        """Discard the shard in progress."""
        if self._cur is not None:
            self._cur.abort()
            self._cur = None

    def __enter__(self) -> ShardWriter:
        return self

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        if exc_type is None:
            self.close()
        else:
            self.abort()
