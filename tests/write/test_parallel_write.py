"""write_shards: several real worker processes, one deterministic dataset, failures reported."""

from __future__ import annotations

import functools
import multiprocessing
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import tarindex
from tarindex.codecs.encode import encode_value
from tarindex.write.parallel import write_shards

pytestmark = pytest.mark.timeout(120)


def make_item(i: int) -> tuple[np.ndarray[Any, Any], int]:
    """A torchvision-like item: (uint8 image, label)."""
    rng = np.random.default_rng(i)
    return rng.integers(0, 256, (8, 8), dtype=np.uint8), i % 10


class Items:
    """A map-style dataset of (image, label) tuples, picklable (module-level class)."""

    def __init__(self, n: int, poison: int = -1, kill: int = -1) -> None:
        self.n, self.poison, self.kill = n, poison, kill

    def __len__(self) -> int:
        return self.n

    def __iter__(self) -> Iterator[tuple[np.ndarray[Any, Any], int]]:
        return (self[i] for i in range(self.n))

    def __getitem__(self, i: int) -> tuple[np.ndarray[Any, Any], int]:
        if not 0 <= i < self.n:
            raise IndexError(i)  # ends iteration, as a torch Dataset's does
        if i == self.kill:
            os.kill(os.getpid(), signal.SIGKILL)  # a real kill -9 of this worker
        if i == self.poison:
            raise RuntimeError(f"cannot load item {i}")
        return make_item(i)


def to_sample(i: int, item: tuple[np.ndarray[Any, Any], int]) -> dict[str, Any]:
    image, label = item
    return {"__key__": f"sample{i:06d}", "png": image, "cls": label, "pyd": {"i": i}}


def samples(n: int) -> Iterator[dict[str, Any]]:
    for i in range(n):
        yield to_sample(i, make_item(i))


def keys_and_labels(paths: list[str]) -> list[tuple[str, bytes]]:
    ss = tarindex.ShardSet(paths)
    return [(ss.sample(i)["__key__"], bytes(ss.sample(i)["cls"])) for i in range(len(ss))]


def leftovers(d: Path) -> list[str]:
    return sorted(p.name for p in d.iterdir() if p.name.endswith((".tmp", ".lock")))


def test_same_dataset_whatever_the_number_of_workers(tmp_path: Path) -> None:
    kw: dict[str, Any] = {"maxcount": 70, "mtime": 0, "seed": 1, "durable": False}
    out: dict[str, list[bytes]] = {}
    cases: list[tuple[str, Any, int]] = [
        ("map1", Items(333), 1),
        ("map3", Items(333), 3),
        ("iter2", samples(333), 2),
        ("iter1", samples(333), 1),
    ]
    for name, source, jobs in cases:
        d = tmp_path / name
        res = write_shards(
            source,
            str(d / "train-%06d.tar"),
            jobs=jobs,
            to_sample=None if name.startswith("iter") else to_sample,
            progress=False,
            **kw,
        )
        assert [Path(p).name for p in res.paths] == [f"train-{k:06d}.tar" for k in range(5)]
        assert res.counts == [70, 70, 70, 70, 53] and res.n_samples == 333
        assert keys_and_labels(res.paths) == [
            (f"sample{i:06d}", b"%d" % (i % 10)) for i in range(333)
        ]
        out[name] = [Path(p).read_bytes() for p in res.paths]
        assert leftovers(d) == []
    # byte for byte the same shards (seeded ids, fixed mtime), however many processes wrote them
    assert out["map1"] == out["map3"] == out["iter2"] == out["iter1"]


def test_progress_and_explicit_shard_sizes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    seen: list[int] = []
    res = write_shards(
        Items(100),
        tmp_path / "s-%03d.tar",
        jobs=2,
        shard_sizes=[10, 60, 30],
        start_shard=4,
        to_sample=to_sample,
        on_progress=seen.append,
        durable=False,
    )
    assert [Path(p).name for p in res.paths] == ["s-004.tar", "s-005.tar", "s-006.tar"]
    assert res.counts == [10, 60, 30] and sum(seen) == 100
    assert "writing shards" in capsys.readouterr().err  # the tqdm bar
    with pytest.raises(tarindex.errors.WriterError, match="add up to 100, the source holds 99"):
        write_shards(
            Items(99), tmp_path / "t-%03d.tar", shard_sizes=[10, 60, 30], to_sample=to_sample
        )
    with pytest.raises(tarindex.errors.WriterError, match="no integer field"):
        write_shards(Items(3), tmp_path / "one.tar", to_sample=to_sample)
    with pytest.raises(tarindex.errors.WriterError, match="not maxsize="):
        write_shards(Items(3), tmp_path / "u-%d.tar", maxsize=1e6)
    with pytest.raises(tarindex.errors.WriterError, match="with encoder=False"):  # here, not in workers
        write_shards(Items(3), tmp_path / "v-%d.tar", jobs=2, encoder=False, compress=True)
    assert not list(tmp_path.glob("v-*")) and not list(tmp_path.glob(".v-*"))


