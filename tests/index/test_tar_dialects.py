"""Tars made by real tools, in every dialect, indexed and read back byte-exact.

Each archive is built from a tree on disk; every indexed sample is compared byte for byte with
the file it came from, and the member listing with Python's tarfile (second opinion).
Decisions tested here are written down in docs/TAR_DIALECTS.md.
"""

from __future__ import annotations

import io
import os
import shutil
import subprocess
import tarfile
import warnings
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

import tarindex
from tarindex.errors import TruncatedError
from tarindex.format.keys import normalize_name, split_key
from tarindex.format.tar import padded
from tarindex.index.scan import scan_members

pytestmark = pytest.mark.timeout(120)

GNU_TAR = "/usr/bin/tar"
LONG_SPLIT = "L" * 70 + "/" + "M" * 60 + "/split.txt"  # > 100 bytes, fits ustar prefix + name
LONG_NOSPLIT = "n/" + "x" * 140 + ".txt"  # a component > 100 bytes: LongName or pax path
NON_UTF8 = b"raw\xff\xfe/k.bin"


def need(tool: str) -> str:
    path = shutil.which(tool)
    if path is None:
        pytest.skip(f"{tool} is not installed (bsdtar: Debian package libarchive-tools)")
    return path


def run(*args: str, cwd: Path | None = None, ok: tuple[int, ...] = (0,)) -> None:
    r = subprocess.run(args, cwd=cwd, capture_output=True, env={**os.environ, "LC_ALL": "C.UTF-8"})
    assert r.returncode in ok, (args, r.returncode, r.stderr.decode(errors="replace"))


def make_tree(
    root: Path,
    *,
    long: bool = True,
    nosplit: bool = True,
    raw: bool = True,
    specials: bool = True,
    seed: int = 0,
) -> None:
    """A tree of samples plus every kind of non-sample entry."""
    rng = np.random.default_rng(seed)
    files: dict[str, int] = {
        "data/000000.jpg": 5000,
        "data/000000.json": 17,
        "data/000001.jpg": 512,
        "data/000001.json": 513,
        "data/000002.txt": 0,
        "data/000003.cls": 511,
        "v1.2.3/x.y/000.txt": 40,
        "données/été.txt": 33,
        "hl/a.bin": 700,
    }
    if long:
        files[LONG_SPLIT] = 1234
    if nosplit:
        files[LONG_NOSPLIT] = 99
    for name, n in files.items():
        p = root / name
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(rng.integers(0, 256, n, dtype=np.uint8).tobytes())
    (root / "emptydir").mkdir()
    if raw:
        d = os.path.join(os.fsencode(root), b"raw\xff\xfe")
        os.mkdir(d)
        with open(os.path.join(d, b"k.bin"), "wb") as f:
            f.write(b"non-utf8 name")
    if specials:
        os.link(root / "hl/a.bin", root / "hl/b.bin")
        os.symlink("data/000000.jpg", root / "sym.jpg")
        if nosplit:
            os.symlink("y" * 150, root / "longlink.txt")  # GNU LongLink / pax linkpath
        os.mkfifo(root / "pipe.fifo")


