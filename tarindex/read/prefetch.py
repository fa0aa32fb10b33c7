"""Read-ahead for remote shards: the members of a batch, or of the next blocks, fetched early.

Local shards need none (the page cache and ``MADV_WILLNEED`` do it). For remote shards the
selected members' byte ranges, coalesced, go into each source's read-ahead store
(:class:`~tarindex.storage.remote.RemoteSource`), so the kernel's reads that follow take them
from memory.
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import Future
from typing import Any

import numpy as np
from numpy.typing import NDArray

from ..storage.remote import RemoteSource, prefetch_many
from .fetchpolicy import FetchPolicy
from .fields import Fields
from .pool import ReaderPool
from .spanner import shards_of

__all__ = ["drop_prefetched", "prefetch", "prefetch_blocks"]


def prefetch(
    pool: ReaderPool,
    starts: NDArray[np.int64],
    per: int,
    indices: Sequence[int] | NDArray[np.integer[Any]],
    fields: Fields,
    wait: bool,
    policy: FetchPolicy | None = None,
    reach: NDArray[np.int64] | None = None,
) -> None:
    """Fetch the members of global samples ``indices`` ahead (see ``ShardSet.prefetch``).

    ``policy`` sees the reads first (it may switch shards to whole-shard reads and start
    downloads ahead); shards read whole are opened (concurrently: downloaded or found in
    the cache) and need no ranges. Out-of-range indices are left for the read to refuse.
    """
    idx = np.asarray(indices).reshape(-1)
    if not idx.size or idx.dtype.kind not in "iu":
        return
    total = int(starts[-1])
    idx = idx.astype(np.int64, copy=False)
    idx = np.where(idx < 0, idx + total, idx)
    idx = idx[(idx >= 0) & (idx < total)]
    sid = shards_of(starts, per, idx)
    if policy is not None:
        policy.before_read(idx, sid, reach)
    items = []
    shards = np.unique(sid).tolist()
    pool.open_many(shards)
    for s in shards:
        r = pool.reader(s)
        src = r.source
        if isinstance(src, RemoteSource):
            b = r.gather(idx[sid == s] - starts[s], fields, data=False)
            items.append((src, b.tar_offset, b.tar_offset + b.size))
    if wait:
        prefetch_many([(src, a.tolist(), e.tolist()) for src, a, e in items])
    else:
        for src, a, e in items:
            src.prefetch_ranges(a, e)


def prefetch_blocks(
    pool: ReaderPool,
    pieces: Sequence[Sequence[int]],
    fields: Fields,
    policy: FetchPolicy | None = None,
) -> int:
    """Queue blocks ``(shard, j0, j1)`` for background read-ahead, in order.

    While ``policy`` holds a stream's downloads (its first block not read yet), the blocks
    of its first window are fetched by ranges, the first sample's shard first
    (:func:`_reach_ahead`), and nothing more: the rest waits for the next call.

    Returns how many of ``pieces`` were queued (see ``SetTakes.prefetch_blocks``).
    """
    mode = pool.remote.fetch
    whole: Any = pool.whole if mode == "auto" else ()
    held = policy is not None and policy.held
    reach = policy.reach if policy is not None else 0
    if mode == "shard":
        if held:
            _reach_ahead(pool, pieces, fields, reach, policy)
        return len(pieces)  # whole shards: downloaded ahead by the fetch policy
    if held:  # the first window alone, whole shards or not (its later blocks: next call)
        return _reach_ahead(pool, pieces, fields, reach, policy)
    pool.open_many([p[0] for p in pieces if p[0] not in whole])
    for n, (s, j0, j1) in enumerate(pieces):
        if s in whole:
            continue  # read from its whole copy, downloaded ahead by the fetch policy
        r = pool.reader(s)
        src = r.source
        if not isinstance(src, RemoteSource) or j1 <= j0:
            continue
        b = r.read_block(j0, j1, fields, data=False)
        if not len(b.size):
            continue
        if not src.queue_ahead(b.tar_offset, b.tar_offset + b.size):
            return n
    return len(pieces)


def _reach_ahead(
    pool: ReaderPool,
    pieces: Sequence[Sequence[int]],
    fields: Fields,
    reach: int,
    policy: FetchPolicy | None = None,
) -> int:
    """Fetch by ranges the next blocks of whole shards that their downloads have not reached.

    A whole shard's download fetches its pieces in order, and the fetch policy runs a few
    downloads at a time in the plan's order: a plan's first blocks (a shuffled window reads a
    block of every shard) would otherwise wait for the pieces before them, or for downloads
    not started.
    Only the blocks within the first ``reach`` samples of ``pieces`` are looked at (the
    stream's first window, ``FetchPolicy.reach``), so the bytes fetched twice stay one
    window at most; blocks of shards read by ranges anyway go the same way. The first
    sample's shard goes first and alone; the others are opened (concurrently) and queued
    once its round is in. Shards ``policy`` downloads in the plan's order are left to
    their downloads (:meth:`FetchPolicy.ranged_first`: their first pieces hold them).

    Returns:
        How many of ``pieces`` that window spans.
    """
    head = []
    left = reach
    n = 0
    for p in pieces:
        if left <= 0:
            break
        n += 1
        if p[2] > p[1]:
            head.append(p)
            left -= p[2] - p[1]
    if not head:
        return n
    # a shard's blocks are queued together (a shard not read yet fetches them all in its
    # first round, with its open-time checks), shards in the order the pieces first need
    # them. The first one's round goes alone: the others are opened while it is in flight
    # and their ranges stored (reads wait for them, never fetch them twice), their rounds
    # sent once it is in (the first sample's replies then share neither the event loop nor
    # the server with ~50 others: they waited 40-70 ms behind them at 20 ms latency)
    first = head[0][0]
    rest = list(dict.fromkeys(p[0] for p in head if p[0] != first))
    if policy is not None:
        rest = [s for s in rest if policy.ranged_first(s)]
    gate: Future[None] = Future()  # set once the first shard's round is in
    handed = False
    for group in ([first], rest):
        pool.open_many(group)  # the others while the first round is in flight
        for s in group:
            r = pool.reader(s)
            src = r.source
            if not isinstance(src, RemoteSource) or not (src.downloading or src.fetches):
                continue
            rs = [r.read_block(j0, j1, fields, data=False) for t, j0, j1 in head if t == s]
            rs = [b for b in rs if len(b.size)]
            if rs:
                a = np.concatenate([b.tar_offset for b in rs])
                e = a + np.concatenate([b.size for b in rs])
                cuts = np.cumsum([len(b.size) for b in rs])[:-1].tolist()
                if s == first:
                    src.queue_ahead(a, e, done=gate, cuts=cuts)
                    handed = True
                else:
                    src.queue_ahead(a, e, after=gate, cuts=cuts)
        if not handed:  # the first shard queued nothing (read from its whole copy, say)
            gate.set_result(None)
            handed = True
    return n


def drop_prefetched(pool: ReaderPool) -> None:
    """Drop the bytes fetched ahead and not read yet, in the pool's open remote shards."""
    for r in pool.open_readers():
        src = r.source
        if isinstance(src, RemoteSource):
            src.drop_ahead()
