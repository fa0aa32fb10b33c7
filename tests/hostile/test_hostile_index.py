"""Hostile-index corpus: one real shard, its index edited table by table, every read path.

The base is a 12-sample shard written by ``tarindex.ShardWriter``. Each variant edits the
index tables (or header) and writes a *valid* crc32 footer, so only the table checks can
object. Every read path (``ds[i]``, ``__getitems__`` plain and batched, streaming per sample,
shuffled and batched, DataLoader workers, ``verify``, the CLI) must refuse every variant with
a ``FormatError`` whose message names the ``.tidx`` path and says what is wrong. No path may
return another sample's bytes, a missing or empty member, crash, print a traceback, or
allocate more than a small multiple of the index size (FORMAT.md §2, §2.7; design.md "One
read kernel").

The corpus is encoded here, from FORMAT.md §2, not with ``tarindex.format.index``: the
hostile files must not depend on what the code under test is willing to encode.
"""

from __future__ import annotations

import re
import shutil
import struct
import traceback
import tracemalloc
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from numpy.typing import NDArray

import tarindex
import tarindex.read._kernel_py
import tarindex.read.kernel
from tarindex.cli.main import main
from tarindex.errors import FormatError, StaleIndexError
from tarindex.read.verify import verify

try:  # import torch now, not inside the first measured call (traced, it takes seconds)
    import torch.utils.data  # noqa: F401
except ImportError:  # the torch paths skip themselves
    pass

pytestmark = [
    pytest.mark.timeout(60),
    pytest.mark.filterwarnings("ignore:This DataLoader will create"),
]

N = 12  # samples in the base shard, keys s0000..s0011, members bin (700..3000 bytes) and cls
J = 3  # the sample the table edits hit (its members are M and M + 1)
M = 2 * J  # member index of sample J's "bin"
EXTRA = 4  # map paths read up to N + EXTRA indices when the header claims more samples
MEM_LIMIT = 64 << 20  # bytes: peak traced allocation per call, at least
MEM_FACTOR = 64  # ... or this many times the index file's size, whichever is larger

Sample = dict[str, Any]

# --- FORMAT.md §2, spelled out -----------------------------------------------------------------

MAGIC = b"\x89TIDX\r\n\x1a"  # §2.1
END_MAGIC = b"TIDX"  # §2.7
HEADER_FMT = "8sHHIQQQQQQQII"  # §2.1, without the byte-order prefix
HEADER_SIZE = struct.calcsize("<" + HEADER_FMT)
FOOTER_SIZE = 8  # §2.7: <I4s crc32, b"TIDX"


def _pad(n: int) -> int:
    return -n % 8


@dataclass
class Raw:
    """An index file as its fields (FORMAT.md §2), free to be made inconsistent."""

    major: int
    minor: int
    flags: int
    tar_size: int
    head_crc: int
    tail_crc: int
    sample_ptr: NDArray[np.uint64]
    offset: NDArray[np.uint64]
    size: NDArray[np.uint64]
    ext_id: NDArray[np.uint32]
    key_ptr: NDArray[np.uint64]
    key_blob: bytes
    ext_ptr: NDArray[np.uint64]
    ext_blob: bytes
    meta: bytes
    records: bytes = b""
    """The records of FORMAT.md §2.8 (v1.1: TARX, DCRC), kept as they are."""

    def copy(self) -> Raw:
        return replace(
            self,
            sample_ptr=self.sample_ptr.copy(),
            offset=self.offset.copy(),
            size=self.size.copy(),
            ext_id=self.ext_id.copy(),
            key_ptr=self.key_ptr.copy(),
            ext_ptr=self.ext_ptr.copy(),
        )


