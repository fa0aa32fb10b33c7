"""The README's "Use" snippet runs as written (in a temp dir, in a subprocess)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

README = Path(__file__).parent.parent / "README.md"


@pytest.mark.timeout(180)
def test_readme_use_snippet_runs(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    code = re.search(r"## Use\n\n```python\n(.*?)```", README.read_text(), re.S)
    assert code is not None, "README lost its Use snippet"
    script = tmp_path / "snippet.py"
    script.write_text(
        "if __name__ == '__main__':\n"
        + "".join("    " + line + "\n" for line in code.group(1).splitlines())
        + "    print('shapes', tuple(images.shape), tuple(labels.shape))\n"
    )
    # to_tensors must be picklable by reference for spawn/forkserver workers: run with fork
    out = subprocess.run(
        [sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=170
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert "shapes (4, 3, 32, 32) (4,)" in out.stdout
    assert len(list((tmp_path / "out").glob("train-*.tar.tidx"))) == 5


@pytest.mark.timeout(120)
def test_readme_webdataset_snippet_runs(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    code = re.search(
        r"### Coming from webdataset\n.*?```python\n(.*?)```", README.read_text(), re.S
    )
    assert code is not None, "README lost its webdataset snippet"
    script = tmp_path / "snippet.py"
    script.write_text(
        code.group(1)
        + "print('last', image.shape, image.dtype, sorted(data))\n"
        + "print('n', sum(1 for _ in dataset))\n"
    )
    out = subprocess.run(
        [sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=110
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert "n 100" in out.stdout
    assert re.search(r"last \((24, 32\) uint8|24, 32, 3\) float32) \['id'\]", out.stdout)


@pytest.mark.timeout(120)
def test_readme_mixing_snippet_runs(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    code = re.search(
        r"### Mixing sources, resuming anywhere\n.*?```python\n(.*?)```", README.read_text(), re.S
    )
    assert code is not None, "README lost its mixing snippet"
    script = tmp_path / "snippet.py"
    script.write_text(code.group(1) + "print('ok', len(head), sorted(window.values()))\n")
    out = subprocess.run(
        [sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=110
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert "ok 100 [" in out.stdout
