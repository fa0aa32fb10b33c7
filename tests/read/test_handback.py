"""The kernel's one hand-back type: both kernels hand back the same HandBack, one helper acts on it.

Every entry point of the read kernel (``_kernel.c`` and its twin ``_kernel_py``) returns its
result or a :class:`tarindex.read.hot.HandBack` (``why``, ``shard``, ``chunk``, ``at``), the
one class defined in Python (the compiled module builds instances of it); callers give it to
:meth:`tarindex.read.pool.ReaderPool.settle`. Here: the same situations over real shards give
the identical HandBack from both kernels (a shard to open, a chunk to check, the Python path,
the position a batch or a copy stopped at), ``settle`` does what each asks, and ``mypy
--strict`` sees the type where callers use it.
"""

from __future__ import annotations

import ast
import inspect
import textwrap
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import pytest

import tarindex
from tarindex.read import _kernel_py
from tarindex.read import kernel as kernel_mod
from tarindex.read.checks import CHUNK_SHIFT
from tarindex.read.hot import HandBack
from tarindex.read.options import OpenOptions
from tarindex.read.pool import ReaderPool
from tarindex.storage.remote import RemoteOptions
from tests.conftest import MakeShards

pytestmark = pytest.mark.timeout(240)

MODULES: list[Any] = [
    pytest.param(
        "_kernel",
        marks=pytest.mark.skipif(
            kernel_mod.compiled is None, reason=f"not built: {kernel_mod.read_kernel()}"
        ),
    ),
    "_kernel_py",
]
SIZES = [1500, 1200]  # shard 0: chunks 0 (samples 0..1023) and 1; shard 1 from global 1500


def _module(name: str) -> ModuleType:
    mod = kernel_mod.compiled if name == "_kernel" else _kernel_py
    assert mod is not None
    return mod


class _Reader:
    """What the kernel reads of a reader: its public ``hot``."""

    def __init__(self, hot: Any) -> None:
        self.hot = hot


def _views(
    mod: ModuleType, ss: tarindex.ShardSet, checked: dict[int, set[int]]
) -> tuple[tuple[Any, ...], dict[int, _Reader]]:
    """``mod.Tables`` of every shard of ``ss`` (its tables sound: every chunk passed the
    guard) with only the chunks ``checked[s]`` flagged, and readers holding them."""
    tabs, readers = [], {}
    for s in range(ss.n_shards):
        r = ss.reader(s)
        for c in range(len(r.hot.checked)):
            r.check_chunk(c)
        h, t = r.hot, r.index
        flags = bytearray(len(h.checked))
        for c in checked.get(s, ()):
            flags[c] = 1
        kb = h.key_base
        tab = mod.Tables(t.key_ptr, t.sample_ptr, h.keys, kb, kb + len(t.key_blob), t.ext_id,
                         t.offset, t.size, h.mm, h.exts, flags)  # fmt: skip
        tabs.append(tab)
        readers[s] = _Reader(h._replace(tables=tab))
    return tuple(tabs), readers


def _alloc(n: int) -> tuple[Any, bytearray]:
    b = bytearray(n)
    return None, b


def _situations(mod: ModuleType, ss: tarindex.ShardSet) -> dict[str, Any]:
    """Each situation's hand-back (or a result's type name) from kernel module ``mod``."""
    sb = np.asarray(ss.starts, np.int64)
    st, paths = sb.tobytes(), list(ss.paths)
    all_checked = {0: {0, 1}, 1: {0, 1}}
    tabs, full = _views(mod, ss, all_checked)
    _, first = _views(mod, ss, {0: {0}, 1: set()})  # shard 0 chunk 1 and shard 1 unchecked
    out: dict[str, Any] = {
        "sample: not open": mod.sample(1600, st, 0, {0: full[0]}, paths),
        "sample: chunk unchecked": mod.sample(1100, st, 0, first, paths),
        "sample: chunk unchecked, fields": mod.sample(
            1600, st, 0, first, paths, frozenset({"cls"})
        ),
        "sample: out of range": mod.sample(len(ss), st, 0, full, paths),
        "sample: not an int": mod.sample(1.0, st, 0, full, paths),
        "sample: fields not a frozenset": mod.sample(3, st, 0, full, paths, ["cls"]),
        "sample: not mapped": mod.sample(
            3, st, 0, {0: _Reader(full[0].hot._replace(tables=None))}, paths
        ),
        "sample: read": type(mod.sample(1600, st, 0, full, paths)).__name__,
        "take: not open": mod.take([0, 5, 1600], st, 0, {0: full[0]}, paths),
        "take: chunk unchecked": mod.take([0, 5, 1100, 1600], st, 0, first, paths),
        "take: out of range": mod.take([0, 1, -len(ss) - 1], st, 0, full, paths),
        "take: read": type(mod.take([0, 1600], st, 0, full, paths)).__name__,
        "batch: not open": mod.batch([0, 1, 1600], sb, 0, {0: full[0]}, paths, None, (), _alloc),
        "batch: chunk unchecked": mod.batch([0, 1600], sb, 0, first, paths, None, (), _alloc),
        "batch: not an int": mod.batch([0, 1, 2.5], sb, 0, full, paths, None, (), _alloc),
        "batch: int member not decimal": mod.batch(
            [0, 1], sb, 0, full, paths, None, ("txt",), _alloc
        ),
        "batch: read": type(mod.batch([0, 1600], sb, 0, full, paths, None, (), _alloc)).__name__,
    }
    ftabs, _ = _views(mod, ss, {0: {0}, 1: {0, 1}})
    slot, local = np.array([1, 0, 0, 1], np.int64), np.array([3, 5, 1100, 4], np.int64)
    out["gather: chunk unchecked"] = mod.gather(ftabs, (7, 9), slot, local)
    out["gather: stop position"] = mod.gather(tabs, (7, 9), slot, local + np.array([0, 0, 0, 5000]))
    out["gather: read"] = type(mod.gather(tabs, (7, 9), slot, local)).__name__
    data = (b"12 34 x5 56",)
    vals = np.zeros(3, np.int64)
    src, off, size = np.zeros(3, np.int64), np.array([0, 3, 6], np.int64), np.full(3, 2, np.int64)
    out["pack: stop position"] = mod.pack(
        bytearray(0), data, src, off, size, np.full(3, -1, np.int64), vals, 0
    )
    two = (src[:2], off[:2], size[:2], np.full(2, -1, np.int64), vals[:2])
    out["pack: done"] = mod.pack(bytearray(0), data, *two, 0)
    out["Tables.samples: read"] = type(tabs[0].samples(1000, 1030, None, "p", 0)).__name__
    out["Tables.samples: unchecked"] = ftabs[0].samples(1000, 1030, None, "p", 0)
    return out


