"""Gzip-compressed shards (docs/FORMAT.md §10): indexed without recompressing, read at random
and streamed, checked against their compressed file, compared with webdataset 1.0.2."""

from __future__ import annotations

import gzip
import io
import os
import random
import shutil
import subprocess
import tarfile
from pathlib import Path

import numpy as np
import pytest

import tarindex
from tarindex.errors import (
    ChecksumError,
    FormatError,
    StaleIndexError,
    TarIndexError,
    TruncatedError,
)
from tarindex.format.index import decode_index
from tarindex.read import ShardReader
from tarindex.storage.gzsource import GzipSource
from tests.remote_server import serve

GNU_TAR = shutil.which("tar")


def _tree(d: Path, n: int, seed: int = 0) -> dict[str, dict[str, bytes]]:
    """``n`` samples as loose files (bin of random size, cls, txt); returns them by key."""
    rng = np.random.default_rng(seed)
    d.mkdir(parents=True)
    want: dict[str, dict[str, bytes]] = {}
    for i in range(n):
        k = f"{i:06d}"
        s = {
            "bin": rng.integers(0, 256, int(rng.integers(0, 6000)), dtype=np.uint8).tobytes(),
            "cls": str(i % 10).encode(),
            "txt": (f"sample {i} " * int(rng.integers(1, 50))).encode(),
        }
        for ext, data in s.items():
            (d / f"{k}.{ext}").write_bytes(data)
        want[k] = s
    return want


def _gnu_tgz(
    tmp_path: Path, n: int = 400, name: str = "s.tar.gz"
) -> tuple[str, dict[str, dict[str, bytes]]]:
    if GNU_TAR is None:
        pytest.skip("GNU tar is not installed")
    want = _tree(tmp_path / "files", n)
    out = str(tmp_path / name)
    names = sorted(os.listdir(tmp_path / "files"))
    subprocess.run(
        [GNU_TAR, "--sort=name", "-czf", out, "-C", str(tmp_path / "files"), *names], check=True
    )
    return out, want


def _as_dict(s: dict[str, object]) -> dict[str, bytes]:
    return {k: bytes(v) for k, v in s.items() if not k.startswith("__")}  # type: ignore[call-overload]


def test_gnu_tar_gz_random_access_matches_the_files(tmp_path: Path) -> None:
    tgz, want = _gnu_tgz(tmp_path)
    t = tarindex.build_index(tgz, gzip_spacing=1 << 16)
    assert t.gzip is not None and t.member_crc is not None
    assert t.gzip.gz_size == os.path.getsize(tgz)
    ds = tarindex.TarDataset(tgz)
    assert len(ds) == len(want)
    order = list(range(len(ds)))
    random.Random(0).shuffle(order)
    for i in order:
        s = ds[i]
        assert _as_dict(s) == want[s["__key__"]]
    # batches (__getitems__) and streaming in shard order read the same samples
    batch = ds.__getitems__(order[:50])
    assert [b["__key__"] for b in batch] == [ds[i]["__key__"] for i in order[:50]]
    stream = tarindex.TarIterableDataset(tgz, shuffle=False)
    got = [(_as_dict(s), s["__key__"]) for s in stream]
    assert [k for _, k in got] == sorted(want)
    assert all(d == want[k] for d, k in got)
    shuffled = tarindex.TarIterableDataset(tgz, shuffle=True, seed=3)
    assert sorted(s["__key__"] for s in shuffled) == sorted(want)


def test_same_index_tables_as_the_plain_tar(tmp_path: Path) -> None:
    """The index of x.tar.gz describes the tar inside: its tables equal those of x.tar."""
    tgz, _ = _gnu_tgz(tmp_path, 50)
    plain = str(tmp_path / "s.tar")
    with gzip.open(tgz, "rb") as f, open(plain, "wb") as o:
        shutil.copyfileobj(f, o)
    a = tarindex.build_index(tgz)
    b = tarindex.build_index(plain, checksums=True)
    assert a.tables_bytes() == b.tables_bytes()
    assert a.member_crc is not None and b.member_crc is not None
    assert a.member_crc.tolist() == b.member_crc.tolist()
    assert a.tar_size == os.path.getsize(plain) and b.gzip is None


