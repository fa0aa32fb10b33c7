"""Resolve rank and world size in the parent process (never inside DataLoader workers)."""

from __future__ import annotations

import os

__all__ = ["resolve_rank", "require_rank"]


def resolve_rank(rank: int | None, world_size: int | None) -> tuple[int, int] | None:
    """Return ``(rank, world_size)`` from the arguments or ``torch.distributed``, if possible.

    Order: explicit arguments; ``torch.distributed`` when initialised; else ``(0, 1)`` unless
    the environment says ``WORLD_SIZE > 1`` (a launcher started several processes but the
    process group is not up yet), in which case ``None`` (unresolved).

    Raises:
        ValueError: If only one of ``rank``/``world_size`` is given, or they are out of range.
    """
    if rank is not None or world_size is not None:
        if rank is None or world_size is None:
            raise ValueError(
                f"rank={rank!r}, world_size={world_size!r}: pass both or neither "
                "(neither: taken from torch.distributed)"
            )
        r, w = int(rank), int(world_size)
        if not 0 <= r < w:
            raise ValueError(
                f"rank={rank!r}, world_size={world_size!r}: need 0 <= rank < world_size"
            )
        return r, w
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    ws = os.environ.get("WORLD_SIZE", "")
    try:
        env_ws = int(ws) if ws else 1
    except ValueError:
        env_ws = 1
    if env_ws > 1:
        return None
    return 0, 1


def require_rank(rank: int | None, world_size: int | None, what: str) -> tuple[int, int]:
    """Like :func:`resolve_rank` but raise when unresolved.

    Raises:
        RuntimeError: ``WORLD_SIZE > 1`` in the environment, no ``rank``/``world_size``
            arguments and ``torch.distributed`` not initialised in this process.
    """
    got = resolve_rank(rank, world_size)
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
