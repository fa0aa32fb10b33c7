"""Compressed members (EXT.zst) and the per-shard trained zstd dictionary (FORMAT.md §7)."""

from __future__ import annotations

import json
import os
import subprocess
import tarfile
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import zstandard

import tarindex
from tarindex import codecs
from tarindex.codecs import ExtDecoder, decode_value
from tarindex.format.spec import ZSTD_DICT_MEMBER, ZSTD_DICT_META
from tarindex.index.build import build_index
from tarindex.read.verify import verify
from tests.conftest import have

DICT_NAME = ZSTD_DICT_MEMBER.decode()
WORDS = (
    "a photo of the small red house by the lake with trees and a dog running across green "
    "grass under a cloudy sky near the old stone bridge at sunset in winter"
).split()


def caption_sample(i: int, rng: np.random.Generator) -> dict[str, Any]:
    """~300 bytes of JSON caption + metadata, a text caption, a label and raw bytes."""
    words = " ".join(rng.choice(WORDS, int(rng.integers(8, 20))))
    meta = {
        "caption": words,
        "url": f"https://img.example.com/{i:08x}/{'-'.join(words.split()[:3])}.jpg",
        "width": int(rng.integers(200, 2000)),
        "height": int(rng.integers(200, 2000)),
        "similarity": round(float(rng.uniform(0.2, 0.4)), 4),
        "license": ["CC-BY", "CC0", "unknown"][i % 3],
    }
    return {"__key__": f"{i:08d}", "json": meta, "txt": words, "cls": i % 7, "bin": rng.bytes(40)}


def samples(n: int, seed: int = 0) -> list[dict[str, Any]]:
    rng = np.random.default_rng(seed)
    return [caption_sample(i, rng) for i in range(n)]


def write(pattern: Path, data: list[dict[str, Any]], **kw: Any) -> list[str]:
    with tarindex.ShardWriter(str(pattern), mtime=0, durable=False, **kw) as w:
        for s in data:
            w.write(s)
    return w.paths


def decoded(path: str | list[str], i: int) -> dict[str, Any]:
    torch_ds = pytest.importorskip("tarindex.torch.dataset")
    s = torch_ds.TarDataset(path, decode=True)[i]
    return {k: v for k, v in s.items() if k not in ("__shard__", "__url__", "__local_path__")}


def test_compress_is_transparent_when_decoding(tmp_path: Path) -> None:
    data = samples(50)
    plain = write(tmp_path / "plain-%02d.tar", data)
    zst = write(tmp_path / "zst-%02d.tar", data, compress=("json", "txt"))
    raw = tarindex.ShardSet(zst).sample(3)
    # raw samples show the members as stored: EXT.zst, one zstd frame each
    assert list(raw)[:5] == ["__key__", "bin", "cls", "json.zst", "txt.zst"]  # sorted
    assert zstandard.frame_content_size(raw["json.zst"]) == len(json.dumps(data[3]["json"]))
    for i in (0, 3, 49):
        assert decoded(zst, i) == decoded(plain, i)
        assert decoded(zst, i)["json"] == data[i]["json"]
    # the explicit form, and compress=True
    both = write(
        tmp_path / "all-%02d.tar", [{"__key__": "a", "json.zst": [1], "npy": np.arange(3)}]
    )
    assert list(tarindex.ShardSet(both).sample(0))[:3] == ["__key__", "json.zst", "npy"]
    every = write(tmp_path / "every-%02d.tar", data[:2], compress=True)
    assert sorted(tarindex.ShardSet(every).sample(0)) == sorted(
        ["__key__", "__shard__", "__index__", "json.zst", "txt.zst", "cls.zst", "bin.zst"]
    )
    assert decoded(every, 1) == decoded(plain, 1)


def test_decode_only_selects_a_compressed_member_by_the_name_it_is_served_under(
    tmp_path: Path,
) -> None:
    data = samples(3)
    (zst,) = write(tmp_path / "zst-%02d.tar", data, compress=("json", "txt"))
    raw = tarindex.ShardSet(zst).sample(1)
    got = ExtDecoder(only=["json"])(dict(raw))  # "json" selects json.zst (served as json)
    assert got["json"] == data[1]["json"] and got["txt.zst"] == raw["txt.zst"]
    assert "json.zst" not in got and "txt" not in got
    got = ExtDecoder(only=["json.zst", "cls"])(dict(raw))  # the stored name still selects it
    assert got["json"] == data[1]["json"] and got["cls"] == 1
    got = ExtDecoder(only=["cls"])(dict(raw))  # left out: as stored, name and bytes
    assert got["json.zst"] == raw["json.zst"] and got["cls"] == 1


