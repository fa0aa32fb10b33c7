"""A signal at any point while a writer starts a shard leaves no temp file behind.

``write_shards`` workers stop on SIGTERM (``lifeline.Stop``) and Ctrl-C raises
``KeyboardInterrupt`` wherever Python is: if it lands after the temp file is created but before
the writer object that would remove it is stored, the file is orphaned (seen as a leftover
``s-00003.tar.<pid>.<hex>.tmp`` after a real ``kill -9`` of a ``write_shards`` caller). The
exception is injected at every line of the opening code in turn, through ``sys.settrace``.
"""

from __future__ import annotations

import sys
from pathlib import Path
from types import CodeType, FrameType
from typing import Any

import tarindex
from tarindex.write.shards import ShardWriter
from tarindex.write.tar import TarShardWriter, _open_temp

OPENING: set[CodeType] = {
    TarShardWriter.__init__.__code__,
    ShardWriter._open.__code__,
    _open_temp.__code__,
}


def _write_interrupted_at(pattern: str, line: int) -> bool:
    """Write one sample, raising KeyboardInterrupt at the ``line``-th line run by the opening
    code; True if the write finished (``line`` is past the opening code's last line)."""
    seen = 0

    def local(frame: FrameType, event: str, arg: Any) -> Any:
        nonlocal seen
        if event == "line":
            seen += 1
            if seen == line:
                raise KeyboardInterrupt
        return local

    def tracer(frame: FrameType, event: str, arg: Any) -> Any:
        return local if frame.f_code in OPENING else None

    sys.settrace(tracer)
    try:
        with ShardWriter(pattern, maxcount=10) as sink:
            sink.write({"__key__": "a", "bin": b"x" * 100})
    except KeyboardInterrupt:
        return False
    finally:
        sys.settrace(None)
    return True


def test_an_interrupt_anywhere_in_opening_a_shard_leaves_no_temp_file(tmp_path: Path) -> None:
    line = 1
    while True:
        out = tmp_path / str(line)
        done = _write_interrupted_at(str(out / "s-%05d.tar"), line)
        temps = sorted(p.name for p in out.glob("*.tmp")) if out.exists() else []
        assert temps == [], f"interrupted at line {line} of the opening code: {temps} left"
        if done:
            break
        line += 1
    assert line > 10  # the opening code was really walked line by line
    assert tarindex.ShardSet(str(out / "s-*.tar")).sample(0)["bin"] == b"x" * 100
