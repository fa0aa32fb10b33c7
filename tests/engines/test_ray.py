"""tarindex.ray on a real local Ray cluster (ray.init(num_cpus=2)): read tasks, write, manifest."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import tarindex
from tarindex.read.manifest import prune, write_manifest

ray = pytest.importorskip("ray", reason="ray is not installed (pip install -e '.[test]')")
pytest.importorskip("ray.data", reason="ray[data] is not installed (pip install -e '.[test]')")

import tarindex.ray  # noqa: E402

from ..remote_server import serve  # noqa: E402


@pytest.fixture(scope="module")
def cluster() -> Iterator[None]:
    try:
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    except Exception as e:  # no room for its processes, a port it cannot bind
        pytest.skip(f"Ray cannot start here ({type(e).__name__}: {e})")
    ctx = ray.data.DataContext.get_current()
    ctx.enable_progress_bars = False
    yield
    ray.shutdown()


def payload(i: int) -> bytes:
    return np.random.default_rng(i).integers(0, 256, 20 + (i * 37) % 900, dtype=np.uint8).tobytes()


def sample(i: int) -> dict[str, Any]:
    s: dict[str, Any] = {"__key__": f"{i:06d}", "bin": payload(i), "cls": i % 10}
    if i % 3:
        s["json"] = {"i": i}  # a third of the samples have no json member: nulls
    return s


def shards(root: Path, n: int, maxcount: int, pad: int = 0) -> str:
    """``n`` samples in shards of ``maxcount`` (``bin`` ``pad`` bytes longer), and their manifest."""
    with tarindex.ShardWriter(str(root / "in-%06d.tar"), maxcount=maxcount, durable=False) as w:
        for i in range(n):
            s = sample(i)
            s["bin"] += bytes(pad)
            w.write(s)
    write_manifest(str(root / "in-*.tar"), str(root / "data.json"))
    return str(root / "data.json")


def same_as_shards(rows: list[dict[str, Any]], manifest: str) -> None:
    """Every sample exactly once, byte for byte as TarDataset reads it."""
    ref = tarindex.ShardSet(manifest)
    assert sorted(r["__index__"] for r in rows) == list(range(len(ref)))
    for r in rows:
        s = ref.sample(r["__index__"])
        assert r["__key__"] == s["__key__"]
        assert r["bin"] == s["bin"] and r["cls"] == int(s["cls"])
        assert r["json"] == s.get("json")


def test_round_trip_byte_exact(cluster: None, tmp_path: Path) -> None:
    src = shards(tmp_path, 3000, 800)  # 4 shards
    ds = tarindex.ray.read(src, block_rows=256, parallelism=12)
    assert ds.schema().names == ["__key__", "__index__", "bin", "cls", "json"]
    same_as_shards(ds.take_all(), src)
    out = tmp_path / "out"
    t = tarindex.ray.write(ds, str(out), maxcount=300, durable=False)
    assert t.n_samples == 3000 and all(p.startswith("attempt-") for p in t.paths)
    pytest.importorskip("torch")
    back = tarindex.TarDataset(str(out / "data.json"))
    got = {back[j]["__key__"]: back[j] for j in range(len(back))}
    assert sorted(got) == [f"{i:06d}" for i in range(3000)]
    want = tarindex.TarDataset(src)
    for i in range(3000):
        a, b = got[f"{i:06d}"], want[i]
        assert {k: v for k, v in a.items() if not k.startswith("__")} == {
            k: v for k, v in b.items() if not k.startswith("__")
        }
    assert prune(str(out), str(out / "data.json")) == []


def test_read_tasks_are_sample_ranges_not_shards(cluster: None, tmp_path: Path) -> None:
    src = shards(tmp_path, 4000, 1000)  # 4 shards
    # Ray's default request (200) over 4000 small samples: one task of ~128 MiB would do
    assert len(tarindex.ray.TarIndexDatasource(src, block_rows=100).get_read_tasks(200)) == 1
    source = tarindex.ray.TarIndexDatasource(src, block_rows=100, task_rows=100)
    tasks = source.get_read_tasks(32)
    assert len(tasks) == 32  # not capped at 4
    assert [t.metadata.num_rows for t in tasks] == [125] * 32
    assert all(len(t.metadata.input_files or ()) == 1 for t in tasks)  # 1000/125: aligned
    tasks = source.get_read_tasks(30)  # ranges that straddle shard ends
    assert sum(t.metadata.num_rows or 0 for t in tasks) == 4000
    assert any(len(t.metadata.input_files or ()) == 2 for t in tasks)
    ds = tarindex.ray.read(src, block_rows=100, parallelism=30)
    # blocks are contiguous ranges of the global order, and every sample comes once
    spans = ds.map_batches(
        lambda b: {"lo": [int(b["__index__"].min())], "hi": [int(b["__index__"].max())],
                   "n": [len(b["__index__"])]},
        batch_size=None,
    ).take_all()
    assert len(spans) >= 30 and all(r["hi"] - r["lo"] + 1 == r["n"] for r in spans)
    assert sorted((r["lo"], r["hi"]) for r in spans)[-1][1] == 3999
    assert sum(r["n"] for r in spans) == 4000
    assert sorted(ds.to_pandas()["__index__"].tolist()) == list(range(4000))


def test_default_blocks_hold_a_thousand_rows(cluster: None, tmp_path: Path) -> None:
    src = shards(tmp_path, 5000, 700)
    ds = tarindex.ray.read(src)  # Ray's own parallelism: it would cut 200 blocks if asked
    sizes = ds.map_batches(lambda b: {"n": [len(b["__key__"])]}, batch_size=None).take_all()
    assert sum(r["n"] for r in sizes) == 5000
    assert min(r["n"] for r in sizes) >= 1000, sizes  # not one table per sample


def test_count_reads_no_data(cluster: None, tmp_path: Path) -> None:
    src = shards(tmp_path, 2000, 500)
    ds = tarindex.ray.read(src, block_rows=100, parallelism=8)
    for p in tmp_path.glob("in-*.tar"):
        os.unlink(p)  # a read would fail now: count() must come from the tasks' metadata
    assert ds.count() == 2000


def test_fields_cls_reads_no_payload_bytes(cluster: None, tmp_path: Path) -> None:
    """Over a real HTTP server: no byte of a ``bin`` or ``json`` member is ever sent."""
    shards(tmp_path, 2000, 500, pad=2048)  # gaps between cls members > COALESCE_GAP
    payload_ranges = []
    for p in sorted(tmp_path.glob("in-*.tar")):
        with tarindex.ShardReader(str(p)) as r:
            blk = r.read_block(0, r.n_samples, ("bin", "json"), data=False)
            payload_ranges += [
                (p.name, int(o), int(o) + int(s)) for o, s in zip(blk.tar_offset, blk.size, strict=True)
            ]
    total = sum(b - a for _, a, b in payload_ranges)
    assert total > 800_000
    with serve(str(tmp_path)) as srv:
        urls = [f"{srv.url}/{p.name}" for p in sorted(tmp_path.glob("in-*.tar"))]
        write_manifest(urls, str(tmp_path / "remote.json"))
        srv.reset()
        opts = tarindex.RemoteOptions(readahead_bytes=0)
        ds = tarindex.ray.read(str(tmp_path / "remote.json"), fields=("cls",), remote=opts,
                               block_rows=250, parallelism=8)
        rows = ds.take_all()
        log = list(srv.log)
        sent = srv.bytes_for(".tar")
    assert sorted(r["__index__"] for r in rows) == list(range(2000))
    assert all(r["cls"] == r["__index__"] % 10 and set(r) == {"__key__", "__index__", "cls"} for r in rows)
    tar_gets = [
        (path.rsplit("/", 1)[-1], a, b) for m, path, a, b in log if m == "GET" and path.endswith(".tar")
    ]
    assert tar_gets, "no tar byte was read at all"
    sizes = {p.name: p.stat().st_size for p in tmp_path.glob("in-*.tar")}
    for name, a, b in tar_gets:  # [a, b): the bytes sent
        if b <= 4096 or a >= sizes[name] - 16384:
            continue  # the open-time checks: first and last 4 KiB, the end (FORMAT.md §3)
        hit = [x for x in payload_ranges if x[0] == name and x[1] < b and a < x[2]]
        assert not hit, f"GET {name} bytes {a}-{b} overlaps payload members {hit[:3]}"
    assert sent < total / 20  # cls members, headers between them, the open-time checks


def test_write_empty_blocks_and_a_retried_task(cluster: None, tmp_path: Path) -> None:
    marker = tmp_path / "failed-once"

    def to_sample(j: int, row: dict[str, Any]) -> dict[str, Any]:
        i = int(row["id"])
        if i == 1500 and not marker.exists():
            marker.write_text("x")  # the first attempt of this task dies mid-way
            raise RuntimeError("lost worker")
        return {"__key__": f"{i:06d}", "bin": payload(i), "cls": i % 10}

    ds = ray.data.range(3000, override_num_blocks=6).filter(
        lambda r: not (500 <= r["id"] < 1000 or 2000 <= r["id"] < 2500)
    )
    out = tmp_path / "out"
    t = tarindex.ray.write(ds, str(out), maxcount=200, to_sample=to_sample, durable=False,
                           ray_remote_args={"max_retries": 2, "retry_exceptions": True})
    assert marker.exists()
    want = [i for i in range(3000) if not (500 <= i < 1000 or 2000 <= i < 2500)]
    assert t.n_samples == len(want)
    ss = tarindex.ShardSet(str(out / "data.json"))
    keys = [ss.sample(j)["__key__"] for j in range(len(ss))]
    assert sorted(keys) == [f"{i:06d}" for i in want]  # every row exactly once
    assert all(ss.sample(j)["bin"] == payload(int(k)) for j, k in enumerate(keys))
    # the failed attempt removed its own files; nothing is left for prune
    assert prune(str(out), str(out / "data.json")) == []


def test_a_write_task_killed_mid_write_is_superseded(cluster: None, tmp_path: Path) -> None:
    """A write task's worker is killed (``kill -9``) after two of its shards are closed and
    while a third is being written; Ray runs the task again. The manifest lists only the
    retry's shards, every row once, byte for byte, and prune lists and deletes exactly the
    killed attempt's files (its closed shards, their indexes, the cut temp file)."""
    import signal
    import threading
    import time

    marks = tmp_path / "marks"
    marks.mkdir()

    def to_sample(j: int, row: dict[str, Any]) -> dict[str, Any]:
        i = int(row["id"])
        if i == 1250 and not (marks / "killed").exists():  # 250 rows in: 2 shards closed
            (marks / "pid").write_text(str(os.getpid()))
            time.sleep(300)  # until the test kills this worker
        return {"__key__": f"{i:06d}", "bin": payload(i), "cls": i % 10}

    def killer() -> None:
        deadline = time.monotonic() + 240
        while not (marks / "pid").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        if (marks / "pid").exists():
            (marks / "killed").write_text("x")
            os.kill(int((marks / "pid").read_text()), signal.SIGKILL)

    out = tmp_path / "out"
    th = threading.Thread(target=killer, daemon=True)
    th.start()
    t = tarindex.ray.write(ray.data.range(3000, override_num_blocks=3), str(out), maxcount=100,
                           to_sample=to_sample, durable=False, ray_remote_args={"max_retries": 2})
    th.join(5)
    assert (marks / "killed").exists()
    assert t.n_samples == 3000
    committed = {os.path.basename(os.path.dirname(p)) for p in t.paths}
    dirs = {p.name for p in out.glob("attempt-*")}
    left = dirs - committed
    assert len(committed) == 3 and len(left) == 1  # the killed attempt's directory
    (dead,) = left
    assert dead.startswith("attempt-00001-")  # the task that was killed
    dead_files = sorted(str(p) for p in (out / dead).iterdir())
    assert sum(f.endswith(".tar") for f in dead_files) >= 2  # it had closed two shards
    ss = tarindex.ShardSet(str(out / "data.json"))
    keys = [ss.sample(j)["__key__"] for j in range(len(ss))]
    assert sorted(keys) == [f"{i:06d}" for i in range(3000)]  # every row exactly once
    assert all(ss.sample(j)["bin"] == payload(int(k)) for j, k in enumerate(keys))
    listed = prune(str(out), str(out / "data.json"), dry_run=True)
    assert listed == dead_files  # the leftovers are the killed attempt's files, all of them
    assert prune(str(out), str(out / "data.json")) == dead_files
    assert not (out / dead).exists() and {p.name for p in out.glob("attempt-*")} == committed
    assert len(tarindex.ShardSet(str(out / "data.json"))) == 3000


def test_a_write_that_fails_writes_no_manifest(cluster: None, tmp_path: Path) -> None:
    def bad(j: int, row: dict[str, Any]) -> Any:
        if int(row["id"]) == 150:
            raise RuntimeError("bad row")
        return {"__key__": f"{int(row['id']):06d}", "cls": 1}

    out = tmp_path / "out"
    with pytest.raises(Exception, match="bad row"):
        tarindex.ray.write(ray.data.range(400, override_num_blocks=4), str(out), maxcount=10,
                           to_sample=bad)
    assert not (out / "data.json").exists()
    assert not any(p.name.startswith("attempt-") for p in out.glob("*"))  # on_write_failed


def test_scale_md_ray_example_runs(cluster: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import re

    doc = (Path(__file__).parents[2] / "docs" / "SCALE.md").read_text()
    code = re.search(r"### Ray.*?```python\n(.*?)```", doc, re.S)
    assert code is not None, "docs/SCALE.md lost its Ray example"
    monkeypatch.chdir(tmp_path)
    exec(compile(code.group(1), "SCALE.md", "exec"), {})  # ray.init: already running
    assert (tmp_path / "ray-out" / "data.json").exists()
