"""tarindex.spark.write on a real local Spark session (local[2], task retries on)."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import tarindex
from tarindex.read.manifest import prune, read_manifest
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


# --- the Python Data Source API: spark.read.format("tarindex"), df.write.format("tarindex") ---

needs_source_api = pytest.mark.skipif(
    int(pyspark.__version__.split(".")[0]) < 4, reason="the Python Data Source API needs pyspark >= 4"
)


def shards_of(root: Path, n: int, maxcount: int) -> str:
    """``n`` samples (``bin``, ``cls``, ``json`` on two thirds) in shards, and their manifest."""
    with tarindex.ShardWriter(str(root / "in-%06d.tar"), maxcount=maxcount, durable=False) as w:
        for i in range(n):
            s: dict[str, Any] = {"__key__": f"{i:06d}", "bin": payload(i), "cls": i % 10}
            if i % 3:
                s["json"] = {"i": i, "even": i % 2 == 0}
            w.write(s)
    tarindex.write_manifest(str(root / "in-*.tar"), str(root / "data.json"))
    return str(root / "data.json")


@needs_source_api
def test_source_reads_sample_ranges_byte_exact(spark: Any, tmp_path: Path) -> None:
    src = shards_of(tmp_path, 1000, 500)  # 2 shards
    tarindex.spark.register(spark)
    df = spark.read.format("tarindex").option("partitions", 8).option("blockRows", 50).load(src)
    assert df.columns == ["__key__", "__index__", "bin", "cls", "json"]
    assert df.rdd.getNumPartitions() == 8  # not capped at 2 shards
    spans = df.rdd.mapPartitions(lambda it: [sorted(r["__index__"] for r in it)]).collect()
    assert [len(s) for s in spans] == [125] * 8
    assert all(s == list(range(s[0], s[0] + 125)) for s in spans)  # contiguous ranges
    ref = tarindex.ShardSet(src)
    rows = df.collect()
    assert sorted(r["__index__"] for r in rows) == list(range(1000))  # each exactly once
    for r in rows:
        s = ref.sample(r["__index__"])
        assert (r["__key__"], r["bin"], r["cls"], r["json"]) == (
            s["__key__"], s["bin"], int(s["cls"]), s.get("json")
        )


@needs_source_api
def test_source_fields_filter_and_join(spark: Any, tmp_path: Path) -> None:
    from pyspark.sql import functions as F

    src = shards_of(tmp_path, 600, 200)
    tarindex.spark.register(spark)
    meta = spark.read.format("tarindex").option("fields", "cls,json").load(src)
    assert meta.columns == ["__key__", "__index__", "cls", "json"]  # no bin column, no bin read
    parsed = meta.withColumn("j", F.from_json(F.col("json").cast("string"), "i long, even boolean"))
    picked = parsed.filter((F.col("cls") == 3) & F.col("j.even"))
    names = spark.createDataFrame([(k, f"name {k}") for k in range(10)], "cls long, name string")
    got = picked.join(names, "cls").select("__key__", "name", "j.i").collect()
    want = [i for i in range(600) if i % 10 == 3 and i % 2 == 0 and i % 3]
    assert sorted(r["i"] for r in got) == want == []  # i % 10 == 3 is odd: none
    odd = parsed.filter((F.col("cls") == 3) & ~F.col("j.even")).join(names, "cls").collect()
    assert sorted(r["__key__"] for r in odd) == [f"{i:06d}" for i in range(600) if i % 10 == 3 and i % 3]
    assert all(r["name"] == "name 3" for r in odd)
    with pytest.raises(Exception, match="not members"):
        spark.read.format("tarindex").schema("__key__ string, __index__ long, jpg binary").load(src).collect()


@needs_source_api
def test_source_write_with_empty_partitions_round_trip(spark: Any, tmp_path: Path) -> None:
    tarindex.spark.register(spark)
    df = frame(spark, 36, 6)
    df = df.filter(~df["__key__"].between("000006", "000011") & ~df["__key__"].between("000024", "000029"))
    out = str(tmp_path / "out")
    df.write.format("tarindex").option("maxcount", 4).option("durable", "false").mode("append").save(out)
    want = [i for i in range(36) if not (6 <= i <= 11 or 24 <= i <= 29)]
    ss = tarindex.ShardSet(os.path.join(out, "data.json"))
    assert [ss.sample(j)["__key__"] for j in range(len(ss))] == [f"{i:06d}" for i in want]
    check_subset(os.path.join(out, "data.json"), want)
    assert prune(out, os.path.join(out, "data.json")) == []
    # one dataset per directory: append refuses, overwrite replaces the manifest
    with pytest.raises(Exception, match="already there"):
        df.write.format("tarindex").mode("append").save(out)
    df.limit(5).write.format("tarindex").mode("overwrite").save(out)
    assert len(tarindex.ShardSet(os.path.join(out, "data.json"))) == 5
    assert len(prune(out, os.path.join(out, "data.json"))) > 0  # the first write's shards


def check_subset(manifest: str, want: list[int]) -> None:
    """The manifest's samples are exactly rows ``want``, byte for byte through TarDataset."""
    pytest.importorskip("torch")
    ds = tarindex.TarDataset(manifest)
    got = {ds[j]["__key__"]: ds[j] for j in range(len(ds))}
    assert sorted(got) == [f"{i:06d}" for i in want] and len(ds) == len(want)
    for i in want:
        s = got[f"{i:06d}"]
        assert s["bin"] == payload(i) and s["cls"] == str(i % 10).encode()
        assert s["txt"] == f"text {i}".encode()


