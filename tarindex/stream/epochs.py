"""Ranks, workers, epochs and resume state of the planned streams and samplers, torch-free.

Rank and world size are resolved in the parent process, never inside DataLoader workers
(where a spawned process group is not initialised); the epoch counter advances once per
``__iter__`` so persistent workers, which never see a later ``set_epoch``, still move on.
Where the process group and the worker come from is an :class:`Env`: :data:`LOCAL` (explicit
arguments and the environment only) here, ``tarindex.torch._dist.TORCH`` in the torch layer.
"""

from __future__ import annotations

import os
from typing import Any, ClassVar

from ..plan.checks import check_int, check_u64
from ..plan.state import STATE_VERSION, check_consumed, check_state

Layouts = tuple[list[list[int]], list[bool], list[int], bool]
"""What a streaming owner's ``_layouts`` returns: per source its shard layout, whether its plan
shuffles, its samples; and whether its state nests the layouts (a mix)."""

__all__ = [
    "Env",
    "LOCAL",
    "resolve_rank",
    "require_rank",
    "RankEpoch",
    "EpochOwner",
    "StreamEpochOwner",
]


class Env:
    """Where a stream runs: the process group's rank and the DataLoader worker, if any.

    This base knows no process group and no worker pool: :meth:`dist` is ``None`` and
    :meth:`worker` is ``(worker, num_workers)`` as given (``(0, 1)``: the process itself).
    The torch layer's subclass asks ``torch.distributed`` and ``get_worker_info``. Instances
    pickle by class (module-level subclasses only).

    Args:
        worker: This process's worker id, ``0 <= worker < num_workers``. Defaults to ``0``.
        num_workers: Workers sharing the rank's plan. Defaults to ``1``.

    Raises:
        ValueError: If ``worker`` is out of range.
    """

    def __init__(self, worker: int = 0, num_workers: int = 1) -> None:
        nw = check_int("num_workers", num_workers, 1)
        self._worker = (check_int("worker", worker, 0, nw), nw)

    def dist(self) -> tuple[int, int] | None:
        """``(rank, world_size)`` of an initialised process group, else ``None``."""
        return None

    def worker(self) -> tuple[int, int] | None:
        """``(worker, num_workers)`` inside a worker, ``None`` in the main process."""
        return None if self._worker == (0, 1) else self._worker

    def layout(self) -> tuple[int, int]:
        """``(worker, num_workers)``: :meth:`worker`, or ``(0, 1)`` in the main process."""
        got = self.worker()
        return (0, 1) if got is None else got


LOCAL = Env()
"""The torch-free :class:`Env`: no process group, the main process is the only worker."""


def resolve_rank(
    rank: int | None, world_size: int | None, env: Env = LOCAL
) -> tuple[int, int] | None:
    """Return ``(rank, world_size)`` from the arguments or ``env``'s process group, if possible.

    Order: explicit arguments; ``env.dist()`` (``torch.distributed`` when initialised, in the
    torch layer); else ``(0, 1)`` unless the environment says ``WORLD_SIZE > 1`` (a launcher
    started several processes but the process group is not up yet), in which case ``None``
    (unresolved).

    Raises:
        ValueError: If only one of ``rank``/``world_size`` is given, or they are out of range.
    """
    if rank is not None or world_size is not None:
        if rank is None or world_size is None:
            raise ValueError(
                f"rank={rank!r}, world_size={world_size!r}: pass both or neither "
                "(neither: taken from torch.distributed)"
            )
        w = check_int("world_size", world_size, 1)
        r = check_int("rank", rank, 0)
        if r >= w:
            raise ValueError(
                f"rank={rank!r}, world_size={world_size!r}: need 0 <= rank < world_size"
            )
        return r, w
    got = env.dist()
    if got is not None:
        return got
    ws = os.environ.get("WORLD_SIZE", "")
    try:
        env_ws = int(ws) if ws else 1
    except ValueError:
        env_ws = 1
    if env_ws > 1:
        return None
    return 0, 1


def require_rank(
    rank: int | None, world_size: int | None, what: str, env: Env = LOCAL
) -> tuple[int, int]:
    """Like :func:`resolve_rank` but raise when unresolved.

    Raises:
        RuntimeError: ``WORLD_SIZE > 1`` in the environment, no ``rank``/``world_size``
            arguments and ``torch.distributed`` not initialised in this process.
    """
    got = resolve_rank(rank, world_size, env)
    if got is None:
        raise RuntimeError(
            f"{what}: WORLD_SIZE={os.environ.get('WORLD_SIZE')} in the environment, but "
            "torch.distributed is not initialised in this process and no rank/world_size "
            "was passed, so every rank would read the same data. Call "
            "torch.distributed.init_process_group() before iterating or creating the DataLoader "
            "(rank is resolved in the parent, never in DataLoader workers), or pass "
            "rank= and world_size= explicitly."
        )
    return got


