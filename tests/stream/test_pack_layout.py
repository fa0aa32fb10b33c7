"""tarindex.stream.pack.pack_layout: a batch's layout before its copy pass, then fill."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import tarindex
from tarindex.errors import FormatError
from tarindex.stream.pack import numpy_alloc, pack_blocks, pack_layout


def shards(root: Path) -> tarindex.ShardSet:
    with tarindex.ShardWriter(str(root / "s-%06d.tar"), maxcount=6, durable=False) as w:
        for i in range(10):
            s: dict[str, object] = {"__key__": f"k{i}", "bin": bytes([i]) * i, "cls": i}
            if i % 3:
                s["lab"] = 100 + i  # a second integer field, missing from samples 0, 3, 6, 9
            if i % 2:
                s["txt"] = f"t{i}"
            w.write(s)
    return tarindex.ShardSet(str(root / "s-*.tar"))


def test_layout_then_fill_is_pack_blocks(tmp_path: Path) -> None:
    ss = shards(tmp_path)
    parts = [(ss.read_block(0, 0, 6), np.asarray([5, 1, 2], np.int64)), (ss.read_block(1, 0, 4), None)]
    rows = np.asarray([3, 0, 6, 1, 5, 2, 4], np.int64)
    want = pack_blocks(parts, rows, ("cls", "lab"))
    lay = pack_layout(parts, rows, ("cls", "lab"))
    assert lay is not None and lay.nbytes == int(want.offsets[-1, -1])
    assert lay.ints["cls"].tolist() == [-1] * 7  # filled in place by fill, not before
    keep, view = numpy_alloc(lay.nbytes)
    got = lay.fill(keep, view)
    assert got.fields == want.fields and got.keys == want.keys and got.shards == want.shards
    assert bytes(got.data) == bytes(want.data)
    for name in ("offsets", "present", "global_index"):
        assert np.array_equal(getattr(got, name), getattr(want, name)), name
    assert {k: v.tolist() for k, v in got.ints.items()} == {k: v.tolist() for k, v in want.ints.items()}
    assert got.ints is lay.ints  # the columns a caller wrapped before the copy hold the values
    with pytest.raises(RuntimeError, match="filled already"):
        lay.fill(keep, view)


def test_int_present(tmp_path: Path) -> None:
    ss = shards(tmp_path)
    lay = pack_layout([(ss.read_block(0, 0, 6), None)], None, ("cls", "lab"))
    assert lay is not None
    assert lay.int_present("cls") is None  # every sample has one
    has = lay.int_present("lab")
    assert has is not None and has.tolist() == [False, True, True, False, True, True]
    got = lay.fill(*numpy_alloc(lay.nbytes))
    assert got.ints["cls"].tolist() == list(range(6))
    assert got.ints["lab"].tolist() == [-1, 101, 102, -1, 104, 105]
    one = pack_layout([(ss.read_block(1, 0, 4), None)], None, ("cls",))  # every sample, in order
    assert one is not None and one.int_present("cls") is None
    assert one.fill(*numpy_alloc(one.nbytes)).ints["cls"].tolist() == [6, 7, 8, 9]
    twice = pack_blocks([(ss.read_block(1, 0, 4), np.asarray([3, 3, 0], np.int64))], None, ("cls",))
    assert twice.ints["cls"].tolist() == [9, 9, 6]  # a sample taken twice
    assert pack_layout([], None) is None


def test_a_bad_integer_is_named_by_fill(tmp_path: Path) -> None:
    with tarindex.ShardWriter(str(tmp_path / "s-%06d.tar"), maxcount=10, durable=False) as w:
        for i in range(4):
            w.write({"__key__": f"k{i}", "cls": b"x" if i == 2 else str(i).encode()})
    ss = tarindex.ShardSet(str(tmp_path / "s-*.tar"))
    lay = pack_layout([(ss.read_block(0, 0, 4), None)])
    assert lay is not None
    keep, view = numpy_alloc(lay.nbytes)
    with pytest.raises(FormatError, match=r"s-000000\.tar: byte \d+: member k2\.cls .*int_fields=\(\)"):
        lay.fill(keep, view)


def test_field_order(tmp_path: Path) -> None:
    """First appearance among the members as concatenated (``rows`` moves samples, not the
    order of fields), or the order a caller names."""
    with tarindex.ShardWriter(str(tmp_path / "s-%06d.tar"), maxcount=10, durable=False) as w:
        w.write({"__key__": "a", "txt": b"t"})
        w.write({"__key__": "b", "bin": b"bb", "txt": b"u"})
    ss = tarindex.ShardSet(str(tmp_path / "s-*.tar"))
    blk = ss.read_block(0, 0, 2)
    assert pack_blocks([(blk, None)]).fields == ["txt", "bin"]
    flipped = pack_blocks([(blk, None)], np.asarray([1, 0], np.int64))  # what it was before
    assert flipped.fields == ["txt", "bin"] and flipped.keys == ["b", "a"]
    assert bytes(flipped.data) == b"utbb"
    assert pack_blocks([(blk, np.asarray([1, 0], np.int64))]).fields == ["bin", "txt"]
    for order, want in [(["bin", "txt"], ["bin", "txt"]), (["bin"], ["bin", "txt"]), ([], ["txt", "bin"])]:
        lay = pack_layout([(blk, None)], None, (), order)
        assert lay is not None and lay.fields == want
        keep, view = numpy_alloc(lay.nbytes)
        got = lay.fill(keep, view)
        assert [bytes(got.data[o[0] : o[-1]]) for o in got.offsets] == [
            {"txt": b"tu", "bin": b"bb"}[f] for f in want
        ]


def test_field_counts(tmp_path: Path) -> None:
    # the members of each byte field, counted by pack_layout for an `order` (block_table's
    # validity: B means every sample has it) or summed from `present`, in `fields`' order
    ss = shards(tmp_path)
    blk = ss.read_block(0, 0, 6)
    parts = [(blk, None), (blk, np.asarray([1, 1], np.int64))]  # k1 (bin, lab, txt) thrice
    for order in (None, ["txt", "bin"], ["lab", "bin"]):
        lay = pack_layout(parts, None, ("cls",), order)
        assert lay is not None
        want = dict(zip(lay.fields, lay.present.sum(axis=1).tolist(), strict=True))
        assert dict(zip(lay.fields, lay.field_counts(), strict=True)) == want
        assert want == {"bin": 8, "lab": 6, "txt": 5}  # all 8 rows have bin (k0: empty)
