"""Pack a folder of files into indexed shards: first the plan, then the writing.

:func:`plan_pack` decides, before anything is written, which files form which sample and
checks the output pattern; :func:`write_pack` writes the plan with
:class:`tarindex.ShardWriter` (tar + index per shard, FORMAT.md §1). ``tarindex pack`` is these
two calls plus messages.

Layouts:

* ``classes``: ``SRC/<class>/.../<file>.<ext>``; every file is a sample with a ``cls`` member
  (its class id: the position of its class folder in the sorted list of class folders, also
  written as ``classes.json`` beside the shards). Key = ``<class>/<path>/<stem>``, stem = the
  file name up to its last dot, through :func:`sanitize_stem`. Files sharing a stem in one
  folder (``001.jpg``, ``001.json``) form one sample.
* ``flat``: files sharing a key form a sample, key and extension by the webdataset rule
  (:func:`tarindex.format.keys.split_key`, FORMAT.md §4). Sub-folders become part of the key.
* ``auto``: ``classes`` if the folder's top level holds only folders, else ``flat``.

Hidden files and folders, and files without an extension, are skipped. Samples are written in
sorted key order.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .errors import PackError, WriterError
from .format.keys import check_ext, check_key, split_key
from .indexfile import write_atomic
from .writer import ShardWriter, check_pattern

__all__ = ["PackPlan", "PackResult", "plan_pack", "sanitize_stem", "write_pack"]

LAYOUTS = ("auto", "classes", "flat")


def sanitize_stem(stem: str) -> str:
    """Make a file's stem usable as a key basename, deterministically and reversibly.

    A key's basename may not contain a dot (FORMAT.md §4): ``%`` becomes ``%25`` and ``.``
    becomes ``%2E`` (URL-style, so ``urllib.parse.unquote`` restores the stem, and two
    different stems never map to the same key). Stems without ``.`` or ``%`` are unchanged.
    """
    return stem.replace("%", "%25").replace(".", "%2E")


@dataclass
class PackPlan:
    """What :func:`write_pack` will write, computed from the source folder before anything is."""

    layout: str
    """``"classes"`` or ``"flat"``."""
    samples: list[tuple[str, list[tuple[str, str]], int | None]]
    """``(key, [(ext, file path), ...], class id or None)`` in write order."""
    classes: list[str] | None
    """Class names; a sample's class id is its position here (``classes`` layout only)."""
    skipped: list[tuple[str, str]]
    """``(file path, reason)`` of files that go into no sample."""


@dataclass
class PackResult:
    """What :func:`write_pack` wrote."""

    paths: list[str]
    """The shards, in order; each has its index beside it (``<shard>.tidx``)."""
    n_files: int
    """Source files packed (the ``cls`` members of the ``classes`` layout not counted)."""
    classes_json: str | None
    """Path of ``classes.json`` (``classes`` layout), else None."""


def _walk_files(root: str) -> list[str]:
    """Non-hidden regular files under ``root``, as sorted ``/``-separated relative paths."""
    out: list[str] = []
    for d, dirs, files in os.walk(root):
        dirs[:] = sorted(x for x in dirs if not x.startswith("."))
        rel = os.path.relpath(d, root)
        for f in sorted(files):
            if f.startswith("."):
                continue
            path = f if rel == "." else os.path.join(rel, f)
            out.append(path.replace(os.sep, "/"))
    return sorted(out)


def plan_pack(
    src: str,
    layout: str = "auto",
    *,
    out_pattern: str | None = None,
    maxcount: int = 100_000,
) -> PackPlan:
    """Decide which files form which samples (layouts in the module docs).

    Args:
        src: The folder to pack.
        layout: ``"classes"``, ``"flat"`` or ``"auto"`` (``classes`` when the folder's top
            level holds only sub-folders, ``flat`` otherwise). Defaults to ``"auto"``.
        out_pattern: If given, the shard path pattern is checked too: it must lie outside
            ``src`` and pass :func:`tarindex.writer.check_pattern`, and a pattern without an
            integer field must fit the samples in one shard. Defaults to no check.
        maxcount: Samples per shard at most, for that last check. Defaults to ``100_000``.

    Returns:
        A :class:`PackPlan`.

    Raises:
        PackError: ``src`` is not a folder or holds no usable file; a ``classes`` layout with
            files at the top level, or with a ``.cls`` file (the class id is written as
            ``cls``); an unknown layout; ``out_pattern`` inside ``src``, not a valid pattern,
            or without an integer field while the samples need more than one shard. The
            message names the path and the fix.
    """
    if layout not in LAYOUTS:
        raise PackError(f"layout {layout!r}: expected one of {', '.join(LAYOUTS)}")
    if out_pattern is not None:
        out_dir = os.path.dirname(os.path.abspath(out_pattern))
        if os.path.commonpath([os.path.abspath(src), out_dir]) == os.path.abspath(src):
            raise PackError(
                f"{out_pattern}: OUT_PATTERN is inside SRC_DIR {src}; write the "
                f"shards elsewhere (a second run would pack them)"
            )
    plan = _plan(src, layout)
    if out_pattern is not None:
        try:
            has_field = check_pattern(out_pattern)
        except WriterError as e:
            raise PackError(str(e)) from None
        if not has_field and len(plan.samples) > maxcount:
            raise PackError(
                f"{out_pattern!r}: {len(plan.samples)} samples need more than one shard "
                f"(--maxcount {maxcount}); add an integer field, e.g. out/shard-%06d.tar"
            )
    return plan


