"""Index format v1: exact bytes, golden files, corruption detection at open and in verify."""

from __future__ import annotations

import os
import shutil
import struct
import zlib
from pathlib import Path

import numpy as np
import pytest

import tarindex
from tarindex.errors import (
    BadMagicError,
    ChecksumError,
    FormatError,
    StaleIndexError,
    TruncatedError,
    UnsupportedVersionError,
)
from tarindex.format.index import IndexTables, decode_index, encode_index, layout, read_header
from tarindex.format.spec import FOOTER, HEADER, MAGIC

GOLDEN = Path(__file__).parents[1] / "golden" / "v1"


def small_tables() -> IndexTables:
    return IndexTables(
        sample_ptr=np.array([0, 2, 3], "<u8"),
        offset=np.array([512, 1536, 2560], "<u8"),
        size=np.array([3, 5, 0], "<u8"),
        ext_id=np.array([0, 1, 0], "<u4"),
        key_ptr=np.array([0, 2, 5], "<u8"),
        key_blob=b"k1k22",
        exts=[b"txt", b"cls"],
        tar_size=10240,
        head_crc=0x12345678,
        tail_crc=0x9ABCDEF0,
        meta={"producer": "test"},
    )


def test_header_exact_bytes() -> None:
    enc = encode_index(small_tables())
    assert enc[:8] == MAGIC == b"\x89TIDX\r\n\x1a"
    assert struct.unpack_from("<HHIQQQQQQQII", enc, 8) == (
        1,
        3,  # minor 3: the GZIX record of compressed shards (FORMAT.md §2.8.4)
        0,
        2,
        3,
        2,
        5,
        6,
        len(b'{"producer":"test"}'),
        10240,
        0x12345678,
        0x9ABCDEF0,
    )
    assert HEADER.size == 80
    # every section is 8-byte aligned and the footer is the last 8 bytes
    h = read_header(enc)
    for name, (start, _) in layout(h).items():
        assert start % 8 == 0, name
    assert enc[-4:] == b"TIDX"
    assert struct.unpack("<I", enc[-8:-4])[0] == zlib.crc32(enc[:-8])


def test_roundtrip_tables() -> None:
    t = small_tables()
    d = decode_index(encode_index(t), full_check=True)
    for f in ("sample_ptr", "offset", "size", "ext_id", "key_ptr"):
        np.testing.assert_array_equal(getattr(d, f), getattr(t, f))
    assert bytes(d.key_blob) == t.key_blob and d.exts == t.exts and d.meta == t.meta
    assert (d.tar_size, d.head_crc, d.tail_crc) == (t.tar_size, t.head_crc, t.tail_crc)


def test_golden_v1_still_reads(tmp_path: Path) -> None:
    for f in GOLDEN.iterdir():
        shutil.copy(f, tmp_path / f.name)
    r = tarindex.ShardReader(str(tmp_path / "tiny.tar"), full_check=True)
    assert r.n_samples == 6
    assert r.sample(2) == {
        "__key__": "s002",
        "txt": b"golden 2",
        "cls": b"2",
        "bin": bytes(range(14)),
    }
    assert r.sample(5)["__key__"] == "dir/" + "long" * 30
    r.close()
    # rebuilding the golden tar's index gives the same tables
    rebuilt = tarindex.build_index(tmp_path / "tiny.tar", str(tmp_path / "re.tidx"))
    stored = decode_index((GOLDEN / "tiny.tar.tidx").read_bytes())
    assert rebuilt.tables_bytes() == stored.tables_bytes()


def test_golden_v1_3_gzip_still_reads(tmp_path: Path) -> None:
    """Format 1.3's compressed golden shard: the GZIX record, the tar inside, the same samples."""
    golden = GOLDEN.parent / "v1.3"
    for f in golden.iterdir():
        shutil.copy(f, tmp_path / f.name)
    gz = tarindex.ShardReader(str(tmp_path / "tiny.tar.gz"), full_check=True)
    plain = tarindex.ShardReader(str(tmp_path / "tiny.tar"), full_check=True)
    assert gz.index.gzip is not None and gz.index.gzip.spacing == 1 << 16
    assert gz.index.gzip.gz_size == (golden / "tiny.tar.gz").stat().st_size
    assert gz.n_samples == plain.n_samples == 6
    assert [gz.sample(j) for j in range(6)] == [plain.sample(j) for j in range(6)]
    gz.close()
    plain.close()
    stored = decode_index((golden / "tiny.tar.gz.tidx").read_bytes())
    plain_t = decode_index((golden / "tiny.tar.tidx").read_bytes())
    assert stored.tables_bytes() == plain_t.tables_bytes()


