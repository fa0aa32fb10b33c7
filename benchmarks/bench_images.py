"""Images at training speed: JPEG -> 224x224 uint8 tensor with RandomResizedCrop + flip.

On distinct ImageNet-like JPEGs cut from real photos (``tests/photos.py``: scikit-learn's
sample photos, cropped and scaled to ~500x375 and ~1024x768, quality 90), images/s per core
(CPU seconds of the one thread running them, ``time.thread_time``; rounds interleaved, the
best round reported, so load from other processes does not enter the ratios) of:

* ``tarindex ImageDecode``: ``ExtDecoder(ImageDecode(224, tensor=True))`` on sample dicts,
  what ``decode=tarindex.ImageDecode(224, tensor=True)`` runs per sample.
* ``Pillow + RandomResizedCrop + flip``: Pillow's full decode, ``convert("RGB")``, the same
  box, ``crop().resize((224, 224), BILINEAR)``, flip, ``np.array`` -> CHW tensor: torchvision's
  PIL path written out with Pillow (torchvision's wheels do not load on these CPU machines),
  what webdataset, wids and litdata users run.
* ``webdataset torchrgb8 + RandomResizedCrop + flip``: ``autodecode.Decoder([imagehandler(
  "torchrgb8")])`` (what ``.decode("torchrgb8")`` runs), then the tensor transform of
  torchvision v2 written out in torch: slice the box, ``F.interpolate(bilinear,
  antialias=True)`` to 224, flip.
* the limits: bare libjpeg-turbo (``simplejpeg.decode_jpeg``) full decode of the same bytes,
  and its decode at the DCT scale ImageDecode picks; next to them tarindex's full decode
  (``decode_scaled`` at full size, the backend call ImageDecode makes) and ``decode="rgb8"``.

Then wall-clock rates: ImageDecode in 1 and 2 threads (the backend decodes and Pillow resizes
with the GIL released), and a DataLoader (batch 64) over a shard with 1 and 2 workers. Wall
clock is what the machine gives: on a loaded machine those two figures are lower bounds.

Usage: ``python benchmarks/bench_images.py [--quick]``.
"""

from __future__ import annotations

import argparse
import io
import os
import sys
import tempfile
import threading
import time
from collections.abc import Callable

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import tarindex  # noqa: E402
from tarindex.codecs.decode import ExtDecoder  # noqa: E402
from tarindex.codecs.image import ImageDecode, dct_factor  # noqa: E402
from tarindex.codecs.jpeg import decode_scaled, jpeg_size  # noqa: E402
from tests.photos import photo_jpegs  # noqa: E402

SPEC = ImageDecode(224, seed=0, tensor=True)


def ours(jpegs: list[bytes]) -> Callable[[], None]:
    dec = ExtDecoder(SPEC)

    def run() -> None:
        for i, d in enumerate(jpegs):
            dec({"__index__": i, "jpg": d})

    return run


def pillow_rrc(jpegs: list[bytes]) -> Callable[[], None]:
    import torch
    from PIL import Image

    def run() -> None:
        for i, d in enumerate(jpegs):
            im = Image.open(io.BytesIO(d)).convert("RGB")
            (x, y, w, h), flip = SPEC.box(im.size[0], im.size[1], 0, i)
            out = im.crop((x, y, x + w, y + h)).resize((224, 224), Image.Resampling.BILINEAR)
            if flip:
                out = out.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
            torch.from_numpy(np.array(out)).permute(2, 0, 1).contiguous()

    return run


def wds_rrc(jpegs: list[bytes]) -> Callable[[], None]:
    import torch
    import torch.nn.functional as F
    from webdataset import autodecode

    dec = autodecode.Decoder([autodecode.imagehandler("torchrgb8")])

    def run() -> None:
        for i, d in enumerate(jpegs):
            t = dec({"__key__": str(i), "jpg": d})["jpg"]  # uint8 (3, H, W)
            (x, y, w, h), flip = SPEC.box(t.shape[2], t.shape[1], 0, i)
            crop = t[:, y : y + h, x : x + w].unsqueeze(0).float()
            out = F.interpolate(crop, (224, 224), mode="bilinear", antialias=True)
            out = out[0].round_().clamp_(0, 255).to(torch.uint8)
            if flip:
                out = out.flip(-1)

    return run


def bare_full(jpegs: list[bytes]) -> Callable[[], None]:
    import simplejpeg

    def run() -> None:
        for d in jpegs:
            simplejpeg.decode_jpeg(d, "RGB")

    return run