def check_archive(tar: Path, root: Path, *, tarfile_agrees: bool = True) -> tarindex.index.members.Members:
    """Index ``tar``, then check every sample byte-exact against the files under ``root``."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # none of these archives deserves a warning, except
        warnings.filterwarnings("ignore", ".*not adjacent")  # directory order is unsorted
        tarindex.build_index(str(tar))
        members = scan_members(tar)
    disk = os.fsencode(root)
    names = [normalize_name(n) for n in members.raw_names]
    # every regular file on disk is indexed once, except the second name of a hard link
    expect = set()
    for dirpath, _dirs, fnames in os.walk(disk):
        for fn in fnames:
            full = os.path.join(dirpath, fn)
            if os.path.isfile(full) and not os.path.islink(full):
                expect.add(os.path.relpath(full, disk))
    links = [n for n, kind in members.skipped if kind.startswith("hard link")]
    assert len(links) == (1 if os.path.exists(root / "hl/b.bin") else 0)
    expect -= {os.fsencode(normalize_name(os.fsencode(n))) for n in links}
    assert sorted(names) == sorted(expect)
    assert len(set(names)) == len(names)
    # byte-exact through the reader, sample by sample
    with tarindex.ShardReader(str(tar)) as r:
        seen = 0
        for j in range(r.n_samples):
            key = r.key(j).encode("utf-8", "surrogateescape")
            for ext, data in r.sample(j).items():
                if ext.startswith("__"):
                    continue
                rel = key + b"." + ext.encode("utf-8", "surrogateescape")
                with open(os.path.join(disk, rel), "rb") as f:
                    assert bytes(data) == f.read(), rel
                seen += 1
        assert seen == sum(1 for n in names if split_key(n) is not None)
    if tarfile_agrees:
        with tarfile.open(tar) as tf:
            ref = [
                (m.name.encode("utf-8", "surrogateescape"), m.offset_data, m.size)
                for m in tf.getmembers()
                if m.isreg()
            ]
        got = list(
            zip(members.raw_names, members.offset.tolist(), members.size.tolist(), strict=True)
        )
        norm = [(normalize_name(n).rstrip(b"/"), o, s) for n, o, s in ref]
        assert [(normalize_name(n), o, s) for n, o, s in got] == norm
    return members


# -- GNU tar ---------------------------------------------------------------------------------
GNU_FORMATS = {
    # format: what the tree may hold
    "v7": dict(long=False, nosplit=False, specials=False),
    "oldgnu": {},
    "gnu": {},
    "ustar": dict(nosplit=False),
    "posix": dict(raw=False),
}


@pytest.mark.parametrize("fmt", sorted(GNU_FORMATS))
def test_gnu_tar_formats(tmp_path: Path, fmt: str) -> None:
    root = tmp_path / "root"
    root.mkdir()
    make_tree(root, **GNU_FORMATS[fmt])
    tar = tmp_path / f"{fmt}.tar"
    run(GNU_TAR, f"--format={fmt}", "-cf", str(tar), "-C", str(root), ".")
    m = check_archive(tar, root)
    kinds = {k.split(" to ")[0] for _, k in m.skipped}
    assert "directory" in kinds
    if fmt != "v7":
        assert {"symlink", "hard link", "fifo"} <= kinds
    assert all(n.startswith(b"./") for n in m.raw_names)  # leading ./ kept raw, stripped in keys


def test_gnu_posix_non_utf8_name(tmp_path: Path) -> None:
    """GNU tar --format=posix with a name that is not UTF-8 (pax hdrcharset or raw bytes)."""
    root = tmp_path / "root"
    root.mkdir()
    make_tree(root, specials=False, long=False, nosplit=False)
    tar = tmp_path / "p.tar"
    run(GNU_TAR, "--format=posix", "-cf", str(tar), "-C", str(root), ".")
    m = check_archive(tar, root, tarfile_agrees=False)
    assert any(n.endswith(NON_UTF8) for n in m.raw_names)
    assert any(n.endswith(NON_UTF8.decode("utf-8", "surrogateescape")) for n in m.names)


# -- bsdtar ----------------------------------------------------------------------------------
BSD_FORMATS = {
    "ustar": dict(nosplit=False),
    "pax": {},
    "paxr": {},
    "gnutar": dict(raw=True),
    "v7tar": dict(long=False, nosplit=False, specials=False),
}


@pytest.mark.parametrize("fmt", sorted(BSD_FORMATS))
def test_bsdtar_formats(tmp_path: Path, fmt: str) -> None:
    bsdtar = need("bsdtar")
    root = tmp_path / "root"
    root.mkdir()
    make_tree(root, **BSD_FORMATS[fmt])
    tar = tmp_path / f"{fmt}.tar"
    run(bsdtar, "--format", fmt, "-cf", str(tar), "-C", str(root), ".")
    check_archive(tar, root, tarfile_agrees=fmt not in ("pax", "paxr"))


# -- Python tarfile --------------------------------------------------------------------------
@pytest.mark.parametrize("fmt", ["GNU_FORMAT", "PAX_FORMAT", "USTAR_FORMAT"])
def test_python_tarfile_formats(tmp_path: Path, fmt: str) -> None:
    root = tmp_path / "root"
    root.mkdir()
    make_tree(root, nosplit=fmt != "USTAR_FORMAT", raw=fmt != "USTAR_FORMAT")
    tar = tmp_path / "py.tar"
    with tarfile.open(tar, "w", format=getattr(tarfile, fmt)) as tf:
        tf.add(root, arcname=".")
    check_archive(tar, root)


# -- pax details -----------------------------------------------------------------------------
def _pax_tar(path: Path, members: list[tuple[tarfile.TarInfo, bytes | None]]) -> None:
    with tarfile.open(path, "w", format=tarfile.PAX_FORMAT) as tf:
        for ti, data in members:
            tf.addfile(ti, io.BytesIO(data) if data is not None else None)


def test_pax_path_linkpath_size_override(tmp_path: Path) -> None:
    """A pax ``size`` overrides the header's size field; ``path`` overrides the name."""
    name = "deep/" + "é" * 80 + "/0.bin"
    data = os.urandom(3000)
    ti = tarfile.TarInfo(name)
    ti.size = len(data)
    ti.pax_headers = {"size": str(len(data)), "comment": "x"}
    ln = tarfile.TarInfo("0.lnk")
    ln.type = tarfile.SYMTYPE
    ln.linkname = "t" * 200
    after = tarfile.TarInfo("1.bin")
    after.size = 5
    tar = tmp_path / "pax.tar"
    _pax_tar(tar, [(ti, data), (ln, None), (after, b"hello")])
    raw = bytearray(tar.read_bytes())
    # zero the ustar size field of the first member so only the pax record gives the size
    m = scan_members(tar)
    hdr = int(m.offset[0]) - 512
    raw[hdr + 124 : hdr + 136] = b"00000000000\0"
    raw[hdr + 148 : hdr + 156] = b" " * 8
    raw[hdr + 148 : hdr + 156] = b"%06o\0 " % sum(raw[hdr : hdr + 512])
    tar.write_bytes(bytes(raw))
    m = scan_members(tar)
    assert m.names == [name, "1.bin"]
    assert m.size.tolist() == [3000, 5]
    assert tar.read_bytes()[int(m.offset[0]) : int(m.offset[0]) + 3000] == data
    assert ("0.lnk", "symlink to " + "t" * 200) in m.skipped


