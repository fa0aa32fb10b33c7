"""Spark writing figures of ``bench_engines.py`` (issue 20): ``local[2]`` vs one writer process.

What each row includes (every writer ``maxcount=5000``, ``durable=True``: each shard and its
index fsync'd before it counts, as a user's default; the same samples, the same bytes on disk):

* **The tables**, written once before any timing, as a Spark job of 2 tasks would leave them:
  a directory of 2 parquet files (snappy, row groups of 16,384 rows, ~128 MiB: Spark's
  ``parquet.block.size``), read by ``spark.read.parquet`` into the DataFrame every Spark row
  uses (Spark's own split: ~128 MiB a partition). Not a DataFrame built from driver-side
  Python data (that is shipped driver -> JVM -> workers, which no user table is), not cached.
  Warm page cache (the files were just written).

  - *payload form*: ``__key__`` string, ``bin`` binary (8,192 distinct random bytes a row:
    incompressible, as JPEGs), ``cls`` long, ``json`` string;
  - *function form*: ``__key__``, ``path`` (each payload in its own file: images on disk and a
    table of their paths, the common real pattern), ``cls``, ``json``; the payload is loaded
    by the row -> sample function in the task (:func:`load_sample`).

* **one process** (the baseline): one Python process reads the same parquet files with
  pyarrow (10,000-row batches, Spark's ``maxRecordsPerBatch``) and writes them with one
  ``ShardWriter`` (:func:`tarindex.write.partition.write_partition` over
  :func:`tarindex.stream.arrow.samples_of`: the very body every Spark task runs, minus Spark).
  Beside it, the writer alone: one ``ShardWriter`` over the same samples already in memory as
  Python dicts (no read, no conversion: the best any one process can do).
* **Spark rows**: ``local[2]``, JVM and Python workers warmed by one untimed pass of each job
  first; each timed from the call to the manifest on disk (the job, its scheduling and the
  driver's manifest included; the session's start-up excluded).
  ``spark.sql.execution.arrow.maxRecordsPerBatch`` is Spark's default (10,000);
  ``spark.sql.execution.arrow.pyspark.enabled`` / ``useArrow`` only concern
  ``createDataFrame``/``toPandas`` and Python UDFs, not ``mapInArrow`` or the Python Data
  Source writer, which always move Arrow batches.
* **Spark's ceilings** (no tarindex code): a ``mapInArrow`` that only counts its rows (the
  scan + the JVM -> Python Arrow transfer of the same DataFrame); for the function form also
  one that loads every payload and writes nothing.
* **CPU per sample** of each row, by process: the JVM, Spark's Python workers, this (driver)
  process (``/proc``: user + system time; Linux). Load-independent where wall-clock is not:
  the machine's 2 cores are shared with other sessions. A Python worker that exits between
  two readings takes its time out of the sum (a baseline row can show a few us below 0).
* mosaicml's ``dataframe_to_mds`` on the same payload DataFrame (when ``streaming`` is
  installed, ``pip install -e '.[bench]'``): once, best of one (it is ~10x slower). It does no
  fsync.

Rounds: after the warm-up, 3 rounds, each running every row once in the same order; a
row's figure is its best round (samples/s) and its median CPU.
"""

from __future__ import annotations

import json
import os
import resource
import shutil
import time
from collections.abc import Callable
from typing import Any

import numpy as np

import tarindex
from tarindex.stream.arrow import samples_of
from tarindex.write.partition import write_partition

MAXCOUNT = 5000
ROW_GROUP = 16_384  # rows: ~128 MiB of 8 KiB payloads, Spark's parquet.block.size
BATCH = 10_000  # spark.sql.execution.arrow.maxRecordsPerBatch's default
PAYLOAD = 8192
ROUNDS = 3
PAYLOAD_SCHEMA = {"__key__": "str", "bin": "bytes", "cls": "int64", "json": "str"}


def make_tables(root: str, n: int) -> dict[str, Any]:
    """Write the payload table, the payload files and the path table (2 parquet files each)."""
    import pyarrow as pa  # type: ignore[import-untyped,unused-ignore]
    import pyarrow.parquet as pq  # type: ignore[import-untyped,unused-ignore]

    rng = np.random.default_rng(0)
    data = rng.integers(0, 256, n * PAYLOAD, dtype=np.uint8)
    offsets = np.arange(0, (n + 1) * PAYLOAD, PAYLOAD, dtype=np.int32)
    keys = [f"{i:08d}" for i in range(n)]
    cls = pa.array(np.arange(n) % 1000, pa.int64())
    js = pa.array([json.dumps({"id": i, "w": i % 7}) for i in range(n)], pa.string())
    binary = pa.Array.from_buffers(pa.binary(), n, [None, pa.py_buffer(offsets), pa.py_buffer(data)])
    table = pa.table({"__key__": keys, "bin": binary, "cls": cls, "json": js})
    files = os.path.join(root, "files")
    os.makedirs(files)
    paths = []
    for i, k in enumerate(keys):
        p = os.path.join(files, f"{k}.bin")
        with open(p, "wb") as f:
            f.write(data[i * PAYLOAD : (i + 1) * PAYLOAD].data)
        paths.append(p)
    ptable = pa.table({"__key__": keys, "path": paths, "cls": cls, "json": js})
    got: dict[str, Any] = {"n": n}
    for name, t in (("payload", table), ("paths", ptable)):
        d = os.path.join(root, name)
        os.makedirs(d)
        half = n // 2
        for k, (a, b) in enumerate(((0, half), (half, n))):
            pq.write_table(t.slice(a, b - a), os.path.join(d, f"part-{k:05d}.parquet"),
                           row_group_size=ROW_GROUP)
        got[name] = d
    got["dicts"] = list(samples_of(table.to_batches(BATCH)))  # the writer-alone baseline
    return got


