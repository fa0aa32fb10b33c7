"""Shared-memory transport of batch buffers from DataLoader workers to the main process.

The only module that touches torch's private storage APIs. A worker allocates a batch's
``uint8`` buffer in shared memory *named by file* (torch's ``file_system`` sharing), whatever
the global sharing strategy, and the buffer is pickled as that name: with the default
``file_descriptor`` strategy every tensor a worker sends costs a round trip to a
descriptor-serving thread in that worker, which waits for the worker's GIL while it fetches the
next batch; by name, a batch of 64 x 19 KB samples moved ~1.5x faster on 2 cores. Cleanup is
torch's: the segment is unlinked when the last process holding it frees it, and torch's shm
manager removes what a dead process leaked.

A worker keeps the segments it made (up to :data:`POOL_SEGMENTS`) and hands one out again once
the main process has let go of it: torch's count of the processes holding a segment (in the
segment's header) is back to 1, the worker's own, and no tensor in the worker uses it. A new
segment costs its pages: torch ``fallocate`` s the file and every page faults on the first write,
~6 ms of the worker's CPU for a ``(64, 3, 224, 224)`` batch (~0.1 ms an image, 7% of a
1024x768 JPEG's decode); a reused one is already mapped. A batch the main process keeps alive
keeps its segment out of the pool (a new one is made), so nothing is written under a reader.
Raw-byte batches differ in size from batch to batch, so a segment is made a little larger than
asked (:func:`segment_size`: the next of 8 steps per power of two, at most 1/8 more) and any
free segment from the size asked to twice it serves: the buffer is its first ``nbytes``, and
it is sent as that many bytes. Before this, every raw batch of a shuffled ``DataLoader`` made
a segment (and dropped an old one): 37% of a worker's CPU over local tars.

A batch the main process received by name goes on by name too when it pickles the batch again
(a ``torch.multiprocessing`` queue to another process): the segment gains a holder, so the worker
does not reuse it while that process holds it. Pickled as a tensor instead, torch's default
``file_descriptor`` sharing would copy it into new shared memory and unmap the segment under any
numpy array or view the main process made of the batch (a segfault, or another batch's bytes once
a new segment is mapped at that address).

The segments are named through torch's shared-memory manager (``torch_shm_manager``), a
program each process starts on its first by-name segment unless it inherited one: ~0.2 s on a
quiet machine (it loads libtorch), 0.5-1 s per worker with two workers starting at once on 2
cores, paid in each worker of a first epoch before its first batch. So once a dataset that
sends batches by name was made here (:func:`expect_workers`), the first ``fork`` of this
process starts the manager here first (:func:`os.register_at_fork`), once per process, and
forked workers inherit it (torch's own path when a process shares a tensor by file name before
forking); spawned workers start their own.

When those private APIs are missing (another torch version) or :func:`use_public_sharing` is
on, buffers are ordinary tensors moved to shared memory with the public
``Tensor.share_memory_()`` and pickled by torch's own reductions.
"""

from __future__ import annotations

import ctypes
import os
import threading
from typing import Any

import torch
import torch.utils.data

__all__ = [
    "POOL_SEGMENTS",
    "alloc_buffer",
    "by_name_available",
    "expect_workers",
    "open_ref",
    "segment_size",
    "share_ref",
    "use_public_sharing",
]

_REF_TAG = "tarindex-shm-v2"  # v2: the bytes sent (a segment may be longer)
_BY_NAME: set[int] = set()
"""data_ptr of the buffers :func:`alloc_buffer` made by name in this worker, not sent yet."""
_public = [os.environ.get("TARINDEX_PUBLIC_SHM", "") not in ("", "0")]
_RECEIVED: dict[int, tuple[Any, int, bytes, bytes, int]] = {}
"""The segments :func:`open_ref` mapped in this process, by storage (``_cdata``): a weak reference
to the storage, its ``data_ptr`` then, and its (manager, handle, size) name."""
_RECEIVED_LOCK = threading.Lock()  # the DataLoader's pin-memory thread unpickles batches too


