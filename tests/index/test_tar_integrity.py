"""Tar fidelity and "nothing dropped silently": one test per kind of input (TAR_DIALECTS.md).

The kinds are those other readers' test suites exercise (Go's archive/tar, libarchive, CPython's
tarfile): consecutive pax headers, GNU long link targets, NULs and missing ``=`` in pax records,
empty pax headers, v7 directories with a size, huge pax sizes, FIFOs and devices, tars without
end blocks; and members in no sample, listed and escaped by ``tarindex ls``. Every input is
built here, by GNU tar, Python's tarfile, or byte by byte where no tool writes that kind.
"""

from __future__ import annotations

import io
import os
import shutil
import stat
import subprocess
import tarfile
import threading
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Literal

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import tarindex
from tarindex.cli.main import main
from tarindex.errors import NotATarError, TarHeaderError, TruncatedError
from tarindex.format.keys import escape_name, no_sample_members, no_sample_reason, split_key
from tarindex.format.tar import padded
from tarindex.index.build import build_index
from tarindex.index.scan import scan_members

pytestmark = pytest.mark.timeout(120)

END = bytes(1024)


# -- byte-level builders (for the kinds no tool writes on purpose) ----------------------------
def hdr(
    name: str,
    size: int = 0,
    tf: bytes = tarfile.REGTYPE,
    link: str = "",
    fmt: Literal[0, 1, 2] = tarfile.USTAR_FORMAT,
) -> bytes:
    """One header block as Python's tarfile writes it (name and link <= 100 bytes)."""
    ti = tarfile.TarInfo(name)
    ti.size, ti.type, ti.linkname, ti.mtime = size, tf, link, 0
    return ti.tobuf(fmt, "utf-8", "surrogateescape")


def body(data: bytes) -> bytes:
    """``data`` and its zero padding to a whole block."""
    return data + bytes(padded(len(data)) - len(data))


def rec(key: bytes, value: bytes) -> bytes:
    """One pax record ``"<len> key=value\\n"`` (POSIX.1-2001 pax)."""
    core = b" " + key + b"=" + value + b"\n"
    n = len(core) + 1
    while len(str(n)) + len(core) != n:
        n = len(str(n)) + len(core)
    return str(n).encode() + core


def pax(*records: bytes, tf: bytes = tarfile.XHDTYPE) -> bytes:
    """A pax extended (``x``) or global (``g``) header with its records."""
    data = b"".join(records)
    return hdr("PaxHeaders/h", len(data), tf) + body(data)


def member(name: str, data: bytes, tf: bytes = tarfile.REGTYPE) -> bytes:
    return hdr(name, len(data), tf) + body(data)


def write(tmp_path: Path, raw: bytes, name: str = "x.tar") -> Path:
    p = tmp_path / name
    p.write_bytes(raw)
    return p


def gnu_tar() -> str:
    path = shutil.which("tar")
    if (
        path is None
        or b"GNU tar" not in subprocess.run([path, "--version"], capture_output=True).stdout
    ):
        pytest.skip("GNU tar is not installed")
    return path


def gnu_list(tar: Path) -> list[str]:
    """GNU tar's listing of ``tar`` (the reference for pax/GNU header semantics)."""
    r = subprocess.run([gnu_tar(), "-tf", str(tar)], capture_output=True, env={"LC_ALL": "C"})
    assert r.returncode == 0, r.stderr
    return r.stdout.decode("utf-8", "surrogateescape").splitlines()


def scan_quiet(p: Path, **kw: bool) -> tarindex.index.members.Members:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return scan_members(p, **kw)


