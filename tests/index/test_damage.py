"""Damaged and wrong inputs: each gives a specific TarIndexError naming file, offset and finding.

Never a partial index, never a member range past EOF, never a hang (pytest timeouts).
"""

from __future__ import annotations

import bz2
import gzip
import io
import lzma
import os
import shutil
import subprocess
import tarfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tarindex
from tarindex.errors import (
    ChecksumError,
    CompressedTarError,
    NotATarError,
    TarHeaderError,
    TarIndexError,
    TrailingGarbageError,
    TruncatedError,
)
from tarindex.format.tar import padded
from tarindex.index.scan import scan_members

pytestmark = pytest.mark.timeout(60)

SIZES = [0, 100, 1000, 3000, 512, 7]


def make_tar(
    path: Path, sizes: list[int] = SIZES, fmt: int = tarfile.GNU_FORMAT
) -> list[tarfile.TarInfo]:
    with tarfile.open(path, "w", format=fmt) as tf:
        for i, n in enumerate(sizes):
            ti = tarfile.TarInfo(f"s/{i:04d}.bin")
            ti.size = n
            ti.mtime = 0
            tf.addfile(ti, io.BytesIO(bytes([i % 250 + 1]) * n))
    with tarfile.open(path) as tf:
        return tf.getmembers()


def fix_checksum(raw: bytearray, hdr: int) -> None:
    raw[hdr + 148 : hdr + 156] = b" " * 8
    raw[hdr + 148 : hdr + 156] = b"%06o\0 " % sum(raw[hdr : hdr + 512])


def assert_fails(
    path: Path, cls: type[TarIndexError], *, at: int | None = None, found: str = ""
) -> str:
    """scan and build_index both raise ``cls``; no index file is left behind."""
    with pytest.raises(cls) as ei:
        scan_members(path)
    msg = str(ei.value)
    assert str(path) in msg
    assert "byte" in msg
    if at is not None:
        assert f"byte {at}" in msg, msg
    if found:
        assert found in msg, msg
    with pytest.raises(cls):
        tarindex.build_index(str(path))
    assert not os.path.exists(str(path) + ".tidx")
    assert not [p for p in os.listdir(path.parent) if p.endswith(".tmp")]
    return msg


def test_intact_baseline(tmp_path: Path) -> None:
    tar = tmp_path / "ok.tar"
    ref = make_tar(tar)
    m = scan_members(tar)
    assert m.offset.tolist() == [r.offset_data for r in ref]


def test_cut_at_every_512_boundary(tmp_path: Path) -> None:
    tar = tmp_path / "full.tar"
    make_tar(tar)
    blob = tar.read_bytes()
    full = scan_members(tar)
    last_end = int(full.offset[-1]) + padded(int(full.size[-1]))
    cut = tmp_path / "cut.tar"
    for c in range(0, len(blob), 512):
        cut.write_bytes(blob[:c])
        if c == 0:
            assert_fails(cut, NotATarError, at=0)
        elif c < last_end + 512:  # a member, its padding or the whole end marker is missing
            assert_fails(cut, TruncatedError)
        else:  # only end-of-archive zeros are missing: the same, complete index (GNU tar agrees)
            m = scan_members(cut)
            assert m.raw_names == full.raw_names and (m.offset == full.offset).all()


@pytest.mark.parametrize("delta", [1, 100, 511])
def test_cut_mid_member_and_mid_header(tmp_path: Path, delta: int) -> None:
    tar = tmp_path / "t.tar"
    ref = make_tar(tar)
    blob = tar.read_bytes()
    big = ref[3]  # 3000 bytes
    cut = tmp_path / "mid-member.tar"
    cut.write_bytes(blob[: big.offset_data + delta])
    msg = assert_fails(cut, TruncatedError, at=big.offset_data + delta, found="s/0003.bin")
    assert "3000" in msg
    hdr = ref[4].offset  # a header block
    cut2 = tmp_path / "mid-header.tar"
    cut2.write_bytes(blob[: hdr + delta])
    assert_fails(cut2, TruncatedError, at=hdr, found="inside a header block")


def test_bad_header_checksum(tmp_path: Path) -> None:
    tar = tmp_path / "t.tar"
    ref = make_tar(tar)
    raw = bytearray(tar.read_bytes())
    raw[ref[2].offset + 3] ^= 0x20  # a name byte
    tar.write_bytes(bytes(raw))
    assert_fails(tar, ChecksumError, at=ref[2].offset, found="checksum")


