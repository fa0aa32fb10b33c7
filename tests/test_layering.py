"""Imports point down: format <- scan/indexfile/writer/reader <- build, pack, verify <- cli."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parent.parent / "tarindex"


def _imports(path: Path) -> set[str]:
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level:
            out.add("." * node.level + (node.module or ""))
        elif isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
    return out


@pytest.mark.parametrize("module", ["indexfile.py", "writer.py", "reader.py"])
def test_reader_writer_and_index_paths_do_not_import_the_header_walk(module: str) -> None:
    got = _imports(PKG / module)
    assert not got & {".scan", ".build", ".cli", ".verify", ".pack"}, got


def test_format_is_bytes_only() -> None:
    for path in (PKG / "format").glob("*.py"):
        tree = ast.parse(path.read_text())
        calls = {
            n.func.id
            for n in ast.walk(tree)
            if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)
        }
        assert "open" not in calls, path
        above = {m for m in _imports(path) if m.startswith("..")} - {"..errors"}
        assert not above, path  # nothing above format/ but the exception classes


def test_cli_has_no_pack_planning_or_pattern_check() -> None:
    src = (PKG / "cli.py").read_text()
    for name in ("def plan_pack", "def sanitize_stem", "def _walk_files", "def _check_pattern"):
        assert name not in src
