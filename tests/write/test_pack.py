"""tarindex.write.pack (planning + writing) and the writer's one pattern check, as a library."""

from __future__ import annotations

import builtins
import json
import os
import zlib
from pathlib import Path
from typing import Any

import pytest

import tarindex
from tarindex.write.pack import plan_pack, write_pack
from tarindex.write.shards import check_pattern


def _classes(tmp_path: Path) -> Path:
    src = tmp_path / "src"
    for c in ("cat", "dog"):
        (src / c).mkdir(parents=True)
        for i in range(3):
            (src / c / f"{i}.v1.png").write_bytes(f"{c}{i}".encode())
    return src


def test_plan_and_write_classes_layout(tmp_path: Path) -> None:
    plan = plan_pack(str(_classes(tmp_path)), out_pattern=str(tmp_path / "o-%d.tar"))
    assert plan.layout == "classes" and plan.classes == ["cat", "dog"]
    assert [k for k, _, _ in plan.samples][:2] == ["cat/0%2Ev1", "cat/1%2Ev1"]
    seen: list[int] = []
    res = write_pack(plan, str(tmp_path / "o-%d.tar"), maxcount=4, on_sample=lambda: seen.append(1))
    assert len(seen) == 6 and res.n_files == 6 and len(res.paths) == 2
    assert res.classes_json is not None
    assert json.loads(Path(res.classes_json).read_text()) == ["cat", "dog"]
    with tarindex.ShardReader(res.paths[1]) as r:
        assert r.sample(1) == {"__key__": "dog/2%2Ev1", "png": b"dog2", "cls": b"1"}


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"src": "missing"}, "not a directory"),
        ({"out": "src/o-%d.tar"}, "inside SRC_DIR"),
        ({"out": "o-%d%d.tar"}, "one integer field"),
        ({"out": "o.tar", "maxcount": 2}, "more than one shard"),
        ({"layout": "zigzag"}, "layout 'zigzag'"),
    ],
)
def test_plan_pack_raises_pack_error(tmp_path: Path, kwargs: dict[str, Any], match: str) -> None:
    _classes(tmp_path)
    src = str(tmp_path / kwargs.get("src", "src"))
    with pytest.raises(tarindex.errors.PackError, match=match) as ei:
        plan_pack(
            src,
            kwargs.get("layout", "auto"),
            out_pattern=str(tmp_path / kwargs.get("out", "o-%d.tar")),
            maxcount=kwargs.get("maxcount", 100),
        )
    assert isinstance(ei.value, ValueError) and isinstance(ei.value, tarindex.TarIndexError)


@pytest.mark.parametrize(
    "pattern, has_field",
    [("out/s-%06d.tar", True), ("out/one.tar", False), ("x-%d-%%.tar", True)],
)
def test_check_pattern_accepts(pattern: str, has_field: bool) -> None:
    assert check_pattern(pattern) is has_field


@pytest.mark.parametrize(
    "pattern", ["x-%d%d.tar", "100%.tar", "x-%(n)d.tar", "x-%.0s.tar", "x-%z.tar", "x-%%.tar"]
)
def test_check_pattern_refuses(pattern: str) -> None:
    with pytest.raises(tarindex.errors.WriterError, match="pattern"):
        check_pattern(pattern)


def test_build_index_opens_the_tar_once(
    make_shards: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tar,) = make_shards([7])
    opened: list[str] = []
    real_open, real_os_open = builtins.open, os.open

    def counting_open(file: Any, *a: Any, **k: Any) -> Any:
        opened.append(str(file))
        return real_open(file, *a, **k)

    def counting_os_open(file: Any, *a: Any, **k: Any) -> Any:
        opened.append(str(file))
        return real_os_open(file, *a, **k)

    monkeypatch.setattr(builtins, "open", counting_open)  # either way of opening counts
    monkeypatch.setattr(os, "open", counting_os_open)
    tables = tarindex.build_index(tar, str(tmp_path / "re.tidx"))
    monkeypatch.undo()
    assert opened.count(tar) == 1
    data = Path(tar).read_bytes()
    assert (tables.head_crc, tables.tail_crc) == (
        zlib.crc32(data[:4096]),
        zlib.crc32(data[-4096:]),
    )
    members = tarindex.index.scan.scan(tar)
    assert (members.head_crc, members.tail_crc) == (tables.head_crc, tables.tail_crc)