# -- consecutive pax headers: the last one applies, whole ---------------------------------------
def test_consecutive_pax_headers_last_applies(tmp_path: Path) -> None:
    raw = (
        pax(rec(b"path", b"first.txt"))  # replaced by the next header, not merged with it
        + pax(rec(b"mtime", b"1.5"))
        + member("real.txt", b"abc")
        + pax(rec(b"path", b"one.bin"))
        + pax(rec(b"path", b"two.bin"))
        + member("hdr.bin", b"xy")
        + pax(rec(b"path", b"p" * 600 + b".bin"))  # records > 1 block: the slow path
        + pax(rec(b"size", b"4"))
        + hdr("size.bin", 0)
        + body(b"1234")
        + pax(rec(b"linkpath", b"L" * 300), rec(b"path", b"old.lnk"))
        + pax(rec(b"linkpath", b"T" * 200))
        + hdr("new.lnk", 0, tarfile.SYMTYPE, "short")
        + END
    )
    p = write(tmp_path, raw)
    m = scan_members(p)
    assert m.raw_names == [b"real.txt", b"two.bin", b"size.bin"]
    assert m.size.tolist() == [3, 2, 4]
    assert ("new.lnk", "symlink to " + "T" * 200) in m.skipped
    assert gnu_list(p) == ["real.txt", "two.bin", "size.bin", "new.lnk"]
    with open(p, "rb") as f:
        f.seek(int(m.offset[2]))
        assert f.read(4) == b"1234"


# -- GNU LongLink ('K'): the whole target --------------------------------------------------------
def test_gnu_longlink_targets_read_in_full(tmp_path: Path) -> None:
    tar = gnu_tar()
    root = tmp_path / "tree"
    (root / "d").mkdir(parents=True)
    long_file = "d/" + "f" * 120 + ".bin"
    (root / long_file).write_bytes(b"long-named file")
    os.link(root / long_file, root / "h.bin")  # hard link whose target needs a K record
    os.symlink("y" * 300, root / "s.lnk")  # symlink whose target needs a K record
    out = tmp_path / "gnu.tar"
    subprocess.run(
        [tar, "--format=gnu", "-cf", str(out), "-C", str(root), long_file, "h.bin", "s.lnk"],
        check=True,
    )
    m = scan_members(out)
    assert ("s.lnk", "symlink to " + "y" * 300) in m.skipped
    assert ("h.bin", "hard link to " + long_file) in m.skipped
    assert m.names == [long_file]


def test_tarfile_gnu_longlink_and_repeated_k(tmp_path: Path) -> None:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.GNU_FORMAT) as tf:
        ti = tarfile.TarInfo("sym.lnk")
        ti.type, ti.linkname = tarfile.SYMTYPE, "t/" * 150 + "end"
        tf.addfile(ti)
    m = scan_members(write(tmp_path, buf.getvalue()))
    assert m.skipped == [("sym.lnk", "symlink to " + "t/" * 150 + "end")]
    # two K records in a row (Go's gnu-multi-hdrs kind): the last one applies
    k1 = member("././@LongLink", b"A" * 150 + b"\0", tarfile.GNUTYPE_LONGLINK)
    k2 = member("././@LongLink", b"B" * 160 + b"\0", tarfile.GNUTYPE_LONGLINK)
    l1 = member("././@LongLink", b"N" * 130 + b"\0", tarfile.GNUTYPE_LONGNAME)
    l2 = member("././@LongLink", b"M" * 140 + b"\0", tarfile.GNUTYPE_LONGNAME)
    raw = k1 + l1 + k2 + l2 + hdr("x", 0, tarfile.SYMTYPE, "short", tarfile.GNU_FORMAT) + END
    p = write(tmp_path, raw, "multi.tar")
    assert scan_members(p).skipped == [("M" * 140, "symlink to " + "B" * 160)]
    assert gnu_list(p) == ["M" * 140]


# -- ambiguous pax records: NUL in path, no '=', NUL in a keyword ------------------------------
@pytest.mark.parametrize("big", [False, True], ids=["one-block", "multi-block"])
@pytest.mark.parametrize(
    "record",
    [
        rec(b"path", b"evil\0.txt"),
        rec(b"linkpath", b"a\0b"),
        b"11 pathfoo\n",  # no '='
        rec(b"SCHILY.xattr.user.nul\0", b"fizzbuzz"),  # NUL in the keyword
        rec(b"", b"value"),  # empty keyword
    ],
    ids=["nul-in-path", "nul-in-linkpath", "no-equals", "nul-in-keyword", "empty-keyword"],
)
def test_ambiguous_pax_records_are_refused(tmp_path: Path, record: bytes, big: bool) -> None:
    pad = rec(b"comment", b"c" * 700) if big else b""
    raw = pax(pad + record) + member("file.txt", b"data") + END
    with pytest.raises(TarHeaderError, match="pax"):
        scan_members(write(tmp_path, raw))


