"""A worker process's lifeline: stop when the process that started it dies (``kill -9`` too).

:func:`tarindex.write_shards` calls :func:`exit_with_parent` first thing in each worker; the
worker then sees :class:`Stop` raised where it is (blocked on a pipe included), removes the
shard it was writing and exits, instead of writing on for nobody.
"""

from __future__ import annotations

import multiprocessing
import multiprocessing.connection
import os
import signal
import sys
import threading
from types import FrameType

__all__ = ["Stop", "exit_with_parent"]


class Stop(BaseException):
    """Raised in a worker by SIGTERM: its caller died (or someone asked it to stop)."""


def _on_sigterm(signum: int, frame: FrameType | None) -> None:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # once: the cleanup itself is not interrupted
    raise Stop


_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def exit_with_parent() -> None:
    """Make this worker stop (SIGTERM -> :class:`Stop`) when the process that started it dies.

    Two watches, either suffices: on Linux the kernel sends SIGTERM when the parent dies
    (``prctl(PR_SET_PDEATHSIG)``, set through ctypes; with ``forkserver`` the parent is the
    fork server, which exits when the caller does); everywhere, a thread waits on the pipe
    multiprocessing keeps open to the parent (:func:`multiprocessing.parent_process`'s
    sentinel) and sends SIGTERM to this process when it reads end-of-file (under ``fork``
    a later worker holds an earlier one's pipe open too: without the kernel's watch they stop
    one after another, the last-started first).
    """
    signal.signal(signal.SIGTERM, _on_sigterm)
    if sys.platform.startswith("linux"):
        try:
            import ctypes

            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0)
        except (OSError, AttributeError):  # no libc symbol: the thread below still watches
            pass
    parent = multiprocessing.parent_process()
    if parent is not None and parent.sentinel is not None:
        threading.Thread(
            target=_watch_parent, args=(parent.sentinel,), name="tarindex-watch", daemon=True
        ).start()


def _watch_parent(sentinel: int) -> None:
    """Wait until the parent is gone (its pipe reads EOF), then stop this process."""
    try:
        multiprocessing.connection.wait([sentinel])
    except OSError:  # the descriptor was closed: this process is exiting anyway
        return
    os.kill(os.getpid(), signal.SIGTERM)
