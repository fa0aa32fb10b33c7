"""A local directory cache for remote shards, bounded in bytes, shared by many processes.

Entries are files under ``root``: ``<root>/<key[:2]>/<key>/<name>`` (a chunk of a shard, an
index, a whole shard). The rules that make it safe when DataLoader workers and several
training processes share one directory (docs/REMOTE.md, "Cache"):

- An entry appears only by ``os.replace`` of a complete temp file written in
  ``<root>/tmp/`` (same filesystem): a reader sees the whole file or nothing. A reader also
  checks an entry's length against what it expects and drops a file that differs.
- A process killed mid-write leaves only ``tmp/<pid>.<random>`` files, never read as entries;
  the next eviction pass deletes those whose process is gone, or older than 10 minutes,
  unless a live process holds them (:meth:`DirCache.hold_temp`: a decompressed copy being
  made or indexed for longer than that is never deleted under its writer).
- The byte limit is kept on disk, not in a process's memory: ``<root>/usage`` holds the bytes
  of all entries, read and rewritten under an exclusive ``flock`` of ``<root>/lock`` by every
  insert. When an insert would pass the limit, the directory is scanned and the least
  recently used entries (oldest mtime; a hit touches its entry) are deleted until it fits.
  ``usage`` is rewritten before the rename, so a crash can only over-count, which the next
  scan corrects. The lock is released by the kernel if its holder dies.
- One writer per entry across processes: :meth:`DirCache.lock` takes an exclusive ``flock``
  of ``<root>/locks/<key>.<name>`` (released by the kernel if its holder dies), so two
  processes (DataLoader workers, ranks) that want the same whole shard make one download: the
  second waits for the lock, then finds the entry. Lock files are empty and not counted.
- Links are never followed inside ``root``: every file is opened with ``O_NOFOLLOW``, every
  directory checked with ``lstat``; a symbolic link found where a directory or file of the
  cache belongs (planted by someone else) is removed, never written through, so nothing
  lands outside ``root`` and every byte stored is counted and evictable.
"""

from __future__ import annotations

