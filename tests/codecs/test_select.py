"""select= / tarindex.to_tuple: webdataset's to_tuple for both datasets, reading only its fields."""

from __future__ import annotations

import io
import pickle
import warnings
from pathlib import Path
from typing import Any, cast

import numpy as np
import pytest
import torch
from PIL import Image

import tarindex
from tarindex.storage.bytesource import PreadSource

wds = pytest.importorskip("webdataset")


def _image(fmt: str, i: int) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(np.full((6, 8, 3), i * 7 % 256, np.uint8)).save(buf, format=fmt)
    return buf.getvalue()


@pytest.fixture
def shards(tmp_path: Path) -> str:
    """12 samples over 2 shards: even ones have a jpg, odd ones a png (sample 5 both, 7 none)."""
    rng = np.random.default_rng(0)
    with tarindex.ShardWriter(str(tmp_path / "t-%06d.tar"), maxcount=6, mtime=0) as w:
        for i in range(12):
            s: dict[str, Any] = {"__key__": f"{i:03d}", "json": {"id": i}, "cls": i % 3}
            s["bin"] = rng.integers(0, 256, 200_000, dtype=np.uint8).tobytes()  # never selected
            if i % 2 == 0 or i == 5:
                s["jpg"] = _image("JPEG", i)
            if i % 2 == 1 and i != 7:
                s["png"] = _image("PNG", i)
            w.write(s)
    return str(tmp_path / "t-{000000..000001}.tar")


def test_to_tuple_picks_the_first_alternative_present() -> None:
    sel = tarindex.to_tuple("jpg;png", "json")
    assert sel.alternatives == (("jpg", "png"), ("json",))
    assert sel.fields is not None
    assert sel.fields == {e + z for e in ("jpg", "png", "json") for z in ("", ".zst", ".gz")}
    s = {"__key__": "k", "__shard__": "s.tar", "png": b"P", "jpg": b"J", "json": b"{}"}
    assert sel(s) == (b"J", b"{}")
    assert tarindex.to_tuple("png;jpg", "__key__")(s) == (b"P", "k")
    assert tarindex.to_tuple("jpg;png json").alternatives == sel.alternatives  # wds' spaces
    with pytest.raises(tarindex.errors.MissingFieldError) as ei:
        tarindex.to_tuple("jpg", "txt;caption")(s)
    msg = str(ei.value)
    assert msg.startswith("s.tar: sample 'k' has no 'txt' or 'caption' (it has jpg, json, png)")
    assert isinstance(ei.value, KeyError) and isinstance(ei.value, tarindex.TarIndexError)
    projected = {"__key__": "k", "__shard__": "s.tar", "jpg": b"J"}  # as a dataset reads it
    with pytest.raises(tarindex.errors.MissingFieldError, match=r"\(of the selected members it has "
                       r"jpg; `tarindex ls s.tar` lists every member\)"):
        tarindex.to_tuple("jpg", "txt")(projected)
    with pytest.raises(tarindex.errors.MissingFieldError, match="of the selected members it has none"):
        tarindex.to_tuple("txt")({"__key__": "k", "__shard__": "s.tar"})
    lax = tarindex.to_tuple("jpg", "txt", missing_is_error=False)
    assert lax(s) == (b"J", None)
    assert pickle.loads(pickle.dumps(lax)).alternatives == lax.alternatives
    assert repr(lax) == "to_tuple('jpg', 'txt', missing_is_error=False)"
    for bad in ((), ("jpg;",), (3,)):
        with pytest.raises(ValueError, match="to_tuple"):
            tarindex.to_tuple(*bad)


def _keys_json(out: tuple[Any, ...]) -> int:
    return int(out[1]["id"])


def test_both_datasets_select_decode_and_read_only_the_selected_members(shards: str) -> None:
    ds = tarindex.TarDataset(
        shards,
        decode="rgb8",
        select=("jpg;png", "json"),
        options=tarindex.OpenOptions(use_mmap=False),
    )
    assert ds.fields == {e + z for e in ("jpg", "png", "json") for z in ("", ".zst", ".gz")}
    ok = [i for i in range(12) if i != 7]
    for i in ok:
        img, meta = ds[i]
        assert meta == {"id": i} and img.shape == (6, 8, 3) and img.dtype == np.uint8
    with pytest.raises(tarindex.errors.MissingFieldError, match=r"t-000001.tar: sample '007' has no 'jpg"):
        ds[7]
    bin_bytes = 12 * 200_000
    read = sum(cast(PreadSource, ds.shards.reader(s).source).bytes_read for s in (0, 1))
    assert 0 < read < bin_bytes / 10, read  # no 200 KB "bin" member was read (sorted: first)
    # the batched fetch (DataLoader's __getitems__) does the same per sample
    got = ds.__getitems__([0, 5, 3])
    assert [m["id"] for _, m in got] == [0, 5, 3]
    # sample 5 has both: jpg (the first alternative) wins, and the png is not decoded
    both = tarindex.TarDataset(shards, decode=_count_png, select=("jpg;png", "json"))
    assert both[5][0] == _image("JPEG", 5) and both[5][1] == {"id": 5}

    stream = tarindex.TarIterableDataset(
        shards,
        shuffle=True,
        seed=3,
        buffer_size=4,
        decode="torchrgb8",
        select=tarindex.to_tuple("jpg;png", "__key__", "cls"),
        on_error="skip",
        options=tarindex.OpenOptions(use_mmap=False),
    )
    with pytest.warns(RuntimeWarning, match="sample '007'.*skipped.*MissingFieldError"):
        items = list(stream)
    assert sorted(int(k) for _, k, _ in items) == ok
    for img, key, cls in items:
        assert isinstance(img, torch.Tensor) and tuple(img.shape) == (3, 6, 8)
        assert cls == int(key) % 3
    read = sum(cast(PreadSource, stream.shards.reader(s).source).bytes_read for s in (0, 1))
    assert 0 < read < bin_bytes / 10, read


