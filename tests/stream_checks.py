"""Checks of the torch-free executors, run by tests/test_stream_core.py in a process where
``import torch`` fails (``sys.modules["torch"] = None``). Each check raises AssertionError if
the logic it covers breaks; ``main`` runs one by name over shard paths given as JSON."""

from __future__ import annotations

import json
import re
import sys
import warnings
from collections import Counter
from typing import Any

import numpy as np

from tarindex import ShardSet
from tarindex.errors import StaleIndexError
from tarindex.plan.mix import mix_bound
from tarindex.stream import BlockPlanSampler, Env, MixedStream, StreamDataset, pack_blocks
from tarindex.stream.pack import Packed

from .plan.test_mix_schedule import window_excess


def idx(ds: Any) -> list[int]:
    return [int(s["__index__"]) for s in ds]


def check_sample(s: dict[str, Any], ss: ShardSet) -> None:
    i = int(s["__index__"])
    assert s["__key__"] == f"{i:08d}" and s["cls"] == b"%d" % (i % 10), s["__key__"]
    assert s["bin"] == ss.sample(i)["bin"] and s["txt"] == f"sample {i}".encode()


def exactly_once(paths: list[str]) -> None:
    """Every (rank, worker) split: equal counts, the plan's order, each sample once."""
    ss = ShardSet(paths)
    n = len(ss)
    assert n % 6 == 0
    for shuffle, buf, on_error in ((True, 8, "raise"), (True, 8, "skip"), (True, 0, "raise"),
                                   (False, 0, "raise")):
        for ws in (1, 2, 3):
            for nw in (1, 2, 3):
                seen: Counter[int] = Counter()
                per_rank = []
                for r in range(ws):
                    counts = []
                    for w in range(nw):
                        ds = StreamDataset(
                            ss, rank=r, world_size=ws, env=Env(w, nw), block_size=4,
                            buffer_size=buf, shuffle=shuffle, seed=5, on_error=on_error,
                        )
                        got = list(ds)
                        for s in got:
                            check_sample(s, ss)
                        order = idx(got)
                        assert order == ds.plan(0, w, nw).order(ss.starts).tolist()
                        counts.append(len(order))
                        seen.update(order)
                    assert sum(counts) == len(ds) == n // ws
                    assert max(counts) - min(counts) <= 1
                    per_rank.append(counts)
                assert all(c == per_rank[0] for c in per_rank), per_rank
                assert sorted(seen) == list(range(n)) and set(seen.values()) == {1}
                if not shuffle and ws == 1 and nw == 1:
                    assert sorted(seen.elements()) == idx(StreamDataset(ss, shuffle=False))


def epochs(paths: list[str]) -> None:
    """The order is a pure function of (seed, epoch); each __iter__ plays the next epoch."""
    ss = ShardSet(paths)
    n = len(ss)
    a = StreamDataset(ss, seed=7, block_size=4, buffer_size=8)
    b = StreamDataset(paths, seed=7, block_size=4, buffer_size=8)  # a source, not a ShardSet
    e0, e1 = idx(a), idx(a)
    assert e0 == idx(b) and sorted(e0) == sorted(e1) == list(range(n))
    assert e0 != e1 and e0 != list(range(n))
    b.set_epoch(1)
    assert idx(b) == e1
    assert (b.state_dict()["epoch"], b.state_dict()["consumed"]) == (1, n)  # played to the end
    assert idx(StreamDataset(ss, seed=8, block_size=4, buffer_size=8)) != e0


def resume(paths: list[str]) -> None:
    """A state taken mid-epoch resumes exactly the rest; the epoch after follows."""
    ss = ShardSet(paths)
    for w, nw in ((0, 1), (1, 2)):
        for kw in ({"buffer_size": 8}, {"buffer_size": 0}, {"shuffle": False}):
            def mk(w: int = w, nw: int = nw, kw: dict[str, Any] = kw) -> StreamDataset:
                return StreamDataset(ss, seed=3, block_size=4, env=Env(w, nw), **kw)

            ref = mk()
            ref.set_epoch(2)
            full, nxt = idx(ref), idx(ref)
            for k in (0, 1, 5, 9, len(full) - 1, len(full)):
                ds = mk()
                ds.set_epoch(2)
                it = iter(ds)
                head = [int(next(it)["__index__"]) for _ in range(k)]
                state = json.loads(json.dumps(ds.state_dict()))  # plain data
                assert (state["epoch"], state["consumed"], state["worker"]) == (2, k, w)
                fresh = mk()
                fresh.load_state_dict(state)
                assert fresh.state_dict() == state  # loaded, not consumed yet
                assert head + idx(fresh) == full, (w, kw, k)
                assert idx(fresh) == nxt
    bad = StreamDataset(ss, seed=3, block_size=5)
    try:
        bad.load_state_dict(StreamDataset(ss, seed=3, block_size=4).state_dict())
    except ValueError as e:
        assert "block_size" in str(e)
    else:
        raise AssertionError("a state of another plan was accepted")