def use_public_sharing(on: bool = True) -> None:
    """Force (or stop forcing) the public-API fallback in this process and its new workers.

    Also settable with the environment variable ``TARINDEX_PUBLIC_SHM=1``.
    """
    _public[0] = bool(on)
    os.environ["TARINDEX_PUBLIC_SHM"] = "1" if on else "0"


_MANAGER: list[Any] = []
"""This process's tiny segment that started (and keeps) torch's shm manager, or ``None`` if
that failed; empty: not tried."""
_EXPECT = [False]


def expect_workers() -> None:
    """Note that this process may fork DataLoader workers that send batches by name.

    Costs nothing now; this process's next ``fork`` starts torch's shm manager first (the
    module docstring), unless this is a worker or the by-name path is off.
    """
    _EXPECT[0] = True


def _before_fork() -> None:
    """``os.register_at_fork(before=...)``: start the shm manager here once, if expected."""
    if not _EXPECT[0] or _MANAGER or torch.utils.data.get_worker_info() is not None:
        return
    try:
        if by_name_available():
            _MANAGER.append(torch.UntypedStorage._new_using_filename_cpu(1))
            return
    except Exception:  # no manager program: each worker tries (and reports) its own
        pass
    _MANAGER.append(None)


os.register_at_fork(before=_before_fork)


def by_name_available() -> bool:
    """Whether the by-name path (torch private APIs) is used in this process."""
    return not _public[0] and all(
        hasattr(torch.UntypedStorage, a)
        for a in ("_new_using_filename_cpu", "_share_filename_cpu_", "_shared_incref")
    )


POOL_SEGMENTS = 8
"""Most shared-memory segments a worker keeps for reuse (the batches in flight: the DataLoader's
``prefetch_factor``, 2 by default, plus the one the main process is using)."""

_HEADER = 64
"""Bytes before a by-name segment's data: torch's ``RefcountedMapAllocator`` header, whose
first ``int`` is the count of processes holding the segment (checked once: :func:`_counts_ok`)."""
_POOL: list[tuple[torch.Tensor, int]] = []
"""This worker's segments: (the tensor, the storage's use count when only the pool holds it)."""
_COUNTS_OK: list[bool] = []
_POOL_LOCK = threading.Lock()


def _use_count(t: torch.Tensor) -> int:
    """How many tensors and storages in this process use ``t``'s storage (plus one, the probe's)."""
    return int(torch._C._storage_Use_Count(t.untyped_storage()._cdata))


def _holders(t: torch.Tensor) -> int:
    """How many processes hold ``t``'s segment: torch's count in the segment's header."""
    return ctypes.c_int.from_address(t.untyped_storage().data_ptr() - _HEADER).value


def _counts_ok() -> bool:
    """Whether this torch keeps the holders' count where :func:`_holders` reads it (checked once)."""
    if not _COUNTS_OK:
        try:
            storage = torch.UntypedStorage._new_using_filename_cpu(64)
            t = torch.empty(0, dtype=torch.uint8).set_(storage)
            seen = [_holders(t)]
            storage._shared_incref()  # type: ignore[no-untyped-call]
            seen.append(_holders(t))
            storage._shared_decref()
            seen.append(_holders(t))
            _COUNTS_OK.append(seen == [1, 2, 1])
        except Exception:
            _COUNTS_OK.append(False)
    return _COUNTS_OK[0]


