"""The index's table guards (FORMAT.md §2.2-2.5): every sample read is checked here, once."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
from numpy.typing import NDArray

from ..errors import (
    FormatError,
)
from .hints import rebuild_hint
from .spec import (
    BLOCK,
)

if TYPE_CHECKING:
    from .index import IndexTables

__all__ = ["check_samples"]

def check_samples(
    t: IndexTables, j0: int, j1: int, path: str = "<index>", block_size: int = BLOCK
) -> None:
    """Check the index tables of samples ``j0 <= j < j1`` against FORMAT.md §2.2-2.5, vectorised.

    The one set of table guards: every read of a sample goes through it (the reader checks
    each chunk of samples once, before its first read), and ``verify`` runs it over the whole
    shard. A sample's members ``sample_ptr[j]:sample_ptr[j+1]`` must be non-empty and in
    range, its key ``key_ptr[j]:key_ptr[j+1]`` non-empty and inside ``key_blob``, every
    member's ``ext_id`` a known extension and at most once per sample, every data range
    ``[offset, offset + size)`` inside ``tar_size``, starting on a 512-byte record boundary
    after its header (POSIX ustar: data follows its 512-byte header block), and not
    overlapping another member's record of the same samples.

    Args:
        t: The tables (numpy views of the index).
        j0: First sample, ``0 <= j0 <= j1``.
        j1: End sample (exclusive), ``<= t.n_samples``.
        path: Path of the index, for messages. Defaults to ``"<index>"``.
        block_size: The tar record size in bytes. Defaults to ``512``.

    Raises:
        FormatError: Naming the index, the byte offset of the bad table entry in it, what is
            wrong and the command that rebuilds the index.
    """
    sections = t.sections

    def bad(section: str, i: int, what: str) -> FormatError:
        start, _ = sections.get(section, (-1, 0))
        item = 4 if section == "ext_id" else 8
        where = f"byte {start + item * i}: " if start >= 0 else ""
        return FormatError(
            f"{path}: {where}{section}[{i}] {what}; the index is corrupt; rebuild it with: "
            f"{rebuild_hint(path)}"
        )

    n_members, key_bytes, n_exts = t.n_members, len(t.key_blob), len(t.exts)
    for name, table, limit, unit, empty in (
        ("sample_ptr", t.sample_ptr, n_members, "members", "a sample with no members"),
        ("key_ptr", t.key_ptr, key_bytes, "key bytes", "an empty key"),
    ):
        p = table[j0 : j1 + 1]  # <u8: compared unsigned, no wrap-around
        over = p > np.uint64(limit)
        if over.any():
            k = int(np.argmax(over))
            raise bad(name, j0 + k, f"= {int(p[k])} is past the table's {limit} {unit}")
        flat = p[1:] <= p[:-1]
        if flat.any():
            k = int(np.argmax(flat)) + 1
            what = f"repeats the previous value ({empty})" if p[k] == p[k - 1] else "decreases"
            raise bad(name, j0 + k, f"= {int(p[k])} {what}")
    lo, hi = int(t.sample_ptr[j0]), int(t.sample_ptr[j1])
    if hi <= lo:
        return
    eid = t.ext_id[lo:hi]
    out = eid >= n_exts
    if out.any():
        k = int(np.argmax(out))
        raise bad("ext_id", lo + k, f"= {int(eid[k])} is not one of the {n_exts} extensions")
    off = t.offset[lo:hi]
    size = t.size[lo:hi]
    tar_size = np.uint64(t.tar_size)
    past = (size > tar_size) | (off > tar_size - np.minimum(size, tar_size))
    if past.any():
        k = int(np.argmax(past))
        raise bad(
            "offset",
            lo + k,
            f"= {int(off[k])} with size {int(size[k])} runs past the tar's {t.tar_size} bytes",
        )
    rec = np.uint64(block_size)
    misplaced = (off % rec != 0) | (off < rec)
    if misplaced.any():
        k = int(np.argmax(misplaced))
        raise bad(
            "offset",
            lo + k,
            f"= {int(off[k])} is not a data offset (data starts on a {block_size}-byte record "
            f"boundary after its header)",
        )
    # one extension at most once per sample, else a dict of the sample would drop a member
    sp = t.sample_ptr[j0 : j1 + 1].astype(np.int64)
    counts: NDArray[np.int64] = sp[1:] - sp[:-1]
    local = np.repeat(np.arange(j1 - j0, dtype=np.int64), counts)
    code = local * n_exts + eid.astype(np.int64)
    if len(code) > 1:
        order = np.argsort(code, kind="stable")
        c = code[order]
        same = c[1:] == c[:-1]
        if same.any():
            m = int(order[int(np.argmax(same)) + 1])
            raise bad(
                "ext_id",
                lo + m,
                f"= {int(eid[m])} repeats an extension of sample {j0 + int(local[m])}",
            )
        # records [header, data, padding) of distinct members never overlap in a tar
        order = np.argsort(off, kind="stable")
        so = off[order]
        ends = (so + size[order] + (rec - 1)) // rec * rec  # no overflow: off + size <= tar_size
        clash = so[1:] < ends[:-1] + rec
        if clash.any():
            k = int(np.argmax(clash)) + 1
            m, prev = int(order[k]), int(order[k - 1])
            raise bad(
                "offset",
                lo + m,
                f"= {int(so[k])} overlaps member {lo + prev} (bytes {int(so[k - 1])}.."
                f"{int(so[k - 1] + size[prev])} and its header)",
            )

