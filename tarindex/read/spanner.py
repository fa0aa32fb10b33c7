"""Global sample index -> ``(shard, j)``: the one locate rule of every read path.

A set of shards numbers its samples ``0 .. total - 1`` in shard order; ``starts`` (``int64``,
``n_shards + 1``) holds the first global index of each shard and the total last. Negative
indices count from the end, as list indexing does; anything else out of range is a
:class:`~tarindex.errors.SampleIndexError`, and a non-integer (or a ``bool``) a
``TypeError``, by one rule (:func:`check_index`, :func:`check_indices` for a batch) that
every entry point applies: nothing wraps or truncates. The compiled loops (``sample``,
``take``, ``batch``) take only ``int`` indices in range and hand anything else back; their
callers apply this rule then, so a batch the loops accept is not checked twice. ``per > 0``
says every shard but the last holds ``per`` samples (the writer's ``maxcount``): the shard
is then ``i // per`` with no search. The compiled loops hold the C side of the same rule
(``shard_of`` in ``_kernel.c``).
"""

from __future__ import annotations

import bisect
import operator
from collections.abc import Iterable, Sequence
from typing import Any, SupportsIndex, cast

import numpy as np
from numpy.typing import NDArray

from ..errors import SampleIndexError

__all__ = ["check_index", "check_indices", "equal_count", "locate", "locate_many"]


def equal_count(counts: Sequence[int]) -> int:
    """``per`` for these shard sample counts: the count of all but the last if equal, else 0."""
    c0 = counts[0] if counts else 0  # equal counts but maybe the last: i // c0 finds i
    return c0 if c0 > 0 and all(c == c0 for c in counts[:-1]) else 0


_BOOLS = (bool, np.bool_)


def _bad_index(i: object, n: int, negative: bool = True, integer: bool = True) -> Exception:
    """The error for index ``i`` of ``n`` samples: ``TypeError`` unless an integer, else range.

    ``integer=False``: ``i`` failed ``operator.index`` (a float tensor, an array of several
    numbers: types that have ``__index__`` but are no integer).
    """
    if not integer or isinstance(i, _BOOLS) or not hasattr(type(i), "__index__"):
        return TypeError(
            f"sample index {i!r} ({type(i).__name__}) is not an integer: indices are Python or "
            f"numpy integers in [{-n if negative else 0}, {n}) (bool is refused: a mask is not "
            f"a list of indices)"
        )
    return SampleIndexError(
        f"sample index {i} out of range [{-n if negative else 0}, {n}) for {n} samples"
    )


def check_index(i: object, n: int, negative: bool = True) -> int:
    """The one index rule: ``i`` as an ``int`` in ``[0, n)``; negative counts from the end.

    Accepts Python and numpy integers (anything with ``__index__``, as list indexing does);
    refuses ``bool``, floats, strings and anything else.
    ``negative=False`` (a subset's indices): ``[0, n)`` only. Every read path (``ds[i]``,
    ``get``, ``locate``, ...) and :func:`check_indices` apply it.

    Raises:
        SampleIndexError: If ``i`` is outside ``[-n, n)`` (the message names both).
        TypeError: If ``i`` is not an integer, or is a ``bool``.
    """
    if type(i) is not int:
        if isinstance(i, _BOOLS):
            raise _bad_index(i, n, negative)
        try:
            i = operator.index(cast(SupportsIndex, i))  # numpy ints, any __index__ (as lists)
        except TypeError:
            raise _bad_index(i, n, negative, integer=False) from None
    if i < 0:
        if not negative or i < -n:
            raise _bad_index(i, n, negative)
        i += n
    elif i >= n:
        raise _bad_index(i, n, negative)
    return i


def check_indices(
    indices: Sequence[int] | NDArray[np.integer[Any]], n: int, negative: bool = True
) -> NDArray[np.int64]:
    """:func:`check_index` over a batch: ``int64 (k,)`` in ``[0, n)``, in the order given.

    Nothing wraps: a ``uint64`` (or Python) index past ``int64`` is out of range, not the
    sample it wraps to; float, string and bool arrays are refused whatever their values.

    Raises:
        SampleIndexError: If an index is outside ``[-n, n)`` (the first such is named).
        TypeError: If an index is not an integer, or is a ``bool``; if ``indices`` has more
            than one dimension (a batch of batches is not flattened).
    """
    try:
        idx = np.asarray(indices)
    except (ValueError, OverflowError):  # ragged, or ints numpy cannot hold in one dtype
        idx = np.asarray(list(indices), dtype=object)
    if idx.ndim == 0 and isinstance(indices, Iterable) and not isinstance(indices, np.ndarray):
        # numpy holds a set, dict, generator or bytes as one object, not its items: each
        # item is an index (it read the first alone before)
        return check_indices(list(indices), n, negative)
    if idx.ndim > 1:
        raise TypeError(
            f"sample indices of shape {idx.shape}: a batch of indices is one-dimensional "
            f"(a list or a 1-d array of integers); flatten it first if that is what you mean"
        )
    idx = idx.reshape(-1)
    if not idx.size:
        return np.zeros(0, np.int64)
    kind = idx.dtype.kind
    if kind == "u" and int(idx.max()) >= n:  # before any cast: 2**64 - 1 must not wrap
        raise _bad_index(int(idx[idx >= n][0]), n, negative)
    if kind not in "iu" or (  # a float, str or bool array; or Python objects numpy made
        # float or object (ints past int64 among others) or int (a bool among ints; an int
        # subclass, whose __int__ numpy reads and the scalar rule does not): each element by
        # the scalar rule
        not isinstance(indices, np.ndarray)
        and any(type(i) is not int and not isinstance(i, np.integer) for i in indices)
    ):
        items = idx.tolist() if isinstance(indices, np.ndarray) else list(indices)
        return np.fromiter((check_index(i, n, negative) for i in items), np.int64, idx.size)
    out = idx.astype(np.int64, copy=False)
    if negative:
        out = np.where(out < 0, out + n, out)
    bad = (out < 0) | (out >= n)
    if bad.any():
        raise _bad_index(int(idx[bad][0]), n, negative)
    return out


def locate(starts: list[int], per: int, i: int) -> tuple[int, int]:
    """Map global sample index ``i`` to ``(shard, j)``; ``starts`` as a list of ints.

    Raises:
        SampleIndexError: If ``i`` is out of range.
        TypeError: If ``i`` is not an integer (or a ``bool``).
    """
    i = check_index(i, starts[-1])
    if per:  # shards of equal counts (the writer's maxcount): no search
        s = i // per
        last = len(starts) - 2
        if s > last:
            s = last
    else:
        s = bisect.bisect_right(starts, i) - 1
    return s, i - starts[s]


def shards_of(starts: NDArray[np.int64], per: int, idx: NDArray[np.int64]) -> NDArray[np.int64]:
    """The shard of each global index of ``idx`` (``int64``, each in ``[0, total)``)."""
    if per:
        return np.minimum(idx // per, len(starts) - 2)
    out: NDArray[np.int64] = np.searchsorted(starts, idx, side="right") - 1
    return out


def locate_many(
    starts: NDArray[np.int64], per: int, indices: Sequence[int] | NDArray[np.integer[Any]]
) -> tuple[NDArray[np.int64], NDArray[np.int64], NDArray[np.int64]]:
    """:func:`locate` for a batch: ``int64`` global indices (normalised), shards, locals.

    Raises:
        SampleIndexError, TypeError: As :func:`check_indices`.
    """
    idx = check_indices(indices, int(starts[-1]))
    sid = shards_of(starts, per, idx)
    return idx, sid, idx - starts[sid]