def test_a_worker_that_raises(tmp_path: Path) -> None:
    with pytest.raises(tarindex.errors.ParallelWriteError) as ei:
        write_shards(
            Items(400, poison=250),
            tmp_path / "s-%02d.tar",
            jobs=2,
            maxcount=50,
            to_sample=to_sample,
            progress=False,
            durable=False,
        )
    res = ei.value.result
    msg = str(ei.value)
    assert "shard 5" in msg and "RuntimeError: cannot load item 250" in msg and "sample 250" in msg
    assert 5 in res.failed and "raised" in res.failed[5]
    assert not (tmp_path / "s-05.tar").exists() and not (tmp_path / "s-05.tar.tidx").exists()
    # every shard reported written is complete and readable; nothing else is on disk
    assert 5 not in [int(Path(p).stem[2:]) for p in res.paths]
    for p, c in zip(res.paths, res.counts, strict=True):
        assert c == 50 and len(tarindex.ShardReader(p).index.sample_ptr) == 51
    on_disk = sorted(p.name for p in tmp_path.glob("*.tar"))
    assert on_disk == sorted(Path(p).name for p in res.paths)
    assert leftovers(tmp_path) == []


@pytest.mark.parametrize("source", ["map", "iter"])
def test_a_worker_killed_with_sigkill(tmp_path: Path, source: str) -> None:
    if source == "map":
        src: Any = Items(400, kill=120)
        kw: dict[str, Any] = {"to_sample": to_sample}
    else:  # the worker writing the shard of sample 120 dies inside the encoder
        src = ({**s, "bin": _Bomb()} if i == 120 else s for i, s in enumerate(samples(400)))
        kw = {"encoder": _bomb_encoder}
    with pytest.raises(tarindex.errors.ParallelWriteError) as ei:
        write_shards(
            src, tmp_path / "s-%02d.tar", jobs=2, maxcount=50, progress=False, durable=False, **kw
        )
    res = ei.value.result
    assert "killed by signal 9" in res.failed[2], res.failed
    assert not (tmp_path / "s-02.tar").exists() and leftovers(tmp_path) == []
    assert 2 not in [int(Path(p).stem[2:]) for p in res.paths]
    for p, c in zip(res.paths, res.counts, strict=True):
        assert len(tarindex.ShardSet(p)) == c
    assert sorted(p.name for p in tmp_path.glob("*.tar")) == sorted(Path(p).name for p in res.paths)


class _Bomb:
    """A value whose encoding kills the process (pickled to the worker, encoded there)."""

    def __reduce__(self) -> Any:
        return (_Bomb, ())

    def __bytes__(self) -> bytes:
        raise AssertionError("unreachable")


def _bomb_encoder(ext: str, value: Any) -> bytes:
    if isinstance(value, _Bomb):
        os.kill(os.getpid(), signal.SIGKILL)
    return encode_value(ext, value)


def test_the_iterable_raising_stops_everyone_cleanly(tmp_path: Path) -> None:
    def broken() -> Iterator[dict[str, Any]]:
        yield from samples(130)
        raise OSError("the source went away")

    with pytest.raises(OSError, match="went away"):
        write_shards(broken(), tmp_path / "s-%02d.tar", jobs=2, maxcount=50, progress=False)
    assert leftovers(tmp_path) == []
    for p in tmp_path.glob("*.tar"):  # whatever is there is complete
        assert len(tarindex.ShardSet(str(p))) == 50


def test_tutorial_dataset2tar_several_processes(tmp_path: Path) -> None:
    """webdataset's tutorial: N processes, each writing its own tars with TarWriter, then one call."""
    os.chdir(tmp_path)
    dataset = Items(240)
    num_workers = 3
    with multiprocessing.get_context().Pool(num_workers) as pool:
        pool.map(_dataset2tar, [(dataset, num, num_workers) for num in range(num_workers)])
    paths = [f"mnist-{num}.tar" for num in range(num_workers)]
    got = sorted(k for p in paths for k, _ in keys_and_labels([p]))
    assert got == [f"sample{i:06d}" for i in range(240)]
    # the same as one call, in one deterministic order
    res = tarindex.write_shards(
        dataset, "mnist-%06d.tar", jobs=num_workers, maxcount=100, to_sample=to_sample
    )
    ds = tarindex.ShardSet(res.paths)
    assert [ds.sample(i)["__key__"] for i in range(240)] == [f"sample{i:06d}" for i in range(240)]
    s = tarindex.codecs.decode.ExtDecoder("l8", allow_pickle=True)(ds.sample(77))
    assert np.array_equal(s["png"], make_item(77)[0]) and s["pyd"] == {"i": 77}


