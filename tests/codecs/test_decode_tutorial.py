"""webdataset's tutorial read flow, line by line, with tarindex (both datasets), against webdataset.

Each tarindex line sits under the webdataset line it replaces (in a comment), and both run on
the same shards: the tutorial's ``.shuffle(100).decode("rgb").to_tuple("jpg;png", "json")``,
its DataLoader, and its custom ``(key, value)`` decoder.
"""

from __future__ import annotations

import io
import warnings
from itertools import islice
from typing import Any

import numpy as np
import pytest
import torch
from PIL import Image

import tarindex

wds = pytest.importorskip("webdataset")

H, W = 12, 16


@pytest.fixture(scope="module")
def url(tmp_path_factory: pytest.TempPathFactory) -> str:
    """Two shards of 30 samples, images as jpg or png (the tutorial's "jpg;png"), json labels."""
    d = tmp_path_factory.mktemp("tutorial")
    rng = np.random.default_rng(0)
    with tarindex.ShardWriter(str(d / "openimages-train-%06d.tar"), maxcount=30, mtime=0) as w:
        for i in range(60):
            pixels = rng.integers(0, 256, (H, W, 3), dtype=np.uint8)
            ext = "jpg" if i % 3 else "png"
            w.write(
                {
                    "__key__": f"{i:06d}",
                    ext: Image.fromarray(pixels),
                    "json": {"id": i, "annotations": [{"category_id": i % 5}]},
                }
            )
    return str(d / "openimages-train-{000000..000001}.tar")


def _wds(url: str) -> Any:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # webdataset's shardshuffle notice
        return wds.WebDataset(url, shardshuffle=False)


def _by_id(items: Any) -> dict[int, tuple[Any, ...]]:
    out = {int(data["id"]): (image, data) for image, data in items}
    return out


def test_tutorial_decode_rgb_to_tuple(url: str) -> None:
    # dataset = wds.WebDataset(url).shuffle(100).decode("rgb").to_tuple("jpg;png", "json")
    dataset = tarindex.TarIterableDataset(
        url, shuffle=True, buffer_size=100, decode="rgb", select=("jpg;png", "json")
    )
    # for image, data in islice(dataset, 0, 3):
    #     print(image.shape, image.dtype, type(data))
    for image, data in islice(dataset, 0, 3):
        assert (image.shape, image.dtype, type(data)) == ((H, W, 3), np.float32, dict)

    # the same flow in webdataset gives the same pairs (in another order: its shuffle)
    theirs = _by_id(_wds(url).shuffle(100).decode("rgb").to_tuple("jpg;png", "json"))
    ours = _by_id(dataset)
    assert sorted(ours) == sorted(theirs) == list(range(60))
    for i, (image, data) in ours.items():
        np.testing.assert_array_equal(image, theirs[i][0])
        assert data == theirs[i][1]

    # the map-style dataset, same arguments, shuffled by the DataLoader
    ds = tarindex.TarDataset(url, decode="rgb", select=tarindex.to_tuple("jpg;png", "json"))
    assert _by_id(ds[i] for i in range(len(ds))).keys() == ours.keys()
    for i in (0, 1, 59):
        np.testing.assert_array_equal(ds[i][0], ours[i][0])


@pytest.mark.timeout(120)
def test_tutorial_dataloader(url: str) -> None:
    # dataloader = torch.utils.data.DataLoader(dataset, num_workers=4, batch_size=16)
    # images, targets = next(iter(dataloader))
    dataset = tarindex.TarIterableDataset(
        url, shuffle=True, buffer_size=100, decode="rgb", select=("jpg;png", "json")
    )
    dataloader = torch.utils.data.DataLoader(dataset, num_workers=2, batch_size=16)
    images, targets = next(iter(dataloader))
    assert images.shape == (16, H, W, 3) and images.dtype == torch.float32
    assert targets["id"].shape == (16,)
    ids = [int(i) for _, t in dataloader for i in t["id"]]
    assert sorted(ids) == list(range(60))  # one epoch, every sample once, over 2 workers

    ds = tarindex.TarDataset(url, decode="torchrgb8", select=("jpg;png", "json"))
    loader = torch.utils.data.DataLoader(ds, num_workers=2, batch_size=16, shuffle=True)
    images, targets = next(iter(loader))
    assert images.shape == (16, 3, H, W) and images.dtype == torch.uint8


# def my_png_decoder(key, value):
#     if not key.endswith(".png"):
#         return None
#     assert isinstance(value, bytes)
#     return imageio.imread(io.BytesIO(value))
def my_png_decoder(key: str, value: bytes) -> Any:
    if not key.endswith(".png"):
        return None
    assert isinstance(value, bytes)
    return np.asarray(Image.open(io.BytesIO(value)))[::-1].copy()  # upside down: visibly ours


@pytest.mark.timeout(120)
def test_tutorial_custom_key_value_decoder(url: str) -> None:
    # dataset = wds.WebDataset(url).decode(my_png_decoder, "rgb8").to_tuple("jpg;png", "json")
    theirs = _by_id(_wds(url).decode(my_png_decoder, "rgb8").to_tuple("jpg;png", "json"))
    for make in (tarindex.TarDataset, tarindex.TarIterableDataset):
        dataset = make(url, decode=[my_png_decoder, "rgb8"], select=("jpg;png", "json"))
        # per sample, in DataLoader workers
        loader = torch.utils.data.DataLoader(dataset, num_workers=2, batch_size=None)
        ours = _by_id(loader)
        assert sorted(ours) == sorted(theirs) == list(range(60))
        for i, (image, data) in ours.items():
            want = theirs[i][0]
            np.testing.assert_array_equal(np.asarray(image), want)
            assert data == theirs[i][1]
        png = ours[0][0]  # sample 0 is a png: decoded by the handler, flipped
        jpg = ours[1][0]  # sample 1 is a jpg: the handler said None, "rgb8" decoded it
        assert png.shape == jpg.shape == (H, W, 3)
        plain = tarindex.TarDataset(url, decode="rgb8", select=("png", "json"))[0][0]
        np.testing.assert_array_equal(np.asarray(png), plain[::-1])
