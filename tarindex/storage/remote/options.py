"""How remote shards are reached: :class:`RemoteOptions`, URL helpers, traffic counters.

Plain values only (no open handle): a :class:`RemoteOptions` is pickled to DataLoader workers.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
import urllib.parse
from dataclasses import dataclass, field
from typing import Any

from ...format.url import url_scheme
from ..cache import DirCache

__all__ = [
    "DEFAULT",
    "FETCH_POLICIES",
    "MANIFEST_MAX_BYTES",
    "RemoteOptions",
    "STATS",
    "cache_key",
    "local_path",
    "protocol_of",
    "stats",
]

MANIFEST_MAX_BYTES = 256 << 20
"""Largest remote manifest read, in bytes (a reader limit, docs/REMOTE.md "Bounds")."""


def local_path(path: str) -> str:
    """``file:///x/y`` -> ``/x/y`` (percent-decoded); any other string unchanged."""
    if url_scheme(path) == "file":
        return urllib.parse.unquote(urllib.parse.urlsplit(path).path)
    return path


def protocol_of(url: str) -> str:
    """The URL's scheme, lower case (``"https"``, ``"s3"``)."""
    return url_scheme(url) or "file"


def cache_key(*parts: object) -> str:
    """A hex sha256 of ``parts`` joined by NUL: the key of a cache entry or memory slot."""
    return hashlib.sha256("\0".join(map(str, parts)).encode("utf-8", "surrogateescape")).hexdigest()


@dataclass(frozen=True)
class RemoteOptions:
    """How remote shards are read (pickled to DataLoader workers; holds no open handle).

    Args:
        storage_options: Per protocol, keyword arguments for its fsspec filesystem, e.g.
            ``{"s3": {"endpoint_url": "http://127.0.0.1:9000", "anon": False}}``. A flat dict
            (no protocol keys) applies to every protocol. Defaults to none.
        retries: Retries of a failed or short read (connection dropped, timeout, deadline
            passed, 5xx, 429) before :class:`~tarindex.errors.RemoteError`. Defaults to ``5``.
        backoff: First retry delay in seconds, doubled per retry up to 2 s. Defaults to
            ``0.05``.
        timeout: Seconds a request may wait for a connection or for the next bytes (HTTP).
            Defaults to ``60``.
        deadline: Seconds one request (a size query, one ranged read, one index) may take
            in all, however its bytes trickle in (HTTP and S3); a request past it is
            abandoned and retried like a timeout, then
            :class:`~tarindex.errors.RemoteError`. Defaults to ``120``.
        concurrency: Requests in flight at most per batched read. Defaults to ``64``.
        readahead_bytes: Per process, bytes fetched ahead and not yet read (streaming
            read-ahead, batch prefetch) at most. Defaults to 64 MiB.
        readahead_threads: Background read-ahead requests in flight at most per process.
            Defaults to ``16``.
        cache_dir: A local directory caching remote bytes across processes and runs
            (:class:`~tarindex.storage.cache.DirCache`). Defaults to ``None`` (no cache).
        cache_bytes: Byte limit of ``cache_dir``. Defaults to 10 GiB.
        chunk_bytes: With ``cache_dir``, reads are rounded out to aligned chunks of this
            many bytes, each cached as one file. Defaults to 1 MiB.
        download_whole: For servers that ignore ``Range``: download each whole shard into
            ``cache_dir`` instead of refusing it. Defaults to ``False``.
        fetch: The fetch policy (docs/REMOTE.md, "Fetch policy"). ``"shard"``: every shard
            is downloaded whole into the cache directory (sequential multi-MB ranged reads,
            one download per machine) and read from there; ``"range"``: only the bytes of
            the samples read are fetched (ranged reads); ``"auto"``: chosen from the access
            pattern: whole shards when the plan (a streaming epoch, a sampler of ours, an
            order handed with ``ShardSet.follow``) or the reads so far say a shard will be
            read mostly or wholly, ranges otherwise (``ds[i]``, ``get(key)``, subsets).
            Defaults to ``"auto"``.
        shards_ahead: Whole-shard downloads this process runs ahead of need, in the plan's
            order, at most; a shard under 64 MiB counts as its share of one
            (:data:`tarindex.read.fetchpolicy.SHARD_UNIT`: small shards download together).
            Defaults to ``4``.
        whole_cache_dir: Where whole shards go when ``cache_dir`` is ``None``. Defaults to
            ``None``: ``$TARINDEX_CACHE_DIR``, else ``<tmp>/tarindex-cache-<uid>`` (bounded
            by ``cache_bytes`` either way).
    """

    storage_options: dict[str, Any] = field(default_factory=dict)
    retries: int = 5
    backoff: float = 0.05
    timeout: float = 60.0
    deadline: float = 120.0
    concurrency: int = 64
    readahead_bytes: int = 64 << 20
    readahead_threads: int = 16
    cache_dir: str | None = None
    cache_bytes: int = 10 << 30
    chunk_bytes: int = 1 << 20
    download_whole: bool = False
    fetch: str = "auto"
    shards_ahead: int = 4
    whole_cache_dir: str | None = None

    def __post_init__(self) -> None:
        if self.fetch not in FETCH_POLICIES:
            raise ValueError(
                f"RemoteOptions(fetch={self.fetch!r}): expected one of {', '.join(FETCH_POLICIES)}"
            )
        if int(self.shards_ahead) < 0:
            raise ValueError(f"RemoteOptions(shards_ahead={self.shards_ahead}): expected >= 0")

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
        return _cache_at(self.cache_dir, self.cache_bytes)

    def whole_cache(self) -> DirCache:
        """Where whole shards are kept (bounded by :attr:`cache_bytes` either way).

        :attr:`cache_dir`, else :attr:`whole_cache_dir`, else the environment's
        ``TARINDEX_CACHE_DIR``, else ``<tmp>/tarindex-cache-<uid>``.

        Raises:
            OSError: If the directory cannot be created.
        """
        d = self.cache_dir or self.whole_cache_dir or os.environ.get("TARINDEX_CACHE_DIR")
        if not d:
            uid = os.getuid() if hasattr(os, "getuid") else 0
            d = os.path.join(tempfile.gettempdir(), f"tarindex-cache-{uid}")
        return _cache_at(d, self.cache_bytes)