def _dataset2tar(args: tuple[Items, int, int]) -> None:
    dataset, num, num_workers = args
    with tarindex.TarWriter(f"mnist-{num}.tar") as sink:
        for index, (input, output) in enumerate(dataset):
            if index % num_workers != num:
                continue
            sink.write(
                {"__key__": f"sample{index:06d}", "png": input, "cls": output, "pyd": {"i": index}}
            )


def test_forkserver_workers(tmp_path: Path) -> None:
    ctx = multiprocessing.get_context("forkserver")
    res = write_shards(
        Items(90),
        tmp_path / "f-%02d.tar",
        jobs=2,
        maxcount=40,
        to_sample=to_sample,
        mp_context=ctx,
        progress=False,
        compress=("pyd",),
        zstd_dict=True,
    )
    assert res.counts == [40, 40, 10]
    assert keys_and_labels(res.paths)[41] == ("sample000041", b"1")


def _tree(root: Path, n: int) -> Path:
    rng = np.random.default_rng(5)
    for c in ("cat", "dog", "emu"):
        (root / "src" / c).mkdir(parents=True, exist_ok=True)
        for i in range(n):
            size = int(rng.integers(10, 3000))
            (root / "src" / c / f"{i:04d}.jpg").write_bytes(rng.bytes(size))
    return root / "src"


def _members(paths: list[str]) -> list[list[tuple[str, int]]]:
    import tarfile

    out = []
    for p in paths:
        with tarfile.open(p) as tf:
            out.append([(m.name, m.size) for m in tf.getmembers() if m.isfile()])
    return out


def test_pack_jobs_cuts_where_one_writer_does(tmp_path: Path) -> None:
    from tarindex.write.pack import plan_pack, write_pack

    src = _tree(tmp_path, 40)
    got = {}
    for jobs in (1, 2):
        pattern = str(tmp_path / f"j{jobs}" / "p-%03d.tar")
        plan = plan_pack(str(src), out_pattern=pattern)
        seen: list[int] = []
        res = write_pack(
            plan,
            pattern,
            maxcount=25,
            maxsize=40_000,
            jobs=jobs,
            on_sample=functools.partial(seen.append, 1),
        )
        assert len(seen) == 120 and res.n_files == 120
        assert res.classes_json is not None and Path(res.classes_json).exists()
        for p in res.paths:
            assert os.path.getsize(p) <= 40_000 or len(tarindex.ShardSet(p)) == 1
        got[jobs] = _members(res.paths)
    assert got[1] == got[2] and len(got[1]) > 120 // 25 + 1  # cut by size too


def test_cli_pack_jobs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from tarindex.cli.main import main

    src = _tree(tmp_path, 10)
    out = tmp_path / "out" / "c-%02d.tar"
    assert main(["pack", str(src), str(out), "--maxcount", "7", "--jobs", "2", "-q"]) == 0
    text = capsys.readouterr().out
    assert "packed 30 samples" in text and "5 shard(s)" in text
    ds = tarindex.ShardSet(str(tmp_path / "out" / "c-{00..04}.tar"))
    assert [ds.sample(i)["__key__"] for i in (0, 29)] == ["cat/0000", "emu/0009"]


class SlowItems(Items):
    """Items that take a few ms each and note which process read them (in ``pid_dir``)."""

    def __init__(self, n: int, pid_dir: str) -> None:
        super().__init__(n)
        self.pid_dir = pid_dir

    def __getitem__(self, i: int) -> tuple[np.ndarray[Any, Any], int]:
        Path(self.pid_dir, str(os.getpid())).touch()
        time.sleep(0.005)
        return super().__getitem__(i)


CALLER = """
import multiprocessing, sys
import tarindex
from tests.write.test_parallel_write import SlowItems, to_sample
out, method = sys.argv[1], sys.argv[2]
tarindex.write_shards(
    SlowItems(100_000, out + "/pids"), out + "/s-%05d.tar", jobs=2, maxcount=20,
    to_sample=to_sample, progress=False, durable=False,
    mp_context=multiprocessing.get_context(method),
)
"""


