"""Never serve wrong bytes: changed shards, crashed or concurrent writers, corrupt indexes.

Real parts: GNU tar appends (`tar -r`), a writer process killed with SIGKILL at every step of
putting a shard in place, a second writer process on the same pattern.
"""

from __future__ import annotations

import os
import shutil
import signal
import struct
import subprocess
import sys
import textwrap
import time
import warnings
import zlib
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import tarindex
import tarindex.read.verify
from tarindex.errors import (
    ChecksumError,
    IndexMissingError,
    StaleIndexError,
    TarIndexError,
    WriterError,
)
from tarindex.format.index import decode_index, encode_index
from tarindex.format.spec import FOOTER, RECORD

GOLDEN = Path(__file__).parents[1] / "golden"
ROOT = str(Path(__file__).parents[2])
pytestmark = pytest.mark.timeout(180)


def _write(
    pattern: str, n: int, data_seed: int, size: int = 1000, **kw: Any
) -> list[dict[str, Any]]:
    rng = np.random.default_rng(data_seed)
    out = []
    with tarindex.ShardWriter(pattern, mtime=0, **kw) as w:
        for i in range(n):
            s = {"__key__": f"{i:04d}", "bin": rng.integers(0, 256, size, np.uint8).tobytes()}
            w.write({**s, "cls": i})
            out.append({**s, "cls": str(i).encode()})
    return out


def _read(tar: Path) -> list[dict[str, Any]]:
    with tarindex.ShardReader(str(tar)) as r:
        return [r.sample(j) for j in range(r.n_samples)]


def test_tar_r_append_within_the_padding_is_detected(tmp_path: Path) -> None:
    if shutil.which("tar") is None:
        pytest.skip("GNU tar is not installed")
    tar = tmp_path / "s.tar"
    # one sample whose end of data falls 1 KiB into the second 10240-byte record: the append
    # lands there, far from the last 4 KiB, and the record padding absorbs it
    _write(str(tar), 1, 0, size=8704)
    size = tar.stat().st_size
    assert decode_index(Path(str(tar) + ".tidx").read_bytes()).end == 11264 and size == 20480
    (tmp_path / "new.txt").write_bytes(b"appended")
    subprocess.run(["tar", "-rf", str(tar), "-C", str(tmp_path), "new.txt"], check=True)
    assert tar.stat().st_size == size  # fits in the record padding: size and tail unchanged
    with pytest.raises(StaleIndexError, match="appended"):
        tarindex.ShardReader(str(tar))
    tarindex.build_index(str(tar))  # re-indexing picks the new sample up
    assert [s["__key__"] for s in _read(tar)] == ["0000", "new"]


def test_same_size_rewrite_of_a_middle_member_header_is_detected(tmp_path: Path) -> None:
    tar = tmp_path / "s.tar"
    _write(str(tar), 40, 0, size=3000)
    t = decode_index(Path(str(tar) + ".tidx").read_bytes())
    m = (t.n_members - 1) // 2  # one of the re-read headers (first, quartiles, last)
    h = int(t.offset[m]) - 512
    raw = bytearray(tar.read_bytes())
    raw[h : h + 4] = b"9999"  # rename in place ("0019.bin" -> "9999.bin"), checksum fixed
    raw[h + 148 : h + 156] = b" " * 8
    raw[h + 148 : h + 156] = b"%06o\0 " % sum(raw[h : h + 512])
    tar.write_bytes(bytes(raw))
    with pytest.raises(StaleIndexError, match=f"byte {h}: the header of member {m} names"):
        tarindex.ShardReader(str(tar))


def test_flipped_index_bit_refused_at_first_open(tmp_path: Path) -> None:
    tar = tmp_path / "s.tar"
    want = _write(str(tar), 20, 0)
    ip = Path(str(tar) + ".tidx")
    good = ip.read_bytes()
    for pos in (200, 300, len(good) - 40):  # tables, keys, records: crc32 not fixed
        bad = bytearray(good)
        bad[pos] ^= 0x10
        ip.write_bytes(bytes(bad))
        with pytest.raises(ChecksumError, match=f"{ip}: footer crc32"):
            tarindex.ShardReader(str(tar))
        ds = tarindex.ShardSet(str(tar))
        with pytest.raises(ChecksumError):
            ds.sample(0)
        # the documented opt-out for huge indexes skips the crc32 (the guards still apply)
        try:
            with tarindex.ShardReader(str(tar), check_crc=False) as r:
                r.sample(0)
        except TarIndexError:
            pass
    ip.write_bytes(good)
    assert _read(tar) == [{k: v for k, v in s.items()} for s in want]


