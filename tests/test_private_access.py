"""No module reads another object's private attributes (``x._name`` where ``x`` is not ``self``)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[1] / "tarindex"

# ``os._exit`` / ``sys._getframe`` are the standard library's public spellings; a NamedTuple's
# ``_fields`` / ``_replace`` / ``_asdict`` / ``_make`` are its documented API.
OWN = {"self", "cls"}
STDLIB = {"os", "sys"}
NAMEDTUPLE_API = {"_fields", "_replace", "_asdict", "_make"}

# torch has no public API for a shared-memory storage by name with torch's own reference count
# and cleanup of segments a killed worker leaves (torch.from_file leaks them in /dev/shm): the
# transport uses torch's, and falls back to the public share_memory_() when they are missing.
# To reuse a worker's segment it reads torch's count of a storage's users in the process; to
# pass a received batch on by name it keys the segments it mapped by torch's storage id.
# These are torch's attributes, not another tarindex object's state.
THIRD_PARTY = {
    "torch/transport.py": {
        "torch.UntypedStorage._new_using_filename_cpu",
        "storage._share_filename_cpu_",
        "storage._shared_incref",
        "storage._shared_decref",
        "torch._C",
        "torch._C._storage_Use_Count",
        "t.untyped_storage()._cdata",
        "storage._cdata",
    },
}


def private_reads(source: str) -> list[tuple[int, str]]:
    out = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Attribute) or not node.attr.startswith("_"):
            continue
        if node.attr.startswith("__") and node.attr.endswith("__"):
            continue  # dunders are protocol, not private state
        if node.attr in NAMEDTUPLE_API:
            continue
        v = node.value
        if isinstance(v, ast.Name) and v.id in OWN | STDLIB:
            continue
        if isinstance(v, ast.Call) and isinstance(v.func, ast.Name) and v.func.id == "super":
            continue
        out.append((node.lineno, ast.unparse(node)))
    return out


def test_the_check_finds_what_it_must() -> None:
    src = "def f(r):\n    return r._ck, self._ok, super()._x, os._exit, r.__len__, T._fields\n"
    assert private_reads(src) == [(2, "r._ck")]


@pytest.mark.parametrize("path", sorted(PKG.rglob("*.py")), ids=lambda p: str(p.relative_to(PKG)))
def test_no_private_reads(path: Path) -> None:
    allowed = THIRD_PARTY.get(str(path.relative_to(PKG)), set())
    assert [r for r in private_reads(path.read_text()) if r[1] not in allowed] == [], path
