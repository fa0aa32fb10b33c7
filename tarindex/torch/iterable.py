"""TarIterableDataset: streaming over indexed tar shards, split over ranks and workers, resumable.

The epoch plan (which blocks each rank and worker reads, in which order) comes from the pure
functions of :mod:`tarindex.shuffle`; this module only resolves rank and worker, reads each
planned block as one sequential byte range, and yields its samples.
"""

from __future__ import annotations

import os
import warnings
import zlib
from collections import deque
from collections.abc import Callable, Collection, Iterator, Sequence
from itertools import chain, repeat
from typing import Any, cast

import numpy as np
import torch.utils.data
from numpy.typing import NDArray

from ..codecs.decode import DecodeSpec, make_decoder
from ..codecs.select import ToTuple, select_fields
from ..plan import shuffle as plan_mod
from ..read import Block, Sample, ShardSet
from ..read.sources import Source
from ..read.split import ShardSubset
from ..storage.remote import RemoteOptions
from ._dist import StreamEpochOwner
from .collate import INT_FIELDS, BatchedSamples, pack_blocks
from .dataset import decode_sample

__all__ = ["TarIterableDataset"]

_STATE_VERSION = 1
# A shuffle window's samples are copied out (ShardSet.take) a few at a time as they are yielded:
# at most _TAKE of them, and about _TAKE_BYTES of them. A consumer frees each sample before the
# next, so a take's bytes are freed in one run. Runs of several MB went back to the system
# (glibc trims the top of its heap) and faulted in again at the next take: 1024 samples of
# 100 KB streamed at 27k/s held in a window, 68k/s taken 256 KB at a time (benchmarks/README).
_TAKE = 256
_TAKE_BYTES = 256 << 10
_PLAN_KEYS = (
    "block_size",
    "buffer_size",
    "shuffle",
    "drop_last",
    "n_samples",
    "world_size",
    "rank",
    "batch_size",
    "subset",
)


