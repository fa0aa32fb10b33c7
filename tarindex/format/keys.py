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

__all__ = ["split_key", "normalize_name", "check_key", "check_ext"]


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
