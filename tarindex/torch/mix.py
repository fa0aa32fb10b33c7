"""Weighted mixing of several sources: MixedDataset (streaming) and MixSampler (map-style).

The schedule (which source fills each position of an epoch) is the pure function
:func:`tarindex.plan.mix.mix_schedule`; each source's own samples come from its block plan
(:func:`tarindex.plan.epoch.plan_worker` with the source's own seed, derived from the mix seed);
dealing over ranks and workers is :func:`tarindex.plan.epoch.slot_span`, as for
:class:`~tarindex.torch.iterable.TarIterableDataset`. See docs/STREAMING.md, "Mixing".
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence, Sized
from itertools import chain
from typing import Any

import numpy as np
import torch.utils.data
from numpy.typing import NDArray

from ..plan.epoch import WorkerPlan, plan_span, plan_worker, rank_share, slot_span
from ..plan.mix import mix_counts, mix_offsets, mix_schedule, mix_sources, mix_spans, source_seed
from ..plan.seeds import make_rng
from ._dist import StreamEpochOwner
from .iterable import TarIterableDataset
from .sampler import PlanSampler, shard_counts

__all__ = ["MixedDataset", "MixSampler"]

_STATE_VERSION = 1
_CHUNK = 1 << 16  # schedule positions computed at a time


class _Skipped:
    pass


_SKIPPED = _Skipped()


def _plain(src: TarIterableDataset) -> bool:
    """Whether a source yields the raw sample dicts (no decode, no transform)."""
    return src.decoder is None and src.transform is None


def _source_spans(
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

    ``first``: :func:`tarindex.plan.mix.mix_offsets` at ``start``, if already computed.
    """
    if first is None:
        first = mix_offsets(counts, seed, epoch, start, shuffle)
    o0 = first.tolist()
    o1 = mix_offsets(counts, seed, epoch, stop, shuffle).tolist()
    return [
        mix_spans(a, b, int(c), int(n), epoch, r)
        for a, b, c, n, r in zip(o0, o1, counts.tolist(), sizes, replacement, strict=True)
    ]


