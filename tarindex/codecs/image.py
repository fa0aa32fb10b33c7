"""Decode an image straight to the size the model eats: :class:`ImageDecode`.

``decode=tarindex.ImageDecode(size=224)`` makes every image member of a sample a ``uint8``
array ``(3, 224, 224)`` (or a tensor, ``tensor=True``), through these steps:

1. **Header.** The image's width and height are read from its header (no pixel decoded) and
   checked against ``max_image_pixels``.
2. **Crop box.** ``crop="random-resized"`` chooses a box as torchvision's
   ``RandomResizedCrop.get_params`` does: up to 10 tries of an area fraction drawn uniformly
   from ``scale`` and an aspect ratio drawn log-uniformly from ``ratio``; the first box that
   fits the image (``w = round(sqrt(area * r))``, ``h = round(sqrt(area / r))``) is placed at a
   uniform position; after 10 misses, the central box of the whole image clamped to ``ratio``.
   ``crop="center"`` is the central box of the target's aspect ratio covering ``center``
   (``0.875`` = 224/256) of the shorter matching side, as ``Resize(256)`` + ``CenterCrop(224)``.
   ``crop=None`` is the whole image (resized to the target, aspect not kept).
3. **Region at a DCT scale.** A JPEG is decoded at the smallest DCT scale ``1/k``, ``k`` in
   1, 2, 4, 8, that keeps the box at or above the target size, and only over the box
   (:func:`tarindex.codecs.jpeg.decode_region`: tarindex's libjpeg-turbo decoder reads no
   row below the box and transforms no row above it nor column beside it; the other
   backends, simplejpeg and Pillow's ``Image.draft``, decode the whole image at ``1/k`` and
   slice it): a 1024x768 photo for a 224 crop of half its area decodes at 1/2, and about
   half of that. (libjpeg-turbo's other scales, 5/8 .. 7/8, decode slower than the full
   size and are not used.) The box on the scaled image is fractional in general (its edges
   divided by ``k``); the resize keeps that sub-pixel position. PNG, WebP and the other
   formats decode whole at full size through Pillow (they have no DCT scale).
4. **Resize.** The box is resized to the target, antialiased bilinear (the filter widened
   when shrinking), by this process's resize backend (:func:`resize_backend`): tarindex's
   own (:func:`tarindex.codecs.resample.resample`, compiled or its numpy twin) or Pillow's
   ``Image.resize``, the same pixels bit for bit: a box of whole pixels (every box at full
   size) is cropped and resized, torchvision's PIL path ``crop(box).resize(size, BILINEAR)``
   exactly; a fractional box is resized with ``box=`` (the filter reaching past its edges).
5. **Flip** left-right with probability 1/2 (``flip=True``), the layout (``"CHW"`` or
   ``"HWC"``) and dtype (``"uint8"``, or ``"float32"`` in ``[0, 1]``): the resize writes
   ``uint8`` straight into the output (:meth:`ImageDecode.decode_into`: a slot of a batch
   tensor, when batched), the flip and the layout being the strides it writes with.

**Random choices** are a pure function of ``(seed, epoch, index)``, ``index`` being the
sample's global ``__index__``: ``numpy.random.SeedSequence`` over their 32-bit words and a tag
of its own gives 64-bit words, turned into uniforms in ``[0, 1)``. So an epoch replays exactly,
whatever the number of DataLoader workers or the order they fetch in. The epoch is the one the
dataset's ``set_epoch(epoch)`` set (the streaming datasets also advance it once per
``__iter__``, as their plan does): the dataset hands it to its decoder
(:meth:`tarindex.codecs.ExtDecoder.set_epoch`). See docs/DECODING.md, "Decoding to the
model's size", for the tolerance against a full decode and what each knob costs.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from numpy.typing import NDArray

from .exts import IMAGE_FORMATS
from .jpeg import BACKENDS, decode_region, jpeg_size
from .resample import resample

__all__ = [
    "CROPS",
    "RESIZERS",
    "ImageDecode",
    "crop_box",
    "dct_factor",
    "draws",
    "resize",
    "resize_backend",
    "resize_into",
]

CROPS = ("random-resized", "center", None)
"""The crop modes of :class:`ImageDecode`."""

_TAG_IMAGE = 0x494D47  # "IMG": this module's stream, distinct from every plan tag (1..6)
_MASK32 = (1 << 32) - 1
_N_DRAWS = 42  # 10 tries x (area, ratio, top, left) + flip + spare
_U53 = 1.0 / (1 << 53)


def draws(seed: int, epoch: int, index: int) -> list[float]:
    """The uniforms in ``[0, 1)`` of sample ``index`` in ``epoch``: a pure function of the three.

    ``SeedSequence([seed_lo, seed_hi, epoch_lo, epoch_hi, tag, index_lo, index_hi])``, its first
    42 64-bit words, each's top 53 bits over ``2**53``. Uniform ``4k .. 4k + 3`` are try
    ``k``'s area, log-ratio, top and left; uniform 40 the flip.

    Raises:
        ValueError: A negative argument, or one ``>= 2**64``.
    """
    words = []
    for name, v in (("seed", seed), ("epoch", epoch), ("index", index)):
        v = int(v)
        if not 0 <= v < 1 << 64:
            raise ValueError(f"{name}={v!r}: expected an integer in [0, 2**64)")
        words.append((v & _MASK32, v >> 32))
    (s0, s1), (e0, e1), (i0, i1) = words
    state = np.random.SeedSequence([s0, s1, e0, e1, _TAG_IMAGE, i0, i1]).generate_state(
        _N_DRAWS, np.uint64
    )
    out: list[float] = ((state >> np.uint64(11)) * _U53).tolist()  # exact: < 2**53 each
    return out


def crop_box(
    width: int,
    height: int,
    u: Sequence[float],
    scale: tuple[float, float] = (0.08, 1.0),
    ratio: tuple[float, float] = (3 / 4, 4 / 3),
) -> tuple[int, int, int, int]:
    """The crop box of torchvision's ``RandomResizedCrop.get_params``, driven by the uniforms ``u``.

    Args:
        width: Image width in pixels.
        height: Image height in pixels.
        u: At least 40 uniforms in ``[0, 1)`` (:func:`draws`).
        scale: Range of the box's area as a fraction of the image's. Defaults to
            ``(0.08, 1.0)``.
        ratio: Range of the box's aspect ratio (width / height), drawn log-uniformly.
            Defaults to ``(3/4, 4/3)``.

    Returns:
        ``(left, top, w, h)`` in pixels of the full image, ``w, h >= 1``.
    """
    area = width * height
    lo, hi = math.log(ratio[0]), math.log(ratio[1])
    for k in range(10):
        target = area * (scale[0] + (scale[1] - scale[0]) * u[4 * k])
        r = math.exp(lo + (hi - lo) * u[4 * k + 1])
        w = int(round(math.sqrt(target * r)))
        h = int(round(math.sqrt(target / r)))
        if 0 < w <= width and 0 < h <= height:
            top = int(u[4 * k + 2] * (height - h + 1))
            left = int(u[4 * k + 3] * (width - w + 1))
            return left, top, w, h
    in_ratio = width / height  # fallback: the central box, clamped to ratio
    if in_ratio < min(ratio):
        w, h = width, int(round(width / min(ratio)))
    elif in_ratio > max(ratio):
        w, h = int(round(height * max(ratio))), height
    else:
        w, h = width, height
    return (width - w) // 2, (height - h) // 2, max(w, 1), max(h, 1)


def dct_factor(room: float) -> int:
    """The largest of 8, 4, 2, 1 that is ``<= room`` (1 when ``room < 2``).

    Only the power-of-two DCT scales are used: libjpeg-turbo's 5/8, 6/8 and 7/8 decode
    slower than the full size (measured: 0.55 .. 0.84 ms against 0.46 ms for a 500x375 JPEG)
    and blur chroma edges more (docs/DECODING.md).
    """
    for k in (8, 4, 2):
        if room >= k:
            return k
    return 1


def _center_box(
    width: int, height: int, tw: int, th: int, frac: float
) -> tuple[int, int, int, int]:
    """The central box of aspect ``tw/th`` covering ``frac`` of the image's matching side."""
    if width * th >= height * tw:  # image wider than the target: the height limits
        h = height * frac
        w = h * tw / th
    else:
        w = width * frac
        h = w * th / tw
    w_i, h_i = max(1, int(round(w))), max(1, int(round(h)))
    return (width - w_i) // 2, (height - h_i) // 2, w_i, h_i


