"""Which remote shards are read whole and which by ranges: the fetch policy of a ShardSet.

docs/REMOTE.md, "Fetch policy". :attr:`RemoteOptions.fetch` says:

- ``"range"``: ranged reads of the samples read (never a whole shard).
- ``"shard"``: every shard whole, from the cache (:mod:`tarindex.storage.remote.whole`),
  downloaded ahead of need in the plan's order (or shard order without a plan).
- ``"auto"``: from the access pattern. With a plan (a streaming epoch, a sampler of ours,
  an order handed to :meth:`tarindex.ShardSet.follow`): the shards this machine will read
  mostly (:data:`WHOLE_SHARE` of their samples or more) are fetched whole, ahead of need in
  the plan's first-need order, and released once the plan is past them, if the plan's
  largest working set fits the cache's limit; otherwise ranges. Without a plan: ranges,
  until this process has read :data:`ADAPT` of a shard's distinct samples, :data:`ADAPT_MIN`
  at least (and could read most of
  it: a subset that holds less of it stays on ranges), then that shard whole; and once its
  distinct samples, spread over several shards, reach :data:`SPREAD` of those shards'
  samples (a shuffled epoch: ``DataLoader(shuffle=True)``, a random ``ds[i]`` pass), every
  shard it has read whole, downloaded in the order the reads first came to them,
  :attr:`RemoteOptions.shards_ahead` at once.

The machine's share of a plan: a rank's plan times ``LOCAL_WORLD_SIZE / WORLD_SIZE`` (the
environment torchrun sets; both default to 1), since ranks and DataLoader workers on one
machine share the cache directory.
"""

from __future__ import annotations

import functools
import os
import weakref
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from typing import Any

import numpy as np
from numpy.typing import NDArray

from ..format.index import decode_index, read_header
from ..format.packed import PACKED_META
from ..format.spec import HEADER
from ..storage.remote import (
    RemoteSource,
    drop_seeds,
    fetch_ahead,
    hold,
    is_url,
    load_indexes,
    need,
    pin_ahead,
    release,
)
from .pool import ReaderPool
from .spanner import shards_of

__all__ = [
    "ADAPT",
    "ADAPT_MIN",
    "PIN_AHEAD",
    "SHARD_UNIT",
    "SPREAD",
    "SPREAD_MIN",
    "WHOLE_SHARE",
    "FetchPolicy",
    "machine_share",
]

ADAPT = 1 / 16
"""Without a plan (``"auto"``): a shard is fetched whole once this process has read this
fraction of its distinct samples by ranges (and at least :data:`ADAPT_MIN` of them)."""

ADAPT_MIN = 64
"""Without a plan: samples of a shard read by ranges before it may be fetched whole."""

SPREAD = 1 / 64
"""Without a plan (``"auto"``): once the job has read this fraction of the distinct samples
of the shards this process has read (two shards at least; this process's distinct samples
times :attr:`FetchPolicy.readers`, :data:`SPREAD_MIN` of its own at least), the job reads at
random across them (a shuffled epoch), and every one of them is fetched whole. A sparse job
(1% of the samples, ``get(key)``) stays below it: on ranges."""

SPREAD_MIN = 32
"""Without a plan: distinct samples read before :data:`SPREAD` may switch shards whole."""

SYNC_EVERY = 16
"""With a plan: the plan's downloads are ordered and the shards it is done with released
once per this many positions the reads move on (every ``ds[i]``: 60 us of a 25 us read)."""

PIN_AHEAD = 64
"""Shards whose versions the whole-shard read-ahead learns ahead of their downloads, at most."""

SHARD_UNIT = 64 << 20
"""Bytes of a whole shard that count as one of :attr:`RemoteOptions.shards_ahead` downloads
at once (a smaller shard counts as its share: :meth:`FetchPolicy._weight`)."""

WHOLE_SHARE = 0.5
"""With a plan (``"auto"``): a shard the machine will read at least this fraction of is
fetched whole."""


