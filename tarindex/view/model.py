"""What the viewer shows, read through the public read API: totals, sample rows, members, previews.

Every read goes through :class:`tarindex.ShardSet` / :class:`tarindex.ShardReader` (one lock:
a ShardSet is not shared between threads unguarded) and every decode through
:mod:`tarindex.codecs`, within bounds: images under :data:`tarindex.codecs.MAX_IMAGE_PIXELS`
and :data:`THUMB_SECONDS`, decompression under :data:`PREVIEW_BYTES`, text cut at
:data:`TEXT_CHARS`. A page of the grid reads only its own samples (O(page), whatever the
dataset's size); the summary reads the index tables (vectorised) and at most
:data:`CLS_SAMPLES` ``cls`` members.
"""

from __future__ import annotations

import io
import json
import threading
from collections import Counter, OrderedDict
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..codecs import decode as codec_decode
from ..codecs.exts import IMAGE_FORMATS, INT_EXTS, JSON_EXTS, TEXT_EXTS, last_ext
from ..codecs.handlers import open_image
from ..format.index import read_header
from ..format.spec import HEADER
from ..format.url import is_url
from ..read import OpenOptions, ShardReader, ShardSet

__all__ = [
    "CLS_SAMPLES",
    "PREVIEW_BYTES",
    "TEXT_CHARS",
    "THUMB_PX",
    "THUMB_SECONDS",
    "Member",
    "Row",
    "Summary",
    "View",
]

THUMB_PX = 128
"""Thumbnails fit in ``THUMB_PX x THUMB_PX`` pixels."""
THUMB_SECONDS = 3.0
"""A thumbnail not decoded within this many seconds is shown as a placeholder."""
THUMB_BYTES = 64 << 20
"""Image members larger than this (bytes) get no thumbnail (nothing is read)."""
PREVIEW_BYTES = 4 << 20
"""Members larger than this (bytes) are not decoded for a preview, and a preview's
decompressed output is bounded by it too."""
TEXT_CHARS = 4000
"""A text or json preview is cut at this many characters."""
GRID_TEXT_BYTES = 512
"""Bytes of a txt/json member read for the grid's first lines."""
CLS_SAMPLES = 2000
"""The summary's ``cls`` histogram reads at most this many ``cls`` members, evenly spaced."""
_DECODERS = 2  # decode threads; a stuck decode holds one, never the server
_IN_FLIGHT = 8  # decodes queued or running at most; more are refused at once
_CACHE = 512  # thumbnails kept (PNG bytes, a few KiB each)


@dataclass
class Member:
    """One member of a sample, as the index records it."""

    pos: int
    """Position in the sample (0-based), as the URLs name it."""
    ext: str
    name: str
    """``key.ext``, the member's name in the tar up to normalisation (FORMAT.md §2.5)."""
    size: int
    offset: int
    """Byte offset of the member's data in its tar."""
    crc32: int | None
    """Recorded crc32, or None if the index records none."""


@dataclass
class Row:
    """One sample of the grid or the sample page."""

    index: int
    key: str
    shard: int
    j: int
    members: list[Member]
    lines: dict[int, str] = field(default_factory=dict)
    """First lines of the txt/json members, by position."""
    cls: str | None = None


@dataclass
class Summary:
    """Dataset totals (the summary page)."""

    shards: int
    samples: int
    members: int
    data_bytes: int
    tar_bytes: int
    exts: dict[str, tuple[int, int]]
    """``{ext: (members, bytes)}``."""
    size_hist: dict[str, list[int]]
    """``{ext: counts}``: members of size ``[2**b, 2**(b+1))`` in bin ``b`` (bin 0 holds 0 and 1)."""
    cls_hist: dict[str, int]
    cls_read: int
    """``cls`` members read for :attr:`cls_hist` (at most :data:`CLS_SAMPLES`)."""
    versions: dict[str, int]
    """``{"major.minor": shards}`` of the index format."""
    with_crc: int
    """Shards whose index records member crc32s."""