def _golden_copy(tmp_path: Path) -> tuple[Path, Path]:
    for f in ("tiny.tar", "tiny.tar.tidx"):
        shutil.copy(GOLDEN / f, tmp_path / f)
    return tmp_path / "tiny.tar", tmp_path / "tiny.tar.tidx"


def test_truncated_index_every_length(tmp_path: Path) -> None:
    tar, idx = _golden_copy(tmp_path)
    data = idx.read_bytes()
    for cut in list(range(0, 96, 8)) + list(range(96, len(data), 37)) + [len(data) - 1]:
        idx.write_bytes(data[:cut])
        with pytest.raises((TruncatedError, BadMagicError)) as e:
            tarindex.ShardReader(str(tar))
        assert str(idx) in str(e.value)


def test_appended_index_detected(tmp_path: Path) -> None:
    tar, idx = _golden_copy(tmp_path)
    idx.write_bytes(idx.read_bytes() + b"\0" * 8)
    with pytest.raises(TruncatedError, match="header.s counts"):
        tarindex.ShardReader(str(tar))


def test_bad_magic_and_version(tmp_path: Path) -> None:
    tar, idx = _golden_copy(tmp_path)
    data = bytearray(idx.read_bytes())
    bad = bytearray(data)
    bad[0] = 0x50
    idx.write_bytes(bad)
    with pytest.raises(BadMagicError, match="byte 0"):
        tarindex.ShardReader(str(tar))
    bad = bytearray(data)
    struct.pack_into("<H", bad, 8, 2)
    idx.write_bytes(bad)
    with pytest.raises(UnsupportedVersionError, match="version 2.0"):
        tarindex.ShardReader(str(tar))
    bad = bytearray(data)
    bad[-1] ^= 1
    idx.write_bytes(bad)
    with pytest.raises(BadMagicError, match="end magic"):
        tarindex.ShardReader(str(tar))


def test_every_bit_flip_in_tables_caught_by_full_check(tmp_path: Path) -> None:
    tar, idx = _golden_copy(tmp_path)
    data = idx.read_bytes()
    footer = len(data) - FOOTER.size
    for pos in range(HEADER.size, footer, 3):
        bad = bytearray(data)
        bad[pos] ^= 0x10
        idx.write_bytes(bad)
        with pytest.raises(FormatError):  # ChecksumError, or an earlier structural error
            tarindex.ShardReader(str(tar), full_check=True).close()
    bad = bytearray(data)
    bad[HEADER.size + 9] ^= 1  # inside sample_ptr[1]
    idx.write_bytes(bad)
    with pytest.raises(ChecksumError, match=r"crc32 .* at byte \d+; .*tarindex index --force"):
        tarindex.ShardReader(str(tar), full_check=True)


def test_corrupt_offset_never_returns_short_member(tmp_path: Path) -> None:
    """An index whose member range runs past the tar is refused at read time, even unchecked:
    the table guards run before the first read, naming the index and the bad entry's byte."""
    tar, idx = _golden_copy(tmp_path)
    t = decode_index(idx.read_bytes())
    off = np.array(t.offset)
    off[0] = t.tar_size - 1
    bad = IndexTables(**{**t.__dict__, "offset": off, "key_blob": bytes(t.key_blob)})
    idx.write_bytes(encode_index(bad))
    with pytest.raises(FormatError, match=f"{idx}: byte [0-9]+: offset.0. = .* runs past"):
        # the open re-reads member 0's header, so its chunk is checked already at open
        tarindex.ShardReader(str(tar)).sample(0)
    with pytest.raises(FormatError, match="runs past"):
        tarindex.ShardReader(str(tar), full_check=True)


def test_stale_index(tmp_path: Path) -> None:
    tar, idx = _golden_copy(tmp_path)
    orig = tar.read_bytes()
    # appended to
    tar.write_bytes(orig + bytes(10240))
    with pytest.raises(StaleIndexError, match="tarindex index --force"):
        tarindex.ShardReader(str(tar))
    # replaced with same size, different head
    bad = bytearray(orig)
    bad[600] ^= 0xFF
    tar.write_bytes(bad)
    with pytest.raises(StaleIndexError, match="bytes 0..4096 differ"):
        tarindex.ShardReader(str(tar))
    # cut
    tar.write_bytes(orig[:-512])
    with pytest.raises(StaleIndexError, match="cut"):
        tarindex.ShardReader(str(tar))
    tar.write_bytes(orig)
    tarindex.ShardReader(str(tar)).close()


def test_missing_index_says_how(tmp_path: Path) -> None:
    tar, idx = _golden_copy(tmp_path)
    os.unlink(idx)
    with pytest.raises(tarindex.errors.IndexMissingError, match=f"tarindex index {tar}"):
        tarindex.ShardSet(str(tar), options=tarindex.OpenOptions(index="require"))
    with pytest.raises(FileNotFoundError):
        tarindex.ShardReader(str(tar))