class RankEpoch:
    """The rank, world size and epoch of a sampler or streaming dataset, written once.

    Rank: ``rank``/``world_size`` if given, else ``env``'s process group when initialised,
    resolved in the parent process (construction, ``len()``, ``__iter__``, or when pickled to
    a worker: :meth:`before_pickle`); in a worker an unresolved rank raises (see
    :func:`require_rank`). Epoch: each :meth:`next_epoch` returns ``e + k``, where ``e`` is the
    last :meth:`set_epoch` value (``0`` initially) and ``k`` the number of :meth:`next_epoch`
    calls since.

    Args:
        rank: This process's rank, or ``None``.
        world_size: Number of ranks, or ``None``.
        what: The owner's name, for messages.
        env: Where the process group and the worker come from. Defaults to :data:`LOCAL`.

    Raises:
        ValueError: If only one of ``rank``/``world_size`` is given, or they are out of range.
    """

    def __init__(
        self, rank: int | None, world_size: int | None, what: str, env: Env = LOCAL
    ) -> None:
        self._args = (rank, world_size)
        self._what = what
        self.env = env
        self._dist: tuple[int, int] | None = resolve_rank(rank, world_size, env)
        self.epoch = 0
        self.since_set = 0

    def resolve(self) -> tuple[int, int]:
        """``(rank, world_size)``, resolving now if needed.

        Raises:
            RuntimeError: ``WORLD_SIZE > 1`` but no rank could be resolved.
        """
        if self._dist is None:
            where = self._what if self.env.worker() is None else f"{self._what} worker"
            self._dist = require_rank(*self._args, where, self.env)
        return self._dist

    def before_pickle(self) -> None:
        """Resolve in the parent before crossing to a spawned worker (errors wait for use)."""
        if self._dist is None and self.env.worker() is None:
            try:
                self._dist = resolve_rank(*self._args, self.env)
            except Exception:
                pass

    def set_epoch(self, epoch: int) -> None:
        """Play ``epoch`` on the next :meth:`next_epoch` (``epoch + k`` on the k-th after).

        Raises:
            ValueError: If ``epoch`` is negative or ``>= 2**64``.
        """
        self.epoch = check_u64("epoch", epoch)
        self.since_set = 0

    def peek(self) -> int:
        """The epoch the next :meth:`next_epoch` returns."""
        return self.epoch + self.since_set

    def next_epoch(self) -> int:
        """Return the epoch of this ``__iter__`` and advance the counter."""
        e = self.epoch + self.since_set
        self.since_set += 1
        return e

    def resume(self, epoch: int) -> None:
        """Continue ``epoch`` now (a loaded state); the next :meth:`next_epoch` is ``epoch + 1``."""
        self.epoch, self.since_set = int(epoch), 1

    def begin_iter(self, loaded: dict[str, Any] | None) -> tuple[int, int, int, int]:
        """``(worker, num_workers, epoch, start)`` of a new ``__iter__`` in this process.

        Resolves the rank first (the parent may resolve now; fork workers inherit an
        initialised group, spawned ones were resolved when pickled; anything else raises).
        ``loaded`` is a state from ``load_state_dict`` (its ``epoch`` is resumed from its
        ``consumed`` samples), or ``None`` for the next epoch from position 0.

        Raises:
            RuntimeError: If the rank cannot be resolved.
            ValueError: If ``loaded`` came from another worker layout.
        """
        worker, nw = self.env.layout()
        self.resolve()
        if loaded is None:
            return worker, nw, self.next_epoch(), 0
        if (loaded["worker"], loaded["num_workers"]) != (worker, nw):
            raise ValueError(
                f"state saved by worker {loaded['worker']} of {loaded['num_workers']} loaded "
                f"into worker {worker} of {nw}: restore it with the same num_workers (with "
                f"workers, through torchdata's StatefulDataLoader)"
            )
        epoch = int(loaded["epoch"])
        self.resume(epoch)
        return worker, nw, epoch, int(loaded["consumed"])


class Progress:
    """One iterator's place in its epoch: what ``state_dict`` reports while it is the newest.

    Every ``__iter__`` makes its own and its loop writes only that one (``consumed``, plan
    positions passed), so an older iterator of the same object still being consumed never
    moves the state of the newest. ``legs`` is a planned sampler's earlier world sizes.
    """

    __slots__ = ("consumed", "epoch", "legs", "num_workers", "worker")

    def __init__(
        self,
        epoch: int,
        consumed: int,
        worker: int = 0,
        num_workers: int = 1,
        legs: list[tuple[int, int]] | None = None,
    ) -> None:
        self.epoch, self.consumed = epoch, consumed
        self.worker, self.num_workers = worker, num_workers
        self.legs: list[tuple[int, int]] = [] if legs is None else legs

    def passed(self, pos: int) -> None:
        """Record that plan position ``pos`` (exclusive) is reached."""
        self.consumed = pos


