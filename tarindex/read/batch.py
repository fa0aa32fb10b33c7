"""A batch of global samples from many shards: :func:`gather` (a Block) and :func:`gather_packed`.

The batch read of a :class:`~tarindex.read.shardset.ShardSet` (``__getitems__``,
``batched=True``): one pass over the batch with scalar reads of each shard's hot tables
(:class:`~tarindex.read.hot.HotTables`), compiled where it can be (``_kernel.gather``,
``_kernel.batch``), then the per-member work vectorised (:func:`_assemble`). Every sample's
chunk of the tables passes the chunk guard first and every mapping the cut check
(:mod:`tarindex.read.checks`).
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import Any

import numpy as np
from numpy.typing import NDArray

from ..format.spec import EXT_ID_DTYPE, OFFSET_DTYPE
from ..storage.bytesource import Buffer
from . import kernel
from .block import Block, crc_mismatches, data_error, joined
from .checks import CHUNK_SHIFT
from .fields import Fields, field_set
from .hot import HandBack, HotTables, Mapped
from .pool import ReaderPool
from .runs import read_runs
from .shard import ShardReader
from .spanner import check_indices, locate_many

__all__ = ["gather", "gather_packed"]


def _mapping(r: ShardReader | None) -> Mapped | None:
    return None if r is None else r.hot.mm


def gather(
    pool: ReaderPool,
    starts: NDArray[np.int64],
    per: int,
    indices: Sequence[int] | NDArray[np.integer[Any]],
    fields: Fields = None,
) -> Block:
    """Read global samples ``indices`` (a batch, any order, repeats allowed) as one block.

    One pass over the batch with scalar reads of each shard's tables (the per-sample cost
    of ``ds[i]``, without its dict): every sample's chunk of the tables passes the guards
    first, as in :meth:`ShardReader.read_block`. With mmap the block's buffers are the
    mappings; with ``pread`` each shard's selected members are read in runs. When the
    batch spans more shards than may stay open (:attr:`ReaderPool.open_bound`) the members' bytes
    are copied out at once, so descriptors stay within the bound.

    Args:
        pool: The readers of the shards.
        starts: ``int64 (n_shards + 1,)``: first global index of each shard, then the total.
        per: Samples per shard when all but the last hold that many, else 0.
        indices: Global sample indices; negative ones count from the end.
        fields: Extensions to read (others are not read). Defaults to ``None`` (all).

    Returns:
        A :class:`Block` of ``len(indices)`` samples in the order of ``indices``.

    Raises:
        SampleIndexError: If an index is out of range.
        TypeError: If an index is not an integer.
        FormatError, StaleIndexError: As :meth:`ShardReader.read_block` and :meth:`reader`.
    """
    idx, sid, local, fields = *locate_many(starts, per, indices), field_set(fields)
    uniq, col = np.unique(sid, return_inverse=True)  # slot: rank among the batch's shards
    slots: list[int] = uniq.tolist()
    n_slots = len(slots)
    copy = n_slots > pool.open_bound  # more shards than may stay open: copy out
    slot_exts: list[tuple[str, ...]] = [()] * n_slots
    crcs: list[Any] = [None] * n_slots  # with verify_data: the recorded member crc32s
    tables: dict[int, tuple[ShardReader, HotTables]] = {}
    seen = bytearray(n_slots)
    verify = pool.options.verify_data  # or a shard whose reader always verifies (compressed)
    if not copy:
        for slot, s in enumerate(slots):
            r = pool.reader(s)
            r.check_tar()  # cut or changed since opened: its error, not its bytes
            h = r.hot
            tables[s] = (r, h)
            slot_exts[slot], crcs[slot] = h.exts, r.index.member_crc
            verify = verify or r.verify_data
    col = col.astype(np.int64, copy=False)
    got = None if copy else _gather_compiled(pool, slots, tables, col, local)
    if got is not None:
        keys_c, cnts_c, off_c, size_c, ext_c = got
        return _assemble(
            pool,
            tables,
            slots,
            slot_exts,
            crcs,
            keys_c,
            local,
            idx,
            cnts_c,
            off_c,
            size_c,
            ext_c,
            col,
            fields,
            copy,
            verify,
        )
    # One scalar pass: per sample its key and member count; its run of member offsets,
    # sizes and extension ids is appended as raw little-endian table bytes (one memcpy
    # each whatever the member count). Everything per member is vectorised afterwards.
    keys: list[str] = []
    cnts: list[int] = []
    off_b, size_b, ext_b = bytearray(), bytearray(), bytearray()
    for s, j, slot in zip(sid.tolist(), local.tolist(), col.tolist(), strict=True):
        if copy:  # readers come and go: the open one (its tables stay valid while open)
            r = pool.reader(s)
            h = r.hot
            if not seen[slot]:
                seen[slot] = 1
                slot_exts[slot], crcs[slot] = h.exts, r.index.member_crc
                verify = verify or r.verify_data
        else:
            r, h = tables[s]
        checked, kp, sp, imm, kb, _, _, _, _, _, _, ob, sb, eb, _, _ = h
        if not checked[j >> CHUNK_SHIFT]:
            r.check_chunk(j >> CHUNK_SHIFT)
        keys.append(imm[kb + kp[j] : kb + kp[j + 1]].decode("utf-8", "surrogateescape"))
        lo, hi = sp[j], sp[j + 1]
        off_b += ob[lo << 3 : hi << 3]
        size_b += sb[lo << 3 : hi << 3]
        ext_b += eb[lo << 2 : hi << 2]
        cnts.append(hi - lo)
    return _assemble(
        pool,
        tables,
        slots,
        slot_exts,
        crcs,
        keys,
        local,
        idx,
        cnts,
        off_b,
        size_b,
        ext_b,
        col,
        fields,
        copy,
        verify,
    )


def gather_packed(
    pool: ReaderPool,
    starts: NDArray[np.int64],
    per: int,
    indices: Sequence[int] | NDArray[np.integer[Any]],
    fields: Fields,
    int_fields: Collection[str],
    alloc: Any,
) -> tuple[Any, ...] | None:
    """:func:`gather` and the batch packing in one compiled pass, or ``None``.

    The layout is ``tarindex.stream.pack.field_major``'s: byte fields (in order of first
    appearance in batch order) one after the other, each sample's member in batch order;
    ``int_fields`` members parsed as decimal integers instead. ``None`` means: use
    :func:`gather` and pack its block (no compiled loops, ``pread``, ``verify_data``,
    more shards than may stay open, or a sample they hand back: the Python path then
    raises the error that names it).

    Args:
        pool: As :func:`gather`.
        starts: As :func:`gather`.
        per: As :func:`gather`.
        indices: Global sample indices; negative ones count from the end. The compiled
            loop takes ``int`` indices in range and hands anything else back; the index rule
            (:func:`~tarindex.read.spanner.check_indices`) then runs once, before any shard is
            opened for the batch, so a batch it takes pays nothing for it.
        fields: Extensions to read. ``None``: all.
        int_fields: Extensions parsed as decimal integers.
        alloc: ``alloc(nbytes) -> (keep, writable buffer)``: the batch buffer.

    Returns:
        ``(keep, keys, byte_fields, int_fields, offsets, present, ints, index, shards)``:
        ``offsets`` ``int64 (nf, n + 1)``, ``present`` ``bool (nf, n)``, ``ints`` ``int64
        (ni, n)`` (``-1`` where missing), ``index`` ``int64 (n,)``, ``shards`` paths.

    Raises:
        SampleIndexError, TypeError: As :func:`gather`.
        FormatError, StaleIndexError, TruncatedError: As :func:`gather`.
    """
    if isinstance(indices, np.ndarray):  # not 1-d: one item the loop hands back to the rule
        seq: list[int] = indices.tolist() if indices.ndim == 1 else [indices]  # type: ignore[list-item]
    else:  # a generator is read once: the rule checks the list made of it
        seq = indices = indices if type(indices) is list else list(indices)
    given = indices  # ints, or what the loop hands back to the rule below
    fkey = field_set(fields)  # "bin" is one field
    ikey = frozenset(int_fields)
    checked = False
    for _ in range(len(seq) + 3):  # each hand-back opens a reader or checks a chunk
        got = kernel.kernel.batch(seq, starts, per, pool.readers, pool.paths, fkey, ikey, alloc)
        if not isinstance(got, HandBack):
            break
        if not checked:  # the loop took only ints in range: the index rule (its errors) now
            seq, checked = check_indices(given, int(starts[-1])).tolist(), True
            if got.why == "python":  # maybe numpy integers, as ints now: once more
                continue
        if not pool.settle(got):  # StaleIndexError, FormatError: as gather
            return None  # the Python path raises the error or reads the batch
    else:
        return None
    keep, keys, bnames, inames, offs, pres, ints, index, shards = got
    n, nf, ni = len(keys), len(bnames), len(inames)
    return (
        keep,
        keys,
        bnames,
        inames,
        np.frombuffer(offs, np.int64).reshape(nf, n + 1),
        np.frombuffer(pres, np.bool_).reshape(nf, n),
        np.frombuffer(ints, np.int64).reshape(ni, n),
        np.frombuffer(index, np.int64),
        shards,
    )


def _gather_compiled(
    pool: ReaderPool,
    slots: list[int],
    tables: dict[int, tuple[ShardReader, HotTables]],
    col: NDArray[np.int64],
    local: NDArray[np.int64],
) -> tuple[list[str], bytes, bytes, bytes, bytes] | None:
    """:func:`gather`'s scalar pass in the compiled loop, or ``None`` (the Python pass).

    Returns keys, member counts and the members' raw table bytes. A sample handed back
    in an unchecked chunk gets the chunk checked (``FormatError`` if corrupt) and the pass
    runs again; any other hand-back: the Python pass decides.
    """
    tabs = tuple(t for t in (tables[s][1].tables for s in slots) if t is not None)
    if len(tabs) != len(slots):  # a reader that is not mapped: the Python pass
        return None
    shards = tuple(slots)
    while True:
        got = kernel.kernel.gather(tabs, shards, col, local)
        if not isinstance(got, HandBack):
            return got
        # the readers the batch reads (not the pool's: another thread may have reopened one)
        if not pool.settle(got, {s: r for s, (r, _) in tables.items()}):
            return None


def _assemble(
    pool: ReaderPool,
    tables: dict[int, tuple[ShardReader, HotTables]],
    slots: list[int],
    slot_exts: list[tuple[str, ...]],
    crcs: list[Any],
    keys: list[str],
    local: NDArray[np.int64],
    idx: NDArray[np.int64],
    cnts: list[int] | bytes,
    off_b: bytes | bytearray,
    size_b: bytes | bytearray,
    ext_b: bytes | bytearray,
    shard_col: NDArray[np.int64],
    fields: Fields,
    copy: bool,
    verify: bool,
) -> Block:
    """The vectorised half of :func:`gather`: member arrays, projection, reads, the block.

    ``verify``: check members against their recorded crc32s (``verify_data``, or a
    compressed shard, whose reader always does).

    ``tables``: the readers the scalar pass read (unless ``copy``), used again here whatever
    another thread has since done to the pool (evicted, closed, reopened a shard).
    """
    cnt = np.asarray(cnts, np.int64) if isinstance(cnts, list) else np.frombuffer(cnts, np.int64)
    tar_off = np.frombuffer(off_b, OFFSET_DTYPE).astype(np.int64)
    size = np.frombuffer(size_b, OFFSET_DTYPE).astype(np.int64)
    eid = np.frombuffer(ext_b, EXT_ID_DTYPE).astype(np.int64)
    src = np.repeat(shard_col, cnt)
    mp = np.zeros(len(keys) + 1, np.int64)
    np.cumsum(cnt, out=mp[1:])
    ext_code: dict[str, int] = {}  # global extension codes; equal tables share a range
    ebase_of: dict[tuple[str, ...], int] = {}
    codes: list[int] = []
    ebase: list[int] = []
    for exts in slot_exts:
        eb = ebase_of.get(exts)
        if eb is None:
            eb = ebase_of[exts] = len(codes)
            codes.extend([ext_code.setdefault(e, len(ext_code)) for e in exts])
        ebase.append(eb)
    if len(ebase_of) > 1:
        eid = np.asarray(codes, np.int64)[eid + np.asarray(ebase, np.int64)[src]]
    names = list(ext_code)
    mid = None  # with verify_data: each member's number in its index
    if verify:  # each member's number in its index: sample_ptr[j] + rank
        sps = [(pool.reader(s) if copy else tables[s][0]).index.sample_ptr for s in slots]
        first = np.empty(len(keys), np.int64)
        for c in range(len(slots)):
            at = shard_col == c
            sp = sps[c]
            first[at] = sp[local[at]]
        mid = np.arange(len(eid), dtype=np.int64) + np.repeat(first - mp[:-1], cnt)
    keep = None  # members kept by fields (pread reads no byte of the others)
    if fields is not None:
        keep = np.asarray([e in fields for e in names], np.bool_)[eid]
        if keep.all():
            keep = None
    maps = [None if copy else _mapping(tables[s][0]) for s in slots]
    offset = tar_off if all(m is not None for m in maps) else tar_off.copy()
    datas: list[Any] = []  # Buffers, or Mapped (read with the fault guard)
    for slot, s in enumerate(slots):
        mm = maps[slot]
        if mm is not None:
            datas.append(mm)  # mapped: the buffer is the mapping (its Mapped)
            continue
        mine = src == slot
        want = np.flatnonzero(mine if keep is None else mine & keep)
        left = np.flatnonzero(mine & ~keep) if keep is not None else want[:0]
        r = pool.reader(s) if copy else tables[s][0]
        datas.append(_fetch(r, want, tar_off, size, left, offset) if len(want) else b"")
    if keep is not None:
        kc = np.zeros(len(keep) + 1, np.int64)
        np.cumsum(keep, out=kc[1:])
        mp = kc[mp]
        tar_off, size, eid, src, offset = (
            tar_off[keep],
            size[keep],
            eid[keep],
            src[keep],
            offset[keep],
        )
        if mid is not None:
            mid = mid[keep]
    paths = [pool.paths[s] for s in slots]
    blk = Block(
        paths, shard_col, local, idx, keys, mp, eid, size, tar_off, offset, src, datas, names
    )
    if mid is not None:
        for b, k, got, recorded in crc_mismatches(blk, mid, crcs):
            slot = int(src[k])
            r = tables[slots[slot]][0] if slots[slot] in tables else pool.reader(slots[slot])
            raise data_error(
                paths[slot],
                pool.index_paths[slots[slot]],  # beside the tar, or in index_dir
                keys[b],
                names[int(eid[k])],
                int(tar_off[k]),
                got,
                recorded,
                r.copy_path,  # a compressed shard's decompressed copy, else None
            )
    return blk


def _fetch(
    r: ShardReader,
    want: NDArray[np.int64],
    tar_off: NDArray[np.int64],
    size: NDArray[np.int64],
    left: NDArray[np.int64],
    offset: NDArray[np.int64],
) -> Buffer:
    """Read members ``want`` (positions in ``tar_off``/``size``) of reader ``r`` into a buffer.

    Sets ``offset[want]`` to where they are in it. With ``pread`` the reads are runs that
    read no byte of the members ``left`` (left out by ``fields``).
    """
    toff, sz = tar_off[want], size[want]
    src = r.source
    if src.zero_copy:  # mapped, but more shards than may stay open: copy the members out
        mm = r.hot.mm
        assert mm is not None
        r.check_tar()  # cut or changed since opened: its error, not its bytes
        out, offset[want] = joined(
            [mm[a : a + n] for a, n in zip(toff.tolist(), sz.tolist(), strict=True)]
        )
        return out
    buf: Buffer
    if len(left):
        all_off = np.concatenate([toff, tar_off[left]])
        all_end = np.concatenate([toff + sz, tar_off[left] + size[left]])
        keep = np.zeros(len(all_off), np.bool_)
        keep[: len(toff)] = True
        buf, at = read_runs(src, all_off, all_end, keep)
    else:
        buf, at = read_runs(src, toff, toff + sz, None)
    offset[want] = at
    return buf
