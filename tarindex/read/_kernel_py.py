"""The read kernel's per-sample loops in pure Python: ``_kernel.c``'s twin (see ``_kernel.pyi``).

Every function and class of the extension ``tarindex.read._kernel`` with the same signature,
the same results and the same hand-backs: a :class:`~tarindex.read.hot.HandBack` where a loop
does not decide a case itself (the caller's :meth:`~tarindex.read.pool.ReaderPool.settle`
then opens the shard or checks the chunk, or the caller takes the reader's own path, which
raises the error that names the index). :mod:`tarindex.read.kernel` chooses one of the two once, at
import; a machine without a C compiler, a big-endian host or ``TARINDEX_PURE_PYTHON=1`` runs
these. Like the C, they read tables that ``checks.py`` validated chunk by chunk and bound every
read they make instead of trusting them. See docs/READING.md, "Compiled loops".
"""

from __future__ import annotations

import itertools
import mmap
import os
import re
import sys
import weakref
from array import array
from collections.abc import Callable, Collection, Sequence
from typing import Any, Literal

from .checks import CHUNK_SHIFT
from .hot import HandBack, Packed

__all__ = ["Mapped", "Tables", "batch", "gather", "pack", "sample", "take"]

_HOT_FIELDS, _HOT_TABLES = 16, 15  # HotTables' positions (as the C)
_WANT_MAX = 64  # sample(..., fields): flags of at most this many extensions, else hand back
_SSIZE_MAX = sys.maxsize
_calls = itertools.count(1)  # numbers the calls that check each mapping's size once
_DECIMAL = re.compile(rb"[ \t-\r]*([+-]?[0-9]{1,18})[ \t-\r]*")
_Row = tuple[int, int, int, int]


def _python(at: int) -> HandBack:
    """The hand-back of a case the Python path decides, at position ``at`` of the call."""
    return HandBack("python", -1, -1, at)


def _ssize(x: object) -> int:
    """``x`` as a C ``Py_ssize_t`` argument: an ``int`` in range (TypeError, OverflowError)."""
    if not isinstance(x, int):
        raise TypeError(f"'{type(x).__name__}' object cannot be interpreted as an integer")
    if not -_SSIZE_MAX - 1 <= x <= _SSIZE_MAX:
        raise OverflowError("Python int too large to convert to C ssize_t")
    return int(x)


def _words(obj: Any, code: Literal["Q", "I", "q"]) -> memoryview:
    """A buffer's bytes read as little-endian words (``"Q"``, ``"I"``, ``"q"``)."""
    raw = memoryview(obj).cast("B")
    if sys.byteorder == "little":
        return raw.cast(code)
    a = array(code, raw)  # big-endian host: a native copy
    a.byteswap()
    return memoryview(a)


def _flat(obj: Any) -> memoryview:
    """A contiguous buffer's bytes (ValueError if it is not contiguous, as ``PyBUF_SIMPLE``)."""
    mv = memoryview(obj)
    if not mv.c_contiguous:
        raise ValueError("buffer is not contiguous")
    return mv.cast("B")


def _i64(obj: Any, what: str) -> memoryview:
    """An int64 buffer (ValueError if its length is not a multiple of 8)."""
    raw = _flat(obj)
    if raw.nbytes % 8:
        raise ValueError(f"{what}: not an int64 buffer")
    return _words(raw, "q")


def _decimal(p: bytes) -> int | None:
    """A strict decimal (ASCII whitespace, sign, 1-18 digits, whitespace), or ``None``."""
    m = _DECIMAL.fullmatch(p)
    return None if m is None else int(m.group(1))


