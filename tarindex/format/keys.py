"""Member name -> (sample key, extension): the one key rule used everywhere in tarindex.

The rule follows webdataset: the key is the member path up to the first dot of its
*basename*; the extension is the rest of the basename (without that dot). Dots in
directory names do not count. Leading ``./`` and ``/`` components are removed first (GNU tar's
``tar cf x.tar .`` writes them; extraction ignores them). Examples (FORMAT.md §4)::

    "a/22.05.png"          -> ("a/22", "05.png")
    "./235342 Track 2.0.mp3" -> ("235342 Track 2", "0.mp3")
    "v1.2/img.tar.gz"      -> ("v1.2/img", "tar.gz")
    "README"               -> None  (no extension: not part of any sample)
"""

from __future__ import annotations

__all__ = [
    "served_ext",
    "split_key",
    "normalize_name",
    "lookup_key",
    "check_key",
    "check_ext",
    "no_sample_members",
    "no_sample_reason",
    "escape_name",
]

import re
from collections.abc import Sequence

import numpy as np
from numpy.typing import NDArray

_SLASH, _DOT, _UNDERSCORE = ord("/"), ord("."), ord("_")
NO_SAMPLE = "in no sample"
"""Start of the ``Members.skipped`` reason of a regular file the key rule leaves out."""


def normalize_name(name: bytes) -> bytes:
    """Strip leading ``./`` and ``/`` components from a member name (FORMAT.md §4, rule 1).

    Bytes in, bytes out; ``b"././/a/b.png"`` becomes ``b"a/b.png"``.
    """
    while True:
        if name.startswith(b"./"):
            name = name[2:]
        elif name.startswith(b"/"):
            name = name[1:]
        else:
            return name


def lookup_key(key: str) -> bytes:
    """A key asked for (a lookup's argument), as the index stores keys (FORMAT.md §4).

    UTF-8 with ``surrogateescape`` (so a key read from a non-UTF-8 name round-trips), then
    :func:`normalize_name`. The one rule of every key lookup (``ShardReader.find_key``,
    ``ShardSet.index_of``/``get``, ``TarDataset.get``).

    Raises:
        TypeError: If ``key`` is not a ``str`` (a sample *index* is read with
            ``sample(i)`` or ``ds[i]``, not looked up).
    """
    if not isinstance(key, str):
        raise TypeError(
            f"a sample key is a str, not {type(key).__name__} ({key!r}): read sample i with "
            f"sample(i) (or ds[i]); get(key) and index_of(key) look a key up"
        )
    return normalize_name(key.encode("utf-8", "surrogateescape"))


def split_key(name: bytes) -> tuple[bytes, bytes] | None:
    """Split a member name into ``(key, extension)`` bytes, or None when it has no extension.

    Args:
        name: Raw member name bytes as stored in the tar (FORMAT.md §4).

    Returns:
        ``(key, ext)`` where ``key`` is the normalized path up to the first dot of the
        basename and ``ext`` the rest of the basename; ``None`` when the basename has no
        dot, starts with a dot, or ends with one, or when the extension starts with ``__``
        (reserved for ``__key__``, ``__shard__``, ``__index__``): such members belong to no
        sample.
    """
    if name.startswith((b"./", b"/")):
        name = normalize_name(name)
    slash = name.rfind(b"/") + 1
    dot = name.find(b".", slash)
    if dot <= slash or dot == len(name) - 1 or name.startswith(b"__", dot + 1):
        return None
    return name[:dot], name[dot + 1 :]


def served_ext(ext: str) -> str:
    """The name a sample serves extension ``ext`` under: lower-cased (FORMAT.md §4, rule 4).

    webdataset's ``group_by_keys(lcase=True)`` lower-cases extensions, so ``a.JPG`` is the
    ``"jpg"`` of sample ``a`` for ``fields=``, ``select=`` and decoding alike. The index stores
    extensions as they are in the tar (its tables and their checks are unchanged); readers
    apply this when they open a shard. Two extensions of one sample that differ only in case
    (``a.jpg`` and ``a.JPG``) are refused when that sample is read, as webdataset refuses a
    duplicate file name.
    """
    return ext.lower()


