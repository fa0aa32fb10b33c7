"""The fix an index error message names: the command that rebuilds the index (FORMAT.md §1)."""

from __future__ import annotations

from .spec import INDEX_SUFFIX

__all__ = ["rebuild_hint"]


def rebuild_hint(path: str) -> str:
    """The rebuild command for the index at ``path`` (its tar is ``path`` minus ``.tidx``, §1)."""
    tar = path[: -len(INDEX_SUFFIX)] if path.endswith(INDEX_SUFFIX) else "<tar>"
    return f"tarindex index --force {tar}"