def _plan(src: str, layout: str) -> PackPlan:
    if not os.path.isdir(src):
        raise PackError(f"{src}: not a directory")
    top = [e for e in sorted(os.listdir(src)) if not e.startswith(".")]
    top_files = [e for e in top if not os.path.isdir(os.path.join(src, e))]
    top_dirs = [e for e in top if os.path.isdir(os.path.join(src, e))]
    if layout == "auto":
        layout = "classes" if top_dirs and not top_files else "flat"
    if layout == "classes" and top_files:
        raise PackError(
            f"{src}: --layout classes needs only class folders at the top level, found file "
            f"{top_files[0]!r}; move it into a class folder or use --layout flat"
        )
    classes = top_dirs if layout == "classes" else None
    class_id = {c: i for i, c in enumerate(classes or [])}
    groups: dict[str, list[tuple[str, str]]] = {}
    labels: dict[str, int | None] = {}
    skipped: list[tuple[str, str]] = []
    for rel in _walk_files(src):
        path = os.path.join(src, *rel.split("/"))
        if layout == "classes":
            dirname, _, base = rel.rpartition("/")
            stem, dot, ext = base.rpartition(".")
            if not dot or not stem:
                skipped.append((path, "no extension"))
                continue
            key = f"{dirname}/{sanitize_stem(stem)}"
            label: int | None = class_id[rel.split("/", 1)[0]]
        else:
            parts = split_key(rel.encode("utf-8", "surrogateescape"))
            if parts is None:
                skipped.append((path, "no extension"))
                continue
            key = parts[0].decode("utf-8", "surrogateescape")
            ext = parts[1].decode("utf-8", "surrogateescape")
            label = None
        try:
            check_key(key)
            check_ext(ext)
        except ValueError as e:
            skipped.append((path, str(e)))
            continue
        if layout == "classes" and ext == "cls":
            raise PackError(
                f"{path}: a .cls file in the classes layout; pack writes each sample's class id "
                f"as 'cls' itself: remove or rename it"
            )
        groups.setdefault(key, []).append((ext, path))
        labels[key] = label
    if not groups:
        raise PackError(
            f"{src}: no files to pack (hidden files and files without an extension are skipped)"
        )
    samples = [(k, groups[k], labels[k]) for k in sorted(groups)]
    return PackPlan(layout, samples, classes, skipped)


def write_pack(
    plan: PackPlan,
    out_pattern: str,
    *,
    maxcount: int = 100_000,
    maxsize: float = 3e9,
    on_sample: Callable[[], object] | None = None,
) -> PackResult:
    """Write a :class:`PackPlan` into indexed shards with :class:`tarindex.ShardWriter`.

    Each sample's files are read whole, in plan order; the ``classes`` layout adds ``cls``
    (the class id, an int) to every sample and writes ``classes.json`` (a JSON list of the
    class names; id = position) atomically beside the first shard. On an error the shard in
    progress is deleted; finished shards stay complete with their indexes.

    Args:
        plan: From :func:`plan_pack`.
        out_pattern: Shard path pattern, ``pattern % k`` for shard ``k`` (e.g.
            ``"out/train-%06d.tar"``), or a plain path for one shard.
        maxcount: Samples per shard at most. Defaults to ``100_000``.
        maxsize: Bytes per shard at most. Defaults to ``3e9``.
        on_sample: Called after every sample written (a progress bar). Defaults to None.

    Returns:
        A :class:`PackResult`.

    Raises:
        WriterError: As :class:`tarindex.ShardWriter` (a bad pattern or limit, a pattern
            without an integer field when a second shard is needed).
        OSError: A source file cannot be read or a shard cannot be written.
    """
    n_files = 0
    with ShardWriter(out_pattern, maxcount=maxcount, maxsize=maxsize) as sink:
        for key, files, label in plan.samples:
            sample: dict[str, Any] = {"__key__": key}
            for ext, path in files:
                with open(path, "rb") as f:
                    sample[ext] = f.read()
            if label is not None:
                sample["cls"] = label
            sink.write(sample)
            n_files += len(files)
            if on_sample is not None:
                on_sample()
    classes_json = None
    if plan.classes is not None:
        classes_json = os.path.join(os.path.dirname(os.path.abspath(sink.paths[0])), "classes.json")
        write_atomic(
            classes_json, (json.dumps(plan.classes, ensure_ascii=False, indent=1) + "\n").encode()
        )
    return PackResult(sink.paths, n_files, classes_json)
