"""StreamDataset: the torch-free streaming dataset (plan, counts, epochs, resume, output).

Per epoch the plan of :mod:`tarindex.plan.shuffle` is computed from ``(seed, epoch)`` alone,
the same in every rank and worker; this class resolves which part of it this process plays
(rank, world size and worker through its :class:`~tarindex.stream.epochs.Env`), hands the
plan positions to the :class:`~tarindex.stream.executor.Executor`, finishes each sample
(decode, select, transform, ``on_error``) and keeps the resume counter.
``tarindex.TarIterableDataset`` is this class with torch's base class, ``get_worker_info``
and ``torch.distributed``; its docstring documents the behaviour and every argument.
"""

from __future__ import annotations

import os
import zlib
from collections.abc import Callable, Collection, Iterator, Sequence
from itertools import chain
from typing import Any

import numpy as np
from numpy.typing import NDArray

from ..codecs import DecodeSpec, ExtDecoder, make_decoder
from ..codecs.select import Selection, select_fields
from ..errors import DecodeError
from ..plan.checks import check_int, check_sizes, check_u64
from ..plan.epoch import WorkerPlan, batch_span, epoch_blocks, plan_worker, rank_share, slot_span
from ..plan.state import shard_layout
from ..read import Sample, ShardSet
from ..read.fields import check_fields
from ..read.options import OpenOptions
from ..read.sample_source import SampleSource
from ..read.sources import Source
from ..read.subset import ShardSubset
from ..storage.remote import RemoteOptions
from .epochs import Env, Layouts, Progress, StreamEpochOwner
from .executor import Executor
from .finish import SKIP, Finisher, check_on_error
from .images import PackedImages, decode_packed, decode_packed_skipping, image_spec
from .pack import INT_FIELDS, Alloc, Packed, numpy_alloc
from .shards import open_shards

__all__ = ["StreamDataset"]


