"""``tarindex verify``: :func:`tarindex.read.verify.verify` on every shard."""

from __future__ import annotations

import argparse
import sys

from ..errors import TarIndexError
from ..format.url import is_url
from ..index.build import local_tar
from ..read import OpenOptions, ShardSet, index_for
from ..read.sources import is_manifest
from .common import EXIT_FAIL, EXIT_OK, describe, expand

__all__ = ["command"]


def command(args: argparse.Namespace) -> int:
    """Verify every shard (a remote tar streamed once, then rescanned); exit 1 on any failure."""
    from ..read import verify as verify_mod  # looked up per call: tests replace verify()

    paths = expand(args.paths)
    listed = {  # a manifest's shards: checked against it first, as the datasets do
        p: (ss, s)
        for ss in (
            ShardSet(m, options=OpenOptions(max_open=1, index_dir=args.index_dir, index="require"))
            for m in args.paths
            if is_manifest(m)
        )
        for s, p in enumerate(ss.paths)
    }
    failed = 0
    for p in paths:
        tmp = p
        try:
            if p in listed:
                ss, s = listed[p]
                ss.reader(s).close()  # StaleManifestError if missing or changed
            ip = index_for(p, args.index_dir) if args.index_dir or is_url(p) else None
            with local_tar(p) as tmp:
                if ip is None:
                    report = verify_mod.verify(tmp, data=args.data)
                else:
                    report = verify_mod.verify(tmp, ip, data=args.data)
        except (TarIndexError, OSError) as e:
            failed += 1
            msg = describe(e).replace(tmp, p) if tmp != p else describe(e)
            print(f"FAIL {msg if msg.startswith(p) else f'{p}: {msg}'}", file=sys.stderr)
            continue
        print(f"ok   {p}: {report}")
    print(f"verified {len(paths)} shard(s): {len(paths) - failed} ok, {failed} failed")
    return EXIT_FAIL if failed else EXIT_OK
