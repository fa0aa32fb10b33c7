"""``EXT.gz`` members (webdataset's ``gzfilter``): decoded like ``EXT.zst``, within the budget."""

from __future__ import annotations

import gzip
import io
import json
import tarfile
import tracemalloc
import warnings
import zlib
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import zstandard

import tarindex
from tarindex import DecodeError
from tarindex.codecs import (
    COMPRESSION_SUFFIXES,
    ExtDecoder,
    compress,
    compression_layers,
    decode_value,
    encode,
    strip_compression,
)

wds = pytest.importorskip("webdataset")

MiB = 1 << 20
GiB = 1 << 30
ARR = np.arange(24, dtype=np.float32).reshape(2, 3, 4)


def _gz_zeros(mib: int, isize: int | None = None) -> bytes:
    """A gzip member of ``mib`` MiB of zero bytes, built without compressing them all.

    One 1 MiB deflate block ending in a full flush (the compressor's state reset) repeats
    as is, then an empty final block and the trailer. ``isize``: the trailer's size field
    instead of the true size mod 2**32 (a lying trailer).
    """
    zero = bytes(MiB)
    c = zlib.compressobj(9, zlib.DEFLATED, -15)  # raw deflate
    block = c.compress(zero) + c.flush(zlib.Z_FULL_FLUSH)
    crc = 0
    for _ in range(mib):
        crc = zlib.crc32(zero, crc)
    size = mib * MiB if isize is None else isize
    head = b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x02\xff"  # deflate, no name, mtime 0
    tail = crc.to_bytes(4, "little") + (size % (1 << 32)).to_bytes(4, "little")
    return head + block * mib + b"\x03\x00" + tail  # \x03\x00: final empty fixed block


def _tar(path: Path, members: dict[str, bytes]) -> str:
    """A tar made by Python's tarfile (GNU format), with its tarindex index."""
    with tarfile.open(path, "w", format=tarfile.GNU_FORMAT) as tf:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size, info.mtime = len(data), 0
            tf.addfile(info, io.BytesIO(data))
    tarindex.build_index(str(path))
    return str(path)


def _wds(path: str) -> list[dict[str, Any]]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return list(wds.WebDataset(path, shardshuffle=False).decode())


def _ours(path: str, **kw: Any) -> tuple[list[Any], list[Any]]:
    """Every sample of ``path`` read by both datasets, in order."""
    mapped = tarindex.TarDataset(path, **kw)
    stream = tarindex.TarIterableDataset(path, shuffle=False, **kw)
    return [mapped[i] for i in range(len(mapped))], list(stream)


def _same(a: Any, b: Any) -> None:
    if isinstance(a, np.ndarray):
        assert isinstance(b, np.ndarray) and a.dtype == b.dtype
        np.testing.assert_array_equal(a, b)
    else:
        assert type(a) is type(b) and a == b, (a, b)