class MixedDataset(StreamEpochOwner, torch.utils.data.IterableDataset[Any]):
    """Stream several :class:`~tarindex.TarIterableDataset` sources mixed by weight or count.

    Per epoch, source ``s`` fills ``counts[s]`` of the ``N = sum(counts)`` positions of the
    mixed stream, spread evenly: **over any window of ``k`` consecutive samples of an epoch**
    (of the whole stream, or of what one rank or one DataLoader worker yields) source ``s``
    appears ``k * p_s`` times up to ``1 + (m - 2) * p_s``, where ``p_s = counts[s] / N`` and
    ``m`` is the number of sources with a non-zero count: within 1 for two sources, within 2
    for three (:func:`tarindex.plan.mix.mix_bound`). Through a DataLoader with ``W`` workers,
    which takes whole batches from the workers in turn, a window of the loader's output is
    within ``W`` times that bound. The schedule is a low-discrepancy sequence rotated by a
    seeded offset each epoch; each source's samples come from the source's own block plan
    (shards, blocks, ``block_size``, ``buffer_size``, ``shuffle``, ``fields``, ``decode``,
    ``transform``, ``on_error`` of that source), seeded from this dataset's seed and the
    source's position, so the whole order is a pure function of ``(seed, epoch)`` (and the
    worker layout: a worker reads just its contiguous range of each source, mixed in windows
    cut from that range's start, :func:`tarindex.plan.epoch.plan_span`); the sources' own seeds,
    epochs and ranks are not used.

    Samples are the sources' samples, unchanged. ``source_key="__source__"`` adds that key
    (int, the source's position in ``sources``) to each sample dict before the source's decode
    and transform; it costs ~8% of the per-sample rate (the dict grows), so it is off by
    default: a per-source ``transform`` can tag samples instead.

    **Counts.** ``counts=`` gives the samples per epoch of each source; ``weights=`` splits
    ``samples_per_epoch`` by weight (largest remainder, exact): by default the largest epoch
    in which no source sampled without replacement repeats a sample. Without replacement
    (the default) a source gives at most its size per epoch, each sample at most once (a
    different random subset each epoch when fewer); with ``replacement=True`` (one flag or one
    per source) its stream is its epochs one after another, so a sample repeats only after
    the whole source has been seen (:func:`tarindex.plan.mix.mix_spans`).

    **Ranks and workers.** The ``N`` positions are dealt exactly as by
    :class:`~tarindex.TarIterableDataset`: rank ``r`` yields ``len(ds)`` positions
    (``ceil(N / world_size)``, or ``N // world_size`` with ``drop_last``), the same on every
    rank, worker ``w`` of ``W`` a contiguous part of them (the same counts on every rank).
    When ``world_size`` divides ``N`` and no source is sampled with replacement, every
    mixed-in sample is yielded exactly once per epoch across all ranks and workers.

    **Epochs and resume** work as for ``TarIterableDataset`` (``set_epoch``, persistent
    workers, ``state_dict``/``load_state_dict``, torchdata's ``StatefulDataLoader``); the
    state is ``O(number of sources)``. Only the same world size and worker layout resume.

    Args:
        sources: ``TarIterableDataset`` objects (per-sample output, not ``batched``).
        weights: Relative weights, one per source (exclusive with ``counts``).
        counts: Samples per epoch from each source (exclusive with ``weights``).
        samples_per_epoch: With ``weights``: the epoch length ``N``. Defaults to
            :func:`tarindex.plan.mix.mix_total`.
        replacement: See **Counts**. Defaults to ``False``.
        shuffle: Rotate the schedule by a seeded offset each epoch (the sources shuffle
            according to their own ``shuffle``). Defaults to ``True``.
        seed: Base seed, ``0 <= seed < 2**64``. Defaults to ``0``.
        rank: This process's rank (with ``world_size``). Defaults to ``torch.distributed``'s.
        world_size: Number of ranks. Defaults to ``torch.distributed``'s, else ``1``.
        drop_last: Remainder policy over ranks, as ``TarIterableDataset``'s. Defaults to
            ``False`` (pad by repeating the start of the epoch's stream).
        source_key: Add the source's position under this key to every sample. Defaults to
            ``None`` (samples unchanged).

    Raises:
        TypeError: A source is not a ``TarIterableDataset``.
        ValueError: A batched source; bad weights or counts (see
            :func:`tarindex.plan.mix.mix_counts`); bad ``seed``, ``rank``/``world_size``.
        RuntimeError: From ``len()`` or ``__iter__``: ``WORLD_SIZE > 1`` but no rank.
    """

    def __init__(
        self,
        sources: Sequence[TarIterableDataset],
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
    ) -> None:
        srcs = list(sources)
        for i, s in enumerate(srcs):
            if not isinstance(s, TarIterableDataset):
                raise TypeError(f"sources[{i}]: expected a TarIterableDataset, got {type(s)!r}")
            if s.batch_size is not None:
                raise ValueError(
                    f"sources[{i}] is batched: mix per-sample sources (batched=False) and "
                    "batch the mix with the DataLoader"
                )
        make_rng(seed, 0, 0)  # validates seed
        self.sources = srcs
        self.sizes = [len(s.shards) for s in srcs]
        self.counts, self.replacement = mix_counts(
            self.sizes, weights, counts, samples_per_epoch, replacement
        )
        self.n_plan = int(self.counts.sum())
        self.shuffle = bool(shuffle)
        self.seed = int(seed)
        self.drop_last = bool(drop_last)
        self.source_key = source_key
        self._init_epochs(rank, world_size, "MixedDataset")

    # -- sizes (rank, epoch, set_epoch: StreamEpochOwner) -----------------------------------------
    def __len__(self) -> int:
        """Samples this rank yields per epoch (all its workers), the same on every rank.

        Raises:
            RuntimeError: If the rank cannot be resolved.
        """
        return rank_share(self.n_plan, self._rank()[1], self.drop_last)

    def source_plan(self, s: int, source_epoch: int, start: int, stop: int) -> WorkerPlan:
        """Return positions ``[start, stop)`` of source ``s``'s own epoch ``source_epoch``.

        The source's block plan with its own seed (:func:`tarindex.plan.mix.source_seed`),
        mixed in windows cut from ``start`` (:func:`tarindex.plan.epoch.plan_span`): a worker
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
        spans = _source_spans(
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

    def state_dict(self) -> dict[str, Any]:
        """Return where this process (worker) is in the epoch: a few ints per source.

        Returns:
            ``{"version", "seed", "epoch", "consumed", "worker", "num_workers", "n_samples",
            "counts", "sizes", "replacement", "sources", "shuffle", "drop_last",
            "world_size", "rank"}``; ``consumed`` is the number of mixed positions this
            worker has passed in ``epoch``. Before any iteration it describes the next epoch
            at 0; a loaded but not yet consumed state is returned as loaded.
        """
        return self._worker_state(_STATE_VERSION)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume from :meth:`state_dict`: the next ``__iter__`` continues that epoch once.

        Raises:
            ValueError: Unknown version, or a state saved with other plan parameters (counts,
                sources, world size, ...): the message names the field.
        """
        if state.get("version") != _STATE_VERSION:
            raise ValueError(
                f"state version {state.get('version')!r}: this tarindex reads MixedDataset "
                f"state version {_STATE_VERSION}"
            )
        mine = self._plan_params()
        for k, v in mine.items():
            if state.get(k) != v:
                raise ValueError(
                    f"state {k}={state.get(k)!r} but this MixedDataset has {k}={v!r}: resuming "
                    f"would not replay the same mix; construct it with the same sources, "
                    f"weights/counts and {k} (a streaming state resumes only on the same rank "
                    "of the same world size)"
                )
        self._loaded = dict(state)
        self.seed = int(state["seed"])

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
        self._active = {"epoch": epoch, "worker": worker, "num_workers": nw}
        self._consumed = min(start, b - a)
        return self._generate(epoch, a, b)

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

    def _generate(self, epoch: int, a: int, b: int) -> Iterator[Any]:
        """The worker's share ``[a, b)`` from position ``a + consumed`` on.

        Each source's windows are cut from the worker's first position, also when resuming,
        so a resumed epoch reads and yields exactly what the uninterrupted one would have.
        """
        o0 = mix_offsets(self.counts, self.seed, epoch, a, self.shuffle)
        spans = _source_spans(
            self.counts, self.sizes, self.replacement, self.seed, epoch, a, b, self.shuffle, o0
        )
        pos = self._consumed
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
                    self._consumed = pos
                    yield x
            else:
                for s, x in zip(src.tolist(), pulled, strict=False):  # checked below
                    pos += 1
                    self._consumed = pos
                    if x is skipped:
                        continue
                    if tag[s]:
                        x[key] = s
                    yield x
            if a + pos != c1:  # map() ends quietly where a stream runs out
                raise RuntimeError(
                    f"MixedDataset: source {int(src[a + pos - c0])} ran out at mixed position "
                    f"{a + pos} of [{a}, {b}) in epoch {epoch}: its plan is shorter than the "
                    "mix's spans (a bug: please report it)"
                )

    def __repr__(self) -> str:
        return (
            f"MixedDataset({len(self.sources)} sources, counts={self.counts.tolist()}, "
            f"shuffle={self.shuffle}, seed={self.seed})"
        )