def _count_png(key: str, data: bytes) -> Any:
    if key == ".png":
        raise AssertionError("the png of a sample whose jpg was picked is not decoded")
    return None


def test_select_with_transform_fields_and_batched(shards: str) -> None:
    ds = tarindex.TarDataset(
        shards, decode="l", select="jpg;png json", transform=lambda t: (t[0].mean(), t[1]["id"])
    )
    mean, i = ds[4]
    assert i == 4 and abs(float(mean) - 4 * 7 / 255) < 0.05
    with pytest.raises(ValueError, match="drop fields="):
        tarindex.TarDataset(shards, select=("jpg",), fields=("jpg",))
    with pytest.raises(ValueError, match="drop decode/transform/select"):
        tarindex.TarDataset(shards, select=("jpg",), batched=True)
    with pytest.raises(ValueError, match="drop fields="):
        tarindex.TarIterableDataset(shards, select=("jpg",), fields=("cls",))
    with pytest.raises(ValueError, match="decode/transform/select"):
        tarindex.TarIterableDataset(shards, select=("cls",), batched=True, batch_size=2)
    with pytest.raises(ValueError, match="select=3"):
        tarindex.TarDataset(shards, select=3)


@pytest.mark.timeout(120)
def test_select_in_dataloader_workers_both_datasets(shards: str) -> None:
    sel = tarindex.to_tuple("jpg;png", "json", "cls", missing_is_error=False)
    ds = tarindex.TarDataset(shards, decode="torchrgb", select=sel)
    loader = torch.utils.data.DataLoader(
        ds, batch_size=None, shuffle=True, num_workers=2, generator=torch.Generator().manual_seed(0)
    )
    seen = {}
    for img, meta, cls in loader:
        seen[meta["id"]] = img
        assert cls == meta["id"] % 3
    assert sorted(seen) == list(range(12)) and seen[7] is None
    assert seen[2].dtype == torch.float32 and tuple(seen[2].shape) == (3, 6, 8)
    stream = tarindex.TarIterableDataset(shards, seed=1, decode="rgb8", select=sel)
    got = list(torch.utils.data.DataLoader(stream, batch_size=None, num_workers=2))
    assert sorted(m["id"] for _, m, _ in got) == list(range(12))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        want = {
            s["json"]["id"]: s for s in wds.WebDataset(shards, shardshuffle=False).decode("rgb8")
        }
    for img, meta, _ in got:
        if meta["id"] != 7:
            w = want[meta["id"]]
            np.testing.assert_array_equal(img, w["jpg"] if "jpg" in w else w["png"])


@pytest.mark.parametrize("zstd_dict", [False, True], ids=["zstd", "zstd-dictionary"])
def test_select_finds_compressed_members_by_their_decoded_name(
    tmp_path: Path, zstd_dict: bool
) -> None:
    with tarindex.ShardWriter(
        str(tmp_path / "z-%06d.tar"), mtime=0, compress=("json",), zstd_dict=zstd_dict
    ) as w:
        for i in range(40):
            w.write({"__key__": f"{i:03d}", "json": {"id": i, "caption": "a cat " * 5}, "cls": i})
    path = str(tmp_path / "z-000000.tar")
    assert "json.zst" in tarindex.TarDataset(path).raw(0)
    sel = tarindex.to_tuple("json", "cls")
    assert sel.fields is not None
    assert sel.fields == {"json", "json.zst", "json.gz", "cls", "cls.zst", "cls.gz"}
    for ds in (
        tarindex.TarDataset(path, decode=True, select=sel),
        tarindex.TarIterableDataset(path, shuffle=False, decode=True, select=sel),
    ):
        got = [ds[i] for i in range(40)] if isinstance(ds, tarindex.TarDataset) else list(ds)
        assert [(m["id"], c) for m, c in got] == [(i, i) for i in range(40)]
    raw = tarindex.TarDataset(path, select=sel)[3]  # undecoded: the stored member's bytes
    assert raw[0] == tarindex.TarDataset(path).raw(3)["json.zst"] and raw[1] == b"3"