class StreamDataset(StreamEpochOwner):
    """Streaming over indexed tar shards: sequential block reads, a deterministic shuffle.

    The behaviour, the counts and every argument are those of
    :class:`tarindex.TarIterableDataset` (which is this class over torch); this one needs no
    torch. ``source`` may also be a ready :class:`~tarindex.ShardSet` (its own ``options``
    and ``remote`` are used; passing either with it raises ``ValueError``). ``env`` says where rank,
    world size and worker come from: :data:`~tarindex.stream.epochs.LOCAL` (explicit
    ``rank``/``world_size`` or the environment; ``Env(worker, num_workers)`` plays one worker's
    share in this process). Batched output is :class:`~tarindex.stream.pack.Packed` batches
    in buffers from ``alloc``.

    Raises:
        ValueError, FileNotFoundError, IndexMissingError: As ``TarIterableDataset``.
    """

    def __init__(
        self,
        source: Source | ShardSet | ShardSubset,
        *,
        shuffle: bool = True,
        seed: int = 0,
        block_size: int = 64,
        buffer_size: int = 1024,
        decode: DecodeSpec = None,
        transform: Callable[[Sample], Any] | None = None,
        fields: Collection[str] | None = None,
        select: Selection | str | Sequence[str] | None = None,
        rank: int | None = None,
        world_size: int | None = None,
        drop_last: bool = False,
        on_error: str = "raise",
        allow_pickle: bool = False,
        options: OpenOptions | None = None,
        batched: bool = False,
        remote: RemoteOptions | None = None,
        batch_size: int | None = None,
        int_fields: Sequence[str] = INT_FIELDS,
        subset: Sequence[int] | NDArray[np.integer[Any]] | None = None,
        env: Env | None = None,
    ) -> None:
        block_size, buffer_size = check_sizes(block_size, buffer_size)
        check_on_error(on_error)
        seed = check_u64("seed", seed)
        fields = check_fields(fields)
        int_fields = check_fields(int_fields, "int_fields")
        opened = open_shards(source, options, remote)
        self.shards: SampleSource = opened
        self._subset_crc: int | None = None
        if subset is not None:  # plans, counts and resume over just these samples
            view = ShardSubset(opened, subset)
            self.shards = view
            self._subset_crc = zlib.crc32(view.indices.tobytes())
        self.shuffle = bool(shuffle)
        self.seed = seed
        self.block_size = block_size
        self.buffer_size = buffer_size
        self.decoder = make_decoder(decode, allow_pickle)
        self.transform = transform
        self.select, fields = select_fields(select, fields)
        self.image_spec = image_spec(self.decoder) if batched else None
        if batched:
            if (
                self.decoder is not None and self.image_spec is None
            ) or transform is not None or self.select is not None:
                raise ValueError(
                    f"{self._name}(batched=True) yields raw bytes: drop decode/transform/select "
                    "(decode the BatchedSamples in the training loop; fields= projects the "
                    "read), or decode=tarindex.ImageDecode(...) alone for one image tensor "
                    "per batch"
                )
            if batch_size is None:
                raise ValueError("batch_size=None: batched=True needs an integer batch_size >= 1")
            batch_size = check_int("batch_size", batch_size, 1)
        elif batch_size is not None:
            raise ValueError(
                f"batch_size={batch_size!r} without batched=True: pass batched=True for "
                f"BatchedSamples, or batch per-sample dicts with DataLoader(batch_size=...)"
            )
        self.batched = bool(batched)
        self.batch_size: int | None = batch_size if batched else None
        self.int_fields: tuple[str, ...] = int_fields
        self.fields = None if fields is None else tuple(fields)
        self.drop_last = bool(drop_last)
        self.on_error = on_error
        self.finisher = Finisher(self.shards, self.decoder, self.select, self.transform)
        self.executor = Executor(self.shards, self.fields, on_error)
        self._init_epochs(rank, world_size, self._name, env)
        self._blocks_cache: tuple[int, NDArray[np.int64]] | None = None

    @property
    def _name(self) -> str:
        return type(self).__name__

    # -- ranks, sizes (epoch, set_epoch: StreamEpochOwner) ------------------------------------
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
        return rank_share(len(self.shards), self._rank()[1], self.drop_last)

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
        blocks = epoch_blocks(
            self.shards.counts, self.seed, epoch, self.block_size, self.shuffle
        )
        self._blocks_cache = (epoch, blocks)
        return blocks

    def plan(self, epoch: int, worker: int = 0, num_workers: int = 1) -> WorkerPlan:
        """Return the plan of ``epoch`` for this rank's worker ``worker`` of ``num_workers``.

        Computed from the indexes' sample counts only (no data read); see
        :func:`tarindex.shuffle.plan_worker`. ``plan(...).order(ds.shards.starts)`` lists the
        global indices in the order that worker yields them.
        """
        rank, ws = self._rank()
        return plan_worker(
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

    # -- state --------------------------------------------------------------------------------
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

    def _layouts(self) -> Layouts:
        return [shard_layout(self.shards.counts)], [self.shuffle], [len(self.shards)], False

    def _share(self, worker: int, num_workers: int) -> int:
        rank, ws = self._rank()
        n = len(self.shards)
        if self.batch_size is None:
            a, b = slot_span(n, rank, ws, worker, num_workers, self.drop_last)
        else:
            a, b = batch_span(n, rank, ws, worker, num_workers, self.batch_size, self.drop_last)
        return b - a

    def state_dict(self) -> dict[str, Any]:
        """Return where this process is in the epoch, in ``O(1)`` (a few ints).

        Returns:
            ``{"version", "seed", "epoch", "consumed", "worker", "num_workers", "block_size",
            "buffer_size", "shuffle", "drop_last", "n_samples", "world_size", "rank",
            "batch_size", "subset", "layout"}``: ``consumed`` is the number of plan positions
            (samples, also with ``batched=True``) this worker has passed in ``epoch``
            (yielded or skipped); ``batch_size`` is ``None`` unless batched; ``subset`` the
            crc32 of the subset's indices or ``None``; ``layout`` the shards' ``[n_shards,
            crc32 of the per-shard counts]`` (:func:`tarindex.plan.state.shard_layout`).
            Before any iteration it describes the next epoch at 0; a loaded but not yet
            consumed state is returned as loaded. docs/STREAMING.md, "Resume".
        """
        return self._worker_state()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume from :meth:`state_dict`: the next ``__iter__`` continues that epoch once.

        The seed is taken from the state; later epochs follow from it (the ``__iter__`` after
        the resumed one plays ``epoch + 1``). Checked by
        :func:`tarindex.plan.state.check_state`; a version 1 state (saved before ``layout``
        existed) loads only with ``shuffle=False``, and one without ``batch_size`` or
        ``subset`` counts as unbatched over all samples.

        Raises:
            ValueError: Naming the field: not a state of this version (1 or 2) or missing
                keys (all named, with the keys expected); a field that is not an integer in
                range (``seed``, ``epoch``, ``consumed``, ``worker``, ...); another world size
                or rank; different plan parameters (block or buffer size, shuffle, drop_last,
                sample count, batch size, subset); with ``shuffle=True``, another shard layout
                (the same samples re-sharded: resuming would repeat some and skip others) or
                a version 1 state; ``consumed`` past what the saved worker plays this epoch.
        """
        self._load_worker_state(state, {"batch_size": None, "subset": None})
        self._blocks_cache = None

    # -- iteration ----------------------------------------------------------------------------
    def __iter__(self) -> Iterator[Any]:
        """Start (or resume) an epoch; see the class docstring for which epoch.

        Raises:
            RuntimeError: If the rank cannot be resolved.
            ValueError: If a loaded state came from a different worker layout.
        """
        worker, nw, epoch, start = self._re.begin_iter(self._loaded)
        self._loaded = None  # a loaded state is consumed by one __iter__
        if isinstance(self.decoder, ExtDecoder):  # ImageDecode draws per (seed, epoch, index)
            self.decoder.set_epoch(epoch)
        p = self.plan(epoch, worker, nw)
        # load_state_dict checked start against the plan
        self._active = act = Progress(epoch, start, worker, nw)
        if self.batch_size is not None:
            return self._generate_batched(p, act)
        return self._generate(p, act)

    def _generate(self, p: WorkerPlan, act: Progress) -> Iterator[Any]:
        finisher, on_error = self.finisher, self.on_error
        plain = finisher.plain
        pos = act.consumed
        for smp in self.executor.stream(p, pos):
            pos += 1
            act.consumed = pos
            if smp is None:  # unreadable, skipped (on_error="skip")
                continue
            if plain:
                yield smp
                continue
            out = finisher.guarded(smp, on_error)
            if out is not SKIP:
                yield out

    def _generate_batched(self, p: WorkerPlan, act: Progress) -> Iterator[Any]:
        wrap = self._wrap_batch if self.image_spec is None else self._images
        for b in self.executor.batches(
            p, act.consumed, int(self.batch_size), self.int_fields, self._raw_alloc(), act.passed  # type: ignore[arg-type]
        ):
            out = wrap(b)
            if out is not None:  # None: every sample skipped (on_error="skip")
                yield out

    def _raw_alloc(self) -> Alloc:
        """Raw batches: the batch's buffer, or the worker's own when images are made of them."""
        return numpy_alloc if self.image_spec is not None else self._alloc

    def _images(self, packed: Packed) -> Any:
        """A raw batch decoded into one image array (:mod:`tarindex.stream.images`)."""
        dec, spec = self.decoder, self.image_spec
        assert isinstance(dec, ExtDecoder) and spec is not None
        args = (packed, spec, dec.epoch, dec.max_image_pixels, self._alloc, self._alloc)
        try:
            got = decode_packed(*args)
        except DecodeError:
            if self.on_error != "skip":
                raise
            got = decode_packed_skipping(*args)  # the bad samples warned about, left out
            if not len(got.keys):
                return None  # every sample skipped: no batch
        return self._wrap_images(got)

    def _wrap_images(self, packed: PackedImages) -> Any:
        return packed

    def iter_batches(self, p: WorkerPlan, start: int = 0) -> Iterator[Any]:
        """With ``batched=True``: the batches of plan ``p`` from position ``start``, in order.

        What the worker of ``p`` yields (see the class docstring, "Batched output"), without
        touching this dataset's epoch or resume state.

        Raises:
            ValueError: If the dataset is not batched.
        """
        if self.batch_size is None:
            raise ValueError("iter_batches: this dataset yields samples (batched=False)")
        wrap = self._wrap_batch if self.image_spec is None else self._images
        if isinstance(self.decoder, ExtDecoder):
            self.decoder.set_epoch(p.epoch)
        got = map(
            wrap,
            self.executor.batches(p, start, self.batch_size, self.int_fields, self._raw_alloc()),
        )
        return (b for b in got if b is not None)  # None: every sample skipped

    # -- batch buffers (the torch layer puts them in shared memory) ---------------------------
    def _alloc(self, nbytes: int) -> tuple[Any, NDArray[np.uint8]]:
        return numpy_alloc(nbytes)

    def _wrap_batch(self, packed: Packed) -> Any:
        return packed

    def iter_plan(
        self,
        p: WorkerPlan,
        start: int = 0,
        stop: int | None = None,
        *,
        skipped: Any = None,
        tag: tuple[str, Any] | None = None,
    ) -> Iterator[Any]:
        """Yield plan positions ``[start, stop)`` of ``p`` in yield order, decoded and transformed.

        The hook through which :class:`~tarindex.stream.mix.MixedStream` reads a source: exactly
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
                return chain.from_iterable(self.executor.parts(p, start, stop))
        if isinstance(self.decoder, ExtDecoder):
            self.decoder.set_epoch(p.epoch)
        return self._finished(self.executor.stream(p, start, stop), skipped, tag)

    def _finished(
        self, raw: Iterator[Sample | None], skipped: Any, tag: tuple[str, Any] | None
    ) -> Iterator[Any]:
        finisher, on_error = self.finisher, self.on_error
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
            out = finisher.guarded(smp, on_error)
            yield skipped if out is SKIP else out

    # -- pickling -----------------------------------------------------------------------------
    def __getstate__(self) -> dict[str, Any]:
        state = super().__getstate__()
        state["_blocks_cache"] = None
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)

    def __repr__(self) -> str:
        return (
            f"{self._name}({self.shards.n_shards} shards, {len(self.shards)} samples, "
            f"shuffle={self.shuffle}, seed={self.seed}, block_size={self.block_size}, "
            f"buffer_size={self.buffer_size}"
            + (f", batch_size={self.batch_size}" if self.batch_size is not None else "")
            + f", pid={os.getpid()})"
        )
