"""The pure-Python (numpy) twin of ``tarindex/codecs/_resample.c``: same function, pixels, errors.

:func:`resample` resizes a box of a ``uint8`` image into an output array as Pillow's
``Image.resize((W, H), BILINEAR, box=box)`` does, bit for bit; the rule is in the C file's
header comment and in :mod:`tarindex.codecs.resample`. Here each pass is a loop over the
filter's taps (a handful), each tap one gather and one multiply-add over the whole image in
``int64``; the sums are integers, so their order does not change them, and the weights are
computed in the same double-precision steps as the C (the filter sum ``ww`` added tap by tap,
in order, as Pillow adds it).
"""

from __future__ import annotations

from typing import Any

import numpy as np
from numpy.typing import NDArray

__all__ = ["resample"]

_BITS = 22
_HALF = 1 << (_BITS - 1)


def _coeffs(
    in_size: int, in0: np.float32, in1: np.float32, out_size: int
) -> tuple[NDArray[np.intp], NDArray[np.intp], NDArray[np.int64]]:
    """``(lo, n, k)``: first src pixel, pixel count and ``(out_size, ksize)`` fixed-point weights."""
    scale = float(np.float32(in1 - in0)) / out_size
    fs = max(scale, 1.0)
    support = fs
    ss = 1.0 / fs
    ksize = int(np.ceil(support)) * 2 + 1
    center = float(in0) + (np.arange(out_size, dtype=np.float64) + 0.5) * scale
    lo = np.trunc(center - support + 0.5).astype(np.intp)
    hi = np.trunc(center + support + 0.5).astype(np.intp)
    lo = np.maximum(lo, 0)
    n = np.minimum(hi, in_size) - lo
    taps = np.arange(ksize)
    x = np.abs(((taps[None, :] + lo[:, None]).astype(np.float64) - center[:, None] + 0.5) * ss)
    w = np.where((x < 1.0) & (taps[None, :] < n[:, None]), 1.0 - x, 0.0)
    ww = np.zeros(out_size)
    for t in range(ksize):  # in order, as the C adds them (a pairwise sum rounds otherwise)
        ww = ww + w[:, t]
    w = np.divide(w, ww[:, None], out=w.copy(), where=ww[:, None] != 0.0)
    k = np.where(w < 0, -0.5 + w * (1 << _BITS), 0.5 + w * (1 << _BITS))
    return lo, n, np.trunc(k).astype(np.int64)


def _clip8(acc: NDArray[np.int64]) -> NDArray[np.uint8]:
    out: NDArray[np.uint8] = np.clip(acc >> _BITS, 0, 255).astype(np.uint8)  # Any on numpy 2.4
    return out


def resample(src: Any, x0: float, y0: float, x1: float, y1: float, out: Any) -> None:
    """Resize the box ``(x0, y0, x1, y1)`` of ``src`` (``uint8 (h, w, c)``) into ``out`` (``(H, W, c)``).

    See ``tarindex/codecs/_resample.c`` for the arguments and the rule.

    Raises:
        ValueError: Arrays not ``uint8`` of 3 dimensions, sides below 1, channels not the
            same 1 to 4, src pixels not contiguous within a row, a box not inside src with
            ``x0 < x1``, ``y0 < y1``, or ``out`` not writable.
    """
    s = np.asarray(src)
    o = out if isinstance(out, np.ndarray) else np.asarray(memoryview(out))  # a view, never a copy
    if s.ndim != 3 or o.ndim != 3 or s.dtype != np.uint8 or o.dtype != np.uint8:
        raise ValueError("resample: src and out must be uint8 arrays of 3 dimensions (h, w, c)")
    h, w, nc = s.shape
    oh, ow = o.shape[:2]
    if not (1 <= nc <= 4 and o.shape[2] == nc and min(h, w, oh, ow) >= 1):
        raise ValueError(
            f"resample: src {s.shape} to out {o.shape}: expected sides >= 1 and the same 1 to 4 "
            f"channels"
        )
    if s.strides[2] != 1 or s.strides[1] != nc:
        raise ValueError(
            "resample: src's pixels must be contiguous within a row (strides (any, c, 1)): pass "
            "numpy.ascontiguousarray(src)"
        )
    box = [float(v) for v in (x0, y0, x1, y1)]
    if not (
        all(np.isfinite(v) and v >= 0 for v in box)
        and box[0] < box[2] <= w
        and box[1] < box[3] <= h
    ):
        raise ValueError(
            f"resample: box ({box[0]:g}, {box[1]:g}, {box[2]:g}, {box[3]:g}) is not inside the "
            f"{w}x{h} image with x0 < x1 and y0 < y1"
        )
    if not o.flags.writeable:
        raise ValueError("resample: out is not a writable array")
    f = [np.float32(v) for v in box]
    if oh < h and h - oh > 2 * (w - ow):  # Pillow's order (the C's two_pass): vertical first
        o[...] = _passes(s.transpose(1, 0, 2), (f[1], f[0], f[3], f[2]), ow, oh).transpose(1, 0, 2)
    else:
        o[...] = _passes(s, f, oh, ow)


def _passes(s: NDArray[np.uint8], f: Any, oh: int, ow: int) -> NDArray[np.uint8]:
    """The horizontal pass over the rows the vertical one reads, then the vertical pass."""
    h, w = s.shape[:2]
    lo_v, n_v, k_v = _coeffs(h, f[1], f[3], oh)
    first, last = int(lo_v[0]), int(lo_v[-1] + n_v[-1])
    rows = s[first:last].astype(np.int64)
    if ow != w or f[0] != 0 or f[2] != np.float32(w):  # else the pass is the identity
        lo, _, k = _coeffs(w, f[0], f[2], ow)
        acc = np.full((last - first, ow, s.shape[2]), _HALF, np.int64)
        for t in range(k.shape[1]):  # a weight of 0 past a pixel's count: any pixel will do
            acc += rows[:, np.minimum(lo + t, w - 1), :] * k[:, t][None, :, None]
        rows = _clip8(acc).astype(np.int64)
    acc = np.full((oh, ow, s.shape[2]), _HALF, np.int64)
    for t in range(k_v.shape[1]):
        acc += rows[np.minimum(lo_v - first + t, last - first - 1)] * k_v[:, t][:, None, None]
    return _clip8(acc)
