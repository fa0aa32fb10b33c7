"""Confirm that a shard's sidecar index still describes its tar, header by header.

``verify`` is the full check behind ``tarindex verify``: stronger than the O(1) checks every
open does (index header, footer magic, tar fingerprint), it reads the whole index (crc32
footer, table consistency), re-reads the ustar header block right before every indexed
member's data, and rebuilds the tables from a fresh header walk to compare them byte for byte.
A gzip-compressed shard (docs/FORMAT.md §10) is checked the same way on the tar inside, inflated
once into a temp file; ``data`` reads its members through the seek points.
"""

from __future__ import annotations

import mmap
import os
import warnings
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from ..errors import ChecksumError, StaleIndexError, TarHeaderError
from ..format.index import IndexTables
from ..format.keys import normalize_name, split_key
from ..format.spec import (
    BLOCK,
    GNUTYPE_LONGNAME,
    REGULAR_TYPES,
    SOLARIS_XHDTYPE,
    TAR_SIZE,
    TAR_TYPEFLAG,
    XHDTYPE,
    ZSTD_DICT_META,
)
from ..format.tar import checksum_ok, header_checksums, header_name, parse_number
from ..index.build import find_zstd_dict, index_tables_for
from ..index.gzbuild import plain_tar
from ..index.scan import scan_members
from .block import crc_mismatches
from .shard import ShardReader

__all__ = ["VerifyReport", "verify"]

_BATCH = 1 << 14
_REGULAR = np.array(sorted(REGULAR_TYPES), np.uint8)
_LONG_NAME_TYPES = frozenset((XHDTYPE, SOLARIS_XHDTYPE, GNUTYPE_LONGNAME))  # 'x', 'X', 'L'


@dataclass
class VerifyReport:
    """What :func:`verify` checked on one shard (it raises instead of returning a failure)."""

    tar_path: str
    """The tar."""
    index_path: str
    """Its sidecar index."""
    n_samples: int
    """Samples in the index."""
    n_members: int
    """Members in the index; each one's header block was re-read."""
    long_names: int
    """Members whose header name field is not their full name (GNU LongName, pax ``path``);
    their names were confirmed through the fresh header walk."""
    data_checked: bool = False
    """Whether every member's bytes were checked against the recorded crc32s."""
    require_end: bool = True
    """False if the shard was indexed with ``require_end=False`` (``--no-require-end``): a
    copy of it cut at a member boundary would verify too (docs/TAR_DIALECTS.md)."""
    ok: bool = True
    """Always True: a failed check raises."""

    def __str__(self) -> str:
        data = ", data crc32" if self.data_checked else ""
        end = (
            ""
            if self.require_end
            else "; indexed with --no-require-end, so a copy cut at a member boundary would "
            "match too"
        )
        return (
            f"{self.n_samples} samples, {self.n_members} members{data}: index crc32, fingerprint, "
            f"{self.n_members} member headers and a fresh scan all match{end}"
        )


