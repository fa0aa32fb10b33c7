"""Image batches as one tensor: ``batched=True`` with ``decode=tarindex.ImageDecode(...)``.

Two things live here, the torch side of :mod:`tarindex.stream.images`:

- :class:`ImageBatch`: what a batched image dataset yields. ``batch.images`` is one
  ``uint8`` tensor ``(B, 3, H, W)`` (the spec's layout and dtype), decoded in the DataLoader
  worker straight into its slots, allocated in shared memory and sent by name
  (:mod:`tarindex.torch.transport`), so moving a batch to the main process costs no copy;
  ``batch.cls`` the ``int64`` labels. Collating it is passing it through.
- **The GPU decode.** With ``ImageDecode(device="cuda")`` the workers send the batch's raw
  JPEG bytes (shared memory) and each sample's crop box and flip (drawn from its header in
  the worker, the same draws as the CPU decode); :meth:`ImageBatch.decode` then decodes the
  whole batch on the GPU (``torchvision.io.decode_jpeg(list, device=...)``), crops, resizes
  (antialiased bilinear) and flips there. :func:`decode_on_device` is that function; on
  ``device="cpu"`` it runs the same steps with the CPU decoder of :mod:`tarindex.codecs.jpeg`
  in place of torchvision's when torchvision does not load (how its CPU correctness is
  tested here).
"""

from __future__ import annotations

import functools
from collections.abc import Collection, Sequence
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from numpy.typing import NDArray

from ..codecs import ExtDecoder
from ..codecs.image import ImageDecode
from ..codecs.jpeg import decode_scaled
from ..errors import DecodeError
from ..read.sample_source import SampleSource
from ..stream.images import PackedImages, decode_packed
from ..stream.pack import INT_FIELDS, fetch_packed, numpy_alloc
from .batch import BatchedSamples, IntColumns
from .transport import alloc_buffer, open_ref, share_ref

__all__ = [
    "ImageBatch",
    "decode_on_device",
    "fetch_images",
    "torchvision_decoder",
]


def _tensor_alloc(nbytes: int) -> tuple[torch.Tensor, NDArray[np.uint8]]:
    t = alloc_buffer(nbytes)
    return t, t.numpy()


class ImageBatch(IntColumns):
    """A batch of images decoded to the model's size: one tensor, plus labels and keys.

    Made by ``TarDataset(..., batched=True, decode=ImageDecode(...))`` (its
    ``__getitems__``; use ``collate_fn=tarindex.collate_batched``, which passes it through)
    and ``TarIterableDataset(..., batched=True, batch_size=B, decode=ImageDecode(...))``
    (``DataLoader(ds, batch_size=None)``). Picklable; from a DataLoader worker its tensors
    travel through shared memory by name, no copy.

    Attributes:
        images: The images: ``uint8`` (or ``float32``) tensor ``(B, 3, H, W)`` (``layout=
            "CHW"``) or ``(B, H, W, 3)``; slot ``b`` is what ``ds[i]`` decodes for sample
            ``b`` (bit for bit). ``None`` until :meth:`decode` with a device spec.
        exts: The extension of each sample's image member.
        keys: Sample keys, ``B`` strings.
        shards: Shard path of each sample.
        raw: The samples' other byte members (``json``, ...) as a :class:`BatchedSamples`,
            or ``None`` when they have none; with a device spec, the image members too.
        spec: The :class:`ImageDecode` the images were (or are to be) decoded with.
    """

    __slots__ = ("images", "exts", "keys", "shards", "raw", "spec", "_ints", "_index", "_boxes")

    def __init__(self, packed: PackedImages, spec: ImageDecode) -> None:
        images, exts, ints, keys, index, shards, raw, boxes = packed
        if images is not None:
            images = images.view(getattr(torch, spec.dtype)).view(len(keys), *spec.shape)
        self.images: torch.Tensor | None = images
        self.exts = exts
        self.keys = keys
        self.shards = shards
        self.raw = None if raw is None else BatchedSamples(*raw)
        self.spec = spec
        self._ints = ints
        self._index = index
        self._boxes = boxes

    def __len__(self) -> int:
        return len(self.keys)

    def __repr__(self) -> str:
        shape = None if self.images is None else tuple(self.images.shape)
        return (
            f"ImageBatch({len(self)} samples, images={shape}, ints={list(self._ints)}, "
            f"device={self.spec.device!r})"
        )

    @property
    def boxes(self) -> torch.Tensor | None:
        """With a device spec: ``int64 (B, 7)`` box, flip and image size per sample, else ``None``.

        Columns :data:`tarindex.stream.images.BOX_COLUMNS`, drawn in the worker.
        """
        return None if self._boxes is None else torch.from_numpy(self._boxes)

    def decode(self, device: str | torch.device | None = None) -> torch.Tensor:
        """The images, decoded on ``device`` (:func:`decode_on_device`) if not yet decoded.

        Args:
            device: Where to decode. Defaults to ``spec.device``.

        Returns:
            :attr:`images` (set by this call the first time): ``uint8 (B, 3, H, W)`` on
            ``device``.

        Raises:
            DecodeError: An image that cannot be decoded (names shard, key, extension).
        """
        if self.images is None:
            self.images = decode_on_device(self, device or self.spec.device)
        return self.images

    def pin_memory(self) -> ImageBatch:
        """This batch with :attr:`images` (or, for a device decode, the raw bytes) pinned."""
        if self.images is not None:
            self.images = self.images.pin_memory()
        elif self.raw is not None:
            self.raw = self.raw.pin_memory()
        return self

    def __getstate__(self) -> dict[str, Any]:
        state = {k: getattr(self, k) for k in self.__slots__}
        if self.images is not None:
            ref = share_ref(self.images)  # a worker's buffer goes by name (transport.py)
            if ref is not None:
                state["images"] = (ref, tuple(self.images.shape), self.spec.dtype)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        img = state["images"]
        if isinstance(img, tuple):
            ref, shape, dtype = img
            state["images"] = open_ref(ref).view(getattr(torch, dtype)).view(*shape)
        for k, v in state.items():
            object.__setattr__(self, k, v)


