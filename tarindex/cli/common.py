"""What the ``tarindex`` commands share: exit codes, the two CLI-only errors, source expansion.

The translation of errors into exit codes and one-line messages is in :mod:`tarindex.cli.main`
only; the commands raise (the library's errors, or :class:`UsageError` / :class:`Failure`).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterator, Sequence
from typing import IO, Any

from ..read import Block, OpenOptions, ShardReader, ShardSet, index_for
from ..read.sources import expand_source, is_manifest

__all__ = [
    "EXIT_OK",
    "EXIT_FAIL",
    "EXIT_USAGE",
    "UsageError",
    "Failure",
    "NotFoundError",
    "describe",
    "expand",
    "each_reader",
    "blocks",
    "index_of",
    "progress",
    "stdout_bytes",
]

EXIT_OK = 0
EXIT_FAIL = 1
EXIT_USAGE = 2
_LS_BLOCK = 1 << 16  # samples per kernel read in info/ls (tables only)


class UsageError(Exception):
    """A command-line mistake: reported on one line, exit code 2."""


class Failure(Exception):
    """The command failed on the data or the system (exit code 1): reported on one line."""


class NotFoundError(Failure):
    """What the command asked for (a key, an extension) is not in the data: exit code 1."""


def describe(e: BaseException) -> str:
    """One line for an exception: OSErrors as ``path: reason``, others by their message."""
    from ..errors import TarIndexError

    if isinstance(e, OSError) and not isinstance(e, TarIndexError) and e.strerror:
        return f"{e.filename}: {e.strerror}" if e.filename else e.strerror
    msg = str(e) or type(e).__name__
    return " ".join(msg.split())  # one line


def expand(sources: Sequence[str]) -> list[str]:
    """Expand every source (path, directory, glob, braces); keep order, drop repeats.

    A glob drops index files and directories (:func:`tarindex.sources.expand_source`).

    Raises:
        UsageError: If a source matches nothing or a brace range is malformed.
    """
    out: list[str] = []
    seen: set[str] = set()
    for src in sources:
        try:
            paths = expand_source(src)
        except (FileNotFoundError, ValueError) as e:
            raise UsageError(describe(e)) from None
        for p in paths:
            if p not in seen:
                seen.add(p)
                out.append(p)
    if not out:
        raise UsageError(f"{' '.join(sources)}: matches only index files, no shards")
    return out


def index_of(path: str, args: argparse.Namespace) -> str | None:
    """The index of ``path`` under ``--index-dir``, or None (beside the tar)."""
    d = getattr(args, "index_dir", None)
    return index_for(path, d) if d else None


def each_reader(
    sources: Sequence[str], args: argparse.Namespace
) -> Iterator[tuple[str, ShardReader]]:
    """Every shard of ``sources`` once, in order, open; a manifest's checked against it.

    A manifest's shards open through its :class:`ShardSet`, so a shard missing or changed
    since the manifest raises :class:`~tarindex.errors.StaleManifestError` (naming it), as
    the datasets do; other sources open as they are.

    Raises:
        UsageError: If a source matches nothing.
        StaleManifestError: A manifest's shard is missing or changed.
    """
    seen: set[str] = set()
    for src in sources:
        if is_manifest(src):
            one = OpenOptions(max_open=1, index_dir=args.index_dir, index="require")
            ss = ShardSet(src, options=one)
            try:
                for s, p in enumerate(ss.paths):
                    if p not in seen:
                        seen.add(p)
                        yield p, ss.reader(s)
            finally:
                ss.close()
            continue
        for p in expand([src]):
            if p not in seen:
                seen.add(p)
                with ShardReader(p, index_of(p, args)) as r:
                    yield p, r


def blocks(r: ShardReader) -> Iterator[Block]:
    """The shard's samples as kernel blocks of tables (no member bytes read)."""
    for j0 in range(0, r.n_samples, _LS_BLOCK):
        yield r.read_block(j0, min(j0 + _LS_BLOCK, r.n_samples), data=False)


def stdout_bytes() -> IO[bytes]:
    """The binary stdout (``sys.stdout.buffer``, or stdout itself when it has none)."""
    out: Any = getattr(sys.stdout, "buffer", None) or sys.stdout
    return out  # type: ignore[no-any-return]


def progress(total: int, unit: str, quiet: bool, desc: str) -> Any:
    """A tqdm bar on stderr, shown only when stderr is a terminal (never with ``quiet``)."""
    from tqdm import tqdm  # type: ignore[import-untyped,unused-ignore]

    # disable=None: shown only when stderr is a terminal, so logs and pipes stay clean
    return tqdm(
        total=total,
        unit=unit,
        desc=desc,
        file=sys.stderr,
        disable=True if quiet else None,
        leave=False,
        dynamic_ncols=True,
    )