def _index_version(index_path: str) -> str:
    if is_url(index_path):
        return "remote"
    with open(index_path, "rb") as f:
        h = read_header(f.read(HEADER.size), index_path)
    return f"{h.major}.{h.minor}"


class View:
    """The dataset as the viewer sees it: one ShardSet, a lock, a thumbnail pool.

    Args:
        source: Anything :class:`tarindex.ShardSet` takes.
        index_dir: Indexes kept apart from the tars. Defaults to ``None``.

    Raises:
        As :class:`tarindex.ShardSet`.
    """

    def __init__(self, source: Any, index_dir: str | None = None) -> None:
        self.source = source
        self.ss = ShardSet(
            source, options=OpenOptions(max_open=8, index_dir=index_dir, index="require")
        )
        self.lock = threading.RLock()
        self._summary: Summary | None = None
        self._pool = ThreadPoolExecutor(_DECODERS, thread_name_prefix="tarindex-view-decode")
        self._slots = threading.BoundedSemaphore(_IN_FLIGHT)
        self._thumbs: OrderedDict[tuple[int, int], bytes | None] = OrderedDict()

    def __len__(self) -> int:
        return len(self.ss)

    def close(self) -> None:
        """Stop the decode threads (without waiting for a stuck one) and close the shards."""
        self._pool.shutdown(wait=False, cancel_futures=True)
        with self.lock:
            self.ss.close()

    # -- tables -------------------------------------------------------------------------

    def _reader(self, s: int) -> ShardReader:
        return self.ss.reader(s)

    def row(self, i: int, lines: bool = True) -> Row:
        """Sample ``i``: key, members, and (``lines``) the first lines of text and ``cls``.

        Raises:
            SampleIndexError: ``i`` is out of range.
        """
        with self.lock:
            s, j = self.ss.locate(i)
            r = self._reader(s)
            key = r.key(j)
            lo, hi = r.member_slice(j)
            t = r.index
            crc = t.member_crc
            members = [
                Member(
                    m - lo,
                    r.exts[int(t.ext_id[m])],
                    f"{key}.{r.exts[int(t.ext_id[m])]}",
                    int(t.size[m]),
                    int(t.offset[m]),
                    None if crc is None else int(crc[m]),
                )
                for m in range(lo, hi)
            ]
            row = Row(int(self.ss.starts[s]) + j, key, s, j, members)
            if lines:
                for mb in members:
                    last = last_ext(mb.ext)
                    if mb.ext in INT_EXTS and mb.size <= 32:
                        row.cls = r.read(mb.offset, mb.size).decode("utf-8", "replace").strip()
                    elif mb.ext in TEXT_EXTS or mb.ext in JSON_EXTS or last in ("txt", "json"):
                        head = r.read(mb.offset, min(mb.size, GRID_TEXT_BYTES))
                        text = head.decode("utf-8", "replace").splitlines()[:3]
                        row.lines[mb.pos] = "\n".join(x[:120] for x in text)
        return row

    def member_bytes(self, i: int, pos: int, limit: int | None = None) -> tuple[Member, bytes]:
        """Member ``pos`` of sample ``i`` and its first ``limit`` bytes (all if None).

        Raises:
            SampleIndexError: ``i`` is out of range.
            KeyError: The sample has no member ``pos``.
        """
        row = self.row(i, lines=False)
        if not 0 <= pos < len(row.members):
            raise KeyError(f"sample {i} has no member {pos} (it has {len(row.members)})")
        mb = row.members[pos]
        n = mb.size if limit is None else min(mb.size, limit)
        with self.lock:
            return mb, self._reader(row.shard).read(mb.offset, n)

    def member_chunks(self, i: int, pos: int, chunk: int = 1 << 20) -> tuple[Member, Any]:
        """Member ``pos`` of sample ``i`` and an iterator of its bytes, ``chunk`` at a time."""
        row = self.row(i, lines=False)
        if not 0 <= pos < len(row.members):
            raise KeyError(f"sample {i} has no member {pos} (it has {len(row.members)})")
        mb = row.members[pos]

        def chunks() -> Any:
            for a in range(0, mb.size, chunk):
                with self.lock:
                    yield self._reader(row.shard).read(mb.offset + a, min(chunk, mb.size - a))

        return mb, chunks()

    # -- previews -----------------------------------------------------------------------

    @staticmethod
    def is_image(ext: str) -> bool:
        """True if ``ext`` is an image the codecs open (its last component, uncompressed)."""
        return last_ext(ext) in IMAGE_FORMATS and last_ext(ext) == ext.rsplit(".", 1)[-1]

    def thumbnail(self, i: int, pos: int) -> bytes | None:
        """A PNG of member ``pos`` of sample ``i`` fitting :data:`THUMB_PX`, or None.

        None if the member is not an image, is over :data:`THUMB_BYTES`, over the pixel bound,
        does not decode, or is not decoded within :data:`THUMB_SECONDS` (the decode thread
        then finishes on its own; at most :data:`_IN_FLIGHT` decodes are pending).
        """
        k = (i, pos)
        with self.lock:
            if k in self._thumbs:
                return self._thumbs[k]
        mb, _ = self.member_bytes(i, pos, 0)
        if not self.is_image(mb.ext) or mb.size > THUMB_BYTES:
            return None
        if not self._slots.acquire(blocking=False):
            return None  # busy: not cached, the next request tries again
        try:
            _, data = self.member_bytes(i, pos)
            fut = self._pool.submit(_thumb, last_ext(mb.ext), data)
            fut.add_done_callback(lambda _f: self._slots.release())
        except BaseException:
            self._slots.release()
            raise
        try:
            png = fut.result(THUMB_SECONDS)
        except FutureTimeout:
            return None
        with self.lock:
            self._thumbs[k] = png
            while len(self._thumbs) > _CACHE:
                self._thumbs.popitem(last=False)
        return png

    def preview(self, i: int, pos: int) -> tuple[str, str]:
        """``(kind, text)`` of member ``pos``: kind is image, cls, text, json, npy, binary, none.

        Decoded with :func:`tarindex.codecs.decode_value` (compression suffixes too) under
        :data:`PREVIEW_BYTES`; ``text`` is cut at :data:`TEXT_CHARS`.
        """
        mb, _ = self.member_bytes(i, pos, 0)
        if self.is_image(mb.ext):
            return "image", ""
        if mb.size > PREVIEW_BYTES:
            return "none", f"{mb.size} bytes: too large to preview (over {PREVIEW_BYTES})"
        _, data = self.member_bytes(i, pos)
        try:
            v = codec_decode.decode_value(
                mb.ext, data, image="raw", max_decompressed_bytes=PREVIEW_BYTES
            )
        except Exception as e:  # a preview never fails the page: it says why
            return "none", f"does not decode: {e}"
        return _describe(v)

    # -- totals -------------------------------------------------------------------------

    def summary(self) -> Summary:
        """The dataset's totals, computed once (index tables only, plus some ``cls`` reads)."""
        with self.lock:
            if self._summary is None:
                self._summary = self._compute_summary()
            return self._summary

    def _compute_summary(self) -> Summary:
        ss = self.ss
        exts: dict[str, list[int]] = {}
        hist: dict[str, Any] = {}
        members = data = tar = crc = 0
        versions: Counter[str] = Counter()
        cls_ext: set[str] = set()
        for s in range(ss.n_shards):
            r = self._reader(s)
            t = r.index
            sizes = t.size.astype(np.int64)
            eid = t.ext_id.astype(np.int64)
            members += len(sizes)
            data += int(sizes.sum())
            tar += r.tar_size
            crc += t.member_crc is not None
            versions[_index_version(r.index_path)] += 1
            bins = np.floor(np.log2(np.maximum(sizes, 1))).astype(np.int64)
            for e, name in enumerate(r.exts):
                sel = eid == e
                got = exts.setdefault(name, [0, 0])
                got[0] += int(sel.sum())
                got[1] += int(sizes[sel].sum())
                h = np.bincount(bins[sel], minlength=64)[:64]
                hist[name] = hist[name] + h if name in hist else h
                if name in INT_EXTS:
                    cls_ext.add(name)
        cls_hist: Counter[str] = Counter()
        n = len(ss)
        read = 0
        if cls_ext and n:
            ext = sorted(cls_ext)[0]
            for i in np.unique(np.linspace(0, n - 1, min(n, CLS_SAMPLES)).astype(np.int64)):
                smp = ss.sample(int(i), (ext,))
                if ext in smp:
                    read += 1
                    cls_hist[bytes(smp[ext]).decode("utf-8", "replace").strip()[:40]] += 1
        return Summary(
            ss.n_shards,
            n,
            members,
            data,
            tar,
            {k: (v[0], v[1]) for k, v in sorted(exts.items())},
            {k: [int(c) for c in np.trim_zeros(v, "b").tolist()] for k, v in sorted(hist.items())},
            dict(sorted(cls_hist.items(), key=lambda kv: _cls_order(kv[0]))),
            read,
            dict(versions),
            crc,
        )

    def shard_rows(self) -> list[tuple[str, int, int, int, int, str]]:
        """Per shard: ``(path, samples, members, data bytes, tar bytes, error)``.

        A shard that does not open (stale, corrupt, missing) gets its header's sample count,
        ``-1`` for what needs the reader, and the error's message.
        """
        out = []
        with self.lock:
            for s in range(self.ss.n_shards):
                path = self.ss.paths[s]
                try:
                    r = self._reader(s)
                except Exception as e:  # the page names it; the other shards still show
                    out.append(
                        (path, int(self.ss.counts[s]), -1, -1, -1, f"{type(e).__name__}: {e}")
                    )
                    continue
                t = r.index
                out.append((path, r.n_samples, len(t.size), int(t.size.sum()), r.tar_size, ""))
        return out

    def find(self, key: str) -> list[int]:
        """Global indices of the samples whose key is ``key`` (the key tables; O(log n) per shard)."""
        with self.lock:
            return self.ss.indices_of(key)


