"""The temp files of a cache directory (:class:`~tarindex.storage.cache.DirCache`'s ``tmp/``).

One reason to change: when a temp file may be deleted and what the temp files hold. A temp
file is named ``<pid>.<random>``; it is an insert or a download in progress, counted against
the cache's limit (:meth:`DirCache.reserve`). It goes when its writer's process is gone
(killed mid-write: never trusted, never renamed into place) or it is older than
:data:`TMP_GRACE_S`, unless a live process holds it (:meth:`DirCache.hold_temp`: a shared
``flock`` the kernel drops when its holder dies).
"""

from __future__ import annotations

import errno
import fcntl
import os
import time

__all__ = [
    "NO_ROOM",
    "TMP_GRACE_S",
    "clean_tmp",
    "is_held",
    "pid_alive",
    "preallocate",
    "temp_bytes",
]

TMP_GRACE_S = 600.0
"""A temp file older than this is deleted by a scan even if its writer's pid is alive."""

NO_ROOM = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG})
"""The ``errno`` of a file that has no room where it is written: the disk is full
(``ENOSPC``), the user's quota is (``EDQUOT``), or the file may not be that large (``EFBIG``:
the process's ``RLIMIT_FSIZE``, a FAT32 disk's 4 GiB). The cache's answer to each is the same:
the entry is not stored (the bytes are read from the source), never a failed read."""


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` exists (one this user may not signal counts as alive)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def is_held(p: str) -> bool:
    """Whether the temp file ``p`` is held (:meth:`DirCache.hold_temp`) by a live process.

    (``O_NONBLOCK``: the open of a FIFO planted in ``tmp/`` would wait for a writer forever.)
    """
    try:
        fd = os.open(p, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return True
    finally:
        os.close(fd)
    return False


def clean_tmp(tmpdir: str) -> None:
    """Delete the temp files in ``tmpdir`` whose writer is gone or that are very old.

    A held file (:func:`is_held`) is never deleted.
    """
    now = time.time()
    try:
        it = list(os.scandir(tmpdir))
    except OSError:
        return
    for e in it:
        try:
            pid = int(e.name.split(".", 1)[0])
            st = e.stat(follow_symlinks=False)
        except (ValueError, OSError):
            continue
        if (not pid_alive(pid) or now - st.st_mtime > TMP_GRACE_S) and not is_held(e.path):
            try:
                os.unlink(e.path)
            except OSError:
                pass


def temp_bytes(tmpdir: str, exclude: str = "") -> int:
    """Bytes of the temp files in ``tmpdir`` (inserts and downloads in progress), but ``exclude``."""
    total = 0
    try:
        it = list(os.scandir(tmpdir))
    except OSError:
        return 0
    for e in it:
        if e.path == exclude:
            continue
        try:
            total += e.stat(follow_symlinks=False).st_size
        except OSError:
            continue
    return total


def preallocate(fd: int, n: int) -> None:
    """Give the file ``fd`` its ``n`` bytes on disk now (``posix_fallocate``; else its size).

    Raises:
        OSError: One of :data:`NO_ROOM` (the disk is full, the file may not be that large), or
            another error than "not supported".
    """
    if not n:
        return
    try:
        os.posix_fallocate(fd, 0, n)
    except OSError as e:
        if e.errno not in (errno.EOPNOTSUPP, errno.EINVAL, errno.ENOSYS):
            raise
        os.ftruncate(fd, n)