def check_key(key: str) -> None:
    """Raise ValueError unless ``key`` is a key the writer may store (FORMAT.md §4).

    Such a key round-trips through :func:`split_key` unchanged and is safe to extract.

    Args:
        key: The sample key (``__key__``).

    Raises:
        ValueError: If ``key`` is empty, ends with ``/``, has a dot in its basename, starts
            with ``./`` or ``/``, contains a NUL, has a ``..`` component, or is not
            encodable as UTF-8 (a lone surrogate).
    """
    if not key:
        raise ValueError("empty sample key")
    base = key.rsplit("/", 1)[-1]
    if not base:
        raise ValueError(f"sample key {key!r} ends with '/'")
    if "." in base:
        raise ValueError(
            f"sample key {key!r} has a dot in its basename; readers would split it at the "
            f"first dot (webdataset rule, FORMAT.md §4): use e.g. {key.replace('.', '_')!r}"
        )
    if key.startswith("./") or key.startswith("/"):
        raise ValueError(f"sample key {key!r} starts with './' or '/'; readers strip it")
    if "\0" in key:
        raise ValueError(f"sample key {key!r} contains a NUL byte")
    if ".." in key.split("/"):
        raise ValueError(
            f"sample key {key!r} has a '..' component; extracting the shard would write outside "
            f"the target directory (tar and tarfile refuse or rewrite such names)"
        )
    _check_utf8("sample key", key)


def _check_utf8(what: str, s: str) -> None:
    # names are stored as UTF-8; a lone surrogate would fail half-way through a sample
    try:
        s.encode("utf-8")
    except UnicodeEncodeError as e:
        raise ValueError(
            f"{what} {s!r} is not encodable as UTF-8 ({e.reason} at {e.start})"
        ) from None


def check_ext(ext: str) -> None:
    """Raise ValueError unless ``ext`` is an extension the writer may store (FORMAT.md §4).

    Args:
        ext: The extension, without its leading dot (``"png"``, ``"seg.png"``).

    Raises:
        ValueError: If ``ext`` is empty, contains ``/`` or a NUL, starts or ends with ``.``,
            or is not encodable as UTF-8. (A ``__`` prefix is the caller's business: the
            writer skips such entries as sample metadata.)
    """
    if not ext or "/" in ext or "\0" in ext or ext.startswith(".") or ext.endswith("."):
        raise ValueError(
            f"invalid extension {ext!r}: must be non-empty, without '/' or NUL, and not start "
            f"or end with '.'"
        )
    _check_utf8("extension", ext)


def no_sample_reason(name: bytes) -> str | None:
    """Say why the member ``name`` belongs to no sample, or return None if it has a key.

    The same rule as :func:`split_key` (``split_key(name) is None`` exactly when this returns
    a reason); the reason is what ``Members.skipped`` and ``tarindex ls --members --skipped``
    show (FORMAT.md §4, rule 3).

    Returns:
        ``"in no sample: ..."`` naming the rule: no extension, a hidden name (starts with a
        dot), an empty extension (ends with a dot), or a reserved ``__`` extension.
    """
    if split_key(name) is not None:
        return None
    base = name.rsplit(b"/", 1)[-1]
    dot = base.find(b".")
    if dot == 0:
        why = "hidden name (starts with '.')"
    elif dot < 0:
        why = "no extension"
    elif dot == len(base) - 1:
        why = "empty extension (name ends with '.')"
    else:
        why = "reserved extension (starts with '__')"
    return f"{NO_SAMPLE}: {why}"