def bare_scaled(jpegs: list[bytes]) -> Callable[[], None]:
    import simplejpeg

    plan = []
    for i, d in enumerate(jpegs):
        w0, h0 = jpeg_size(d)
        (_, _, w, h), _ = SPEC.box(w0, h0, 0, i)
        k = dct_factor(min(w / 224, h / 224))
        plan.append((d, w0 // k, h0 // k))

    def run() -> None:
        for d, mw, mh in plan:
            simplejpeg.decode_jpeg(d, "RGB", min_width=mw, min_height=mh)

    return run


def ours_full(jpegs: list[bytes]) -> Callable[[], None]:
    def run() -> None:
        for d in jpegs:
            decode_scaled(d, 1 << 30, 1 << 30, 1 << 30)

    return run


def ours_rgb8(jpegs: list[bytes]) -> Callable[[], None]:
    dec = ExtDecoder("rgb8")

    def run() -> None:
        for d in jpegs:
            dec({"jpg": d})

    return run


CONTENDERS = {
    "tarindex ImageDecode": ours,
    "Pillow + RandomResizedCrop + flip": pillow_rrc,
    "webdataset torchrgb8 + RandomResizedCrop + flip": wds_rrc,
    "bare libjpeg-turbo full decode (limit)": bare_full,
    "bare libjpeg-turbo scaled decode (limit)": bare_scaled,
    "tarindex full decode (backend call)": ours_full,
    'tarindex decode="rgb8" (Pillow)': ours_rgb8,
}


def per_core(jpegs: list[bytes], rounds: int) -> dict[str, float]:
    runs = {name: make(jpegs) for name, make in CONTENDERS.items()}
    best = {name: float("inf") for name in runs}
    for _ in range(rounds):
        for name, run in runs.items():
            t0 = time.thread_time()
            run()
            best[name] = min(best[name], time.thread_time() - t0)
    return {name: len(jpegs) / t for name, t in best.items()}


def threads(jpegs: list[bytes], n: int) -> float:
    dec = ExtDecoder(SPEC)
    parts = [list(range(k, len(jpegs), n)) for k in range(n)]

    def work(idx: list[int]) -> None:
        for i in idx:
            dec({"__index__": i, "jpg": jpegs[i]})

    ts = [threading.Thread(target=work, args=(p,)) for p in parts]
    t0 = time.perf_counter()
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    return len(jpegs) / (time.perf_counter() - t0)


def loader(root: str, jpegs: list[bytes], workers: int) -> float:
    import torch

    pattern = os.path.join(root, f"img-{len(jpegs)}-%06d.tar")
    if not os.path.exists(pattern % 0):
        with tarindex.ShardWriter(pattern, maxcount=len(jpegs)) as sink:
            for i, d in enumerate(jpegs):
                sink.write({"__key__": f"{i:06d}", "jpg": d, "cls": i % 10})
    ds = tarindex.TarDataset(pattern % 0, decode=SPEC, select=("jpg", "cls"))
    dl = torch.utils.data.DataLoader(ds, batch_size=64, shuffle=True, num_workers=workers)
    next(iter(dl))  # workers started and warm: time the epoch after
    t0 = time.perf_counter()
    n = sum(len(b[1]) for b in dl)
    return n / (time.perf_counter() - t0)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer images and rounds")
    args = ap.parse_args(argv)
    n, rounds = (60, 2) if args.quick else (200, 3)
    print(f"JPEG backend: {tarindex.codecs.image_backend()}; load average {os.getloadavg()}")
    rows: list[tuple[str, str, float, str]] = []
    with tempfile.TemporaryDirectory() as root:
        for size in ((500, 375), (1024, 768)):
            count = n if size[0] < 1000 else n // 2
            jpegs = photo_jpegs(count, size, quality=90, seed=7)
            kb = sum(map(len, jpegs)) / len(jpegs) / 1024
            case = f"{size[0]}x{size[1]}, {count} JPEGs, {kb:.0f} KB each"
            rates = per_core(jpegs, rounds)
            base = rates["Pillow + RandomResizedCrop + flip"]
            for name, r in rates.items():
                rows.append((case, name, r, f"{r / base:.2f}x Pillow+RRC"))
            lim = rates["bare libjpeg-turbo full decode (limit)"]
            r = rates["tarindex full decode (backend call)"]
            rows.append((case, "  full decode / bare libjpeg-turbo", r / lim, "ratio"))
            r = rates["tarindex ImageDecode"]
            w = rates["webdataset torchrgb8 + RandomResizedCrop + flip"]
            rows.append((case, "  ImageDecode / webdataset+RRC", r / w, "ratio"))
            t1, t2 = threads(jpegs, 1), threads(jpegs, 2)
            rows.append((case, "ImageDecode, 1 thread (wall)", t1, ""))
            rows.append((case, "ImageDecode, 2 threads (wall)", t2, f"{t2 / t1:.2f}x 1 thread"))
            d1, d2 = loader(root, jpegs * 2, 1), loader(root, jpegs * 2, 2)
            rows.append((case, "DataLoader, 1 worker (wall)", d1, ""))
            rows.append((case, "DataLoader, 2 workers (wall)", d2, f"{d2 / d1:.2f}x 1 worker"))
    print("| images | contender | images/s (or ratio) | note |")
    print("|---|---|---:|---|")
    for case, name, r, note in rows:
        val = f"{r:.2f}" if note == "ratio" else f"{r:.0f}"
        print(f"| {case} | {name} | {val} | {note} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
