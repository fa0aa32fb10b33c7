"""The compiled read-kernel loops (tarindex/read/_kernel.c) against the Python loops they replace.

Every read path that has a compiled form is run twice on the same shards, once with the
extension and once with ``tarindex.read.kernel.compiled`` set to ``None`` (what a machine without a
C compiler, or ``TARINDEX_PURE_PYTHON=1``, runs), and must return the same samples, the same
batches and the same errors. The shards are varied on purpose: GNU tar's member order,
samples with members missing, non-ASCII keys, integer fields in every spelling ``int()``
takes and some it does not.
"""

from __future__ import annotations

import importlib.util
import io
import os
import struct
import subprocess
import sys
import tarfile
import zlib
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import tarindex
from tarindex.read import _kernel_py
from tarindex.read import kernel as kernel_mod
from tarindex.read.hot import HandBack
from tests.conftest import MakeShards, have

torch = pytest.importorskip("torch")
from tarindex.torch.collate import fetch_batched, pack_blocks  # noqa: E402

pytestmark = pytest.mark.timeout(240)
COMPILED = kernel_mod.compiled


def _both(make: Callable[[], Any], monkeypatch: pytest.MonkeyPatch) -> tuple[Any, Any]:
    """``make()`` with the compiled loops, then again with their twin ``_kernel_py``."""
    assert kernel_mod.compiled is not None and kernel_mod.kernel is kernel_mod.compiled
    compiled = make()
    with monkeypatch.context() as m:
        m.setattr(kernel_mod, "kernel", _kernel_py)
        python = make()
    return compiled, python


def _outcome(fn: Callable[[], Any]) -> Any:
    try:
        return ("ok", fn())
    except Exception as e:  # the error is part of the result compared
        return ("error", type(e).__name__, str(e))


needs_ext = pytest.mark.skipif(
    COMPILED is None, reason=f"no compiled loops to compare: {kernel_mod.read_kernel()}"
)


def test_the_extension_is_built() -> None:
    """CI installs with a C compiler: a silent build failure must not hide the compiled path."""
    if os.environ.get("TARINDEX_PURE_PYTHON", "") not in ("", "0"):
        pytest.skip("TARINDEX_PURE_PYTHON is set: the Python loops are asked for")
    assert COMPILED is not None, (
        "tarindex.read._kernel did not import: install a C compiler and reinstall "
        "(pip install -e .), or set TARINDEX_PURE_PYTHON=1 to run the Python loops"
    )


def test_pure_python_env_selects_the_python_loops(make_shards: MakeShards) -> None:
    paths = make_shards([30])
    code = (
        "import sys, tarindex, tarindex.read.kernel as k\n"
        f"ds = tarindex.TarDataset({paths!r})\n"
        "s = ds[3]\n"
        "print(k.compiled is None, k.kernel.__name__, type(ds.shards.reader(0).hot.tables)"
        ".__module__, s['__key__'])\n"
    )
    env = dict(os.environ, TARINDEX_PURE_PYTHON="1")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    twin = "tarindex.read._kernel_py"
    assert out.stdout.split() == ["True", twin, twin, "00000003"]


@pytest.mark.parametrize("pure", [False, True])
def test_read_kernel_and_version_say_which_loops_run(pure: bool) -> None:
    """``tarindex.read_kernel()`` and ``tarindex --version`` name the loops in use, and why."""
    env = {k: v for k, v in os.environ.items() if k != "TARINDEX_PURE_PYTHON"}
    if pure:
        env["TARINDEX_PURE_PYTHON"] = "1"
    code = "import tarindex; print(tarindex.read_kernel())"
    got = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    ver = subprocess.run(
        [sys.executable, "-m", "tarindex", "--version"], env=env, capture_output=True, text=True
    )
    assert got.returncode == 0 and ver.returncode == 0, got.stderr + ver.stderr
    want = "python (TARINDEX_PURE_PYTHON is set)" if pure else "compiled"
    if not pure and importlib.util.find_spec("tarindex.read._kernel") is None:
        want = "python (the extension tarindex.read._kernel is not built"
    assert got.stdout.startswith(want), got.stdout
    assert ver.stdout.startswith(f"tarindex {tarindex.__version__} (read kernel: {want}"), (
        ver.stdout
    )


# --- varied shards --------------------------------------------------------------------------

CLS_TEXT = [b"7", b" 12\n", b"+3", b"-0", b"007", b"\t42 ", b"-5", b"123456789012345678"]


