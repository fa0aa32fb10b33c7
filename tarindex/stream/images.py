"""Batches of images decoded straight into one array: the torch-free core of batched ``ImageDecode``.

With ``batched=True`` and ``decode=tarindex.ImageDecode(...)`` a batch of ``B`` samples is
read as the other batched paths read it (:func:`tarindex.stream.pack.fetch_packed`, or a
streaming window's blocks through :func:`~tarindex.stream.pack.pack_blocks`) into an ordinary
buffer that stays in the process that read it; then :func:`decode_packed` decodes each
sample's image member into slot ``b`` of one preallocated ``(B, *spec.shape)`` array from
``alloc`` (a shared-memory tensor inside a DataLoader worker: ``tarindex.torch.images``), with
:meth:`~tarindex.codecs.image.ImageDecode.decode_into`, the decode ``ds[i]`` runs, so the
batch holds the same pixels bit for bit. Integer fields (``cls``) are ``int64`` columns; the
other byte fields (``json``, compressed members, ...) are kept raw in a :class:`Packed` of
their own.

With ``ImageDecode(device="cuda")`` nothing is decoded here: the image bytes stay in the
(shared) batch buffer and each sample's crop box and flip, read from its header, go with it
(:attr:`PackedImages.boxes`), for a batched GPU decode in the main process.
"""

from __future__ import annotations

import warnings
from typing import Any, NamedTuple

import numpy as np
from numpy.typing import NDArray

from ..codecs import ExtDecoder, ImageDecode
from ..codecs.compress import Refused
from ..codecs.exts import IMAGE_EXTS, IMAGE_FORMATS, last_ext
from ..codecs.jpeg import check_stream, jpeg_size
from ..errors import DecodeError
from .pack import Alloc, Packed, numpy_alloc, pack_samples

__all__ = ["BOX_COLUMNS", "PackedImages", "decode_packed", "image_spec", "keep_fields"]

BOX_COLUMNS = ("left", "top", "width", "height", "flipped", "image_width", "image_height")
"""Columns of :attr:`PackedImages.boxes`: the box in pixels of the full image, the flip
(0/1) and the image's size from its header."""


class PackedImages(NamedTuple):
    """One batch of images decoded to the target size; the arguments of ``ImageBatch`` in order."""

    images: Any
    """The ``alloc`` buffer's ``keep``: ``B * prod(spec.shape)`` values of ``spec.dtype`` (slot
    ``b`` is sample ``b``'s image); ``None`` when decoding is left to a device."""
    exts: list[str]
    """The extension of each sample's image member (``"jpg"``, ``"png"``, ...)."""
    ints: dict[str, NDArray[np.int64]]
    """Integer fields: ``int64 (B,)`` columns, ``-1`` where a sample has none."""
    keys: list[str]
    """Sample keys, ``B`` strings."""
    global_index: NDArray[np.int64]
    """``int64 (B,)``: global index of each sample."""
    shards: list[str | None]
    """Shard path of each sample."""
    raw: Packed | None
    """The other byte fields, raw (with a device decode: the image members too)."""
    boxes: NDArray[np.int64] | None
    """With a device decode: ``int64 (B, 7)``, :data:`BOX_COLUMNS`; else ``None``."""


def image_spec(decoder: Any) -> ImageDecode | None:
    """The :class:`ImageDecode` a dataset's decoder is, or ``None``.

    ``decode=ImageDecode(...)`` (alone, or a list of just it) makes an :class:`ExtDecoder`
    whose one step is the spec: the datasets then decode batches into one array.
    """
    if isinstance(decoder, ExtDecoder) and len(decoder.steps) == 1:
        step = decoder.steps[0]
        if step.__class__ is ImageDecode:
            return step  # type: ignore[no-any-return,unused-ignore]
    return None


def _is_image(ext: str) -> bool:
    return last_ext(ext) in IMAGE_EXTS and "." not in ext


