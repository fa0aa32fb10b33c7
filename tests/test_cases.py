"""cases.md 2 and 3 across both access modes: a tar made by GNU tar with non-adjacent members of
one sample and a duplicated member (``tar -r``) reads the same through TarDataset and
TarIterableDataset, never as half-samples."""

from __future__ import annotations

import subprocess
import warnings
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

import tarindex  # noqa: E402

ORDER = ["0.a", "1.a", "2.a", "0.b", "1.b", "2.b", "3.a", "3.b"]


def _tar(tmp_path: Path) -> Path:
    root = tmp_path / "root"
    root.mkdir()
    for n in ORDER:
        (root / n).write_bytes(n.encode() * 300)
    tar = tmp_path / "mixed.tar"
    subprocess.run(["tar", "-cf", str(tar), "-C", str(root), *ORDER], check=True)
    (root / "1.b").write_bytes(b"replaced " * 50)  # tar -r appends a second copy of 1.b
    subprocess.run(["tar", "-rf", str(tar), "-C", str(root), "1.b"], check=True)
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        tarindex.build_index(tar)
    msgs = " ".join(str(w.message) for w in rec)
    assert "not adjacent" in msgs and "more than once" in msgs
    return tar


def _want() -> dict[str, dict[str, bytes]]:
    want = {k: {e: f"{k}.{e}".encode() * 300 for e in "ab"} for k in "0123"}
    want["1"]["b"] = b"replaced " * 50  # the last copy wins, as on extraction
    return want


def _strip(s: dict[str, object]) -> tuple[str, dict[str, object]]:
    return str(s["__key__"]), {k: v for k, v in s.items() if not k.startswith("__")}


def test_map_and_stream_agree_on_interleaved_and_duplicates(tmp_path: Path) -> None:
    tar = _tar(tmp_path)
    want = _want()
    ds = tarindex.TarDataset(str(tar))
    assert [ds[i]["__key__"] for i in range(len(ds))] == ["0", "1", "2", "3"]  # first appearance
    assert dict(_strip(ds[i]) for i in range(len(ds))) == want
    for shuffle in (False, True):
        it = tarindex.TarIterableDataset(str(tar), shuffle=shuffle, seed=3, block_size=2)
        got = [_strip(s) for s in it]
        assert len(got) == 4 and dict(got) == want
        loader = torch.utils.data.DataLoader(it, batch_size=None, num_workers=2)
        got = [_strip(s) for s in loader]
        assert sorted(k for k, _ in got) == ["0", "1", "2", "3"] and dict(got) == want