def _odd_shards(tmp: Path) -> list[str]:
    """Three shards: the writer's (varied members), GNU tar's, and tarfile's (odd labels)."""
    rng = np.random.default_rng(5)
    a = tmp / "a.tar"
    with tarindex.ShardWriter(str(a), maxcount=10_000, mtime=0) as w:
        for i in range(300):
            s: dict[str, Any] = {"__key__": f"k{i:04d}" if i % 7 else f"ключ-{i}"}
            if i % 5 != 1:
                s["bin"] = rng.integers(0, 256, int(rng.integers(0, 4000)), np.uint8).tobytes()
            if i % 3:
                s["cls"] = CLS_TEXT[i % len(CLS_TEXT)]
            if i % 4 == 0:
                s["json"] = b'{"i": %d}' % i
            if len(s) == 1:
                s["txt"] = b"alone"
            w.write(s)
    b = tmp / "b.tar"
    src = tmp / "src"
    src.mkdir()
    names = []
    for i in range(40):
        (src / f"g{i:03d}.txt").write_bytes(b"gnu %d" % i)
        (src / f"g{i:03d}.cls").write_bytes(b"%d\n" % (i % 9))
        names += [f"g{i:03d}.txt", f"g{i:03d}.cls"]
    if have("tar"):
        subprocess.run(["tar", "--format=gnu", "-cf", str(b), "-C", str(src), *names], check=True)
    else:  # still a third-party tar: tarfile
        with tarfile.open(b, "w", format=tarfile.GNU_FORMAT) as t:
            for nm in names:
                t.add(src / nm, arcname=nm)
    tarindex.build_index(str(b))
    c = tmp / "c.tar"
    with tarfile.open(c, "w", format=tarfile.PAX_FORMAT) as t:
        for i in range(20):
            for ext, data in (("cls", b"%d" % i), ("bin", bytes([i]) * (i * 100))):
                info = tarfile.TarInfo(f"dir/t{i:02d}.{ext}")
                info.size = len(data)
                t.addfile(info, io.BytesIO(data))
    tarindex.build_index(str(c))
    return [str(a), str(b), str(c)]


def _items(s: dict[str, Any]) -> list[tuple[str, Any]]:
    return [(k, bytes(v) if isinstance(v, bytes | memoryview) else v) for k, v in s.items()]


@needs_ext
@pytest.mark.parametrize("fields", [None, ("cls",), ["bin", "json"], ("nope",)])
def test_getitem_agrees(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fields: Any) -> None:
    paths = _odd_shards(tmp_path)

    def read() -> list[Any]:
        ds = tarindex.TarDataset(paths, fields=fields)
        out = [_items(ds[i]) for i in range(len(ds))] + [_items(ds[-1])]
        out.append(_outcome(lambda: ds[len(ds)]))
        out.append(_outcome(lambda: ds[1.5]))
        return out

    compiled, python = _both(read, monkeypatch)
    assert compiled == python
    assert compiled[-2][:2] == ("error", "SampleIndexError")
    assert compiled[-1][:2] == ("error", "TypeError")


def _batch_view(b: Any) -> Any:
    return (
        list(b.keys),
        list(b.fields),
        b.int_fields,
        bytes(b.data.numpy()),
        [b.offsets(f).tolist() for f in b.fields],
        [b.present(f).tolist() for f in b.fields],
        [b.ints(f).tolist() for f in b.int_fields],
        b.index.tolist(),
        list(b.shards),
        b.data.dtype,
    )


@needs_ext
@pytest.mark.parametrize("fields", [None, ("cls", "txt"), ("bin",)])
def test_batched_getitems_agree(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fields: Any
) -> None:
    paths = _odd_shards(tmp_path)
    n = 360
    rng = np.random.default_rng(0)
    batches: list[Any] = [rng.integers(0, n, 64).tolist() for _ in range(6)]
    batches.append([3, 3, 3, -1, -360])  # repeats and negatives
    batches.append(np.arange(310, 330))  # numpy indices, across two shards
    batches.append([np.int64(5), 7])

    def read() -> list[Any]:
        ds = tarindex.TarDataset(paths, batched=True, fields=fields)
        assert len(ds) == n
        out = [_batch_view(ds.__getitems__(bt)) for bt in batches]
        out.append(_outcome(lambda: ds.__getitems__([0, n])))
        out.append(_outcome(lambda: ds.__getitems__([0, 1.5])))
        return out

    compiled, python = _both(read, monkeypatch)
    assert compiled == python
    assert compiled[-2][:2] == ("error", "SampleIndexError")
    assert compiled[-1][:2] == ("error", "TypeError")