def parse(buf: bytes) -> Raw:
    """Split a valid little-endian index into its fields (header counts give the layout)."""
    (magic, major, minor, flags, ns, nm, ne, kb, eb, mb, tar_size, hc, tc) = struct.unpack_from(
        "<" + HEADER_FMT, buf
    )
    assert magic == MAGIC
    pos = HEADER_SIZE

    def take(n: int) -> bytes:
        nonlocal pos
        out = buf[pos : pos + n]
        pos += n + _pad(n)
        return out

    def u8(count: int) -> NDArray[np.uint64]:
        return np.frombuffer(take(8 * count), "<u8").astype(np.uint64)

    sample_ptr, offset, size = u8(ns + 1), u8(nm), u8(nm)
    ext_id = np.frombuffer(take(4 * nm), "<u4").astype(np.uint32)
    key_ptr, key_blob = u8(ns + 1), take(kb)
    ext_ptr, ext_blob, meta = u8(ne + 1), take(eb), take(mb)
    records = buf[pos : len(buf) - FOOTER_SIZE]
    return Raw(
        major, minor, flags, tar_size, hc, tc,
        sample_ptr, offset, size, ext_id, key_ptr, key_blob, ext_ptr, ext_blob, meta, records,
    )  # fmt: skip


def encode(r: Raw, order: str = "<", extra: int = 0, **header: int) -> bytes:
    """Encode ``r`` with a valid crc32 footer.

    Sections are laid out from the arrays as they are; ``header`` overrides header fields
    (``n_samples=...``) without moving anything, so the header may lie about the tables.
    ``order=">"`` writes every header integer and table big-endian (the footer stays ``<I``,
    so its crc32 is valid for a reader of the format). ``extra`` zero bytes go before the
    footer.
    """
    u8, u4 = np.dtype(order + "u8"), np.dtype(order + "u4")
    parts = [
        r.sample_ptr.astype(u8).tobytes(),
        r.offset.astype(u8).tobytes(),
        r.size.astype(u8).tobytes(),
        r.ext_id.astype(u4).tobytes(),
        r.key_ptr.astype(u8).tobytes(),
        r.key_blob,
        r.ext_ptr.astype(u8).tobytes(),
        r.ext_blob,
        r.meta,
    ]
    fields = {
        "major": r.major,
        "minor": r.minor,
        "flags": r.flags,
        "n_samples": len(r.sample_ptr) - 1,
        "n_members": len(r.offset),
        "n_exts": len(r.ext_ptr) - 1,
        "key_bytes": len(r.key_blob),
        "ext_bytes": len(r.ext_blob),
        "meta_bytes": len(r.meta),
        "tar_size": r.tar_size,
        "head_crc": r.head_crc,
        "tail_crc": r.tail_crc,
    }
    unknown = set(header) - set(fields)
    assert not unknown, unknown
    fields.update(header)
    out = bytearray(struct.pack(order + HEADER_FMT, MAGIC, *fields.values()))
    for p in parts:
        out += p + bytes(_pad(len(p)))
    out += r.records
    out += bytes(extra)
    out += struct.pack("<I4s", zlib.crc32(out), END_MAGIC)
    return bytes(out)


# --- the corpus --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Case:
    """One hostile index: how to make it from the base, and words its error should use."""

    id: str
    make: Callable[[Raw], bytes]
    words: tuple[str, ...]
    """The error message (paths removed) must contain at least one of these, any case."""


def _edit(section: str, i: int, value: Callable[[Raw], int] | int) -> Callable[[Raw], bytes]:
    def make(base: Raw) -> bytes:
        r = base.copy()
        getattr(r, section)[i] = value(r) if callable(value) else value
        return encode(r)

    return make


def _drop_members_of_j(base: Raw) -> bytes:
    """Sample J keeps its key but loses its members; every other entry stays right."""
    r = base.copy()
    lo, hi = int(r.sample_ptr[J]), int(r.sample_ptr[J + 1])
    keep = np.r_[0:lo, hi : len(r.offset)]
    r.offset, r.size, r.ext_id = r.offset[keep], r.size[keep], r.ext_id[keep]
    r.sample_ptr[J + 1 :] -= np.uint64(hi - lo)
    return encode(r)


