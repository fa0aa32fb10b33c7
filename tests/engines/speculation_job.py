"""The driver of ``test_spark_speculation.py``: real speculative copies on a two-host cluster.

Run as ``python -m tests.engines.speculation_job MASTER OUT`` against a Spark standalone
cluster whose two workers are two hosts (127.0.0.1 and 127.0.0.2): Spark launches a
speculative copy of a task only on a host where no attempt of it runs
(``TaskSetManager``: ``!(speculative && hasAttemptOnHost(index, host))``), so one host
(``local[N]``, ``local-cluster[...]``) never runs one.

In each write (``tarindex.spark.write`` through ``mapInArrow``, then
``df.write.format("tarindex")``), partition 1's first attempt closes two shards, then stalls;
Spark speculates, the copy on the other host finishes and is committed, and Spark kills the
stalled attempt. Checks: the manifest lists only the copy's shards (every row once, byte for
byte), none of the loser's, and ``prune`` lists exactly what the loser left (its files when
it was killed mid-write; nothing when its writer saw its input fail and removed its attempt)
and deletes it. Prints
``OK <path>`` per write; any failure raises (a non-zero exit).
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

import tarindex
import tarindex.spark
from tarindex.read.manifest import prune, read_manifest

N = 400  # rows, in 2 partitions of 200
STALL_AT = 300  # partition 1's row 100: five shards of 20 closed, a sixth open
# (~2 KB rows: a Python worker's output is buffered by 64 KiB, so the rows before the stall
# reach the next worker in the task only if they fill the buffer)


def payload(i: int) -> bytes:
    return np.random.default_rng(i).integers(0, 256, 2000 + i % 300, dtype=np.uint8).tobytes()


def stall_once(marks: Path, out: str, i: int) -> None:
    """In the first attempt of partition 1 only, at row ``STALL_AT``: record this worker's pid
    and, a moment later, the files its attempt's writer has made, then sleep until Spark
    kills the attempt."""
    from pyspark import TaskContext

    tc = TaskContext.get()
    assert tc is not None
    if i == STALL_AT and tc.attemptNumber() == 0:
        time.sleep(3)  # the writer (this process or the next one in the task) catches up
        seen = sorted(str(p) for p in Path(out).glob("attempt-00001-*-0-*/*"))
        (marks / "all").write_text("\n".join(str(p) for p in Path(out).glob("**/*")))
        (marks / "seen").write_text("\n".join(seen))
        (marks / "stalled").write_text(str(os.getpid()))
        time.sleep(600)


def check(out: str, marks: Path) -> None:
    # the stalled attempt's Python worker is killed after the job ends (the task kill's
    # timeout): wait for it, so nothing still writes while we prune
    pid = int((marks / "stalled").read_text())
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.2)
    else:
        raise AssertionError(f"the stalled attempt's worker {pid} was never killed")
    manifest = os.path.join(out, "data.json")
    t = read_manifest(manifest)
    committed = {os.path.dirname(os.path.join(out, p)) for p in t.paths}
    p1 = {d for d in committed if os.path.basename(d).startswith("attempt-00001-")}
    assert len(p1) == 1, committed
    assert os.path.basename(next(iter(p1))).split("-")[3] == "1", p1  # the copy: attempt 1
    ss = tarindex.ShardSet(manifest)
    got = {ss.sample(j)["__key__"]: ss.sample(j) for j in range(len(ss))}
    assert len(ss) == N and sorted(got) == [f"{i:06d}" for i in range(N)], len(ss)
    for k, s in got.items():
        assert s["bin"] == payload(int(k)) and s["cls"] == str(int(k) % 10).encode()
    seen = (marks / "seen").read_text().split("\n")
    assert sum(f.endswith(".tar") for f in seen) >= 2, (seen, (marks / "all").read_text())
    listed = {os.path.join(out, p) for p in t.paths}
    assert not listed & set(seen)  # none of them is in the manifest
    # what the loser left: its files if it was killed while writing, nothing if its writer
    # saw its input fail and removed its attempt; wait until that removal is over
    last: list[str] = []
    for _ in range(50):
        now = sorted(str(p) for p in Path(out).glob("attempt-*/*") if os.path.dirname(p) not in committed)
        if now == last:
            break
        last = now
        time.sleep(0.5)
    assert all(os.path.basename(os.path.dirname(f)).split("-")[3] == "0" for f in last), last
    assert prune(out, manifest, dry_run=True) == last
    assert prune(out, manifest) == last
    assert {str(p) for p in Path(out).glob("attempt-*")} == committed
    assert len(tarindex.ShardSet(manifest)) == N
    print(f"loser: {len(seen)} files seen while it ran, {len(last)} left and pruned", flush=True)


def main(master: str, root: str) -> None:
    from pyspark.sql import SparkSession

    spark = (
        SparkSession.builder.master(master)
        .appName("tarindex-speculation")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.ui.enabled", "false")
        .config("spark.executor.memory", "512m")
        .config("spark.cores.max", "2")
        # no task before both executors (one per host) are there
        .config("spark.scheduler.minRegisteredResourcesRatio", "1.0")
        .config("spark.scheduler.maxRegisteredResourcesWaitingTime", "180s")
        .config("spark.pyspark.python", sys.executable)
        .config("spark.executorEnv.PYTHONPATH", os.environ.get("PYTHONPATH", ""))
        .config("spark.speculation", "true")
        .config("spark.speculation.interval", "100ms")
        .config("spark.speculation.quantile", "0.5")
        .config("spark.speculation.multiplier", "1.5")
        # no copy before partition 1's first attempt has reached its stall (STALL_AT): with
        # 1s, a loaded machine's slow start had the copy commit and the attempt killed before
        # it stalled, and there was no stalled attempt to check (a CI run failed so)
        .config("spark.speculation.minTaskRuntime", "20s")
        .config("spark.speculation.efficiency.enabled", "false")
        .config("spark.sql.execution.arrow.maxRecordsPerBatch", "10")
        .config("spark.python.task.killTimeout", "1s")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    sc = spark.sparkContext
    rows = [(f"{i:06d}", payload(i), i % 10) for i in range(N)]
    df = spark.createDataFrame(sc.parallelize(rows, 2), "__key__ string, bin binary, cls long")

    # 1. tarindex.spark.write (mapInArrow): the stall is in to_sample, in the writer's worker
    marks = Path(root) / "marks-arrow"
    marks.mkdir(parents=True)
    out = os.path.join(root, "arrow")

    def to_sample(j: int, row: dict[str, Any]) -> dict[str, Any]:
        stall_once(marks, out, int(row["__key__"]))
        return {"__key__": row["__key__"], "bin": row["bin"], "cls": row["cls"]}

    t = tarindex.spark.write(df, out, maxcount=20, to_sample=to_sample, durable=False)
    assert t.n_samples == N
    check(out, marks)
    print("OK", out, flush=True)

    # 2. df.write.format("tarindex"): the stall is in a mapInArrow before the writer (batches
    # of 10 rows stream from it to the writer's own Python worker)
    tarindex.spark.register(spark)
    marks2 = Path(root) / "marks-format"
    marks2.mkdir(parents=True)
    out2 = os.path.join(root, "format")

    def stall(batches: Any) -> Any:
        for b in batches:
            for k in b.column("__key__").to_pylist():
                stall_once(marks2, out2, int(k))
            yield b

    (df.mapInArrow(stall, df.schema).write.format("tarindex").option("maxcount", 20)
     .option("durable", "false").mode("append").save(out2))
    check(out2, marks2)
    print("OK", out2, flush=True)
    spark.stop()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
