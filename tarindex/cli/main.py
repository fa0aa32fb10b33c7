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
    tarindex view SOURCE [--port N] [--host H] [--open] [--html OUT_DIR]   look at a dataset

A ``SOURCE`` is anything :func:`tarindex.read.sources.expand_source` takes: a path, a directory of ``*.tar``,
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

This module is the argument wiring and the one place that turns errors into exit codes and
messages; each command is a module of its own (:mod:`tarindex.cli.index`, ``verify``, ``info``,
``ls``, ``cat``, ``manifest``, ``pack``, ``demo``), thin over the library.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from collections.abc import Sequence

from .._version import __version__
from ..errors import PackError, TarIndexError
from ..format.spec import GZIP_SPACING, MIN_GZIP_SPACING
from ..read import read_kernel
from ..write.pack import LAYOUTS
from . import cat, demo, index, info, ls, manifest, pack, verify, view
from .common import EXIT_FAIL, EXIT_USAGE, Failure, UsageError, describe

__all__ = ["main", "build_parser", "parse_size"]


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


def _gzip_spacing(text: str) -> int:
    v = _positive_int(text)
    if v < MIN_GZIP_SPACING:
        raise argparse.ArgumentTypeError(f"{v} must be >= {MIN_GZIP_SPACING} (64 KiB)")
    return v


_INDEX_DIR_HELP = "the indexes are in DIR (<tar name>.tidx), not beside the tars"

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
        "--data` and reads with OpenOptions(verify_data=True)",
    )
    s.add_argument(
        "--gzip-spacing",
        type=_gzip_spacing,
        default=GZIP_SPACING,
        metavar="BYTES",
        help="gzip-compressed tars (.tar.gz, .tgz): decompressed bytes between seek points; a "
        "random read inflates at most this much, the index keeps 32 KiB per point "
        "(default: 1048576, at least 65536; docs/FORMAT.md section 10)",
    )
    s.add_argument(
        "-o",
        "--out",
        metavar="DIR",
        default=None,
        help="write the indexes into DIR as <tar name>.tidx instead of beside the tars (needed "
        "for remote tars, which are streamed once; read them with OpenOptions(index_dir=DIR))",
    )
    s.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    s.set_defaults(func=index.command)

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
    s.set_defaults(func=verify.command)

    s = sub.add_parser("info", help="shards, samples, members, extensions, bytes")
    s.add_argument("sources", nargs="+", metavar="SOURCE")
    s.add_argument("--json", action="store_true", help="print a JSON object")
    s.add_argument("--index-dir", metavar="DIR", default=None, help=_INDEX_DIR_HELP)
    s.set_defaults(func=info.command)

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
    s.add_argument(
        "-m",
        "--members",
        action="store_true",
        help="list tar members instead; a member replaced by a later one of the same name "
        "gets a fourth field, 'shadowed by the later NAME at byte OFFSET'",
    )
    s.add_argument(
        "-s",
        "--skipped",
        action="store_true",
        help="list what is in no sample instead (implies --members): directories, links, "
        "devices, sparse files, and regular files the key rule leaves out (README, .hidden, "
        "name., a __ extension), one line each: name, reason",
    )
    s.add_argument("--index-dir", metavar="DIR", default=None, help=_INDEX_DIR_HELP)
    s.set_defaults(func=ls.command)

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
    s.set_defaults(func=cat.command, by="auto")

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
    s.add_argument(
        "--prune",
        action="store_true",
        help="SOURCE are manifests: delete the files of attempts they do not list, under their "
        "directory (--dry-run: list only)",
    )
    s.add_argument("--dry-run", action="store_true", help="with --prune: list, delete nothing")
    s.set_defaults(func=manifest.command)

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
    s.add_argument(
        "--max-side",
        type=_positive_int,
        help="re-encode images whose longer side is above N pixels at N (default: as they are)",
    )
    s.add_argument("--quality", type=int, default=95, help="JPEG/WebP quality of --max-side")
    s.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    s.set_defaults(func=pack.command)

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
    s.set_defaults(func=demo.command)

    s = sub.add_parser(
        "view",
        help="look at a dataset in a browser: summary, samples, one sample, shards",
        description="Serve read-only pages of SOURCE on a local port (127.0.0.1 unless --host), "
        "until Ctrl-C; or with --html write them as a static report.",
    )
    s.add_argument("source", metavar="SOURCE")
    s.add_argument("--port", type=int, default=8765, help="port (default: 8765; 0: any free)")
    s.add_argument(
        "--host", default="127.0.0.1", help="interface (default: 127.0.0.1; others warn)"
    )
    s.add_argument("--open", action="store_true", help="open the page in a browser")
    s.add_argument("--html", metavar="OUT_DIR", default=None, help="write a static report")
    s.add_argument(
        "--pages", type=_positive_int, default=3, help="grid pages in --html (default: 3)"
    )
    s.add_argument("--index-dir", metavar="DIR", default=None, help=_INDEX_DIR_HELP)
    s.set_defaults(func=view.command)
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
    prefix = f"tarindex {args.command}: error:"
    try:
        return int(args.func(args))
    except (UsageError, PackError) as e:  # PackError: the folder or OUT_PATTERN, before writing
        print(f"{prefix} {describe(e)}", file=sys.stderr)
        return EXIT_USAGE
    except (TarIndexError, Failure) as e:  # NotFoundError is a Failure
        print(f"{prefix} {describe(e)}", file=sys.stderr)
        return EXIT_FAIL
    except FileNotFoundError as e:
        print(f"{prefix} {describe(e)}", file=sys.stderr)
        return EXIT_USAGE
    except OSError as e:
        if isinstance(e, BrokenPipeError):  # `tarindex ls x | head`: quiet, exit 1 (output cut)
            try:
                devnull = os.open(os.devnull, os.O_WRONLY)
                os.dup2(devnull, sys.stdout.fileno())
            except (OSError, ValueError, AttributeError):
                pass
            return EXIT_FAIL
        print(f"{prefix} {describe(e)}", file=sys.stderr)
        return EXIT_FAIL
    except KeyboardInterrupt:
        print(f"tarindex {args.command}: interrupted", file=sys.stderr)
        return 130