def verify(
    tar_path: str | os.PathLike[str], index_path: str | None = None, *, data: bool = False
) -> VerifyReport:
    """Check that the sidecar index of ``tar_path`` describes the tar exactly.

    Checks, in order: the index's crc32 footer and table consistency
    (``decode_index(..., full_check=True)``); the tar's fingerprint (size, crc32 of the first
    and last 4096 bytes, FORMAT.md §3); for every indexed member, the 512-byte block right
    before its data offset is a regular-file tar header with a valid checksum, whose size
    field (or pax size) equals the indexed size and whose name gives the indexed key and
    extension; finally that a fresh header walk of the tar rebuilds the same sample, member
    and key tables byte for byte. Cost: one pass over the index and one header walk of the tar.
    A gzip-compressed tar (FORMAT.md §10) is first inflated once into a temp file in
    ``$TMPDIR`` (every gzip member's crc32 checked), whose headers are re-read and walked:
    offsets are those of the decompressed tar, as in the index.

    With ``data``, also every member's bytes against the crc32 the index records
    (FORMAT.md §2.8.2): one read of every member.

    Args:
        tar_path: The tar.
        index_path: Its index. Defaults to ``<tar_path>.tidx``.
        data: Also check the data checksums. Defaults to ``False``.

    Returns:
        A :class:`VerifyReport` (``ok`` is True; ``str()`` gives a one-line summary).

    Raises:
        IndexMissingError: There is no index.
        FormatError: The index is corrupt (checksum, bad tables), or the tar is (scan errors:
            truncated, bad header checksum, ...). :class:`tarindex.errors.TarHeaderError` when the
            header before an indexed member has a valid checksum but a size field that is not
            a number. ``TruncatedError``/``ChecksumError`` for invalid gzip data of a
            gzip-compressed tar.
        StaleIndexError: The index does not describe this tar: fingerprint mismatch, an
            indexed offset that is not right after a matching header, or tables that differ
            from a fresh scan. The message names the member, the byte offset and the fix.
        ChecksumError: With ``data``: members whose bytes differ from their recorded crc32
            (the message names shard, key, extension and byte offset of each, the first 20
            and a count), or the index records no checksums.
    """
    tar = os.fspath(tar_path)
    with ShardReader(tar, index_path, full_check=True) as r:
        stored = r.index
        ipath = r.index_path
        # a gzip shard's headers and walk are those of the tar inside (FORMAT.md §10)
        with plain_tar(tar) as plain:
            long_names = _check_headers(plain, ipath, stored)
            # the walk also takes the fingerprint; a tar indexed with --no-require-end is
            # rescanned the same way (its index's metadata says so); what the walk warns of
            # (no end marker, members skipped) was reported by `index`, the report says the first
            require_end = bool(stored.meta.get("require_end", True))
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                members = scan_members(plain, require_end=require_end)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # a bad dictionary member was reported by `index`
                zd = find_zstd_dict(members)  # FORMAT.md §7: the same dictionary entry, or none
            members.path = tar  # messages name the shard, not the temp copy
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # interleaving/duplicates were reported by `index`
            fresh = index_tables_for(members)
        if fresh.tables_bytes() != stored.tables_bytes():
            raise StaleIndexError(
                f"{tar}: index {ipath} does not match a fresh scan of the tar: "
                f"{_first_difference(stored, fresh)}; rebuild it with: tarindex index --force {tar}"
            )
        want = None if zd is None else zd.meta()
        if stored.meta.get(ZSTD_DICT_META) != want:
            raise StaleIndexError(
                f"{tar}: index {ipath} records the zstd dictionary "
                f"{stored.meta.get(ZSTD_DICT_META)!r}, a fresh scan finds {want!r} (FORMAT.md "
                f"§7); rebuild it with: tarindex index --force {tar}"
            )
        if data:
            _check_data(r)
            r.zstd_dict()  # its bytes against the recorded crc32 (ChecksumError)
        return VerifyReport(
            tar,
            ipath,
            stored.n_samples,
            stored.n_members,
            long_names,
            data_checked=data,
            require_end=require_end,
        )


_SHOWN = 20  # mismatches named in a ChecksumError message; the rest are counted


def _check_data(r: ShardReader) -> None:
    """Every member's bytes against the crc32 the index records (FORMAT.md §2.8.2)."""
    crc = r.index.member_crc
    if crc is None:
        raise ChecksumError(
            f"{r.index_path}: the index records no data checksums; add them with: tarindex index "
            f"--checksums {r.tar_path} (it rebuilds an index that has none)"
        )
    bad: list[str] = []
    n_bad = 0
    step = 4096
    for j0 in range(0, r.n_samples, step):
        blk = r.read_block(j0, min(j0 + step, r.n_samples))
        lo = int(r.index.sample_ptr[j0])
        for b, k, got, want in crc_mismatches(blk, range(lo, lo + len(blk.size)), [crc]):
            n_bad += 1
            if len(bad) < _SHOWN:
                bad.append(
                    f"byte {int(blk.tar_offset[k])}: {blk.keys[b]}.{r.exts[int(blk.ext_id[k])]} "
                    f"crc32 0x{got:08x} != 0x{want:08x}"
                )
    if n_bad:
        more = f" (and {n_bad - len(bad)} more)" if n_bad > len(bad) else ""
        raise ChecksumError(
            f"{r.tar_path}: {n_bad} member(s) differ from the data checksums in {r.index_path}: "
            f"{'; '.join(bad)}{more}; the tar changed since it was indexed: copy it again, or "
            f"re-index it (tarindex index --force --checksums {r.tar_path})"
        )


