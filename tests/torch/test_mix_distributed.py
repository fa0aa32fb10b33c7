"""Mixing and sampler resume under real torch.distributed (gloo, loopback), 2 and 3 ranks.

One launch per world size runs every configuration: MixedDataset through a 2-worker DataLoader
(exactly-once, equal counts, the planned order), MixSampler over concatenated TarDatasets, and a
BlockSampler checkpoint taken on 2 ranks (StatefulDataLoader, 2 workers) and resumed on 3.
"""

from __future__ import annotations

import datetime
import json
import os
import time
import traceback
from collections import Counter
from typing import Any

import pytest

torch = pytest.importorskip("torch")
sdl = pytest.importorskip("torchdata.stateful_dataloader")

import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as tmp  # noqa: E402
from torch.utils.data import ConcatDataset, DataLoader  # noqa: E402

from tarindex import (  # noqa: E402
    BlockSampler,
    MixedDataset,
    MixSampler,
    TarDataset,
    TarIterableDataset,
)

from .test_distributed import FORK, free_port  # noqa: E402

BS = 4
SIZES = {"a": [13, 5, 11, 1, 9, 17, 10], "b": [40, 20], "c": [6]}  # 66 + 60 + 6 = 132
CONFIGS: dict[str, dict[str, Any]] = {
    "exact": {"counts": [66, 60, 6]},  # 132: divisible by 2 and 3, every sample once
    "odd": {"counts": [66, 60, 7], "replacement": [False, False, True]},  # 133: padding
    "weights": {"weights": [0.5, 0.3, 0.2], "replacement": True, "samples_per_epoch": 120},
}
SAMPLER_STEPS = 5  # batches each rank takes before the checkpoint


def ids(batch: list[dict[str, Any]]) -> list[list[int]]:
    return [[int(s["__source__"]), int(s["__index__"])] for s in batch]


def keys(batch: list[dict[str, Any]]) -> list[str]:
    return [str(s["__shard__"]) + "/" + str(s["__key__"]) for s in batch]


def make_mix(paths: dict[str, list[str]], cfg: str, **kw: Any) -> MixedDataset:
    srcs = [TarIterableDataset(paths[n], block_size=4, buffer_size=8) for n in SIZES]
    return MixedDataset(srcs, seed=3, source_key="__source__", **CONFIGS[cfg], **kw)


def block_sampler(paths: dict[str, list[str]], **kw: Any) -> tuple[TarDataset, BlockSampler]:
    ds = TarDataset(paths["a"])
    s = BlockSampler(ds, block_size=4, buffer_size=8, seed=2, **kw)
    s.set_epoch(1)
    return ds, s


def _rank_main(rank: int, ws: int, port: int, paths: dict[str, list[str]], out: str) -> None:
    os.environ.update(GLOO_SOCKET_IFNAME="lo", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(ws))
    res: dict[str, Any] = {}
    try:
        dist.init_process_group(
            "gloo",
            init_method=f"tcp://127.0.0.1:{port}",
            rank=rank,
            world_size=ws,
            timeout=datetime.timedelta(seconds=60),
        )
        for cfg in CONFIGS:
            mix = make_mix(paths, cfg)  # rank from torch.distributed
            loader = DataLoader(
                mix,
                batch_size=BS,
                num_workers=2,
                collate_fn=ids,
                timeout=60,
                multiprocessing_context=FORK,
            )
            for e in (0, 1):
                mix.set_epoch(e)
                res[f"mix/{cfg}/{e}"] = {"len": len(mix), "batches": list(loader)}
        dss = [TarDataset(paths[n]) for n in SIZES]
        cat: ConcatDataset[Any] = ConcatDataset(dss)
        ms = MixSampler(dss, counts=[66, 60, 6], block_size=4, seed=1)
        got = list(
            DataLoader(
                cat,
                batch_size=BS,
                sampler=ms,
                num_workers=2,
                collate_fn=keys,
                timeout=60,
                multiprocessing_context=FORK,
            )
        )
        res["mixsampler"] = {"len": len(ms), "batches": got}
        # BlockSampler: checkpoint on 2 ranks, resume on 3 (a fresh launch reads rank 0's)
        ds, s = block_sampler(paths)
        loader = sdl.StatefulDataLoader(
            ds,
            batch_size=BS,
            sampler=s,
            num_workers=2,
            collate_fn=keys,
            multiprocessing_context=FORK,
        )
        ckpt = os.path.join(os.path.dirname(out), "sampler_state.json")
        if ws == 2:
            it = iter(loader)
            res["sampler_head"] = [next(it) for _ in range(SAMPLER_STEPS)]
            if rank == 0:
                with open(ckpt, "w") as f:
                    json.dump(loader.state_dict(), f)
            del it
        else:
            with open(ckpt) as f:
                loader.load_state_dict(json.load(f))
            res["sampler_rest"] = list(loader)
        dist.barrier()
    except BaseException:
        res = {"error": traceback.format_exc()}
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
    with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
        json.dump(res, f)


