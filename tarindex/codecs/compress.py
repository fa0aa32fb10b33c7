"""The compression layers of a member: ``.zst`` (zstandard) and ``.gz`` (gzip), both ways.

A trailing suffix of :data:`~tarindex.codecs.exts.COMPRESSION_SUFFIXES` means compressed bytes
of the inner extension (``"npy.zst"``, ``"json.gz"``; layers nest: ``"npy.gz.zst"``;
docs/FORMAT.md §7, docs/DECODING.md "Compressed members"). Readers take the layers off with
:func:`decompress_layers` (:data:`DECOMPRESSORS`), writers put them on with
:data:`COMPRESSORS`; decoded samples name an entry without them (:func:`strip_compression`).
A ``.zst`` member is one or more zstd frames, all decoded, as ``zstd -d`` does
(:func:`unzstd`); a ``.gz`` member one or more gzip members, all inflated (:func:`gunzip`).
In both, bytes after the last one that do not start another are an error.

**Bounded.** The bytes that a sample's ``.zst`` frames and ``.gz`` streams (and ``.npz``
entries, :mod:`tarindex.codecs.decode`) expand to count against one :class:`Budget` per
sample: checked before the output is allocated (``.zst``: from the frame header's size, else
by a first counting pass in 1 MiB steps), or counted while inflating and refused once past
the budget (``.gz``, holding at most :data:`GZ_KEEP` bytes of output until it is known to
fit). A ``.zst`` frame compressed with a dictionary is decompressed with the shard's
(:attr:`Budget.zstd_dict`), whose id must match.

A refused member raises :class:`Refused`, which :mod:`tarindex.codecs.decode` turns into a
:class:`tarindex.DecodeError` naming the member (shard, key, extension); at the zstandard
stage into its subclass ``tarindex.codecs.ZstdDecodeError``, also a ``zstandard.ZstdError``.
zstandard is imported on first use, so ``import tarindex`` does not import it.
"""

from __future__ import annotations

import gzip
import threading
import zlib
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any

from ..errors import DecodeError
from ..format.spec import ZSTD_FRAME_MAGIC, ZSTD_SKIPPABLE_MAGIC, ZSTD_SKIPPABLE_MASK
from .exts import COMPRESSION_SUFFIXES, GZ_SUFFIX, RENAMED_SUFFIXES, ZST_SUFFIX

__all__ = [
    "COMPRESSORS",
    "DECOMPRESSORS",
    "GZ_KEEP",
    "Budget",
    "Refused",
    "compression_layers",
    "decompress_layers",
    "gunzip",
    "gzip_compress",
    "decoded_name",
    "strip_compression",
    "unzstd",
    "zstd_compress",
    "zstd_compressor",
    "zstd_decode_error",
]

COUNT_STEP = 1 << 20
"""Output counted per step (bytes) when a size is not known up front: 1 MiB."""
GZ_KEEP = 1 << 26
"""``.gz`` output held while inflating (bytes): 64 MiB; past it, counted first, inflated again."""


class Refused(Exception):
    """A bound or a format check refused a member; ``zstd``: at the zstandard stage."""

    def __init__(self, msg: str, zstd: bool = False) -> None:
        super().__init__(msg)
        self.zstd = zstd


class Budget:
    """Decompressed bytes a sample may still produce, shared by its members.

    Also carries the sample's shard's zstd dictionary (``zstandard.ZstdCompressionDict`` or
    None, FORMAT.md §7): the per-sample decode context.

    Args:
        limit: Bytes the sample may expand to, ``>= 0``.
        zstd_dict: The shard's zstd dictionary, or ``None``. Defaults to ``None``.
    """

    __slots__ = ("left", "limit", "zstd_dict")

    def __init__(self, limit: int, zstd_dict: Any = None) -> None:
        self.limit = self.left = limit
        self.zstd_dict = zstd_dict

    def take(self, n: int, what: str, zstd: bool) -> None:
        """Charge ``n`` bytes, described by ``what``.

        Raises:
            Refused: ``n`` is more than what is left; ``zstd`` marks the zstandard stage.
        """
        if n > self.left:
            raise Refused(
                f"{what} {n} bytes, more than the {self.left} left of the sample's "
                f"decompression budget of {self.limit} bytes "
                f"(tarindex.codecs.decode.ZSTD_MAX_OUTPUT, "
                f"or ExtDecoder(max_decompressed_bytes=N); raise it if this is real)",
                zstd,
            )
        self.left -= n


# -- zstandard ------------------------------------------------------------------------------

