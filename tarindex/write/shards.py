"""ShardWriter: samples into numbered tar shards, each with its sidecar index, atomically.

The shard pattern (:func:`check_pattern`, :func:`existing_shards`), the cut from one shard to
the next (``maxcount`` samples, ``maxsize`` bytes: :func:`plan_shard_sizes` plans it ahead),
the per-shard zstd dictionary, and :class:`TarWriter` (one file, no numbering). One shard's
bytes are :class:`tarindex.write.tar.TarShardWriter`'s; a sample's members are
:class:`tarindex.write.members.SampleEncoder`'s.
"""

from __future__ import annotations

import glob
import hashlib
import os
import re
from collections import deque
from collections.abc import Callable, Collection, Iterable
from typing import Any

from ..codecs import encode_value, zstd_compressor
from ..errors import WriterError
from ..format.manifest import ManifestRow
from ..format.spec import BLOCK, INDEX_SUFFIX, MAX_ZSTD_DICT_BYTES, SHARD_ID_BYTES
from ..format.tar import build_member_header, padded
from ..storage.indexfile import index_path_for
from .lock import PatternLock
from .members import Member, SampleEncoder, int_option
from .tar import TarShardWriter, check_mtime, finished_size

__all__ = [
    "ShardWriter",
    "TarWriter",
    "ZSTD_DICT_BYTES",
    "check_pattern",
    "existing_shards",
    "plan_shard_sizes",
]


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


# one printf conversion (or a literal %%); check_pattern has already refused mapping keys and '*'
_CONVERSION = re.compile(r"%%|%[-#0 +]*\d*(?:\.\d*)?[hlL]?[a-zA-Z]")


def _shard_number(middle: str) -> list[int]:
    """Integers that ``middle`` (the text of a pattern's field) may have been printed from."""
    out: list[int] = []
    for base in (10, 16, 8, 0):
        try:
            out.append(int(middle, base))
        except ValueError:
            pass
    try:
        out.append(int(float(middle)))  # %e, %f, %g fields
    except (ValueError, OverflowError):
        pass
    return [k for k in out if k >= 0]


def existing_shards(pattern: str) -> list[str]:
    """Files on disk that ``pattern`` names: shard ``k`` = ``pattern % k`` and its index.

    A file counts only if it is exactly ``pattern % k`` for some integer ``k >= 0``, or that
    plus ``.tidx`` (FORMAT.md §1): with ``"out/s-%06d.tar"``, ``out/s-000003.tar`` and
    ``out/s-000012.tar.tidx`` count, ``out/s-3.tar``, ``out/s-000003.tar.bak`` and
    ``out/classes.json`` do not. A pattern without a field names one shard (itself).

    Returns:
        The paths, sorted.

    Raises:
        WriterError: ``pattern`` fails :func:`check_pattern`.
    """
    if not check_pattern(pattern):
        return sorted(p for p in (pattern, index_path_for(pattern)) if os.path.lexists(p))
    pat = os.path.normpath(pattern)
    spec = next((m for m in _CONVERSION.finditer(pat) if m.group() != "%%"), None)
    if spec is None:  # check_pattern took it, but it is no conversion this module can read
        raise WriterError(f"pattern {pattern!r}: use one integer field such as %06d")
    prefix = pat[: spec.start()].replace("%%", "%")
    found: set[str] = set()
    for extra in ("", INDEX_SUFFIX):
        suffix = pat[spec.end() :].replace("%%", "%") + extra
        for path in glob.glob(glob.escape(prefix) + "*" + glob.escape(suffix)):
            middle = path[len(prefix) : len(path) - len(suffix)]
            shard = path[: len(path) - len(extra)]
            if any(os.path.normpath(pattern % k) == shard for k in _shard_number(middle)):
                found.add(path)
    return sorted(found)


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
        if count and (count >= maxcount or finished_size(pos + n) > maxsize):
            out.append(count)
            count = pos = 0
        if pos == 0:
            pos = 2 * BLOCK  # the shard-id header (TarShardWriter.prepare counts it too)
        pos += n
        count += 1
    if count:
        out.append(count)
    return out


ZSTD_DICT_BYTES = 32 * 1024
"""Default size bound of a shard's trained zstd dictionary (``zstd_dict=True``): 32 KiB.

On ~300-byte JSON captions (benchmarks/bench_compress.py) 32 KiB trained on 1000 samples
gives ~108 bytes per member against ~244 without a dictionary; 110 KiB gains 4% more."""
_TRAIN_MIN_SAMPLES = 8
_TRAIN_MIN_BYTES = 4096
_TRAIN_MAX_BYTES = 64 << 20  # stop holding samples for training past 64 MiB of them