def _git(*args: str, cwd: Path) -> None:
    env = {
        **os.environ,
        "GIT_AUTHOR_NAME": "t",
        "GIT_AUTHOR_EMAIL": "t@t",
        "GIT_COMMITTER_NAME": "t",
        "GIT_COMMITTER_EMAIL": "t@t",
        "GIT_CONFIG_GLOBAL": "/dev/null",
        "GIT_CONFIG_NOSYSTEM": "1",
    }
    subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, env=env)


def test_git_archive_global_header_anywhere(tmp_path: Path) -> None:
    """``git archive`` starts with a pax global header; one in the middle (cat) works too."""
    need("git")
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "s").mkdir()
    for i in range(3):
        (repo / "s" / f"{i:03d}.txt").write_bytes(os.urandom(100 + i))
    _git("init", "-q", cwd=repo)
    _git("add", ".", cwd=repo)
    _git("commit", "-qm", "x", cwd=repo)
    g = tmp_path / "git.tar"
    with open(g, "wb") as f:
        subprocess.run(["git", "archive", "--format=tar", "HEAD"], cwd=repo, check=True, stdout=f)
    assert g.read_bytes()[156:157] == b"g"
    m = scan_members(g)
    assert m.names == ["s/000.txt", "s/001.txt", "s/002.txt"]
    other = tmp_path / "o"
    other.mkdir()
    (other / "a.bin").write_bytes(b"abc")
    first = tmp_path / "first.tar"
    run(GNU_TAR, "-cf", str(first), "-C", str(other), "a.bin")
    both = tmp_path / "both.tar"
    both.write_bytes(first.read_bytes() + g.read_bytes())
    m2 = scan_members(both)
    assert m2.names == ["a.bin", *m.names]
    tarindex.build_index(str(both))
    with tarindex.ShardReader(str(both)) as r:
        for j in range(1, r.n_samples):
            assert r.sample(j)["txt"] == (repo / f"{r.key(j)}.txt").read_bytes()


def test_pax_global_size_and_path_apply_to_later_members(tmp_path: Path) -> None:
    """POSIX: a global header's keywords apply to every later member (as tarfile reads them)."""
    tar = tmp_path / "g.tar"
    with tarfile.open(tar, "w", format=tarfile.PAX_FORMAT, pax_headers={"comment": "global"}) as tf:
        for i in range(3):
            ti = tarfile.TarInfo(f"{i}.txt")
            ti.size = 4
            tf.addfile(ti, io.BytesIO(b"%04d" % i))
    m = check_members_match_tarfile(tar)
    assert m.names == ["0.txt", "1.txt", "2.txt"]


