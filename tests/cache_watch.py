"""A watcher of a cache directory's bytes and downloads, for tests of its bounds.

Each sample is taken under the cache's lock (``DIR/lock``, docs/REMOTE.md): every step that
changes what the bound counts (a download's reservation, its temp file preallocated to the
tar's size; an insert's rename into place; an eviction) runs under that lock, so a sample
sees the cache between two such steps, never in the middle of one. A watcher walking the
directory without it counted a download twice when it was renamed from ``tmp/`` into place
between the walk's two directories, and counted an entry's ``.sum`` record, written in
``tmp/`` before its rename, as a download.
"""

from __future__ import annotations

import fcntl
import os
import threading
from collections.abc import Iterable
from pathlib import Path
from types import TracebackType

__all__ = ["CacheWatch"]

_META = ("lock", "usage")  # the cache's own files at its root: not entries


class CacheWatch:
    """Sample ``root`` every millisecond while in the ``with`` block, under its lock.

    Attributes:
        peak_bytes: The most bytes of entries (their ``.sum`` records aside) plus temp files
            (downloads reserved, inserts, ``.sum`` records on their way) seen at once.
        peak_downloads: The most downloads seen at once: temp files of one of
            ``tar_sizes`` bytes (a download preallocates its tar's size when it reserves
            its room, under the lock, and is renamed into place under it).
        samples: Samples taken.
        at_peak: The files (path relative to ``root``, size) of the first sample with
            ``peak_downloads`` downloads (for a failure's message).
    """

    def __init__(self, root: Path, tar_sizes: Iterable[int]) -> None:
        self.root = root
        self.sizes = frozenset(tar_sizes)
        self.peak_bytes = 0
        self.peak_downloads = 0
        self.samples = 0
        self.at_peak: list[tuple[str, int]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="cache-watch", daemon=True)

    def __enter__(self) -> CacheWatch:
        self._thread.start()
        return self

    def __exit__(
        self,
        typ: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stop.is_set():
            self._sample()
            self._stop.wait(0.001)

    def _sample(self) -> None:
        try:
            fd = os.open(self.root / "lock", os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644)
        except OSError:
            return  # the cache is not made yet
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            files = self._files()
        finally:
            os.close(fd)  # (drops the lock)
        n = sum(size for p, size in files if not p.endswith(".sum"))
        downloads = sum(
            1 for p, size in files if p.startswith("tmp" + os.sep) and size in self.sizes
        )
        self.samples += 1
        self.peak_bytes = max(self.peak_bytes, n)
        if downloads > self.peak_downloads:
            self.peak_downloads = downloads
            self.at_peak = files

    def _files(self) -> list[tuple[str, int]]:
        out = []
        for d, dirs, fs in os.walk(self.root):
            rel = os.path.relpath(d, self.root)
            if rel == "locks":
                dirs[:] = []
                continue
            for f in fs:
                if rel == "." and f in _META:
                    continue
                try:
                    size = os.lstat(os.path.join(d, f)).st_size
                except OSError:
                    continue
                out.append((os.path.normpath(os.path.join(rel, f)), size))
        return sorted(out)
