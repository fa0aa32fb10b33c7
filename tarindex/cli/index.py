"""``tarindex index``: build the sidecar indexes of many tars (:func:`tarindex.index.build.build_indexes`)."""

from __future__ import annotations

import argparse
import functools
import os
import sys

from ..index.build import IndexResult, build_indexes
from ..read import is_up_to_date
from .common import EXIT_FAIL, EXIT_OK, UsageError, expand, progress

__all__ = ["command", "default_jobs"]


def default_jobs() -> int:
    """The number of cores this process may use (at least 1)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))  # type: ignore[attr-defined,unused-ignore]
    except AttributeError:
        return os.cpu_count() or 1


def command(args: argparse.Namespace) -> int:
    """Build indexes for many shards, print a summary; exit 1 if any failed."""
    paths = expand(args.paths)
    bar = progress(len(paths), "shard", args.quiet, "indexing")

    def report(res: IndexResult) -> None:
        for w in res.warnings:
            bar.write(f"tarindex index: warning: {w}", file=sys.stderr)
        if res.status == "failed" and not bar.disable:  # live on a terminal; the summary repeats it
            bar.write(f"tarindex index: error: {res.message}", file=sys.stderr)
        bar.update(1)

    try:
        results = build_indexes(
            paths,
            jobs=args.jobs or default_jobs(),
            out=args.out,
            # --checksums rebuilds an index that records no crc32s
            up_to_date=None
            if args.force
            else functools.partial(is_up_to_date, checksums=args.checksums),
            require_end=args.require_end,
            checksums=args.checksums,
            gzip_spacing=args.gzip_spacing,
            on_result=report,
        )
    except ValueError as e:  # a URL without --out
        raise UsageError(str(e)) from None
    finally:
        bar.close()
    n = {s: sum(r.status == s for r in results) for s in ("built", "skipped", "failed")}
    print(
        f"indexed {len(paths)} shard(s): {n['built']} built, {n['skipped']} up to date "
        f"(skipped), {n['failed']} failed"
    )
    for res in results:
        if res.status == "failed":
            msg = res.message if res.path in res.message else f"{res.path}: {res.message}"
            print(f"  FAILED {msg}", file=sys.stderr)
    return EXIT_FAIL if n["failed"] else EXIT_OK