def batch_ids(batches: list[Packed]) -> list[int]:
    return [i for b in batches for i in b.global_index.tolist()]


def batched(paths: list[str]) -> None:
    """Batched output: the same samples as per-sample output, packed right; resume by batch."""
    ss = ShardSet(paths)
    for w, nw in ((0, 1), (1, 2)):
        def mk(w: int = w, nw: int = nw, **k: Any) -> StreamDataset:
            return StreamDataset(ss, seed=4, block_size=3, buffer_size=7, env=Env(w, nw), **k)

        ds = mk(batched=True, batch_size=5)
        full = list(ds)
        assert all(isinstance(b, Packed) and isinstance(b.data, np.ndarray) for b in full)
        samples = ds.plan(0, w, nw).order(ss.starts).tolist()  # whole batches per worker
        assert batch_ids(full) == samples
        if nw == 1:  # the rank yields the same samples as unbatched, in the same order
            assert samples == idx(mk())
        assert [len(b.keys) for b in full[:-1]] == [5] * (len(full) - 1)
        for b in full:
            f = b.fields.index("bin")
            for r, i in enumerate(b.global_index.tolist()):
                want = ss.sample(i)
                got = b.data[b.offsets[f, r] : b.offsets[f, r + 1]].tobytes()
                assert got == want["bin"] and b.ints["cls"][r] == i % 10
                assert b.keys[r] == want["__key__"] and b.shards[r] == want["__shard__"]
        for k in (1, 2):
            ds = mk(batched=True, batch_size=5)
            it = iter(ds)
            head = [next(it) for _ in range(k)]
            state = ds.state_dict()
            assert state["consumed"] == 5 * k
            fresh = mk(batched=True, batch_size=5)
            fresh.load_state_dict(state)
            assert batch_ids(head + list(fresh)) == samples
    blk = ss.read_block(0, 0, int(ss.counts[0]), None)
    packed = pack_blocks([(blk, np.asarray([2, 0], np.int64))])
    assert packed.global_index.tolist() == [2, 0] and packed.ints["cls"].tolist() == [2, 0]


