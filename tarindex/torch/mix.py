"""Weighted mixing of several sources: MixedDataset (streaming) and MixSampler (map-style).

The mixing executor and the samplers' plans are torch-free (:class:`tarindex.stream.MixedStream`,
:class:`tarindex.stream.samplers.MixPlanSampler`); these are them as torch's ``IterableDataset``
and ``Sampler``, rank and worker from ``torch.distributed`` and ``get_worker_info``. See
docs/STREAMING.md, "Mixing".
"""

from __future__ import annotations

from typing import Any

import torch.utils.data

from ..stream.mix import MixedStream
from ..stream.samplers import MixPlanSampler
from ._dist import TORCH

__all__ = ["MixedDataset", "MixSampler"]


class MixedDataset(MixedStream, torch.utils.data.IterableDataset[Any]):
    """Stream several :class:`~tarindex.TarIterableDataset` sources mixed by weight or count.

    Per epoch, source ``s`` fills ``counts[s]`` of the ``N = sum(counts)`` positions of the
    mixed stream, spread evenly: **over any window of ``k`` consecutive samples of an epoch**
    (of the whole stream, or of what one rank or one DataLoader worker yields) source ``s``
    appears ``k * p_s`` times up to ``1 + (m - 2) * p_s``, where ``p_s = counts[s] / N`` and
    ``m`` is the number of sources with a non-zero count: within 1 for two sources, within 2
    for three (:func:`tarindex.shuffle.mix_bound`). Through a DataLoader with ``W`` workers,
    which takes whole batches from the workers in turn, a window of the loader's output is
    within ``W`` times that bound. The schedule is a low-discrepancy sequence rotated by a
    seeded offset each epoch; each source's samples come from the source's own block plan
    (shards, blocks, ``block_size``, ``buffer_size``, ``shuffle``, ``fields``, ``decode``,
    ``transform``, ``on_error`` of that source), seeded from this dataset's seed and the
    source's position, so the whole order is a pure function of ``(seed, epoch)`` (and the
    worker layout: a worker reads just its contiguous range of each source, mixed in windows
    cut from that range's start, :func:`tarindex.shuffle.plan_span`); the sources' own seeds,
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
    the whole source has been seen (:func:`tarindex.shuffle.mix_spans`).

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
            :func:`tarindex.shuffle.mix_total`.
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
        TypeError: A source is not a ``TarIterableDataset`` (a
            :class:`~tarindex.stream.StreamDataset`).
        ValueError: A batched source; bad weights or counts (see
            :func:`tarindex.shuffle.mix_counts`); bad ``seed``, ``rank``/``world_size``.
        RuntimeError: From ``len()`` or ``__iter__``: ``WORLD_SIZE > 1`` but no rank.
    """

    default_env = TORCH


class MixSampler(MixPlanSampler, torch.utils.data.Sampler[int]):
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
    :class:`~tarindex.stream.samplers.PlanSampler`.

    Args:
        sources: Sized datasets (``TarDataset`` for shard-aware blocks) or sample counts.
        weights: Relative weights, one per source (exclusive with ``counts``).
        counts: Samples per epoch from each source (exclusive with ``weights``).
        samples_per_epoch: With ``weights``: the epoch length. Defaults to
            :func:`tarindex.shuffle.mix_total`.
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

    default_env = TORCH
