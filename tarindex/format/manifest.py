"""Encode and decode a dataset manifest (FORMAT.md §9). Bytes in, bytes out: no file IO.

A manifest lists a dataset's shards, in sample order, with what opening the dataset needs
(sample counts) and what identifies each shard (sizes and the tar's fingerprint), so a dataset
of any number of shards opens with one read. It is one JSON object with one array per column
(columnar: 100k shards decode in tens of milliseconds)::

    {"format": "tarindex-manifest", "version": 1, "n_shards": 2, "n_samples": 7,
     "shards": {"path": ["a-000000.tar", "a-000001.tar"], "samples": [4, 3], ...}}

Paths are relative to the manifest's directory unless absolute or a URL
(:func:`resolve_path`); the path functions work on URLs too.
"""

from __future__ import annotations

import json
import posixpath
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np
from numpy.typing import NDArray

from ..errors import FormatError
from .spec import MAX_MEMBERS, MAX_SAMPLES
from .url import url_scheme

__all__ = [
    "MANIFEST_FORMAT",
    "MANIFEST_VERSION",
    "COLUMNS",
    "ManifestRow",
    "ManifestTable",
    "table_from_rows",
    "encode_manifest",
    "decode_manifest",
    "resolve_path",
    "resolve_paths",
    "relative_path",
]

MANIFEST_FORMAT = "tarindex-manifest"
"""Value of the ``format`` field (FORMAT.md §9)."""
MANIFEST_VERSION = 1
"""Manifest version; a reader refuses a larger one and ignores fields it does not know."""
COLUMNS = (
    "path",
    "samples",
    "members",
    "tar_bytes",
    "index_bytes",
    "head_crc",
    "tail_crc",
    "shard_id",
)
"""The per-shard columns (FORMAT.md §9), each a JSON array of ``n_shards`` entries."""

_INT_COLUMNS = ("samples", "members", "tar_bytes", "index_bytes", "head_crc", "tail_crc")
_HEX32 = re.compile(r"^(?:[0-9a-f]{32})?$")
_HEX = re.compile(r"[0-9a-f]*")


@dataclass
class ManifestTable:
    """The shards of one manifest (FORMAT.md §9), columns as arrays of ``n_shards`` entries."""

    paths: list[str]
    """Shard paths as written in the manifest: relative to its directory, absolute, or URLs."""
    samples: NDArray[np.int64]
    """Samples per shard (the index header's ``n_samples``)."""
    members: NDArray[np.int64]
    """Indexed members per shard."""
    tar_bytes: NDArray[np.int64]
    """Size of each tar in bytes (the index header's ``tar_size``)."""
    index_bytes: NDArray[np.int64]
    """Size of each index file in bytes when the manifest was made (informative)."""
    head_crc: NDArray[np.int64]
    """crc32 of each tar's first 4096 bytes (the index header's ``head_crc``, FORMAT.md §3)."""
    tail_crc: NDArray[np.int64]
    """crc32 of each tar's last 4096 bytes (``tail_crc``)."""
    shard_id: list[str]
    """Each shard's id (FORMAT.md §1) as 32 lowercase hex digits, ``""`` for other tars."""
    meta: dict[str, Any] = field(default_factory=dict)
    """Other top-level fields (``producer``, ``version``, ...), kept as read."""

    @property
    def n_shards(self) -> int:
        """Number of shards."""
        return len(self.paths)

    @property
    def n_samples(self) -> int:
        """Samples in all shards."""
        return int(self.samples.sum())


class ManifestRow(NamedTuple):
    """One shard's row of a manifest (FORMAT.md §9), in :data:`COLUMNS` order.

    What a writer knows when it closes a shard (:class:`tarindex.write.tar.TarShardWriter`
    fills one in), so a manifest is made from rows without reopening any shard; a plain tuple
    of str and int, cheap to pickle or to send as an Arrow row from an engine's task.
    """

    path: str
    """Where the shard is: a local path or a URL (a manifest records it relative to itself)."""
    samples: int
    """Samples in the shard."""
    members: int
    """Indexed members in the shard."""
    tar_bytes: int
    """Size of the tar in bytes."""
    index_bytes: int
    """Size of its index file in bytes."""
    head_crc: int
    """crc32 of the tar's first 4096 bytes (FORMAT.md §3)."""
    tail_crc: int
    """crc32 of the tar's last 4096 bytes (FORMAT.md §3)."""
    shard_id: str
    """The shard id (FORMAT.md §1) as 32 lowercase hex digits, ``""`` for other tars."""


