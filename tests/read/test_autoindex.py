"""No index step unless asked (index="auto"): a missing index is built on first open, beside
the tar or in the per-user index cache, safely under many processes; OpenOptions(index="require") keeps
IndexMissingError. Real tars (GNU tar, webdataset's TarWriter), a real DataLoader with 2
workers, a real read-only directory (another user), a real HTTP server."""

from __future__ import annotations

import multiprocessing as mp
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import numpy as np
import pytest

import tarindex
from tarindex.errors import FormatError, IndexMissingError, StaleIndexError
from tests.remote_server import serve

GNU_TAR = shutil.which("tar")
REQUIRE = tarindex.OpenOptions(index="require")


@pytest.fixture(autouse=True)
def _own_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TARINDEX_INDEX_CACHE", str(tmp_path / "index-cache"))


def _files(d: Path, keys: range, seed: int = 0) -> dict[str, dict[str, bytes]]:
    rng = np.random.default_rng(seed)
    d.mkdir(parents=True, exist_ok=True)
    want = {}
    for i in keys:
        k = f"{i:05d}"
        s = {
            "bin": rng.integers(0, 256, int(rng.integers(0, 2000)), np.uint8).tobytes(),
            "cls": str(i % 10).encode(),
        }
        for ext, data in s.items():
            (d / f"{k}.{ext}").write_bytes(data)
        want[k] = s
    return want


def _gnu_tar(out: Path, src: Path, gz: bool = False) -> None:
    if GNU_TAR is None:
        pytest.skip("GNU tar is not installed")
    names = sorted(os.listdir(src))
    flags = "-czf" if gz else "-cf"
    subprocess.run([GNU_TAR, "--sort=name", flags, str(out), "-C", str(src), *names], check=True)


def _plain(s: dict[str, object]) -> dict[str, bytes]:
    return {k: bytes(v) for k, v in s.items() if not k.startswith("__")}  # type: ignore[call-overload]


def test_gnu_tar_indexed_on_first_open_beside_it(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    want = _files(tmp_path / "f", range(200))
    tar = tmp_path / "d" / "a.tar"
    tar.parent.mkdir()
    _gnu_tar(tar, tmp_path / "f")
    with pytest.raises(IndexMissingError, match="tarindex index"):
        tarindex.TarDataset(str(tar), options=REQUIRE)
    assert not os.path.exists(str(tar) + ".tidx")
    ds = tarindex.TarDataset(str(tar))
    err = capfd.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.startswith("tarindex: built")]
    assert len(lines) == 1 and lines[0].endswith("index='require' turns this off")
    assert f"-> {tar}.tidx" in lines[0]
    assert os.path.exists(str(tar) + ".tidx")
    assert {ds[i]["__key__"]: _plain(ds[i]) for i in range(len(ds))} == want
    tarindex.TarDataset(str(tar))  # now indexed: nothing built, nothing said
    assert "tarindex: built" not in capfd.readouterr().err
    with pytest.raises(ValueError, match="index='bogus'"):
        tarindex.OpenOptions(index="bogus")


def test_webdataset_shards_same_samples_as_webdataset(tmp_path: Path) -> None:
    """Shards written by webdataset's TarWriter (.tar and .tgz), never indexed: WebDataset and
    tarindex's streaming and map-style datasets yield the same samples."""
    wds = pytest.importorskip("webdataset")
    rng = np.random.default_rng(1)
    for name in ("w.tar", "w.tgz"):
        with wds.TarWriter(str(tmp_path / name)) as w:
            for i in range(60):
                w.write(
                    {
                        "__key__": f"s{i:03d}",
                        "txt": f"text {i}",
                        "bin": rng.integers(0, 256, int(rng.integers(0, 900)), np.uint8).tobytes(),
                        "cls": str(i % 4),
                    }
                )
        path = str(tmp_path / name)
        theirs = [
            {k: v for k, v in s.items() if not k.startswith("__")} | {"__key__": s["__key__"]}
            for s in wds.WebDataset(path, shardshuffle=False)
        ]
        ours = [
            _plain(s) | {"__key__": s["__key__"]}
            for s in tarindex.TarIterableDataset(path, shuffle=False)
        ]
        assert ours == theirs
        ds = tarindex.TarDataset(path)
        assert [_plain(ds[i]) | {"__key__": ds[i]["__key__"]} for i in range(len(ds))] == theirs


