"""Hostile inputs: crafted indexes, files swapped under the reader, odd writer input, odd sources.

The rule for indexes: the cheap checks at open (the ShardReader default) never lead to a
crash, a hang, a short or wrong member returned silently, or a non-tarindex exception from
``sample(j)`` / ``ShardSet.sample(i)``; ``full_check=True`` catches every inconsistency up front.
Filesystem problems surface as the usual ``OSError`` subclasses.
"""

from __future__ import annotations

import errno
import glob
import json
import os
import shutil
import struct
import subprocess
import sys
import tarfile
import textwrap
import tracemalloc
import unicodedata
import zlib
from pathlib import Path
from typing import Literal, TypedDict, cast

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tarindex
from tarindex.errors import (
    FormatError,
    SampleIndexError,
    StaleIndexError,
    TarIndexError,
    TruncatedError,
    WriterError,
)
from tarindex.format.index import IndexTables, decode_index, encode_index, layout, read_header
from tarindex.format.keys import served_ext
from tarindex.format.spec import FOOTER, HEADER, MAX_BLOB_BYTES, MAX_MEMBERS, MAX_SAMPLES
from tarindex.read.sources import MAX_EXPANSION, expand_braces, expand_source

GOLDEN = Path(__file__).parents[1] / "golden" / "v1"
GOLDEN_IDX = (GOLDEN / "tiny.tar.tidx").read_bytes()
GOLDEN_T = decode_index(GOLDEN_IDX)
FAST = settings(
    max_examples=int(os.environ.get("HOSTILE_EXAMPLES", 60)),
    deadline=None,
    suppress_health_check=list(HealthCheck),
)
# typed as the Literal hypothesis's stub wants (a bare ("Cs",) is inferred as tuple[str])
NO_SURROGATES: tuple[Literal["Cs"]] = ("Cs",)


class _ReaderOptions(TypedDict, total=False):
    full_check: bool


def _golden(tmp: Path) -> tuple[Path, Path]:
    for f in ("tiny.tar", "tiny.tar.tidx"):
        shutil.copy(GOLDEN / f, tmp / f)
    return tmp / "tiny.tar", tmp / "tiny.tar.tidx"


def _refooter(buf: bytearray) -> bytes:
    """Recompute the crc32 footer so only the structural checks can object."""
    struct.pack_into("<I", buf, len(buf) - FOOTER.size, zlib.crc32(bytes(buf[: -FOOTER.size])))
    return bytes(buf)


def _tables(**kw: object) -> bytes:
    base = {**GOLDEN_T.__dict__, "key_blob": bytes(GOLDEN_T.key_blob)}
    base.update(kw)
    return encode_index(IndexTables(**base))


def _expected() -> list[dict[str, object]]:
    with tarindex.ShardReader(str(GOLDEN / "tiny.tar")) as r:
        return [r.sample(j) for j in range(r.n_samples)]


EXPECTED = _expected()


def _assert_names_file_offset_fix(e: BaseException, path: Path) -> None:
    msg = str(e)
    assert str(path) in msg, msg
    assert "byte" in msg or "sample" in msg, msg
    assert "tarindex" in msg, msg  # the command that fixes it


def _read_all_checked(tar: Path, **kw: object) -> None:
    """Open and read every sample; only TarIndexError may come out, never a short member."""
    try:
        r = tarindex.ShardReader(str(tar), **kw)  # type: ignore[arg-type]
    except TarIndexError:
        return
    with r:
        t = r.index
        for j in range(r.n_samples):
            try:
                s = r.sample(j)
            except TarIndexError:
                continue
            lo, hi = r.member_slice(j)
            assert len(s) == hi - lo + 1
            for m in range(lo, hi):
                assert len(s[r.exts[int(t.ext_id[m])]]) == int(t.size[m])  # never short


# --- header: allocation bombs, overflow, limits ----------------------------------------------

HUGE = [
    ("n_samples", 16, MAX_SAMPLES),
    ("n_samples", 16, MAX_SAMPLES + 1),
    ("n_samples", 16, 2**64 - 1),
    ("n_members", 24, MAX_MEMBERS),
    ("n_members", 24, 2**64 - 1),
    ("n_exts", 32, 2**63),
    ("key_bytes", 40, MAX_BLOB_BYTES),
    ("ext_bytes", 48, 2**64 - 1),
    ("meta_bytes", 56, 2**62),
]


