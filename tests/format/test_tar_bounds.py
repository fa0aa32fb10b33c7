"""Header records with absurd sizes (issue 19 item 17): a clear TarHeaderError naming the file and
the byte offset, in bounded time, never a raw ValueError or minutes of work.

The bounds (docs/TAR_DIALECTS.md, "Bounds"; tarindex.format.tar): a pax extended header is at
most 16 MiB (libarchive reads bodies up to 1 GiB, Go up to 1 MiB; 16 MiB is libarchive's largest
single attribute, ``xattr_limit``), and so is a member name (GNU LongName / LongLink record, pax
``path`` / ``linkpath``): libarchive and Go stop names at 1 MiB, but tarindex indexes longer
ones (tests/test_integrity.py). Tars are built here, as raw bytes or with GNU tar.
"""

from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path

import pytest

import tarindex
from tarindex.errors import TarHeaderError
from tarindex.format.spec import (
    GNUTYPE_LONGLINK,
    GNUTYPE_LONGNAME,
    REGTYPE,
    SYMTYPE,
    XGLTYPE,
    XHDTYPE,
)
from tarindex.format.tar import (
    MAX_NAME_BYTES,
    MAX_PAX_HEADER_BYTES,
    _pax_record,
    _ustar_block,
    padded,
    parse_pax,
)

DATA = b"hello"


def _pad(b: bytes) -> bytes:
    return b + bytes(padded(len(b)) - len(b))


def _member(name: bytes = b"a.bin", typeflag: int = REGTYPE) -> bytes:
    size = len(DATA) if typeflag == REGTYPE else 0
    return _ustar_block(name, size, 0, 0o644, typeflag) + (_pad(DATA) if size else b"")


def _pax_tar(path: Path, records: bytes, typeflag: int = XHDTYPE, member: bytes = b"") -> Path:
    head = _ustar_block(b"PaxHeaders/a", len(records), 0, 0o644, typeflag)
    path.write_bytes(head + _pad(records) + (member or _member()) + bytes(1024))
    return path


def _gnu_tar(path: Path, name: bytes, typeflag: int = GNUTYPE_LONGNAME) -> Path:
    """One 'L' (or 'K') record holding ``name`` + NUL, then a member (a symlink after 'K')."""
    body = name + b"\0"
    head = _ustar_block(b"././@LongLink", len(body), 0, 0o644, typeflag)
    member = _member(
        b"a.bin" if typeflag == GNUTYPE_LONGNAME else b"l",
        REGTYPE if typeflag == GNUTYPE_LONGNAME else SYMTYPE,
    )
    with open(path, "wb") as f:  # written in pieces: a 100 MB name is never one bytes object
        f.write(head)
        step = 1 << 24
        for i in range(0, len(body), step):
            f.write(body[i : i + step])
        f.write(bytes(padded(len(body)) - len(body)) + member + bytes(1024))
    return path


def _refused(tar: Path, *needles: str, seconds: float = 5.0) -> str:
    t0 = time.perf_counter()
    with pytest.raises(TarHeaderError) as ei:
        tarindex.build_index(tar)
    took = time.perf_counter() - t0
    msg = str(ei.value)
    assert msg.startswith(f"{tar}: byte "), msg
    for n in needles:
        assert n in msg, msg
    assert took < seconds, f"{took:.1f} s"
    assert not Path(tarindex.storage.indexfile.index_path_for(tar)).exists()
    return msg


# -- pax size ----------------------------------------------------------------------------------
def test_pax_size_with_4301_digits_of_leading_zeros_is_its_value(tmp_path: Path) -> None:
    """Python refuses int() of > 4300 digits; the record is still the decimal 5 (GNU tar reads
    it so; tarfile drops the record and says 0): size 5, never a raw ValueError."""
    tar = _pax_tar(tmp_path / "z.tar", _pax_record(b"size", b"0" * 4300 + b"5"))
    tables = tarindex.build_index(tar)
    assert tables.size.tolist() == [5]
    assert tarindex.ShardReader(str(tar)).sample(0)["bin"] == DATA
    if shutil.which("tar"):
        got = subprocess.run(["tar", "-xOf", str(tar)], capture_output=True, check=True).stdout
        assert got == DATA


def test_pax_size_with_4301_significant_digits_is_refused(tmp_path: Path) -> None:
    tar = _pax_tar(tmp_path / "big.tar", _pax_record(b"size", b"1" + b"0" * 4300))
    _refused(tar, "pax size", "(4301 bytes)", "10**18")


# -- names: pax path / linkpath, GNU LongName / LongLink ---------------------------------------
def test_a_50_MB_pax_path_is_refused_in_bounded_time(tmp_path: Path) -> None:
    name = b"d/" + b"x" * 50_000_000 + b".bin"
    tar = _pax_tar(tmp_path / "p50.tar", _pax_record(b"path", name))
    _refused(tar, "byte 0:", "pax extended header", f"{MAX_PAX_HEADER_BYTES}")


