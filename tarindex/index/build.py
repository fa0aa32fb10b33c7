"""Build the sidecar index of an existing tar: one header walk, one mapping of the tar.

:func:`tarindex.index.scan.scan_members` walks the headers and takes the fingerprint (FORMAT.md §3)
from the same mapping; :func:`index_tables_for` groups the members into samples (FORMAT.md
§2, §4); :func:`build_index` writes the result atomically beside the tar (FORMAT.md §1).
:func:`build_indexes` does it for many tars (``tarindex index``): in parallel processes, local
or remote (a remote tar is streamed once into a local temp file), one bad tar never stopping
the others.
"""

from __future__ import annotations

import os
import tempfile
import warnings
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field

import numpy as np

from .._version import __version__
from ..errors import CompressedTarError, TarIndexError
from ..format.group import group_members
from ..format.index import IndexTables, encode_index
from ..format.keys import NO_SAMPLE, no_sample_reason, normalize_name
from ..format.packed import PACKED_FORMATS, PACKED_META
from ..format.spec import GZIP_SPACING, MAX_ZSTD_DICT_BYTES, ZSTD_DICT_MEMBER, ZSTD_DICT_META
from ..format.url import is_url
from ..format.zstd_dict import DictEntry, dict_id_of, entry_for
from ..storage.indexfile import index_path_for, write_atomic
from ..storage.remote import download, local_path
from ..storage.unpack import codec_missing
from .gzbuild import check_spacing, gunzipped, unpacked
from .scan import Members, scan_members

__all__ = [
    "IndexResult",
    "build_index",
    "build_indexes",
    "find_zstd_dict",
    "index_tables_for",
    "local_tar",
]


def index_tables_for(members: Members, producer: str = "tarindex.scan") -> IndexTables:
    """Group a scanned member list into index tables (FORMAT.md §2, grouping §4).

    Warns (``UserWarning``, at most one warning of each kind per shard) when regular files
    belong to no sample under the key rule (``README``, ``.hidden``, ``name.``, a ``__``
    extension: FORMAT.md §4; they are listed in ``members.skipped``), when some sample's
    members are not adjacent, or when a member name appears more than once (the last copy is
    indexed).

    Args:
        members: The tar's regular-file members and fingerprint, from :func:`scan_members`.
        producer: ``producer`` in the metadata (FORMAT.md §2.6). Defaults to
            ``"tarindex.scan"``.

    Returns:
        The tables, with ``meta`` set; ``tar_size``, ``head_crc`` and ``tail_crc`` are the
        fingerprint the scan took (FORMAT.md §3).
    """
    res = group_members(
        members.raw_names,
        members.offset.tolist(),
        members.size.tolist(),
        tar_size=members.tar_size,
        head_crc=members.head_crc,
        tail_crc=members.tail_crc,
        meta={"producer": producer, "version": __version__},
    )
    t = res.tables
    t.end = members.end
    if members.member_crc is not None:  # into index order (grouping may reorder members)
        crc_at = dict(zip(members.offset.tolist(), members.member_crc.tolist(), strict=True))
        t.member_crc = np.asarray([crc_at[o] for o in t.offset.tolist()], np.uint32)
    # the shard's zstd dictionary is in no sample by design (FORMAT.md §7): no warning
    no_ext = [n for n in res.skipped_no_ext if normalize_name(n) != ZSTD_DICT_MEMBER]
    if no_ext:
        n = len(no_ext)
        first = no_ext[0]
        why = (no_sample_reason(first) or NO_SAMPLE).removeprefix(NO_SAMPLE + ": ")
        warnings.warn(
            f"{members.path}: {n} regular file(s) belong to no sample under the key rule "
            f"(FORMAT.md §4) and are not indexed, e.g. {first!r} ({why}); list them with: "
            f"tarindex ls --members --skipped {members.path}",
            stacklevel=2,
        )
    if res.interleaved:
        warnings.warn(
            f"{members.path}: the members of some samples are not adjacent in the tar; grouped "
            f"by key across the shard (sequential reads of such samples seek)",
            stacklevel=2,
        )
    if res.duplicates:
        warnings.warn(
            f"{members.path}: {len(res.duplicates)} member name(s) appear more than once, e.g. "
            f"{res.duplicates[0]!r}; the last copy is indexed (as tar extraction does)",
            stacklevel=2,
        )
    return res.tables


