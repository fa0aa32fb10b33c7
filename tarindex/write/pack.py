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

Nothing is left out silently:

* Skipped files (hidden ones aside) are listed in :attr:`PackPlan.skipped` with the reason:
  no extension, a name that is not a valid key, not a regular file (a fifo, socket, device).
* A symlink is followed when its target (fully resolved) lies inside the source folder: the
  sample gets the link's name and the target's bytes. A symlink to outside the folder, a
  broken symlink, a symlink loop and a folder link to one of its own parents (a loop) are
  refused with :class:`~tarindex.errors.PackError`.
* A file or folder that cannot be read raises :class:`PermissionError` (an :class:`OSError`)
  naming it, before anything is written.
* A class folder whose name is not valid UTF-8 raises :class:`~tarindex.errors.PackError`.
* The output: a pattern whose folder resolves (symlinks included) into the source folder is
  refused; so is a pattern that already names files on disk (shard ``k`` = ``pattern % k``
  and its ``.tidx``), unless ``overwrite=True``, which deletes those files, and only those,
  before writing (:func:`existing_shards`).
* A failure while writing (disk full, a source file gone) deletes the shard in progress (its
  temp file) and every shard this run finished; the :class:`OSError` names the shard or the
  source file. A failed pack leaves no partial dataset behind.
"""

from __future__ import annotations

import errno
import json
import os
import stat
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..errors import PackError, ParallelWriteError, WriterError
from ..format.keys import check_ext, check_key, split_key
from ..storage.indexfile import index_path_for, write_atomic
from .shards import ShardWriter, check_pattern, existing_shards, plan_shard_sizes

__all__ = [
    "PackPlan",
    "PackResult",
    "plan_pack",
    "sanitize_stem",
    "write_pack",
]

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
    """``(file path, reason)`` of files that go into no sample (hidden files not listed)."""
    src: str | None = None
    """The source folder (set by :func:`plan_pack`); :func:`write_pack` refuses an output
    pattern inside it. None: not checked."""


@dataclass
class PackResult:
    """What :func:`write_pack` wrote."""

    paths: list[str]
    """The shards, in order; each has its index beside it (``<shard>.tidx``)."""
    n_files: int
    """Source files packed (the ``cls`` members of the ``classes`` layout not counted)."""
    classes_json: str | None
    """Path of ``classes.json`` (``classes`` layout), else None."""
    removed: list[str] = field(default_factory=list)
    """Files of an earlier pack deleted first (``overwrite=True``): shards and indexes."""


def _display(path: str) -> str:
    r"""``path`` for a one-line message, escaped.

    Bytes that are not UTF-8 are shown as ``\xNN``, control characters (a newline in a file
    name) as ``\n``, ``\x1b``, ...
    """
    text = path.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def _inside(path: str, folder: str) -> bool:
    """True if the absolute ``path`` is ``folder`` or lies under it (both resolved)."""
    return os.path.commonpath([path, folder]) == folder


def _unreadable(path: str, what: str) -> PermissionError:
    return PermissionError(
        errno.EACCES,
        f"Permission denied: cannot {what} in SRC_DIR; fix its permissions or move it out "
        f"(nothing was written)",
        _display(path),
    )


@dataclass
class _Tree:
    """What :func:`_walk_files` found under a folder."""

    files: list[str] = field(default_factory=list)
    """Regular files (or links to them), ``/``-separated paths relative to the root, sorted."""
    top_dirs: list[str] = field(default_factory=list)
    """Folders (or links to them) at the top level, sorted."""
    top_files: list[str] = field(default_factory=list)
    """Files at the top level, sorted."""
    skipped: list[tuple[str, str]] = field(default_factory=list)
    """``(path, reason)``: entries that are neither a file nor a folder."""


def _walk_files(root: str) -> _Tree:
    """Walk ``root``: non-hidden files and folders, following only links that stay inside.

    Raises:
        PackError: A symlink to outside ``root``, a broken symlink, a symlink loop, or a
            folder link to one of its own parents.
        PermissionError: A file that cannot be read or a folder that cannot be listed.
        OSError: Another error from the file system, naming the path.
    """
    real_root = os.path.realpath(root)
    tree = _Tree()

    def target(path: str) -> os.stat_result:
        """The stat of a symlink's target, which must lie inside ``root``."""
        real = os.path.realpath(path)
        if not _inside(real, real_root):
            raise PackError(
                f"{_display(path)}: symlink to {_display(real)}, outside SRC_DIR {_display(root)}; "
                f"pack follows only links that stay inside SRC_DIR: copy the target in or "
                f"remove the link"
            )
        try:
            return os.stat(path)
        except FileNotFoundError:
            raise PackError(
                f"{_display(path)}: broken symlink (target {_display(os.readlink(path))} does "
                f"not exist); fix or remove it"
            ) from None
        except OSError as e:
            if e.errno == errno.ELOOP:
                raise PackError(f"{_display(path)}: symlink loop; fix or remove it") from None
            raise

    def visit(folder: str, rel: str, parents: frozenset[tuple[int, int]]) -> None:
        if not os.access(folder, os.R_OK | os.X_OK):
            raise _unreadable(folder, "list this folder")
        try:
            with os.scandir(folder) as it:
                entries = sorted(it, key=lambda e: e.name)
        except PermissionError:
            raise _unreadable(folder, "list this folder") from None
        for entry in entries:
            if entry.name.startswith("."):
                continue
            path = os.path.join(folder, entry.name)
            sub = f"{rel}/{entry.name}" if rel else entry.name
            if entry.is_symlink():
                mode = target(path).st_mode
            elif entry.is_dir(follow_symlinks=False):
                mode = stat.S_IFDIR
            elif entry.is_file(follow_symlinks=False):
                mode = stat.S_IFREG
            else:
                mode = 0
            if stat.S_ISDIR(mode):
                st = entry.stat()  # follows a link: the folder it reaches
                ident = (st.st_dev, st.st_ino)
                if ident in parents:
                    raise PackError(
                        f"{_display(path)}: a link to one of its own parent folders (a loop); "
                        f"remove the link"
                    )
                if not rel:
                    tree.top_dirs.append(entry.name)
                visit(path, sub, parents | {ident})
            elif stat.S_ISREG(mode):
                if not os.access(path, os.R_OK):
                    raise _unreadable(path, "read this file")
                if not rel:
                    tree.top_files.append(entry.name)
                tree.files.append(sub)
            else:
                tree.skipped.append((path, "not a regular file (a fifo, socket or device)"))

    root_st = os.stat(root)
    visit(root, "", frozenset({(root_st.st_dev, root_st.st_ino)}))
    tree.files.sort()
    return tree


