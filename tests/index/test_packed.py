"""zstd/xz/bzip2(/lz4) shards made by real tools, read through a decompressed copy (FORMAT.md §11).

Random access and streaming go through the copy in the tar cache, made once and keyed by the
compressed file's fingerprint; the index describes the tar inside. webdataset 1.0.2 reading the
same shards (``tarfile``'s ``r|*`` for xz/bzip2, ``pipe:zstd -dc`` for zstd) gives the same
samples in the same order.
"""

from __future__ import annotations

import bz2
import lzma
import multiprocessing as mp
import os
import random
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import tarindex
from tarindex.errors import (
    ChecksumError,
    CompressedTarError,
    FormatError,
    StaleIndexError,
    TruncatedError,
)
from tarindex.format.index import decode_index
from tarindex.format.packed import packed_of
from tarindex.storage.tarcache import tar_cache_dir
from tests.remote_server import serve

TAR = shutil.which("tar")
TOOLS = {"zstd": shutil.which("zstd"), "xz": shutil.which("xz"), "bzip2": shutil.which("bzip2")}
# the tar option and the suffix of each compression
KINDS = {"zstd": ("--zstd", "tar.zst"), "xz": ("-J", "tar.xz"), "bzip2": ("-j", "tar.bz2")}


def _files(root: Path, n: int, seed: int = 1) -> dict[str, dict[str, bytes]]:
    """``n`` samples (txt of varied size, cls) as files under ``root/d``; the expected samples."""
    d = root / "files" / "d"
    d.mkdir(parents=True)
    rng = random.Random(seed)
    want: dict[str, dict[str, bytes]] = {}
    for i in range(n):
        txt = f"sample {i} seed {seed} ".encode() * rng.randrange(1, 400)
        cls = str(i % 7).encode()
        (d / f"{i:05d}.txt").write_bytes(txt)
        (d / f"{i:05d}.cls").write_bytes(cls)
        want[f"d/{i:05d}"] = {"txt": txt, "cls": cls}
    return want


def _tar_c(root: Path, kind: str, n: int = 200, seed: int = 1) -> tuple[str, dict[str, dict[str, bytes]]]:
    """A shard made by GNU ``tar --zstd/-J/-j -cf`` (skips when tar or the compressor is missing)."""
    if TAR is None or TOOLS[kind] is None:
        pytest.skip(f"GNU tar or {kind} is not installed")
    want = _files(root, n, seed)
    opt, suffix = KINDS[kind]
    out = str(root / f"s.{suffix}")
    subprocess.run(
        [TAR, "--sort=name", opt, "-cf", out, "-C", str(root / "files"), "d"], check=True
    )
    return out, want


def _by_tool(root: Path, kind: str) -> tuple[str, dict[str, dict[str, bytes]]]:
    """A tarindex shard run through the compressor itself (``zstd -c``, ``xz -c``, ``bzip2 -c``)."""
    tool = TOOLS[kind]
    if tool is None:
        pytest.skip(f"{kind} is not installed")
    plain = root / "w.tar"
    want: dict[str, dict[str, bytes]] = {}
    with tarindex.ShardWriter(str(plain)) as w:
        for i in range(300):
            s = {"txt": f"text {i} ".encode() * (i % 50 + 1), "cls": str(i % 10).encode()}
            w.write({"__key__": f"k{i:05d}", **s})
            want[f"k{i:05d}"] = s
    out = root / f"w.{KINDS[kind][1]}"
    with open(out, "wb") as f:
        subprocess.run([tool, "-c", str(plain)], stdout=f, check=True)
    plain.unlink()
    return str(out), want


def _as_dict(s: dict[str, object]) -> dict[str, bytes]:
    return {k: v for k, v in s.items() if not k.startswith("__")}  # type: ignore[misc]


