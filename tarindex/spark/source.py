"""``spark.read.format("tarindex")`` / ``df.write.format("tarindex")``: the Python Data Source API.

Needs pyspark >= 4.0 (the Python Data Source API); :func:`tarindex.spark.register` once per
session.

Reading: the driver reads the manifest (or the index headers) only and cuts the dataset's
samples into contiguous global ranges (:func:`tarindex.stream.arrow.cut_ranges`): partitions
are sample ranges, not shards. Each partition yields Arrow record batches of ``blockRows``
samples (:func:`tarindex.stream.arrow.read_range`); option ``fields`` leaves the other
members' bytes unread. Columns: ``__key__`` string, ``__index__`` long, one per extension
(``long`` for ``intFields``, ``binary`` otherwise), null where a sample lacks the member.

Writing: each task runs :func:`tarindex.write.partition.write_partition` as partition
``TaskContext.partitionId()`` under an attempt name of this write's token, the attempt number
and the task attempt id, and returns its shards' rows as its commit message. Spark passes
:meth:`TarIndexWriter.commit` one message per partition (from the attempt its commit
coordinator let commit) and it writes the manifest from them; :meth:`TarIndexWriter.abort`
deletes every attempt of this write. Files of attempts that failed or lost the commit are in
no manifest; :func:`tarindex.read.manifest.prune` deletes them.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from pyspark.sql.datasource import (
    DataSource,
    DataSourceArrowWriter,
    DataSourceReader,
    InputPartition,
    WriterCommitMessage,
)
from pyspark.sql.types import BinaryType, LongType, StringType, StructField, StructType

from ..format.url import is_url
from ..read import OpenOptions
from ..read.manifest import write_manifest_rows
from ..stream.arrow import (
    BLOCK_ROWS,
    INDEX,
    INT_FIELDS,
    KEY,
    OpenSpec,
    columns_of,
    cut_ranges,
    read_range,
    samples_of,
)
from ..write.partition import ShardRow, remove_attempts, write_partition

__all__ = ["NAME", "ROWS_PER_PARTITION", "TarIndexDataSource", "TarIndexReader", "TarIndexWriter"]

NAME = "tarindex"
"""The format name: ``spark.read.format("tarindex")``."""
ROWS_PER_PARTITION = 65_536
"""Default samples per read partition (option ``partitions`` sets the count instead)."""


def _names(value: str | None) -> list[str] | None:
    """An option's comma-separated names (``"cls, json"``); ``None`` when not given."""
    if value is None:
        return None
    return [x.strip() for x in value.split(",") if x.strip()]


def _int_option(options: Any, name: str, default: int, minimum: int) -> int:
    raw = options.get(name)
    try:
        v = default if raw is None else int(raw)
    except ValueError:
        v = minimum - 1
    if v < minimum:
        raise ValueError(f"option {name}={raw!r}: expected an integer >= {minimum}")
    return v


@dataclass(frozen=True)
class _Range(InputPartition):
    """One read partition: global samples ``start <= i < stop``."""

    start: int
    stop: int


@dataclass(frozen=True)
class _Rows(WriterCommitMessage):
    """One task's commit message: the rows of the shards it wrote (tuples of ShardRow fields)."""

    rows: list[tuple[Any, ...]]


class TarIndexDataSource(DataSource):
    """The ``tarindex`` format of Spark's Python Data Source API.

    Read options: ``path`` (``load(path)``: a manifest ``data.json``, best, or anything
    :class:`~tarindex.read.ShardSet` takes), ``fields`` (comma-separated extensions to read;
    defaults to the first shard's), ``intFields`` (read as ``long``; defaults to ``"cls"``,
    ``""`` for none), ``partitions`` (read partitions; defaults to one per
    :data:`ROWS_PER_PARTITION` samples), ``blockRows`` (samples per Arrow batch, and the
    fewest a partition gets; defaults to ``1024``), ``verifyData`` (``"true"``: check each
    member's crc32).

    Write options: ``path`` (``save(path)``: the output directory, local or a URL),
    ``maxcount`` (defaults to ``100000``), ``maxsize`` (bytes, defaults to ``3e9``), ``key``
    (the key column, defaults to ``__key__``), ``manifest`` (defaults to ``path/data.json``),
    ``prefix`` (defaults to ``part``), ``tmpDir``, ``durable`` (``"false"``: no fsync). Every
    other column is one member named by the column (binary as is, strings UTF-8, ``cls``
    integers as decimal text); a null leaves it out; ``__``-prefixed columns are skipped.
    Mode ``overwrite`` replaces the manifest (the old shards are then in none: ``tarindex
    manifest --prune``); mode ``append`` refuses an existing manifest (one manifest per
    dataset directory).
    """

    @classmethod
    def name(cls) -> str:
        """``"tarindex"``."""
        return NAME

    def _spec(self) -> OpenSpec:
        path = self.options.get("path")
        if not path:
            raise ValueError("tarindex: no source; use spark.read.format('tarindex').load('data.json')")
        verify = str(self.options.get("verifyData", "false")).lower() == "true"
        return OpenSpec.of(path, None, OpenOptions(verify_data=verify))

    def _columns(self) -> tuple[list[str], tuple[str, ...]]:
        ints = _names(self.options.get("intFields"))
        cols = columns_of(self._spec().open(), _names(self.options.get("fields")))
        return cols, tuple(INT_FIELDS if ints is None else ints)

    def schema(self) -> StructType:
        """``__key__`` string, ``__index__`` long, one column per member (see the class)."""
        cols, ints = self._columns()
        return StructType(
            [StructField(KEY, StringType(), False), StructField(INDEX, LongType(), False)]
            + [StructField(c, LongType() if c in ints else BinaryType(), True) for c in cols]
        )

    def reader(self, schema: StructType) -> TarIndexReader:
        """The reader of ``schema``'s member columns (:class:`TarIndexReader`)."""
        cols, ints = self._columns()
        wanted = [f.name for f in schema.fields if f.name not in (KEY, INDEX)]
        unknown = [c for c in wanted if c not in cols]
        if unknown:
            raise ValueError(f"tarindex: columns {unknown} are not members of the dataset ({cols})")
        every = self.options.get("fields") is None and wanted == cols
        return TarIndexReader(self._spec(), wanted, ints, self.options, every)

    def writer(self, schema: StructType, overwrite: bool) -> TarIndexWriter:
        """The writer of ``df.write.format("tarindex")`` (:class:`TarIndexWriter`)."""
        return TarIndexWriter(self.options, overwrite)


