"""The `tarindex` command: every subcommand through main([...]), plus real subprocesses."""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import numpy as np
import pytest

import tarindex
from tarindex.cli.main import main, parse_size
from tarindex.write.pack import plan_pack, sanitize_stem
from tests.conftest import MakeShards

Cap = pytest.CaptureFixture[str]
CapB = pytest.CaptureFixture[bytes]

ALL_BYTES = bytes(range(256)) * 3 + b"\r\n\x00\r\x1a\xff"


def run(argv: list[str], capsys: Cap) -> tuple[int, str, str]:
    code = main(argv)
    out, err = capsys.readouterr()
    return code, out, err


def one_clear_line(err: str) -> None:
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1, err
    assert lines[0].startswith("tarindex "), err
    assert "Traceback" not in err


@pytest.fixture
def shards(make_shards: MakeShards) -> list[str]:
    return make_shards([5, 7, 3], seed=1)


def _rewrite_header(buf: bytearray, pos: int, name: bytes) -> None:
    """Give the ustar header at ``pos`` a new name and a correct checksum."""
    buf[pos : pos + 100] = name.ljust(100, b"\0")
    buf[pos + 148 : pos + 156] = b" " * 8
    buf[pos + 148 : pos + 156] = b"%06o\0 " % sum(buf[pos : pos + 512])


# -- usage ------------------------------------------------------------------------------------
def test_no_command_prints_help_and_exits_2(capsys: Cap) -> None:
    code, out, err = run([], capsys)
    assert code == 2 and "usage: tarindex" in err


def test_unknown_command_and_bad_option_exit_2(capsys: Cap) -> None:
    assert run(["bogus"], capsys)[0] == 2
    assert run(["index", "--jobs", "0", "x.tar"], capsys)[0] == 2
    assert run(["pack", "a", "b", "--maxsize", "12Q"], capsys)[0] == 2


def test_help_and_version_exit_0(capsys: Cap) -> None:
    assert run(["--help"], capsys)[0] == 0
    code, out, _ = run(["--version"], capsys)
    assert code == 0 and tarindex.__version__ in out
    code, out, _ = run(["pack", "--help"], capsys)
    assert code == 0 and "%2E" in out


def test_missing_path_is_usage_error(tmp_path: Path, capsys: Cap) -> None:
    for cmd in (["info"], ["ls"], ["verify"], ["index"]):
        code, _, err = run([*cmd, str(tmp_path / "nope.tar")], capsys)
        assert code == 2
        one_clear_line(err)
        assert "nope.tar" in err
    code, _, err = run(["info", str(tmp_path / "x-*.tar")], capsys)
    assert code == 2 and "glob" in err


def test_missing_index_is_a_clear_error(shards: list[str], capsys: Cap) -> None:
    os.unlink(tarindex.storage.indexfile.index_path_for(shards[1]))
    for argv in (["info", *shards], ["ls", *shards], ["cat", shards[1], "0", "cls"]):
        code, _, err = run(argv, capsys)
        assert code == 1, argv
        one_clear_line(err)
        assert f"tarindex index {shards[1]}" in err


# -- info, ls, cat ----------------------------------------------------------------------------
def test_info(shards: list[str], capsys: Cap) -> None:
    code, out, _ = run(["info", os.path.dirname(shards[0])], capsys)
    assert code == 0
    assert "shards:      3" in out and "samples:     15" in out and "members:     45" in out
    assert "bin (15), cls (15), txt (15)" in out
    code, out, _ = run(["info", "--json", *shards], capsys)
    info = json.loads(out)
    assert info["shards"] == 3 and info["samples"] == 15 and info["members"] == 45
    assert info["extensions"] == {"bin": 15, "cls": 15, "txt": 15}
    assert info["tar_bytes"] == sum(os.path.getsize(p) for p in shards)
    data = 0
    for p in shards:
        m = tarindex.index.scan.scan(p)
        data += int(m.size.sum())
    assert info["data_bytes"] == data