EXPECTED = {
    "sample: not open": HandBack("open", 1, -1, 0),
    "sample: chunk unchecked": HandBack("check", 0, 1100 >> CHUNK_SHIFT, 0),
    "sample: chunk unchecked, fields": HandBack("check", 1, 0, 0),
    "sample: out of range": HandBack("python", -1, -1, 0),
    "sample: not an int": HandBack("python", -1, -1, 0),
    "sample: fields not a frozenset": HandBack("python", -1, -1, 0),
    "sample: not mapped": HandBack("python", -1, -1, 0),
    "sample: read": "dict",
    "take: not open": HandBack("open", 1, -1, 2),
    "take: chunk unchecked": HandBack("check", 0, 1, 2),
    "take: out of range": HandBack("python", -1, -1, 2),
    "take: read": "list",
    "batch: not open": HandBack("open", 1, -1, 2),
    "batch: chunk unchecked": HandBack("check", 1, 0, 1),
    "batch: not an int": HandBack("python", -1, -1, 2),
    "batch: int member not decimal": HandBack("python", -1, -1, 0),
    "batch: read": "tuple",
    "gather: chunk unchecked": HandBack("check", 7, 1, 2),  # shards[slot]: the shard it names
    "gather: stop position": HandBack("python", -1, -1, 3),
    "gather: read": "tuple",
    "pack: stop position": HandBack("python", -1, -1, 2),
    "pack: done": None,
    "Tables.samples: read": "list",
    "Tables.samples: unchecked": HandBack("python", -1, -1, 24),
}


@pytest.mark.parametrize("name", MODULES)
def test_each_situation_hands_back_one_value(make_shards: MakeShards, name: str) -> None:
    """The expected HandBack in each situation, of the one class (the compiled module's
    are instances of ``tarindex.read.hot.HandBack`` too, never a copy of it)."""
    ss = tarindex.ShardSet(make_shards(SIZES))
    got = _situations(_module(name), ss)
    assert got == EXPECTED
    assert all(type(v) is HandBack for v in got.values() if isinstance(v, tuple))
    ss.close()


@pytest.mark.skipif(kernel_mod.compiled is None, reason="one kernel only")
def test_both_kernels_hand_back_the_identical_value(make_shards: MakeShards) -> None:
    ss = tarindex.ShardSet(make_shards(SIZES))
    compiled, twin = (_situations(_module(n), ss) for n in ("_kernel", "_kernel_py"))
    assert list(compiled.items()) == list(twin.items())
    assert [type(v) for v in compiled.values()] == [type(v) for v in twin.values()]


