"""``tarindex manifest``: write a dataset manifest (FORMAT.md §9), or check shards against one."""

from __future__ import annotations

import argparse
import os
import sys

from ..read.manifest import check_manifest, prune, write_manifest
from ..read.sources import is_manifest
from .common import EXIT_FAIL, EXIT_OK, UsageError, expand

__all__ = ["command"]


def command(args: argparse.Namespace) -> int:
    """Write ``-o OUT.json`` from the sources, or (``--check``) report changed shards (exit 1).

    ``--prune``: delete (``--dry-run``: list) the files of write attempts a manifest does not
    list, under its directory (:func:`tarindex.read.manifest.prune`).
    """
    if args.prune:  # leftovers of failed or superseded attempts (write_partition)
        for m in args.sources:
            if not is_manifest(m):
                raise UsageError(f"{m}: --prune takes manifests (*.json)")
            left = prune(os.path.dirname(m) or ".", m, dry_run=args.dry_run)
            for line in left:
                print(line)
            print(f"{m}: {len(left)} leftover file(s) {'found' if args.dry_run else 'deleted'}")
        return EXIT_OK
    if args.check:
        if args.output is not None:
            raise UsageError("--check takes manifests, not -o")
        failed = 0
        for m in args.sources:
            if not is_manifest(m):
                raise UsageError(f"{m}: --check takes manifests (*.json)")
            problems = check_manifest(m)
            for line in problems:
                print(f"FAIL {line}", file=sys.stderr)
            failed += len(problems)
            print(f"{m}: {len(problems)} shard(s) missing or changed")
        return EXIT_FAIL if failed else EXIT_OK
    if args.output is None:
        raise UsageError("the manifest to write is missing: -o data.json")
    if not args.output.endswith(".json"):
        raise UsageError(f"-o {args.output}: a manifest's name must end in .json")
    paths = expand(args.sources)
    t = write_manifest(paths, args.output, absolute=args.absolute)
    print(f"wrote {args.output}: {t.n_shards} shard(s), {t.n_samples} sample(s)")
    return EXIT_OK