def load_sample(j: int, row: Any) -> dict[str, Any]:
    """The row -> sample function: loads the payload in the task (``row`` a dict)."""
    with open(row["path"], "rb") as f:
        data = f.read()
    return {"__key__": row["__key__"], "bin": data, "cls": row["cls"], "json": row["json"]}


def _cpu() -> dict[str, float]:
    """CPU seconds (user + system) so far: this process, the JVM it started, Spark's Python
    workers (the JVM's descendants, their waited-for children included)."""
    tck = os.sysconf("SC_CLK_TCK")
    kids: dict[int, list[tuple[int, float, str]]] = {}
    for p in os.listdir("/proc"):
        if not p.isdigit():
            continue
        try:
            with open(f"/proc/{p}/stat") as f:
                s = f.read()
            exe = os.readlink(f"/proc/{p}/exe")
        except OSError:
            continue
        f4 = s[s.rindex(")") + 2 :].split()
        kids.setdefault(int(f4[1]), []).append(
            (int(p), sum(int(x) for x in f4[11:15]) / tck, exe)
        )
    me = resource.getrusage(resource.RUSAGE_SELF)
    out = {"driver": me.ru_utime + me.ru_stime, "jvm": 0.0, "workers": 0.0}
    for pid, c, exe in kids.get(os.getpid(), []):
        if os.path.basename(exe).startswith("java"):
            out["jvm"] += c
            stack = [pid]
            while stack:
                for k, kc, _ in kids.get(stack.pop(), []):
                    out["workers"] += kc
                    stack.append(k)
    return out


def _run(fn: Callable[[str], int], out: str, n: int) -> tuple[float, dict[str, float]]:
    c0 = _cpu()
    t0 = time.perf_counter()
    got = fn(out)
    dt = time.perf_counter() - t0
    c1 = _cpu()
    shutil.rmtree(out, ignore_errors=True)
    assert got == n, (got, n)
    return n / dt, {k: (c1[k] - c0[k]) / n * 1e6 for k in c0}


def one_process(files: str, to_sample: Callable[[int, Any], Any] | None) -> Callable[[str], int]:
    """One process: pyarrow reads the parquet files, one ShardWriter writes (the task body)."""
    import pyarrow.parquet as pq

    def run(out: str) -> int:
        def batches() -> Any:
            for f in sorted(os.listdir(files)):
                yield from pq.ParquetFile(os.path.join(files, f)).iter_batches(batch_size=BATCH)

        rows = write_partition(samples_of(batches(), to_sample=to_sample), out, 0,
                               maxcount=MAXCOUNT, to_sample=to_sample)
        return sum(r.samples for r in rows)

    return run


def writer_alone(dicts: list[dict[str, Any]]) -> Callable[[str], int]:
    """One ShardWriter over the samples already in memory as dicts."""

    def run(out: str) -> int:
        with tarindex.ShardWriter(f"{out}/s-%06d.tar", maxcount=MAXCOUNT) as w:
            for s in dicts:
                w.write(s)
        return len(dicts)

    return run


def spark_write(df: Any, to_sample: Callable[[int, Any], Any] | None = None) -> Callable[[str], int]:
    import tarindex.spark

    def run(out: str) -> int:
        return tarindex.spark.write(df, out, maxcount=MAXCOUNT, to_sample=to_sample).n_samples

    return run


def format_write(df: Any) -> Callable[[str], int]:
    def run(out: str) -> int:
        df.write.format("tarindex").option("maxcount", MAXCOUNT).mode("append").save(out)
        return len(tarindex.ShardSet(f"{out}/data.json"))

    return run


def _count_batches(batches: Any) -> Any:
    import pyarrow as pa

    k = 0
    for b in batches:
        k += b.num_rows
    yield pa.RecordBatch.from_pylist([{"n": k}])