def test_data_checksums_verify_and_read(tmp_path: Path) -> None:
    tar = tmp_path / "s.tar"
    _write(str(tar), 30, 0, size=5000)
    t = decode_index(Path(str(tar) + ".tidx").read_bytes())
    assert t.member_crc is not None and t.end > 0 and len(t.shard_id) == 16
    assert tarindex.read.verify.verify(str(tar), data=True).data_checked
    m = 2 * 11  # sample 11's bin, away from the first/last 4 KiB and the re-read headers
    raw = bytearray(tar.read_bytes())
    at = int(t.offset[m]) + 77
    raw[at] ^= 0xFF
    tar.write_bytes(bytes(raw))
    tarindex.ShardReader(str(tar)).close()  # an in-place data change is invisible at open
    with pytest.raises(ChecksumError, match=rf"1 member\(s\).*byte {int(t.offset[m])}: 0011\.bin"):
        tarindex.read.verify.verify(str(tar), data=True)
    assert tarindex.read.verify.verify(str(tar)).ok  # without --data: headers and tables only
    from tarindex.cli.main import main

    assert main(["verify", "--data", str(tar)]) == 1
    ss = tarindex.ShardSet(str(tar), options=tarindex.OpenOptions(verify_data=True))
    assert ss.sample(10)["__key__"] == "0010"
    for read in (
        lambda: ss.sample(11),
        lambda: ss.gather([3, 11]),
        lambda: ss.read_block(0, 8, 14),
        lambda: ss.reader(0).gather(np.array([11])),
    ):
        with pytest.raises(ChecksumError, match=f"byte {int(t.offset[m])}: member 0011.bin"):
            read()
    assert ss.read_block(0, 0, 11, ("bin",)).to_samples()[10]["__key__"] == "0010"
    assert ss.sample(11, ("cls",))["cls"] == b"11"  # the bad member is not read: no error


def test_verify_data_needs_checksums(tmp_path: Path) -> None:
    tar = tmp_path / "s.tar"
    _write(str(tar), 3, 0)
    ip = Path(str(tar) + ".tidx")
    t = decode_index(ip.read_bytes())
    t.member_crc = None
    ip.write_bytes(encode_index(t))
    with pytest.raises(ChecksumError, match="no data checksums"):
        tarindex.read.verify.verify(str(tar), data=True)
    with pytest.raises(tarindex.FormatError, match="--checksums"):
        tarindex.ShardReader(str(tar), verify_data=True)


def test_golden_v1_0_and_v1_1_read(tmp_path: Path) -> None:
    for v in ("v1", "v1.1"):
        tar = GOLDEN / v / "tiny.tar"
        with tarindex.ShardReader(str(tar)) as r:
            assert r.n_samples == 6
            assert r.index.meta["producer"] == "tarindex.writer"
    t10 = decode_index((GOLDEN / "v1" / "tiny.tar.tidx").read_bytes())
    t11 = decode_index((GOLDEN / "v1.1" / "tiny.tar.tidx").read_bytes())
    assert t10.end == -1 and t10.member_crc is None  # 1.0: no records
    assert t11.end > 0 and t11.member_crc is not None and len(t11.shard_id) == 16
    assert tarindex.read.verify.verify(str(GOLDEN / "v1.1" / "tiny.tar"), data=True).ok


def test_unknown_record_is_skipped(tmp_path: Path) -> None:
    src = GOLDEN / "v1.1"
    for f in ("tiny.tar", "tiny.tar.tidx"):
        shutil.copy(src / f, tmp_path / f)
    ip = tmp_path / "tiny.tar.tidx"
    buf = bytearray(ip.read_bytes())
    body = b"a record from a later minor version"
    rec = RECORD.pack(b"ZZZZ", 0, len(body)) + body + bytes(-len(body) % 8)
    buf[-FOOTER.size : -FOOTER.size] = rec  # before the footer, then a valid crc32
    out = bytes(buf[: -FOOTER.size])
    ip.write_bytes(out + struct.pack("<I4s", zlib.crc32(out), b"TIDX"))
    assert _read(tmp_path / "tiny.tar") == _read(src / "tiny.tar")
    # a record that runs past the footer is refused
    bad = bytearray(out)
    at = len(out) - len(rec)
    bad[at + 8 : at + 16] = struct.pack("<Q", 1 << 20)
    ip.write_bytes(bytes(bad) + struct.pack("<I4s", zlib.crc32(bytes(bad)), b"TIDX"))
    with pytest.raises(tarindex.FormatError, match="runs past the footer"):
        tarindex.ShardReader(str(tmp_path / "tiny.tar"))