_ZSTD_DECODE_ERROR: type[DecodeError] | None = None
_ZSTD_LOCK = threading.Lock()


def zstd_decode_error() -> type[DecodeError]:
    """``ZstdDecodeError``: a DecodeError that is also a ``zstandard.ZstdError``.

    Made on first use, so ``import tarindex`` does not import zstandard; the module
    ``__getattr__`` below resolves the name, so instances pickle (DataLoader workers).
    """
    global _ZSTD_DECODE_ERROR
    with _ZSTD_LOCK:  # one class only: pickle checks the name resolves to the same object
        if _ZSTD_DECODE_ERROR is None:
            import zstandard

            class ZstdDecodeError(DecodeError, zstandard.ZstdError):
                """A ``.zst`` member cannot be decompressed, or not within its bounds."""

            ZstdDecodeError.__qualname__ = "ZstdDecodeError"  # pickled by name, as a global
            _ZSTD_DECODE_ERROR = ZstdDecodeError
        return _ZSTD_DECODE_ERROR


def __getattr__(name: str) -> Any:
    """Resolve ``ZstdDecodeError`` lazily (it subclasses ``zstandard.ZstdError``)."""
    if name == "ZstdDecodeError":
        return zstd_decode_error()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


_DCTX = threading.local()  # per thread: {id(dictionary) or 0: (dictionary, ZstdDecompressor)}
_DCTX_KEEP = 8  # decompressors kept per thread (one per shard dictionary in use)


def _decompressor(zstd_dict: Any) -> Any:
    """This thread's ``ZstdDecompressor`` for ``zstd_dict`` (None: no dictionary).

    Making one costs ~60 us (its context), decompressing a small member ~1 us: they are kept,
    per thread (a decompressor is not thread-safe), keyed by the dictionary object (held, so
    its id stays unique), never by shard path.
    """
    cache: dict[int, tuple[Any, Any]] | None = getattr(_DCTX, "cache", None)
    if cache is None:
        cache = _DCTX.cache = {}
    k = 0 if zstd_dict is None else id(zstd_dict)
    hit = cache.get(k)
    if hit is not None and hit[0] is zstd_dict:
        return hit[1]
    import zstandard

    dctx = zstandard.ZstdDecompressor(dict_data=zstd_dict)
    if len(cache) >= _DCTX_KEEP:
        cache.pop(next(iter(cache)))
    cache[k] = (zstd_dict, dctx)
    return dctx


def _frame_end(data: bytes, pos: int) -> int | None:
    """End of the zstd frame that starts at ``pos`` (its magic checked by the caller), or None.

    Reads the frame header descriptor and the block headers only (RFC 8878 §3.1.1: magic,
    descriptor, window byte, dictionary id, content size, :data:`_HEADER_BYTES`; then blocks
    of a 3-byte little-endian header, bit 0 last block, bits 1-2 type, bits 3-23 size, an
    RLE block (type 1) holding 1 byte of content; then a 4-byte checksum if the descriptor's
    bit 2 is set), 3 bytes per block of at most 128 KiB. None: the frame runs past the end
    of ``data``.
    """
    n = len(data)
    if pos + 5 > n:
        return None
    fhd = data[pos + 4]
    q = pos + _HEADER_BYTES[fhd]
    while q + 3 <= n:
        h = data[q] | data[q + 1] << 8 | data[q + 2] << 16
        q += 3 + (1 if h & 6 == 2 else h >> 3)
        if h & 1:
            q += fhd & 4  # Content_Checksum_flag (bit 2): 4 bytes of xxhash64
            return q if q <= n else None
    return None


_HEADER_BYTES = tuple(
    4  # magic
    + 1  # Frame_Header_Descriptor
    + (0 if fhd & 0x20 else 1)  # Window_Descriptor, absent with Single_Segment_flag (bit 5)
    + (0, 1, 2, 4)[fhd & 3]  # Dictionary_ID, Dictionary_ID_flag (bits 0-1)
    + (1 if fhd & 0x20 else 0, 2, 4, 8)[fhd >> 6]  # Frame_Content_Size, FCS_flag (bits 6-7)
    for fhd in range(256)
)
"""A zstd frame header's size in bytes, by its descriptor byte (RFC 8878 §3.1.1.1)."""