def _copies(root: str | None = None) -> list[str]:
    """The decompressed copies in the tar cache."""
    out = []
    for d, _, fs in os.walk(root or tar_cache_dir()):
        out += [os.path.join(d, f) for f in fs if f == "tar"]
    return out


@pytest.mark.parametrize("kind", ["zstd", "xz", "bzip2"])
@pytest.mark.parametrize("maker", ["tar -c", "compressor -c"])
def test_random_access_and_streaming(tmp_path: Path, kind: str, maker: str) -> None:
    """No index step: the first open indexes the shard and keeps its copy; ds[i] and both
    streaming orders give the tar's samples, byte for byte, in both kernel modes (CI runs
    this file twice)."""
    path, want = (_tar_c if maker == "tar -c" else _by_tool)(tmp_path, kind)
    ds = tarindex.TarDataset(path)
    assert len(ds) == len(want)
    assert os.path.exists(path + ".tidx") and len(_copies()) == 1  # indexed and copied once
    order = list(range(len(ds)))
    random.Random(0).shuffle(order)
    for i in order:
        s = ds[i]
        assert s["__shard__"] == path and _as_dict(s) == want[s["__key__"]]
    got = [s["__key__"] for s in tarindex.TarIterableDataset(path, shuffle=False)]
    assert got == sorted(want)
    seen = {}
    for s in tarindex.TarIterableDataset(path, shuffle=True, seed=3):
        seen[s["__key__"]] = _as_dict(s)
    assert seen == want
    t = decode_index(memoryview(Path(path + ".tidx").read_bytes()), path + ".tidx")
    pf = packed_of(t.meta, path)
    assert pf is not None and pf.format == kind and pf.size == os.path.getsize(path)
    assert t.gzip is None and t.member_crc is not None
    assert len(_copies()) == 1


@pytest.mark.parametrize("kind", ["zstd", "xz", "bzip2"])
def test_same_samples_as_webdataset(tmp_path: Path, kind: str) -> None:
    """Differential: webdataset 1.0.2 over the same shard gives the same samples in order."""
    wds = pytest.importorskip("webdataset")
    path, want = _tar_c(tmp_path, kind, n=120)
    url = f"pipe:{TOOLS['zstd']} -dc {path}" if kind == "zstd" else path
    theirs = [
        (s["__key__"], {k: v for k, v in s.items() if not k.startswith("__")})
        for s in wds.WebDataset(url, shardshuffle=False)
    ]
    ours = [(s["__key__"], _as_dict(s)) for s in tarindex.TarIterableDataset(path, shuffle=False)]
    assert ours == theirs and len(ours) == len(want)
    ds = tarindex.TarDataset(path)
    assert [(ds[i]["__key__"], _as_dict(ds[i])) for i in range(len(ds))] == theirs


def test_lz4(tmp_path: Path) -> None:
    """lz4 is read when its package is installed; else the error names the package and a
    command that works (run here when ``lz4`` is on PATH)."""
    plain = tmp_path / "p.tar"
    with tarindex.ShardWriter(str(plain)) as w:
        for i in range(20):
            w.write({"__key__": f"k{i:03d}", "txt": f"t{i}"})
    out = tmp_path / "p.tar.lz4"
    try:
        import lz4.frame  # type: ignore[import-not-found,unused-ignore]
    except ImportError:
        lz4 = None
    if lz4 is not None:
        out.write_bytes(lz4.frame.compress(plain.read_bytes()))
        assert tarindex.TarDataset(str(out))[7]["txt"] == b"t7"
        return
    tool = shutil.which("lz4")
    if tool is None:
        pytest.skip("neither the lz4 package nor the lz4 command")
    subprocess.run([tool, "-q", "-c", str(plain)], stdout=open(out, "wb"), check=True)
    with pytest.raises(CompressedTarError, match="pip install lz4") as ei:
        tarindex.build_index(str(out))
    msg = str(ei.value)
    assert str(out) in msg and "byte 0" in msg
    cmd = msg.split("`")[1]
    subprocess.run(cmd, shell=True, check=True, cwd=tmp_path)
    fixed = cmd.rsplit(">", 1)[1].strip()
    assert tarindex.TarDataset(fixed)[7]["txt"] == b"t7"


