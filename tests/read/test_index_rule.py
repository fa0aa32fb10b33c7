"""One index rule for every read path (issue 19 item 6): nothing wraps, truncates or parses.

``ds[i]``, ``get``, ``locate``, ``gather``, ``gather_packed``, ``take``, ``__getitems__``
(plain and ``batched=True``) and ``subset=`` take Python or numpy integers in range; a huge
index (``2**64 - 1`` wrapped to ``-1`` before) is a ``SampleIndexError`` naming it and the
valid range, a float, string or bool a ``TypeError``; in the compiled and Python loops alike.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

import tarindex
import tarindex.read.kernel
from tarindex.errors import SampleIndexError
from tarindex.torch.dataset import TarDataset

from ..conftest import MakeShards

HUGE: list[int | np.integer[Any]] = [
    2**64 - 1,
    2**64,
    2**63,
    np.uint64(2**64 - 1),
    -(2**63) - 1,
    10,
    -11,
]
NOT_INT: list[Any] = [1.7, "1", True, np.bool_(True), np.float64(1.0), None]
# types with __index__ that are no integer: "out of range" would be the wrong error
NOT_INT += [np.asarray([1, 2]), np.asarray([[3]])]


def _paths(shards: list[str]) -> dict[str, Callable[[Any], object]]:
    ss = tarindex.ShardSet(shards)
    ds, dsb = TarDataset(shards), TarDataset(shards, batched=True)
    sub = TarDataset(shards, subset=[0, 3, 7])

    def alloc(n: int) -> tuple[None, bytearray]:
        return None, bytearray(n)

    return {
        "ds[i]": lambda i: ds[i],
        "get": lambda i: ss.sample(i),
        "locate": lambda i: ss.locate(i),
        "gather": lambda i: ss.gather([0, i]),
        "gather ndarray": lambda i: ss.gather(np.asarray([i])),
        "gather_packed": lambda i: ss.takes().gather_packed([i, 0], None, ("cls",), alloc),
        "take": lambda i: ss.takes().take([0, i]),
        "__getitems__": lambda i: ds.__getitems__([0, i]),
        "batched": lambda i: dsb.__getitems__([i]),
        "subset=": lambda i: TarDataset(shards, subset=[1, i]),
        "subset ds[i]": lambda i: sub[i],
        "subset batch": lambda i: sub.__getitems__([i]),
    }


@pytest.fixture(params=["compiled", "python"])
def kernel_mode(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    if request.param == "python":
        monkeypatch.setattr(tarindex.read.kernel, "compiled", None)
    elif tarindex.read.kernel.compiled is None:
        pytest.skip(f"needs the compiled loops: {tarindex.read.kernel.read_kernel()}")
    return str(request.param)


def test_out_of_range_never_wraps(make_shards: MakeShards, kernel_mode: str) -> None:
    paths = _paths(make_shards([5, 5]))
    for name, f in paths.items():
        for bad in HUGE:
            with pytest.raises(SampleIndexError, match=rf"{int(bad)} out of range \[-?\d+, \d+\)"):
                f(bad)
                pytest.fail(f"{name}: index {bad!r} read a sample")


def test_non_integers_are_refused(make_shards: MakeShards, kernel_mode: str) -> None:
    paths = _paths(make_shards([5, 5]))
    for name, f in paths.items():
        for bad in NOT_INT:
            with pytest.raises(TypeError, match="is not an integer|is one-dimensional"):
                f(bad)
                pytest.fail(f"{name}: index {bad!r} read a sample")


def test_good_indices_agree(make_shards: MakeShards, kernel_mode: str) -> None:
    shards = make_shards([5, 5])
    ss = tarindex.ShardSet(shards)
    keys = [f"{i:08d}" for i in range(10)]
    for i in (0, 7, -1, -10, np.int64(3), np.uint64(9), np.int8(-2)):
        want = keys[int(i)]
        assert ss.sample(i)["__key__"] == want  # type: ignore[arg-type]
        assert ss.gather([i]).to_samples()[0]["__key__"] == want  # type: ignore[list-item]
        assert ss.takes().take([i])[0]["__key__"] == want  # type: ignore[list-item]

    class Four:
        def __index__(self) -> int:
            return 4

    assert ss.sample(Four())["__key__"] == keys[4]  # type: ignore[arg-type]  # as list indexing
    assert ss.gather([Four(), 1]).to_samples()[0]["__key__"] == keys[4]  # type: ignore[list-item]
    u = np.asarray([9, 0, 2**63 - 1], np.uint64)
    with pytest.raises(SampleIndexError, match="9223372036854775807 out of range"):
        ss.gather(u)
    got = ss.gather(np.asarray([9, 0], np.uint64)).to_samples()
    assert [s["__key__"] for s in got] == [keys[9], keys[0]]
    assert (
        TarDataset(shards, subset=np.asarray([4, 1], np.uint64)).shards.sample(0)["__key__"] == keys[1]
    )
    with pytest.raises(SampleIndexError, match=r"-1 out of range \[0, 10\)"):
        TarDataset(shards, subset=[-1])  # a subset's indices do not count from the end


def test_a_float_tensor_is_no_integer(make_shards: MakeShards) -> None:
    """torch.tensor(1.5) has ``__index__`` (which raises): a TypeError, not "out of range"."""
    torch = pytest.importorskip("torch")
    paths = _paths(make_shards([5, 5]))
    for name, f in paths.items():
        with pytest.raises(TypeError, match="is not an integer"):
            f(torch.tensor(1.5))
            pytest.fail(f"{name}: read a sample")
    assert TarDataset(make_shards([5, 5], name="t"))[torch.tensor(3)]["__index__"] == 3


def test_a_batch_of_batches_is_not_flattened(make_shards: MakeShards) -> None:
    """A 2-d index array read 2 samples on some paths and raised "out of range" on others."""
    shards = make_shards([5, 5])
    ss = tarindex.ShardSet(shards)
    dsb = TarDataset(shards, batched=True)
    paths: list[Callable[[Any], object]] = [
        ss.gather,
        ss.takes().take,
        dsb.__getitems__,
        lambda x: TarDataset(shards, subset=x),
    ]
    for f in paths:
        with pytest.raises(TypeError, match=r"shape \(1, 2\): a batch of indices is one-dim"):
            f(np.asarray([[1, 2]]))
    assert ss.gather(np.asarray(4)).to_samples()[0]["__index__"] == 4  # 0-d: one index


def test_mask_arrays_are_refused(make_shards: MakeShards) -> None:
    ss = tarindex.ShardSet(make_shards([5, 5]))
    for bad in (np.ones(10, bool), np.asarray([1.0, 2.0]), np.asarray(["1"])):
        with pytest.raises(TypeError, match="is not an integer"):
            ss.gather(bad)
    assert len(ss.gather(np.zeros(0, np.float64))) == 0  # an empty batch of any dtype


def test_reader_sample_numbers(make_shards: MakeShards) -> None:
    with tarindex.ShardReader(make_shards([5])[0]) as r:
        for bad in (True, 1.5, "1"):
            with pytest.raises(TypeError, match="is not an integer"):
                r.sample(bad)  # type: ignore[arg-type]
            with pytest.raises(TypeError, match="is not an integer"):
                r.read_block(bad, 3)  # type: ignore[arg-type]
            with pytest.raises(TypeError, match="is not an integer"):
                r.gather([bad])  # type: ignore[list-item]
        for huge in (2**64 - 1, np.uint64(2**64 - 1), -1):
            with pytest.raises(SampleIndexError, match="out of range"):
                r.sample(huge)  # type: ignore[arg-type]
            with pytest.raises(SampleIndexError, match="out of range"):
                r.gather(np.asarray([huge]))
        assert r.sample(np.int64(4))["__key__"] == "00000004"  # type: ignore[arg-type]
        assert len(r.read_block(np.int64(1), np.uint64(5))) == 4  # type: ignore[arg-type]


def test_batches_pay_for_the_rule_only_when_handed_back(
    make_shards: MakeShards, kernel_mode: str
) -> None:
    """take and gather_packed call the loop first: it takes ints in range and hands anything
    else back, and the rule then runs before any shard is opened for the call (issue 18's
    speed bar: a planner's batch pays nothing for the check); numpy integers still take the
    compiled pass, once converted by the rule."""
    shards = make_shards([5, 5])
    keys = [f"{i:08d}" for i in range(10)]

    def alloc(n: int) -> tuple[None, bytearray]:
        return None, bytearray(n)

    bads: list[tuple[Any, type[Exception]]] = [
        (True, TypeError), (np.int64(10), SampleIndexError), (1.0, TypeError)
    ]
    for bad, err in bads:
        ss = tarindex.ShardSet(shards)
        t = ss.takes()
        with pytest.raises(err):
            t.take([0, 7, bad])
        with pytest.raises(err):
            t.gather_packed([0, 7, bad], None, ("cls",), alloc)
        assert not ss.pool.readers, f"{bad!r}: a shard was opened for a refused batch"
    ss = tarindex.ShardSet(shards)
    batches: list[Any] = [[np.int64(3), np.uint8(9), -1], np.asarray([3, 9, -1], np.int64)]
    for idx in batches:
        got = ss.takes().gather_packed(idx, None, ("cls",), alloc)
        assert got is not None, f"{idx!r}: the kernel's batch did not take numpy integers"
        assert got[1] == [keys[3], keys[9], keys[9]]
        assert [d["__key__"] for d in ss.takes().take(list(idx))] == [keys[3], keys[9], keys[9]]
