"""Remote shards through fsspec: URLs, ranged reads with retries, indexes, read-ahead.

Any fsspec protocol works (``https://``, ``s3://``, ``gs://``, ``hf://``, ...; install
``tarindex[remote]`` and the protocol's package). ``file://`` URLs are plain local paths.
What is here (the story is docs/REMOTE.md):

- :class:`RemoteOptions`: how to reach remote shards (fsspec storage options, retries,
  timeout, read-ahead budget, cache directory, the opt-in for servers that ignore Range).
- :func:`fetch`: the one place bytes cross the network: a list of ``(url, start, end)``
  ranges read concurrently with one fsspec ``cat_ranges`` per filesystem, every reply's length
  checked (a server that ignores ``Range`` is refused, a short reply retried), transient
  errors retried with bounded exponential backoff, then a :class:`~tarindex.errors.RemoteError`
  naming the URL and the byte range.
- :func:`load_indexes`: an index fetched once per process (kept in memory, and in the cache
  directory when there is one).
- :class:`RemoteSource`: the :class:`~tarindex.bytesource.ByteSource` of a remote tar:
  ``read_ranges`` coalesces neighbouring ranges and reads them concurrently;
  ``prefetch_ranges`` fetches ranges ahead (in background threads, within a per-process byte
  budget) into a store that later reads take from.

Filesystem objects are made per process (keyed by pid, ``skip_instance_cache``) and never
pickled: a forked, spawned or forkserver DataLoader worker builds its own.
"""

from __future__ import annotations

import hashlib
import os
import threading
import time
import urllib.parse
from bisect import bisect_right
from collections import OrderedDict
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from numpy.typing import NDArray

from ..errors import IndexMissingError, RangeNotSupportedError, RemoteError, TruncatedError
from ..format.url import is_url, url_scheme
from .cache import DirCache

__all__ = [
    "RemoteOptions",
    "RemoteSource",
    "is_url",
    "local_path",
    "fetch",
    "load_indexes",
    "prefetch_many",
    "expand_remote",
    "download",
    "stats",
]

COALESCE_GAP = 2048
"""Largest gap in bytes between two ranges that one request spans (tar headers, padding)."""


def local_path(path: str) -> str:
    """``file:///x/y`` -> ``/x/y`` (percent-decoded); any other string unchanged."""
    if url_scheme(path) == "file":
        return urllib.parse.unquote(urllib.parse.urlsplit(path).path)
    return path


def protocol_of(url: str) -> str:
    """The URL's scheme, lower case (``"https"``, ``"s3"``)."""
    return url_scheme(url) or "file"


@dataclass(frozen=True)
class RemoteOptions:
    """How remote shards are read (pickled to DataLoader workers; holds no open handle).

    Args:
        storage_options: Per protocol, keyword arguments for its fsspec filesystem, e.g.
            ``{"s3": {"endpoint_url": "http://127.0.0.1:9000", "anon": False}}``. A flat dict
            (no protocol keys) applies to every protocol. Defaults to none.
        retries: Retries of a failed or short read (connection dropped, timeout, 5xx, 429)
            before :class:`~tarindex.errors.RemoteError`. Defaults to ``5``.
        backoff: First retry delay in seconds, doubled per retry up to 2 s. Defaults to
            ``0.05``.
        timeout: Seconds a request may wait for a connection or for the next bytes (HTTP).
            Defaults to ``60``.
        concurrency: Requests in flight at most per batched read. Defaults to ``64``.
        readahead_bytes: Per process, bytes fetched ahead and not yet read (streaming
            read-ahead, batch prefetch) at most. Defaults to 64 MiB.
        readahead_threads: Background read-ahead requests in flight at most per process.
            Defaults to ``16``.
        cache_dir: A local directory caching remote bytes across processes and runs
            (:class:`~tarindex.cache.DirCache`). Defaults to ``None`` (no cache).
        cache_bytes: Byte limit of ``cache_dir``. Defaults to 10 GiB.
        chunk_bytes: With ``cache_dir``, reads are rounded out to aligned chunks of this
            many bytes, each cached as one file. Defaults to 1 MiB.
        download_whole: For servers that ignore ``Range``: download each whole shard into
            ``cache_dir`` instead of refusing it. Defaults to ``False``.
    """

    storage_options: dict[str, Any] = field(default_factory=dict)
    retries: int = 5
    backoff: float = 0.05
    timeout: float = 60.0
    concurrency: int = 64
    readahead_bytes: int = 64 << 20
    readahead_threads: int = 16
    cache_dir: str | None = None
    cache_bytes: int = 10 << 30
    chunk_bytes: int = 1 << 20
    download_whole: bool = False

    def __hash__(self) -> int:
        return hash(repr(self))

    def options_for(self, protocol: str) -> dict[str, Any]:
        """The fsspec keyword arguments for ``protocol``."""
        so = self.storage_options
        if protocol in so and isinstance(so[protocol], dict):
            return dict(so[protocol])
        if so and set(so) & _protocols():
            return {}  # per-protocol form, nothing for this one
        return dict(so)

    def cache(self) -> DirCache | None:
        """This process's view of :attr:`cache_dir` (``None`` without one)."""
        if self.cache_dir is None:
            return None
        key = (os.getpid(), self.cache_dir, self.cache_bytes)
        c = _caches.get(key)
        if c is None:
            c = _caches[key] = DirCache(self.cache_dir, self.cache_bytes)
        return c