def no_sample_members(names: Sequence[bytes]) -> NDArray[np.intp]:
    """Return the positions of the names that belong to no sample (``split_key`` is None).

    The vectorised form of :func:`split_key`'s rule 3 (FORMAT.md §4) for a scan's whole
    member list: a member belongs to no sample when its basename (after the last ``/``; the
    leading ``./`` and ``/`` that rule 1 strips never change it) has no dot, starts with
    one, ends with one, or has ``__`` right after its first dot. A few numpy passes over the
    joined names instead of a Python call per member (``benchmarks/bench_scan.py``).

    Args:
        names: Raw member names, length ``m``.

    Returns:
        Shape ``(k,)``, ascending indices into ``names``.
    """
    m = len(names)
    if m == 0:
        return np.zeros(0, np.intp)
    blob = b"\0".join(names) + b"\0\0\0"  # NUL ends each name; two more pad the '__' look-ahead
    if blob.count(0) != m + 2:  # a NUL inside a name (no scan makes one): the plain rule
        return np.array([i for i, n in enumerate(names) if split_key(n) is None], np.intp)
    a = np.frombuffer(blob, np.uint8)
    ends = np.flatnonzero(a == 0)[:m]
    starts = np.empty(m, np.int64)
    starts[0] = 0
    starts[1:] = ends[:-1] + 1
    # basename start: one past the last '/' before the name's end (or the name's start)
    slashes = np.flatnonzero(a == _SLASH)
    base = starts
    if len(slashes):
        j = np.searchsorted(slashes, ends) - 1
        base = np.maximum(np.where(j >= 0, slashes[np.maximum(j, 0)] + 1, 0), starts)
    # first dot at or after the basename start, if it lies before the name's end
    dots = np.flatnonzero(a == _DOT)
    if len(dots) == 0:
        return np.arange(m, dtype=np.intp)
    k = np.searchsorted(dots, base)
    dot = dots[np.minimum(k, len(dots) - 1)]
    has = (k < len(dots)) & (dot < ends)
    bad = (
        ~has
        | (dot == base)
        | (dot == ends - 1)
        | ((a[dot + 1] == _UNDERSCORE) & (a[dot + 2] == _UNDERSCORE))
    )
    return np.flatnonzero(bad)


# C0 controls, DEL, C1 controls, the backslash itself, Unicode line/paragraph separators
# (str.splitlines breaks there), and surrogate escapes (bytes that are not UTF-8)
_UNSAFE = re.compile(r"[\x00-\x1f\x7f-\x9f\\\u2028\u2029\udc80-\udcff]")
_ESCAPES = {"\\": "\\\\", "\n": "\\n", "\t": "\\t", "\r": "\\r"}


def _escape_one(m: re.Match[str]) -> str:
    c = m.group()
    e = _ESCAPES.get(c)
    if e is not None:
        return e
    o = ord(c)
    if 0xDC80 <= o <= 0xDCFF:  # a raw byte kept by surrogateescape
        return f"\\x{o - 0xDC00:02x}"
    return f"\\x{o:02x}" if o < 0x80 else f"\\u{o:04x}"


def escape_name(name: str) -> str:
    r"""Return ``name`` printable on one line: control characters as backslash escapes.

    What ``tarindex ls`` prints for member names, keys, extensions and skip reasons, so one
    output line is one item. Escaped, as in Python string literals: backslash as ``\\``,
    newline ``\n``, tab ``\t``, carriage return ``\r``; every other C0 control and DEL as
    ``\xNN``; C1 controls and U+2028/U+2029 (line breaks to ``str.splitlines``) as
    ``\uNNNN``; a byte that is not UTF-8 (kept as a surrogate escape, FORMAT.md §2.5) as
    ``\xNN`` of that byte. So ``\xNN`` is always one raw byte of the name, ``\uNNNN`` one
    character (its UTF-8 bytes), and everything else prints as itself.
    """
    return _UNSAFE.sub(_escape_one, name) if _UNSAFE.search(name) else name