def check_members_match_tarfile(tar: Path) -> tarindex.index.members.Members:
    m = scan_members(tar)
    with tarfile.open(tar) as tf:
        ref = [(m_.name, m_.offset_data, m_.size) for m_ in tf.getmembers() if m_.isreg()]
    assert list(zip(m.names, m.offset.tolist(), m.size.tolist(), strict=True)) == ref
    return m


# -- hand-built headers: numbers, terminators, checksums ------------------------------------
def header(
    name: bytes,
    size_field: bytes,
    *,
    typeflag: bytes = b"0",
    chk: str = "%06o\0 ",
    signed: bool = False,
    magic: bytes = b"ustar\x0000",
) -> bytes:
    b = bytearray(512)
    b[0 : len(name)] = name
    b[100:108] = b"0000644\0"
    b[108:116] = b"0000000\0"
    b[116:124] = b"0000000\0"
    b[124:136] = size_field
    b[136:148] = b"00000000000\0"
    b[156:157] = typeflag
    b[257:265] = magic
    b[148:156] = b" " * 8
    s = sum((x - 256 if x > 127 else x) for x in b) if signed else sum(b)
    b[148:156] = (chk % s).encode().ljust(8, b"\0")[:8]
    return bytes(b)


def member(name: bytes, data: bytes, size_field: bytes | None = None, **kw: object) -> bytes:
    sf = size_field if size_field is not None else b"%011o\0" % len(data)
    return header(name, sf, **kw) + data + bytes(padded(len(data)) - len(data))  # type: ignore[arg-type]


SIZE_STYLES: dict[str, Callable[[int], bytes]] = {
    "nul": lambda n: b"%011o\0" % n,
    "space": lambda n: b"%011o " % n,
    "space-nul": lambda n: b"%010o \0" % n,
    "twelve-digits": lambda n: b"%012o" % n,
    "leading-spaces": lambda n: b"%11o\0" % n,
    "short-nul-garbage": lambda n: (b"%o\0" % n).ljust(12, b"\xaa"),
    "base256": lambda n: b"\x80" + n.to_bytes(11, "big"),
}
CHK_STYLES = ["%06o\0 ", "%07o\0", "%06o  ", "%o\0", " %06o\0", "%07o "]


@pytest.mark.parametrize("style", sorted(SIZE_STYLES))
@pytest.mark.parametrize("chk", CHK_STYLES)
def test_numeric_field_styles(tmp_path: Path, style: str, chk: str) -> None:
    data = [os.urandom(n) for n in (1000, 0, 700)]
    parts = [
        member(b"s/%d.bin" % i, d, SIZE_STYLES[style](len(d)), chk=chk) for i, d in enumerate(data)
    ]
    tar = tmp_path / "n.tar"
    tar.write_bytes(b"".join(parts) + bytes(1024))
    m = scan_members(tar)
    assert m.size.tolist() == [1000, 0, 700]
    blob = tar.read_bytes()
    for o, s, d in zip(m.offset.tolist(), m.size.tolist(), data, strict=True):
        assert blob[o : o + s] == d


def test_signed_checksum_variant(tmp_path: Path) -> None:
    """Old Sun tar summed signed chars: names with high bytes get a different checksum."""
    name = "é/ü.bin".encode()
    tar = tmp_path / "s.tar"
    tar.write_bytes(
        member(name, b"abc", signed=True) + member(b"b.bin", b"de", signed=True) + bytes(1024)
    )
    m = scan_members(tar)
    assert m.raw_names == [name, b"b.bin"] and m.size.tolist() == [3, 2]


def test_base256_size_over_8gib_is_read_not_trusted_blindly(tmp_path: Path) -> None:
    """A base-256 size field beyond 8 GiB (sparse file, nothing written): the member's range is
    checked against the file size, so a header claiming 9 GiB in a small file is a truncation."""
    big = 9 << 30
    tar = tmp_path / "big.tar"
    with open(tar, "wb") as f:
        f.write(header(b"big.bin", b"\x80" + big.to_bytes(11, "big")))
        f.seek(512 + big + 1024 - 1)  # a sparse file on disk: 9 GiB of holes, no data written
        f.write(b"\0")
    m = scan_members(tar)
    assert m.size.tolist() == [big] and m.offset.tolist() == [512]
    with open(tar, "r+b") as f:
        f.truncate(512 + 4096)
    with pytest.raises(TruncatedError, match=str(512 + big)):
        scan_members(tar)