def test_ls_samples(shards: list[str], capsys: Cap) -> None:
    code, out, _ = run(["ls", *shards], capsys)
    assert code == 0
    rows = [ln.split("\t") for ln in out.splitlines()]
    assert rows == [[str(i), f"{i:08d}", "bin,cls,txt"] for i in range(15)]


def test_ls_members_match_the_tar(shards: list[str], capsys: Cap) -> None:
    code, out, _ = run(["ls", "--members", shards[0]], capsys)
    assert code == 0
    data = Path(shards[0]).read_bytes()
    rows = [ln.split("\t") for ln in out.splitlines()]
    assert len(rows) == 15
    ds = tarindex.ShardReader(shards[0])
    for j in range(5):
        sample = ds.sample(j)
        for name, off, size in rows[3 * j : 3 * j + 3]:
            key, ext = name.split(".", 1)
            assert key == sample["__key__"]
            assert data[int(off) : int(off) + int(size)] == sample[ext]
    ds.close()
    code, out, _ = run(["ls", "-m", *shards], capsys)
    assert out.count("==> ") == 3 and len([ln for ln in out.splitlines() if "\t" in ln]) == 45


def test_cat_is_binary_exact(tmp_path: Path, capsysbinary: CapB) -> None:
    with tarindex.ShardWriter(str(tmp_path / "b-%02d.tar"), maxcount=2) as w:
        for i in range(5):
            w.write({"__key__": f"k{i}", "bin": ALL_BYTES * (i + 1), "cls": i})
    src = str(tmp_path / "b-{00..02}.tar")
    assert main(["cat", src, "k3", "bin"]) == 0
    assert capsysbinary.readouterr().out == ALL_BYTES * 4
    assert main(["cat", src, "3", "bin"]) == 0  # no key "3": global index 3
    assert capsysbinary.readouterr().out == ALL_BYTES * 4
    assert main(["cat", src, "-1", "cls"]) == 0
    assert capsysbinary.readouterr().out == b"4"
    assert main(["cat", "--index", src, "0", "cls"]) == 0
    assert capsysbinary.readouterr().out == b"0"


def test_cat_prefers_a_key_over_an_index(tmp_path: Path, capsysbinary: CapB) -> None:
    p = str(tmp_path / "k.tar")
    with tarindex.ShardWriter(p) as w:
        for i in range(3):
            w.write({"__key__": str(2 - i), "txt": f"key {2 - i} at {i}"})
    assert main(["cat", p, "0", "txt"]) == 0
    assert capsysbinary.readouterr().out == b"key 0 at 2"
    assert main(["cat", "-i", p, "0", "txt"]) == 0
    assert capsysbinary.readouterr().out == b"key 2 at 0"
    assert main(["cat", "-k", p, "7", "txt"]) == 1
    assert b"no sample with key '7'" in capsysbinary.readouterr().err


def test_cat_missing_sample_or_extension(shards: list[str], capsys: Cap) -> None:
    code, out, err = run(["cat", shards[0], "00000002", "png"], capsys)
    assert code == 1 and out == ""
    one_clear_line(err)
    assert "has no member 'png'; it has: bin, cls, txt" in err
    code, _, err = run(["cat", shards[0], "nokey", "bin"], capsys)
    assert code == 1 and "no sample with key 'nokey'" in err
    code, _, err = run(["cat", shards[0], "99", "bin"], capsys)
    assert code == 1 and "out of range" in err


# -- index ------------------------------------------------------------------------------------
def test_index_builds_skips_and_forces(shards: list[str], capsys: Cap) -> None:
    idx = [tarindex.storage.indexfile.index_path_for(p) for p in shards]
    written = [Path(p).read_bytes() for p in idx]
    for p in idx:
        os.unlink(p)
    pattern = os.path.join(os.path.dirname(shards[0]), "train-*.tar")
    code, out, _ = run(["index", "-j", "1", pattern], capsys)
    assert code == 0 and "3 built, 0 up to date (skipped), 0 failed" in out
    for p, w in zip(idx, written, strict=True):  # tables equal the writer's
        assert (
            tarindex.ShardReader(p[: -len(".tidx")]).index.tables_bytes()
            == tarindex.format.index.decode_index(w).tables_bytes()
        )
    code, out, _ = run(["index", pattern], capsys)
    assert code == 0 and "0 built, 3 up to date (skipped)" in out
    os.unlink(idx[2])
    code, out, _ = run(["index", pattern], capsys)
    assert code == 0 and "1 built, 2 up to date (skipped)" in out
    code, out, _ = run(["index", "--force", pattern], capsys)
    assert code == 0 and "3 built, 0 up to date" in out