class TarIterableDataset(StreamEpochOwner, torch.utils.data.IterableDataset[Any]):
    """Streaming dataset: sequential block reads, a deterministic shuffle, equal shares per rank.

    Per epoch the plan of :mod:`tarindex.shuffle` is computed from ``(seed, epoch)`` alone, the
    same in every rank and worker: shards permuted, cut into blocks of ``block_size`` contiguous
    samples, blocks permuted and dealt to ``(rank, worker)``, samples mixed in windows of
    ``buffer_size``. Each block (or the part of it in one window) is read with one sequential
    read of its byte range; over local mapped shards a window's samples are instead copied out
    of the mappings a few at a time as they are yielded (see ``buffer_size``).

    Samples are dicts like :class:`TarDataset`'s: ``__key__`` (str), ``__shard__`` (path),
    ``__index__`` (int, global index) and one entry per extension (``bytes`` unless decoded).

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
            or a dataset manifest (``data.json``: opens with one read).
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
        fields: Extensions to read, e.g. ``("cls",)``; the others are left out of every
            sample and their bytes are not read (a label-only pass reads no image bytes).
            Defaults to ``None`` (all).
        select: Yield tuples, webdataset's ``to_tuple``: ``tarindex.to_tuple("jpg;png",
            "json")`` or ``("jpg;png", "json")``, as for :class:`TarDataset` (reads only the
            members it names; a missing field raises :class:`tarindex.MissingFieldError`,
            which ``on_error="skip"`` warns about and skips). Defaults to ``None``.
        rank: This process's rank (with ``world_size``). Defaults to ``torch.distributed``'s.
        world_size: Number of ranks. Defaults to ``torch.distributed``'s, else ``1``.
        drop_last: Remainder policy, see **Counts**. Defaults to ``False`` (pad by repeating).
        on_error: ``"raise"`` or ``"skip"``. ``"skip"`` warns and skips a block that cannot be
            read or a sample whose decode or transform raises; skipped samples are not replaced,
            so that rank yields fewer than ``len(ds)`` and DDP may wait at the end of an epoch.
            Defaults to ``"raise"``.
        allow_pickle: Unpickle ``pickle``/``pyd`` members when decoding. Defaults to ``False``.
        max_open: Open shards per process at most (lowered to fit the descriptor limit,
            see :class:`tarindex.ShardSet`). Defaults to ``48``.
        use_mmap: Map the tars and slice each member straight from the mapping (one copy
            per byte). Defaults to ``True``. ``False`` reads each block with one ``os.pread``
            and slices members out of that buffer (two copies, ~0.75x the rate on ~20 KB
            samples, warm cache) but cannot die of SIGBUS if a tar is cut while open.
        check_crc: Check each index's crc32 when its shard is first opened in a process
            (about 1 ms per MB of index); ``False`` for huge indexes ``verify`` has checked.
            Defaults to ``True``.
        verify_data: Check every member read against the crc32 its index records
            (``ChecksumError`` naming shard, key, extension and byte offset); needs indexes
            with checksums (the writer's, or ``tarindex index --checksums``). Defaults to
            ``False``.
        index_dir: Where the indexes are, if not beside the tars (see
            :class:`tarindex.ShardSet`). Defaults to ``None``.
        remote: How URL shards are read (:class:`tarindex.RemoteOptions`). Over remote
            shards each block is one ranged read, and the next blocks of the plan are read
            ahead in background threads within ``readahead_bytes``. Defaults to
            ``RemoteOptions()``.
        batched: Yield one ``BatchedSamples`` per ``batch_size`` samples instead of sample
            dicts (see **Batched output**). Raw bytes only: not with ``decode``/``transform``.
            Defaults to ``False``.
        batch_size: Samples per batch, ``>= 1``; only with ``batched=True``. A state saved
            with one ``batch_size`` resumes only with the same one.
        int_fields: With ``batched=True``, extensions parsed into ``int64`` columns
            (``batch.ints(ext)``) instead of stored as bytes. Defaults to ``("cls",)``.
        subset: Global sample indices of the source: stream just those samples (a split,
            :func:`tarindex.split_by_key`). The plan is made over the subset's per-shard
            counts, so the counts, remainder policy and exactly-once rules above hold for
            the subset; each block reads only the subset's members; ``__index__`` is the
            source index; ``plan(...).order(ds.shards.starts)`` gives positions in the
            subset (``ds.shards.indices[order]`` the source indices). A state saved with one
            subset resumes only with the same one. Defaults to ``None`` (all samples).

    Raises:
        FileNotFoundError: Nothing matches ``source``.
        IndexMissingError: A shard has no index (the message says how to build it).
        ValueError: Bad ``block_size``, ``seed``, ``on_error``, ``rank``/``world_size``;
            ``batched=True`` with ``decode``/``transform``/``select`` or without a
            ``batch_size >= 1``; ``select`` with ``fields``;
            ``batch_size`` without ``batched=True``.
        FormatError, StaleIndexError, ChecksumError, TruncatedError: While iterating, as for
            :class:`TarDataset` (``on_error="skip"`` warns and skips the block instead).
        DecodeError: While iterating, a member that cannot be decoded or exceeds a decode
            bound (``on_error="skip"`` warns and skips the sample).
        RuntimeError: From ``len()`` or ``__iter__``: ``WORLD_SIZE > 1`` in the environment but
            no rank could be resolved (see :func:`tarindex.torch._dist.require_rank`).
    """

    def __init__(
        self,
        source: Source,
        *,
        shuffle: bool = True,
        seed: int = 0,
        block_size: int = 64,
        buffer_size: int = 1024,
        decode: DecodeSpec = None,
        transform: Callable[[Sample], Any] | None = None,
        fields: Collection[str] | None = None,
        select: ToTuple | str | Sequence[str] | None = None,
        rank: int | None = None,
        world_size: int | None = None,
        drop_last: bool = False,
        on_error: str = "raise",
        allow_pickle: bool = False,
        max_open: int | None = None,
        use_mmap: bool = True,
        check_crc: bool = True,
        verify_data: bool = False,
        batched: bool = False,
        index_dir: str | None = None,
        remote: RemoteOptions | None = None,
        batch_size: int | None = None,
        int_fields: Sequence[str] = INT_FIELDS,
        subset: Sequence[int] | NDArray[np.integer[Any]] | None = None,
    ) -> None:
        if int(block_size) < 1:
            raise ValueError(f"block_size={block_size!r}: expected an integer >= 1")
        if on_error not in ("raise", "skip"):
            raise ValueError(f"on_error={on_error!r}: expected 'raise' or 'skip'")
        plan_mod.make_rng(seed, 0, 0)  # validates seed
        self.shards = ShardSet(
            source,
            max_open=max_open,
            use_mmap=use_mmap,
            check_crc=check_crc,
            verify_data=verify_data,
            index_dir=index_dir,
            remote=remote,
        )
        self._subset_crc: int | None = None
        if subset is not None:  # plans, counts and resume over just these samples
            view = ShardSubset(self.shards, subset)
            self.shards = view
            self._subset_crc = zlib.crc32(view.indices.tobytes())
        self.shuffle = bool(shuffle)
        self.seed = int(seed)
        self.block_size = int(block_size)
        self.buffer_size = max(int(buffer_size), 0)
        self.decoder = make_decoder(decode, allow_pickle)
        self.transform = transform
        self.select, fields = select_fields(select, fields)
        if batched:
            if self.decoder is not None or transform is not None or self.select is not None:
                raise ValueError(
                    "TarIterableDataset(batched=True) yields raw bytes: drop "
                    "decode/transform/select (decode the BatchedSamples in the training loop; "
                    "fields= projects the read)"
                )
            if batch_size is None or int(batch_size) < 1:
                raise ValueError(
                    f"batch_size={batch_size!r}: batched=True needs an integer batch_size >= 1"
                )
        elif batch_size is not None:
            raise ValueError(
                f"batch_size={batch_size!r} without batched=True: pass batched=True for "
                f"BatchedSamples, or batch per-sample dicts with DataLoader(batch_size=...)"
            )
        self.batched = bool(batched)
        self.batch_size: int | None = int(batch_size) if batched else None  # type: ignore[arg-type]
        self.int_fields = tuple(int_fields)
        self.fields = None if fields is None else tuple(fields)
        self.drop_last = bool(drop_last)
        self.on_error = on_error
        self._init_epochs(rank, world_size, "TarIterableDataset")
        self._blocks_cache: tuple[int, NDArray[np.int64]] | None = None

    # -- ranks, sizes (epoch, set_epoch: StreamEpochOwner) ----------------------------------------
    @property
    def rank(self) -> int:
        """This process's rank (resolved on first use)."""
        return self._rank()[0]

    @property
    def world_size(self) -> int:
        """Number of ranks (resolved on first use)."""
        return self._rank()[1]

    @property
    def n_samples(self) -> int:
        """Samples in all shards (before splitting over ranks)."""
        return len(self.shards)

    @property
    def num_samples(self) -> int:
        """Samples this rank yields per epoch (all its workers together); equal on every rank.

        Raises:
            RuntimeError: If the rank cannot be resolved (see the class docstring).
        """
        return plan_mod.rank_share(len(self.shards), self._rank()[1], self.drop_last)

    @property
    def num_batches(self) -> int:
        """With ``batched=True``: batches this rank yields per epoch, equal on every rank.

        ``ceil(num_samples / batch_size)``, whatever ``num_workers``.

        Raises:
            ValueError: If the dataset is not batched.
            RuntimeError: If the rank cannot be resolved.
        """
        if self.batch_size is None:
            raise ValueError("num_batches: this dataset yields samples (batched=False)")
        return -(-self.num_samples // self.batch_size)

    def __len__(self) -> int:
        """What one epoch of this rank yields, in items: samples, or batches when batched.

        :attr:`num_samples`, or with ``batched=True`` :attr:`num_batches` (so
        ``len(DataLoader(ds, batch_size=None))`` is the number of batches).

        Raises:
            RuntimeError: If the rank cannot be resolved (see the class docstring).
        """
        return self.num_batches if self.batch_size is not None else self.num_samples

    def _epoch_blocks(self, epoch: int) -> NDArray[np.int64]:
        c = self._blocks_cache
        if c is not None and c[0] == epoch:
            return c[1]
        blocks = plan_mod.epoch_blocks(
            self.shards.counts, self.seed, epoch, self.block_size, self.shuffle
        )
        self._blocks_cache = (epoch, blocks)
        return blocks

    def plan(self, epoch: int, worker: int = 0, num_workers: int = 1) -> plan_mod.WorkerPlan:
        """Return the plan of ``epoch`` for this rank's worker ``worker`` of ``num_workers``.

        Computed from the indexes' sample counts only (no data read); see
        :func:`tarindex.shuffle.plan_worker`. ``plan(...).order(ds.shards.starts)`` lists the
        global indices in the order that worker yields them.
        """
        rank, ws = self._rank()
        return plan_mod.plan_worker(
            self.shards.counts,
            self.seed,
            epoch,
            self.block_size,
            rank,
            ws,
            worker,
            num_workers,
            buffer_size=self.buffer_size,
            shuffle=self.shuffle,
            drop_last=self.drop_last,
            blocks=self._epoch_blocks(epoch),
            batch_size=self.batch_size,
        )

    # -- state ------------------------------------------------------------------------------
    def _plan_params(self) -> dict[str, Any]:
        rank, ws = self._rank()
        return {
            "block_size": self.block_size,
            "buffer_size": self.buffer_size,
            "shuffle": self.shuffle,
            "drop_last": self.drop_last,
            "n_samples": len(self.shards),
            "world_size": ws,
            "rank": rank,
            "batch_size": self.batch_size,
            "subset": self._subset_crc,
        }

    def state_dict(self) -> dict[str, Any]:
        """Return where this process is in the epoch, in ``O(1)`` (a few ints).

        Returns:
            ``{"version", "seed", "epoch", "consumed", "worker", "num_workers", "block_size",
            "buffer_size", "shuffle", "drop_last", "n_samples", "world_size", "rank",
            "batch_size"}``: ``consumed`` is the number of plan positions (samples, also with
            ``batched=True``) this worker has passed in ``epoch`` (yielded or skipped);
            ``batch_size`` is ``None`` unless batched. Before any iteration it describes the
            next epoch at 0; a loaded but not yet consumed state is returned as loaded.
        """
        return self._worker_state(_STATE_VERSION)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume from :meth:`state_dict`: the next ``__iter__`` continues that epoch once.

        The seed is taken from the state; later epochs follow from it (the ``__iter__`` after
        the resumed one plays ``epoch + 1``).

        Raises:
            ValueError: If the state has an unknown version or was taken with different plan
                parameters (block or buffer size, shuffle, drop_last, sample count, rank or
                world size, batch size): resuming would not be exact. The message names the
                field. A state without ``batch_size`` (saved before it existed) counts as
                unbatched.
        """
        if state.get("version") != _STATE_VERSION:
            raise ValueError(
                f"state version {state.get('version')!r}: this tarindex reads version "
                f"{_STATE_VERSION}; save the state again with this version"
            )
        mine = self._plan_params()
        if state.get("world_size") != mine["world_size"]:
            raise ValueError(
                f"state saved with world_size={state.get('world_size')!r}, this run has "
                f"world_size={mine['world_size']!r}: a streaming state resumes only on the same "
                "rank of the same world size (each worker's state covers its own part of the "
                "plan). Resume on the old world size, start the next epoch "
                "(set_epoch(state['epoch'] + 1)) on the new one, or use the map-style "
                "TarDataset with BlockSampler, which deals what is left over a new world size"
            )
        for k in _PLAN_KEYS:
            if state.get(k) != mine[k]:
                raise ValueError(
                    f"state {k}={state.get(k)!r} but this dataset has {k}={mine[k]!r}: resuming "
                    f"would not replay the same plan; construct the dataset with the same "
                    f"{k} (and shards) as the one that saved the state"
                )
        self._loaded = dict(state)
        self.seed = int(state["seed"])
        self._blocks_cache = None

    # -- iteration --------------------------------------------------------------------------
    def __iter__(self) -> Iterator[Any]:
        """Start (or resume) an epoch; see the class docstring for which epoch.

        Raises:
            RuntimeError: If the rank cannot be resolved.
            ValueError: If a loaded state came from a different worker layout.
        """
        worker, nw, epoch, start = self._re.begin_iter(self._loaded)
        self._loaded = None  # a loaded state is consumed by one __iter__
        p = self.plan(epoch, worker, nw)
        self._active = {"epoch": epoch, "worker": worker, "num_workers": nw}
        self._consumed = min(start, p.n_samples)
        if self.batch_size is not None:
            return self._generate_batched(p, self._consumed)
        return self._generate(p, self._consumed)

    def _generate(self, p: plan_mod.WorkerPlan, start: int) -> Iterator[Any]:
        finish = self._finish
        plain = self.decoder is None and self.transform is None and self.select is None
        pos = start
        for smp in self._stream(p, start):
            pos += 1
            self._consumed = pos
            if smp is None:  # unreadable, skipped (on_error="skip")
                continue
            if plain:
                yield smp
                continue
            out = finish(smp)
            if out is not _SKIP:
                yield out

    def iter_plan(
        self,
        p: plan_mod.WorkerPlan,
        start: int = 0,
        stop: int | None = None,
        *,
        skipped: Any = None,
        tag: tuple[str, Any] | None = None,
    ) -> Iterator[Any]:
        """Yield plan positions ``[start, stop)`` of ``p`` in yield order, decoded and transformed.

        The hook through which :class:`tarindex.torch.mix.MixedDataset` reads a source: exactly
        one item per position, ``skipped`` in place of a sample left out under
        ``on_error="skip"``. Does not touch this dataset's epoch or resume state. Without
        decode, transform, ``on_error="skip"`` or ``tag`` it returns the kernel's parts
        flattened by ``itertools.chain`` (no Python frame per sample).

        Args:
            p: A plan of this dataset's shards (:meth:`plan` or
                :func:`tarindex.shuffle.plan_worker` over ``shards.counts``).
            start: First position, ``0 <= start <= p.n_samples``. Defaults to ``0``.
            stop: End position. Defaults to ``p.n_samples``.
            skipped: Yielded for a skipped sample. Defaults to ``None``.
            tag: ``(key, value)`` set in every sample dict before decoding. Defaults to none.
        """
        if self.decoder is None and self.transform is None and self.on_error == "raise":
            if tag is None:  # errors raise, so never a None: the kernel's parts, flattened in C
                return chain.from_iterable(self._parts(p, start, stop))
        return self._finished(self._stream(p, start, stop), skipped, tag)

    def _finished(
        self, raw: Iterator[Sample | None], skipped: Any, tag: tuple[str, Any] | None
    ) -> Iterator[Any]:
        finish = self._finish
        plain = self.decoder is None and self.transform is None
        for smp in raw:
            if smp is None:
                yield skipped
                continue
            if tag is not None:
                smp[tag[0]] = tag[1]
            if plain:
                yield smp
                continue
            out = finish(smp)
            yield skipped if out is _SKIP else out

    def _stream(
        self, p: plan_mod.WorkerPlan, start: int, stop: int | None = None
    ) -> Iterator[Sample | None]:
        """This worker's raw samples of plan positions ``[start, stop)``, in yield order.

        Without mixing, block by block in plan order; with mixing, window by window (at most
        ``buffer_size`` samples held), each in its seeded order. ``None`` marks a sample whose
        block could not be read under ``on_error="skip"``. The samples of :meth:`_parts`, one
        after another.
        """
        for part in self._parts(p, start, stop):
            yield from part

    def _parts(
        self, p: plan_mod.WorkerPlan, start: int, stop: int | None = None
    ) -> Iterator[Iterator[Sample | None]]:
        """:meth:`_stream` as one iterator per block (or window): ``chain`` them to flatten.

        A part is read when it is asked for, and each part lets a sample go as it yields it
        (the consumer decodes it in place, and a decoded block or window held here would keep
        every decoded image of it alive); its per-sample step is C (``list.pop``), so a
        flattening ``itertools.chain`` adds no Python frame per sample.
        """
        end = p.n_samples if stop is None else min(int(stop), p.n_samples)
        if start >= end:
            return
        ra = _ReadAhead.over(self.shards, self.fields)
        try:
            if not (p.shuffle and p.buffer_size > 1):
                pieces = plan_mod.slice_blocks(p.segments, start, end).tolist()
                if ra is not None:
                    ra.add(pieces)
                for piece in pieces:
                    got = self._read_samples(piece, False, ra)
                    got.reverse()
                    yield map(got.pop, repeat(-1, len(got)))
                return
            w = p.buffer_size
            lean = self.on_error == "raise"  # a window's samples copied out as yielded
            k_end = (end - 1) // w + 1
            nxt = p.window(start // w)
            if ra is not None:
                ra.add(nxt[0].tolist())
            for k in range(start // w, k_end):
                pieces, perm = nxt
                if k + 1 < k_end:
                    nxt = p.window(k + 1)
                    if ra is not None:
                        ra.add(nxt[0].tolist())
                lo = start - k * w if start > k * w else 0
                plist = pieces.tolist()
                span = self.shards.take_ready(plist, self.fields) if lean else None
                if span is not None:
                    yield from self._taken(pieces, perm, lo, end - k * w, span)
                    continue
                buf: list[Sample | None] = []
                for piece in plist:  # each block is unpacked (and freed) at once
                    buf.extend(self._read_samples(piece, True, ra))
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
        self, pieces: NDArray[np.int64], perm: NDArray[np.int64] | None, lo: int, hi: int,
        span: int,
    ) -> Iterator[Iterator[Sample | None]]:
        """A window's positions ``[lo, hi)`` in its order, copied out a few at a time.

        The window holds the global indices of its samples (8 bytes each) instead of their
        bytes (``ShardSet.take_ready`` has opened and checked its blocks, ``span`` bytes of
        tar): each sample is made just before it is yielded, so it is still in the cache when
        the consumer drops it, and a window of large samples costs no memory. A take is
        ``_TAKE`` samples or ``_TAKE_BYTES`` of them, whichever is fewer (one at least).
        """
        idx = plan_mod.blocks_to_indices(pieces, self.shards.starts)
        order = (idx if perm is None else idx[perm])[lo:hi].tolist()
        step = max(1, min(_TAKE, _TAKE_BYTES * len(idx) // max(span, 1)))
        # each take checks its tars' sizes: the consumer runs between takes, and a tar cut
        # then would be read through its mapping by an unchecked take (SIGBUS)
        take = self.shards.take
        for c in range(0, len(order), step):
            got = take(order[c : c + step])
            got.reverse()
            yield map(got.pop, repeat(-1, len(got)))

    def _read1(
        self, piece: list[int], prefetch: bool, ra: _ReadAhead | None = None, *,
        samples: bool = False,
    ) -> Any:
        """Kernel read of a planned piece ``(shard, j0, j1)``; ``None`` if skipped.

        A :class:`Block`, or with ``samples`` its sample dicts (``ShardSet.read_samples``).
        ``ra`` (remote shards): the plan's next blocks are queued for read-ahead first.
        """
        s, j0, j1 = piece
        try:
            if ra is not None:
                ra.pump()
            if samples:
                return self.shards.read_samples(s, j0, j1, self.fields, prefetch=prefetch)
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
        self, piece: list[int], prefetch: bool, ra: _ReadAhead | None = None
    ) -> list[Sample | None]:
        """The piece's samples, or one ``None`` per sample if it was skipped."""
        got = self._read1(piece, prefetch, ra, samples=True)
        return [None] * (piece[2] - piece[1]) if got is None else cast("list[Sample | None]", got)

    def _read_window(
        self, pieces: NDArray[np.int64], prefetch: bool, ra: _ReadAhead | None = None
    ) -> list[Block | None]:
        """Kernel reads of a window's pieces, held until packed.

        Detached when they span more shards than may stay open, so descriptors stay within
        the bound.
        """
        detach = len(np.unique(pieces[:, 0])) > self.shards.open_bound
        out: list[Block | None] = []
        for piece in pieces.tolist():
            b = self._read1(piece, prefetch, ra)
            out.append(b.detach() if detach and b is not None else b)
        return out

    def _generate_batched(self, p: plan_mod.WorkerPlan, start: int) -> Iterator[BatchedSamples]:
        """Batches of ``batch_size`` consecutive positions of this worker's yield order.

        The batch grid is fixed at multiples of ``batch_size`` from the worker's first
        position; a resume at ``start`` off the grid yields ``[start, next multiple)`` first,
        then the uninterrupted batches. Members are copied once, from the kernel's source
        buffer into the batch buffer (:func:`~tarindex.torch.collate.pack_blocks`).
        """
        bsz, n = int(self.batch_size), p.n_samples  # type: ignore[arg-type]
        mixing = p.shuffle and p.buffer_size > 1
        w = p.buffer_size if mixing else bsz  # a window: mixed together (or one batch)
        # per window: its blocks joined into one, window position -> position in it (-1:
        # skipped under on_error="skip"), and the yield order
        wins: dict[int, tuple[Block | None, NDArray[np.int64], Any]] = {}
        ra = _ReadAhead.over(self.shards, self.fields)
        try:
            yield from self._batches(p, start, bsz, n, mixing, w, wins, ra)
        finally:
            if ra is not None:
                ra.close()

    def _batches(
        self,
        p: plan_mod.WorkerPlan,
        start: int,
        bsz: int,
        n: int,
        mixing: bool,
        w: int,
        wins: dict[int, tuple[Block | None, NDArray[np.int64], Any]],
        ra: _ReadAhead | None,
    ) -> Iterator[BatchedSamples]:
        pos = start
        while pos < n:
            end = min((pos // bsz + 1) * bsz, n)
            parts: list[tuple[Block, NDArray[np.int64] | None]] = []
            for k in range(pos // w, (end - 1) // w + 1):
                got = wins.get(k)
                if got is None:
                    got = wins[k] = self._window(p, k, w, mixing, ra)
                whole, at, perm = got
                a, b = max(pos, k * w) - k * w, min(end, (k + 1) * w) - k * w
                sel = at[perm[a:b]] if perm is not None else at[a:b]
                sel = sel[sel >= 0]
                if whole is not None and len(sel):
                    parts.append((whole, sel))
            for k in [k for k in wins if (k + 1) * w <= end]:
                del wins[k]
            pos = end
            self._consumed = pos
            if parts:
                yield pack_blocks(parts, None, self.int_fields)

    def _window(
        self,
        p: plan_mod.WorkerPlan,
        k: int,
        w: int,
        mixing: bool,
        ra: _ReadAhead | None = None,
    ) -> tuple[Block | None, NDArray[np.int64], Any]:
        """Read window ``k`` of the plan (``w`` positions) as one block.

        ``ra`` (remote shards): windows ``k`` and ``k + 1`` are queued for read-ahead.
        """

        def pieces_of(k: int) -> tuple[NDArray[np.int64], Any]:
            if mixing:
                return p.window(k)
            return plan_mod.slice_blocks(p.segments, k * w, min((k + 1) * w, p.n_samples)), None

        pieces, perm = ra.window(k, pieces_of, k < (p.n_samples - 1) // w) if ra else pieces_of(k)
        blocks = self._read_window(pieces, mixing, ra)
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

    def _decode(self, sample: Sample) -> Any:
        return decode_sample(self.shards, self.decoder, sample)  # type: ignore[arg-type]

    def _finish(self, sample: Sample) -> Any:
        try:
            out: Any = sample
            if self.select is not None:
                out = self.select(sample, None if self.decoder is None else self._decode)
            elif self.decoder is not None:
                out = decode_sample(self.shards, self.decoder, sample)
            if self.transform is not None:
                return self.transform(out)
            return out
        except Exception as e:
            where = f"{sample.get('__shard__')}: sample {sample.get('__key__')!r}"
            if self.on_error != "skip":
                if hasattr(e, "add_note"):
                    e.add_note(f"while decoding/transforming {where}")
                raise
            warnings.warn(
                f"{where}: skipped (on_error='skip'): {e!r}", RuntimeWarning, stacklevel=2
            )
            return _SKIP

    # -- pickling ---------------------------------------------------------------------------
    def __getstate__(self) -> dict[str, Any]:
        state = super().__getstate__()
        state["_blocks_cache"] = None
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)

    def __repr__(self) -> str:
        return (
            f"TarIterableDataset({self.shards.n_shards} shards, {len(self.shards)} samples, "
            f"shuffle={self.shuffle}, seed={self.seed}, block_size={self.block_size}, "
            f"buffer_size={self.buffer_size}"
            + (f", batch_size={self.batch_size}" if self.batch_size is not None else "")
            + f", pid={os.getpid()})"
        )


class _Skip:
    pass


_SKIP = _Skip()


class _ReadAhead:
    """The plan's blocks not read yet, queued to the shards' read-ahead (remote shards only).

    :meth:`pump` (before each block read) hands the queue's head to
    :meth:`~tarindex.read.reader.ShardSet.prefetch_blocks` until the per-process budget
    (``RemoteOptions.readahead_bytes``) is full; what was fetched ahead and not read is dropped
    by :meth:`close` (the iteration ended or was abandoned).
    """

    DEPTH = 256
    """Blocks looked at per pump at most."""

    def __init__(self, shards: ShardSet, fields: Sequence[str] | None) -> None:
        self.shards = shards
        self.fields = fields
        self.queue: deque[list[int]] = deque()
        self._windows: dict[int, tuple[NDArray[np.int64], Any]] = {}

    @classmethod
    def over(cls, shards: ShardSet, fields: Sequence[str] | None) -> _ReadAhead | None:
        """A read-ahead for ``shards``, or ``None`` if none is remote."""
        return cls(shards, fields) if shards.remote else None

    def add(self, pieces: list[list[int]]) -> None:
        """Append blocks ``(shard, j0, j1)``, in the order they will be read."""
        self.queue.extend(pieces)

    def window(
        self,
        k: int,
        pieces_of: Callable[[int], tuple[NDArray[np.int64], Any]],
        has_next: bool,
    ) -> tuple[NDArray[np.int64], Any]:
        """Window ``k``'s pieces (planned once), queueing it and window ``k + 1``."""
        for q in (k, k + 1) if has_next else (k,):
            if q not in self._windows:
                self._windows[q] = pieces_of(q)
                self.add(self._windows[q][0].tolist())
        for q in [q for q in self._windows if q < k]:
            del self._windows[q]
        return self._windows[k]

    def pump(self) -> None:
        """Queue the next blocks for background reads while the budget has room."""
        q = self.queue
        if not q:
            return
        head = [q[i] for i in range(min(len(q), self.DEPTH))]
        for _ in range(self.shards.prefetch_blocks(head, self.fields)):
            q.popleft()

    def close(self) -> None:
        """Drop what was fetched ahead and not read (frees the budget)."""
        self.queue.clear()
        self.shards.drop_prefetched()
