"""``tarindex manifest``: write a dataset manifest (FORMAT.md §9), or check shards against one."""

from __future__ import annotations

import argparse
import sys

from ..read.manifest import check_manifest, write_manifest
from ..read.sources import is_manifest
from .common import EXIT_FAIL, EXIT_OK, UsageError, expand

__all__ = ["command"]


def command(args: argparse.Namespace) -> int:
    """Write ``-o OUT.json`` from the sources, or (``--check``) report changed shards (exit 1)."""
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
