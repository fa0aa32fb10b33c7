"""Write a dataset into shards with several worker processes: webdataset's ``dataset2tar``.

:func:`write_shards` cuts the samples into consecutive runs, one per shard (``maxcount``
samples each, or the counts ``shard_sizes`` gives), and has ``jobs`` worker processes write
them: shard ``k`` is ``pattern % k`` and holds run ``k``, whichever worker writes it, so the
result is one dataset whose sample order (shard by shard, in input order) is the same for
any ``jobs``, and no two workers ever write the same name. Each worker writes its shards
with :class:`tarindex.TarWriter` (tar + index, atomic: a shard is either complete with its
index or absent).

- A map-style source (``len()`` and ``[i]``, e.g. a torch ``Dataset``) is pickled to each
  worker, which reads its own runs: reading, converting and encoding run in parallel.
- An iterable is read by the calling process, which sends each run's samples to the
  worker writing it (run ``k`` to worker ``k % jobs``); encoding and writing run in
  parallel.

Failures lose nothing silently: a worker that raises, or dies (``kill -9``, out of memory),
stops the run after the shards in progress elsewhere; the shard it was writing is removed
(its temp file, and a tar left without its index), and :class:`~tarindex.errors.
ParallelWriteError` reports the shards written, the runs that failed (and why: the
exception, or the signal), and those never started. Each worker talks to the caller over
its own pipes, so a worker killed mid-message cannot block the others.

Nor does a caller that dies (``kill -9``) leave workers behind: each worker watches its
parent (Linux: ``PR_SET_PDEATHSIG``; everywhere: the end of the pipe multiprocessing keeps
to the parent) and, once it is gone, removes the shard it was writing and exits. A run never
mixes its shards with an earlier run's: shards already on disk under the pattern
(:func:`~tarindex.write.shards.existing_shards`, the rule ``tarindex pack`` uses) are
refused, or deleted first with ``overwrite=True``.
"""

from __future__ import annotations

import glob
import multiprocessing
import multiprocessing.connection
import os
import signal
import sys
import traceback
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from ..errors import ParallelWriteError, WriterError
from ..storage.indexfile import index_path_for
from .lifeline import Stop, exit_with_parent
from .lock import PatternLock, lock_path_for
from .shards import TarWriter, check_pattern, existing_shards

__all__ = ["MapStyle", "WriteResult", "describe_failed", "write_shards"]

_BATCH = 64  # samples per message from the caller to a worker (iterable sources)
_PROGRESS_EVERY = 256  # samples between progress messages from a worker


class MapStyle(Protocol):
    """A map-style dataset: ``len(ds)`` samples, ``ds[i]`` for ``0 <= i < len(ds)``."""

    def __len__(self) -> int: ...

    def __getitem__(self, i: int, /) -> Any: ...


@dataclass
class WriteResult:
    """What :func:`write_shards` wrote."""

    paths: list[str]
    """The shards in sample order (shard ``k`` = ``pattern % k``), each with its index."""
    counts: list[int]
    """Samples in each shard."""
    n_samples: int = 0
    """Samples written in all."""
    failed: dict[int, str] = field(default_factory=dict)
    """Only on :class:`~tarindex.errors.ParallelWriteError`: shard number -> why it failed."""
    removed: list[str] = field(default_factory=list)
    """Files of an earlier run deleted first (``overwrite=True``): shards and indexes."""


def _is_map_style(source: object) -> bool:
    return (
        hasattr(source, "__len__")
        and hasattr(source, "__getitem__")
        and not isinstance(source, (str, bytes, dict))
    )


def _sample(i: int, item: Any, to_sample: Callable[[int, Any], Any] | None) -> dict[str, Any]:
    s = item if to_sample is None else to_sample(i, item)
    if not isinstance(s, dict):
        raise WriterError(
            f"sample {i}: got a {type(s).__name__}, expected a dict {{'__key__': str, ext: "
            f"value}}; pass to_sample=f(index, item) -> dict to convert (e.g. the tuples of a "
            f"torchvision dataset)"
        )
    return s


