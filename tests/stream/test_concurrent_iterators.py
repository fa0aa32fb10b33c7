"""Two iterators of one object at once: ``state_dict`` is the newest one's place, exactly.

Each ``__iter__`` keeps its own progress (:class:`tarindex.stream.epochs.Progress`). Before,
every iterator wrote one shared counter, so an older iterator still being consumed moved the
``consumed`` of the state describing the newest one: a resume from it skipped or repeated
samples, silently. Here the older one runs on after the state is taken, and the state must
not move; resuming from it must continue the newest iterator exactly.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from tarindex import (  # noqa: E402
    BlockSampler,
    MixedDataset,
    MixSampler,
    TarDataset,
    TarIterableDataset,
)


def ident(x: Any) -> Any:
    """A sample's key, a batch's keys, or a sampler's index: what the runs compare."""
    if isinstance(x, dict):
        return str(x["__key__"])
    if hasattr(x, "keys") and not isinstance(x, int):
        return [str(k) for k in x.keys]
    return int(x)


def take(it: Iterator[Any], n: int) -> list[Any]:
    return [ident(next(it)) for _ in range(n)]


@pytest.fixture
def shards(make_shards: Any) -> list[str]:
    return list(make_shards([25] * 4, name="four"))


def makers(paths: list[str]) -> dict[str, Callable[[], Any]]:
    kw: dict[str, Any] = {"block_size": 8, "buffer_size": 16, "seed": 5}
    return {
        "stream": lambda: TarIterableDataset(paths, **kw),
        "stream batched": lambda: TarIterableDataset(paths, batch_size=4, batched=True, **kw),
        "mixed": lambda: MixedDataset(
            [TarIterableDataset(paths[:2], **kw), TarIterableDataset(paths[2:], **kw)],
            counts=[30, 30],
            seed=3,
        ),
        "block sampler": lambda: BlockSampler(TarDataset(paths), block_size=8, seed=2),
        "mix sampler": lambda: MixSampler([TarDataset(paths), 30], counts=[60, 20], seed=4),
    }


@pytest.mark.parametrize(
    "kind", ["stream", "stream batched", "mixed", "block sampler", "mix sampler"]
)
def test_an_older_iterator_never_moves_the_newest_ones_state(
    shards: list[str], kind: str
) -> None:
    make = makers(shards)[kind]
    ds = make()
    old = iter(ds)
    take(old, 7)
    new = iter(ds)  # the next epoch (streaming) or the next sampler epoch
    head = take(new, 3)
    state = ds.state_dict()
    assert state["consumed"] == (12 if kind == "stream batched" else 3), state
    take(old, 5)  # the older iterator goes on
    assert ds.state_dict() == state
    rest = [ident(x) for x in new]
    resumed = make()
    resumed.load_state_dict(state)
    assert [ident(x) for x in resumed] == rest  # the newest iterator's continuation, exactly
    assert len(head) + len(rest) > 3