class MixSampler(PlanSampler):
    """Sample from several map-style datasets concatenated, mixed by weight or count.

    Yields indices into ``torch.utils.data.ConcatDataset(sources)`` (source ``s``'s sample
    ``i`` is index ``offsets[s] + i``). The mix is :class:`MixedDataset`'s, with the same
    window bound (``1 + (m - 2) * p_s`` over any ``k`` consecutive indices of a rank),
    counts, replacement and remainder rules; each source's own order is
    :class:`~tarindex.BlockSampler`'s block plan (blocks never cross a shard boundary of a
    ``TarDataset``), seeded per source from ``seed``. One stream per rank, as for a sampler:
    rank ``r`` yields ``len(sampler)`` indices, the same on every rank; with ``world_size``
    dividing ``N`` and no replacement every mixed-in sample appears once per epoch across
    ranks. Epochs, ``state_dict``/``load_state_dict`` (also on another world size) as
    :class:`~tarindex.torch.sampler.PlanSampler`.

    Args:
        sources: Sized datasets (``TarDataset`` for shard-aware blocks) or sample counts.
        weights: Relative weights, one per source (exclusive with ``counts``).
        counts: Samples per epoch from each source (exclusive with ``weights``).
        samples_per_epoch: With ``weights``: the epoch length. Defaults to
            :func:`tarindex.plan.mix.mix_total`.
        replacement: One flag or one per source (see :class:`MixedDataset`). Defaults to
            ``False``.
        block_size: Contiguous indices per block within a source. Defaults to ``64``.
        buffer_size: Mixing window within a source's order; ``<= 1`` keeps blocks intact.
            Defaults to ``0``.
        shuffle: Shuffle each source's blocks and rotate the schedule. Defaults to ``True``.
        seed: Base seed. Defaults to ``0``.
        rank: This process's rank (with ``world_size``). Defaults to ``torch.distributed``'s.
        world_size: Number of ranks. Defaults to ``torch.distributed``'s, else ``1``.
        drop_last: Remainder policy. Defaults to ``False``.

    Raises:
        ValueError: Bad weights or counts, ``block_size``, ``seed``, ``rank``/``world_size``.
    """

    def __init__(
        self,
        sources: Sequence[Sized | int],
        *,
        weights: Sequence[float] | None = None,
        counts: Sequence[int] | None = None,
        samples_per_epoch: int | None = None,
        replacement: bool | Sequence[bool] = False,
        block_size: int = 64,
        buffer_size: int = 0,
        shuffle: bool = True,
        seed: int = 0,
        rank: int | None = None,
        world_size: int | None = None,
        drop_last: bool = False,
    ) -> None:
        if int(block_size) < 1:
            raise ValueError(f"block_size={block_size!r}: expected an integer >= 1")
        make_rng(seed, 0, 0)  # validates seed
        self.shard_counts = [
            np.asarray([int(s)], dtype=np.int64)
            if isinstance(s, (int, np.integer))
            else shard_counts(s)
            for s in sources
        ]
        self.sizes = [int(c.sum()) for c in self.shard_counts]
        self.offsets = np.zeros(len(self.sizes) + 1, dtype=np.int64)
        np.cumsum(self.sizes, out=self.offsets[1:])
        self.counts, self.replacement = mix_counts(
            self.sizes, weights, counts, samples_per_epoch, replacement
        )
        self.n_plan = int(self.counts.sum())
        self.block_size = int(block_size)
        self.buffer_size = max(int(buffer_size), 0)
        self.shuffle = bool(shuffle)
        self.seed = int(seed)
        self.drop_last = bool(drop_last)
        super().__init__(rank, world_size, "MixSampler")

    def plan_params(self) -> dict[str, Any]:
        """The mix's parameters that a saved state must match."""
        return {
            "kind": "MixSampler",
            "counts": self.counts.tolist(),
            "sizes": list(self.sizes),
            "replacement": list(self.replacement),
            "block_size": self.block_size,
            "buffer_size": self.buffer_size,
            "shuffle": self.shuffle,
            "drop_last": self.drop_last,
        }

    def source_order(self, s: int, source_epoch: int) -> NDArray[np.int64]:
        """Source ``s``'s indices (within it) in the order of its own epoch ``source_epoch``."""
        c = self.shard_counts[s]
        starts = np.zeros(len(c) + 1, dtype=np.int64)
        np.cumsum(c, out=starts[1:])
        p = plan_worker(
            c,
            source_seed(self.seed, s),
            source_epoch,
            self.block_size,
            buffer_size=self.buffer_size,
            shuffle=self.shuffle,
        )
        return p.order(starts)

    def sources_of(self, indices: NDArray[np.int64]) -> NDArray[np.int64]:
        """The source of each concatenated index: ``int64`` of the same shape."""
        out: NDArray[np.int64] = np.searchsorted(self.offsets, indices, side="right") - 1
        return out

    def rank_order(self, epoch: int, rank: int, world_size: int) -> NDArray[np.int64]:
        """Rank ``rank`` of ``world_size``'s concatenated indices of a fresh ``epoch``."""
        a, b = slot_span(self.n_plan, rank, world_size, 0, 1, self.drop_last)
        src, _ = mix_schedule(self.counts, self.seed, epoch, a, b, self.shuffle)
        out = np.empty(len(src), dtype=np.int64)
        spans = _source_spans(
            self.counts, self.sizes, self.replacement, self.seed, epoch, a, b, self.shuffle
        )
        for s, rows in enumerate(spans):
            if rows:
                cache: dict[int, NDArray[np.int64]] = {}
                parts = []
                for q, p0, p1 in rows:
                    if q not in cache:
                        cache[q] = self.source_order(s, q)
                    parts.append(cache[q][p0:p1])
                out[src == s] = np.concatenate(parts) + self.offsets[s]
        return out
