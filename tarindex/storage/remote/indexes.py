"""Remote index files: fetched whole once per process, kept in memory and in the cache.

An index fetched from the network is bounded by what its header describes
(:func:`index_bound`); one taken from the cache directory is checked (header, length, crc32
footer) before it is trusted, and a corrupt cache entry is dropped, with a warning naming
its file, and fetched again.
"""

from __future__ import annotations

import os
import threading
import warnings
from collections import OrderedDict
from collections.abc import Callable, Sequence

from ...errors import FormatError, IndexMissingError, RemoteError
from ...format.index import decode_index, index_size, read_header
from ...format.spec import GZIP_RECORD, GZIP_WINDOW, HEADER, MIN_GZIP_SPACING
from ...format.url import url_scheme
from .fetch import read_wholes
from .options import DEFAULT, RemoteOptions, cache_key, protocol_of
from .transport import filesystem, fs_path

__all__ = ["expand_remote", "forget_index", "index_bound", "load_indexes"]

_INDEX_MEMORY = 512 << 20
"""Bytes of fetched indexes one process keeps in memory at most (least recently used out)."""

INDEX_RECORD_SLACK = 1 << 20
"""Bytes an index may hold past its tables and per-entry records (records of later minors)."""

_indexes: OrderedDict[str, bytes] = OrderedDict()
_indexes_bytes = [0]
_idx_lock = threading.Lock()


def _after_fork_in_child() -> None:
    global _idx_lock
    _idx_lock = threading.Lock()


os.register_at_fork(after_in_child=_after_fork_in_child)