class TarIndexReader(DataSourceReader):
    """Partitions = contiguous global sample ranges; each yields Arrow record batches."""

    def __init__(
        self,
        spec: OpenSpec,
        columns: list[str],
        ints: tuple[str, ...],
        options: Any,
        every_member: bool = False,
    ) -> None:
        self.spec, self.columns, self.ints, self.every = spec, columns, ints, every_member
        self.block_rows = _int_option(options, "blockRows", BLOCK_ROWS, 1)
        n = len(spec.open())
        self.n_samples = n
        self.tasks = _int_option(options, "partitions", max(1, -(-n // ROWS_PER_PARTITION)), 1)

    def partitions(self) -> Sequence[_Range]:
        """One partition per range of :func:`~tarindex.stream.arrow.cut_ranges`."""
        got = [_Range(a, b) for a, b in cut_ranges(self.n_samples, self.tasks, self.block_rows)]
        return got or [_Range(0, 0)]

    def read(self, partition: InputPartition) -> Iterator[Any]:
        """The partition's samples as ``pyarrow.RecordBatch``es of ``blockRows`` rows."""
        if not isinstance(partition, _Range):
            raise TypeError(f"tarindex: partition {partition!r} is not one partitions() made")
        if partition.stop > partition.start:
            shards = self.spec.open()
            for t in read_range(shards, partition.start, partition.stop, self.columns, self.ints,
                                self.block_rows, self.every):
                yield from t.to_batches()


class TarIndexWriter(DataSourceArrowWriter):
    """Each task writes its partition's shards; the driver commits the manifest or aborts."""

    def __init__(self, options: Any, overwrite: bool) -> None:
        out = options.get("path")
        if not out:
            raise ValueError("tarindex: no output; use df.write.format('tarindex').save('out')")
        self.out = out if is_url(out) else os.path.abspath(out)
        self.manifest = options.get("manifest") or f"{self.out.rstrip('/')}/data.json"
        if not overwrite and not is_url(self.manifest) and os.path.exists(self.manifest):
            raise FileExistsError(
                f"{self.manifest}: a manifest is already there (one dataset per directory); "
                f"use .mode('overwrite') to replace it, or another path"
            )
        self.token = secrets.token_hex(4)
        self.key = options.get("key") or KEY
        self.kw: dict[str, Any] = {
            "maxcount": _int_option(options, "maxcount", 100_000, 1),
            "maxsize": float(options.get("maxsize", 3e9)),
            "prefix": options.get("prefix") or "part",
            "tmp_dir": options.get("tmpDir"),
        }
        if str(options.get("durable", "true")).lower() == "false":
            self.kw["durable"] = False

    def write(self, iterator: Iterator[Any]) -> _Rows:
        """Write this task's record batches as its partition; its rows are the message."""
        from pyspark import TaskContext

        tc = TaskContext.get()
        if tc is None:  # pragma: no cover - Spark always runs write in a task
            raise RuntimeError("tarindex: no TaskContext (not inside a Spark task)")
        rows = write_partition(
            samples_of(iterator, self.key),
            self.out,
            tc.partitionId(),
            attempt=f"{self.token}-{tc.attemptNumber()}-{tc.taskAttemptId()}",
            **self.kw,
        )
        return _Rows([tuple(r) for r in rows])

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        """Write the manifest from the committed tasks' rows (driver, all tasks succeeded)."""
        rows = [ShardRow(*r) for m in messages if isinstance(m, _Rows) for r in m.rows]
        write_manifest_rows(rows, self.manifest)

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        """Delete every attempt of this write (no manifest is written)."""
        remove_attempts(self.out, self.token)
