"""Cut a shard from another process while it is read, on every read path; count the SIGBUS deaths.

Issue 19 item 3: a tar truncated by another process while a reader has it mapped must raise
``TruncatedError`` (or ``StaleIndexError``: it changed), never kill the reader with SIGBUS.
For each trial a fresh copy of a 2-shard set (48 samples of 256 KB each: copies long enough
for a cut to land inside one) is opened by a forked reader that loops over
random reads on one path; once it has read, this process (another process than the reader)
truncates both tars to 100 KB with ``os.truncate`` after a random 0-20 ms, and the reader's
fate is recorded:

- ``error``: it raised ``TruncatedError``/``StaleIndexError`` naming the tar (the goal);
- ``SIGBUS`` (or another signal): it died, or a DataLoader worker did (torch reports a worker's
  SIGBUS as "Unexpected bus error encountered in worker" and "worker ... exited
  unexpectedly");
- ``other``: another exception, or no error within 30 s; ``hung``: no exit within 90 s.

Paths: ``getitem`` (``ds[i]``), ``getitems`` (``ds.__getitems__``), ``batched``
(``TarDataset(batched=True)``), ``stream`` (``TarIterableDataset`` per sample), ``stream-
batched`` (``batched=True, batch_size=16``); each in-process and through a ``DataLoader``
with 2 worker processes (``--workers``). The kernel is the compiled one unless
``TARINDEX_PURE_PYTHON=1``.

    python tools/cut_while_mapped.py --trials 100            # the issue's count, every path
    python tools/cut_while_mapped.py --trials 3 --json       # what tests/hostile runs

Needs torch (the datasets and the DataLoader). Linux (``os.fork``).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import select
import shutil
import signal
import sys
import tempfile
import time
from typing import Any

PATHS = ("getitem", "getitems", "batched", "stream", "stream-batched")
CUT_TO = 100_000
"""Bytes the tars are cut to (the issue's 100 KB)."""


def make_source(d: str, n: int = 48, size: int = 256 << 10) -> list[str]:
    """Two shards of ``n`` samples with a ``bin`` of ``size`` random bytes and a ``cls``."""
    import tarindex

    rng = random.Random(0)
    paths = []
    for s in range(2):
        p = os.path.join(d, f"src-{s}.tar")
        with tarindex.ShardWriter(p, maxcount=n, mtime=0) as w:
            for i in range(n):
                w.write({"__key__": f"{s}-{i:06d}", "bin": rng.randbytes(size), "cls": i % 10})
        paths.append(p)
    return paths


def _read_loop(path: str, tars: list[str], workers: int, ready: int) -> int:
    """The reader (a forked child): read, say so after the first read, read until the cut
    shows; an exit code."""
    import numpy as np
    import torch.utils.data

    import tarindex
    from tarindex.errors import StaleIndexError, TruncatedError

    def ok(e: BaseException) -> bool:
        text = str(e)
        return isinstance(e, (TruncatedError, StaleIndexError)) and any(t in text for t in tars)

    torch.set_num_threads(1)  # no thread pool in a process that forks DataLoader workers
    rng = np.random.default_rng(os.getpid())
    said = [False]

    def reading() -> None:  # after the first read (DataLoader: the first batch from a worker)
        if not said[0]:
            said[0] = True
            os.write(ready, b"r")

    deadline = time.monotonic() + 30  # a loaded machine: an epoch in workers can take seconds
    try:
        if path in ("getitem", "getitems", "batched"):
            ds = tarindex.TarDataset(tars, batched=path == "batched")
            n = len(ds)
            if workers:
                while time.monotonic() < deadline:
                    bs = None if path == "getitem" else 16
                    dl = torch.utils.data.DataLoader(
                        ds, batch_size=bs, num_workers=workers, shuffle=True,
                        collate_fn=tarindex.collate_batched if path == "batched" else lambda b: b,
                    )  # fmt: skip
                    for _ in dl:
                        reading()
            while time.monotonic() < deadline:
                if path == "getitem":
                    for i in rng.integers(0, n, 64).tolist():
                        ds[i]
                        reading()
                else:
                    ds.__getitems__(rng.integers(0, n, 16).tolist())
                    reading()
        else:
            batched = path == "stream-batched"
            it = tarindex.TarIterableDataset(
                tars, shuffle=True, seed=0, batched=batched, batch_size=16 if batched else None
            )
            epoch = 0
            while time.monotonic() < deadline:
                it.set_epoch(epoch)
                epoch += 1
                src: Any = it
                if workers:
                    src = torch.utils.data.DataLoader(
                        it, batch_size=None, num_workers=workers,
                        collate_fn=(lambda b: b),
                    )  # fmt: skip
                for _ in src:
                    reading()
    except Exception as e:  # noqa: BLE001 (the fate is the result)
        if ok(e):
            return 0
        text = f"{type(e).__name__}: {e}"
        worker_died = "DataLoader worker" in text and (
            "exited unexpectedly" in text or "killed by signal" in text
        )  # torch's worker handler prints "Unexpected bus error encountered in worker" first
        if worker_died or "Bus error" in text:
            sys.stderr.write(text[:300] + "\n")
            return 7  # a DataLoader worker died by a signal
        sys.stderr.write(text[:500] + "\n")
        return 3
    return 4  # no error within the deadline


def trial(src: list[str], d: str, path: str, workers: int, rng: random.Random) -> str:
    """One trial: a fresh copy, a forked reader, the cut from here; the reader's fate."""
    tars = []
    for s, p in enumerate(src):
        t = os.path.join(d, f"cut-{s}.tar")
        shutil.copyfile(p, t)
        shutil.copyfile(p + ".tidx", t + ".tidx")
        tars.append(t)
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the reader, leading a process group with its DataLoader workers
        os.setpgid(0, 0)
        os.close(r)
        code = 5
        try:
            code = _read_loop(path, tars, workers, w)
        finally:
            sys.stderr.flush()
            os._exit(code)
    os.close(w)
    select.select([r], [], [], 60)  # the reader is reading (or died before its first read)
    os.close(r)
    time.sleep(rng.random() * 0.02)  # a cut at a random point of the reads
    for t in tars:
        os.truncate(t, CUT_TO)
    end = time.monotonic() + 90
    done, status = 0, 0
    while not done and time.monotonic() < end:
        done, status = os.waitpid(pid, os.WNOHANG)
        time.sleep(0.01)
    try:  # the reader's DataLoader workers, if it left any (or the reader itself, hung)
        os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    if not done:
        os.waitpid(pid, 0)
        return "hung"
    if os.WIFSIGNALED(status):
        return signal.Signals(os.WTERMSIG(status)).name
    code = os.WEXITSTATUS(status)
    return {0: "error", 7: "SIGBUS"}.get(code, "other")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--trials", type=int, default=100)
    ap.add_argument("--paths", nargs="*", default=list(PATHS), choices=PATHS)
    ap.add_argument(
        "--workers",
        type=int,
        nargs="*",
        default=[0, 2],
        help="DataLoader workers per run (0: in-process). Defaults to 0 and 2.",
    )
    ap.add_argument("--json", action="store_true", help="print the counts as JSON")
    args = ap.parse_args(argv)
    import torch.utils.data  # noqa: F401 (imported once here, not in every forked reader)

    import tarindex  # noqa: F401

    rng = random.Random(0)
    out: dict[str, dict[str, int]] = {}
    with tempfile.TemporaryDirectory() as d:
        src = make_source(d)
        for path in args.paths:
            for workers in args.workers:
                name = f"{path}{' (2 workers)' if workers else ''}"
                counts: dict[str, int] = {}
                for _ in range(args.trials):
                    fate = trial(src, d, path, workers, rng)
                    counts[fate] = counts.get(fate, 0) + 1
                out[name] = counts
                if not args.json:
                    print(f"{name:28s} {counts}", flush=True)
    if args.json:
        print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
