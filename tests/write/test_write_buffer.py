"""The shard writer's 1 MiB write buffer: failures inside a flush, and bytes across its edges.

A shard's small samples gather in a buffer that goes to the file in one ``os.writev``
(tarindex/write/tar.py). A file size limit (real ``RLIMIT_FSIZE``, in a subprocess) reached in
the middle of such a flush must name the sample whose bytes hit it, not the first or last of
the buffer, and leave nothing behind; a writer whose flush failed takes no more bytes.
"""

from __future__ import annotations

import gzip
import io
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

import tarindex
from tarindex.write.tar import DIRECT_WRITE_BYTES, WRITE_BUFFER_BYTES

ROOT = str(Path(__file__).parents[2])
LIMIT = 600_000  # bytes; inside the first 1 MiB flush
PER_SAMPLE = 512 + 10_240  # header + 10_000 bytes of data padded to 512
FIRST = 1024  # the shard-id header

_LIMITED = """
import os, resource, signal, sys
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # write() fails with EFBIG instead
resource.setrlimit(resource.RLIMIT_FSIZE, ({limit}, {limit}))
import tarindex
from tarindex.write.tar import TarShardWriter
out = sys.argv[1]
{body}
print(sorted(os.listdir(out)))
"""


def _run(body: str, out: Path) -> list[str]:
    out.mkdir()
    code = _LIMITED.format(limit=LIMIT, body=body)
    r = subprocess.run(
        [sys.executable, "-c", code, str(out)],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": ROOT},
        timeout=60,
    )
    assert r.returncode == 0, r.stderr
    return r.stdout.splitlines()


@pytest.mark.skipif(sys.platform == "win32", reason="RLIMIT_FSIZE")
def test_a_size_limit_inside_a_buffered_flush_names_the_sample_and_keeps_nothing(
    tmp_path: Path,
) -> None:
    body = """
try:
    with tarindex.ShardWriter(os.path.join(out, "s-%03d.tar"), maxcount=1000) as sink:
        for i in range(200):
            sink.write({"__key__": f"{i:04d}", "bin": bytes([i]) * 10_000})
except OSError as e:
    print(e.errno, e)
"""
    out = tmp_path / "out"
    err, listing = _run(body, out)
    hit = (LIMIT - FIRST) // PER_SAMPLE  # the sample holding byte LIMIT: 55
    assert 0 < hit and FIRST + (hit + 2) * PER_SAMPLE < WRITE_BUFFER_BYTES  # mid-buffer
    assert err.startswith("27 "), err  # EFBIG
    assert (
        f"{out}/s-000.tar: byte {LIMIT}: writing the shard failed (sample '{hit:04d}'): "
        "File too large" in err
    ), err
    assert listing == "[]"  # no temp file, no index, no lock


@pytest.mark.skipif(sys.platform == "win32", reason="RLIMIT_FSIZE")
def test_a_writer_whose_flush_failed_takes_no_more_bytes(tmp_path: Path) -> None:
    body = """
w = TarShardWriter(os.path.join(out, "s.tar"), 0)
i = 0
try:
    while True:
        w.write(f"{i:04d}", [("bin", bytes(10_000))])
        i += 1
except OSError as e:
    print(e)
size = os.path.getsize(w.tmp)
for key, n in [("late", 200_000), ("later", 100)]:  # a direct write, a buffered one
    try:
        w.write(key, [("bin", bytes(n))])
    except OSError as e:
        print(e)
print(os.path.getsize(w.tmp) == size)
try:
    w.close()
except OSError as e:
    print(e)
"""
    out = tmp_path / "out"
    first, late, later, same_size, closed, listing = _run(body, out)
    assert f"s.tar: byte {LIMIT}: writing the shard failed (sample '0055')" in first, first
    assert late == later == first  # the same error again, nothing written after the gap
    assert same_size == "True"
    assert closed == first  # close() says the same, and removes the temp file
    assert listing == "[]"


@pytest.mark.parametrize("name", ["s-%03d.tar", "s-%03d.tar.gz"])
def test_small_and_large_samples_across_flushes_round_trip(tmp_path: Path, name: str) -> None:
    sizes = [0, 1, 511, 513, DIRECT_WRITE_BYTES - 1024, DIRECT_WRITE_BYTES, 300_000, 70_000]
    sizes = sizes * 6 + [10_000] * 150  # several 1 MiB flushes, direct writes between them
    samples = [{"__key__": f"{i:04d}", "bin": os.urandom(n), "cls": i} for i, n in enumerate(sizes)]
    with tarindex.ShardWriter(str(tmp_path / name), maxcount=100, mtime=0) as sink:
        for s in samples:
            sink.write(s)
    assert len(sink.paths) == 2
    got: dict[str, bytes] = {}
    for p in sink.paths:
        raw = Path(p).read_bytes()
        with tarfile.open(
            fileobj=io.BytesIO(gzip.decompress(raw) if p.endswith("gz") else raw)
        ) as t:
            for m in t.getmembers():
                f = t.extractfile(m)
                if f is not None:
                    got[m.name] = f.read()
    want = {f"{s['__key__']}.bin": s["bin"] for s in samples}
    assert {k: v for k, v in got.items() if k.endswith(".bin")} == want
    if name.endswith(".tar"):  # and through the index
        ds = tarindex.ShardSet(str(tmp_path / "s-{000..001}.tar"))
        assert [ds.sample(i)["bin"] for i in range(len(ds))] == [s["bin"] for s in samples]