def table_from_rows(
    rows: Sequence[Sequence[Any]], meta: dict[str, Any] | None = None, *, first: int = 0
) -> ManifestTable:
    """The manifest table of ``rows``, in their order; O(n), vectorised (100k rows in ms).

    Paths are taken as they are (the caller makes them relative: :func:`relative_path`).
    Nothing is checked here: :func:`encode_manifest` then :func:`decode_manifest` check.

    Args:
        rows: One row per shard, in sample order: :class:`ManifestRow`, or any tuple whose
            fields from ``first`` on are the :data:`COLUMNS`.
        meta: Other top-level fields (``producer``, ...). Defaults to none.
        first: Index of the ``path`` field in each row. Defaults to ``0``.
    """
    n = len(rows)
    cols: list[Any] = list(zip(*rows, strict=True))[first:] if n else [()] * len(COLUMNS)

    def ints(k: int) -> NDArray[np.int64]:
        return np.asarray(cols[k], np.int64) if n else np.zeros(0, np.int64)

    return ManifestTable(
        paths=list(cols[0]),
        samples=ints(1),
        members=ints(2),
        tar_bytes=ints(3),
        index_bytes=ints(4),
        head_crc=ints(5),
        tail_crc=ints(6),
        shard_id=list(cols[7]),
        meta=dict(meta or {}),
    )


def encode_manifest(t: ManifestTable) -> bytes:
    """Serialize ``t`` (FORMAT.md §9): UTF-8 JSON, one line per column, ending in a newline.

    Raises:
        ValueError: If the columns do not all have ``n_shards`` entries.
    """
    n = t.n_shards
    cols: dict[str, list[Any]] = {
        "path": list(t.paths),
        **{c: np.asarray(getattr(t, c), np.int64).tolist() for c in _INT_COLUMNS},
        "shard_id": list(t.shard_id),
    }
    if any(len(v) != n for v in cols.values()):
        raise ValueError("encode_manifest: every column must have one entry per shard")
    head = {
        **t.meta,
        "format": MANIFEST_FORMAT,
        "version": MANIFEST_VERSION,
        "n_shards": n,
        "n_samples": t.n_samples,
    }
    lines = [json.dumps(head, sort_keys=True, separators=(",", ":"))[:-1] + ',"shards":{']
    body = [f"{json.dumps(c)}:{json.dumps(v, ensure_ascii=False)}" for c, v in cols.items()]
    lines.append(",\n".join(body))
    lines.append("}}\n")
    return "\n".join(lines).encode("utf-8")


def _bad(where: str, what: str) -> FormatError:
    return FormatError(
        f"{where}: {what} (FORMAT.md §9); not a valid tarindex manifest: make it again with "
        f"tarindex manifest SHARDS... -o {where}"
    )


