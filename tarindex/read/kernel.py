"""Which per-sample loops run: the compiled ones (``_kernel.c``) or their twin, chosen once.

The choice is made at import: :data:`kernel` is the extension module ``tarindex.read._kernel``
(also :data:`compiled`), or its pure-Python twin :mod:`tarindex.read._kernel_py` (same
functions, same results, same hand-backs: a :class:`~tarindex.read.hot.HandBack` where a loop
leaves a case to Python; :data:`compiled` is then ``None``) when the
extension was not built (no C compiler at install), on a big-endian host (the tables are
little-endian, FORMAT.md §2), or with ``TARINDEX_PURE_PYTHON=1`` in the environment. Callers
call ``kernel.kernel.X(...)`` at call time (never a copy of it), with no branch on which one
runs, so the twin can also be asked for in one place (the equivalence tests set it). See
docs/READING.md, "Compiled loops".
"""

from __future__ import annotations

import importlib.util
import os
import sys
from types import ModuleType
from typing import TYPE_CHECKING

from . import _kernel_py

__all__ = ["compiled", "kernel", "read_kernel"]


def _load() -> tuple[ModuleType | None, str]:
    """The compiled loops or ``None``, and what :func:`read_kernel` says."""
    if os.environ.get("TARINDEX_PURE_PYTHON", "") not in ("", "0"):
        return None, "python (TARINDEX_PURE_PYTHON is set)"
    if sys.byteorder != "little":
        return None, "python (big-endian host)"
    if importlib.util.find_spec(f"{__package__}._kernel") is None:  # no C compiler at install
        return None, "python (the extension tarindex.read._kernel is not built: reinstall with gcc)"
    try:
        from . import _kernel
    except ImportError as e:  # built for another Python, or damaged
        return None, f"python (tarindex.read._kernel failed to load: {e}; reinstall it)"
    return _kernel, "compiled"


compiled, _WHY = _load()
"""The extension module ``tarindex.read._kernel`` (see ``_kernel.pyi``), or ``None``."""

if TYPE_CHECKING:  # typed as the extension (_kernel.pyi): the twin has the same signatures
    from . import _kernel as kernel
else:
    kernel = compiled if compiled is not None else _kernel_py
"""The loops every caller runs: :data:`compiled`, else :mod:`tarindex.read._kernel_py`."""


def read_kernel() -> str:
    """Which per-sample loops this process runs: ``"compiled"`` or ``"python (<why>)"``.

    Both give the same samples, batches and errors; the compiled ones are faster
    (docs/READING.md, "Compiled loops"). ``tarindex --version`` prints it too.
    """
    return _WHY