def test_earliest_bad_header_wins_over_later_errors(tmp_path: Path) -> None:
    """A corrupt size field (checksum not fixed) sends the walk astray: the report is still
    the checksum of that header, not whatever the walk hit next."""
    tar = tmp_path / "t.tar"
    ref = make_tar(tar)
    raw = bytearray(tar.read_bytes())
    raw[ref[1].offset + 124 : ref[1].offset + 135] = b"00000000001"  # 100 -> 1: lands mid-data
    tar.write_bytes(bytes(raw))
    assert_fails(tar, ChecksumError, at=ref[1].offset)


def test_bad_checksum_deep_in_a_large_archive(tmp_path: Path) -> None:
    """Checksums are verified in batches: the offset must still be exact past the first batch."""
    tar = tmp_path / "t.tar"
    ref = make_tar(tar, sizes=[10] * 5000, fmt=tarfile.USTAR_FORMAT)
    raw = bytearray(tar.read_bytes())
    raw[ref[4321].offset + 1] ^= 1
    tar.write_bytes(bytes(raw))
    assert_fails(tar, ChecksumError, at=ref[4321].offset)


def test_non_numeric_size_field(tmp_path: Path) -> None:
    tar = tmp_path / "t.tar"
    ref = make_tar(tar)
    raw = bytearray(tar.read_bytes())
    h = ref[2].offset
    raw[h + 124 : h + 136] = b"0000001z50\0\0"
    fix_checksum(raw, h)
    tar.write_bytes(bytes(raw))
    assert_fails(tar, TarHeaderError, at=h + 124, found="z50")


def test_trailing_garbage_after_end_blocks(tmp_path: Path) -> None:
    tar = tmp_path / "t.tar"
    make_tar(tar)
    blob = tar.read_bytes()
    for garbage in (b"garbage!" * 100, b"x", b"\0" * 700 + b"y"):
        tar.write_bytes(blob + garbage)
        assert_fails(tar, TrailingGarbageError, found="after the end-of-archive marker")
    tar.write_bytes(blob + bytes(300))  # zero padding, even not block-aligned, is harmless
    assert len(scan_members(tar)) == len(SIZES)


def test_empty_file_and_not_a_tar(tmp_path: Path) -> None:
    empty = tmp_path / "empty.tar"
    empty.write_bytes(b"")
    assert_fails(empty, NotATarError, at=0, found="empty")
    short = tmp_path / "short.tar"
    short.write_bytes(b"hello world\n")
    assert_fails(short, NotATarError, at=0, found="hello")
    text = tmp_path / "text.tar"
    text.write_bytes(b"Lorem ipsum dolor sit amet. " * 200)
    assert_fails(text, NotATarError, at=0, found="Lorem")
    zeros = tmp_path / "zeros.tar"
    zeros.write_bytes(bytes(10240))  # an empty archive: valid, no members
    assert len(scan_members(zeros)) == 0


def _compress(kind: str, data: bytes) -> bytes:
    tool = shutil.which(kind)
    if tool is not None:
        return subprocess.run([tool, "-c"], input=data, capture_output=True, check=True).stdout
    if kind == "gzip":
        return gzip.compress(data)
    if kind == "bzip2":
        return bz2.compress(data)
    if kind == "xz":
        return lzma.compress(data)
    zstandard = pytest.importorskip("zstandard", reason="neither the zstd command nor the module")
    compressed: bytes = zstandard.ZstdCompressor().compress(data)
    return compressed


@pytest.mark.parametrize("kind", ["bzip2", "xz", "zstd"])
def test_compressed_tar_under_a_tar_name(tmp_path: Path, kind: str) -> None:
    """The magic decides, not the name: the plain walk says which compression it found and
    the command that indexes it; build_index reads it through a decompressed copy (FORMAT.md
    §11); a compressed non-tar is named at its decompressed byte."""
    src = tmp_path / "src.tar"
    make_tar(src)
    tar = tmp_path / "shard.tar"
    tar.write_bytes(_compress(kind, src.read_bytes()))
    with pytest.raises(CompressedTarError, match=f"{tar}: byte 0: found a {kind} stream.*tarindex index"):
        scan_members(tar)
    t = tarindex.build_index(str(tar))
    assert t.tar_size == src.stat().st_size and t.meta["compressed"]["format"] == kind
    tiny = tmp_path / "tiny.tar"  # compressed and shorter than one block
    tiny.write_bytes(_compress(kind, b"x"))
    with pytest.raises(NotATarError, match=f"{tiny}: decompressed byte 0"):
        tarindex.build_index(str(tiny))
    assert not os.path.exists(str(tiny) + ".tidx")