def _check_output(src: str | None, pattern: str, *, overwrite: bool) -> list[str]:
    """Check the output pattern against the source folder and the files already there.

    Returns:
        The files an earlier pack left under ``pattern`` (:func:`existing_shards`), for
        ``overwrite`` to delete; empty if none.

    Raises:
        PackError: ``pattern`` is not a valid pattern, resolves into ``src``, or names
            existing files and ``overwrite`` is False.
    """
    try:
        has_field = check_pattern(pattern)
        old = existing_shards(pattern)
    except WriterError as e:
        raise PackError(str(e)) from None
    if src is not None:
        first = pattern % 0 if has_field else pattern
        out_dir = os.path.realpath(os.path.dirname(os.path.abspath(first)))
        if _inside(out_dir, os.path.realpath(src)):
            raise PackError(
                f"{pattern}: OUT_PATTERN is inside SRC_DIR {src} (symlinks resolved: "
                f"{_display(out_dir)}); write the shards elsewhere (a second run would pack them)"
            )
    if old and not overwrite:
        more = f" and {len(old) - 1} more" if len(old) > 1 else ""
        raise PackError(
            f"{pattern}: {len(old)} file(s) of an earlier pack already exist ({old[0]}{more}); "
            f"pass --overwrite (overwrite=True) to delete them first, or choose another pattern"
        )
    return old


