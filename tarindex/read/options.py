"""How a :class:`~tarindex.ShardSet` opens and checks its shards: :class:`OpenOptions`.

One object, held by the set (``shards.options``) and passed as it is by every constructor
that opens shards (``ShardSet``, ``TarDataset``, ``TarIterableDataset``): the options are
documented here once. How remote shards are fetched is the other object,
:class:`tarindex.RemoteOptions` (``remote=``). Plain values only, so it pickles to
DataLoader workers under every start method.
"""

from __future__ import annotations

import operator
import os
from dataclasses import dataclass

__all__ = ["OpenOptions", "INDEX_MODES"]

INDEX_MODES = ("auto", "require")
"""``OpenOptions.index``: build a missing index, or raise
:class:`~tarindex.errors.IndexMissingError`."""


@dataclass(frozen=True)
class OpenOptions:
    """How shards are opened, bounded and checked (every field has a default; compare by value).

    Args:
        max_open: Shards open at once per process at most (each holds 2 file descriptors),
            least recently used closed first; lowered in each process to what ``ulimit -n``
            allows (:func:`tarindex.read.pool.open_shard_bound`). An ``int >= 1``, or ``None``
            for :data:`tarindex.read.pool.DEFAULT_MAX_OPEN` (48). Defaults to ``None``.
        use_mmap: Map the tars and slice members straight from the mapping (one copy per
            byte). ``False`` reads with ``os.pread`` (a second copy, ~0.75x the streaming rate
            on ~20 KB samples, warm cache) and cannot die of SIGBUS if a tar is cut while open
            (docs/READING.md). Defaults to ``True``.
        check_crc: Check each index's crc32 when its shard is first opened in a process
            (about 1 ms per MB of index); ``False`` for huge indexes ``verify`` has checked.
            Defaults to ``True``.
        verify_data: Check every member read against the crc32 its index records
            (:class:`~tarindex.errors.ChecksumError` naming shard, key, extension and byte
            offset); needs indexes with checksums (the writer's, or ``tarindex index
            --checksums``). Defaults to ``False``.
        index_dir: A directory (or URL) holding the indexes as ``<tar name>.tidx``, for tars
            whose index is not beside them (``tarindex index URL --out DIR``). A path-like is
            kept as its ``str``. Defaults to ``None`` (beside each tar).
        index: What a shard without an index gets when the set is made. ``"auto"``: an
            index is built now, beside its tar (or in ``index_dir``) if that directory is
            writable, else (and for remote shards) in the per-user index cache
            (``$XDG_CACHE_HOME/tarindex/indexes``), with a progress bar on long tars and one
            line on stderr saying where; safe when several processes open the same shards
            (:mod:`tarindex.read.autoindex`, docs/READING.md "No index step").
            ``"require"``: :class:`~tarindex.errors.IndexMissingError` naming the command
            that builds it. Defaults to ``"auto"``.

    Raises:
        TypeError: ``max_open`` not an integer (``2.5``, ``True``), a flag not a ``bool``, or
            ``index_dir`` neither ``None``, a ``str`` nor a path-like.
        ValueError: ``max_open < 1``; ``index`` neither ``"auto"`` nor ``"require"``.
    """

    max_open: int | None = None
    use_mmap: bool = True
    check_crc: bool = True
    verify_data: bool = False
    index_dir: str | None = None
    index: str = "auto"

    def __post_init__(self) -> None:
        m = self.max_open
        if m is not None:
            if isinstance(m, bool):
                raise TypeError(f"OpenOptions(max_open={m!r}): expected an int >= 1 or None")
            try:
                m = operator.index(m)  # numpy ints too; 2.5 and "2" are refused, not truncated
            except TypeError:
                raise TypeError(
                    f"OpenOptions(max_open={m!r}): expected an int >= 1 or None"
                ) from None
            if m < 1:
                raise ValueError(f"OpenOptions(max_open={m}): at least 1 shard must stay open")
            object.__setattr__(self, "max_open", m)
        for name in ("use_mmap", "check_crc", "verify_data"):
            v = getattr(self, name)
            if type(v) is not bool:
                raise TypeError(f"OpenOptions({name}={v!r}): expected True or False")
        d = self.index_dir
        if d is not None:
            if not isinstance(d, (str, os.PathLike)):
                raise TypeError(f"OpenOptions(index_dir={d!r}): expected a directory path or URL")
            object.__setattr__(self, "index_dir", os.fspath(d))
        if self.index not in INDEX_MODES:
            raise ValueError(
                f"OpenOptions(index={self.index!r}): expected 'auto' (build a missing index "
                f"when the shards are opened) or 'require' (raise IndexMissingError)"
            )