def test_dictionary_member_index_entry_and_other_tools(tmp_path: Path) -> None:
    data = samples(400)
    (shard,) = write(tmp_path / "d-%02d.tar", data, compress=("json", "txt"), zstd_dict=True)
    with tarfile.open(shard) as tf:
        names = [m.name for m in tf.getmembers()]
        assert names[0] == DICT_NAME and names[3:5] == ["00000000.json.zst", "00000000.txt.zst"]
        zd_bytes = tf.extractfile(DICT_NAME).read()  # type: ignore[union-attr]
    r = tarindex.ShardReader(shard)
    zd = r.zstd_dict()
    assert zd is r.zstd_dict() and zd.as_bytes() == zd_bytes  # loaded once per reader
    entry = r.index.meta[ZSTD_DICT_META]
    assert entry["dict_id"] == zd.dict_id() != 0 and entry["size"] == len(zd_bytes)
    frame = r.sample(5)["json.zst"]
    assert zstandard.get_frame_parameters(frame).dict_id == zd.dict_id()
    # decoding needs the shard's dictionary: the datasets pass it
    for i in (0, 5, 399):
        assert decoded(shard, i)["json"] == data[i]["json"]
        assert decoded(shard, i)["txt"] == data[i]["txt"]
    # webdataset reads the shard: the dictionary member is no sample for it either
    wds: Any = pytest.importorskip("webdataset")
    got = list(wds.WebDataset(shard, shardshuffle=False))
    assert [s["__key__"] for s in got] == [s["__key__"] for s in data]
    assert got[5]["json.zst"] == frame
    # tar -x extracts it as a file
    if have("tar"):
        out = tmp_path / "x"
        out.mkdir()
        subprocess.run(["tar", "-xf", shard, "-C", str(out)], check=True)
        assert (out / DICT_NAME).read_bytes() == zd_bytes
    # verify passes (the dictionary is in no sample, as the rescan finds)
    assert verify(shard, data=True).ok


def test_dictionary_is_smaller_than_plain_zstd(tmp_path: Path) -> None:
    data = samples(1500)
    (plain,) = write(tmp_path / "z-%02d.tar", data, compress=("json",))
    (dct,) = write(tmp_path / "d-%02d.tar", data, compress=("json",), zstd_dict=True)

    def payload(p: str) -> int:
        blk = tarindex.ShardReader(p).read_block(0, len(data), ("json.zst",))
        return int(blk.size.sum())

    assert payload(dct) * 2 <= payload(plain), (payload(dct), payload(plain))