def find_zstd_dict(members: Members) -> DictEntry | None:
    """Find the shard's zstd dictionary member (FORMAT.md §7) and describe it, or None.

    The member named ``__tarindex_zstd_dict__`` at the top of the tar (its last copy, as
    extraction does); its bytes are read once (a zstd dictionary is at most
    ``MAX_ZSTD_DICT_BYTES``) for the crc32 and the dictionary id. A member of that name that
    is not a zstd dictionary, or too large, is not recorded (a warning says so).
    """
    names = [normalize_name(n) for n in members.raw_names]
    hits = [i for i, n in enumerate(names) if n == ZSTD_DICT_MEMBER]
    if not hits:
        return None
    i = hits[-1]
    offset, size = int(members.offset[i]), int(members.size[i])
    name = ZSTD_DICT_MEMBER.decode()
    if not 0 < size <= MAX_ZSTD_DICT_BYTES:
        warnings.warn(
            f"{members.path}: byte {offset}: member {name!r} holds {size} bytes, not a zstd "
            f"dictionary of 1 to {MAX_ZSTD_DICT_BYTES} bytes (FORMAT.md §7); not recorded, so "
            f"its .zst members that need it will not decode",
            stacklevel=3,
        )
        return None
    with open(members.path, "rb") as f:
        data = os.pread(f.fileno(), size, offset)
    entry = entry_for(data, offset)
    if len(data) != size or dict_id_of(data) < 0:
        warnings.warn(
            f"{members.path}: byte {offset}: member {name!r} is not a zstd dictionary (no "
            f"dictionary magic, FORMAT.md §7); not recorded",
            stacklevel=3,
        )
        return None
    return entry


