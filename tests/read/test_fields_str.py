"""``fields="bin"`` (a bare string) is one field on every path, in both loops (issue 19 item 18)."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import tarindex

from ..conftest import MakeShards

SCRIPT = r"""
import sys
import tarindex
from tarindex.torch.dataset import TarDataset
from tarindex.torch.iterable import TarIterableDataset

paths = sys.argv[1:]
ss = tarindex.ShardSet(paths)


def keys(s):
    return sorted(k for k in s if not k.startswith("__"))


for field in ("bin", "cls"):
    got = {
        "get": keys(ss.sample(1, field)),
        "gather": keys(ss.gather([1, 0], field).to_samples()[0]),
        "read_block": keys(ss.read_block(0, 0, 2, field).to_samples()[1]),
        "read_samples": keys(ss.takes().read_samples(0, 0, 2, field)[1]),
        "reader.sample": keys(ss.reader(0).sample(1, field)),
        "reader.gather": keys(ss.reader(0).gather([1], field).to_samples()[0]),
        "TarDataset": keys(TarDataset(paths, fields=field)[1]),
        "__getitems__": keys(TarDataset(paths, fields=field).__getitems__([1])[0]),
        "batched": list(TarDataset(paths, fields=field, batched=True).__getitems__([1]).fields)
        + list(TarDataset(paths, fields=field, batched=True).__getitems__([1]).int_fields),
        "subset": keys(TarDataset(paths, fields=field, subset=[1, 2])[0]),
        "stream": keys(next(iter(TarIterableDataset(paths, fields=field)))),
    }
    for name, k in got.items():
        print(field, name, k, flush=True)
        assert k == [field], (name, k)
try:
    ss.sample(0, [b"bin"])
except TypeError as e:
    print("refused", e)
else:
    raise AssertionError("bytes fields read")
print(tarindex.read_kernel())
"""


@pytest.mark.parametrize("pure", ["0", "1"], ids=["compiled", "python"])
def test_bare_string_is_one_field(make_shards: MakeShards, tmp_path: Path, pure: str) -> None:
    paths = make_shards([5, 5])
    env = {"TARINDEX_PURE_PYTHON": pure, "PYTHONPATH": str(Path(tarindex.__file__).parent.parent)}
    p = subprocess.run(
        [sys.executable, "-c", SCRIPT, *paths], capture_output=True, text=True, env=env
    )
    assert p.returncode == 0, p.stdout + p.stderr
    assert ("python" in p.stdout) == (pure == "1") or tarindex.read.kernel.compiled is None


def test_one_fields_rule_and_one_error_at_every_entry_point(make_shards: MakeShards) -> None:
    """Issue 18: ``fields=`` has one normaliser (:mod:`tarindex.read.fields`); a bad value is
    the same :class:`FieldsError` (a ``TypeError`` and a ``ValueError``) on the read paths and
    in the datasets, naming the argument and the bad entry."""
    from tarindex.errors import FieldsError
    from tarindex.read.fields import check_fields, field_set

    assert issubclass(FieldsError, TypeError) and issubclass(FieldsError, ValueError)
    assert check_fields("bin") == ("bin",) and check_fields(["b", "a", "b"]) == ("b", "a")
    assert field_set("bin") == frozenset({"bin"}) and field_set(None) is None
    checked = field_set(("cls",))
    assert field_set(checked) is checked  # taken again as it is (the ds[i] path)
    ss = tarindex.ShardSet(make_shards([5]))
    bad: list[Any] = [
        [b"bin"], frozenset({b"bin"}), ("bin", 3), b"bin", 3, (f for f in ["bin"])
    ]
    for fields in bad:
        reads: tuple[Callable[[Any], object], ...] = (
            lambda f: ss.sample(0, f),
            lambda f: ss.gather([0], f),
            lambda f: ss.read_block(0, 0, 2, f),
            lambda f: ss.takes().read_samples(0, 0, 2, f),
            lambda f: ss.reader(0).sample(0, f),
            check_fields,
            field_set,
        )
        for read in reads:
            with pytest.raises(FieldsError, match="fields="):
                read(fields)
    with pytest.raises(FieldsError, match="int_fields="):
        check_fields([1], "int_fields")  # type: ignore[list-item]
