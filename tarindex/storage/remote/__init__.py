"""Remote shards through fsspec: URLs, ranged reads with retries, indexes, read-ahead.

Any fsspec protocol works (``https://``, ``s3://``, ``gs://``, ``hf://``, ...; install
``tarindex[remote]`` and the protocol's package). ``file://`` URLs are plain local paths.
The story is docs/REMOTE.md; the modules, bottom up:

- :mod:`.options`: :class:`RemoteOptions` (fsspec storage options, retries, timeout,
  deadline, read-ahead budget, cache directory, the opt-in for servers that ignore Range),
  URL helpers, the traffic counters (:func:`stats`).
- :mod:`.transport`: fsspec filesystems (made per process, keyed by pid,
  ``skip_instance_cache``, never pickled) and one request with the checks on its reply
  (the range it holds, the pinned version, a bounded body, the deadline).
- :mod:`.fetch`: :func:`fetch`, the one place ranges cross the network (retries, backoff),
  sizes (:func:`file_size`), whole files, :func:`download`.
- :mod:`.indexes`: :func:`load_indexes`, an index fetched once per process (kept in
  memory, and in the cache directory when there is one).
- :mod:`.ahead`: the read-ahead store of a remote tar (ranges fetched ahead, the per-process
  byte budget and threads).
- :mod:`.source`: :class:`RemoteSource`, the byte source of a remote tar (coalescing,
  read-ahead, cache), and :func:`prefetch_many`.
- :mod:`.needorder`: the order a plan reads a tar's bytes in (:func:`need`): its whole
  download fetches its pieces in it.
- :mod:`.whole`: whole shards downloaded once per machine into the cache and read locally
  (the ``"shard"`` fetch policy): :func:`open_copy` (read while it downloads), :func:`find_copy`,
  :func:`local_copy`, :func:`fetch_ahead`, :func:`release`.
"""

from __future__ import annotations

from ...format.url import is_url
from .. import sums as _sums
from . import ahead as _ahead
from . import fetch as _fetch
from . import indexes as _idx
from . import transport as _tr
from . import whole as _whole
from .fetch import download, fetch, file_size, read_whole
from .indexes import expand_remote, forget_index, load_indexes
from .needorder import need
from .options import DEFAULT, MANIFEST_MAX_BYTES, RemoteOptions, local_path, stats
from .source import RemoteSource, prefetch_many
from .transport import Pin, filesystem, learns_versions
from .whole import (
    drop_seeds,
    fetch_ahead,
    find_copy,
    hold,
    local_copy,
    open_copy,
    pin_ahead,
    pinned,
    release,
)

__all__ = [
    "DEFAULT",
    "MANIFEST_MAX_BYTES",
    "Pin",
    "RemoteOptions",
    "RemoteSource",
    "download",
    "drop_seeds",
    "fetch_ahead",
    "find_copy",
    "expand_remote",
    "fetch",
    "file_size",
    "filesystem",
    "filesystem_pids",
    "forget_process_state",
    "hold",
    "forget_index",
    "is_url",
    "learns_versions",
    "load_indexes",
    "local_copy",
    "local_path",
    "need",
    "open_copy",
    "pin_ahead",
    "pinned",
    "prefetch_many",
    "read_whole",
    "release",
    "stats",
]


def forget_process_state() -> None:
    """Forget what this process learnt: indexes, Range-checked hosts, read-ahead, own entries.

    Indexes in memory, Range-checked hosts, the read-ahead pool, and the entries its
    downloads wrote (checked at their next open, as in another process). For tests and
    benchmarks that need a cold process; the cache directory is kept.
    """
    _sums.forget_own()
    _idx.forget_all_indexes()
    _fetch.forget_range_checks()
    _ahead.drop_pool()
    _whole.forget_pins()
    _whole.forget_ahead()


def filesystem_pids() -> list[int]:
    """The process ids whose fsspec filesystems this process holds (for worker tests).

    Its own pid once it made one; after a fork, its parent's too (never used there).
    """
    return _tr.filesystem_pids()