# -- member kinds ----------------------------------------------------------------------------
def _sparse_file(path: Path, regions: int) -> dict[int, bytes]:
    chunks = {}
    with open(path, "wb") as f:
        for k in range(regions):
            off = k * 65536 + 4096
            d = os.urandom(1000)
            f.seek(off)
            f.write(d)
            chunks[off] = d
        f.truncate(regions * 65536 + 8192)
    return chunks


@pytest.mark.parametrize(
    "how",
    [
        ["--format=gnu"],
        ["--format=oldgnu"],
        ["--format=posix"],
        ["--format=posix", "--sparse-version=0.0"],
        ["--format=posix", "--sparse-version=0.1"],
    ],
)
def test_sparse_members_are_skipped_with_warning(tmp_path: Path, how: list[str]) -> None:
    root = tmp_path / "root"
    root.mkdir()
    _sparse_file(root / "holes.bin", 12)  # > 4 regions: GNU sparse extension blocks
    (root / "0.txt").write_bytes(b"before")
    (root / "1.txt").write_bytes(b"after" * 300)
    tar = tmp_path / "sp.tar"
    run(GNU_TAR, *how, "-S", "-cf", str(tar), "-C", str(root), "0.txt", "holes.bin", "1.txt")
    with pytest.warns(UserWarning, match="sparse"):
        m = scan_members(tar)
    assert m.names == ["0.txt", "1.txt"]
    assert any("sparse" in k for _, k in m.skipped)
    blob = tar.read_bytes()
    for n, o, s in zip(m.names, m.offset.tolist(), m.size.tolist(), strict=True):
        assert blob[o : o + s] == (root / n).read_bytes()


def test_zero_byte_and_v7_directory(tmp_path: Path) -> None:
    tar = tmp_path / "v7.tar"
    tar.write_bytes(
        member(b"d/", b"", typeflag=b"\0", magic=bytes(8))
        + member(b"d/0.txt", b"", magic=bytes(8))
        + member(b"d/1.txt", b"x", typeflag=b"\0", magic=bytes(8))
        + bytes(1024)
    )
    m = scan_members(tar)
    assert m.names == ["d/0.txt", "d/1.txt"] and m.size.tolist() == [0, 1]
    assert ("d/", "directory") in m.skipped


def test_hardlink_with_pax_body_is_skipped_but_walk_stays_aligned(tmp_path: Path) -> None:
    """POSIX.1-2001 lets a pax hard link carry data; it is still not a sample (see docs)."""
    ln = tarfile.TarInfo("b.bin")
    ln.type = tarfile.LNKTYPE
    ln.linkname = "a.bin"
    ln.size = 600
    ln.pax_headers = {"comment": "body follows"}
    a = tarfile.TarInfo("a.bin")
    a.size = 3
    c = tarfile.TarInfo("c.bin")
    c.size = 2
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tf:
        tf.addfile(a, io.BytesIO(b"aaa"))
        tf.addfile(ln)
        tf.fileobj.write(b"\x01" * 1024)  # the 600-byte body + padding
        tf.offset += 1024
        tf.addfile(c, io.BytesIO(b"cc"))
    tar = tmp_path / "hl.tar"
    tar.write_bytes(raw.getvalue())
    m = scan_members(tar)
    assert m.names == ["a.bin", "c.bin"]
    assert ("b.bin", "hard link to a.bin") in m.skipped


