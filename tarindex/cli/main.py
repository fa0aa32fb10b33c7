"""The ``tarindex`` command line (also ``python -m tarindex``).

Subcommands::

    tarindex index PATH_OR_GLOB... [--jobs N] [--force] [--out DIR]   build sidecar indexes
    tarindex verify SOURCE...                             index matches tar (tarindex.verify)
    tarindex info SOURCE...                               shards, samples, extensions, bytes
    tarindex ls SOURCE... [--members]                     samples, or tar members
    tarindex cat SOURCE KEY_OR_INDEX EXT                  one member's bytes to stdout
    tarindex manifest SOURCE... -o data.json [--check]    a dataset manifest (FORMAT.md §9)
    tarindex pack SRC_DIR OUT_PATTERN [--maxcount N] [--maxsize BYTES] [--overwrite] [--jobs N]
    tarindex demo [--workdir DIR] [--epochs N]            the main job on real data

A ``SOURCE`` is anything :func:`tarindex.expand_source` takes: a path, a directory of ``*.tar``,
a glob (quote it), a brace pattern (``'train-{000000..000009}.tar'``) or a manifest
(``data.json``), local or a URL (``https://...``, ``s3://...``; docs/REMOTE.md).
``--index-dir DIR`` reads indexes kept apart from their tars (``tarindex index URL --out DIR``).

Exit codes:
    0: success.
    1: the data failed: an index could not be built, verification failed, an index is
       missing, stale or corrupt, a key or extension asked for does not exist, the demo's
       accuracy is below 90 %, a needed extra is not installed.
    2: bad usage: unknown option, a path or pattern that matches nothing, an invalid
       argument value.

A user mistake prints one line ``tarindex <command>: error: <message>`` to stderr, never a
traceback. Importing this module does not import torch (only ``demo`` does).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import sys
import warnings
from collections import Counter
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import IO, Any

import numpy as np

from .._version import __version__
from ..errors import PackError, TarIndexError
from ..format.keys import escape_name
from ..index.build import build_index
from ..index.scan import scan_members
from ..read.reader import Block, ShardReader, ShardSet, index_for, is_up_to_date, read_kernel
from ..read.sources import expand_source, is_manifest
from ..storage.remote import download, is_url, load_indexes
from ..write.pack import LAYOUTS, plan_pack, write_pack

__all__ = ["main", "build_parser", "parse_size"]

EXIT_OK = 0
EXIT_FAIL = 1
EXIT_USAGE = 2


class UsageError(Exception):
    """A command-line mistake: reported on one line, exit code 2."""


class NotFoundError(Exception):
    """What the command asked for (a key, an extension) is not in the data: exit code 1."""


# -- helpers ----------------------------------------------------------------------------------
def _describe(e: BaseException) -> str:
    """One line for an exception: OSErrors as ``path: reason``, others by their message."""
    if isinstance(e, OSError) and not isinstance(e, TarIndexError) and e.strerror:
        return f"{e.filename}: {e.strerror}" if e.filename else e.strerror
    msg = str(e) or type(e).__name__
    return " ".join(msg.split())  # one line


def _expand(sources: Sequence[str]) -> list[str]:
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
            raise UsageError(_describe(e)) from None
        for p in paths:
            if p not in seen:
                seen.add(p)
                out.append(p)
    if not out:
        raise UsageError(f"{' '.join(sources)}: matches only index files, no shards")
    return out


def _stdout_bytes() -> IO[bytes]:
    out: Any = getattr(sys.stdout, "buffer", None) or sys.stdout
    return out  # type: ignore[no-any-return]


def _progress(total: int, unit: str, quiet: bool, desc: str) -> Any:
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


def _human(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


_SIZE = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:e[0-9]+)?)\s*([kmgt]?)(i?)b?\s*$", re.IGNORECASE)


def parse_size(text: str) -> int:
    """Parse a byte count: ``"1000000"``, ``"1e9"``, ``"500M"``, ``"1.5G"``, ``"64KiB"``.

    Suffixes ``k``, ``M``, ``G``, ``T`` are powers of 1000; ``Ki``, ``Mi``, ``Gi``, ``Ti``
    powers of 1024; a trailing ``B`` is allowed. Case is ignored.

    Returns:
        The size in bytes, ``>= 1``.

    Raises:
        argparse.ArgumentTypeError: If ``text`` is not such a size, or is below 1 byte.
    """
    m = _SIZE.match(text)
    if m is None:
        raise argparse.ArgumentTypeError(f"{text!r} is not a size in bytes (e.g. 1e9, 500M, 1GiB)")
    num, prefix, binary = m.groups()
    power = "kmgt".find(prefix.lower()) + 1 if prefix else 0
    value = int(float(num) * (1024 if binary else 1000) ** power)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: size must be at least 1 byte")
    return value


def _positive_int(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if v < 1:
        raise argparse.ArgumentTypeError(f"{v} must be >= 1")
    return v


def _default_jobs() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))  # type: ignore[attr-defined,unused-ignore]
    except AttributeError:
        return os.cpu_count() or 1


@contextmanager
def _local_tar(path: str, where: str | None = None) -> Iterator[str]:
    """A local file with the tar's bytes: ``path`` itself, or a remote tar streamed into a temp file.

    The temp file (in ``where``, else the system's temp directory) is removed afterwards.
    """
    if not is_url(path):
        yield path
        return
    import tempfile

    fd, tmp = tempfile.mkstemp(prefix=".tarindex-", suffix=".tar.tmp", dir=where)
    os.close(fd)
    try:
        download(path, tmp)
        yield tmp
    finally:
        try:
            os.unlink(tmp)
        except OSError:
            pass


def _named(msg: str, tmp: str, url: str) -> str:
    """A message about a temp copy, naming the URL it came from instead."""
    return msg.replace(tmp, url) if tmp != url else msg


# -- index ------------------------------------------------------------------------------------
@dataclass
class _Outcome:
    path: str
    status: str  # "built" or "failed"
    message: str = ""
    warnings: list[str] = field(default_factory=list)


def _index_one(
    path: str, require_end: bool = True, checksums: bool = False, out: str | None = None
) -> _Outcome:
    """Build one shard's index (into ``out`` if given); never raises (runs in a worker process).

    A remote tar is streamed once into a temp file in ``out`` and indexed from there.
    """
    tmp = path
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            with _local_tar(path, out) as tmp:
                tables = build_index(
                    tmp,
                    index_for(path, out) if out else None,
                    require_end=require_end,
                    checksums=checksums,
                )
            status, msg = "built", f"{tables.n_samples} samples"
        except Exception as e:  # a bad shard must not stop the others
            status = "failed"
            msg = _named(_describe(e), tmp, path)
            if not isinstance(e, (TarIndexError, OSError)):
                msg = f"{type(e).__name__}: {msg}"
    return _Outcome(path, status, msg, [_named(str(w.message), tmp, path) for w in caught])


def _run_jobs(
    paths: list[str],
    jobs: int,
    require_end: bool = True,
    checksums: bool = False,
    out: str | None = None,
) -> Iterator[_Outcome]:
    """Yield the outcome of every shard, in completion order (in-process when ``jobs == 1``)."""
    if jobs <= 1 or len(paths) <= 1:
        for p in paths:
            yield _index_one(p, require_end, checksums, out)
        return
    import multiprocessing as mp
    from concurrent.futures import ProcessPoolExecutor, as_completed
    from concurrent.futures.process import BrokenProcessPool

    # fork where it exists (Linux): the workers start in milliseconds with everything imported,
    # and this process has no threads of its own yet. forkserver/spawn cost ~0.3 s per worker
    # (a fresh interpreter importing numpy), which ate the gain on a few-second index run.
    methods = mp.get_all_start_methods()
    ctx = mp.get_context("fork" if "fork" in methods else "spawn")
    with ProcessPoolExecutor(max_workers=min(jobs, len(paths)), mp_context=ctx) as pool:
        futures = {pool.submit(_index_one, p, require_end, checksums, out): p for p in paths}
        for fut in as_completed(futures):
            try:
                yield fut.result()
            except BrokenProcessPool as e:  # a worker died (e.g. SIGBUS on a file cut while read)
                yield _Outcome(futures[fut], "failed", f"worker process died: {_describe(e)}")


def cmd_index(args: argparse.Namespace) -> int:
    """``tarindex index``: build indexes for many shards; exit 1 if any failed."""
    paths = _expand(args.paths)
    out = args.out
    remote = [p for p in paths if is_url(p)]
    if remote and out is None:
        raise UsageError(
            f"{remote[0]}: a remote tar's index cannot be written beside it; keep it locally: "
            f"tarindex index {remote[0]} --out DIR (then read with index_dir=DIR)"
        )
    if out is not None:
        os.makedirs(out, exist_ok=True)
    # the up-to-date check is O(1) per shard (header + 8 KiB fingerprint): done here, not in workers
    todo = (
        paths
        if args.force
        else [p for p in paths if not is_up_to_date(p, index_for(p, out) if out else None)]
    )
    n_skipped = len(paths) - len(todo)
    built: list[_Outcome] = []
    failed: list[_Outcome] = []
    bar = _progress(len(todo), "shard", args.quiet, "indexing")
    try:
        jobs = args.jobs or _default_jobs()
        for res in _run_jobs(todo, jobs, args.require_end, args.checksums, out):
            for w in res.warnings:
                bar.write(f"tarindex index: warning: {' '.join(w.split())}", file=sys.stderr)
            if res.status == "failed":
                failed.append(res)
                if not bar.disable:  # live feedback on a terminal; the summary repeats it
                    bar.write(f"tarindex index: error: {res.message}", file=sys.stderr)
            else:
                built.append(res)
            bar.update(1)
    finally:
        bar.close()
    print(
        f"indexed {len(paths)} shard(s): {len(built)} built, {n_skipped} up to date "
        f"(skipped), {len(failed)} failed"
    )
    for res in failed:
        msg = res.message if res.path in res.message else f"{res.path}: {res.message}"
        print(f"  FAILED {msg}", file=sys.stderr)
    return EXIT_FAIL if failed else EXIT_OK


# -- verify -----------------------------------------------------------------------------------
def cmd_verify(args: argparse.Namespace) -> int:
    """``tarindex verify``: :func:`tarindex.verify.verify` on every shard; exit 1 on any failure."""
    from ..read.verify import verify

    paths = _expand(args.paths)
    listed = {  # a manifest's shards: checked against it first, as the datasets do
        p: (ss, s)
        for ss in (ShardSet(m, index_dir=args.index_dir, max_open=1) for m in args.paths
                   if is_manifest(m))
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
            with _local_tar(p) as tmp:  # a remote tar: streamed once, then rescanned
                report = verify(tmp, data=args.data) if ip is None else verify(tmp, ip, data=args.data)
        except (TarIndexError, OSError) as e:
            failed += 1
            msg = _named(_describe(e), tmp, p)  # messages already start with the file's path
            print(f"FAIL {msg if msg.startswith(p) else f'{p}: {msg}'}", file=sys.stderr)
            continue
        print(f"ok   {p}: {report}")
    print(f"verified {len(paths)} shard(s): {len(paths) - failed} ok, {failed} failed")
    return EXIT_FAIL if failed else EXIT_OK


# -- info, ls, cat ----------------------------------------------------------------------------
_INDEX_DIR_HELP = "the indexes are in DIR (<tar name>.tidx), not beside the tars"
_LS_BLOCK = 1 << 16  # samples per kernel read in info/ls (tables only)


def _index_of(path: str, args: argparse.Namespace) -> str | None:
    d = getattr(args, "index_dir", None)
    return index_for(path, d) if d else None


def _each_reader(
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
            ss = ShardSet(src, index_dir=args.index_dir, max_open=1)  # one open at a time
            try:
                for s, p in enumerate(ss.paths):
                    if p not in seen:
                        seen.add(p)
                        yield p, ss.reader(s)
            finally:
                ss.close()
            continue
        for p in _expand([src]):
            if p not in seen:
                seen.add(p)
                with ShardReader(p, _index_of(p, args)) as r:
                    yield p, r


def _blocks(r: ShardReader) -> Iterator[Block]:
    """The shard's samples as kernel blocks of tables (no member bytes read)."""
    for j0 in range(0, r.n_samples, _LS_BLOCK):
        yield r.read_block(j0, min(j0 + _LS_BLOCK, r.n_samples), data=False)


def cmd_info(args: argparse.Namespace) -> int:
    """``tarindex info``: shards, samples, members, extensions (counts) and bytes."""
    n_shards = n_samples = n_members = data_bytes = tar_bytes = index_bytes = 0
    exts: Counter[str] = Counter()
    for p, r in _each_reader(args.sources, args):
        n_shards += 1
        counts = np.zeros(len(r.exts), np.int64)
        for blk in _blocks(r):
            counts += np.bincount(blk.ext_id, minlength=len(r.exts))
            data_bytes += int(blk.size.sum())
            n_members += len(blk.ext_id)
        n_samples += r.n_samples
        tar_bytes += r.tar_size
        index_bytes += (
            len(load_indexes([r.index_path], [p])[0][0])
            if is_url(r.index_path)
            else os.path.getsize(r.index_path)
        )
        for name, c in zip(r.exts, counts.tolist(), strict=True):
            exts[name] += c
    info = {
        "shards": n_shards,
        "samples": n_samples,
        "members": n_members,
        "extensions": dict(sorted(exts.items())),
        "data_bytes": data_bytes,
        "tar_bytes": tar_bytes,
        "index_bytes": index_bytes,
    }
    if args.json:
        print(json.dumps(info, indent=2))
        return EXIT_OK
    print(f"shards:      {n_shards}")
    print(f"samples:     {n_samples}")
    print(f"members:     {n_members}")
    print("extensions:  " + (", ".join(f"{e} ({c})" for e, c in sorted(exts.items())) or "-"))
    print(f"data bytes:  {data_bytes} ({_human(data_bytes)}, member contents)")
    print(f"tar bytes:   {tar_bytes} ({_human(tar_bytes)})")
    print(f"index bytes: {index_bytes} ({_human(index_bytes)})")
    return EXIT_OK


def cmd_ls(args: argparse.Namespace) -> int:
    """``tarindex ls``: one line per sample (index, key, extensions) or per tar member.

    Names, keys, extensions and reasons are printed through
    :func:`tarindex.format.keys.escape_name` (control characters as backslash escapes), so
    one line is always one item.
    """
    write = sys.stdout.write
    esc = escape_name
    if args.members or args.skipped:
        paths = _expand(args.sources)
        for s, p in enumerate(paths):
            with _local_tar(p) as tmp:
                m = scan_members(tmp)
            if len(paths) > 1:
                write(("\n" if s else "") + f"==> {esc(p)} <==\n")
            if args.skipped:
                for name, why in m.skipped:
                    write(f"{esc(name)}\t{esc(why)}\n")
                continue
            for name, off, size in zip(m.names, m.offset.tolist(), m.size.tolist(), strict=True):
                write(f"{esc(name)}\t{off}\t{size}\n")
        return EXIT_OK
    start = 0
    for _, r in _each_reader(args.sources, args):
        exts = [esc(e) for e in r.exts]
        for blk in _blocks(r):
            ptr = blk.member_ptr.tolist()
            names = [exts[e] for e in blk.ext_id.tolist()]
            for b, (j, key) in enumerate(zip(blk.samples.tolist(), blk.keys, strict=True)):
                write(f"{start + j}\t{esc(key)}\t{','.join(names[ptr[b] : ptr[b + 1]])}\n")
        start += r.n_samples
    return EXIT_OK


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
    return ss.locate(i)


def _ambiguous(ss: ShardSet, args: argparse.Namespace, hits: list[int]) -> str:
    """The error for a key held by samples of several shards: each place, and how to pick one."""
    places = []
    for i in hits[:5]:
        s, j = ss.locate(i)
        places.append(f"{i} ({ss.paths[s]}, sample {j})")
    more = ", ..." if len(hits) > 5 else ""
    opts = f" --index-dir {shlex.quote(args.index_dir)}" if args.index_dir else ""
    by_index = shlex.join(["tarindex", "cat", "--index", args.source, str(hits[0]), args.ext])
    by_shard = shlex.join(["tarindex", "cat", ss.paths[ss.locate(hits[0])[0]], args.sample, args.ext])
    return (
        f"key {args.sample!r} is in {len(hits)} samples: {', '.join(places)}{more}; keys are "
        f"unique only within a shard: pick one by its global index ({by_index}{opts}) or pass "
        f"its shard as SOURCE ({by_shard}{opts})"
    )


def cmd_cat(args: argparse.Namespace) -> int:
    """``tarindex cat``: write one member's bytes, unchanged, to stdout."""
    paths = _expand([args.source])
    # a manifest: no header reads
    ss = ShardSet(args.source if is_manifest(args.source) else paths, index_dir=args.index_dir)
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
        out = _stdout_bytes()
        out.write(smp[args.ext])
        out.flush()
    finally:
        ss.close()
    return EXIT_OK


# -- manifest ---------------------------------------------------------------------------------
def cmd_manifest(args: argparse.Namespace) -> int:
    """``tarindex manifest``: write a dataset manifest, or check shards against one."""
    from ..read.manifest import check_manifest, prune, write_manifest

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
    paths = _expand(args.sources)
    t = write_manifest(paths, args.output, absolute=args.absolute)
    print(f"wrote {args.output}: {t.n_shards} shard(s), {t.n_samples} sample(s)")
    return EXIT_OK


# -- pack -------------------------------------------------------------------------------------
def cmd_pack(args: argparse.Namespace) -> int:
    """``tarindex pack``: a folder of files into indexed shards (:mod:`tarindex.pack`).

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
    except OSError as e:
        print(f"tarindex pack: error: {_describe(e)}", file=sys.stderr)
        return EXIT_FAIL
    for path, why in plan.skipped[:5]:
        print(f"tarindex pack: skipped {path}: {why}", file=sys.stderr)
    if len(plan.skipped) > 5:
        print(f"tarindex pack: skipped {len(plan.skipped) - 5} more file(s)", file=sys.stderr)
    bar = _progress(len(plan.samples), "sample", args.quiet, "packing")
    try:
        res = write_pack(
            plan,
            args.out_pattern,
            maxcount=args.maxcount,
            maxsize=args.maxsize,
            overwrite=args.overwrite,
            on_sample=lambda: bar.update(1),
            jobs=args.jobs,
        )
    except OSError as e:
        bar.close()
        print(f"tarindex pack: error: {_describe(e)}", file=sys.stderr)
        return EXIT_FAIL
    except ValueError as e:
        if isinstance(e, TarIndexError):
            raise
        raise UsageError(_describe(e)) from None
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


# -- demo -------------------------------------------------------------------------------------
def cmd_demo(args: argparse.Namespace) -> int:
    """``tarindex demo``: the main job on scikit-learn's digits (needs the demo extra)."""
    from . import demo

    try:
        res = demo.run(args.workdir, args.epochs, seed=args.seed)
    except demo.MissingExtraError as e:
        print(f"tarindex demo: error: {e}", file=sys.stderr)
        return EXIT_FAIL
    if res.accuracy < 0.9 and args.epochs >= demo.DEFAULT_EPOCHS:
        print(
            f"tarindex demo: error: test accuracy {res.accuracy:.4f} is below 0.9; the "
            f"pipeline is broken",
            file=sys.stderr,
        )
        return EXIT_FAIL
    return EXIT_OK


# -- parser and entry point -------------------------------------------------------------------
_CAT_HELP = """\
KEY_OR_INDEX is looked up as a sample key first (e.g. 00000042 or cat/0001); if no sample
has that key and it is an integer, it is the global sample index (negative counts from the
end). --key or --index forces one reading. A key held by samples of several shards is an
error naming each (keys are unique only within a shard): pass that shard as SOURCE, or the
sample's global index with --index; the error prints both commands."""

_PACK_HELP = """\
layouts:
  classes  SRC_DIR/<class>/.../<file>.<ext>: every file is a sample with a `cls` member; class
           ids are the sorted class folder names, also written as classes.json beside the
           shards (a JSON list; cls = position). Key = <class>/<path>/<stem>, stem = the file
           name up to its LAST dot, with '%' -> '%25' and '.' -> '%2E' (keys may not contain
           dots; the mapping is reversible and collision-free). Files sharing a stem in one
           folder (001.jpg, 001.json) form one sample.
  flat     any other folder: files sharing a key form a sample, key = path up to the FIRST
           dot of the file name, extension = the rest (webdataset rule: 0001.png, 0001.cls,
           0001.seg.png -> key 0001). Sub-folders become part of the key.
  auto     (default) classes if SRC_DIR's top level holds only folders, else flat.
Hidden files and folders, and files without an extension, are skipped. Samples are written in
sorted key order. OUT_PATTERN takes one integer field (out/train-%06d.tar).

nothing is left out silently:
  skipped  files without an extension, names that are not valid keys, fifos/sockets/devices:
           each listed on stderr (the first 5, then a count); hidden files and folders are
           skipped without being listed (nor counted by --layout auto)
  symlinks followed when the target (fully resolved) is inside SRC_DIR: the sample gets the
           link's name and the target's bytes. Refused (exit 2): a link to outside SRC_DIR,
           a broken link, a link loop, a folder link to one of its own parents
  exit 1   a file or folder that cannot be read (named; checked before writing), a shard
           that cannot be written (disk full: the error names the shard)
  exit 2   a class folder name that is not UTF-8; OUT_PATTERN inside SRC_DIR (symlinks
           resolved); OUT_PATTERN naming files of an earlier pack, unless --overwrite
A failed pack deletes the shard in progress and every shard it finished: it never leaves a
partial dataset. --overwrite first deletes the files OUT_PATTERN names (shard k is
OUT_PATTERN % k, e.g. out/train-000003.tar, and its .tidx), nothing else in the folder."""


_LS_HELP = """\
Names, keys and extensions are printed escaped so that one line is one item: backslash as
\\\\, newline \\n, tab \\t, carriage return \\r, other control characters (C0, DEL) and
bytes that are not UTF-8 as \\xNN (the byte), C1 controls and U+2028/U+2029 as \\uNNNN (the
character); everything else as itself. Members that are in no sample are counted in one
warning per shard by `tarindex index`; `ls --skipped` names them."""


def build_parser() -> argparse.ArgumentParser:
    """Return the argument parser of the ``tarindex`` command."""
    p = argparse.ArgumentParser(
        prog="tarindex",
        description="Random access and streaming over tar shards with a sidecar index.",
        epilog="Exit codes: 0 ok, 1 failure (index, verification, missing data), 2 bad usage.",
    )
    p.add_argument(
        "--version", action="version", version=f"tarindex {__version__} (read kernel: {read_kernel()})"
    )
    sub = p.add_subparsers(dest="command", metavar="COMMAND")

    s = sub.add_parser(
        "index",
        help="build sidecar indexes for existing tars",
        description="Build the sidecar index (<tar>.tidx) of every shard. Shards "
        "whose index is up to date are skipped unless --force. A shard that fails "
        "does not stop the others; exit 1 if any failed.",
    )
    s.add_argument(
        "paths",
        nargs="+",
        metavar="PATH_OR_GLOB",
        help="tar files, directories of *.tar, globs (quoted) or brace patterns",
    )
    s.add_argument(
        "-j",
        "--jobs",
        type=_positive_int,
        default=None,
        help="worker processes (default: the number of usable cores)",
    )
    s.add_argument("-f", "--force", action="store_true", help="rebuild up-to-date indexes too")
    s.add_argument(
        "--no-require-end",
        dest="require_end",
        action="store_false",
        help="index a tar that ends without the end-of-archive zero blocks, with a warning "
        "(by default it is refused: a copy cut at a member boundary looks the same)",
    )
    s.add_argument(
        "--checksums",
        action="store_true",
        help="also record each member's crc32 (reads all the data), for `tarindex verify "
        "--data` and reads with verify_data=True",
    )
    s.add_argument(
        "-o",
        "--out",
        metavar="DIR",
        default=None,
        help="write the indexes into DIR as <tar name>.tidx instead of beside the tars (needed "
        "for remote tars, which are streamed once; read them with index_dir=DIR)",
    )
    s.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    s.set_defaults(func=cmd_index)

    s = sub.add_parser(
        "verify",
        help="check that each index matches its tar (full check)",
        description="Check each index's crc32 and tables, rescan the tar and "
        "compare. Exit 1 if any shard fails.",
    )
    s.add_argument("paths", nargs="+", metavar="SOURCE")
    s.add_argument(
        "--data",
        action="store_true",
        help="also check every member's bytes against the crc32s the index records (reads all "
        "the data; indexes from the writer or `tarindex index --checksums`)",
    )
    s.add_argument("--index-dir", metavar="DIR", default=None, help=_INDEX_DIR_HELP)
    s.set_defaults(func=cmd_verify)

    s = sub.add_parser("info", help="shards, samples, members, extensions, bytes")
    s.add_argument("sources", nargs="+", metavar="SOURCE")
    s.add_argument("--json", action="store_true", help="print a JSON object")
    s.add_argument("--index-dir", metavar="DIR", default=None, help=_INDEX_DIR_HELP)
    s.set_defaults(func=cmd_info)

    s = sub.add_parser(
        "ls",
        help="list samples (index, key, extensions) or tar members",
        description="One tab-separated line per sample: global index, key, "
        "extensions; with --members, per regular file in the tar: name, data offset, size "
        "(bytes), read from the tar headers (no index needed); with --skipped, per entry "
        "that is in no sample: name, reason.",
        epilog=_LS_HELP,
    )
    s.add_argument("sources", nargs="+", metavar="SOURCE")
    s.add_argument("-m", "--members", action="store_true", help="list tar members instead")
    s.add_argument(
        "-s",
        "--skipped",
        action="store_true",
        help="list what is in no sample instead (implies --members): directories, links, "
        "devices, sparse files, and regular files the key rule leaves out (README, .hidden, "
        "name., a __ extension), one line each: name, reason",
    )
    s.add_argument("--index-dir", metavar="DIR", default=None, help=_INDEX_DIR_HELP)
    s.set_defaults(func=cmd_ls)

    s = sub.add_parser(
        "cat",
        help="write one member's bytes to stdout",
        description="Write the bytes of one member to stdout, unchanged.",
        epilog=_CAT_HELP,
    )
    s.add_argument("source", metavar="SOURCE")
    s.add_argument("sample", metavar="KEY_OR_INDEX")
    s.add_argument("ext", metavar="EXT", help="extension, e.g. png, cls, seg.png")
    g = s.add_mutually_exclusive_group()
    g.add_argument(
        "-k", "--key", dest="by", action="store_const", const="key", help="KEY_OR_INDEX is a key"
    )
    g.add_argument(
        "-i",
        "--index",
        dest="by",
        action="store_const",
        const="index",
        help="KEY_OR_INDEX is a global sample index",
    )
    s.add_argument("--index-dir", metavar="DIR", default=None, help=_INDEX_DIR_HELP)
    s.set_defaults(func=cmd_cat, by="auto")

    s = sub.add_parser(
        "manifest",
        help="write a dataset manifest (one read opens the dataset), or check one",
        description="Open every shard of SOURCE once and write a manifest listing each "
        "with its sample and member counts, sizes and fingerprint (docs/FORMAT.md §9), "
        "paths relative to the manifest's directory. Every command and dataset takes the "
        "manifest as its SOURCE; shards are checked against it when opened. With --check, "
        "open every shard a manifest lists now and report each one missing or changed "
        "(exit 1).",
    )
    s.add_argument("sources", nargs="+", metavar="SOURCE")
    s.add_argument("-o", "--output", metavar="OUT.json", help="the manifest to write")
    s.add_argument(
        "--absolute", action="store_true", help="record absolute paths (default: relative)"
    )
    s.add_argument("--check", action="store_true", help="SOURCE are manifests: check their shards")
    s.add_argument("--prune", action="store_true", help="SOURCE are manifests: delete the files "
                   "of attempts they do not list, under their directory (--dry-run: list only)")
    s.add_argument("--dry-run", action="store_true", help="with --prune: list, delete nothing")
    s.set_defaults(func=cmd_manifest)

    s = sub.add_parser(
        "pack",
        help="pack a folder of files into indexed shards",
        description="Pack the files of SRC_DIR into tar shards with indexes.",
        epilog=_PACK_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    s.add_argument("src_dir", metavar="SRC_DIR")
    s.add_argument("out_pattern", metavar="OUT_PATTERN")
    s.add_argument(
        "--maxcount",
        type=_positive_int,
        default=100_000,
        help="samples per shard at most (default: 100000)",
    )
    s.add_argument(
        "--maxsize",
        type=parse_size,
        default=int(3e9),
        help="bytes per shard at most, e.g. 1e9, 500M, 1GiB (default: 3G)",
    )
    s.add_argument("--layout", choices=LAYOUTS, default="auto")
    s.add_argument(
        "--overwrite",
        action="store_true",
        help="delete the shards (and .tidx) of an earlier pack with OUT_PATTERN first; "
        "without it, existing shards are refused (exit 2)",
    )
    s.add_argument(
        "--jobs",
        type=_positive_int,
        default=1,
        help="writer processes (default: 1); the shards are the same for any N",
    )
    s.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    s.set_defaults(func=cmd_pack)

    s = sub.add_parser(
        "demo",
        help="the main job: digits -> shards -> DataLoader -> classifier",
        description="Pack scikit-learn's handwritten digits into shards (and a copy with the\n"
        "tar command), train a small classifier through DataLoader(TarDataset(...),\n"
        "shuffle=True, num_workers=2), print the held-out accuracy and random-access\n"
        "samples/s. Needs the demo extra; from a clone of the repository:\n\n"
        '  pip install -c constraints.txt -e ".[demo]"',
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    s.add_argument(
        "--workdir",
        default=None,
        help="keep the shards here (default: a temporary directory, deleted)",
    )
    s.add_argument(
        "--epochs", type=_positive_int, default=None, help="training epochs (default: 12)"
    )
    s.add_argument("--seed", type=int, default=0, help="seed of everything (default: 0)")
    s.set_defaults(func=cmd_demo)
    for s in sub.choices.values():
        s.set_defaults(subparser=s)  # main() reports a stray option with this usage line
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``tarindex`` command.

    Args:
        argv: Arguments without the program name. Defaults to ``sys.argv[1:]``.

    Returns:
        The exit code: 0 ok, 1 failure, 2 bad usage (see the module docs), 130 on Ctrl-C.
        User mistakes are reported on stderr in one line, not raised.
    """
    parser = build_parser()
    try:
        args, extra = parser.parse_known_args(argv)
        if extra:  # reported by the subcommand's parser: its usage line, not the top level's
            sub: argparse.ArgumentParser = getattr(args, "subparser", parser)
            sub.error(f"unrecognized arguments: {' '.join(extra)}")
    except SystemExit as e:  # --help, --version (0) or a usage error (2, already printed)
        return e.code if isinstance(e.code, int) else EXIT_USAGE
    if args.command is None:
        parser.print_help(sys.stderr)
        return EXIT_USAGE
    if args.command == "demo" and args.epochs is None:
        from .demo import DEFAULT_EPOCHS

        args.epochs = DEFAULT_EPOCHS
    prefix = f"tarindex {args.command}: error:"
    try:
        return int(args.func(args))
    except (UsageError, PackError) as e:  # PackError: the folder or OUT_PATTERN, before writing
        print(f"{prefix} {_describe(e)}", file=sys.stderr)
        return EXIT_USAGE
    except (TarIndexError, NotFoundError) as e:
        print(f"{prefix} {_describe(e)}", file=sys.stderr)
        return EXIT_FAIL
    except FileNotFoundError as e:
        print(f"{prefix} {_describe(e)}", file=sys.stderr)
        return EXIT_USAGE
    except OSError as e:
        if isinstance(e, BrokenPipeError):  # `tarindex ls x | head`: quiet, exit 1 (output cut)
            try:
                devnull = os.open(os.devnull, os.O_WRONLY)
                os.dup2(devnull, sys.stdout.fileno())
            except (OSError, ValueError, AttributeError):
                pass
            return EXIT_FAIL
        print(f"{prefix} {_describe(e)}", file=sys.stderr)
        return EXIT_FAIL
    except KeyboardInterrupt:
        print(f"tarindex {args.command}: interrupted", file=sys.stderr)
        return 130