@needs_source_api
def test_source_write_attempts_that_fail_or_die(spark: Any, tmp_path: Path) -> None:
    """Partition 1's first attempt raises midway; in partition 2's first attempt the Python
    worker evaluating the rows dies (``os._exit``). Each is retried once; the manifest lists
    only the committed attempts, every row once, and nothing of the failed attempts stays."""
    from pyspark import TaskContext
    from pyspark.sql import functions as F

    tarindex.spark.register(spark)
    marks = tmp_path / "marks"
    marks.mkdir()

    @F.udf("binary")
    def bin_of(key: str) -> bytes:
        tc = TaskContext.get()
        assert tc is not None
        i = int(key)
        if tc.attemptNumber() == 0 and i in (150, 260):
            (marks / key).write_text(str(tc.partitionId()))
            if i == 150:
                raise RuntimeError("lost executor")
            os._exit(1)  # the Python worker dies: no cleanup runs
        return payload(i)

    n = 300
    df = frame(spark, n, 3).withColumn("bin", bin_of("__key__"))  # 100 rows a partition
    out = str(tmp_path / "out")
    df.write.format("tarindex").option("maxcount", 20).mode("append").save(out)
    assert sorted(p.name for p in marks.iterdir()) == ["000150", "000260"]
    check_subset(os.path.join(out, "data.json"), list(range(n)))
    t = read_manifest(os.path.join(out, "data.json"))
    attempts = {os.path.basename(os.path.dirname(p)).split("-")[3] for p in t.paths}
    assert attempts == {"0", "1"}  # attempt numbers: the retries of partitions 1 and 2 committed
    assert prune(out, os.path.join(out, "data.json")) == []  # failed attempts removed theirs


@needs_source_api
def test_source_write_that_fails_aborts(spark: Any, tmp_path: Path) -> None:
    from pyspark.sql import functions as F

    tarindex.spark.register(spark)

    @F.udf("binary")
    def bad(key: str) -> bytes:
        if key == "000015":
            raise RuntimeError("always bad")
        return b"x"

    out = tmp_path / "out"
    with pytest.raises(Exception, match="always bad"):
        frame(spark, 40, 2).withColumn("bin", bad("__key__")).write.format("tarindex").option(
            "maxcount", 3
        ).mode("append").save(str(out))
    assert not (out / "data.json").exists()
    # abort removed this write's attempts; the failing task's own writer (a Python worker the
    # JVM stops once the UDF failed) may still be removing its attempt after the driver's
    # abort returned (remove_attempts' docstring): give it until the stage's workers are done
    deadline = time.monotonic() + 60
    while [p for p in out.glob("attempt-*")] and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not [p for p in out.glob("attempt-*")]


@needs_source_api
def test_scale_md_format_example_runs(spark: Any, tmp_path: Path) -> None:
    import re

    doc = (Path(__file__).parents[2] / "docs" / "SCALE.md").read_text()
    code = re.search(r"#### Spark's Python Data Source API.*?```python\n(.*?)```", doc, re.S)
    assert code is not None, "docs/SCALE.md lost its format('tarindex') example"
    # Spark's Python workers resolve relative paths in the directory Spark started in, so the
    # example's paths are pointed here (a chdir now would not reach them)
    src = code.group(1).replace('"fmt-out', f'"{tmp_path}/fmt-out')
    exec(compile(src, "SCALE.md", "exec"), {})
    assert len(tarindex.ShardSet(str(tmp_path / "fmt-out" / "data.json"))) == 1000