import errno
import os
import secrets
import stat
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
        os.makedirs(self.root, exist_ok=True)
        self._real_dir(os.path.join(self.root, "tmp"))
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
            fd = self.open_entry(p)
        except OSError:
            self.misses += 1
            return None
        with open(fd, "rb") as f:
            data = f.read()
        if size is not None and len(data) != size:
            self.discard_path(p)
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
        if self._is_entry(p) and self._entry_size(p) == size:
            try:
                os.utime(p, follow_symlinks=False)
            except OSError:
                return None
            return p
        return None

    def open_entry(self, p: str) -> int:
        """A read-only descriptor of the cache file ``p``, links not followed.

        Raises:
            OSError: ``p`` is missing, a link, or lies under a link (a planted link is
                removed first).
        """
        self._check_parents(p)
        try:
            fd = os.open(p, os.O_RDONLY | os.O_NOFOLLOW)
        except OSError as e:
            if e.errno == errno.ELOOP:
                self.discard_path(p)
            raise
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            raise OSError(errno.EINVAL, f"{p}: not a regular file")
        return fd

    def discard(self, key: str, name: str) -> None:
        """Delete entry ``(key, name)`` if it exists (a link there is removed, not followed)."""
        self.discard_path(self.path(key, name))

    def discard_path(self, p: str) -> None:
        """Delete the cache file ``p`` (an entry or a temp file); missing is fine."""
        self._drop(p)

    def put(self, key: str, name: str, data: bytes | memoryview) -> bool:
        """Insert entry ``(key, name)`` atomically, evicting LRU entries to stay within the limit.

        Returns:
            ``True`` if the entry was stored; ``False`` if it is larger than the whole limit
            or the disk is full (the cache never makes a read fail).
        """
        n = len(data)
        if n > self.limit:
            return False
        tmp = self.temp_path()
        try:
            with open(self._create(tmp), "wb") as f:
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
        self._real_dir(os.path.join(self.root, "tmp"))
        return os.path.join(self.root, "tmp", f"{os.getpid()}.{secrets.token_hex(6)}")

    def hold_temp(self, p: str) -> int:
        """Hold the temp file ``p`` (from :meth:`temp_path`; created if missing) until closed.

        The hold is a shared ``flock`` on the returned descriptor; close it when done.

        The cache's clean-up never deletes a held temp file, however old (a copy being
        decompressed or scanned for longer than the grace time); the kernel drops the hold
        when its process dies, so a killed writer's file is deleted as before.
        """
        import fcntl

        fd = os.open(p, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644)
        fcntl.flock(fd, fcntl.LOCK_SH)
        return fd

    def lock(self, key: str, name: str, blocking: bool = True) -> int | None:
        """Take the exclusive lock of entry ``(key, name)``: one writer per entry, machine-wide.

        An ``flock`` of ``<root>/locks/<key>.<name>`` on a descriptor of its own, so it also
        excludes other threads of this process; the kernel releases it if the holder dies.

        Args:
            key: Entry key (hex digest).
            name: Entry name.
            blocking: Wait for another holder. ``False`` returns ``None`` at once if the
                lock is held. Defaults to ``True``.

        Returns:
            The descriptor holding the lock (give it to :meth:`unlock`), or ``None``.
        """
        import fcntl

        self._real_dir(os.path.join(self.root, "locks"))
        fd = self._open_nofollow(self.lock_path(key, name), os.O_RDWR | os.O_CREAT)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | (0 if blocking else fcntl.LOCK_NB))
        except BlockingIOError:
            os.close(fd)
            return None
        except BaseException:
            os.close(fd)
            raise
        return fd

    def lock_path(self, key: str, name: str) -> str:
        """The lock file of entry ``(key, name)`` (see :meth:`lock`).

        While a download of the entry holds the lock, the file holds its progress record
        (:mod:`tarindex.storage.pieces`).
        """
        return os.path.join(self.root, "locks", f"{key}.{name}")

    @staticmethod
    def unlock(fd: int) -> None:
        """Release a lock taken by :meth:`lock` (closing its descriptor releases the flock)."""
        os.close(fd)

    def release(self, key: str, name: str) -> None:
        """Mark entry ``(key, name)`` as done with: it is evicted before every other entry.

        Its mtime (the LRU order) is set to the epoch; a reader that has it open keeps
        reading it (an evicted file lives until its last descriptor closes). Missing: nothing.
        """
        p = self.path(key, name)
        if self._is_entry(p):
            try:
                os.utime(p, (0, 0), follow_symlinks=False)
            except OSError:
                pass

    def usage(self) -> int:
        """Bytes held by the entries now (a scan of the directory)."""
        return sum(n for _, n, _ in self._scan())

    # -- internals ------------------------------------------------------------------------
    def _real_dir(self, d: str) -> None:
        """Make ``d`` (under ``root``) a real directory: links and files in its way removed."""
        rel = os.path.relpath(d, self.root)
        cur = self.root
        os.makedirs(cur, exist_ok=True)  # (deleted by hand while in use: made again)
        for part in rel.split(os.sep):
            cur = os.path.join(cur, part)
            try:
                st = os.lstat(cur)
            except FileNotFoundError:
                st = None
            if st is not None and not stat.S_ISDIR(st.st_mode):
                self._drop(cur)  # a planted link (or a stray file): removed, never followed
                st = None
            if st is None:
                try:
                    os.mkdir(cur)
                except FileExistsError:
                    if not stat.S_ISDIR(os.lstat(cur).st_mode):
                        raise

    def _check_parents(self, p: str) -> None:
        """Raise ``OSError`` if a directory between ``root`` and ``p`` is not a real one."""
        rel = os.path.relpath(os.path.dirname(p), self.root)
        cur = self.root
        for part in rel.split(os.sep):
            if part in ("", "."):
                continue
            cur = os.path.join(cur, part)
            if not stat.S_ISDIR(os.lstat(cur).st_mode):
                raise OSError(errno.ELOOP, f"{cur}: not a real directory of the cache")

    def _create(self, p: str) -> int:
        """A new file ``p`` for writing (``O_EXCL | O_NOFOLLOW``: never through a link)."""
        return os.open(p, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)

    def _open_nofollow(self, p: str, flags: int) -> int:
        """Open the cache's own file ``p`` (lock, usage); a link there is removed first."""
        try:
            return os.open(p, flags | os.O_NOFOLLOW, 0o644)
        except OSError as e:
            if e.errno != errno.ELOOP:
                raise
        self._drop(p)
        return os.open(p, flags | os.O_NOFOLLOW, 0o644)

    def _is_entry(self, p: str) -> bool:
        try:
            self._check_parents(p)
            return stat.S_ISREG(os.lstat(p).st_mode)
        except OSError:
            return False

    def _commit(self, tmp: str, final: str, n: int) -> bool:
        import fcntl

        self._real_dir(os.path.dirname(final))
        lock = self._open_nofollow(os.path.join(self.root, "lock"), os.O_RDWR | os.O_CREAT)
        with open(lock, "a+b") as lk:
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

    def _entry_size(self, p: str) -> int:
        try:
            self._check_parents(p)
            st = os.lstat(p)
        except OSError:
            return 0
        return st.st_size if stat.S_ISREG(st.st_mode) else 0

    def _read_usage(self) -> int:
        try:
            fd = self._open_nofollow(os.path.join(self.root, "usage"), os.O_RDONLY)
            with open(fd, "rb") as f:
                return int(f.read().strip() or b"0")
        except (OSError, ValueError):
            return self.limit + 1  # unknown: force a scan

    def _write_usage(self, used: int) -> None:
        p = os.path.join(self.root, "usage")
        tmp = f"{p}.{os.getpid()}"
        self._drop(tmp)
        with open(self._create(tmp), "wb") as f:
            f.write(b"%d\n" % used)
        os.replace(tmp, p)

    def _scan(self) -> list[tuple[float, int, str]]:
        """Every entry as ``(mtime, size, path)``; removes temp files of dead writers."""
        out: list[tuple[float, int, str]] = []
        self._clean_tmp()
        for d1 in os.scandir(self.root):
            if d1.is_symlink():
                self._drop(d1.path)  # planted: removed, never followed
            if not d1.is_dir(follow_symlinks=False) or d1.name in ("tmp", "locks"):
                continue
            for d2 in os.scandir(d1.path):
                if d2.is_symlink():
                    self._drop(d2.path)
                if not d2.is_dir(follow_symlinks=False):
                    continue
                for f in os.scandir(d2.path):
                    try:
                        st = f.stat(follow_symlinks=False)
                    except OSError:
                        continue
                    if not stat.S_ISREG(st.st_mode):
                        self._drop(f.path)
                        continue
                    out.append((st.st_mtime, st.st_size, f.path))
        return out

    @staticmethod
    def _held(p: str) -> bool:
        """Whether the temp file ``p`` is held by :meth:`hold_temp` in a live process."""
        import fcntl

        try:
            fd = os.open(p, os.O_RDONLY | os.O_NOFOLLOW)
        except OSError:
            return False
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            return True
        finally:
            os.close(fd)
        return False

    def _clean_tmp(self) -> None:
        """Delete temp files whose writer is gone (killed mid-write) or that are very old.

        A file held by :meth:`hold_temp` is never deleted.
        """
        now = time.time()
        try:
            it = list(os.scandir(os.path.join(self.root, "tmp")))
        except OSError:
            return
        for e in it:
            try:
                pid = int(e.name.split(".", 1)[0])
                st = e.stat(follow_symlinks=False)
            except (ValueError, OSError):
                continue
            if (not _pid_alive(pid) or now - st.st_mtime > _TMP_GRACE_S) and not self._held(
                e.path
            ):
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