def launch(ws: int, paths: dict[str, list[str]], out: str, timeout: float) -> list[dict[str, Any]]:
    os.makedirs(out)
    ctx = tmp.get_context("spawn")
    port = free_port()
    procs = [ctx.Process(target=_rank_main, args=(r, ws, port, paths, out)) for r in range(ws)]
    for p in procs:
        p.start()
    deadline = time.monotonic() + timeout
    for p in procs:
        p.join(max(0.1, deadline - time.monotonic()))
    hung = [i for i, p in enumerate(procs) if p.is_alive()]
    for p in procs:
        if p.is_alive():
            p.kill()
            p.join(5)
    assert not hung, f"ranks {hung} of {ws} still running after {timeout}s (hang)"
    results = []
    for r, p in enumerate(procs):
        path = os.path.join(out, f"rank{r}.json")
        assert os.path.exists(path), f"rank {r} exited with {p.exitcode} and wrote no result"
        with open(path) as f:
            res = json.load(f)
        assert "error" not in res, f"rank {r}:\n{res['error']}"
        results.append(res)
    return results


def planned_batches(mix: MixedDataset, epoch: int, nw: int = 2) -> list[list[list[int]]]:
    """The batches a DataLoader with nw workers yields, from the plan: workers take turns."""
    per = []
    for w in range(nw):
        src, idx = mix.order(epoch, w, nw)
        pairs = [[int(a), int(b)] for a, b in zip(src.tolist(), idx.tolist(), strict=True)]
        per.append([pairs[i : i + BS] for i in range(0, len(pairs), BS)])
    return [b[k] for k in range(max(map(len, per))) for b in per if k < len(b)]


@pytest.mark.dist
@pytest.mark.slow  # two launches: ~50 s on 2 idle cores
@pytest.mark.timeout(420)
def test_mix_and_sampler_resume_under_gloo(make_shards: Any, tmp_path: Any) -> None:
    paths = {n: make_shards(sizes, name=n, seed=i) for i, (n, sizes) in enumerate(SIZES.items())}
    heads: list[list[list[str]]] = []
    for ws in (2, 3):
        results = launch(ws, paths, str(tmp_path / f"ws{ws}"), timeout=190)
        for cfg in CONFIGS:
            for e in (0, 1):
                runs = [res[f"mix/{cfg}/{e}"] for res in results]
                flat = [[tuple(x) for b in run["batches"] for x in b] for run in runs]
                ref = [make_mix(paths, cfg, rank=r, world_size=ws) for r in range(ws)]
                # equal samples and batches per rank, len() exact, the planned order
                assert {len(f) for f in flat} == {run["len"] for run in runs} == {len(ref[0])}
                assert len({len(run["batches"]) for run in runs}) == 1
                for r, run in enumerate(runs):
                    assert run["batches"] == planned_batches(ref[r], e), (cfg, e, r)
                c = Counter(x for f in flat for x in f)
                n = int(ref[0].counts.sum())
                if cfg == "exact":  # without replacement and ws | n: every sample exactly once
                    want = [(s, i) for s, sz in enumerate(SIZES.values()) for i in range(sum(sz))]
                    assert sorted(c) == want and set(c.values()) == {1}
                assert sum(c.values()) == ws * -(-n // ws)
            e0 = [res[f"mix/{cfg}/0"]["batches"] for res in results]
            assert e0 != [res[f"mix/{cfg}/1"]["batches"] for res in results]
        runs = [res["mixsampler"] for res in results]
        flat = [k for run in runs for b in run["batches"] for k in b]
        assert {run["len"] for run in runs} == {132 // ws} and len(flat) == 132 == len(set(flat))
        if ws == 2:
            heads = [res["sampler_head"] for res in results]
        else:
            rests = [res["sampler_rest"] for res in results]
            ds, s = block_sampler(paths, rank=0, world_size=1)
            allkeys = [str(ds[i]["__shard__"]) + "/" + str(ds[i]["__key__"]) for i in range(66)]
            seen = Counter(k for part in heads + rests for b in part for k in b)
            # 66 - 2 ranks x 5 batches x 4 = 26 left over 3 ranks: 9 each, 1 padded twice
            assert {sum(map(len, r)) for r in rests} == {9}
            assert sorted(seen) == sorted(allkeys) and sum(seen.values()) == 67