def _drop_key_of_j(base: Raw) -> bytes:
    """Sample J's key becomes empty; every other key stays right."""
    r = base.copy()
    lo, hi = int(r.key_ptr[J]), int(r.key_ptr[J + 1])
    r.key_blob = r.key_blob[:lo] + r.key_blob[hi:]
    r.key_ptr[J + 1 :] -= np.uint64(hi - lo)
    return encode(r)


def _big_endian(base: Raw) -> bytes:
    return encode(base, order=">")


RANGE = ("offset", "size", "range", "past", "end of", "overflow")
ALIGN = ("offset", "512", "block", "align", "header")
OVERLAP = ("overlap", "offset", "header")
SAMPLE_PTR = ("sample_ptr", "member")
KEY = ("key_ptr", "key")
EXT = ("ext_id", "extension")
COUNT = ("n_samples", "n_members", "header", "truncated", "size", "limit")
VERSION = ("version", "endian", "byte order")

CASES = [
    # member ranges (FORMAT.md §2.3; data follows a 512-byte header on a block boundary, §1)
    Case("offset_past_tar", _edit("offset", M, lambda r: r.tar_size + 512), RANGE),
    Case("end_past_tar", _edit("size", M, lambda r: r.tar_size - int(r.offset[M]) + 1), RANGE),
    Case("size_u64_max", _edit("size", M, 2**64 - 1), RANGE),
    Case("offset_u64_max", _edit("offset", M, 2**64 - 1), RANGE),  # offset + size wraps
    Case("offset_wraps_aligned", _edit("offset", M, 2**64 - 512), RANGE),  # wraps, on a block
    Case("offset_misaligned", _edit("offset", M, lambda r: int(r.offset[M]) + 1), ALIGN),
    Case("offset_zero", _edit("offset", M, 0), ALIGN),  # data before any header
    # overlapping members: sample J's cls at its bin's offset, or 512 bytes into it
    Case("overlap_same_offset", _edit("offset", M + 1, lambda r: int(r.offset[M])), OVERLAP),
    Case("overlap_inside", _edit("offset", M + 1, lambda r: int(r.offset[M]) + 512), OVERLAP),
    # samples (§2.2)
    Case("sample_ptr_decreasing", _edit("sample_ptr", J + 1, M - 1), SAMPLE_PTR),
    Case(
        "sample_ptr_past_members",
        _edit("sample_ptr", J + 1, lambda r: len(r.offset) + 1),
        SAMPLE_PTR,
    ),
    Case("sample_no_members", _drop_members_of_j, SAMPLE_PTR),
    # keys (§2.5; an empty key cannot come from any member name, §4)
    Case("key_ptr_decreasing", _edit("key_ptr", J + 1, lambda r: int(r.key_ptr[J]) - 1), KEY),
    Case("key_ptr_past_blob", _edit("key_ptr", J + 1, lambda r: len(r.key_blob) + 1), KEY),
    Case("key_empty", _drop_key_of_j, KEY),
    # extensions (§2.4; a dict per sample cannot hold one extension twice)
    Case("ext_id_eq_n_exts", _edit("ext_id", M, lambda r: len(r.ext_ptr) - 1), EXT),
    Case("ext_id_u32_max", _edit("ext_id", M, 2**32 - 1), EXT),
    Case("ext_twice_in_sample", _edit("ext_id", M + 1, lambda r: int(r.ext_id[M])), EXT),
    # header counts (§2.1): absurd, or one more sample than the tables hold
    Case("n_samples_2e40", lambda r: encode(r, n_samples=2**40), COUNT),
    Case(
        "n_samples_2e40_members_2e42", lambda r: encode(r, n_samples=2**40, n_members=2**42), COUNT
    ),
    Case("n_samples_plus_one", lambda r: encode(r, n_samples=len(r.sample_ptr)), COUNT),
    # ... and the file grown by the 16 bytes the two longer pointer tables need
    Case(
        "n_samples_plus_one_sized",
        lambda r: encode(r, extra=16, n_samples=len(r.sample_ptr)),
        (*COUNT, "sample_ptr", "pointer"),
    ),
    # byte order and version (§2: little-endian; §2.1: refuse an unknown major)
    Case("big_endian", _big_endian, VERSION),
    Case("major_2", lambda r: encode(r, major=2), VERSION),
]
CASE_BY_ID = {c.id: c for c in CASES}
assert len(CASE_BY_ID) == len(CASES)


