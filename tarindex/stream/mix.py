"""MixedStream: the torch-free mixing executor, several streaming sources by weight or count.

The schedule (which source fills each position of an epoch) is the pure function
:func:`tarindex.plan.shuffle.mix_schedule`; each source's own samples come from its block plan
(:func:`tarindex.plan.shuffle.plan_span` with the source's own seed, derived from the mix
seed), read through the source's :meth:`~tarindex.stream.dataset.StreamDataset.iter_plan`;
dealing over ranks and workers is :func:`tarindex.plan.shuffle.slot_span`, as for a single
source. ``tarindex.MixedDataset`` is this class over torch. See docs/STREAMING.md, "Mixing".
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from itertools import chain
from typing import Any

import numpy as np
from numpy.typing import NDArray

from ..plan.checks import check_u64
from ..plan.epoch import WorkerPlan, plan_span, rank_share, slot_span
from ..plan.mix import mix_counts, mix_offsets, mix_schedule, mix_sources, mix_spans, source_seed
from ..plan.state import shard_layout
from .dataset import StreamDataset
from .epochs import Env, Layouts, Progress, StreamEpochOwner

__all__ = ["MixedStream", "source_spans"]
_CHUNK = 1 << 16  # schedule positions computed at a time


class _Skipped:
    pass


_SKIPPED = _Skipped()


def _plain(src: StreamDataset) -> bool:
    """Whether a source yields the raw sample dicts (no decode, no transform)."""
    return src.decoder is None and src.transform is None


def source_spans(
    counts: NDArray[np.int64],
    sizes: Sequence[int],
    replacement: Sequence[bool],
    seed: int,
    epoch: int,
    start: int,
    stop: int,
    shuffle: bool,
    first: NDArray[np.int64] | None = None,
) -> list[list[tuple[int, int, int]]]:
    """Per source, the ranges of its own epochs that fill mixed positions ``[start, stop)``.

    ``first``: :func:`tarindex.shuffle.mix_offsets` at ``start``, if already computed.
    """
    if first is None:
        first = mix_offsets(counts, seed, epoch, start, shuffle)
    o0 = first.tolist()
    o1 = mix_offsets(counts, seed, epoch, stop, shuffle).tolist()
    return [
        mix_spans(a, b, int(c), int(n), epoch, r)
        for a, b, c, n, r in zip(o0, o1, counts.tolist(), sizes, replacement, strict=True)
    ]


class MixedStream(StreamEpochOwner):
    """Several streaming sources mixed by weight or count, torch-free.

    The behaviour, the counts and every argument are those of :class:`tarindex.MixedDataset`
    (which is this class over torch); the sources are :class:`~tarindex.stream.StreamDataset`
    objects (``TarIterableDataset`` is one). ``env`` says where rank, world size and worker
    come from (:class:`~tarindex.stream.epochs.Env`; defaults to
    :data:`~tarindex.stream.epochs.LOCAL`).

    Raises:
        TypeError: A source is not a ``StreamDataset``.
        ValueError: As ``MixedDataset``.
    """

    def __init__(
        self,
        sources: Sequence[StreamDataset],
        *,
        weights: Sequence[float] | None = None,
        counts: Sequence[int] | None = None,
        samples_per_epoch: int | None = None,
        replacement: bool | Sequence[bool] = False,
        shuffle: bool = True,
        seed: int = 0,
        rank: int | None = None,
        world_size: int | None = None,
        drop_last: bool = False,
        source_key: str | None = None,
        env: Env | None = None,
    ) -> None:
        srcs = list(sources)
        for i, s in enumerate(srcs):
            if not isinstance(s, StreamDataset):
                raise TypeError(
                    f"sources[{i}]: expected a TarIterableDataset (a StreamDataset), got {type(s)!r}"
                )
            if s.batch_size is not None:
                raise ValueError(
                    f"sources[{i}] is batched: mix per-sample sources (batched=False) and "
                    "batch the mix with the DataLoader"
                )
        seed = check_u64("seed", seed)
        self.sources = srcs
        self.sizes = [len(s.shards) for s in srcs]
        self.counts, self.replacement = mix_counts(
            self.sizes, weights, counts, samples_per_epoch, replacement
        )
        self.n_plan = int(self.counts.sum())
        self.shuffle = bool(shuffle)
        self.seed = seed
        self.drop_last = bool(drop_last)
        self.source_key = source_key
        self._init_epochs(rank, world_size, type(self).__name__, env)

    # -- sizes (rank, epoch, set_epoch: StreamEpochOwner) -----------------------------------------
    def __len__(self) -> int:
        """Samples this rank yields per epoch (all its workers), the same on every rank.

        Raises:
            RuntimeError: If the rank cannot be resolved.
        """
        return rank_share(self.n_plan, self._rank()[1], self.drop_last)

    def source_plan(self, s: int, source_epoch: int, start: int, stop: int) -> WorkerPlan:
        """Return positions ``[start, stop)`` of source ``s``'s own epoch ``source_epoch``.

        The source's block plan with its own seed (:func:`tarindex.shuffle.source_seed`),
        mixed in windows cut from ``start`` (:func:`tarindex.shuffle.plan_span`): a worker
        reads no sample of the source outside its share.
        """
        src = self.sources[s]
        return plan_span(
            src.shards.counts,
            source_seed(self.seed, s),
            source_epoch,
            src.block_size,
            start,
            stop,
            buffer_size=src.buffer_size,
            shuffle=src.shuffle,
        )

    def span(self, worker: int = 0, num_workers: int = 1) -> tuple[int, int]:
        """Positions ``[start, stop)`` of the epoch's mixed stream dealt to this rank's worker."""
        rank, ws = self._rank()
        return slot_span(self.n_plan, rank, ws, worker, num_workers, self.drop_last)

    def order(
        self, epoch: int, worker: int = 0, num_workers: int = 1
    ) -> tuple[NDArray[np.int64], NDArray[np.int64]]:
        """Return what this rank's worker yields in ``epoch``, computed without reading data.

        Returns:
            ``(src, index)``: ``int64`` arrays of shape ``(n,)``, the source of each sample
            and its ``__index__`` within that source, in yield order.
        """
        a, b = self.span(worker, num_workers)
        src, _ = mix_schedule(self.counts, self.seed, epoch, a, b, self.shuffle)
        idx = np.empty(len(src), dtype=np.int64)
        spans = source_spans(
            self.counts, self.sizes, self.replacement, self.seed, epoch, a, b, self.shuffle
        )
        for s, rows in enumerate(spans):
            if not rows:
                continue
            starts = self.sources[s].shards.starts
            parts = [self.source_plan(s, q, p0, p1).order(starts) for q, p0, p1 in rows]
            idx[src == s] = np.concatenate(parts)
        return src, idx

    # -- state ------------------------------------------------------------------------------
    def _plan_params(self) -> dict[str, Any]:
        rank, ws = self._rank()
        return {
            "n_samples": self.n_plan,
            "counts": self.counts.tolist(),
            "sizes": list(self.sizes),
            "replacement": list(self.replacement),
            "sources": [[s.block_size, s.buffer_size, s.shuffle] for s in self.sources],
            "shuffle": self.shuffle,
            "drop_last": self.drop_last,
            "world_size": ws,
            "rank": rank,
        }

    def _layouts(self) -> Layouts:
        layouts = [shard_layout(s.shards.counts) for s in self.sources]
        return layouts, [s.shuffle for s in self.sources], list(self.sizes), True

    def _share(self, worker: int, num_workers: int) -> int:
        a, b = self.span(worker, num_workers)
        return b - a

    def state_dict(self) -> dict[str, Any]:
        """Return where this process (worker) is in the epoch: a few ints per source.

        Returns:
            ``{"version", "seed", "epoch", "consumed", "worker", "num_workers", "n_samples",
            "counts", "sizes", "replacement", "sources", "shuffle", "drop_last",
            "world_size", "rank", "layout"}``; ``consumed`` is the number of mixed positions
            this worker has passed in ``epoch``; ``layout`` one ``[n_shards, crc32]`` per
            source (:func:`tarindex.plan.state.shard_layout`). Before any iteration it
            describes the next epoch at 0; a loaded but not yet consumed state is returned
            as loaded.
        """
        return self._worker_state()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume from :meth:`state_dict`: the next ``__iter__`` continues that epoch once.

        Checked by :func:`tarindex.plan.state.check_state`: a source that shuffles must
        have the shard layout it had when the state was saved; a version 1 state (no
        ``layout``) loads only when no source shuffles.

        Raises:
            ValueError: Naming the field: missing keys, a field that is not an integer in
                range, another world size or rank, other plan parameters (counts, sources,
                ...), another shard layout of a shuffled source, a version 1 state of a
                shuffled source, or ``consumed`` past the saved worker's share.
        """
        self._load_worker_state(state, same="sources, weights/counts")

    # -- iteration --------------------------------------------------------------------------
    def __iter__(self) -> Iterator[Any]:
        """Start (or resume) an epoch.

        Raises:
            RuntimeError: If the rank cannot be resolved.
            ValueError: If a loaded state came from a different worker layout.
        """
        worker, nw, epoch, start = self._re.begin_iter(self._loaded)
        self._loaded = None  # a loaded state is consumed by one __iter__
        a, b = self.span(worker, nw)
        # load_state_dict checked start against the span
        self._active = act = Progress(epoch, start, worker, nw)
        return self._generate(act, a, b)

    def _source_stream(self, s: int, rows: list[tuple[int, int, int]], skip: int) -> Iterator[Any]:
        """Source ``s``'s samples of ``rows`` after the first ``skip``, one item per position.

        ``_SKIPPED`` marks a sample left out under ``on_error="skip"``. With ``source_key``, a
        source without decode/transform gets it from :meth:`_generate` (no per-sample layer
        here); others before their decode and transform.
        """
        src = self.sources[s]
        key = self.source_key
        tag = None if key is None or _plain(src) else (key, s)
        parts = []
        for q, p0, p1 in rows:
            first = min(skip, p1 - p0)
            skip -= first
            if first < p1 - p0:
                parts.append((q, p0, p1, first))
        its = (
            src.iter_plan(self.source_plan(s, q, p0, p1), first, skipped=_SKIPPED, tag=tag)
            for q, p0, p1, first in parts
        )
        return next(its) if len(parts) == 1 else chain.from_iterable(its)

    def _generate(self, act: Progress, a: int, b: int) -> Iterator[Any]:
        """The worker's share ``[a, b)`` from position ``a + consumed`` on.

        Each source's windows are cut from the worker's first position, also when resuming,
        so a resumed epoch reads and yields exactly what the uninterrupted one would have.
        """
        epoch = act.epoch
        o0 = mix_offsets(self.counts, self.seed, epoch, a, self.shuffle)
        spans = source_spans(
            self.counts, self.sizes, self.replacement, self.seed, epoch, a, b, self.shuffle, o0
        )
        pos = act.consumed
        skips = (
            (mix_offsets(self.counts, self.seed, epoch, a + pos, self.shuffle) - o0)
            if pos
            else np.zeros_like(o0)
        ).tolist()
        streams = np.empty(len(spans), dtype=object)  # a source's stream, by source number
        for s, (rows, k) in enumerate(zip(spans, skips, strict=True)):
            streams[s] = self._source_stream(s, rows, k)
        key = self.source_key
        tag = [key is not None and _plain(src) for src in self.sources]
        skipped = _SKIPPED
        lean = not any(tag) and all(src.on_error == "raise" for src in self.sources)
        for c0 in range(a + pos, b, _CHUNK):
            c1 = min(b, c0 + _CHUNK)
            src = mix_sources(self.counts, self.seed, epoch, c0, c1, self.shuffle)
            # one C-level next() per position, on the stream of its source
            pulled = map(next, streams[src].tolist())
            if lean:  # no marker can come (errors raise), nothing to tag
                for x in pulled:
                    pos += 1
                    act.consumed = pos
                    yield x
            else:
                for s, x in zip(src.tolist(), pulled, strict=False):  # checked below
                    pos += 1
                    act.consumed = pos
                    if x is skipped:
                        continue
                    if tag[s]:
                        x[key] = s
                    yield x
            if a + pos != c1:  # map() ends quietly where a stream runs out
                raise RuntimeError(
                    f"{type(self).__name__}: source {int(src[a + pos - c0])} ran out at mixed position "
                    f"{a + pos} of [{a}, {b}) in epoch {epoch}: its plan is shorter than the "
                    "mix's spans (a bug: please report it)"
                )

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}({len(self.sources)} sources, counts={self.counts.tolist()}, "
            f"shuffle={self.shuffle}, seed={self.seed})"
        )
