"""`tarindex verify`, `ls --members`, `ls --skipped`, `info` and `cat` on gzip-compressed shards
made by other tools (GNU ``tar czf``; a tarindex shard run through ``gzip -c``), FORMAT.md §10."""

from __future__ import annotations

import gzip
import json
import random
import shutil
import subprocess
import zlib
from pathlib import Path

import pytest

import tarindex
from tarindex.cli.main import main
from tarindex.errors import TarIndexError

Cap = pytest.CaptureFixture[str]
CapB = pytest.CaptureFixture[bytes]

GNU_TAR = shutil.which("tar")
GZIP = shutil.which("gzip")


def _gnu_tar_czf(tmp_path: Path) -> str:
    """300 samples (txt, cls) under a directory entry, by ``tar czf``."""
    if GNU_TAR is None:
        pytest.skip("GNU tar is not installed")
    d = tmp_path / "files" / "d"
    d.mkdir(parents=True)
    rng = random.Random(1)
    for i in range(300):
        (d / f"{i:05d}.txt").write_bytes(f"sample {i} ".encode() * rng.randrange(1, 400))
        (d / f"{i:05d}.cls").write_bytes(str(i % 7).encode())
    out = str(tmp_path / "gnu.tar.gz")
    subprocess.run([GNU_TAR, "--sort=name", "-czf", out, "-C", str(tmp_path / "files"), "d"], check=True)
    return out


def _tarindex_then_gzip(tmp_path: Path) -> str:
    """1000 samples written by tarindex, then ``gzip -c x.tar > x.tar.gz``."""
    if GZIP is None:
        pytest.skip("gzip is not installed")
    plain = tmp_path / "w.tar"
    with tarindex.ShardWriter(str(plain)) as w:
        for i in range(1000):
            w.write({"__key__": f"k{i:05d}", "txt": f"text {i} " * (i % 50 + 1), "cls": i % 10})
    out = tmp_path / "w.tar.gz"
    with open(out, "wb") as f:
        subprocess.run([GZIP, "-c", str(plain)], stdout=f, check=True)
    plain.unlink()
    return str(out)


@pytest.fixture(params=["tar czf", "tarindex + gzip -c"])
def tgz(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    make = _gnu_tar_czf if request.param == "tar czf" else _tarindex_then_gzip
    p = make(tmp_path)
    assert main(["index", p]) == 0
    return p


def _gunzip(tgz: str) -> str:
    plain = tgz[: -len(".gz")]
    with gzip.open(tgz, "rb") as f, open(plain, "wb") as o:
        shutil.copyfileobj(f, o)
    return plain


def test_verify_a_gzip_shard(tgz: str, capsys: Cap) -> None:
    """Was an IndexError: the header re-read indexed the compressed file's blocks."""
    capsys.readouterr()
    assert main(["verify", tgz]) == 0
    assert main(["verify", "--data", tgz]) == 0
    out = capsys.readouterr().out
    assert out.count("ok   ") == 2 and "data crc32" in out
    rep = tarindex.verify(tgz, data=True)
    t = tarindex.build_index(_gunzip(tgz))
    assert (rep.n_samples, rep.n_members) == (t.n_samples, t.n_members)


def test_verify_a_gzip_shard_changed_inside_is_an_error(tgz: str, capsys: Cap) -> None:
    """Compressed bytes flipped in place (size, first and last 4 KiB kept): a clear error
    naming the shard, never a traceback or an ok.

    Some bit flips leave a deflate stream valid with the same output (an unused code length,
    say; gzip's own CRC passes), and ``tar czf``'s bytes change with the files' mtimes: the
    flip is the first one from the middle that Python's gzip module (the oracle) sees as a
    change."""
    data = bytearray(Path(tgz).read_bytes())
    assert len(data) > 3 * 4096
    plain = gzip.decompress(bytes(data))
    for pos in range(len(data) // 2, len(data) - 4096):
        data[pos] ^= 0x10
        try:
            changed = gzip.decompress(bytes(data)) != plain
        except (OSError, EOFError, zlib.error):
            changed = True
        if changed:
            break
        data[pos] ^= 0x10
    else:
        pytest.fail("no bit flip past the middle changes the gzip shard")
    Path(tgz).write_bytes(bytes(data))
    with pytest.raises(TarIndexError, match=Path(tgz).name):
        tarindex.verify(tgz, data=True)
    capsys.readouterr()
    assert main(["verify", "--data", tgz]) != 0
    err = capsys.readouterr()
    assert "Traceback" not in err.err and Path(tgz).name in err.out + err.err


def test_ls_members_and_skipped_of_a_gzip_shard(tgz: str, capsys: Cap) -> None:
    """Was refused ("found a gzip stream"); lists the tar inside like the gunzipped tar."""
    capsys.readouterr()
    assert main(["ls", "--members", tgz]) == 0
    members = capsys.readouterr().out
    assert main(["ls", "--skipped", tgz]) == 0
    skipped = capsys.readouterr().out
    plain = _gunzip(tgz)
    assert main(["ls", "--members", plain]) == 0
    assert members == capsys.readouterr().out
    assert main(["ls", "--skipped", plain]) == 0
    assert skipped == capsys.readouterr().out
    lines = members.splitlines()
    t = tarindex.build_index(plain)
    assert len(lines) == t.n_members
    if "gnu" in tgz:
        assert skipped.startswith("d/\t")  # the directory entry
    # the offsets are in the decompressed tar: each names the member's bytes there
    raw = Path(plain).read_bytes()
    for ln in lines[:: max(1, len(lines) // 50)]:
        name, off, size = ln.split("\t")
        assert raw[int(off) - 512 : int(off) - 412].rstrip(b"\0") == name.encode()
        assert int(size) >= 1


def test_info_and_cat_on_a_gzip_shard(tgz: str, capsysbinary: CapB) -> None:
    capsysbinary.readouterr()
    assert main(["info", tgz]) == 0
    info = capsysbinary.readouterr().out.decode()
    assert main(["info", "--json", tgz]) == 0
    js = json.loads(capsysbinary.readouterr().out)
    assert (js["gzip_shards"], js["gzip_bytes"]) == (1, Path(tgz).stat().st_size)
    want_gz = f"gzip bytes:  {Path(tgz).stat().st_size} "
    assert f"tar bytes:   {Path(_gunzip(tgz)).stat().st_size} " in info and want_gz in info
    plain = _gunzip(tgz)
    ds = tarindex.TarDataset(plain)
    key, want = ds[5]["__key__"], bytes(ds[5]["txt"])
    capsysbinary.readouterr()
    assert main(["cat", tgz, str(key), "txt"]) == 0
    assert capsysbinary.readouterr().out == want
