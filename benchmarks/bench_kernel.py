"""The read kernel's hot paths, paired in one process: rates that survive a noisy machine.

``run.py`` times each contender in its own child process, and on a shared 2-core VM a row
moves by up to ±30% between runs. This script times tarindex and its limits in ONE process,
each pass with thread CPU time, best of ``--passes``, over the same random samples, so the
ratios (and a before/after pair with ``--before``) are comparable:

* ``limit``: mmap slices of every member of each sample, offsets known in advance (the
  ``ds[i]`` limit of run.py), each dropped at once (its memory is reused, warm, by the next);
* ``limit, batch of 64 held``: the same slices, kept until the batch of 64 they belong to is
  complete, as per-item reads under a ``DataLoader`` are until ``collate_fn`` packs them (the
  per-item bound a batched fetch competes with);
* ``copy limit``: the same members copied into one reused batch buffer, no bookkeeping at
  all (the bound of any path that delivers one buffer per batch, as ``batched=True`` does);
* ``ds[i]``, ``__getitems__`` (list of dicts), ``__getitems__ batched=True``,
  ``fields=("cls",)`` and one shuffled streaming epoch in this process.

Usage: ``python benchmarks/bench_kernel.py [--data GLOB] [--n 20000] [--passes 5]
[--before PATH]``. ``--data`` defaults to run.py's full-mode tarindex shards (run
``python benchmarks/run.py`` once first); ``--before PATH`` also runs the same measurement with
``PYTHONPATH=PATH`` (another checkout's tarindex, e.g. a ``git worktree`` of an older commit)
in a child process, for `--rounds` rounds with the order of the pair flipped each round (the
second run of a pair tends to win), and prints after/before ratios of each tree's best round. A row whose keyword the
older checkout lacks (``batched=``, ``fields=``) prints ``n/a``; a checkout older than the
index format of ``--data`` cannot read it: write the data with that checkout's
``benchmarks/run.py --only write --match tarindex --data DIR`` and pass that to both.
"""

from __future__ import annotations

import argparse
import glob
import json
import mmap
import os
import subprocess
import sys
import time
from collections.abc import Callable

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_DATA = os.path.join(HERE, "_data", "n100000", "tarindex", "*.tar")