class Mapped:
    """A tar's descriptor (owned) and what it was when opened: ``_kernel.Mapped``'s twin.

    The compiled one copies out of the mapping inside a fault guard; Python cannot recover
    from a fault in a copy, so this one never reads the mapping: every slice is an
    ``os.pread`` of the descriptor, and a short read (the tar cut since) raises the error
    ``fault`` makes, as a fault of the compiled copy does.

    Args:
        fd: An open descriptor of the tar, owned from now on (closed with the object).
        size: The tar's size when opened (bytes).
        dev, ino, mtime_ns: Its ``st_dev``, ``st_ino``, ``st_mtime_ns`` when opened.
        fault: ``fault(at) -> Exception | None``: the error for a read that failed at byte
            ``at`` (``-1``: the check), ``tarindex.read.checks.tar_fault``.
    """

    def __init__(
        self,
        fd: int,
        size: int,
        dev: int,
        ino: int,
        mtime_ns: int,
        fault: Callable[[int], BaseException | None],
    ) -> None:
        if hasattr(self, "fd"):
            raise TypeError("Mapped is initialised once")
        self.fd, self.size, self.fault = fd, size, fault
        self.ident = (dev, ino, mtime_ns)
        weakref.finalize(self, os.close, fd)

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, item: slice) -> bytes:
        """``self[a:b]``: those bytes of the tar (clamped as bytes slicing is), read with pread."""
        if not isinstance(item, slice):
            raise TypeError("Mapped indices must be slices")
        a, b, step = item.indices(self.size)
        if step != 1:
            raise ValueError("Mapped slices have step 1")
        if b <= a:
            return b""
        got = os.pread(self.fd, b - a, a)
        if len(got) != b - a:
            raise self._error(a + len(got))
        return got

    def _error(self, at: int) -> BaseException:
        e = self.fault(at)
        if isinstance(e, BaseException):
            return e
        return OSError(f"byte {at}: reading a mapped tar faulted (SIGBUS)")

    def willneed(self, start: int, end: int) -> None:
        """Ask the kernel to read bytes ``[start, end)`` ahead (``posix_fadvise``; a hint)."""
        start, end = max(_ssize(start), 0), min(_ssize(end), self.size)
        if end > start and hasattr(os, "posix_fadvise"):
            try:
                os.posix_fadvise(self.fd, start, end - start, os.POSIX_FADV_WILLNEED)
            except OSError:
                pass

    def check(self) -> None:
        """Raise the error of a tar changed since it was opened (``fault(-1)``: one fstat)."""
        e = self.fault(-1)
        if e is not None:
            raise e if isinstance(e, BaseException) else self._error(-1)