def _check_headers(tar: str, ipath: str, t: IndexTables) -> int:
    """Re-read the header block before every indexed member; return how many use long names."""
    m = t.n_members
    if m == 0:
        return 0
    fix = f"rebuild it with: tarindex index --force {tar}"
    off = np.asarray(t.offset, np.int64)
    size = np.asarray(t.size, np.int64)
    ext_id = np.asarray(t.ext_id, np.int64)
    sp = np.asarray(t.sample_ptr, np.int64)
    counts: NDArray[np.int64] = sp[1:] - sp[:-1]
    sample_of = np.repeat(np.arange(t.n_samples), counts)
    bad = np.flatnonzero((off < BLOCK) | (off % BLOCK != 0))
    if len(bad):
        i = int(bad[0])
        raise StaleIndexError(
            f"{tar}: byte {int(off[i])}: indexed member {i} does not start on a 512-byte block "
            f"after a header, so the index {ipath} does not describe this tar; {fix}"
        )
    kp = np.asarray(t.key_ptr, np.int64)
    blob = bytes(t.key_blob)
    long_names = 0
    with open(tar, "rb") as f:
        mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        try:
            blocks = np.frombuffer(mm, np.uint8, count=len(mm) // BLOCK * BLOCK).reshape(-1, BLOCK)
            for s in range(0, m, _BATCH):
                hdr = off[s : s + _BATCH] - BLOCK
                rows = blocks[hdr >> 9]
                computed, chk = header_checksums(rows)
                for i in np.flatnonzero(computed != chk).tolist():
                    p = int(hdr[i])
                    if not checksum_ok(mm[p : p + BLOCK]):
                        raise StaleIndexError(
                            f"{tar}: byte {p}: the block before indexed member {s + i} (data at byte "
                            f"{p + BLOCK}) is not a valid tar header (checksum mismatch); the tar "
                            f"was rewritten in place since {ipath} was made; {fix}"
                        )
                tf = rows[:, TAR_TYPEFLAG]
                for i in np.flatnonzero(~np.isin(tf, _REGULAR)).tolist():
                    p = int(hdr[i])
                    raise StaleIndexError(
                        f"{tar}: byte {p}: indexed member {s + i} has a header of type "
                        f"{chr(int(tf[i]))!r}, not a regular file; {fix}"
                    )
                for i in range(len(hdr)):
                    p, j = int(hdr[i]), s + i
                    block = mm[p : p + BLOCK]
                    try:
                        hsize = parse_number(block[TAR_SIZE])
                    except ValueError:
                        raise TarHeaderError(
                            f"{tar}: byte {p + TAR_SIZE.start}: size field of the header of indexed "
                            f"member {j} is {block[TAR_SIZE]!r}, expected an octal or base-256 number; "
                            f"the tar header is corrupt (it changed since {ipath} was made): "
                            f"re-copy or re-create the tar, then: tarindex index --force {tar}"
                        ) from None
                    name = header_name(block)
                    smp = int(sample_of[j])
                    key = blob[kp[smp] : kp[smp + 1]]
                    ext = t.exts[int(ext_id[j])]
                    if split_key(name) == (key, ext) and hsize == int(size[j]):
                        continue
                    # a pax or GNU long-name/size record precedes this header: the fresh scan
                    # (which resolves them) decides; count it
                    full = key + b"." + ext
                    cut = len(name) >= 99 and full.startswith(normalize_name(name))
                    if cut or _after_records(mm, p):  # a name field cut at 100 bytes, or
                        long_names += 1  # a record of any length right before: the scan decides
                        continue
                    raise StaleIndexError(
                        f"{tar}: byte {p}: header of indexed member {j} names {name[:80]!r} with "
                        f"size {hsize}, the index {ipath} says key {key[:80]!r}, extension "
                        f"{ext[:40]!r}, size {int(size[j])}; {fix}"
                    )
            del blocks, rows
        finally:
            try:
                mm.close()
            except BufferError:
                pass
    return long_names


def _after_records(mm: mmap.mmap, p: int) -> bool:
    """True if a pax ('x'/'X') or GNU long-name ('L') record ends right before byte ``p``."""
    q = p - BLOCK
    while q >= 0:  # walk back over the record's data blocks to its header (bounded by 1 MiB)
        b = mm[q : q + BLOCK]
        if b[TAR_TYPEFLAG] in _LONG_NAME_TYPES and checksum_ok(b):
            return True
        q -= BLOCK
        if p - q > (1 << 20):
            break
    return False


def _first_difference(stored: IndexTables, fresh: IndexTables) -> str:
    """Name the first table entry where the stored and the rebuilt tables differ."""
    if stored.n_samples != fresh.n_samples or stored.n_members != fresh.n_members:
        return (
            f"the index has {stored.n_samples} samples / {stored.n_members} members, the tar "
            f"{fresh.n_samples} / {fresh.n_members}"
        )
    if list(stored.exts) != list(fresh.exts):
        return (
            f"extensions {[e[:40] for e in stored.exts[:20]]} in the index, "
            f"{[e[:40] for e in fresh.exts[:20]]} in the tar"
        )
    for name in ("sample_ptr", "offset", "size", "ext_id", "key_ptr"):
        a, b = np.asarray(getattr(stored, name)), np.asarray(getattr(fresh, name))
        diff = np.flatnonzero(a != b)
        if len(diff):
            i = int(diff[0])
            return f"{name}[{i}] is {int(a[i])} in the index, {int(b[i])} in the tar"
    ka, kb = bytes(stored.key_blob), bytes(fresh.key_blob)
    if ka != kb:
        i = (
            next(i for i, (x, y) in enumerate(zip(ka, kb, strict=False)) if x != y)
            if len(ka) == len(kb)
            else 0
        )
        return f"the sample keys differ from key byte {i}"
    return "the tables differ"