def test_index_checksums_rebuilds_an_index_without_them(tmp_path: Path, capsys: Cap) -> None:
    """An index without crc32s is not up to date for ``--checksums`` (it skipped it before,
    and ``verify --data`` then failed asking for the same command)."""
    src = tmp_path / "src"
    src.mkdir()
    for i in range(3):
        (src / f"{i}.bin").write_bytes(bytes([i]) * 100)
    tar = str(tmp_path / "gnu.tar")
    subprocess.run(["tar", "cf", tar, "-C", str(src), "0.bin", "1.bin", "2.bin"], check=True)
    assert run(["index", tar], capsys)[0] == 0
    code, out, err = run(["verify", "--data", tar], capsys)
    assert code == 1 and "records no data checksums" in out + err
    code, out, _ = run(["index", "--checksums", tar], capsys)
    assert code == 0 and "1 built, 0 up to date" in out
    assert run(["verify", "--data", tar], capsys)[0] == 0
    code, out, _ = run(["index", "--checksums", tar], capsys)  # now it is up to date
    assert code == 0 and "0 built, 1 up to date" in out


@pytest.mark.parametrize("jobs", ["1", "2"])
def test_index_goes_on_after_a_corrupt_tar(
    shards: list[str], tmp_path: Path, jobs: str, capsys: Cap
) -> None:
    for p in shards:
        os.unlink(tarindex.storage.indexfile.index_path_for(p))
    cut = tmp_path / "cut.tar"
    cut.write_bytes(Path(shards[0]).read_bytes()[:3000])
    junk = tmp_path / "junk.tar"
    junk.write_bytes(b"not a tar at all" * 64)
    argv = ["index", "-j", jobs, shards[0], str(cut), shards[1], str(junk), shards[2]]
    code, out, err = run(argv, capsys)
    assert code == 1
    assert "5 shard(s): 3 built, 0 up to date (skipped), 2 failed" in out
    assert f"FAILED {cut}: byte " in err and f"FAILED {junk}: byte 0" in err
    assert "Traceback" not in err
    for p in shards:
        assert tarindex.ShardReader(p).n_samples > 0
    assert not os.path.exists(tarindex.storage.indexfile.index_path_for(str(cut)))
    assert not os.path.exists(tarindex.storage.indexfile.index_path_for(str(junk)))
    assert [p for p in os.listdir(tmp_path) if p.endswith(".tmp")] == []


# -- verify -----------------------------------------------------------------------------------
def test_verify_ok(shards: list[str], capsys: Cap) -> None:
    code, out, err = run(["verify", *shards], capsys)
    assert code == 0 and "3 ok, 0 failed" in out and err == ""


def test_verify_calls_tarindex_verify(
    shards: list[str], monkeypatch: pytest.MonkeyPatch, capsys: Cap
) -> None:
    import tarindex.read.verify

    seen: list[str] = []

    def fake(p: str, *, data: bool = False) -> str:
        seen.append(p)
        return "checked"

    monkeypatch.setattr(tarindex.read.verify, "verify", fake)
    code, out, _ = run(["verify", *shards], capsys)
    assert code == 0 and seen == shards and f"ok   {shards[0]}: checked" in out


def test_verify_detects_a_corrupt_index(shards: list[str], capsys: Cap) -> None:
    ip = tarindex.storage.indexfile.index_path_for(shards[1])
    buf = bytearray(Path(ip).read_bytes())
    buf[100] ^= 0x01  # inside the sample/member tables: the cheap open checks do not see it
    Path(ip).write_bytes(bytes(buf))
    code, out, err = run(["verify", *shards], capsys)
    assert code == 1 and "2 ok, 1 failed" in out
    assert f"FAIL {shards[1]}" in err and "crc32" in err


