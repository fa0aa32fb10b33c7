"""``tarindex pack``: a folder of files into indexed shards (:mod:`tarindex.write.pack`)."""

from __future__ import annotations

import argparse
import sys

from ..codecs.encode import ImageEncoder
from ..errors import TarIndexError
from ..write.pack import plan_pack, write_pack
from .common import EXIT_OK, Failure, UsageError, describe, progress

__all__ = ["command"]


def command(args: argparse.Namespace) -> int:
    """Plan, then write the shards.

    A file or folder that cannot be read, and a shard that cannot be written, exit 1 (an
    OSError of any kind, a vanished file too); the checks before writing (PackError) exit 2.
    """
    try:
        plan = plan_pack(
            args.src_dir,
            args.layout,
            out_pattern=args.out_pattern,
            maxcount=args.maxcount,
            overwrite=args.overwrite,
        )
    except OSError as e:  # exit 1, a vanished file too (not the usage error of main)
        raise Failure(describe(e)) from None
    for path, why in plan.skipped[:5]:
        print(f"tarindex pack: skipped {path}: {why}", file=sys.stderr)
    if len(plan.skipped) > 5:
        print(f"tarindex pack: skipped {len(plan.skipped) - 5} more file(s)", file=sys.stderr)
    bar = progress(len(plan.samples), "sample", args.quiet, "packing")
    try:
        res = write_pack(
            plan,
            args.out_pattern,
            maxcount=args.maxcount,
            maxsize=args.maxsize,
            overwrite=args.overwrite,
            on_sample=lambda: bar.update(1),
            jobs=args.jobs,
            encoder=True if args.max_side is None else ImageEncoder(args.quality, args.max_side),
        )
    except OSError as e:
        raise Failure(describe(e)) from None
    except ValueError as e:
        if isinstance(e, TarIndexError):
            raise
        raise UsageError(describe(e)) from None
    finally:
        bar.close()
    if res.removed:
        print(f"removed {len(res.removed)} file(s) of the earlier pack (--overwrite)")
    print(
        f"packed {len(plan.samples)} samples ({res.n_files} files, {plan.layout} layout) into "
        f"{len(res.paths)} shard(s), each with its index:"
    )
    for p in res.paths:
        print(f"  {p}")
    if plan.classes is not None:
        print(f"{len(plan.classes)} classes (cls = position in the list): {res.classes_json}")
    return EXIT_OK
