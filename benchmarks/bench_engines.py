"""Engines (issue 20): manifests from returned rows, Spark writing vs one ShardWriter process.

One run, side by side, on this machine (2 cores), local disk, warm page cache:

* **manifest from rows**: ``write_manifest_rows`` of 100,000 shard rows (10 per partition),
  as a Spark or Ray driver does after its job; no shard opened. Target < 2 s.
* **Spark writing** (:mod:`engines_spark`, which says what each row includes): ``N``
  samples of 8 KB random bytes + ``cls`` + ``json`` in a parquet table read by Spark,
  written by ``tarindex.spark.write`` and ``df.write.format("tarindex")`` on ``local[2]``
  against one process reading the same table and writing it with one ``ShardWriter``
  (target >= 1.6x), beside Spark's own ceiling (a ``mapInArrow`` that writes nothing) and
  mosaicml's ``dataframe_to_mds`` on the same DataFrame; and the row -> sample function form
  (a table of paths, each payload loaded from its file in the task). CPU per sample of the
  JVM, Spark's Python workers and the driver beside each. Use ``--n 100000`` (each Spark job
  costs ~0.2-0.3 s of scheduling: at 20,000 samples that is a fifth of one process's time).
* **Ray read** (``--ray``): the same samples in 4 shards; one epoch through
  ``tarindex.ray.read`` and through ``ray.data.read_webdataset(decoder=None)`` on the same
  shards (``ray.init(num_cpus=2)``, every block consumed by ``iter_batches(batch_size=None)``),
  samples/s and read tasks used; beside them, in this process, the raw kernel
  (``ShardSet.read_block`` over every 1,024 samples: the tables checked, the keys decoded to
  ``str``, the global indices; plus ``pack_blocks(int_fields=())``, the one copy of every
  member's bytes, ``cls`` included as bytes, that any consumer needs: ``read_block`` alone
  over a mapping copies nothing) and the read task's whole body (what
  :func:`tarindex.stream.arrow.read_range` runs per block for the datasource timed below,
  ``fields=None``: read_block of every member, the key bytes, the layout, the Arrow columns
  wrapped around the batch buffer, the one copy of the member bytes with ``cls`` parsed to
  int64), per core: this thread's CPU time, every 1,024-row block read by both back to back
  (order alternating), one ratio per pass, median and spread of 9 passes (wall-clock ratio
  beside it). Ray's own ceiling: a datasource with the same tasks yielding a ready table (no
  read), what moving the bytes through Ray costs.
  Target: the datasource per core >= 0.9x raw ``read_block``.

Usage: ``python benchmarks/bench_engines.py [--n 100000] [--ray] [--no-spark] [--json out.json]``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
import time
from typing import Any

import numpy as np

import tarindex
from tarindex.read.manifest import write_manifest_rows
from tarindex.write.partition import ShardRow


def manifest_rows(root: str, n: int = 100_000) -> float:
    rows = [
        ShardRow(k // 10, f"a{k // 10}", k % 10,
                 f"{root}/attempt-{k // 10:05d}-a{k // 10}/part-{k // 10:05d}-{k % 10:06d}.tar",
                 1000, 3000, 10_240_000, 70_000, k, k, f"{k:032x}")
        for k in range(n)
    ]
    best = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        write_manifest_rows(rows, f"{root}/data.json")
        best = min(best, time.perf_counter() - t0)
    return best


def rows_of(n: int) -> list[tuple[str, bytes, int, str]]:
    rng = np.random.default_rng(0)
    blob = rng.integers(0, 256, 8192 + 4096, dtype=np.uint8).tobytes()
    return [
        (f"{i:08d}", blob[i % 4096 : i % 4096 + 8192], i % 1000, json.dumps({"id": i, "w": i % 7}))
        for i in range(n)
    ]


def one_writer(rows: list[tuple[str, bytes, int, str]], out: str) -> float:
    t0 = time.perf_counter()
    with tarindex.ShardWriter(f"{out}/s-%06d.tar", maxcount=5000, durable=False) as w:
        for k, b, c, j in rows:
            w.write({"__key__": k, "bin": b, "cls": c, "json": j})
    return len(rows) / (time.perf_counter() - t0)


_TV_STUB = {  # MDS imports torchvision at ``import streaming`` (run.py's _stub_torchvision)
    "torchvision/__init__.py": "from . import datasets, transforms\n__version__ = '0.0-stub'\n",
    "torchvision/datasets/__init__.py": "class VisionDataset:\n    pass\nCIFAR10 = VisionDataset\n",
    "torchvision/transforms/__init__.py": "from . import functional\n",
    "torchvision/transforms/functional.py": "def to_tensor(x):\n    return x\n",
}


def stub_torchvision(root: str) -> None:
    """Where torchvision does not import (PyPI's wheel beside the pinned CPU torch), a stub
    package on ``PYTHONPATH`` for this process and Spark's Python workers: MDS's writer never
    uses it. Before the Spark session starts (its workers inherit the environment)."""
    try:
        import torchvision  # type: ignore[import-not-found,unused-ignore]  # noqa: F401

        return
    except Exception:
        pass
    import sys

    d = os.path.join(root, "tvstub")
    for rel, text in _TV_STUB.items():
        os.makedirs(os.path.dirname(os.path.join(d, rel)), exist_ok=True)
        with open(os.path.join(d, rel), "w") as f:
            f.write(text)
    for m in [m for m in sys.modules if m == "torchvision" or m.startswith("torchvision.")]:
        del sys.modules[m]
    sys.path.insert(0, d)
    os.environ["PYTHONPATH"] = os.pathsep.join([d, os.environ.get("PYTHONPATH", "")])


def ray_read(rows: list[tuple[str, bytes, int, str]], root: str) -> dict[str, Any]:
    import ray

    import tarindex.ray
    from tarindex.stream.arrow import arrow_schema, block_table, columns_of
    from tarindex.stream.pack import pack_blocks

    n = len(rows)
    shards = os.path.join(root, "ray")
    with tarindex.ShardWriter(f"{shards}/s-%06d.tar", maxcount=-(-n // 4), durable=False) as w:
        for k, b, c, j in rows:
            w.write({"__key__": k, "bin": b, "cls": c, "json": j})
    tarindex.write_manifest(f"{shards}/s-*.tar", f"{shards}/data.json")
    res: dict[str, Any] = {}
    ss = tarindex.ShardSet(f"{shards}/data.json")

    def alone() -> float:  # read_block over a mapping: tables only, no byte copied
        t0 = time.perf_counter()
        for s in range(ss.n_shards):
            c = int(ss.counts[s])
            for j in range(0, c, 1024):
                ss.read_block(s, j, min(c, j + 1024))
        return n / (time.perf_counter() - t0)

    cols = columns_of(ss)
    schema = arrow_schema(cols)
    blocks = [(s, j, min(int(ss.counts[s]), j + 1024), int(ss.starts[s]) + j)
              for s in range(ss.n_shards) for j in range(0, int(ss.counts[s]), 1024)]

    def raw(s: int, j: int, j1: int, a: int) -> None:  # the kernel's read + the one copy
        pack_blocks([(ss.read_block(s, j, j1), None)], None, ())

    def body(s: int, j: int, j1: int, a: int) -> None:  # what read_range runs per block
        # for the datasource below (no fields=: every member read, one outside cols refused)
        block_table(ss, a, a + (j1 - j), cols, every_member=True, schema=schema)

    # Per core: this thread's CPU time (time.thread_time: the time the work itself took, not
    # the time other processes held the core), block by block, each 1,024-row block read by
    # raw and by the body back to back (order alternating), so both meet the same load and
    # cache; one ratio per pass over the dataset, 9 passes. Wall-clock beside it.
    cpu: list[tuple[float, float]] = []
    wall: list[tuple[float, float]] = []
    for r in range(10):
        c = [0.0, 0.0]
        w = [0.0, 0.0]
        for k, blk in enumerate(blocks):
            for which in ((0, 1) if (r + k) % 2 == 0 else (1, 0)):
                t0, w0 = time.thread_time(), time.perf_counter()
                (raw, body)[which](*blk)
                c[which] += time.thread_time() - t0
                w[which] += time.perf_counter() - w0
        if r:  # the first pass warms the page cache and the allocator
            cpu.append((n / c[0], n / c[1]))
            wall.append((n / w[0], n / w[1]))
    ratios = [b / a for a, b in cpu]
    res["read_block_alone_per_s"] = max(alone() for _ in range(3))
    res["raw_read_block_per_s"] = float(np.median([a for a, _ in cpu]))
    res["read_task_body_per_s"] = float(np.median([b for _, b in cpu]))
    res["body_over_raw_median"] = float(np.median(ratios))
    res["body_over_raw_min"], res["body_over_raw_max"] = min(ratios), max(ratios)
    res["body_over_raw_wall_median"] = float(np.median([b / a for a, b in wall]))
    res["load_during_body"] = os.getloadavg()[0]
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    ray.data.DataContext.get_current().enable_progress_bars = False

    def epoch(make: Any) -> float:
        ds = make()
        t0 = time.perf_counter()
        got = sum(b.num_rows for b in ds.iter_batches(batch_size=None, batch_format="pyarrow"))
        dt = time.perf_counter() - t0
        assert got == n, got
        return n / dt

    ours = tarindex.ray.TarIndexDatasource(f"{shards}/data.json")
    tasks = ours.get_read_tasks(200)  # what Ray's default asks for
    res["ray_tasks_tarindex"] = len(tasks)
    # first epoch (workers import tarindex and pyarrow, open the shards), then warm ones
    runs = [epoch(lambda: ray.data.read_datasource(ours)) for _ in range(3)]
    res["ray_tarindex_first_per_s"], res["ray_tarindex_per_s"] = runs[0], max(runs[1:])
    # Ray's own ceiling on these tasks: the same tables made once per worker and yielded
    # again, no read at all (what moving the bytes through Ray costs)
    ceiling = _Replay(ss, cols, [t.metadata for t in tasks])
    res["ray_noop_per_s"] = max(epoch(lambda: ray.data.read_datasource(ceiling)) for _ in range(3))
    paths = sorted(os.path.join(shards, f) for f in os.listdir(shards) if f.endswith(".tar"))
    from ray.data._internal.datasource.webdataset_datasource import WebDatasetDatasource

    res["ray_tasks_webdataset"] = len(WebDatasetDatasource(paths, decoder=None).get_read_tasks(200))
    res["ray_webdataset_per_s"] = max(
        epoch(lambda: ray.data.read_webdataset(paths, decoder=None)) for _ in range(2)
    )
    ray.shutdown()
    return res


_TABLE: list[Any] = []  # one per Ray worker process: _Replay's table


class _ReplayTask:
    def __init__(self, spec: Any, cols: list[str], rows: int) -> None:
        self.spec, self.cols, self.rows = spec, cols, rows

    def __call__(self) -> Any:
        from tarindex.stream.arrow import block_table

        if not _TABLE:
            _TABLE.append(block_table(self.spec.open(), 0, 1024, self.cols))
        for a in range(0, self.rows, 1024):
            yield _TABLE[0].slice(0, min(1024, self.rows - a))


def _Replay(ss: Any, cols: list[str], metas: list[Any]) -> Any:  # noqa: N802
    """A Ray datasource with our tasks' count and sizes whose tasks read nothing: each worker
    makes one 1,024-row table once and yields it again (Ray's cost of moving the bytes)."""
    from ray.data.datasource import Datasource, ReadTask

    from tarindex.stream.arrow import OpenSpec

    spec = OpenSpec.of(list(ss.paths))

    class Replay(Datasource):  # type: ignore[misc]
        def estimate_inmemory_data_size(self) -> int:
            return sum(m.size_bytes for m in metas)

        def get_read_tasks(self, parallelism: int, **kw: Any) -> list[Any]:
            return [ReadTask(_ReplayTask(spec, cols, m.num_rows), m) for m in metas]

    return Replay()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=20_000)
    ap.add_argument("--json", default=None)
    ap.add_argument("--ray", action="store_true", help="the Ray read figures too")
    ap.add_argument("--no-spark", action="store_true", help="skip the Spark figures")
    a = ap.parse_args()
    root = tempfile.mkdtemp(prefix="bench-engines-")
    res: dict[str, Any] = {"n": a.n}
    try:
        res["manifest_100k_rows_s"] = manifest_rows(os.path.join(root, "m"))
        print(f"manifest from 100,000 rows: {res['manifest_100k_rows_s']:.3f} s")
        rows = rows_of(a.n)
        res["shardwriter_per_s"] = one_writer(rows, os.path.join(root, "one"))
        print(f"one ShardWriter process: {res['shardwriter_per_s']:,.0f} samples/s")
        if a.ray:
            got = ray_read(rows, root)
            res.update(got)
            print(f"raw read_block + one copy, per core: {got['raw_read_block_per_s']:,.0f} samples/s; "
                  f"read task body (read_block + pack + Arrow), per core: "
                  f"{got['read_task_body_per_s']:,.0f} samples/s (CPU time, medians)")
            print(f"  task body / raw: {got['body_over_raw_median']:.2f}x median of 9 interleaved "
                  f"passes ({got['body_over_raw_min']:.2f}..{got['body_over_raw_max']:.2f}), "
                  f"wall-clock {got['body_over_raw_wall_median']:.2f}x, load "
                  f"{got['load_during_body']:.1f}; read_block alone (no copy): "
                  f"{got['read_block_alone_per_s']:,.0f}/s")
            print(f"Ray, tarindex.ray.read: {got['ray_tarindex_per_s']:,.0f} samples/s warm, "
                  f"{got['ray_tarindex_first_per_s']:,.0f} first epoch "
                  f"({got['ray_tasks_tarindex']} read tasks; per core "
                  f"{got['ray_tarindex_per_s'] / 2 / got['raw_read_block_per_s']:.2f}x raw "
                  f"read_block); Ray's ceiling (same tasks, no read): "
                  f"{got['ray_noop_per_s']:,.0f} samples/s (ours "
                  f"{got['ray_tarindex_per_s'] / got['ray_noop_per_s']:.2f}x of it); "
                  f"ray.data.read_webdataset: {got['ray_webdataset_per_s']:,.0f} "
                  f"samples/s ({got['ray_tasks_webdataset']} read tasks)")
        if a.no_spark:
            return
        from engines_spark import report, spark_figures

        stub_torchvision(root)
        got = spark_figures(root, a.n)
        res.update(got)
        report(res)
    finally:
        shutil.rmtree(root, ignore_errors=True)
        if a.json:  # also after --no-spark's early return
            with open(a.json, "w") as f:
                json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