def _skippable_end(data: bytes, pos: int) -> int | None:
    """End of the skippable frame (RFC 8878 §3.1.2) at ``pos``; None: not one.

    Raises:
        Refused: Its size runs past the end of ``data``.
    """
    if len(data) - pos < 8:
        return None
    if int.from_bytes(data[pos : pos + 4], "little") & ZSTD_SKIPPABLE_MASK != ZSTD_SKIPPABLE_MAGIC:
        return None
    size = int.from_bytes(data[pos + 4 : pos + 8], "little")
    if pos + 8 + size > len(data):
        raise Refused(
            f"skippable frame at byte {pos} of {len(data)} declares {size} bytes, and "
            f"{len(data) - pos - 8} follow (RFC 8878 §3.1.2); the member is truncated",
            True,
        )
    return pos + 8 + size


def unzstd(data: bytes, budget: Budget) -> bytes:
    """Decompress every zstd frame of ``data`` (RFC 8878 §3.1), as ``zstd -d`` does.

    Frames follow one another (``cat a.zst b.zst``), each charged to ``budget`` before it is
    allocated (:func:`_unzstd_frame`), with or without a size in its header, with the shard's
    dictionary or none; skippable frames are skipped; bytes after a frame that start no
    frame are an error (zero bytes too, as for ``zstd -d``). The output is the frames'
    outputs concatenated. Where each frame ends is found by walking its block headers
    (:func:`_frame_end`: 0.5 us for a member of one block, measured), so a member of one
    frame (what the writer makes) is still one ``decompress`` call.

    Raises:
        Refused: Over the budget, a dictionary id that is not the shard's, trailing bytes
            that are not a frame, a skippable frame cut short, or a frame after the first
            corrupt or cut short (naming the frame and its byte offset).
        zstandard.ZstdError: ``data`` does not start with a frame, or its only frame is
            corrupt or truncated.
    """
    n = len(data)
    end = _frame_end(data, 0) if data[:4] == ZSTD_FRAME_MAGIC else None
    if end == n or (end is None and _skippable_end(data, 0) is None):
        # one frame, the whole member (the common case); or none, or one cut short:
        # zstandard says what is wrong, as it did for every member before frames were walked
        return _unzstd_frame(data, budget)
    import zstandard

    parts: list[bytes] = []
    pos = 0
    while pos < n:
        skip = _skippable_end(data, pos)
        if skip is not None:
            pos = skip
            continue
        if data[pos : pos + 4] != ZSTD_FRAME_MAGIC:
            raise Refused(
                f"{n - pos} trailing bytes at byte {pos} of {n}, after {len(parts)} zstd "
                f"frame(s), are not a zstd frame (they start {bytes(data[pos : pos + 12])!r}; "
                f"a frame starts {ZSTD_FRAME_MAGIC!r}; `zstd -d` refuses them too)",
                True,
            )
        end = _frame_end(data, pos)
        where = f"zstd frame {len(parts) + 1} at byte {pos} of {n}"
        try:
            out = _unzstd_frame(data[pos:] if end is None else data[pos:end], budget)
        except zstandard.ZstdError as e:
            raise Refused(f"{where}: {e}", True) from e
        if end is None:  # decoded, although its blocks run past the member: refuse anyway
            raise Refused(f"{where}: its blocks run past the end of the member", True)
        parts.append(out)
        pos = end
    return b"".join(parts)


def _frame_decompressor(data: bytes, budget: Budget) -> tuple[int, Any]:
    """``(declared size or -1, decompressor)`` for the zstd frame that starts ``data``.

    A frame compressed with a dictionary (its header names the dictionary id) gets the
    decompressor of ``budget.zstd_dict``, the shard's (FORMAT.md §7), whose id must match.
    Not a frame: ``-1`` and the plain decompressor (whose ``decompress`` then says so).

    Raises:
        Refused: A dictionary id that is not the shard's.
    """
    import zstandard

    try:
        declared = zstandard.frame_content_size(data)  # -1: not in the frame header
        # Dictionary_ID_flag (descriptor bits 0-1) 0: no dictionary id, no second parse
        dict_id = zstandard.get_frame_parameters(data).dict_id if data[4] & 3 else 0
    except (zstandard.ZstdError, IndexError):
        declared, dict_id = -1, 0  # not a frame: decompress() says so
    zd = None
    if dict_id:
        zd = budget.zstd_dict
        have = None if zd is None else zd.dict_id()
        if have != dict_id:
            got = "has no zstd dictionary" if zd is None else f"has dictionary {have}"
            raise Refused(
                f"zstd frame was compressed with dictionary {dict_id}, and the shard {got} "
                f"(FORMAT.md §7); decode through TarDataset/TarIterableDataset, or pass "
                f"zstd_dict=ShardReader(tar).zstd_dict()",
                True,
            )
    return declared, _decompressor(zd)