def test_verify_detects_a_replaced_tar(shards: list[str], capsys: Cap) -> None:
    with open(shards[0], "ab") as f:
        f.write(bytes(10240))
    code, _, err = run(["verify", shards[0]], capsys)
    assert code == 1 and "tarindex index --force" in err


def test_verify_detects_a_rewritten_tar_the_open_check_misses(tmp_path: Path, capsys: Cap) -> None:
    p = str(tmp_path / "big.tar")
    with tarindex.ShardWriter(p) as w:
        for i in range(40):
            w.write({"__key__": f"{i:04d}", "bin": bytes(1000), "cls": i})
    # rename a member in the middle, beyond the 4 KiB head/tail fingerprint, same size
    m = tarindex.index.scan.scan(p)
    k = m.names.index("0020.cls")
    hdr = int(m.offset[k]) - 512
    buf = bytearray(Path(p).read_bytes())
    _rewrite_header(buf, hdr, b"0020.txt")
    Path(p).write_bytes(bytes(buf))
    tarindex.ShardReader(p).close()  # the O(1) open check still passes
    code, _, err = run(["verify", p], capsys)
    assert code == 1
    assert f"FAIL {p}" in err and "0020" in err and "tarindex index --force" in err


def test_verify_missing_index_fails(shards: list[str], capsys: Cap) -> None:
    os.unlink(tarindex.storage.indexfile.index_path_for(shards[2]))
    code, out, err = run(["verify", *shards], capsys)
    assert code == 1 and "no index" in err and "Traceback" not in err


# -- pack -------------------------------------------------------------------------------------
def _png(value: int) -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    Image.new("L", (4, 4), value).save(buf, format="PNG")
    return buf.getvalue()


def test_pack_class_folders(tmp_path: Path, capsys: Cap) -> None:
    src = tmp_path / "src"
    files = {
        "dog/b.png": _png(1),
        "cat/a.png": _png(2),
        "cat/a.v2.png": _png(3),
        "cat/100%.png": _png(4),
        "bird/deep/x.png": _png(5),
        "dog/README": b"no ext",
        "dog/.DS_Store": b"hidden",
    }
    for rel, data in files.items():
        (src / rel).parent.mkdir(parents=True, exist_ok=True)
        (src / rel).write_bytes(data)
    out = tmp_path / "out"
    argv = ["pack", str(src), str(out / "train-%04d.tar"), "--maxcount", "2"]
    code, stdout, err = run(argv, capsys)
    assert code == 0, err
    assert "packed 5 samples" in stdout and "classes layout" in stdout
    assert "README" in err and ".DS_Store" not in err
    assert json.loads((out / "classes.json").read_text()) == ["bird", "cat", "dog"]
    assert sorted(os.listdir(out)) == [
        "classes.json",
        "train-0000.tar",
        "train-0000.tar.tidx",
        "train-0001.tar",
        "train-0001.tar.tidx",
        "train-0002.tar",
        "train-0002.tar.tidx",
    ]
    ds = tarindex.ShardSet(str(out / "train-*.tar"))
    got = {}
    for i in range(len(ds)):
        s = ds.sample(i)
        got[s["__key__"]] = (s["png"], int(s["cls"]))
    assert got == {
        "bird/deep/x": (files["bird/deep/x.png"], 0),
        "cat/100%25": (files["cat/100%.png"], 1),
        "cat/a": (files["cat/a.png"], 1),
        "cat/a%2Ev2": (files["cat/a.v2.png"], 1),
        "dog/b": (files["dog/b.png"], 2),
    }
    assert run(["verify", str(out)], capsys)[0] == 0


