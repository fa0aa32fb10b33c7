"""Imports point down the layers of docs/ARCHITECTURE.md; format/ is bytes only."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parent.parent / "tarindex"

# Lower rank = lower layer. A module may import its own package and any lower rank only.
RANKS = {
    "errors": 0,
    "_version": 0,
    "_extensions": 0,  # load a compiled extension or say why (read/kernel, codecs/resample, jpeg)
    "format": 1,
    "plan": 2,
    "storage": 2,
    "codecs": 2,
    "index": 3,
    "write": 3,
    "read": 4,
    "stream": 5,
    "torch": 6,
    "spark": 6,  # engine adapters, over write/ and read/
    "ray": 6,
    "__init__": 7,  # the public API
    "view": 6,  # the viewer: over read/ and codecs/, never torch
    "cli": 8,  # over the public API
    "__main__": 9,
}


def _module(path: Path) -> list[str]:
    parts = list(path.relative_to(PKG.parent).with_suffix("").parts)
    return parts[:-1] if parts[-1] == "__init__" else parts


def _imports(path: Path) -> set[str]:
    """Absolute names (``tarindex.x.y``) of every tarindex module ``path`` imports."""
    here = _module(path)
    pkg = here if path.name == "__init__.py" else here[:-1]
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level:
            base = pkg[: len(pkg) - (node.level - 1)]
            name = ".".join(base + ([node.module] if node.module else []))
            if node.module is None:
                out.update(f"{name}.{a.name}" for a in node.names)
            else:
                out.add(name)
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("tarindex"):
            out.add(node.module or "")
        elif isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name.startswith("tarindex"))
    return out


def _layer(name: str) -> str:
    parts = name.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def _all_modules() -> list[Path]:
    return sorted(PKG.rglob("*.py"))


@pytest.mark.parametrize("path", _all_modules(), ids=lambda p: str(p.relative_to(PKG)))
def test_imports_point_down(path: Path) -> None:
    mine = _layer(".".join(_module(path)))
    if path.parent == PKG and path.name not in ("__init__.py", "__main__.py"):
        mine = path.stem
    assert mine in RANKS, f"{path}: layer {mine!r} has no rank in this test"
    for name in _imports(path):
        theirs = _layer(name)
        if theirs == mine:
            continue
        assert theirs in RANKS, f"{path} imports {name}: layer {theirs!r} has no rank"
        assert RANKS[theirs] < RANKS[mine], f"{path} ({mine}) imports {name} ({theirs}): upward"


@pytest.mark.parametrize(
    "module",
    ["storage/indexfile.py", "write/tar.py", "write/shards.py", "write/members.py"]
    + [
        f"read/{m}.py"
        for m in ("shard", "opening", "shardset", "pool", "checks", "batch", "block", "paths")
    ],
)
def test_reader_writer_and_index_paths_do_not_import_the_header_walk(module: str) -> None:
    got = _imports(PKG / module)
    banned = {
        "tarindex.index.scan",
        "tarindex.index.build",
        "tarindex.cli",
        "tarindex.read.verify",
        "tarindex.write.pack",
    }
    assert not {g for g in got if any(g == b or g.startswith(b + ".") for b in banned)}, got


def test_format_is_bytes_only() -> None:
    for path in (PKG / "format").glob("*.py"):
        tree = ast.parse(path.read_text())
        calls = {
            n.func.id
            for n in ast.walk(tree)
            if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)
        }
        assert "open" not in calls, path
        above = {m for m in _imports(path) if not m.startswith("tarindex.format")}
        assert above <= {"tarindex.errors"}, path  # nothing above format/ but the exceptions


def test_cli_has_no_pack_planning_or_pattern_check() -> None:
    src = "".join(p.read_text() for p in (PKG / "cli").glob("*.py"))
    for name in ("def plan_pack", "def sanitize_stem", "def _walk_files", "def _check_pattern"):
        assert name not in src


@pytest.mark.parametrize("path", _all_modules(), ids=lambda p: str(p.relative_to(PKG)))
def test_no_module_over_700_lines(path: Path) -> None:
    n = len(path.read_text().splitlines())
    assert n <= 700, f"{path}: {n} lines; split it by its reasons to change (docs/ARCHITECTURE.md)"


# The header walks' short names for spec.py's header fields: derived from them where they are
# used (index/scan.py, index/paxfast.py), never a value of their own.
SAME_VALUE_OK = {"_TF", "_SIZE_AT", "_SIZE_TERM", "_NAME_LEN"}


def _constants(path: Path) -> dict[str, str]:
    """Module-level ``UPPER_CASE`` assignments of ``path``: name -> value source."""
    out = {}
    for node in ast.parse(path.read_text()).body:
        value = node.value if isinstance(node, ast.Assign | ast.AnnAssign) else None
        targets = node.targets if isinstance(node, ast.Assign) else [getattr(node, "target", None)]
        for t in targets if value is not None else []:
            if isinstance(t, ast.Name) and t.id.strip("_").isupper() and len(t.id.strip("_")) > 1:
                out[t.id] = ast.unparse(value)  # type: ignore[arg-type]
    return out


def test_a_constant_is_defined_once() -> None:
    """Issue 18: ``COALESCE_GAP`` (and the tar's no-data typeflags, its record size, the
    default integer fields) were defined in two modules despite ``format/spec.py``'s "every
    constant is defined here only". A public constant's name is assigned in one module, a
    private one's name and value (``_X = v``) in one module, and no module outside
    ``format/spec.py`` writes a ``spec.py`` value (one built from other names) again."""
    spec = {v: k for k, v in _constants(PKG / "format" / "spec.py").items()}
    where: dict[tuple[str, str], list[str]] = {}
    again = []
    for path in _all_modules():
        rel = str(path.relative_to(PKG))
        for name, value in _constants(path).items():
            key = (name, value) if name.startswith("_") else (name, "")
            where.setdefault(key, []).append(rel)
            derived = any(isinstance(n, ast.Name) for n in ast.walk(ast.parse(value)))
            if rel != "format/spec.py" and derived and value in spec:
                again.append(f"{rel}: {name} = {value} (spec.py's {spec[value]})")
    twice = {k: p for k, p in where.items() if len(p) > 1 and k[0] not in SAME_VALUE_OK}
    assert twice == {} and again == []