@pytest.mark.timeout(20)
@pytest.mark.parametrize("field,off,value", HUGE)
def test_huge_header_counts_fail_fast_without_allocating(
    tmp_path: Path, field: str, off: int, value: int
) -> None:
    tar, idx = _golden(tmp_path)
    buf = bytearray(GOLDEN_IDX)
    struct.pack_into("<Q", buf, off, value)
    idx.write_bytes(buf)
    tracemalloc.start()
    try:
        options: tuple[_ReaderOptions, ...] = ({}, {"full_check": True})
        for kw in options:
            with pytest.raises(FormatError) as e:
                tarindex.ShardReader(str(tar), **kw)
            _assert_names_file_offset_fix(e.value, idx)
        with pytest.raises(FormatError):
            decode_index(bytes(buf), full_check=True)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 16 << 20, f"{field}={value}: peak {peak} bytes"
    # ShardSet reads only the header: it either refuses or counts; get() never misbehaves
    try:
        ss = tarindex.ShardSet(str(tar))
    except FormatError:
        return
    with pytest.raises(TarIndexError):
        ss.sample(0)


@FAST
@given(
    counts=st.lists(st.integers(0, 2**64 - 1) | st.integers(0, 64), min_size=6, max_size=6),
    body=st.integers(0, 4096),
    fill=st.sampled_from([0, 0xFF, 0x41]),
)
def test_random_header_counts_only_raise_tarindex_errors(
    tmp_path_factory: pytest.TempPathFactory, counts: list[int], body: int, fill: int
) -> None:
    tmp = tmp_path_factory.mktemp("h")
    tar, idx = _golden(tmp)
    buf = bytearray(GOLDEN_IDX[: HEADER.size]) + bytes([fill]) * body
    struct.pack_into("<6Q", buf, 16, *counts)
    if len(buf) >= HEADER.size + FOOTER.size:
        buf[-4:] = b"TIDX"
    idx.write_bytes(buf)
    _read_all_checked(tar)
    _read_all_checked(tar, full_check=True, use_mmap=False)


def test_zero_samples_reads_cleanly(tmp_path: Path) -> None:
    p = tmp_path / "empty.tar"
    tarindex.write.tar.TarShardWriter(str(p), mtime=0).close()
    with tarindex.ShardReader(str(p), full_check=True) as r:
        assert r.n_samples == 0
        for j in (0, -1, 1):
            with pytest.raises(SampleIndexError):
                r.sample(j)
            with pytest.raises(SampleIndexError):
                r.key(j)
    with tarfile.open(p) as tf:
        assert tf.getnames() == []
    ss = tarindex.ShardSet(str(p))
    assert len(ss) == 0
    with pytest.raises(SampleIndexError):
        ss.sample(0)


# --- tables: pointers, ids, ranges ----------------------------------------------------------


def _mut(name: str, i: int, v: int) -> dict[str, object]:
    a = np.array(getattr(GOLDEN_T, name))
    a[i] = v
    return {name: a}


CORRUPT_TABLES = {
    "sample_ptr backwards": _mut("sample_ptr", 1, 7),
    "sample_ptr past members": _mut("sample_ptr", 1, 10**6),
    "sample_ptr 2^64-1": _mut("sample_ptr", 3, 2**64 - 1),
    "key_ptr backwards": _mut("key_ptr", 1, 9),
    "key_ptr past blob": _mut("key_ptr", 2, 10**9),
    "ext_id out of range": _mut("ext_id", 0, 3),
    "ext_id u32 max": _mut("ext_id", 15, 2**32 - 1),
    "ext repeated in sample": _mut("ext_id", 1, 0),
    "offset+size overflows u64": _mut("size", 0, 2**64 - 1),
    "offset max": _mut("offset", 4, 2**64 - 1),
    "member past tar end": _mut("size", 2, 20480),
}


IN_BOUNDS = {"key_ptr backwards"}  # key_ptr[1] = 9: sample 0 reads key bytes 0..9