class _Chunk:
    """Writes one shard in a worker: samples in, tar + index out (TarWriter, atomic)."""

    def __init__(self, pattern: str, k: int, writer_kw: dict[str, Any]) -> None:
        self.path = pattern % k
        # start_shard=k: with seed=, shard ids are a function of (seed, k), as ShardWriter's
        self.sink = TarWriter(self.path, start_shard=k, **writer_kw)
        self.n = 0

    def write(self, s: dict[str, Any]) -> None:
        self.sink.write(s)
        self.n += 1

    def close(self) -> None:
        self.sink.close()

    def abort(self) -> None:
        self.sink.abort()


def _remove_unfinished(path: str, pid: int | None) -> None:
    """Remove what an unfinished shard ``path`` left: temp, lock, index and tar files.

    The temp files are those process ``pid`` made for the tar and its index
    (``temp_path_for``'s names, :func:`write_atomic`'s included); a tar is
    there without its index only if its close was cut between the rename and the index.

    Both sides call it: the worker that stops mid-shard (a signal can land between a file's
    creation and the assignment that would let ``abort`` find it), and the caller for a
    worker that failed or died. Within a run only that worker writes ``path`` (the caller
    holds the pattern lock), so nothing here belongs to anyone else.
    """
    if pid is not None:
        for base in (path, index_path_for(path)):  # the tar's temp file, the index's
            for p in glob.glob(f"{glob.escape(base)}.{pid}.*.tmp"):
                try:
                    os.remove(p)
                except FileNotFoundError:
                    pass
    for p in [lock_path_for(path), index_path_for(path), path]:
        try:
            os.remove(p)
        except FileNotFoundError:
            pass


def _worker(
    w: int,
    source: Any,
    to_sample: Callable[[int, Any], Any] | None,
    pattern: str,
    writer_kw: dict[str, Any],
    tasks: multiprocessing.connection.Connection,
    results: multiprocessing.connection.Connection,
) -> None:
    """A worker process: write the shards the caller sends, report on ``results``.

    Tasks: ``("map", k, lo, hi)`` (read ``source[lo:hi]``), ``("begin", k, lo)`` +
    ``("batch", items)`` ... + ``("end",)`` (iterable), ``None`` (quit; an unfinished shard
    is aborted). Results: ``("begin", k, pid)``, ``("n", count)``, ``("done", k, n)``,
    ``("fail", k, text)``, ``("exit",)``.
    """
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the caller handles Ctrl-C for everyone
    exit_with_parent()
    cur: _Chunk | None = None
    k, i, told = -1, 0, 0
    begun: int | None = None  # the shard being written, from before its temp file exists
    stopped = False
    try:
        while True:
            msg = tasks.recv()
            if msg is None:
                break
            try:
                if msg[0] == "map":
                    _, k, lo, hi = msg
                    results.send(("begin", k, os.getpid()))
                    begun = k
                    cur = _Chunk(pattern, k, writer_kw)
                    for i in range(lo, hi):
                        cur.write(_sample(i, source[i], to_sample))
                        if cur.n - told >= _PROGRESS_EVERY:
                            results.send(("n", cur.n - told))
                            told = cur.n
                    msg = ("end",)
                elif msg[0] == "begin":
                    _, k, i = msg
                    results.send(("begin", k, os.getpid()))
                    begun = k
                    cur = _Chunk(pattern, k, writer_kw)
                elif msg[0] == "batch":
                    assert cur is not None
                    for item in msg[1]:
                        cur.write(_sample(i, item, to_sample))
                        i += 1
                    if cur.n - told >= _PROGRESS_EVERY:
                        results.send(("n", cur.n - told))
                        told = cur.n
                if msg[0] == "end" and cur is not None:
                    cur.close()
                    n, cur, begun = cur.n, None, None  # finished: a stop now keeps the shard
                    results.send(("n", n - told))
                    results.send(("done", k, n))
                    told = 0
            except Exception as e:
                if cur is not None:
                    cur.abort()
                    cur = None
                where = f"sample {i}: " if not isinstance(e, WriterError) else ""
                text = "".join(traceback.format_exception_only(type(e), e)).strip()
                results.send(("fail", k, f"{where}{text}"))
                break
    except Stop:  # the caller is gone (or SIGTERM): nobody reads the pipe, do not write to it
        stopped = True
    finally:
        if cur is not None:
            cur.abort()
        if begun is not None:
            # a stop inside the writer (between a temp or lock file's creation and the
            # assignment that would let ``abort`` find it) leaves files no object knows
            _remove_unfinished(pattern % begun, os.getpid())
        if not stopped:
            try:
                results.send(("exit",))
            except OSError:
                pass
    if stopped:
        sys.exit(128 + signal.SIGTERM)