def test_a_read_inflates_at_most_one_span(tmp_path: Path) -> None:
    """ds[i] decompresses at most one seek-point span (plus the buffer and the member)."""
    tgz, _ = _gnu_tgz(tmp_path, 600)
    spacing = 1 << 16
    t = tarindex.build_index(tgz, gzip_spacing=spacing)
    assert t.tar_size > 8 * spacing  # many spans
    r = ShardReader(tgz)
    src = r.source
    assert isinstance(src, GzipSource)
    rng = random.Random(1)
    for _ in range(60):
        j = rng.randrange(r.n_samples)
        before = src.inflated
        r.sample(j)
        sp = t.sample_ptr
        size = int(t.offset[sp[j + 1] - 1] + t.size[sp[j + 1] - 1] - t.offset[sp[j]])
        assert src.inflated - before <= spacing + (64 << 10) + size
    r.close()


def test_webdataset_tgz_same_samples_as_webdataset(tmp_path: Path) -> None:
    """A .tgz written by webdataset's TarWriter: WebDataset and tarindex yield the same samples."""
    wds = pytest.importorskip("webdataset")
    path = str(tmp_path / "w.tgz")
    rng = np.random.default_rng(2)
    with wds.TarWriter(path) as w:  # .tgz: webdataset gzips the stream
        for i in range(120):
            w.write(
                {
                    "__key__": f"k{i:04d}",
                    "txt": f"text {i}",
                    "bin": rng.integers(0, 256, int(rng.integers(0, 3000)), np.uint8).tobytes(),
                    "cls": str(i % 7),
                }
            )
    with open(path, "rb") as f:
        assert f.read(2) == b"\x1f\x8b"
    theirs = [
        {k: v for k, v in s.items() if not k.startswith("__")} | {"__key__": s["__key__"]}
        for s in wds.WebDataset(path, shardshuffle=False)
    ]
    tarindex.build_index(path)
    ours = [
        _as_dict(s) | {"__key__": s["__key__"]}
        for s in tarindex.TarIterableDataset(path, shuffle=False)
    ]
    assert ours == theirs
    ds = tarindex.TarDataset(path)
    assert [_as_dict(ds[i]) | {"__key__": ds[i]["__key__"]} for i in range(len(ds))] == theirs


def test_a_changed_tar_gz_is_stale(tmp_path: Path) -> None:
    tgz, _ = _gnu_tgz(tmp_path, 80)
    tarindex.build_index(tgz)
    plain = gzip.decompress(Path(tgz).read_bytes())
    # the same tar recompressed (other level): other compressed bytes, same tar inside
    Path(tgz).write_bytes(gzip.compress(plain, 1, mtime=0))
    with pytest.raises(StaleIndexError, match="tarindex index --force"):
        tarindex.TarDataset(tgz)[0]
    tarindex.build_index(tgz)
    assert len(tarindex.TarDataset(tgz)) == 80
    with open(tgz, "ab") as f:  # appended to
        f.write(gzip.compress(b"x" * 1024))
    with pytest.raises(StaleIndexError, match="compressed file is"):
        ShardReader(tgz)


def test_bytes_changed_inside_never_read_wrong(tmp_path: Path) -> None:
    """Compressed bytes changed in place (size, first and last 4 KiB kept): every read is
    either the true sample or an error, never other bytes (members are crc32-checked)."""
    tgz, want = _gnu_tgz(tmp_path, 300)
    tarindex.build_index(tgz, gzip_spacing=1 << 16)
    data = bytearray(Path(tgz).read_bytes())
    assert len(data) > 3 * 4096
    rng = random.Random(5)
    for _ in range(40):
        at = rng.randrange(4096, len(data) - 4096)
        data[at] ^= 1 << rng.randrange(8)
    Path(tgz).write_bytes(bytes(data))
    ok = bad = 0
    try:
        ds = tarindex.TarDataset(tgz)
        for i in range(len(ds)):
            try:
                s = ds[i]
            except TarIndexError as e:
                # the open-time header checks (StaleIndexError) run at the first read of the shard
                assert isinstance(e, (FormatError, ChecksumError, TruncatedError, StaleIndexError))
                bad += 1
                continue
            assert _as_dict(s) == want[s["__key__"]]
            ok += 1
    except (FormatError, StaleIndexError):  # the open-time header checks caught it
        bad += 1
    assert bad > 0