def segment_size(nbytes: int) -> int:
    """The size of a new segment for a buffer of ``nbytes`` (``> 0``) bytes, in bytes.

    ``nbytes`` rounded up to the next multiple of an eighth of its power of two (at most
    1/8 more, and a multiple of 4 KiB from 32 KiB up), so batches of nearby sizes share
    segments.
    """
    step = max(1, 1 << max(0, nbytes.bit_length() - 4))
    return -(-nbytes // step) * step


def _pooled(nbytes: int) -> torch.Tensor | None:
    """The smallest free segment of ``nbytes`` to ``2 * nbytes`` bytes, or ``None``.

    Free: this worker made it, and its batch is gone everywhere.
    """
    best = None
    for t, alone in _POOL:
        n = t.numel()
        if nbytes <= n <= 2 * nbytes and (best is None or n < best.numel()):
            if _holders(t) == 1 and _use_count(t) == alone:
                best = t
    return best


def _new_segment(nbytes: int) -> torch.Tensor:
    t = torch.empty(0, dtype=torch.uint8).set_(
        torch.UntypedStorage._new_using_filename_cpu(segment_size(nbytes))
    )
    if _counts_ok():
        if len(_POOL) >= POOL_SEGMENTS:  # full: drop a free segment (of another size), if any
            free = [i for i, (p, n) in enumerate(_POOL) if _holders(p) == 1 and _use_count(p) == n]
            if not free:
                return t
            del _POOL[free[0]]
        _POOL.append((t, _use_count(t)))
    return t


def alloc_buffer(nbytes: int) -> torch.Tensor:
    """A ``torch.uint8`` tensor of shape ``(nbytes,)``, in shared memory inside a worker.

    In the main process (no DataLoader worker) it is ordinary memory. In a worker it may be a
    segment of an earlier batch that no process uses any more (the module docstring): its
    bytes are that batch's, not zeros; the tensor is the segment's first ``nbytes`` bytes.
    """
    if torch.utils.data.get_worker_info() is None or nbytes <= 0:
        return torch.empty(max(nbytes, 0), dtype=torch.uint8)
    if by_name_available():
        with _POOL_LOCK:  # the view taken inside: another thread sees the segment in use
            t = _pooled(nbytes)
            if t is None:
                t = _new_segment(nbytes)
            _BY_NAME.add(t.untyped_storage().data_ptr())
            return t[:nbytes]
    t = torch.empty(nbytes, dtype=torch.uint8)
    t.share_memory_()  # type: ignore[no-untyped-call]
    return t


def share_ref(data: torch.Tensor) -> tuple[str, bytes, bytes, int, int] | None:
    """Pickle-time: the by-name handle of a buffer :func:`alloc_buffer` made, else ``None``.

    Also a segment :func:`open_ref` mapped here (a batch the main process passes on to another
    process), as often as it is pickled. The sender takes one reference on the segment;
    :func:`open_ref` drops it once the receiver holds its own mapping, as
    ``torch.multiprocessing.reductions`` does. ``None`` means: pickle the tensor itself
    (torch's reductions share it). ``data`` is a contiguous tensor from the segment's start
    (what :func:`alloc_buffer` gave, or a view of it); the receiver gets its bytes, not the
    segment's tail.
    """
    storage = data.untyped_storage()
    ptr = storage.data_ptr()
    if data.storage_offset() or not data.is_contiguous():
        return None
    used = data.numel() * data.element_size()
    if ptr in _BY_NAME:
        _BY_NAME.discard(ptr)
        manager, handle, size = storage._share_filename_cpu_()
    else:
        with _RECEIVED_LOCK:
            got = _RECEIVED.get(storage._cdata)
        # still that storage, on that mapping (torch's fd sharing may have moved it since)
        if got is None or got[0].expired() or got[1] != ptr:
            return None
        manager, handle, size = got[2:]
    storage._shared_incref()  # type: ignore[no-untyped-call]
    return (_REF_TAG, manager, handle, int(size), int(used))


def open_ref(ref: Any) -> torch.Tensor:
    """Unpickle-time: map the buffer named by :func:`share_ref` (or pass a tensor through).

    Returns:
        ``torch.uint8``, the bytes the sender's tensor held (the segment's first ones).
    """
    if isinstance(ref, torch.Tensor):
        return ref
    from torch.multiprocessing.reductions import StorageWeakRef, rebuild_storage_filename

    _, manager, handle, size, used = ref
    storage = rebuild_storage_filename(  # type: ignore[no-untyped-call]
        torch.UntypedStorage, manager, handle, size
    )
    with _RECEIVED_LOCK:  # the live ones only: a freed storage's entry goes
        for k in [k for k, v in _RECEIVED.items() if v[0].expired()]:
            del _RECEIVED[k]
        _RECEIVED[storage._cdata] = (
            StorageWeakRef(storage),  # type: ignore[no-untyped-call]
            storage.data_ptr(),
            manager,
            handle,
            size,
        )
    return torch.empty(0, dtype=torch.uint8).set_(storage)[:used]