def fetch_images(
    shards: SampleSource,
    indices: Sequence[int],
    decoder: ExtDecoder,
    spec: ImageDecode,
    fields: Collection[str] | None = None,
    int_fields: Collection[str] = INT_FIELDS,
) -> ImageBatch:
    """Read samples ``indices`` and decode their images into one batch tensor.

    The raw batch is read by :func:`tarindex.stream.pack.fetch_packed` into this process's
    memory; :func:`tarindex.stream.images.decode_packed` decodes each image into its slot of a
    shared-memory tensor (or, for a device spec, copies the bytes there and draws the boxes).

    Args:
        shards: The shards (``TarDataset.shards``).
        indices: Global sample indices.
        decoder: The dataset's decoder (its epoch and ``max_image_pixels``).
        spec: The image decode (the decoder's one step).
        fields: Extensions to read. Defaults to ``None`` (all).
        int_fields: Extensions parsed into ``int64`` columns. Defaults to ``("cls",)``.

    Raises:
        SampleIndexError: An index out of range.
        DecodeError: A sample without exactly one image member, or an image that cannot be
            decoded (names shard, key and extension).
    """
    packed = fetch_packed(shards, indices, int_fields, fields, numpy_alloc)
    got = decode_packed(
        packed, spec, decoder.epoch, decoder.max_image_pixels, _tensor_alloc, _tensor_alloc
    )
    return ImageBatch(got, spec)


@functools.cache
def torchvision_decoder() -> Any:
    """``torchvision.io.decode_jpeg`` if torchvision loads here, else ``None`` (looked up once)."""
    try:
        from torchvision.io import decode_jpeg  # type: ignore[import-not-found,import-untyped,unused-ignore]
    except Exception:  # not installed, or a wheel that does not match this torch
        return None
    return decode_jpeg


def _cpu_decode(datas: Sequence[torch.Tensor], exts: Sequence[str]) -> list[torch.Tensor]:
    """The stand-in for ``decode_jpeg(list)``: each image at full size, ``uint8 (3, h, w)``."""
    out = []
    for d, ext in zip(datas, exts, strict=True):
        buf = d.numpy()
        if ext in ("jpg", "jpeg"):
            arr = decode_scaled(buf, 1 << 30, 1 << 30, 1 << 62)
        else:
            from ..codecs.handlers import open_image

            arr = np.asarray(open_image(ext, buf.tobytes(), 1 << 62).convert("RGB"))
        out.append(torch.from_numpy(np.ascontiguousarray(arr)).permute(2, 0, 1))
    return out