DEFAULT = RemoteOptions()


def _protocols() -> set[str]:
    """Protocol names fsspec knows (``http``, ``s3``, ...); empty without fsspec."""
    try:
        import fsspec  # type: ignore[import-untyped,unused-ignore]
    except ImportError:
        return set()
    return set(fsspec.available_protocols()) | {"http", "https", "s3", "gs", "gcs", "az", "hf"}

_caches: dict[tuple[int, str, int], DirCache] = {}
_filesystems: dict[tuple[int, str, str], Any] = {}
_fs_lock = threading.Lock()
_range_ok: set[tuple[int, str]] = set()
"""(pid, scheme://host) whose server answered a ranged read with a range, in this process."""


def _after_fork_in_child() -> None:
    # a lock held by another thread at fork time would stay held forever in the child; the
    # read-ahead threads do not exist there: make them again on first use
    global _fs_lock, _idx_lock
    _fs_lock = threading.Lock()
    _idx_lock = threading.Lock()
    _pool[0] = None


os.register_at_fork(after_in_child=_after_fork_in_child)


@dataclass
class _Stats:
    requests: int = 0
    bytes: int = 0
    retries: int = 0


_stats = _Stats()


def stats(reset: bool = False) -> dict[str, int]:
    """This process's remote traffic: ``{"requests", "bytes", "retries"}`` since start/reset."""
    out = {"requests": _stats.requests, "bytes": _stats.bytes, "retries": _stats.retries}
    if reset:
        _stats.requests = _stats.bytes = _stats.retries = 0
    return out


def _import_fsspec() -> Any:
    try:
        import fsspec  # type: ignore[import-untyped,unused-ignore]
    except ImportError:
        raise ImportError(
            "remote shards need fsspec: pip install 'tarindex[remote]' (plus s3fs for s3://, "
            "gcsfs for gs://, ...)"
        ) from None
    return fsspec


def filesystem(url: str, opts: RemoteOptions = DEFAULT) -> Any:
    """This process's fsspec filesystem for ``url``'s protocol and ``opts`` (made on first use).

    Raises:
        ImportError: fsspec, or the protocol's package, is not installed (the message says
            what to install).
    """
    proto = protocol_of(url)
    key = (os.getpid(), proto, repr(sorted(opts.options_for(proto).items())))
    fs = _filesystems.get(key)
    if fs is not None:
        return fs
    fsspec = _import_fsspec()
    kw = opts.options_for(proto)
    if proto in ("http", "https") and "client_kwargs" not in kw:
        import aiohttp

        kw["client_kwargs"] = {
            "timeout": aiohttp.ClientTimeout(
                total=None, sock_connect=opts.timeout, sock_read=opts.timeout
            )
        }
    try:
        with _fs_lock:
            fs = _filesystems.get(key)
            if fs is None:
                fs = _filesystems[key] = fsspec.filesystem(proto, skip_instance_cache=True, **kw)
    except ImportError as e:
        raise ImportError(f"{url}: protocol {proto!r} needs a package fsspec names: {e}") from e
    return fs


def _fs_path(fs: Any, url: str) -> str:
    proto = protocol_of(url)
    return url if proto in ("http", "https") else str(fs._strip_protocol(url))


def _permanent(e: BaseException) -> bool:
    """Errors a retry cannot fix: missing, forbidden, bad request (not 408/429/5xx)."""
    if isinstance(e, (FileNotFoundError, PermissionError, IsADirectoryError)):
        return True
    status = getattr(e, "status", None) or getattr(e, "code", None)
    if isinstance(status, int) and 400 <= status < 500 and status not in (408, 425, 429):
        return True
    return False


def _describe(e: BaseException) -> str:
    s = str(e).strip().replace("\n", " ")
    return f"{type(e).__name__}: {s[:300]}" if s else type(e).__name__