@pytest.mark.parametrize("key", [b"path", b"linkpath"])
def test_parse_pax_refuses_a_name_over_the_bound(key: bytes) -> None:
    """The value rule itself (the scan's header bound is met first, at the same size)."""
    first = _pax_record(b"mtime", b"1")
    rec = first + _pax_record(key, b"n" * (MAX_NAME_BYTES + 1))
    with pytest.raises(
        ValueError,
        match=rf"pax record at \+{len(first)}: {key.decode()} value is "
        rf"{MAX_NAME_BYTES + 1} bytes, over the {MAX_NAME_BYTES}-byte bound",
    ):
        parse_pax(rec)
    assert parse_pax(_pax_record(key, b"n" * 1000))[key] == b"n" * 1000


def test_pax_global_header_over_the_bound_is_refused(tmp_path: Path) -> None:
    rec = _pax_record(b"comment", b"c" * (MAX_PAX_HEADER_BYTES + 1))
    tar = _pax_tar(tmp_path / "g.tar", rec, typeflag=XGLTYPE)
    _refused(tar, "byte 0:", "pax global header", f"{len(rec)} bytes")


def test_an_8_MB_pax_attribute_still_indexes(tmp_path: Path) -> None:
    """libarchive's test_read_format_tar_pax_large_attr holds an 8,000,000-byte pax header."""
    rec = _pax_record(b"comment", b"c" * 7_999_000) + _pax_record(b"path", b"big.bin")
    tar = _pax_tar(tmp_path / "8m.tar", rec)
    assert tarindex.build_index(tar).n_samples == 1
    assert tarindex.index.scan.scan(tar).names == ["big.bin"]


def test_gnu_long_name_over_the_bound_is_refused(tmp_path: Path) -> None:
    tar = _gnu_tar(tmp_path / "L.tar", b"y" * MAX_NAME_BYTES + b".bin")
    _refused(tar, "byte 0:", "GNU long name", f"{MAX_NAME_BYTES}")


def test_a_100_MB_gnu_long_name_is_refused_in_bounded_time(tmp_path: Path) -> None:
    tar = _gnu_tar(tmp_path / "L100.tar", b"y" * 100_000_000 + b".bin")
    _refused(tar, "byte 0:", "GNU long name", "100000005 bytes")


def test_gnu_long_link_over_the_bound_is_refused(tmp_path: Path) -> None:
    tar = _gnu_tar(tmp_path / "K.tar", b"t" * (MAX_NAME_BYTES + 1), GNUTYPE_LONGLINK)
    _refused(tar, "byte 0:", "GNU long link")


def test_long_names_under_the_bound_index(tmp_path: Path) -> None:
    for kind, tar in (
        ("pax", _pax_tar(tmp_path / "ok.tar", _pax_record(b"path", b"p" * 300_000 + b".bin"))),
        ("gnu", _gnu_tar(tmp_path / "okL.tar", b"q" * 300_000 + b".bin")),
    ):
        assert tarindex.build_index(tar).n_samples == 1, kind
        (name,) = tarindex.index.scan.scan(tar).names
        assert len(name) == 300_004 and name.endswith(".bin"), kind


@pytest.mark.skipif(shutil.which("tar") is None, reason="needs the tar command (GNU tar)")
@pytest.mark.parametrize("fmt", ["gnu", "posix"])
def test_gnu_tar_long_names_index(tmp_path: Path, fmt: str) -> None:
    """GNU tar writes a 100 KB name (--transform) as a LongName record (gnu) or pax path."""
    (tmp_path / "f.bin").write_bytes(DATA)
    long = "n" * 100_000
    tar = tmp_path / f"{fmt}.tar"
    subprocess.run(
        [
            "tar",
            f"--format={fmt}",
            "--transform",
            f"s,^f,{long},",
            "-cf",
            str(tar),
            "-C",
            str(tmp_path),
            "f.bin",
        ],
        check=True,
    )
    assert tarindex.build_index(tar).n_samples == 1
    assert tarindex.index.scan.scan(tar).names == [long + ".bin"]
    assert tarindex.ShardReader(str(tar)).sample(0)["bin"] == DATA


def test_a_name_over_1_mib_indexes_in_bounded_time(tmp_path: Path) -> None:
    """A 2 MiB name is allowed; its key hash (FORMAT.md §8) is finished byte by byte for the few
    long keys left, not by one numpy pass per byte position (was ~10 s for this key)."""
    from tarindex.format.keyhash import key_hash
    from tarindex.format.keytable import key_table_of

    name = b"k" * (2 << 20) + b".bin"
    tar = _pax_tar(tmp_path / "2m.tar", _pax_record(b"path", name))
    t0 = time.perf_counter()
    tables = tarindex.build_index(tar)
    assert time.perf_counter() - t0 < 4.0  # ~0.6 s; a numpy pass per byte took 10-30 s
    assert tables.key_blob == name[:-4]
    kt = key_table_of(tables.key_blob, tables.key_ptr.astype("int64"))
    assert kt.hash.tolist() == [key_hash(name[:-4]) >> 32]


def test_a_name_at_the_bound_indexes(tmp_path: Path) -> None:
    name = b"m" * (MAX_NAME_BYTES - 64) + b".bin"  # the pax header stays within its bound
    tar = _pax_tar(tmp_path / "max.tar", _pax_record(b"path", name))
    t0 = time.perf_counter()
    assert tarindex.build_index(tar).n_samples == 1
    assert time.perf_counter() - t0 < 20.0  # ~2.5 s