def build_index(
    tar_path: str | os.PathLike[str],
    index_path: str | None = None,
    *,
    require_end: bool = True,
    checksums: bool = False,
    gzip_spacing: int = GZIP_SPACING,
    tmp_dir: str | None = None,
    on_read: Callable[[int], None] | None = None,
    keep_copy: bool = True,
) -> IndexTables:
    """Scan an existing tar and write its sidecar index atomically (the tar is not modified).

    A plain tar is opened and mapped once: the header walk also takes the fingerprint. A
    gzip-compressed tar (``.tar.gz``, ``.tgz``: found by its magic bytes, whatever its name)
    is indexed without recompressing it (FORMAT.md §10): its seek points are recorded (one
    every ``gzip_spacing`` decompressed bytes), a temporary decompressed copy in ``tmp_dir``
    is walked, and the index records the offsets of the tar inside, the data crc32s (the
    data is read anyway) and the compressed file's fingerprint (``GZIX``, §2.8.4). A zstd,
    xz, bzip2 or lz4-compressed tar (lz4 if its package is installed) has no seek points: it
    is decompressed once, front to back, into the tar cache
    (:mod:`tarindex.storage.tarcache`), walked there, and the index records the tar inside,
    its crc32s and the compressed file's format and fingerprint (metadata ``compressed``,
    §11); the copy stays in the cache for the reads. Warnings as :func:`index_tables_for` and
    :func:`tarindex.index.scan.scan_members`.

    Args:
        tar_path: A plain tar made by any common tool (GNU tar, bsdtar, Python tarfile,
            webdataset, tarindex; docs/TAR_DIALECTS.md), or such a tar compressed with gzip.
        index_path: Where to write. Defaults to ``<tar_path>.tidx`` (FORMAT.md §1).
        require_end: Refuse a tar that ends without the end-of-archive zero blocks (a copy
            cut at a member boundary looks the same: ``TruncatedError``). ``False`` indexes
            it with a warning (``tarindex index --no-require-end``). Defaults to ``True``.
            docs/TAR_DIALECTS.md, "End of archive".
        checksums: Also record each member's crc32 (FORMAT.md §2.8.2; reads all the data,
            so ``tarindex verify --data`` and ``OpenOptions(verify_data=True)`` can check them). Always
            on for a gzip-compressed tar. Defaults to ``False``.
        gzip_spacing: Decompressed bytes between two seek points of a gzip-compressed tar,
            at least 64 KiB: a random read decompresses at most this much, and the index
            holds 32 KiB per point (FORMAT.md §10). Defaults to ``1 MiB``.
        tmp_dir: Directory of the temporary decompressed copy. Defaults to ``None`` (the
            system's temp directory).
        on_read: Called with each count of compressed bytes read while indexing a
            compressed tar (twice its size in all), e.g. for a progress bar. Defaults to
            ``None``.
        keep_copy: Keep the decompressed copy of a zstd/xz/bzip2/lz4 tar in the tar cache,
            keyed by ``tar_path``'s fingerprint (§11), so reading it does not decompress it
            again. ``False`` for a temporary download. Defaults to ``True``.

    Returns:
        The tables written (FORMAT.md §2).

    Raises:
        FormatError: Any of the scan errors of :func:`tarindex.index.scan.scan_members` (truncated,
            corrupt, not a tar); each names the file and the byte offset. No index file is
            written then. Invalid gzip data raises ``TruncatedError``/``ChecksumError``.
        CompressedTarError: lz4 data without the lz4 package (the message gives the fix).
        ValueError: ``gzip_spacing`` is below 64 KiB.
        OSError: The tar cannot be read or the index cannot be written.
    """
    tar_path = os.fspath(tar_path)
    try:  # a plain tar is opened once; the scan's first block tells a gzip stream apart
        tables = _tables(tar_path, require_end, checksums, tar_path)
    except CompressedTarError as e:
        if e.compression == "gzip":
            check_spacing(gzip_spacing)
            with gunzipped(tar_path, gzip_spacing, tmp_dir, on_read) as (plain, gz):
                tables = _tables(plain, require_end, True, tar_path)
                tables.gzip = gz
        elif e.compression in PACKED_FORMATS and not codec_missing(e.compression):
            with unpacked(tar_path, e.compression, tmp_dir, on_read, keep_copy) as (plain, pf):
                tables = _tables(plain, require_end, True, tar_path)
                tables.meta[PACKED_META] = pf.meta()
        else:
            raise
    write_atomic(index_path or index_path_for(tar_path), encode_index(tables))
    return tables


def _tables(path: str, require_end: bool, checksums: bool, shown: str) -> IndexTables:
    """Scan the plain tar at ``path`` into index tables; messages name ``shown``."""
    members = scan_members(path, require_end=require_end, checksums=checksums)
    entry = find_zstd_dict(members)  # reads from ``path``
    members.path = shown
    tables = index_tables_for(members)
    if entry is not None:
        tables.meta[ZSTD_DICT_META] = entry.meta()
    if not require_end:
        tables.meta["require_end"] = False  # verify rescans it the same way
    return tables


# -- many tars ---------------------------------------------------------------------------------
@dataclass
class IndexResult:
    """What :func:`build_indexes` did with one tar."""

    path: str
    """The tar, as given (a local path or a URL)."""
    status: str
    """``"built"``, ``"skipped"`` (its index is up to date) or ``"failed"``."""
    index_path: str
    """Where its index is (or would have been written)."""
    n_samples: int = 0
    """Samples in the index written (``"built"`` only)."""
    message: str = ""
    """One line: ``"N samples"`` when built; the error when failed, naming the tar (its URL,
    never the temp copy), the byte offset where one applies, and the fix."""
    error: str = ""
    """The failure's exception class name (``"TruncatedError"``, ``"FileNotFoundError"``, ...)."""
    warnings: list[str] = field(default_factory=list)
    """The warnings indexing it raised (interleaved samples, names in no sample, ...), one line
    each."""