def fetch(reqs: Sequence[tuple[str, int, int]], opts: RemoteOptions = DEFAULT) -> list[bytes]:
    """Read byte ranges ``[start, end)`` of remote files, concurrently; return their bytes.

    One fsspec ``cat_ranges`` call per filesystem and attempt (at most
    :attr:`RemoteOptions.concurrency` requests in flight). Every reply must have exactly
    ``end - start`` bytes: a longer reply means the server ignored ``Range``; a shorter one
    (connection dropped mid-body) is retried, like timeouts, connection errors, 5xx and 429,
    up to :attr:`RemoteOptions.retries` times with exponential backoff.

    Args:
        reqs: ``(url, start, end)`` per range, ``0 <= start < end``.
        opts: Transport options. Defaults to :data:`DEFAULT`.

    Returns:
        The bytes of each range, in the order of ``reqs``.

    Raises:
        RangeNotSupportedError: A reply held more bytes than asked for (names the URL).
        IndexMissingError: Never; see :func:`load_indexes`.
        FileNotFoundError: A URL does not exist (names it).
        RemoteError: A range still failing after the retries, or a permanent error (403,
            400, ...): names the URL, the byte range and the last cause.
    """
    out: list[bytes | None] = [None] * len(reqs)
    todo = [i for i, (_, a, b) in enumerate(reqs) if b > a]
    for i, (_, a, b) in enumerate(reqs):
        if b <= a:
            out[i] = b""
    delay = opts.backoff
    last: dict[int, BaseException | str] = {}
    for attempt in range(opts.retries + 1):
        if not todo:
            break
        if attempt:
            _stats.retries += len(todo)
            time.sleep(delay)
            delay = min(delay * 2, 2.0)
        groups: dict[int, list[int]] = {}
        fss: dict[int, Any] = {}
        for i in todo:
            fs = filesystem(reqs[i][0], opts)
            groups.setdefault(id(fs), []).append(i)
            fss[id(fs)] = fs
        failed: list[int] = []
        for gid, idx in groups.items():
            fs = fss[gid]
            paths = [_fs_path(fs, reqs[i][0]) for i in idx]
            starts = [reqs[i][1] for i in idx]
            ends = [reqs[i][2] for i in idx]
            _stats.requests += len(idx)
            try:
                got: list[Any] = fs.cat_ranges(
                    paths, starts, ends, on_error="return", batch_size=opts.concurrency
                )
            except Exception as e:  # a whole batch failing (e.g. loop errors)
                got = [e] * len(idx)
            for i, g in zip(idx, got, strict=True):
                url, a, b = reqs[i]
                if isinstance(g, BaseException):
                    if isinstance(g, FileNotFoundError):
                        raise FileNotFoundError(
                            f"{url}: not found (bytes {a}..{b}): check the URL"
                        ) from g
                    if _permanent(g):
                        raise RemoteError(
                            f"{url}: bytes {a}..{b}: {_describe(g)} (not retried); check the "
                            f"URL and the credentials in RemoteOptions.storage_options"
                        ) from g
                    last[i] = g
                    failed.append(i)
                    continue
                _stats.bytes += len(g)
                if len(g) == b - a:
                    out[i] = bytes(g)
                    if protocol_of(url) in ("http", "https"):
                        _range_ok.add((os.getpid(), _origin(url)))
                elif len(g) > b - a:
                    raise _no_range(url, a, b, len(g))
                else:
                    last[i] = f"short reply: {len(g)} of {b - a} bytes"
                    failed.append(i)
        todo = failed
    if todo:
        i = todo[0]
        url, a, b = reqs[i]
        cause = last.get(i, "unknown error")
        err = RemoteError(
            f"{url}: bytes {a}..{b}: still failing after {opts.retries} retries "
            f"({len(todo)} range(s)); last error: "
            f"{cause if isinstance(cause, str) else _describe(cause)}; check the server, or "
            f"raise RemoteOptions(retries=, timeout=)"
        )
        if isinstance(cause, BaseException):
            raise err from cause
        raise err
    return out  # type: ignore[return-value]


def _origin(url: str) -> str:
    u = urllib.parse.urlsplit(url)
    return f"{u.scheme}://{u.netloc}"


def _no_range(url: str, a: int, b: int, got: int) -> RangeNotSupportedError:
    return RangeNotSupportedError(
        f"{url}: asked for bytes {a}..{b} ({b - a} bytes), the server sent {got}: it ignores "
        f"HTTP Range requests, so every read would download the whole shard. Serve the shards "
        f"from a server that honours Range (nginx, S3, ...), or opt in to whole-shard "
        f"downloads into a cache: RemoteOptions(download_whole=True, cache_dir=DIR)"
    )


def file_size(url: str, opts: RemoteOptions = DEFAULT) -> int:
    """Size in bytes of the remote file ``url`` (HTTP ``HEAD``, S3 ``HeadObject``, ...).

    Raises:
        FileNotFoundError: No such file.
        RemoteError: The size cannot be learnt (after retries).
    """
    fs = filesystem(url, opts)
    delay = opts.backoff
    for attempt in range(opts.retries + 1):
        try:
            _stats.requests += 1
            size = fs.size(_fs_path(fs, url))
        except FileNotFoundError:
            raise
        except Exception as e:
            if _permanent(e) or attempt == opts.retries:
                raise RemoteError(f"{url}: cannot get its size: {_describe(e)}") from e
            _stats.retries += 1
            time.sleep(delay)
            delay = min(delay * 2, 2.0)
            continue
        if size is None:
            raise RemoteError(f"{url}: the server does not report the file's size (HEAD)")
        return int(size)
    raise AssertionError("unreachable")


# -- indexes --------------------------------------------------------------------------------
_INDEX_MEMORY = 512 << 20
"""Bytes of fetched indexes one process keeps in memory at most (least recently used out)."""

_indexes: OrderedDict[str, bytes] = OrderedDict()
_indexes_bytes = [0]
_idx_lock = threading.Lock()