def keep_fields(packed: Packed, names: list[str], alloc: Alloc) -> Packed | None:
    """The byte fields ``names`` of ``packed`` (field-major, so each is one slice) in a new buffer.

    Returns ``None`` when ``names`` is empty. One copy of those fields' bytes.
    """
    if not names:
        return None
    src = np.asarray(packed.data).reshape(-1)
    rows = [packed.fields.index(f) for f in names]
    sizes = [int(packed.offsets[f, -1] - packed.offsets[f, 0]) for f in rows]
    keep, view = alloc(sum(sizes))
    offsets = np.empty((len(rows), packed.offsets.shape[1]), np.int64)
    at = 0
    for k, f in enumerate(rows):
        o = packed.offsets[f]
        view[at : at + sizes[k]] = src[int(o[0]) : int(o[-1])]
        offsets[k] = o - o[0] + at
        at += sizes[k]
    return Packed(
        list(names),
        keep,
        offsets,
        packed.present[rows],
        packed.keys,
        packed.global_index,
        {},
        packed.shards,
    )


def _which_image(packed: Packed) -> tuple[list[str], NDArray[np.int64]]:
    """The image field of each sample (exactly one each), as names and field rows."""
    img_rows = [f for f, ext in enumerate(packed.fields) if _is_image(ext)]
    n = len(packed.keys)
    count = packed.present[img_rows].sum(axis=0) if img_rows else np.zeros(n, np.int64)
    bad = np.flatnonzero(count != 1)
    if len(bad):
        b = int(bad[0])
        have = [packed.fields[f] for f in img_rows if packed.present[f, b]]
        what = "no image member" if not have else f"{len(have)} image members {have}"
        raise DecodeError(
            f"{packed.shards[b]}: sample {packed.keys[b]!r} has {what}; a batched ImageDecode "
            f"decodes exactly one image per sample into the batch tensor: read one with "
            f"fields=('jpg', 'cls') (or the extension your shards use)"
        )
    row = np.zeros(n, np.int64)
    for f in img_rows:
        row[packed.present[f]] = f
    return [packed.fields[f] for f in row.tolist()], row


def _boxes(
    spec: ImageDecode,
    packed: Packed,
    src: NDArray[np.uint8],
    exts: list[str],
    row: NDArray[np.int64],
    epoch: int,
    max_pixels: int,
) -> NDArray[np.int64]:
    n = len(exts)
    out = np.zeros((n, len(BOX_COLUMNS)), np.int64)
    idx = packed.global_index.tolist()
    for b in range(n):
        o = packed.offsets[row[b]]
        data = src[int(o[b]) : int(o[b + 1])]
        try:
            if IMAGE_FORMATS[last_ext(exts[b])] == "JPEG":
                w, h = jpeg_size(data, spec.backend)
                check_stream(data)  # a cut JPEG is named here, not by the batched decode
            else:
                from ..codecs.handlers import open_image

                w, h = open_image(last_ext(exts[b]), bytes(data), max_pixels).size
            if w * h > max_pixels:
                raise Refused(f"image is {w}x{h} = {w * h} pixels, more than {max_pixels}")
            (left, top, bw, bh), flipped = spec.box(w, h, epoch, idx[b])
        except MemoryError:
            raise
        except Exception as e:
            raise _error(packed, b, exts[b], e) from e
        out[b] = (left, top, bw, bh, int(flipped), w, h)
    return out


def _error(packed: Packed, b: int, ext: str, e: Exception) -> DecodeError:
    """A decode failure as :class:`ExtDecoder` reports it: shard, key, extension, cause."""
    return DecodeError(f"{packed.shards[b]}: sample {packed.keys[b]!r}, extension {ext!r}: {e}")