@dataclass(frozen=True)
class Base:
    tar: Path
    index: bytes
    raw: Raw
    expected: list[Sample]
    """Sample i as written: ``{"__key__": str, "bin": bytes, "cls": bytes}``."""


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> Base:
    tar = tmp_path_factory.mktemp("base") / "shard.tar"
    rng = np.random.default_rng(0)
    expected: list[Sample] = []
    with tarindex.ShardWriter(str(tar), mtime=0) as w:
        for i in range(N):
            n = int(rng.integers(700, 3001))
            s = {"__key__": f"s{i:04d}", "bin": rng.integers(0, 256, n, np.uint8).tobytes()}
            w.write({**s, "cls": i})
            expected.append({**s, "cls": str(i).encode()})
    index = Path(str(tar) + ".tidx").read_bytes()
    raw = parse(index)
    assert encode(raw) == index  # the corpus codec is the format's, byte for byte
    assert raw.sample_ptr.tolist() == list(range(0, 2 * N + 1, 2))  # two members per sample
    eps = raw.ext_ptr.tolist()
    assert [raw.ext_blob[a:b] for a, b in zip(eps[:-1], eps[1:], strict=True)] == [b"bin", b"cls"]
    assert raw.ext_id[M] == 0 and raw.ext_id[M + 1] == 1 and raw.size[M] > 512
    return Base(tar, index, raw, expected)