@pytest.mark.parametrize("use_mmap", [True, False])
@pytest.mark.parametrize("case", list(CORRUPT_TABLES))
def test_corrupt_tables_never_misread(tmp_path: Path, case: str, use_mmap: bool) -> None:
    tar, idx = _golden(tmp_path)
    idx.write_bytes(_tables(**CORRUPT_TABLES[case]))
    caught = 0
    try:  # the open re-reads a few member headers: their samples' tables are checked then
        r = tarindex.ShardReader(str(tar), use_mmap=use_mmap)
    except FormatError as err:
        assert not isinstance(err, IndexError)
        _assert_names_file_offset_fix(err, idx)
        caught, r = 1, None
    if r is not None:
        with r:
            for j in range(r.n_samples):
                try:
                    s = r.sample(j)
                except FormatError as err:  # TruncatedError included; never IndexError & co
                    assert not isinstance(err, IndexError)
                    _assert_names_file_offset_fix(err, idx)  # a table fault names the index
                    caught += 1
                    continue
                # a pointer moved within bounds and still non-decreasing where the O(1) check
                # looks is indistinguishable from a valid one; only full_check (below) sees it
                assert s == EXPECTED[j] or case in IN_BOUNDS, f"sample {j} silently differs"
    assert caught, "the corruption was never noticed"
    ss = tarindex.ShardSet(str(tar), options=tarindex.OpenOptions(use_mmap=use_mmap))
    with pytest.raises(FormatError):
        for i in range(len(ss)):
            ss.sample(i)
    with pytest.raises(FormatError) as e:
        tarindex.ShardReader(str(tar), full_check=True)
    _assert_names_file_offset_fix(e.value, idx)


@pytest.mark.parametrize(
    "exts,match",
    [
        ([b"txt", b"txt", b"bin"], "repeats extension"),
        ([b"txt", b"", b"bin"], "empty"),
        ([b"__key__", b"cls", b"bin"], "reserved"),
        ([b"txt", b"__shard__", b"bin"], "reserved"),
    ],
)
def test_bad_extension_table_refused_at_open(tmp_path: Path, exts: list[bytes], match: str) -> None:
    """A repeated name or '__key__' would make the sample dict drop a member silently."""
    tar, idx = _golden(tmp_path)
    idx.write_bytes(_tables(exts=exts))
    with pytest.raises(FormatError, match=match) as e:
        tarindex.ShardReader(str(tar))
    _assert_names_file_offset_fix(e.value, idx)


def test_ext_ptr_backwards_refused_at_open(tmp_path: Path) -> None:
    tar, idx = _golden(tmp_path)
    buf = bytearray(_tables())
    start, _ = layout(read_header(memoryview(buf)))["ext_ptr"]
    struct.pack_into("<Q", buf, start + 8, 5)  # ext_ptr = [0, 5, 6, 9]: "txtcl", "s", "bin"
    idx.write_bytes(_refooter(buf))
    struct.pack_into("<Q", buf, start + 8, 7)  # [0, 7, 6, 9]: goes backwards
    idx.write_bytes(_refooter(buf))
    with pytest.raises(FormatError, match="ext_ptr"):
        tarindex.ShardReader(str(tar))


@pytest.mark.parametrize(
    "meta", [b"not json", b"\xff\xfe", b"[" * 100_000, b"[1, 2]", b'"str"', b"null", b"{"]
)
def test_metadata_not_a_json_object(tmp_path: Path, meta: bytes) -> None:
    tar, idx = _golden(tmp_path)
    h = read_header(GOLDEN_IDX)
    lay = layout(h)
    start, _ = lay["meta"]
    buf = bytearray(GOLDEN_IDX[:start]) + meta
    buf += bytes(-len(buf) % 8) + bytes(FOOTER.size)
    struct.pack_into("<Q", buf, 56, len(meta))
    buf[-4:] = b"TIDX"
    idx.write_bytes(_refooter(buf))
    with pytest.raises(FormatError, match="metadata") as e:
        tarindex.ShardReader(str(tar))
    _assert_names_file_offset_fix(e.value, idx)


@FAST
@given(
    pos=st.integers(HEADER.size, len(GOLDEN_IDX) - FOOTER.size - 1),
    value=st.integers(0, 2**64 - 1) | st.integers(0, 40),
    width=st.sampled_from([1, 4, 8]),
)
def test_any_table_mutation_caught_by_read_or_full_check(
    tmp_path_factory: pytest.TempPathFactory, pos: int, value: int, width: int
) -> None:
    """Mutate any bytes of the tables, fix the crc: never a non-tarindex error or a short member;
    what full_check lets through reads without error; what a read refuses, full_check refused."""
    tmp = tmp_path_factory.mktemp("m")
    tar, idx = _golden(tmp)
    buf = bytearray(GOLDEN_IDX)
    end = len(buf) - FOOTER.size
    pos = min(pos, end - width)
    buf[pos : pos + width] = (value % (1 << (8 * width))).to_bytes(width, "little")
    idx.write_bytes(_refooter(buf))
    for use_mmap in (True, False):
        _read_all_checked(tar, use_mmap=use_mmap)
    try:
        r = tarindex.ShardReader(str(tar), full_check=True)
    except (FormatError, StaleIndexError):  # a size moved: the re-read header disagrees
        return
    with r:
        for j in range(r.n_samples):
            r.sample(j)  # raises if full_check missed an inconsistency