def _key(*parts: object) -> str:
    return hashlib.sha256("\0".join(map(str, parts)).encode("utf-8", "surrogateescape")).hexdigest()


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
        c._drop(c.path(_key("index", url), "tidx"))


def load_indexes(
    urls: Sequence[str], tar_urls: Sequence[str], opts: RemoteOptions = DEFAULT
) -> list[tuple[bytes, bool]]:
    """The bytes of remote index files, each fetched at most once per process.

    From this process's memory, else the cache directory, else the network (all missing ones
    concurrently, one whole-file read each).

    Args:
        urls: Index URLs.
        tar_urls: The tar each index belongs to, for messages.
        opts: Transport options.

    Returns:
        Per URL, ``(bytes, fresh)``: ``fresh`` is ``True`` if just fetched from the network.

    Raises:
        IndexMissingError: An index does not exist (the message says how to build it).
        RemoteError: As :func:`fetch`.
    """
    out: list[tuple[bytes, bool] | None] = [None] * len(urls)
    missing: list[int] = []
    c = opts.cache()
    for i, u in enumerate(urls):
        with _idx_lock:
            d = _indexes.get(u)
            if d is not None:
                _indexes.move_to_end(u)
        if d is None and c is not None:
            d = c.get(_key("index", u), "tidx")
            if d is not None:
                _remember(u, d)
        if d is None:
            missing.append(i)
        else:
            out[i] = (d, False)
    if missing:
        got = _fetch_whole([urls[i] for i in missing], tar_urls, missing, opts)
        for i, d in zip(missing, got, strict=True):
            out[i] = (d, True)
            _remember(urls[i], d)
            if c is not None:
                c.put(_key("index", urls[i]), "tidx", d)
    return out  # type: ignore[return-value]


def _fetch_whole(
    urls: list[str], tar_urls: Sequence[str], pos: list[int], opts: RemoteOptions
) -> list[bytes]:
    """Whole files, concurrently per filesystem, with the retries of :func:`fetch`."""
    fs = filesystem(urls[0], opts)
    paths = [_fs_path(fs, u) for u in urls]
    delay = opts.backoff
    got: list[Any] = [None] * len(urls)
    todo = list(range(len(urls)))
    for attempt in range(opts.retries + 1):
        if attempt:
            _stats.retries += len(todo)
            time.sleep(delay)
            delay = min(delay * 2, 2.0)
        _stats.requests += len(todo)
        try:
            res = fs.cat([paths[i] for i in todo], on_error="return")
        except Exception as e:
            res = {paths[i]: e for i in todo}
        failed = []
        for i in todo:
            g = res.get(paths[i], FileNotFoundError(paths[i])) if isinstance(res, dict) else res
            if isinstance(g, BaseException):
                if isinstance(g, FileNotFoundError) or getattr(g, "status", None) == 404:
                    t = tar_urls[pos[i]]
                    raise IndexMissingError(
                        f"{urls[i]}: no index for remote shard {t}; build one beside it (on a "
                        f"machine that can write there: tarindex index on the file, then upload "
                        f"{os.path.basename(urls[i])}), or keep it locally: tarindex index {t} "
                        f"--out DIR, then read with index_dir=DIR"
                    ) from None
                if _permanent(g) or attempt == opts.retries:
                    raise RemoteError(f"{urls[i]}: cannot fetch the index: {_describe(g)}") from g
                failed.append(i)
                continue
            _stats.bytes += len(g)
            got[i] = bytes(g)
        todo = failed
        if not todo:
            break
    return got


def expand_remote(pattern: str, opts: RemoteOptions = DEFAULT) -> list[str]:
    """Shard URLs for a remote glob (``s3://b/train-*.tar``) or directory (ending in ``/``).

    Sorted; index files and temp files are left out. A plain URL is returned as it is (its
    existence is checked when its index is fetched).

    Raises:
        FileNotFoundError: Nothing matches (names the pattern).
    """
    from ..format.spec import INDEX_SUFFIX

    proto = protocol_of(pattern)
    globby = any(ch in pattern.split("://", 1)[1] for ch in "*?[")
    if not globby and not pattern.endswith("/"):
        return [pattern]
    fs = filesystem(pattern, opts)
    if globby:
        found = fs.glob(_fs_path(fs, pattern))
    else:
        found = [p for p in fs.ls(_fs_path(fs, pattern), detail=False) if p.endswith(".tar")]
    urls = sorted(
        (p if url_scheme(p) else f"{proto}://{p.lstrip('/')}")
        for p in found
        if not p.endswith((INDEX_SUFFIX, ".tmp"))
    )
    if not urls:
        raise FileNotFoundError(f"{pattern}: no shard matches this remote pattern")
    return urls


# -- read-ahead -----------------------------------------------------------------------------
class _Pool:
    """This process's read-ahead threads and byte budget (made again after a fork)."""

    def __init__(self, threads: int, budget: int) -> None:
        self.pid = os.getpid()
        self.executor = ThreadPoolExecutor(max(1, threads), thread_name_prefix="tarindex-ra")
        self.lock = threading.Lock()
        self.budget = budget
        self.used = 0

    def take(self, n: int, force: bool = False) -> bool:
        with self.lock:
            if not force and (self.used + n > self.budget and self.used or not self.budget):
                return False
            self.used += n
            return True

    def give(self, n: int) -> None:
        with self.lock:
            self.used -= n


