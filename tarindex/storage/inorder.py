"""Calls run in the order they were queued, on one thread of their own.

A whole download's ranged replies arrive on the event loop's thread
(:mod:`tarindex.storage.remote.transport`); writing each chunk there (crc, ``pwrite``, the
flags: :class:`tarindex.storage.pieces.RangeSink`) kept the loop from receiving the next
one. :class:`InOrder` takes the chunks off the loop: one thread per download runs them in the
order they came (so a retried range's chunks land after the first try's), the queue is
bounded in bytes (the caller waits once the disk falls behind the network), and the first
error is kept and raised to the caller (:meth:`InOrder.put`, :meth:`InOrder.flush`).
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable

__all__ = ["InOrder"]


class InOrder:
    """One thread that runs queued calls in order; the first error stops it and is raised.

    Args:
        name: The thread's name.
        limit: Bytes queued at most (each call's ``size``); :meth:`put` waits past it.
    """

    def __init__(self, name: str, limit: int = 32 << 20) -> None:
        self.name = name
        self.limit = limit
        self._queue: deque[tuple[Callable[[], None], int]] = deque()
        self._wake = threading.Condition(threading.Lock())
        self._queued = 0  # bytes queued and not yet run
        self._error: BaseException | None = None
        self._thread: threading.Thread | None = None
        self._stopped = False

    def put(self, call: Callable[[], None], size: int) -> None:
        """Queue ``call`` (of ``size`` bytes) to run after the calls queued before it.

        Returns at once unless ``limit`` bytes are queued (then waits for room).

        Raises:
            BaseException: An earlier call's error (nothing runs after it).
            RuntimeError: :meth:`stop` was called.
        """
        with self._wake:
            while self._queued > self.limit and self._error is None and not self._stopped:
                self._wake.wait()
            if self._error is not None:
                raise self._error
            if self._stopped:
                raise RuntimeError(f"{self.name}: stopped; nothing more runs")
            self._queue.append((call, size))
            self._queued += size
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
                self._thread.start()
            else:
                self._wake.notify()

    def _run(self) -> None:
        while True:
            with self._wake:
                while not self._queue and not self._stopped:
                    self._wake.wait()
                if not self._queue:
                    return
                batch = list(self._queue)
                self._queue.clear()
            for call, _ in batch:
                if self._error is None:
                    try:
                        call()
                    except BaseException as e:  # kept: put and flush raise it
                        self._error = e
            with self._wake:
                self._queued -= sum(n for _, n in batch)
                self._wake.notify_all()

    def flush(self) -> None:
        """Wait until every queued call ran.

        Raises:
            BaseException: The first call's error, if one failed.
        """
        with self._wake:
            while self._queued:
                self._wake.wait()
        if self._error is not None:
            raise self._error

    def stop(self) -> None:
        """Run what is queued, then end the thread (idempotent; later :meth:`put` raise)."""
        with self._wake:
            self._stopped = True
            self._wake.notify_all()
            t = self._thread
        if t is not None and t is not threading.current_thread():
            t.join()
