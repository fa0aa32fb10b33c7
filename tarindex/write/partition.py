"""One engine task's share of a dataset: :func:`write_partition`, the unit every engine runs.

A Spark task, a Ray write task or a cluster array job writes its partition ``k`` with one
:class:`~tarindex.write.shards.ShardWriter` to deterministic names, ``part-{k:05d}-%06d.tar``
(:func:`task_pattern`), inside a directory of its own attempt, and returns the manifest row of
each shard it wrote (:class:`ShardRow`: counts, sizes, fingerprint, from what the writer knew
when it closed the shard). The driver keeps one attempt per partition (:func:`commit`) and
writes the manifest from those rows (:func:`tarindex.read.manifest.write_manifest_rows`): no
shard is reopened, so 100k shards make a manifest in well under a second.

Attempts, without a lock across hosts: every attempt writes under its own name
(``out/attempt-{k:05d}-{attempt}/``, the attempt a unique string: the engine's attempt id
plus a random token), so two attempts of one partition (a retry after a failure, a
speculative duplicate) never write the same path; *commit is the rows the driver receives*.
An attempt that fails or is superseded leaves files that no manifest lists:
:func:`tarindex.read.manifest.prune` lists and deletes them (``tarindex manifest --prune``).

Output to a URL (``s3://bucket/data``, any fsspec protocol that can write): each shard is
written to local temporary space, uploaded (tar, then index) as soon as it is closed and
deleted locally, so a task's disk holds at most the shard it is writing and the one it is
uploading: about ``2 * maxsize`` bytes.
"""

from __future__ import annotations

import os
import posixpath
import re
import secrets
import shutil
import tempfile
from collections.abc import Callable, Iterable
from operator import itemgetter
from typing import Any, NamedTuple

import numpy as np

from ..errors import WriterError
from ..format.manifest import ManifestRow
from ..format.spec import INDEX_SUFFIX
from ..format.url import is_url
from ..storage.remote import RemoteOptions, filesystem, local_path
from ..storage.remote.transport import fs_path
from .shards import ShardWriter

__all__ = [
    "ATTEMPT_PREFIX",
    "ShardRow",
    "attempt_dir",
    "commit",
    "remove_attempts",
    "task_pattern",
    "write_partition",
]

ATTEMPT_PREFIX = "attempt-"
"""Every attempt's directory under the output is ``attempt-{partition:05d}-{attempt}``."""

_ATTEMPT = re.compile(r"[A-Za-z0-9_.-]{1,64}")
_NOT_WRITER_OPTIONS = ("seed", "start_shard")  # ids and names are per partition here


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


class ShardRow(NamedTuple):
    """One shard written by :func:`write_partition`: where it came from, and its manifest row.

    Flat str and int fields (an Arrow or pandas row as it is); the last eight are the
    manifest's columns (:class:`~tarindex.format.manifest.ManifestRow`, FORMAT.md §9).
    """

    partition: int
    """The partition (task) number ``k``."""
    attempt: str
    """The attempt's unique name (its directory is ``attempt-{k:05d}-{attempt}``)."""
    shard: int
    """The shard's number within the attempt, ``0, 1, ...``."""
    path: str
    """Where the shard is: an absolute local path or a URL."""
    samples: int
    """Samples in the shard."""
    members: int
    """Indexed members."""
    tar_bytes: int
    """Size of the tar in bytes."""
    index_bytes: int
    """Size of its index in bytes."""
    head_crc: int
    """crc32 of the tar's first 4096 bytes (FORMAT.md §3)."""
    tail_crc: int
    """crc32 of its last 4096 bytes."""
    shard_id: str
    """The shard id, 32 hex digits (FORMAT.md §1)."""

    def manifest_row(self) -> ManifestRow:
        """The manifest's columns of this shard."""
        return ManifestRow(*self[3:])


def attempt_dir(out: str, partition: int, attempt: str) -> str:
    """The directory attempt ``attempt`` of partition ``partition`` writes: under ``out``.

    Raises:
        ValueError: If ``partition`` is negative or ``attempt`` is not 1 to 64 of
            ``[A-Za-z0-9_.-]``.
    """
    if int(partition) < 0:
        raise ValueError(f"partition={partition!r}: expected an integer >= 0")
    if not _ATTEMPT.fullmatch(attempt):
        raise ValueError(f"attempt={attempt!r}: expected 1 to 64 of [A-Za-z0-9_.-]")
    return posixpath.join(out.rstrip("/"), f"{ATTEMPT_PREFIX}{int(partition):05d}-{attempt}")


