"""The streaming executor: one worker's epoch plan read block by block, window by window.

Given a :class:`~tarindex.plan.shuffle.WorkerPlan` (which blocks, in which order, mixed in
which windows), :class:`Executor` reads each planned block as one sequential byte range
(``read_samples`` / ``read_block``), or over local mapped shards copies a window's samples
out of the mappings a few at a time as they are yielded (``take_ready`` / ``take``), through
the source's executor-facing reads (:meth:`~tarindex.read.ShardSet.takes`,
:class:`~tarindex.read.takes.Takes`); remote shards read ahead
(:class:`~tarindex.stream.readahead.ReadAhead`); ``on_error="skip"`` warns and marks a block
that cannot be read. Batched output packs each batch's samples straight from the block reads
(:func:`~tarindex.stream.pack.pack_blocks`). No epoch, rank or resume state lives here: the
caller says which plan positions to play.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterator, Sequence
from itertools import repeat
from typing import Any, cast

import numpy as np
from numpy.typing import NDArray

from ..plan.blocks import blocks_to_indices, slice_blocks
from ..plan.epoch import WorkerPlan
from ..read import Block, Sample
from ..read.sample_source import SampleSource
from ..read.takes import Takes
from .pack import Alloc, Packed, pack_blocks
from .readahead import ReadAhead

__all__ = ["Executor", "TAKE", "TAKE_BYTES"]

# A shuffle window's samples are copied out (Takes.take) a few at a time as they are yielded:
# at most TAKE of them, and about TAKE_BYTES of them. A consumer frees each sample before the
# next, so a take's bytes are freed in one run. Runs of several MB went back to the system
# (glibc trims the top of its heap) and faulted in again at the next take: 1024 samples of
# 100 KB streamed at 27k/s held in a window, 68k/s taken 256 KB at a time (benchmarks/README).
TAKE = 256
TAKE_BYTES = 256 << 10

# per window: its blocks joined into one, window position -> position in it (-1: skipped
# under on_error="skip"), and the yield order (None: plan order)
_Window = tuple[Block | None, NDArray[np.int64], Any]


def _by_need(
    pieces: NDArray[np.int64], perm: NDArray[np.int64] | None, lo: int
) -> NDArray[np.int64]:
    """A window's blocks ``(m, 3)`` in the order its positions ``perm[lo:]`` first need them.

    The read-ahead of remote shards fetches them in this order, so the window's first sample
    does not wait behind blocks it yields later (blocks it does not yield go last).
    """
    if perm is None or len(pieces) < 2:
        return pieces
    ends = np.cumsum(pieces[:, 2] - pieces[:, 1])
    where = np.searchsorted(ends, perm[lo:], side="right")
    u, first = np.unique(where, return_index=True)
    need = u[np.argsort(first)]
    need = need[need < len(pieces)]
    rest = np.setdiff1d(np.arange(len(pieces)), need)
    out: NDArray[np.int64] = pieces[np.concatenate([need, rest])]
    return out


class Executor:
    """Reads plan positions of one worker's plan over ``shards``.

    Args:
        shards: The shards (or a subset view) the plan was made over.
        fields: Extensions to read (``None``: all).
        on_error: ``"raise"``, or ``"skip"``: a block that cannot be read is warned about
            (``RuntimeWarning`` naming the shard and its samples) and each of its samples is
            ``None``; batches leave them out.
    """

    def __init__(self, shards: SampleSource, fields: Sequence[str] | None, on_error: str) -> None:
        self.shards = shards
        self.fields = fields
        self.on_error = on_error

    # -- per sample ---------------------------------------------------------------------------
    def stream(
        self, p: WorkerPlan, start: int, stop: int | None = None
    ) -> Iterator[Sample | None]:
        """This worker's raw samples of plan positions ``[start, stop)``, in yield order.

        Without mixing, block by block in plan order; with mixing, window by window (at most
        ``buffer_size`` samples held), each in its seeded order. ``None`` marks a sample whose
        block could not be read under ``on_error="skip"``. The samples of :meth:`parts`, one
        after another.
        """
        for part in self.parts(p, start, stop):
            yield from part

    def parts(
        self, p: WorkerPlan, start: int, stop: int | None = None
    ) -> Iterator[Iterator[Sample | None]]:
        """:meth:`stream` as one iterator per block (or window): ``chain`` them to flatten.

        A part is read when it is asked for, and each part lets a sample go as it yields it
        (the consumer decodes it in place, and a decoded block or window held here would keep
        every decoded image of it alive); its per-sample step is C (``list.pop``), so a
        flattening ``itertools.chain`` adds no Python frame per sample.
        """
        end = p.n_samples if stop is None else min(int(stop), p.n_samples)
        if start >= end:
            return
        t = self.shards.takes()
        mixing = p.shuffle and p.buffer_size > 1
        ra = ReadAhead.over(self.shards, t, self.fields, p.segments, p.buffer_size if mixing else 0)
        try:
            if not mixing:
                pieces = slice_blocks(p.segments, start, end).tolist()
                if ra is not None:
                    ra.add(pieces)
                for piece in pieces:
                    got = self._read_samples(t, piece, False, ra)
                    got.reverse()
                    yield map(got.pop, repeat(-1, len(got)))
                return
            w = p.buffer_size
            lean = self.on_error == "raise"  # a window's samples copied out as yielded
            k_end = (end - 1) // w + 1
            nxt = p.window(start // w)
            if ra is not None:  # the first window's blocks in the order its samples need them
                ra.add(_by_need(nxt[0], nxt[1], start % w).tolist())
            for k in range(start // w, k_end):
                pieces, perm = nxt
                if k + 1 < k_end:
                    nxt = p.window(k + 1)
                    if ra is not None:
                        ra.add(nxt[0].tolist())
                lo = start - k * w if start > k * w else 0
                plist = pieces.tolist()
                span = t.take_ready(plist, self.fields) if lean else None
                if span is not None:
                    yield from self._taken(t, pieces, perm, lo, end - k * w, span)
                    continue
                if ra is not None and k == start // w and perm is not None:
                    # remote: the first window's samples go out as their blocks arrive
                    # (fetched ahead together), not once all of it is here
                    yield self._first_window(t, plist, perm[lo : end - k * w], ra)
                    continue
                buf: list[Sample | None] = []
                for piece in plist:  # each block is unpacked (and freed) at once
                    buf.extend(self._read_samples(t, piece, True, ra))
                hi = min(end - k * w, len(buf))
                if perm is None:
                    rev = buf[lo:hi][::-1]
                else:
                    rev = list(map(buf.__getitem__, perm[lo:hi][::-1].tolist()))
                del buf
                yield map(rev.pop, repeat(-1, len(rev)))
        finally:
            if ra is not None:
                ra.close()

    def _taken(
        self, t: Takes, pieces: NDArray[np.int64], perm: NDArray[np.int64] | None, lo: int,
        hi: int, span: int,
    ) -> Iterator[Iterator[Sample | None]]:
        """A window's positions ``[lo, hi)`` in its order, copied out a few at a time.

        The window holds the global indices of its samples (8 bytes each) instead of their
        bytes (``Takes.take_ready`` has opened and checked its blocks, ``span`` bytes of
        tar): each sample is made just before it is yielded, so it is still in the cache when
        the consumer drops it, and a window of large samples costs no memory. A take is
        ``TAKE`` samples or ``TAKE_BYTES`` of them, whichever is fewer (one at least).
        """
        idx = blocks_to_indices(pieces, self.shards.starts)
        order = (idx if perm is None else idx[perm])[lo:hi].tolist()
        step = max(1, min(TAKE, TAKE_BYTES * len(idx) // max(span, 1)))
        # each take checks its tars' sizes: the consumer runs between takes, and a tar cut
        # then would be read through its mapping by an unchecked take (SIGBUS)
        take = t.take
        for c in range(0, len(order), step):
            got = take(order[c : c + step])
            got.reverse()
            yield map(got.pop, repeat(-1, len(got)))

    def _first_window(
        self, t: Takes, plist: list[list[int]], order: NDArray[np.int64], ra: ReadAhead
    ) -> Iterator[Sample | None]:
        """A window's positions ``order`` in order, each block read when its first sample is due.

        Remote shards: the read-ahead has queued the window's blocks together, so the first
        sample waits for its own block's bytes, not for the whole window's (a shuffled
        window reads a block of every shard: ~16 MiB at the default sizes). A Python step
        per sample: the first window of an iteration only.
        """
        ends = np.cumsum([j1 - j0 for _, j0, j1 in plist])
        where = np.searchsorted(ends, order, side="right").tolist()
        got: list[list[Sample | None] | None] = [None] * len(plist)
        base = [0, *ends[:-1].tolist()]
        for p, b in zip(order.tolist(), where, strict=True):
            blk = got[b]
            if blk is None:
                blk = got[b] = self._read_samples(t, plist[b], True, ra)
            yield blk[p - base[b]]

    # -- block reads --------------------------------------------------------------------------
    def _read1(
        self, t: Takes, piece: list[int], prefetch: bool, ra: ReadAhead | None = None, *,
        samples: bool = False,
    ) -> Any:
        """Kernel read of a planned piece ``(shard, j0, j1)``; ``None`` if skipped.

        A :class:`Block`, or with ``samples`` its sample dicts (``Takes.read_samples``).
        ``ra`` (remote shards): the plan's next blocks are queued for read-ahead first.
        """
        s, j0, j1 = piece
        try:
            if ra is not None:
                ra.pump(s)
            if samples:
                return t.read_samples(s, j0, j1, self.fields, prefetch=prefetch)
            return self.shards.read_block(s, j0, j1, self.fields, prefetch=prefetch)
        except Exception as e:
            if self.on_error != "skip":
                raise
            warnings.warn(
                f"{self.shards.paths[s]}: skipped samples {j0}..{j1} (on_error='skip'): {e}",
                RuntimeWarning,
                stacklevel=3,
            )
            return None

    def _read_samples(
        self, t: Takes, piece: list[int], prefetch: bool, ra: ReadAhead | None = None
    ) -> list[Sample | None]:
        """The piece's samples, or one ``None`` per sample if it was skipped."""
        got = self._read1(t, piece, prefetch, ra, samples=True)
        return [None] * (piece[2] - piece[1]) if got is None else cast("list[Sample | None]", got)

    def _read_window(
        self, t: Takes, pieces: NDArray[np.int64], prefetch: bool, ra: ReadAhead | None = None
    ) -> list[Block | None]:
        """Kernel reads of a window's pieces, held until packed.

        Detached when they span more shards than may stay open, so descriptors stay within
        the bound.
        """
        detach = len(np.unique(pieces[:, 0])) > t.open_bound
        out: list[Block | None] = []
        for piece in pieces.tolist():
            b = self._read1(t, piece, prefetch, ra)
            out.append(b.detach() if detach and b is not None else b)
        return out

    # -- batches ------------------------------------------------------------------------------
    def batches(
        self,
        p: WorkerPlan,
        start: int,
        batch_size: int,
        int_fields: Sequence[str],
        alloc: Alloc,
        passed: Callable[[int], None] | None = None,
    ) -> Iterator[Packed]:
        """Batches of ``batch_size`` consecutive positions of this worker's yield order.

        The batch grid is fixed at multiples of ``batch_size`` from the worker's first
        position; a resume at ``start`` off the grid yields ``[start, next multiple)`` first,
        then the uninterrupted batches. Members are copied once, from the kernel's source
        buffer into the batch buffer (:func:`~tarindex.stream.pack.pack_blocks`); a batch
        whose samples were all skipped (``on_error="skip"``) is not yielded.

        Args:
            p: The worker's plan.
            start: First position, ``0 <= start <= p.n_samples``.
            batch_size: Samples per batch, ``>= 1``.
            int_fields: Extensions parsed into ``int64`` columns.
            alloc: The batch buffer (see :data:`tarindex.stream.pack.Alloc`).
            passed: Called with the end position of each batch before it is yielded (the
                caller's resume counter). Defaults to none.
        """
        mixing = p.shuffle and p.buffer_size > 1
        w = p.buffer_size if mixing else batch_size  # a window: mixed together (or one batch)
        wins: dict[int, _Window] = {}
        t = self.shards.takes()
        ra = ReadAhead.over(self.shards, t, self.fields, p.segments, w if mixing else 0)
        try:
            yield from self._batches(
                t, p, start, batch_size, mixing, w, wins, ra, int_fields, alloc, passed
            )
        finally:
            if ra is not None:
                ra.close()

    def _batches(
        self,
        t: Takes,
        p: WorkerPlan,
        start: int,
        bsz: int,
        mixing: bool,
        w: int,
        wins: dict[int, _Window],
        ra: ReadAhead | None,
        int_fields: Sequence[str],
        alloc: Alloc,
        passed: Callable[[int], None] | None,
    ) -> Iterator[Packed]:
        pos, n = start, p.n_samples
        while pos < n:
            end = min((pos // bsz + 1) * bsz, n)
            parts: list[tuple[Block, NDArray[np.int64] | None]] = []
            for k in range(pos // w, (end - 1) // w + 1):
                got = wins.get(k)
                if got is None:
                    got = wins[k] = self._window(t, p, k, w, mixing, ra)
                whole, at, perm = got
                a, b = max(pos, k * w) - k * w, min(end, (k + 1) * w) - k * w
                sel = at[perm[a:b]] if perm is not None else at[a:b]
                sel = sel[sel >= 0]
                if whole is not None and len(sel):
                    parts.append((whole, sel))
            for k in [k for k in wins if (k + 1) * w <= end]:
                del wins[k]
            pos = end
            if passed is not None:
                passed(pos)
            if parts:
                yield pack_blocks(parts, None, int_fields, alloc)

    def _window(
        self,
        t: Takes,
        p: WorkerPlan,
        k: int,
        w: int,
        mixing: bool,
        ra: ReadAhead | None = None,
    ) -> _Window:
        """Read window ``k`` of the plan (``w`` positions) as one block.

        ``ra`` (remote shards): windows ``k`` and ``k + 1`` are queued for read-ahead.
        """

        def pieces_of(k: int) -> tuple[NDArray[np.int64], Any]:
            if mixing:
                return p.window(k)
            return slice_blocks(p.segments, k * w, min((k + 1) * w, p.n_samples)), None

        pieces, perm = ra.window(k, pieces_of, k < (p.n_samples - 1) // w) if ra else pieces_of(k)
        blocks = self._read_window(t, pieces, mixing, ra)
        lens = (pieces[:, 2] - pieces[:, 1]).tolist()
        at = np.full(sum(lens), -1, np.int64)
        pos = done = 0
        for blk, ln in zip(blocks, lens, strict=True):
            if blk is not None:
                at[pos : pos + ln] = np.arange(done, done + ln, dtype=np.int64)
                done += ln
            pos += ln
        ok = [b for b in blocks if b is not None]
        return (Block.concat(ok) if ok else None), at, perm