def decode_manifest(buf: bytes | memoryview, where: str = "<manifest>") -> ManifestTable:
    """Decode and check a manifest (FORMAT.md §9); O(n_shards), vectorised.

    Checks the format name and version, that every column has ``n_shards`` entries of the
    right type, counts and sizes non-negative, per-shard ``samples`` and ``members`` within
    what an index holds (``MAX_SAMPLES``, ``MAX_MEMBERS``, FORMAT.md §2.1; so the totals
    never wrap int64), ``members >= samples``, crc32s in
    ``[0, 2**32)``, shard ids of 32 hex digits (or empty), paths non-empty, and the totals.

    Args:
        buf: The manifest file's bytes.
        where: The manifest's path or URL, for messages. Defaults to ``"<manifest>"``.

    Raises:
        FormatError: Naming the manifest and the field (and shard) that is wrong.
    """
    try:
        doc = json.loads(bytes(buf).decode("utf-8"))
    except (ValueError, RecursionError) as e:
        raise _bad(where, f"not UTF-8 JSON ({type(e).__name__}: {e})") from None
    if not isinstance(doc, dict) or doc.get("format") != MANIFEST_FORMAT:
        got = doc.get("format") if isinstance(doc, dict) else type(doc).__name__
        raise _bad(where, f"field 'format' is {got!r}, expected {MANIFEST_FORMAT!r}")
    version = doc.get("version")
    if type(version) is not int or version < 1:
        raise _bad(where, f"field 'version' is {version!r}, expected an integer >= 1")
    if version > MANIFEST_VERSION:
        raise FormatError(
            f"{where}: manifest version {version}, this tarindex reads version "
            f"{MANIFEST_VERSION} (FORMAT.md §9); upgrade tarindex, or make the manifest again "
            f"with this one"
        )
    n = doc.get("n_shards")
    shards = doc.get("shards")
    if type(n) is not int or n < 0 or not isinstance(shards, dict):
        raise _bad(where, "needs 'n_shards' (an integer >= 0) and a 'shards' object of columns")
    for c in COLUMNS:
        col = shards.get(c)
        if not isinstance(col, list) or len(col) != n:
            got = len(col) if isinstance(col, list) else type(col).__name__
            raise _bad(where, f"column {c!r} has {got} entries, expected n_shards = {n}")
    ints: dict[str, NDArray[np.int64]] = {}
    for c in _INT_COLUMNS:
        try:
            a = np.asarray(shards[c]) if n else np.empty(0, np.int64)
        except (ValueError, OverflowError):
            a = np.asarray([None])
        if a.dtype.kind not in "iu" or a.ndim != 1:
            raise _bad(where, f"column {c!r} must hold integers")
        a = a.astype(np.int64)
        if n and int(a.min()) < 0:
            raise _bad(where, f"column {c!r}: shard {int(np.argmin(a))} has a negative value")
        ints[c] = a
    for c, what, lim in (("samples", "samples", MAX_SAMPLES), ("members", "members", MAX_MEMBERS)):
        if n and int(ints[c].max()) > lim:  # an index holds at most this many (§2.1)
            k = int(np.argmax(ints[c]))
            raise _bad(
                where,
                f"column {c!r}: shard {k} has {int(ints[c][k])} {what}, more than an index "
                f"holds ({lim}, FORMAT.md §2.1)",
            )
    for c in ("head_crc", "tail_crc"):
        if n and int(ints[c].max()) >= 1 << 32:
            raise _bad(where, f"column {c!r}: shard {int(np.argmax(ints[c]))} is not a crc32")
    low = ints["members"] < ints["samples"]
    if low.any():
        raise _bad(where, f"shard {int(np.argmax(low))} has fewer members than samples")
    paths, sids = shards["path"], shards["shard_id"]
    # one pass each over joined strings; the per-entry loop only finds the culprit
    if not (all(type(p) is str and p for p in paths) and "\0" not in "".join(paths)):
        k, p = next(
            (k, p) for k, p in enumerate(paths) if not isinstance(p, str) or not p or "\0" in p
        )
        raise _bad(where, f"column 'path': shard {k} is {p!r}, expected a non-empty path")
    if not (
        all(type(x) is str and len(x) in (0, 32) for x in sids) and _HEX.fullmatch("".join(sids))
    ):
        k, x = next(
            (k, x) for k, x in enumerate(sids) if not isinstance(x, str) or not _HEX32.match(x)
        )
        raise _bad(where, f"column 'shard_id': shard {k} is {x!r}, expected 32 hex digits")
    total, held = doc.get("n_samples"), sum(ints["samples"].tolist())  # exact: no int64 wrap
    if type(total) is not int or total != held:
        raise _bad(where, f"'n_samples' is {total!r}, the shards hold {held}")
    meta = {
        k: v
        for k, v in doc.items()
        if k not in ("format", "version", "n_shards", "n_samples", "shards")
    }
    return ManifestTable(
        paths=paths,
        samples=ints["samples"],
        members=ints["members"],
        tar_bytes=ints["tar_bytes"],
        index_bytes=ints["index_bytes"],
        head_crc=ints["head_crc"],
        tail_crc=ints["tail_crc"],
        shard_id=sids,
        meta=meta,
    )


def _dirname(location: str) -> str:
    if url_scheme(location):
        scheme, rest = location.split("://", 1)
        return f"{scheme}://{posixpath.dirname(rest)}"
    return posixpath.dirname(location) if "/" in location else ""


def resolve_path(manifest: str, entry: str) -> str:
    """Return where shard ``entry`` of the manifest at ``manifest`` is (FORMAT.md §9).

    A URL or an absolute path is taken as it is; anything else is relative to the directory
    of ``manifest`` (a local path or a URL: ``s3://b/d/data.json`` + ``x.tar`` gives
    ``s3://b/d/x.tar``).
    """
    if url_scheme(entry) or entry.startswith("/"):
        return entry
    base = _dirname(manifest)
    if not base:
        return entry
    if url_scheme(base):
        scheme, rest = base.split("://", 1)
        return f"{scheme}://{posixpath.normpath(posixpath.join(rest, entry))}"
    return posixpath.normpath(posixpath.join(base, entry))


def resolve_paths(manifest: str, entries: list[str]) -> list[str]:
    """:func:`resolve_path` of every entry; plain relative names are joined without parsing.

    100k entries in milliseconds (the manifest's directory is worked out once).
    """
    base = _dirname(manifest)
    if not base:
        return [resolve_path(manifest, e) for e in entries]
    prefix = base.rstrip("/") + "/"
    return [
        prefix + e
        if not (e.startswith(("/", "./", "../")) or "://" in e or "/." in e or "//" in e)
        else resolve_path(manifest, e)
        for e in entries
    ]


def relative_path(manifest: str, path: str) -> str:
    """Return how the manifest at ``manifest`` names the shard at ``path`` (FORMAT.md §9).

    Relative to the manifest's directory when both are local paths (``..`` when needed), or
    both are URLs under the same directory; otherwise ``path`` unchanged (an absolute local
    path needs ``manifest`` absolute too: both are made absolute by the caller).
    """
    if url_scheme(path) or url_scheme(manifest):
        base = _dirname(manifest) + "/"
        if url_scheme(path) and url_scheme(manifest) and path.startswith(base):
            return path[len(base) :]
        return path
    base = _dirname(manifest) or "."
    return posixpath.relpath(path, base)
