"""Ray Data adapter: read shards as a Ray Dataset, write a Dataset as shards (docs/SCALE.md).

:func:`read` makes a dataset whose read tasks are contiguous global sample ranges
(:class:`TarIndexDatasource`); :func:`write` runs
:func:`tarindex.write.partition.write_partition` in every write task and writes the manifest
on the driver (:class:`TarIndexDatasink`). Needs ``ray[data]`` (``pip install
'tarindex[ray]'``); imported only by ``import tarindex.ray``.
"""

from __future__ import annotations

from .datasink import TarIndexDatasink, write
from .datasource import TarIndexDatasource, read

__all__ = ["TarIndexDatasink", "TarIndexDatasource", "read", "write"]
