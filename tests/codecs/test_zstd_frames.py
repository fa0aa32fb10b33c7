"""``.zst`` members of several frames (``cat a.zst b.zst``) decode to all of them, as ``zstd -d``.

Issue 19 item 4: every frame is decoded (with and without a size in its header, with the
shard's dictionary too), skippable frames are skipped, and bytes after the last frame that
are not a frame are a DecodeError naming the member, as they are for ``.gz``. The per-sample
budget counts every frame.
"""

from __future__ import annotations

import io
import random
import shutil
import struct
import subprocess
import tarfile
import tracemalloc
from pathlib import Path
from typing import Any

import pytest
import zstandard

import tarindex
from tarindex.codecs import ExtDecoder, ZstdDecodeError, decode_value, zstd_compress
from tarindex.format.spec import ZSTD_DICT_MEMBER
from tarindex.index.build import build_index

ZSTD = shutil.which("zstd")
TEXT = [f"frame {i}: the quick brown fox jumps over the lazy dog. " * (i + 1) for i in range(5)]


def _frame(data: bytes, *, size: bool = True, checksum: bool = False, zd: Any = None) -> bytes:
    cctx = zstandard.ZstdCompressor(dict_data=zd, write_content_size=size, write_checksum=checksum)
    if size:
        return cctx.compress(data)
    cobj = cctx.compressobj()  # a streamed frame: no size in its header, whatever the input
    return cobj.compress(data) + cobj.flush()


def _skippable(payload: bytes, nibble: int = 0xA) -> bytes:
    return struct.pack("<II", 0x184D2A50 | nibble, len(payload)) + payload


def test_concatenated_frames_decode_to_every_frame() -> None:
    hello = zstd_compress(b"hello ") + zstd_compress(b"world")  # what `cat a.zst b.zst` makes
    assert decode_value("txt.zst", hello) == "hello world"
    assert decode_value("bin.zst", hello) == b"hello world"
    parts = [t.encode() for t in TEXT]
    for size in (True, False):
        frames = [_frame(p, size=size, checksum=i % 2 == 1) for i, p in enumerate(parts)]
        assert zstandard.frame_content_size(frames[0]) == (len(parts[0]) if size else -1)
        assert decode_value("txt.zst", b"".join(frames)) == "".join(TEXT)
    mixed = _frame(parts[0]) + _frame(b"", size=False) + _frame(parts[1], size=False)
    assert decode_value("txt.zst", mixed + _frame(b"")) == TEXT[0] + TEXT[1]
    many = b"".join(zstd_compress(bytes([i])) for i in range(200))
    assert decode_value("bin.zst", many) == bytes(range(200))
    # skippable frames (RFC 8878 §3.1.2) carry no output and are skipped, as zstd -d does
    skip = _skippable(b"meta") + _frame(parts[0]) + _skippable(b"", 0) + _frame(parts[1])
    assert decode_value("txt.zst", skip + _skippable(b"x" * 9, 0xF)) == TEXT[0] + TEXT[1]
    # a layer inside another: every frame of each layer
    inner = zstd_compress(b'{"a": ') + zstd_compress(b"1}")
    assert decode_value("json.zst.zst", zstd_compress(inner[:7]) + zstd_compress(inner[7:])) == {
        "a": 1
    }


