"""A local directory cache for remote shards, bounded in bytes, shared by many processes.

Entries are files under ``root``: ``<root>/<key[:2]>/<key>/<name>`` (a chunk of a shard, an
index, a whole shard). The rules that make it safe when DataLoader workers and several
training processes share one directory (docs/REMOTE.md, "Cache"):

- An entry appears only by ``os.replace`` of a complete temp file written in
  ``<root>/tmp/`` (same filesystem): a reader sees the whole file or nothing.
- Nothing is served unchecked (:mod:`tarindex.storage.sums`): a bytes entry carries the
  crc of its data, tied to its key and name; a whole-file entry put with ``crcs`` a
  ``<name>.sum`` record of per-MiB crcs (crc32c; zlib's crc32 without google-crc32c). A
  process checks an entry when it first reads it (again whenever its ``ctime`` changed); an
  entry that fails is deleted with a ``RuntimeWarning`` naming the file and the bytes, and
  read as a miss (fetched again).
- A process killed mid-write leaves only ``tmp/<pid>.<random>`` files, never read as entries;
  the next eviction pass deletes those whose process is gone, or older than 10 minutes,
  unless a live process holds them (:meth:`DirCache.hold_temp`: a decompressed copy being
  made or indexed for longer than that is never deleted under its writer).
- The byte limit is kept on disk, not in a process's memory: ``<root>/usage`` holds the bytes
  of all entries, read and rewritten under an exclusive ``flock`` of ``<root>/lock`` by every
  insert. The temp files in ``tmp/`` count too: a whole-shard download reserves its size when
  it starts (:meth:`DirCache.reserve`: its temp file preallocated under the lock), so entries
  plus downloads in flight stay within the limit (a download that does not fit beside the
  running ones does not start). When an insert would pass the limit, the directory is scanned and the least
  recently used entries (oldest mtime; a hit touches its entry, at most every
  :attr:`DirCache.TOUCH_S` seconds, so a checked entry stays checked) are deleted until it
  fits; a ``.sum`` record goes with its entry.
  ``usage`` is rewritten before the rename, so a crash can only over-count, which the next
  scan corrects. The lock is released by the kernel if its holder dies.
- One writer per entry across processes: :meth:`DirCache.lock` takes an exclusive ``flock``
  of ``<root>/locks/<key>.<name>`` (released by the kernel if its holder dies), so two
  processes (DataLoader workers, ranks) that want the same whole shard make one download: the
  second waits for the lock, then finds the entry. Lock files are empty and not counted.
- Links are never followed inside ``root``: every file is opened with ``O_NOFOLLOW``, every
  directory checked with ``lstat``; a symbolic link (or a directory) found where a directory
  or file of the cache belongs (planted by someone else) is removed, never written through, so nothing
  lands outside ``root`` and every byte stored is counted and evictable.
"""

from __future__ import annotations

import errno
import os
import secrets
import stat
import time
import warnings
from collections.abc import Sequence

from . import sums
from .cachetmp import NO_ROOM, clean_tmp, preallocate, temp_bytes
from .sums import ENTRY_HEAD, SUM_SUFFIX

__all__ = ["DirCache"]

