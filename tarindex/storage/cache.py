"""A local directory cache for remote shards, bounded in bytes, shared by many processes.

Entries are files under ``root``: ``<root>/<key[:2]>/<key>/<name>`` (a chunk of a shard, an
index, a whole shard). The rules that make it safe when DataLoader workers and several
training processes share one directory (docs/REMOTE.md, "Cache"):

- An entry appears only by ``os.replace`` of a complete temp file written in
  ``<root>/tmp/`` (same filesystem): a reader sees the whole file or nothing. A reader also
  checks an entry's length against what it expects and drops a file that differs.
- A process killed mid-write leaves only ``tmp/<pid>.<random>`` files, never read as entries;
  the next eviction pass deletes those whose process is gone.
- The byte limit is kept on disk, not in a process's memory: ``<root>/usage`` holds the bytes
  of all entries, read and rewritten under an exclusive ``flock`` of ``<root>/lock`` by every
  insert. When an insert would pass the limit, the directory is scanned and the least
  recently used entries (oldest mtime; a hit touches its entry) are deleted until it fits.
  ``usage`` is rewritten before the rename, so a crash can only over-count, which the next
  scan corrects. The lock is released by the kernel if its holder dies.
"""

from __future__ import annotations

import errno
import os
import secrets
import time

__all__ = ["DirCache"]