def test_dataloader_two_workers_on_a_fresh_directory(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    d = tmp_path / "shards"
    d.mkdir()
    want: dict[str, dict[str, bytes]] = {}
    for s in range(3):
        w = _files(tmp_path / f"f{s}", range(s * 100, s * 100 + 100), seed=s)
        want |= w
        _gnu_tar(d / f"train-{s:03d}.tar", tmp_path / f"f{s}", gz=s == 2)
    ds = tarindex.TarDataset(str(d))  # a directory: its .tar and .tar.gz shards
    assert len(ds) == 300 and ds.shards.n_shards == 3
    loader = torch.utils.data.DataLoader(
        ds, batch_size=16, shuffle=True, num_workers=2, collate_fn=lambda b: b
    )
    got = {s["__key__"]: _plain(s) for batch in loader for s in batch}
    assert got == want
    it = tarindex.TarIterableDataset(str(d), shuffle=True, seed=0)
    loader2 = torch.utils.data.DataLoader(it, batch_size=None, num_workers=2)
    assert sorted(s["__key__"] for s in loader2) == sorted(want)


def _open_in_process(args: tuple[str, str, object]) -> tuple[int, str]:
    src, cache, barrier = args
    os.environ["TARINDEX_INDEX_CACHE"] = cache
    barrier.wait()  # type: ignore[attr-defined]
    import contextlib
    import io

    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        ds = tarindex.TarDataset(src)
        n = len(ds)
        assert all(ds[i]["__key__"] for i in range(n))
    return n, err.getvalue()


def test_many_processes_open_the_same_missing_indexes(tmp_path: Path) -> None:
    """Four processes (as DDP ranks would) open the same unindexed shards at once: each index
    is built once, none is torn, all four see every sample."""
    d = tmp_path / "shards"
    d.mkdir()
    for s in range(6):
        _files(tmp_path / f"f{s}", range(s * 300, s * 300 + 300), seed=s)
        _gnu_tar(d / f"x-{s}.tar", tmp_path / f"f{s}")
    ctx = mp.get_context("spawn")
    with ctx.Manager() as m:
        barrier = m.Barrier(4)
        with ctx.Pool(4) as pool:
            got = pool.map(_open_in_process, [(str(d), str(tmp_path / "index-cache"), barrier)] * 4)
    assert [n for n, _ in got] == [1800] * 4
    built = sum(
        int(ln.split("built ")[1].split(" ")[0]) if "indexes" in ln else 1
        for _, err in got
        for ln in err.splitlines()
        if ln.startswith("tarindex: built")
    )
    assert built == 6  # every index built exactly once
    for s in range(6):
        t = tarindex.ShardReader(str(d / f"x-{s}.tar"), full_check=True)
        assert t.n_samples == 300
        t.close()
    assert not [p for p in os.listdir(d) if p.endswith(".tmp")]


_READONLY_SCRIPT = """
import os, sys, tarindex
ds = tarindex.TarDataset(sys.argv[1])
print(len(ds), ds[0]["__key__"], ds[len(ds) - 1]["__key__"])
"""


def _read_only(ro: Path, script: str, *args: str, cache: Path) -> subprocess.CompletedProcess[str]:
    """Run ``script`` with ``ro`` bind-mounted read-only (a mount namespace of its own: writes
    there fail with EROFS, for root too); the index cache is ``cache``."""
    env = dict(os.environ, TARINDEX_INDEX_CACHE=str(cache))
    env["PYTHONPATH"] = os.pathsep.join([str(Path(tarindex.__file__).parents[1]), *sys.path])
    shell = 'mount --bind -o ro "$1" "$1" && shift && exec "$@"'
    return subprocess.run(
        ["unshare", "-m", "sh", "-c", shell, "sh", str(ro), sys.executable, "-c", script, *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_read_only_directory_falls_back_to_the_cache_and_a_changed_tar_is_rebuilt(
    tmp_path: Path,
) -> None:
    """Shards in a read-only directory: the index goes to the index cache; a tar changed
    since gets a new cache entry (its stat fingerprint changed), never the old index."""
    ro = tmp_path / "ro"
    _files(tmp_path / "f", range(50))
    ro.mkdir()
    _gnu_tar(ro / "a.tar", tmp_path / "f")
    cache = tmp_path / "cache"
    probe = _read_only(ro, "open(__import__('sys').argv[1] + '/x', 'w')", str(ro), cache=cache)
    if shutil.which("unshare") is None or "Read-only file system" not in probe.stderr:
        pytest.skip(f"cannot make a read-only bind mount here: {probe.stderr.strip()[-200:]}")
    r = _read_only(ro, _READONLY_SCRIPT, str(ro / "a.tar"), cache=cache)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["50", "00000", "00049"]
    assert f"-> {cache}" in r.stderr and not os.path.exists(ro / "a.tar.tidx")
    r = _read_only(ro, _READONLY_SCRIPT, str(ro / "a.tar"), cache=cache)  # cached: not rebuilt
    assert r.returncode == 0 and "tarindex: built" not in r.stderr, r.stderr
    _files(tmp_path / "f", range(50, 80))  # the tar changes: more samples
    _gnu_tar(ro / "a.tar", tmp_path / "f")
    r = _read_only(ro, _READONLY_SCRIPT, str(ro / "a.tar"), cache=cache)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["80", "00000", "00079"] and "tarindex: built" in r.stderr


def test_a_tar_changed_after_its_sidecar_was_built_is_stale(tmp_path: Path) -> None:
    """Decision (docs/READING.md): a sidecar index is never rewritten behind the user's back;
    a tar changed after it was auto-indexed is StaleIndexError naming the rebuild command."""
    _files(tmp_path / "f", range(40))
    tar = tmp_path / "a.tar"
    _gnu_tar(tar, tmp_path / "f")
    ds = tarindex.TarDataset(str(tar))
    assert len(ds) == 40
    _files(tmp_path / "f", range(40, 45))
    _gnu_tar(tar, tmp_path / "f")
    with pytest.raises(StaleIndexError, match="tarindex index --force"):
        tarindex.TarDataset(str(tar))[0]


def test_a_bad_tar_fails_at_open_naming_it(tmp_path: Path) -> None:
    good = tmp_path / "d" / "a.tar"
    good.parent.mkdir()
    with tarfile.open(good, "w") as tf:
        tf.add(__file__, "x.py")
    bad = tmp_path / "d" / "b.tar"
    bad.write_bytes(good.read_bytes()[:700])
    with pytest.raises(FormatError, match="b.tar"):
        tarindex.TarDataset(str(tmp_path / "d"))
    assert not os.path.exists(str(bad) + ".tidx")


def test_remote_shards_are_indexed_into_the_cache(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    srv_dir = tmp_path / "srv"
    srv_dir.mkdir()
    want = _files(tmp_path / "f", range(80))
    _gnu_tar(srv_dir / "r.tar", tmp_path / "f")
    _gnu_tar(srv_dir / "r.tar.gz", tmp_path / "f", gz=True)
    with serve(str(srv_dir)) as srv:
        for name in ("r.tar", "r.tar.gz"):
            url = f"{srv.url}/{name}"
            ds = tarindex.TarDataset(url)
            err = capfd.readouterr().err
            assert f"-> {tmp_path / 'index-cache'}" in err
            assert {ds[i]["__key__"]: _plain(ds[i]) for i in range(len(ds))} == want
            with pytest.raises(IndexMissingError):
                tarindex.TarDataset(url, options=REQUIRE)
            tarindex.TarDataset(url)  # from the cache: nothing built
            assert "tarindex: built" not in capfd.readouterr().err
        assert not os.path.exists(srv_dir / "r.tar.tidx")