def _load_batches(batches: Any) -> Any:
    import pyarrow as pa

    k = 0
    for b in batches:
        for p in b.column("path").to_pylist():
            with open(p, "rb") as f:
                k += len(f.read()) > 0
    yield pa.RecordBatch.from_pylist([{"n": k}])


def spark_noop(df: Any, body: Callable[[Any], Any] = _count_batches) -> Callable[[str], int]:
    """Spark's ceiling: a ``mapInArrow`` that writes nothing (``body``: count, or load)."""

    def run(out: str) -> int:
        return sum(r.n for r in df.mapInArrow(body, "n long").collect())

    return run


def mds_write(df: Any) -> Callable[[str], int] | None:
    try:
        from streaming.base.converters import dataframe_to_mds  # type: ignore[import-not-found]
    except ImportError:
        return None

    def run(out: str) -> int:
        dataframe_to_mds(df, merge_index=True,
                         mds_kwargs={"out": out, "columns": PAYLOAD_SCHEMA, "size_limit": 1 << 26})
        with open(os.path.join(out, "index.json")) as f:
            return sum(s["samples"] for s in json.load(f)["shards"])

    return run


def spark_figures(root: str, n: int) -> dict[str, Any]:
    """Every Spark row, printed as it comes; returns ``{row: samples/s, row_cpu: {...}}``."""
    from pyspark.sql import SparkSession

    import tarindex.spark

    t = make_tables(os.path.join(root, "tables"), n)
    here = os.path.dirname(os.path.abspath(__file__))  # the workers import this module
    os.environ["PYTHONPATH"] = os.pathsep.join([here, os.environ.get("PYTHONPATH", "")])
    spark = (
        SparkSession.builder.master("local[2]").config("spark.ui.enabled", "false")
        .config("spark.driver.memory", "4g").config("spark.ui.showConsoleProgress", "false")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    tarindex.spark.register(spark)
    df = spark.read.parquet(t["payload"])
    pdf = spark.read.parquet(t["paths"])
    rows: dict[str, Callable[[str], int]] = {
        "payload_one_process": one_process(t["payload"], None),
        "payload_writer_alone": writer_alone(t["dicts"]),
        "payload_spark_write": spark_write(df),
        "payload_spark_format": format_write(df),
        "payload_spark_noop": spark_noop(df),
        "fn_one_process": one_process(t["paths"], load_sample),
        "fn_spark_write": spark_write(pdf, load_sample),
        "fn_spark_noop": spark_noop(pdf),
        "fn_spark_noop_loading": spark_noop(pdf, _load_batches),
    }
    res: dict[str, Any] = {
        "spark_partitions_payload": df.rdd.getNumPartitions(),
        "spark_partitions_fn": pdf.rdd.getNumPartitions(),
    }
    out = os.path.join(root, "out")
    for name, fn in rows.items():  # warm-up: JIT, workers importing tarindex and pyarrow
        if "spark" in name:
            _run(fn, out, n)
    runs: dict[str, list[tuple[float, dict[str, float]]]] = {k: [] for k in rows}
    loads = []
    for _ in range(ROUNDS):
        for name, fn in rows.items():
            runs[name].append(_run(fn, out, n))
        loads.append(os.getloadavg()[0])
    for name, got in runs.items():
        res[name] = max(r for r, _ in got)
        res[name + "_cpu_us"] = {k: float(np.median([c[k] for _, c in got])) for k in got[0][1]}
    res["load_spark"] = loads
    mds = mds_write(df)
    if mds is not None:
        res["payload_mds"], res["payload_mds_cpu_us"] = _run(mds, out, n)
    spark.stop()
    return res


def report(res: dict[str, Any]) -> None:
    """Print the rows, ratios against the one-process baseline and the ceilings."""
    for form, title in (("payload", "payload in the DataFrame"), ("fn", "row -> sample function")):
        one = res[f"{form}_one_process"]
        print(f"Spark writing, {title} ({res['n']:,} samples, "
              f"{res[f'spark_partitions_{form}']} partitions, load {res['load_spark']}):")
        for name in [k for k in res if k.startswith(form + "_") and not k.endswith("_cpu_us")]:
            c = res[name + "_cpu_us"]
            print(f"  {name[len(form) + 1:]:<18} {res[name]:>9,.0f} samples/s  {res[name] / one:5.2f}x "
                  f"one process;  CPU us/sample: JVM {c['jvm']:5.1f}  workers {c['workers']:5.1f}  "
                  f"driver {c['driver']:5.1f}  total {sum(c.values()):5.1f}")
        ceiling = res[f"{form}_spark_noop" + ("_loading" if form == "fn" else "")]
        print(f"  tarindex.spark.write / Spark's ceiling: {res[f'{form}_spark_write'] / ceiling:.2f}x")
    if "payload_mds" in res:
        print(f"  tarindex.spark.write / mosaicml dataframe_to_mds: "
              f"{res['payload_spark_write'] / res['payload_mds']:.2f}x")