def decode_packed(
    packed: Packed,
    spec: ImageDecode,
    epoch: int,
    max_pixels: int,
    alloc: Alloc,
    raw_alloc: Alloc,
) -> PackedImages:
    """Decode each sample's image member of ``packed`` into slot ``b`` of one array.

    Args:
        packed: The batch, raw (its buffer any bytes-like array: the packers' ``keep``).
        spec: The decode.
        epoch: The epoch the random crops are drawn for.
        max_pixels: Largest image accepted (``ExtDecoder.max_image_pixels``).
        alloc: The image buffer: ``B * prod(spec.shape) * itemsize`` bytes.
        raw_alloc: The buffer of the other byte fields (and, with ``spec.device`` not
            ``"cpu"``, of the image members).

    Returns:
        The batch; its ``images`` slot ``b`` equals
        ``spec.decode(ext, data, epoch=epoch, index=global_index[b])`` exactly.

    Raises:
        DecodeError: A sample with no image member or several, or one that cannot be
            decoded (names shard, key and extension).
    """
    n = len(packed.keys)
    exts, row = _which_image(packed) if n else ([], np.zeros(0, np.int64))
    src = np.asarray(packed.data).reshape(-1)
    used = sorted(set(row.tolist()))
    others = [f for f in packed.fields if f not in {packed.fields[r] for r in used}]
    if spec.device != "cpu":  # the bytes travel; the box is drawn here, from the header
        boxes = _boxes(spec, packed, src, exts, row, epoch, max_pixels)
        raw = keep_fields(packed, list(packed.fields), raw_alloc)
        return PackedImages(
            None, exts, packed.ints, packed.keys, packed.global_index, packed.shards, raw, boxes
        )
    itemsize = spec.np_dtype.itemsize
    slot = int(np.prod(spec.shape))
    keep, view = alloc(n * slot * itemsize)
    images = view.view(spec.np_dtype).reshape((n, *spec.shape))
    idx = packed.global_index.tolist()
    offs = packed.offsets
    for b in range(n):
        o = offs[row[b]]
        ext = last_ext(exts[b])
        try:
            spec.decode_into(
                images[b],
                ext,
                src[int(o[b]) : int(o[b + 1])],
                epoch=epoch,
                index=idx[b],
                max_pixels=max_pixels,
            )
        except MemoryError:
            raise
        except Exception as e:
            raise _error(packed, b, exts[b], e) from e
    raw = keep_fields(packed, others, raw_alloc)
    return PackedImages(
        keep, exts, packed.ints, packed.keys, packed.global_index, packed.shards, raw, None
    )


def decode_packed_skipping(
    packed: Packed,
    spec: ImageDecode,
    epoch: int,
    max_pixels: int,
    alloc: Alloc,
    raw_alloc: Alloc,
) -> PackedImages:
    """:func:`decode_packed` under ``on_error="skip"``: the samples that decode, in order.

    A sample that cannot be decoded is warned about (``RuntimeWarning`` naming shard, key,
    extension and why) and left out of the batch, which then holds fewer samples (none, if
    every one fails: the dataset then yields no batch). Only run after
    :func:`decode_packed` raised: each sample is tried alone, the others packed again and
    decoded together.
    """
    src = np.asarray(packed.data).reshape(-1)
    good: list[dict[str, Any]] = []
    for b, key in enumerate(packed.keys):
        smp: dict[str, Any] = {"__key__": key, "__shard__": packed.shards[b]}
        if int(packed.global_index[b]) >= 0:
            smp["__index__"] = int(packed.global_index[b])
        for f, name in enumerate(packed.fields):
            if packed.present[f, b]:
                smp[name] = src[int(packed.offsets[f, b]) : int(packed.offsets[f, b + 1])]
        for name, col in packed.ints.items():
            if int(col[b]) >= 0:
                smp[name] = int(col[b])
        try:
            decode_packed(pack_samples([smp], packed.ints), spec, epoch, max_pixels, *_NEW)
        except DecodeError as e:
            warnings.warn(f"{e}: skipped (on_error='skip')", RuntimeWarning, stacklevel=2)
            continue
        good.append(smp)
    return decode_packed(pack_samples(good, packed.ints), spec, epoch, max_pixels, alloc, raw_alloc)


_NEW = (numpy_alloc, numpy_alloc)