def test_nul_in_other_pax_values_is_accepted(tmp_path: Path) -> None:
    # Go accepts a NUL in values other than names (xattrs are binary); so does tarindex
    raw = pax(rec(b"SCHILY.xattr.user.bin", b"a\0b")) + member("file.txt", b"data") + END
    assert scan_members(write(tmp_path, raw)).raw_names == [b"file.txt"]


def test_tarfile_pax_path_with_nul_is_refused(tmp_path: Path) -> None:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tf:
        ti = tarfile.TarInfo("plain.txt")
        ti.pax_headers = {"path": "a\0b.txt"}
        tf.addfile(ti, io.BytesIO(b""))
    with pytest.raises(TarHeaderError, match="NUL"):
        scan_members(write(tmp_path, buf.getvalue()))


# -- empty pax headers: refused ---------------------------------------------------------------
@pytest.mark.parametrize("tf", [tarfile.XHDTYPE, tarfile.XGLTYPE], ids=["x", "g"])
def test_empty_pax_header_is_refused(tmp_path: Path, tf: bytes) -> None:
    raw = hdr("PaxHeaders/empty", 0, tf) + member("file.txt", b"") + END
    with pytest.raises(TarHeaderError, match="empty pax"):
        scan_members(write(tmp_path, raw))
    with pytest.raises(TarHeaderError):
        build_index(tmp_path / "x.tar")
    assert not (tmp_path / "x.tar.tidx").exists()


def test_pax_header_with_records_still_read(tmp_path: Path) -> None:
    raw = pax(rec(b"comment", b"c"), tf=tarfile.XGLTYPE) + member("file.txt", b"") + END
    assert scan_members(write(tmp_path, raw)).raw_names == [b"file.txt"]


# -- v7 directory with a size field -----------------------------------------------------------
def test_v7_directory_with_size_does_not_swallow_next_header(tmp_path: Path) -> None:
    raw = (
        hdr("directory1/", 1, tarfile.AREGTYPE)
        + hdr("directory2/", 600, tarfile.AREGTYPE)
        + member("f.txt", b"abc", tarfile.AREGTYPE)
        + END
    )
    p = write(tmp_path, raw)
    m = scan_members(p)
    assert m.raw_names == [b"f.txt"]
    assert m.skipped == [("directory1/", "directory"), ("directory2/", "directory")]
    with tarfile.open(p) as tf:  # tarfile reads v7 directories the same way
        assert [(t.name, t.isdir()) for t in tf] == [
            ("directory1", True),
            ("directory2", True),
            ("f.txt", False),
        ]


def test_v7_directory_with_size_after_many_members(tmp_path: Path) -> None:
    """The batch check finds the directory late; the walk resumes after it, nothing repeated."""
    parts = []
    for i in range(2600):  # more than one batch of 2048 before the directory
        parts.append(member(f"a/{i:05d}.bin", bytes([i % 256]) * (i % 700), tarfile.AREGTYPE))
    parts.append(member("u.odd", b"12345", b"Q"))  # unknown typeflag: one warning
    parts.append(hdr("v7dir/", 1000, tarfile.AREGTYPE))  # its "data" is the next header
    parts.append(hdr("sym.lnk", 0, tarfile.SYMTYPE, "a/00000.bin"))
    for i in range(300):
        parts.append(member(f"b/{i:05d}.bin", bytes([i % 256]) * (i % 900), tarfile.AREGTYPE))
    p = write(tmp_path, b"".join(parts) + END)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        m = scan_members(p)
    assert len(caught) == 1 and "unknown type" in str(caught[0].message)
    with tarfile.open(p) as tf:
        want = [t for t in tf if t.isreg()]
    assert m.names == [t.name for t in want]
    assert m.offset.tolist() == [t.offset_data for t in want]
    assert m.skipped == [
        ("u.odd", "member of unknown type 'Q'"),
        ("v7dir/", "directory"),
        ("sym.lnk", "symlink to a/00000.bin"),
    ]