def test_a_changed_file_is_never_served_from_its_old_copy(tmp_path: Path) -> None:
    """The copy is keyed by the compressed file: replaced (other samples), the old index is
    StaleIndexError naming the fix; rebuilt, the new samples come out, never the old copy."""
    path, _ = _tar_c(tmp_path / "a", "xz", n=50, seed=1)
    ds = tarindex.TarDataset(path)
    old = ds[3]
    (tmp_path / "b").mkdir()
    other, want2 = _tar_c(tmp_path / "b", "xz", n=50, seed=2)
    shutil.copyfile(other, path)  # the same name, other contents
    with pytest.raises(StaleIndexError, match=f"{path}: compressed .*tarindex index --force {path}"):
        tarindex.TarDataset(path)[3]
    tarindex.build_index(path)
    s = tarindex.TarDataset(path)[3]
    assert _as_dict(s) == want2[s["__key__"]] != _as_dict(old)


def test_same_size_rewrite_in_place(tmp_path: Path) -> None:
    """A same-size rewrite whose first and last 4 KiB are unchanged (the fingerprint cannot
    see it) still gets a new copy (the key holds mtime and inode), which the index's checks
    then compare with the tar inside; the bytes served are the file's now, never the old copy's."""
    path, want = _tar_c(tmp_path, "zstd", n=200)
    ds = tarindex.TarDataset(path)
    ds[0]
    data = bytearray(Path(path).read_bytes())
    mid = len(data) // 2
    data[mid] ^= 0xFF
    with open(path, "r+b") as f:  # in place: the same inode, a new mtime
        f.write(data)
    with pytest.raises((FormatError, StaleIndexError), match=str(path)):
        ds2 = tarindex.TarDataset(path)
        for i in range(len(ds2)):
            s = ds2[i]
            assert _as_dict(s) == want[s["__key__"]]


def _cut(path: str, n: int) -> None:
    with open(path, "r+b") as f:
        f.truncate(os.path.getsize(path) - n)