@pytest.fixture(scope="module")
def corpus(base: Base, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """``{case id: tar path}``: a copy of the base tar beside its hostile index, per case.

    Directory names are neutral (``v00``...) so no word of a case id is in the paths.
    """
    out: dict[str, Path] = {}
    for k, case in enumerate(CASES):
        tar = tmp_path_factory.mktemp(f"v{k:02d}") / "shard.tar"
        shutil.copyfile(base.tar, tar)
        data = case.make(base.raw)
        assert data != base.index and len(data) % 8 == 0
        assert zlib.crc32(data[:-FOOTER_SIZE]) == struct.unpack_from("<I", data, len(data) - 8)[0]
        Path(str(tar) + ".tidx").write_bytes(data)
        out[case.id] = tar
    return out


# --- read paths --------------------------------------------------------------------------------


@dataclass
class Outcome:
    """What one read path did: samples returned (global index, sample) and errors raised."""

    got: list[tuple[int, Sample]] = field(default_factory=list)
    errors: list[BaseException] = field(default_factory=list)
    note: str = ""
    unexpected: str = ""
    """An exception that is not a FormatError, as text (DataLoader paths only; see _consume)."""


def _torch() -> None:
    pytest.importorskip("torch")


def _batch_samples(batch: Any) -> Iterator[tuple[int, Sample]]:
    assert isinstance(batch, tarindex.torch.batch.BatchedSamples), type(batch)
    for b in range(len(batch)):
        s = batch.sample(b)
        yield int(s.get("__index__", -1)), s


def run_getitem(tar: str) -> Outcome:
    _torch()
    out = Outcome()
    try:
        ds = tarindex.TarDataset(tar)
    except FormatError as e:
        return Outcome(errors=[e])
    for i in range(min(len(ds), N + EXTRA)):
        try:
            out.got.append((i, ds[i]))
        except FormatError as e:
            out.errors.append(e)
    return out


def _getitems(tar: str, batched: bool) -> Outcome:
    _torch()
    try:
        ds = tarindex.TarDataset(tar, batched=batched)
        idx = list(range(min(len(ds), N + EXTRA)))
        got: Any = ds.__getitems__(idx)
    except FormatError as e:
        return Outcome(errors=[e])
    if batched:
        samples = [s for _, s in _batch_samples(got)]
    else:
        samples = list(got)
    assert len(samples) == len(idx), f"asked for {len(idx)} samples, got {len(samples)}"
    return Outcome(got=list(zip(idx, samples, strict=True)))


def run_getitems(tar: str) -> Outcome:
    return _getitems(tar, batched=False)


def run_getitems_batched(tar: str) -> Outcome:
    return _getitems(tar, batched=True)


def _format_error_names() -> set[str]:
    names, todo = set(), [FormatError]
    while todo:
        c = todo.pop()
        names.add(c.__name__)
        todo.extend(c.__subclasses__())
    return names


def _reraised_format_error(e: BaseException) -> bool:
    """True for torch's fallback wrapper of a worker's FormatError.

    Recent torch re-raises the worker's exception type (``FormatError(msg)``); when the type
    cannot be rebuilt from one message it raises ``RuntimeError("Caught X in DataLoader
    worker process k. Original Traceback ...")`` instead, the original message included.
    """
    m = re.match(r"Caught (\w+) in DataLoader worker", str(e))
    return isinstance(e, RuntimeError) and m is not None and m[1] in _format_error_names()


def _consume(make: Callable[[], Any], batched: bool, keep_unexpected: bool = False) -> Outcome:
    """Iterate what ``make()`` returns until it ends or raises a FormatError.

    With ``keep_unexpected`` any other exception is kept as text and dropped, so its
    traceback does not keep a DataLoader iterator (and its workers) alive past the test.
    """
    out = Outcome()
    it: Any = None
    try:
        it = iter(make())
        for item in it:
            if batched:
                out.got.extend(_batch_samples(item))
            else:
                out.got.append((int(item.get("__index__", -1)), item))
            if len(out.got) > 2 * N + EXTRA:
                out.note = f"yielded more than {2 * N + EXTRA} samples of {N}, stopped"
                break
    except Exception as e:
        if not isinstance(e, FormatError) and not keep_unexpected:
            raise
        # drop the traceback: through torch's reraise frame it forms a cycle holding the
        # DataLoader iterator, whose workers would be joined at a later gc (seconds, elsewhere)
        e.with_traceback(None)
        if isinstance(e, FormatError) or _reraised_format_error(e):
            out.errors.append(e)
        else:
            out.unexpected = "".join(traceback.format_exception_only(type(e), e))
    finally:
        it = None  # a DataLoader iterator shuts its workers down now, not at a later gc
    return out


def _iterable(tar: str, **kw: Any) -> Outcome:
    _torch()
    return _consume(lambda: tarindex.TarIterableDataset(tar, **kw), batched=bool(kw.get("batched")))


def run_iter(tar: str) -> Outcome:
    return _iterable(tar, shuffle=False)


def run_iter_shuffle(tar: str) -> Outcome:
    return _iterable(tar, shuffle=True, seed=0)


def run_iter_batched(tar: str) -> Outcome:
    return _iterable(tar, batched=True, batch_size=4, shuffle=False)


def run_verify(tar: str) -> Outcome:
    # verify's API: a report (ok is always True), or FormatError / StaleIndexError (an
    # indexed offset that is not right after a matching header, tables unlike a fresh scan)
    try:
        report = verify(tar)
    except (FormatError, StaleIndexError) as e:
        return Outcome(errors=[e])
    return Outcome(note=f"verify returned a report: {report}")


PATHS: dict[str, Callable[[str], Outcome]] = {
    "getitem": run_getitem,
    "getitems": run_getitems,
    "getitems_batched": run_getitems_batched,
    "iter": run_iter,
    "iter_shuffle": run_iter_shuffle,
    "iter_batched": run_iter_batched,
    "verify": run_verify,
}
ORDERED = {"getitem", "getitems", "getitems_batched", "iter", "iter_batched"}  # stored order


def _loader(tar: str, batched: bool) -> Outcome:
    _torch()
    from torch.utils.data import DataLoader

    def make() -> Any:
        kw: dict[str, Any] = {"batched": True, "batch_size": 4} if batched else {}
        ds = tarindex.TarIterableDataset(tar, shuffle=False, **kw)
        return DataLoader(ds, batch_size=None, num_workers=2, persistent_workers=False, timeout=60)

    return _consume(make, batched, keep_unexpected=True)


# --- checks ------------------------------------------------------------------------------------


def _norm(s: Sample) -> Sample:
    """The sample without ``__shard__``/``__index__``, bytes-like values as ``bytes``."""
    return {
        k: bytes(v) if isinstance(v, bytes | bytearray | memoryview) else v
        for k, v in s.items()
        if k not in ("__shard__", "__index__")
    }


def _show(s: Sample) -> str:
    return repr(
        {
            k: f"{len(v)} bytes crc {zlib.crc32(v):08x}" if isinstance(v, bytes) else v
            for k, v in _norm(s).items()
        }
    )


def _check_returned(got: list[tuple[int, Sample]], base: Base, what: str) -> None:
    for i, s in got:
        assert 0 <= i < N, f"{what}: returned a sample with index {i} (the shard has {N})"
        assert _norm(s) == base.expected[i], (
            f"{what}: sample {i} is {_show(s)}, it was written as {_show(base.expected[i])}"
        )


def _check_message(msg: str, case: Case, tar: Path, what: str) -> None:
    idx = str(tar) + ".tidx"
    assert idx in msg, f"{what}: the message does not name the index {idx}: {msg!r}"
    bare = msg.replace(idx, "").replace(str(tar), "").replace(str(tar.parent), "").lower()
    assert any(w.lower() in bare for w in case.words), (
        f"{what}: the message does not say what is wrong (expected one of {case.words}): {msg!r}"
    )


def _check_refused(out: Outcome, case: Case, tar: Path, base: Base, what: str) -> None:
    if out.unexpected:
        pytest.fail(f"{what}: raised, not a FormatError: {out.unexpected}")
    _check_returned(out.got, base, what)
    assert out.errors, (
        f"{what}: no FormatError; {out.note or f'returned {len(out.got)} correct samples'}"
    )
    for e in out.errors:
        _check_message(str(e), case, tar, f"{what}: {type(e).__name__}")


def _measured(fn: Callable[[], Any], index_size: int, what: str) -> Any:
    """Run ``fn()``; fail if its traced allocation peak exceeds the module's bound."""
    was = tracemalloc.is_tracing()
    if not was:
        tracemalloc.start()
    tracemalloc.reset_peak()
    try:
        result = fn()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        if not was:
            tracemalloc.stop()
    limit = max(MEM_LIMIT, MEM_FACTOR * index_size)
    assert peak <= limit, f"{what}: allocated {peak} bytes at peak (limit {limit})"
    return result


# --- tests -------------------------------------------------------------------------------------


@pytest.mark.parametrize("path", list(PATHS))
def test_intact_shard_reads_back_on_every_path(path: str, base: Base) -> None:
    """The control: the harness accepts a correct read of the unedited shard."""
    out: Outcome = _measured(lambda: PATHS[path](str(base.tar)), len(base.index), path)
    assert not out.errors, out.errors
    if path == "verify":
        assert out.note.startswith("verify returned a report"), out.note
        return
    _check_returned(out.got, base, path)
    order = [i for i, _ in out.got]
    assert (order if path in ORDERED else sorted(order)) == list(range(N)), order


@pytest.mark.parametrize("path", list(PATHS))
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_hostile_index_is_refused(
    case: Case, path: str, corpus: dict[str, Path], base: Base
) -> None:
    tar = corpus[case.id]
    size = Path(str(tar) + ".tidx").stat().st_size
    what = f"{case.id} via {path}"
    out: Outcome = _measured(lambda: PATHS[path](str(tar)), size, what)
    _check_refused(out, case, tar, base, what)


# the paths with a compiled form (tarindex/_kernel.c), run again with the Python loops
COMPILED_PATHS = ["getitem", "getitems", "getitems_batched", "iter_batched"]


@pytest.mark.skipif(
    tarindex.read.kernel.compiled is None,
    reason=f"needs the compiled loops: {tarindex.read.kernel.read_kernel()}",
)
@pytest.mark.parametrize("path", COMPILED_PATHS)
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_hostile_index_is_refused_by_the_python_loops(
    case: Case, path: str, corpus: dict[str, Path], base: Base, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As above, as a machine without the compiled loops reads (TARINDEX_PURE_PYTHON=1)."""
    monkeypatch.setattr(tarindex.read.kernel, "kernel", tarindex.read._kernel_py)
    tar = corpus[case.id]
    size = Path(str(tar) + ".tidx").stat().st_size
    what = f"{case.id} via {path} (Python loops)"
    out: Outcome = _measured(lambda: PATHS[path](str(tar)), size, what)
    _check_refused(out, case, tar, base, what)


CLI: dict[str, Callable[[str], list[str]]] = {
    "info": lambda tar: ["info", tar],
    "ls": lambda tar: ["ls", tar],
    "cat": lambda tar: ["cat", tar, f"s{J:04d}", "bin"],
}


def test_intact_shard_cli(base: Base, capsysbinary: pytest.CaptureFixture[bytes]) -> None:
    for cmd, argv in CLI.items():
        assert main(argv(str(base.tar))) == 0, cmd
        out, err = capsysbinary.readouterr()
        assert err == b"", (cmd, err)
        if cmd == "cat":
            assert out == base.expected[J]["bin"]


@pytest.mark.parametrize("cmd", list(CLI))
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_hostile_index_cli(
    case: Case,
    cmd: str,
    corpus: dict[str, Path],
    capsysbinary: pytest.CaptureFixture[bytes],
) -> None:
    """Exit code 1, one line on stderr naming the index and the problem, no traceback."""
    tar = corpus[case.id]
    size = Path(str(tar) + ".tidx").stat().st_size
    what = f"{case.id} via tarindex {cmd}"
    code = _measured(lambda: main(CLI[cmd](str(tar))), size, what)
    out, err_b = capsysbinary.readouterr()
    err = err_b.decode("utf-8", "replace")
    assert "Traceback" not in err, f"{what}: {err}"
    assert code == 1, f"{what}: exit code {code}, stderr {err!r}"
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1, f"{what}: expected one line on stderr: {err!r}"
    _check_message(lines[0], case, tar, what)
    if cmd == "cat":
        assert out == b"", f"{what}: wrote {len(out)} bytes to stdout before failing"


LOADER_CASES = ["end_past_tar", "sample_ptr_past_members", "ext_twice_in_sample"]


@pytest.mark.timeout(180)
@pytest.mark.parametrize("batched", [False, True], ids=["samples", "batches"])
@pytest.mark.parametrize("case_id", LOADER_CASES)
def test_hostile_index_through_dataloader_workers(
    case_id: str, batched: bool, corpus: dict[str, Path], base: Base
) -> None:
    """A worker's FormatError reaches the main process (torch re-raises its type)."""
    case, tar = CASE_BY_ID[case_id], corpus[case_id]
    what = f"{case_id} via DataLoader(num_workers=2, {'batched' if batched else 'samples'})"
    out = _loader(str(tar), batched)
    _check_refused(out, case, tar, base, what)


@pytest.mark.timeout(180)
@pytest.mark.parametrize("batched", [False, True], ids=["samples", "batches"])
def test_intact_shard_through_dataloader_workers(batched: bool, base: Base) -> None:
    out = _loader(str(base.tar), batched)
    assert not out.errors, out.errors
    _check_returned(out.got, base, "intact via DataLoader")
    assert sorted(i for i, _ in out.got) == list(range(N))