def test_gnu_tar_v7_directories(tmp_path: Path) -> None:
    tar = gnu_tar()
    root = tmp_path / "tree"
    (root / "d" / "e").mkdir(parents=True)
    (root / "d" / "e" / "k.txt").write_bytes(b"v7")
    out = tmp_path / "v7.tar"
    subprocess.run([tar, "--format=v7", "-cf", str(out), "-C", str(root), "d"], check=True)
    m = scan_members(out)
    assert m.names == ["d/e/k.txt"]
    assert [r for _, r in m.skipped] == ["directory", "directory"]


# -- a pax size of thousands of digits ----------------------------------------------------------
@pytest.mark.parametrize("digits", [25, 5000])
def test_huge_pax_size_is_tar_header_error(tmp_path: Path, digits: int) -> None:
    raw = pax(rec(b"size", b"9" * digits)) + member("file.txt", b"abc") + END
    with pytest.raises(TarHeaderError, match="pax size"):
        scan_members(write(tmp_path, raw))


# -- FIFOs and devices are refused without blocking --------------------------------------------
def _in_thread(fn: Callable[..., object], *args: object) -> object:
    """Run ``fn(*args)`` with a deadline: a blocking open fails the test instead of hanging it."""
    box: list[object] = []

    def target() -> None:
        try:
            box.append(fn(*args))
        except BaseException as e:  # noqa: BLE001 - handed to the test
            box.append(e)

    t = threading.Thread(target=target, daemon=True)
    t.start()
    t.join(20)
    assert not t.is_alive(), "blocked on a FIFO"
    return box[0]


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs on this platform")
def test_fifo_is_refused_without_blocking(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    fifo = tmp_path / "pipe.tar"
    os.mkfifo(fifo)
    err = _in_thread(scan_members, fifo)
    assert isinstance(err, NotATarError) and "FIFO" in str(err)
    assert _in_thread(main, ["index", "-j", "1", str(fifo)]) == 1
    assert _in_thread(main, ["ls", "--members", str(fifo)]) == 1
    assert "FIFO" in capsys.readouterr().err
    # inside a directory source: the FIFO fails, the real shard next to it is indexed
    good = tmp_path / "a.tar"
    good.write_bytes(member("0.txt", b"ok") + END)
    assert _in_thread(main, ["index", "-j", "1", str(tmp_path)]) == 1
    assert (tmp_path / "a.tar.tidx").exists() and not (tmp_path / "pipe.tar.tidx").exists()
    assert stat.S_ISFIFO(os.stat(fifo).st_mode)


@pytest.mark.parametrize("dev", ["/dev/null", "/dev/zero"])
def test_device_is_refused(dev: str) -> None:
    if not os.path.exists(dev):
        pytest.skip(f"{dev} does not exist")
    err = _in_thread(scan_members, dev)
    assert isinstance(err, NotATarError) and "character device" in str(err)


def test_directory_is_refused(tmp_path: Path) -> None:
    with pytest.raises(IsADirectoryError):
        scan_members(tmp_path)


# -- no end-of-archive blocks: refused by default, opt-in with a warning -----------------------
def _tarfile_bytes(n: int = 3) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.USTAR_FORMAT) as tf:
        for i in range(n):
            ti = tarfile.TarInfo(f"{i:04d}.txt")
            data = f"sample {i}".encode() * (i + 1)
            ti.size = len(data)
            tf.addfile(ti, io.BytesIO(data))
    return buf.getvalue()


def _end_of_members(p: Path) -> int:
    m = scan_members(p)
    return int(m.offset[-1]) + padded(int(m.size[-1]))


def test_missing_end_blocks_refused_by_default(tmp_path: Path) -> None:
    full = write(tmp_path, _tarfile_bytes(), "full.tar")
    cut = write(tmp_path, full.read_bytes()[: _end_of_members(full)], "cut.tar")
    with pytest.raises(TruncatedError, match="no-require-end"):
        scan_members(cut)
    with pytest.raises(TruncatedError):
        build_index(cut)
    assert not (tmp_path / "cut.tar.tidx").exists()
    assert main(["index", "-j", "1", str(cut)]) == 1


