"""Real torch.distributed (gloo, loopback): one process launch per world size runs every config.

Each rank runs all configurations (datasets x remainder policy x epochs, spawn + persistent
workers, the map-style BlockSampler) inside one process group and writes what it saw to a JSON
file; the test then checks exactly-once, equal counts, epoch changes and the exact order the
plan predicts. Launch costs dominate on 2 cores, so configurations share launches.
"""

from __future__ import annotations

import datetime
import json
import os
import socket
import time
import traceback
from collections import Counter
from typing import Any

import pytest

torch = pytest.importorskip("torch")

import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as tmp  # noqa: E402
from torch.utils.data import DataLoader  # noqa: E402

from tarindex import BlockSampler, TarDataset, TarIterableDataset  # noqa: E402

BS = 4
KW: dict[str, Any] = {"block_size": 4, "buffer_size": 8, "seed": 5}
DATASETS = {
    "uneven7": [13, 5, 11, 1, 9, 17, 10],  # 66 samples: divides by 2 and 3
    "odd": [5, 7, 5],  # 17 samples: remainder with both world sizes
    "one": [12],  # one shard for ranks x workers = 4 and 6 slots
}


# A spawned rank's default start method is spawn (each worker would import torch again, seconds
# on 2 cores): fork the per-epoch workers explicitly where the platform has fork.
FORK = "fork" if "fork" in tmp.get_all_start_methods() else None


def indices(batch: list[dict[str, Any]]) -> list[int]:
    return [int(s["__index__"]) for s in batch]


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def loader_batches(ds: TarIterableDataset, epoch: int, nw: int, bs: int = BS) -> list[list[int]]:
    """The batches a DataLoader with ``nw`` workers yields, from the plan: workers take turns."""
    per = [ds.plan(epoch, w, nw).order(ds.shards.starts).tolist() for w in range(nw)]
    batches = [[o[i : i + bs] for i in range(0, len(o), bs)] for o in per]
    return [b[k] for k in range(max(map(len, batches))) for b in batches if k < len(b)]


def _rank_main(rank: int, ws: int, port: int, paths: dict[str, list[str]], out: str) -> None:
    os.environ.update(
        GLOO_SOCKET_IFNAME="lo",
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        RANK=str(rank),
        WORLD_SIZE=str(ws),
    )
    res: dict[str, Any] = {}
    try:
        # built before the process group exists: rank unresolved until the parent pickles it
        early = TarIterableDataset(paths["uneven7"], **KW)
        dist.init_process_group(
            "gloo",
            init_method=f"tcp://127.0.0.1:{port}",
            rank=rank,
            world_size=ws,
            timeout=datetime.timedelta(seconds=60),
        )
        for name, p in paths.items():
            for drop_last in (False, True):
                ds = TarIterableDataset(p, drop_last=drop_last, **KW)  # rank from torch.distributed
                loader = DataLoader(
                    ds,
                    batch_size=BS,
                    num_workers=2,
                    collate_fn=indices,
                    timeout=60,
                    multiprocessing_context=FORK,
                )
                for e in (0, 1, 0):
                    ds.set_epoch(e)
                    res[f"{name}/{drop_last}/{e}"] = {"len": len(ds), "batches": list(loader)}
        if ws == 2:  # spawned, persistent workers: rank resolved in the parent, epochs advance
            # one spawned worker per rank keeps the launch cost down (a spawn imports torch)
            loader = DataLoader(
                early,
                batch_size=BS,
                num_workers=1,
                collate_fn=indices,
                timeout=60,
                multiprocessing_context="spawn",
                persistent_workers=True,
            )
            for e in (0, 1):
                res[f"spawn/{e}"] = {"len": len(early), "batches": list(loader)}
        mapds = TarDataset(paths["uneven7"])
        for drop_last in (False, True):
            for name, p in (("uneven7", mapds), ("odd", TarDataset(paths["odd"]))):
                s = BlockSampler(p, block_size=4, seed=5, drop_last=drop_last)
                for e in (0, 1, 0):
                    s.set_epoch(e)
                    got = list(DataLoader(p, batch_size=BS, sampler=s, collate_fn=indices))
                    res[f"sampler/{name}/{drop_last}/{e}"] = {"len": len(s), "batches": got}
        dist.barrier()
    except BaseException:
        res = {"error": traceback.format_exc()}
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
    with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
        json.dump(res, f)