def test_every_kind_of_frame_and_block_is_walked_to_its_end() -> None:
    """Raw, RLE and compressed blocks, one or many per frame, every header layout."""
    rng = random.Random(19)

    def piece(k: int) -> bytes:
        kind = rng.randrange(3)
        if kind == 0:
            return rng.randbytes(k)  # raw blocks
        if kind == 1:
            return bytes([rng.randrange(256)]) * k  # RLE blocks
        return (b"abcdefgh" * (k // 8 + 1))[:k]  # compressed blocks

    for trial in range(40):
        parts: list[bytes] = []
        frames: list[bytes] = []
        for _ in range(rng.randrange(1, 5)):
            size = rng.choice((0, 1, 255, 256, 65_535, 65_536 + 256, 300_000))
            data = b"".join(piece(size // 3 + 1) for _ in range(3))[:size]
            cctx = zstandard.ZstdCompressor(
                level=rng.choice((-5, 1, 3, 7)),
                write_checksum=rng.random() < 0.5,
                write_content_size=rng.random() < 0.7,
                write_dict_id=False,
            )
            frame = cctx.compress(data)
            if rng.random() < 0.3:  # streamed: no size, often several blocks
                cobj = cctx.compressobj()
                frame = cobj.compress(data) + cobj.flush()
            parts.append(data)
            frames.append(frame)
        joined = b"".join(frames)
        assert decode_value("bin.zst", joined) == b"".join(parts), trial
        with pytest.raises(ZstdDecodeError, match="trailing bytes"):
            decode_value("bin.zst", joined + b"\x00")


def test_trailing_bytes_that_are_not_a_frame_name_the_member() -> None:
    one = zstd_compress(b"hello ")
    big = zstd_compress(b"0123456789abcdef" * 20_000)  # 320 kB, three blocks
    for first in (one, big, _frame(b"hello ", size=False)):
        for tail in (b"garbage!", bytes(4), b"\x28\xb5\x2f"):
            with pytest.raises(ZstdDecodeError) as ei:
                decode_value("txt.zst", first + tail, shard="s.tar", key="k7")
            msg = str(ei.value)
            assert msg.startswith("s.tar: sample 'k7', extension 'txt.zst': "), msg
            n = len(first)
            assert f"{len(tail)} trailing bytes at byte {n} of {n + len(tail)}" in msg, msg
            assert "not a zstd frame" in msg and repr(tail) in msg
            assert isinstance(ei.value, tarindex.DecodeError)
            assert isinstance(ei.value, zstandard.ZstdError)
    # a second frame cut short: its own error, naming the frame and where it starts
    two = zstd_compress(b"world" * 100)
    for size in (True, False):
        cut = one + _frame(b"world" * 100, size=size)[:-3]
        with pytest.raises(ZstdDecodeError, match=rf"zstd frame 2 at byte {len(one)} of "):
            decode_value("bin.zst", cut, shard="s.tar", key="k7")
    with pytest.raises(ZstdDecodeError, match="skippable frame at byte"):
        decode_value("bin.zst", one + _skippable(b"meta")[:-1])
    # the sample decoder too: shard and key from the sample
    with pytest.raises(tarindex.DecodeError, match=r"^x.tar: sample 'k', extension 'bin.zst'"):
        ExtDecoder()({"__key__": "k", "__shard__": "x.tar", "bin.zst": one + two + b"\x01"})


def test_the_budget_counts_every_frame() -> None:
    block = b"x" * 60_000
    for size in (True, False):
        two = _frame(block, size=size) + _frame(block, size=size)
        assert decode_value("bin.zst", two) == block * 2
        assert decode_value("bin.zst", two, max_decompressed_bytes=120_000) == block * 2
        what = "declares 60000" if size else "expands to at least 60000"
        with pytest.raises(
            ZstdDecodeError, match=f"zstd frame.* {what} bytes, more than the 59999"
        ):
            decode_value("bin.zst", two, max_decompressed_bytes=119_999)
    # one budget per sample across members and frames
    dec = ExtDecoder(max_decompressed_bytes=150_000)
    two = zstd_compress(block) + zstd_compress(block)
    with pytest.raises(ZstdDecodeError, match="more than the 30000 left"):
        dec({"__key__": "k", "a.bin.zst": two, "b.bin.zst": two})


def test_a_header_declaring_less_than_the_frame_holds_allocates_no_more() -> None:
    frame = zstandard.ZstdCompressor(write_content_size=True).compress(bytes(50 << 20))
    assert frame[4] == 0x80  # FCS_flag 2 (4 bytes), a window byte: swap in an 8-byte size
    liar = frame[:4] + bytes([0xC0, frame[5]]) + struct.pack("<Q", 100) + frame[10:]
    assert zstandard.frame_content_size(liar) == 100 and len(liar) < 2000
    tracemalloc.start()
    try:
        with pytest.raises(ZstdDecodeError, match="extension 'bin.zst'"):
            decode_value("bin.zst", liar)
        assert tracemalloc.get_traced_memory()[1] < 4 << 20  # not the 50 MiB it holds
    finally:
        tracemalloc.stop()
    with pytest.raises(ZstdDecodeError, match="zstd frame 2 at byte"):
        decode_value("bin.zst", zstd_compress(b"ok") + liar)


def _dictionary(tmp_path: Path) -> tuple[zstandard.ZstdCompressionDict, bytes]:
    """A shard's trained dictionary, and the tar member that holds it."""
    words = "a photo of the small red house by the lake with trees and a dog".split()
    with tarindex.ShardWriter(
        str(tmp_path / "d-%02d.tar"), mtime=0, compress=("txt",), zstd_dict=True
    ) as w:
        for i in range(200):
            w.write({"__key__": f"{i:04d}", "txt": " ".join(words[i % 5 :] + words[: i % 7])})
    (path,) = w.paths
    zd = tarindex.ShardReader(path).zstd_dict()
    assert zd is not None
    with tarfile.open(path) as tf:
        member = tf.extractfile(ZSTD_DICT_MEMBER.decode())
        assert member is not None
        return zd, member.read()


def test_frames_with_the_shards_dictionary(tmp_path: Path) -> None:
    zd, dict_bytes = _dictionary(tmp_path)
    parts = [t.encode() for t in TEXT]
    data = (
        _frame(parts[0], zd=zd)
        + _frame(parts[1], size=False, zd=zd)
        + _frame(parts[2])  # a plain frame between dictionary frames
        + _frame(parts[3], size=False, checksum=True, zd=zd)
    )
    want = "".join(TEXT[:4])
    assert decode_value("txt.zst", data, zstd_dict=zd) == want
    assert ExtDecoder()({"__key__": "k", "txt.zst": data}, zd)["txt"] == want
    with pytest.raises(ZstdDecodeError, match="has no zstd dictionary"):
        decode_value("txt.zst", _frame(parts[0]) + _frame(parts[1], zd=zd))
    # end to end: a tar holding the dictionary member and a member of several frames
    tar = tmp_path / "multi.tar"
    with tarfile.open(tar, "w", format=tarfile.GNU_FORMAT) as tf:
        for name, payload in (
            (ZSTD_DICT_MEMBER.decode(), dict_bytes),
            ("s0.txt.zst", data),
            ("s1.txt.zst", data + b"trailing"),
        ):
            info = tarfile.TarInfo(name)
            info.size = len(payload)
            tf.addfile(info, io.BytesIO(payload))
    build_index(str(tar))
    torch_ds = pytest.importorskip("tarindex.torch.dataset")
    ds = torch_ds.TarDataset(str(tar), decode=True)
    assert ds[0]["txt"] == want
    with pytest.raises(tarindex.DecodeError, match=rf"{tar}: sample 's1', extension 'txt.zst'"):
        ds[1]


@pytest.mark.skipif(ZSTD is None, reason="the zstd command is not installed (apt install zstd)")
def test_files_made_by_the_zstd_command(tmp_path: Path) -> None:
    assert ZSTD is not None
    a, b = tmp_path / "a.txt", tmp_path / "b.txt"
    a.write_bytes(TEXT[2].encode() * 50)
    b.write_bytes(TEXT[4].encode())
    subprocess.run([ZSTD, "-q", "-19", str(a), str(b)], check=True)  # a.txt.zst b.txt.zst
    streamed = subprocess.run(  # from a pipe: no size in the frame header
        [ZSTD, "-q", "-c", "--no-check"], input=b"piped", capture_output=True, check=True
    ).stdout
    assert zstandard.frame_content_size(streamed) == -1
    cat = (tmp_path / "a.txt.zst").read_bytes() + (tmp_path / "b.txt.zst").read_bytes() + streamed
    assert zstandard.get_frame_parameters(cat).has_checksum  # the CLI writes a checksum
    (tmp_path / "cat.zst").write_bytes(cat)
    want = subprocess.run(
        [ZSTD, "-d", "-q", "-c", str(tmp_path / "cat.zst")], capture_output=True, check=True
    ).stdout
    assert want == a.read_bytes() + b.read_bytes() + b"piped"
    assert decode_value("txt.zst", cat) == want.decode()
    bad = subprocess.run(
        [ZSTD, "-d", "-q", "-c"], input=cat + b"junk", capture_output=True, check=False
    )
    assert bad.returncode != 0  # the zstd command refuses trailing bytes too
    with pytest.raises(ZstdDecodeError, match="4 trailing bytes"):
        decode_value("txt.zst", cat + b"junk")