def plan_pack(
    src: str,
    layout: str = "auto",
    *,
    out_pattern: str | None = None,
    maxcount: int = 100_000,
    overwrite: bool = False,
) -> PackPlan:
    """Decide which files form which samples (layouts and checks in the module docs).

    Args:
        src: The folder to pack.
        layout: ``"classes"``, ``"flat"`` or ``"auto"`` (``classes`` when the folder's top
            level holds only sub-folders, ``flat`` otherwise). Defaults to ``"auto"``.
        out_pattern: If given, the shard path pattern is checked too: it must pass
            :func:`tarindex.write.shards.check_pattern`, its folder must resolve (symlinks
            included) outside ``src``, it must name no existing file unless ``overwrite``
            (:func:`existing_shards`), and a pattern without an integer field must fit the
            samples in one shard. Defaults to no check.
        maxcount: Samples per shard at most, for that last check. Defaults to ``100_000``.
        overwrite: Accept an ``out_pattern`` that names existing files
            (:func:`write_pack` deletes them). Defaults to False.

    Returns:
        A :class:`PackPlan`.

    Raises:
        PackError: ``src`` is not a folder or holds no usable file; it holds a symlink to
            outside itself, a broken symlink or a link loop; a class folder name is not
            valid UTF-8; a ``classes`` layout with files at the top level, or with a
            ``.cls`` file (the class id is written as ``cls``); an unknown layout;
            ``out_pattern`` inside ``src``, not a valid pattern, naming existing files
            (without ``overwrite``), or without an integer field while the samples need
            more than one shard. The message names the path and the fix.
        PermissionError: A file or folder under ``src`` cannot be read; names it.
        OSError: Another file-system error while walking ``src``, naming the path.
    """
    if layout not in LAYOUTS:
        raise PackError(f"layout {layout!r}: expected one of {', '.join(LAYOUTS)}")
    if out_pattern is not None:
        _check_output(src, out_pattern, overwrite=overwrite)
    plan = _plan(src, layout)
    if out_pattern is not None and not check_pattern(out_pattern) and len(plan.samples) > maxcount:
        raise PackError(
            f"{out_pattern!r}: {len(plan.samples)} samples need more than one shard "
            f"(--maxcount {maxcount}); add an integer field, e.g. out/shard-%06d.tar"
        )
    return plan


def _plan(src: str, layout: str) -> PackPlan:
    if not os.path.isdir(src):
        raise PackError(f"{src}: not a directory")
    tree = _walk_files(src)
    if layout == "auto":
        layout = "classes" if tree.top_dirs and not tree.top_files else "flat"
    if layout == "classes" and tree.top_files:
        raise PackError(
            f"{src}: --layout classes needs only class folders at the top level, found file "
            f"{tree.top_files[0]!r}; move it into a class folder or use --layout flat"
        )
    classes = tree.top_dirs if layout == "classes" else None
    for name in classes or []:
        try:
            name.encode("utf-8")
        except UnicodeEncodeError:
            raise PackError(
                f"{_display(os.path.join(src, name))}: class folder name is not valid UTF-8 "
                f"(class names go into the keys and classes.json); rename the folder"
            ) from None
    class_id = {c: i for i, c in enumerate(classes or [])}
    groups: dict[str, list[tuple[str, str]]] = {}
    labels: dict[str, int | None] = {}
    skipped = list(tree.skipped)
    for rel in tree.files:
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
    return PackPlan(layout, samples, classes, skipped, src)


def _failed(e: OSError, path: str, doing: str, n_done: int) -> OSError:
    """``e`` restated to name ``path`` (a shard, not its temp file) and what was removed."""
    return OSError(
        e.errno,
        f"{e.strerror or e}, {doing}; removed the temp file and the {n_done} shard(s) this "
        f"run had finished: nothing of this pack was kept",
        _display(path),
    )


def _classes_path(first_shard: str) -> str:
    """Where ``classes.json`` goes: beside the first shard, named as it is (relative stays so)."""
    return os.path.join(os.path.dirname(first_shard), "classes.json")


def _write_classes(path: str, classes: list[str]) -> None:
    """Write the class names as a JSON list (id = position), atomically."""
    write_atomic(path, (json.dumps(classes, ensure_ascii=False, indent=1) + "\n").encode())