def test_maxsize_bounds_the_file(tmp_path: Path) -> None:
    pattern = str(tmp_path / "s-%03d.tar")
    rng = np.random.default_rng(0)
    with tarindex.ShardWriter(pattern, maxsize=60_000, mtime=0) as w:
        for i in range(40):
            w.write({"__key__": f"{i:04d}", "bin": rng.bytes(int(rng.integers(1, 9000)))})
        w.write({"__key__": "big", "bin": bytes(100_000)})  # larger than maxsize: alone
        w.write({"__key__": "after", "bin": b"x"})
    sizes = {p: os.path.getsize(p) for p in w.paths}
    big = [p for p in w.paths if "big" in [s["__key__"] for s in _read(Path(p))]]
    assert len(big) == 1 and len(_read(Path(big[0]))) == 1
    assert all(v <= 60_000 for p, v in sizes.items() if p not in big)
    assert sum(len(_read(Path(p))) for p in w.paths) == 42


def test_seed_makes_shards_reproducible(tmp_path: Path) -> None:
    a = _write(str(tmp_path / "a.tar"), 5, 0, seed=7)
    b = _write(str(tmp_path / "b.tar"), 5, 0, seed=7)
    assert a == b
    assert (tmp_path / "a.tar").read_bytes() == (tmp_path / "b.tar").read_bytes()
    _write(str(tmp_path / "c.tar"), 5, 0)  # random ids: two runs differ in the first block
    _write(str(tmp_path / "d.tar"), 5, 0)
    assert (tmp_path / "c.tar").read_bytes()[:1024] != (tmp_path / "d.tar").read_bytes()[:1024]


_KILLED_WRITER = textwrap.dedent(
    """
    import os, signal, sys
    import numpy as np
    import tarindex

    pattern, seed, kill_at = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    calls = [0]
    real_replace, real_unlink = os.replace, os.unlink

    def step():
        calls[0] += 1
        if calls[0] == kill_at:
            os.kill(os.getpid(), signal.SIGKILL)  # a real kill -9, at this step

    def replace(*a, **k):
        step()
        real_replace(*a, **k)
        step()

    def unlink(*a, **k):
        step()
        real_unlink(*a, **k)

    os.replace, os.unlink = replace, unlink
    rng = np.random.default_rng(seed)
    with tarindex.ShardWriter(pattern, maxcount=5, mtime=0) as w:
        for i in range(10):
            w.write({"__key__": f"{i:04d}", "bin": rng.integers(0, 256, 1000, np.uint8).tobytes()})
    print("finished")
    """
)


