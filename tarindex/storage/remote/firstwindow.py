"""A stream's first window: downloads held while it is read by ranges, its bytes kept for them.

docs/REMOTE.md, "Fetch policy": a shuffled stream reads a block of every shard before its
first sample. Those blocks are fetched by ranges in one round while the shards' whole
downloads are held (:func:`hold`: an open starts none); the bytes they bring are kept
(:func:`seed`) and the download of each shard, once it starts in this process, writes them
into its copy and fetches only the rest (:func:`take_seeds`, :func:`usable`, :func:`holes`),
so each byte comes over the network once. What is kept is one window's bytes at most, let go
of by the download that takes them or when no download will follow (:func:`drop_seeds`).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from concurrent.futures import Future

from ..cache import DirCache
from .transport import Pin

__all__ = [
    "Seed",
    "cached_seeds",
    "drop_seeds",
    "forget_holds",
    "hold",
    "holes",
    "is_held",
    "kept",
    "same_version",
    "seed",
    "take_seeds",
    "usable",
]

_lock = threading.Lock()


def _after_fork_in_child() -> None:
    global _lock
    _lock = threading.Lock()


os.register_at_fork(after_in_child=_after_fork_in_child)


_holds: dict[tuple[int, str], int] = {}
"""(pid, URL) -> holders: downloads an open does not start (a stream's first window reads by
ranges). Counted: two streams over the same URLs each let go of their own hold."""

Seed = tuple[int, int, "Future[bytes] | bytes", Callable[[], Pin | None]]
"""Bytes ``[start, end)`` of a tar fetched by ranges (or in flight), and the version they are of."""

_seeds: dict[tuple[int, str], list[Seed]] = {}
"""(pid, URL) -> bytes a held stream fetched by ranges (:func:`seed`), for its download."""


def hold(urls: list[str], on: bool) -> None:
    """Hold (``on``) or let go of the downloads of ``urls`` in this process.

    While held, an open (:func:`open_copy`) joins a download already running or finds the
    complete copy, and starts none: the reads go by ranges (the fetch policy holds a
    stream's downloads until its first block is read). Holds are counted: each ``on`` is
    let go of by one ``off``.
    """
    pid = os.getpid()
    with _lock:
        for u in urls:
            k = (pid, u)
            if on:
                _holds[k] = _holds.get(k, 0) + 1
            elif _holds.get(k, 0) > 1:
                _holds[k] -= 1
            else:
                _holds.pop(k, None)


def seed(
    url: str, start: int, end: int, data: Future[bytes] | bytes, pin: Callable[[], Pin | None]
) -> None:
    """Keep bytes ``[start, end)`` of ``url``, fetched by ranges while it is held, for its download.

    A stream's first window is read by ranges before the downloads start (:func:`hold`);
    the download of ``url`` in this process then writes these bytes into its copy and
    fetches only the others, so they come over the network once (docs/REMOTE.md). ``data``
    is the bytes or the fetch in flight (waited for by the download); ``pin()`` the version
    they are of, once fetched (bytes of another version than the download's are fetched
    again). Kept only while ``url`` is held; dropped by the download that takes them or by
    :func:`drop_seeds`.
    """
    k = (os.getpid(), url)
    with _lock:
        if k in _holds:
            _seeds.setdefault(k, []).append((start, end, data, pin))


def drop_seeds(urls: list[str], unheld: bool = False) -> None:
    """Forget the bytes kept for the downloads of ``urls`` (:func:`seed`): none will start.

    ``unheld``: only those of URLs no one holds now (another stream's stay).
    """
    pid = os.getpid()
    with _lock:
        for u in urls:
            if not (unheld and (pid, u) in _holds):
                _seeds.pop((pid, u), None)


def take_seeds(url: str) -> list[Seed]:
    """The bytes kept for the download of ``url`` (:func:`seed`), handed over once."""
    with _lock:
        return _seeds.pop((os.getpid(), url), [])


def cached_seeds(c: DirCache | None, key: str, pin: Pin, chunk: int, url: str) -> list[Seed]:
    """The chunks of ``key`` the chunk cache ``c`` holds, as seeds for its whole download.

    A job read a shard by ranges into the chunk cache (:attr:`RemoteOptions.chunk_bytes`
    each) before the fetch policy switched it whole: the download writes those bytes into
    its copy and fetches only the rest, so they come over the network once. ``key`` holds
    the version (``pin``), so every chunk found is of it; each is checked as any
    :meth:`DirCache.get` (a bad one is dropped and fetched with the rest).
    """
    if c is None:
        return []
    out: list[Seed] = []
    for name in c.names(key):
        if not name.isdigit():
            continue
        a = int(name) * chunk
        if a >= pin.size:
            continue
        n = min(chunk, pin.size - a)
        data = c.get(key, name, n, f"bytes {a}..{a + n} of {url}")
        if data is not None:
            out.append((a, a + n, data, lambda: pin))
    return out


def is_held(url: str) -> bool:
    """Whether this process holds the downloads of ``url`` (:func:`hold`)."""
    with _lock:
        return (os.getpid(), url) in _holds


def kept() -> int:
    """Ranges this process keeps for downloads now (:func:`seed`; for tests)."""
    with _lock:
        return sum(len(v) for v in _seeds.values())


def forget_holds() -> None:
    """Forget this process's holds and the bytes kept for downloads."""
    with _lock:
        _holds.clear()
        _seeds.clear()


def same_version(p: Pin | None, pin: Pin) -> bool:
    """Whether ``p`` names the version ``pin`` does (size and tag)."""
    return p is not None and p.size == pin.size and p.tag() == pin.tag()


def usable(seeds: list[Seed], pin: Pin) -> list[Seed]:
    """The seeds a download pinned to ``pin`` can use: non-overlapping, in the tar.

    A seed fetched already counts only if it is of the download's version; one in flight
    is checked when its bytes arrive. Sorted by start.
    """
    out: list[Seed] = []
    top = 0
    for sd in sorted(seeds, key=lambda x: x[0]):
        a, b, data = sd[0], sd[1], sd[2]
        if a < top or b > pin.size or b <= a:
            continue
        if isinstance(data, Future) and data.done():
            try:
                data = data.result()
            except Exception:
                continue
            if len(data) != b - a:
                continue
            sd = (a, b, data, sd[3])
        if isinstance(data, bytes) and (len(data) != b - a or not same_version(sd[3](), pin)):
            continue
        out.append(sd)
        top = b
    return out


def holes(size: int, have: list[tuple[int, int]], piece: int) -> list[tuple[int, int]]:
    """The ranges of ``[0, size)`` outside ``have`` (sorted, disjoint).

    Cut at multiples of ``piece``: at most ``piece`` bytes each (a download's requests).
    """
    out = []
    pos = 0
    for a, b in [*have, (size, size)]:
        while pos < a:
            e = min(a, (pos // piece + 1) * piece)
            out.append((pos, e))
            pos = e
        pos = max(pos, b)
    return out