def test_gzip_under_a_tar_name(tmp_path: Path) -> None:
    """The magic decides, not the name: gzip data is indexed through seek points (FORMAT.md
    §10); the plain-tar walk alone still says it is compressed; gzip of a non-tar is named."""
    src = tmp_path / "src.tar"
    make_tar(src)
    tar = tmp_path / "shard.tar"
    tar.write_bytes(_compress("gzip", src.read_bytes()))
    with pytest.raises(CompressedTarError, match="gzip"):
        scan_members(tar)
    t = tarindex.build_index(str(tar))
    assert t.gzip is not None and t.tar_size == src.stat().st_size
    tiny = tmp_path / "tiny.tar"  # gzip of one byte: not a tar inside
    tiny.write_bytes(_compress("gzip", b"x"))
    with pytest.raises(NotATarError, match=f"{tiny}: decompressed byte 0"):
        tarindex.build_index(str(tiny))
    assert not os.path.exists(str(tiny) + ".tidx")


def test_pax_record_malformed(tmp_path: Path) -> None:
    tar = tmp_path / "p.tar"
    with tarfile.open(tar, "w", format=tarfile.PAX_FORMAT) as tf:
        ti = tarfile.TarInfo("a.bin")
        ti.size = 1
        ti.pax_headers = {"comment": "hello"}
        tf.addfile(ti, io.BytesIO(b"a"))
    raw = bytearray(tar.read_bytes())
    i = raw.index(b"comment=hello")
    raw[i - 3 : i - 1] = b"9x"  # length field "9x": not a number
    tar.write_bytes(bytes(raw))
    assert_fails(tar, TarHeaderError, at=512, found="malformed pax")


def test_pax_header_then_end_of_archive(tmp_path: Path) -> None:
    tar = tmp_path / "p.tar"
    with tarfile.open(tar, "w", format=tarfile.PAX_FORMAT) as tf:
        ti = tarfile.TarInfo("é.bin")
        ti.size = 1
        tf.addfile(ti, io.BytesIO(b"a"))
    raw = bytearray(tar.read_bytes())
    raw[1024:1536] = bytes(512)  # the member header after the pax header: gone
    tar.write_bytes(bytes(raw))
    assert_fails(tar, TarHeaderError, at=0, found="not by a member")


# -- fuzz ------------------------------------------------------------------------------------
_FUZZ_BASE: dict[str, tuple[bytes, list[int]]] = {}


def _fuzz_base(fmt: str) -> tuple[bytes, list[int]]:
    if fmt not in _FUZZ_BASE:
        bio = io.BytesIO()
        with tarfile.open(fileobj=bio, mode="w", format=getattr(tarfile, fmt)) as tf:
            for i, n in enumerate([5, 600, 0, 1500]):
                name = (
                    "d/" + ("p" * 50 + "/") * i + f"{i}.bin"
                )  # long names: prefix, LongName, pax path
                ti = tarfile.TarInfo(("é" if fmt == "PAX_FORMAT" else "") + name)
                ti.size = n
                tf.addfile(ti, io.BytesIO(os.urandom(n)))
        blob = bio.getvalue()
        with tarfile.open(fileobj=io.BytesIO(blob)) as tf:
            heads = sorted(
                {h for m in tf.getmembers() for h in range(m.offset, m.offset_data, 512)}
            )
        _FUZZ_BASE[fmt] = blob, heads
    return _FUZZ_BASE[fmt]