def _as_sample(j: int, item: Any, to_sample: Callable[[int, Any], Any] | None) -> dict[str, Any]:
    s = item if to_sample is None else to_sample(j, item)
    if not isinstance(s, dict):
        raise WriterError(
            f"item {j} of the partition: got a {type(s).__name__}, expected a dict "
            f"{{'__key__': str, ext: value}}; pass to_sample=f(index, item) -> dict to convert"
        )
    return s


class _Uploader:
    """Moves each closed shard (tar, then index) from local temp space to ``out``'s URL."""

    def __init__(self, url_dir: str, remote: RemoteOptions) -> None:
        self.url_dir = url_dir
        self.fs = filesystem(url_dir, remote)
        self.done: list[str] = []

    def url_of(self, local: str) -> str:
        return f"{self.url_dir}/{os.path.basename(local)}"

    def move(self, local: str) -> str:
        url = self.url_of(local)
        for src, dst in ((local, url), (local + INDEX_SUFFIX, url + INDEX_SUFFIX)):
            self.fs.put_file(src, fs_path(dst))
            self.done.append(dst)
            os.unlink(src)
        return url

    def remove_all(self) -> None:
        """Best effort: delete what this attempt uploaded (:func:`prune` finds the rest)."""
        try:
            if self.done:
                self.fs.rm([fs_path(u) for u in self.done])
        except Exception:
            pass


def write_partition(
    samples: Iterable[Any],
    out: str,
    partition: int,
    *,
    attempt: str | None = None,
    maxcount: int = 100_000,
    maxsize: float = 3e9,
    to_sample: Callable[[int, Any], Any] | None = None,
    prefix: str = "part",
    remote: RemoteOptions | None = None,
    tmp_dir: str | None = None,
    **writer_kw: Any,
) -> list[ShardRow]:
    """Write one partition's samples as shards and return their manifest rows.

    The shards go to ``{out}/attempt-{partition:05d}-{attempt}/{prefix}-{partition:05d}-%06d.tar``
    (:func:`attempt_dir`, :func:`task_pattern`), each with its index, written by one
    :class:`~tarindex.write.shards.ShardWriter` (same cut: ``maxcount`` samples or
    ``maxsize`` bytes per shard). An empty partition writes nothing and returns ``[]``.

    Output to a URL: each shard is written under ``tmp_dir``, uploaded when it closes (tar,
    then index) and deleted there; local disk holds about two shards at most. On an error the
    attempt's files are removed (best effort: a task killed meanwhile leaves them to
    :func:`tarindex.read.manifest.prune`) and the error is raised: the engine retries the task
    as a new attempt.

    Args:
        samples: The partition's items, in order: sample dicts (``{"__key__": str, ext:
            value}``) or anything ``to_sample`` converts.
        out: The dataset's directory: a local path or an fsspec URL (``s3://bucket/data``).
        partition: The partition number ``k >= 0``; shards sort by it, then by shard.
        attempt: This attempt's unique name (1 to 64 of ``[A-Za-z0-9_.-]``): an engine passes
            its attempt id plus a run token. Defaults to 16 random hex digits.
        maxcount: Samples per shard at most. Defaults to ``100_000``.
        maxsize: Bytes per shard at most (as :class:`~tarindex.write.shards.ShardWriter`).
            Defaults to ``3e9``.
        to_sample: ``f(j, item) -> dict`` with ``j`` the item's position in the partition.
            Defaults to none (items are sample dicts).
        prefix: Start of every shard name. Defaults to ``"part"``.
        remote: How to reach ``out`` when it is a URL (``storage_options``). Defaults to
            ``RemoteOptions()``.
        tmp_dir: Local directory for the shards being written to a URL. Defaults to the
            system's temporary directory.
        **writer_kw: :class:`~tarindex.write.shards.ShardWriter` options (``encoder``,
            ``mtime``, ``compress``, ``zstd_dict``, ``durable``, ...); not ``seed`` or
            ``start_shard`` (shard ids stay random, so partitions never share one).

    Returns:
        One :class:`ShardRow` per shard written, in shard order.

    Raises:
        WriterError: As :meth:`ShardWriter.write` (a bad sample, a key twice in a shard), or
            an item that is not a dict after ``to_sample``.
        ValueError: A negative ``partition``, a bad ``attempt`` or a refused writer option.
        OSError: Writing or uploading failed.
    """
    bad = sorted(set(writer_kw) & set(_NOT_WRITER_OPTIONS))
    if bad:
        raise ValueError(
            f"write_partition: {', '.join(bad)} cannot be set: shard names come from the "
            f"partition, and shard ids stay random so that no two partitions share one"
        )
    name = secrets.token_hex(8) if attempt is None else str(attempt)
    out = local_path(out)
    remote_out = is_url(out)
    target = attempt_dir(out if remote_out else os.path.abspath(out), partition, name)
    up: _Uploader | None = None
    if remote_out:
        up = _Uploader(target, remote or RemoteOptions())
        local_dir = tempfile.mkdtemp(prefix="tarindex-partition-", dir=tmp_dir)
        writer_kw.setdefault("durable", False)  # a scratch copy: the upload is what counts
    else:
        local_dir = target
    rows: list[ShardRow] = []

    def flush(w: ShardWriter) -> None:
        for row in w.rows[len(rows) :]:
            path = row.path if up is None else up.move(row.path)
            rows.append(ShardRow(partition, name, len(rows), path, *row[1:]))

    w = ShardWriter(
        task_pattern(local_dir, partition, prefix), maxcount=maxcount, maxsize=maxsize, **writer_kw
    )
    try:
        with w:
            for j, item in enumerate(samples):
                w.write(_as_sample(j, item, to_sample))
                if len(w.rows) > len(rows):
                    flush(w)
        flush(w)
    except BaseException:
        if up is not None:
            up.remove_all()
        else:
            shutil.rmtree(target, ignore_errors=True)
        raise
    finally:
        if up is not None:
            shutil.rmtree(local_dir, ignore_errors=True)
    return rows