def test_truncated_and_corrupt_gzip_are_refused_at_index_time(tmp_path: Path) -> None:
    tgz, _ = _gnu_tgz(tmp_path, 100)
    data = Path(tgz).read_bytes()
    cut = tmp_path / "cut.tar.gz"
    cut.write_bytes(data[: len(data) // 2])
    with pytest.raises(TruncatedError, match="cut.tar.gz"):
        tarindex.build_index(str(cut))
    assert not os.path.exists(str(cut) + ".tidx")
    crc = tmp_path / "crc.tar.gz"
    crc.write_bytes(data[:-8] + bytes([data[-8] ^ 1]) + data[-7:])  # the trailer's crc32
    with pytest.raises(FormatError, match="crc.tar.gz"):
        tarindex.build_index(str(crc))
    with pytest.raises(ValueError, match="gzip_spacing"):
        tarindex.build_index(tgz, gzip_spacing=1000)


def test_multi_member_gzip(tmp_path: Path) -> None:
    """``cat a.gz b.gz`` (and bgzip's blocks) is one stream, as gunzip reads it."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.USTAR_FORMAT) as tf:
        for i in range(200):
            d = (f"member {i} " * 300).encode()
            ti = tarfile.TarInfo(f"{i:04d}.txt")
            ti.size = len(d)
            tf.addfile(ti, io.BytesIO(d))
    raw = buf.getvalue()
    cuts = [0, len(raw) // 3, 2 * len(raw) // 3, len(raw)]
    path = tmp_path / "multi.tar.gz"
    path.write_bytes(
        b"".join(gzip.compress(raw[a:b], mtime=0) for a, b in zip(cuts, cuts[1:], strict=False))
    )
    tarindex.build_index(str(path), gzip_spacing=1 << 16)
    ds = tarindex.TarDataset(str(path))
    assert len(ds) == 200
    for i in (0, 67, 133, 199, 100):
        assert ds[i]["txt"] == (f"member {i} " * 300).encode()


@pytest.mark.parametrize(
    ("opener", "magic_name"),
    [("zstd", "zstd"), ("xz", "xz"), ("bz2", "bzip2")],
)
def test_other_compressions_are_read_through_a_copy(
    tmp_path: Path, opener: str, magic_name: str
) -> None:
    """bzip2/xz/zstd have no seek points: indexed and read through a decompressed copy
    (FORMAT.md §11; the rest is tests/index/test_packed.py)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.USTAR_FORMAT) as tf:
        ti = tarfile.TarInfo("a.txt")
        ti.size = 2
        tf.addfile(ti, io.BytesIO(b"hi"))
    if opener == "zstd":
        import zstandard

        comp = zstandard.ZstdCompressor().compress(buf.getvalue())
        ext = "zst"
    elif opener == "xz":
        import lzma

        comp, ext = lzma.compress(buf.getvalue()), "xz"
    else:
        import bz2

        comp, ext = bz2.compress(buf.getvalue()), "bz2"
    p = tmp_path / f"x.tar.{ext}"
    p.write_bytes(comp)
    t = tarindex.build_index(str(p))
    assert t.gzip is None and t.meta["compressed"]["format"] == magic_name
    assert tarindex.TarDataset(str(p))[0]["txt"] == b"hi"


def test_remote_tar_gz(tmp_path: Path) -> None:
    """A .tar.gz served over HTTP with its index beside it: ranged reads of the compressed file."""
    tgz, want = _gnu_tgz(tmp_path / "srv", 800)
    t = tarindex.build_index(tgz, gzip_spacing=1 << 16)
    assert t.gzip is not None and len(t.gzip.points) > 1 << 20  # seek points past 1 MiB
    with serve(os.path.dirname(tgz)) as srv:
        ds = tarindex.TarDataset(srv.url + "/s.tar.gz")
        for i in (0, 799, 57, 3):
            s = ds[i]
            assert _as_dict(s) == want[s["__key__"]]
        assert srv.bytes_for(".tar.gz") < os.path.getsize(tgz) * 4


def test_index_file_holds_the_seek_points(tmp_path: Path) -> None:
    tgz, _ = _gnu_tgz(tmp_path, 50)
    tarindex.build_index(tgz)
    t = decode_index(memoryview(Path(tgz + ".tidx").read_bytes()), tgz + ".tidx", check_crc=True)
    assert t.gzip is not None and bytes(t.gzip.points[:5]) == b"GZIDX"
    assert t.gzip.spacing == 1 << 20
