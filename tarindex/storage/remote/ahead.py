"""The read-ahead store of a remote tar: ranges fetched ahead, kept until reads take them.

One reason to change: how bytes fetched ahead are held, budgeted and handed out.
:class:`~.source.RemoteSource` decides what to fetch (and fetches it); this module keeps
it. The rules (docs/REMOTE.md, "Read-ahead"):

- **One budget per process.** Every store of a process takes its bytes from one
  :class:`AheadPool` (:attr:`RemoteOptions.readahead_bytes`, its threads
  :attr:`RemoteOptions.readahead_threads`), made again after a fork.
- **A range is kept until its bytes were read.** Each stored range records the bytes the
  hint asked for; once reads have taken that many from it, whatever their order, it is
  dropped and its bytes return to the budget. A failed fetch is dropped when a read meets
  it (and its error raised there).
- **Non-overlapping.** Stored ranges never overlap; a range that would overlap one stored
  is not kept (the older one stays).
"""

from __future__ import annotations

import os
import threading
from bisect import bisect_right
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor

from .options import RemoteOptions

__all__ = ["Ahead", "AheadPool", "AheadStore", "drop_pool", "the_pool"]


class AheadPool:
    """This process's read-ahead threads and byte budget (made again after a fork).

    Args:
        threads: Background fetch threads.
        budget: Bytes all stores of the process may hold ahead at once.
    """

    def __init__(self, threads: int, budget: int) -> None:
        self.pid = os.getpid()
        self.executor = ThreadPoolExecutor(max(1, threads), thread_name_prefix="tarindex-ra")
        self.lock = threading.Lock()
        self.budget = budget
        self.used = 0

    def take(self, n: int, force: bool = False) -> bool:
        """Count ``n`` bytes against the budget; ``False`` (not counted) if it has no room.

        A first range is admitted whatever its size when nothing is held (``budget > 0``);
        ``force`` admits always (bytes already fetched because a read asked for them).
        """
        with self.lock:
            if not force and (self.used + n > self.budget and self.used or not self.budget):
                return False
            self.used += n
            return True

    def give(self, n: int) -> None:
        """Return ``n`` bytes to the budget."""
        with self.lock:
            self.used -= n


_pool: list[AheadPool | None] = [None]


def _after_fork_in_child() -> None:
    _pool[0] = None  # the read-ahead threads do not exist in the child: made again on use


os.register_at_fork(after_in_child=_after_fork_in_child)


def drop_pool() -> None:
    """Forget this process's read-ahead pool: the next read-ahead makes one from its options."""
    _pool[0] = None


def the_pool(opts: RemoteOptions) -> AheadPool:
    """This process's read-ahead pool (made from ``opts`` on first use, and after a fork)."""
    p = _pool[0]
    if p is None or p.pid != os.getpid():
        p = _pool[0] = AheadPool(opts.readahead_threads, opts.readahead_bytes)
    return p


class Ahead:
    """One range ``[start, end)`` fetched ahead: its bytes (or the fetch in flight)."""

    __slots__ = ("start", "end", "need", "served", "future", "data", "pool")

    def __init__(self, start: int, end: int, pool: AheadPool, need: int | None = None) -> None:
        self.start = start
        self.end = end
        self.need = end - start if need is None else need  # bytes the hint asked for
        self.served = 0  # bytes handed out by reads so far
        self.future: Future[bytes] | None = None
        self.data: bytes | None = None
        self.pool = pool

    def result(self) -> bytes:
        """Its bytes, waiting for the fetch in flight (raises the fetch's error)."""
        if self.data is None:
            assert self.future is not None
            self.data = self.future.result()
            self.future = None
        return self.data