FETCH_POLICIES = ("auto", "shard", "range")
"""The values of :attr:`RemoteOptions.fetch`."""

DEFAULT = RemoteOptions()

_caches: dict[tuple[int, str, int], DirCache] = {}


def _cache_at(root: str, limit: int) -> DirCache:
    key = (os.getpid(), root, limit)
    c = _caches.get(key)
    if c is None:
        c = _caches[key] = DirCache(root, limit)
    return c


def _protocols() -> set[str]:
    """Protocol names fsspec knows (``http``, ``s3``, ...); empty without fsspec."""
    try:
        import fsspec  # type: ignore[import-untyped,unused-ignore]
    except ImportError:
        return set()
    return set(fsspec.available_protocols()) | {"http", "https", "s3", "gs", "gcs", "az", "hf"}


@dataclass
class Stats:
    """This process's remote traffic counters (see :func:`stats`)."""

    requests: int = 0
    """Requests sent (a size query, a ranged read, a whole-file read)."""
    bytes: int = 0
    """Body bytes received."""
    retries: int = 0
    """Requests sent again after a transient failure."""
    shards: int = 0
    """Whole shards downloaded into the cache (the ``"shard"`` fetch policy)."""


STATS = Stats()
"""The counters of this process (a forked child starts from its parent's values)."""


def stats(reset: bool = False) -> dict[str, int]:
    """This process's remote traffic since start/reset.

    ``{"requests", "bytes", "retries", "shards"}`` (``shards``: whole shards downloaded
    into the cache).
    """
    out = {
        "requests": STATS.requests,
        "bytes": STATS.bytes,
        "retries": STATS.retries,
        "shards": STATS.shards,
    }
    if reset:
        STATS.requests = STATS.bytes = STATS.retries = STATS.shards = 0
    return out
