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

import sys
from typing import TYPE_CHECKING

from .._extensions import load_extension
from . import _kernel_py

__all__ = ["compiled", "kernel", "read_kernel"]

compiled, _WHY = load_extension(
    f"{__package__}._kernel",
    f"the extension {__package__}._kernel is not built: reinstall with gcc",  # no C compiler
    None if sys.byteorder == "little" else "big-endian host",  # the tables are little-endian
)
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
