"""Batched ImageDecode: one (B, 3, H, W) tensor per batch, the pixels of ds[i], through workers.

Also the device decode's CPU path (the bytes and boxes the workers send, decoded by
``decode_on_device(batch, "cpu")``) against the per-sample CPU decode, and the GPU decode where
CUDA and torchvision are present.
"""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import tarindex
from tarindex.errors import DecodeError

from ..photos import photo_jpegs

torch = pytest.importorskip("torch")
pytest.importorskip("sklearn")

from tarindex.torch.images import ImageBatch, decode_on_device, torchvision_decoder  # noqa: E402


def _write(tmp_path: Path, n: int, size: tuple[int, int] = (320, 240)) -> str:
    jpegs = photo_jpegs(n, size, seed=3)
    with tarindex.ShardWriter(str(tmp_path / "img-%06d.tar"), maxcount=n // 3 + 1) as sink:
        for i, data in enumerate(jpegs):
            sink.write({"__key__": f"{i:05d}", "jpg": data, "cls": i % 7, "json": {"i": i}})
    return str(tmp_path / "img-*.tar")


def _loader(ds: Any, workers: int, **kw: Any) -> Any:
    return torch.utils.data.DataLoader(
        ds, num_workers=workers, collate_fn=tarindex.collate_batched, **kw
    )


def test_map_style_batches_are_the_per_sample_pixels_through_two_workers(tmp_path: Path) -> None:
    src = _write(tmp_path, 30)
    spec = tarindex.ImageDecode(64, seed=5)
    ds = tarindex.TarDataset(src, batched=True, decode=spec)
    one = tarindex.TarDataset(src, decode=spec)

    def run(epoch: int, workers: int) -> dict[int, Any]:
        ds.set_epoch(epoch)
        out: dict[int, Any] = {}
        for batch in _loader(ds, workers, batch_size=8, shuffle=True):
            assert isinstance(batch, ImageBatch) and len(batch) <= 8
            images = batch.decode()  # decoded in the worker already: the tensor itself
            assert images is batch.images
            assert images.shape == (len(batch), 3, 64, 64)
            assert images.dtype == torch.uint8 and images.is_contiguous()
            if workers:  # sent from the worker in shared memory, no copy
                assert images.is_shared()  # type: ignore[no-untyped-call]
            idx = batch.index.tolist()
            assert batch.cls.tolist() == [i % 7 for i in idx]
            assert batch.raw is not None and batch.raw.fields == ("json",)
            assert [batch.raw.bytes("json", b) for b in range(len(batch))] == [
                one.raw(i)["json"] for i in idx
            ]
            for b, i in enumerate(idx):
                out[i] = images[b].clone()
        return out

    e0, e0_w0, e1 = run(0, 2), run(0, 0), run(1, 2)
    assert sorted(e0) == list(range(30))
    assert all(torch.equal(e0[i], e0_w0[i]) for i in e0)  # replays with any workers
    assert sum(not torch.equal(e0[i], e1[i]) for i in e0) >= 25  # another epoch: new crops
    one.set_epoch(1)
    for i in range(30):  # bit for bit the per-sample path's pixels
        assert np.array_equal(e1[i].numpy(), one[i]["jpg"]), i


def test_streaming_batches_are_the_per_sample_pixels_through_two_workers(tmp_path: Path) -> None:
    src = _write(tmp_path, 30)
    spec = tarindex.ImageDecode(48, seed=2)
    ds = tarindex.TarIterableDataset(src, batched=True, batch_size=4, decode=spec, seed=1)
    raw = tarindex.TarDataset(src)

    def run(epoch: int, workers: int) -> tuple[list[list[int]], dict[int, Any]]:
        ds.set_epoch(epoch)
        order: list[list[int]] = []
        out: dict[int, Any] = {}
        loader = torch.utils.data.DataLoader(ds, batch_size=None, num_workers=workers)
        for batch in loader:
            images = batch.decode()
            assert images.shape == (len(batch), 3, 48, 48)
            order.append(batch.index.tolist())
            for b, i in enumerate(order[-1]):
                out[i] = images[b].numpy().copy()
        return order, out

    (o0, e0), (o0b, e0b), (_, e1) = run(0, 2), run(0, 2), run(1, 2)
    assert o0 == o0b and all(np.array_equal(e0[i], e0b[i]) for i in e0)  # exact replay
    assert sorted(e0) == list(range(30)) and len(o0) == len(ds)
    assert sum(not np.array_equal(e0[i], e1[i]) for i in e0) >= 25
    for i in range(30):
        want = spec.decode("jpg", raw[i]["jpg"], epoch=1, index=i)
        assert np.array_equal(e1[i], want), i


def _segment(images: Any) -> bytes:
    """The name of the shared-memory segment a batch's images arrived in."""
    return bytes(images.untyped_storage()._share_filename_cpu_()[1])


def test_a_worker_reuses_a_batch_segment_once_the_main_process_let_go(tmp_path: Path) -> None:
    from tarindex.torch import transport

    assert transport.by_name_available()
    src = _write(tmp_path, 64)
    spec = tarindex.ImageDecode(32, seed=1)
    ds = tarindex.TarDataset(src, batched=True, decode=spec)
    one = tarindex.TarDataset(src, decode=spec)
    names = []
    for batch in _loader(ds, 1, batch_size=4, prefetch_factor=2):
        names.append(_segment(batch.images))
        for b, i in enumerate(batch.index.tolist()):  # a reused segment holds this batch
            assert np.array_equal(batch.images[b].numpy(), one[i]["jpg"]), i
    assert len(names) == 16
    # each batch used to be a new segment (torch fallocates it, and every page faults when the
    # decode first writes it: ~0.1 ms an image); now the worker's few go round
    assert len(set(names)) <= transport.POOL_SEGMENTS < len(names)


def test_a_batch_the_main_process_keeps_is_never_written_again(tmp_path: Path) -> None:
    src = _write(tmp_path, 64)
    spec = tarindex.ImageDecode(32, seed=4)
    ds = tarindex.TarDataset(src, batched=True, decode=spec)
    one = tarindex.TarDataset(src, decode=spec)
    kept = []
    for k, batch in enumerate(_loader(ds, 2, batch_size=4, shuffle=True)):
        if k % 2:  # a view of the images keeps the segment as the batch does
            kept.append((batch.index.tolist()[1:3], batch.images[1:3]))
        else:
            kept.append((batch.index.tolist(), batch.images))
    assert len({_segment(images) for _, images in kept}) == len(kept) == 16
    for idx, images in kept:
        for b, i in enumerate(idx):
            assert np.array_equal(images[b].numpy(), one[i]["jpg"]), i


def test_layouts_dtypes_and_pickling(tmp_path: Path) -> None:
    src = _write(tmp_path, 6)
    for spec in (
        tarindex.ImageDecode((40, 56), crop="center", dtype="float32"),
        tarindex.ImageDecode(32, layout="HWC", seed=9),
    ):
        ds = tarindex.TarDataset(src, batched=True, decode=spec, fields=("jpg", "cls"))
        one = tarindex.TarDataset(src, decode=spec)
        batch = ds.__getitems__([5, 0, 3])
        assert batch.raw is None  # fields= read no json
        images = batch.decode()
        assert images.dtype == getattr(torch, spec.dtype)
        assert tuple(images.shape) == (3, *spec.shape)
        for b, i in enumerate([5, 0, 3]):
            assert np.array_equal(images[b].numpy(), one[i]["jpg"])
        back = pickle.loads(pickle.dumps(batch))
        assert torch.equal(back.decode(), images) and back.keys == batch.keys
        assert tarindex.collate_batched([batch]) is batch


def test_a_sample_without_one_image_or_with_a_bad_one_is_named(tmp_path: Path) -> None:
    jpeg = photo_jpegs(1, (320, 240))[0]
    with tarindex.ShardWriter(str(tmp_path / "bad-%06d.tar"), maxcount=10) as sink:
        sink.write({"__key__": "ok", "jpg": jpeg, "cls": 1})
        sink.write({"__key__": "none", "cls": 2})
        sink.write({"__key__": "two", "jpg": jpeg, "png": b"x", "cls": 3})
        sink.write({"__key__": "broken", "jpg": b"\xff\xd8 not a jpeg", "cls": 4})
    ds = tarindex.TarDataset(str(tmp_path / "bad-*.tar"), batched=True, decode=tarindex.ImageDecode(32))
    assert ds.__getitems__([0]).decode().shape == (1, 3, 32, 32)
    with pytest.raises(DecodeError, match=r"bad-000000\.tar: sample 'none' has no image member"):
        ds.__getitems__([0, 1])
    with pytest.raises(DecodeError, match=r"sample 'two' has 2 image members"):
        ds.__getitems__([2])
    with pytest.raises(DecodeError, match=r"bad-000000\.tar: sample 'broken', extension 'jpg'"):
        ds.__getitems__([0, 3])
    with pytest.raises(ValueError, match="batched=True"):
        tarindex.TarDataset(str(tmp_path / "bad-*.tar"), batched=True, decode="rgb8")


@pytest.mark.parametrize("size", [(500, 375), (1024, 768)])
def test_device_decode_on_cpu_matches_the_cpu_decode(tmp_path: Path, size: tuple[int, int]) -> None:
    """The GPU path's code run on the CPU: same boxes and flips, pixels within tolerance."""
    jpegs = photo_jpegs(16, size, quality=90, seed=4)
    with tarindex.ShardWriter(str(tmp_path / "p-%06d.tar"), maxcount=8) as sink:
        for i, data in enumerate(jpegs):
            sink.write({"__key__": f"{i:04d}", "jpg": data, "cls": i})
    src = str(tmp_path / "p-*.tar")
    dev = tarindex.ImageDecode(224, seed=3, device="cuda")  # workers send bytes + boxes
    cpu = tarindex.ImageDecode(224, seed=3)
    ds = tarindex.TarDataset(src, batched=True, decode=dev)
    ds.set_epoch(2)
    batches = list(_loader(ds, 2, batch_size=6, shuffle=True))
    seen = []
    for batch in batches:
        assert batch.images is None and batch.raw is not None and batch.boxes is not None
        assert batch.raw.data.is_shared()  # the JPEG bytes came through shared memory
        boxes = batch.boxes.tolist()
        idx = batch.index.tolist()
        for b, i in enumerate(idx):  # the worker drew the CPU decode's boxes and flips
            (left, top, w, h), flipped = cpu.box(size[0], size[1], 2, i)
            assert boxes[b] == [left, top, w, h, int(flipped), size[0], size[1]]
        got: Any = batch.decode("cpu")
        assert got is batch.decode() and got.shape == (len(batch), 3, 224, 224)
        assert got.dtype == torch.uint8
        for b, i in enumerate(idx):
            want = cpu.decode("jpg", jpegs[i], epoch=2, index=i)
            diff = np.abs(got[b].numpy().astype(np.int16) - want.astype(np.int16))
            seen.append(float(diff.mean()))
            assert diff.mean() <= 2.5 and diff.max() <= 40, (i, diff.mean(), diff.max())
        seen_idx = idx
        assert seen_idx
    assert len(seen) == 16 and np.mean(seen) <= 1.0
    one = tarindex.TarDataset(src, decode=dev)  # ds[i] decodes on the CPU, any spec
    assert one[0]["jpg"].shape == (3, 224, 224)
    with pytest.raises(ValueError, match="decoded in the workers"):
        decode_on_device(tarindex.TarDataset(src, batched=True, decode=cpu).__getitems__([0]), "cpu")


@pytest.mark.skipif(
    not torch.cuda.is_available() or torchvision_decoder() is None,
    reason="batched GPU decode needs CUDA and a torchvision that loads: this machine has "
    + ("no CUDA device" if not torch.cuda.is_available() else "no working torchvision"),
)
def test_gpu_decode_matches_the_cpu_decode(tmp_path: Path) -> None:
    jpegs = photo_jpegs(16, (500, 375), quality=90, seed=4)
    with tarindex.ShardWriter(str(tmp_path / "g-%06d.tar"), maxcount=8) as sink:
        for i, data in enumerate(jpegs):
            sink.write({"__key__": f"{i:04d}", "jpg": data, "cls": i})
    spec = tarindex.ImageDecode(224, seed=3, device="cuda")
    cpu = tarindex.ImageDecode(224, seed=3)
    ds = tarindex.TarDataset(str(tmp_path / "g-*.tar"), batched=True, decode=spec)
    for batch in _loader(ds, 2, batch_size=8):
        got = batch.decode()
        assert got.device.type == "cuda" and got.shape == (len(batch), 3, 224, 224)
        for b, i in enumerate(batch.index.tolist()):
            want = cpu.decode("jpg", jpegs[i], epoch=0, index=i)
            diff = np.abs(got[b].cpu().numpy().astype(np.int16) - want.astype(np.int16))
            assert diff.mean() <= 2.5 and diff.max() <= 40
