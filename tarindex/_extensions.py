"""Load a compiled extension or say why not: the one rule of every compiled loop's import.

Each compiled loop of tarindex has a pure-Python twin (``read/_kernel.c`` and
``read/_kernel_py.py``, ``codecs/_resample.c`` and ``codecs/_resample_py.py``; ``codecs/_jpeg.c``
falls back to simplejpeg or Pillow). Which one runs is chosen once, at import, by
:func:`load_extension`, and the choice is said in the module's introspection string
(``tarindex.read_kernel()``, ``tarindex.codecs.resample.resample_kernel()``,
``tarindex.codecs.image_backend()``). This module imports nothing of tarindex: it sits at
the bottom of the layers (tests/test_layering.py), with ``errors.py``.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
from types import ModuleType

__all__ = ["load_extension"]


def load_extension(
    name: str, missing: str, unusable: str | None = None, form: str = "python ({})"
) -> tuple[ModuleType | None, str]:
    """The compiled extension ``name`` (``"tarindex.read._kernel"``), or ``None``, and why.

    Checked in this order, the first that holds decides; ``why`` is the reason put in
    ``form`` (by default ``"python (<reason>)"``, what ``read_kernel()`` says when its
    pure-Python twin runs):

    1. ``TARINDEX_PURE_PYTHON`` is set (to anything but ``""`` or ``"0"``): the reason is
       ``"TARINDEX_PURE_PYTHON is set"`` (the extension is not imported);
    2. ``unusable`` is given (the caller's own condition, e.g. ``"big-endian host"`` for the
       read kernel, whose tables are little-endian): the reason is ``unusable``;
    3. the extension is not there (it is built at install only where a C compiler, and its
       headers, were): ``missing``, the caller's text saying how to build it;
    4. it is there but fails to import (built for another Python, damaged):
       ``"<name> failed to load: <the ImportError>; reinstall it"``.

    Otherwise ``(module, "compiled")``.
    """
    if os.environ.get("TARINDEX_PURE_PYTHON", "") not in ("", "0"):
        return None, form.format("TARINDEX_PURE_PYTHON is set")
    if unusable is not None:
        return None, form.format(unusable)
    try:
        if importlib.util.find_spec(name) is None:
            return None, form.format(missing)
        return importlib.import_module(name), "compiled"
    except ImportError as e:  # built for another Python, or damaged (or its package)
        return None, form.format(f"{name} failed to load: {e}; reinstall it")