@pytest.mark.parametrize("kind", ["zstd", "xz", "bzip2"])
def test_cut_and_corrupt_files_are_clear_errors(tmp_path: Path, kind: str) -> None:
    """A cut file is TruncatedError at its last compressed byte; a flipped byte fails the
    stream's own check or its format; bytes after the data are refused at their offset.
    Every message names the file, the compressed byte and the fix; no index is left."""
    path, _ = _tar_c(tmp_path, kind, n=200)
    good = Path(path).read_bytes()
    _cut(path, 9)
    with pytest.raises(TruncatedError) as ei:
        tarindex.build_index(path)
    msg = str(ei.value)
    assert f"{path}: compressed byte {len(good) - 9}" in msg and "re-copy" in msg, msg
    assert not os.path.exists(path + ".tidx")
    bad = bytearray(good)
    bad[len(bad) // 2] ^= 0x55
    Path(path).write_bytes(bytes(bad))
    with pytest.raises((ChecksumError, FormatError)) as ei2:
        tarindex.build_index(path)
    msg = str(ei2.value)
    assert path in msg and "compressed bytes from" in msg and "re-copy or re-create" in msg, msg
    Path(path).write_bytes(good + b"junk after the data")
    with pytest.raises(FormatError, match=f"{path}: compressed bytes? (from )?{len(good)}:"):
        tarindex.build_index(path)
    Path(path).write_bytes(good + bytes(10240))  # zeros after the data: tar padding
    assert len(tarindex.build_index(path).sample_ptr) == 201
    assert not _copies(str(tmp_path / "x")) and not os.path.exists(path + ".tmp")


def test_a_copy_evicted_or_cut_in_the_cache_is_made_again(tmp_path: Path) -> None:
    """The copy is checked against the index at every open: a copy of the wrong size is
    dropped and made again from the compressed file."""
    path, want = _tar_c(tmp_path, "xz", n=30)
    t = tarindex.build_index(path)
    (copy,) = _copies()
    _cut(copy, 512)
    s = tarindex.TarDataset(path)[5]
    assert _as_dict(s) == want[s["__key__"]]
    (copy2,) = _copies()
    assert os.path.getsize(copy2) == t.tar_size
    os.unlink(copy2)
    for use_mmap in (True, False):
        ds = tarindex.TarDataset(path, options=tarindex.OpenOptions(use_mmap=use_mmap))
        assert all(_as_dict(ds[i]) == want[ds[i]["__key__"]] for i in range(len(ds)))
    assert len(_copies()) == 1


def test_tar_cache_unusable_or_too_small(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A tar cache that cannot be made, or is smaller than the copy: an OSError naming the
    shard, the cache and the variable that fixes it; nothing is left half-written."""
    path, want = _tar_c(tmp_path, "zstd", n=40)
    tarindex.build_index(path, keep_copy=False)
    (tmp_path / "afile").write_bytes(b"")
    monkeypatch.setenv("TARINDEX_TAR_CACHE", str(tmp_path / "afile" / "cache"))
    with pytest.raises(OSError, match=f"{path}: .*cannot be made.*TARINDEX_TAR_CACHE"):
        tarindex.TarDataset(path)[0]
    root = tmp_path / "small"
    monkeypatch.setenv("TARINDEX_TAR_CACHE", str(root))
    monkeypatch.setenv("TARINDEX_TAR_CACHE_BYTES", "1000")
    with pytest.raises(OSError, match=f"{path}: .*{root}.*TARINDEX_TAR_CACHE_BYTES"):
        tarindex.TarDataset(path)[0]
    assert not _copies(str(root)) and not os.listdir(root / "tmp")
    monkeypatch.setenv("TARINDEX_TAR_CACHE_BYTES", str(1 << 30))
    s = tarindex.TarDataset(path)[0]
    assert _as_dict(s) == want[s["__key__"]]


def _open_one(path: str, log: str, barrier: object) -> None:
    """In a child: count decompressions (into ``log``), wait for the others, read a sample
    (its key appended to ``log + ".keys"``)."""
    import tarindex.storage.tarcache as tc

    real = vars(tc)["unpack_checked"]

    def counted(*a: object, **k: object) -> int:
        with open(log, "a") as f:
            f.write(f"{os.getpid()}\n")
        n: int = real(*a, **k)
        return n

    vars(tc)["unpack_checked"] = counted
    barrier.wait()  # type: ignore[attr-defined]
    s = tarindex.TarDataset(path)[17]
    with open(log + ".keys", "a") as f:
        f.write(f"{s['__key__']}\n")


def test_concurrent_processes_decompress_once(tmp_path: Path) -> None:
    """Four processes opening the same shard with an empty tar cache make one copy (the
    entry's flock): the others wait for it and map it."""
    path, want = _tar_c(tmp_path, "xz", n=400)
    tarindex.build_index(path, keep_copy=False)
    assert not _copies()
    log = str(tmp_path / "unpacks.log")
    ctx = mp.get_context("spawn")
    barrier = ctx.Barrier(4)
    procs = [ctx.Process(target=_open_one, args=(path, log, barrier)) for _ in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
        assert p.exitcode == 0
    keys = Path(log + ".keys").read_text().split()
    assert len(keys) == 4 and len(set(keys)) == 1 and keys[0] in want
    assert len(Path(log).read_text().split()) == 1
    assert len(_copies()) == 1


def test_remote_shards(tmp_path: Path) -> None:
    """A .tar.zst over HTTP: indexed on first open (into the index cache), its copy made from
    one download; a second dataset downloads nothing more."""
    srv_dir = tmp_path / "srv"
    srv_dir.mkdir()
    path, want = _tar_c(srv_dir, "zstd", n=80)
    os.environ["TARINDEX_INDEX_CACHE"] = str(tmp_path / "icache")
    try:
        with serve(str(srv_dir)) as srv:
            url = srv.url + "/s.tar.zst"
            ds = tarindex.TarDataset(url)
            for i in (0, 79, 33):
                s = ds[i]
                assert _as_dict(s) == want[s["__key__"]] and s["__shard__"] == url
            got = {s["__key__"] for s in tarindex.TarIterableDataset(url, shuffle=True, seed=1)}
            assert got == set(want)
            n = srv.bytes_for(".tar.zst")
            size = os.path.getsize(path)
            assert n <= 3 * size  # the index's download and the copy's (plus the checks)
            ds2 = tarindex.TarDataset(url)
            assert _as_dict(ds2[1]) == want[ds2[1]["__key__"]]
            assert srv.bytes_for(".tar.zst") - n < size  # served from the copy
    finally:
        del os.environ["TARINDEX_INDEX_CACHE"]


def test_cli_index_verify_ls(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``tarindex index``, ``verify``, ``verify --data``, ``ls --members`` and ``info`` on a .tar.xz."""
    from tarindex.cli.main import main

    path, want = _tar_c(tmp_path, "xz", n=40)
    assert main(["index", path]) == 0
    assert main(["verify", path]) == 0
    assert main(["verify", "--data", path]) == 0
    capsys.readouterr()
    assert main(["ls", "--members", path]) == 0
    out = capsys.readouterr().out
    assert "d/00039.txt" in out
    assert main(["info", path]) == 0
    out = capsys.readouterr().out
    assert f"xz bytes:    {os.path.getsize(path)} " in out and "samples:     40" in out


def test_dataloader_workers(tmp_path: Path) -> None:
    """A real DataLoader with 2 worker processes over two .tar.zst shards, map-style and
    streaming: every sample once, the bytes of the tar."""
    torch = pytest.importorskip("torch")
    a, want_a = _tar_c(tmp_path / "a", "zstd", n=60, seed=1)
    b, want_b = _tar_c(tmp_path / "b", "zstd", n=50, seed=2)
    want = {(a, k): v for k, v in want_a.items()} | {(b, k): v for k, v in want_b.items()}
    ds = tarindex.TarDataset([a, b])
    got = {}
    dl = torch.utils.data.DataLoader(ds, batch_size=None, shuffle=True, num_workers=2)
    for s in dl:
        got[(s["__shard__"], s["__key__"])] = _as_dict(s)
    assert got == want
    it = tarindex.TarIterableDataset([a, b], shuffle=True, seed=5)
    dl2 = torch.utils.data.DataLoader(it, batch_size=None, num_workers=2)
    keys = [(s["__shard__"], s["__key__"]) for s in dl2]
    assert sorted(keys) == sorted(want)


def test_stdlib_compressors(tmp_path: Path) -> None:
    """Python's own lzma/bz2 streams (several concatenated, as ``pbzip2``/``xz -T`` make)."""
    plain = tmp_path / "p.tar"
    with tarindex.ShardWriter(str(plain)) as w:
        for i in range(100):
            w.write({"__key__": f"k{i:03d}", "txt": f"t{i}" * 100})
    data = plain.read_bytes()
    half = len(data) // 2
    for name, comp in (("a.tar.xz", lzma.compress), ("a.tar.bz2", bz2.compress)):
        p = tmp_path / name
        p.write_bytes(comp(data[:half]) + comp(data[half:]))
        ds = tarindex.TarDataset(str(p))
        assert len(ds) == 100 and ds[99]["txt"] == b"t99" * 100


if __name__ == "__main__":  # pragma: no cover
    sys.exit(pytest.main([__file__, "-q"]))
