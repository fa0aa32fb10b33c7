"""``tarindex.ray.write(ds, out)``: each Ray write task writes a partition, the driver the manifest.

Every write task runs :func:`tarindex.write.partition.write_partition` over its blocks, as
partition ``k`` = the task's index in the write operator (``TaskContext.task_idx``), under an
attempt name of this write's token and a random one, so a retried task never writes another
attempt's paths. The task returns its shards' rows; :meth:`TarIndexDatasink.on_write_complete`
(on the driver, once every task succeeded) writes the manifest from the rows Ray collected, one
successful attempt per task (:func:`tarindex.write.partition.commit`).
:meth:`TarIndexDatasink.on_write_failed` deletes what this write's attempts left; leftovers of
killed attempts are :func:`tarindex.read.manifest.prune`'s.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Callable, Iterable
from typing import Any

from ray.data import Dataset
from ray.data.block import BlockAccessor
from ray.data.datasource import Datasink, WriteResult

from ..format.manifest import ManifestTable
from ..format.url import is_url
from ..read.manifest import write_manifest_rows
from ..storage.remote import RemoteOptions
from ..stream.arrow import KEY, samples_of
from ..write.partition import ShardRow, remove_attempts, write_partition

__all__ = ["TarIndexDatasink", "write"]


class TarIndexDatasink(Datasink[list[ShardRow]]):
    """A Ray ``Datasink`` writing indexed tar shards and, on completion, one manifest.

    Rows to samples as :func:`tarindex.stream.arrow.samples_of`: column ``key`` is the key,
    every other column a member named by it (``__``-prefixed columns, such as the
    ``__index__`` of :func:`tarindex.ray.read`, are not written); or ``to_sample(j, row)``.
    Task ``k`` writes ``out/attempt-{k:05d}-{attempt}/part-{k:05d}-%06d.tar``; the manifest
    lists the tasks' shards in task order.

    Args:
        out: The dataset's directory (every worker can write it: local in one machine, a
            shared filesystem, or an fsspec URL such as ``s3://bucket/data``).
        maxcount: Samples per shard at most. Defaults to ``100_000``.
        maxsize: Bytes per shard at most. Defaults to ``3e9``.
        key: The key column. Defaults to ``"__key__"``.
        to_sample: ``f(j, row_dict) -> sample`` (pickled to the workers). Defaults to the
            column rule.
        manifest: Where the manifest goes. Defaults to ``out/data.json``.
        prefix: Start of every shard name. Defaults to ``"part"``.
        remote: How workers and the driver reach a URL ``out``.
        tmp_dir: Workers' local space for shards on their way to a URL.
        **writer_kw: :class:`~tarindex.ShardWriter` options.

    Attributes:
        table: The manifest written (after the write completed), else ``None``.
    """

    def __init__(
        self,
        out: str,
        *,
        maxcount: int = 100_000,
        maxsize: float = 3e9,
        key: str = KEY,
        to_sample: Callable[[int, Any], Any] | None = None,
        manifest: str | None = None,
        prefix: str = "part",
        remote: RemoteOptions | None = None,
        tmp_dir: str | None = None,
        **writer_kw: Any,
    ) -> None:
        out = os.fspath(out)
        self.out = out if is_url(out) else os.path.abspath(out)
        self.manifest = manifest if manifest is not None else f"{self.out.rstrip('/')}/data.json"
        self.token = secrets.token_hex(4)
        self.remote = remote or RemoteOptions()
        self.key, self.to_sample = key, to_sample
        self.options: dict[str, Any] = dict(
            maxcount=maxcount, maxsize=maxsize, to_sample=to_sample, prefix=prefix,
            remote=self.remote, tmp_dir=tmp_dir, **writer_kw,
        )
        self.table: ManifestTable | None = None

    def get_name(self) -> str:
        """``"TarIndex"``: Ray names the write operator by it."""
        return "TarIndex"

    def write(self, blocks: Iterable[Any], ctx: Any) -> list[ShardRow]:
        """Write this task's blocks as partition ``ctx.task_idx``; return its shards' rows."""
        tables = (BlockAccessor.for_block(b).to_arrow() for b in blocks)
        return write_partition(
            samples_of(tables, self.key, self.to_sample),
            self.out,
            int(ctx.task_idx),
            attempt=f"{self.token}-{secrets.token_hex(6)}",
            **self.options,
        )

    def on_write_complete(self, write_result: WriteResult[list[ShardRow]]) -> None:
        """Write the manifest from every task's rows (driver; once all tasks succeeded)."""
        rows = [r for got in write_result.write_returns for r in (got or [])]
        self.table = write_manifest_rows(rows, self.manifest, remote=self.remote)

    def on_write_failed(self, error: Exception) -> None:
        """Delete the shards this write's attempts left (best effort); no manifest is written."""
        try:
            remove_attempts(self.out, self.token, self.remote)
        except OSError:
            pass


def write(
    ds: Dataset,
    out: str,
    *,
    ray_remote_args: dict[str, Any] | None = None,
    concurrency: int | None = None,
    **kw: Any,
) -> ManifestTable:
    """Write a ``ray.data.Dataset`` as indexed tar shards plus a manifest; return the manifest.

    Args:
        ds: The dataset; one write task per block Ray hands the sink.
        out: As :class:`TarIndexDatasink`.
        ray_remote_args: Ray's options of the write tasks (``max_retries``,
            ``retry_exceptions=True`` to retry a task whose ``to_sample`` raised, ...).
        concurrency: Most write tasks at once. Defaults to Ray's choice.
        **kw: As :class:`TarIndexDatasink` (``maxcount``, ``maxsize``, ``to_sample``, ...).

    Returns:
        The manifest written (paths relative to its directory).

    Raises:
        Ray's error for a failed write (a task that failed every try, with its exception);
        no manifest is written then, and this write's shards are deleted.
    """
    sink = TarIndexDatasink(out, **kw)
    ds.write_datasink(sink, ray_remote_args=ray_remote_args, concurrency=concurrency)
    assert sink.table is not None  # on_write_complete ran: write_datasink returned
    return sink.table