@pytest.fixture(scope="module")
def wds_shard(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A shard written by webdataset's TarWriter (it gzips ``.gz`` members), then indexed."""
    path = str(tmp_path_factory.mktemp("gz") / "w-000000.tar")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with wds.TarWriter(path) as w:
            for i in range(6):
                w.write(
                    {
                        "__key__": f"{i:04d}",
                        "json.gz": {"i": i, "caption": "a cat é " * i},
                        "txt.gz": f"caption {i} é",
                        "npy.gz": ARR + i,
                        "cls": i,
                    }
                )
    tarindex.build_index(path)
    return path


def test_webdataset_shard_decodes_as_webdataset_decodes_it(wds_shard: str) -> None:
    raw = tarindex.TarDataset(wds_shard).raw(2)
    assert [k for k in raw if not k.startswith("__")] == ["cls", "json.gz", "npy.gz", "txt.gz"]
    assert raw["txt.gz"][:2] == b"\x1f\x8b"  # stored gzipped: raw samples show the tar's bytes
    theirs = _wds(wds_shard)
    assert len(theirs) == 6
    for ours in _ours(wds_shard, decode=True):
        assert len(ours) == 6
        for mine, wd in zip(ours, theirs, strict=True):
            assert mine["__key__"] == wd["__key__"]
            # the decoded value keeps the stored name, as in webdataset (issue 22 item 3)
            names = sorted(k for k in mine if not k.startswith("__"))
            assert names == ["cls", "json.gz", "npy.gz", "txt.gz"]
            assert names == sorted(k for k in wd if not k.startswith("__"))
            for ext in ("json", "txt", "npy"):
                _same(mine[ext + ".gz"], wd[ext + ".gz"])
            _same(mine["cls"], wd["cls"])
    assert _ours(wds_shard, decode=True)[0][3]["json.gz"] == {"i": 3, "caption": "a cat é " * 3}


def test_handlers_see_the_inner_key_and_gunzipped_bytes_as_in_webdataset(wds_shard: str) -> None:
    class Record:
        def __init__(self) -> None:
            self.calls: list[tuple[str, bytes]] = []

        def __call__(self, key: str, data: bytes) -> Any:
            self.calls.append((key, bytes(data)))
            return None

    mine, theirs = Record(), Record()
    ds = tarindex.TarDataset(wds_shard, decode=[mine])
    got = [ds[i] for i in range(len(ds))]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        list(wds.WebDataset(wds_shard, shardshuffle=False).decode(theirs))
    assert sorted(mine.calls) == sorted(theirs.calls)
    assert (".json", json.dumps({"i": 1, "caption": "a cat é "}).encode()) in mine.calls
    assert got[1]["txt.gz"] == "caption 1 é"  # None from the handler: the built-ins decode it


def test_tarfile_shard_multi_member_and_padding(tmp_path: Path) -> None:
    """gzip streams from Python's gzip; multi-member and zero-padded ones, as gzip reads them."""
    text = "première ligne\n".encode()
    two = gzip.compress(text, mtime=0) + gzip.compress(b"second\n", mtime=7)  # cat a.gz b.gz
    members = {
        "a.json.gz": gzip.compress(b'{"x": [1, 2]}'),
        "a.txt.gz": two + bytes(5),  # zero padding after the members is skipped
        "a.npy.gz": gzip.compress(_npy(ARR)),
        "b.json.gz": gzip.compress(b"[]", compresslevel=1),
        "b.txt.gz": b"",  # empty data: empty output, as gzip.decompress(b"")
        "b.npy.gz": gzip.compress(_npy(ARR[0])) + bytes(3) + gzip.compress(b""),
    }
    path = _tar(tmp_path / "t-000000.tar", members)
    theirs = _wds(path)
    for ours in _ours(path, decode=True):
        for mine, wd in zip(ours, theirs, strict=True):
            for ext in ("json.gz", "txt.gz", "npy.gz"):
                _same(mine[ext], wd[ext])
        assert ours[0]["txt.gz"] == "première ligne\nsecond\n" and ours[1]["txt.gz"] == ""
        assert ours[0]["json.gz"] == {"x": [1, 2]} and ours[1]["json.gz"] == []
        np.testing.assert_array_equal(ours[1]["npy.gz"], ARR[0])
    assert decode_value("bin.gz", two) == gzip.decompress(two)


def _npy(a: np.ndarray[Any, Any]) -> bytes:
    buf = io.BytesIO()
    np.save(buf, a)
    return buf.getvalue()


def test_select_finds_gz_members(wds_shard: str) -> None:
    sel = tarindex.to_tuple("json", "txt;cls", "npy")
    assert sel.fields is not None
    assert {"json.gz", "json.zst", "txt.gz", "npy.gz"} <= sel.fields
    theirs = _wds(wds_shard)
    for ours in _ours(wds_shard, decode=True, select=sel):
        assert len(ours) == 6
        for (j, t, a), wd in zip(ours, theirs, strict=True):
            _same(j, wd["json.gz"])
            _same(t, wd["txt.gz"])
            _same(a, wd["npy.gz"])
    # webdataset's own spelling selects the same member
    for ours in _ours(wds_shard, decode=True, select=("json.gz", "npy.gz")):
        assert [j["i"] for j, _ in ours] == list(range(6))
    # undecoded: the stored member's bytes; the projection read only the selected members
    raw = tarindex.TarDataset(wds_shard, select=("json",))[4]
    assert raw == (tarindex.TarDataset(wds_shard).raw(4)["json.gz"],)
    assert gzip.decompress(raw[0]) == json.dumps({"i": 4, "caption": "a cat é " * 4}).encode()


def _peak(f: Any, *args: Any) -> tuple[BaseException, int]:
    """Call ``f(*args)``, which must raise: ``(the exception, peak bytes traced meanwhile)``."""
    tracemalloc.start()
    try:
        with pytest.raises(DecodeError) as ei:
            f(*args)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    return ei.value, peak


def test_gzip_bomb_is_refused_without_its_output(tmp_path: Path) -> None:
    # 1 GiB + 1 MiB of zeros: a 1 MB member, over the default 1 GiB budget
    bomb = _gz_zeros(1025)
    assert len(bomb) < 2 * MiB
    liar = bomb[:-4] + bytes(4)  # a trailer whose size field says 0: it is not trusted anyway
    path = _tar(tmp_path / "b-000000.tar", {"k1.json.gz": bomb, "k2.json.gz": liar})
    err, peak = _peak(tarindex.TarDataset(path, decode=True).__getitem__, 0)
    # counted while inflating, refused one 1 MiB step past the budget, holding <= 64 MiB
    assert peak < 64 * MiB + 8 * MiB, peak
    msg = str(err)
    head = f"{path}: sample 'k1', extension 'json.gz': gzip stream expands to at least"
    assert msg.startswith(head), msg
    assert f"more than the {GiB} left" in msg and err.__cause__ is None
    assert "max_decompressed_bytes" in msg
    budget = 256 * MiB
    small = tarindex.TarDataset(path, decode=ExtDecoder(max_decompressed_bytes=budget))
    err, peak = _peak(small.__getitem__, 1)
    assert str(err).startswith(head.replace("k1", "k2")), str(err)
    assert f"more than the {budget} left" in str(err) and peak < 72 * MiB, peak
    stream = tarindex.TarIterableDataset(
        path, shuffle=False, decode=ExtDecoder(max_decompressed_bytes=budget), fields=("json.gz",)
    )
    with pytest.raises(DecodeError, match="sample 'k1', extension 'json.gz'"):
        next(iter(stream))
    # the budget is shared by a sample's members: two 3 MiB streams do not fit in 5 MiB
    ok = _gz_zeros(3)
    sample = {"__shard__": "s.tar", "__key__": "k", "a.bin.gz": ok, "b.bin.gz": ok}
    with pytest.raises(DecodeError) as ei:
        ExtDecoder(max_decompressed_bytes=5 * MiB)(sample)
    says = "s.tar: sample 'k', extension 'b.bin.gz': gzip stream expands to at least"
    assert str(ei.value).startswith(says) and f"more than the {2 * MiB} left" in str(ei.value)
    assert sample["a.bin.gz"] == bytes(3 * MiB)  # the first one fit
    got = ExtDecoder(max_decompressed_bytes=6 * MiB)(
        {"__key__": "k", "a.bin.gz": ok, "b.bin.gz": ok}
    )
    assert got == {"__key__": "k", "a.bin.gz": bytes(3 * MiB), "b.bin.gz": bytes(3 * MiB)}
    assert decode_value("bin.gz", ok, max_decompressed_bytes=3 * MiB) == bytes(3 * MiB)
    with pytest.raises(DecodeError, match=f"budget of {3 * MiB - 1} bytes"):
        decode_value("bin.gz", ok, max_decompressed_bytes=3 * MiB - 1)


def test_output_over_the_held_bound_is_counted_then_inflated_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    rng = np.random.default_rng(0)
    data = rng.integers(0, 4, 3 * MiB + 123, dtype=np.uint8).tobytes()
    part = (data[: MiB + 1], data[MiB + 1 :])
    gz = b"".join(gzip.compress(p, compresslevel=1, mtime=0) for p in part)
    monkeypatch.setattr(compress, "GZ_KEEP", MiB)  # a smaller bound to hold while inflating
    assert decode_value("bin.gz", gz) == data
    with pytest.raises(DecodeError, match="gzip stream expands to at least"):
        decode_value("bin.gz", gz, max_decompressed_bytes=len(data) - 1)


_GOOD = gzip.compress(json.dumps({"caption": "x" * 300, "n": list(range(50))}).encode())
_CORRUPT = {  # case: (bytes, what the message says)
    "not-gzip": (b'{"caption": "plain json"}', "cannot inflate gzip member 1 at byte 0"),
    "flipped": (_GOOD[:20] + bytes([_GOOD[20] ^ 0xFF]) + _GOOD[21:], "gzip"),
    "crc": (_GOOD[:-8] + bytes([_GOOD[-8] ^ 1]) + _GOOD[-7:], "incorrect data check"),
    "size": (_GOOD[:-4] + (len(_GOOD) + 1).to_bytes(4, "little"), "incorrect length check"),
    "truncated": (_GOOD[: len(_GOOD) // 2], "gzip stream is truncated: member 1"),
    "trailing-garbage": (_GOOD + b"\1" * 8, f"cannot inflate gzip member 2 at byte {len(_GOOD)}"),
    "second-member": (_GOOD + gzip.compress(b"[1]")[:-6], "truncated: member 2"),
}


@pytest.mark.parametrize("case", list(_CORRUPT))
def test_corrupt_gzip_member_names_the_member(tmp_path: Path, case: str) -> None:
    bad, says = _CORRUPT[case]
    path = _tar(tmp_path / "c-000000.tar", {"k0.json.gz": _GOOD, "k1.json.gz": bad})
    for ds in (
        tarindex.TarDataset(path, decode=True),
        tarindex.TarIterableDataset(path, shuffle=False, decode=True),
    ):
        with pytest.raises(DecodeError) as ei:
            list(ds) if isinstance(ds, tarindex.TarIterableDataset) else ds[1]
        msg = str(ei.value)
        assert msg.startswith(f"{path}: sample 'k1', extension 'json.gz': "), msg
        assert says in msg, msg
        if "truncated" not in msg:
            assert isinstance(ei.value.__cause__, zlib.error), msg
    with warnings.catch_warnings():  # webdataset refuses the same bytes
        warnings.simplefilter("ignore")
        with pytest.raises(wds.autodecode.DecodingError):
            list(wds.WebDataset(path, shardshuffle=False).decode())
    assert tarindex.TarDataset(path, decode=True)[0]["json.gz"]["n"] == list(range(50))


def test_entry_names_nesting_and_collisions() -> None:
    assert COMPRESSION_SUFFIXES == (".zst", ".gz")
    assert compression_layers("npy.gz.zst") == (".zst", ".gz")
    assert strip_compression("meta.json.gz") == "meta.json"
    assert strip_compression("gz") == "gz" and compression_layers("zst") == ()
    assert strip_compression("json.GZ") == "json.GZ"  # case-sensitive, as webdataset
    inner = gzip.compress(_npy(ARR))
    both = zstandard.ZstdCompressor().compress(inner)
    np.testing.assert_array_equal(decode_value("npy.gz.zst", both), ARR)
    np.testing.assert_array_equal(decode_value("npy.gz.gz", gzip.compress(inner)), ARR)
    # a member whose whole extension is "gz" is not a compressed member: it stays bytes
    assert decode_value("gz", inner) == inner
    # json and json.gz side by side: two entries, as in webdataset (issue 22 item 3)
    sample = {"__key__": "k", "json": b"1", "json.gz": gzip.compress(b"2")}
    assert ExtDecoder()(sample) == {"__key__": "k", "json": 1, "json.gz": 2}
    # json and json.zst (tarindex's own compressed members, served as json) still collide
    sample = {"__key__": "k", "json": b"1", "json.zst": zstandard.ZstdCompressor().compress(b"2")}
    with pytest.raises(DecodeError, match="extensions 'json' and 'json.zst' both decode to 'json'"):
        ExtDecoder()(sample)


def test_writer_gzips_dot_gz_deterministically(tmp_path: Path) -> None:
    assert set(compress.COMPRESSORS) == set(COMPRESSION_SUFFIXES)  # one table, both sides
    runs = []
    for run in range(2):
        with tarindex.ShardWriter(str(tmp_path / f"r{run}-%06d.tar"), mtime=0) as w:
            for i in range(3):
                w.write({"__key__": f"{i}", "json.gz": {"i": i}, "txt.gz": "é" * i, "cls": i})
        ds = tarindex.TarDataset(str(tmp_path / f"r{run}-000000.tar"))
        runs.append([{k: v for k, v in ds.raw(i).items() if k != "__shard__"} for i in range(3)])
    assert runs[0] == runs[1]  # mtime 0 in every gzip header: the same members every run
    path = str(tmp_path / "r0-000000.tar")
    raw = tarindex.TarDataset(path).raw(2)
    assert gzip.decompress(raw["json.gz"]) == b'{"i": 2}' and raw["json.gz"][4:8] == bytes(4)
    theirs = _wds(path)
    for ours in _ours(path, decode=True):
        assert [(s["json.gz"], s["txt.gz"]) for s in ours] == [
            (t["json.gz"], t["txt.gz"]) for t in theirs
        ]
    assert encode.encode_value("txt.gz", "hi") == gzip.compress(b"hi", 6, mtime=0)
