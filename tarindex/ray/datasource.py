"""``tarindex.ray.read(source)``: a Ray Dataset whose read tasks are sample ranges, not shards.

The driver reads the manifest (or the index headers) only: the dataset's ``n`` samples are
cut into contiguous global ranges (:func:`tarindex.stream.arrow.cut_ranges`), as many as Ray
asks for (its ``parallelism``) but at least ``task_rows`` samples each (about 128 MiB unless
a parallelism is asked for), so the number of read tasks is not capped by the number of
shards, and each task's metadata holds its exact row count (``Dataset.count()`` reads no
data). A task yields Arrow tables of ``block_rows``
samples read by the read kernel (:func:`tarindex.stream.arrow.read_range`): ``fields=``
leaves the other members' bytes unread.
"""

from __future__ import annotations

import bisect
import functools
from collections.abc import Collection, Iterator
from typing import Any

from ray.data import Dataset, read_datasource
from ray.data.block import BlockMetadata
from ray.data.datasource import Datasource, ReadTask

from ..plan.checks import check_int
from ..read import OpenOptions, ShardSet
from ..read.fields import Fields
from ..storage.remote import RemoteOptions
from ..stream.arrow import (
    BLOCK_ROWS,
    INT_FIELDS,
    OpenSpec,
    arrow_schema,
    bytes_per_sample,
    columns_of,
    cut_ranges,
    read_range,
)

__all__ = ["TASK_BYTES", "TarIndexDatasource", "read"]

TASK_BYTES = 128 << 20
"""Default estimated bytes per read task (Ray's default ``target_max_block_size``)."""


def _read_task(
    spec: OpenSpec,
    start: int,
    stop: int,
    columns: list[str],
    int_fields: tuple[str, ...],
    rows: int,
    every_member: bool,
) -> Iterator[Any]:
    yield from read_range(spec.open(), start, stop, columns, int_fields, rows, every_member)