@settings(
    max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    fmt=st.sampled_from(["GNU_FORMAT", "PAX_FORMAT", "USTAR_FORMAT"]),
    flips=st.lists(
        st.tuples(st.integers(0, 10**6), st.integers(0, 511), st.integers(1, 255)),
        min_size=1,
        max_size=4,
    ),
    fix=st.booleans(),
    cut=st.none() | st.integers(0, 8000),
)
def test_fuzz_header_bytes(
    tmp_path: Path, fmt: str, flips: list[tuple[int, int, int]], fix: bool, cut: int | None
) -> None:
    blob, heads = _fuzz_base(fmt)
    raw = bytearray(blob)
    for which, off, x in flips:
        h = heads[which % len(heads)]
        raw[h + off] ^= x
        if fix:  # make the checksum right, so the damage reaches the parser
            fix_checksum(raw, h)
    if cut is not None:
        raw = raw[:cut]
    p = tmp_path / "fuzz.tar"
    p.write_bytes(bytes(raw))
    try:
        m = scan_members(p)
    except TarIndexError as e:
        assert str(p) in str(e)
        return
    ends = m.offset + m.size
    assert (ends <= len(raw)).all()
    assert len(m.raw_names) == len(m.offset) == len(m.size)


# -- verify ----------------------------------------------------------------------------------
def test_verify_ok_and_report(tmp_path: Path) -> None:
    from tarindex.read.verify import VerifyReport, verify

    tar = tmp_path / "v.tar"
    with tarfile.open(tar, "w", format=tarfile.PAX_FORMAT) as tf:
        for i, n in enumerate([10, 0, 3000]):
            ti = tarfile.TarInfo(f"{'é' * 60}/{'q' * 50}/{i}.bin")
            ti.size = n
            tf.addfile(ti, io.BytesIO(b"v" * n))
    tarindex.build_index(str(tar))
    rep = verify(tar)
    assert isinstance(rep, VerifyReport) and rep.ok
    assert (rep.n_samples, rep.n_members, rep.long_names) == (3, 3, 3)
    assert "3 samples" in str(rep)


def test_verify_catches_in_place_header_rewrite_the_fingerprint_misses(tmp_path: Path) -> None:
    from tarindex.errors import StaleIndexError
    from tarindex.read.verify import verify

    tar = tmp_path / "t.tar"
    ref = make_tar(tar, sizes=[5000] * 6)  # headers in the middle, far from the first/last 4 KiB
    tarindex.build_index(str(tar))
    raw = bytearray(tar.read_bytes())
    h = ref[3].offset
    raw[h : h + 10] = b"s/0099.bin"  # rename a member in place, same size, valid checksum
    fix_checksum(raw, h)
    tar.write_bytes(bytes(raw))
    # the fingerprint cannot see it; the open re-reads this member's header (FORMAT.md §3)
    with pytest.raises(StaleIndexError, match=f"byte {h}: the header of member 3 names"):
        tarindex.ShardReader(str(tar)).close()
    with pytest.raises(StaleIndexError, match=f"byte {h}"):
        verify(tar)
    # a data-only rewrite of the same size in the middle is invisible to both (documented)
    tarindex.build_index(str(tar))
    raw[ref[2].offset_data] ^= 0xFF
    tar.write_bytes(bytes(raw))
    assert verify(tar).ok


def test_verify_appended_and_corrupt_index(tmp_path: Path) -> None:
    from tarindex.errors import ChecksumError as CE
    from tarindex.errors import StaleIndexError
    from tarindex.read.verify import verify

    tar = tmp_path / "t.tar"
    make_tar(tar)
    tarindex.build_index(str(tar))
    idx = Path(str(tar) + ".tidx")
    good = idx.read_bytes()
    bad = bytearray(good)
    bad[len(bad) // 2] ^= 1
    idx.write_bytes(bytes(bad))
    with pytest.raises((CE, TarIndexError)):
        verify(tar)
    idx.write_bytes(good)
    with open(tar, "ab") as f:
        f.write(bytes(10240))
    with pytest.raises(StaleIndexError):
        verify(tar)


def test_verify_reports_a_bad_size_field_with_path_and_offset(tmp_path: Path) -> None:
    # was a bare ValueError("not an octal number") from parse_number: no path, and a traceback
    # from `tarindex verify` (the CLI catches TarIndexError only)
    from tarindex.read.verify import verify

    tar = tmp_path / "t.tar"
    ref = make_tar(tar, sizes=[5000] * 6)  # header in the middle: the fingerprint misses it
    tarindex.build_index(str(tar))
    raw = bytearray(tar.read_bytes())
    h = ref[3].offset
    raw[h + 124 : h + 136] = b"00000011x10\0"  # not octal, checksum still valid
    fix_checksum(raw, h)
    tar.write_bytes(bytes(raw))
    with pytest.raises(TarHeaderError, match=rf"{tar}: byte {h + 124}: .*tarindex index --force"):
        verify(tar)
