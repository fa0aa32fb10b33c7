"""tarindex.stream.arrow: the read ranges and Arrow tables every engine's read task makes."""

from __future__ import annotations

from pathlib import Path

import pytest

import tarindex
from tarindex.errors import FormatError, SampleIndexError
from tarindex.read.keys import key_bytes
from tarindex.stream.arrow import block_table, columns_of, cut_ranges, read_range, samples_of

pa = pytest.importorskip("pyarrow", reason="pyarrow is not installed (pip install -e '.[test]')")


def test_cut_ranges() -> None:
    assert cut_ranges(0, 8) == []
    assert cut_ranges(10, 4, 1) == [(0, 3), (3, 6), (6, 8), (8, 10)]
    assert cut_ranges(5000, 200) == [(0, 1000), (1000, 2000), (2000, 3000), (3000, 4000), (4000, 5000)]
    got = cut_ranges(4000, 64, 50)
    assert len(got) == 64 and got[0] == (0, 63) and got[-1][1] == 4000
    assert all(a[1] == b[0] for a, b in zip(got, got[1:], strict=False))
    with pytest.raises(ValueError, match="tasks"):
        cut_ranges(10, 0)


def write(root: Path, n: int, maxcount: int, extra: int | None = None) -> tarindex.ShardSet:
    with tarindex.ShardWriter(str(root / "s-%06d.tar"), maxcount=maxcount, durable=False) as w:
        for i in range(n):
            s = {"__key__": f"{i:05d}", "bin": bytes([i % 256]) * (i % 7), "cls": i % 10}
            if i % 2:
                s["txt"] = f"t{i}"
            if extra is not None and i == extra:
                s["odd"] = b"!"
            w.write(s)
    return tarindex.ShardSet(str(root / "s-*.tar"))


def test_block_table_spans_shards_with_nulls(tmp_path: Path) -> None:
    ss = write(tmp_path, 25, 10)
    cols = columns_of(ss)
    assert cols == ["bin", "cls", "txt"]
    t = block_table(ss, 7, 23, cols)  # shards 0, 1 and 2
    assert t.column("__index__").to_pylist() == list(range(7, 23))
    assert t.column("cls").to_pylist() == [i % 10 for i in range(7, 23)]
    assert t.column("bin").to_pylist() == [bytes([i % 256]) * (i % 7) for i in range(7, 23)]
    assert t.column("txt").to_pylist() == [f"t{i}".encode() if i % 2 else None for i in range(7, 23)]
    assert [len(b) for b in read_range(ss, 0, 25, ["cls"], block_rows=10)] == [10, 10, 5]
    assert block_table(ss, 0, 5, ["cls"], int_fields=()).column("cls").to_pylist()[:2] == [b"0", b"1"]
    back = list(samples_of([t]))
    assert back[0] == {"__key__": "00007", "bin": bytes([7]) * 0, "cls": 7, "txt": b"t7"}
    assert "txt" not in back[1]  # a null leaves the member out


def test_a_member_outside_the_columns_is_an_error(tmp_path: Path) -> None:
    ss = write(tmp_path, 30, 10, extra=17)
    with pytest.raises(FormatError, match=r"'odd' member.*fields="):
        block_table(ss, 10, 20, columns_of(ss), every_member=True)
    assert block_table(ss, 10, 20, ["cls", "odd"]).column("odd").null_count == 9


def test_bad_int_field_names_shard_and_fix(tmp_path: Path) -> None:
    ss = write(tmp_path, 10, 10)
    with pytest.raises(FormatError, match="int_fields=()"):
        block_table(ss, 0, 10, ["txt"], int_fields=("txt",))
    with pytest.raises(ValueError, match="__"):
        columns_of(ss, ("__key__",))


def test_keys_and_ints_from_buffers(tmp_path: Path) -> None:
    """Non-ASCII keys (bytes != characters), a real -1 label beside a missing one (null)."""
    with tarindex.ShardWriter(str(tmp_path / "u-%06d.tar"), maxcount=3, durable=False) as w:
        for i, key in enumerate(["a", "é-1", "日本-2", "z3", "ß"]):
            s: dict[str, object] = {"__key__": key, "bin": bytes([i]) * i}
            if i != 2:
                s["cls"] = -1 if i == 1 else i
            w.write(s)
    ss = tarindex.ShardSet(str(tmp_path / "u-*.tar"))
    t = block_table(ss, 0, 5, ["bin", "cls"])
    t.validate(full=True)
    assert t.column("__key__").to_pylist() == ["a", "é-1", "日本-2", "z3", "ß"]
    assert t.column("cls").to_pylist() == [0, -1, None, 3, 4]
    assert t.column("bin").to_pylist() == [bytes([i]) * i for i in range(5)]
    ascii_only = block_table(ss, 3, 5, ["cls"])
    ascii_only.validate(full=True)
    assert ascii_only.column("__key__").to_pylist() == ["z3", "ß"]


def test_a_key_that_is_not_utf8_is_named(tmp_path: Path) -> None:
    import io
    import tarfile

    with tarfile.open(tmp_path / "k.tar", "w", format=tarfile.GNU_FORMAT, encoding="latin-1") as tf:
        for name in ["ok.cls", "caf\xe9.cls"]:  # latin-1 bytes on disk: not UTF-8
            info = tarfile.TarInfo(name)
            info.size = 1
            tf.addfile(info, io.BytesIO(b"1"))
    tarindex.build_index(str(tmp_path / "k.tar"))
    ss = tarindex.ShardSet(str(tmp_path / "k.tar"))
    with pytest.raises(FormatError, match=r"k\.tar: key 'caf\\udce9' is not UTF-8.*rename"):
        block_table(ss, 0, 2, ["cls"])
    assert block_table(ss, 0, 1, ["cls"]).column("__key__").to_pylist() == ["ok"]
    blob, ptr = key_bytes(ss.reader(0), 0, 2)  # the stored bytes the key column is made of
    assert blob == b"okcaf\xe9" and ptr.tolist() == [0, 2, 6]
    assert key_bytes(ss.reader(0), 1, 1)[0] == b""
    with pytest.raises(SampleIndexError):
        key_bytes(ss.reader(0), 1, 3)
