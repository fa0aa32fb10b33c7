"""Hostile members: decoding is bounded, starts no program, and names shard, key and extension."""

from __future__ import annotations

import io
import json
import os
import pickle
import re
import struct
import subprocess
import sys
import tarfile
import tracemalloc
import warnings
import zlib
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import zstandard
from numpy.typing import NDArray
from PIL import Image, UnidentifiedImageError

import tarindex
from tarindex import DecodeError, TarIndexError
from tarindex.codecs import IMAGE_EXTS, IMAGE_FORMATS, ExtDecoder, decode_value, encode_value
from tarindex.codecs import decode as codecs

MiB = 1 << 20
_LINUX = pytest.mark.skipif(
    not os.path.exists("/proc/self/status"), reason="peak memory read from /proc (VmHWM)"
)
GiB = 1 << 30


def _png(width: int, height: int, bit_depth: int = 1, color_type: int = 0) -> bytes:
    """An all-zero PNG, compressed row by row (its pixels are never held whole)."""

    def chunk(tag: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + tag + body + struct.pack(">I", zlib.crc32(tag + body))

    ihdr = struct.pack(">IIBBBBB", width, height, bit_depth, color_type, 0, 0, 0)
    channels = {0: 1, 2: 3, 3: 1, 4: 2, 6: 4}[color_type]
    row = bytes(1 + (width * channels * bit_depth + 7) // 8)  # filter byte 0, zero pixels
    z = zlib.compressobj(9)
    idat = b"".join(z.compress(row) for _ in range(height)) + z.flush()
    plte = chunk(b"PLTE", bytes(3 * (1 << bit_depth))) if color_type == 3 else b""
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", ihdr)
        + plte
        + chunk(b"IDAT", idat)
        + chunk(b"IEND", b"")
    )


def _zst(n: int, content_size: bool = True) -> bytes:
    """A zstd frame of ``n`` zero bytes, compressed 1 MiB at a time."""
    cctx = zstandard.ZstdCompressor(level=1, write_content_size=content_size)
    c = cctx.compressobj(size=n if content_size else -1)
    zero = bytes(min(n, MiB))
    parts: list[bytes] = []
    left = n
    while left > 0:
        k = min(left, MiB)
        parts.append(c.compress(zero[:k]))
        left -= k
    return b"".join(parts) + c.flush()


def _sample(**members: bytes) -> dict[str, Any]:
    return {"__shard__": "/data/s-000.tar", "__key__": "k1", **members}


def _where(ext: str) -> str:
    return f"/data/s-000.tar: sample 'k1', extension {ext!r}: "


# --- EPS (Ghostscript) under an image extension ------------------------------------------------

EPS_HANDWRITTEN = (
    b"%!PS-Adobe-3.0 EPSF-3.0\n%%BoundingBox: 0 0 16 16\n%%EndComments\n"
    b"newpath 0 0 moveto 16 16 lineto stroke showpage\n%%EOF\n"
)


def _eps_payloads() -> list[bytes]:
    buf = io.BytesIO()
    Image.new("RGB", (16, 16), (255, 0, 0)).save(buf, format="EPS")  # Pillow's own EPS writer
    ps = buf.getvalue()
    # DOS EPS: binary header (magic C5 D0 D3 C6, PostScript offset and length), then PostScript
    dos = struct.pack("<IIIIIIIH", 0xC6D3D0C5, 30, len(ps), 0, 0, 0, 0, 0xFFFF) + ps
    return [ps, EPS_HANDWRITTEN, dos]


_SPAWN_SCRIPT = r"""
import io, json, sys
SPAWN = {"subprocess.Popen", "os.system", "os.exec", "os.posix_spawn", "os.spawn",
         "os.fork", "os.forkpty", "pty.spawn"}
spawned = []
def hook(event, args):
    if event in SPAWN:
        spawned.append(event)
sys.addaudithook(hook)
import tarindex
from tarindex.codecs import ExtDecoder, IMAGE_EXTS
payloads = [open(p, "rb").read() for p in sys.argv[2:]]
results = []
if sys.argv[1] == "pillow":  # the control: Pillow left to sniff the format
    from PIL import Image
    for data in payloads:
        try:
            Image.open(io.BytesIO(data)).load()
            results.append("loaded")
        except Exception as e:
            results.append(type(e).__name__)
else:
    for i, data in enumerate(payloads):
        for ext in sorted(IMAGE_EXTS):
            for mode in ("pil", "rgb8", "l8"):
                try:
                    ExtDecoder(mode)({"__shard__": "s.tar", "__key__": f"k{i}", ext: data})
                    results.append([ext, "DECODED", ""])
                except tarindex.DecodeError as e:
                    results.append([ext, str(e), type(e.__cause__).__name__])
print(json.dumps({"spawned": spawned, "results": results}))
"""


@pytest.mark.skipif(sys.platform == "win32", reason="the fake gs is a shell script")
def test_eps_under_an_image_extension_is_refused_and_starts_no_program(tmp_path: Path) -> None:
    bindir = tmp_path / "bin"
    bindir.mkdir()
    gs = bindir / "gs"  # a fake Ghostscript, first on PATH: it only leaves a marker
    gs.write_text('#!/bin/sh\necho "gs $*" >> "$TARINDEX_GS_MARKER"\nexit 0\n')
    gs.chmod(0o755)
    marker = tmp_path / "gs-was-run"
    files = []
    for i, data in enumerate(_eps_payloads()):
        (tmp_path / f"eps{i}").write_bytes(data)
        files.append(str(tmp_path / f"eps{i}"))
    env = {
        **os.environ,
        "PATH": f"{bindir}{os.pathsep}{os.environ.get('PATH', '')}",
        "TARINDEX_GS_MARKER": str(marker),
    }

    def run(mode: str) -> dict[str, Any]:
        out = subprocess.run(
            [sys.executable, "-c", _SPAWN_SCRIPT, mode, *files],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert out.returncode == 0, out.stderr
        got: dict[str, Any] = json.loads(out.stdout.splitlines()[-1])
        return got

    got = run("tarindex")
    assert not marker.exists(), marker.read_text()
    assert got["spawned"] == []
    assert len(got["results"]) == len(files) * len(IMAGE_EXTS) * 3
    for ext, msg, cause in got["results"]:
        assert msg.startswith("s.tar: sample 'k"), msg
        # the extension's format first, then the other safe ones: never EPS
        assert f"extension {ext!r}: not an image in any of {IMAGE_FORMATS[ext]}, " in msg, msg
        assert "EPS, ...) are never opened" in msg, msg
        assert cause == "UnidentifiedImageError"
    # the control: the same bytes, opened by Pillow without a format list, run "gs"
    control = run("pillow")
    assert marker.exists() and "subprocess.Popen" in control["spawned"], control


def test_eps_in_a_dataset_is_an_error_or_skipped(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    from tarindex import TarDataset, TarIterableDataset

    ok = io.BytesIO()
    Image.new("RGB", (4, 3), (1, 2, 3)).save(ok, format="JPEG")
    path = str(tmp_path / "s.tar")
    with tarindex.ShardWriter(path, maxcount=10, mtime=0) as w:
        w.write({"__key__": "good", "jpg": ok.getvalue(), "cls": 1})
        w.write({"__key__": "evil", "jpg": EPS_HANDWRITTEN, "cls": 2})
    ds = TarDataset(path, decode="rgb8")
    assert ds[0]["jpg"].shape == (3, 4, 3)
    where = re.escape(f"{ds.paths[0]}: sample 'evil', extension 'jpg': not an image in any of JPEG")
    with pytest.raises(DecodeError, match=f"^{where}"):
        ds[1]
    it = TarIterableDataset(path, decode="rgb8", shuffle=False, on_error="skip")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        keys = [s["__key__"] for s in it]
    assert keys == ["good"]
    assert any("evil" in str(c.message) and "not an image" in str(c.message) for c in caught)


def test_image_bytes_of_another_safe_format_decode_by_content() -> None:
    # as webdataset (PIL.Image.open sniffs): a .jpg holding PNG bytes decodes (issue 22)
    png, jpg = io.BytesIO(), io.BytesIO()
    Image.new("RGB", (5, 4), (9, 8, 7)).save(png, format="PNG")
    Image.new("RGB", (5, 4)).save(jpg, format="JPEG")
    got = ExtDecoder("rgb8")(_sample(jpg=png.getvalue()))["jpg"]
    assert got.shape == (4, 5, 3) and got[0, 0].tolist() == [9, 8, 7]
    assert decode_value("seg.png", jpg.getvalue(), "rgb8", key="k1").shape == (4, 5, 3)
    # bytes of no safe format are refused, Pillow's error chained
    with pytest.raises(DecodeError, match="extension 'jpg': not an image in any of JPEG") as ei:
        ExtDecoder("rgb8")(_sample(jpg=b"GIF89a-not-really" + bytes(40)))
    assert isinstance(ei.value.__cause__, UnidentifiedImageError)


@pytest.mark.parametrize("ext", sorted(IMAGE_EXTS))
def test_every_image_extension_round_trips(ext: str) -> None:
    img = Image.new("RGB", (7, 5), (10, 200, 30))
    data = encode_value(ext, img)
    assert Image.open(io.BytesIO(data)).format == IMAGE_FORMATS[ext]
    assert decode_value(ext, data, "rgb8").shape == (5, 7, 3)
    assert decode_value(ext, data, "l8").shape == (5, 7)
    assert decode_value(ext, data, "pil").size == (7, 5)
    assert decode_value(ext, data, "raw") is data


def test_truncated_image_chains_pillows_error() -> None:
    noise = np.random.default_rng(0).integers(0, 256, (64, 64, 3), dtype=np.uint8)
    data = encode_value("png", Image.fromarray(noise))
    with pytest.raises(DecodeError, match=r"cannot decode \d+ bytes as a PNG image") as ei:
        ExtDecoder()(_sample(png=data[: len(data) // 2]))
    assert isinstance(ei.value.__cause__, OSError)


# --- pixel bound -------------------------------------------------------------------------------


def test_pixel_bound_defaults_well_under_pillows() -> None:
    assert codecs.MAX_IMAGE_PIXELS == 1 << 25
    assert (
        Image.MAX_IMAGE_PIXELS is not None and codecs.MAX_IMAGE_PIXELS < Image.MAX_IMAGE_PIXELS / 2
    )
    assert ExtDecoder().max_image_pixels == 1 << 25
    assert ExtDecoder(max_image_pixels=7).max_image_pixels == 7
    for bad in (0, -1, 1.5, True, "9"):
        with pytest.raises(ValueError, match="max_image_pixels"):
            ExtDecoder(max_image_pixels=bad)  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="max_image_pixels"):
            decode_value("png", b"", max_image_pixels=bad)  # type: ignore[arg-type]


def test_image_over_the_pixel_bound_is_refused() -> None:
    png = _png(300, 200, bit_depth=8)
    with pytest.raises(DecodeError) as ei:
        ExtDecoder("l8", max_image_pixels=300 * 200 - 1)(_sample(**{"seg.png": png}))
    assert str(ei.value).startswith(
        _where("seg.png") + "image is 300x200 = 60000 pixels, more than max_image_pixels = 59999"
    )
    assert "ExtDecoder(mode, max_image_pixels=N)" in str(ei.value)
    got = ExtDecoder("l8", max_image_pixels=300 * 200)(_sample(**{"seg.png": png}))
    assert got["seg.png"].shape == (200, 300)
    # the default: one row past 2**25 pixels is refused; exactly 2**25 decodes
    with pytest.raises(DecodeError, match="8192x4097 = 33562624 pixels"):
        decode_value("png", _png(8192, 4097), shard="s.tar", key="k")
    assert decode_value("png", _png(8192, 4096), "pil").size == (8192, 4096)


_HWM = r"""
def hwm_kib():
    # peak resident size of this process image (VmHWM, reset by exec; ru_maxrss is not:
    # it keeps the high-water mark of the forked parent)
    with open("/proc/self/status") as f:
        return int(next(line for line in f if line.startswith("VmHWM:")).split()[1])
"""

_MEM_SCRIPT = (
    _HWM
    + r"""
import json, sys
from PIL import Image
if sys.argv[1] == "off":
    Image.MAX_IMAGE_PIXELS = None  # what users set to silence Pillow's warning
import tarindex
from tarindex.codecs.decode import ExtDecoder
data = open(sys.argv[2], "rb").read()
dec = ExtDecoder("rgb8", max_image_pixels=int(sys.argv[3]) if sys.argv[3] != "-" else None)
before = hwm_kib()
try:
    dec({"__shard__": "s.tar", "__key__": "big", "png": data})
    out = "decoded"
except tarindex.DecodeError as e:
    out = str(e)
after = hwm_kib()
print(json.dumps({"grew_mib": (after - before) / 1024, "out": out}))
"""
)


@_LINUX
def test_a_small_png_of_huge_dimensions_costs_no_memory(tmp_path: Path) -> None:
    """A 20000 x 20000 1-bit PNG is ~60 KB; decoded as rgb8 it would take 1.6 GB."""
    big = tmp_path / "big.png"
    big.write_bytes(_png(20000, 20000))
    assert big.stat().st_size < 500_000
    mid = tmp_path / "mid.png"
    mid.write_bytes(_png(6000, 6000))

    def run(pillow: str, path: Path, bound: str) -> dict[str, Any]:
        out = subprocess.run(
            [sys.executable, "-c", _MEM_SCRIPT, pillow, str(path), bound],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert out.returncode == 0, out.stderr
        got: dict[str, Any] = json.loads(out.stdout.splitlines()[-1])
        return got

    # Pillow's own guard off: tarindex's bound alone refuses it, before decoding
    got = run("off", big, "-")
    assert got["out"].startswith("s.tar: sample 'big', extension 'png': image is 20000x20000")
    assert got["grew_mib"] < 16, got
    # Pillow's guard on (400M > 2 * 89M pixels): its error, named the same way
    got = run("on", big, "-")
    assert got["out"].startswith("s.tar: sample 'big', extension 'png': Image size (400000000")
    assert "MAX_IMAGE_PIXELS" in got["out"] and got["grew_mib"] < 16, got
    # the control: a 36M-pixel image, allowed, does cost its pixels (36 MB "1" + 108 MB RGB)
    got = run("on", mid, str(6000 * 6000))
    assert got["out"] == "decoded" and got["grew_mib"] > 100, got


# --- decompression budget ----------------------------------------------------------------------


@pytest.mark.parametrize("content_size", [True, False], ids=["size-in-header", "no-size"])
def test_zstd_budget_is_shared_by_a_samples_members(content_size: bool) -> None:
    budget = 16 * MiB
    frame = _zst(budget, content_size)
    assert len(frame) < 4096
    sample = _sample(**{"a.bin.zst": frame, "b.bin.zst": frame, "c.bin.zst": frame})
    tracemalloc.start()
    try:
        with pytest.raises(DecodeError) as ei:
            ExtDecoder(max_decompressed_bytes=budget)(sample)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    msg = str(ei.value)
    assert msg.startswith(_where("b.bin.zst") + "zstd frame"), msg
    assert "more than the 0 left of the sample's decompression budget of 16777216 bytes" in msg
    assert "ZSTD_MAX_OUTPUT" in msg and "max_decompressed_bytes" in msg
    assert isinstance(ei.value, zstandard.ZstdError) and isinstance(ei.value, ValueError)
    assert sample["a.bin.zst"] == bytes(budget)  # the first one fit
    assert peak < budget + 4 * MiB, peak  # one member's output, never two
    # halves fit twice, the third is refused
    half = _zst(budget // 2, content_size)
    sample = _sample(**{"a.bin.zst": half, "b.bin.zst": half, "c.txt.zst": half})
    with pytest.raises(DecodeError, match="extension 'c.txt.zst'"):
        ExtDecoder(max_decompressed_bytes=budget)(sample)
    # each call of decode_value has its own budget
    assert decode_value("bin.zst", frame, max_decompressed_bytes=budget) == bytes(budget)
    with pytest.raises(DecodeError, match="budget of 16777215 bytes"):
        decode_value("bin.zst", frame, max_decompressed_bytes=budget - 1)


def test_zstd_defaults_and_errors() -> None:
    assert codecs.ZSTD_MAX_OUTPUT == GiB and ExtDecoder().max_decompressed_bytes == GiB
    assert decode_value("txt.zst", encode_value("txt.zst", "hi")) == "hi"
    assert decode_value("bin.zst", _zst(0, False)) == b""
    assert decode_value("bin.zst", _zst(0, True)) == b""
    assert decode_value("json.zst.zst", encode_value("json.zst.zst", [1])) == [1]
    for bad in (b"not zstd", b"\x28\xb5\x2f\xfd", _zst(5 * MiB, False)[:-20]):
        with pytest.raises(DecodeError, match=r"^s\.tar: sample 'k', extension 'bin\.zst'") as ei:
            decode_value("bin.zst", bad, shard="s.tar", key="k")
        assert isinstance(ei.value, zstandard.ZstdError)
        assert isinstance(ei.value.__cause__, zstandard.ZstdError)
        assert type(ei.value) is tarindex.codecs.ZstdDecodeError
        again = pickle.loads(pickle.dumps(ei.value))  # DataLoader workers pickle errors
        assert type(again) is type(ei.value) and str(again) == str(ei.value)
    for wrong in (-1, 1.0, False):
        with pytest.raises(ValueError, match="max_decompressed_bytes"):
            ExtDecoder(max_decompressed_bytes=wrong)  # type: ignore[arg-type]
    assert (
        ExtDecoder(max_decompressed_bytes=0)(_sample(**{"a.bin.zst": _zst(0)}))["a.bin"] == b""
    )


_BOMB_SCRIPT = (
    _HWM
    + r"""
import json, sys
import tarindex
from tarindex.codecs.decode import ExtDecoder
shards = tarindex.ShardSet(sys.argv[1])
sample = shards.sample(0)
before = hwm_kib()
try:
    ExtDecoder()(sample)
    out = "decoded"
except tarindex.DecodeError as e:
    out = str(e)
first = len(sample["a.bin.zst"])
after = hwm_kib()
print(json.dumps({"grew_mib": (after - before) / 1024, "out": out, "first": first}))
"""
)


@pytest.mark.slow
@_LINUX
def test_three_one_gib_members_of_a_small_tar_cost_one_gib(tmp_path: Path) -> None:
    frame = _zst(GiB)
    tar = tmp_path / "bomb.tar"
    with tarfile.open(tar, "w", format=tarfile.USTAR_FORMAT) as tf:
        for ext in ("a.bin.zst", "b.bin.zst", "c.bin.zst"):
            info = tarfile.TarInfo(f"bomb.{ext}")
            info.size = len(frame)
            tf.addfile(info, io.BytesIO(frame))
    assert tar.stat().st_size < 200_000
    tarindex.build_index(str(tar))
    out = subprocess.run(
        [sys.executable, "-c", _BOMB_SCRIPT, str(tar)], capture_output=True, text=True, timeout=240
    )
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout.splitlines()[-1])
    assert got["out"].startswith(
        f"{tar}: sample 'bomb', extension 'b.bin.zst': zstd frame declares"
    )
    assert got["first"] == GiB
    assert 1000 < got["grew_mib"] < 1024 + 128, got


def test_npz_entries_count_against_the_budget() -> None:
    buf = io.BytesIO()
    np.savez_compressed(buf, x=np.zeros(2 * MiB, np.float64), y=np.arange(3))  # 16 MiB of x
    npz = buf.getvalue()
    assert len(npz) < 100_000
    got = decode_value("npz", npz)
    want = dict(np.load(io.BytesIO(npz)))
    assert got.keys() == want.keys() and all(np.array_equal(got[k], want[k]) for k in want)
    with pytest.raises(DecodeError, match=r"extension 'npz': \.npz entries declare \d+ bytes"):
        decode_value("npz", npz, max_decompressed_bytes=MiB)
    # shared with .zst members of the same sample
    sample = _sample(**{"a.npz": npz, "b.bin.zst": _zst(8 * MiB)})
    with pytest.raises(DecodeError, match="extension 'b.bin.zst'"):
        ExtDecoder(max_decompressed_bytes=20 * MiB)(sample)
    # a non-.npy entry comes back as bytes, as np.load gives it
    zbuf = io.BytesIO()
    import zipfile

    with zipfile.ZipFile(zbuf, "w") as zf:
        zf.writestr("note.txt", b"hello")
        zf.writestr("a.npy", encode_value("npy", np.arange(4)))
    got = decode_value("npz", zbuf.getvalue())
    assert got["note.txt"] == b"hello" and np.array_equal(got["a"], np.arange(4))


# --- .npy headers ------------------------------------------------------------------------------


@pytest.mark.parametrize("version", [(1, 0), (2, 0), (3, 0)])
def test_npy_header_declaring_more_than_the_member_is_refused(version: tuple[int, int]) -> None:
    # the header written by hand, as the NPY format spec lays it out (numpy's own writer is
    # private and moved between versions): magic, version, header length (u2 for 1.0, u4
    # after), the dict literal padded with spaces and a newline to a multiple of 64 bytes
    text = repr({"descr": "<f8", "fortran_order": False, "shape": (1 << 40,)}).encode("latin1")
    lenfmt = "<H" if version[0] == 1 else "<I"
    fixed = 6 + 2 + struct.calcsize(lenfmt)
    pad = -(fixed + len(text) + 1) % 64
    body = text + b" " * pad + b"\n"
    head = b"\x93NUMPY" + bytes(version) + struct.pack(lenfmt, len(body))
    data = head + body + bytes(64)
    with pytest.raises(DecodeError) as ei:
        ExtDecoder()(_sample(npy=data))
    assert str(ei.value).startswith(
        _where("npy") + ".npy header declares shape (1099511627776,) of float64 = 8796093022208 "
        "bytes, but the member holds 64 bytes"
    )


@pytest.mark.parametrize(
    "arr",
    [
        np.arange(12, dtype="<i4").reshape(3, 4),
        np.asfortranarray(np.ones((2, 3))),
        np.array(5.0),
        np.zeros((0, 7), np.uint8),
        np.zeros(3, dtype=[("a", "<i2"), ("b", "<f4", (2,))]),
        np.zeros(3, dtype=[("é", "<i2")]),  # written as format 3.0
    ],
)
def test_npy_still_loads(arr: NDArray[Any]) -> None:
    data = encode_value("npy", arr)
    got = decode_value("npy", data)
    assert got.dtype == arr.dtype and got.shape == arr.shape and np.array_equal(got, arr)
    assert decode_value("npy.zst", encode_value("npy.zst", arr)).shape == arr.shape


def test_npy_bad_or_short_data() -> None:
    data = encode_value("npy", np.arange(100))
    with pytest.raises(DecodeError, match="member holds 400 bytes") as ei:
        decode_value("npy", data[:-400], key="k")
    with pytest.raises(DecodeError, match=r"cannot decode 5 bytes as a \.npy file") as ei:
        decode_value("npy", b"hello")
    assert ei.value.__cause__ is not None
    obj = io.BytesIO()
    np.save(obj, np.array([{"a": 1}], dtype=object), allow_pickle=True)
    with pytest.raises(DecodeError, match="allow_pickle"):
        decode_value("npy", obj.getvalue())


# --- JSON, text, integers: errors name the member and chain the cause ---------------------------


@pytest.mark.parametrize(
    "data", [b"[" * 200_000, b"[" * 100_000 + b"]" * 100_000, b'{"a":' * 100_000 + b"1"]
)
def test_deeply_nested_json_is_a_decode_error(data: bytes) -> None:
    with pytest.raises(DecodeError) as ei:
        ExtDecoder()(_sample(json=data))
    assert str(ei.value).startswith(_where("json") + f"cannot decode {len(data)} bytes as JSON: ")
    assert isinstance(ei.value.__cause__, RecursionError)


@pytest.mark.parametrize(
    ("ext", "data", "cause"),
    [
        ("json", b"{nope", json.JSONDecodeError),
        ("cls", b"12x", ValueError),
        ("cls", b"9" * 5000, ValueError),  # int() refuses more than 4300 digits
        ("txt", b"\xff\xfe", UnicodeDecodeError),
        ("caption.txt", b"\xc3", UnicodeDecodeError),
    ],
)
def test_decoder_errors_name_the_member_and_chain(ext: str, data: bytes, cause: type) -> None:
    with pytest.raises(DecodeError) as ei:
        ExtDecoder()(_sample(**{ext: data, "bin": b"raw"}))
    assert str(ei.value).startswith(_where(ext) + f"cannot decode {len(data)} bytes as ")
    assert type(ei.value.__cause__) is cause
    e = ei.value
    assert isinstance(e, TarIndexError) and isinstance(e, ValueError)
    assert type(e) is DecodeError is tarindex.DecodeError
    again = pickle.loads(pickle.dumps(e))
    assert type(again) is DecodeError and str(again) == str(e)
    assert len(str(e)) < 600


def test_messages_without_shard_or_key_and_usage_errors() -> None:
    with pytest.raises(DecodeError, match=r"^extension 'json': cannot decode"):
        decode_value("json", b"{")
    with pytest.raises(DecodeError, match=r"^sample 'k', extension 'json': cannot decode"):
        ExtDecoder()({"__key__": "k", "json": b"{"})
    for call in (lambda: ExtDecoder("bgr"), lambda: decode_value("png", b"", image="bgr")):
        with pytest.raises(ValueError, match="image mode 'bgr'") as ei:
            call()
        assert not isinstance(ei.value, DecodeError)
    d = ExtDecoder("l8", max_image_pixels=10, max_decompressed_bytes=20)
    again = pickle.loads(pickle.dumps(d))
    assert (again.image, again.max_image_pixels, again.max_decompressed_bytes) == ("l8", 10, 20)
    assert "max_image_pixels=10" in repr(d)
    # the default bounds are taken when a decoder is made, so workers see the same ones
    old = codecs.MAX_IMAGE_PIXELS
    codecs.MAX_IMAGE_PIXELS = 99
    try:
        assert ExtDecoder().max_image_pixels == 99
        made = codecs.make_decoder("rgb8")
        assert isinstance(made, ExtDecoder) and made.max_image_pixels == 99
    finally:
        codecs.MAX_IMAGE_PIXELS = old


def test_import_tarindex_does_not_import_zstandard_or_pillow() -> None:
    code = (
        "import sys, tarindex, tarindex.codecs\n"
        "assert 'zstandard' not in sys.modules and 'PIL' not in sys.modules, sorted(sys.modules)\n"
        "tarindex.codecs.ZstdDecodeError\n"
        "assert 'zstandard' in sys.modules\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_corrupt_bytes_never_pass_for_a_tga_image() -> None:
    # TGA has no magic number: a member that is not TGA by extension is never opened as one,
    # so bytes Pillow would take for a TGA header are an error, not wrong pixels (issue 22)
    tga = io.BytesIO()
    Image.new("RGB", (3, 2), (1, 2, 3)).save(tga, format="TGA")
    with pytest.raises(DecodeError, match="not an image in any of JPEG"):
        ExtDecoder("rgb8")(_sample(jpg=tga.getvalue()))
    got = ExtDecoder("rgb8")(_sample(tga=tga.getvalue()))["tga"]
    assert got.shape == (2, 3, 3) and got[0, 0].tolist() == [1, 2, 3]