def measure(data: str, n: int, passes: int) -> dict[str, float]:
    """Samples/s of each row (thread CPU time, best of ``passes``), in this process."""
    import tarindex

    paths = sorted(glob.glob(data))
    if not paths:
        raise SystemExit(f"{data}: no shards (run python benchmarks/run.py first, or --data)")
    ds = tarindex.TarDataset(paths)

    def optional(**kw: object) -> tarindex.TarDataset | None:
        """A dataset with ``kw``, or None where the checkout measured lacks the keyword."""
        try:
            return tarindex.TarDataset(paths, **kw)  # type: ignore[arg-type]
        except TypeError:
            return None

    dsb = optional(batched=True)
    dsf = optional(fields=("cls",))
    perm = np.random.default_rng(1).permutation(len(ds))[:n].tolist()
    batches = [perm[k : k + 64] for k in range(0, len(perm) - 63, 64)]
    plan: list[tuple[tuple[int, int, int], ...]] = []
    mms: list[mmap.mmap] = []
    for s, p in enumerate(paths):
        with tarindex.ShardReader(p) as r:
            t = r.index
            off, size, sp = t.offset.tolist(), t.size.tolist(), t.sample_ptr.tolist()
            for j in range(r.n_samples):
                plan.append(tuple((s, off[m], off[m] + size[m]) for m in range(sp[j], sp[j + 1])))
        with open(p, "rb") as f:
            mms.append(mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ))
    views = [memoryview(m) for m in mms]
    out = memoryview(bytearray(max(64 * max(sum(b - a for _, a, b in q) for q in plan), 1)))

    def limit() -> None:
        for i in perm:
            for s, a, b in plan[i]:
                mms[s][a:b]

    def held_limit() -> None:
        for bt in batches:  # a DataLoader holds a batch's samples until collate_fn packs them
            kept = [mms[s][a:b] for i in bt for s, a, b in plan[i]]
            del kept

    def copy_limit() -> None:
        for bt in batches:
            d = 0
            for i in bt:
                for s, a, b in plan[i]:
                    out[d : d + b - a] = views[s][a:b]
                    d += b - a

    def dsi() -> None:
        for i in perm:
            ds[i]

    def items() -> None:
        for bt in batches:
            ds.__getitems__(bt)

    def batched() -> None:
        assert dsb is not None
        for bt in batches:
            dsb.__getitems__(bt)

    def fields() -> None:
        assert dsf is not None
        for i in perm:
            dsf[i]

    stream_ds = tarindex.TarIterableDataset(paths, shuffle=True, seed=0)

    def stream() -> None:
        for _ in stream_ds:
            pass

    rows: dict[str, tuple[Callable[[], None], int]] = {
        "limit": (limit, len(perm)),
        "limit, batch of 64 held": (held_limit, 64 * len(batches)),
        "copy limit (one batch buffer)": (copy_limit, 64 * len(batches)),
        "ds[i]": (dsi, len(perm)),
        "__getitems__ (dicts)": (items, 64 * len(batches)),
        "__getitems__ batched=True": (batched, 64 * len(batches)),
        "fields=('cls',)": (fields, len(perm)),
        "streaming epoch": (stream, len(stream_ds)),
    }
    if dsb is None:  # an older checkout (--before): the row is n/a
        del rows["__getitems__ batched=True"]
    if dsf is None:
        del rows["fields=('cls',)"]
    for fn, _ in rows.values():  # warm: page cache, page tables, open readers
        fn()
    best = {name: float("inf") for name in rows}
    for _ in range(passes):  # interleaved, so a slow moment hits every row alike
        for name, (fn, _) in rows.items():
            t0 = time.thread_time()
            fn()
            best[name] = min(best[name], time.thread_time() - t0)
    for v in views:
        v.release()
    return {name: rows[name][1] / best[name] for name in rows}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", default=DEFAULT_DATA, help="glob of tarindex shards")
    ap.add_argument("--n", type=int, default=20_000, help="random samples per pass")
    ap.add_argument("--passes", type=int, default=5)
    ap.add_argument("--before", help="another tarindex checkout to compare (PYTHONPATH)")
    ap.add_argument("--rounds", type=int, default=2,
                    help="with --before: rounds of the pair, the order flipped each round")
    ap.add_argument("--json", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.json:
        print(json.dumps(measure(a.data, a.n, a.passes)))
        return 0
    runs: dict[str, list[dict[str, float]]] = {"now": []}
    if a.before:
        runs["before"] = []
    # A tree run second in a pair tends to win (warm page cache, settled clocks), so the order
    # of the pair flips every round and each tree keeps its best round.
    for rnd in range(max(1, a.rounds) if a.before else 1):
        for which in (list(runs) if rnd % 2 == 0 else list(runs)[::-1]):
            env = dict(os.environ)
            if which == "before":
                env["PYTHONPATH"] = a.before
            cmd = [sys.executable, __file__, "--json", "--data", a.data, "--n", str(a.n),
                   "--passes", str(a.passes)]
            got = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True)
            runs[which].append(json.loads(got.stdout.strip().splitlines()[-1]))
    best: dict[str, dict[str, float]] = {
        w: {k: max(r[k] for r in rs) for k in rs[0]} for w, rs in runs.items()
    }
    now = best["now"]
    print(f"{'row':32s} {'now /s':>10s} {'of limit':>9s}" + ("  before /s  now/before"
                                                            if a.before else ""))
    for k, v in now.items():
        line = f"{k:32s} {v / 1e3:9.1f}k {v / now['limit']:9.2f}"
        b = best.get("before", {}).get(k)
        if a.before and b is None:
            line += f" {'n/a':>11s} {'':>11s}"  # the older checkout has no such keyword
        elif b is not None:
            line += f" {b / 1e3:10.1f}k {v / b:10.2f}x"
        print(line)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