class AheadStore:
    """The ranges of one tar fetched ahead, sorted by start and non-overlapping (module docs)."""

    def __init__(self) -> None:
        self._entries: list[Ahead] = []
        self._starts: list[int] = []
        self._lock = threading.Lock()

    @property
    def held(self) -> bool:
        """Whether any range is stored (or in flight)."""
        return bool(self._starts)

    def find(self, a: int, b: int) -> Ahead | None:
        """The stored range that holds ``[a, b)``, if any."""
        with self._lock:
            k = bisect_right(self._starts, a) - 1
            if k >= 0:
                e = self._entries[k]
                if e.end >= b:
                    return e
        return None

    def result(self, e: Ahead) -> bytes:
        """The bytes of a stored range; a failed fetch is dropped from the store and re-raised."""
        try:
            return e.result()
        except BaseException:
            self.drop(e)
            raise

    def queue(
        self,
        plan: list[tuple[int, int, int]],
        pool: AheadPool,
        fetch_one: Callable[[int, int], bytes],
    ) -> bool:
        """Fetch ``plan``'s ranges ``(start, end, bytes asked)`` in ``pool``'s threads.

        Returns:
            ``False`` once the budget had no room (the rest of the plan is not queued).
        """
        for a, b, need in plan:
            if not pool.take(b - a):
                return False
            e = Ahead(a, b, pool, need)
            e.future = pool.executor.submit(fetch_one, a, b)
            if not self._insert(e):
                pool.give(b - a)
        return True

    def queue_together(
        self,
        plan: list[tuple[int, int, int]],
        pool: AheadPool,
        fetch_many: Callable[[list[tuple[int, int]]], list[bytes]],
        after: Future[None] | None = None,
        done: Future[None] | None = None,
    ) -> bool:
        """:meth:`queue`, with the ranges admitted fetched by one call in one thread.

        For a source whose first round must carry them all (its open-time checks go with
        them): one round of requests instead of one round per range. The ranges are stored
        at once (reads wait for them), their fetch starts once ``after`` is done (at once
        without one); ``done`` is set when their bytes (or the fetch's error) are in, or at
        once if no range was admitted.

        Returns:
            ``False`` once the budget had no room (the rest of the plan is not queued).
        """
        entries: list[Ahead] = []
        room = True
        for a, b, need in plan:
            if not pool.take(b - a):
                room = False
                break
            e = Ahead(a, b, pool, need)
            e.future = Future()
            if self._insert(e):
                entries.append(e)
            else:
                pool.give(b - a)
        if not entries:
            if done is not None:
                done.set_result(None)
            return room

        def run() -> None:
            try:
                got = fetch_many([(e.start, e.end) for e in entries])
            except BaseException as err:
                for e in entries:
                    assert e.future is not None
                    e.future.set_exception(err)
            else:
                for e, d in zip(entries, got, strict=True):
                    assert e.future is not None
                    e.future.set_result(d)
            finally:
                if done is not None:
                    done.set_result(None)

        def start(_: object = None) -> None:
            try:
                pool.executor.submit(run)
            except RuntimeError:  # the executor is shut down (interpreter exit): here
                run()

        if after is None:
            start()
        else:
            after.add_done_callback(start)
        return room

    def keep(self, plan: list[tuple[int, int, int]], datas: list[bytes], pool: AheadPool) -> None:
        """Keep ``datas``, the bytes of ``plan``'s ranges fetched now (budget forced)."""
        pool.take(sum(b - a for a, b, _ in plan), force=True)
        for (a, b, need), d in zip(plan, datas, strict=True):
            e = Ahead(a, b, pool, need)
            e.data = d
            if not self._insert(e):
                pool.give(b - a)

    def _insert(self, e: Ahead) -> bool:
        with self._lock:
            k = bisect_right(self._starts, e.start)
            if (k > 0 and self._entries[k - 1].end > e.start) or (
                k < len(self._entries) and self._entries[k].start < e.end
            ):
                return False  # overlaps what is stored: keep the older one
            self._entries.insert(k, e)
            self._starts.insert(k, e.start)
            return True

    def consume(self, e: Ahead, nbytes: int) -> None:
        """Count ``nbytes`` read from ``e``; drop it once the bytes asked for were all read."""
        e.served += nbytes
        if e.served >= e.need:
            self.drop(e)

    def drop(self, e: Ahead) -> None:
        """Drop ``e`` (if still stored) and return its bytes to the budget."""
        with self._lock:
            k = bisect_right(self._starts, e.start) - 1
            if not (k >= 0 and self._entries[k] is e):
                return
            del self._entries[k]
            del self._starts[k]
        e.pool.give(e.end - e.start)

    def clear(self) -> None:
        """Drop every stored range (frees their budget; fetches in flight end unread)."""
        with self._lock:
            entries, self._entries, self._starts = self._entries, [], []
        for e in entries:
            e.pool.give(e.end - e.start)
