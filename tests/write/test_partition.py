"""write_partition: engine tasks write partitions, the driver makes the manifest from rows."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import tarindex
from tarindex.errors import WriterError
from tarindex.format.manifest import ManifestRow, decode_manifest
from tarindex.read.manifest import prune, write_manifest_rows
from tarindex.write.partition import ShardRow, attempt_dir, commit, write_partition


def sample(i: int) -> dict[str, Any]:
    rng = np.random.default_rng(i)
    return {
        "__key__": f"{i:07d}",
        "bin": rng.integers(0, 256, int(rng.integers(0, 2000)), dtype=np.uint8).tobytes(),
        "cls": i % 7,
    }


# partition k holds these global sample numbers: 2 is empty, 3 has a single sample
PARTS = [range(0, 23), range(23, 40), range(40, 40), range(40, 41), range(41, 60)]


def expect_all(manifest: str, n: int) -> None:
    """Every sample 0..n-1 exactly once, in partition order, bytes as written, via TarDataset."""
    pytest.importorskip("torch")
    ds = tarindex.TarDataset(manifest)
    assert len(ds) == n
    for i in range(n):
        got, want = ds[i], sample(i)
        assert got["__key__"] == want["__key__"]
        assert got["bin"] == want["bin"] and got["cls"] == str(want["cls"]).encode()


def test_partitions_to_manifest_from_rows_only(tmp_path: Path) -> None:
    out = str(tmp_path / "out")
    rows: list[ShardRow] = []
    for k, part in enumerate(PARTS):
        got = write_partition((sample(i) for i in part), out, k, maxcount=8, durable=False)
        assert [r.shard for r in got] == list(range(len(got)))
        assert sum(r.samples for r in got) == len(part)
        assert {r.partition for r in got} <= {k}
        rows += got
    assert not [r for r in rows if r.partition == 2]  # an empty partition writes nothing
    assert len([d for d in os.listdir(out) if d.startswith("attempt-00002")]) == 0
    names = [os.path.relpath(r.path, out) for r in rows]
    assert names[0] == f"attempt-00000-{rows[0].attempt}/part-00000-000000.tar"
    m = str(tmp_path / "out" / "data.json")
    t = write_manifest_rows(rows[::-1], m)  # any arrival order: committed in partition order
    assert t.n_samples == 60 and t.n_shards == 3 + 3 + 1 + 3
    expect_all(m, 60)
    # the rows are what a reader of each shard sees: same table as opening every shard
    again = tarindex.write_manifest([r.path for r in commit(rows)], str(tmp_path / "open.json"))
    for c in ("samples", "members", "tar_bytes", "index_bytes", "head_crc", "tail_crc"):
        assert getattr(t, c).tolist() == getattr(again, c).tolist(), c
    assert t.shard_id == again.shard_id and t.paths == [os.path.relpath(p, out) for p in
                                                        [r.path for r in commit(rows)]]
    assert t.meta["producer"] == "tarindex.write_manifest_rows"
    assert prune(out, m) == []  # nothing left over
    # ShardWriter's own rows make a manifest too (ManifestRow: order as given)
    with tarindex.ShardWriter(str(tmp_path / "w" / "s-%03d.tar"), maxcount=5) as w:
        for i in range(12):
            w.write(sample(i))
    assert [r.samples for r in w.rows] == [5, 5, 2] and all(isinstance(r, ManifestRow) for r in w.rows)
    t2 = write_manifest_rows(w.rows, str(tmp_path / "w" / "w.json"))
    assert t2.paths == ["s-000.tar", "s-001.tar", "s-002.tar"]
    expect_all(str(tmp_path / "w" / "w.json"), 12)


def test_failed_attempt_leaves_nothing_and_retry_writes_once(tmp_path: Path) -> None:
    out = str(tmp_path / "out")

    def boom(j: int, i: int) -> dict[str, Any]:
        if j == 13:
            raise RuntimeError("executor lost")
        return sample(i)

    with pytest.raises(RuntimeError, match="executor lost"):  # shard 0 was finished: removed
        write_partition(PARTS[0], out, 0, attempt="t1-0", maxcount=8, to_sample=boom)
    assert not os.path.exists(attempt_dir(out, 0, "t1-0"))
    rows = write_partition(PARTS[0], out, 0, attempt="t1-1", maxcount=8,
                           to_sample=lambda j, i: sample(i))
    rows += write_partition((sample(i) for i in PARTS[1]), out, 1, maxcount=8)
    m = os.path.join(out, "data.json")
    write_manifest_rows(rows, m)
    expect_all(m, 40)


KILLED = textwrap.dedent(
    """
    import sys, time, tarindex
    from tarindex.write.partition import write_partition
    def slow():
        for i in range(10**6):
            if i == 20:
                print("shard0", flush=True)
            if i >= 20:
                time.sleep(0.01)
            yield {"__key__": f"{i:07d}", "cls": i}
    write_partition(slow(), sys.argv[1], 0, attempt="killed", maxcount=8)
    """
)


def test_killed_and_speculative_attempts_are_pruned(tmp_path: Path) -> None:
    out = str(tmp_path / "out")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    p = subprocess.Popen([sys.executable, "-c", KILLED, out], stdout=subprocess.PIPE, env=env)
    assert p.stdout is not None and p.stdout.readline() == b"shard0\n"
    time.sleep(0.05)
    p.send_signal(signal.SIGKILL)  # a lost executor: no cleanup runs
    p.wait(timeout=30)
    killed = attempt_dir(out, 0, "killed")
    left_by_kill = sorted(os.path.join(killed, f) for f in os.listdir(killed))
    assert any(f.endswith(".tmp") for f in left_by_kill) and len(left_by_kill) >= 3
    # the retry, and a speculative duplicate of partition 1 that also finished
    a = write_partition((sample(i) for i in PARTS[0]), out, 0, attempt="r1", maxcount=8)
    b1 = write_partition((sample(i) for i in PARTS[1]), out, 1, attempt="s1", maxcount=8)
    b2 = write_partition((sample(i) for i in PARTS[1]), out, 1, attempt="s2", maxcount=8)
    m = os.path.join(out, "data.json")
    t = write_manifest_rows(b1 + a + b2, m)  # both duplicates' rows arrived: one is kept
    assert t.n_samples == 40 and all("attempt-00001-s1/" in x for x in t.paths[3:])
    expect_all(m, 40)
    s2 = [r.path for r in b2] + [r.path + ".tidx" for r in b2]
    leftovers = sorted(left_by_kill + s2)
    assert prune(out, m, dry_run=True) == leftovers
    cli = subprocess.run([sys.executable, "-m", "tarindex", "manifest", "--prune", "--dry-run", m],
                         env=env, capture_output=True, text=True, timeout=60)
    assert cli.returncode == 0, cli.stderr
    assert cli.stdout.splitlines() == [*leftovers, f"{m}: {len(leftovers)} leftover file(s) found"]
    assert all(os.path.exists(x) for x in leftovers)
    assert prune(out, m) == leftovers
    assert not os.path.exists(killed) and not os.path.exists(attempt_dir(out, 1, "s2"))
    assert prune(out, m) == []
    expect_all(m, 40)  # the committed shards are untouched
    assert tarindex.read.manifest.check_manifest(m) == []


def test_commit_refuses_an_attempt_with_missing_rows(tmp_path: Path) -> None:
    rows = write_partition((sample(i) for i in range(20)), str(tmp_path), 0, maxcount=8)
    assert len(rows) == 3
    with pytest.raises(WriterError, match=r"partition 0, attempt .*shards \[0, 2\]"):
        commit([rows[0], rows[2]])
    with pytest.raises(WriterError, match="expected 0..3"):
        commit([*rows, rows[1]])
    assert commit(rows[::-1]) == rows


def test_options_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="seed"):
        write_partition([sample(0)], str(tmp_path), 0, seed=1)
    with pytest.raises(ValueError, match="attempt"):
        write_partition([sample(0)], str(tmp_path), 0, attempt="a/b")
    with pytest.raises(ValueError, match="partition"):
        write_partition([sample(0)], str(tmp_path), -1)
    with pytest.raises(WriterError, match="item 0 of the partition: got a tuple"):
        write_partition([(1, 2)], str(tmp_path), 0)
    with pytest.raises(ValueError, match=r"\.json"):
        write_manifest_rows([], str(tmp_path / "m.txt"))
    assert os.listdir(tmp_path) == []  # nothing left by the failures


def test_100k_rows_make_a_manifest(tmp_path: Path) -> None:
    # its speed (< 2 s) is a figure of benchmarks/bench_engines.py, not a timed assertion here
    out = str(tmp_path / "big")
    rows = [
        ShardRow(k // 10, f"a{k // 10}", k % 10,
                 f"{out}/attempt-{k // 10:05d}-a{k // 10}/part-{k // 10:05d}-{k % 10:06d}.tar",
                 1000, 3000, 10_240_000, 70_000, k, k ^ 0xFFFF, f"{k:032x}")
        for k in range(100_000)
    ]
    t = write_manifest_rows(rows, f"{out}/data.json")
    assert t.n_shards == 100_000 and t.n_samples == 100_000_000
    back = decode_manifest(open(f"{out}/data.json", "rb").read())
    assert back.paths[12_345] == "attempt-01234-a1234/part-01234-000005.tar"
    assert int(back.head_crc[99_999]) == 99_999


def test_scale_md_engine_example_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import re

    doc = (Path(__file__).parents[2] / "docs" / "SCALE.md").read_text()
    code = re.search(r"## Engines: .*?```python\n(.*?)```", doc, re.S)
    assert code is not None, "docs/SCALE.md lost its write_partition example"
    monkeypatch.chdir(tmp_path)
    exec(compile(code.group(1), "SCALE.md", "exec"), {})
    assert len(tarindex.ShardSet("out/data.json")) == 300