def mixing(paths: list[str], paths_b: list[str], paths_c: list[str]) -> None:
    """Exact counts per source, the window bound, each sample once, workers, resume."""
    shard_sets = [ShardSet(p) for p in (paths, paths_b, paths_c)]
    sizes = [len(s) for s in shard_sets]
    counts = [sizes[0], sizes[1] // 2, sizes[2]]

    def mk(w: int = 0, nw: int = 1) -> MixedStream:
        srcs = [StreamDataset(s, block_size=4, buffer_size=8) for s in shard_sets]
        return MixedStream(srcs, counts=counts, seed=1, source_key="__source__", env=Env(w, nw))

    got = [(int(s["__source__"]), int(s["__index__"])) for s in mk()]
    src = np.asarray([g[0] for g in got], np.int64)
    assert Counter(src.tolist()) == {0: counts[0], 1: counts[1], 2: counts[2]}
    assert (window_excess(src, counts) <= mix_bound(counts) + 1e-9).all()
    assert len(set(got)) == len(got)  # no replacement: each mixed-in sample once
    assert {i for s, i in got if s == 0} == set(range(sizes[0]))
    order = mk().order(0)
    assert got == list(zip(order[0].tolist(), order[1].tolist(), strict=True))
    parts = [[(int(s["__source__"]), int(s["__index__"])) for s in mk(w, 2)] for w in range(2)]
    assert sorted(parts[0] + parts[1]) == sorted(got) and len(parts[0]) - len(parts[1]) == 1
    for k in (0, 7, len(parts[1]) - 1):
        m = mk(1, 2)
        it = iter(m)
        head = [(int(s["__source__"]), int(s["__index__"])) for s in (next(it) for _ in range(k))]
        fresh = mk(1, 2)
        fresh.load_state_dict(m.state_dict())
        rest = [(int(s["__source__"]), int(s["__index__"])) for s in fresh]
        assert head + rest == parts[1], k
    again = mk()

    def pairs(m: MixedStream) -> list[tuple[int, int]]:
        return [(int(s["__source__"]), int(s["__index__"])) for s in m]

    assert pairs(again) == got  # a fresh mix replays epoch 0
    second = pairs(again)  # its next __iter__ plays epoch 1: another order, the same counts
    assert second != got and Counter(s for s, _ in second) == Counter(src.tolist())


def on_error(paths: list[str]) -> None:
    """on_error="skip": an unreadable shard is warned about (path, samples) and left out."""
    ss = ShardSet(paths)
    n, lo, hi = len(ss), int(ss.starts[1]), int(ss.starts[2])
    skip = StreamDataset(ss, on_error="skip", block_size=4, buffer_size=8, seed=0)
    fresh = StreamDataset(ShardSet(paths), block_size=4, buffer_size=8, seed=0)
    with open(paths[1], "ab") as f:  # the tar no longer matches its index
        f.write(b"\0" * 1024)
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        got = idx(skip)
    assert sorted(got) == [i for i in range(n) if not lo <= i < hi]
    assert skip.state_dict()["consumed"] == n  # skipped positions are passed too
    msgs = [str(x.message) for x in w]
    spans = [re.search(r"skipped samples (\d+)\.\.(\d+)", m) for m in msgs]
    assert msgs and all(paths[1] in m for m in msgs), msgs
    assert sum(int(s.group(2)) - int(s.group(1)) for s in spans if s) == hi - lo
    try:
        list(fresh)
    except StaleIndexError as e:
        assert paths[1] in str(e)
    else:
        raise AssertionError("on_error='raise' read a changed shard")
    good = ShardSet(paths[:1] + paths[2:])

    def picky(s: dict[str, Any]) -> int:
        if int(s["__index__"]) % 5 == 0:
            raise KeyError("no fives")
        return int(s["__index__"])

    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        got = list(StreamDataset(good, transform=picky, on_error="skip", block_size=4))
    assert sorted(got) == [i for i in range(len(good)) if i % 5]
    assert len(w) == len(range(0, len(good), 5)) and all("skipped" in str(x.message) for x in w)
    try:
        list(StreamDataset(good, transform=picky, block_size=4))
    except KeyError:
        pass
    else:
        raise AssertionError("on_error='raise' swallowed a transform error")


def samplers(paths: list[str]) -> None:
    """The planned samplers' core: equal shares, each index once, resume on another world size."""
    n = len(ShardSet(paths))
    heads, states = [], []
    for r in range(3):
        s = BlockPlanSampler(n, block_size=4, rank=r, world_size=3, seed=2)
        it = iter(s)
        heads.append([next(it) for _ in range(5)])
        states.append(s.state_dict())
    rests = []
    for r in range(2):
        s = BlockPlanSampler(n, block_size=4, rank=r, world_size=2, seed=2)
        s.load_state_dict(states[0])
        rests.append(list(s))
    assert {len(r) for r in rests} == {(n - 15 + 1) // 2}  # 51 left: 26 each, 1 repeated
    c = Counter(i for p in heads + rests for i in p)
    assert sorted(c) == list(range(n)) and sum(c.values()) == n + 1


def imports() -> None:
    """tarindex.stream and all its modules import without torch, and import no torch layer."""
    import importlib
    import pkgutil

    import tarindex.stream as pkg

    for m in pkgutil.iter_modules(pkg.__path__):
        importlib.import_module(f"tarindex.stream.{m.name}")
    assert sys.modules["torch"] is None
    assert not [m for m in sys.modules if m.startswith("tarindex.torch")]


def main() -> None:
    name, args = sys.argv[1], json.loads(sys.argv[2])
    globals()[name](*args)
    assert sys.modules.get("torch") is None, "torch was imported"
    print("ok", name)


if __name__ == "__main__":
    main()
