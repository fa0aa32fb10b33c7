"""Integer arguments of the plans: one rule for counts, sizes, seeds, epochs and ranks.

Every count the planners, samplers and datasets take (``counts=``, ``block_size``,
``buffer_size``, ``batch_size``, ``samples_per_epoch``, seeds, epochs, ranks, the fields of a
saved state) passes :func:`check_int`: a Python or numpy integer, never a ``bool``, a float or
a string (``int(5.5)`` would silently plan 5).
"""

from __future__ import annotations

import operator
from typing import Any

import numpy as np

__all__ = ["U64_LIMIT", "check_int", "check_u64", "check_sizes"]

U64_LIMIT = 1 << 64
"""Seeds and epochs are integers in ``[0, U64_LIMIT)`` (they are fed to the seeds as 64 bits)."""


def check_int(name: str, value: Any, minimum: int | None = None, limit: int | None = None) -> int:
    """Return ``value`` as an ``int`` if it is an integer in range, else raise naming ``name``.

    Args:
        name: The argument's name, for the message (``"block_size"``, ``"counts[1]"``).
        value: A Python ``int`` or a numpy integer; ``bool``, floats (also ``3.0``), strings
            and everything else are refused.
        minimum: Smallest value allowed. Defaults to ``None`` (no bound).
        limit: Values must be ``< limit``. Defaults to ``None`` (no bound).

    Returns:
        The value as a Python ``int``.

    Raises:
        ValueError: ``name=value`` is not an integer, or out of range (the message gives the range).
    """
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise ValueError(f"{name}={value!r}: expected an integer{_range(minimum, limit)}")
    v = operator.index(value)
    if (minimum is not None and v < minimum) or (limit is not None and v >= limit):
        raise ValueError(f"{name}={value!r}: expected an integer{_range(minimum, limit)}")
    return v


def _range(minimum: int | None, limit: int | None) -> str:
    if minimum is not None and limit is not None:
        return f" in [{minimum}, {limit})"
    if minimum is not None:
        return f" >= {minimum}"
    if limit is not None:
        return f" < {limit}"
    return ""


def check_u64(name: str, value: Any) -> int:
    """:func:`check_int` in ``[0, 2**64)``: a seed or an epoch.

    Raises:
        ValueError: Naming ``name``.
    """
    return check_int(name, value, 0, U64_LIMIT)


def check_sizes(block_size: Any, buffer_size: Any) -> tuple[int, int]:
    """Check a block plan's ``block_size`` (``>= 1``) and ``buffer_size`` (any integer).

    Returns:
        ``(block_size, max(buffer_size, 0))``: a buffer ``<= 1`` means no mixing.

    Raises:
        ValueError: Naming the argument that is not an integer, or a ``block_size < 1``.
    """
    return check_int("block_size", block_size, 1), max(check_int("buffer_size", buffer_size), 0)
