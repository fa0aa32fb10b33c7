"""``tarindex.spark.write(df, out)``: each Spark task writes its partition, the driver the manifest.

Every task runs :func:`tarindex.write.partition.write_partition` over its partition's rows
(``DataFrame.mapInArrow``: Arrow batches in, the shards' rows out), under an attempt name
made of a token of this call and the task's attempt id (``TaskContext.taskAttemptId()``,
unique within the application), so a retried task (``spark.task.maxFailures``) or a
speculative copy (``spark.speculation``) never writes another attempt's paths. The driver
collects the rows (Spark keeps one successful attempt's result per partition) and writes the
manifest from them (:func:`tarindex.read.manifest.write_manifest_rows`); files of failed or
killed attempts are listed in no manifest, and :func:`tarindex.read.manifest.prune` deletes
them.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Callable, Iterator
from typing import Any

from ..format.manifest import ManifestTable
from ..format.url import is_url
from ..read.manifest import write_manifest_rows
from ..storage.remote import RemoteOptions
from ..stream.arrow import samples_of
from ..write.partition import ShardRow, write_partition

__all__ = ["ROW_SCHEMA", "write"]

ROW_SCHEMA = (
    "partition long, attempt string, shard long, path string, samples long, members long, "
    "tar_bytes long, index_bytes long, head_crc long, tail_crc long, shard_id string"
)
"""The Spark DDL schema of the rows each task returns: :class:`ShardRow`'s fields."""


def write(
    df: Any,
    out: str,
    *,
    maxcount: int = 100_000,
    maxsize: float = 3e9,
    key: str = "__key__",
    to_sample: Callable[[int, Any], Any] | None = None,
    manifest: str | None = None,
    prefix: str = "part",
    remote: RemoteOptions | None = None,
    tmp_dir: str | None = None,
    **writer_kw: Any,
) -> ManifestTable:
    """Write a Spark DataFrame as indexed tar shards plus one manifest; return the manifest.

    Partition ``k`` of ``df`` becomes ``out/attempt-{k:05d}-{attempt}/part-{k:05d}-%06d.tar``
    (:func:`~tarindex.write.partition.write_partition`), in the DataFrame's row order; the
    dataset's sample order is partition by partition. Empty partitions write nothing. One
    Spark task (one Python worker, one core) per partition: a small table (a table of paths
    in one parquet file is one partition) is written by one task unless repartitioned
    first (``df.repartition(k)``).

    Rows to samples: by default column ``key`` (strings, valid keys: FORMAT.md §4) is the
    sample key and every other column is one member named by its column (``jpg``: binary,
    ``cls``: an integer, ``txt``: a string, ``json``: a struct or map, ...; values are encoded
    by extension as :class:`~tarindex.ShardWriter` does); a null leaves that member out.
    Or ``to_sample(j, row) -> dict``, ``row`` a dict of the row's columns and ``j`` its
    position in the partition (it runs on the executors: it must pickle).

    Args:
        df: A ``pyspark.sql.DataFrame``.
        out: The dataset's directory: a path every executor can write (local mode, a
            shared filesystem) or an fsspec URL (``s3://bucket/data``).
        maxcount: Samples per shard at most. Defaults to ``100_000``.
        maxsize: Bytes per shard at most. Defaults to ``3e9``.
        key: The key column. Defaults to ``"__key__"``.
        to_sample: ``f(j, row) -> sample dict``. Defaults to the column rule above.
        manifest: Where the manifest goes (``.json``). Defaults to ``out/data.json``.
        prefix: Start of every shard name. Defaults to ``"part"``.
        remote: How the executors and the driver reach a URL ``out`` (``storage_options``;
            pickled to the executors). Defaults to ``RemoteOptions()``.
        tmp_dir: Executors' local directory for shards on their way to a URL. Defaults
            to the system's temporary directory.
        **writer_kw: :class:`~tarindex.ShardWriter` options (``compress``, ``encoder``, ...).

    Returns:
        The manifest written (its paths relative to its directory).

    Raises:
        pyspark's error for a failed job (a task that failed ``spark.task.maxFailures``
        times, with the task's exception: e.g. a ``WriterError`` naming the bad sample);
        nothing is written to the manifest then.
    """
    base = out if is_url(out) else os.path.abspath(out)
    token = secrets.token_hex(4)  # this call's: attempt ids restart in a new application
    opts = remote or RemoteOptions()

    def task(batches: Iterator[Any]) -> Iterator[Any]:
        import pyarrow as pa  # type: ignore[import-untyped,unused-ignore]
        from pyspark import TaskContext

        tc = TaskContext.get()
        if tc is None:  # pragma: no cover - mapInArrow always runs inside a task
            raise RuntimeError("tarindex.spark.write: no TaskContext (not inside a Spark task)")
        rows = write_partition(
            samples_of(batches, key, to_sample),
            base,
            tc.partitionId(),
            attempt=f"{token}-{tc.attemptNumber()}-{tc.taskAttemptId()}",
            maxcount=maxcount,
            maxsize=maxsize,
            to_sample=to_sample,
            prefix=prefix,
            remote=opts,
            tmp_dir=tmp_dir,
            **writer_kw,
        )
        if rows:
            yield pa.RecordBatch.from_pylist([r._asdict() for r in rows])

    got = df.mapInArrow(task, ROW_SCHEMA).collect()
    rows = [ShardRow(**r.asDict()) for r in got]
    where = manifest if manifest is not None else f"{base.rstrip('/')}/data.json"
    return write_manifest_rows(rows, where, remote=opts)