def _unzstd_frame(data: bytes, budget: Budget) -> bytes:
    """Decompress the zstd frame ``data`` (one frame: bytes after it are ignored) within ``budget``.

    Its size is charged to ``budget`` before the output is allocated: the size its header
    declares, else the output counted in 1 MiB steps (stopping past the budget).

    Raises:
        Refused: Over the budget, or a dictionary id that is not the shard's.
        zstandard.ZstdError: Not a zstd frame, or a corrupt or truncated one.
    """
    declared, dctx = _frame_decompressor(data, budget)
    if declared >= 0:
        # a 40-byte frame may declare 16 GiB, allocated up front by decompress(): check first
        budget.take(declared, "zstd frame declares", True)
        out: bytes = dctx.decompress(data)
        return out
    # no size in the header: count the output with one 1 MiB buffer, stopping past the
    # budget, then decompress into one allocation of exactly that size; ``data`` holds one
    # frame only, since the count would run on into the next (stream_reader reads across)
    buf = bytearray(min(budget.left + 1, COUNT_STEP))
    n = 0
    with dctx.stream_reader(data) as r:
        while n <= budget.left:
            k = r.readinto(buf)
            if not k:
                break
            n += k
    what = "to at least" if n > budget.left else "to"
    budget.take(n, f"zstd frame (no size in its header) expands {what}", True)
    # max_output_size=0 would mean "unbounded"; a truncated frame raises ZstdError here
    out = dctx.decompress(data, max_output_size=max(n, 1))
    return out


def zstd_compressor(level: int = 3, zstd_dict: Any = None) -> Any:
    """A ``zstandard.ZstdCompressor`` whose frames record their content size (and dict id).

    Args:
        level: zstd level (1-22; negative levels are faster). Defaults to ``3``.
        zstd_dict: A ``zstandard.ZstdCompressionDict`` (the shard's trained dictionary,
            docs/FORMAT.md §7), or ``None``. Defaults to ``None``.

    Returns:
        The compressor: ``.compress(data)`` gives one frame whose header holds the
        decompressed size, so a reader charges it to the sample's decompression budget
        before allocating (:func:`unzstd`). Not thread-safe: one per thread.
    """
    import zstandard

    return zstandard.ZstdCompressor(level=level, dict_data=zstd_dict, write_content_size=True)


def zstd_compress(data: bytes, level: int = 3, zstd_dict: Any = None) -> bytes:
    """Compress ``data`` into one zstd frame (:func:`zstd_compressor`'s, for one member)."""
    out: bytes = zstd_compressor(level, zstd_dict).compress(data)
    return out


# -- gzip -----------------------------------------------------------------------------------


def _inflate(data: bytes, left: int, keep: int) -> tuple[int, list[bytes] | None]:
    """Inflate every gzip member of ``data`` in 1 MiB steps: ``(bytes out, chunks)``.

    Stops as soon as the output passes ``left`` (the count returned is then ``> left``).
    The chunks are kept while the output is at most ``keep`` bytes, else ``None``.
    """
    parts: list[bytes] | None = []
    n = 0
    rest: Any = data
    member = 0
    while True:
        d = zlib.decompressobj(wbits=31)  # gzip wrapper: header, crc32 and size are checked
        buf = rest
        try:
            while not d.eof:
                chunk = d.decompress(buf, min(left - n + 1, COUNT_STEP))  # max_length >= 1
                buf = d.unconsumed_tail
                n += len(chunk)
                if n > left:
                    return n, None
                if not chunk and not buf and not d.eof:  # input used up, no trailer
                    raise Refused(
                        f"gzip stream is truncated: member {member + 1} ends after "
                        f"{len(rest)} bytes, without its end of stream and trailer"
                    )
                if parts is not None and chunk:
                    if n > keep:
                        parts = None
                    else:
                        parts.append(chunk)
        except zlib.error as e:
            at = len(data) - len(rest)
            raise Refused(
                f"cannot inflate gzip member {member + 1} at byte {at} of {len(data)}: {e} "
                f"(starts {bytes(rest[:12])!r}; a gzip member starts b'\\x1f\\x8b')"
            ) from e
        member += 1
        rest = d.unused_data.lstrip(b"\0")  # zero padding after a member: skipped, as gzip does
        if not rest:
            return n, parts