# --- files: stale, missing, swapped, unreadable -------------------------------------------------


def test_index_of_a_different_tar_is_stale(tmp_path: Path) -> None:
    tar, _ = _golden(tmp_path)
    other = tmp_path / "other.tar"
    with tarindex.ShardWriter(str(other), mtime=0) as w:
        for i in range(6):
            w.write({"__key__": f"s{i:03d}", "txt": "x" * 1500})
    assert other.stat().st_size == tar.stat().st_size  # same size: only the crc tells them apart
    shutil.copy(other.with_name("other.tar.tidx"), tar.with_name("tiny.tar.tidx"))
    with pytest.raises(StaleIndexError, match=r"bytes 0\.\.4096 differ.*tarindex index --force"):
        tarindex.ShardReader(str(tar))
    ss = tarindex.ShardSet(str(tar))  # header only
    with pytest.raises(StaleIndexError):
        ss.sample(0)


def test_index_rebuilt_under_a_shardset_is_stale(tmp_path: Path) -> None:
    tar, idx = _golden(tmp_path)
    ss = tarindex.ShardSet(str(tar))
    n = len(ss)
    t = GOLDEN_T  # the same tar, a valid index that leaves out the last sample
    idx.write_bytes(
        _tables(
            sample_ptr=np.array(t.sample_ptr)[:-1].copy(),
            offset=np.array(t.offset)[:15].copy(),
            size=np.array(t.size)[:15].copy(),
            ext_id=np.array(t.ext_id)[:15].copy(),
            key_ptr=np.array(t.key_ptr)[:-1].copy(),
            key_blob=bytes(t.key_blob)[:20],
        )
    )
    tarindex.ShardReader(str(tar), full_check=True).close()
    with pytest.raises(StaleIndexError, match="ShardSet"):
        ss.sample(n - 1)


@pytest.mark.timeout(10)
def test_index_path_is_a_fifo_does_not_hang(tmp_path: Path) -> None:
    tar, idx = _golden(tmp_path)
    os.unlink(idx)
    os.mkfifo(idx)
    with pytest.raises(FormatError, match="not a regular file"):
        tarindex.ShardReader(str(tar))
    with pytest.raises(FormatError, match="not a regular file"):
        tarindex.ShardSet(str(tar))
    os.unlink(idx)
    shutil.copy(GOLDEN / "tiny.tar.tidx", idx)
    os.unlink(tar)
    os.mkfifo(tar)
    with pytest.raises(FormatError, match="not a regular file"):
        tarindex.ShardReader(str(tar))


def test_index_path_is_a_directory_or_symlink_loop(tmp_path: Path) -> None:
    tar, idx = _golden(tmp_path)
    os.unlink(idx)
    idx.mkdir()
    for call in (lambda: tarindex.ShardReader(str(tar)), lambda: tarindex.ShardSet(str(tar))):
        with pytest.raises(IsADirectoryError):
            call()
    idx.rmdir()
    os.symlink(idx, idx)  # ELOOP
    with pytest.raises(OSError) as e:
        tarindex.ShardReader(str(tar))
    assert e.value.errno == errno.ELOOP
    os.unlink(idx)
    os.symlink(tmp_path / "nowhere", idx)  # dangling: the index is missing
    with pytest.raises(tarindex.errors.IndexMissingError, match="tarindex index"):
        tarindex.ShardReader(str(tar))
    os.unlink(idx)
    shutil.copy(GOLDEN / "tiny.tar.tidx", idx)
    os.unlink(tar)
    tar.mkdir()
    with pytest.raises(IsADirectoryError):
        tarindex.ShardReader(str(tar))


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads mode-000 files")
def test_unreadable_index(tmp_path: Path) -> None:
    tar, idx = _golden(tmp_path)
    idx.chmod(0)
    with pytest.raises(PermissionError):
        tarindex.ShardReader(str(tar))


def test_truncated_index_every_byte_names_file_offset_and_fix(tmp_path: Path) -> None:
    tar, idx = _golden(tmp_path)
    for cut in range(len(GOLDEN_IDX)):
        idx.write_bytes(GOLDEN_IDX[:cut])
        with pytest.raises(FormatError) as e:
            tarindex.ShardReader(str(tar))
        _assert_names_file_offset_fix(e.value, idx)
        if cut < HEADER.size:
            with pytest.raises(FormatError):
                tarindex.ShardSet(str(tar))