def commit(rows: Iterable[ShardRow]) -> list[ShardRow]:
    """The rows of one attempt per partition, in (partition, shard) order: what is committed.

    The rows the driver received are the commit: for each partition the first attempt seen
    among ``rows`` is kept and any other attempt's rows are dropped (a speculative duplicate
    whose result also arrived; its files are leftovers for
    :func:`tarindex.read.manifest.prune`).

    Raises:
        WriterError: If a kept attempt's shard numbers are not ``0 .. n-1`` (some of its rows
            did not arrive, or arrived twice): naming the partition and the attempt.
    """
    kept: dict[int, str] = {}
    out = [r for r in rows if kept.setdefault(r.partition, r.attempt) == r.attempt]
    out.sort(key=itemgetter(0, 2))  # (partition, shard)
    part = np.fromiter((r.partition for r in out), np.int64, len(out))
    shard = np.fromiter((r.shard for r in out), np.int64, len(out))
    # shard numbers run 0, 1, ... from each partition's first row
    bad = shard != np.arange(len(out)) - np.searchsorted(part, part)
    if bad.any():
        k = int(part[np.argmax(bad)])
        got = shard[part == k].tolist()
        raise WriterError(
            f"partition {k}, attempt {kept[k]!r}: rows for shards {got}, expected "
            f"0..{len(got) - 1} once each; pass every row write_partition returned for that "
            f"attempt"
        )
    return out


def remove_attempts(out: str, token: str, remote: RemoteOptions | None = None) -> list[str]:
    """Delete every attempt directory under ``out`` whose attempt name starts with ``token``.

    An engine job names its attempts ``{token}-...`` (a random token of the job): when the
    job fails or is aborted, this removes all it wrote (committed attempts and leftovers
    alike) and nothing of another job's. A task still running may write after this returns;
    :func:`tarindex.read.manifest.prune` removes that later.

    Returns:
        The attempt directories deleted (paths or URLs), sorted.

    Raises:
        ValueError: If ``token`` is not 1 to 64 of ``[A-Za-z0-9_.-]``.
        OSError: Listing or deleting failed.
    """
    if not _ATTEMPT.fullmatch(token):
        raise ValueError(f"token={token!r}: expected 1 to 64 of [A-Za-z0-9_.-]")
    out = local_path(out).rstrip("/")
    mine = re.compile(re.escape(ATTEMPT_PREFIX) + r"\d{5,}-" + re.escape(token) + r"(?:-|$)")
    if is_url(out):
        fs = filesystem(out, remote or RemoteOptions())
        scheme = out.split("://", 1)[0]
        root = fs_path(out).rstrip("/")
        if not fs.exists(root):
            return []
        found = sorted(
            str(p).rstrip("/") for p in fs.ls(root, detail=False)
            if mine.match(posixpath.basename(str(p).rstrip("/")))
        )
        for d in found:
            fs.rm(d, recursive=True)
        return [f"{scheme}://{d}" for d in found]
    if not os.path.isdir(out):
        return []
    gone = sorted(e.path for e in os.scandir(out) if e.is_dir(follow_symlinks=False) and mine.match(e.name))
    for d in gone:
        shutil.rmtree(d, ignore_errors=True)
    return gone
