"""Writing from many machines: independent writer processes, one manifest, torch.distributed ranks."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import textwrap
from collections import Counter
from pathlib import Path

import pytest

import tarindex
from tarindex.errors import WriterError

SCALE = Path(__file__).parents[2] / "docs" / "SCALE.md"

TASK = textwrap.dedent(
    """
    import sys, tarindex
    out, task, n_tasks, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    with tarindex.ShardWriter(tarindex.write.partition.task_pattern(out, task), maxcount=37) as sink:
        for i in range(task, n, n_tasks):
            sink.write({"__key__": f"{i:06d}", "cls": i, "txt": f"task {task}"})
    """
)


def test_independent_writers_then_one_manifest(tmp_path: Path) -> None:
    out, n_tasks, n = tmp_path / "out", 4, 1000
    procs = [
        subprocess.Popen([sys.executable, "-c", TASK, str(out), str(t), str(n_tasks), str(n)])
        for t in range(n_tasks)
    ]  # all at once, into one directory
    assert [p.wait(timeout=120) for p in procs] == [0] * n_tasks
    names = sorted(os.listdir(out))
    assert not [x for x in names if not re.fullmatch(r"part-0000[0-3]-00000[0-6]\.tar(\.tidx)?", x)]
    m = str(out / "data.json")
    t = tarindex.write_manifest(str(out / "part-*.tar"), m)
    assert t.n_samples == n and t.n_shards == n_tasks * 7  # 250 samples per task, 37 a shard
    assert len(set(t.shard_id)) == t.n_shards  # random ids: no two shards share one
    ss = tarindex.ShardSet(m)
    keys = [ss.sample(i)["__key__"] for i in range(len(ss))]
    assert sorted(keys) == [f"{i:06d}" for i in range(n)]
    # sample order is fixed by the names (task, then shard), not by who finished first
    assert keys[:3] == ["000000", "000004", "000008"] and keys[250] == "000001"
    assert ss.sample(ss.index_of("000777"))["txt"] == b"task 1"


def test_one_pattern_one_writer(tmp_path: Path) -> None:
    pattern = tarindex.write.partition.task_pattern(str(tmp_path), 3)
    assert pattern == str(tmp_path / "part-00003-%06d.tar")
    with tarindex.ShardWriter(pattern, durable=False) as a:
        a.write({"__key__": "x", "cls": 1})
        with pytest.raises(WriterError, match="another ShardWriter"):  # a task started twice
            with tarindex.ShardWriter(pattern, durable=False) as b:
                b.write({"__key__": "y", "cls": 2})
    with pytest.raises(ValueError):
        tarindex.write.partition.task_pattern(str(tmp_path), -1)
    with pytest.raises(ValueError):
        tarindex.write.partition.task_pattern(str(tmp_path), 0, prefix="a%d")


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.dist
@pytest.mark.timeout(240)
def test_the_torch_distributed_example_under_gloo(tmp_path: Path) -> None:
    """docs/SCALE.md's example, as written, in 2 gloo ranks (one launch)."""
    pytest.importorskip("torch")
    code = re.search(
        r"From `torch.distributed` ranks.*?```python\n(.*?)```", SCALE.read_text(), re.S
    )
    assert code is not None, "docs/SCALE.md lost its torch.distributed example"
    script = tmp_path / "example.py"
    script.write_text(
        code.group(1)
        + "import json\n"
        + "json.dump({'seen': seen, 'len': len(ds)}, open(f'{out}/seen-{rank}.json', 'w'))\n"
    )
    out, ws, port = tmp_path / "dataset", 2, free_port()
    procs = []
    for r in range(ws):
        env = dict(
            os.environ,
            OUT=str(out),
            RANK=str(r),
            WORLD_SIZE=str(ws),
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(port),
            GLOO_SOCKET_IFNAME="lo",
        )
        procs.append(
            subprocess.Popen(
                [sys.executable, str(script)], env=env, stderr=subprocess.PIPE, text=True
            )
        )
    try:
        errs = [p.communicate(timeout=200)[1] for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait(5)
    assert [p.returncode for p in procs] == [0] * ws, "\n".join(e[-2000:] for e in errs)
    t = tarindex.read.sources.read_manifest(str(out / "data.json"))
    assert t.n_samples == 1000 and t.n_shards == 10  # 500 per rank in shards of 100
    assert [os.path.basename(p) for p in t.paths[:6:5]] == [
        "part-00000-000000.tar",
        "part-00001-000000.tar",
    ]
    seen = [json.loads((out / f"seen-{r}.json").read_text()) for r in range(ws)]
    assert [s["len"] for s in seen] == [500, 500] == [len(s["seen"]) for s in seen]
    c = Counter(i for s in seen for i in s["seen"])
    assert sorted(c) == list(range(1000)) and set(c.values()) == {1}  # exactly once


def test_a_forked_child_does_not_keep_a_killed_holders_lock(tmp_path: Path) -> None:
    """A writer killed with SIGKILL while a child it forked lives on (a ``write_shards`` worker
    under ``fork`` that has not exited yet): the flock dies with the writer, not with the child."""
    from tarindex.write.lock import PatternLock

    pattern = str(tmp_path / "s-%05d.tar")
    holder = textwrap.dedent(
        f"""
        import os, sys, time
        from tarindex.write.lock import PatternLock
        lock = PatternLock({pattern!r})
        child = os.fork()
        if child == 0:  # fork's after-child hook has dropped the lock's descriptor here
            os.write(1, b"child ready\\n")  # one write a line: print writes pieces unbuffered
            time.sleep(60)
            os._exit(0)
        os.write(1, f"pid {{child}}\\n".encode())
        time.sleep(60)
        """
    )
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")])}
    p = subprocess.Popen([sys.executable, "-c", holder], stdout=subprocess.PIPE, text=True, env=env)
    assert p.stdout is not None
    # the holder is killed only once the child has run (until it is scheduled after fork, the
    # child holds the inherited descriptor: under load the lock was then still held)
    lines = [p.stdout.readline().split(), p.stdout.readline().split()]
    assert ["child", "ready"] in lines, lines
    child = int(next(w[1] for w in lines if w[0] == "pid"))
    try:
        p.kill()
        p.wait(30)
        assert os.path.exists(tmp_path / ".s-_05d.tar.lock")  # SIGKILL: the file stays, unheld
        PatternLock(pattern).release()  # taken over at once: the child held no copy
    finally:
        os.kill(child, 9)