class _Run:
    """The caller's side: workers, their pipes, the shards' fates, progress."""

    def __init__(
        self,
        jobs: int,
        source: Any,
        to_sample: Callable[[int, Any], Any] | None,
        pattern: str,
        writer_kw: dict[str, Any],
        ctx: Any,
        bar: Any,
        on_progress: Callable[[int], object] | None,
    ) -> None:
        self.pattern = pattern
        self.bar, self.on_progress = bar, on_progress
        self.procs: list[Any] = []
        self.tasks: list[multiprocessing.connection.Connection] = []
        self.results: list[multiprocessing.connection.Connection] = []
        self.current: dict[int, tuple[int, int]] = {}  # worker -> (shard, pid) in progress
        self.done: dict[int, int] = {}  # shard -> samples
        self.failed: dict[int, str] = {}
        self.exited: set[int] = set()
        self.idle: list[int] = []
        for w in range(jobs):
            t_recv, t_send = ctx.Pipe(duplex=False)
            r_recv, r_send = ctx.Pipe(duplex=False)
            p = ctx.Process(
                target=_worker,
                args=(w, source, to_sample, pattern, writer_kw, t_recv, r_send),
                name=f"tarindex-write-{w}",
                daemon=True,
            )
            p.start()
            t_recv.close()
            r_send.close()
            self.procs.append(p)
            self.tasks.append(t_send)
            self.results.append(r_recv)
            self.idle.append(w)

    @property
    def failing(self) -> bool:
        return bool(self.failed)

    def send(self, w: int, msg: Any) -> bool:
        """Send a task to worker ``w``; False if it is gone (its failure is recorded)."""
        if w in self.exited:
            return False
        try:
            self.tasks[w].send(msg)
            return True
        except OSError:  # BrokenPipeError: the worker died
            self.poll(0.2)
            self._dead(w)
            return False

    def poll(self, timeout: float | None) -> None:
        """Handle what the workers reported, waiting up to ``timeout`` seconds for something."""
        live = [w for w in range(len(self.procs)) if w not in self.exited]
        if not live:
            return
        conns = {self.results[w]: w for w in live}
        sentinels = {self.procs[w].sentinel: w for w in live}
        ready = multiprocessing.connection.wait([*conns, *sentinels], timeout)
        for r in ready:
            if r in conns:
                self._drain(conns[r])
        for r in ready:
            w = sentinels.get(r)
            if w is not None and w not in self.exited:
                self._drain(w)
                self._dead(w)

    def _drain(self, w: int) -> None:
        conn = self.results[w]
        try:
            while conn.poll():
                self._handle(w, conn.recv())
        except (EOFError, OSError):  # the worker is gone (maybe mid-message)
            self._dead(w)

    def _handle(self, w: int, msg: Any) -> None:
        kind = msg[0]
        if kind == "n":
            if self.bar is not None:
                self.bar.update(msg[1])
            if self.on_progress is not None:
                self.on_progress(msg[1])
        elif kind == "begin":
            self.current[w] = (msg[1], msg[2])
        elif kind == "done":
            self.current.pop(w, None)
            self.done[msg[1]] = msg[2]
            self.idle.append(w)
        elif kind == "fail":
            k = msg[1]
            self.current.pop(w, None)
            self.failed[k] = f"worker {w} (pid {self.procs[w].pid}) raised: {msg[2]}"
            self._remove(k, self.procs[w].pid)
        elif kind == "exit":
            self.exited.add(w)
            self.procs[w].join()
            self._orphan(w, "exited")

    def _dead(self, w: int) -> None:
        if w in self.exited:
            return
        self.exited.add(w)
        p = self.procs[w]
        p.join(5)
        code = p.exitcode
        how = f"killed by signal {-code}" if code is not None and code < 0 else f"exit code {code}"
        self._orphan(w, how)

    def _orphan(self, w: int, how: str) -> None:
        """Worker ``w`` is gone: the shard it was writing (if any) failed."""
        cur = self.current.pop(w, None)
        if cur is not None:
            k, pid = cur
            if how == "exited":  # told to quit mid-shard: the run was stopping
                self.failed.setdefault(k, _STOPPED)
            else:
                self.failed[k] = f"worker {w} (pid {pid}) died while writing it ({how})"
            self._remove(k, pid)

    def _remove(self, k: int, pid: int | None) -> None:
        """Remove what a failed shard left: its temp file, lock file, a tar without index."""
        _remove_unfinished(self.pattern % k, pid)

    def wait_idle(self) -> int | None:
        """The next idle worker (waiting for one), or None once the run is failing/over."""
        while not self.failing:
            while self.idle:
                w = self.idle.pop(0)
                if w not in self.exited:
                    return w
            if len(self.exited) == len(self.procs):
                return None
            self.poll(0.5)
        return None

    def finish(self) -> None:
        """Tell every worker to quit; wait for all of them, handling their last reports."""
        for w in range(len(self.procs)):
            self.send(w, None)
        while len(self.exited) < len(self.procs):
            self.poll(0.5)

    def kill(self) -> None:
        """Stop the workers now (an exception in the caller, Ctrl-C), cleaning up their shards.

        Each killed worker's last reports are read first (a shard it finished, the one it
        had begun), so the shard it was writing is the one cleaned up.
        """
        for w, p in enumerate(self.procs):
            if w not in self.exited and p.is_alive():
                p.kill()
        for w in range(len(self.procs)):
            if w not in self.exited:
                self.procs[w].join(5)
                self._drain(w)  # up to EOF, which ends in _dead(w): its shard is removed
            if w not in self.exited:
                self.exited.add(w)
                self._orphan(w, "stopped")
        for c in (*self.tasks, *self.results):
            c.close()