@contextmanager
def local_tar(path: str, where: str | None = None) -> Iterator[str]:
    """Yield a local file holding the tar's bytes: ``path`` itself, or a remote tar streamed once.

    A URL (``https://``, ``s3://``, ...; docs/REMOTE.md) is streamed with
    :func:`tarindex.storage.remote.download` into a temp file in ``where`` (else the system's
    temp directory), removed afterwards whatever happens.

    Raises:
        FileNotFoundError: No such remote file.
        RemoteError: The download failed (as :func:`tarindex.storage.remote.fetch`).
    """
    if not is_url(path):
        yield path
        return
    fd, tmp = tempfile.mkstemp(prefix=".tarindex-", suffix=".tar.tmp", dir=where)
    os.close(fd)
    try:
        download(path, tmp)
        yield tmp
    finally:
        try:
            os.unlink(tmp)
        except OSError:
            pass


def _index_path(tar: str, out: str | None) -> str:
    """``<tar>.tidx`` beside the tar, or ``<out>/<tar's base name>.tidx`` (FORMAT.md §1)."""
    if out is None:
        return index_path_for(tar)
    return os.path.join(out, index_path_for(tar.rstrip("/").rsplit("/", 1)[-1]))


def _one_line(e: BaseException) -> str:
    """An exception as one line: OSErrors as ``path: reason``, others by their message."""
    if isinstance(e, OSError) and not isinstance(e, TarIndexError) and e.strerror:
        msg = f"{e.filename}: {e.strerror}" if e.filename else e.strerror
    else:
        msg = " ".join((str(e) or type(e).__name__).split())
    if not isinstance(e, (TarIndexError, OSError)):  # a bug, not bad data: say what it was
        msg = f"{type(e).__name__}: {msg}"
    return msg


def _build_one(
    path: str,
    index_path: str,
    out: str | None,
    require_end: bool,
    checksums: bool,
    gzip_spacing: int = GZIP_SPACING,
) -> IndexResult:
    """Build one tar's index; never raises (it runs in a worker process)."""
    tmp = path
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            with local_tar(path, out) as tmp:
                tables = build_index(
                    tmp,
                    index_path,
                    require_end=require_end,
                    checksums=checksums,
                    gzip_spacing=gzip_spacing,
                    tmp_dir=out,
                    keep_copy=tmp == path,  # a temp download's copy (§11) would be keyed by it
                )
            res = IndexResult(
                path, "built", index_path, tables.n_samples, f"{tables.n_samples} samples"
            )
        except Exception as e:  # a bad tar must not stop the others
            res = IndexResult(
                path, "failed", index_path, message=_one_line(e), error=type(e).__name__
            )
    if tmp != path:  # messages about the temp copy name the URL it came from
        res.message = res.message.replace(tmp, path)
    res.warnings = [" ".join(str(w.message).replace(tmp, path).split()) for w in caught]
    return res


def _run(
    todo: list[tuple[str, str]],
    jobs: int,
    out: str | None,
    require_end: bool,
    checksums: bool,
    gzip_spacing: int,
) -> Iterator[IndexResult]:
    """Yield the result of every ``(tar, index path)``, in completion order."""
    if jobs <= 1 or len(todo) <= 1:
        for p, ip in todo:
            yield _build_one(p, ip, out, require_end, checksums, gzip_spacing)
        return
    import multiprocessing as mp
    from concurrent.futures import ProcessPoolExecutor, as_completed
    from concurrent.futures.process import BrokenProcessPool

    # fork where it exists (Linux): the workers start in milliseconds with everything imported.
    # forkserver/spawn cost ~0.3 s per worker (a fresh interpreter importing numpy), which ate
    # the gain on a few-second index run.
    ctx = mp.get_context("fork" if "fork" in mp.get_all_start_methods() else "spawn")
    with ProcessPoolExecutor(max_workers=min(jobs, len(todo)), mp_context=ctx) as pool:
        futures = {
            pool.submit(_build_one, p, ip, out, require_end, checksums, gzip_spacing): (p, ip)
            for p, ip in todo
        }
        for fut in as_completed(futures):
            try:
                yield fut.result()
            except BrokenProcessPool as e:  # a worker died (e.g. SIGBUS on a file cut while read)
                p, ip = futures[fut]
                yield IndexResult(
                    p,
                    "failed",
                    ip,
                    message=f"{p}: worker process died: {_one_line(e)}",
                    error=type(e).__name__,
                )


