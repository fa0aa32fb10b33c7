"""The pattern lock: one writer at a time per shard pattern (``fcntl.flock``, where there is one)."""

from __future__ import annotations

import os
import weakref

from ..errors import WriterError

__all__ = ["PatternLock", "lock_path_for"]


def lock_path_for(pattern: str) -> str:
    """The lock file a writer of ``pattern`` holds: ``.<pattern name>.lock`` beside the shards."""
    d, base = os.path.split(os.path.abspath(pattern))
    return os.path.join(d, "." + base.replace("%", "_") + ".lock")


class PatternLock:
    """An exclusive, non-blocking ``flock`` on ``.<pattern name>.lock`` beside the shards.

    The file exists only while a writer holds it: the holder removes it before unlocking,
    and a writer that locked a file someone removed meanwhile (it checks the inode) tries
    again, so two writers never both hold a lock. The file holds the holder's pid.

    Raises:
        WriterError: If another writer (this process or another) holds the lock.
    """

    def __init__(self, pattern: str) -> None:
        os.makedirs(os.path.dirname(os.path.abspath(pattern)), exist_ok=True)
        self.path = lock_path_for(pattern)
        self.fd = -1
        try:
            import fcntl
        except ImportError:  # no flock (Windows): no lock
            return
        while True:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o666)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                holder = os.pread(fd, 32, 0).decode("ascii", "replace").strip() or "?"
                os.close(fd)
                raise WriterError(
                    f"{pattern}: another ShardWriter (pid {holder}) is writing this pattern "
                    f"(lock {self.path} is held); wait for it to finish, or write to another "
                    f"pattern"
                ) from None
            try:
                same = os.stat(self.path).st_ino == os.fstat(fd).st_ino
            except FileNotFoundError:
                same = False
            if same:
                break
            os.close(fd)  # the holder removed it between our open and our lock: again
        self.fd = fd
        _HELD.add(self)
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)

    def release(self) -> None:
        """Remove the lock file, then unlock (closing the descriptor releases the flock)."""
        fd, self.fd = self.fd, -1
        _HELD.discard(self)
        if fd >= 0:
            try:
                os.unlink(self.path)
            except FileNotFoundError:
                pass
            os.close(fd)


_HELD: weakref.WeakSet[PatternLock] = weakref.WeakSet()
"""The locks this process holds: a forked child (``write_shards`` workers under ``fork``) closes
its copies of their descriptors, so the flock dies with its holder, not with the last child."""


def _drop_inherited() -> None:
    for lock in list(_HELD):
        fd, lock.fd = lock.fd, -1
        if fd >= 0:
            os.close(fd)  # the parent's descriptor still holds the flock; nothing is unlinked
    _HELD.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_drop_inherited)
