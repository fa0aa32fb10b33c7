"""The read core: shards, sets of shards, blocks, and the loops that read them (docs/READING.md).

- :mod:`~tarindex.read.shard`: :class:`ShardReader`, one open shard (index mapped, tar checked).
- :mod:`~tarindex.read.shardset`: :class:`ShardSet`, many shards as one sequence of samples;
  :mod:`~tarindex.read.options`: :class:`OpenOptions`, how it opens and checks them.
- :mod:`~tarindex.read.block`: :class:`Block`, samples as tables plus buffers; the batch copy.
- :mod:`~tarindex.read.hot`: :class:`HotTables`, the one structure the per-sample loops read.
- :mod:`~tarindex.read.kernel`: which loops run (compiled ``_kernel`` or Python), chosen once.
- :mod:`~tarindex.read.checks`: every guard once (chunk guard, cut check, open-time checks).
- :mod:`~tarindex.read.spanner`: global index -> ``(shard, j)``.
- :mod:`~tarindex.read.pool`: the LRU of open readers, the descriptor bound, fork safety.
- :mod:`~tarindex.read.batch`, :mod:`~tarindex.read.keys`, :mod:`~tarindex.read.prefetch`:
  batches across shards, key lookup, remote read-ahead.
- :mod:`~tarindex.read.takes`: :class:`~tarindex.read.takes.Takes`, what only the streaming
  executors read through (``ShardSet.takes()``); not on the user-facing objects.
"""

from .block import Block, Sample, copy_members, crc_mismatches, data_error
from .checks import CHUNK
from .fields import Fields, check_fields, field_set
from .hot import HotTables
from .kernel import read_kernel
from .options import OpenOptions
from .paths import index_for, read_sample_count
from .pool import DEFAULT_MAX_OPEN, ReaderPool, open_shard_bound
from .shard import ShardReader, is_up_to_date
from .shardset import ShardSet
from .spanner import check_index, check_indices

__all__ = [
    "Block",
    "CHUNK",
    "DEFAULT_MAX_OPEN",
    "Fields",
    "check_fields",
    "HotTables",
    "OpenOptions",
    "ReaderPool",
    "Sample",
    "ShardReader",
    "ShardSet",
    "copy_members",
    "crc_mismatches",
    "data_error",
    "field_set",
    "index_for",
    "is_up_to_date",
    "open_shard_bound",
    "read_kernel",
    "read_sample_count",
    "check_index",
    "check_indices",
]
