"""Planned samplers, torch-free: which indices of a map-style dataset each rank draws.

:class:`PlanSampler` holds what every planned sampler shares (epochs, ranks, exact resume,
resuming on another world size); :class:`BlockPlanSampler` and :class:`MixPlanSampler` only
say which indices a rank takes in a fresh epoch. ``tarindex.BlockSampler`` and
``tarindex.MixSampler`` are these over torch's ``Sampler`` (their docstrings are these).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence, Sized
from typing import Any

import numpy as np
from numpy.typing import NDArray

from ..plan.checks import check_int, check_sizes, check_u64
from ..plan.epoch import plan_worker, rank_share, slot_span
from ..plan.mix import mix_counts, mix_schedule, source_seed
from ..plan.resume import resume_segments
from ..plan.state import STATE_VERSION, check_consumed, check_state, shard_layout
from .epochs import EpochOwner, Layouts, Progress
from .mix import source_spans

__all__ = ["PlanSampler", "BlockPlanSampler", "MixPlanSampler", "follow_plan", "shard_counts"]


class PlanSampler(EpochOwner):
    """Base of the planned samplers: epochs, ranks, ``state_dict`` and world-size changes.

    A subclass sets :attr:`n_plan` (positions in one epoch's plan over all ranks) and
    implements :meth:`rank_order` (the indices rank ``r`` of ``W`` yields in a fresh epoch, a
    pure function of seed and epoch) and :meth:`plan_params` (what must match to resume).

    **Resume.** :meth:`state_dict` is ``O(1)``: seed, epoch, ``consumed`` (indices this
    rank's iterator has yielded in that epoch), the world size and the plan parameters.
    After :meth:`load_state_dict` the next ``__iter__`` yields exactly the rest of that epoch
    and the one after plays ``epoch + 1``. Under DDP every rank draws the same number of
    indices (same batch size, same steps), so the state of any rank describes all of them:
    load one rank's state (e.g. rank 0's) into every rank.

    **Another world size.** Loading a state saved with ``W`` ranks into a sampler with
    ``W' != W`` ranks resumes exactly what is left: the indices the ``W`` ranks had not yet
    yielded this epoch (each rank's share after its first ``consumed``), in plan order, dealt
    over the ``W'`` ranks in equal contiguous shares with the sampler's remainder policy
    (:func:`tarindex.shuffle.resume_segments`): fewer than ``W'`` of them are repeated
    (``drop_last=False``) or left out (``drop_last=True``). That epoch, each rank yields its
    share of the rest (not ``len(sampler)``); the next epoch is a normal one on ``W'`` ranks.
    A state saved in such a resumed epoch records each change, so it may change again.
    """

    n_plan: int
    """Positions in one epoch's plan over all ranks (the ``n`` of the remainder policy)."""
    same_args = "dataset"
    """What else a state's sampler must have been built with (named when parameters differ)."""
    drop_last: bool
    """Remainder policy."""
    seed: int
    """Base seed."""

    def __init__(self, rank: int | None, world_size: int | None, what: str) -> None:
        self._init_epochs(rank, world_size, what)

    # -- to implement -----------------------------------------------------------------------
    def rank_order(self, epoch: int, rank: int, world_size: int) -> NDArray[np.int64]:
        """Return rank ``rank`` of ``world_size``'s indices of a fresh ``epoch``, in order.

        Returns:
            ``int64`` array of shape ``(rank_share(n_plan, world_size, drop_last),)``.
        """
        raise NotImplementedError

    def plan_params(self) -> dict[str, Any]:
        """Return the parameters a saved state must match (besides seed and world size)."""
        raise NotImplementedError

    def layouts(self) -> Layouts:
        """Return the sources' shard layouts, as :data:`tarindex.stream.epochs.Layouts`.

        Per source its :func:`~tarindex.plan.state.shard_layout`, whether its plan shuffles
        and its samples; and whether the state nests the layouts (one per source).
        """
        raise NotImplementedError

    # -- epochs and ranks (rank, epoch, set_epoch: EpochOwner) ------------------------------
    def __len__(self) -> int:
        """Indices this rank yields in a fresh epoch; the same on every rank."""
        return rank_share(self.n_plan, self._rank()[1], self.drop_last)

    def indices(self, epoch: int) -> NDArray[np.int64]:
        """Return this rank's indices for a fresh ``epoch``: ``int64`` of shape ``(len(self),)``."""
        rank, ws = self._rank()
        return self.rank_order(epoch, rank, ws)

    def planned_epochs(self) -> list[int]:
        """The epochs a copy of this sampler (in a DataLoader worker) may be drawn for next.

        The epoch being iterated, if any, then the next one and the one after (a persistent
        worker's copy lags the parent's counter): what the fetch policy of a remote
        dataset tries, in order, to match the reads it sees to this plan
        (:meth:`tarindex.ShardSet.follow`).
        """
        nxt = self._re.peek()
        out = [nxt, nxt + 1]
        if self._active is not None:
            out.insert(0, int(self._active.epoch))
        return list(dict.fromkeys(out))

    def leg_order(
        self, epoch: int, legs: list[tuple[int, int]], rank: int, world_size: int
    ) -> NDArray[np.int64]:
        """Rank ``rank`` of ``world_size``'s indices after the interrupted ``legs`` of ``epoch``.

        ``legs`` as in :func:`tarindex.shuffle.resume_segments`; ``[]`` is a fresh epoch.

        Returns:
            ``int64`` array, in yield order.
        """
        if not legs:
            return self.rank_order(epoch, rank, world_size)
        segs = resume_segments(self.n_plan, legs, rank, world_size, self.drop_last)
        w0 = int(legs[0][0])
        cache: dict[int, NDArray[np.int64]] = {}
        parts = []
        for r, a, b in segs.tolist():
            if r not in cache:
                cache[r] = self.rank_order(epoch, r, w0)
            parts.append(cache[r][a:b])
        return np.concatenate(parts) if parts else np.empty(0, dtype=np.int64)

    # -- state ------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Return where this rank is in the epoch, in ``O(1)`` (a few ints; one pair per change).

        Returns:
            ``{"version", "seed", "epoch", "consumed", "world_size", "rank", "legs",
            "n_samples", ...plan parameters}``: ``consumed`` is the number of indices this
            rank's iterator has yielded in ``epoch`` (in the current leg); ``legs`` lists the
            ``[world_size, consumed]`` of earlier legs of this epoch on other world sizes
            (``[]`` normally). Before any iteration it describes the next epoch at 0; a
            loaded but not yet consumed state is returned as loaded.
        """
        if self._loaded is not None:
            return dict(self._loaded)
        rank, ws = self._rank()
        if self._active is not None:
            act = self._active
            epoch, legs, consumed = act.epoch, act.legs, act.consumed
        else:
            epoch, legs, consumed = self._re.peek(), [], 0
        return {
            "version": STATE_VERSION,
            "seed": self.seed,
            "epoch": epoch,
            "consumed": consumed,
            "world_size": ws,
            "rank": rank,
            "legs": [list(x) for x in legs],
            "n_samples": self.n_plan,
            **self.plan_params(),
            "layout": self._layout_state(),
        }

    def _layout_state(self) -> list[int] | list[list[int]]:
        layouts, _, _, nested = self.layouts()
        return [list(x) for x in layouts] if nested else list(layouts[0])

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume from :meth:`state_dict`: the next ``__iter__`` yields the rest of that epoch.

        The state may come from any rank, and from another world size (see the class
        docstring). The seed is taken from the state. Checked by
        :func:`tarindex.plan.state.check_state`: with ``shuffle=True`` the datasets must have
        the shard layout they had when the state was saved, and a version 1 state (no
        ``layout``) loads only with ``shuffle=False``.

        Raises:
            ValueError: Naming the field: missing keys, a field that is not an integer in
                range, another kind of sampler or other plan parameters, another shard
                layout (shuffled), a version 1 state (shuffled), or a ``consumed`` out of
                range.
        """
        layouts, shuffled, sizes, nested = self.layouts()
        st = check_state(
            state,
            what=type(self).__name__,
            mine={"n_samples": self.n_plan, **self.plan_params()},
            extra=("world_size", "rank", "legs"),
            layouts=layouts,
            shuffled=shuffled,
            sizes=sizes,
            nested=nested,
            v1_defaults={"legs": []},
            same=self.same_args,
        )
        legs = [(w, k) for w, k in st["legs"]]
        ws = st["world_size"]
        share = self._leg_share(legs, ws)  # validates the legs against the plan
        check_consumed(st["consumed"], share, f"a rank of {ws}", st["epoch"])
        self._loaded = st
        self.seed = st["seed"]

    def _leg_share(self, legs: list[tuple[int, int]], ws: int) -> int:
        if not legs:
            return rank_share(self.n_plan, ws, self.drop_last)
        segs = resume_segments(self.n_plan, legs, 0, ws, self.drop_last)
        return int((segs[:, 2] - segs[:, 1]).sum())

    # -- iteration --------------------------------------------------------------------------
    def __iter__(self) -> Iterator[int]:
        """Iterate one epoch (see the class docstring for which).

        The epoch starts, and a loaded state is consumed, when the first index is drawn, not
        at ``iter()``: a DataLoader with workers calls ``iter(sampler)`` twice per epoch and
        draws from the second iterator only.
        """
        return self._generate()

    def _generate(self) -> Iterator[int]:
        rank, ws = self._rank()
        legs: list[tuple[int, int]] = []
        start = 0
        if self._loaded is not None:
            st, self._loaded = self._loaded, None
            epoch = st["epoch"]
            legs = [(w, k) for w, k in st["legs"]]
            if st["world_size"] == ws:
                start = st["consumed"]
            else:
                legs.append((st["world_size"], st["consumed"]))
            self._re.resume(epoch)
        else:
            epoch = self._re.next_epoch()
        idx = self.leg_order(epoch, legs, rank, ws)
        self._active = act = Progress(epoch, start, legs=legs)
        for i in idx[start:].tolist():
            act.consumed += 1
            yield i


class BlockPlanSampler(PlanSampler):
    """Blocks of contiguous indices, shuffled and split over ranks, torch-free.

    The behaviour and every argument are those of :class:`tarindex.BlockSampler` (which is
    this class over torch's ``Sampler``).
    """

    def __init__(
        self,
        dataset_or_len: int | Sized | Any,
        *,
        block_size: int = 64,
        shuffle: bool = True,
        seed: int = 0,
        rank: int | None = None,
        world_size: int | None = None,
        drop_last: bool = False,
        buffer_size: int = 0,
    ) -> None:
        block_size, buffer_size = check_sizes(block_size, buffer_size)
        seed = check_u64("seed", seed)
        counts = _source_counts("dataset_or_len", dataset_or_len)
        self.counts = counts
        self.starts = np.zeros(len(counts) + 1, dtype=np.int64)
        np.cumsum(counts, out=self.starts[1:])
        self.n_plan = int(self.starts[-1])
        self.block_size = block_size
        self.shuffle = bool(shuffle)
        self.seed = seed
        self.drop_last = bool(drop_last)
        self.buffer_size = buffer_size
        super().__init__(rank, world_size, "BlockSampler")
        follow_plan(dataset_or_len, self)

    def plan_params(self) -> dict[str, Any]:
        """The block plan's parameters that a saved state must match."""
        return {
            "kind": "BlockSampler",
            "block_size": self.block_size,
            "buffer_size": self.buffer_size,
            "shuffle": self.shuffle,
            "drop_last": self.drop_last,
        }

    def layouts(self) -> Layouts:
        """The dataset's shard layout (one run of ``n`` for a bare length)."""
        return [shard_layout(self.counts)], [self.shuffle], [self.n_plan], False

    def rank_order(self, epoch: int, rank: int, world_size: int) -> NDArray[np.int64]:
        """Rank ``rank`` of ``world_size``'s indices of a fresh ``epoch`` (the block plan)."""
        p = plan_worker(
            self.counts,
            self.seed,
            epoch,
            self.block_size,
            rank,
            world_size,
            0,
            1,
            buffer_size=self.buffer_size,
            shuffle=self.shuffle,
            drop_last=self.drop_last,
        )
        return p.order(self.starts)


def follow_plan(dataset: Any, sampler: PlanSampler) -> None:
    """Hand ``sampler``'s plan to ``dataset``'s shards, if they take one (remote shards).

    A ``TarDataset`` over remote shards then fetches the shards the plan reads mostly
    whole, ahead of need, in the plan's order (docs/REMOTE.md, "Fetch policy").
    """
    shards = getattr(dataset, "shards", None)
    follow = getattr(shards, "follow", None)
    if callable(follow) and getattr(shards, "remote", False):
        follow(sampler)


def _source_counts(name: str, source: Sized | int | Any) -> NDArray[np.int64]:
    """Per-shard counts of a sized dataset (:func:`shard_counts`), or ``[n]`` for a count."""
    if isinstance(source, Sized):
        return shard_counts(source)
    return np.asarray([check_int(name, source, 0)], dtype=np.int64)


def shard_counts(dataset: Sized | Any) -> NDArray[np.int64]:
    """Per-shard sample counts of a ``TarDataset`` (``shards.counts``), else ``[len(dataset)]``.

    Returns:
        ``int64`` array summing to ``len(dataset)``.
    """
    counts = getattr(getattr(dataset, "shards", None), "counts", None)
    if counts is not None and int(np.sum(counts)) == len(dataset):
        return np.asarray(counts, dtype=np.int64)
    return np.asarray([len(dataset)], dtype=np.int64)


class MixPlanSampler(PlanSampler):
    """Several map-style datasets concatenated, mixed by weight or count, torch-free.

    The behaviour and every argument are those of :class:`tarindex.MixSampler` (which is
    this class over torch's ``Sampler``).
    """

    same_args = "datasets, weights/counts"

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
        block_size, buffer_size = check_sizes(block_size, buffer_size)
        seed = check_u64("seed", seed)
        self.shard_counts = [_source_counts(f"sources[{i}]", s) for i, s in enumerate(sources)]
        self.sizes = [int(c.sum()) for c in self.shard_counts]
        self.offsets = np.zeros(len(self.sizes) + 1, dtype=np.int64)
        np.cumsum(self.sizes, out=self.offsets[1:])
        self.counts, self.replacement = mix_counts(
            self.sizes, weights, counts, samples_per_epoch, replacement
        )
        self.n_plan = int(self.counts.sum())
        self.block_size = block_size
        self.buffer_size = buffer_size
        self.shuffle = bool(shuffle)
        self.seed = seed
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

    def layouts(self) -> Layouts:
        """Each source's shard layout (one run for a count or a plain sized dataset)."""
        layouts = [shard_layout(c) for c in self.shard_counts]
        return layouts, [self.shuffle] * len(layouts), list(self.sizes), True

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
        spans = source_spans(
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