def build_indexes(
    paths: Sequence[str],
    *,
    jobs: int = 1,
    out: str | None = None,
    up_to_date: Callable[[str, str | None], bool] | None = None,
    require_end: bool = True,
    checksums: bool = False,
    gzip_spacing: int = GZIP_SPACING,
    on_result: Callable[[IndexResult], None] | None = None,
) -> list[IndexResult]:
    """Build the sidecar index of many tars, in parallel processes (``tarindex index``).

    Each tar goes through :func:`build_index`. A tar that fails (cut, corrupt, not a tar,
    unreadable, a worker killed) is reported in its result and does not stop the others; no
    index file is left for it. A remote tar (a URL, docs/REMOTE.md) is streamed once into a
    temp file in ``out``, indexed there and the temp file removed.

    Args:
        paths: Tars: local paths or URLs (expand globs and braces first, e.g. with
            :func:`tarindex.read.sources.expand_source`).
        jobs: Worker processes, ``>= 1`` (``fork`` where the platform has it, else
            ``spawn``). ``1`` builds in this process. Defaults to ``1``.
        out: Write each index into this directory as ``<tar's base name>.tidx`` (created if
            missing) instead of beside its tar; needed for URLs. Read them back with
            ``OpenOptions(index_dir=out)``. Defaults to ``None`` (beside the tars, FORMAT.md §1).
        up_to_date: ``up_to_date(tar, index_path_or_None)``: True if an existing index still
            describes its tar; those tars are skipped (status ``"skipped"``). ``tarindex
            index`` passes :func:`tarindex.read.is_up_to_date` (the reader's open-time
            checks, FORMAT.md §3, a layer above this one). Called in this process, O(1) per
            tar. Defaults to ``None``: every tar is built (``tarindex index --force``).
        require_end: As :func:`build_index`. Defaults to ``True``.
        checksums: As :func:`build_index`. Defaults to ``False``.
        gzip_spacing: As :func:`build_index` (gzip-compressed tars). Defaults to 1 MiB.
        on_result: Called in this process with each result as it is ready (completion
            order; skipped tars first), e.g. for a progress bar. Defaults to ``None``.

    Returns:
        One :class:`IndexResult` per tar, in the order of ``paths``.

    Raises:
        ValueError: If ``jobs < 1``, or a path is a URL and ``out`` is not given (a remote
            tar's index cannot be written beside it).
        OSError: ``out`` cannot be created.
    """
    if jobs < 1:
        raise ValueError(f"jobs={jobs!r}: expected at least 1 worker process")
    check_spacing(gzip_spacing)
    remote = [p for p in paths if is_url(p)]
    if remote and out is None:
        raise ValueError(
            f"{remote[0]}: a remote tar's index cannot be written beside it; keep it locally: "
            f"tarindex index {remote[0]} --out DIR (then read with OpenOptions(index_dir=DIR))"
        )
    if out is not None:
        out = local_path(out)
        os.makedirs(out, exist_ok=True)
    results: dict[str, IndexResult] = {}
    todo: list[tuple[str, str]] = []
    seen: set[str] = set()
    for p in paths:
        if p in seen:
            continue  # given twice: built once
        seen.add(p)
        ip = _index_path(p, out)
        if up_to_date is not None and up_to_date(p, ip if out is not None else None):
            results[p] = IndexResult(p, "skipped", ip, message="index up to date")
            if on_result is not None:
                on_result(results[p])
        else:
            todo.append((p, ip))
    for res in _run(todo, jobs, out, require_end, checksums, gzip_spacing):
        results[res.path] = res
        if on_result is not None:
            on_result(res)
    return [results[p] for p in paths]