def test_pack_class_folders_decode_with_torch(tmp_path: Path, capsys: Cap) -> None:
    pytest.importorskip("torch")
    src = tmp_path / "src"
    for c, cls in enumerate(["a", "b"]):
        (src / cls).mkdir(parents=True)
        for i in range(3):
            (src / cls / f"{i}.png").write_bytes(_png(10 * c + i))
    assert run(["pack", str(src), str(tmp_path / "o" / "s.tar")], capsys)[0] == 0
    ds = tarindex.TarDataset(str(tmp_path / "o" / "s.tar"), decode="l8")
    assert [(int(s["png"][0, 0]), s["cls"]) for s in (ds[i] for i in range(len(ds)))] == [
        (0, 0),
        (1, 0),
        (2, 0),
        (10, 1),
        (11, 1),
        (12, 1),
    ]


def test_pack_flat_groups_by_first_dot(tmp_path: Path, capsys: Cap) -> None:
    src = tmp_path / "flat"
    (src / "sub").mkdir(parents=True)
    for rel, data in {
        "0001.png": b"p1",
        "0001.cls": b"3",
        "0001.seg.png": b"s1",
        "0002.png": b"p2",
        "sub/0003.txt": b"t",
        "notes": b"x",
    }.items():
        (src / rel).write_bytes(data)
    code, out, err = run(["pack", str(src), str(tmp_path / "f-%d.tar")], capsys)
    assert code == 0 and "flat layout" in out and "notes" in err
    assert not os.path.exists(tmp_path / "classes.json")
    code, out, _ = run(["ls", str(tmp_path / "f-0.tar")], capsys)
    assert out.splitlines() == ["0\t0001\tcls,png,seg.png", "1\t0002\tpng", "2\tsub/0003\ttxt"]


def test_pack_usage_errors(tmp_path: Path, capsys: Cap) -> None:
    src = tmp_path / "src"
    (src / "cat").mkdir(parents=True)
    for i in range(3):
        (src / "cat" / f"{i}.png").write_bytes(b"x")
    cases = [
        ([str(tmp_path / "missing"), str(tmp_path / "o-%d.tar")], "not a directory"),
        ([str(src), str(src / "o-%d.tar")], "inside SRC_DIR"),
        ([str(src), str(tmp_path / "one.tar"), "--maxcount", "2"], "more than one shard"),
        ([str(src), str(tmp_path / "o-%d%d.tar")], "one integer field"),
        ([str(src), str(tmp_path / "o-%d.tar"), "--layout", "flat", "--maxcount", "1"], None),
    ]
    for argv, msg in cases:
        code, _, err = run(["pack", *argv], capsys)
        if msg is None:
            assert code == 0, err
            continue
        assert code == 2, argv
        one_clear_line(err)
        assert msg in err
    (src / "stray.png").write_bytes(b"x")
    code, _, err = run(["pack", str(src), str(tmp_path / "x.tar"), "--layout", "classes"], capsys)
    assert code == 2 and "stray.png" in err
    (tmp_path / "empty").mkdir()
    code, _, err = run(["pack", str(tmp_path / "empty"), str(tmp_path / "e.tar")], capsys)
    assert code == 2 and "no files to pack" in err


def test_pack_refuses_a_cls_file_in_class_layout(tmp_path: Path) -> None:
    (tmp_path / "s" / "a").mkdir(parents=True)
    (tmp_path / "s" / "a" / "0.png").write_bytes(b"x")
    (tmp_path / "s" / "a" / "0.cls").write_bytes(b"1")
    assert main(["pack", str(tmp_path / "s"), str(tmp_path / "o.tar")]) == 2


def test_sanitize_stem_is_injective() -> None:
    stems = ["a.b", "a%2Eb", "a_b", "a%b", "a%25b", "a..b", "%", "."]
    keys = [sanitize_stem(s) for s in stems]
    assert len(set(keys)) == len(stems)
    assert all("." not in k for k in keys)
    from urllib.parse import unquote

    assert [unquote(k) for k in keys] == stems


