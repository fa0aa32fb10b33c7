"""Expand a dataset source (path, URL, list, brace pattern, glob, directory, manifest) into shards.

URLs (``https://``, ``s3://``, any fsspec protocol) are expanded too: braces as text, globs
and directories (a URL ending in ``/``) by listing through fsspec
(:func:`tarindex.remote.expand_remote`). ``file://`` URLs are local paths. A path or URL
ending in ``.json`` is a dataset manifest (FORMAT.md §9): its shards, read with one read.
"""

from __future__ import annotations

import glob
import os
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Union

import numpy as np
from numpy.typing import NDArray

from ..format.manifest import ManifestTable, decode_manifest, resolve_paths
from ..format.spec import INDEX_SUFFIX, SHARD_SUFFIXES
from ..storage.remote import (
    DEFAULT,
    MANIFEST_MAX_BYTES,
    RemoteOptions,
    expand_remote,
    is_url,
    local_path,
    read_whole,
)

__all__ = [
    "Source",
    "MANIFEST_SUFFIX",
    "ShardList",
    "expand_braces",
    "expand_source",
    "expand_shards",
    "is_manifest",
    "read_manifest",
]

MANIFEST_SUFFIX = ".json"
"""A source path ending in this is a dataset manifest (FORMAT.md §9), never a shard."""

Source = Union[str, "os.PathLike[str]", Iterable[Union[str, "os.PathLike[str]"]]]

_BRACE = re.compile(r"\{([^{}]*)\}")
_INT = re.compile(r"-?[0-9]+")  # ASCII digits only: int() would also take "1_0", " 5", "٣"
MAX_EXPANSION = 1_000_000
"""Most paths one brace pattern may expand to; ``{0..100000000}`` is a typo, not 10^8 shards."""


def expand_braces(pattern: str, limit: int = MAX_EXPANSION) -> list[str]:
    """Expand ``{000..009}`` ranges (zero padding kept) and ``{a,b,c}`` lists, left to right.

    Args:
        pattern: A path with zero or more ``{...}`` groups (not nested).
        limit: Most paths the pattern may expand to. Defaults to ``MAX_EXPANSION``.

    Examples:
        ``"train-{000..002}.tar"`` -> ``["train-000.tar", "train-001.tar", "train-002.tar"]``.

    Raises:
        ValueError: For a range whose ends are not integers, or a pattern that expands to more
            than ``limit`` paths (checked before the list is built).
    """
    n = 1  # fail fast on "{0..999}{0..999}{0..999}": product of the groups' sizes
    for m in _BRACE.finditer(pattern):
        lo_s, dots, hi_s = m.group(1).partition("..")
        if (
            dots
            and _INT.fullmatch(lo_s)
            and _INT.fullmatch(hi_s)
            and max(len(lo_s), len(hi_s)) <= 18
        ):
            n *= abs(int(hi_s) - int(lo_s)) + 1
        elif not dots:
            n *= m.group(1).count(",") + 1
        if n > limit:
            raise _too_many(pattern, limit)
    out: list[str] = []
    _expand(pattern, pattern, limit, out)
    return out


def _too_many(pattern: str, limit: int) -> ValueError:
    return ValueError(
        f"brace pattern {pattern!r} expands to more than {limit} paths; check the range ends "
        f"(or pass a list of paths)"
    )


def _expand(pattern: str, whole: str, limit: int, out: list[str]) -> None:
    m = _BRACE.search(pattern)
    if m is None:
        if len(out) >= limit:
            raise _too_many(whole, limit)
        out.append(pattern)
        return
    body = m.group(1)
    head, tail = pattern[: m.start()], pattern[m.end() :]
    if ".." in body:
        lo_s, hi_s = body.split("..", 1)
        if not (_INT.fullmatch(lo_s) and _INT.fullmatch(hi_s)) or max(len(lo_s), len(hi_s)) > 18:
            raise ValueError(
                f"brace range {{{body}}} in {whole!r}: ends must be integers (ASCII digits, at "
                f"most 18)"
            )
        lo, hi = int(lo_s), int(hi_s)
        if abs(hi - lo) >= limit:
            raise _too_many(whole, limit)
        width = len(lo_s) if lo_s.startswith("0") and len(lo_s) > 1 else 0
        step = 1 if hi >= lo else -1
        items: Iterable[str] = (f"{i:0{width}d}" for i in range(lo, hi + step, step))
    else:
        items = body.split(",")
    for item in items:
        _expand(head + item + tail, whole, limit, out)