class EpochOwner:
    """Base of what holds a :class:`RankEpoch`: the streaming datasets and the planned samplers.

    Holds ``_re`` (rank, world size, epoch counter), ``_loaded`` (a state from
    ``load_state_dict`` not yet consumed by an ``__iter__``) and ``_active`` (the
    :class:`Progress` of the iterator started last by this process, or ``None``). Its
    :class:`Env` is ``env`` if given, else the class's :attr:`default_env` (the torch layer's
    classes set torch's).
    """

    default_env: ClassVar[Env] = LOCAL
    """Where rank, world size and worker come from when no ``env`` is given."""

    def _init_epochs(
        self, rank: int | None, world_size: int | None, what: str, env: Env | None = None
    ) -> None:
        self._re = RankEpoch(rank, world_size, what, self.default_env if env is None else env)
        self._loaded: dict[str, Any] | None = None
        self._active: Progress | None = None

    def _rank(self) -> tuple[int, int]:
        return self._re.resolve()

    @property
    def epoch(self) -> int:
        """The last :meth:`set_epoch` value (``0`` initially)."""
        return self._re.epoch

    def set_epoch(self, epoch: int) -> None:
        """Play epoch ``epoch`` on the next ``__iter__`` (and ``epoch + k`` on the k-th after).

        Call it in the parent before ``iter(loader)``: a streaming dataset's workers created
        for that iterator get the new epoch; persistent workers advance by themselves (one
        epoch per ``__iter__``).

        Raises:
            ValueError: If ``epoch`` is negative or ``>= 2**64``.
        """
        self._re.set_epoch(epoch)
        self._active = None

    def __getstate__(self) -> dict[str, Any]:
        self._re.before_pickle()
        return self.__dict__.copy()


class StreamEpochOwner(EpochOwner):
    """Base of the streaming datasets: one plan per worker, resumed per worker.

    A subclass implements :meth:`_plan_params` (what a saved state must match),
    :meth:`_layouts` (its sources' shard layouts) and :meth:`_share` (positions a worker
    plays); saving and loading a state (:func:`tarindex.plan.state.check_state`) are here.
    """

    seed: int
    """Base seed."""

    def _plan_params(self) -> dict[str, Any]:
        raise NotImplementedError

    def _layouts(self) -> Layouts:
        """Return the sources' shard layouts (:data:`Layouts`).

        Per source its :func:`~tarindex.plan.state.shard_layout`, whether its plan shuffles
        (then it depends on the layout) and its samples; and whether the state nests them.
        """
        raise NotImplementedError

    def _share(self, worker: int, num_workers: int) -> int:
        """Positions worker ``worker`` of ``num_workers`` of this rank plays per epoch."""
        raise NotImplementedError

    def __getstate__(self) -> dict[str, Any]:
        state = super().__getstate__()
        state["_active"] = None  # progress travels via state_dict only
        return state

    def _layout_state(self) -> list[int] | list[list[int]]:
        layouts, _, _, nested = self._layouts()
        return [list(x) for x in layouts] if nested else list(layouts[0])

    def _worker_state(self) -> dict[str, Any]:
        """A streaming dataset's ``state_dict``: this process's worker's place in the epoch.

        A loaded but not yet consumed state is returned as loaded; before any iteration the
        state describes the next epoch at 0.
        """
        if self._loaded is not None:
            return dict(self._loaded)
        act = self._active
        if act is not None:
            epoch, worker, nw, consumed = act.epoch, act.worker, act.num_workers, act.consumed
        else:
            worker, nw = self._re.env.layout()
            epoch, consumed = self._re.peek(), 0
        return {
            "version": STATE_VERSION,
            "seed": self.seed,
            "epoch": epoch,
            "consumed": consumed,
            "worker": worker,
            "num_workers": nw,
            **self._plan_params(),
            "layout": self._layout_state(),
        }

    def _load_worker_state(
        self, state: Any, v1_defaults: dict[str, Any] | None = None, same: str = "shards"
    ) -> None:
        """A streaming dataset's ``load_state_dict``: check ``state``, arm the next ``__iter__``.

        Raises:
            ValueError: As :func:`tarindex.plan.state.check_state`, or a ``consumed`` past
                the saved worker's share of the epoch.
        """
        layouts, shuffled, sizes, nested = self._layouts()
        what = type(self).__name__
        st = check_state(
            state,
            what=what,
            mine=self._plan_params(),
            extra=("worker", "num_workers"),
            layouts=layouts,
            shuffled=shuffled,
            sizes=sizes,
            nested=nested,
            v1_defaults=v1_defaults,
            same=same,
        )
        w, nw = st["worker"], st["num_workers"]
        who = f"worker {w} of {nw} of rank {st['rank']} of {st['world_size']}"
        check_consumed(st["consumed"], self._share(w, nw), who, st["epoch"])
        self._loaded = st
        self.seed = st["seed"]
