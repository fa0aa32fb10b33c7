"""The open readers of a set of shards: a bounded LRU per process, safe under fork.

A :class:`ReaderPool` opens a shard's :class:`~tarindex.read.shard.ShardReader` on first use
in the process that reads, keeps at most :attr:`ReaderPool.open_bound` open (least recently
used closed first), sized from the process's descriptor limit (:func:`open_shard_bound`);
if opening still fails with ``EMFILE``, half the open readers are closed, the bound is
lowered and a ``ResourceWarning`` says so. A forked child closes the readers it inherited at
once (their descriptors count against its limit). Readers are never pickled.

The LRU order is this module's alone: the read kernel (compiled or its twin) only looks
readers up in :attr:`ReaderPool.readers` (a read-only mapping of shard -> reader); after a
kernel read the caller marks the shards it used with :meth:`ReaderPool.touch`. What the
kernel hands back (a :class:`~tarindex.read.hot.HandBack`: a shard to open, a chunk to
check) every caller gives to :meth:`ReaderPool.settle`, the one place that acts on it.

Threads: a pool may be shared by threads. Opening, evicting and closing change
:attr:`ReaderPool.readers` under the pool's lock; a hit only looks up (no lock). An evicted
reader, and every reader at :meth:`ReaderPool.close`, is only let go of, never closed under a
read: its mappings and descriptors are released when the last read holding it (another
thread's, in flight) ends, at once when none does. So a read in flight always finishes with
the right bytes, and a read after ``close`` opens its shard again (docs/READING.md,
"Threads"). A shard two threads open at once is opened twice and one reader kept.
"""

from __future__ import annotations

import errno
import os
import threading
import warnings
import weakref
from collections import OrderedDict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace
from typing import Any

from ..storage.remote import RemoteOptions, is_url
from .checks import check_listed, stale_count, unlisted
from .hot import HandBack
from .options import OpenOptions
from .shard import ShardReader
from .sources import ShardList

__all__ = ["ReaderPool", "open_shard_bound", "DEFAULT_MAX_OPEN", "FDS_PER_SHARD"]

DEFAULT_MAX_OPEN = 48
"""Default bound on open shards per :class:`~tarindex.read.shardset.ShardSet` and process."""

FDS_PER_SHARD = 2
"""Descriptors an open :class:`ShardReader` holds: the index mapping and the tar source."""

_FD_RESERVE = 16
"""Descriptors left free for everything else when the bound is sized from the limit."""


