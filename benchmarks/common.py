"""Shared pieces of benchmarks/run.py: the seeded dataset, timers, memory probes, results.

The dataset: sample ``i`` has key ``f"{i:08d}"``, a payload ``bin`` and a label ``cls``
(``i % 1000``, decimal text). Payload sizes are seeded: 90% around 10 KB (8-12 KB), 10%
around 100 KB (80-120 KB), mean about 19 KB. Bytes are slices of a seeded random pool, so
nothing compresses. Every contender writes exactly these samples.
"""

from __future__ import annotations

import json
import os
import resource
import time
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

SEED = 0
POOL_BYTES = 1 << 18  # 256 KiB random pool; payloads are slices of it


@dataclass
class Spec:
    """The dataset and the run's sizes."""

    n: int
    """Samples."""
    per_shard: int
    """Samples per shard (tar formats); MDS/litdata use their own chunking."""
    n_access: int
    """Random accesses timed per contender."""
    root: str
    """Where every format is written."""
    ra_seconds: float = 10.0
    """Time cap of one contender's random-access loop (slow ones stop early)."""
    loader_epochs: int = 1
    """DataLoader epochs per loader row (the best steady rate is reported)."""
    seed: int = SEED
    scale: list[int] = field(default_factory=lambda: [10_000, 100_000, 1_000_000])


class Payloads:
    """Deterministic payloads: ``payload(i)`` is the same bytes in every process."""

    def __init__(self, n: int, seed: int = SEED) -> None:
        rng = np.random.default_rng(seed)
        self.pool = rng.bytes(POOL_BYTES)
        big = rng.random(n) < 0.10
        small = rng.integers(8_000, 12_001, n)
        large = rng.integers(80_000, 120_001, n)
        self.sizes = np.where(big, large, small).astype(np.int64)
        self.starts = rng.integers(0, POOL_BYTES - 120_001, n).astype(np.int64)
        self._sizes = self.sizes.tolist()
        self._starts = self.starts.tolist()

    def payload(self, i: int) -> bytes:
        s = self._starts[i]
        return self.pool[s : s + self._sizes[i]]

    def sample(self, i: int) -> dict[str, Any]:
        return {"__key__": key(i), "bin": self.payload(i), "cls": label(i)}

    @property
    def total_bytes(self) -> int:
        return int(self.sizes.sum())


def key(i: int) -> str:
    return f"{i:08d}"


def label(i: int) -> int:
    return i % 1000


def now() -> float:
    return time.perf_counter()


def peak_rss_mb() -> float:
    """Peak resident set of this process in MB (file-backed mmap pages included)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def children_peak_rss_mb() -> float:
    """Peak resident set of the largest waited-for child (DataLoader workers) in MB."""
    return resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024


def rss_anon_mb() -> float:
    """Anonymous resident memory (heap, Python objects) in MB; excludes mmapped files."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("RssAnon:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def du_bytes(path: str) -> int:
    """Bytes allocated on disk under ``path`` (like ``du -s --block-size=1``)."""
    total = 0
    if os.path.isfile(path):
        return os.stat(path).st_blocks * 512
    for d, _, files in os.walk(path):
        for f in files:
            try:
                total += os.stat(os.path.join(d, f)).st_blocks * 512
            except FileNotFoundError:
                pass
    return total


def dup_missing(ids: np.ndarray, n: int) -> tuple[int, int]:
    """``(duplicates, missing)`` of a list of sample ids against ``range(n)``."""
    counts = np.bincount(np.asarray(ids, np.int64), minlength=n)
    return int((counts[counts > 1] - 1).sum()), int((counts == 0).sum())


@dataclass
class Result:
    """One measured cell: contender x figure."""

    contender: str
    figure: str
    samples_per_s: float | None = None
    mb_per_s: float | None = None
    seconds: float | None = None
    status: str = "ok"
    """``ok``, ``failed: <reason>``, ``n/a: <why>`` or ``not available yet``."""
    extra: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def dump_json(obj: Any, path: str) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(obj, f, indent=1, sort_keys=False, default=str)
    os.replace(tmp, path)