def test_missing_end_blocks_opt_in(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    full = write(tmp_path, _tarfile_bytes(), "full.tar")
    end = _end_of_members(full)
    cut = write(tmp_path, full.read_bytes()[:end], "cut.tar")
    with pytest.warns(UserWarning, match="without the end-of-archive marker"):
        tables = build_index(cut, require_end=False)
    assert tables.n_samples == 3
    with tarindex.ShardReader(str(cut)) as r:
        assert bytes(r.sample(2)["txt"]) == b"sample 2" * 3
    cut.with_name("cut.tar.tidx").unlink()
    assert main(["index", "-j", "1", "--no-require-end", str(cut)]) == 0
    assert "without the end-of-archive marker" in capsys.readouterr().err
    # cut inside the last member's padding: every byte of data is there
    pad = write(tmp_path, full.read_bytes()[: end - 100], "pad.tar")
    with pytest.warns(UserWarning, match="inside its zero padding"):
        assert len(scan_members(pad, require_end=False)) == 3
    # still refused: cut inside a member's data, inside a header, after a pax record
    for k, raw in enumerate(
        [
            full.read_bytes()[: end - 512 - 10],
            full.read_bytes()[: end + 100],
            full.read_bytes()[:end] + pax(rec(b"path", b"next.txt")),
        ]
    ):
        with pytest.raises(TruncatedError):
            scan_quiet(write(tmp_path, raw, f"bad{k}.tar"), require_end=False)


def test_gnu_tar_cut_at_member_boundary(tmp_path: Path) -> None:
    tar = gnu_tar()
    root = tmp_path / "tree"
    root.mkdir()
    for i in range(4):
        (root / f"{i}.bin").write_bytes(bytes([i]) * (100 * i + 1))
    full = tmp_path / "gnu.tar"
    subprocess.run([tar, "-cf", str(full), "-C", str(root), "."], check=True)
    cut = write(tmp_path, full.read_bytes()[: _end_of_members(full)], "cut.tar")
    with pytest.raises(TruncatedError):
        scan_members(cut)
    with pytest.warns(UserWarning, match="require_end=False"):
        assert scan_members(cut, require_end=False).names == scan_members(full).names


# -- members in no sample: listed, counted in one warning, shown by ls --------------------------
NO_SAMPLE = {
    "README": "in no sample: no extension",
    ".hidden": "in no sample: hidden name (starts with '.')",
    "d/.x.png": "in no sample: hidden name (starts with '.')",
    "name.": "in no sample: empty extension (name ends with '.')",
    "k.__key__": "in no sample: reserved extension (starts with '__')",
}


def test_members_in_no_sample_are_listed_and_warned(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    tar = gnu_tar()
    root = tmp_path / "tree"
    (root / "d").mkdir(parents=True)
    (root / "ok").mkdir()
    names = ["ok/0001.png", "README", ".hidden", "d/.x.png", "name.", "k.__key__", "ok/0001.cls"]
    for n in names:
        (root / n).write_bytes(n.encode())
    out = tmp_path / "s.tar"
    subprocess.run([tar, "-cf", str(out), "-C", str(root), *names], check=True)
    m = scan_members(out)
    assert m.names == names  # every regular file is still a member of the tar
    assert m.skipped == [(n, NO_SAMPLE[n]) for n in names if n in NO_SAMPLE]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        tables = build_index(out)
    assert tables.n_samples == 1
    assert len(caught) == 1
    msg = str(caught[0].message)
    assert "5 regular file(s) belong to no sample" in msg and "'README'" in msg
    assert "tarindex ls --members --skipped" in msg
    capsys.readouterr()
    assert main(["ls", "--skipped", str(out)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines == [f"{n}\t{NO_SAMPLE[n]}" for n in names if n in NO_SAMPLE]
    assert main(["index", "-j", "1", "--force", str(out)]) == 0
    assert capsys.readouterr().err.count("belong to no sample") == 1


def test_skipped_is_in_archive_order(tmp_path: Path) -> None:
    raw = (
        member("README", b"r")
        + hdr("dir/", 0, tarfile.DIRTYPE)
        + member("0.txt", b"0")
        + hdr("v7/", 0, tarfile.AREGTYPE)
        + hdr("l.lnk", 0, tarfile.SYMTYPE, "0.txt")
        + member("z.", b"z")
        + END
    )
    m = scan_members(write(tmp_path, raw))
    assert [n for n, _ in m.skipped] == ["README", "dir/", "v7/", "l.lnk", "z."]


_NAME_BYTES = st.binary(max_size=12).map(lambda b: b.replace(b"\0", b"")) | st.text(
    "./_ab\xff", max_size=12
).map(lambda s: s.encode("utf-8", "surrogateescape"))


@settings(max_examples=300, deadline=None)
@given(st.lists(_NAME_BYTES, max_size=30))
def test_no_sample_members_is_split_key(names: list[bytes]) -> None:
    want = [i for i, n in enumerate(names) if split_key(n) is None]
    assert no_sample_members(names).tolist() == want
    assert [i for i, n in enumerate(names) if no_sample_reason(n) is not None] == want


def test_no_sample_members_falls_back_on_nul() -> None:
    names = [b"a\0b.txt", b"README", b"c.png"]
    assert no_sample_members(names).tolist() == [1]


# -- ls escapes control characters: one line is one item ------------------------------------------
ODD = {
    "a\nb.txt": "a\\nb.txt",
    "tab\there.txt": "tab\\there.txt",
    "cr\r.txt": "cr\\r.txt",
    "esc\x1b.txt": "esc\\x1b.txt",
    "del\x7f.txt": "del\\x7f.txt",
    "c1\x85.txt": "c1\\u0085.txt",
    "ls\u2028x.txt": "ls\\u2028x.txt",
    "back\\slash.txt": "back\\\\slash.txt",
    "raw\udcff.txt": "raw\\xff.txt",
    "plain é.txt": "plain é.txt",
}


def test_ls_escapes_names_and_keys(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    buf = io.BytesIO()
    with tarfile.open(
        fileobj=buf, mode="w", format=tarfile.PAX_FORMAT, encoding="utf-8", errors="surrogateescape"
    ) as tf:
        for name in [*ODD, "READ\nME"]:
            ti = tarfile.TarInfo(name)
            ti.size = 2
            tf.addfile(ti, io.BytesIO(b"ok"))
    p = write(tmp_path, buf.getvalue())
    capsys.readouterr()
    assert main(["ls", "--members", str(p)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [ln.split("\t")[0] for ln in lines] == [*ODD.values(), "READ\\nME"]
    assert all(len(ln.split("\t")) == 3 for ln in lines)
    assert main(["ls", "--skipped", str(p)]) == 0
    assert capsys.readouterr().out == "READ\\nME\tin no sample: no extension\n"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        build_index(p)
    assert main(["ls", str(p)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [ln.split("\t")[1] for ln in lines] == [v.removesuffix(".txt") for v in ODD.values()]
    assert all(ln.endswith("\ttxt") for ln in lines)


def test_escape_name_leaves_plain_names_alone() -> None:
    for s in ["000001", "a/22", "été/ü", "x y"]:
        assert escape_name(s) == s
    assert escape_name("\0\x1f\x9f") == "\\x00\\x1f\\u009f"


def test_ls_help_documents_skipped_and_escaping(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["ls", "--help"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "--skipped" in out and "in no sample" in out and "\\xNN" in out


def test_index_help_documents_no_require_end(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["index", "--help"]) == 0
    assert "--no-require-end" in capsys.readouterr().out


def test_members_unchanged_for_plain_shards(tmp_path: Path) -> None:
    """A shard of samples only: nothing skipped, no warning (the common case stays quiet)."""
    rng = np.random.default_rng(0)
    with tarindex.ShardWriter(str(tmp_path / "w.tar"), mtime=0) as w:
        for i in range(50):
            w.write({"__key__": f"{i:04d}", "bin": rng.bytes(int(rng.integers(0, 900)))})
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        m = scan_members(next(tmp_path.glob("w*.tar")))
    assert m.skipped == [] and len(m) == 50
