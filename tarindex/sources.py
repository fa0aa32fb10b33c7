"""Expand a dataset source (path, list, brace pattern, glob, directory) into shard paths."""

from __future__ import annotations

import glob
import os
import re
from collections.abc import Iterable
from typing import Union

__all__ = ["Source", "expand_braces", "expand_source"]

Source = Union[str, "os.PathLike[str]", Iterable[Union[str, "os.PathLike[str]"]]]

_BRACE = re.compile(r"\{([^{}]*)\}")


def expand_braces(pattern: str) -> list[str]:
    """Expand ``{000..009}`` ranges (zero padding kept) and ``{a,b,c}`` lists, left to right.

    Examples:
        ``"train-{000..002}.tar"`` -> ``["train-000.tar", "train-001.tar", "train-002.tar"]``.

    Raises:
        ValueError: For a range whose ends are not integers.
    """
    m = _BRACE.search(pattern)
    if m is None:
        return [pattern]
    body = m.group(1)
    head, tail = pattern[: m.start()], pattern[m.end() :]
    if ".." in body:
        lo_s, hi_s = body.split("..", 1)
        try:
            lo, hi = int(lo_s), int(hi_s)
        except ValueError:
            raise ValueError(f"brace range {{{body}}} in {pattern!r}: ends must be integers") from None
        width = len(lo_s) if lo_s.startswith("0") and len(lo_s) > 1 else 0
        step = 1 if hi >= lo else -1
        items = [f"{i:0{width}d}" for i in range(lo, hi + step, step)]
    else:
        items = body.split(",")
    return [p for item in items for p in expand_braces(head + item + tail)]


def expand_source(source: Source) -> list[str]:
    """Return the shard paths of ``source``, in a stable order.

    ``source`` may be a path, a directory (its ``*.tar`` files, sorted), a glob (sorted
    matches), a brace pattern (in pattern order), or a list of any of these (list order).

    Raises:
        FileNotFoundError: If nothing matches (the message names the pattern).
    """
    if isinstance(source, (str, os.PathLike)):
        items = [os.fspath(source)]
    else:
        items = [os.fspath(s) for s in source]
    out: list[str] = []
    for item in items:
        for p in expand_braces(item):
            if os.path.isdir(p):
                found = sorted(glob.glob(os.path.join(glob.escape(p), "*.tar")))
                if not found:
                    raise FileNotFoundError(f"{p}: directory has no *.tar shards")
                out.extend(found)
            elif any(c in p for c in "*?[") and not os.path.exists(p):
                found = sorted(glob.glob(p))
                if not found:
                    raise FileNotFoundError(f"{p}: no shard matches this glob")
                out.extend(found)
            else:
                if not os.path.exists(p):
                    raise FileNotFoundError(f"{p}: shard not found")
                out.append(p)
    if not out:
        raise FileNotFoundError(f"{source!r}: no shards")
    return out