def machine_share() -> float:
    """The fraction of a rank-split plan this machine reads: local ranks over all ranks."""
    try:
        world = max(1, int(os.environ.get("WORLD_SIZE", "1")))
        local = max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
    except ValueError:
        return 1.0
    return min(1.0, local / world) if world > 1 else 1.0


class FetchPolicy:
    """The fetch policy of one ShardSet's remote shards (module docs); per process.

    Args:
        pool: The set's readers (:attr:`ReaderPool.whole` holds the shards read whole).
        starts: ``int64 (n_shards + 1,)``: the set's cumulative sample counts.
        per: Samples per shard when all are equal (``0``: not).
    """

    def __init__(self, pool: ReaderPool, starts: NDArray[np.int64], per: int) -> None:
        self.pool = pool
        self.starts = starts
        self.per = per
        self.counts = np.diff(starts)
        self.provider: Any = None
        """What :meth:`follow` was given: an order (``int64`` global indices) or a sampler."""
        self.readers = 1
        """Processes reading like shares of the job's samples, this one included (the
        DataLoader's workers: ``TarDataset`` sets it in each); :data:`SPREAD` weighs this
        process's distinct samples by it."""
        self._fresh()

    def _fresh(self) -> None:
        n = len(self.counts)
        self.reads = np.zeros(n, np.int64)
        """Without a plan: distinct samples of each shard this process has read."""
        self._seen = np.zeros(int(self.starts[-1]), np.bool_)  # 1 byte per sample
        self._plan: dict[str, Any] | None = None
        self._tries: list[Callable[[], NDArray[np.int64]]] = []
        self._ahead: list[int] = []  # shards to fetch whole, in order of need
        self._futs: dict[int, Future[bool | None]] = {}
        self._sizes: dict[int, tuple[int, str]] = {}
        self._bytes_at: dict[int, NDArray[np.int64]] = {}  # shard -> sample j's first byte
        self._ordered: set[int] = set()  # streaming: whole shards downloaded in the plan's order
        self._compressed: set[int] = set()  # shards whose index describes a compressed file
        self._started = False
        self._held = False  # streaming: downloads wait for the first block read (reading)
        self.reach = 0
        """Streaming: samples at the plan's start fetched by ranges before its downloads."""
        self._first_read = False
        self._holding: list[str] = []
        self._touched: list[int] = []  # no plan: the shards read, in the order first read
        self._weighed = 0  # no plan, spread: _touched[:_weighed] were queued or turned down
        self._distinct = 0  # no plan: distinct samples read
        self._spread = False  # no plan: the reads spread over the shards (SPREAD)
        self._holding_ids: list[int] = []
        self._hold_state = [False]  # shared with the finalizer: the hold is still on

    def copy_for(self, pool: ReaderPool) -> FetchPolicy:
        """A policy of ``pool`` (a fresh copy of this one's pool) following the same plan."""
        p = FetchPolicy(pool, self.starts, self.per)
        p.provider = self.provider
        return p

    @property
    def mode(self) -> str:
        """:attr:`RemoteOptions.fetch` of the set; ``"range"`` with ``download_whole``.

        ``download_whole`` (a server that ignores Range) already downloads each shard whole
        into ``cache_dir`` at its open; the policy's downloads are ranged pieces, which such a
        server answers with the whole file each (a test saw one shard sent 3-5 times).
        """
        opts = self.pool.remote
        return "range" if opts.download_whole else opts.fetch

    # -- plans ----------------------------------------------------------------------------------
    def follow(self, provider: Any) -> None:
        """Read in the order ``provider`` gives (``None`` forgets it).

        ``provider``: an ``int64`` array of global indices (the order the reads will come
        in), or a planned sampler (``indices(epoch)``, ``planned_epochs()``).
        """
        if provider is not None and not hasattr(provider, "planned_epochs"):
            provider = np.asarray(provider, dtype=np.int64).reshape(-1)
        self.provider = provider
        self._plan = None

    def follow_blocks(self, pieces: NDArray[np.int64], first: int = 0) -> None:
        """A streaming plan: ``(shard, j0, j1)`` rows in read order (this worker's).

        ``first``: the samples the stream reads before its first sample comes out (a
        shuffled window, else its first block). Those are fetched by ranges before any
        download starts (:meth:`reading`); in ``"auto"``, a shard the plan has wholly read
        by then is never downloaded.
        """
        if self.mode == "range" or not len(pieces):
            return
        sid = pieces[:, 0]
        order = _first_need(sid)
        ends = np.cumsum(pieces[:, 2] - pieces[:, 1])
        self.reach = max(int(first), int(ends[0]))
        self._held = True  # the first window's reads go first, by ranges (reading)
        self._holding_ids = [s for s in order if is_url(self.pool.paths[s])]
        self._holding = [self.pool.paths[s] for s in self._holding_ids]
        hold(self._holding, True)
        # a stream dropped after its first sample never calls reading again: let go with it
        self._hold_state = [True]
        weakref.finalize(self, _let_go, list(self._holding), self._hold_state)
        if self.mode == "shard":
            self._in_plan_order(pieces, order)
            self._queue(order)
            return
        last = np.zeros(len(self.counts), np.int64)
        last[sid] = ends  # the last write wins: where each shard's last block ends
        early = set(np.nonzero((last > 0) & (last <= self.reach))[0].tolist())
        # every rank and worker reads its share of the same stream: the machine reads this
        # share of every shard the stream holds
        remote = [s for s in order if is_url(self.pool.paths[s]) and s not in early]
        whole = remote if machine_share() >= WHOLE_SHARE else []
        if whole and self._fits(whole):
            for s in whole:
                self.pool.set_whole(s)
            self._in_plan_order(pieces, whole)
            self._queue(whole)

    def _in_plan_order(self, pieces: NDArray[np.int64], shards: list[int]) -> None:
        """Streaming: the downloads of ``shards`` fetch their pieces in the plan's order.

        Each shard's blocks, as byte ranges in the order the plan reads them, go to its
        download (:func:`~tarindex.storage.remote.need`): the first window's blocks first
        (its samples are mixed: all are needed at once), in file order, then the others in
        the plan's order. Their first-window blocks are not fetched by ranges, but those of
        the first sample's shard (:meth:`ranged_first`): they are their downloads' first
        pieces.
        """
        win = np.cumsum(pieces[:, 2] - pieces[:, 1]) - (pieces[:, 2] - pieces[:, 1]) < self.reach
        for s in shards:
            if not self._whole_ok(s):
                continue
            at = self._bytes_at[s]
            mine = pieces[:, 0] == s
            rows = np.concatenate([pieces[mine & win], pieces[mine & ~win]])
            if not len(rows):
                continue
            a = np.maximum(at[rows[:, 1]] - 512, 0)  # the first member's header too
            b = at[rows[:, 2]]
            k = int((mine & win).sum())
            a[:k].sort()
            b[:k].sort()
            need(self.pool.paths[s], list(zip(a.tolist(), b.tolist(), strict=True)))
            self._ordered.add(s)

    def ranged_first(self, s: int) -> bool:
        """Streaming: whether shard ``s``'s first-window blocks are fetched by ranges.

        ``False`` for a shard downloaded in the plan's order other than the first block's
        (:meth:`_in_plan_order`): its download's first pieces hold them.
        """
        return s not in self._ordered

    @property
    def held(self) -> bool:
        """Whether a stream's downloads wait for its first block read (:meth:`reading`)."""
        return self._held

    def reading(self, s: int) -> None:
        """Streaming: a block of shard ``s`` is read next (called before each block read).

        The plan's downloads start once its first block has been read: the first window's
        blocks are fetched by ranges first (``prefetch._reach_ahead``), in one round that
        does not share the server's bandwidth with the downloads (which would hold the first
        sample back by the time to download the shards' first pieces); their bytes are kept
        for the downloads, which fetch only the rest (:mod:`~tarindex.storage.remote.firstwindow`).
        From then on a whole shard read before its turn in the plan's download order is
        downloaded now (its reads wait for bytes its download has requested, and go by
        ranges for the others), and a download that ended makes room for the next one at
        once (not when the stream has passed a shard).
        """
        if self._held:
            if not self._first_read:
                self._first_read = True
                return
            self._held = False
            if self._hold_state[0]:
                self._hold_state[0] = False
                hold(self._holding, False)
            # the first window's bytes go to the downloads of whole shards (firstwindow.seed);
            # the other shards are never downloaded here
            if self.mode != "shard":
                whole = self.pool.whole
                drop_seeds([self.pool.paths[t] for t in self._holding_ids if t not in whole])
        if self._ahead:  # a download that ended makes room for the next one now
            self._pump()
        if s in self.pool.whole or self.mode == "shard":
            self._demand(np.asarray([s], np.int64))

    def passed_blocks(self, done: Sequence[int]) -> None:
        """Streaming: the plan has read the last block of shards ``done`` in this worker."""
        for s in done:
            if s in self.pool.whole or self.mode == "shard":
                self._release(s)
        self._pump()

    def _orders(self) -> list[Callable[[], NDArray[np.int64]]]:
        """The orders to try, in turn, each drawn only when it is tried.

        A sampler's epoch of 8,000 samples costs a DataLoader worker ~4 ms to draw; the first
        one tried usually fits.
        """
        p = self.provider
        if p is None:
            return []
        if isinstance(p, np.ndarray):
            return [lambda: p]
        return [functools.partial(p.indices, e) for e in p.planned_epochs()]

    def _sync(self, idx: NDArray[np.int64]) -> dict[str, Any] | None:
        """The plan these reads follow, and where in it they are (``None``: no plan fits)."""
        plan = self._plan
        if plan is not None:
            pos = plan["where"][idx]
            if _contiguous(pos):
                plan["pos"] = int(pos.min())
                return plan
        if not self._tries:
            self._tries = self._orders()
        while self._tries:
            order = self._tries.pop(0)()
            where = np.full(int(self.starts[-1]), -1, np.int64)
            where[order] = np.arange(len(order), dtype=np.int64)
            pos = where[idx]
            if (pos < 0).any() or not _contiguous(pos):
                continue
            sid = shards_of(self.starts, self.per, order)
            last = np.full(len(self.counts), -1, np.int64)
            last[sid] = np.arange(len(sid), dtype=np.int64)  # last write wins: last need
            # the plan's positions grouped by shard, ascending: shard * (n + 1) + position
            step = len(sid) + 1
            occ = np.argsort(sid, kind="stable")
            self._plan = plan = {
                "where": where,
                "sid": sid,
                "last": last,
                "occ": sid[occ] * step + occ,
                "pos": int(pos.min()),
                "synced": -SYNC_EVERY,  # the position the downloads were last ordered at
                "decided": False,
            }
            return plan
        return None

    # -- reads --------------------------------------------------------------------------------
    def before_read(
        self, idx: NDArray[np.int64], sid: NDArray[np.int64], reach: NDArray[np.int64] | None
    ) -> None:
        """Called before samples ``idx`` (global, in range) of shards ``sid`` are read.

        Args:
            idx: ``int64 (k,)`` global indices about to be read.
            sid: ``int64 (k,)`` their shards.
            reach: ``int64 (n_shards,)``: samples of each shard the caller can read at most
                (a subset), or ``None`` (all).
        """
        mode = self.mode
        if mode == "range" or not len(idx):
            return
        self._remap(sid)
        plan = self._sync(idx) if self.provider is not None else None
        if plan is not None:
            if not plan["decided"]:
                plan["decided"] = True
                self._decide(plan)
            pos = plan["pos"]
            if 0 <= pos - plan["synced"] < SYNC_EVERY:
                return  # the downloads' order and releases move on every SYNC_EVERY reads
            plan["synced"] = pos
            if self._ahead or self.pool.whole or mode == "shard":
                done = np.nonzero((plan["last"] >= 0) & (plan["last"] < pos))[0]
                for s in done.tolist():
                    self._release(s)
                self._ahead = [
                    s for s in _next_need(plan, pos) if s in self.pool.whole or mode == "shard"
                ]
                self._pump()
            return
        if mode == "shard":
            if not self._started:
                self._started = True
                first = _first_need(sid)
                rest = [s for s in range(len(self.counts)) if s not in set(first)]
                self._queue(first + rest)
            self._demand(sid)
            return
        # distinct samples read per shard: a job re-reading a few samples (a validation
        # subset every step, the same keys) stays on ranges however often it reads them
        seen = self._seen
        fresh = ~seen[idx]
        if fresh.any():
            seen[idx[fresh]] = True
            got = sid[fresh]
            self._touched += [s for s in _first_need(got) if not self.reads[s]]
            np.add.at(self.reads, got, 1)
            self._distinct += len(got)
            self._spread_out(reach)
        elif self._ahead:
            self._pump_spread()
        cand = np.nonzero(self.reads >= np.maximum(ADAPT_MIN, ADAPT * self.counts))[0]
        for s in cand.tolist():
            if s in self.pool.whole or not is_url(self.pool.paths[s]):
                continue
            if reach is not None and reach[s] < WHOLE_SHARE * self.counts[s]:
                continue
            if self._fits([s]):
                self.pool.set_whole(s)
                self._demand(np.asarray([s], np.int64))

    def _spread_out(self, reach: NDArray[np.int64] | None) -> None:
        """No plan: whole downloads of the shards read once the reads spread over them.

        A shuffled epoch reads a few samples of every shard per batch: the per-shard rule
        (:data:`ADAPT`) would switch each shard late, after one ranged request per sample
        for a sixteenth of it. Once the distinct samples read reach :data:`SPREAD` of the
        shards read (a sparse job stays below), every shard read so far, and every shard
        read from then on, is queued for a whole download in the order the reads first
        came to it; :meth:`_pump_spread` runs ``shards_ahead`` at once.
        """
        touched = self._touched
        if not self._spread:
            if len(touched) < 2 or self._distinct < SPREAD_MIN:
                return
            if self._distinct * self.readers < SPREAD * int(self.counts[touched].sum()):
                return
            self._spread = True
        new = []
        for s in touched[self._weighed :]:
            if s in self.pool.whole or s in self._futs or not self._whole_ok(s):
                continue
            if reach is not None and reach[s] < WHOLE_SHARE * self.counts[s]:
                continue  # a subset holding little of it
            new.append(s)
        self._weighed = len(touched)
        if new and self._fits(self._ahead + new):
            self._ahead += new
        self._pump_spread()

    def _pump_spread(self) -> None:
        """No plan, spread: start the queued downloads there is room for; read them whole.

        A shard is read from its whole copy (joining its download) once the download runs
        here or in another process; until then by ranges.
        """
        self._pump()
        for s in self._ahead:
            if s in self._futs:
                self.pool.set_whole(s)
        self._ahead = [s for s in self._ahead if s not in self._futs]

    def _remap(self, sid: NDArray[np.int64]) -> None:
        """Reopen the shards of ``sid`` read from a copy that downloaded while they were open.

        Their next read maps the complete copy (the compiled kernel's reads) instead of
        reading it through the remote source.
        """
        readers = self.pool.readers
        for s in (int(sid[0]),) if len(sid) == 1 else np.unique(sid).tolist():
            r = readers.get(s)
            try:
                src = r.source if r is not None else None
            except ValueError:  # closed by another thread meanwhile
                continue
            if isinstance(src, RemoteSource) and src.copy_finished:
                self.pool.drop(s)

    def _decide(self, plan: dict[str, Any]) -> None:
        if self.mode == "shard":
            self._ahead = _first_need(plan["sid"][plan["pos"] :])
            return
        share = np.bincount(plan["sid"], minlength=len(self.counts)) / np.maximum(self.counts, 1)
        share = share * machine_share()
        whole = [
            s
            for s in _first_need(plan["sid"])
            if share[s] >= WHOLE_SHARE and is_url(self.pool.paths[s])
        ]
        if whole and self._fits(whole, plan):
            for s in whole:
                self.pool.set_whole(s)

    def _fits(self, shards: list[int], plan: dict[str, Any] | None = None) -> bool:
        """Whether the shards, whole, fit the cache at the plan's largest working set."""
        try:
            limit = self.pool.remote.whole_cache().limit
        except OSError:
            return False
        sizes = {s: self._info(s)[0] for s in shards}
        if plan is None:
            live = sum(sizes.values()) + sum(
                self._info(s)[0] for s in self.pool.whole if s not in sizes
            )
            return live <= limit
        first = np.full(len(self.counts), -1, np.int64)
        sid = plan["sid"]
        order = np.arange(len(sid), dtype=np.int64)
        first[sid[::-1]] = order[::-1]
        events = sorted(
            [(int(first[s]), sizes[s]) for s in shards]
            + [(int(plan["last"][s]) + 1, -sizes[s]) for s in shards]
        )
        live = peak = 0
        for _, d in events:
            live += d
            peak = max(peak, live)
        return peak <= limit

    def _info(self, s: int) -> tuple[int, str]:
        """Shard ``s``'s tar size (from its index header) and fingerprint string."""
        got = self._sizes.get(s)
        if got is None:
            ip = self.pool.index_paths[s]
            if is_url(ip):
                data = load_indexes([ip], [self.pool.paths[s]], self.pool.remote)[0][0]
            else:
                with open(ip, "rb") as f:
                    data = f.read()
            h = read_header(bytes(data[: HEADER.size]), ip)
            t = decode_index(memoryview(data), ip)
            if t.gzip is not None or PACKED_META in t.meta:  # read through seek points or a
                self._compressed.add(s)  # decompressed copy, never downloaded whole here
            got = self._sizes[s] = (h.tar_size, f"{h.tar_size}:{h.head_crc}:{h.tail_crc}")
            # sample j's bytes start at its first member's data (j = n: the tar's end)
            first = np.asarray(t.sample_ptr, np.int64)[:-1]
            at = np.empty(len(first) + 1, np.int64)
            off = np.asarray(t.offset, np.int64)
            at[:-1] = off[np.minimum(first, len(off) - 1)] if len(off) else 0
            at[-1] = h.tar_size
            self._bytes_at[s] = at
        return got

    # -- whole-shard read-ahead ---------------------------------------------------------------
    def _queue(self, shards: list[int]) -> None:
        self._ahead = [s for s in shards if self._whole_ok(s)]
        self._pump()

    def _whole_ok(self, s: int) -> bool:
        """Whether shard ``s`` is a remote plain tar, the only kind downloaded whole here.

        A compressed one is read through seek points (gzip) or a decompressed copy
        (FORMAT.md §10, §11).
        """
        if not is_url(self.pool.paths[s]):
            return False
        self._info(s)
        return s not in self._compressed

    def _pump(self) -> None:
        """Keep :attr:`RemoteOptions.shards_ahead` downloads of the next shards running.

        The versions of the next :data:`PIN_AHEAD` shards are learnt meanwhile (one size
        query each, in the background), so a read that needs one before its download
        starts here (a shuffled plan needs many shards at once) joins or starts it without
        a round trip of its own.
        """
        if self._held:
            # a stream's first reads first (reading); the versions of the shards they read
            # are learnt from their replies (no size query on the way to the first sample)
            return
        opts = self.pool.remote
        for s in self._ahead[:PIN_AHEAD]:
            if s not in self._futs:
                pin_ahead(self.pool.paths[s], self.pool.opts_for(s))
        room = opts.shards_ahead - sum(
            self._weight(s) for s, f in self._futs.items() if not f.done()
        )
        for s in self._ahead:
            if room <= 0:
                break
            f = self._futs.get(s)
            if f is not None:
                continue
            url = self.pool.paths[s]
            self._futs[s] = fetch_ahead(url, self.pool.opts_for(s), self._info(s)[1])
            room -= self._weight(s)

    def _weight(self, s: int) -> float:
        """How much of :attr:`RemoteOptions.shards_ahead` shard ``s``'s download counts for.

        One for a shard of :data:`SHARD_UNIT` bytes or more, its share of that below: the
        bound is on the bytes downloading at once, and a few small shards (a streaming
        epoch over 20 MB shards) would otherwise wait for each other's downloads to end.
        """
        return min(1.0, self._info(s)[0] / SHARD_UNIT)

    def _demand(self, sid: NDArray[np.int64]) -> None:
        """Start the downloads of the whole shards of ``sid`` not started (no plan: read now).

        Reads of a shard go by ranges until its download reaches their bytes
        (:class:`~tarindex.storage.remote.whole.CopySource`).
        """
        for s in (int(sid[0]),) if len(sid) == 1 else np.unique(sid).tolist():
            if s in self._futs or not self._whole_ok(s):
                continue
            if self.mode != "shard" and s not in self.pool.whole:
                continue
            self._futs[s] = fetch_ahead(self.pool.paths[s], self.pool.opts_for(s), self._info(s)[1])

    def _release(self, s: int) -> None:
        if s in self._futs and is_url(self.pool.paths[s]):
            release(self.pool.paths[s], self.pool.remote, self._info(s)[1])
            self.pool.drop(s)
            del self._futs[s]