def decode_on_device(batch: ImageBatch, device: str | torch.device) -> torch.Tensor:
    """Decode a device batch's JPEGs together on ``device``: crop, resize, flip there.

    The batched decode is ``torchvision.io.decode_jpeg(list_of_uint8_tensors,
    device=device)`` (nvJPEG on CUDA) at full size; then per image the box (drawn in the
    worker from the header: :attr:`ImageBatch.boxes`) is sliced, resized to the target with
    ``F.interpolate(bilinear, antialias=True)`` in ``float32``, rounded to ``uint8`` and
    flipped, into one preallocated ``(B, *shape)`` tensor on ``device``. Non-JPEG members, and
    every member when torchvision does not load (``device="cpu"`` only), are decoded by
    :mod:`tarindex.codecs.jpeg`'s CPU decoder at full size and moved to ``device``. Within the
    tolerance of docs/DECODING.md of the CPU path (no DCT scaling here: nvJPEG decodes full
    size).

    Args:
        batch: An :class:`ImageBatch` of a ``device`` spec (raw bytes and boxes).
        device: ``"cuda"``, ``"cuda:N"`` or ``"cpu"``.

    Returns:
        ``uint8`` (or the spec's ``float32``) tensor ``(B, 3, H, W)`` (or ``(B, H, W, 3)``)
        on ``device``.

    Raises:
        ValueError: ``batch`` holds no raw images (its spec decodes on the CPU).
        RuntimeError: ``device`` is CUDA and torchvision does not load.
        DecodeError: An image the decoder refuses (names shard, key and extension).
    """
    spec, raw, box_t = batch.spec, batch.raw, batch.boxes
    if raw is None or box_t is None:
        raise ValueError("decode_on_device: this batch was decoded in the workers (device='cpu')")
    dev = torch.device(device)
    n = len(batch)
    th, tw = spec.hw
    datas = [raw.tensor(batch.exts[b], b) for b in range(n)]
    exts = [e.lower() for e in batch.exts]
    jpeg = [b for b in range(n) if exts[b] in ("jpg", "jpeg")]
    decoder = torchvision_decoder()
    if dev.type != "cpu" and decoder is None:
        raise RuntimeError(
            f"device={str(dev)!r}: batched GPU decode needs torchvision (pip install "
            f"torchvision matching torch {torch.__version__})"
        )
    full: list[torch.Tensor | None] = [None] * n
    b = 0
    try:
        if decoder is not None and jpeg:
            try:
                got = decoder([datas[b] for b in jpeg], device=dev)
            except Exception:  # decode one by one: the error names the member that fails
                got = []
                for b in jpeg:
                    got.extend(decoder([datas[b]], device=dev))
            for b, img in zip(jpeg, got, strict=True):
                full[b] = img
        for b in range(n):
            if full[b] is None:
                full[b] = _cpu_decode([datas[b]], [exts[b]])[0].to(dev)
    except Exception as e:
        raise DecodeError(
            f"{batch.shards[b]}: sample {batch.keys[b]!r}, extension {batch.exts[b]!r}: "
            f"decoding on {dev} (batch of {n}): {type(e).__name__}: {e}"
        ) from e
    out = torch.empty((n, 3, th, tw), dtype=torch.uint8, device=dev)
    boxes = box_t.numpy()
    for b in range(n):
        left, top, w, h, flipped, iw, ih = boxes[b].tolist()
        img = full[b]
        assert img is not None
        if img.shape[0] == 1:  # grayscale JPEG
            img = img.expand(3, -1, -1)
        if tuple(img.shape[1:]) != (ih, iw):
            raise DecodeError(
                f"{batch.shards[b]}: sample {batch.keys[b]!r}, extension {batch.exts[b]!r}: "
                f"decoded {tuple(img.shape)}, header says {iw}x{ih}"
            )
        crop = img[None, :3, top : top + h, left : left + w].float()
        res = F.interpolate(crop, size=(th, tw), mode="bilinear", antialias=True)[0]
        res = res.round_().clamp_(0, 255)
        out[b] = res.flip(-1) if flipped else res
    if spec.layout == "HWC":
        out = out.permute(0, 2, 3, 1).contiguous()
    if spec.dtype == "float32":
        return out.float().div_(255)
    return out

