"""Tar constants and the one header-checksum rule (format/spec.py tar section, format/tar.py)."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

import numpy as np
import pytest

from tarindex.format import spec
from tarindex.format.tar import (
    build_member_header,
    checksum_ok,
    header_checksum,
    header_checksums,
    header_name,
)


def test_typeflags_match_cpython_tarfile() -> None:
    pairs = {
        "REGTYPE": "REGTYPE",
        "AREGTYPE": "AREGTYPE",
        "LNKTYPE": "LNKTYPE",
        "SYMTYPE": "SYMTYPE",
        "CHRTYPE": "CHRTYPE",
        "BLKTYPE": "BLKTYPE",
        "DIRTYPE": "DIRTYPE",
        "FIFOTYPE": "FIFOTYPE",
        "CONTTYPE": "CONTTYPE",
        "XHDTYPE": "XHDTYPE",
        "XGLTYPE": "XGLTYPE",
        "SOLARIS_XHDTYPE": "SOLARIS_XHDTYPE",
        "GNUTYPE_LONGNAME": "GNUTYPE_LONGNAME",
        "GNUTYPE_LONGLINK": "GNUTYPE_LONGLINK",
        "GNUTYPE_SPARSE": "GNUTYPE_SPARSE",
    }
    for ours, theirs in pairs.items():
        assert bytes((getattr(spec, ours),)) == getattr(tarfile, theirs), ours
    assert spec.REGULAR_TYPES == {spec.REGTYPE, spec.AREGTYPE, spec.CONTTYPE}


def test_header_fields_tile_the_ustar_block() -> None:
    fields = [
        spec.TAR_NAME,
        spec.TAR_MODE,
        spec.TAR_UID,
        spec.TAR_GID,
        spec.TAR_SIZE,
        spec.TAR_MTIME,
        spec.TAR_CHKSUM,
        slice(spec.TAR_TYPEFLAG, spec.TAR_TYPEFLAG + 1),
        spec.TAR_LINKNAME,
        spec.TAR_MAGIC,
        spec.TAR_VERSION,
        spec.TAR_UNAME,
        spec.TAR_GNAME,
        spec.TAR_DEVMAJOR,
        spec.TAR_DEVMINOR,
        spec.TAR_PREFIX,
    ]
    pos = 0
    for f in fields:  # contiguous, in POSIX order, ending where the 12 pad bytes start
        assert f.start == pos
        pos = f.stop
    assert pos == 500 and spec.BLOCK == 512


def test_writer_header_read_by_tarfile_field_by_field() -> None:
    block = build_member_header(b"a/b.bin", 1234, 567, mode=0o640)
    ti = tarfile.TarInfo.frombuf(block, "utf-8", "surrogateescape")
    assert (ti.name, ti.size, ti.mtime, ti.mode, ti.type) == ("a/b.bin", 1234, 567, 0o640, b"0")
    assert block[spec.TAR_MAGIC] == spec.USTAR_MAGIC
    assert block[spec.TAR_VERSION] == spec.USTAR_VERSION
    long = b"d" * 120 + b"/" + b"f" * 90
    block = build_member_header(long, 1, 0)
    assert len(block) == spec.BLOCK and header_name(block) == long  # ustar prefix split


def _reference_unsigned(block: bytes) -> int:  # the POSIX text, literally
    return sum(block[:148]) + 8 * ord(" ") + sum(block[156:])


def _reference_signed(block: bytes) -> int:
    return sum(b - 256 if b > 127 else b for b in block[:148] + block[156:]) + 8 * ord(" ")


def test_scalar_and_vectorised_checksums_are_one_rule() -> None:
    rng = np.random.default_rng(0)
    rows = rng.integers(0, 256, (64, spec.BLOCK), dtype=np.uint8)
    rows[:8] = 0  # all-zero and all-0xff blocks are the extremes
    rows[8:16] = 0xFF
    computed, _ = header_checksums(rows)
    for i in range(len(rows)):
        block = rows[i].tobytes()
        assert header_checksum(block) == _reference_unsigned(block) == int(computed[i])


@pytest.mark.parametrize("signed", [False, True])
def test_checksum_ok_accepts_unsigned_and_signed(signed: bool) -> None:
    rng = np.random.default_rng(1)
    block = bytearray(rng.integers(0, 128, spec.BLOCK, dtype=np.uint8).tobytes())
    block[:100] = rng.integers(128, 256, 100, dtype=np.uint8).tobytes()  # signed != unsigned
    want = _reference_signed(bytes(block)) if signed else _reference_unsigned(bytes(block))
    assert want > 0 and _reference_signed(bytes(block)) != _reference_unsigned(bytes(block))
    block[spec.TAR_CHKSUM] = b"%06o\0 " % want
    assert checksum_ok(bytes(block))
    block[0] ^= 1
    assert not checksum_ok(bytes(block))


def test_writer_checksum_matches_tarfile(tmp_path: Path) -> None:
    block = build_member_header(b"x.bin", 3, 0)
    assert checksum_ok(block)
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.USTAR_FORMAT) as tf:
        ti = tarfile.TarInfo("x.bin")
        ti.size, ti.mtime, ti.mode = 3, 0, 0o644
        tf.addfile(ti, io.BytesIO(b"abc"))
    theirs = buf.getvalue()[: spec.BLOCK]
    assert header_checksum(theirs) == int(theirs[spec.TAR_CHKSUM].split(b"\0")[0], 8)