def test_settle_does_what_each_hand_back_asks(make_shards: MakeShards) -> None:
    """``ReaderPool.settle``: opens within the bound, checks a chunk once, never decides
    ``"python"``; a call then runs the loop again (``True``) or takes the Python path."""
    paths = make_shards(SIZES)
    pool = ReaderPool(
        paths, [p + ".tidx" for p in paths], SIZES, None, OpenOptions(max_open=1), RemoteOptions()
    )
    assert pool.settle(HandBack("open", 1, -1, 0)) is True
    assert list(pool.readers) == [1]
    assert pool.settle(HandBack("open", 0, -1, 3)) is False  # full: a batch may need shard 1
    assert list(pool.readers) == [1]
    r = pool.readers[1]
    assert not r.hot.checked[1]
    assert pool.settle(HandBack("check", 1, 1, 0)) is True
    assert r.hot.checked[1]
    assert pool.settle(HandBack("check", 1, 1, 0)) is False  # checked: another reason
    assert pool.settle(HandBack("python", -1, -1, 0)) is False
    other = ReaderPool(
        paths, [p + ".tidx" for p in paths], SIZES, None, OpenOptions(), RemoteOptions()
    )
    r0 = other.reader(0)
    assert pool.settle(HandBack("check", 0, 1, 0), {0: r0}) is True  # the call's own reader
    assert r0.hot.checked[1] and 0 not in pool.readers
    pool.close()
    other.close()


def test_every_reader_of_a_hand_back_reads_it_by_name(make_shards: MakeShards) -> None:
    """Through the public API a hand-back is settled and the read goes on in the kernel:
    a shard opened and its chunks checked on first use, the samples as the Python path's."""
    paths = make_shards(SIZES)
    ss = tarindex.ShardSet(paths)
    plain = tarindex.ShardSet(paths, options=OpenOptions(use_mmap=False))  # "python" each time
    for i in (1600, 1100, -1, 0):
        assert ss.sample(i) == plain.sample(i)
    assert ss.sample(5, ("cls",)) == plain.sample(5, ("cls",))
    assert ss.takes().take([0, 1100, 1600, 2699]) == plain.takes().take([0, 1100, 1600, 2699])
    ss.close()
    plain.close()


SNIPPET = """
from typing import Any
import numpy as np
from tarindex.read import kernel
from tarindex.read.hot import HandBack

K = kernel.kernel
a = np.zeros(1, np.int64)
def alloc(n: int) -> tuple[Any, bytearray]:
    return None, bytearray(n)
reveal_type(K.sample(0, b"", 0, {}, []))
reveal_type(K.take([0], b"", 0, {}, []))
reveal_type(K.batch([0], a, 0, {}, [], None, (), alloc))
reveal_type(K.gather((), (), a, a))
reveal_type(K.pack(bytearray(), (), a, a, a, a, a, 0))
hb = K.pack(bytearray(), (), a, a, a, a, a, 0)
if hb is not None:
    reveal_type(hb.why)
    reveal_type(hb.at)
    why, shard, chunk, at = hb
    reveal_type(shard)
"""


def test_mypy_strict_sees_the_hand_back_type(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every entry point's hand-back is typed for callers: a HandBack of literal ``why`` and
    int fields, never ``Any`` (the stub ``_kernel.pyi`` is what ``kernel.kernel`` is typed as)."""
    api = pytest.importorskip("mypy.api")
    (tmp_path / "snip.py").write_text(textwrap.dedent(SNIPPET))
    root = str(Path(tarindex.__file__).parent.parent)
    monkeypatch.setenv("MYPYPATH", root)  # this checkout's tarindex, whatever is installed
    out, err, code = api.run(
        [
            "--strict",
            "--follow-imports=silent",
            "--config-file",
            "",
            "--cache-dir",
            str(tmp_path / "cache"),
            str(tmp_path / "snip.py"),
        ]
    )
    assert code == 0, out + err
    revealed = [ln.split("Revealed type is ", 1)[1] for ln in out.splitlines() if "Revealed" in ln]
    assert len(revealed) == 8, out
    for r in revealed[:5]:
        assert "fallback=tarindex.read.hot.HandBack" in r, r
        assert "Any" not in r.split("| tuple[Literal")[-1], r  # the hand-back part: no Any
    assert revealed[5] == "\"Literal['open'] | Literal['check'] | Literal['python']\""
    assert revealed[6] == revealed[7] == '"int"'


def _returns(tree: ast.Module) -> dict[str, str]:
    """Return annotations of the module's functions and of its classes' methods, as text."""
    out = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef):
            for f in node.body:
                if isinstance(f, ast.FunctionDef) and f.returns is not None:
                    out[f"{node.name}.{f.name}"] = ast.unparse(f.returns)
        elif isinstance(node, ast.FunctionDef) and node.col_offset == 0 and node.returns:
            out[node.name] = ast.unparse(node.returns)
    return out


def test_the_stub_and_the_twin_declare_the_same_hand_backs() -> None:
    """``_kernel.pyi`` (the compiled module's types) and ``_kernel_py`` agree on every public
    entry point's return type, each one naming HandBack where it hands back."""
    stub = _returns(ast.parse(Path(kernel_mod.__file__).with_name("_kernel.pyi").read_text()))
    twin = _returns(ast.parse(inspect.getsource(_kernel_py)))
    public = {k: v for k, v in stub.items() if not k.split(".")[-1].startswith("_")}
    assert {k: twin.get(k) for k in public} == public
    for name in ("sample", "take", "batch", "gather", "pack", "Tables.samples"):
        assert "HandBack" in public[name], name
