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

A batch the main process received by name goes on by name too when it pickles the batch again
(a ``torch.multiprocessing`` queue to another process): the segment gains a holder, so the worker
does not reuse it while that process holds it. Pickled as a tensor instead, torch's default
``file_descriptor`` sharing would copy it into new shared memory and unmap the segment under any
numpy array or view the main process made of the batch (a segfault, or another batch's bytes once
a new segment is mapped at that address).

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
    "open_ref",
    "share_ref",
    "use_public_sharing",
]

_REF_TAG = "tarindex-shm-v1"
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


def _pooled(nbytes: int) -> torch.Tensor | None:
    """A segment of ``nbytes`` this worker made whose batch is gone everywhere, or ``None``."""
    for t, alone in _POOL:
        if t.numel() == nbytes and _holders(t) == 1 and _use_count(t) == alone:
            return t
    return None


def _new_segment(nbytes: int) -> torch.Tensor:
    t = torch.empty(0, dtype=torch.uint8).set_(
        torch.UntypedStorage._new_using_filename_cpu(nbytes)
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
    bytes are that batch's, not zeros.
    """
    if torch.utils.data.get_worker_info() is None or nbytes <= 0:
        return torch.empty(max(nbytes, 0), dtype=torch.uint8)
    if by_name_available():
        with _POOL_LOCK:  # the view taken inside: another thread sees the segment in use
            t = _pooled(nbytes)
            if t is None:
                t = _new_segment(nbytes)
            _BY_NAME.add(t.untyped_storage().data_ptr())
            return t.view(-1)
    t = torch.empty(nbytes, dtype=torch.uint8)
    t.share_memory_()  # type: ignore[no-untyped-call]
    return t


def share_ref(data: torch.Tensor) -> tuple[str, bytes, bytes, int] | None:
    """Pickle-time: the by-name handle of a buffer :func:`alloc_buffer` made, else ``None``.

    Also a segment :func:`open_ref` mapped here (a batch the main process passes on to another
    process), as often as it is pickled. The sender takes one reference on the segment;
    :func:`open_ref` drops it once the receiver holds its own mapping, as
    ``torch.multiprocessing.reductions`` does. ``None`` means: pickle the tensor itself
    (torch's reductions share it).
    """
    storage = data.untyped_storage()
    ptr = storage.data_ptr()
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
    return (_REF_TAG, manager, handle, int(size))


def open_ref(ref: Any) -> torch.Tensor:
    """Unpickle-time: map the buffer named by :func:`share_ref` (or pass a tensor through)."""
    if isinstance(ref, torch.Tensor):
        return ref
    from torch.multiprocessing.reductions import StorageWeakRef, rebuild_storage_filename

    _, manager, handle, size = ref
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
    return torch.empty(0, dtype=torch.uint8).set_(storage)