@needs_ext
def test_compiled_batch_is_what_gather_and_pack_give(tmp_path: Path) -> None:
    """In one process: gather_packed (compiled) against gather + pack_blocks (any loops)."""
    paths = _odd_shards(tmp_path)
    ss = tarindex.ShardSet(paths)
    rng = np.random.default_rng(1)
    for _ in range(5):
        idx = rng.integers(0, len(ss), 50).tolist()
        got = fetch_batched(ss, idx)
        want = pack_blocks([(ss.gather(idx), None)])
        assert _batch_view(got) == _batch_view(want)


@needs_ext
def test_streaming_batches_agree(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    paths = _odd_shards(tmp_path)

    def read() -> list[Any]:
        ds = tarindex.TarIterableDataset(paths, shuffle=True, seed=3, batched=True, batch_size=16)
        return [_batch_view(b) for b in ds]

    compiled, python = _both(read, monkeypatch)
    assert compiled == python


@needs_ext
@pytest.mark.parametrize("shuffle", [False, True])
@pytest.mark.parametrize("fields", [None, ("cls", "txt")])
def test_streaming_samples_agree(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, shuffle: bool, fields: Any
) -> None:
    """Per-sample streaming (``Takes.read_samples``), also of a split view, both ways."""
    paths = _odd_shards(tmp_path)

    def read() -> list[Any]:
        ds = tarindex.TarIterableDataset(paths, shuffle=shuffle, seed=3, fields=fields)
        parts = tarindex.split_by_key(paths, {"train": 0.7, "val": 0.3}, seed=1)
        view = tarindex.TarIterableDataset(
            paths, shuffle=shuffle, seed=3, fields=fields, subset=parts["train"]
        )
        return [[_items(x) for x in ds], [_items(x) for x in view]]

    compiled, python = _both(read, monkeypatch)
    assert compiled == python
    assert len(compiled[0]) == 360 and 0 < len(compiled[1]) < 360


def _label_shard(tmp: Path, label: bytes) -> str:
    p = tmp / f"lab-{len(label)}.tar"
    with tarindex.ShardWriter(str(p), maxcount=100, mtime=0) as w:
        for i in range(10):
            w.write({"__key__": f"s{i}", "bin": b"x" * i, "cls": label if i == 6 else b"1"})
    return str(p)


@needs_ext
@pytest.mark.parametrize(
    "label", [b"abc", b"1_000", b"99999999999999999999", b"", b"-1", b"1.5", b"\xff"]
)
def test_integer_members_parse_as_int_does(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, label: bytes
) -> None:
    """The compiled parser takes plain decimals and hands everything else to ``int()``."""
    path = _label_shard(tmp_path, label)

    def read() -> Any:
        ds = tarindex.TarDataset(path, batched=True)
        stream = tarindex.TarIterableDataset(path, batched=True, batch_size=10)
        return (
            _outcome(lambda: _batch_view(ds.__getitems__(list(range(10))))),
            _outcome(lambda: [_batch_view(b) for b in stream]),
        )

    compiled, python = _both(read, monkeypatch)
    assert compiled == python
    try:
        ok = -(2**63) <= int(label) < 2**63
    except ValueError:
        ok = False
    for kind, *rest in compiled:
        if ok:
            assert kind == "ok", rest
            views = rest[0] if isinstance(rest[0], list) else [rest[0]]
            keys, (labels,) = views[0][0], views[0][6]  # the cls column
            assert {k: v for k, v in zip(keys, labels, strict=True)} == {
                f"s{i}": int(label) if i == 6 else 1 for i in range(10)
            }
        else:
            assert kind == "error" and rest[0] == "FormatError", rest
            assert "s6.cls" in rest[1] and "int_fields=()" in rest[1], rest[1]


# --- guards and lifetimes -------------------------------------------------------------------


@needs_ext
def test_corrupt_chunk_is_refused_by_the_compiled_paths(
    make_shards: MakeShards, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A table the chunk check refuses gives the same FormatError on every compiled path."""
    (path,) = make_shards([50])
    idx = Path(path + ".tidx")
    blob = bytearray(idx.read_bytes())
    r = tarindex.ShardReader(path)
    off = r.index.sections["offset"][0]
    r.close()
    blob[off + 8 * 20 : off + 8 * 21] = (2**62).to_bytes(8, "little")  # member 20 past the tar
    body = bytes(blob[:-8])  # FORMAT.md §2.7: a valid crc32 footer, so only the guards see it
    idx.write_bytes(body + struct.pack("<I4s", zlib.crc32(body), b"TIDX"))

    def read() -> Any:
        out = []
        for batched in (False, True):
            ds = tarindex.TarDataset(path, batched=batched)
            out.append(_outcome(partial(ds.__getitems__, list(range(50)))))
            out.append(_outcome(partial(ds.__getitem__, 10)))
        stream = tarindex.TarIterableDataset(path, shuffle=False)
        out.append(_outcome(lambda: list(stream)))
        return out

    compiled, python = _both(read, monkeypatch)
    assert compiled == python
    for o in compiled:
        assert o[0] == "error" and o[1] in ("FormatError", "StaleIndexError") or o[0] == "ok"
    assert any(o[0] == "error" and str(idx) in o[2] for o in compiled)


@needs_ext
def test_close_releases_the_mappings(make_shards: MakeShards) -> None:
    (path,) = make_shards([20])
    r = tarindex.ShardReader(path)
    assert r.hot.tables is not None
    mm, imm = r._mm, r._imm
    assert mm is not None and imm is not None
    r.close()
    assert r.hot.tables is None
    assert imm.closed  # close() closes the index mapping: no buffer of it is left held
    # nothing of the reader holds the tar's Mapped (its mapping and descriptor) any more:
    # only this function's name and getrefcount's argument
    assert sys.getrefcount(mm) == 2


@needs_ext
def test_a_reader_closed_while_a_batch_is_packed_stays_readable(make_shards: MakeShards) -> None:
    """``alloc`` runs Python code: closing every reader there must not free what is copied."""
    paths = make_shards([40, 40])
    ss = tarindex.ShardSet(paths)
    want = pack_blocks([(ss.gather(list(range(80))), None)])
    ss.close()

    def alloc(nbytes: int) -> tuple[Any, Any]:
        ss.close()  # every Tables of the batch loses its reader now
        import gc

        gc.collect()
        t = torch.empty(nbytes, dtype=torch.uint8)
        return t, t.numpy()

    got = ss.takes().gather_packed(list(range(80)), None, ("cls",), alloc)
    assert got is not None
    assert bytes(got[0].numpy()) == bytes(want.data.numpy())
    assert got[1] == want.keys


class _Collides:
    """Hashes as the extension ``cls`` does; comparing it runs Python code that raises."""

    def __hash__(self) -> int:
        return hash("cls")

    def __eq__(self, other: object) -> bool:
        raise ZeroDivisionError("compared")


def _get_items(ss: tarindex.ShardSet, i: int, fields: Any) -> list[tuple[str, Any]]:
    return sorted(ss.sample(i, fields).items())


@needs_ext
@pytest.mark.parametrize(
    "fields",
    [
        frozenset({"cls"}),
        frozenset(),
        frozenset({"bin", "nope"}),
        ("cls",),
        ["bin"],
        frozenset({_Collides()}),
    ],
    ids=["frozenset", "empty", "unknown", "tuple", "list", "collides"],
)
def test_sample_with_fields_agrees(
    make_shards: MakeShards, monkeypatch: pytest.MonkeyPatch, fields: Any
) -> None:
    """``ShardSet.sample(i, fields)``: the compiled sample (a frozenset) and the Python path agree,
    for every kind of ``fields`` (others are handed back) and a comparison that raises.

    (A bare string, ``fields="bin"``, is left out: the Python loops read it as a collection of
    extensions and a mapped reader's flags as a set of letters, before and after this change;
    issue 19, item 18.)"""
    paths = make_shards([30, 30])

    def read() -> list[Any]:
        ss = tarindex.ShardSet(paths)
        out = [_outcome(partial(_get_items, ss, i, fields)) for i in (0, 31, -1, 59)]
        ss.close()
        return out

    compiled, python = _both(read, monkeypatch)
    assert compiled == python
    if isinstance(fields, frozenset) and fields and not isinstance(next(iter(fields)), str):
        assert all(o[:2] == ("error", "ZeroDivisionError") for o in compiled)
    else:
        assert all(o[0] == "ok" for o in compiled)


def test_the_compiled_loops_read_hot_tables_where_they_expect() -> None:
    """``_kernel.c`` reads a reader's ``hot`` by position (HOT_MM, HOT_SIZE, HOT_TABLES)."""
    from tarindex.read.hot import HotTables

    fields = HotTables._fields
    assert (len(fields), fields.index("mm"), fields.index("tar_size")) == (16, 9, 10)
    assert fields.index("tables") == 15


class _Reader:
    """What the kernel reads of a reader: its public ``hot``."""

    def __init__(self, hot: Any) -> None:
        self.hot = hot


def _kernel_views(mod: Any, ss: tarindex.ShardSet) -> tuple[tuple[Any, ...], dict[int, Any]]:
    """``mod.Tables`` of every shard of ``ss`` (all chunks checked) and readers holding them."""
    tabs, readers = [], {}
    for s in range(ss.n_shards):
        r = ss.reader(s)
        for c in range(len(r.hot.checked)):
            r.check_chunk(c)
        h, t = r.hot, r.index
        kb = h.key_base
        tab = mod.Tables(t.key_ptr, t.sample_ptr, h.keys, kb, kb + len(t.key_blob), t.ext_id,
                         t.offset, t.size, h.mm, h.exts, h.checked)  # fmt: skip
        tabs.append(tab)
        readers[s] = _Reader(h._replace(tables=tab))
    return tuple(tabs), readers


@needs_ext
def test_each_compiled_function_is_its_twins(tmp_path: Path) -> None:
    """Every function of ``_kernel`` called directly beside ``_kernel_py``'s: same inputs, same
    results, hand-backs and errors (over varied real shards, good and bad arguments)."""
    ss = tarindex.ShardSet(_odd_shards(tmp_path))
    starts = np.asarray(ss.starts, np.int64)
    sb, per, paths, n = starts.tobytes(), 0, list(ss.paths), len(ss)
    rng = np.random.default_rng(1)
    idx = [int(i) for i in rng.integers(-n, n, 200)] + [n, -n - 1, 2**70]
    slot = rng.integers(0, ss.n_shards, 100).astype(np.int64)
    local = np.array([rng.integers(0, ss.reader(int(s)).n_samples) for s in slot], np.int64)
    results: list[list[Any]] = []
    mods: tuple[Any, ...] = (COMPILED, _kernel_py)
    for mod in mods:
        tabs, rd = _kernel_views(mod, ss)
        out: list[Any] = []
        for s, t in enumerate(tabs):
            m = ss.reader(s).n_samples
            for want in (None, b"\x01" * 8, b"\x00\x01" * 4, b""):
                out += [_outcome(partial(t.samples, j, j + 1, want, "p", j)) for j in range(-1, m + 1)]
                out.append(_outcome(partial(t.samples, 0, m, want, "p", 5)))
            out.append(_outcome(partial(t.samples, 1, m + 1, None, "p", 0)))
        out += [_outcome(partial(mod.sample, i, sb, per, rd, paths)) for i in idx]
        fs = frozenset({"cls"})
        out += [_outcome(partial(mod.sample, i, sb, per, rd, paths, fs)) for i in idx]
        out.append(_outcome(partial(mod.sample, 3, sb, per, {}, paths)))
        out.append(_outcome(partial(mod.sample, 3, sb, 7, rd, paths)))
        out.append(_outcome(partial(mod.take, idx[:50], sb, per, rd, paths)))
        out.append(_outcome(partial(mod.take, idx, sb, per, rd, paths)))
        shards = tuple(range(len(tabs)))
        out.append(_outcome(partial(mod.gather, tabs, shards, slot, local)))
        out.append(_outcome(partial(mod.gather, tabs, shards, slot, local + 1000)))
        for fields, ints in ((None, ()), (None, ("cls",)), (frozenset({"cls", "txt"}), ("cls",))):
            for bi in (idx[:64], [i for i in idx[:64] if i % 3], [0.5], [], list(range(n))):
                got = _outcome(
                    partial(
                        mod.batch,
                        bi,
                        starts,
                        per,
                        rd,
                        paths,
                        fields,
                        ints,
                        lambda k: (None, bytearray(k)),
                    )  # fmt: skip
                )
                out.append([bytes(v) if isinstance(v, bytearray) else v for v in got[1]]
                           if got[0] == "ok" and not isinstance(got[1], HandBack)
                           else got)  # fmt: skip
        data = (b" 12\n+3 -0 x7 99999999999999999999 5", bytes(range(256)))
        src = np.array([0, 0, 0, 0, 0, 1, 1, 0], np.int64)
        off = np.array([0, 4, 7, 10, 13, 0, 250, 34], np.int64)
        size = np.array([4, 2, 3, 2, 20, 10, 10, 1], np.int64)
        dest = np.array([-1, -1, -1, -1, -1, 0, 10, -1], np.int64)
        for start in (0, 3, 4, 5, 6):
            buf, vals = bytearray(16), np.zeros(8, np.int64)
            got = _outcome(partial(mod.pack, buf, data, src, off, size, dest, vals, start))
            out.append((got, bytes(buf), vals.tolist()))
        results.append(out)
    assert len(results[0]) > 1800
    assert results[0] == results[1]
