"""Members read through a byte source in runs: :func:`read_runs` (``pread`` and remote).

A mapped source needs no runs (its buffer is the mapping); a source that reads copies
(:class:`~tarindex.storage.bytesource.PreadSource`, a remote source) gets one read per run of
neighbouring selected members, never a byte of a member left out by ``fields``.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

from ..storage.bytesource import COALESCE_GAP, Buffer, ByteSource

__all__ = ["read_runs"]

def read_runs(
    src: ByteSource,
    all_off: NDArray[np.int64],
    all_end: NDArray[np.int64],
    keep: NDArray[np.bool_] | None,
) -> tuple[Buffer, NDArray[np.int64]]:
    """Read the kept members in runs: neighbours in the tar with nothing left out between.

    ``all_off``/``all_end`` are the data ranges of every member of the selected samples,
    ``keep`` which of them are wanted (``None``: all). A run breaks at a member that is not
    kept or at a gap over :data:`COALESCE_GAP` bytes, so no byte of a left-out member is
    read. Returns the buffer and each kept member's offset in it.
    """
    order = np.argsort(all_off, kind="stable")
    so, se = all_off[order], all_end[order]
    w = np.ones(len(so), np.bool_) if keep is None else keep[order]
    brk = np.ones(len(so), np.bool_)
    brk[1:] = ~w[:-1] | (so[1:] - np.maximum.accumulate(se)[:-1] > COALESCE_GAP)
    new = (brk & w)[w]  # run starts, among the kept members in offset order
    ko, ke = so[w], se[w]
    first = np.flatnonzero(new)
    starts = ko[first]
    ends = np.maximum.reduceat(ke, first)
    run = np.cumsum(new) - 1
    buf, bases = src.read_ranges(starts, ends)
    at_sorted = np.zeros(len(so), np.int64)
    at_sorted[w] = bases[run] + (ko - starts[run])
    at = np.empty(len(so), np.int64)
    at[order] = at_sorted
    return buf, at if keep is None else at[keep]