def _alive(pid: int) -> bool:
    """True while ``pid`` runs (a zombie nobody reaps yet counts as gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    except OSError:  # no /proc here
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        return True
    return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")


def _until(cond: Any, seconds: float, what: str) -> None:
    deadline = time.monotonic() + seconds
    while not cond():
        assert time.monotonic() < deadline, f"timed out after {seconds} s waiting for {what}"
        time.sleep(0.05)


def _stop_inside(where: str, pattern: str, tasks: Any, results: Any) -> None:
    """A write_shards worker whose SIGTERM lands just after it created a file no object knows
    yet: the shard's lock file (``where="lock"``), or the index's temp file (``"index"``, the
    tar already renamed into place)."""
    import tarindex.write.shards as shards
    import tarindex.write.tar as tar
    from tarindex.storage.indexfile import temp_path_for
    from tarindex.write.lock import PatternLock
    from tarindex.write.parallel import _worker

    class LockThenSignal(PatternLock):
        def __init__(self, pattern: str) -> None:
            super().__init__(pattern)
            os.kill(os.getpid(), signal.SIGTERM)  # before ShardWriter.write stores the lock

    def index_temp_then_signal(path: str, data: bytes, *, durable: bool = True) -> None:
        os.close(os.open(temp_path_for(path), os.O_WRONLY | os.O_CREAT | os.O_EXCL))
        os.kill(os.getpid(), signal.SIGTERM)  # as in write_atomic, before its try
        time.sleep(5)

    if where == "lock":
        shards.PatternLock = LockThenSignal  # type: ignore[attr-defined]
    else:
        tar.write_atomic = index_temp_then_signal  # type: ignore[attr-defined]
    _worker(0, Items(50), to_sample, pattern, {"durable": False}, tasks, results)


@pytest.mark.parametrize("where", ["lock", "index"])
def test_worker_stopped_inside_a_file_creation_leaves_no_file(tmp_path: Path, where: str) -> None:
    """A stop between a file's creation and the assignment that lets ``abort`` find it (the
    CI failure of stop 30: ``.s-00003.tar.lock`` left): the worker removes its shard's files."""
    ctx = multiprocessing.get_context("fork")
    tasks_r, tasks_w = ctx.Pipe(duplex=False)
    results_r, results_w = ctx.Pipe(duplex=False)
    pattern = str(tmp_path / "s-%05d.tar")
    p = ctx.Process(target=_stop_inside, args=(where, pattern, tasks_r, results_w))
    p.start()
    tasks_w.send(("map", 3, 0, 20))
    p.join(30)
    assert p.exitcode == 128 + signal.SIGTERM
    got = []
    while results_r.poll(0):
        got.append(results_r.recv())
    assert got[0] == ("begin", 3, p.pid) and all(m[0] == "n" for m in got[1:])  # never "done"
    assert sorted(q.name for q in tmp_path.iterdir()) == []


@pytest.mark.parametrize("method", ["fork", "forkserver"])
def test_caller_killed_with_sigkill_leaves_no_worker_and_no_mixed_run(
    tmp_path: Path, method: str
) -> None:
    """Issue 19 item 15: a real ``kill -9`` of a real caller; its workers exit and remove the
    shard they were writing; a new run refuses the killed run's shards, or deletes them."""
    out = tmp_path / "out"
    (out / "pids").mkdir(parents=True)
    root = Path(__file__).resolve().parents[2]
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")]),
    }
    caller = subprocess.Popen([sys.executable, "-c", CALLER, str(out), method], cwd=root, env=env)
    try:
        _until(
            lambda: len(list((out / "pids").iterdir())) >= 2 and len(list(out.glob("*.tidx"))) >= 2,
            60,
            "two workers and two finished shards",
        )
    finally:
        caller.kill()  # SIGKILL: no handler, no finally, no atexit in the caller
        caller.wait(30)
    workers = [int(p.name) for p in (out / "pids").iterdir()]
    assert len(workers) == 2 and caller.pid not in workers
    _until(lambda: not any(_alive(w) for w in workers), 20, f"workers {workers} to exit")
    # the shards in progress were removed, their locks too; the caller's pattern lock stays
    # (SIGKILL), unheld: the next run takes it over and removes it
    assert leftovers(out) == [".s-_05d.tar.lock"]
    old = sorted(p.name for p in out.glob("s-*"))
    assert len(old) >= 4 and all(p.endswith((".tar", ".tar.tidx")) for p in old)

    pattern = str(out / "s-%05d.tar")
    with pytest.raises(tarindex.errors.WriterError, match="of an earlier run already exist"):
        write_shards(Items(30), pattern, jobs=2, maxcount=10, to_sample=to_sample, progress=False)
    assert sorted(p.name for p in out.glob("s-*")) == old  # refused: nothing deleted
    res = write_shards(
        Items(30), pattern, jobs=2, maxcount=10, to_sample=to_sample, progress=False, overwrite=True
    )
    assert sorted(Path(p).name for p in res.removed) == old
    assert sorted(p.name for p in out.glob("s-*.tar")) == [f"s-{k:05d}.tar" for k in range(3)]
    assert leftovers(out) == []
    assert keys_and_labels(sorted(str(p) for p in out.glob("s-*.tar"))) == [
        (f"sample{i:06d}", b"%d" % (i % 10)) for i in range(30)
    ]
