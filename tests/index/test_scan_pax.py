"""The header walk's pax fast path (one pax header per member, as webdataset and tarfile write)
agrees with Python's tarfile on every member, and hands anything unusual to the full path."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

import numpy as np
import pytest

import tarindex
from tarindex.format.tar import build_member_header


def _members_agree(path: Path) -> None:
    got = tarindex.index.scan.scan(path)
    with tarfile.open(path) as tf:
        regs = [m for m in tf.getmembers() if m.isreg()]
    assert got.names == [m.name for m in regs]
    assert got.offset.tolist() == [m.offset_data for m in regs]
    assert got.size.tolist() == [m.size for m in regs]


def test_float_mtime_pax_per_member(tmp_path: Path) -> None:
    """Python's tarfile writes a pax header for a float mtime (webdataset's TarWriter does so)."""
    rng = np.random.default_rng(0)
    p = tmp_path / "f.tar"
    with tarfile.open(p, "w", format=tarfile.PAX_FORMAT) as tf:
        for i in range(300):
            data = rng.bytes(int(rng.integers(0, 2000)))
            ti = tarfile.TarInfo(f"{i:05d}.bin" if i % 7 else f"{'d' * 120}/{'n' * 120}{i}.bin")
            ti.size, ti.mtime = len(data), 1_700_000_000.25 + i
            if i % 11 == 0:
                ti.pax_headers = {"comment": "x" * 300}  # a larger record set
            tf.addfile(ti, io.BytesIO(data))
    _members_agree(p)
    tarindex.build_index(p)
    with tarfile.open(p) as tf:
        want = {m.name: tf.extractfile(m).read() for m in tf.getmembers()}  # type: ignore[union-attr]
    r = tarindex.ShardReader(str(p))
    for j in range(r.n_samples):
        s = r.sample(j)
        assert s["bin"] == want[s["__key__"] + ".bin"]


def test_webdataset_writer_shards(tmp_path: Path) -> None:
    wds = pytest.importorskip("webdataset")
    p = tmp_path / "w.tar"
    with wds.TarWriter(str(p)) as w:
        for i in range(200):
            w.write({"__key__": f"{i:06d}", "bin": bytes([i % 256]) * i, "cls": str(i % 10)})
    _members_agree(p)


def _pax_block(records: bytes) -> bytes:
    from tarindex.format.spec import XHDTYPE
    from tarindex.format.tar import _ustar_block, padded

    head = _ustar_block(b"PaxHeaders/x", len(records), 0, 0o644, XHDTYPE)
    return head + records + bytes(padded(len(records)) - len(records))


@pytest.mark.parametrize(
    "records, name, size",
    [
        (b"16 path=a/b.bin\n", b"a/b.bin", 5),
        (b"10 size=3\n", b"plain.bin", 3),  # pax size overrides the header's 5
        (b"8 path=\n", b"plain.bin", 5),  # empty path: the header's name applies
    ],
)
def test_pax_records_variants(tmp_path: Path, records: bytes, name: bytes, size: int) -> None:
    member = build_member_header(b"plain.bin", 5, 0)
    body = b"hello" + bytes(507)
    p = tmp_path / "v.tar"
    p.write_bytes(_pax_block(records) + member + body + bytes(1024))
    got = tarindex.index.scan.scan(p)
    assert got.raw_names == [name] and got.size.tolist() == [size]
    assert got.offset.tolist() == [len(_pax_block(records)) + 512]


def test_empty_pax_header_is_refused(tmp_path: Path) -> None:
    # no records at all (size 0): refused, as bsdtar does (docs/TAR_DIALECTS.md, "Empty pax")
    p = tmp_path / "v.tar"
    member = build_member_header(b"plain.bin", 5, 0)
    p.write_bytes(_pax_block(b"") + member + b"hello" + bytes(507) + bytes(1024))
    with pytest.raises(tarindex.errors.TarHeaderError, match=rf"{p}: byte 0: empty pax"):
        tarindex.index.scan.scan(p)


def test_bad_pax_record_still_reported(tmp_path: Path) -> None:
    member = build_member_header(b"plain.bin", 5, 0)
    p = tmp_path / "bad.tar"
    p.write_bytes(_pax_block(b"99 path=x\n") + member + b"hello" + bytes(507) + bytes(1024))
    with pytest.raises(tarindex.errors.TarHeaderError, match=rf"{p}: byte 512: malformed pax"):
        tarindex.index.scan.scan(p)