_TMP_GRACE_S = 600.0
"""A temp file older than this is deleted by a scan even if its writer's pid is alive."""


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class DirCache:
    """A byte-bounded LRU of files in a directory, safe across processes (see module docs).

    Args:
        root: The cache directory (created if missing).
        limit: Most bytes the entries may hold together, ``>= 0``.

    Attributes:
        hits: Entries served by :meth:`get` in this process.
        misses: :meth:`get` calls that found no usable entry.

    Raises:
        OSError: If ``root`` cannot be created.
    """

    def __init__(self, root: str, limit: int) -> None:
        self.root = os.path.abspath(os.fspath(root))
        self.limit = int(limit)
        self.hits = 0
        self.misses = 0
        os.makedirs(os.path.join(self.root, "tmp"), exist_ok=True)
        self._clean_tmp()

    def __getstate__(self) -> dict[str, object]:
        return {"root": self.root, "limit": self.limit, "hits": 0, "misses": 0}

    def path(self, key: str, name: str) -> str:
        """The file of entry ``(key, name)``; ``key`` is a hex digest, ``name`` a file name."""
        return os.path.join(self.root, key[:2], key, name)

    def get(self, key: str, name: str, size: int | None = None) -> bytes | None:
        """Return the bytes of entry ``(key, name)``, or ``None`` if it is missing.

        Args:
            key: Entry key (hex digest).
            name: Entry name inside the key.
            size: Expected length in bytes; an entry of another length is deleted and
                ``None`` returned. Defaults to ``None`` (any length).
        """
        p = self.path(key, name)
        try:
            with open(p, "rb") as f:
                data = f.read()
        except (FileNotFoundError, NotADirectoryError):
            self.misses += 1
            return None
        if size is not None and len(data) != size:
            self._drop(p)
            self.misses += 1
            return None
        try:
            os.utime(p)  # recency for the LRU order, visible to every process
        except OSError:
            pass
        self.hits += 1
        return data

    def local_file(self, key: str, name: str, size: int) -> str | None:
        """The path of entry ``(key, name)`` if it exists with ``size`` bytes (touched), else None."""
        p = self.path(key, name)
        try:
            if os.stat(p).st_size == size:
                os.utime(p)
                return p
        except OSError:
            return None
        return None

    def put(self, key: str, name: str, data: bytes | memoryview) -> bool:
        """Insert entry ``(key, name)`` atomically, evicting LRU entries to stay within the limit.

        Returns:
            ``True`` if the entry was stored; ``False`` if it is larger than the whole limit
            or the disk is full (the cache never makes a read fail).
        """
        n = len(data)
        if n > self.limit:
            return False
        tmp = os.path.join(self.root, "tmp", f"{os.getpid()}.{secrets.token_hex(6)}")
        try:
            with open(tmp, "wb") as f:
                f.write(data)
            return self._commit(tmp, self.path(key, name), n)
        except OSError as e:
            self._drop(tmp)
            if e.errno in (errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES):
                return False
            raise

    def put_file(self, key: str, name: str, tmp: str) -> bool:
        """Insert the complete file ``tmp`` (made by :meth:`temp_path`) as entry ``(key, name)``."""
        n = os.path.getsize(tmp)
        if n > self.limit:
            self._drop(tmp)
            return False
        return self._commit(tmp, self.path(key, name), n)

    def temp_path(self) -> str:
        """A fresh temp file name in the cache's ``tmp/`` (for :meth:`put_file`)."""
        return os.path.join(self.root, "tmp", f"{os.getpid()}.{secrets.token_hex(6)}")

    def usage(self) -> int:
        """Bytes held by the entries now (a scan of the directory)."""
        return sum(n for _, n, _ in self._scan())

    # -- internals ------------------------------------------------------------------------
    def _commit(self, tmp: str, final: str, n: int) -> bool:
        import fcntl

        os.makedirs(os.path.dirname(final), exist_ok=True)
        with open(os.path.join(self.root, "lock"), "a+b") as lk:
            fcntl.flock(lk.fileno(), fcntl.LOCK_EX)
            try:
                old = self._entry_size(final)
                used = self._read_usage() - old
                if used + n > self.limit:
                    used = self._evict(self.limit - n, keep=final)
                self._write_usage(used + n)
                os.replace(tmp, final)
            finally:
                fcntl.flock(lk.fileno(), fcntl.LOCK_UN)
        return True

    @staticmethod
    def _entry_size(p: str) -> int:
        try:
            return os.stat(p).st_size
        except OSError:
            return 0

    def _read_usage(self) -> int:
        try:
            with open(os.path.join(self.root, "usage"), "rb") as f:
                return int(f.read().strip() or b"0")
        except (OSError, ValueError):
            return self.limit + 1  # unknown: force a scan

    def _write_usage(self, used: int) -> None:
        p = os.path.join(self.root, "usage")
        tmp = f"{p}.{os.getpid()}"
        with open(tmp, "wb") as f:
            f.write(b"%d\n" % used)
        os.replace(tmp, p)

    def _scan(self) -> list[tuple[float, int, str]]:
        """Every entry as ``(mtime, size, path)``; removes temp files of dead writers."""
        out: list[tuple[float, int, str]] = []
        self._clean_tmp()
        for d1 in os.scandir(self.root):
            if not d1.is_dir(follow_symlinks=False) or d1.name == "tmp":
                continue
            for d2 in os.scandir(d1.path):
                if not d2.is_dir(follow_symlinks=False):
                    continue
                for f in os.scandir(d2.path):
                    try:
                        st = f.stat(follow_symlinks=False)
                    except OSError:
                        continue
                    out.append((st.st_mtime, st.st_size, f.path))
        return out

    def _clean_tmp(self) -> None:
        """Delete temp files whose writer is gone (killed mid-write) or that are very old."""
        now = time.time()
        try:
            it = list(os.scandir(os.path.join(self.root, "tmp")))
        except OSError:
            return
        for e in it:
            try:
                pid = int(e.name.split(".", 1)[0])
                st = e.stat()
            except (ValueError, OSError):
                continue
            if not _pid_alive(pid) or now - st.st_mtime > _TMP_GRACE_S:
                self._drop(e.path)

    def _evict(self, room: int, keep: str) -> int:
        """Delete LRU entries until the rest hold at most ``room`` bytes; return their total."""
        entries = sorted(self._scan())
        total = sum(n for _, n, p in entries if p != keep)
        for _, n, p in entries:
            if total <= room:
                break
            if p == keep:
                continue
            self._drop(p)
            total -= n
        return total

    @staticmethod
    def _drop(p: str) -> None:
        try:
            os.unlink(p)
        except OSError:
            pass