def test_writer_killed_at_every_step_never_leaves_a_wrong_pair(tmp_path: Path) -> None:
    script = tmp_path / "w.py"
    script.write_text(_KILLED_WRITER)
    env = {**os.environ, "PYTHONPATH": ROOT}
    pattern = str(tmp_path / "out" / "s-%02d.tar")
    old = _write(pattern, 10, 1, maxcount=5)  # an earlier run, different bytes
    new_rng = np.random.default_rng(2)
    new = [new_rng.integers(0, 256, 1000, np.uint8).tobytes() for _ in range(10)]
    kill_at = 1
    while True:
        _write(pattern, 10, 1, maxcount=5)  # start each try from the earlier run's shards
        p = subprocess.run(
            [sys.executable, str(script), pattern, "2", str(kill_at)],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        finished = "finished" in p.stdout
        assert finished or p.returncode == -signal.SIGKILL, p.stderr[-2000:]
        for s in range(2):
            tar = Path(pattern % s)
            try:
                got = _read(tar)
            except (IndexMissingError, StaleIndexError, FileNotFoundError):
                continue  # refused, clearly: never served
            bins = [x["bin"] for x in got]
            assert bins in (
                [x["bin"] for x in old[5 * s : 5 * s + 5]],
                new[5 * s : 5 * s + 5],
            ), f"kill at step {kill_at}: shard {s} serves bytes of neither run"
        if finished:
            break
        kill_at += 1
    assert kill_at > 6  # every step of both shards was tried


_HOLDER = textwrap.dedent(
    """
    import sys
    import tarindex

    w = tarindex.ShardWriter(sys.argv[1], mtime=0)
    w.write({"__key__": "a", "bin": b"x"})
    print("holding", flush=True)
    sys.stdin.readline()
    w.close()
    """
)


def test_a_second_writer_on_one_pattern_is_refused(tmp_path: Path) -> None:
    pattern = str(tmp_path / "s-%03d.tar")
    script = tmp_path / "hold.py"
    script.write_text(_HOLDER)
    env = {**os.environ, "PYTHONPATH": ROOT}
    holder = subprocess.Popen(
        [sys.executable, str(script), pattern],
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "holding"
        w = tarindex.ShardWriter(pattern)
        with pytest.raises(WriterError, match=rf"another ShardWriter \(pid {holder.pid}\)"):
            w.write({"__key__": "b", "bin": b"y"})
        w.abort()
    finally:
        assert holder.stdin is not None
        holder.stdin.write("\n")
        holder.stdin.flush()
        assert holder.wait(timeout=60) == 0
    # released: a new writer may write, and no lock file is left behind
    _write(pattern, 2, 0)
    time.sleep(0)
    assert sorted(os.listdir(tmp_path)) == ["hold.py", "s-000.tar", "s-000.tar.tidx"]


def _keys(batch: list[dict[str, Any]]) -> list[str]:
    return [s["__key__"] for s in batch]


def test_a_dataloader_worker_reading_a_cut_shard_names_it(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    tar = tmp_path / "s.tar"
    _write(str(tar), 400, 0, size=3000)
    ds = tarindex.TarDataset(str(tar))
    loader = torch.utils.data.DataLoader(ds, batch_size=8, num_workers=2, collate_fn=_keys)
    it = iter(loader)
    next(it)  # both workers have the shard open (mapped) by now
    time.sleep(1.0)  # and are idle, their prefetched batches done: the cut falls between reads
    os.truncate(tar, 4096)
    with pytest.raises((tarindex.errors.TruncatedError, StaleIndexError), match=str(tar)):
        for _ in it:
            pass


def _gnu_tar(tmp_path: Path, sizes: list[int]) -> Path:
    src = tmp_path / "src"
    src.mkdir()
    rng = np.random.default_rng(0)
    for i, n in enumerate(sizes):
        (src / f"{i:04d}.bin").write_bytes(rng.integers(1, 256, n, np.uint8).tobytes())
        (src / f"{i:04d}.cls").write_bytes(str(i).encode())
    tar = tmp_path / "gnu.tar"
    subprocess.run(
        ["tar", "--sort=name", "--format=gnu", "-cf", str(tar), "-C", str(src), "."], check=True
    )
    return tar


def test_tar_r_on_a_gnu_tar_shard_is_detected(tmp_path: Path) -> None:
    if shutil.which("tar") is None:
        pytest.skip("GNU tar is not installed")
    tar = _gnu_tar(tmp_path, [100, 100])
    tarindex.build_index(str(tar))
    t = decode_index(Path(str(tar) + ".tidx").read_bytes())
    size = tar.stat().st_size
    assert 0 < t.end < size - 4096  # room in the record padding, away from the last 4 KiB
    (tmp_path / "9999.txt").write_bytes(b"appended")
    subprocess.run(["tar", "-rf", str(tar), "-C", str(tmp_path), "9999.txt"], check=True)
    assert tar.stat().st_size == size
    with pytest.raises(StaleIndexError, match=f"byte {t.end}: data after the end"):
        tarindex.ShardReader(str(tar))


def test_index_checksums_for_an_existing_tar(tmp_path: Path) -> None:
    if shutil.which("tar") is None:
        pytest.skip("GNU tar is not installed")
    from tarindex.cli.main import main

    tar = _gnu_tar(tmp_path, [6000] * 8)
    assert main(["index", "--quiet", str(tar)]) == 0
    assert decode_index(Path(str(tar) + ".tidx").read_bytes()).member_crc is None
    assert main(["verify", "--data", str(tar)]) == 1  # no checksums recorded: says how
    assert main(["index", "--quiet", "--force", "--checksums", str(tar)]) == 0
    t = decode_index(Path(str(tar) + ".tidx").read_bytes())
    assert t.member_crc is not None
    assert main(["verify", "--data", str(tar)]) == 0
    raw = bytearray(tar.read_bytes())
    m = 6  # sample 3's bin: not a re-read header, not in the first or last 4 KiB
    raw[int(t.offset[m]) + 10] ^= 1
    tar.write_bytes(bytes(raw))
    with pytest.raises(ChecksumError, match=r"\./0003\.bin|0003\.bin"):
        tarindex.read.verify.verify(str(tar), data=True)
    with pytest.raises(ChecksumError, match="member 0003.bin"):
        tarindex.TarDataset(str(tar), options=tarindex.OpenOptions(verify_data=True))[3]


def test_verify_a_tar_indexed_without_end_blocks(tmp_path: Path) -> None:
    tar = tmp_path / "a.tar"
    _write(str(tar), 2, 0)
    end = decode_index(Path(str(tar) + ".tidx").read_bytes()).end
    cut = tmp_path / "cut.tar"
    cut.write_bytes(tar.read_bytes()[:end])  # a tool that omits the end-of-archive blocks
    with pytest.raises(tarindex.errors.TruncatedError):
        tarindex.build_index(str(cut))
    with pytest.warns(UserWarning):
        tarindex.build_index(str(cut), require_end=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # reported once, by the index build: not again by verify
        report = tarindex.read.verify.verify(str(cut))  # rescanned the way it was indexed
    assert report.ok and not report.require_end
    assert "indexed with --no-require-end, so a copy cut at a member boundary" in str(report)
    assert tarindex.read.verify.verify(str(tar)).require_end
    assert [s["__key__"] for s in _read(cut)] == ["0000", "0001"]


def test_verify_with_names_over_1_mib(tmp_path: Path) -> None:
    import io
    import tarfile

    tar = tmp_path / "big.tar"
    name = "d/" + "x" * (1 << 20)
    with tarfile.open(tar, "w", format=tarfile.PAX_FORMAT) as tf:
        for n, data in ((name + ".bin", b"abc"), ("k2.bin", b"zz")):
            ti = tarfile.TarInfo(n)
            ti.size = len(data)
            tf.addfile(ti, io.BytesIO(data))
    tarindex.build_index(str(tar))
    assert tarindex.read.verify.verify(str(tar)).long_names == 1
    with tarindex.ShardReader(str(tar)) as r:
        assert r.key(0) == name and r.sample(0)["bin"] == b"abc"
    # damage the cut name field of that member: the message stays short
    t = decode_index(Path(str(tar) + ".tidx").read_bytes())
    h = int(t.offset[0]) - 512
    raw = bytearray(tar.read_bytes())
    raw[h : h + 2] = b"e/"
    raw[h + 148 : h + 156] = b" " * 8
    raw[h + 148 : h + 156] = b"%06o\0 " % sum(raw[h : h + 512])
    tar.write_bytes(bytes(raw))
    with pytest.raises(TarIndexError) as e:
        tarindex.read.verify.verify(str(tar))
    assert len(str(e.value)) < 1000


_FULL = textwrap.dedent(
    """
    import os, resource, signal, sys
    import tarindex

    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # then write() fails with EFBIG
    resource.setrlimit(resource.RLIMIT_FSIZE, (200_000, 200_000))
    try:
        with tarindex.ShardWriter(sys.argv[1], maxcount=1000) as w:
            for i in range(100):
                w.write({"__key__": f"{i:04d}", "bin": os.urandom(10_000)})
    except OSError as e:
        print(e)
    """
)


@pytest.mark.skipif(sys.platform == "win32", reason="RLIMIT_FSIZE")
def test_a_full_disk_names_the_shard_and_leaves_nothing(tmp_path: Path) -> None:
    out = tmp_path / "out"
    p = subprocess.run(
        [sys.executable, "-c", _FULL, str(out / "s-%03d.tar")],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": ROOT},
        timeout=60,
    )
    assert f"{out}/s-000.tar: byte " in p.stdout and "writing the shard failed" in p.stdout, p
    assert os.listdir(out) == []  # the temp file is gone, no lock file left