def _cls_order(v: str) -> tuple[int, int | str]:
    try:
        return (0, int(v))
    except ValueError:
        return (1, v)


def _thumb(last: str, data: bytes) -> bytes | None:
    """Decode under the pixel bound, downscale to :data:`THUMB_PX`, encode PNG; None on failure."""
    try:
        img = open_image(last, data, codec_decode.MAX_IMAGE_PIXELS)
        img.draft("RGB", (THUMB_PX * 2, THUMB_PX * 2))  # JPEG: decode at a reduced scale
        img.thumbnail((THUMB_PX, THUMB_PX))
        if img.mode not in ("RGB", "RGBA", "L"):
            img = img.convert("RGBA" if "A" in img.mode else "RGB")
        out = io.BytesIO()
        img.save(out, "PNG")
        return out.getvalue()
    except Exception:  # hostile or broken image: a placeholder, never an error page
        return None


def _describe(v: Any) -> tuple[str, str]:
    if isinstance(v, bool | int | np.integer):
        return "cls", str(int(v))
    if isinstance(v, str):
        return "text", v[:TEXT_CHARS]
    if isinstance(v, np.ndarray):
        flat = v.reshape(-1)[:16]
        more = ", ..." if v.size > 16 else ""
        vals = ", ".join(str(x) for x in flat.tolist())
        return "npy", f"shape {tuple(v.shape)}, dtype {v.dtype}\n[{vals}{more}]"
    if isinstance(v, dict | list):
        try:
            return "json", json.dumps(v, indent=2, ensure_ascii=False, default=repr)[:TEXT_CHARS]
        except (TypeError, ValueError):
            return "json", repr(v)[:TEXT_CHARS]
    if isinstance(v, bytes | bytearray | memoryview):
        b = bytes(v[:64])
        return "binary", " ".join(f"{x:02x}" for x in b) + (" ..." if len(v) > 64 else "")
    return "text", repr(v)[:TEXT_CHARS]
