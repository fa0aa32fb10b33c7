"""OpenOptions: the one documented object of how a ShardSet opens and checks its shards."""

from __future__ import annotations

import dataclasses
import pickle
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import tarindex
from tarindex import OpenOptions


def test_defaults_are_the_documented_ones() -> None:
    o = OpenOptions()
    assert (o.max_open, o.use_mmap, o.check_crc, o.verify_data, o.index_dir, o.index) == (
        None, True, True, False, None, "auto",
    )
    fields = [f.name for f in dataclasses.fields(OpenOptions)]
    assert fields == ["max_open", "use_mmap", "check_crc", "verify_data", "index_dir", "index"]
    for name in fields:  # every field is documented on the class, with its default
        assert f"{name}:" in (OpenOptions.__doc__ or ""), name
    same = OpenOptions(max_open=np.int64(3))  # type: ignore[arg-type]
    assert OpenOptions(max_open=3) == same  # compared by value
    with pytest.raises(dataclasses.FrozenInstanceError):
        o.use_mmap = False  # type: ignore[misc]


@pytest.mark.parametrize(
    "kw, err",
    [
        ({"max_open": 0}, ValueError),
        ({"max_open": -2}, ValueError),
        ({"max_open": 2.5}, TypeError),  # refused, not truncated
        ({"max_open": "4"}, TypeError),
        ({"max_open": True}, TypeError),
        ({"use_mmap": 0}, TypeError),
        ({"check_crc": "no"}, TypeError),
        ({"verify_data": None}, TypeError),
        ({"index_dir": 3}, TypeError),
        ({"index": "bogus"}, ValueError),
        ({"index": None}, ValueError),
    ],
)
def test_bad_values_are_refused_naming_the_field(kw: dict[str, Any], err: type) -> None:
    with pytest.raises(err, match=f"OpenOptions\\({next(iter(kw))}="):
        OpenOptions(**kw)


def test_a_shardset_keeps_and_pickles_its_options(tmp_path: Path) -> None:
    with tarindex.ShardWriter(str(tmp_path / "s-%03d.tar"), maxcount=10, durable=False) as w:
        for i in range(25):
            w.write({"__key__": f"{i:04d}", "cls": i})
    idx = tmp_path / "idx"
    idx.mkdir()
    for p in w.paths:
        Path(p + ".tidx").rename(idx / (Path(p).name + ".tidx"))
    opts = OpenOptions(max_open=2, use_mmap=False, verify_data=True, index_dir=idx)  # type: ignore[arg-type]
    assert opts.index_dir == str(idx)  # a path-like is kept as its str
    ss = tarindex.ShardSet(w.paths, options=opts)
    assert ss.options is opts and ss.max_open == 2 and ss.takes().open_bound <= 2
    assert [ss.sample(i)["cls"] for i in (0, 13, 24)] == [b"0", b"13", b"24"]
    back = pickle.loads(pickle.dumps(ss))
    assert back.options == opts and back.sample(24)["__key__"] == "0024"
    assert tarindex.ShardSet(w.paths, options=OpenOptions(index_dir=str(idx))).max_open == 48
    with pytest.raises(TypeError, match="use_mmap"):
        tarindex.ShardSet(w.paths, use_mmap=False)  # type: ignore[call-arg]  # one way: options=
