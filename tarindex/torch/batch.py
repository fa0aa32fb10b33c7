"""BatchedSamples: a batch of raw samples in one ``uint8`` tensor, laid out field-major.

The layout is :func:`tarindex.stream.pack.field_major`'s (defined there only): the members of
field ``fields[0]`` for samples ``0..B-1``, then those of ``fields[1]``, and so on;
``offsets[f]`` (``int64 (B + 1,)``) cuts field ``f`` into samples. Integer fields (``cls``)
are ``int64`` columns instead.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import torch
from numpy.typing import NDArray

from ..read import Sample
from .transport import open_ref, share_ref

__all__ = ["BatchedSamples"]


class IntColumns:
    """The per-sample integer columns of a batch (:class:`BatchedSamples`, ``ImageBatch``).

    Both hold ``_index`` (``int64 (B,)``) and ``_ints`` (``{ext: int64 (B,)}``).
    """

    __slots__ = ()
    _index: NDArray[np.int64]
    _ints: dict[str, NDArray[np.int64]]

    @property
    def index(self) -> torch.Tensor:
        """Global index of each sample: ``torch.int64``, shape ``(B,)`` (``-1`` if unknown)."""
        return torch.from_numpy(self._index)

    @property
    def cls(self) -> torch.Tensor:
        """The ``cls`` labels: ``torch.int64``, shape ``(B,)``; ``-1`` where a sample has none.

        Raises:
            KeyError: If no sample of the batch has a ``cls`` member.
        """
        return self.ints("cls")

    def ints(self, ext: str) -> torch.Tensor:
        """An integer field (``int_fields``): ``torch.int64``, ``(B,)``, ``-1`` if missing.

        Raises:
            KeyError: If the field is not an integer field of this batch.
        """
        return torch.from_numpy(self._ints[ext])

    @property
    def int_fields(self) -> tuple[str, ...]:
        """Names of the integer fields of this batch."""
        return tuple(self._ints)


class BatchedSamples(IntColumns):
    """A batch of raw samples: one ``uint8`` buffer, offsets per extension, ``int64`` labels.

    Made by the packers of :mod:`tarindex.torch.collate` (``TarDataset(batched=True)``,
    ``TarIterableDataset(batched=True)``, :func:`~tarindex.torch.collate.collate_batched`);
    picklable, and cheap to send from a DataLoader worker (one shared-memory tensor plus small
    numpy arrays). It deliberately has no ``__getitem__``: passing it to the default collate by
    mistake fails loudly instead of producing a wrong batch.

    Attributes:
        fields: Extensions stored in :attr:`data`, in order of first appearance in the batch.
        data: ``torch.uint8`` tensor of shape ``(nbytes,)``: the members' bytes, field by field
            (all samples of ``fields[0]``, then of ``fields[1]``, ...).
        keys: Sample keys, ``len(batch)`` strings.
        shards: Shard path of each sample (``None`` when unknown).
    """

    __slots__ = ("fields", "data", "keys", "shards", "_offsets", "_present", "_index", "_ints")

    def __init__(
        self,
        fields: Sequence[str],
        data: torch.Tensor,
        offsets: NDArray[np.int64],
        present: NDArray[np.bool_],
        keys: list[str],
        index: NDArray[np.int64],
        ints: dict[str, NDArray[np.int64]],
        shards: list[str | None],
    ) -> None:
        self.fields = tuple(fields)
        self.data = data
        self.keys = keys
        self.shards = shards
        self._offsets = offsets
        self._present = present
        self._index = index
        self._ints = ints

    # -- shape -------------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self.keys)

    def __repr__(self) -> str:
        ints = ", ".join(self._ints)
        return (
            f"BatchedSamples({len(self)} samples, fields={list(self.fields)}, ints=[{ints}], "
            f"{int(self.data.numel())} bytes)"
        )

    # -- columns -----------------------------------------------------------------------------

    def offsets(self, ext: str) -> torch.Tensor:
        """Byte offsets of field ``ext`` in :attr:`data`: ``torch.int64``, shape ``(B + 1,)``.

        Sample ``b``'s member is ``data[offsets[b]:offsets[b + 1]]`` (empty where missing).

        Raises:
            KeyError: If no sample of the batch has that extension.
        """
        return torch.from_numpy(self._offsets[self._field(ext)])

    def lengths(self, ext: str) -> torch.Tensor:
        """Byte length of field ``ext`` per sample: ``torch.int64``, shape ``(B,)``."""
        o = self._offsets[self._field(ext)]
        return torch.from_numpy(o[1:] - o[:-1])

    def present(self, ext: str) -> torch.Tensor:
        """Which samples have a member ``ext``: ``torch.bool``, shape ``(B,)``."""
        if ext in self._ints:
            return torch.from_numpy(self._ints[ext] >= 0)
        return torch.from_numpy(self._present[self._field(ext)].copy())

    # -- per sample --------------------------------------------------------------------------
    def tensor(self, ext: str, b: int) -> torch.Tensor:
        """Sample ``b``'s member ``ext`` as a zero-copy ``torch.uint8`` view of :attr:`data`.

        Raises:
            KeyError: If sample ``b`` has no member ``ext``.
        """
        f = self._field(ext)
        if not self._present[f, b]:
            raise KeyError(f"sample {b} ({self.keys[b]!r}) has no member {ext!r}")
        o = self._offsets[f]
        return self.data[int(o[b]) : int(o[b + 1])]

    def view(self, ext: str, b: int) -> memoryview:
        """Sample ``b``'s member ``ext`` as a zero-copy read-only ``memoryview``.

        Raises:
            KeyError: If sample ``b`` has no member ``ext``.
        """
        view: memoryview = memoryview(self.tensor(ext, b).numpy()).toreadonly()  # type: ignore[arg-type]
        return view

    def bytes(self, ext: str, b: int) -> bytes:
        """Sample ``b``'s member ``ext`` as ``bytes`` (a copy).

        Raises:
            KeyError: If sample ``b`` has no member ``ext``.
        """
        return self.tensor(ext, b).numpy().tobytes()

    def sample(self, b: int) -> Sample:
        """Sample ``b`` as the dict :class:`TarDataset` would return (``bytes`` per extension).

        Integer fields come back as their decimal text, as stored in the tar.
        """
        out: Sample = {"__key__": self.keys[b]}
        if self.shards[b] is not None:
            out["__shard__"] = self.shards[b]
        if self._index[b] >= 0:
            out["__index__"] = int(self._index[b])
        for f, ext in enumerate(self.fields):
            if self._present[f, b]:
                o = self._offsets[f]
                out[ext] = self.data[int(o[b]) : int(o[b + 1])].numpy().tobytes()
        for ext, vals in self._ints.items():
            if vals[b] >= 0:
                out[ext] = str(int(vals[b])).encode()
        return out

    def __iter__(self) -> Iterator[Sample]:
        """Iterate over the samples as dicts (see :meth:`sample`)."""
        return (self.sample(b) for b in range(len(self)))

    def pin_memory(self) -> BatchedSamples:
        """Return a copy with :attr:`data` in pinned memory (``DataLoader(pin_memory=True)``)."""
        return BatchedSamples(
            self.fields,
            self.data.pin_memory(),
            self._offsets,
            self._present,
            self.keys,
            self._index,
            self._ints,
            self.shards,
        )

    def _field(self, ext: str) -> int:
        try:
            return self.fields.index(ext)
        except ValueError:
            fields = list(self.fields)
            raise KeyError(f"no field {ext!r} in this batch (fields: {fields})") from None

    # -- pickling (slots) --------------------------------------------------------------------
    def __getstate__(self) -> dict[str, Any]:
        state = {k: getattr(self, k) for k in self.__slots__}
        ref = share_ref(self.data)  # a worker's buffer goes by name (transport.py)
        if ref is not None:
            state["data"] = ref
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        state["data"] = open_ref(state["data"])
        for k, v in state.items():
            object.__setattr__(self, k, v)