def test_tar_cut_while_open_without_mmap(tmp_path: Path) -> None:
    tar, _ = _golden(tmp_path)
    r = tarindex.ShardReader(str(tar), use_mmap=False)
    assert r.sample(0) == EXPECTED[0]
    os.truncate(tar, 1024)
    # the pread path's fstat sees the cut before the read comes up short (issue 19 item 8)
    with pytest.raises(
        TruncatedError, match=rf"{tar}: byte \d+: the tar was cut to \d+ bytes while open.*index"
    ):
        r.sample(4)
    r.close()


_CHILD = textwrap.dedent(
    """
    import os, sys, tarindex
    tar = sys.argv[1]
    ss = tarindex.ShardSet(tar)
    r = ss.reader(0)
    os.truncate(tar, 1024)
    for read in (lambda: r.sample(4), lambda: r.read_block(0, 5), lambda: ss.gather([1, 4])):
        try:
            read()
        except Exception as e:
            print("raised", type(e).__name__, e)
        else:
            print("returned")
    """
)


@pytest.mark.timeout(60)
def test_tar_cut_while_mmapped_in_a_child(tmp_path: Path) -> None:
    """With mmap, touching pages past the new end of a cut file is SIGBUS: every read checks
    the mapping's size first, so a cut shard raises TruncatedError naming it instead. Run it in
    a child so a SIGBUS could not kill pytest."""
    tar, _ = _golden(tmp_path)
    p = subprocess.run(
        [sys.executable, "-c", _CHILD, str(tar)], capture_output=True, text=True, timeout=50
    )
    assert p.returncode == 0, p  # not -7 (SIGBUS)
    lines = p.stdout.splitlines()
    assert len(lines) == 3 and all(
        ln.startswith(f"raised TruncatedError {tar}: byte 1024: the tar was cut") for ln in lines
    ), p.stdout


# --- writer ------------------------------------------------------------------------------------

ROUNDTRIP_KEYS = [
    "a\nb",
    "tab\there",
    "k" * 300,
    "k" * 101,
    "d" * 150 + "/" + "k" * 90,
    "a" * 97 + "€€",
    "a" * 98 + "€€",
    "a" * 99 + "€€",
    "p" * 155 + "/" + "n" * 96,
    unicodedata.normalize("NFD", "é"),
    unicodedata.normalize("NFC", "é"),
    "a/./b",
    "a//b",
    "k ",
    "a\\b",
    "dir.v1/x",
    "\u202eevil",
    "🙂" * 60,
    "x" * 40 + "/" + "y" * 40 + "/" + "z" * 200,
]


@pytest.mark.parametrize("key", ROUNDTRIP_KEYS)
def test_odd_keys_roundtrip_through_tarfile_and_reader(tmp_path: Path, key: str) -> None:
    p = tmp_path / "s-%02d.tar"
    samples = [
        {"__key__": key, "txt": b"data", "a..b": b"", "e" * 150: b"x"},
        {"__key__": "next", "txt": b"n"},
    ]
    with tarindex.ShardWriter(str(p), maxcount=1, mtime=0) as w:
        for s in samples:
            w.write(s)
    for k, s in enumerate(samples):
        shard = tmp_path / f"s-{k:02d}.tar"
        with tarindex.ShardReader(str(shard), full_check=True) as r:
            assert r.sample(0) == {k2: v for k2, v in s.items()}
        with tarfile.open(shard) as tf:
            got = {m.name: tf.extractfile(m).read() for m in tf}  # type: ignore[union-attr]
        assert got == {f"{s['__key__']}.{e}": v for e, v in s.items() if e != "__key__"}
    assert sorted(os.listdir(tmp_path)) == [
        "s-00.tar",
        "s-00.tar.tidx",
        "s-01.tar",
        "s-01.tar.tidx",
    ]


