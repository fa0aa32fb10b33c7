"""The :class:`~tarindex.storage.bytesource.ByteSource` of a remote tar, with read-ahead.

``read_ranges`` takes what was fetched ahead, coalesces the rest and reads it in one
concurrent batch (through the cache directory when there is one); ``prefetch_ranges``
fetches ranges ahead (in background threads, within a per-process byte budget) into the
source's read-ahead store (:mod:`.ahead`, which holds them) that later reads take from. A
source is pinned at open to the version of the tar it saw (:class:`~.transport.Pin`): every
network read asks for that version, and its cache entries are keyed by it, so an object
replaced after open is :class:`~tarindex.errors.StaleIndexError`, never other bytes under
the old index.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import numpy as np
from numpy.typing import NDArray

from ...errors import RangeNotSupportedError, RemoteError, TruncatedError
from ..pieces import PieceReader
from .ahead import Ahead, AheadStore, the_pool
from .fetch import (
    agreed,
    coalesce,
    coalesce_need,
    expect_version,
    fetch,
    range_checked,
    slices,
    stat,
)
from .options import STATS, RemoteOptions, protocol_of
from .transport import Pin, filesystem, fs_path
from .whole import Copy, CopySource, check_ahead, learnt, running_here, seed, tar_key

__all__ = ["JOIN_EVERY_S", "RemoteSource", "Verify", "prefetch_many"]

JOIN_EVERY_S = 0.002
"""Seconds between two looks for a whole copy to join (:meth:`RemoteSource.join_copy`)."""

Verify = Callable[[dict[tuple[int, int], bytes], Pin], None]
"""The open-time checks of a deferred source: ``verify(check bytes by (offset, size), pin)``."""


class RemoteSource:
    """The bytes of one remote tar: ranged reads through fsspec, read-ahead, optional cache.

    Made in the process that reads (by :meth:`tarindex.read.ShardReader`); never pickled.

    Args:
        url: The tar's URL.
        size: Its size in bytes (from :func:`~.fetch.stat`).
        opts: Transport options.
        ident: A string that identifies this version of the tar (the index's fingerprint):
            with the pin, the cache keys of its bytes.
        pin: The version of the object this source reads (:func:`~.fetch.stat` at open):
            every network read asks for it, a changed object is
            :class:`~tarindex.errors.StaleIndexError`. Defaults to ``None`` (any version:
            only the size is checked).
        deferred: ``(check ranges, verify)`` of a source opened without a request (see
            :meth:`deferred`). Defaults to ``None``.

    Attributes:
        requests: Network requests made for this source (for tests and benchmarks).
        bytes_fetched: Bytes received for this source.
        pin: The pinned version, or ``None``.
        key: The cache key of this tar version's bytes (URL, size, ``ident``, pin).
    """

    zero_copy = False

    def __init__(
        self,
        url: str,
        size: int,
        opts: RemoteOptions,
        ident: str,
        pin: Pin | None = None,
        deferred: tuple[list[tuple[int, int]], Verify] | None = None,
    ) -> None:
        self.path = url
        self.size = size
        self.opts = opts
        self.pin = pin
        self.key = tar_key(url, size, ident, pin)
        self.requests = 0
        self.bytes_fetched = 0
        self._store = AheadStore()  # ranges fetched ahead
        self._local: CopySource | None = None  # a whole local copy (maybe downloading)
        self._closed = False
        self._ident = ident
        self._deferred = deferred
        self._vlock = threading.RLock()
        self._join: Callable[[], Copy | None] | None = None
        self._join_at = 0.0
        self._gate: Future[None] | None = None
        self._first_job: Future[None] | None = None  # a queued first round (queue_ahead)
        if deferred is not None and pin is not None:
            # the version is known (a whole shard's, learnt once per process): the checks run
            # now, beside the first reads (pinned); every byte handed out waits for them
            self._gate = check_ahead(self.check_now)

    # -- opening --------------------------------------------------------------------------
    @classmethod
    def open(cls, url: str, opts: RemoteOptions, ident: str) -> RemoteSource:
        """Learn the tar's size and version (pinned), check that its server honours ``Range``.

        The first ranged read of an HTTP server in each process is made alone (a server
        that ignores Range then costs one whole download, not one per check).

        Raises:
            FileNotFoundError: The tar does not exist.
            RangeNotSupportedError: The server ignores Range (without ``download_whole``).
            StaleIndexError: With ``download_whole``, the object changed while it was
                downloaded (the copy is discarded).
            RemoteError: As :func:`~.fetch.fetch` (a 503 on the size query is retried).
        """
        pin = stat(url, opts)
        src = cls(url, pin.size, opts, ident, pin)
        src.probe_range()
        return src

    @classmethod
    def deferred(
        cls,
        url: str,
        size: int,
        opts: RemoteOptions,
        ident: str,
        checks: list[tuple[int, int]],
        verify: Verify,
    ) -> RemoteSource:
        """A source opened without a request: its version is learnt at its first read.

        The first network read sends the open-time check ranges ``checks`` in the same
        concurrent round as the bytes asked for, unpinned; every reply of that round must
        name one version (``Content-Range`` total, ``ETag``, ``Last-Modified``, S3 version
        id), which is then pinned as :meth:`open` pins it, and ``verify(got, pin)`` runs
        the open-time checks on the check bytes (``got[(offset, size)]``) before any byte
        read is handed out. HTTP and S3 only (their replies name the version).

        Args:
            url: The tar.
            size: Its size as the index records it (bytes).
            opts: Transport options.
            ident: The index's fingerprint of the tar.
            checks: The ranges ``(start, end)`` of the open-time checks.
            verify: Raises (``StaleIndexError``, ...) if the checks fail.
        """
        return cls(url, size, opts, ident, None, (list(checks), verify))

    @property
    def checked(self) -> bool:
        """Whether the open-time checks ran (not yet only for an unread :meth:`deferred` source)."""
        return self._deferred is None

    def check_now(self) -> None:
        """Run a :meth:`deferred` source's open-time checks now (one round of requests).

        A first round already queued (:meth:`queue_ahead`: the checks go with its ranges) is
        waited for instead of sending the checks in a round of their own.
        """
        job = self._first_job
        if job is not None and self._deferred is not None:
            job.result()
        if self._deferred is not None:
            self.first_round([])

    def first_round(self, reqs: list[tuple[int, int]]) -> list[bytes]:
        """The bytes of ``reqs``, fetched in one round with a deferred source's checks.

        The open-time checks of a :meth:`deferred` source go in the same concurrent round;
        the replies' version is pinned and the checks run before the bytes are returned.

        Raises:
            StaleIndexError: The checks failed, or the replies named several versions.
            RemoteError: As :func:`fetch`.
        """
        with self._vlock:
            deferred = self._deferred
            if deferred is not None:
                return self._first(deferred, reqs)
        # checked by another thread's round meanwhile: outside the lock (no queue of fetches)
        return self._network(reqs)

    def _first(
        self, deferred: tuple[list[tuple[int, int]], Verify], reqs: list[tuple[int, int]]
    ) -> list[bytes]:
        """The first round of a deferred source (:meth:`first_round`), under its lock."""
        checks, verify = deferred
        ranges = checks + reqs
        # coalesced runs (the first 4 KiB check and the first samples in one read); no Range
        # probe: a server ignoring Range shows in these replies (docs/REMOTE.md)
        merged = coalesce([a for a, _ in ranges], [b for _, b in ranges])
        seen: list[Pin | None] = [None] * len(merged)
        got = fetch([(self.path, a, b) for a, b in merged], self.opts, None, seen)
        self.requests += len(merged)
        self.bytes_fetched += sum(len(g) for g in got)
        pin = agreed(self.path, seen, self.size)
        parts = slices(merged, got, ranges)
        verify({(a, b - a): g for (a, b), g in zip(checks, parts, strict=False)}, pin)
        learnt(self.path, pin)  # the shard's download and later opens ask no version
        self.pin = pin
        self.key = tar_key(self.path, self.size, self._ident, pin)
        self._deferred = None
        return parts[len(checks) :]

    def probe_range(self) -> None:
        """The first ranged read of an HTTP server in this process, alone (see :meth:`open`)."""
        if not self.size or protocol_of(self.path) not in ("http", "https"):
            return
        if range_checked(self.path):
            return
        try:
            self.fetch_fresh([(0, min(512, self.size))])  # not rounded to a chunk
        except RangeNotSupportedError:
            if not self.opts.download_whole:
                raise
            self._download_whole()

    def _download_whole(self) -> None:
        c = self.opts.cache()
        if c is None:
            raise RangeNotSupportedError(
                f"{self.path}: the server ignores HTTP Range and download_whole=True needs a "
                f"cache directory to download shards into: RemoteOptions(download_whole=True, "
                f"cache_dir=DIR)"
            )
        fd = c.open_checked(self.key, "whole", self.size, f"the whole copy of {self.path}")
        if fd is None:
            fs = filesystem(self.path, self.opts)
            tmp = c.temp_path()
            try:
                STATS.requests += 1
                self.requests += 1
                fs.get_file(fs_path(self.path), tmp)
                n = os.path.getsize(tmp)
                if n != self.size:
                    raise RemoteError(
                        f"{self.path}: downloaded {n} bytes, the server said {self.size}"
                    )
                STATS.bytes += n
                self.bytes_fetched += n
                if self.pin is not None:  # a plain GET, not pinned: the version after it
                    self.requests += 1
                    expect_version(self.path, self.pin, self.opts, "it was downloaded whole")
                if not c.put_file(self.key, "whole", tmp, crcs=True):
                    raise RemoteError(
                        f"{self.path}: {self.size} bytes do not fit the cache's limit "
                        f"(cache_bytes={c.limit}) or its disk"
                    )
            except BaseException:
                c.discard_path(tmp)
                raise
            fd = c.open_entry(c.path(self.key, "whole"))  # just written, its crc32s from it
        self.read_copy(fd, None)

    def read_copy(self, fd: int, pieces: PieceReader | None) -> None:
        """Read from a local copy of the whole tar from now on (:class:`~.whole.CopySource`).

        Args:
            fd: Its descriptor (owned from now on).
            pieces: The progress of its download, when it is still being written (reads
                wait for their pieces; bytes a failed download never wrote are read from
                the server); ``None``: complete. A :meth:`deferred` source's open-time
                checks start now, in the background; no byte is read before they pass.
        """
        # run now (or running: its future, no thread waiting on it), awaited by the first read
        gate = self._gate if self._gate is not None else None if self.checked else self.check_now
        self._local = CopySource(self.path, fd, self.size, pieces, self.fetch_fresh, gate)

    def _passed(self) -> None:
        """Wait for the open-time checks running beside the first reads; raise their error."""
        g = self._gate
        if g is not None:
            g.result()
            self._gate = None

    def join_copy(self, find: Callable[[], Copy | None]) -> None:
        """Read a whole copy of the tar once one is in the cache or downloading.

        ``find`` (:func:`~.whole.find_copy`: no request) is asked before reads, every
        :data:`JOIN_EVERY_S` at most, until it gives a copy of the pinned version; reads go
        by ranges meanwhile, then to the copy (:meth:`read_copy`; bytes it has not reached
        by ranges still).
        """
        self._join = find

    def _try_join(self) -> None:
        now = time.monotonic()
        if now < self._join_at and not running_here(self.path):
            return  # (a download this process started is joined at once: find waits for it)
        self._join_at = now + JOIN_EVERY_S
        with self._vlock:
            find = self._join
            if find is None or self._local is not None or self._closed:
                return
            cp = find()
            if cp is None:
                return
            self._join = None
            pin = self.pin
            if pin is not None and (cp.size != pin.size or cp.pin.tag() != pin.tag()):
                os.close(cp.fd)  # another version than the one this source reads
                if cp.pieces is not None:
                    cp.pieces.close()
                return
            self.read_copy(cp.fd, cp.pieces)
            local = self._local
            if local is not None:
                local.joined = True  # complete now or later: the fetch policy maps it then

    @property
    def copy_finished(self) -> bool:
        """Whether this source reads a copy that was downloading at open and is the entry now."""
        local = self._local
        return local is not None and local.joined and local.settled

    @property
    def downloading(self) -> bool:
        """Whether this source reads a whole copy still being downloaded (:meth:`read_copy`)."""
        local = self._local
        return local is not None and not local.complete

    @property
    def fetches(self) -> bool:
        """Whether reads still go to the network (not closed, not a whole-shard download)."""
        return self._local is None and not self._closed

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
        if self._join is not None:
            self._try_join()
        local = self._local  # once: close() in another thread drops it
        if local is not None and (local.complete or self._store.find(offset, end) is None):
            return bytes(local.read(offset, size))
        buf, bases = self.read_ranges(np.asarray([offset], np.int64), np.asarray([end], np.int64))
        b = int(bases[0])  # (read_ranges waited for the checks)
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
        if self._join is not None:
            self._try_join()
        local = self._local
        store = self._store
        if local is not None and (local.complete or not store.held):
            buf, bases = local.read_ranges(starts, ends)
            return bytes(buf), bases
        hits: list[Ahead | None] = [store.find(a, b) for a, b in zip(st, en, strict=True)]
        if local is not None:
            local.passed()  # a copy's bytes fetched beside it wait for its checks too
        if n and hits[0] is not None and all(h is hits[0] for h in hits):
            e = hits[0]
            data = store.result(e)
            store.consume(e, int((ends - starts).sum()))
            self._passed()  # the open-time checks running beside (a pinned deferred source)
            return data, starts - e.start
        parts: list[bytes | None] = [None] * n
        miss = [i for i in range(n) if hits[i] is None]
        if miss:
            if local is not None:  # from the copy (or the server, where it has no bytes yet)
                buf, bases = local.read_ranges(starts[miss], ends[miss])
                sizes = (ends[miss] - starts[miss]).tolist()
                got = [bytes(buf[o : o + k]) for o, k in zip(bases.tolist(), sizes, strict=True)]
            else:
                got = self._fetch_ranges([(st[i], en[i]) for i in miss])
            for i, g in zip(miss, got, strict=True):
                parts[i] = g
        used: dict[int, tuple[Ahead, int]] = {}
        for i, h in enumerate(hits):
            if h is not None:
                d = store.result(h)
                parts[i] = d[st[i] - h.start : en[i] - h.start]
                prev = used.get(id(h))
                used[id(h)] = (h, en[i] - st[i] + (prev[1] if prev else 0))
        for h, nbytes in used.values():
            store.consume(h, nbytes)
        bases = np.zeros(n, np.int64)
        if n > 1:
            np.cumsum(ends[:-1] - starts[:-1], out=bases[1:])
        self._passed()
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
        if wait:
            self.store_fetched(plan, self._fetch_ranges([(a, b) for a, b, _ in plan]))
            return
        self._store.queue(plan, the_pool(self.opts), self._fetch_one)

    def queue_ahead(
        self,
        starts: NDArray[np.int64],
        ends: NDArray[np.int64],
        after: Future[None] | None = None,
        done: Future[None] | None = None,
        cuts: Sequence[int] = (),
    ) -> bool:
        """:meth:`prefetch_ranges` in the background; ``False`` if the budget had no room.

        A source reading a whole copy that is downloading queues only the ranges the
        download has not reached (:meth:`~.whole.CopySource.reached`), not to wait for its
        earlier pieces. A :meth:`deferred` source not read yet (no cache directory) fetches
        them all in its first round, with its open-time checks (not a round per range).

        Args:
            starts: ``int64 (r,)`` range starts in bytes.
            ends: Their ends (exclusive).
            after: Such a first round starts once this is done (its ranges stored now).
            done: Set once it is in (at once without one).
            cuts: Where in ``starts`` a block begins: each stored apart (a block's read
                takes its run, headers too: a range stored for several would be used up).
        """
        local = self._local
        plan: list[tuple[int, int, int]] = []
        if not self._closed and (local is None or not local.complete):
            st, en = starts.tolist(), ends.tolist()
            bounds = [0, *cuts, len(st)]
            for c0, c1 in zip(bounds, bounds[1:], strict=False):
                plan.extend(self.plan_prefetch(st[c0:c1], en[c0:c1]))
        if local is not None:
            plan = [(a, b, need) for a, b, need in plan if not local.reached(a, b)]
        if plan and self._deferred is not None and self.pin is None and self.opts.cache() is None:
            # not opened yet: every range goes in the one round that carries the checks (a
            # range each would queue behind that round: two rounds). With a cache the checks
            # go first, alone (its keys hold the pin: plan_fetch)
            job: Future[None] = Future()
            if done is not None:
                job.add_done_callback(lambda _: done.set_result(None))
            if self._first_job is None:  # the round that carries the checks (a later one waits)
                self._first_job = job
            pool = the_pool(self.opts)
            ok = self._store.queue_together(plan, pool, self._fetch_ranges, after, job)
        else:
            ok = self._store.queue(plan, the_pool(self.opts), self._fetch_one) if plan else True
            if done is not None:
                done.set_result(None)
        if local is None and plan:
            self._seed(plan)
        return ok

    def _seed(self, plan: list[tuple[int, int, int]]) -> None:
        """Hand the ranges just queued to this tar's download, if it is held (:func:`~.whole.seed`).

        A stream's first window, read by ranges before its downloads start: the download
        writes these bytes into its copy instead of fetching them again.
        """
        for a, b, _ in plan:
            e = self._store.find(a, b)
            if e is None or e.start != a or e.end != b:
                continue
            fut = e.future  # before data: result() sets data, then drops the future
            data = e.data if fut is None else None
            got = data if data is not None else fut
            if got is not None:
                seed(self.path, a, b, got, lambda: self.pin)

    def plan_prefetch(
        self, starts: Sequence[int], ends: Sequence[int]
    ) -> list[tuple[int, int, int]]:
        """The coalesced ranges ``(start, end, bytes asked)`` not already stored.

        A stored range is dropped once reads have taken as many bytes from it as were asked
        for (the union of the given ranges in it), whatever their order.
        """
        out = []
        for a, b, need in coalesce_need(starts, ends):
            if a >= 0 and b <= self.size and self._store.find(a, b) is None:
                out.append((a, b, need))
        return out

    def store_fetched(self, plan: list[tuple[int, int, int]], datas: list[bytes]) -> None:
        """Keep ``datas`` (the bytes of ``plan``'s ranges, fetched now) in the store.

        Counted in the read-ahead budget whatever its room (they were asked for).
        """
        self._store.keep(plan, datas, the_pool(self.opts))

    def close(self) -> None:
        """Drop the read-ahead store (pending reads finish in the background; idempotent)."""
        self._closed = True
        self.drop_ahead()
        local, self._local = self._local, None
        if local is not None:
            local.close()  # a read in flight keeps the descriptor until it ends

    def drop_ahead(self) -> None:
        """Drop every range fetched ahead and not read yet (frees the read-ahead budget)."""
        self._store.clear()

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
        which must see the remote file as it is. A complete whole-shard copy
        (``download_whole``) is read instead, as nothing else can be.

        Raises:
            RemoteError: As :func:`fetch`.
        """
        local = self._local
        if local is not None and local.complete:
            return [bytes(local.read(a, b - a)) for a, b in ranges]
        merged = coalesce([a for a, _ in ranges], [b for _, b in ranges])
        return slices(merged, self._network(merged), ranges)

    def _network(self, reqs: list[tuple[int, int]]) -> list[bytes]:
        if self._deferred is not None and self.pin is None:
            return self.first_round(reqs)  # the version is learnt from this round
        # pinned (a whole copy's source, its checks running beside: what it hands out waits
        # for them, CopySource.passed), or checked
        if not reqs:
            return []
        got = fetch([(self.path, a, b) for a, b in reqs], self.opts, [self.pin] * len(reqs))
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
        if c is not None:
            self.check_now()  # the cache key holds the pin: learn it first
        if c is None:
            merged = coalesce([a for a, _ in ranges], [b for _, b in ranges])

            def finish_plain(got: list[bytes]) -> list[bytes]:
                return slices(merged, got, ranges)

            return merged, finish_plain
        cb = self.opts.chunk_bytes
        ids = sorted({i for a, b in ranges for i in range(a // cb, (b - 1) // cb + 1)})
        have: dict[int, bytes] = {}
        for i in ids:
            n = min(cb, self.size - i * cb)
            d = c.get(self.key, f"{i}", n, f"bytes {i * cb}..{i * cb + n} of {self.path}")
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
    firsts = []  # deferred sources: their first round also carries the open-time checks
    reqs: list[tuple[str, int, int]] = []
    pins: list[Pin | None] = []
    opts: RemoteOptions | None = None
    for src, starts, ends in items:
        if not src.fetches:
            continue
        plan = src.plan_prefetch(starts, ends)
        if not plan:
            continue
        net, finish = src.plan_fetch([(a, b) for a, b, _ in plan])
        if not src.checked:
            firsts.append((src, plan, finish, net))
            continue
        jobs.append((src, plan, finish, len(reqs), len(net)))
        reqs.extend((src.path, a, b) for a, b in net)
        pins.extend([src.pin] * len(net))
        opts = src.opts
    if firsts:  # each in its own round, all at once (and beside the batch below)

        def first(job: tuple[RemoteSource, Any, Any, list[tuple[int, int]]]) -> None:
            src, plan, finish, net = job
            src.store_fetched(plan, finish(src.first_round(net)))

        if len(firsts) == 1 and not jobs:
            first(firsts[0])
            return
        with ThreadPoolExecutor(min(16, len(firsts)), thread_name_prefix="tarindex-open") as ex:
            futs = [ex.submit(first, j) for j in firsts]
            if jobs and opts is not None:
                _finish_jobs(jobs, fetch(reqs, opts, pins) if reqs else [])
            for f in futs:
                f.result()
        return
    if not jobs or opts is None:
        return
    _finish_jobs(jobs, fetch(reqs, opts, pins) if reqs else [])


def _finish_jobs(jobs: list[Any], got: list[bytes]) -> None:
    for src, plan, finish, at, n in jobs:
        mine = got[at : at + n]
        src.requests += n
        src.bytes_fetched += sum(len(g) for g in mine)
        src.store_fetched(plan, finish(mine))