class TarIndexDatasource(Datasource):
    """A Ray ``Datasource`` over indexed tar shards: read tasks are global sample ranges.

    Columns: ``__key__`` (``string``), ``__index__`` (``int64``, the global sample index),
    then one per member extension (``fields``, or the first shard's extensions):
    ``int64`` for ``int_fields``, ``binary`` (the stored bytes) for the others, null where a
    sample lacks the member (:mod:`tarindex.stream.arrow`).

    Args:
        source: Shards, as :class:`~tarindex.read.ShardSet` takes them; a manifest
            (``data.json``) is best: the driver and every worker then read one file to open
            the dataset, whatever the shard count.
        fields: Extensions to read (others are never read). Defaults to ``None`` (the first
            shard's extensions; a member outside them fails the read, naming it).
        int_fields: Extensions read as ``int64``. Defaults to ``("cls",)``; ``()`` keeps
            every member as bytes.
        block_rows: Samples per Arrow table a task yields. Defaults to ``1024``.
        task_rows: The fewest samples a read task gets (``>= 1``; the last task of a
            dataset smaller than that has what is left). Defaults to ``None``: about
            :data:`TASK_BYTES` of the selected members per task (from the first shard's
            index), and never under ``block_rows``. Ray's own parallelism asks for 200 read
            tasks, and each task costs Ray tens of milliseconds of scheduling and result
            handling of its own: small tasks cost more than they read.
            :func:`read` passes ``block_rows`` when given a ``parallelism``.
        remote: How remote shards are read (:class:`tarindex.RemoteOptions`).
        options: How each worker's :class:`~tarindex.read.ShardSet` opens and checks the
            shards (:class:`tarindex.OpenOptions`: ``use_mmap``, ``verify_data``, ...; the
            driver opens them with the same options to plan). Defaults to
            ``OpenOptions()``.

    Raises:
        FileNotFoundError, IndexMissingError, FormatError: As :class:`~tarindex.read.ShardSet`
            (on the driver, at construction).
    """

    def __init__(
        self,
        source: Any,
        *,
        fields: Fields = None,
        int_fields: Collection[str] = INT_FIELDS,
        block_rows: int = BLOCK_ROWS,
        task_rows: int | None = None,
        remote: RemoteOptions | None = None,
        options: OpenOptions | None = None,
    ) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self._spec = OpenSpec.of(source, remote, options)
        shards = ShardSet(self._spec.source, options=self._spec.options, remote=self._spec.remote)
        self.columns = columns_of(shards, fields)
        """The member columns, in order."""
        self.every_member = fields is None  # columns from the first shard: refuse others
        self.int_fields = tuple(int_fields)
        self.block_rows = check_int("block_rows", block_rows, 1)
        self.starts: list[int] = shards.starts.tolist()
        self.paths: list[str] = list(shards.paths)
        self.schema = arrow_schema(self.columns, self.int_fields)
        """The tables' ``pyarrow.Schema``."""
        self.row_bytes = bytes_per_sample(shards, self.columns)
        """Estimated in-memory bytes per row (from the first shard's index)."""
        shards.close()
        if task_rows is None:
            task_rows = max(self.block_rows, int(TASK_BYTES // max(self.row_bytes, 1.0)))
        self.task_rows = check_int("task_rows", task_rows, 1)
        """The fewest samples a read task gets."""

    def __len__(self) -> int:
        return self.starts[-1]

    def get_name(self) -> str:
        """``"TarIndex"``: Ray names the read operator ``ReadTarIndex``."""
        return "TarIndex"

    def estimate_inmemory_data_size(self) -> int | None:
        """Rows times :attr:`row_bytes`: an estimate (Ray sizes its read parallelism by it)."""
        return int(len(self) * self.row_bytes)

    def get_read_tasks(
        self, parallelism: int, per_task_row_limit: int | None = None, data_context: Any = None
    ) -> list[ReadTask]:
        """One :class:`ReadTask` per range of :func:`~tarindex.stream.arrow.cut_ranges`.

        ``parallelism`` ranges (Ray's request), fewer where a range would hold under
        :attr:`task_rows` samples.
        """
        tasks = []
        for a, b in cut_ranges(len(self), max(1, int(parallelism)), self.task_rows):
            s0 = bisect.bisect_right(self.starts, a) - 1
            s1 = bisect.bisect_left(self.starts, b)
            meta = BlockMetadata(
                num_rows=b - a,
                size_bytes=int((b - a) * self.row_bytes),
                input_files=tuple(self.paths[s0:s1]),
                exec_stats=None,
            )
            fn = functools.partial(
                _read_task,
                self._spec,
                a,
                b,
                list(self.columns),
                self.int_fields,
                self.block_rows,
                self.every_member,
            )
            tasks.append(ReadTask(fn, meta, schema=self.schema, per_task_row_limit=per_task_row_limit))
        return tasks


def read(
    source: Any,
    *,
    fields: Fields = None,
    int_fields: Collection[str] = INT_FIELDS,
    block_rows: int = BLOCK_ROWS,
    task_rows: int | None = None,
    remote: RemoteOptions | None = None,
    options: OpenOptions | None = None,
    parallelism: int = -1,
    **read_kw: Any,
) -> Dataset:
    """Read indexed tar shards as a ``ray.data.Dataset`` (:class:`TarIndexDatasource`).

    ``parallelism`` (``override_num_blocks`` in Ray's newer words, passed through
    ``**read_kw``) asks for that many read tasks; each gets at least ``task_rows`` samples
    (``block_rows`` when a parallelism is given and ``task_rows`` is not). Without one, Ray
    asks for 200 and :class:`TarIndexDatasource`'s ``task_rows`` default keeps tasks at
    about :data:`TASK_BYTES` each.
    ``ds.count()`` comes from the tasks' metadata, reading no data.

    Raises:
        As :class:`TarIndexDatasource` (on the driver); a read task raises as
        :func:`tarindex.stream.arrow.block_table`.
    """
    asked = parallelism != -1 or read_kw.get("override_num_blocks") is not None
    ds = TarIndexDatasource(
        source,
        fields=fields,
        int_fields=int_fields,
        block_rows=block_rows,
        task_rows=block_rows if task_rows is None and asked else task_rows,
        remote=remote,
        options=options,
    )
    got: Dataset = read_datasource(ds, parallelism=parallelism, **read_kw)
    return got
