"""Streaming lets a sample go once it has yielded the next: no window or block is kept alive.

A consumer decodes samples in place; a stream that kept the yielded dicts of its current
window (or block) would keep every decoded image of it alive. After ``next()`` returns sample
``i + 1``, sample ``i`` is referenced by the test alone (``sys.getrefcount`` counts its own
argument too, so 2).
"""

from __future__ import annotations

import sys
from collections.abc import Iterable
from typing import Any

import pytest

pytest.importorskip("torch")

from tarindex import MixedDataset, TarIterableDataset  # noqa: E402


def held_after_next(stream: Iterable[Any]) -> list[int]:
    """Per sample but the last: its reference count once the stream has yielded the next."""
    out, it = [], iter(stream)
    prev = next(it)
    for x in it:
        out.append(sys.getrefcount(prev))
        prev = x
    return out


@pytest.mark.parametrize(
    ("buffer_size", "shuffle", "on_error"),
    [(16, True, "raise"), (0, True, "raise"), (16, False, "raise"), (16, True, "skip")],
)
def test_single_source_lets_samples_go(
    make_shards: Any, buffer_size: int, shuffle: bool, on_error: str
) -> None:
    ds = TarIterableDataset(
        make_shards([30, 20]),
        block_size=4,
        buffer_size=buffer_size,
        shuffle=shuffle,
        on_error=on_error,
    )
    counts = held_after_next(ds)
    assert len(counts) == 49 and set(counts) == {2}


@pytest.mark.parametrize("source_key", [None, "__source__"])
def test_mix_lets_samples_go(make_shards: Any, source_key: str | None) -> None:
    srcs = [
        TarIterableDataset(make_shards(sizes, name=name), block_size=4, buffer_size=16)
        for name, sizes in (("a", [30, 20]), ("b", [12]), ("c", [5]))
    ]
    mix = MixedDataset(srcs, counts=[50, 12, 5], source_key=source_key)
    counts = held_after_next(mix)
    assert len(counts) == 66 and set(counts) == {2}
    # a mix resumed mid-epoch (windows cut from the worker's start, the first partly skipped)
    mix.load_state_dict({**mix.state_dict(), "consumed": 23})
    counts = held_after_next(mix)
    assert len(counts) == 43 and set(counts) == {2}


def test_a_kept_window_would_fail(make_shards: Any) -> None:
    """The check can fail: a stream that holds its window's samples is caught."""
    ds = TarIterableDataset(make_shards([30]), block_size=4, buffer_size=16)

    def holding() -> Any:
        window: list[Any] = []
        for x in ds:
            window.append(x)
            if len(window) == 16:
                window = []
            yield x

    assert max(held_after_next(holding())) > 2
