"""Dataset manifests (FORMAT.md §9): one file listing every shard, so a dataset opens in one read.

``tarindex manifest SOURCE... -o data.json`` (or :func:`write_manifest`) opens every shard once
(the open-time checks of FORMAT.md §3: the manifest never records a shard whose index does not
match its tar) and records its path, sample and member counts, sizes and fingerprint. Every
dataset, :class:`~tarindex.read.ShardSet` and CLI command takes the manifest as its source;
the shards are checked against it when each is first opened (:meth:`ShardSet.reader`), and
:func:`check_manifest` checks them all now.

Writing from many machines: each task writes its own pattern (``out/part-{task:05d}-%06d.tar``,
one :class:`~tarindex.writer.ShardWriter` per task: names never collide, and the pattern lock
refuses a second writer of one pattern), then one manifest is made over all of them
(docs/MANIFEST.md).
"""

from __future__ import annotations

import os
from collections.abc import Sequence

import numpy as np

from .._version import __version__
from ..errors import TarIndexError
from ..format.manifest import ManifestTable, encode_manifest, relative_path
from ..storage.indexfile import write_atomic
from ..storage.remote import is_url
from .shard import ShardReader
from .shardset import ShardSet
from .sources import Source, expand_source, read_manifest

__all__ = [
    "ManifestTable",
    "build_manifest",
    "write_manifest",
    "read_manifest",
    "check_manifest",
    "task_pattern",
]


def task_pattern(directory: str, task: int, prefix: str = "part") -> str:
    """Return the shard pattern of one of many independent writers: collision-free names.

    ``task_pattern("out", 3)`` is ``"out/part-00003-%06d.tar"``: each task (a cluster job's
    array index, a ``torch.distributed`` rank) writes its own pattern with its own
    :class:`~tarindex.writer.ShardWriter`, so no two tasks ever write the same path, and
    ``out/part-*.tar`` sorts by task, then shard. Then one manifest lists them all
    (:func:`write_manifest`).

    Args:
        directory: Where the shards go (shared by all tasks).
        task: This task's number, ``>= 0``.
        prefix: Start of every shard name. Defaults to ``"part"``.

    Raises:
        ValueError: If ``task`` is negative or ``prefix`` holds ``%`` or ``/``.
    """
    if int(task) < 0:
        raise ValueError(f"task={task!r}: expected an integer >= 0")
    if "%" in prefix or "/" in prefix:
        raise ValueError(f"prefix={prefix!r}: no '%' or '/' in a shard name prefix")
    return os.path.join(directory, f"{prefix}-{int(task):05d}-%06d.tar")


def build_manifest(
    source: Source, location: str, *, absolute: bool = False, check_crc: bool = True
) -> ManifestTable:
    """Open every shard of ``source`` once and return its manifest table (FORMAT.md §9).

    Args:
        source: Shards (anything :func:`tarindex.read.sources.expand_source` takes, manifests included).
        location: Where the manifest will be written: paths are made relative to its
            directory.
        absolute: Record absolute paths instead. Defaults to ``False``.
        check_crc: Check each index's crc32 while opening it. Defaults to ``True``.

    Raises:
        FileNotFoundError: Nothing matches ``source``, or a listed shard is missing.
        IndexMissingError, FormatError, StaleIndexError: A shard whose index is missing,
            corrupt or stale (as :class:`~tarindex.read.ShardReader`); nothing is recorded
            for a shard that does not open.
    """
    paths = expand_source(source)
    base = location if is_url(location) else os.path.abspath(location)
    n = len(paths)
    cols = {c: np.zeros(n, np.int64) for c in ("samples", "members", "tar_bytes", "index_bytes")}
    head = np.zeros(n, np.int64)
    tail = np.zeros(n, np.int64)
    names: list[str] = []
    sids: list[str] = []
    for k, p in enumerate(paths):
        with ShardReader(p, check_crc=check_crc) as r:
            t = r.index
            cols["samples"][k] = t.n_samples
            cols["members"][k] = t.n_members
            cols["tar_bytes"][k] = t.tar_size
            cols["index_bytes"][k] = t.index_bytes
            head[k], tail[k] = t.head_crc, t.tail_crc
            sids.append(t.shard_id.hex())
        local = p if is_url(p) else os.path.abspath(p)
        names.append(local if absolute and not is_url(p) else relative_path(base, local))
    return ManifestTable(
        paths=names,
        head_crc=head,
        tail_crc=tail,
        shard_id=sids,
        meta={"producer": "tarindex.manifest", "tarindex": __version__},
        **cols,
    )


def write_manifest(
    source: Source, out: str, *, absolute: bool = False, check_crc: bool = True
) -> ManifestTable:
    """Make the manifest of ``source`` (:func:`build_manifest`) and write it atomically to ``out``.

    Args:
        source: Shards (paths, globs, braces, directories, manifests).
        out: The manifest's path; it must end in ``.json`` (how sources recognise it).
        absolute: Record absolute paths. Defaults to ``False`` (relative to ``out``'s
            directory, so the dataset directory can be moved or copied whole).
        check_crc: As :func:`build_manifest`. Defaults to ``True``.

    Returns:
        The table written (paths as recorded).

    Raises:
        ValueError: If ``out`` does not end in ``.json``.
        OSError: If the file cannot be written (nothing is left at ``out`` then).
        FileNotFoundError, IndexMissingError, FormatError, StaleIndexError: As
            :func:`build_manifest`.
    """
    if not out.endswith(".json"):
        raise ValueError(f"{out}: a manifest's name must end in .json (that is how sources tell)")
    t = build_manifest(source, out, absolute=absolute, check_crc=check_crc)
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    write_atomic(out, encode_manifest(t))
    return t


def check_manifest(path: str, shards: Sequence[int] | None = None) -> list[str]:
    """Open every shard the manifest at ``path`` lists and compare it with the manifest.

    Each shard gets the checks of its first open in a dataset (FORMAT.md §3, §9), now.

    Args:
        path: The manifest.
        shards: Only these shard numbers. Defaults to all.

    Returns:
        One line per shard that is missing, changed, stale or corrupt (naming it); empty if
        every shard matches.

    Raises:
        FileNotFoundError, FormatError: If the manifest itself cannot be read.
    """
    ss = ShardSet(path, max_open=1)
    problems: list[str] = []
    try:
        for s in range(ss.n_shards) if shards is None else shards:
            try:
                ss.reader(s)
            except (TarIndexError, OSError) as e:
                msg = " ".join(str(e).split())
                problems.append(msg if msg.startswith(ss.paths[s]) else f"{ss.paths[s]}: {msg}")
    finally:
        ss.close()
    return problems
