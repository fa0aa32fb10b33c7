"""A hostile user of zstd/xz/bzip2 shards and their decompressed copies (FORMAT.md §11).

The copy in the tar cache is a file anyone with the user's rights can edit, cut, swap or
replace by a link. Whatever is done to it, a read returns the indexed bytes or raises an
error naming the shard, the copy, the byte and the fix; never other bytes. Shards are made by
GNU tar and the compressors themselves; CI runs this file in both kernel modes.
"""

from __future__ import annotations

import lzma
import os
import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import pytest

import tarindex
from tarindex.errors import ChecksumError, StaleIndexError
from tarindex.format.index import IndexTables
from tarindex.storage.tarcache import tar_cache, tar_cache_dir, unpacking
from tests.index.test_packed import _as_dict, _copies, _tar_c


def _flip(path: str, at: int) -> None:
    """Flip one bit of byte ``at`` of ``path``, in place (same size, same inode)."""
    with open(path, "r+b") as f:
        f.seek(at)
        b = f.read(1)
        f.seek(at)
        f.write(bytes([b[0] ^ 1]))


def _middle_member(t: IndexTables) -> int:
    """A member of more than 1000 bytes away from the first and last 4 KiB and the headers
    the open-time checks re-read: only a read of it can see a change to its bytes."""
    off, size = np.asarray(t.offset), np.asarray(t.size)
    ok = (size > 1000) & (off > 8192) & (off + size < t.tar_size - 8192)
    ks = np.nonzero(ok)[0]
    return int(ks[len(ks) // 3])


@pytest.mark.parametrize("how", ["ds[i]", "pread", "stream", "gather"])
def test_a_copy_changed_in_place_never_serves_wrong_bytes(tmp_path: Path, how: str) -> None:
    """One bit flipped inside a member of the copy (same size, fingerprint intact): every
    read path raises ChecksumError naming the shard, the decompressed byte, the copy, how to
    drop it and the re-index command, and drops it; the next open decompresses it again.
    Before: the flipped byte was served (a compressed shard's members were not checked)."""
    path, want = _tar_c(tmp_path, "zstd", n=200)
    t = tarindex.build_index(path)
    (copy,) = _copies()
    k = _middle_member(t)
    off = int(np.asarray(t.offset)[k])
    _flip(copy, off + 7)
    opts = tarindex.OpenOptions(use_mmap=how != "pread")
    with pytest.raises(ChecksumError) as ei:
        if how == "stream":
            for _ in tarindex.TarIterableDataset(path, shuffle=False, options=opts):
                pass
        elif how == "gather":
            ss = tarindex.ShardSet([path], options=opts)
            ss.gather(list(range(len(ss))))
        else:
            ds = tarindex.TarDataset(path, options=opts)
            for i in range(len(ds)):
                ds[i]
    msg = str(ei.value)
    assert f"{path}: decompressed byte {off}: member " in msg, msg
    assert copy in msg and f"rm {copy}" in msg and f"tarindex index --force {path}" in msg, msg
    assert not os.path.exists(copy)  # dropped: the next open makes it again
    ds = tarindex.TarDataset(path)
    for i in range(len(ds)):
        s = ds[i]
        assert _as_dict(s) == want[s["__key__"]]


def test_a_copy_changed_in_its_first_bytes_is_made_again(tmp_path: Path) -> None:
    """The copy's first 4 KiB changed (the fingerprint sees it, the compressed file matches
    the index): the copy is dropped and made again, with a warning naming it; the samples are
    right. Before: StaleIndexError telling to rebuild an index that was fine, every open."""
    path, want = _tar_c(tmp_path, "xz", n=60)
    tarindex.build_index(path)
    (copy,) = _copies()
    _flip(copy, 100)
    with pytest.warns(RuntimeWarning, match=f"{path}: its decompressed copy {copy} .*made again"):
        ds = tarindex.TarDataset(path)
        s = ds[3]
    assert _as_dict(s) == want[s["__key__"]]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert all(_as_dict(ds[i]) == want[ds[i]["__key__"]] for i in range(len(ds)))


def test_a_copy_with_a_rewritten_header_is_dropped(tmp_path: Path) -> None:
    """A member header the open-time checks re-read, changed in the copy: StaleIndexError
    naming the copy and how to drop it (it is dropped), not only ``index --force``; the next
    open is right."""
    path, want = _tar_c(tmp_path, "bzip2", n=100)
    t = tarindex.build_index(path)
    (copy,) = _copies()
    m = t.n_members
    k = (m - 1) * 2 // 4  # the median header, re-read at every open (FORMAT.md §3)
    _flip(copy, int(np.asarray(t.offset)[k]) - 512 + 3)  # its name field
    with pytest.raises(StaleIndexError) as ei:
        tarindex.TarDataset(path)[0]
    msg = str(ei.value)
    assert path in msg and copy in msg and f"rm {copy}" in msg, msg
    assert not os.path.exists(copy)
    ds = tarindex.TarDataset(path)
    assert all(_as_dict(ds[i]) == want[ds[i]["__key__"]] for i in range(len(ds)))


def test_a_copy_swapped_for_another_or_a_link(tmp_path: Path) -> None:
    """The copy replaced by another shard's copy of the same size, or by a link to the right
    bytes elsewhere: never read as this shard's (the link is not followed, the other copy
    fails the checks and is made again); the samples are this shard's."""
    a, want = _tar_c(tmp_path / "a", "zstd", n=80, seed=1)
    b, _ = _tar_c(tmp_path / "b", "zstd", n=80, seed=2)
    tarindex.build_index(a)
    tarindex.build_index(b)
    mine = subprocess.run(["zstd", "-dc", a], capture_output=True, check=True).stdout
    ca, cb = sorted(_copies(), key=lambda p: Path(p).read_bytes() != mine)
    other = Path(cb).read_bytes()
    assert Path(ca).read_bytes() == mine != other
    # another copy, cut or padded to this one's size: fails the fingerprint, made again
    Path(ca).write_bytes(other[: len(mine)].ljust(len(mine), b"\0"))
    with pytest.warns(RuntimeWarning, match="made again"):
        ds = tarindex.TarDataset(a)
        assert all(_as_dict(ds[i]) == want[ds[i]["__key__"]] for i in range(len(ds)))
    # a link to a file holding the right bytes: not followed (removed, made again)
    (tmp_path / "elsewhere.tar").write_bytes(mine)
    os.unlink(ca)
    os.symlink(tmp_path / "elsewhere.tar", ca)
    ds = tarindex.TarDataset(a)
    assert all(_as_dict(ds[i]) == want[ds[i]["__key__"]] for i in range(len(ds)))
    assert not os.path.islink(ca) and Path(ca).read_bytes() == mine


_BOMB = """
import resource, signal, sys, tracemalloc
import tarindex
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # past the limit, write() fails with EFBIG
resource.setrlimit(resource.RLIMIT_FSIZE, (128 << 20, 128 << 20))
tracemalloc.start()
try:
    tarindex.build_index(sys.argv[1])
except OSError as e:
    print("peak", tracemalloc.get_traced_memory()[1])
    print(e)
"""


def test_a_decompression_bomb_is_bounded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A 20 KB .tar.zst holding 512 MiB of zeros, with a 64 MiB tar cache, in a process that
    may write no file past 128 MiB: refused with the OSError naming the shard, the cache and
    TARINDEX_TAR_CACHE_BYTES, no call holding more than 128 MiB (zstd fed 4 KiB at a time).
    Before: the whole tar was written out first (EFBIG here, or the disk filled), and one
    decompress call held 512 MiB."""
    if subprocess.run(["which", "zstd"], capture_output=True).returncode:
        pytest.skip("zstd is not installed")
    d = tmp_path / "d"
    d.mkdir()
    with open(d / "zeros.bin", "wb") as f:
        f.truncate(512 << 20)
    path = str(tmp_path / "bomb.tar.zst")
    subprocess.run(["tar", "--zstd", "-cf", path, "-C", str(d), "zeros.bin"], check=True)
    assert os.path.getsize(path) < 100_000
    monkeypatch.setenv("TARINDEX_TAR_CACHE_BYTES", str(64 << 20))
    out = subprocess.run(
        [sys.executable, "-c", _BOMB, path], capture_output=True, text=True, check=True
    ).stdout
    peak, msg = out.split("\n", 1)
    assert f"{path}: its decompressed copy could not be stored" in msg, out
    assert "TARINDEX_TAR_CACHE_BYTES" in msg, msg
    assert int(peak.split()[1]) < 200 << 20, peak
    assert not os.listdir(tar_cache_dir() + "/tmp")


def test_a_copy_worked_on_longer_than_the_grace_time_is_not_cleaned_up(tmp_path: Path) -> None:
    """A temp copy still being indexed (or decompressed) after the cache's 10-minute grace
    time: another process's clean-up (any new DirCache of the tar cache) leaves it alone, and
    it becomes the copy. A temp file of a process that died (kill -9) is still deleted, however
    young. Before: the old temp was deleted under its writer, whose put_file then failed."""
    path, want = _tar_c(tmp_path, "zstd", n=30)
    with unpacking(path, "zstd") as (tmp, _):
        old = time.time() - 3600
        os.utime(tmp, (old, old))
        subprocess.run(
            [sys.executable, "-c", "from tarindex.storage.tarcache import tar_cache; tar_cache()"],
            check=True,
        )
        assert os.path.exists(tmp)
    (copy,) = _copies()
    ds = tarindex.TarDataset(path)
    assert all(_as_dict(ds[i]) == want[ds[i]["__key__"]] for i in range(len(ds)))
    # a writer killed mid-way: its held temp file goes at the next clean-up
    code = (
        "import os, sys, time\n"
        "from tarindex.storage.tarcache import tar_cache\n"
        "c = tar_cache(); p = c.temp_path(); c.hold_temp(p)\n"
        "open(p, 'wb').write(b'x' * 1000); print(p, flush=True); time.sleep(60)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    left = proc.stdout.readline().strip()
    tar_cache()
    assert os.path.exists(left)  # alive and held
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    tar_cache()
    assert not os.path.exists(left)


def test_a_rewrite_in_place_with_its_mtime_set_back_gets_a_new_copy(tmp_path: Path) -> None:
    """A .tar.zst without content checksums (``zstd --no-check``; random data: raw blocks)
    with one byte changed in its middle, in place (same inode and size, the fingerprint
    intact), its mtime set back as ``touch -r``/``rsync -t`` do: the changed byte is never
    served silently. The copy's key holds ctime, so a new copy is made and the member's crc32
    refuses it. Before: the old copy (same path, size, mtime, inode) was served as the file."""
    if subprocess.run(["which", "zstd"], capture_output=True).returncode:
        pytest.skip("zstd is not installed")
    d = tmp_path / "d"
    d.mkdir()
    rng = np.random.default_rng(0)
    for i in range(30):
        (d / f"{i:03d}.bin").write_bytes(rng.integers(0, 256, 20000, np.uint8).tobytes())
    plain, path = str(tmp_path / "r.tar"), str(tmp_path / "r.tar.zst")
    subprocess.run(["tar", "--sort=name", "-cf", plain, "-C", str(d), "."], check=True)
    subprocess.run(["zstd", "-q", "--no-check", "-1", plain, "-o", path], check=True)
    ds = tarindex.TarDataset(path)
    assert len(ds) == 30
    st = os.stat(path)
    _flip(path, st.st_size // 2)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert os.stat(path).st_mtime_ns == st.st_mtime_ns and os.stat(path).st_ino == st.st_ino
    with pytest.raises(ChecksumError, match=f"{path}: decompressed byte"):
        ds = tarindex.TarDataset(path)
        for i in range(len(ds)):
            ds[i]


def test_zstd_skippable_frames_and_xz_stream_padding(tmp_path: Path) -> None:
    """Files ``zstd -t`` and ``xz -t`` accept: a .tar.zst of two frames with skippable frames
    before, between and after them; a .tar.xz of two streams with stream padding (4 and 8
    zero bytes) between and after them (xz file format §2.2). Both read as the tar, holding a
    ``.tar.gz``-named member that is served as its bytes (never opened). Before: the first was
    NotATarError (its first frame is skippable), the second a FormatError at the padding."""
    if subprocess.run(["which", "zstd"], capture_output=True).returncode:
        pytest.skip("zstd is not installed")
    d = tmp_path / "d"
    d.mkdir()
    want = {f"{i:02d}": f"hello {i}\n".encode() * (i * 50 + 1) for i in range(20)}
    for k, v in want.items():
        (d / f"{k}.txt").write_bytes(v)
    inner = tmp_path / "inner"
    inner.mkdir()
    (inner / "x.txt").write_bytes(b"inner")
    subprocess.run(["tar", "-czf", str(d / "05.tar.gz"), "-C", str(inner), "x.txt"], check=True)
    gz = (d / "05.tar.gz").read_bytes()
    plain = subprocess.run(
        ["tar", "--sort=name", "-cf", "-", "-C", str(d), "."], capture_output=True, check=True
    ).stdout
    half = len(plain) // 2 // 512 * 512
    z = [
        subprocess.run(["zstd", "-c", "-"], input=p, capture_output=True, check=True).stdout
        for p in (plain[:half], plain[half:])
    ]
    skip = (0x184D2A53).to_bytes(4, "little") + (7).to_bytes(4, "little") + b"skipped"
    x = [lzma.compress(p, format=lzma.FORMAT_XZ) for p in (plain[:half], plain[half:])]
    files = {
        "s.tar.zst": skip + z[0] + skip + z[1] + skip,
        "m.tar.xz": x[0] + bytes(4) + x[1] + bytes(8),
    }
    for name, data in files.items():
        path = str(tmp_path / name)
        Path(path).write_bytes(data)
        tool = "zstd" if name.endswith("zst") else "xz"
        if subprocess.run(["which", tool], capture_output=True).returncode == 0:
            subprocess.run([tool, "-t", "-q", path], check=True)
        ds = tarindex.TarDataset(path)
        got = {ds[i]["__key__"]: _as_dict(ds[i]) for i in range(len(ds))}
        assert got == {k: {"txt": v} for k, v in want.items()} | {
            "05": {"txt": want["05"], "tar.gz": gz}
        }, name


def test_a_disk_full_mid_copy_names_the_shard_and_the_cache(tmp_path: Path) -> None:
    """The disk fills while the copy is written (here: a 256 KiB file size limit, EFBIG as
    ENOSPC would be): the OSError names the shard, the cache and the fix, and no temp file is
    left. Before: a bare "[Errno 27] File too large"."""
    path, _ = _tar_c(tmp_path, "zstd", n=200)
    tarindex.build_index(path, keep_copy=False)
    code = (
        "import resource, signal, sys\n"
        "import tarindex\n"
        "signal.signal(signal.SIGXFSZ, signal.SIG_IGN)\n"
        "resource.setrlimit(resource.RLIMIT_FSIZE, (256 << 10, 256 << 10))\n"
        "try:\n"
        "    tarindex.TarDataset(sys.argv[1])[0]\n"
        "except OSError as e:\n"
        "    print(e)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, path], capture_output=True, text=True, check=True
    ).stdout
    assert f"{path}: its decompressed copy could not be stored in the tar cache" in out, out
    assert tar_cache_dir() in out and "TARINDEX_TAR_CACHE" in out, out
    assert not os.listdir(tar_cache_dir() + "/tmp") and not _copies()


_SLOW_WRITER = """
import sys, time
import tarindex
import tarindex.storage.tarcache as tc
real = tc.unpack_checked
def then_stall(src, out, fmt, on_read=None):
    n = real(src, out, fmt, on_read)
    out.f.flush()
    print("written", flush=True)  # the whole tar is in the temp file, not yet renamed
    time.sleep(120)
    return n
tc.unpack_checked = then_stall
tarindex.TarDataset(sys.argv[1])[0]
"""


def test_kill_9_mid_copy_leaves_no_copy(tmp_path: Path) -> None:
    """A process kill -9'd with the whole tar written to its temp file but not yet renamed
    (holding the entry's lock): its temp is never taken as the copy, the lock is released, the
    next open makes the copy itself and reads the right samples, and the temp is deleted."""
    path, want = _tar_c(tmp_path, "xz", n=60)
    tarindex.build_index(path, keep_copy=False)
    proc = subprocess.Popen(
        [sys.executable, "-c", _SLOW_WRITER, path], stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None and proc.stdout.readline().strip() == "written"
    (left,) = os.listdir(tar_cache_dir() + "/tmp")
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert not _copies()
    ds = tarindex.TarDataset(path)
    assert all(_as_dict(ds[i]) == want[ds[i]["__key__"]] for i in range(len(ds)))
    assert len(_copies()) == 1 and left not in os.listdir(tar_cache_dir() + "/tmp")
