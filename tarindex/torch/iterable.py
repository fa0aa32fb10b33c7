"""TarIterableDataset: streaming over indexed tar shards, split over ranks and workers, resumable.

The streaming executor (plan, block reads, windows, read-ahead, ``on_error``, resume) is
torch-free: :class:`tarindex.stream.StreamDataset`. This is that dataset as a torch
``IterableDataset``: rank from ``torch.distributed``, worker from ``get_worker_info``, and
batched output as :class:`~tarindex.torch.batch.BatchedSamples` in shared memory.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch.utils.data
from numpy.typing import NDArray

from ..stream.dataset import StreamDataset
from ..stream.images import PackedImages
from ..stream.pack import Packed
from ._dist import TORCH
from .batch import BatchedSamples
from .collate import tensor_alloc
from .images import ImageBatch

__all__ = ["TarIterableDataset"]


class TarIterableDataset(StreamDataset, torch.utils.data.IterableDataset[Any]):
    """Streaming dataset: sequential block reads, a deterministic shuffle, equal shares per rank.

    Per epoch the plan of :mod:`tarindex.plan.shuffle` is computed from ``(seed, epoch)`` alone, the
    same in every rank and worker: shards permuted, cut into blocks of ``block_size`` contiguous
    samples, blocks permuted and dealt to ``(rank, worker)``, samples mixed in windows of
    ``buffer_size``. Each block (or the part of it in one window) is read with one sequential
    read of its byte range; over local mapped shards a window's samples are instead copied out
    of the mappings a few at a time as they are yielded (see ``buffer_size``).

    Samples are dicts like :class:`TarDataset`'s: ``__key__`` (str), ``__shard__`` (path),
    ``__index__`` (int, global index) and one entry per extension (``bytes`` unless decoded).
    Threads may each iterate their own ``iter(ds)`` at once: each plays its own epoch (the
    next, as a second ``iter`` in one thread would) over the shared readers;
    :meth:`state_dict` then describes the iterator started last (docs/READING.md, "Threads").

    **Batched output.** With ``batched=True, batch_size=B`` each item is a
    :class:`~tarindex.torch.collate.BatchedSamples` of ``B`` consecutive samples of a worker's
    yield order, packed straight from the block reads into one buffer (shared memory in a
    worker); use ``DataLoader(ds, batch_size=None)``. The rank yields the same samples as
    without ``batched``, cut into ``ceil(len / B)`` batches that are dealt whole to the
    workers, so only the rank's last batch is short and ``len(ds)`` is the number of batches
    (:attr:`num_batches`; :attr:`num_samples` is the sample count), independent of
    ``num_workers`` and equal on every rank. See docs/STREAMING.md, "Batched output".

    **Counts.** Rank ``r`` yields ``len(ds)`` samples per epoch, the same on every rank:
    ``ceil(n / world_size)`` with ``drop_last=False`` (the first ``world_size * len - n``
    samples of the epoch's plan are yielded a second time, by the last rank(s)), or
    ``n // world_size`` with ``drop_last=True`` (``n mod world_size`` samples of the plan are
    not yielded this epoch). When ``world_size`` divides ``n`` every sample is yielded exactly
    once either way. Within a rank, worker ``w`` of ``W`` yields ``len // W`` or one more
    (the first ``len % W`` workers), the same on every rank, so every rank also yields the
    same number of batches.

    **Order with ``shuffle=False``.** Rank ``r`` reads samples ``[r * len, (r + 1) * len)`` of
    the stored order (shard by shard, source order); worker ``w`` reads a contiguous part of
    that, starting at ``r * len + sum of the earlier workers' counts``. A ``DataLoader`` takes
    whole batches from the workers in turn, so with ``W`` workers and batch size ``b`` the
    batches are: samples ``0..b-1`` of worker 0, samples ``0..b-1`` of worker 1, ...,
    samples ``b..2b-1`` of worker 0, and so on; with ``num_workers=0`` (or 1) it is the stored
    order itself.

    **Epochs.** Each ``__iter__`` plays epoch ``e + k``, where ``e`` is the last
    :meth:`set_epoch` value (``0`` initially) and ``k`` the number of ``__iter__`` calls on
    this object since. So calling ``set_epoch(epoch)`` before each epoch works in-process and
    with fresh workers (the dataset is copied to them when the loader's iterator is created),
    and persistent workers, which never see a later ``set_epoch``, still advance one epoch
    per ``iter(loader)``. With non-persistent workers call ``set_epoch`` every epoch: each
    epoch's workers get a fresh copy, so without it every epoch would replay epoch ``e``.

    **Resume.** :meth:`state_dict` is ``O(1)``: seed, epoch, the samples this process
    (worker) has consumed this epoch, and the plan parameters. After
    :meth:`load_state_dict`, the next ``__iter__`` yields exactly what the interrupted epoch
    would have yielded next. With workers, use ``torchdata``'s ``StatefulDataLoader``, which
    saves and restores each worker's state through these two methods.

    **Ranks.** ``rank``/``world_size`` if given, else ``torch.distributed`` if initialised,
    resolved in the parent process (at construction, ``len()``, ``__iter__`` or when pickled
    to a worker), never in a worker where a spawned process group is not initialised.

    Args:
        source: Path, list, brace pattern, glob or directory of ``*.tar`` shards with indexes,
            or a dataset manifest (``data.json``: opens with one read), or a ready
            :class:`tarindex.ShardSet` (read through as it is, with its own ``options`` and
            ``remote``, which must then be left out).
        shuffle: Shuffle shards, blocks and samples. Defaults to ``True``.
        seed: Base seed, ``0 <= seed < 2**64``. Defaults to ``0``.
        block_size: Contiguous samples per block (one read each). Larger reads faster,
            mixes less. Defaults to ``64``.
        buffer_size: Samples mixed together (a window per worker); ``<= 1`` yields each
            worker's blocks in plan order. Defaults to ``1024``. Over local mapped shards the
            window holds 8 bytes per sample and copies ~256 KB of samples out at a time as
            they are yielded; otherwise (pread, remote, ``fields=``, ``subset=``,
            ``on_error="skip"``) it holds its samples' bytes (docs/STREAMING.md).
        decode: ``None`` (bytes), an image spec (``"rgb8"``, ``"rgb"``, ``"torchrgb8"``,
            ``"pil"``, ...), a handler ``f(key, data)``, a dict ``{ext: f(data)}``, a list of
            those, or a sample function, as for :class:`TarDataset`.
        transform: Called on each (decoded, selected) sample; its result is yielded.
        fields: Extensions to read, e.g. ``("cls",)`` or just ``"cls"`` (a bare string is one
            field); the others are left out of every sample and their bytes are not read (a
            label-only pass reads no image bytes).
            Defaults to ``None`` (all).
        select: Yield tuples, webdataset's ``to_tuple``: ``tarindex.to_tuple("jpg;png",
            "json")`` or ``("jpg;png", "json")``, as for :class:`TarDataset` (reads only the
            members it names; a missing field raises :class:`tarindex.errors.MissingFieldError`,
            which ``on_error="skip"`` warns about and skips). Defaults to ``None``.
        rank: This process's rank (with ``world_size``). Defaults to ``torch.distributed``'s.
        world_size: Number of ranks. Defaults to ``torch.distributed``'s, else ``1``.
        drop_last: Remainder policy, see **Counts**. Defaults to ``False`` (pad by repeating).
        on_error: ``"raise"`` or ``"skip"``. ``"skip"`` warns and skips a block that cannot be
            read or a sample whose decode or transform raises; skipped samples are not replaced,
            so that rank yields fewer than ``len(ds)`` and DDP may wait at the end of an epoch.
            Defaults to ``"raise"``.
        allow_pickle: Unpickle ``pickle``/``pyd`` members when decoding. Defaults to ``False``.
        options: How the shards are opened, bounded and checked: a
            :class:`tarindex.OpenOptions` (``max_open``, ``use_mmap``: ``False`` reads each
            block with one ``os.pread``, ``check_crc``, ``verify_data``, ``index_dir``; each
            documented there). Defaults to ``OpenOptions()``.
        remote: How URL shards are read (:class:`tarindex.RemoteOptions`). Over remote
            shards each block is one ranged read, and the next blocks of the plan are read
            ahead in background threads within ``readahead_bytes``. Defaults to
            ``RemoteOptions()``.
        batched: Yield one ``BatchedSamples`` per ``batch_size`` samples instead of sample
            dicts (see **Batched output**). Raw bytes, or with
            ``decode=tarindex.ImageDecode(...)`` (alone) one
            :class:`~tarindex.torch.images.ImageBatch` per batch: the images decoded in the
            worker straight into one ``uint8 (B, 3, H, W)`` shared-memory tensor, the pixels
            the same spec gives per sample (docs/DECODING.md). Not with ``transform``,
            ``select`` or other decoders.
            Defaults to ``False``.
        batch_size: Samples per batch, ``>= 1``; only with ``batched=True``. A state saved
            with one ``batch_size`` resumes only with the same one.
        int_fields: With ``batched=True``, extensions parsed into ``int64`` columns
            (``batch.ints(ext)``) instead of stored as bytes (a bare string is one). Defaults
            to ``("cls",)``.
        subset: Global sample indices of the source: stream just those samples (a split,
            :func:`tarindex.split_by_key`). The plan is made over the subset's per-shard
            counts, so the counts, remainder policy and exactly-once rules above hold for
            the subset; each block reads only the subset's members; ``__index__`` is the
            source index; ``plan(...).order(ds.shards.starts)`` gives positions in the
            subset (``ds.shards.indices[order]`` the source indices). A state saved with one
            subset resumes only with the same one. Defaults to ``None`` (all samples).
        env: Where rank, world size and worker come from. Defaults to ``torch.distributed``
            and ``get_worker_info`` (:data:`tarindex.torch._dist.TORCH`).

    Raises:
        FileNotFoundError: Nothing matches ``source``.
        IndexMissingError: A shard has no index and ``OpenOptions(index="require")`` (the
            message says how to build it; by default a missing index is built).
        ValueError: A ``block_size``, ``buffer_size``, ``batch_size``, ``seed``, ``rank`` or
            ``world_size`` that is not an integer in range (``2.5`` is refused, not
            truncated); a bad ``on_error``; a ``fields`` entry that is not a ``str``;
            ``options`` or ``remote`` together with a ready ``ShardSet``;
            ``batched=True`` with ``transform``/``select``, a ``decode`` other than an
            ``ImageDecode``, or without a
            ``batch_size >= 1``; ``select`` with ``fields``;
            ``batch_size`` without ``batched=True``.
        FormatError, StaleIndexError, ChecksumError, TruncatedError: While iterating, as for
            :class:`TarDataset` (``on_error="skip"`` warns and skips the block instead).
        DecodeError: While iterating, a member that cannot be decoded or exceeds a decode
            bound (``on_error="skip"`` warns and skips the sample).
        RuntimeError: From ``len()`` or ``__iter__``: ``WORLD_SIZE > 1`` in the environment but
            no rank could be resolved (see :func:`tarindex.stream.epochs.require_rank`).
    """

    default_env = TORCH

    def _alloc(self, nbytes: int) -> tuple[Any, NDArray[np.uint8]]:
        return tensor_alloc(nbytes)  # shared memory inside a DataLoader worker

    def _wrap_batch(self, packed: Packed) -> BatchedSamples:
        return BatchedSamples(*packed)

    def _wrap_images(self, packed: PackedImages) -> ImageBatch:
        assert self.image_spec is not None
        return ImageBatch(packed, self.image_spec)
