"""Spark adapter: a DataFrame into indexed tar shards and one manifest (docs/SCALE.md).

:func:`write` runs :func:`tarindex.write.partition.write_partition` in every Spark task
(through ``mapInArrow``) and writes the manifest on the driver from the rows the tasks
returned. Needs ``pyspark`` (and Java); imported only by ``import tarindex.spark``.
"""

from __future__ import annotations

from .write import ROW_SCHEMA, write

__all__ = ["ROW_SCHEMA", "write"]
