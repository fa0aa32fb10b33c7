"""Antialiased resize of a box of a ``uint8`` image into an output array: Pillow's bilinear, bit for bit.

:func:`resample` is the resize of :class:`tarindex.ImageDecode` (step 4): the box of the
decoded pixels (fractional on a DCT-scaled decode) to the model's size, written straight into
the output, which may be a strided view: a slot of a ``(B, 3, H, W)`` batch seen as ``(H, W,
3)``, flipped left-right by a negative column stride. Its pixels are those of Pillow's
``Image.resize((W, H), Image.BILINEAR, box=box)`` on the same array, bit for bit (Pillow 13's
rule: the box rounded to float32, the triangle filter widened by the scale when shrinking,
22-bit fixed-point weights, two passes with the intermediate rounded to ``uint8``, the
vertical pass first when the height shrinks by more than twice what the width does), without
Pillow's copies into and out of an ``Image``.

Which loops run is chosen once at import, as for the read kernel (:mod:`tarindex.read.kernel`):
the compiled ones (``tarindex/codecs/_resample.c``: the vertical pass vectorised over whole
rows, the horizontal one a 4-lane multiply-add per tap, the GIL released) or their numpy twin
(:mod:`tarindex.codecs._resample_py`, same function, same pixels, same errors) when the
extension was not built or ``TARINDEX_PURE_PYTHON=1`` is set. :func:`resample_kernel` says
which.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
from numpy.typing import NDArray

from .._extensions import load_extension
from . import _resample_py

__all__ = ["compiled", "resample", "resample_kernel"]

compiled, _WHY = load_extension(
    f"{__package__}._resample",
    f"{__package__}._resample is not built: reinstall with a C compiler",
)
"""The extension module ``tarindex.codecs._resample``, or ``None``."""

_FN: Callable[..., None] = compiled.resample if compiled is not None else _resample_py.resample


def resample_kernel() -> str:
    """Which resize loops this process runs: ``"compiled"`` or ``"python (<why>)"``.

    Both give the same pixels (Pillow's, bit for bit); the compiled ones are ~35x faster.
    """
    return _WHY


def resample(
    src: NDArray[np.uint8], box: tuple[float, float, float, float], out: NDArray[np.uint8]
) -> None:
    """Resize the ``box`` of ``src`` into ``out``, antialiased bilinear (Pillow's, bit for bit).

    Args:
        src: ``uint8 (h, w, c)``, ``1 <= c <= 4``, any strides (copied first unless its pixels
            are contiguous within a row, as a decoded region's are).
        box: ``(x0, y0, x1, y1)`` in pixels of ``src``, fractional allowed, ``0 <= x0 < x1 <=
            w``, ``0 <= y0 < y1 <= h``. The filter reaches past the box into ``src`` (up to
            its edges): for a crop's pixels only, pass the crop (``src[y0:y1, x0:x1]``) and
            its whole box.
        out: Writable ``uint8 (H, W, c)``, any strides (e.g. ``slot.transpose(1, 2, 0)`` of
            a ``(3, H, W)`` slot; ``[:, ::-1]`` of it to flip).

    Raises:
        ValueError: Not ``uint8`` arrays of 3 dimensions, sides below 1, channels not the same
            1 to 4, a box not inside ``src`` with ``x0 < x1`` and ``y0 < y1``, ``out`` not
            writable.
    """
    s: Any = src
    if s.ndim == 3 and (s.strides[2] != 1 or s.strides[1] != s.shape[2]):
        s = np.ascontiguousarray(s)
    x0, y0, x1, y1 = box
    _FN(s, float(x0), float(y0), float(x1), float(y1), out)