REFUSED = [
    ({"__key__": "a\0b", "txt": b""}, "NUL"),
    ({"__key__": "../x", "txt": b""}, r"'\.\.'"),
    ({"__key__": "a/../../etc/passwd", "txt": b""}, r"'\.\.'"),
    ({"__key__": "/abs", "txt": b""}, "starts with"),
    ({"__key__": "./rel", "txt": b""}, "starts with"),
    ({"__key__": "a.b", "txt": b""}, "dot"),
    ({"__key__": "..", "txt": b""}, "dot"),
    ({"__key__": "", "txt": b""}, "empty"),
    ({"__key__": "d/", "txt": b""}, "ends with"),
    ({"__key__": "\udcff", "txt": b""}, "UTF-8"),
    ({"__key__": "k", "t\udcffx": b""}, "UTF-8"),
    ({"__key__": "k", "png/../x": b""}, "invalid extension"),
    ({"__key__": "k", "a\0": b""}, "invalid extension"),
    ({"__key__": "k", ".png": b""}, "invalid extension"),
    ({"__key__": "k", "png.": b""}, "invalid extension"),
    ({"__key__": "k", "": b""}, "invalid extension"),
    ({"__key__": "k", 5: b""}, "not a str"),
    ({"__key__": "k", "txt": None}, "cannot encode"),
    ({"__key__": "k", "txt": 1.5}, "cannot encode"),
    ({"__key__": "k", "txt": True}, "bool"),
    ({"__key__": "k", "txt": object()}, "cannot encode"),
    ({"__key__": "k", "txt": np.zeros(3)}, "npy"),
    ({"__key__": "k", "npy": np.array([object()])}, "object"),
    ({"__key__": "k", "json": {"a": {1, 2}}}, "JSON|serializable"),
    ({"__key__": "k", "cls": 10**5000}, "digits|int"),
    ({"__key__": "k", "__only": b"x"}, "no members"),
    ({"__key__": 7, "txt": b""}, "str '__key__'"),
    ({"txt": b""}, "str '__key__'"),
]


def _deep(n: int) -> list[object]:
    out: list[object] = []
    for _ in range(n):
        out = [out]
    return out


REFUSED.append(({"__key__": "k", "json": _deep(100_000)}, "Recursion"))


@pytest.mark.parametrize("sample,match", REFUSED, ids=[str(i) for i in range(len(REFUSED))])
@pytest.mark.parametrize("first", [False, True])
def test_writer_refuses_before_writing(
    tmp_path: Path, sample: dict[object, object], match: str, first: bool
) -> None:
    """Refused with WriterError; nothing of the sample reaches the tar; no temp file left,
    whether the bad sample comes first (no shard open yet) or after a good one."""
    w = tarindex.ShardWriter(str(tmp_path / "x.tar"), mtime=0)
    if not first:
        w.write({"__key__": "good", "txt": b"ok"})
    with pytest.raises(WriterError, match=match):
        w.write(sample)  # type: ignore[arg-type]
    if first:
        assert os.listdir(tmp_path) == []  # refused before any file was created
    w.write({"__key__": "after", "txt": b"ok2"})
    w.close()
    assert sorted(os.listdir(tmp_path)) == ["x.tar", "x.tar.tidx"]
    with tarindex.ShardReader(str(tmp_path / "x.tar"), full_check=True) as r:
        keys = [r.sample(j)["__key__"] for j in range(r.n_samples)]
    assert keys == ["after"] if first else ["good", "after"]
    with tarfile.open(tmp_path / "x.tar") as tf:
        assert len(tf.getnames()) == len(keys)


def test_writer_refusal_inside_with_leaves_no_temp(tmp_path: Path) -> None:
    with pytest.raises(WriterError):
        with tarindex.ShardWriter(str(tmp_path / "x-%d.tar"), mtime=0) as w:
            w.write({"__key__": "a", "txt": b"1"})
            w.write({"__key__": "a", "txt": b"2"})  # repeated key
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("mtime", [-1, 8**11, 2**40, 2**64])
def test_writer_refuses_mtime_that_does_not_fit_ustar(tmp_path: Path, mtime: int) -> None:
    """8**11 used to make a 513-byte header: tarfile then read garbage and lost members."""
    for make in (
        lambda: tarindex.ShardWriter(str(tmp_path / "x.tar"), mtime=mtime),
        lambda: tarindex.write.tar.TarShardWriter(str(tmp_path / "y.tar"), mtime=mtime),
    ):
        with pytest.raises(WriterError, match="mtime"):
            make()
    assert os.listdir(tmp_path) == []


def test_writer_largest_mtime_roundtrips(tmp_path: Path) -> None:
    p = tmp_path / "x.tar"
    with tarindex.ShardWriter(str(p), mtime=8**11 - 1) as w:
        w.write({"__key__": "a", "txt": b"1"})
        w.write({"__key__": "b", "txt": b"2"})
    with tarfile.open(p) as tf:
        assert [(m.name, m.mtime, tf.extractfile(m).read()) for m in tf] == [  # type: ignore[union-attr]
            ("a.txt", 8**11 - 1, b"1"),
            ("b.txt", 8**11 - 1, b"2"),
        ]


