"""Key lookup across shards: global index of a key, of many keys (FORMAT.md §4, §2.8.3).

Keys are unique within a shard, not across shards. Each shard has a key table (hashes
ascending, sample numbers; :meth:`~tarindex.read.shard.ShardReader.key_table`); for several
shards they are joined once per process into one table of global indices
(:func:`joined_table`). A lookup is a binary search in a table, then each candidate's key
bytes are compared (:meth:`~tarindex.read.shard.ShardReader.key_is`), so a hit is never a
hash collision. :func:`key_bytes` hands out a range's keys as stored (an Arrow column's bytes).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
from numpy.typing import NDArray

from ..format.keyhash import LOOKUP_SEED, key_hashes
from ..format.keys import lookup_key, normalize_name
from ..format.keytable import KeyTable
from .shard import ShardReader
from .spanner import locate, shards_of

__all__ = ["joined_table", "find_all", "find_many", "key_bytes"]

Open = Callable[[int], ShardReader]
"""``reader(s)``: the open reader of shard ``s``."""


def joined_table(reader: Open, starts: list[int]) -> KeyTable:
    """Every shard's key table in one: hashes ascending, global indices.

    Each shard is opened once; 12 bytes per sample. Equal hashes stay in global order.
    """
    hs, gs = [], []
    for s in range(len(starts) - 1):
        kt = reader(s).key_table()
        hs.append(np.array(kt.hash, np.uint32))  # copies: the reader may close
        gs.append(np.asarray(kt.order, np.int64) + starts[s])
    h = np.concatenate(hs) if hs else np.empty(0, np.uint32)
    g = np.concatenate(gs) if gs else np.empty(0, np.int64)
    if len(hs) > 1:
        order = np.argsort(h, kind="stable")
        h, g = h[order], g[order]
    return KeyTable(h, g)


def find_all(reader: Open, table: KeyTable, starts: list[int], per: int, kb: bytes) -> list[int]:
    """The global index of every sample whose key bytes are ``kb`` (normalised), ascending.

    Raises:
        FormatError, StaleIndexError: As ``reader`` and the chunk guard of a candidate.
    """
    out = []
    for i in table.candidates(kb):
        s, j = locate(starts, per, i)
        if reader(s).key_is(j, kb):
            out.append(i)
    return sorted(out)


def find_many(
    reader: Open, table: KeyTable, starts: NDArray[np.int64], per: int, keys: Sequence[str]
) -> tuple[NDArray[np.int64], NDArray[np.bool_]]:
    """The global index of each key's sample (``-1``: none), and which keys several hold.

    The keys are hashed together (vectorised, FORMAT.md §8), looked up with one
    ``searchsorted`` in ``table``, and the candidates' key bytes compared shard by shard
    (their chunks of the tables pass the guards first).

    Returns:
        ``int64 (len(keys),)`` and ``bool (len(keys),)`` (held by more than one sample).

    Raises:
        TypeError: If a key is not a ``str`` (:func:`tarindex.format.keys.lookup_key`).
    """
    try:  # lookup_key's rule, vectorised: normalize_name only where it changes something
        raw = [k.encode("utf-8", "surrogateescape") for k in keys]
    except AttributeError:
        for key in keys:
            lookup_key(key)  # raises the one TypeError
        raise
    raw = [normalize_name(b) if b.startswith((b"./", b"/")) else b for b in raw]
    out = np.full(len(raw), -1, np.int64)
    if not raw:
        return out, np.zeros(0, np.bool_)
    ptr = np.zeros(len(raw) + 1, np.int64)
    np.cumsum([len(k) for k in raw], out=ptr[1:])
    hv = (key_hashes(b"".join(raw), ptr, LOOKUP_SEED) >> np.uint64(32)).astype(np.uint32)
    by = np.argsort(hv, kind="stable")  # sorted needles: searchsorted walks forward
    lo = np.empty(len(raw), np.int64)
    hi = np.empty(len(raw), np.int64)
    lo[by] = np.searchsorted(table.hash, hv[by], side="left")
    hi[by] = np.searchsorted(table.hash, hv[by], side="right")
    q = np.repeat(np.arange(len(raw), dtype=np.int64), hi - lo)  # (query, candidate) pairs
    at = np.arange(len(q), dtype=np.int64) - np.repeat(np.cumsum(hi - lo) - (hi - lo), hi - lo)
    cand = np.asarray(table.order, np.int64)[np.repeat(lo, hi - lo) + at]
    sid = shards_of(starts, per, cand) if len(cand) else cand
    found: list[int] = []  # (query, global index) of every confirmed candidate, flat
    ql, cl = q.tolist(), cand.tolist()
    for s in np.unique(sid).tolist():
        sel = np.flatnonzero(sid == s)
        js = cand[sel] - starts[s]
        r = reader(s)
        r.check_samples(js)
        for k, j in zip(sel.tolist(), js.tolist(), strict=True):
            if r.key_is(j, raw[ql[k]]):
                found += (ql[k], cl[k])
    f = np.asarray(found, np.int64).reshape(-1, 2)
    out[f[:, 0]] = f[:, 1]
    dup: NDArray[np.bool_] = np.bincount(f[:, 0], minlength=len(raw)) > 1
    return out, dup


def key_bytes(reader: ShardReader, j0: int, j1: int) -> tuple[bytes, NDArray[np.int64]]:
    """The keys of samples ``j0 <= j < j1`` of a shard as stored: their bytes joined, and offsets.

    The raw member-name bytes of FORMAT.md §2.5 (not decoded: a non-UTF-8 key is its bytes),
    one slice of the index's key blob, the same slice ``read_block`` decodes its keys from;
    key ``j`` is ``blob[ptr[j - j0] : ptr[j - j0 + 1]]``. What an Arrow ``string`` column is
    made of without a Python object per key.

    Returns:
        ``(blob, ptr)``: ``bytes`` and ``int64 (j1 - j0 + 1,)`` offsets from 0.

    Raises:
        SampleIndexError: If the range is outside the shard.
        FormatError: If the index tables of those samples are corrupt.
    """
    reader.check_range(j0, j1)
    t = reader.index
    kp = t.key_ptr[j0 : j1 + 1].astype(np.int64)
    k0 = int(kp[0])
    return bytes(t.key_blob[k0 : int(kp[-1])]), kp - k0