def launch(ws: int, paths: dict[str, list[str]], out: str, timeout: float) -> list[dict[str, Any]]:
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    ctx = tmp.get_context("spawn")
    procs = [
        ctx.Process(target=_rank_main, args=(r, ws, free_port() if r < 0 else port, paths, out))
        for port in [free_port()]
        for r in range(ws)
    ]
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


def check_union(per_rank: list[list[int]], n: int, ws: int, drop_last: bool) -> None:
    c = Counter(i for p in per_rank for i in p)
    if n % ws == 0 or drop_last:
        assert set(c.values()) == {1} and len(c) == n - (n % ws if drop_last else 0)
    else:
        assert sorted(c) == list(range(n)) and sum(c.values()) == n + ws - n % ws


@pytest.mark.dist
@pytest.mark.timeout(240)
@pytest.mark.parametrize("ws", [2, 3])
def test_distributed_epochs(ws: int, make_shards: Any, tmp_path: Any) -> None:
    paths = {name: make_shards(sizes, name=name) for name, sizes in DATASETS.items()}
    out = tmp_path / "results"
    out.mkdir()
    results = launch(ws, paths, str(out), timeout=200)

    for name, sizes in DATASETS.items():
        n = sum(sizes)
        for drop_last in (False, True):
            orders: dict[int, list[list[int]]] = {}
            for e in (0, 1, 0):
                runs = [res[f"{name}/{drop_last}/{e}"] for res in results]
                flat = [[i for b in run["batches"] for i in b] for run in runs]
                # equal per-rank samples and batches, and len() is exact
                assert len({len(f) for f in flat}) == 1
                assert all(len(f) == run["len"] for f, run in zip(flat, runs, strict=True))
                assert len({len(run["batches"]) for run in runs}) == 1
                check_union(flat, n, ws, drop_last)
                # exactly the plan (same seed + epoch => same order, computed anywhere)
                for r, run in enumerate(runs):
                    ref = TarIterableDataset(
                        paths[name], rank=r, world_size=ws, drop_last=drop_last, **KW
                    )
                    assert run["batches"] == loader_batches(ref, e, 2), (name, drop_last, e, r)
                if e in orders:
                    assert orders[e] == flat  # same seed and epoch, same order
                orders[e] = flat
            assert orders[0] != orders[1]  # set_epoch changes the order

    if ws == 2:
        for e in (0, 1):
            runs = [res[f"spawn/{e}"] for res in results]
            for r, run in enumerate(runs):
                ref = TarIterableDataset(paths["uneven7"], rank=r, world_size=ws, **KW)
                assert run["batches"] == loader_batches(ref, e, 1)
            check_union([[i for b in run["batches"] for i in b] for run in runs], 66, ws, False)

    for name in ("uneven7", "odd"):
        n = sum(DATASETS[name])
        for drop_last in (False, True):
            got = {e: [res[f"sampler/{name}/{drop_last}/{e}"] for res in results] for e in (0, 1)}
            for runs in got.values():
                flat = [[i for b in run["batches"] for i in b] for run in runs]
                assert all(len(f) == run["len"] for f, run in zip(flat, runs, strict=True))
                assert len({len(run["batches"]) for run in runs}) == 1
                check_union(flat, n, ws, drop_last)
            assert got[0] != got[1]
            assert got[0] == [res[f"sampler/{name}/{drop_last}/0"] for res in results]
