"""``tarindex cat``: one member's bytes, unchanged, to stdout."""

from __future__ import annotations

import argparse
import shlex

from ..errors import SampleIndexError
from ..read import OpenOptions, ShardSet
from ..read.sources import is_manifest
from .common import EXIT_OK, NotFoundError, expand, stdout_bytes

__all__ = ["command"]


def _locate(ss: ShardSet, i: int, args: argparse.Namespace) -> tuple[int, int]:
    """``ss.locate(i)``, with an out-of-range index reported against SOURCE."""
    try:
        return ss.locate(i)
    except SampleIndexError:
        n = len(ss)
        valid = f"-{n}..{n - 1}" if n else "none"
        raise NotFoundError(
            f"{args.source}: sample index {i} out of range: it has {n} samples in "
            f"{ss.n_shards} shard(s) (valid indices: {valid})"
        ) from None


def _resolve(ss: ShardSet, args: argparse.Namespace) -> tuple[int, int]:
    """Map a key or a global index to ``(shard, j)``; see the ``cat`` help for the rule.

    Raises:
        NotFoundError: No such key (or index), or a key held by several shards (naming each
            and the commands that pick one).
    """
    which, by = args.sample, args.by
    if by in ("auto", "key"):
        hits = ss.indices_of(which)  # the one key lookup (key tables)
        if len(hits) == 1:
            return ss.locate(hits[0])
        if len(hits) > 1:
            raise NotFoundError(_ambiguous(ss, args, hits))
        if by == "key":
            raise NotFoundError(f"no sample with key {which!r} in {ss.n_shards} shard(s)")
    try:
        i = int(which)
    except ValueError:
        raise NotFoundError(
            f"no sample with key {which!r} in {ss.n_shards} shard(s), and it is not an index"
        ) from None
    return _locate(ss, i, args)


def _ambiguous(ss: ShardSet, args: argparse.Namespace, hits: list[int]) -> str:
    """The error for a key held by samples of several shards: each place, and how to pick one."""
    places = []
    for i in hits[:5]:
        s, j = ss.locate(i)
        places.append(f"{i} ({ss.paths[s]}, sample {j})")
    more = ", ..." if len(hits) > 5 else ""
    opts = f" --index-dir {shlex.quote(args.index_dir)}" if args.index_dir else ""
    by_index = shlex.join(["tarindex", "cat", "--index", args.source, str(hits[0]), args.ext])
    by_shard = shlex.join(
        ["tarindex", "cat", ss.paths[ss.locate(hits[0])[0]], args.sample, args.ext]
    )
    return (
        f"key {args.sample!r} is in {len(hits)} samples: {', '.join(places)}{more}; keys are "
        f"unique only within a shard: pick one by its global index ({by_index}{opts}) or pass "
        f"its shard as SOURCE ({by_shard}{opts})"
    )


def command(args: argparse.Namespace) -> int:
    """Write one member's bytes, unchanged, to stdout."""
    paths = expand([args.source])
    # a manifest: no header reads
    ss = ShardSet(
        args.source if is_manifest(args.source) else paths,
        # the CLI reads; `tarindex index` is the one command that writes an index
        options=OpenOptions(index_dir=args.index_dir, index="require"),
    )
    try:
        s, j = _resolve(ss, args)
        r = ss.reader(s)
        smp = r.sample(j, (args.ext,))
        if args.ext not in smp:
            blk = r.read_block(j, j + 1, data=False)
            names = [r.exts[e] for e in blk.ext_id.tolist()]
            raise NotFoundError(
                f"sample {ss.starts[s] + j} (key {smp['__key__']!r}, {paths[s]}) has no member "
                f"{args.ext!r}; it has: {', '.join(names)}"
            )
        out = stdout_bytes()
        out.write(smp[args.ext])
        out.flush()
    finally:
        ss.close()
    return EXIT_OK
