"""The README's "Many shards" snippet runs as written (in a temp dir, in a subprocess)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

README = Path(__file__).parent.parent / "README.md"


@pytest.mark.timeout(120)
def test_readme_many_shards_snippet_runs(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    code = re.search(r"### Many shards[^\n]*\n\n```python\n(.*?)```", README.read_text(), re.S)
    assert code is not None, "README lost its Many shards snippet"
    script = tmp_path / "snippet.py"
    script.write_text(code.group(1) + "print('ok', len(shards), i)\n")
    out = subprocess.run(
        [sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=110
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert "ok 1000 421" in out.stdout
    assert (tmp_path / "data" / "data.json").exists()
