"""TarDataset: a map-style torch Dataset over indexed tar shards, O(1) per sample.

Reads are the core's (:meth:`tarindex.ShardSet.sample`, ``__getitems__`` batches through
:func:`tarindex.torch.collate.fetch_batched`); decode, select and transform are
:class:`tarindex.stream.finish.Finisher`'s, the same as the streaming datasets'.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Collection, Sequence
from typing import Any

import numpy as np
import torch.utils.data
from numpy.typing import NDArray

from ..codecs import DecodeSpec, ExtDecoder, make_decoder
from ..codecs.select import Selection, select_fields
from ..read import Sample, ShardSet
from ..read.fields import check_fields, field_set
from ..read.options import OpenOptions
from ..read.sample_source import SampleSource
from ..read.sources import Source
from ..read.subset import ShardSubset
from ..storage.remote import RemoteOptions
from ..stream.finish import Finisher
from ..stream.images import image_spec
from ..stream.shards import open_shards
from .collate import fetch_batched  # at import: a `from` import per batch cost ~1.4 us
from .images import fetch_images
from .transport import expect_workers

__all__ = ["TarDataset"]


class TarDataset(torch.utils.data.Dataset[Any]):
    """Map-style dataset: ``ds[i]`` is sample ``i`` of the shards, read in O(1) from the index.

    Samples are numbered shard by shard in source order, and within a shard in index order
    (first appearance of the key in the tar). A sample is a dict with ``__key__`` (str),
    ``__shard__`` (the shard's path), ``__index__`` (int, the global index) and one entry per
    extension: ``bytes`` unless ``decode`` is given.

    Shards open lazily in the process that reads them (DataLoader workers under fork, spawn or
    forkserver each open their own), at most ``max_open`` per process; the dataset pickles to a
    few bytes per shard. Opening reads each index's 80-byte header only, or from a manifest
    only the manifest. Threads may share it (``ds[i]``, ``__getitems__``, a concurrent
    ``close()`` of its shards: docs/READING.md, "Threads").

    Args:
        source: Path, list of paths, brace pattern (``"train-{000000..000009}.tar"``), glob or
            directory of ``*.tar`` shards, each with its ``.tidx`` index, or a dataset
            manifest (``data.json``, ``tarindex manifest``: opens with one read), or a ready
            :class:`tarindex.ShardSet` (read through as it is, with its own ``options`` and
            ``remote``, which must then be left out).
        decode: ``None`` (bytes); an image spec of webdataset's (``"rgb8"``: ``uint8
            (H, W, 3)``, ``"rgb"``: ``float32`` in ``[0, 1]``, ``"torchrgb8"``: ``uint8`` tensor
            ``(3, H, W)``, ``"pil"``, ... see :data:`tarindex.codecs.IMAGE_SPECS`; ``True`` is
            ``"pil"``), a handler ``f(key, data)`` (``key = "." + ext``, ``None``: not mine),
            a dict ``{ext: f(data)}``, a list of those tried in order, or a sample function
            ``sample -> sample``; other members go through the built-in decoders. See
            :func:`tarindex.codecs.make_decoder` and docs/DECODING.md. Defaults to ``None``.
        transform: Called on each (decoded, selected) sample; its result is what ``ds[i]``
            returns. Defaults to ``None``.
        fields: Extensions to read, e.g. ``("cls",)`` or just ``"cls"`` (a bare string is one
            field): the others are left out of every sample and their bytes are not read.
            Defaults to ``None`` (all).
        select: Make each sample a tuple, webdataset's ``to_tuple``:
            ``tarindex.to_tuple("jpg;png", "json")`` or just ``("jpg;png", "json")`` (``;``
            separates alternatives, the first present wins). Only the members it names are
            read (it sets ``fields``) and only those it picks are decoded; ``transform`` then
            gets the tuple. A missing field raises :class:`tarindex.errors.MissingFieldError`
            (``to_tuple(..., missing_is_error=False)``: ``None``). Defaults to ``None``.
        allow_pickle: Unpickle ``pickle``/``pyd``/``pkl`` members when decoding. Defaults to
            ``False``.
        options: How the shards are opened, bounded and checked: a
            :class:`tarindex.OpenOptions` (``max_open``, ``use_mmap``, ``check_crc``,
            ``verify_data``, ``index_dir``, each documented there), e.g.
            ``options=tarindex.OpenOptions(verify_data=True)``. Defaults to
            ``OpenOptions()``.
        batched: Make ``__getitems__`` (the DataLoader's batched fetch) return one
            :class:`tarindex.torch.batch.BatchedSamples` per batch, read straight into one
            buffer, instead of a list of dicts; use it with
            ``collate_fn=tarindex.collate_batched``. Raw bytes, or with
            ``decode=tarindex.ImageDecode(...)`` one
            :class:`tarindex.torch.images.ImageBatch`: the images decoded straight into one
            ``uint8 (B, 3, H, W)`` tensor (shared memory in a worker), the same pixels as
            ``ds[i]``, plus ``int64`` labels. Not with ``transform``, ``select`` or other
            decoders. ``ds[i]`` is unchanged. Defaults to ``False``.
        remote: How URL shards are read (:class:`tarindex.RemoteOptions`: storage options,
            retries, cache directory, read-ahead). Over remote shards ``ds[i]`` makes one
            ranged read for the sample's members and ``__getitems__`` one concurrent batch of
            coalesced ranges for the whole batch. Defaults to ``RemoteOptions()``.
        subset: Global sample indices of the source: the dataset is just those samples, in
            source order (``ds[i]`` is source sample ``sorted(set(subset))[i]``; its
            ``__index__`` is the source index). For splits, :func:`tarindex.split_by_key`.
            Defaults to ``None`` (all samples).

    Raises:
        FileNotFoundError: Nothing matches ``source``.
        IndexMissingError: A shard has no index and ``OpenOptions(index="require")`` (the
            message says how to build it; by default a missing index is built).
        StaleIndexError: On first read of a shard whose tar changed since it was indexed.
        FormatError: On first read of a shard whose index is truncated or corrupt.
        ChecksumError: An index whose crc32 fails (at first read), or with ``verify_data`` a
            member whose bytes changed.
        TruncatedError: A tar cut while open.
        DecodeError: A member that cannot be decoded or exceeds a decode bound (names the
            shard, key and extension; see :class:`tarindex.codecs.ExtDecoder` for the bounds).
        IndexError: ``ds[i]`` with ``i`` outside ``[-len(ds), len(ds))``
            (:class:`tarindex.errors.SampleIndexError`).
        MissingFieldError: A sample without a field ``select`` asks for (a ``KeyError``).
        ValueError: ``batched=True`` together with ``transform``, ``select`` or a ``decode``
            other than an ``ImageDecode``;
            a ``fields`` entry that is not a ``str``;
            ``select`` together with ``fields``; an unknown ``decode`` mode; ``options`` or
            ``remote`` together with a ready ``ShardSet``.
    """

    def __init__(
        self,
        source: Source | ShardSet | ShardSubset,
        *,
        decode: DecodeSpec = None,
        transform: Callable[[Sample], Any] | None = None,
        fields: Collection[str] | None = None,
        select: Selection | str | Sequence[str] | None = None,
        allow_pickle: bool = False,
        batched: bool = False,
        options: OpenOptions | None = None,
        remote: RemoteOptions | None = None,
        subset: Sequence[int] | NDArray[np.integer[Any]] | None = None,
    ) -> None:
        opened = open_shards(source, options, remote)
        self.shards: SampleSource = opened
        if subset is not None:  # a view: ds[i] is sample subset[i] of the source
            self.shards = ShardSubset(opened, subset)
        self.select, fields = select_fields(select, check_fields(fields))
        self.fields = field_set(fields)
        self.decoder = make_decoder(decode, allow_pickle)
        self.transform = transform
        self.image_spec = image_spec(self.decoder) if batched else None
        if batched and (
            (self.decoder is not None and self.image_spec is None)
            or transform is not None
            or self.select is not None
        ):
            raise ValueError(
                "TarDataset(batched=True) returns raw bytes: drop decode/transform/select "
                "(fields= projects a batched read), or pass decode=tarindex.ImageDecode(...) "
                "alone for one image tensor per batch"
            )
        self.batched = batched
        self._pid = 0  # the process _readers last ran in
        if batched:
            expect_workers()  # a fork starts torch's shm manager first (transport.py)
        self.finisher = Finisher(self.shards, self.decoder, self.select, self.transform)

    def __len__(self) -> int:
        return len(self.shards)

    def set_epoch(self, epoch: int) -> None:
        """Draw ``decode=tarindex.ImageDecode(...)``'s random crops and flips for ``epoch``.

        Call it before ``iter(loader)`` each epoch (as ``DistributedSampler.set_epoch``):
        workers started for that iterator get it; persistent workers keep the epoch they
        started with (docs/DECODING.md, "Decoding to the model's size"). Without such a
        decoder it changes nothing.

        Raises:
            ValueError: If ``epoch`` is negative or ``>= 2**64``.
        """
        if isinstance(self.decoder, ExtDecoder):
            self.decoder.set_epoch(epoch)

    def raw(self, i: int) -> Sample:
        """Return sample ``i`` undecoded and untransformed (bytes per extension)."""
        return self.shards.sample(i, self.fields)

    def _readers(self) -> None:
        """Tell this process's fetch policy how many processes share the job's reads.

        Once per process: in a DataLoader worker, its loader's ``num_workers`` (each worker
        reads about that share of a shuffled epoch: docs/REMOTE.md, ``SPREAD``); else 1.
        """
        self._pid = os.getpid()
        info = torch.utils.data.get_worker_info()
        src = self.shards
        while isinstance(src, ShardSubset):
            src = src.base
        if isinstance(src, ShardSet):
            src.fetch_policy.readers = info.num_workers if info is not None else 1

    def __getitem__(self, i: int) -> Any:
        shards = self.shards
        if shards.remote:  # one ranged read for the sample's members
            if self._pid != os.getpid():
                self._readers()
            shards.prefetch([i], self.fields)
        sample = shards.sample(i, self.fields)  # TypeError unless an int, as list indexing
        if self.select is None and self.decoder is None and self.transform is None:
            return sample  # raw bytes: the common hot path, no call more
        return self.finisher(sample)

    def __getitems__(self, indices: Sequence[int]) -> list[Any]:
        """Batched fetch used by ``DataLoader`` (one call per batch instead of one per sample).

        Returns a list of samples, or with ``batched=True`` one ``BatchedSamples``. Over
        remote shards the batch's members are fetched first, in one concurrent round trip.
        """
        if self.shards.remote:
            if self._pid != os.getpid():
                self._readers()
            self.shards.prefetch(indices, self.fields)
        if self.batched:
            if self.image_spec is not None:
                assert isinstance(self.decoder, ExtDecoder)
                return fetch_images(  # type: ignore[return-value]
                    self.shards, indices, self.decoder, self.image_spec, self.fields
                )
            return fetch_batched(self.shards, indices, fields=self.fields)  # type: ignore[return-value]
        read, fields = self.shards.sample, self.fields
        samples = [read(i, fields) for i in indices]
        if self.decoder is None and self.select is None and self.transform is None:
            return samples
        finish = self.finisher
        return [finish(s) for s in samples]

    def index_of(self, key: str) -> int:
        """Return the index ``i`` of the sample whose key is ``key`` (``ds[i]["__key__"] == key``).

        O(log n) per lookup through the shards' key tables (FORMAT.md §2.8.3; see
        :meth:`tarindex.ShardSet.indices_of` for the first call over many shards).

        Raises:
            KeyNotFoundError: (a ``KeyError``) If no sample has this key.
            AmbiguousKeyError: (a ``LookupError``) If samples of several shards have it (keys
                are unique only within a shard); the message names them all.
        """
        return self.shards.index_of(key)

    def index_of_many(self, keys: Sequence[str]) -> NDArray[np.int64]:
        """Return the index of each key's sample, ``-1`` where none (vectorised; a join).

        See :meth:`tarindex.ShardSet.index_of_many`.

        Raises:
            AmbiguousKeyError: As :meth:`index_of`.
        """
        return self.shards.index_of_many(keys)

    def indices_of(self, key: str) -> list[int]:
        """Return the index of every sample whose key is ``key``, ascending (maybe empty)."""
        return self.shards.indices_of(key)

    def get(self, key: str) -> Any:
        """Return the sample whose key is ``key``, as ``ds[ds.index_of(key)]`` (decoded, transformed).

        ``get`` is a key lookup everywhere (:meth:`tarindex.ShardSet.get` gives the raw
        sample); sample ``i`` is ``ds[i]``.

        Raises:
            TypeError: If ``key`` is not a ``str``.
            KeyNotFoundError, AmbiguousKeyError: As :meth:`index_of`.
        """
        return self[self.shards.index_of(key)]

    @property
    def paths(self) -> list[str]:
        """Shard paths in sample order."""
        return self.shards.paths

    def __repr__(self) -> str:
        return f"TarDataset({len(self.shards.paths)} shards, {len(self)} samples)"
