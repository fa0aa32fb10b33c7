"""tarindex.spark.write on a real local Spark session (local[2], task retries on)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import tarindex
from tarindex.read.manifest import prune
from tarindex.write.partition import ShardRow

pyspark = pytest.importorskip("pyspark", reason="pyspark is not installed (pip install -e '.[test]')")
pytest.importorskip("pyarrow", reason="pyarrow is not installed (pip install -e '.[test]')")

import tarindex.spark  # noqa: E402


@pytest.fixture(scope="module")
def spark() -> Iterator[Any]:
    from pyspark.sql import SparkSession

    try:
        # local[2, 2]: 2 cores, and a failed task is tried again once; in local mode that is
        # how spark.task.maxFailures takes effect (set too, for the record)
        s = (
            SparkSession.builder.master("local[2, 2]")
            .appName("tarindex-tests")
            .config("spark.task.maxFailures", "2")
            .config("spark.ui.enabled", "false")
            .config("spark.sql.shuffle.partitions", "4")
            .config("spark.driver.bindAddress", "127.0.0.1")
            .getOrCreate()
        )
    except Exception as e:  # no JVM, no java on PATH
        pytest.skip(f"Spark cannot start a JVM here ({type(e).__name__}: {e}); install Java 17")
    s.sparkContext.setLogLevel("ERROR")
    yield s
    s.stop()


def payload(i: int) -> bytes:
    return np.random.default_rng(i).integers(0, 256, 50 + i % 500, dtype=np.uint8).tobytes()


SCHEMA = "__key__ string, bin binary, cls long, txt string"


def frame(spark: Any, n: int, partitions: int) -> Any:
    """``n`` rows in ``partitions`` contiguous slices (``parallelize``: row order kept)."""
    rows = [(f"{i:06d}", payload(i), i % 10, f"text {i}") for i in range(n)]
    return spark.createDataFrame(spark.sparkContext.parallelize(rows, partitions), SCHEMA)


def check(manifest: str, n: int) -> None:
    """Every row exactly once, byte for byte, read back through TarDataset."""
    pytest.importorskip("torch")
    ds = tarindex.TarDataset(manifest)
    assert len(ds) == n
    seen = {}
    for i in range(n):
        s = ds[i]
        seen[s["__key__"]] = s
    assert sorted(seen) == [f"{i:06d}" for i in range(n)]
    for k, s in seen.items():
        i = int(k)
        assert s["bin"] == payload(i) and s["cls"] == str(i % 10).encode()
        assert s["txt"] == f"text {i}".encode()


def test_schema_is_shardrow() -> None:
    names = [f.split()[0] for f in tarindex.spark.ROW_SCHEMA.split(", ")]
    assert tuple(names) == ShardRow._fields


def test_write_round_trip_with_empty_partitions(spark: Any, tmp_path: Path) -> None:
    df = frame(spark, 36, 6)  # 6 rows a partition; partitions 1 and 4 filtered empty
    df = df.filter(~df["__key__"].between("000006", "000011") & ~df["__key__"].between("000024", "000029"))
    assert df.rdd.glom().map(len).collect() == [6, 0, 6, 6, 0, 6]
    t = tarindex.spark.write(df, str(tmp_path / "out"), maxcount=4, durable=False)
    assert t.n_samples == 24 and len(t.paths) == 8 and all(x.startswith("attempt-") for x in t.paths)
    assert [int(x.split("-")[1]) for x in t.paths] == [0, 0, 2, 2, 3, 3, 5, 5]  # partition order
    pytest.importorskip("torch")
    ds = tarindex.TarDataset(str(tmp_path / "out" / "data.json"))
    want = [i for i in range(36) if not (6 <= i <= 11 or 24 <= i <= 29)]
    assert [ds[j]["__key__"] for j in range(len(ds))] == [f"{i:06d}" for i in want]
    assert all(ds[j]["bin"] == payload(i) for j, i in enumerate(want))
    assert prune(str(tmp_path / "out"), str(tmp_path / "out" / "data.json")) == []


def test_a_task_that_fails_once_is_written_once(spark: Any, tmp_path: Path) -> None:
    n = 200
    marker = tmp_path / "failed-once"

    def to_sample(j: int, row: dict[str, Any]) -> dict[str, Any]:
        from pyspark import TaskContext

        tc = TaskContext.get()
        assert tc is not None
        if tc.partitionId() == 1 and tc.attemptNumber() == 0 and j == 50:
            marker.write_text("x")  # after 3 shards of this attempt were finished
            raise RuntimeError("lost executor")
        return {"__key__": row["__key__"], "bin": row["bin"], "cls": row["cls"], "txt": row["txt"]}

    out = str(tmp_path / "out")
    t = tarindex.spark.write(frame(spark, n, 3), out, maxcount=20, to_sample=to_sample)
    assert marker.exists()  # the first attempt did fail; its retry's rows were committed
    assert t.n_samples == n
    attempts = sorted(d for d in os.listdir(out) if d.startswith("attempt-00001-"))
    assert len(attempts) == 1 and attempts[0].endswith("-1-" + attempts[0].rsplit("-", 1)[1])
    check(os.path.join(out, "data.json"), n)


def test_a_task_that_always_fails_fails_the_job(spark: Any, tmp_path: Path) -> None:
    def bad(j: int, row: dict[str, Any]) -> Any:
        return ("not", "a dict")

    with pytest.raises(Exception, match="expected a dict"):
        tarindex.spark.write(frame(spark, 10, 2), str(tmp_path / "out"), to_sample=bad)
    assert not (tmp_path / "out" / "data.json").exists()


def test_scale_md_spark_example_runs(spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import re

    doc = (Path(__file__).parents[2] / "docs" / "SCALE.md").read_text()
    code = re.search(r"### Spark.*?```python\n(.*?)```", doc, re.S)
    assert code is not None, "docs/SCALE.md lost its Spark example"
    monkeypatch.chdir(tmp_path)
    exec(compile(code.group(1), "SCALE.md", "exec"), {})  # getOrCreate: this module's session
    assert (tmp_path / "spark-out" / "data.json").exists()
