"""This process's whole-shard download threads (:mod:`.whole`): daemon threads."""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import TypeVar

__all__ = ["Downloads"]

T = TypeVar("T")


class Downloads:
    """This process's download threads: daemon threads, so process exit never waits for them.

    ``ThreadPoolExecutor`` joins its threads at interpreter exit, after their running work:
    a process that finished its epoch (or was interrupted) waited for every download in
    flight. A download cut by exit leaves a temp file that is never renamed into place (a
    dead writer's: deleted by the next clean-up) and a progress record its readers see
    ended (the lock is released with the process): never trusted, downloaded again when
    needed.

    Args:
        n: The most threads it starts (a new one only when none is idle).
    """

    def __init__(self, n: int) -> None:
        self.n = n
        self.jobs: queue.SimpleQueue[tuple[Callable[[], object], Future[object]]] = (
            queue.SimpleQueue()
        )
        self.threads: list[threading.Thread] = []
        self.idle = 0
        self.lock = threading.Lock()

    def submit(self, fn: Callable[..., T], *args: object) -> Future[T]:
        """Run ``fn(*args)`` on a download thread; its future."""
        f: Future[T] = Future()
        self.jobs.put((lambda: fn(*args), f))  # type: ignore[arg-type]
        with self.lock:
            if not self.idle and len(self.threads) < self.n:
                t = threading.Thread(
                    target=self._work, name=f"tarindex-shard_{len(self.threads)}", daemon=True
                )
                self.threads.append(t)
                t.start()
        return f

    def _work(self) -> None:
        while True:
            with self.lock:
                self.idle += 1
            fn, f = self.jobs.get()
            with self.lock:
                self.idle -= 1
            if not f.set_running_or_notify_cancel():
                continue
            try:
                f.set_result(fn())
            except BaseException as e:
                f.set_exception(e)