def test_plan_pack_is_deterministic(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    for i in rng.permutation(20).tolist():
        (tmp_path / f"{i:03d}.bin").write_bytes(b"x")
    plan = plan_pack(str(tmp_path))
    assert [k for k, _, _ in plan.samples] == [f"{i:03d}" for i in range(20)]


def test_parse_size() -> None:
    assert parse_size("1000") == 1000
    assert parse_size("1e9") == 10**9
    assert parse_size("500M") == 500 * 10**6
    assert parse_size("1.5G") == 1_500_000_000
    assert parse_size("64KiB") == 65536
    assert parse_size("2gib") == 2 * 1024**3


# -- demo (fast paths; the real run is in test_demo.py) ----------------------------------------
def test_demo_without_sklearn_says_how_to_install(
    monkeypatch: pytest.MonkeyPatch, capsys: Cap
) -> None:
    monkeypatch.setitem(sys.modules, "sklearn", None)
    monkeypatch.setitem(sys.modules, "sklearn.datasets", None)
    code, _, err = run(["demo"], capsys)
    assert code == 1
    one_clear_line(err)
    assert 'pip install -c constraints.txt -e ".[demo]"' in err


# -- real processes ---------------------------------------------------------------------------
def _python(*args: str, **kw: object) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run([sys.executable, *args], capture_output=True, timeout=120, **kw)  # type: ignore[call-overload,no-any-return]


def test_python_m_tarindex(shards: list[str], tmp_path: Path) -> None:
    r = _python("-m", "tarindex", "info", *shards)
    assert r.returncode == 0 and b"samples:     15" in r.stdout
    expected = tarindex.ShardReader(shards[1]).sample(2)["bin"]
    r = _python("-m", "tarindex", "cat", shards[1], "00000007", "bin")
    assert r.returncode == 0 and r.stdout == expected
    r = _python("-m", "tarindex", "info", str(tmp_path / "none.tar"))
    assert r.returncode == 2 and b"Traceback" not in r.stderr
    want = f"tarindex info: error: {tmp_path / 'none.tar'}: shard not found"
    assert r.stderr.decode().strip() == want


def test_cli_works_without_torch(shards: list[str]) -> None:
    code = (
        "import sys; sys.modules['torch'] = None\n"
        "from tarindex.cli.main import main\n"
        f"rc = main(['info', {shards[0]!r}]) or main(['verify', {shards[0]!r}])\n"
        "assert 'torch' not in [m.split('.')[0] for m in sys.modules if sys.modules[m]]\n"
        "sys.exit(rc)\n"
    )
    r = _python("-c", code)
    assert r.returncode == 0, r.stderr.decode()


def test_ls_into_a_closed_pipe_is_quiet(tmp_path: Path) -> None:
    p = str(tmp_path / "many.tar")
    with tarindex.ShardWriter(p) as w:
        for i in range(6000):
            w.write({"__key__": f"{i:08d}", "cls": i})
    proc = subprocess.Popen(
        [sys.executable, "-m", "tarindex", "ls", p], stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    assert proc.stdout is not None and proc.stderr is not None
    assert proc.stdout.readline() == b"0\t00000000\tcls\n"
    proc.stdout.close()
    err = proc.stderr.read()
    proc.wait(timeout=60)
    assert b"Traceback" not in err and b"Exception ignored" not in err, err


# -- tars made by other tools -----------------------------------------------------------------
@pytest.mark.skipif(shutil.which("tar") is None, reason="needs the tar command")
def test_gnu_tar_index_ls_cat(tmp_path: Path, capsysbinary: CapB) -> None:
    src = tmp_path / "files"
    (src / "d.1").mkdir(parents=True)
    blobs = {
        f"d.1/{i:03d}.{ext}": ALL_BYTES[i:] + ext.encode()
        for i in range(4)
        for ext in ("bin", "seg.bin")
    }
    for rel, data in blobs.items():
        (src / rel).write_bytes(data)
    tar = tmp_path / "gnu.tar"
    subprocess.run(["tar", "cf", str(tar), "-C", str(src), *sorted(blobs)], check=True)
    assert main(["cat", str(tar), "0", "bin"]) == 1  # not indexed yet
    assert b"tarindex index" in capsysbinary.readouterr().err
    assert main(["ls", "--members", str(tar)]) == 0  # the header walk needs no index
    rows = capsysbinary.readouterr().out.decode().splitlines()
    assert [r.split("\t")[0] for r in rows] == sorted(blobs)
    assert main(["index", str(tmp_path / "*")]) == 0  # the glob also matches files/: skipped
    capsysbinary.readouterr()
    assert main(["cat", str(tar), "d.1/002", "seg.bin"]) == 0
    assert capsysbinary.readouterr().out == blobs["d.1/002.seg.bin"]
    assert main(["index", str(tmp_path / "*.t*")]) == 0  # gnu.tar.tidx is not a shard
    assert "0 built, 1 up to date" in capsysbinary.readouterr().out.decode()


def test_index_reports_interleaved_samples(tmp_path: Path, capsys: Cap) -> None:
    p = tmp_path / "mixed.tar"
    with tarfile.open(p, "w", format=tarfile.USTAR_FORMAT) as tf:
        for name in ("a.png", "b.png", "a.cls", "b.cls"):
            info = tarfile.TarInfo(name)
            info.size = 1
            tf.addfile(info, io.BytesIO(b"x"))
    code, out, err = run(["index", str(p)], capsys)
    assert code == 0 and "1 built" in out
    assert "tarindex index: warning:" in err and "not adjacent" in err
    code, out, _ = run(["ls", str(p)], capsys)
    assert out.splitlines() == ["0\ta\tpng,cls", "1\tb\tpng,cls"]


# -- a fresh user's findings, through the real command ----------------------------------------
def _tarindex(*args: str, cwd: Path) -> tuple[int, str, str]:
    r = _python("-m", "tarindex", *args, cwd=cwd)
    return r.returncode, r.stdout.decode(), r.stderr.decode()


def test_a_bad_option_shows_the_subcommands_usage(tmp_path: Path) -> None:
    for argv in (["ls", "--bogus", "x.tar"], ["ls", "x.tar", "--bogus"]):
        code, out, err = _tarindex(*argv, cwd=tmp_path)
        assert code == 2 and out == "", err
        assert err.startswith("usage: tarindex ls [-h]") and "--members" not in err, err
        assert err.splitlines()[-1] == "tarindex ls: error: unrecognized arguments: --bogus"
    code, _, err = _tarindex("--bogus", cwd=tmp_path)  # no subcommand: the top-level usage
    assert code == 2 and err.startswith("usage: tarindex [-h] [--version] COMMAND")


def test_an_ambiguous_key_names_the_commands_that_pick_one(tmp_path: Path) -> None:
    for name in ("a", "b"):
        with tarindex.ShardWriter(str(tmp_path / f"{name}-%02d.tar"), maxcount=3) as w:
            for i in range(4):
                w.write({"__key__": f"k{i}", "txt": f"{name}{i}"})
    code, out, err = _tarindex("cat", "*.tar", "k3", "txt", cwd=tmp_path)
    assert code == 1 and out == ""
    one_clear_line(err)
    assert "3 (a-01.tar, sample 0), 7 (b-01.tar, sample 0)" in err, err
    assert "indices_of" not in err  # a CLI user gets CLI commands, not a Python call
    by_index = "tarindex cat --index '*.tar' 3 txt"
    by_shard = "tarindex cat a-01.tar k3 txt"
    assert by_index in err and by_shard in err, err
    for cmd in (by_index, by_shard):  # both run as printed
        code, out, err = _tarindex(*cmd.replace("'", "").split()[1:], cwd=tmp_path)
        assert (code, out) == (0, "a3"), err


def test_pack_prints_classes_json_as_the_shards_are_named(tmp_path: Path) -> None:
    for rel in ("src/cat/1.png", "src/dog/2.png"):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_bytes(_png(1))
    for jobs in ("1", "2"):
        out_pattern = f"out{jobs}/p-%02d.tar"
        argv = ("pack", "src", out_pattern, "--maxcount", "1", "--jobs", jobs, "-q")
        code, out, err = _tarindex(*argv, cwd=tmp_path)
        assert code == 0, err
        lines = out.splitlines()
        assert lines[1:3] == [f"  out{jobs}/p-00.tar", f"  out{jobs}/p-01.tar"], out
        assert lines[3].endswith(f": out{jobs}/classes.json"), out
        # classes.json cannot be written: nothing of the pack is kept (with --jobs too)
        bad = tmp_path / f"bad{jobs}"
        (bad / "classes.json").mkdir(parents=True)
        code, out, err = _tarindex(
            "pack", "src", f"bad{jobs}/p-%02d.tar", "--jobs", jobs, "-q", cwd=tmp_path
        )
        assert code == 1, (out, err)
        assert f"bad{jobs}/classes.json" in err and "nothing of this pack was kept" in err, err
        assert sorted(os.listdir(bad)) == ["classes.json"]


def test_a_changed_shard_of_a_manifest_says_how_to_rebuild_it(tmp_path: Path) -> None:
    def write(text: str) -> None:
        with tarindex.ShardWriter(str(tmp_path / "d-%02d.tar"), maxcount=2) as w:
            for i in range(3):
                w.write({"__key__": f"k{i}", "txt": f"{text}{i}"})

    write("old")
    assert _tarindex("manifest", "d-*.tar", "-o", "m.json", cwd=tmp_path)[0] == 0
    write("new")
    code, out, err = _tarindex("cat", "m.json", "k0", "txt", cwd=tmp_path)
    assert code == 1 and out == ""
    one_clear_line(err)
    assert "d-00.tar: shard 0 of manifest m.json changed since the manifest was made" in err
    assert "(head crc32 now 0x" in err, err
    fix = "tarindex manifest m.json -o m.json"
    assert fix in err, err
    assert _tarindex(*fix.split()[1:], cwd=tmp_path)[0] == 0  # the fix, as printed
    assert _tarindex("cat", "m.json", "k0", "txt", cwd=tmp_path)[1] == "new0"
    os.unlink(tmp_path / "d-01.tar")
    code, out, err = _tarindex("manifest", "--check", "m.json", cwd=tmp_path)
    assert code == 1 and "d-01.tar: shard 1 of manifest m.json is missing" in err, err
    assert "tarindex manifest SHARDS... -o m.json" in err


# -- issue 19 item 18: what ls and cat say --------------------------------------------------
def test_ls_members_lists_a_shadowed_member_and_marks_it(tmp_path: Path, capsys: Cap) -> None:
    """`./dup.bin` then `dup.bin`: both are listed; the first, which extraction and the index
    replace by the later copy, is marked (one line per member, 11 for 11)."""
    names = [f"{i:02d}.bin" for i in range(9)]
    names[3] = "./dup.bin"
    names.insert(7, "dup.bin")
    names.append("x.cls")
    p = tmp_path / "dup.tar"
    with tarfile.open(p, "w", format=tarfile.USTAR_FORMAT) as tf:
        for i, name in enumerate(names):
            info = tarfile.TarInfo(name)
            data = f"{name}-{i}".encode()
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
    code, out, _ = run(["ls", "--members", str(p)], capsys)
    assert code == 0
    rows = [ln.split("\t") for ln in out.splitlines()]
    assert [r[0] for r in rows] == names  # 11 lines for 11 members, in archive order
    later = tarindex.index.scan.scan(p).offset.tolist()[7]
    assert rows[3][3:] == [f"shadowed by the later dup.bin at byte {later}"], rows[3]
    assert all(len(r) == 3 for i, r in enumerate(rows) if i != 3), rows
    assert run(["index", str(p)], capsys)[0] == 0  # the index holds the later copy
    r = tarindex.ShardReader(str(p))
    by_key = {r.sample(j)["__key__"]: r.sample(j) for j in range(r.n_samples)}
    assert by_key["dup"]["bin"] == b"dup.bin-7"
    r.close()


def test_cat_past_the_end_names_the_source(tmp_path: Path, capsys: Cap) -> None:
    p = str(tmp_path / "five.tar")
    with tarindex.ShardWriter(p) as w:
        for i in range(5):
            w.write({"__key__": f"k{i}", "txt": f"t{i}"})
    for which in ("5", "-6"):
        code, out, err = run(["cat", "--index", p, which, "txt"], capsys)
        assert code == 1 and out == ""
        one_clear_line(err)
        assert f"{p}: sample index {which} out of range" in err, err
        assert "5 samples in 1 shard(s)" in err and "-5..4" in err, err