def _runs(
    n: int | None, maxcount: int, shard_sizes: Sequence[int] | None
) -> Iterator[tuple[int, int]]:
    """``(lo, hi)`` sample ranges of the shards, in order (``n`` None: unbounded).

    Raises:
        WriterError: ``shard_sizes`` holds a count below 1, or (``n`` known) does not add up
            to ``n``; checked before the first range is returned.
    """
    if shard_sizes is not None:
        sizes = list(shard_sizes)
        for size in sizes:
            if isinstance(size, bool) or not isinstance(size, int) or size < 1:
                raise WriterError(f"shard_sizes: {size!r} is not a count >= 1")
        if n is not None and sum(sizes) != n:
            raise WriterError(f"shard_sizes add up to {sum(sizes)}, the source holds {n} samples")
        bounds = np.cumsum([0, *sizes]).tolist()
        return iter(list(zip(bounds[:-1], bounds[1:], strict=True)))
    return _count_runs(n, maxcount)


def _count_runs(n: int | None, maxcount: int) -> Iterator[tuple[int, int]]:
    lo = 0
    while n is None or lo < n:
        hi = lo + maxcount if n is None else min(lo + maxcount, n)
        yield lo, hi
        lo = hi


def write_shards(
    source: MapStyle | Iterable[Any],
    pattern: str | os.PathLike[str],
    *,
    jobs: int = 1,
    maxcount: int = 100_000,
    shard_sizes: Sequence[int] | None = None,
    start_shard: int = 0,
    to_sample: Callable[[int, Any], Any] | None = None,
    progress: bool = True,
    on_progress: Callable[[int], object] | None = None,
    mp_context: Any = None,
    overwrite: bool = False,
    **writer_kw: Any,
) -> WriteResult:
    """Write ``source`` into numbered shards with ``jobs`` worker processes (see the module).

    Args:
        source: Samples (dicts ``{"__key__": str, ext: value}``, or anything ``to_sample``
            turns into one): a map-style dataset (``len()`` and ``[i]``), read by the workers,
            or any iterable, read here.
        pattern: printf-style shard pattern with one integer field (``"out/train-%06d.tar"``).
        jobs: Worker processes, ``>= 1``; ``1`` writes in this process. Defaults to ``1``.
        maxcount: Samples per shard (the last one may hold fewer). Defaults to ``100_000``.
            Shards are cut by count, not size, so that the cut is the same for any ``jobs``.
        shard_sizes: Explicit samples per shard, in order, instead of ``maxcount`` (e.g. cut
            by size beforehand, as ``tarindex pack --jobs`` does). Defaults to ``None``.
        start_shard: Number of the first shard. Defaults to ``0``.
        to_sample: ``f(index, item) -> sample dict``, run in the workers (in this process
            with ``jobs=1``); with ``jobs > 1`` under the ``spawn``/``forkserver`` start
            methods it must pickle (a module-level function), under ``fork`` any callable
            does. Defaults to ``None`` (items are samples).
        progress: Show a tqdm progress bar (on stderr). Defaults to ``True``.
        on_progress: Called with the number of samples just written. Defaults to ``None``.
        mp_context: A ``multiprocessing`` context. Defaults to the default one.
        overwrite: Delete the shards (and indexes) already under ``pattern``
            (:func:`~tarindex.write.shards.existing_shards`: ``pattern % k`` for any ``k``,
            and nothing else) before writing, e.g. those of a run that was killed; if False
            such files are refused, so a run never leaves another run's shards beside its
            own. Defaults to False.
        **writer_kw: :class:`tarindex.ShardWriter` options for every shard (``mtime``,
            ``durable``, ``encoder``, ``compress``, ``zstd_dict``, ``seed``, ...).

    Returns:
        A :class:`WriteResult`: shard paths and counts, in sample order.

    Raises:
        WriterError: A bad ``pattern``, ``jobs``, ``maxcount``, ``shard_sizes`` or writer
            option (``compress=`` with ``encoder=False``, ...), or files
            already under ``pattern`` without ``overwrite`` (before anything is written or
            deleted), or, with ``jobs=1``, a sample that cannot be written.
        ParallelWriteError: A worker raised or died. Its shard is removed; shards finished
            by then are complete and listed (``.result``), failed ones with the cause
            (``.result.failed``); the dataset is incomplete: write it again.
    """
    pattern = os.fspath(pattern)
    if not check_pattern(pattern, start_shard):
        raise WriterError(
            f"pattern {pattern!r} has no integer field; write_shards numbers its shards: use "
            f"e.g. 'out/train-%06d.tar'"
        )
    for name, v in (("jobs", jobs), ("maxcount", maxcount)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise WriterError(f"{name}={v!r}: expected an integer >= 1")
    for bad in ("maxsize", "start_shard", "pattern"):
        if bad in writer_kw:
            raise WriterError(
                f"write_shards cuts shards by count (maxcount= or shard_sizes=), not {bad}="
            )
    # a bad writer option fails here, once, not in every worker (a writer touches no file
    # before its first sample)
    TarWriter(pattern % start_shard, start_shard=start_shard, **writer_kw)
    mapped = _is_map_style(source)
    n = len(source) if mapped else None  # type: ignore[arg-type]
    total = n if n is not None else (len(source) if hasattr(source, "__len__") else None)  # type: ignore[arg-type]
    runs = _runs(n, maxcount, shard_sizes)
    lock = PatternLock(pattern)  # no ShardWriter (nor another write_shards) on it meanwhile
    try:
        removed = _clear_earlier(pattern, overwrite)
    except BaseException:
        lock.release()
        raise
    bar = None
    if progress:
        from tqdm import tqdm  # type: ignore[import-untyped,unused-ignore]

        bar = tqdm(total=total, unit="sample", desc="writing shards", dynamic_ncols=True)
    try:
        if jobs == 1:
            res = _write_here(
                source, mapped, runs, pattern, start_shard, to_sample, writer_kw, bar, on_progress
            )
            res.removed = removed
            return res
        ctx = mp_context or multiprocessing.get_context()
        run = _Run(
            jobs, source if mapped else None, to_sample, pattern, writer_kw, ctx, bar, on_progress
        )
        try:
            if mapped:
                _feed_map(run, runs, start_shard)
            else:
                _feed_iter(run, iter(source), runs, start_shard)
            run.finish()
        except BaseException:
            run.kill()
            raise
    finally:
        if bar is not None:
            bar.close()
        lock.release()
    return _result(run.done, run.failed, pattern, start_shard, removed)


def _clear_earlier(pattern: str, overwrite: bool) -> list[str]:
    """Refuse (or, with ``overwrite``, delete) the files an earlier run left under ``pattern``.

    Returns:
        The files deleted.

    Raises:
        WriterError: Such files exist and ``overwrite`` is False; nothing is deleted.
    """
    old = existing_shards(pattern)
    if old and not overwrite:
        more = f" and {len(old) - 1} more" if len(old) > 1 else ""
        raise WriterError(
            f"{pattern}: {len(old)} file(s) of an earlier run already exist ({old[0]}{more}); "
            f"a new run would leave them beside its own shards: pass overwrite=True to delete "
            f"them first, or choose another pattern"
        )
    for path in old:
        os.remove(path)
    return old


def _feed_map(run: _Run, runs: Iterator[tuple[int, int]], start: int) -> None:
    for k, (lo, hi) in enumerate(runs, start):
        w = run.wait_idle()
        if w is None or not run.send(w, ("map", k, lo, hi)):
            run.failed.setdefault(k, _STOPPED + " (nor any later shard)")
            break


def _feed_iter(run: _Run, it: Iterator[Any], runs: Iterator[tuple[int, int]], start: int) -> None:
    jobs = len(run.procs)
    for k, (lo, hi) in enumerate(runs, start):
        first = next(it, _END)
        if first is _END:
            return
        w = (k - start) % jobs  # static: the caller need not wait for a worker to be free
        ok = run.send(w, ("begin", k, lo))
        batch = [first]
        i = lo + 1
        while ok and i < hi:
            item = next(it, _END)
            if item is _END:
                break
            batch.append(item)
            i += 1
            if len(batch) >= _BATCH:
                run.poll(0)
                ok = not run.failing and run.send(w, ("batch", batch))
                batch = []
        if ok and batch:
            run.poll(0)
            ok = not run.failing and run.send(w, ("batch", batch))
        if not ok or run.failing:
            if k not in run.failed:
                run.failed[k] = _STOPPED + " (nor any later shard)"
            return
        run.send(w, ("end",))
        run.poll(0)


_END = object()
_STOPPED = "not written: the run stopped after a failure"


def _write_here(
    source: Any,
    mapped: bool,
    runs: Iterator[tuple[int, int]],
    pattern: str,
    start: int,
    to_sample: Callable[[int, Any], Any] | None,
    writer_kw: dict[str, Any],
    bar: Any,
    on_progress: Callable[[int], object] | None,
) -> WriteResult:
    """``jobs=1``: the same shards, written in this process."""
    done: dict[int, int] = {}
    it = None if mapped else iter(source)
    for k, (lo, hi) in enumerate(runs, start):
        cur: _Chunk | None = None
        try:
            for i in range(lo, hi):
                item = source[i] if it is None else next(it, _END)
                if item is _END:
                    break
                if cur is None:
                    cur = _Chunk(pattern, k, writer_kw)
                cur.write(_sample(i, item, to_sample))
                if bar is not None:
                    bar.update(1)
                if on_progress is not None:
                    on_progress(1)
            if cur is None:
                break
            cur.close()
        except BaseException:
            if cur is not None:
                cur.abort()
            raise
        done[k] = cur.n
        if cur.n < hi - lo:
            break
    return _result(done, {}, pattern, start)


def _result(
    done: dict[int, int],
    failed: dict[int, str],
    pattern: str,
    start: int,
    removed: list[str] | None = None,
) -> WriteResult:
    ks = sorted(done)
    res = WriteResult([pattern % k for k in ks], [done[k] for k in ks], sum(done.values()))
    res.removed = removed or []
    if failed:
        res.failed = dict(sorted(failed.items()))
        raise ParallelWriteError(
            f"{pattern}: {describe_failed(pattern, failed)}. {len(ks)} shard(s) "
            f"were written completely (each with its index) and kept; the dataset is "
            f"incomplete: fix the cause and write it again",
            res,
        )
    return res


def describe_failed(pattern: str, failed: dict[int, str]) -> str:
    """``"N shard(s) not written: shard k (path): why; ..."``, in shard order."""
    lines = "; ".join(f"shard {k} ({pattern % k}): {why}" for k, why in sorted(failed.items()))
    return f"{len(failed)} shard(s) not written: {lines}"