@pytest.mark.parametrize(
    "kw",
    [
        {"maxcount": 0},
        {"maxcount": -5},
        {"maxsize": 0},
        {"maxsize": float("nan")},
        {"maxsize": float("inf")},
        {"maxcount": float("nan")},
        {"maxcount": None},
        {"maxcount": "10"},
    ],
)
def test_writer_refuses_bad_limits(tmp_path: Path, kw: dict[str, object]) -> None:
    with pytest.raises(WriterError):
        tarindex.ShardWriter(str(tmp_path / "x-%d.tar"), **kw)  # type: ignore[arg-type]
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize(
    "pattern", ["x-%d%d.tar", "100%.tar", "x-%(n)d.tar", "x-%.0s.tar", "x-%z.tar"]
)
def test_writer_refuses_bad_pattern_up_front(tmp_path: Path, pattern: str) -> None:
    with pytest.raises(WriterError, match="pattern"):
        tarindex.ShardWriter(str(tmp_path / pattern), maxcount=1)
    assert os.listdir(tmp_path) == []


def test_pattern_without_field_needing_two_shards(tmp_path: Path) -> None:
    w = tarindex.ShardWriter(str(tmp_path / "one.tar"), maxcount=1, mtime=0)
    w.write({"__key__": "a", "txt": b"1"})
    with pytest.raises(WriterError, match="no %d field"):
        w.write({"__key__": "b", "txt": b"2"})
    w.close()
    assert sorted(os.listdir(tmp_path)) == ["one.tar", "one.tar.tidx"]  # first shard complete
    with tarindex.ShardReader(str(tmp_path / "one.tar"), full_check=True) as r:
        assert r.n_samples == 1 and r.sample(0) == {"__key__": "a", "txt": b"1"}
    # start_shard != 0 with a plain path is one shard too
    with tarindex.ShardWriter(str(tmp_path / "two.tar"), start_shard=5) as w:
        w.write({"__key__": "a", "txt": b"1"})
    assert (tmp_path / "two.tar.tidx").exists()


@FAST
@given(
    keys=st.lists(
        st.text(st.characters(blacklist_categories=NO_SURROGATES), min_size=1, max_size=120),
        min_size=1,
        max_size=4,
    ),
    ext=st.text(st.characters(blacklist_categories=NO_SURROGATES), min_size=1, max_size=20),
)
def test_property_any_key_roundtrips_or_is_refused(
    tmp_path_factory: pytest.TempPathFactory, keys: list[str], ext: str
) -> None:
    d = tmp_path_factory.mktemp("w")
    w = tarindex.ShardWriter(str(d / "x.tar"), mtime=0)
    written = []
    for k in keys:
        try:
            w.write({"__key__": k, ext: k.encode()})
        except WriterError:
            continue
        written.append(k)
    w.close()
    if not written:
        assert os.listdir(d) == []
        return
    with tarindex.ShardReader(str(d / "x.tar"), full_check=True) as r:
        got = [r.sample(j) for j in range(r.n_samples)]
    assert not ext.startswith("_")  # '_' entries are not written (webdataset's keep_meta)
    exp_ext = served_ext(ext)  # read back lower-cased, as webdataset (FORMAT.md §4 rule 4)
    assert [s["__key__"] for s in got] == written
    assert all(s[exp_ext] == s["__key__"].encode() for s in got)
    with tarfile.open(d / "x.tar") as tf:
        assert tf.getnames() == [f"{k}.{ext}" for k in written]


# --- sources -----------------------------------------------------------------------------------


@pytest.mark.timeout(10)
@pytest.mark.parametrize(
    "pattern",
    [
        "s-{0..100000000}.tar",
        "s-{100000000..0}.tar",
        "{0..999}{0..999}{0..999}",
        "{0..9999999999999999999999999}",
        "{-5000000..5000000}",
    ],
)
def test_huge_brace_range_is_refused_fast(pattern: str) -> None:
    tracemalloc.start()
    try:
        with pytest.raises(ValueError, match="more than|integers"):
            expand_braces(pattern)
        with pytest.raises(ValueError):
            expand_source(pattern)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 8 << 20


def test_brace_edge_cases() -> None:
    assert expand_braces("s-{03..1}.tar") == ["s-03.tar", "s-02.tar", "s-01.tar"]  # reversed
    assert expand_braces("{-1..1}") == ["-1", "0", "1"]
    assert expand_braces("x{}y") == ["xy"]
    assert len(expand_braces("{1..100}{1..100}", limit=10_000)) == 10_000
    assert expand_braces("{a,b}{1..2}", limit=4) == ["a1", "a2", "b1", "b2"]
    for pattern in ("{1..100}{1..101}", "{a,b,c}{1..2}{x,y}", "{a,{0..5}}{1..2}"):
        with pytest.raises(ValueError, match="more than"):
            expand_braces(pattern, limit=10 if "a," in pattern else 10_000)
    assert MAX_EXPANSION >= 100_000  # large real datasets still fit
    for bad in ("{1_0..2}", "{ 1..2}", "{a..b}", "{1..}", "{\u0663..5}"):
        with pytest.raises(ValueError, match="integers"):
            expand_braces(bad)