_pool: list[_Pool | None] = [None]


def _the_pool(opts: RemoteOptions) -> _Pool:
    p = _pool[0]
    if p is None or p.pid != os.getpid():
        p = _pool[0] = _Pool(opts.readahead_threads, opts.readahead_bytes)
    return p


class _Entry:
    __slots__ = ("start", "end", "need", "served", "future", "data", "pool")

    def __init__(self, start: int, end: int, pool: _Pool, need: int | None = None) -> None:
        self.start = start
        self.end = end
        self.need = end - start if need is None else need  # bytes the hint asked for
        self.served = 0  # bytes handed out by reads so far
        self.future: Future[bytes] | None = None
        self.data: bytes | None = None
        self.pool = pool

    def result(self) -> bytes:
        if self.data is None:
            assert self.future is not None
            self.data = self.future.result()
            self.future = None
        return self.data


def coalesce_need(
    starts: Sequence[int], ends: Sequence[int], gap: int = COALESCE_GAP
) -> list[tuple[int, int, int]]:
    """:func:`coalesce`, with the bytes of the given ranges (their union) in each merged range."""
    out: list[list[int]] = []
    for a, b in sorted(zip(starts, ends, strict=True)):
        if b <= a:
            continue
        if out and a - out[-1][1] <= gap:
            last = out[-1]
            if b > last[1]:
                last[2] += b - max(a, last[1])
                last[1] = b
        else:
            out.append([a, b, b - a])
    return [(a, b, n) for a, b, n in out]


def coalesce(
    starts: Sequence[int], ends: Sequence[int], gap: int = COALESCE_GAP
) -> list[tuple[int, int]]:
    """Merge ranges closer than ``gap`` bytes (overlaps too); sorted half-open ``(start, end)``."""
    out: list[tuple[int, int]] = []
    for a, b in sorted(zip(starts, ends, strict=True)):
        if b <= a:
            continue
        if out and a - out[-1][1] <= gap:
            if b > out[-1][1]:
                out[-1] = (out[-1][0], b)
        else:
            out.append((a, b))
    return out


