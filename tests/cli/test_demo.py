"""`tarindex demo` end to end: digits -> shards (+ a GNU tar copy) -> DataLoader -> accuracy."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from tarindex.cli.main import main

pytest.importorskip("torch")
pytest.importorskip("sklearn")


def test_demo_end_to_end(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["demo", "--workdir", str(tmp_path)])
    out, err = capsys.readouterr()
    assert code == 0, err
    m = re.search(r"test accuracy: ([0-9.]+) on (\d+) held-out images", out)
    assert m is not None, out
    assert float(m.group(1)) > 0.9 and int(m.group(2)) == 360
    assert "holds the same 1437 samples as the shards" in out
    rate = re.search(r"random access, 1 process: ([0-9,]+) samples/s raw", out)
    assert rate is not None and int(rate.group(1).replace(",", "")) > 0
    assert len(re.findall(r"^epoch \d+/\d+: train loss", out, re.M)) >= 1
    shards = sorted(os.listdir(tmp_path / "shards"))
    assert shards == [
        *[f"test-000000.tar{s}" for s in ("", ".tidx")],
        *[f"train-{k:06d}.tar{s}" for k in range(4) for s in ("", ".tidx")],
    ]
    # what the demo wrote passes the full verification, the tar copy's rebuilt index too
    assert main(["verify", str(tmp_path / "shards"), str(tmp_path / "tar" / "train-tar.tar")]) == 0
    assert "6 ok, 0 failed" in capsys.readouterr().out


def test_demo_is_seeded(tmp_path: Path) -> None:
    from tarindex.cli import demo

    lines: list[str] = []
    a = demo.run(tmp_path / "a", epochs=1, log=lines.append)
    b = demo.run(tmp_path / "b", epochs=1, log=lines.append)
    assert a.losses == b.losses and a.accuracy == b.accuracy
    for p, q in zip(a.train_shards, b.train_shards, strict=True):
        assert Path(p).read_bytes() == Path(q).read_bytes()
