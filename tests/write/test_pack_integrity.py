"""`tarindex pack` leaves nothing out silently: symlinks, permissions, re-packs, names, disk full.

Real parts throughout: real symlinks and fifos, real file modes read by an unprivileged user
(uid 65534 when the tests run as root), a real full disk (a 1 MiB tmpfs when this process may
mount one, and always RLIMIT_FSIZE), and `python -m tarindex pack` in a subprocess whose exit
code and stderr (one line, no traceback) are checked.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

import tarindex
from tarindex.cli.main import main
from tarindex.write.pack import plan_pack, write_pack
from tarindex.write.shards import existing_shards

Cap = pytest.CaptureFixture[str]
NOBODY = 65534


def pack_cli(*argv: str, prelude: str = "") -> subprocess.CompletedProcess[str]:
    """``python -m tarindex pack ARGV`` in a subprocess, after ``prelude`` (Python code)."""
    if prelude:
        code = (
            f"import sys\n{prelude}\nimport tarindex.cli.main\n"
            "sys.exit(tarindex.cli.main.main(sys.argv[1:]))\n"
        )
        cmd = [sys.executable, "-c", code, "pack", *argv]
    else:
        cmd = [sys.executable, "-m", "tarindex", "pack", *argv]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120)


def one_error_line(err: str, code: int, *needles: str) -> None:
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1, err
    assert lines[0].startswith("tarindex pack: error: "), err
    assert "Traceback" not in err
    for n in needles:
        assert n in lines[0], (n, err)
    assert code in (1, 2)


def files_under(d: Path) -> list[str]:
    if not d.exists():
        return []
    return sorted(str(p.relative_to(d)) for p in d.rglob("*"))


def _flat(src: Path, n: int = 4, size: int = 10) -> Path:
    src.mkdir(parents=True, exist_ok=True)
    for i in range(n):
        (src / f"{i:03d}.bin").write_bytes(bytes([i]) * size)
    return src


def _classes(src: Path) -> Path:
    for c in ("cat", "dog"):
        (src / c).mkdir(parents=True)
        for i in range(2):
            (src / c / f"{i}.png").write_bytes(f"{c}{i}".encode())
    return src


def _samples(pattern: str) -> dict[str, dict[str, bytes]]:
    ss = tarindex.ShardSet(pattern)
    try:
        out = {}
        for i in range(len(ss)):
            s = ss.sample(i)
            out[s["__key__"]] = {k: bytes(v) for k, v in s.items() if not k.startswith("__")}
        return out
    finally:
        ss.close()


# -- symlinks ---------------------------------------------------------------------------------
def _refused_src(tmp_path: Path, case: str) -> Path:
    """A source folder with one thing pack must refuse (exit 2)."""
    src = _classes(tmp_path / "src")
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.png").write_bytes(b"not part of the dataset")
    if case == "link-to-outside-file":
        (src / "cat" / "9.png").symlink_to(outside / "secret.png")
    elif case == "link-to-outside-folder":
        (src / "cat" / "more").symlink_to(outside, target_is_directory=True)
    elif case == "relative-link-escaping":
        (src / "cat" / "9.png").symlink_to("../../outside/secret.png")
    elif case == "broken-link":
        (src / "cat" / "9.png").symlink_to("gone.png")
    elif case == "link-loop":
        (src / "cat" / "9.png").symlink_to("8.png")
        (src / "cat" / "8.png").symlink_to("9.png")
    elif case == "folder-link-to-parent":
        (src / "cat" / "again").symlink_to("..", target_is_directory=True)
    elif case == "folder-links-in-a-ring":
        (src / "cat" / "to-dog").symlink_to("../dog", target_is_directory=True)
        (src / "dog" / "to-cat").symlink_to("../cat", target_is_directory=True)
    elif case == "non-utf8-class-folder":
        bad = os.path.join(os.fsencode(src), b"caf\xe9")
        os.mkdir(bad)
        with open(os.path.join(bad, b"0.png"), "wb") as f:
            f.write(b"x")
    else:
        raise AssertionError(case)
    return src


REFUSED = {
    "link-to-outside-file": "outside SRC_DIR",
    "link-to-outside-folder": "outside SRC_DIR",
    "relative-link-escaping": "outside SRC_DIR",
    "broken-link": "broken symlink",
    "link-loop": "symlink loop",
    "folder-link-to-parent": "loop",
    "folder-links-in-a-ring": "loop",
    "non-utf8-class-folder": "not valid UTF-8",
}


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_refused_source_library(tmp_path: Path, case: str) -> None:
    src = _refused_src(tmp_path, case)
    with pytest.raises(tarindex.errors.PackError, match=REFUSED[case]):
        plan_pack(str(src))


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_refused_source_cli_subprocess(tmp_path: Path, case: str) -> None:
    src = _refused_src(tmp_path, case)
    out = tmp_path / "out"
    r = pack_cli(str(src), str(out / "s-%06d.tar"))
    assert r.returncode == 2, r.stderr
    one_error_line(r.stderr, r.returncode, REFUSED[case])
    assert str(src) in r.stderr  # names the entry
    if case == "non-utf8-class-folder":
        assert "caf\\xe9" in r.stderr  # the name shown, undecodable byte escaped
    assert not out.exists()  # refused before anything is written


def test_symlinks_inside_are_followed(tmp_path: Path) -> None:
    real = tmp_path / "real"
    src = real / "src"
    (src / "data").mkdir(parents=True)
    (src / "a.png").write_bytes(b"A")
    (src / "data" / "x.txt").write_bytes(b"X")
    (src / "b.png").symlink_to("a.png")  # relative, to a file inside
    (src / "c.png").symlink_to(src / "a.png")  # absolute, through the real path
    (src / "view").symlink_to("data", target_is_directory=True)  # a folder inside
    (src / ".hidden.png").symlink_to("/etc/passwd")  # hidden: skipped, never looked at
    (tmp_path / "src-link").symlink_to(src, target_is_directory=True)  # SRC_DIR itself a link
    pattern = str(tmp_path / "out" / "s-%d.tar")
    plan = plan_pack(str(tmp_path / "src-link"), "flat", out_pattern=pattern)
    write_pack(plan, pattern)
    assert _samples(str(tmp_path / "out")) == {
        "a": {"png": b"A"},
        "b": {"png": b"A"},
        "c": {"png": b"A"},
        "data/x": {"txt": b"X"},
        "view/x": {"txt": b"X"},
    }


def test_fifo_is_skipped_with_a_message(tmp_path: Path, capsys: Cap) -> None:
    src = _flat(tmp_path / "src")
    os.mkfifo(src / "pipe.bin")  # reading it would block forever
    code = main(["pack", str(src), str(tmp_path / "o-%d.tar")])
    err = capsys.readouterr().err
    assert code == 0, err
    assert "skipped" in err and "pipe.bin" in err and "not a regular file" in err
    assert list(_samples(str(tmp_path / "o-0.tar"))) == ["000", "001", "002", "003"]


# -- output pattern ---------------------------------------------------------------------------
def test_out_pattern_resolving_into_src_is_refused(tmp_path: Path) -> None:
    src = _flat(tmp_path / "src")
    (src / "shards").mkdir()
    (tmp_path / "out").symlink_to(src / "shards", target_is_directory=True)
    pattern = str(tmp_path / "out" / "s-%d.tar")
    with pytest.raises(tarindex.errors.PackError, match="inside SRC_DIR"):
        plan_pack(str(src), out_pattern=pattern)
    plan = plan_pack(str(src))
    with pytest.raises(tarindex.errors.PackError, match="inside SRC_DIR"):
        write_pack(plan, pattern)  # the library function checks too
    r = pack_cli(str(src), pattern)
    assert r.returncode == 2
    one_error_line(r.stderr, r.returncode, "inside SRC_DIR", "symlinks resolved")
    assert os.listdir(src / "shards") == []


def test_repack_refuses_without_overwrite(tmp_path: Path, capsys: Cap) -> None:
    src = _classes(tmp_path / "src")
    out = tmp_path / "out"
    pattern = str(out / "s-%03d.tar")
    assert main(["pack", str(src), pattern, "--maxcount", "1"]) == 0  # 4 shards
    unrelated = {
        "s-1.tar": b"not %03d",
        "s-000.tar.bak": b"a backup",
        "other-000.tar": b"another pattern",
        "s-abc.tar": b"no number",
        "notes.txt": b"notes",
    }
    for name, data in unrelated.items():
        (out / name).write_bytes(data)
    (out / "s-009.tar.tidx").write_bytes(b"an index whose tar is gone")
    capsys.readouterr()
    before = {p: (out / p).read_bytes() for p in files_under(out)}

    code = main(["pack", str(src), pattern])
    err = capsys.readouterr().err
    assert code == 2
    one_error_line(err, code, "already exist", "--overwrite", "s-000.tar")
    assert {p: (out / p).read_bytes() for p in files_under(out)} == before  # untouched
    r = pack_cli(str(src), pattern)
    assert r.returncode == 2
    one_error_line(r.stderr, r.returncode, "--overwrite")

    (src / "dog" / "2.png").write_bytes(b"dog2")
    code = main(["pack", str(src), pattern, "--overwrite"])
    stdout = capsys.readouterr().out
    assert code == 0
    assert "removed 9 file(s)" in stdout  # 4 shards + 4 indexes + the orphan index
    assert files_under(out) == sorted([*unrelated, "classes.json", "s-000.tar", "s-000.tar.tidx"])
    for name, data in unrelated.items():
        assert (out / name).read_bytes() == data
    assert len(_samples(str(out / "s-000.tar"))) == 5


def test_overwrite_library(tmp_path: Path) -> None:
    src = _flat(tmp_path / "src", n=3)
    pattern = str(tmp_path / "o" / "s-%06d.tar")
    first = write_pack(plan_pack(str(src)), pattern, maxcount=1)
    assert [os.path.basename(p) for p in first.paths] == [
        "s-000000.tar",
        "s-000001.tar",
        "s-000002.tar",
    ]
    with pytest.raises(tarindex.errors.PackError, match="overwrite=True"):
        plan_pack(str(src), out_pattern=pattern)
    with pytest.raises(tarindex.errors.PackError, match="already exist"):
        write_pack(plan_pack(str(src)), pattern)
    res = write_pack(
        plan_pack(str(src), out_pattern=pattern, overwrite=True), pattern, overwrite=True
    )
    assert len(res.removed) == 6 and res.paths == [first.paths[0]]
    assert sorted(os.listdir(tmp_path / "o")) == ["s-000000.tar", "s-000000.tar.tidx"]


@pytest.mark.parametrize(
    "pattern, names, expected",
    [
        ("s-%06d.tar", ["s-000003.tar", "s-3.tar", "s-000003.tar.tidx", "s-0000003.tar"], [0, 2]),
        ("s-%d.tar", ["s-3.tar", "s-03.tar", "s-3.tar.tmp", "s--1.tar", "s-12.tar.tidx"], [0, 4]),
        ("s-%x.tar", ["s-1f.tar", "s-1F.tar", "s-g.tar"], [0]),
        ("s-%05.1f.tar", ["s-002.0.tar", "s-2.0.tar"], [0]),
        ("s-%d-100%%.tar", ["s-7-100%.tar", "s-7-100%%.tar"], [0]),
        ("one.tar", ["one.tar", "one.tar.tidx", "one.tar.bak"], [0, 1]),
        ("[x]-%d.tar", ["[x]-1.tar", "x-1.tar"], [0]),
    ],
)
def test_existing_shards_matches_only_the_pattern(
    tmp_path: Path, pattern: str, names: list[str], expected: list[int]
) -> None:
    for n in names:
        (tmp_path / n).write_bytes(b"")
    got = existing_shards(str(tmp_path / pattern))
    assert got == sorted(str(tmp_path / names[i]) for i in expected)


def test_existing_shards_with_the_field_in_a_folder(tmp_path: Path) -> None:
    for d in ("part-0", "part-1", "part-x"):
        (tmp_path / d).mkdir()
        (tmp_path / d / "s.tar").write_bytes(b"")
    got = existing_shards(str(tmp_path / "part-%d" / "s.tar"))
    assert got == [str(tmp_path / "part-0" / "s.tar"), str(tmp_path / "part-1" / "s.tar")]


# -- unreadable files and folders (as an unprivileged user) -----------------------------------
@pytest.fixture
def shared_dir(tmp_path: Path) -> Iterator[Path]:
    """A folder the test user and, when running as root, uid 65534 can both use."""
    if os.geteuid() != 0:
        yield tmp_path
        return
    d = Path(tempfile.mkdtemp(prefix="tarindex-nobody-"))  # pytest's tmp dirs are 0700 root
    try:
        os.chmod(d, 0o755)
        yield d
    finally:
        shutil.rmtree(d)


def _as_unprivileged(*argv: str) -> subprocess.CompletedProcess[str]:
    """``tarindex pack ARGV`` as uid/gid 65534 if this is root (imports done first: the
    interpreter may live under a folder that user cannot read), else as this user."""
    prelude = (
        "import os, fcntl, json, tqdm, tqdm.std, tarindex.cli.main, tarindex.write.pack\n"
        "if os.geteuid() == 0:\n"
        "    try:\n"
        f"        os.setgroups([]); os.setgid({NOBODY}); os.setuid({NOBODY})\n"
        "    except PermissionError as e:\n"
        "        print('CANNOT-SETUID', e, file=sys.stderr); sys.exit(3)\n"
    )
    r = pack_cli(*argv, prelude=prelude)
    if r.returncode == 3 and "CANNOT-SETUID" in r.stderr:
        pytest.skip(f"cannot drop root to uid {NOBODY} here: {r.stderr.strip()}")
    return r


def _give_away(root: Path) -> None:
    if os.geteuid() == 0:
        for p in [root, *root.rglob("*")]:
            os.chown(p, NOBODY, NOBODY, follow_symlinks=False)


@pytest.mark.parametrize("what", ["file", "folder"])
def test_unreadable_is_an_error_naming_it(shared_dir: Path, what: str) -> None:
    src = _classes(shared_dir / "src")
    _give_away(shared_dir)
    out = shared_dir / "out"
    r = _as_unprivileged(str(src), str(out / "s-%d.tar"))  # readable: packs (harness works)
    assert r.returncode == 0, r.stderr
    shutil.rmtree(out)
    victim = src / "dog" / "1.png" if what == "file" else src / "dog"
    os.chmod(victim, 0)
    try:
        r = _as_unprivileged(str(src), str(out / "s-%d.tar"))
    finally:
        os.chmod(victim, 0o755)
    assert r.returncode == 1, r.stderr
    one_error_line(r.stderr, r.returncode, f"{victim}: Permission denied", "nothing was written")
    assert not out.exists()


def test_pack_imports_no_package_it_does_not_use(tmp_path: Path) -> None:
    """Issue 19 item 19: nothing compressed, so zstandard is never imported (as ``nobody``, a
    venv under a 0700 folder cannot be read: the test above then failed on its lazy import).
    Here zstandard cannot be imported at all; pack must not need it."""
    src = _classes(tmp_path / "src")
    out = tmp_path / "out"
    blocked = "sys.modules['zstandard'] = None  # import zstandard raises ImportError"
    r = pack_cli(str(src), str(out / "s-%d.tar"), "--maxcount", "3", "-q", prelude=blocked)
    assert r.returncode == 0, r.stderr
    assert sorted(_samples(str(out / "s-{0..1}.tar"))) == ["cat/0", "cat/1", "dog/0", "dog/1"]
    code = (
        f"import sys\n{blocked}\nimport tarindex\n"
        f"with tarindex.ShardWriter({str(out / 'w-%d.tar')!r}, maxcount=1) as w:\n"
        "    w.write({'__key__': 'a', 'bin': b'x'}); w.write({'__key__': 'b', 'txt': 'y'})\n"
        "assert 'zstandard' not in sys.modules or sys.modules['zstandard'] is None\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert len(tarindex.ShardSet(str(out / "w-{0..1}.tar"))) == 2


def test_source_file_gone_while_writing_is_exit_1_and_keeps_nothing(
    tmp_path: Path, capsys: Cap, monkeypatch: pytest.MonkeyPatch
) -> None:
    src = _flat(tmp_path / "src", n=6)
    (src / "004.bin").rename(src / "004\nx.bin")  # a newline in the name: still one line
    pattern = str(tmp_path / "out" / "s-%d.tar")
    plan = plan_pack(str(src), out_pattern=pattern)
    (src / "004\nx.bin").unlink()  # between planning and writing
    monkeypatch.setattr("tarindex.cli.pack.plan_pack", lambda *a, **k: plan)
    code = main(["pack", str(src), pattern, "--maxcount", "2"])
    err = capsys.readouterr().err
    assert code == 1
    one_error_line(err, code, "004\\nx.bin", "No such file", "1 shard(s)", "nothing of this pack")
    assert files_under(tmp_path / "out") == []


# -- disk full --------------------------------------------------------------------------------
def _big_flat(src: Path) -> Path:
    src.mkdir(parents=True)
    for i in range(6):
        (src / f"{i:03d}.bin").write_bytes(bytes([i]) * (300_000 if i != 4 else 900_000))
    return src


def _check_disk_full(r: subprocess.CompletedProcess[str], out: Path, reason: str) -> None:
    assert r.returncode == 1, r.stderr
    one_error_line(r.stderr, r.returncode, reason, "writing this shard", "nothing of this pack")
    name = r.stderr.split(": error: ", 1)[1].split(":", 1)[0]
    assert os.path.dirname(name) == str(out) and name.endswith(".tar"), r.stderr
    assert files_under(out) == []  # no temp file, no finished shard, no index, no lock


def test_file_size_limit_while_writing(tmp_path: Path) -> None:
    src = _big_flat(tmp_path / "src")
    out = tmp_path / "out"
    limit = 1 << 20
    prelude = (
        "import resource, signal\n"
        "signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # write() fails with EFBIG instead\n"
        f"resource.setrlimit(resource.RLIMIT_FSIZE, ({limit}, {limit}))\n"
    )
    r = pack_cli(str(src), str(out / "s-%06d.tar"), "--maxcount", "2", prelude=prelude)
    _check_disk_full(r, out, "File too large")
    assert "s-000002.tar" in r.stderr  # 000+001 and 002+003 fit, 004+005 do not


def test_file_size_limit_with_jobs_says_what_was_removed(tmp_path: Path) -> None:
    """Issue 19 item 18: with --jobs the message said the shards were kept, then removed."""
    src = _big_flat(tmp_path / "src")
    out = tmp_path / "out"
    limit = 1 << 20
    prelude = (
        "import resource, signal\n"
        "signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # write() fails with EFBIG instead\n"
        f"resource.setrlimit(resource.RLIMIT_FSIZE, ({limit}, {limit}))\n"
    )
    argv = (str(src), str(out / "s-%06d.tar"), "--maxcount", "2", "--jobs", "2")
    r = pack_cli(*argv, prelude=prelude)
    assert r.returncode == 1, r.stderr
    one_error_line(r.stderr, r.returncode, "File too large", "s-000002.tar", "writing the shard")
    line = r.stderr.strip()
    assert "kept;" not in line and "and kept" not in line, line  # nothing was kept
    assert line.endswith(
        "removed the 2 shard(s) this run had finished: nothing of this pack was kept"
    ), line
    assert files_under(out) == []


@pytest.fixture
def small_tmpfs(tmp_path: Path) -> Iterator[Path]:
    """A 1 MiB tmpfs (needs root or CAP_SYS_ADMIN)."""
    d = tmp_path / "tmpfs"
    d.mkdir()
    if shutil.which("mount") is None:
        pytest.skip("no mount command: cannot make a small tmpfs (RLIMIT_FSIZE test covers it)")
    r = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(d)], capture_output=True, text=True
    )
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({r.stderr.strip()}); RLIMIT_FSIZE test covers it")
    try:
        yield d
    finally:
        subprocess.run(["umount", str(d)], check=True)


def test_disk_full_while_writing(tmp_path: Path, small_tmpfs: Path) -> None:
    src = _big_flat(tmp_path / "src")
    out = small_tmpfs / "out"
    r = pack_cli(str(src), str(out / "s-%06d.tar"), "--maxcount", "2")
    _check_disk_full(r, out, "No space left on device")
    st = os.statvfs(small_tmpfs)
    assert st.f_bfree == st.f_blocks  # everything written was removed