def _let_go(urls: list[str], state: list[bool]) -> None:
    """A stream's policy is gone before its second block: let go of its hold (once).

    The first window's bytes kept for downloads that will not start go too (unless another
    stream holds those URLs).
    """
    if state[0]:
        state[0] = False
        hold(urls, False)
        drop_seeds(urls, unheld=True)


def _first_need(sid: NDArray[np.int64]) -> list[int]:
    """The distinct shards of ``sid`` in the order of their first appearance."""
    if not len(sid):
        return []
    u, first = np.unique(sid, return_index=True)
    out: list[int] = u[np.argsort(first)].tolist()
    return out


def _next_need(plan: dict[str, Any], pos: int) -> list[int]:
    """The shards the plan reads at or after position ``pos``, in the order of that need.

    ``_first_need(plan["sid"][pos:])``, in ``O(shards * log(plan))`` per call from the
    plan's positions grouped by shard (``plan["occ"]``), not a sort of the plan's rest at
    every read (0.45 ms a ``ds[i]`` for 8,000 samples: 13x the read from a whole copy).
    """
    occ = plan["occ"]
    step = len(plan["sid"]) + 1
    base = np.arange(len(plan["last"]), dtype=np.int64) * step
    i = np.searchsorted(occ, base + pos)
    has = np.nonzero(plan["last"] >= pos)[0]  # shards read at or after pos
    nxt = occ[i[has]] - base[has]
    out: list[int] = has[np.argsort(nxt, kind="stable")].tolist()
    return out


def _contiguous(pos: NDArray[np.int64]) -> bool:
    """Whether positions ``pos`` lie in a window about as long as they are (one batch)."""
    if not len(pos):
        return False
    span = int(pos.max()) - int(pos.min()) + 1
    return span <= 2 * len(pos) + 8