def is_manifest(path: str) -> bool:
    """True if the source item ``path`` names a dataset manifest: it ends in ``.json``."""
    return path.endswith(MANIFEST_SUFFIX)


def read_manifest(path: str, remote: RemoteOptions | None = None) -> ManifestTable:
    """Read a manifest (FORMAT.md §9) with one read; its paths resolved against its directory.

    Args:
        path: The manifest's path or URL.
        remote: How to reach a remote manifest. Defaults to ``RemoteOptions()``.

    Returns:
        The table, with :attr:`~tarindex.format.manifest.ManifestTable.paths` resolved
        (:func:`tarindex.format.manifest.resolve_paths`: relative ones against the manifest's
        directory, a local path or a URL); no shard is touched.

    Raises:
        FileNotFoundError: If the manifest does not exist.
        FormatError: If it is not a valid manifest (the message names the field).
        RemoteError: A remote manifest that cannot be read (after retries).
    """
    if is_url(path):
        opts = remote or DEFAULT
        data = read_whole(path, opts, MANIFEST_MAX_BYTES)
    else:
        path = local_path(path)
        with open(path, "rb") as f:
            data = f.read()
    t = decode_manifest(data, path)
    t.paths = resolve_paths(path, t.paths)
    return t


@dataclass
class ShardList:
    """The shards of a source, and what manifests recorded about them (FORMAT.md §9).

    Made by :func:`expand_shards`. Per shard, the manifest columns (``-1`` / ``""`` for a
    shard that no manifest lists) and the manifest that lists it.
    """

    paths: list[str]
    """Shard paths (or URLs), in sample order."""
    samples: NDArray[np.int64]
    """Samples per shard from a manifest, ``-1`` if not listed in one (read from the index)."""
    members: NDArray[np.int64]
    """Members per shard from a manifest, ``-1`` if not listed."""
    tar_bytes: NDArray[np.int64]
    """Tar size in bytes from a manifest, ``-1`` if not listed."""
    head_crc: NDArray[np.int64]
    """``head_crc`` from a manifest, ``-1`` if not listed."""
    tail_crc: NDArray[np.int64]
    """``tail_crc`` from a manifest, ``-1`` if not listed."""
    shard_id: list[str]
    """Shard id (32 hex digits) from a manifest, ``""`` if none or not listed."""
    origin: list[str]
    """The manifest that lists each shard, ``""`` if none."""

    @property
    def listed(self) -> bool:
        """True if some shard comes from a manifest."""
        return bool((self.samples >= 0).any())


def _items(source: Source) -> list[str]:
    """``source`` as a list of path strings: one path, or each of a sequence.

    Raises:
        TypeError: If ``source`` is ``bytes`` (iterating would give ints).
    """
    if isinstance(source, (str, os.PathLike)):
        return [os.fspath(source)]
    if isinstance(source, (bytes, bytearray)):
        raise TypeError(f"source {source!r}: pass a str path (os.fsdecode it), not bytes")
    return [os.fspath(s) for s in source]


