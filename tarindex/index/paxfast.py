"""The scan's fast path for a pax header that describes one plain regular member.

webdataset's writer and Python's tarfile put a small pax 'x' header (a float ``mtime``, a long
``path``) before every member. :func:`plain_pax_member` reads such a pair from its three blocks
at once; anything unusual is left to the full path of :mod:`tarindex.index.scan`, which parses
with :func:`tarindex.format.tar.parse_pax` and reports what is wrong.
"""

from __future__ import annotations

from ..format.spec import BLOCK, REGTYPE, TAR_SIZE, TAR_TYPEFLAG

__all__ = ["plain_pax_member"]

# the size field's 11 octal digits end where its terminator byte (NUL or space) sits
_TF = TAR_TYPEFLAG
_SIZE_AT = TAR_SIZE.start
_SIZE_TERM = TAR_SIZE.stop - 1
_SIZE_DIGITS = slice(_SIZE_AT, _SIZE_TERM)


def plain_pax_member(b: bytes) -> tuple[int, bytes | None] | None:
    """Read a pax 'x' header whose records fit one block, and the regular member after it.

    Args:
        b: The ``3 * 512`` bytes at the pax header: its header block, one block of records,
            then the member's own header block (shorter at the end of the file).

    Returns:
        ``(member data size in bytes, its pax path or None)``, or None whenever anything is
        unusual: records over one block, a size field that is not plain octal, a member that
        is not typeflag '0', a malformed record or empty keyword, ``GNU.sparse.*``,
        ``linkpath``, a NUL in a keyword, or a pax path that is empty, a directory or holds a
        NUL. Header checksums are not checked here (the scan checks them in batches).
    """
    if len(b) < 3 * BLOCK or b[_SIZE_TERM] not in (0, 0x20):
        return None
    f = b[_SIZE_DIGITS]
    if not f.isdigit():
        return None
    try:
        plen = int(f, 8)
        if not 0 < plen <= BLOCK:  # records in exactly one block: header at + 1024
            return None
        h = 2 * BLOCK  # the member's own header, within b
        if b[h + _TF] != REGTYPE:
            return None  # NUL typeflag (a v7 directory?) or not a file: the slow path
        if b[h + _SIZE_TERM] not in (0, 0x20):
            return None
        f = b[h + _SIZE_AT : h + _SIZE_TERM]
        if not f.isdigit():
            return None
        path: bytes | None = None
        psize: bytes | None = None
        p, stop = BLOCK, BLOCK + plen
        while p < stop:
            sp = b.index(b" ", p, p + 24)
            end = p + int(b[p:sp])
            if end > stop or end <= sp or b[end - 1] != 0x0A:  # record ends with "\n"
                return None
            eq = b.index(b"=", sp + 1, end)
            if eq == sp + 1:
                return None  # empty keyword: the slow path refuses it
            key = b[sp + 1 : eq]
            if key == b"path":
                path = b[eq + 1 : end - 1]
            elif key == b"size":
                psize = b[eq + 1 : end - 1]
                if not psize.isdigit():
                    return None
            elif key.startswith(b"GNU.sparse.") or key == b"linkpath" or 0 in key:
                return None  # sparse, a link, or a NUL in a keyword: the slow path
            p = end
        ms = int(psize) if psize is not None else int(f, 8)
    except ValueError:
        return None
    if path is not None and (not path or path.endswith(b"/") or 0 in path):
        return None  # empty pax path (header name applies), a directory, or a NUL in it
    return ms, path
