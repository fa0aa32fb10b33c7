"""The open-time header probe reads names as the scanner does (issue 19 item 7), and a tar
rewritten in place after open is refused on its next read (item 8)."""

from __future__ import annotations

import io
import os
import subprocess
import tarfile
from pathlib import Path

import pytest

import tarindex
from tarindex import StaleIndexError
from tarindex.cli.main import main
from tarindex.format.spec import BLOCK, TAR_CHKSUM, TAR_NAME
from tarindex.format.tar import header_checksum

from ..conftest import have


def _tar(path: Path, fmt: int, names: list[str]) -> None:
    with tarfile.open(path, "w", format=fmt) as tf:
        for n in names:
            ti = tarfile.TarInfo(n)
            ti.size = 3
            tf.addfile(ti, io.BytesIO(b"abc"))


def _set_header_name(path: Path, header_at: int, name: bytes) -> None:
    """Write ``name`` in the name field of the header at ``header_at`` (checksum fixed)."""
    with open(path, "r+b") as f:
        f.seek(header_at)
        block = bytearray(f.read(BLOCK))
        block[TAR_NAME] = name.ljust(TAR_NAME.stop - TAR_NAME.start, b"\0")
        block[TAR_CHKSUM] = b" " * 8
        block[TAR_CHKSUM] = b"%06o\0 " % header_checksum(block)
        f.seek(header_at)
        f.write(block)


def _cli_ok(tar: Path) -> None:
    for cmd in (["ls", str(tar)], ["info", str(tar)], ["verify", str(tar)]):
        assert main(cmd) == 0, cmd


@pytest.mark.parametrize("fmt", [tarfile.GNU_FORMAT, tarfile.PAX_FORMAT], ids=["gnu", "pax"])
@pytest.mark.parametrize("length", [100_000, 1_000_000])
def test_long_names_index_and_open(tmp_path: Path, fmt: int, length: int) -> None:
    tar = tmp_path / "long.tar"
    n = 2 if length > 100_000 else 6
    names = ["k" * length + f"{i:04d}.bin" for i in range(n)]
    _tar(tar, fmt, names)
    # the header's own name field is the writer's choice under a long name: a short stand-in
    # (as some writers store) must not make the probe refuse the index just built
    t = tarindex.build_index(str(tar))
    for k in range(t.n_members):
        _set_header_name(tar, int(t.offset[k]) - BLOCK, b"x.bin")
    os.remove(tarindex.storage.indexfile.index_path_for(str(tar)))
    tarindex.build_index(str(tar))
    _cli_ok(tar)
    with tarindex.ShardReader(str(tar)) as r:
        assert r.key(n - 1) == names[-1][: -len(".bin")]


@pytest.mark.skipif(not have("tar"), reason="needs GNU tar")
def test_gnu_tar_long_names(tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    names = []
    for i in range(5):  # the longest name a filesystem allows, in a deep directory tree
        d = src / "/".join(["d" * 200] * 3)
        d.mkdir(parents=True, exist_ok=True)
        (d / (f"{i:03d}" + "k" * 200 + ".bin")).write_bytes(b"x" * i)
        names.append(d / (f"{i:03d}" + "k" * 200 + ".bin"))
    tar = tmp_path / "gnu.tar"
    subprocess.run(["tar", "--format=gnu", "-cf", str(tar), "-C", str(src), "."], check=True)
    tarindex.build_index(str(tar))
    _cli_ok(tar)


def test_renamed_long_name_is_refused(tmp_path: Path) -> None:
    tar = tmp_path / "long.tar"
    names = ["k" * 5000 + f"{i:04d}.bin" for i in range(3)]
    _tar(tar, tarfile.GNU_FORMAT, names)
    tarindex.build_index(str(tar))
    data = tar.read_bytes()
    at = data.index(b"k" * 5000 + b"0001.bin") + 2000  # past the header's 100-byte name field
    tar.write_bytes(data[:at] + b"j" + data[at + 1 :])  # the LongName record, same size
    with pytest.raises(StaleIndexError, match="member 1 names"):
        tarindex.ShardReader(str(tar))