def index_bound(url: str) -> Callable[[bytes], int]:
    """The bound of :func:`~.fetch.read_whole` for the index at ``url``.

    Given its first bytes (the 80-byte header, FORMAT.md §2.1), the most bytes the index can
    hold: its tables (:func:`~tarindex.format.index.index_size`), plus at most 12 bytes of
    records per member and sample (data crc32s §2.8.2, key hashes §2.8.3), the seek points
    of a gzip-compressed shard (§2.8.4, §10: at most one 32 KiB window per 64 KiB of the
    tar, its ``tar_size``) and :data:`INDEX_RECORD_SLACK`.

    Raises (from the function returned):
        FormatError: The header is not an index header (names the URL).
    """

    def bound(head: bytes) -> int:
        h = read_header(head[: HEADER.size], url)
        points = (h.tar_size // MIN_GZIP_SPACING + 2) * (GZIP_WINDOW + 64) + GZIP_RECORD.size
        return index_size(h) + 12 * (h.n_members + h.n_samples) + points + INDEX_RECORD_SLACK

    return bound


def forget_all_indexes() -> None:
    """Drop every index from this process's memory (not from the cache directory)."""
    with _idx_lock:
        _indexes.clear()
        _indexes_bytes[0] = 0


def _remember(url: str, data: bytes) -> None:
    with _idx_lock:
        old = _indexes.pop(url, None)
        if old is not None:
            _indexes_bytes[0] -= len(old)
        _indexes[url] = data
        _indexes_bytes[0] += len(data)
        while _indexes_bytes[0] > _INDEX_MEMORY and len(_indexes) > 1:
            _, d = _indexes.popitem(last=False)
            _indexes_bytes[0] -= len(d)


def forget_index(url: str, opts: RemoteOptions = DEFAULT) -> None:
    """Drop ``url`` from this process's index memory and from the cache directory."""
    with _idx_lock:
        old = _indexes.pop(url, None)
        if old is not None:
            _indexes_bytes[0] -= len(old)
    c = opts.cache()
    if c is not None:
        c.discard(cache_key("index", url), "tidx")


def _from_cache(url: str, opts: RemoteOptions) -> bytes | None:
    """The cached index of ``url`` if it is whole and sound; a corrupt entry is dropped."""
    c = opts.cache()
    if c is None:
        return None
    key = cache_key("index", url)
    d = c.get(key, "tidx", what=f"the cached index of {url}")
    if d is None:
        return None
    try:
        decode_index(memoryview(d), url, check_crc=True)
    except FormatError as e:
        warnings.warn(
            f"{c.path(key, 'tidx')}: the cached index of {url} is corrupt ({e}); dropped it, "
            f"fetching the index again",
            RuntimeWarning,
            stacklevel=3,
        )
        c.discard(key, "tidx")
        return None
    return d


def load_indexes(
    urls: Sequence[str], tar_urls: Sequence[str], opts: RemoteOptions = DEFAULT
) -> list[tuple[bytes, bool]]:
    """The bytes of remote index files, each fetched at most once per process.

    From this process's memory, else the cache directory (checked: a corrupt entry is
    dropped with a warning naming its file), else the network (all missing ones
    concurrently, one whole-file read each, bounded by :func:`index_bound`).

    Args:
        urls: Index URLs.
        tar_urls: The tar each index belongs to, for messages.
        opts: Transport options.

    Returns:
        Per URL, ``(bytes, fresh)``: ``fresh`` is ``True`` if just fetched from the network.

    Raises:
        IndexMissingError: An index does not exist (the message says how to build it).
        FormatError: A fetched index's header is not an index header.
        RemoteError: As :func:`~.fetch.fetch`; a reply longer than the index can be.
    """
    out: list[tuple[bytes, bool] | None] = [None] * len(urls)
    missing: list[int] = []
    c = opts.cache()
    for i, u in enumerate(urls):
        with _idx_lock:
            d = _indexes.get(u)
            if d is not None:
                _indexes.move_to_end(u)
        if d is None:
            d = _from_cache(u, opts)
            if d is not None:
                _remember(u, d)
        if d is None:
            missing.append(i)
        else:
            out[i] = (d, False)
    if missing:
        got = _fetch_indexes([urls[i] for i in missing], [tar_urls[i] for i in missing], opts)
        for i, d in zip(missing, got, strict=True):
            out[i] = (d, True)
            _remember(urls[i], d)
            if c is not None:
                c.put(cache_key("index", urls[i]), "tidx", d)
    return out  # type: ignore[return-value]


def _fetch_indexes(urls: list[str], tars: list[str], opts: RemoteOptions) -> list[bytes]:
    """Whole index files, all at once (one batch of requests over HTTP and S3)."""
    try:
        return read_wholes(urls, opts, [index_bound(u) for u in urls])
    except FileNotFoundError as e:
        k = next((k for k, u in enumerate(urls) if str(e).startswith(u + ":")), 0)
        u, t = urls[k], tars[k]
        raise IndexMissingError(
            f"{u}: no index for remote shard {t}; build one beside it (on a machine that "
            f"can write there: tarindex index on the file, then upload "
            f"{os.path.basename(u)}), or keep it locally: tarindex index {t} --out DIR, "
            f"then read with options=OpenOptions(index_dir=DIR)"
        ) from None
    except RemoteError as e:
        bad = next((u for u in urls if str(e).startswith(u + ":")), None)
        if bad is None:
            raise
        raise RemoteError(f"{bad}: cannot fetch the index: {e}") from e


def expand_remote(pattern: str, opts: RemoteOptions = DEFAULT) -> list[str]:
    """Shard URLs for a remote glob (``s3://b/train-*.tar``) or directory (ending in ``/``).

    Sorted; index files and temp files are left out. A plain URL is returned as it is (its
    existence is checked when its index is fetched).

    Raises:
        FileNotFoundError: Nothing matches (names the pattern).
    """
    from ...format.spec import INDEX_SUFFIX, SHARD_SUFFIXES

    proto = protocol_of(pattern)
    globby = any(ch in pattern.split("://", 1)[1] for ch in "*?[")
    if not globby and not pattern.endswith("/"):
        return [pattern]
    fs = filesystem(pattern, opts)
    if globby:
        found = fs.glob(fs_path(pattern))
    else:
        found = [p for p in fs.ls(fs_path(pattern), detail=False) if p.endswith(SHARD_SUFFIXES)]
    urls = sorted(
        (p if url_scheme(p) else f"{proto}://{p.lstrip('/')}")
        for p in found
        if not p.endswith((INDEX_SUFFIX, ".tmp"))
    )
    if not urls:
        raise FileNotFoundError(f"{pattern}: no shard matches this remote pattern")
    return urls