def gunzip(data: bytes, budget: Budget) -> bytes:
    """Decompress a gzip stream (RFC 1952) within ``budget``: all its members, concatenated.

    As Python's ``gzip`` (webdataset's ``gzfilter``) and ``gunzip`` do: members follow one
    another (``cat a.gz b.gz``), zero bytes between or after them are skipped, any other
    trailing bytes are an error, each member's crc32 and size are checked; empty data is
    empty output. The output is counted while it is inflated and refused once past the
    budget, holding at most :data:`GZ_KEEP` bytes of it (a stream that inflates to more is
    counted first, then inflated again). The trailer's size field is not used to refuse
    early: it is only mod 2**32, and in a truncated or corrupt stream it is noise.

    Raises:
        Refused: Corrupt, truncated, trailing bytes that are not a member, or over the budget.
    """
    if not data:
        return b""
    n, parts = _inflate(data, budget.left, GZ_KEEP)
    what = "to at least" if n > budget.left else "to"
    budget.take(n, f"gzip stream expands {what}", False)
    if parts is None:  # more than GZ_KEEP: counted only; inflate again, keeping it all
        n, parts = _inflate(data, n, n)
    return b"".join(parts or ())


def gzip_compress(data: bytes, level: int = 6) -> bytes:
    """Gzip ``data`` into one member (RFC 1952) with mtime 0 and no file name: deterministic.

    Args:
        data: The bytes.
        level: zlib level, 0-9. Defaults to ``6``, the ``gzip`` tool's (``gzip.compress``: 9).
    """
    return gzip.compress(data, compresslevel=level, mtime=0)


# -- the layers -----------------------------------------------------------------------------

DECOMPRESSORS: Mapping[str, Callable[[bytes, Budget], bytes]] = MappingProxyType(
    {ZST_SUFFIX: unzstd, GZ_SUFFIX: gunzip}
)
"""Reader side of :data:`~tarindex.codecs.exts.COMPRESSION_SUFFIXES`: suffix -> decompressor."""
COMPRESSORS: Mapping[str, Callable[[bytes], bytes]] = MappingProxyType(
    {ZST_SUFFIX: zstd_compress, GZ_SUFFIX: gzip_compress}
)
"""Writer side of :data:`~tarindex.codecs.exts.COMPRESSION_SUFFIXES`: suffix -> compressor."""


def compression_layers(ext: str) -> tuple[str, ...]:
    """The compression suffixes ending ``ext``, outermost first.

    ``"npy.gz.zst"`` -> ``(".zst", ".gz")``; ``"json"`` -> ``()``; ``"gz"`` -> ``()`` (an
    extension that is only a suffix is not a compressed member).
    """
    if not ext.endswith(COMPRESSION_SUFFIXES):  # the common case, one C call
        return ()
    out: list[str] = []
    while True:
        for sfx in COMPRESSION_SUFFIXES:
            if ext.endswith(sfx) and len(ext) > len(sfx):
                out.append(sfx)
                ext = ext[: -len(sfx)]
                break
        else:
            return tuple(out)


def strip_compression(ext: str) -> str:
    """``ext`` without its compression suffixes: ``"meta.json.gz"`` -> ``"meta.json"``."""
    for sfx in compression_layers(ext):
        ext = ext[: -len(sfx)]
    return ext


def decoded_name(ext: str) -> str:
    """The name a decoded sample serves member ``ext`` under: its ``.zst`` layers taken off.

    ``"json.zst"`` -> ``"json"`` (FORMAT.md §7: tarindex's compressed members read the same
    as plain ones); ``"txt.gz"`` stays ``"txt.gz"`` (decompressed, under the name webdataset
    gives it); ``"npy.gz.zst"`` -> ``"npy.gz"``. See :data:`tarindex.codecs.exts.RENAMED_SUFFIXES`.
    """
    done = False
    while not done:
        done = True
        for sfx in RENAMED_SUFFIXES:
            if ext.endswith(sfx) and len(ext) > len(sfx):
                ext, done = ext[: -len(sfx)], False
    return ext


def decompress_layers(ext: str, data: bytes, budget: Budget) -> tuple[str, bytes]:
    """Take every compression layer off a member: ``(inner extension, its bytes)``.

    ``("npy.gz.zst", b)`` -> ``("npy", gunzip(unzstd(b)))``, each layer charged to ``budget``.

    Raises:
        Refused: As :func:`unzstd` and :func:`gunzip`.
        zstandard.ZstdError: As :func:`unzstd`.
    """
    for sfx in compression_layers(ext):
        data = DECOMPRESSORS[sfx](data, budget)
        ext = ext[: -len(sfx)]
    return ext, data