class Tables:
    """One open shard's validated tables and tar bytes (buffers held while alive).

    Args:
        key_ptr, sample_ptr: ``uint64 (n + 1,)`` buffers (FORMAT.md §4).
        keys: The buffer holding the key blob, ``keys[key_base:key_end]``.
        key_base, key_end: Where the key blob starts and ends in ``keys`` (bytes).
        ext_id: ``uint32 (members,)``; offset, size: ``uint64 (members,)``.
        data: The tar's bytes: a :class:`Mapped` (read with its guard), or a buffer.
        exts: Extension names by id.
        checked: One flag per chunk of samples, 1 once its tables passed the guards.

    Raises:
        ValueError: If the table lengths are inconsistent.
        TypeError: If ``exts`` is not a tuple.
    """

    n = 0
    """Samples (0 until initialised: every read hands back, as the C's)."""
    members = 0
    """Entries of ``ext_id``, ``offset``, ``size``."""
    kbase = kend = dlen = mark = 0  # mark: the call that last checked this mapping's size
    exts: tuple[str, ...] = ()
    kp = sp = eid = off = size = off_raw = size_raw = eid_raw = memoryview(b"")
    keys: Any = b""
    data: Any = b""
    pins: tuple[Any, ...] = ()
    """The buffers held while this object lives (as the C holds them)."""
    checked: Any = b""
    mapped: Mapped | None = None
    """``data`` when it is a :class:`Mapped` (its check and reads), else ``None``."""

    def __init__(
        self,
        key_ptr: Any,
        sample_ptr: Any,
        keys: Any,
        key_base: int,
        key_end: int,
        ext_id: Any,
        offset: Any,
        size: Any,
        data: Any,
        exts: tuple[str, ...],
        checked: bytearray,
    ) -> None:
        if self.pins:
            raise TypeError("Tables is initialised once")
        key_base, key_end = _ssize(key_base), _ssize(key_end)
        if not isinstance(exts, tuple):
            raise TypeError("Tables() argument 'exts' must be tuple")
        mapped = data if isinstance(data, Mapped) else None
        raws = [_flat(b) for b in (key_ptr, sample_ptr, keys, ext_id, offset, size)]
        raws.append(data if mapped is not None else _flat(data))
        ck = _flat(checked)
        if ck.readonly:
            raise BufferError("Object is not writable.")
        kp, sp, klen, eid, off, sz = (r.nbytes for r in raws[:6])
        dlen = len(data) if mapped is not None else raws[6].nbytes
        if (
            kp % 8 or sp % 8 or off % 8 or sz % 8 or eid % 4 or kp < 8 or kp != sp
            or off != sz or off // 8 != eid // 4 or key_base < 0 or key_end < key_base
            or key_end > klen
        ):  # fmt: skip
            raise ValueError("Tables: inconsistent table lengths")
        n = kp // 8 - 1
        if ck.nbytes < (n + (1 << CHUNK_SHIFT) - 1) >> CHUNK_SHIFT:
            raise ValueError("Tables: chunk flags shorter than the sample count")
        self.pins = (raws[2], raws[6], ck)
        self.n, self.members = n, eid // 4
        self.kp, self.sp = _words(raws[0], "Q"), _words(raws[1], "Q")
        self.eid, self.off, self.size = (_words(raws[3], "I"), _words(raws[4], "Q"),
                                         _words(raws[5], "Q"))  # fmt: skip
        self.off_raw, self.size_raw, self.eid_raw = raws[4], raws[5], raws[3]
        self.keys = keys if isinstance(keys, (bytes, mmap.mmap)) else raws[2]
        self.data = data if isinstance(data, (bytes, mmap.mmap, Mapped)) else raws[6]
        self.mapped = mapped
        self.dlen = dlen
        self.kbase, self.kend = key_base, key_end
        self.exts = exts
        self.checked = ck

    def row(self, j: int) -> _Row | None:
        """Sample ``j``'s key and member run, bounded; ``None``: hand back."""
        if not 0 <= j < self.n or not self.checked[j >> CHUNK_SHIFT]:
            return None
        kp, sp = self.kp, self.sp
        k0, k1, m0, m1 = kp[j], kp[j + 1], sp[j], sp[j + 1]
        if k0 <= k1 <= self.kend - self.kbase and m0 <= m1 <= self.members:
            return k0, k1, m0, m1
        return None

    def member(self, m: int) -> tuple[int, int, int] | None:
        """Member ``m``'s extension id, offset and size, bounded; ``None``: hand back."""
        e, o, s = self.eid[m], self.off[m], self.size[m]
        if e < len(self.exts) and o <= self.dlen and s <= self.dlen - o:
            return e, o, s
        return None

    def key(self, k0: int, k1: int) -> str:
        """The key at ``k0:k1`` of the key blob."""
        b = self.kbase
        return bytes(self.keys[b + k0 : b + k1]).decode("utf-8", "surrogateescape")

    def as_dict(
        self, j: int, want: bytes | None, shard: Any, index: Any, meta_first: bool
    ) -> dict[str, Any] | None:
        """Sample ``j`` as a dict (``meta_first``: Block.to_samples' key order), or ``None``."""
        row = self.row(j)
        if row is None:
            return None
        k0, k1, m0, m1 = row
        member = self.member
        if any(member(m) is None for m in range(m0, m1)):
            return None
        d: dict[str, Any] = {"__key__": self.key(k0, k1)}
        if meta_first:
            d["__shard__"] = shard
            d["__index__"] = index
        exts, data, mapped = self.exts, self.data, self.mapped
        for m in range(m0, m1):  # read again: hashing a name may have changed a table
            got = member(m)
            if got is None:
                return None
            e, o, s = got
            if want is None or want[e]:
                d[exts[e]] = data[o : o + s] if mapped is not None else bytes(data[o : o + s])
        if not meta_first:
            d["__shard__"] = shard
            d["__index__"] = index
        return d

    def _want(self, obj: Any) -> bytes | None:
        if obj is None:
            return None
        if not isinstance(obj, bytes) or len(obj) < len(self.exts):
            raise TypeError("want: bytes of one flag per extension")
        return obj

    def samples(
        self, j0: int, j1: int, want: bytes | None, shard: str, base: int
    ) -> list[dict[str, Any]] | HandBack:
        """Samples ``j0 <= j < j1`` as dicts (``"__index__"`` ``base + j - j0``), or a hand-back."""
        j0, j1, base = _ssize(j0), _ssize(j1), _ssize(base)
        w = self._want(want)
        if j0 < 0 or j1 < j0 or j1 > self.n or base > _SSIZE_MAX - (j1 - j0):
            return _python(0)
        out = []
        for j in range(j0, j1):
            d = self.as_dict(j, w, shard, base + (j - j0), True)
            if d is None:
                return _python(j - j0)
            out.append(d)
        return out