class DirCache:
    """A byte-bounded LRU of files in a directory, safe across processes (see module docs).

    Args:
        root: The cache directory (created if missing).
        limit: Most bytes the entries may hold together, ``>= 0``.

    Attributes:
        hits: Entries served by :meth:`get` in this process.
        misses: :meth:`get` calls that found no usable entry.
        corrupt: Entries that failed their checksum in this process (deleted, reported).

    Raises:
        OSError: If ``root`` cannot be created.
    """

    TOUCH_S = 600.0
    """A hit moves its entry's mtime (the LRU order) only if it is older than this (seconds):
    a touch changes the file's ``ctime``, which makes every process check it again (each hit
    in the next :data:`~tarindex.storage.sums.RACY_S` seconds pays a crc32)."""

    def __init__(self, root: str, limit: int) -> None:
        self.root = os.path.abspath(os.fspath(root))
        self.limit = int(limit)
        self.hits = 0
        self.misses = 0
        self.corrupt = 0
        os.makedirs(self.root, exist_ok=True)
        self._real_dir(os.path.join(self.root, "tmp"))
        self._clean_tmp()

    def __getstate__(self) -> dict[str, object]:
        return {"root": self.root, "limit": self.limit, "hits": 0, "misses": 0, "corrupt": 0}

    def path(self, key: str, name: str) -> str:
        """The file of entry ``(key, name)``; ``key`` is a hex digest, ``name`` a file name."""
        return os.path.join(self.root, key[:2], key, name)

    def names(self, key: str) -> list[str]:
        """The names of the entries under ``key`` now (no lock files, no checks; may race)."""
        try:
            with os.scandir(os.path.join(self.root, key[:2], key)) as it:
                return [e.name for e in it if not e.name.startswith(".") and e.is_file()]
        except OSError:
            return []

    def get(self, key: str, name: str, size: int | None = None, what: str = "") -> bytes | None:
        """Return the bytes of entry ``(key, name)`` (checked), or ``None`` if there are none.

        Args:
            key: Entry key (hex digest).
            name: Entry name inside the key.
            size: Expected length in bytes. Defaults to ``None`` (any length).
            what: What the bytes are, for the warning (``"bytes A..B of URL"``).

        An entry of another length (than ``size``, than its checksum record says, or longer
        than the cache may hold), or whose bytes fail their checksum, is deleted with a
        ``RuntimeWarning`` naming its file and the bytes, and ``None`` returned (a miss:
        the caller fetches the bytes again); it is never served. Only an entry whose length
        passed is read: a file planted or grown past its record is not.
        """
        p = self.path(key, name)
        try:
            fd = self.open_entry(p)
        except OSError:
            self.misses += 1
            return None
        try:
            st = os.fstat(fd)
            n = st.st_size - ENTRY_HEAD.size
            if size is not None and n != size:
                bad: str | None = f"it holds {n} bytes of data, not {size}"
            elif st.st_size > self.limit:  # put never stores one
                bad = f"it holds {st.st_size} bytes, more than the cache (cache_bytes={self.limit})"
            else:
                head = os.pread(fd, ENTRY_HEAD.size, 0)
                bad = sums.check_head(head, n)
                if bad is None:
                    data = os.pread(fd, n, ENTRY_HEAD.size)
                    # every get: read whole anyway, and a store through another process's
                    # shared mapping changes bytes without a ctime (sums.py)
                    bad = sums.check_bytes(key, name, head, data, False)
        finally:
            os.close(fd)
        if bad is not None:
            self._corrupt(p, bad, what)
            self.misses += 1
            return None
        self._touch(p, st)
        self.hits += 1
        return data

    def local_file(self, key: str, name: str, size: int, checked: bool = False) -> str | None:
        """The path of entry ``(key, name)`` if it exists with ``size`` bytes (touched), else None.

        Args:
            key: Entry key.
            name: Entry name.
            size: Its expected size in bytes.
            checked: The entry was put with ``crcs`` (:meth:`put_file`): check it as
                :meth:`open_checked` does. Defaults to ``False`` (its size only).
        """
        if checked:
            fd = self.open_checked(key, name, size)
            if fd is None:
                return None
            os.close(fd)
            return self.path(key, name)
        p = self.path(key, name)
        if self._is_entry(p) and self._entry_size(p) == size:
            try:
                self._touch(p, os.lstat(p))
            except OSError:
                return None
            return p
        return None

    def open_checked(self, key: str, name: str, size: int, what: str = "") -> int | None:
        """A read-only descriptor of file entry ``(key, name)`` of ``size`` bytes, checked.

        The entry must have been put with ``crcs`` (:meth:`put_file`); its bytes are checked
        against its ``.sum`` record on the first open in this process (again whenever the
        file's ``ctime`` changed; :mod:`~tarindex.storage.sums`), about 0.4 ms per MiB.

        Args:
            key: Entry key.
            name: Entry name.
            size: Its expected size in bytes.
            what: What the file is, for the warning (``"the whole copy of URL"``).

        Returns:
            The descriptor (the caller owns it), or ``None``: missing, or it failed its check
            (then deleted with a ``RuntimeWarning`` naming the file and the bytes that differ).
        """
        p = self.path(key, name)
        try:
            fd = self.open_entry(p)
        except OSError:
            return None
        try:
            st = os.fstat(fd)
            bad = None
            if st.st_size != size:
                bad = f"it holds {st.st_size} bytes, not {size}"
            elif not sums.is_known(p, st):
                bad = self._check_file(key, name, p, fd, size)
                if bad is None:
                    sums.remember(p, st, os.fstat(fd))
        except BaseException:
            os.close(fd)
            raise
        if bad is not None:
            os.close(fd)
            self._corrupt(p, bad, what)
            return None
        self._touch(p, st)
        return fd

    def _check_file(self, key: str, name: str, p: str, fd: int, size: int) -> str | None:
        """Why file entry ``p`` (open as ``fd``) differs from its ``.sum`` record, or None."""
        try:
            rfd = self.open_entry(p + SUM_SUFFIX)
        except OSError:
            return (
                f"its checksum record {p}{SUM_SUFFIX} is missing (deleted, or an older "
                f"tarindex wrote the entry)"
            )
        with open(rfd, "rb") as f:
            rec = f.read(sums.sums_size(size) + 1)  # (a planted huge file: not read whole)
        got = sums.decode_sums(key, name, rec, size)
        if isinstance(got, str):
            return got
        return sums.check_file(fd, size, *got)

    def _corrupt(self, p: str, why: str, what: str) -> None:
        """Report and delete the entry ``p`` that failed its check (never served)."""
        self.corrupt += 1
        self.discard_path(p)
        of = f" ({what})" if what else ""
        warnings.warn(
            f"{p}: this cache entry{of} failed its check: {why}. Deleted it and fetched the "
            f"bytes again, never served them; if this repeats, something changes files under "
            f"{self.root} (another program, a damaged disk)",
            RuntimeWarning,
            stacklevel=3,
        )

    def _touch(self, p: str, st: os.stat_result) -> None:
        """Move entry ``p``'s mtime to now for the LRU order (if older than :attr:`TOUCH_S`)."""
        if time.time() - st.st_mtime > self.TOUCH_S:
            try:
                os.utime(p, follow_symlinks=False)  # visible to every process
            except OSError:
                pass

    def open_entry(self, p: str) -> int:
        """A read-only descriptor of the cache file ``p``, links not followed, never waiting.

        Raises:
            OSError: ``p`` is missing, a link, or lies under a link (a planted link is
                removed first), or is not a regular file (a FIFO: opened ``O_NONBLOCK``,
                else its open would wait for a writer forever).
        """
        self._check_parents(p)
        try:
            fd = os.open(p, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
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
        """Delete the cache file ``p`` (an entry and its ``.sum``, or a temp file); missing is fine."""
        self._drop(p)
        self._drop(p + SUM_SUFFIX)
        sums.forget(p)

    def put(self, key: str, name: str, data: bytes | memoryview) -> bool:
        """Insert entry ``(key, name)`` atomically, evicting LRU entries to stay within the limit.

        The file holds a :data:`~tarindex.storage.sums.ENTRY_HEAD` record (24 bytes: the data's
        crc32, tied to ``key/name``) before the data, checked by :meth:`get`. Its room is
        reserved (:meth:`reserve`) before a byte is written, so concurrent inserts and
        downloads, in any processes, never hold more than the limit together.

        Returns:
            ``True`` if the entry was stored; ``False`` if it is larger than the whole limit,
            does not fit beside the downloads and inserts running now, or the disk is full
            (the cache never makes a read fail).
        """
        n = len(data) + ENTRY_HEAD.size
        tmp = self.reserve(n)
        if tmp is None:
            return False
        try:
            # into the reserved (preallocated) file: its size, counted, never changes
            fd = os.open(tmp, os.O_WRONLY | os.O_NOFOLLOW)
            with open(fd, "wb") as f:
                f.write(sums.head_of(key, name, data))
                f.write(data)
            return self._commit(tmp, self.path(key, name), n)
        except OSError as e:
            self._drop(tmp)
            if e.errno in NO_ROOM or e.errno in (errno.EROFS, errno.EACCES):
                return False
            raise

    def put_file(
        self,
        key: str,
        name: str,
        tmp: str,
        crcs: Sequence[int] | bool = False,
        kind: str | None = None,
        own: bool = False,
    ) -> bool:
        """Insert the complete file ``tmp`` (made by :meth:`temp_path`) as entry ``(key, name)``.

        Args:
            key: Entry key.
            name: Entry name.
            tmp: The file (moved into place).
            crcs: Write a ``<name>.sum`` record for :meth:`open_checked`: the crc of each
                :data:`~tarindex.storage.sums.GRAIN` bytes of the file, or ``True`` to
                compute them now (one read of the file). Defaults to ``False`` (no record:
                the entry is read by its size alone).
            kind: The rule of ``crcs`` (:data:`~tarindex.storage.sums.CRC32` or
                :data:`~tarindex.storage.sums.CRC32C`). Defaults to
                :func:`~tarindex.storage.sums.grain_kind`, the one this process writes.
            own: ``crcs`` (a sequence) were computed in this process from the bytes it wrote
                to ``tmp`` (a download's replies): this process does not check the entry
                again when it opens it while the file is the one it renamed into place
                (:func:`~tarindex.storage.sums.vouch`); other processes check it.

        Returns:
            As :meth:`put`.
        """
        n = os.path.getsize(tmp)
        rec = None
        own = own and crcs is not True and crcs is not False  # crcs the caller took as it wrote
        if crcs is not False:
            if crcs is True:
                fd = os.open(tmp, os.O_RDONLY | os.O_NOFOLLOW)
                try:
                    crcs = sums.file_crcs(fd, n, sums.GRAIN, kind)
                finally:
                    os.close(fd)
            rec = sums.encode_sums(key, name, n, sums.GRAIN, crcs, kind)
            n += len(rec)
        if n > self.limit:
            self._drop(tmp)
            return False
        return self._commit(tmp, self.path(key, name), n, rec, own)

    def reserve(self, n: int) -> str | None:
        """A temp file of ``n`` bytes (preallocated), counted against the limit from now on.

        For a download written in place (:class:`~tarindex.storage.pieces.PieceWriter`) and
        every :meth:`put`: under
        the cache's lock, the entries, the other temp files and ``n`` must fit the limit;
        least recently used entries (released ones first: :meth:`release`) are evicted until
        they do. The file is made inside the lock, so the next reservation or insert counts
        it; renamed into place by :meth:`put_file`, it becomes the entry it was counted as.

        Returns:
            The temp file's path (from :meth:`temp_path`), or ``None`` if ``n`` does not fit
            beside the temp files of downloads running now, or the disk is full.

        Raises:
            OSError: The file cannot be made for another reason than a full disk.
        """
        import fcntl

        if n > self.limit:
            return None
        tmp = self.temp_path()
        lock = self._open_nofollow(os.path.join(self.root, "lock"), os.O_RDWR | os.O_CREAT)
        with open(lock, "a+b") as lk:
            fcntl.flock(lk.fileno(), fcntl.LOCK_EX)
            try:
                self._clean_tmp()
                temps = self._temp_bytes()
                used = self._read_usage()
                if used + temps + n > self.limit:
                    used = self._evict(self.limit - temps - n, keep="")
                    self._write_usage(used)
                if used + temps + n > self.limit:
                    return None  # running downloads hold the room: read by ranges
                fd = self._create(tmp)
                try:
                    preallocate(fd, n)
                finally:
                    os.close(fd)
            except OSError as e:
                self._drop(tmp)
                if e.errno in NO_ROOM:
                    return None
                raise
            finally:
                fcntl.flock(lk.fileno(), fcntl.LOCK_UN)
        return tmp

    def _temp_bytes(self, exclude: str = "") -> int:
        return temp_bytes(os.path.join(self.root, "tmp"), exclude)

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
        """Open the cache's own file ``p`` (lock, usage); a link, directory or FIFO is removed.

        (``O_NONBLOCK``: the open of a FIFO planted there would wait for a writer forever.)
        """
        for _ in range(2):
            try:
                fd = os.open(p, flags | os.O_NOFOLLOW | os.O_NONBLOCK, 0o644)
            except OSError as e:
                if e.errno not in (errno.ELOOP, errno.EISDIR, errno.ENXIO):
                    raise
            else:
                if stat.S_ISREG(os.fstat(fd).st_mode):
                    return fd
                os.close(fd)
            self._clear(p)
        raise OSError(errno.EINVAL, f"{p}: not a regular file, and it cannot be removed")

    def _is_entry(self, p: str) -> bool:
        try:
            self._check_parents(p)
            return stat.S_ISREG(os.lstat(p).st_mode)
        except OSError:
            return False

    def _commit(
        self, tmp: str, final: str, n: int, rec: bytes | None = None, own: bool = False
    ) -> bool:
        import fcntl

        self._real_dir(os.path.dirname(final))
        rtmp = None
        if rec is not None:
            rtmp = self.temp_path()
            try:
                with open(self._create(rtmp), "wb") as f:
                    f.write(rec)
            except BaseException:
                self._drop(rtmp)
                raise
        lock = self._open_nofollow(os.path.join(self.root, "lock"), os.O_RDWR | os.O_CREAT)
        with open(lock, "a+b") as lk:
            fcntl.flock(lk.fileno(), fcntl.LOCK_EX)
            try:
                old = self._entry_size(final) + self._entry_size(final + SUM_SUFFIX)
                used = self._read_usage() - old
                # the other temp files count: downloads in flight (reserve) hold their room
                temps = self._temp_bytes(exclude=tmp)
                if used + temps + n > self.limit:
                    used = self._evict(self.limit - temps - n, keep=final)
                self._write_usage(used + n)
                # the record first: an entry is never there without the record it needs
                self._clear(final)
                self._clear(final + SUM_SUFFIX)
                if rtmp is not None:
                    os.replace(rtmp, final + SUM_SUFFIX)
                else:
                    self._drop(final + SUM_SUFFIX)
                os.replace(tmp, final)
                sums.forget(final)
                if own and rec is not None:  # (stat under the lock: the file we renamed)
                    sums.vouch(final, os.lstat(final))
            except BaseException:
                if rtmp is not None:
                    self._drop(rtmp)
                raise
            finally:
                fcntl.flock(lk.fileno(), fcntl.LOCK_UN)
        return True

    def _clear(self, p: str) -> None:
        """Remove what is not a regular file at ``p`` (a planted directory, link, fifo...)."""
        try:
            st = os.lstat(p)
        except OSError:
            return
        if stat.S_ISDIR(st.st_mode):
            import shutil

            shutil.rmtree(p, ignore_errors=True)  # (links inside are removed, not followed)
        elif not stat.S_ISREG(st.st_mode):
            self._drop(p)

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
        """Every entry as ``(mtime, size, path)``; removes temp files of dead writers.

        A ``.sum`` record counts with its entry (its mtime is the entry's); one without its
        entry is an entry of its own (evicted first: it has not been touched since written).
        """
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
                files: dict[str, os.stat_result] = {}
                for f in os.scandir(d2.path):
                    try:
                        st = f.stat(follow_symlinks=False)
                    except OSError:
                        continue
                    if not stat.S_ISREG(st.st_mode):
                        self._drop(f.path)
                        continue
                    files[f.path] = st
                for p, st in files.items():
                    if p.endswith(SUM_SUFFIX) and p[: -len(SUM_SUFFIX)] in files:
                        continue
                    rec = files.get(p + SUM_SUFFIX)
                    extra = rec.st_size if rec is not None else 0
                    out.append((st.st_mtime, st.st_size + extra, p))
        return out

    def _clean_tmp(self) -> None:
        """Delete the temp files of dead writers or very old ones (:func:`.cachetmp.clean_tmp`)."""
        clean_tmp(os.path.join(self.root, "tmp"))

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
            self._drop(p + SUM_SUFFIX)
            total -= n
        return total

    @staticmethod
    def _drop(p: str) -> None:
        try:
            os.unlink(p)
        except OSError:
            pass

