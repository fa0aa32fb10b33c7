"""Dataset manifests (FORMAT.md §9): one file listing every shard, so a dataset opens in one read.

``tarindex manifest SOURCE... -o data.json`` (or :func:`write_manifest`) opens every shard once
(the open-time checks of FORMAT.md §3: the manifest never records a shard whose index does not
match its tar) and records its path, sample and member counts, sizes and fingerprint. Every
dataset, :class:`~tarindex.read.ShardSet` and CLI command takes the manifest as its source;
the shards are checked against it when each is first opened (:meth:`ShardSet.reader`), and
:func:`check_manifest` checks them all now.

Writing from many machines: each task writes its own pattern (``out/part-{task:05d}-%06d.tar``,
:func:`tarindex.write.partition.task_pattern`), then one manifest is made over all of them; or
each engine task runs :func:`tarindex.write.partition.write_partition`, which returns the
manifest rows of its shards, and the driver writes the manifest from the rows it received
(:func:`write_manifest_rows`: no shard reopened); :func:`prune` deletes what failed or
superseded attempts left (docs/SCALE.md).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from typing import Any

from .._version import __version__
from ..errors import TarIndexError
from ..format.manifest import (
    ManifestRow,
    ManifestTable,
    decode_manifest,
    encode_manifest,
    relative_path,
    table_from_rows,
)
from ..format.spec import INDEX_SUFFIX
from ..storage.indexfile import write_atomic
from ..storage.remote import RemoteOptions, filesystem, is_url, local_path
from ..storage.remote.transport import fs_path
from ..write.partition import ATTEMPT_PREFIX, ShardRow, commit
from .options import OpenOptions
from .shard import ShardReader
from .shardset import ShardSet
from .sources import Source, expand_source, read_manifest

__all__ = [
    "ManifestTable",
    "build_manifest",
    "write_manifest",
    "write_manifest_rows",
    "read_manifest",
    "check_manifest",
    "prune",
]


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
    rows: list[ManifestRow] = []
    for p in expand_source(source):
        with ShardReader(p, check_crc=check_crc) as r:
            t = r.index
            rows.append(
                ManifestRow(
                    p if is_url(p) else os.path.abspath(p),
                    t.n_samples,
                    t.n_members,
                    t.tar_size,
                    t.index_bytes,
                    t.head_crc,
                    t.tail_crc,
                    t.shard_id.hex(),
                )
            )
    return _table(rows, location, absolute, "tarindex.manifest")


def _table(
    rows: Sequence[Sequence[Any]], location: str, absolute: bool, producer: str, first: int = 0
) -> ManifestTable:
    """The table of ``rows`` (absolute paths or URLs) as the manifest at ``location`` records it.

    ``rows`` as :func:`~tarindex.format.manifest.table_from_rows` takes them (``first``: the
    index of the path field).
    """
    t = table_from_rows(rows, {"producer": producer, "tarindex": __version__}, first=first)
    base = location if is_url(location) else os.path.abspath(location)
    inside = base.rpartition("/")[0] + "/"  # shards under the manifest's directory: a slice
    t.paths = [
        p
        if absolute and not is_url(p)
        else p[len(inside) :]
        if p.startswith(inside)
        else relative_path(base, p)
        for p in t.paths
    ]
    return t


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
    _check_out(out)
    t = build_manifest(source, out, absolute=absolute, check_crc=check_crc)
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    write_atomic(out, encode_manifest(t))
    return t


def _check_out(out: str) -> None:
    if not out.endswith(".json"):
        raise ValueError(f"{out}: a manifest's name must end in .json (that is how sources tell)")


def write_manifest_rows(
    rows: Iterable[ShardRow] | Iterable[ManifestRow],
    out: str,
    *,
    absolute: bool = False,
    remote: RemoteOptions | None = None,
) -> ManifestTable:
    """Write the manifest of shards from their rows only (FORMAT.md §9): no shard is opened.

    The driver's half of :func:`tarindex.write.partition.write_partition`: ``rows`` are the
    rows the tasks returned. :class:`~tarindex.write.partition.ShardRow` rows are committed
    first (:func:`~tarindex.write.partition.commit`: one attempt per partition, in (partition,
    shard) order); :class:`~tarindex.format.manifest.ManifestRow` rows (e.g.
    ``ShardWriter.rows``) are written in the order given. The manifest is checked as a reader
    checks it before it is written. 100k rows take well under a second.

    Args:
        rows: The shards' rows; paths absolute or URLs.
        out: The manifest's path or URL; it must end in ``.json``.
        absolute: Record absolute local paths. Defaults to ``False`` (relative to ``out``'s
            directory, URLs under it too).
        remote: How to reach ``out`` when it is a URL. Defaults to ``RemoteOptions()``.

    Returns:
        The table written (paths as recorded).

    Raises:
        ValueError: If ``out`` does not end in ``.json``.
        WriterError: Rows of a committed attempt missing or repeated (as ``commit``).
        FormatError: Rows that make no valid manifest (negative counts, a bad shard id).
        OSError: The file cannot be written (nothing is left at a local ``out`` then).
    """
    _check_out(out)
    got: list[Any] = list(rows)
    shard_rows = bool(got) and isinstance(got[0], ShardRow)
    if shard_rows:  # the fields before ShardRow.path say where a row came from
        got = commit(got)
    out = local_path(out)
    t = _table(got, out, absolute, "tarindex.write_manifest_rows", first=3 if shard_rows else 0)
    data = encode_manifest(t)
    decode_manifest(data, out)  # the reader's checks, before anything is written
    if is_url(out):
        filesystem(out, remote or RemoteOptions()).pipe_file(fs_path(out), data)
    else:
        os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
        write_atomic(out, data)
    return t


def prune(
    out: str,
    manifest: str,
    *,
    dry_run: bool = False,
    remote: RemoteOptions | None = None,
) -> list[str]:
    """Delete the files of attempts that the manifest does not list: what failed attempts left.

    Looks only inside the attempt directories under ``out``
    (``out/attempt-*/``, :func:`tarindex.write.partition.write_partition`): every file there
    that is neither a shard the manifest lists nor its index is a leftover (a failed or
    superseded attempt's shards, temp files, a killed writer's lock file); attempt
    directories left empty are removed. Run it when no task of the job can still be writing
    (a killed speculative task may still be uploading for a moment), and with the one
    manifest of the dataset that ``out`` holds.

    Args:
        out: The output directory (local or a URL) the tasks wrote.
        manifest: The manifest of what was committed.
        dry_run: Only list. Defaults to ``False``.
        remote: How to reach remote ``out`` and ``manifest``. Defaults to ``RemoteOptions()``.

    Returns:
        The leftovers (paths or URLs), sorted: deleted unless ``dry_run``.

    Raises:
        FileNotFoundError, FormatError: If the manifest cannot be read.
        OSError: A file that cannot be deleted.
    """
    opts = remote or RemoteOptions()
    t = read_manifest(manifest, opts)
    listed = [p if is_url(p) else os.path.abspath(p) for p in t.paths]
    keep = set(listed) | {p + INDEX_SUFFIX for p in listed}
    out = local_path(out).rstrip("/")
    if is_url(out):
        fs = filesystem(out, opts)
        scheme = out.split("://", 1)[0]
        root = fs_path(out).rstrip("/")
        found = [
            f"{scheme}://{p}"
            for p in fs.find(root)
            if p.startswith(root + "/")
            and p[len(root) + 1 :].split("/", 1)[0].startswith(ATTEMPT_PREFIX)
        ]
        left = sorted(p for p in found if p not in keep)
        if left and not dry_run:
            fs.rm([fs_path(p) for p in left])
        return left
    root = os.path.abspath(out)
    dirs = sorted(
        e.path
        for e in (os.scandir(root) if os.path.isdir(root) else ())
        if e.name.startswith(ATTEMPT_PREFIX) and e.is_dir(follow_symlinks=False)
    )
    left = []
    for d in dirs:
        for here, _, files in os.walk(d):
            left.extend(p for p in (os.path.join(here, f) for f in files) if p not in keep)
    left.sort()
    if not dry_run:
        for p in left:
            os.unlink(p)
        for d in dirs:
            for here, _, _ in sorted(os.walk(d), key=lambda w: -len(w[0])):
                try:
                    os.rmdir(here)
                except OSError:  # not empty: a committed attempt
                    pass
    return left


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
    ss = ShardSet(path, options=OpenOptions(max_open=1))
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