class RemoteSource:
    """The bytes of one remote tar: ranged reads through fsspec, read-ahead, optional cache.

    Made in the process that reads (by :meth:`tarindex.read.reader.ShardReader`); never pickled.

    Args:
        url: The tar's URL.
        size: Its size in bytes (from :func:`file_size`).
        opts: Transport options.
        ident: A string that identifies this version of the tar (the index's fingerprint):
            the cache keys of its bytes.

    Attributes:
        requests: Network requests made for this source (for tests and benchmarks).
        bytes_fetched: Bytes received for this source.
    """

    zero_copy = False

    def __init__(self, url: str, size: int, opts: RemoteOptions, ident: str) -> None:
        self.path = url
        self.size = size
        self.opts = opts
        self.key = _key("tar", url, size, ident)
        self.requests = 0
        self.bytes_fetched = 0
        self._entries: list[_Entry] = []  # sorted by start, non-overlapping
        self._starts: list[int] = []
        self._lock = threading.Lock()
        self._local: Any = None  # a PreadSource over a whole-shard download
        self._closed = False

    # -- opening --------------------------------------------------------------------------
    @classmethod
    def open(cls, url: str, opts: RemoteOptions, ident: str) -> RemoteSource:
        """Learn the tar's size and check that its server honours ``Range``.

        The first ranged read of an HTTP server in each process is made alone (a server
        that ignores Range then costs one whole download, not one per check).

        Raises:
            FileNotFoundError: The tar does not exist.
            RangeNotSupportedError: The server ignores Range (without ``download_whole``).
            RemoteError: As :func:`fetch`.
        """
        src = cls(url, file_size(url, opts), opts, ident)
        if src.size and protocol_of(url) in ("http", "https"):
            if (os.getpid(), _origin(url)) not in _range_ok:
                try:
                    src.fetch_fresh([(0, min(512, src.size))])  # not rounded to a chunk
                except RangeNotSupportedError:
                    if not opts.download_whole:
                        raise
                    src._download_whole()
        return src

    def _download_whole(self) -> None:
        from .bytesource import PreadSource

        c = self.opts.cache()
        if c is None:
            raise RangeNotSupportedError(
                f"{self.path}: the server ignores HTTP Range and download_whole=True needs a "
                f"cache directory to download shards into: RemoteOptions(download_whole=True, "
                f"cache_dir=DIR)"
            )
        p = c.local_file(self.key, "whole", self.size)
        if p is None:
            fs = filesystem(self.path, self.opts)
            tmp = c.temp_path()
            try:
                _stats.requests += 1
                self.requests += 1
                fs.get_file(_fs_path(fs, self.path), tmp)
                n = os.path.getsize(tmp)
                if n != self.size:
                    raise RemoteError(
                        f"{self.path}: downloaded {n} bytes, the server said {self.size}"
                    )
                _stats.bytes += n
                self.bytes_fetched += n
                if not c.put_file(self.key, "whole", tmp):
                    raise RemoteError(
                        f"{self.path}: {self.size} bytes do not fit the cache's limit "
                        f"(cache_bytes={c.limit}) or its disk"
                    )
            except BaseException:
                c._drop(tmp)
                raise
            p = c.path(self.key, "whole")
        fd = os.open(p, os.O_RDONLY)
        self._local = PreadSource(self.path, fd, self.size)

    # -- the ByteSource interface -----------------------------------------------------------
    def read(self, offset: int, size: int) -> bytes:
        """Return ``size`` bytes at ``offset`` (from the read-ahead store, cache or network).

        Raises:
            TruncatedError: If the range runs past the end of the tar.
            RemoteError: As :func:`fetch`.
        """
        end = offset + size
        if offset < 0 or size < 0 or end > self.size:
            raise TruncatedError(
                f"{self.path}: byte {self.size}: range {offset}..{end} runs past the end of "
                f"the tar; the index is corrupt or the tar was cut: tarindex verify {self.path}"
            )
        if size == 0:
            return b""
        if self._local is not None:
            return bytes(self._local.read(offset, size))
        buf, bases = self.read_ranges(np.asarray([offset], np.int64), np.asarray([end], np.int64))
        b = int(bases[0])
        return buf[b : b + size] if (b or len(buf) != size) else bytes(buf)

    def read_ranges(
        self, starts: NDArray[np.int64], ends: NDArray[np.int64]
    ) -> tuple[bytes, NDArray[np.int64]]:
        """Read the half-open ranges; return ``(buffer, bases)`` as :class:`ByteSource` says.

        Ranges already fetched ahead are taken from the store (waiting for them if still in
        flight); the rest are coalesced (gaps up to :data:`COALESCE_GAP`) and read with one
        concurrent batch. When all ranges lie in one stored read, its bytes are returned as
        they are (no copy).

        Raises:
            TruncatedError: A range runs past the end of the tar.
            RemoteError: As :func:`fetch`.
        """
        st, en = starts.tolist(), ends.tolist()
        n = len(st)
        if n and (min(st) < 0 or max(en) > self.size):
            bad = next(i for i in range(n) if st[i] < 0 or en[i] > self.size)
            raise TruncatedError(
                f"{self.path}: byte {self.size}: range {st[bad]}..{en[bad]} runs past the end "
                f"of the tar; the index is corrupt or the tar was cut: tarindex verify {self.path}"
            )
        if self._local is not None:
            buf, bases = self._local.read_ranges(starts, ends)
            return bytes(buf), bases
        hits: list[_Entry | None] = [self._find(a, b) for a, b in zip(st, en, strict=True)]
        if n and hits[0] is not None and all(h is hits[0] for h in hits):
            e = hits[0]
            data = self._result(e)
            self._consume(e, int((ends - starts).sum()))
            return data, starts - e.start
        parts: list[bytes | None] = [None] * n
        miss = [i for i in range(n) if hits[i] is None]
        if miss:
            got = self._fetch_ranges([(st[i], en[i]) for i in miss])
            for i, g in zip(miss, got, strict=True):
                parts[i] = g
        used: dict[int, tuple[_Entry, int]] = {}
        for i, h in enumerate(hits):
            if h is not None:
                d = self._result(h)
                parts[i] = d[st[i] - h.start : en[i] - h.start]
                prev = used.get(id(h))
                used[id(h)] = (h, en[i] - st[i] + (prev[1] if prev else 0))
        for h, nbytes in used.values():
            self._consume(h, nbytes)
        bases = np.zeros(n, np.int64)
        if n > 1:
            np.cumsum(ends[:-1] - starts[:-1], out=bases[1:])
        return b"".join(parts), bases  # type: ignore[arg-type]

    def prefetch(self, start: int, end: int) -> None:
        """Fetch ``[start, end)`` ahead in a background thread (within the byte budget)."""
        self.prefetch_ranges(np.asarray([start], np.int64), np.asarray([end], np.int64))

    def prefetch_ranges(
        self, starts: NDArray[np.int64], ends: NDArray[np.int64], wait: bool = False
    ) -> None:
        """Fetch ranges ahead into this source's store; later reads inside them take them.

        Args:
            starts: ``int64 (r,)`` range starts in bytes.
            ends: ``int64 (r,)`` range ends (exclusive).
            wait: Fetch now, in this thread, with one concurrent batch (the ranges of a
                batch or of the open-time checks); always admitted. ``False`` queues each
                coalesced range to the background threads while the per-process budget
                (:attr:`RemoteOptions.readahead_bytes`) has room; the rest are skipped.
        """
        if self._local is not None or self._closed:
            return
        plan = self.plan_prefetch(starts.tolist(), ends.tolist())
        if not plan:
            return
        pool = _the_pool(self.opts)
        if wait:
            pool.take(sum(b - a for a, b, _ in plan), force=True)
            datas = self._fetch_ranges([(a, b) for a, b, _ in plan])
            self._store(plan, datas, pool)
            return
        self._queue(plan, pool)

    def queue_ahead(self, starts: NDArray[np.int64], ends: NDArray[np.int64]) -> bool:
        """:meth:`prefetch_ranges` in the background; ``False`` if the budget had no room."""
        if self._local is not None or self._closed:
            return True
        plan = self.plan_prefetch(starts.tolist(), ends.tolist())
        return self._queue(plan, _the_pool(self.opts)) if plan else True

    def _queue(self, plan: list[tuple[int, int, int]], pool: _Pool) -> bool:
        for a, b, need in plan:
            if not pool.take(b - a):
                return False
            e = _Entry(a, b, pool, need)
            e.future = pool.executor.submit(self._fetch_one, a, b)
            if not self._insert(e):
                pool.give(b - a)
        return True

    def plan_prefetch(
        self, starts: Sequence[int], ends: Sequence[int]
    ) -> list[tuple[int, int, int]]:
        """The coalesced ranges ``(start, end, bytes asked)`` not already stored.

        A stored range is dropped once reads have taken as many bytes from it as were asked
        for (the union of the given ranges in it), whatever their order.
        """
        out = []
        for a, b, need in coalesce_need(starts, ends):
            if a >= 0 and b <= self.size and self._find(a, b) is None:
                out.append((a, b, need))
        return out

    def _store(
        self, plan: list[tuple[int, int, int]], datas: list[bytes], pool: _Pool
    ) -> None:
        for (a, b, need), d in zip(plan, datas, strict=True):
            e = _Entry(a, b, pool, need)
            e.data = d
            if not self._insert(e):
                pool.give(b - a)

    def close(self) -> None:
        """Drop the read-ahead store (pending reads finish in the background; idempotent)."""
        self._closed = True
        self.drop_ahead()
        if self._local is not None:
            self._local.close()
            self._local = None

    def drop_ahead(self) -> None:
        """Drop every range fetched ahead and not read yet (frees the read-ahead budget)."""
        with self._lock:
            entries, self._entries, self._starts = self._entries, [], []
        for e in entries:
            e.pool.give(e.end - e.start)

    # -- store ----------------------------------------------------------------------------
    def _find(self, a: int, b: int) -> _Entry | None:
        with self._lock:
            k = bisect_right(self._starts, a) - 1
            if k >= 0:
                e = self._entries[k]
                if e.end >= b:
                    return e
        return None

    def _result(self, e: _Entry) -> bytes:
        """The bytes of a stored read; a failed one is dropped from the store and re-raised."""
        try:
            return e.result()
        except BaseException:
            self._drop_entry(e)
            raise

    def _insert(self, e: _Entry) -> bool:
        with self._lock:
            k = bisect_right(self._starts, e.start)
            if (k > 0 and self._entries[k - 1].end > e.start) or (
                k < len(self._entries) and self._entries[k].start < e.end
            ):
                return False  # overlaps what is stored: keep the older one
            self._entries.insert(k, e)
            self._starts.insert(k, e.start)
            return True

    def _consume(self, e: _Entry, nbytes: int) -> None:
        """Count ``nbytes`` read from ``e``; drop it once the bytes asked for were all read."""
        e.served += nbytes
        if e.served >= e.need:
            self._drop_entry(e)

    def _drop_entry(self, e: _Entry) -> None:
        with self._lock:
            k = bisect_right(self._starts, e.start) - 1
            if not (k >= 0 and self._entries[k] is e):
                return
            del self._entries[k]
            del self._starts[k]
        e.pool.give(e.end - e.start)

    # -- network (through the cache) --------------------------------------------------------
    def _fetch_one(self, a: int, b: int) -> bytes:
        return self._fetch_ranges([(a, b)])[0]

    def _fetch_ranges(self, ranges: list[tuple[int, int]]) -> list[bytes]:
        """The bytes of ``ranges``, coalesced into requests, through the cache if there is one."""
        reqs, finish = self.plan_fetch(ranges)
        return finish(self._network(reqs))

    def fetch_fresh(self, ranges: list[tuple[int, int]]) -> list[bytes]:
        """The bytes of ``ranges`` from the server now: not the cache, not the read-ahead store.

        One concurrent batch of coalesced requests; for the open-time checks (FORMAT.md §3),
        which must see the remote file as it is. A whole-shard download (``download_whole``)
        is read instead, as nothing else can be.

        Raises:
            RemoteError: As :func:`fetch`.
        """
        if self._local is not None:
            return [bytes(self._local.read(a, b - a)) for a, b in ranges]
        merged = coalesce([a for a, _ in ranges], [b for _, b in ranges])
        got = self._network(merged)
        starts = [m[0] for m in merged]
        out = []
        for a, b in ranges:
            k = bisect_right(starts, a) - 1
            out.append(got[k][a - merged[k][0] : b - merged[k][0]])
        return out

    def _network(self, reqs: list[tuple[int, int]]) -> list[bytes]:
        if not reqs:
            return []
        got = fetch([(self.path, a, b) for a, b in reqs], self.opts)
        self.requests += len(reqs)
        self.bytes_fetched += sum(len(g) for g in got)
        return got

    def plan_fetch(
        self, ranges: list[tuple[int, int]]
    ) -> tuple[list[tuple[int, int]], Callable[[list[bytes]], list[bytes]]]:
        """Network requests for ``ranges`` and a function from their replies to each range's bytes.

        Without a cache the requests are the coalesced ranges. With one they are the runs of
        missing aligned chunks (:attr:`RemoteOptions.chunk_bytes`); the finisher stores the
        fetched chunks in the cache. Two-phase so that :func:`prefetch_many` can send the
        requests of many sources in one batch.
        """
        c = self.opts.cache()
        if c is None:
            merged = coalesce([a for a, _ in ranges], [b for _, b in ranges])

            def finish_plain(got: list[bytes]) -> list[bytes]:
                out = []
                for a, b in ranges:
                    k = bisect_right([m[0] for m in merged], a) - 1
                    m0 = merged[k][0]
                    d = got[k]
                    out.append(d if (a == m0 and b - a == len(d)) else d[a - m0 : b - m0])
                return out

            return merged, finish_plain
        cb = self.opts.chunk_bytes
        ids = sorted({i for a, b in ranges for i in range(a // cb, (b - 1) // cb + 1)})
        have: dict[int, bytes] = {}
        for i in ids:
            n = min(cb, self.size - i * cb)
            d = c.get(self.key, f"{i}", n)
            if d is not None:
                have[i] = d
        need = [i for i in ids if i not in have]
        runs: list[list[int]] = []
        for i in need:
            if runs and runs[-1][-1] == i - 1 and len(runs[-1]) < 64:
                runs[-1].append(i)
            else:
                runs.append([i])
        reqs = [(r[0] * cb, min((r[-1] + 1) * cb, self.size)) for r in runs]

        def finish_cached(got: list[bytes]) -> list[bytes]:
            for r, d in zip(runs, got, strict=True):
                for k, i in enumerate(r):
                    piece = d[k * cb : (k + 1) * cb]
                    have[i] = piece
                    c.put(self.key, f"{i}", piece)
            out = []
            for a, b in ranges:
                i0, i1 = a // cb, (b - 1) // cb
                if i0 == i1:
                    out.append(have[i0][a - i0 * cb : b - i0 * cb])
                else:
                    whole = b"".join(have[i] for i in range(i0, i1 + 1))
                    out.append(whole[a - i0 * cb : b - i0 * cb])
            return out

        return reqs, finish_cached


def prefetch_many(items: Sequence[tuple[RemoteSource, Sequence[int], Sequence[int]]]) -> None:
    """Fetch the ranges of many remote sources now, in one concurrent batch, into their stores.

    The form of :meth:`RemoteSource.prefetch_ranges` (``wait=True``) for a batch that spans
    shards: one round trip for the whole batch instead of one per shard.

    Raises:
        RemoteError: As :func:`fetch`.
    """
    jobs = []
    reqs: list[tuple[str, int, int]] = []
    opts: RemoteOptions | None = None
    for src, starts, ends in items:
        if src._local is not None or src._closed:
            continue
        plan = src.plan_prefetch(starts, ends)
        if not plan:
            continue
        net, finish = src.plan_fetch([(a, b) for a, b, _ in plan])
        jobs.append((src, plan, finish, len(reqs), len(net)))
        reqs.extend((src.path, a, b) for a, b in net)
        opts = src.opts
    if not jobs or opts is None:
        return
    got = fetch(reqs, opts) if reqs else []
    for src, plan, finish, at, n in jobs:
        mine = got[at : at + n]
        src.requests += n
        src.bytes_fetched += sum(len(g) for g in mine)
        pool = _the_pool(src.opts)
        pool.take(sum(b - a for a, b, _ in plan), force=True)
        src._store(plan, finish(mine), pool)


DOWNLOAD_CHUNK = 8 << 20
"""Bytes per ranged read when a remote tar is streamed to a local file."""


def download(url: str, dest: str, opts: RemoteOptions = DEFAULT) -> int:
    """Stream the remote file ``url`` once into the local file ``dest``; return its size.

    Sequential ranged reads of :data:`DOWNLOAD_CHUNK` bytes (each retried as in
    :func:`fetch`), so memory stays bounded; a server that ignores Range is read with one
    plain GET instead.

    Raises:
        FileNotFoundError: No such file.
        RemoteError: As :func:`fetch`; ``dest`` is then incomplete (the caller removes it).
    """
    size = file_size(url, opts)
    with open(dest, "wb") as f:
        pos = 0
        while pos < size:
            end = min(pos + DOWNLOAD_CHUNK, size)
            try:
                (data,) = fetch([(url, pos, end)], opts)
            except RangeNotSupportedError:
                if pos:
                    raise
                f.seek(0)
                f.truncate()
                fs = filesystem(url, opts)
                with fs.open(_fs_path(fs, url), "rb", block_size=0) as r:
                    while chunk := r.read(DOWNLOAD_CHUNK):
                        f.write(chunk)
                break
            f.write(data)
            pos = end
    n = os.path.getsize(dest)
    if n != size:
        raise RemoteError(f"{url}: streamed {n} bytes, the server said {size}; try again")
    return n
