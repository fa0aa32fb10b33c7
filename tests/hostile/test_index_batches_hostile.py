"""Hostile batches of indices against the one index rule (spanner.check_indices) and the
batch loops that apply it only past their first hand-back (8e12014).

Each case here read the wrong samples or raised an unrelated error before its fix:

- an iterable numpy holds as one object (a generator, a set, a dict, bytes) was one index:
  ``ss.gather({3, 4})`` read sample 3 alone, ``subset={3, 4}`` was a one-sample view,
  ``batched=True`` dropped all but the first, silently;
- a generator through ``gather_packed`` was checked after the loop had read it (the rule saw
  nothing left: a ``ValueError`` from numpy, or an empty batch once the rule took iterables);
- a 0-d index array through ``gather_packed`` (``batched=True``) raised
  ``object of type 'int' has no len()`` where ``gather`` reads it as a batch of one;
- an ``int`` subclass whose ``__int__`` disagrees with its value: numpy read ``__int__``, the
  scalar rule (and list indexing) the value, so a batch read another sample than ``ds[i]``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest

import tarindex
import tarindex.read.kernel
from tarindex.torch.dataset import TarDataset

from ..conftest import MakeShards


class LyingInt(int):
    """An int whose ``int()`` (and ``__index__``) say 0: its value is what Python indexes by."""

    def __int__(self) -> int:
        return 0

    def __index__(self) -> int:
        return 0


@pytest.fixture(params=["compiled", "python"])
def kernel_mode(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    if request.param == "python":
        monkeypatch.setattr(tarindex.read.kernel, "compiled", None)
    elif tarindex.read.kernel.compiled is None:
        pytest.skip(f"needs the compiled loops: {tarindex.read.kernel.read_kernel()}")
    return str(request.param)


def _keys(got: Any) -> list[str]:
    if isinstance(got, list):
        return [d["__key__"] for d in got]
    return list(got.keys)


def _apis(shards: list[str]) -> dict[str, Callable[[Any], list[str]]]:
    def alloc(n: int) -> tuple[None, bytearray]:
        return None, bytearray(n)

    def packed(idx: Any) -> list[str]:
        t = tarindex.ShardSet(shards).takes()
        got = t.gather_packed(idx, None, ("cls",), alloc)
        if got is None:  # more hand-backs than its budget (shards to open): the caller's
            # Python path reads the batch then; the shards are open now, so once more
            got = t.gather_packed(idx, None, ("cls",), alloc)
        assert got is not None, "the compiled batch gave up with its shards open"
        return list(got[1])

    def packed_warm(idx: Any) -> list[str]:  # shards open: the loop hands nothing back
        t = tarindex.ShardSet(shards).takes()
        t.gather_packed([0, 9], None, ("cls",), alloc)
        got = t.gather_packed(idx, None, ("cls",), alloc)
        assert got is not None
        return list(got[1])

    def subset(idx: Any) -> list[str]:
        ds = TarDataset(shards, subset=idx)
        return [ds[k]["__key__"] for k in range(len(ds))]

    return {
        "ShardSet.gather": lambda idx: _keys(tarindex.ShardSet(shards).gather(idx)),
        "TarDataset.__getitems__": lambda idx: _keys(TarDataset(shards).__getitems__(idx)),
        "batched __getitems__": lambda idx: _keys(
            TarDataset(shards, batched=True).__getitems__(idx)
        ),
        "gather_packed": packed,
        "gather_packed, shards open": packed_warm,
        "subset=": subset,
    }


def _gen() -> Iterator[int]:
    yield from (3, 8, 4)


ITERABLES: dict[str, Callable[[], Any]] = {
    "generator": _gen,
    "set": lambda: {3, 8, 4},
    "dict": lambda: dict.fromkeys([3, 8, 4]),
    "bytes": lambda: bytes([3, 8, 4]),
    "frozenset": lambda: frozenset([3, 8, 4]),
}


def test_an_iterable_batch_is_each_of_its_items(make_shards: MakeShards, kernel_mode: str) -> None:
    shards = make_shards([5, 5])
    for name, api in _apis(shards).items():
        for kind, make in ITERABLES.items():
            want = [f"{i:08d}" for i in make()]  # a set's own order, as iterating it gives
            if name == "subset=":
                want.sort()  # a view keeps the base's order
            assert api(make()) == want, f"{name} of a {kind} of indices"


def test_a_0d_index_array_is_a_batch_of_one_everywhere(
    make_shards: MakeShards, kernel_mode: str
) -> None:
    shards = make_shards([5, 5])
    for name, api in _apis(shards).items():
        if name == "TarDataset.__getitems__":
            continue  # torch's sampler hands a list; a plain ds[np.int64(3)] is ds[i]
        for dtype in (np.int64, np.uint8, np.int32):
            assert api(np.asarray(3, dtype)) == ["00000003"], f"{name} of a 0-d {dtype}"
        with pytest.raises(TypeError, match=r"shape \(1, 1\)"):
            api(np.asarray([[3]]))
            pytest.fail(f"{name} read a 2-d batch")


def test_an_int_subclass_is_its_value_as_in_a_single_read(
    make_shards: MakeShards, kernel_mode: str
) -> None:
    shards = make_shards([5, 5])
    ds = TarDataset(shards)
    assert ds[LyingInt(7)]["__key__"] == "00000007"  # the scalar rule: the value (as lists)
    for name, api in _apis(shards).items():
        assert sorted(api([LyingInt(7), 2])) == ["00000002", "00000007"], name
        if name != "subset=":  # a view's indices are in [0, n)
            assert api([np.int64(6), LyingInt(-1)]) == ["00000006", "00000009"], name