def _hot_tables(hot: Any) -> Tables | None:
    """``hot``'s Tables if it is a HotTables of this module's tables (else hand back)."""
    if isinstance(hot, tuple) and len(hot) == _HOT_FIELDS:
        t = hot[_HOT_TABLES]
        if isinstance(t, Tables):
            return t
    return None


def _shard_of(starts: memoryview, ns: int, per: int, i: int) -> int:
    """The shard holding global sample ``i`` (the caller checks its bounds)."""
    if per > 0:
        return min(i // per, ns - 1)
    lo, hi = 0, ns
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if starts[mid] <= i:
            lo = mid
        else:
            hi = mid
    return lo


_Resolved = tuple[Tables, int, Any, Any, "bytes | None"]


def _resolve(
    iobj: Any,
    starts: memoryview,
    ns: int,
    per: int,
    readers: dict[int, Any],
    paths: list[str],
    call: int,
    fields: frozenset[Any] | None,
    at: int,
) -> _Resolved | HandBack:
    """Locate sample ``iobj``, look its reader up, check its tar and chunk; or hand back at ``at``."""
    if type(iobj) is not int:
        return _python(at)
    i = iobj
    if not -_SSIZE_MAX - 1 <= i <= _SSIZE_MAX or ns < 1 or ns > len(paths):
        return _python(at)
    total = starts[ns]
    if total < 0:
        return _python(at)
    neg = i < 0
    if neg:
        i += total
    if not 0 <= i < total:
        return _python(at)
    sh = _shard_of(starts, ns, per, i)
    s0, s1 = starts[sh], starts[sh + 1]
    if s0 < 0 or i < s0 or i >= s1:
        return _python(at)
    r = dict.get(readers, sh)
    if r is None:
        return HandBack("open", sh, -1, at)
    hot = r.hot
    t = _hot_tables(hot)
    if t is None:
        return _python(at)
    want = None
    if fields is not None:  # before the size check: a contains may run Python code
        if len(t.exts) > _WANT_MAX:
            return _python(at)
        want = bytes(e in fields for e in t.exts)
    if call == 0 or t.mark != call:
        if t.mapped is not None:  # cut or changed since opened: its error (READING.md)
            t.mapped.check()
        if call:
            t.mark = call
    if sh >= len(paths):
        return _python(at)
    j = i - s0
    if j >= t.n:
        return _python(at)
    if not t.checked[j >> CHUNK_SHIFT]:
        return HandBack("check", sh, j >> CHUNK_SHIFT, at)
    return t, j, i if neg else iobj, paths[sh], want


def _get_args(args: tuple[Any, ...], usage: str) -> tuple[memoryview, int, int]:
    starts, per, readers, paths = args
    if (
        not isinstance(starts, bytes) or len(starts) % 8 or not isinstance(readers, dict)
        or not isinstance(paths, list)
    ):  # fmt: skip
        raise TypeError(usage)
    st = _words(starts, "q")
    return st, len(st) - 1, _ssize(per)


def sample(
    i: int,
    starts: bytes,
    per: int,
    readers: dict[int, Any],
    paths: list[str],
    fields: Collection[str] | None = None,
) -> dict[str, Any] | HandBack:
    """ShardSet.sample(i, fields) as a dict, or a :class:`HandBack` (``at`` 0).

    ``readers`` is only looked up (the pool keeps its LRU order itself, read/pool.py).
    """
    st, ns, p = _get_args(
        (starts, per, readers, paths),
        "sample(i, starts: int64 bytes, per, readers: dict, paths: list[, fields])",
    )
    if fields is not None and type(fields) is not frozenset:
        return _python(0)
    got = _resolve(i, st, ns, p, readers, paths, 0, fields, 0)
    if isinstance(got, HandBack):
        return got
    t, j, index, path, want = got
    d = t.as_dict(j, want, path, index, False)
    return _python(0) if d is None else d


def take(
    indices: list[int],
    starts: bytes,
    per: int,
    readers: dict[int, Any],
    paths: list[str],
) -> list[dict[str, Any]] | HandBack:
    """SetTakes.take(indices) as dicts, or a :class:`HandBack` (``at``: a position in ``indices``)."""
    st, ns, p = _get_args(
        (starts, per, readers, paths),
        "take(indices: list, starts: int64 bytes, per, readers: dict, paths: list)",
    )
    seq = tuple(indices)
    call = next(_calls)
    rs = []
    for b, iobj in enumerate(seq):  # each mapping's size once, before its first byte is copied
        got = _resolve(iobj, st, ns, p, readers, paths, call, None, b)
        if isinstance(got, HandBack):
            return got
        rs.append(got)
    out = []
    for b, (t, j, index, path, _) in enumerate(rs):
        d = t.as_dict(j, None, path, index, True)
        if d is None:
            return _python(b)
        out.append(d)
    return out


def gather(
    tables: tuple[Tables, ...], shards: tuple[int, ...], slot: Any, local: Any
) -> tuple[list[str], bytes, bytes, bytes, bytes] | HandBack:
    """Keys, member counts and member table bytes of a batch, or the first sample's hand-back."""
    if not isinstance(tables, tuple) or not isinstance(shards, tuple):
        raise TypeError("gather(tables: tuple, shards: tuple, slot, local)")
    if not all(isinstance(t, Tables) for t in tables):
        raise TypeError("gather: tables must be Tables")
    if len(shards) != len(tables):
        raise ValueError("gather: tables and shards differ in length")
    sl, lo = _i64(slot, "slot"), _i64(local, "local")
    if len(sl) != len(lo):
        raise ValueError("gather: slot and local differ in length")
    nt = len(tables)
    rows: list[tuple[Tables, _Row]] = []
    for b in range(len(sl)):
        s = sl[b]
        if not 0 <= s < nt:
            raise IndexError("gather: slot out of range")
        t = tables[s]
        j = lo[b]
        row = t.row(j)
        if row is None and 0 <= j < t.n and not t.checked[j >> CHUNK_SHIFT]:
            return HandBack("check", _ssize(shards[s]), j >> CHUNK_SHIFT, b)
        if row is None or any(t.member(m) is None for m in range(row[2], row[3])):
            return _python(b)
        rows.append((t, row))
    keys: list[str] = []
    cnt = array("q")
    ob, sb, eb = bytearray(), bytearray(), bytearray()
    for t, (k0, k1, m0, m1) in rows:
        keys.append(t.key(k0, k1))
        cnt.append(m1 - m0)
        ob += t.off_raw[m0 << 3 : m1 << 3]
        sb += t.size_raw[m0 << 3 : m1 << 3]
        eb += t.eid_raw[m0 << 2 : m1 << 2]
    if sys.byteorder != "little":
        cnt.byteswap()
    return keys, cnt.tobytes(), bytes(ob), bytes(sb), bytes(eb)


def pack(
    out: Any,
    datas: tuple[Any, ...],
    src: Any,
    offset: Any,
    size: Any,
    dest: Any,
    vals: Any,
    start: int,
) -> HandBack | None:
    """Copy byte members, parse integer members: ``None`` when done, else a :class:`HandBack`."""
    if not isinstance(datas, tuple):
        raise TypeError("pack(out, datas: tuple, src, offset, size, dest, vals, start)")
    start = _ssize(start)
    o = _flat(out)
    if o.readonly:
        raise BufferError("Object is not writable.")
    sr, of, sz, de = (_i64(a, "pack array") for a in (src, offset, size, dest))
    vm = _flat(vals)
    if vm.readonly:
        raise BufferError("Object is not writable.")
    if vm.nbytes % 8:
        raise ValueError("pack array: not an int64 buffer")
    vs = vm.cast("q")
    n = len(sr)
    if not len(of) == len(sz) == len(de) == len(vs) == n:
        raise ValueError("pack: arrays differ in length")
    db = [d if isinstance(d, Mapped) else _flat(d) for d in datas]  # a Mapped: pread
    nd, olen = len(db), o.nbytes
    for k in range(max(start, 0), n):
        s, a, ln, d = sr[k], of[k], sz[k], de[k]
        dn = len(db[s]) if 0 <= s < nd else 0
        if not 0 <= s < nd or a < 0 or ln < 0 or a > dn or ln > dn - a:
            return _python(k)
        if d < 0:
            v = _decimal(bytes(db[s][a : a + ln]))
            if v is None:
                return _python(k)
            vs[k] = v
        elif d > olen or ln > olen - d:
            return _python(k)
        else:
            o[d : d + ln] = db[s][a : a + ln]
    return None


def batch(
    indices: Sequence[int],
    starts: Any,
    per: int,
    readers: dict[int, Any],
    paths: list[str],
    fields: Collection[str] | None,
    int_fields: Collection[str],
    alloc: Callable[[int], tuple[Any, Any]],
) -> Packed | HandBack:
    """A whole batch in the field-major layout, or a :class:`HandBack` (``at``: in ``indices``)."""
    if not isinstance(readers, dict) or not isinstance(paths, list):
        raise TypeError(
            "batch(indices, starts, per, readers: dict, paths: list, fields, int_fields, alloc)"
        )
    per = _ssize(per)
    st = _i64(starts, "starts")
    seq = tuple(indices)
    n, ns = len(seq), len(st) - 1
    call = next(_calls)
    if ns < 1 or n == 0:
        return _python(0)
    total = st[ns]
    idx = array("q")
    rows: list[tuple[Tables, int, int]] = []
    for b, i in enumerate(seq):  # pass 1: locate, look up, cut check
        # only an int (take's and sample's rule too): a bool, a numpy integer, anything else
        # goes back to the caller, which applies the index rule (spanner.check_indices)
        if type(i) is not int or not -_SSIZE_MAX - 1 <= i <= _SSIZE_MAX:
            return _python(b)
        if i < 0:
            i += total
        if not 0 <= i < total:
            return _python(b)
        sh = _shard_of(st, ns, per, i)
        s0 = st[sh]
        if i < s0 or i >= st[sh + 1]:
            return _python(b)
        idx.append(i)
        r = dict.get(readers, sh)
        if r is None:
            return HandBack("open", sh, -1, b)
        hot = r.hot
        t = _hot_tables(hot)
        if t is not None and t.mark != call:  # cut or changed since opened: its error
            if t.mapped is not None:
                t.mapped.check()
            t.mark = call
        if t is None:
            return _python(b)
        j = i - s0
        if j >= t.n:
            return _python(b)
        if not t.checked[j >> CHUNK_SHIFT]:
            return HandBack("check", sh, j >> CHUNK_SHIFT, b)
        rows.append((t, j, sh))
    keys: list[str] = []
    shards: list[str] = []
    bnames: list[str] = []
    inames: list[str] = []
    pos: dict[str, int] = {}
    lens: list[list[int]] = []
    ivals: list[list[int]] = []
    for b, (t, j, sh) in enumerate(rows):  # keys, members, layout sizes
        row = t.row(j)
        if row is None:
            return _python(b)
        k0, k1, m0, m1 = row
        keys.append(t.key(k0, k1))
        shards.append(paths[sh])
        for m in range(m0, m1):
            got = t.member(m)
            if got is None:
                return _python(b)
            e, mo, ms = got
            name = t.exts[e]
            p = pos.get(name)
            if p is None:
                p = -1
                if fields is None or name in fields:
                    if name in int_fields:
                        p = -2 - len(inames)
                        inames.append(name)
                    else:
                        p = len(bnames)
                        bnames.append(name)
                pos[name] = p
            if p == -1:
                continue
            is_int = p < -1
            q = -2 - p if is_int else p
            cols = ivals if is_int else lens
            if q >= len(cols):  # a new field: a column of -1
                cols.append([-1] * n)
            if cols[q][b] != -1:  # an extension twice in a sample (the guards refuse it)
                return _python(b)
            if not is_int:
                cols[q][b] = ms
            else:
                v = _decimal(bytes(t.data[mo : mo + ms]))  # a Mapped: read with pread
                if v is None or v == -1:  # int() decides; -1 reads as missing
                    return _python(b)
                cols[q][b] = v
    nf = len(lens)
    offs = array("q")
    pres = bytearray(nf * n)
    cum = 0
    for f, col in enumerate(lens):  # field f's members of samples 0..n-1, then field f + 1
        for b, ln in enumerate(col):
            offs.append(cum)
            pres[f * n + b] = ln >= 0
            if ln > 0:
                cum += ln
        offs.append(cum)
    made = alloc(cum)
    if not isinstance(made, tuple) or len(made) != 2:
        raise TypeError("batch: alloc must return (keep, buffer)")
    out = _flat(made[1])
    if out.readonly:
        raise BufferError("Object is not writable.")
    if out.nbytes < cum:
        raise ValueError("batch: alloc returned a short buffer")
    for b, (t, j, _) in enumerate(rows):  # pass 2: copies, each read bounded again
        row = t.row(j)
        if row is None:
            return _python(b)
        for m in range(row[2], row[3]):
            got = t.member(m)
            if got is None:
                return _python(b)
            e, mo, ms = got
            p = pos.get(t.exts[e], -1)
            if p < 0:
                continue
            a0, a1 = offs[p * (n + 1) + b], offs[p * (n + 1) + b + 1]
            if p >= nf or not pres[p * n + b] or a1 - a0 != ms:
                return _python(b)
            out[a0:a1] = t.data[mo : mo + ms] if t.mapped is not None else t.pins[1][mo : mo + ms]
    iv = array("q", itertools.chain.from_iterable(ivals))
    for a in (offs, iv, idx):
        if sys.byteorder != "little":
            a.byteswap()
    return (
        made[0],
        keys,
        bnames,
        inames,
        bytearray(offs.tobytes()),
        pres,
        bytearray(iv.tobytes()),
        bytearray(idx.tobytes()),
        shards,
    )