def open_shard_bound(requested: int | None = None) -> int:
    """Return how many shards this process may keep open at once (at least 1).

    ``requested`` (default :data:`DEFAULT_MAX_OPEN`), lowered so that
    :data:`FDS_PER_SHARD` descriptors per shard fit under the soft ``RLIMIT_NOFILE`` with the
    descriptors already open and a reserve of 16 left free.
    """
    want = DEFAULT_MAX_OPEN if requested is None else max(1, int(requested))
    try:
        import resource

        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    except (ImportError, OSError, ValueError):
        return want
    if soft < 0 or soft == getattr(resource, "RLIM_INFINITY", -1):
        return want
    try:
        in_use = len(os.listdir("/proc/self/fd"))
    except OSError:
        in_use = _FD_RESERVE
    return max(1, min(want, (soft - in_use - _FD_RESERVE) // FDS_PER_SHARD))


# -- fork registry ---------------------------------------------------------------------------
_fork_generation = [0]
"""Bumped in the child after every ``os.fork``: a pool whose generation differs was
inherited from the parent and must drop the parent's readers (cheaper than ``os.getpid()``
on every read)."""

_live_pools: weakref.WeakSet[ReaderPool] = weakref.WeakSet()
"""Every pool of this process: a forked child closes their inherited readers at once."""


def _bump_fork_generation() -> None:
    _fork_generation[0] += 1
    # The child's copies of the parent's descriptors and mappings count against the child's
    # descriptor limit even if it never reads those shards (a DataLoader worker forked while
    # the parent holds open shards): release them now; the parent's stay open.
    for pool in list(_live_pools):
        pool.drop_inherited()


os.register_at_fork(after_in_child=_bump_fork_generation)


class ReaderPool:
    """The open readers of shards ``paths`` in this process (see the module docstring).

    Args:
        paths: Tar paths (or URLs), by shard number.
        index_paths: Their index paths.
        counts: Samples per shard, as counted when the set was made (a reader whose index
            now says otherwise is refused).
        listing: The manifest rows the shards were listed with, or ``None``.
        options: How the shards open (:class:`~tarindex.read.options.OpenOptions`:
            ``max_open``, and ``use_mmap``, ``check_crc``, ``verify_data`` as
            :class:`ShardReader` takes them).
        remote: As :class:`ShardReader`.
    """

    def __init__(
        self,
        paths: list[str],
        index_paths: list[str],
        counts: list[int],
        listing: ShardList | None,
        options: OpenOptions,
        remote: RemoteOptions,
    ) -> None:
        self.paths = paths
        self.index_paths = index_paths
        self.counts = counts
        self.listing = listing
        self.options = options
        self.max_open = DEFAULT_MAX_OPEN if options.max_open is None else options.max_open
        """The bound asked for (:attr:`open_bound` is what the descriptor limit leaves)."""
        self.remote = remote
        self.readers: OrderedDict[int, ShardReader] = OrderedDict()
        """Shard -> open reader, least recently used first (never rebound: cleared in place)."""
        self.evicts = True
        """More shards than the bound: a hit must keep the LRU order (``move_to_end``)."""
        self.whole: set[int] = set()
        """Remote shards this process reads from a whole copy in the cache (the fetch policy
        of :mod:`tarindex.read.fetchpolicy` under ``RemoteOptions(fetch="auto")``)."""
        self._gen = _fork_generation[0]
        self._bound = 0  # this process's bound, sized on first open
        self._opts: dict[bool, RemoteOptions] = {}
        self._lock = threading.Lock()  # held while readers changes (open, evict, close)
        _live_pools.add(self)

    def fresh(self) -> ReaderPool:
        """A pool of the same shards and options with nothing open (for a copy or a pickle)."""
        return ReaderPool(
            self.paths,
            self.index_paths,
            self.counts,
            self.listing,
            self.options,
            self.remote,
        )

    @property
    def open_bound(self) -> int:
        """Open shards this process keeps at most (``max_open`` within the descriptor limit)."""
        if not self._bound:
            self.set_bound(open_shard_bound(self.max_open))
        return self._bound

    def set_bound(self, bound: int) -> None:
        """Keep at most ``bound`` readers open (``0``: size it again on the next open)."""
        self._bound = bound
        self.evicts = not bound or len(self.paths) > bound

    @property
    def inherited(self) -> bool:
        """Whether this pool's readers were opened before a fork (by another process)."""
        return self._gen != _fork_generation[0]

    def drop_inherited(self) -> None:
        """Close the readers a forked child inherited (its copies of the descriptors).

        Only in the forked child (one thread, the parent's others are gone): the lock is made
        afresh, since another thread of the parent may have held it at the fork.
        """
        self._lock = threading.Lock()
        readers = list(self.readers.values())
        self.readers.clear()
        self._gen = _fork_generation[0]
        self.set_bound(0)
        for r in readers:
            try:
                r.close()
            except Exception:
                pass

    def _open(self, s: int) -> ShardReader:
        """Open shard ``s``'s reader (not kept); on ``EMFILE`` let go of half the open ones."""
        readers, o = self.readers, self.options
        while True:
            try:
                return ShardReader(
                    self.paths[s],
                    self.index_paths[s],
                    use_mmap=o.use_mmap,
                    check_crc=o.check_crc,
                    verify_data=o.verify_data,
                    remote=self.opts_for(s),
                )
            except OSError as e:
                if e.errno not in (errno.EMFILE, errno.ENFILE) or not readers:
                    raise
                n = max(1, len(readers) // 2)
                self.set_bound(max(1, len(readers) - n))
                warnings.warn(
                    f"{self.paths[s]}: too many open files ({e.strerror}) with "
                    f"{len(readers)} shards open; closing {n} and keeping at most "
                    f"{self._bound} open in this process (raise `ulimit -n` or pass a smaller "
                    f"OpenOptions(max_open=...))",
                    ResourceWarning,
                    stacklevel=5,
                )
                with self._lock:  # let go: a reader another thread reads closes when it ends
                    for _ in range(min(n, len(readers))):
                        readers.popitem(last=False)

    def reader(self, s: int) -> ShardReader:
        """Return the open reader of shard ``s``, opening it (and closing the LRU one) if needed.

        Raises:
            StaleIndexError: If the shard's index changed since the set was made, or no
                longer matches its tar.
            StaleManifestError: If the shard was listed by a manifest and is missing or
                differs from its row (FORMAT.md §9).
            FormatError: If the index is corrupt (see :class:`ShardReader`).
        """
        if self._gen != _fork_generation[0]:  # forked: the parent's mmaps and fds are not ours
            self.drop_inherited()
        readers = self.readers
        r = readers.get(s)
        if r is not None:
            if self.evicts:
                self.touch((s,))
            return r
        bound = self.open_bound
        with self._lock:  # room first: the descriptors stay within the bound
            while len(readers) >= bound:  # let go of the LRU ones (closed once unused)
                readers.popitem(last=False)
        r = self._checked_open(s)
        with self._lock:
            had = readers.get(s)
            if had is None:
                while len(readers) >= self.open_bound:  # other threads opened meanwhile
                    readers.popitem(last=False)
                readers[s] = r
                return r
            readers.move_to_end(s)
        r.close()  # another thread opened it meanwhile: keep theirs (ours is unread)
        return had

    def _checked_open(self, s: int) -> ShardReader:
        """Open shard ``s`` and check it against its listing and count (not kept yet)."""
        listing = self.listing
        listed = listing is not None and listing.samples[s] >= 0
        try:
            r = self._open(s)
        except FileNotFoundError as e:
            if listing is None or not listed:
                raise
            raise unlisted(listing, self.paths, s, str(e.strerror or e), missing=True) from e
        if listing is not None and listed:
            try:
                check_listed(listing, self.paths, s, r.index)
            except BaseException:
                r.close()
                raise
        if r.n_samples != self.counts[s]:
            r.close()
            raise stale_count(r.index_path, r.n_samples, self.counts[s])
        return r

    def opts_for(self, s: int) -> RemoteOptions:
        """The remote options shard ``s`` opens with: its fetch policy resolved.

        ``"shard"`` and ``"range"`` as given; ``"auto"`` is ``"shard"`` for the shards in
        :attr:`whole`, else ``"range"``.
        """
        opts = self.remote
        if opts.fetch != "auto":
            return opts
        got = self._opts.get(s in self.whole)
        if got is None:
            got = self._opts[s in self.whole] = replace(
                opts, fetch="shard" if s in self.whole else "range"
            )
        return got

    def set_whole(self, s: int) -> None:
        """Read shard ``s`` from a whole copy from now on (an open ranged reader is closed)."""
        if s not in self.whole:
            self.whole.add(s)
            self.drop(s)

    def drop(self, s: int) -> None:
        """Let go of shard ``s``'s reader if it is open here (the next read opens it again).

        Closed at once, or when a read another thread has in flight in it ends.
        """
        if self._gen != _fork_generation[0]:
            return
        with self._lock:
            self.readers.pop(s, None)

    def touch(self, shards: Iterable[int]) -> None:
        """Mark ``shards`` (in order) as just used: the LRU order after a kernel read.

        Only when the pool evicts (:attr:`evicts`); a shard not open is skipped.
        """
        if self.evicts:
            readers = self.readers
            with self._lock:
                for s in shards:
                    if s in readers:
                        readers.move_to_end(s)

    def settle(self, hb: HandBack, readers: Mapping[int, ShardReader] | None = None) -> bool:
        """Do what a kernel hand-back asks, so the loop can run again: ``True``, or ``False``.

        ``"open"``: opens shard ``hb.shard`` while the pool has room (``True``); when it is
        full, ``False``: opening would let go of a reader the call may still need (a batch
        over more shards than may stay open). ``"check"``: runs the chunk guard of chunk
        ``hb.chunk`` of shard ``hb.shard`` (``True``; ``False`` if it had passed already: the
        loop handed the sample back for another reason), in ``readers[hb.shard]`` when given
        (the readers a call holds, whatever another thread did to the pool since), else in
        the pool's reader. ``"python"``: ``False``. On ``False`` the caller takes the Python
        path, which reads the case or raises its error.

        Raises:
            FormatError: If the chunk's tables fail the guard (naming the index and byte).
            StaleIndexError, StaleManifestError: As :meth:`reader` (opening the shard).
        """
        why = hb.why
        if why == "open":
            if len(self.readers) >= self.open_bound:
                return False
            self.reader(hb.shard)
            return True
        if why == "check":
            r = self.reader(hb.shard) if readers is None else readers[hb.shard]
            if r.hot.checked[hb.chunk]:
                return False
            r.check_chunk(hb.chunk)
            return True
        return False

    def open_many(self, shards: Sequence[int]) -> None:
        """Open the remote shards of ``shards`` that are not open, concurrently.

        Each open waits on a few network round trips (index, size, the open-time checks);
        threads overlap them. Within :attr:`open_bound`; a shard that fails to open here is
        left for :meth:`reader` to open (and raise) in order.
        """
        if self._gen != _fork_generation[0] or len(shards) < 2:
            return  # reader() drops what a fork inherited first
        readers = self.readers
        room = self.open_bound - len(readers)
        todo = [s for s in dict.fromkeys(shards) if s not in readers]
        todo = [s for s in todo if is_url(self.paths[s])][: max(0, room)]
        if len(todo) < 2:
            return
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(min(16, len(todo)), thread_name_prefix="tarindex-open") as ex:
            futs = [(s, ex.submit(self._open, s)) for s in todo]
        for s, f in futs:
            try:
                r = f.result()
            except Exception:
                continue
            if r.n_samples != self.counts[s]:
                r.close()
                continue
            with self._lock:
                keep = s not in readers and len(readers) < self.open_bound
                if keep:
                    readers[s] = r
            if not keep:
                r.close()  # unread: another thread opened the shard, or no room

    def open_readers(self) -> list[ShardReader]:
        """The readers open in this process (none if they were inherited through a fork)."""
        return [] if self._gen != _fork_generation[0] else list(self.readers.values())

    def close(self) -> None:
        """Let go of every open reader of this process (any thread, any time).

        A reader no read holds is closed at once; one another thread is reading closes when
        that read ends (which finishes with the right bytes). A later read opens its shard
        again.
        """
        with self._lock:
            self.readers.clear()

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["readers"] = OrderedDict()  # handles are reopened lazily, never pickled
        del state["_lock"]
        state["_bound"] = 0  # sized again from the receiving process's descriptor limit
        state["whole"] = set()  # the fetch policy decides again in the receiving process
        state["evicts"] = True
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()
        self._gen = _fork_generation[0]
        _live_pools.add(self)