def test_sources_that_match_nothing(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="glob"):
        expand_source(str(tmp_path / "*.tar"))
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "x.txt").write_text("")
    with pytest.raises(FileNotFoundError, match="no \\*.tar"):
        expand_source(str(tmp_path / "d"))
    with pytest.raises(FileNotFoundError):
        expand_source([])
    with pytest.raises(FileNotFoundError, match="not found"):
        expand_source(str(tmp_path / "s-{0..2}.tar"))
    with pytest.raises(TypeError, match="bytes"):
        expand_source(os.fsencode(tmp_path / "x.tar"))  # type: ignore[arg-type]
    with pytest.raises(FileNotFoundError):
        tarindex.ShardSet(str(tmp_path / "none-*.tar"))


def test_shardset_index_types(tmp_path: Path) -> None:
    tar, _ = _golden(tmp_path)
    ss = tarindex.ShardSet(str(tar))
    assert ss.sample(cast(int, np.int64(2)))["__key__"] == "s002"  # numpy ints are accepted too
    assert ss.sample(-1)["__key__"] == EXPECTED[-1]["__key__"]
    for bad in (1.5, "1", None):
        with pytest.raises(TypeError):
            ss.sample(bad)  # type: ignore[arg-type]
    for bad_i in (len(ss), -len(ss) - 1, 2**70):
        with pytest.raises(SampleIndexError):
            ss.sample(bad_i)
    with tarindex.ShardReader(str(tar)) as r:
        for j in (-1, 6, 2**70):
            for f in (r.sample, r.key, r.member_slice):
                with pytest.raises(SampleIndexError):
                    f(j)


def test_meta_roundtrip_does_not_leak_into_reader(tmp_path: Path) -> None:
    """Extra metadata keys (a newer minor version) are ignored."""
    tar, idx = _golden(tmp_path)
    meta = {**GOLDEN_T.meta, "future": {"x": [1, 2]}}
    idx.write_bytes(_tables(meta=meta))
    with tarindex.ShardReader(str(tar), full_check=True) as r:
        assert r.index.meta == meta and r.sample(0) == EXPECTED[0]
    assert json.loads(json.dumps(meta)) == meta
    assert glob.glob(str(tmp_path / "*.tmp")) == []


# --- codecs ------------------------------------------------------------------------------------


def test_zstd_bombs_are_refused() -> None:
    zstandard = pytest.importorskip("zstandard")
    from tarindex.codecs import decode_value, encode_value

    assert decode_value("txt.zst", encode_value("txt.zst", "hi")) == "hi"
    assert decode_value("bin.zst", zstandard.ZstdCompressor().compress(b"")) == b""
    # a 40-byte frame whose header claims 15 GiB: used to be allocated up front
    frame = zstandard.ZstdCompressor(write_content_size=True).compress(b"x" * 300)
    fhd = frame[4]
    body = frame[
        4 + 1 + (0 if fhd & 0x20 else 1) + {0: 1 if fhd & 0x20 else 0, 1: 2, 2: 4, 3: 8}[fhd >> 6] :
    ]
    liar = frame[:4] + bytes([0xC0, 0x58]) + struct.pack("<Q", 15 << 30) + body
    assert zstandard.frame_content_size(liar) == 15 << 30
    with pytest.raises(ValueError, match="ZSTD_MAX_OUTPUT"):
        decode_value("bin.zst", liar)
    # a real bomb without a declared size stops at the cap
    cobj = zstandard.ZstdCompressor(write_content_size=False).compressobj()
    bomb = cobj.compress(bytes(4 << 20)) + cobj.flush()
    import tarindex.codecs.decode as codecs

    old = codecs.ZSTD_MAX_OUTPUT
    codecs.ZSTD_MAX_OUTPUT = 1 << 20
    try:
        with pytest.raises(zstandard.ZstdError):
            decode_value("bin.zst", bomb)
    finally:
        codecs.ZSTD_MAX_OUTPUT = old
    with pytest.raises(zstandard.ZstdError):
        decode_value("bin.zst", b"\x28\xb5\x2f\xfd")