def test_duplicates_from_tar_r_last_copy_wins(tmp_path: Path) -> None:
    root = tmp_path / "root"
    root.mkdir()
    for n in ("x.jpg", "x.txt", "y.jpg"):
        (root / n).write_bytes(n.encode())
    tar = tmp_path / "d.tar"
    run(GNU_TAR, "-cf", str(tar), "-C", str(root), "x.jpg", "x.txt", "y.jpg")
    (root / "x.jpg").write_bytes(b"second copy of x.jpg")
    run(GNU_TAR, "-rf", str(tar), "-C", str(root), "x.jpg")
    with pytest.warns(UserWarning) as rec:  # duplicates (and so interleaved) are reported
        tarindex.build_index(str(tar))
    assert any("more than once" in str(w.message) for w in rec)
    with tarindex.ShardReader(str(tar)) as r:
        assert [r.key(j) for j in range(r.n_samples)] == ["x", "y"]
        assert r.sample(0)["jpg"] == b"second copy of x.jpg"
        assert r.sample(0)["txt"] == b"x.txt"
        assert r.sample(1)["jpg"] == b"y.jpg"


def test_interleaved_samples_grouped_by_key(tmp_path: Path) -> None:
    root = tmp_path / "root"
    root.mkdir()
    order = ["0.a", "1.a", "0.b", "1.b"]
    for n in order:
        (root / n).write_bytes(n.encode() * 100)
    tar = tmp_path / "i.tar"
    run(GNU_TAR, "-cf", str(tar), "-C", str(root), *order)
    with pytest.warns(UserWarning, match="not adjacent"):
        tarindex.build_index(str(tar))
    with tarindex.ShardReader(str(tar)) as r:
        assert r.n_samples == 2
        for j in range(2):
            s = r.sample(j)
            assert s["a"] == f"{j}.a".encode() * 100 and s["b"] == f"{j}.b".encode() * 100


# -- whole archives --------------------------------------------------------------------------
def test_concatenated_archives_all_parts_indexed(tmp_path: Path) -> None:
    parts = []
    for p in range(3):
        root = tmp_path / f"r{p}"
        root.mkdir()
        for i in range(2):
            (root / f"{p}{i}.bin").write_bytes(os.urandom(100 * (p + 1) + i))
        t = tmp_path / f"{p}.tar"
        run(GNU_TAR, "-cf", str(t), "-C", str(root), f"{p}0.bin", f"{p}1.bin")  # 10 KiB records
        parts.append(t.read_bytes())
    cat = tmp_path / "cat.tar"
    cat.write_bytes(b"".join(parts))
    tarindex.build_index(str(cat))
    with tarindex.ShardReader(str(cat)) as r:
        assert [r.key(j) for j in range(r.n_samples)] == [
            f"{p}{i}" for p in range(3) for i in range(2)
        ]
        for j in range(r.n_samples):
            k = r.key(j)
            assert r.sample(j)["bin"] == (tmp_path / f"r{k[0]}" / f"{k}.bin").read_bytes()


def test_gnu_volume_label(tmp_path: Path) -> None:
    root = tmp_path / "root"
    root.mkdir()
    make_tree(root, raw=False)
    tar = tmp_path / "v.tar"
    run(GNU_TAR, "-V", "my label", "-cf", str(tar), "-C", str(root), ".")
    m = check_archive(tar, root)
    assert m.skipped[0] == ("my label", "GNU volume label")


def test_gnu_multivolume_parts(tmp_path: Path) -> None:
    root = tmp_path / "root"
    (root / "src").mkdir(parents=True)
    (root / "src/a.bin").write_bytes(os.urandom(30000))
    (root / "src/b.bin").write_bytes(os.urandom(5000))
    vols = [tmp_path / f"v{i}.tar" for i in (1, 2, 3)]
    run(
        GNU_TAR,
        "-c",
        "-M",
        "-L",
        "20",
        "-V",
        "set",
        *[f"-f{v}" for v in vols],
        "-C",
        str(root),
        "src",
    )
    with pytest.warns(UserWarning, match="continued in the next volume"):
        m1 = scan_members(vols[0])
    assert m1.names == []
    with pytest.warns(UserWarning, match="multi-volume continuation"):
        m2 = scan_members(vols[1])
    assert m2.names == ["src/b.bin"]
    blob = vols[1].read_bytes()
    o = int(m2.offset[0])
    assert blob[o : o + 5000] == (root / "src/b.bin").read_bytes()
    # without -V, the first part cannot be told from a cut file: a loud error, never a short member
    plain = [tmp_path / f"p{i}.tar" for i in (1, 2, 3)]
    run(GNU_TAR, "-c", "-M", "-L", "20", *[f"-f{v}" for v in plain], "-C", str(root), "src")
    with pytest.raises(TruncatedError, match="multi-volume"):
        scan_members(plain[0])