def _remove_shards(tars: Sequence[str]) -> None:
    """Delete shards this run wrote, with their indexes (after a failure)."""
    for tar in tars:
        for path in (tar, index_path_for(tar)):
            try:
                os.remove(path)
            except OSError:  # already gone, or cannot: keep the error that stopped the pack
                pass


def write_pack(
    plan: PackPlan,
    out_pattern: str,
    *,
    maxcount: int = 100_000,
    maxsize: float = 3e9,
    overwrite: bool = False,
    on_sample: Callable[[], object] | None = None,
    jobs: int = 1,
    encoder: Callable[[str, Any], bytes] | bool = True,
) -> PackResult:
    """Write a :class:`PackPlan` into indexed shards with :class:`tarindex.ShardWriter`.

    Each sample's files are read whole, in plan order; the ``classes`` layout adds ``cls``
    (the class id, an int) to every sample and writes ``classes.json`` (a JSON list of the
    class names; id = position) atomically beside the first shard. On any error (or
    Ctrl-C) the shard in progress (its temp file) and every shard this call finished are
    deleted, with their indexes: a failed pack leaves no partial dataset.

    Args:
        plan: From :func:`plan_pack`.
        out_pattern: Shard path pattern, ``pattern % k`` for shard ``k`` (e.g.
            ``"out/train-%06d.tar"``), or a plain path for one shard.
        maxcount: Samples per shard at most. Defaults to ``100_000``.
        maxsize: Bytes per shard at most. Defaults to ``3e9``.
        overwrite: Delete the files an earlier pack left under ``out_pattern``
            (:func:`existing_shards`: shards and their indexes, nothing else) before
            writing; if False, such files are refused. Defaults to False.
        on_sample: Called after every sample written (a progress bar). Defaults to None.
        jobs: Worker processes (:func:`tarindex.write_shards`); the shards are cut before
            writing where one writer would cut them (:func:`tarindex.write.shards.plan_shard_sizes`,
            from the files' sizes), so the result is the same for any ``jobs``. Defaults to
            ``1`` (this process).
        encoder: The writer's encoder (the files' bytes are its values), e.g.
            ``tarindex.codecs.ImageEncoder(quality=90, max_side=512)`` to store images larger
            than 512 pixels scaled down (``tarindex pack --max-side``; with ``jobs > 1`` the
            shards are still cut from the files' sizes). Defaults to ``True`` (bytes as they
            are).

    Returns:
        A :class:`PackResult`.

    Raises:
        PackError: ``out_pattern`` fails :func:`tarindex.write.shards.check_pattern`, resolves
            into ``plan.src``, or names existing files while ``overwrite`` is False (nothing
            is written or deleted then).
        WriterError: As :class:`tarindex.ShardWriter` (a bad limit, a pattern without an
            integer field when a second shard is needed).
        OSError: A source file cannot be read (names the file) or a shard cannot be
            written, e.g. the disk is full (names the shard).
        ParallelWriteError: With ``jobs > 1``, a writer process failed (the disk is full, a
            source file is gone, it was killed); the message gives each failed shard's cause
            and says the finished shards were removed (``.result.paths`` is empty,
            ``.result.failed`` holds the causes).
    """
    _check_output(plan.src, out_pattern, overwrite=overwrite)  # refuse before touching anything
    has_field = check_pattern(out_pattern)
    if jobs > 1 and has_field:
        return _write_pack_jobs(
            plan, out_pattern, maxcount, maxsize, overwrite, on_sample, jobs, encoder
        )
    sink = ShardWriter(out_pattern, maxcount=maxcount, maxsize=maxsize, encoder=encoder)
    n_files = 0
    classes_json = None
    ours: set[str] = set()  # shards this call put a sample in (only those are deleted on error)

    def shard() -> str:  # the shard in progress, or the one whose close failed
        return out_pattern % sink.shard if has_field else out_pattern

    try:
        # again, now that the writer holds the pattern: nothing appeared since the first look
        removed = _check_output(plan.src, out_pattern, overwrite=overwrite)
        for path in removed:
            os.remove(path)
        for key, files, label in plan.samples:
            sample: dict[str, Any] = {"__key__": key}
            for ext, path in files:
                try:
                    with open(path, "rb") as f:
                        sample[ext] = f.read()
                except OSError as e:
                    raise _failed(
                        e, path, "reading this file of SRC_DIR", len(sink.paths)
                    ) from None
            if label is not None:
                sample["cls"] = label
            try:
                sink.write(sample)  # may finish the previous shard and start the next
            except OSError as e:
                raise _failed(e, shard(), "writing this shard", len(sink.paths)) from None
            ours.add(shard())
            n_files += len(files)
            if on_sample is not None:
                on_sample()
        try:
            sink.close()
        except OSError as e:
            raise _failed(e, shard(), "writing this shard", len(sink.paths)) from None
        if plan.classes is not None:
            classes_json = _classes_path(sink.paths[0])
            try:
                _write_classes(classes_json, plan.classes)
            except OSError as e:
                raise _failed(e, classes_json, "writing this file", len(sink.paths)) from None
    except BaseException:
        _discard(sink, ours)
        raise
    return PackResult(sink.paths, n_files, classes_json, removed)


