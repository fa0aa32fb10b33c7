"""``tarindex ls``: one line per sample, per tar member, or per entry in no sample.

Names, keys, extensions and reasons are printed through
:func:`tarindex.format.keys.escape_name` (control characters as backslash escapes), so one line
is always one item.
"""

from __future__ import annotations

import argparse
import sys

from ..format.keys import escape_name
from ..index.build import local_tar
from ..index.gzbuild import plain_tar
from ..index.scan import Members, scan_members
from .common import EXIT_OK, blocks, each_reader, expand

__all__ = ["command"]


def _members(m: Members, write: object) -> None:
    """``name, data offset, size`` per regular file; a shadowed one also says by which copy."""
    esc = escape_name
    out = m.offset.tolist()
    shadowed = m.shadowed()
    for i, (name, off, size) in enumerate(zip(m.names, out, m.size.tolist(), strict=True)):
        line = f"{esc(name)}\t{off}\t{size}"
        j = shadowed.get(i)
        if j is not None:  # extraction and the index keep the later copy
            line += f"\tshadowed by the later {esc(m.names[j])} at byte {out[j]}"
        write(line + "\n")  # type: ignore[operator]


def command(args: argparse.Namespace) -> int:
    """List samples (from the indexes) or, with ``--members``/``--skipped``, the tar headers."""
    write = sys.stdout.write
    esc = escape_name
    if args.members or args.skipped:
        paths = expand(args.sources)
        for s, p in enumerate(paths):
            # a remote tar: streamed once; a gzip one: the tar inside, inflated once
            with local_tar(p) as tmp, plain_tar(tmp) as plain:
                m = scan_members(plain)
            if len(paths) > 1:
                write(("\n" if s else "") + f"==> {esc(p)} <==\n")
            if args.skipped:
                for name, why in m.skipped:
                    write(f"{esc(name)}\t{esc(why)}\n")
            else:
                _members(m, write)
        return EXIT_OK
    start = 0
    for _, r in each_reader(args.sources, args):
        exts = [esc(e) for e in r.exts]
        for blk in blocks(r):
            ptr = blk.member_ptr.tolist()
            names = [exts[e] for e in blk.ext_id.tolist()]
            for b, (j, key) in enumerate(zip(blk.samples.tolist(), blk.keys, strict=True)):
                write(f"{start + j}\t{esc(key)}\t{','.join(names[ptr[b] : ptr[b + 1]])}\n")
        start += r.n_samples
    return EXIT_OK