def expand_shards(source: Source, remote: RemoteOptions | None = None) -> ShardList:
    """Return the shards of ``source`` with what their manifests recorded, in a stable order.

    As :func:`expand_source`; an item ending in ``.json`` is a manifest (FORMAT.md §9), read
    with one read and expanded to its shards, which are not touched (not even checked to
    exist: a missing or changed shard is reported when it is opened).

    Raises:
        FileNotFoundError: If nothing matches, or a manifest does not exist.
        FormatError: If a manifest is not valid.
        ValueError, TypeError: As :func:`expand_source`.
    """
    items = _items(source)
    paths: list[str] = []
    cols: list[list[NDArray[np.int64]]] = [[] for _ in range(5)]
    sids: list[str] = []
    origin: list[str] = []
    plain: list[str] = []

    def flush() -> None:
        if plain:
            got = expand_source(plain, remote)
            paths.extend(got)
            for c in cols:
                c.append(np.full(len(got), -1, np.int64))
            sids.extend([""] * len(got))
            origin.extend([""] * len(got))
            plain.clear()

    for item in items:
        if not is_manifest(item):
            plain.append(item)
            continue
        flush()
        t = read_manifest(item, remote)
        paths.extend(t.paths)
        for c, a in zip(
            cols, (t.samples, t.members, t.tar_bytes, t.head_crc, t.tail_crc), strict=True
        ):
            c.append(a)
        sids.extend(t.shard_id)
        origin.extend([item] * t.n_shards)
    flush()
    if not paths:
        raise FileNotFoundError(f"{source!r}: no shards")
    samples, members, tar_bytes, head, tail = (np.concatenate(c) for c in cols)
    return ShardList(paths, samples, members, tar_bytes, head, tail, sids, origin)


def expand_source(source: Source, remote: RemoteOptions | None = None) -> list[str]:
    """Return the shard paths (or URLs) of ``source``, in a stable order.

    ``source`` may be a path, a directory (its ``*.tar``, ``*.tar.gz`` and ``*.tgz`` files,
    sorted), a glob (sorted
    matches; index files, manifests and temp files left out), a brace pattern (in pattern
    order), a dataset manifest (a path ending in ``.json``, FORMAT.md §9: its shards, in its
    order, not checked to exist), or a list of any of these (list order).
    Each may also be a URL (``https://host/train-{000..009}.tar``, ``s3://bucket/train-*.tar``,
    ``s3://bucket/dir/``); ``file://`` URLs become local paths.

    Args:
        source: The shards.
        remote: How to list remote globs and directories (storage options). Defaults to
            ``RemoteOptions()``.

    Raises:
        FileNotFoundError: If nothing matches (the message names the pattern).
        ValueError: If a brace pattern is malformed or expands to more than
            ``MAX_EXPANSION`` paths (:func:`expand_braces`).
        FormatError: If a manifest is not valid.
        TypeError: If ``source`` is ``bytes`` (pass a ``str`` path).
    """
    items = _items(source)
    out: list[str] = []
    for item in items:
        if is_manifest(item):
            out.extend(read_manifest(item, remote).paths)
            continue
        for p in expand_braces(item):
            if is_url(p):
                out.extend(expand_remote(p, remote or DEFAULT))
                continue
            p = local_path(p)
            if os.path.isdir(p):
                found = sorted(
                    f
                    for f in glob.glob(os.path.join(glob.escape(p), "*"))
                    if f.endswith(SHARD_SUFFIXES) and not os.path.isdir(f)
                )
                if not found:
                    raise FileNotFoundError(f"{p}: directory has no *.tar, *.tar.gz or *.tgz shards")
                out.extend(found)
            elif any(c in p for c in "*?[") and not os.path.exists(p):
                # 'out/*' means the shards: not their indexes, temp files or sub-directories
                found = sorted(
                    f
                    for f in glob.glob(p)
                    if not f.endswith((INDEX_SUFFIX, ".tmp", MANIFEST_SUFFIX))
                    and not os.path.isdir(f)
                )
                if not found:
                    raise FileNotFoundError(f"{p}: no shard matches this glob")
                out.extend(found)
            else:
                if not os.path.exists(p):
                    raise FileNotFoundError(f"{p}: shard not found")
                out.append(p)
    if not out:
        raise FileNotFoundError(f"{source!r}: no shards")
    return out
