"""Spark adapter: DataFrames into indexed tar shards and back (docs/SCALE.md).

- :func:`write` runs :func:`tarindex.write.partition.write_partition` in every Spark task
  (through ``mapInArrow``) and writes the manifest on the driver from the rows the tasks
  returned (pyspark >= 3.5).
- :func:`register` adds the ``tarindex`` format of Spark's Python Data Source API
  (pyspark >= 4.0, :mod:`tarindex.spark.source`): ``spark.read.format("tarindex").load(
  "data.json")``, whose partitions are sample ranges, and ``df.write.format("tarindex")``.

Needs ``pyspark`` (and Java); imported only by ``import tarindex.spark``.
"""

from __future__ import annotations

from typing import Any

from .write import ROW_SCHEMA, write

__all__ = ["ROW_SCHEMA", "register", "write"]


def register(spark: Any) -> None:
    """Register the ``tarindex`` format with ``spark`` (a ``SparkSession``), once per session.

    Raises:
        ImportError: If pyspark is older than 4.0 (no Python Data Source API).
    """
    from .source import TarIndexDataSource

    spark.dataSource.register(TarIndexDataSource)