def test_build_index_finds_the_dictionary_again(tmp_path: Path) -> None:
    data = samples(120)
    (shard,) = write(tmp_path / "d-%02d.tar", data, compress=("json",), zstd_dict=True)
    written = tarindex.ShardReader(shard).index
    os.unlink(shard + ".tidx")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the dictionary member is no "file in no sample"
        rebuilt = build_index(shard)
    assert rebuilt.tables_bytes() == written.tables_bytes()
    assert rebuilt.meta[ZSTD_DICT_META] == written.meta[ZSTD_DICT_META]
    assert decoded(shard, 77)["json"] == data[77]["json"]
    if not have("tar"):
        return
    # extracted and re-packed by GNU tar: the dictionary now sorts after the samples
    out = tmp_path / "x"
    out.mkdir()
    subprocess.run(["tar", "-xf", shard, "-C", str(out)], check=True)
    gnu = str(tmp_path / "gnu.tar")
    subprocess.run(["tar", "--sort=name", "-cf", gnu, "-C", str(out), "."], check=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        t = build_index(gnu)
    assert t.meta[ZSTD_DICT_META]["dict_id"] == written.meta[ZSTD_DICT_META]["dict_id"]
    assert t.meta[ZSTD_DICT_META]["offset"] > written.meta[ZSTD_DICT_META]["offset"]
    assert [decoded(gnu, i)["json"] for i in range(0, 120, 17)] == [
        data[i]["json"] for i in range(0, 120, 17)
    ]


def test_without_or_with_the_wrong_dictionary_is_a_clear_error(tmp_path: Path) -> None:
    a = write(tmp_path / "a-%02d.tar", samples(100, 1), compress=("json",), zstd_dict=True)
    b = write(tmp_path / "b-%02d.tar", samples(100, 2), compress=("json",), zstd_dict=True)
    ra, rb = tarindex.ShardReader(a[0]), tarindex.ShardReader(b[0])
    frame = ra.sample(0)["json.zst"]
    ida = ra.zstd_dict().dict_id()
    with pytest.raises(tarindex.DecodeError, match=rf"dictionary {ida}.*has no zstd dictionary"):
        decode_value("json.zst", frame, shard=a[0], key="00000000")
    other = rb.zstd_dict()
    assert other.dict_id() != ida
    with pytest.raises(codecs.ZstdDecodeError, match=rf"has dictionary {other.dict_id()}"):
        ExtDecoder()({"__key__": "k", "json.zst": frame}, other)
    assert decode_value("json.zst", frame, zstd_dict=ra.zstd_dict()) == samples(1, 1)[0]["json"]


def test_decompression_budget_covers_dictionary_frames(tmp_path: Path) -> None:
    big = {"__key__": "big", "txt": "caption " * 50_000}  # 400 kB of text, a tiny frame
    data = samples(60) + [big]
    (shard,) = write(tmp_path / "d-%02d.tar", data, compress=("txt",), zstd_dict=True)
    r = tarindex.ShardReader(shard)
    raw = r.sample(60)
    assert len(raw["txt.zst"]) < 5_000
    dec = ExtDecoder(max_decompressed_bytes=100_000)
    with pytest.raises(codecs.ZstdDecodeError, match="zstd frame declares 400000 bytes"):
        dec(dict(raw), r.zstd_dict())
    # a dictionary frame without a size in its header is counted before it is allocated
    cctx = zstandard.ZstdCompressor(dict_data=r.zstd_dict(), write_content_size=False)
    bomb = cctx.compress(b"caption " * 50_000)
    assert zstandard.frame_content_size(bomb) == -1
    with pytest.raises(codecs.ZstdDecodeError, match="expands to at least 100001 bytes"):
        dec({"__key__": "b", "txt.zst": bomb}, r.zstd_dict())
    assert ExtDecoder()({"__key__": "b", "txt.zst": bomb}, r.zstd_dict())["txt"] == big["txt"]


def test_dictionary_bytes_changed_in_place_are_refused(tmp_path: Path) -> None:
    (shard,) = write(tmp_path / "d-%02d.tar", samples(300), compress=("json",), zstd_dict=True)
    entry = tarindex.ShardReader(shard).index.meta[ZSTD_DICT_META]
    at = entry["offset"] + entry["size"] - 100  # past the first 4 KiB (the fingerprint)
    assert at > 4096
    with open(shard, "r+b") as f:
        f.seek(at)
        b = f.read(1)
        f.seek(at)
        f.write(bytes([b[0] ^ 0xFF]))
    r = tarindex.ShardReader(shard)  # opens: the fingerprint does not cover it
    with pytest.raises(tarindex.errors.ChecksumError, match=rf"byte {entry['offset']}: zstd dictionary"):
        r.zstd_dict()
    with pytest.raises(tarindex.StaleIndexError, match="records the zstd dictionary"):
        verify(shard)


def test_each_shard_trains_its_own_dictionary(tmp_path: Path) -> None:
    data = samples(703)
    paths = write(
        tmp_path / "d-%02d.tar",
        data,
        maxcount=200,
        compress=("json", "txt"),
        zstd_dict=4096,
        zstd_dict_samples=50,
    )
    assert len(paths) == 4
    ids = []
    for p in paths[:3]:
        with tarfile.open(p) as tf:
            assert tf.getmembers()[0].name == DICT_NAME
        ids.append(tarindex.ShardReader(p).zstd_dict().dict_id())
        assert tarindex.ShardReader(p).index.meta[ZSTD_DICT_META]["size"] <= 4096
    assert len(set(ids)) == 3
    # 103 samples in the last shard: trained too; samples in order across shards
    ds = tarindex.ShardSet(paths)
    assert [ds.sample(i)["__key__"] for i in (0, 199, 200, 702)] == [
        data[i]["__key__"] for i in (0, 199, 200, 702)
    ]
    assert decoded(paths, 650)["json"] == data[650]["json"]
    # a shard of 3 samples holds too little to train on: no dictionary, still compressed
    (tiny,) = write(tmp_path / "t-%02d.tar", data[:3], compress=("json",), zstd_dict=True)
    assert tarindex.ShardReader(tiny).zstd_dict() is None
    assert decoded(tiny, 2)["json"] == data[2]["json"]


def test_held_samples_keep_the_writer_rules(tmp_path: Path) -> None:
    pattern = tmp_path / "d-%02d.tar"
    w = tarindex.ShardWriter(str(pattern), mtime=0, compress=("json",), zstd_dict=True)
    w.write(samples(1)[0])
    assert w.total == 0 and not list(tmp_path.glob("*.tar"))  # held for training
    with pytest.raises(tarindex.errors.WriterError, match="written twice"):
        w.write(samples(1)[0])
    w.close()
    assert w.total == 1 and len(tarindex.ShardSet(str(tmp_path / "d-00.tar"))) == 1
    # an exception inside the with block: nothing held is written, nothing left behind
    with pytest.raises(RuntimeError):
        with tarindex.ShardWriter(str(tmp_path / "e-%02d.tar"), zstd_dict=True) as w2:
            for s in samples(20):
                w2.write(s)
            raise RuntimeError("stop")
    assert not list(tmp_path.glob("e-*"))


def test_same_seed_same_bytes(tmp_path: Path) -> None:
    data = samples(200)
    kw: dict[str, Any] = {"compress": ("json",), "zstd_dict": True, "seed": 3}
    (a,) = write(tmp_path / "a-%02d.tar", data, **kw)
    (b,) = write(tmp_path / "b-%02d.tar", data, **kw)
    assert Path(a).read_bytes() == Path(b).read_bytes()


def test_iterable_dataset_in_workers_decodes_dictionary_members(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    data = samples(240)
    paths = write(
        tmp_path / "d-%02d.tar", data, maxcount=80, compress=("json", "txt"), zstd_dict=True
    )
    ds = tarindex.TarIterableDataset(paths, shuffle=True, seed=1, decode=True)
    loader = torch.utils.data.DataLoader(
        ds, batch_size=None, num_workers=2, collate_fn=lambda s: s
    )
    got = {s["__key__"]: s for s in loader}
    assert len(got) == 240
    for d in data[::37]:
        assert got[d["__key__"]]["json"] == d["json"] and got[d["__key__"]]["txt"] == d["txt"]


@pytest.mark.parametrize(
    ("kw", "match"),
    [
        ({"compress": ("json.x",)}, "without dots"),
        ({"compress": 3}, "expected True"),
        ({"zstd_dict": 10}, "zstd_dict=10"),
        ({"zstd_dict_samples": 0}, "zstd_dict_samples=0"),
        ({"zstd_level": 99}, "zstd_level=99"),
    ],
)
def test_bad_options(tmp_path: Path, kw: dict[str, Any], match: str) -> None:
    with pytest.raises(tarindex.errors.WriterError, match=match):
        tarindex.ShardWriter(str(tmp_path / "x-%02d.tar"), **kw)


def test_ext_and_compressed_ext_in_one_sample(tmp_path: Path) -> None:
    with tarindex.ShardWriter(str(tmp_path / "x-%02d.tar"), compress=("json",)) as w:
        with pytest.raises(tarindex.errors.WriterError, match="'json.zst' twice"):
            w.write({"__key__": "a", "json": [1], "json.zst": [2]})
    (p,) = write(tmp_path / "y-%02d.tar", [{"__key__": "a", "txt": "x", "txt.zst": "y"}])
    with pytest.raises(tarindex.DecodeError, match="both decode to 'txt'"):
        ExtDecoder()(tarindex.ShardSet(p).sample(0))