@dataclass
class _PlanSource:
    """The plan's samples as a map-style dataset (picklable: read in the writer processes)."""

    samples: list[tuple[str, list[tuple[str, str]], int | None]]

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, i: int) -> dict[str, Any]:
        key, files, label = self.samples[i]
        sample: dict[str, Any] = {"__key__": key}
        for ext, path in files:
            with open(path, "rb") as f:
                sample[ext] = f.read()
        if label is not None:
            sample["cls"] = label
        return sample


def _write_pack_jobs(
    plan: PackPlan,
    out_pattern: str,
    maxcount: int,
    maxsize: float,
    overwrite: bool,
    on_sample: Callable[[], object] | None,
    jobs: int,
    encoder: Callable[[str, Any], bytes] | bool = True,
) -> PackResult:
    """:func:`write_pack` with ``jobs`` writer processes (:func:`tarindex.write_shards`)."""
    from .parallel import WriteResult, describe_failed, write_shards

    ShardWriter(out_pattern, maxcount=maxcount, maxsize=maxsize)  # checks the limits
    sizes = []
    for key, files, label in plan.samples:
        members = [(f"{key}.{ext}".encode(), os.stat(path).st_size) for ext, path in files]
        if label is not None:
            members.append((f"{key}.cls".encode(), len(str(label))))
        sizes.append(members)
    shard_sizes = plan_shard_sizes(sizes, maxcount, maxsize)
    removed = _check_output(plan.src, out_pattern, overwrite=overwrite)
    for path in removed:
        os.remove(path)

    def progress(n: int) -> None:
        if on_sample is not None:
            for _ in range(n):
                on_sample()

    try:
        res = write_shards(
            _PlanSource(plan.samples),
            out_pattern,
            jobs=jobs,
            shard_sizes=shard_sizes,
            progress=False,
            on_progress=progress,
            encoder=encoder,
        )
    except ParallelWriteError as e:  # the shards finished meanwhile go too: said once, as done
        _remove_shards(e.result.paths)
        raise ParallelWriteError(
            f"{out_pattern}: {describe_failed(out_pattern, e.result.failed)}; removed the "
            f"{len(e.result.paths)} shard(s) this run had finished: nothing of this pack was "
            f"kept",
            WriteResult([], [], 0, e.result.failed),
        ) from None
    classes_json = None
    if plan.classes is not None:
        classes_json = _classes_path(res.paths[0])
        try:
            _write_classes(classes_json, plan.classes)
        except OSError as e:
            _remove_shards(res.paths)
            raise _failed(e, classes_json, "writing this file", len(res.paths)) from None
    n_files = sum(len(files) for _, files, _ in plan.samples)
    return PackResult(res.paths, n_files, classes_json, removed)


def _discard(sink: ShardWriter, ours: set[str]) -> None:
    """Delete what a failed :func:`write_pack` wrote: the temp file, shards, indexes.

    ``ours`` holds the shards that got a sample: the finished ones, and one whose close
    failed after its tar was renamed into place (before its index was written).
    """
    try:
        sink.abort()  # the shard in progress: its temp file
    except OSError:  # a close that fails again (disk still full): the file is unlinked anyway
        pass
    _remove_shards(sorted(ours | set(sink.paths)))