_MAX_OUT = 1 << 25
"""Largest output ``H * W`` (as :data:`tarindex.codecs.decode.MAX_IMAGE_PIXELS`): 96 MiB of
``uint8`` per image. A larger size failed only at the first decode, as a MemoryError."""


def _side(size: Any, v: Any) -> int:
    if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
        raise ValueError(f"size={size!r}: expected integer sides, not {type(v).__name__}")
    return int(v)


def _pair(size: int | tuple[int, int]) -> tuple[int, int]:
    """``(height, width)`` of ``size``."""
    if isinstance(size, (tuple, list)):
        if len(size) != 2:
            raise ValueError(f"size={size!r}: expected an int or (height, width)")
        h, w = _side(size, size[0]), _side(size, size[1])
    else:
        h = w = _side(size, size)
    if h < 1 or w < 1 or h * w > _MAX_OUT:
        raise ValueError(f"size={size!r}: expected sides >= 1 and height * width <= 2**25")
    return h, w


@dataclass(frozen=True)
class ImageDecode:
    """Decode images to the model's input size, cropped and flipped: ``decode=ImageDecode(...)``.

    The steps (header, crop box, DCT-scaled decode, antialiased resize, flip) and the
    determinism rule are in :mod:`tarindex.codecs.image`; the tolerance and costs in
    docs/DECODING.md ("Decoding to the model's size"). The spec is immutable and pickles to a
    few bytes; the datasets take it as ``decode=`` (alone, or in a list with other steps,
    e.g. ``[ImageDecode(224), my_handler]``), and every other member goes through the
    built-in decoders (``cls`` -> ``int``, ...).

    Args:
        size: Output side in pixels, or ``(height, width)``. Defaults to ``224``.
        crop: ``"random-resized"`` (training), ``"center"`` (evaluation) or ``None`` (the
            whole image). Defaults to ``"random-resized"``.
        scale: Area fraction range of the random box. Defaults to ``(0.08, 1.0)``.
        ratio: Aspect ratio (width / height) range of the random box. Defaults to
            ``(3/4, 4/3)``.
        flip: Flip left-right with probability 1/2. Defaults to ``True`` with
            ``crop="random-resized"``, else ``False``.
        dtype: ``"uint8"`` (``0..255``) or ``"float32"`` (the ``uint8`` value / 255).
            Defaults to ``"uint8"``.
        layout: ``"CHW"`` (torch's) or ``"HWC"``. Defaults to ``"CHW"``.
        seed: Base seed of the random choices, ``0 <= seed < 2**64``. Defaults to ``0``.
        center: Fraction of the shorter matching side the ``"center"`` box covers, in
            ``(0, 1]``. Defaults to ``0.875`` (224/256).
        tensor: Return a ``torch.Tensor`` (sharing the array's memory) instead of a numpy
            array. Defaults to ``False``.
        backend: JPEG backend, ``"simplejpeg"`` or ``"pil"``. Defaults to ``None``: this
            process's (:func:`tarindex.codecs.image_backend`).
        resize: Resize backend, ``"tarindex"`` or ``"pil"`` (:data:`RESIZERS`: the same
            pixels). Defaults to ``None``: this process's (:func:`resize_backend`).
        device: Where a batched dataset decodes: ``"cpu"`` (in the DataLoader workers, into
            the batch tensor) or ``"cuda"``/``"cuda:N"`` (the workers send the batch's JPEG
            bytes and crop boxes; ``batch.decode()`` decodes them together on that GPU,
            :mod:`tarindex.torch.images`). One sample (``ds[i]``) always decodes on the CPU.
            Defaults to ``"cpu"``.

    Raises:
        ValueError: An unknown crop, dtype, layout or backend, a size that is not integers
            ``>= 1`` with ``height * width <= 2**25``, a scale or ratio range that is not
            finite ``0 < lo <= hi`` (scale ``<= 1``), a seed out of range.
    """

    size: int | tuple[int, int] = 224
    crop: str | None = "random-resized"
    scale: tuple[float, float] = (0.08, 1.0)
    ratio: tuple[float, float] = (3 / 4, 4 / 3)
    flip: bool | None = None
    dtype: str = "uint8"
    layout: str = "CHW"
    seed: int = 0
    center: float = 0.875
    tensor: bool = False
    backend: str | None = None
    resize: str | None = None
    device: str = "cpu"
    hw: tuple[int, int] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "hw", _pair(self.size))
        if self.crop not in CROPS:
            raise ValueError(f"crop={self.crop!r}: expected one of {CROPS}")
        if self.flip is None:
            object.__setattr__(self, "flip", self.crop == "random-resized")
        if self.dtype not in ("uint8", "float32"):
            raise ValueError(f"dtype={self.dtype!r}: expected 'uint8' or 'float32'")
        if self.layout not in ("CHW", "HWC"):
            raise ValueError(f"layout={self.layout!r}: expected 'CHW' or 'HWC'")
        for name, rng, top in (("scale", self.scale, 1.0), ("ratio", self.ratio, math.inf)):
            lo, hi = (float(x) for x in rng)
            if not (0 < lo <= hi <= top and math.isfinite(hi)):
                raise ValueError(f"{name}={rng!r}: expected finite 0 < low <= high <= {top}")
            object.__setattr__(self, name, (lo, hi))
        if not 0 < float(self.center) <= 1:
            raise ValueError(f"center={self.center!r}: expected a fraction in (0, 1]")
        if self.backend is not None and self.backend not in BACKENDS:
            raise ValueError(f"backend={self.backend!r}: expected None or one of {BACKENDS}")
        if self.resize is not None and self.resize not in RESIZERS:
            raise ValueError(f"resize={self.resize!r}: expected None or one of {RESIZERS}")
        dev = str(self.device)
        if dev.split(":")[0] not in ("cpu", "cuda"):
            raise ValueError(f"device={self.device!r}: expected 'cpu', 'cuda' or 'cuda:N'")
        object.__setattr__(self, "device", dev)
        draws(self.seed, 0, 0)  # validates the seed

    # -- the crop box ---------------------------------------------------------------------
    def box(
        self, width: int, height: int, epoch: int = 0, index: int = 0
    ) -> tuple[tuple[int, int, int, int], bool]:
        """``((left, top, w, h), flipped)`` of sample ``index`` in ``epoch`` for a ``width x height`` image.

        A pure function of ``(seed, epoch, index)`` and the image size; see the module
        docstring for each crop mode.
        """
        th, tw = self.hw
        if self.crop is None:
            b = (0, 0, width, height)
        elif self.crop == "center":
            b = _center_box(width, height, tw, th, float(self.center))
        if self.crop != "random-resized" and not self.flip:
            return b, False
        u = draws(self.seed, epoch, index)
        if self.crop == "random-resized":
            b = crop_box(width, height, u, self.scale, self.ratio)
        return b, bool(self.flip) and u[40] < 0.5

    # -- decoding -------------------------------------------------------------------------
    @property
    def shape(self) -> tuple[int, int, int]:
        """The output's shape: ``(3, H, W)`` (``layout="CHW"``) or ``(H, W, 3)``."""
        th, tw = self.hw
        return (3, th, tw) if self.layout == "CHW" else (th, tw, 3)

    @property
    def np_dtype(self) -> np.dtype[Any]:
        """The output's numpy dtype: ``uint8`` or ``float32``."""
        return np.dtype(self.dtype)

    def source(
        self, ext: str, data: Any, epoch: int = 0, index: int = 0, max_pixels: int = 1 << 25
    ) -> tuple[NDArray[np.uint8], tuple[float, float, float, float], bool]:
        """Steps 1-3: the decoded pixels, the box on them and the flip, before the resize.

        A JPEG is decoded at its DCT scale and only over the box (plus the pixels the resize
        filter reaches past a fractional box): :func:`tarindex.codecs.jpeg.decode_region`.

        Args:
            ext: The member's image extension (a key of :data:`IMAGE_FORMATS`).
            data: Its bytes (any bytes-like object).
            epoch: The epoch. Defaults to ``0``.
            index: The sample's global index. Defaults to ``0``.
            max_pixels: Largest image accepted, ``width * height`` from the header.

        Returns:
            ``(pixels, box, flipped)``: ``uint8 (h, w, 3)`` RGB (the JPEG's region at its DCT
            scale, other formats whole at full size), the box ``(x0, y0, x1, y1)`` on it in
            pixels (integers where it falls on whole pixels of the scaled image, fractional
            otherwise), whether to flip.

        Raises:
            Refused: Not the format ``ext`` names, or over ``max_pixels``.
        """
        th, tw = self.hw
        if IMAGE_FORMATS[ext] == "JPEG":
            width, height = jpeg_size(data, self.backend)
            (left, top, w, h), flipped = self.box(width, height, epoch, index)
            k = dct_factor(min(w / tw, h / th))  # 1/k keeps the box >= the target
            if min(width, height) < 8 * k:  # the pure backends cannot give 1/k exactly there
                k = 1
            sw, sh = -(-width // k), -(-height // k)  # the image at 1/k
            fx, fy = sw / width, sh / height
            box = (left * fx, top * fy, (left + w) * fx, (top + h) * fy)
            if all(float(v).is_integer() for v in box):
                mx = my = 0  # a crop: no pixel beside the box is used
            else:  # a fractional box: the resize filter reaches past it
                mx = int(math.ceil(max(box[2] - box[0], tw) / tw)) + 2
                my = int(math.ceil(max(box[3] - box[1], th) / th)) + 2
            x0, y0 = max(int(box[0]) - mx, 0), max(int(box[1]) - my, 0)
            x1 = min(int(math.ceil(box[2])) + mx, sw)
            y1 = min(int(math.ceil(box[3])) + my, sh)
            arr = decode_region(data, k, (x0, y0, x1, y1), max_pixels, self.backend)
            return arr, (box[0] - x0, box[1] - y0, box[2] - x0, box[3] - y0), flipped
        else:
            from .handlers import open_image

            img = open_image(ext, bytes(data), max_pixels)
            if img.mode != "RGB":
                img = img.convert("RGB")
            width, height = img.size
            (left, top, w, h), flipped = self.box(width, height, epoch, index)
            arr = np.asarray(img)
        if arr.shape[1] == width and arr.shape[0] == height:
            return arr, (left, top, left + w, top + h), flipped
        fx, fy = arr.shape[1] / width, arr.shape[0] / height
        return arr, (left * fx, top * fy, (left + w) * fx, (top + h) * fy), flipped

    def decode_into(
        self,
        out: NDArray[Any],
        ext: str,
        data: Any,
        *,
        epoch: int = 0,
        index: int = 0,
        max_pixels: int = 1 << 25,
    ) -> None:
        """Decode one image member into ``out``, as sample ``index`` of ``epoch``.

        The one decode of every path: :meth:`decode` (one sample) allocates ``out`` and calls
        it; a batched dataset calls it with ``out`` a slot of the batch tensor, so a batch
        holds the pixels ``ds[i]`` gives, bit for bit. The resize writes into a small
        ``(H, W, 3)`` result that one copy (with the flip and the layout) moves into ``out``.

        Args:
            out: Writable array of :attr:`shape` and :attr:`np_dtype` (any strides).
            ext: The member's image extension (a key of :data:`IMAGE_FORMATS`).
            data: Its bytes (any bytes-like object: ``bytes``, a ``memoryview`` of a batch
                buffer).
            epoch: The epoch (``set_epoch``). Defaults to ``0``.
            index: The sample's global index (``__index__``). Defaults to ``0``.
            max_pixels: Largest image accepted, ``width * height`` from the header.

        Raises:
            Refused: Not the format ``ext`` names, or over ``max_pixels``.
            ValueError: ``out`` of another shape or dtype.
        """
        if out.shape != self.shape or out.dtype != self.np_dtype:
            raise ValueError(
                f"out is {out.dtype} {tuple(out.shape)}: expected {self.dtype} {self.shape}"
            )
        arr, box, flipped = self.source(ext, data, epoch, index, max_pixels)
        if self.dtype == "uint8":  # resized straight into out: layout and flip are its strides
            dst = out.transpose(1, 2, 0) if self.layout == "CHW" else out
        else:
            dst = np.empty((*self.hw, 3), np.uint8)
        resize_into(arr, box, dst[:, ::-1] if flipped else dst, self.resize)
        if self.dtype == "float32":
            res = dst.transpose(2, 0, 1) if self.layout == "CHW" else dst
            np.divide(res, np.float32(255), out=out, dtype=np.float32)

    def decode(
        self, ext: str, data: Any, *, epoch: int = 0, index: int = 0, max_pixels: int = 1 << 25
    ) -> Any:
        """Decode one image member to the target, as sample ``index`` of ``epoch``.

        Args:
            ext: The member's image extension (a key of
                :data:`tarindex.codecs.IMAGE_FORMATS`: ``"jpg"``, ``"png"``, ...).
            data: Its bytes.
            epoch: The epoch (``set_epoch``). Defaults to ``0``.
            index: The sample's global index (``__index__``). Defaults to ``0``.
            max_pixels: Largest image accepted, ``width * height`` from the header.

        Returns:
            ``uint8`` (or ``float32``) array ``(3, H, W)`` (``layout="CHW"``) or ``(H, W,
            3)``, RGB, C-contiguous and writable; a tensor with ``tensor=True``.

        Raises:
            Refused: Not the format ``ext`` names, or over ``max_pixels`` (the caller,
                :class:`tarindex.codecs.ExtDecoder`, raises it as a ``DecodeError``).
        """
        res: NDArray[Any] = np.empty(self.shape, self.np_dtype)
        self.decode_into(res, ext, data, epoch=epoch, index=index, max_pixels=max_pixels)
        if self.tensor:
            import torch

            return torch.from_numpy(res)
        return res


# -- the resize (step 4) ----------------------------------------------------------------------
Box = tuple[float, float, float, float]

RESIZERS = ("tarindex", "pil")
"""The resize backends: ``"tarindex"`` (:func:`tarindex.codecs.resample.resample`: Pillow's
antialiased bilinear bit for bit, compiled or its numpy twin, into any strides, the GIL released)
and ``"pil"`` (Pillow's ``Image.resize`` itself: the reference, ~4x slower plus a copy)."""

_ACTIVE = ["pil" if os.environ.get("TARINDEX_RESIZE", "").strip().lower() == "pil" else "tarindex"]


def resize_backend() -> str:
    """The resize backend of this process: ``"tarindex"``, or ``"pil"`` with ``TARINDEX_RESIZE=pil``."""
    return _ACTIVE[0]


def _window(
    src: NDArray[np.uint8], box: Box, size: tuple[int, int]
) -> tuple[NDArray[np.uint8], Box]:
    """The pixels of ``src`` the resize of ``box`` to ``size`` reads, and the box on them.

    A box of whole pixels is a crop: only its pixels (torchvision's PIL path, ``crop(box)
    .resize(size)``). A fractional box (on a DCT-scaled decode) reads past its edges as far
    as the filter reaches (``box side / output side`` pixels, plus 2): the same result as
    over the whole scaled image.
    """
    th, tw = size
    x0, y0, x1, y1 = box
    if all(float(v).is_integer() for v in box):
        return src[int(y0) : int(y1), int(x0) : int(x1)], (0.0, 0.0, x1 - x0, y1 - y0)
    mx = int(math.ceil(max((x1 - x0) / tw, 1.0))) + 2
    my = int(math.ceil(max((y1 - y0) / th, 1.0))) + 2
    h, w = src.shape[:2]
    ax, ay = max(int(x0) - mx, 0), max(int(y0) - my, 0)
    bx, by = min(int(math.ceil(x1)) + mx, w), min(int(math.ceil(y1)) + my, h)
    return src[ay:by, ax:bx], (x0 - ax, y0 - ay, x1 - ax, y1 - ay)


def resize_into(
    src: NDArray[np.uint8], box: Box, out: NDArray[np.uint8], backend: str | None = None
) -> None:
    """Resize the ``box`` of ``src`` (``uint8 (h, w, 3)``) into ``out`` (``uint8 (H, W, 3)``, any strides).

    ``box`` is ``(x0, y0, x1, y1)`` on ``src`` (whole pixels: a crop; fractional: on a
    DCT-scaled decode, the filter reaching past it); antialiased bilinear, Pillow's pixels
    on either backend.

    Raises:
        ValueError: An unknown backend, or arrays :func:`~tarindex.codecs.resample.resample`
            refuses.
    """
    name = backend or _ACTIVE[0]
    view, rel = _window(src, box, (int(out.shape[0]), int(out.shape[1])))
    if name == "tarindex":
        resample(view, rel, out)
    elif name == "pil":
        from PIL import Image

        img = Image.fromarray(np.ascontiguousarray(view))
        size = (int(out.shape[1]), int(out.shape[0]))
        np.copyto(out, np.asarray(img.resize(size, Image.Resampling.BILINEAR, box=rel)))
    else:
        raise ValueError(f"resize={name!r}: expected one of {RESIZERS}")


def resize(
    src: NDArray[np.uint8], box: Box, size: tuple[int, int], backend: str | None = None
) -> NDArray[np.uint8]:
    """The ``box`` of ``src`` resized to ``size = (H, W)``: a new ``uint8 (H, W, 3)``."""
    out: NDArray[np.uint8] = np.empty((*size, src.shape[2]), np.uint8)
    resize_into(src, box, out, backend)
    return out
