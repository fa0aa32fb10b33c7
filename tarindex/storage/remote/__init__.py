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
- :mod:`.source`: :class:`RemoteSource`, the byte source of a remote tar (coalescing,
  read-ahead, cache), and :func:`prefetch_many`.
"""

from __future__ import annotations

from ...format.url import is_url
from .fetch import _range_ok as _range_ok  # this process's state, for the tests
from .fetch import download, fetch, file_size, read_whole
from .indexes import _indexes as _indexes
from .indexes import _indexes_bytes as _indexes_bytes
from .indexes import expand_remote, forget_index, load_indexes
from .options import DEFAULT, MANIFEST_MAX_BYTES, RemoteOptions, local_path, stats
from .source import RemoteSource, prefetch_many
from .source import _pool as _pool
from .transport import _filesystems as _filesystems
from .transport import filesystem

__all__ = [
    "DEFAULT",
    "MANIFEST_MAX_BYTES",
    "RemoteOptions",
    "RemoteSource",
    "download",
    "expand_remote",
    "fetch",
    "file_size",
    "filesystem",
    "forget_index",
    "is_url",
    "load_indexes",
    "local_path",
    "prefetch_many",
    "read_whole",
    "stats",
]