class ShardWriter:
    """Write samples into a sequence of tar shards, each with its sidecar index.

    A context manager. Shard ``k`` goes to ``pattern % k`` (e.g. ``"out/train-%06d.tar"``). A new
    shard starts before a sample when the current one holds ``maxcount`` samples, or when the
    sample would make the finished tar (headers, padding and end blocks included) larger than
    ``maxsize`` bytes; a single sample larger than that gets a shard of its own. On an
    exception inside the ``with`` block the shard in progress is deleted; shards already
    finished stay complete with their indexes.

    Values are encoded by extension (:func:`tarindex.codecs.encode.encode_value`: webdataset's
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
            (webdataset 1.0's ``encoder=False`` refuses ``str`` too); as they are means every
            extension: an ``EXT.zst`` or ``EXT.gz`` value is stored as given (the frame, so a
            raw copy of a compressed shard keeps its bytes), and ``compress=`` or
            ``zstd_dict=`` beside ``encoder=False`` is a ``WriterError``. Defaults to
            :func:`tarindex.codecs.encode.encode_value`.
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
        post: Called as ``post(path)`` after each shard is complete (the tar renamed into
            place and its index written), in shard order, as webdataset's ``post=`` (the usual
            place to upload a shard). An exception it raises propagates from the
            :meth:`write` or :meth:`close` that finished the shard; the shard stays complete.
            Defaults to ``None``.
        keep_meta: Write sample entries whose name starts with one ``_`` (``"_meta"``) as
            members; by default they are skipped, as webdataset's writer does. Entries
            starting with ``__`` are never written. Defaults to ``False``.

    Members are written sorted by extension (as webdataset's writer), so the same samples
    give the same bytes whatever the order of their dicts. A pattern ending in ``.tar.gz`` or
    ``.tgz`` writes gzip-compressed tars without sidecar indexes (``maxsize`` counts the tar
    before compression; see :class:`tarindex.write.tar.TarShardWriter`). A ``pipe:`` pattern
    is refused: a writer never starts another program.

    Raises:
        WriterError: If ``maxcount`` or ``maxsize`` is not a finite number ``>= 1``, ``mtime``
            does not fit a ustar header, ``pattern`` fails :func:`check_pattern` (a ``%``
            that is not exactly one integer field, the same path for two shards) or starts
            with ``pipe:``, ``post`` is not callable, or a compression option is invalid (or
            given with ``encoder=False``).

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
        post: Callable[[str], Any] | None = None,
        keep_meta: bool = False,
    ) -> None:
        self._lock: PatternLock | None = None
        self.pattern = os.fspath(pattern)
        if self.pattern.startswith("pipe:"):
            raise WriterError(
                f"{self.pattern!r}: a writer never starts another program (webdataset's "
                f"'pipe:' names a shell command); write to a path, and upload each finished "
                f"shard with post=f (ShardWriter(..., post=upload) calls upload(path))"
            )
        if post is not None and not callable(post):
            raise WriterError(f"post={post!r}: expected a callable post(path) or None")
        self.post = post
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
        self.mtime = check_mtime(mtime)
        # a bad pattern fails here, not after the first shard is written
        self._has_field = False if self._single_file else check_pattern(self.pattern, start_shard)
        self.durable = durable
        self.seed = seed
        self._members = SampleEncoder(encoder, compress, keep_meta)
        self.zstd_level = int_option("zstd_level", zstd_level, -(1 << 17), 22)
        if zstd_dict is True:
            zstd_dict = ZSTD_DICT_BYTES
        self._dict_size = (
            0
            if zstd_dict is False
            else int_option("zstd_dict", zstd_dict, 1024, MAX_ZSTD_DICT_BYTES)
        )
        self._train_n = int_option("zstd_dict_samples", zstd_dict_samples, 1, 1 << 40)
        if self._dict_size and self._members.raw:
            raise WriterError(
                f"zstd_dict={zstd_dict!r} with encoder=False: encoder=False stores every value "
                f"as it is (a .zst value is already a frame), so no member would use the "
                f"dictionary; drop one of the two"
            )
        self._first = start_shard
        self.paths: list[str] = []
        self.rows: list[ManifestRow] = []
        """The manifest row of each finished shard (FORMAT.md §9), in :attr:`paths` order."""
        self.total = 0
        self._cur: TarShardWriter | None = None
        self._cctx: Any = None  # the current shard's zstd compressor, made at its first use
        self._zdict: Any = None  # the current shard's trained zstd dictionary, or None
        # samples encoded but not yet in a shard: (key, [(stored ext, data, compress?), ...]);
        # with zstd_dict, a shard's first samples wait here until its dictionary is trained
        self._pending: deque[tuple[str, list[Member]]] = deque()
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
        key, members = self._members.encode(sample)
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
            data = [(e, self._compress(d) if z else d) for e, d, z in members]
            try:
                prepared, n = cur.prepare(key, data)
            except WriterError:
                self._pop()
                raise
            if cur.count and (
                cur.count >= self.maxcount or finished_size(cur.pos + n) > self.maxsize
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
        # one statement: no signal can land between the temp file's creation and ``_cur``
        # (``abort`` then removes it)
        path = self._path(self.shard)
        self._cur = cur = TarShardWriter(path, self.mtime, durable=self.durable, shard_id=sid)
        zd = self._train() if self._dict_size else None
        if zd is not None:
            cur.write_zstd_dict(zd.as_bytes())
        self._zdict, self._cctx = zd, None
        return cur

    def _compress(self, data: bytes) -> bytes:
        """One zstd frame of ``data``, with the shard's dictionary if it has one.

        The compressor is made at the shard's first compressed member, so a writer that
        compresses nothing never imports zstandard (a process that dropped its privileges
        may no longer be able to read the package).
        """
        if self._cctx is None:
            self._cctx = zstd_compressor(self.zstd_level, self._zdict)
        out: bytes = self._cctx.compress(data)
        return out

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
            if self._cur.row is not None:
                self.rows.append(self._cur.row)
            self._cur = None
            self._cctx = self._zdict = None
            self.shard += 1
            if self.post is not None:
                self.post(self.paths[-1])

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
