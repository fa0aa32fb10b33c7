"""Many shards as one sequence of samples: :class:`ShardSet`.

Global index ``i`` -> ``(shard, j)`` by :mod:`tarindex.read.spanner` from the per-shard
counts in the index headers (or a manifest); readers from a per-process
:class:`~tarindex.read.pool.ReaderPool`; one sample (``ds[i]``) through the compiled loops
where they apply (:mod:`tarindex.read.kernel`), else the reader's own path; batches in
:mod:`tarindex.read.batch`, key lookups in :mod:`tarindex.read.keys`, read-ahead in
:mod:`tarindex.read.prefetch`; what only the streaming executors read through (takes,
blocks as dicts, packed batches) in :mod:`tarindex.read.takes` (:meth:`ShardSet.takes`).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
from numpy.typing import NDArray

from ..errors import AmbiguousKeyError, IndexMissingError, KeyNotFoundError
from ..format.index import read_header
from ..format.keys import lookup_key
from ..format.keytable import KeyTable
from ..format.spec import HEADER, INDEX_SUFFIX
from ..storage.remote import RemoteOptions, RemoteSource, is_url, load_indexes
from . import batch, kernel, prefetch
from . import keys as keylookup
from .autoindex import build_missing
from .block import Block, Sample
from .fetchpolicy import FetchPolicy
from .fields import Fields, field_set
from .hot import HandBack
from .options import OpenOptions
from .paths import index_for, read_sample_count
from .pool import ReaderPool
from .sample_source import in_order
from .shard import ShardReader
from .sources import Source, expand_shards
from .spanner import check_index, equal_count, locate
from .takes import SetTakes

__all__ = ["ShardSet"]


class ShardSet:
    """Many shards as one sequence of samples; global index ``i`` -> ``(shard, j)``.

    Construction reads only the 80-byte header of every index (no tar scan, no per-sample
    objects), or from a dataset manifest (FORMAT.md §9) nothing but the manifest: one read
    whatever the shard count. Each shard a manifest lists is checked against it when first
    opened in a process (samples, members, tar size, fingerprint, shard id): a missing or
    changed shard raises :class:`~tarindex.errors.StaleManifestError` naming it. Readers open
    lazily in the process that reads, and are never pickled. At most
    ``options.max_open`` are open at a time per process (least recently used closed first),
    lowered to what the descriptor limit allows (:func:`open_shard_bound`, computed in each
    process); if opening still fails with ``EMFILE``, half the open readers are closed, the
    bound is lowered and a ``ResourceWarning`` says so.

    Safe to share between threads (every read method, and :meth:`close` at any time): a read
    in flight when another thread closes the set, or evicts its shard, finishes with the right
    bytes; later reads open their shards again (docs/READING.md, "Threads").

    Args:
        source: Shards: a path, list, brace pattern, glob, directory or manifest (``.json``)
            (see :func:`tarindex.read.sources.expand_shards`).
        options: How the shards are opened, bounded and checked (``max_open``,
            ``use_mmap``, ``check_crc``, ``verify_data``, ``index_dir``, ``index``; each
            documented on :class:`tarindex.OpenOptions`; ``index="auto"``, the default,
            builds a missing index now). Defaults to ``OpenOptions()``.
        remote: How remote shards (URLs) are read: storage options, retries, read-ahead,
            cache (:class:`tarindex.RemoteOptions`). Defaults to ``RemoteOptions()``.

    Raises:
        FileNotFoundError: No shard matches ``source``.
        IndexMissingError: A shard has no index and ``options.index == "require"`` (the
            message gives the command).
        FormatError: ``options.index == "auto"`` (the default) and a tar without an index
            cannot be indexed (truncated, corrupt, not a tar, ``CompressedTarError``; names
            the tar).
        FormatError: An index header is bad or its counts do not match its size (FORMAT.md
            §2.1), or a manifest is not valid (FORMAT.md §9).
    """

    def __init__(
        self,
        source: Source,
        *,
        options: OpenOptions | None = None,
        remote: RemoteOptions | None = None,
    ) -> None:
        self.options = OpenOptions() if options is None else options
        """How these shards open (:class:`tarindex.OpenOptions`), as given (pickled along)."""
        index_dir = self.options.index_dir
        self.remote_options = remote or RemoteOptions()
        listing = expand_shards(source, self.remote_options)
        self.paths = listing.paths
        self.index_paths = (  # (the common case without index_dir, ~3x faster at 100k shards)
            [p + INDEX_SUFFIX for p in self.paths]
            if index_dir is None
            else [index_for(p, index_dir) for p in self.paths]
        )
        self.remote = any(is_url(p) for p in self.paths if "://" in p)
        """``True`` if some shards are remote URLs (reads then go through fsspec)."""
        counts = self._counts(listing.samples)  # from manifests: no index read at all
        self.counts = np.asarray(counts, dtype=np.int64)
        self.starts = np.zeros(len(counts) + 1, dtype=np.int64)
        np.cumsum(self.counts, out=self.starts[1:])
        self._starts_list: list[int] = self.starts.tolist()
        self._starts_bytes = self.starts.tobytes()  # the compiled get's (immutable) copy
        self._per = equal_count(counts)
        self._pool = ReaderPool(
            self.paths,
            self.index_paths,
            counts,
            listing if listing.listed else None,
            self.options,
            self.remote_options,
        )
        self.max_open = self._pool.max_open
        """Open shards asked for at most (``pool.open_bound``: within the descriptor limit)."""
        self._readers: OrderedDict[int, ShardReader] = self._pool.readers
        self._policy = FetchPolicy(self._pool, self.starts, self._per)

    def _counts(self, known: NDArray[np.int64]) -> list[int]:
        """Sample counts from the index headers; remote indexes fetched together, once.

        ``known[k] >= 0`` (from a manifest) is taken as it is: that index is not read.
        """
        ips = self.index_paths
        counts: list[int] = [int(c) for c in known.tolist()]
        todo = [k for k, c in enumerate(counts) if c < 0]
        far = [k for k in todo if is_url(ips[k])]
        auto = self.options.index == "auto"
        missing: list[int] = []
        for k in todo:
            if not is_url(ips[k]):
                try:
                    counts[k] = read_sample_count(self.paths[k], ips[k])
                except IndexMissingError:
                    if not auto:
                        raise
                    missing.append(k)
        if far:
            try:
                got = load_indexes(
                    [ips[k] for k in far], [self.paths[k] for k in far], self.remote_options
                )
            except IndexMissingError:
                if not auto:
                    raise
                got = []
                for k in far:  # one by one: which are missing
                    try:
                        got.extend(load_indexes([ips[k]], [self.paths[k]], self.remote_options))
                    except IndexMissingError:
                        missing.append(k)
                far = [k for k in far if k not in set(missing)]
            for k, (data, _) in zip(far, got, strict=True):
                counts[k] = read_header(data[: HEADER.size], ips[k], file_size=len(data)).n_samples
        if missing:  # OpenOptions(index="auto"): built now, beside the tar or in the index cache
            for k, ip in build_missing(self.paths, ips, missing, self.remote_options).items():
                ips[k] = ip
                counts[k] = read_sample_count(self.paths[k], ip)
        return counts

    def prefetch(
        self,
        indices: Sequence[int] | NDArray[np.integer[Any]],
        fields: Fields = None,
        *,
        wait: bool = True,
        reach: NDArray[np.int64] | None = None,
    ) -> None:
        """Fetch the members of global samples ``indices`` ahead, for remote shards.

        Local shards: nothing. Remote: the selected members' byte ranges, coalesced, go into
        each source's read-ahead store, so the kernel's reads that follow take them from
        memory. ``wait=True`` fetches the whole batch now in one concurrent round trip across
        shards (``ds[i]``: one ranged read per sample; ``__getitems__``: one batch);
        ``False`` queues them to background threads within the read-ahead budget.
        Out-of-range indices are left for the read to refuse. The fetch policy
        (:mod:`tarindex.read.fetchpolicy`, docs/REMOTE.md) sees every such read first: a
        shard it reads whole is opened from its copy in the cache instead. ``reach``
        (``int64 (n_shards,)``): the samples of each shard the caller can read at most (a
        subset), so a sparse view stays on ranged reads.

        Raises:
            RemoteError: As :func:`tarindex.remote.fetch` (``wait=True``).
            FormatError, StaleIndexError: As :meth:`reader` for a shard opened here.
        """
        if self.remote:
            prefetch.prefetch(
                self._pool, self.starts, self._per, indices, fields, wait, self._policy, reach
            )

    def follow(self, order: Any) -> None:
        """Hand the order of the coming reads to the fetch policy (docs/REMOTE.md).

        With ``RemoteOptions(fetch="auto")`` (the default) a plan says which shards will be
        read mostly (fetched whole into the cache, ahead of need, in the plan's order) and
        which sparsely (ranged reads). Pickled with the set to DataLoader workers, where the
        reads (``ds[i]``, ``__getitems__``) are matched to positions of the plan.

        Args:
            order: The global indices in the order they will be read (e.g. the list given
                to ``DataLoader(ds, sampler=order)``), or a planned sampler of ours
                (``tarindex.BlockSampler`` calls this itself), or ``None`` to forget.
        """
        self._policy.follow(order)

    @property
    def fetch_policy(self) -> FetchPolicy:
        """This set's fetch policy (:class:`~tarindex.read.fetchpolicy.FetchPolicy`)."""
        return self._policy

    @property
    def pool(self) -> ReaderPool:
        """This process's open readers of these shards (:class:`~tarindex.read.pool.ReaderPool`)."""
        return self._pool

    def __len__(self) -> int:
        return self._starts_list[-1]

    def __iter__(self) -> Iterator[Sample]:
        """Every sample in global order, as :meth:`sample` gives it, a block at a time.

        See :func:`tarindex.read.sample_source.in_order` (1024 samples of a shard per read).
        """
        return in_order(self)

    @property
    def n_shards(self) -> int:
        """Number of shards."""
        return len(self.paths)

    def locate(self, i: int) -> tuple[int, int]:
        """Map global sample index ``i`` (negative counts from the end) to ``(shard, j)``.

        Raises:
            SampleIndexError: If ``i`` is out of range.
            TypeError: If ``i`` is not an integer.
        """
        return locate(self._starts_list, self._per, i)

    def reader(self, s: int) -> ShardReader:
        """Return the open reader of shard ``s``, opening it (and closing the LRU one) if needed.

        Its open-time checks (FORMAT.md §3) have run, or, for a remote shard read from a
        copy still being downloaded, are running since its open: its first read waits for
        them (docs/REMOTE.md, "Fetch policy").

        Raises:
            StaleIndexError: If the shard's index changed since this ShardSet was made, or
                no longer matches its tar.
            StaleManifestError: If the ShardSet was made from a manifest and the shard is
                missing or differs from its row (FORMAT.md §9).
            FormatError: If the index is corrupt (see :class:`ShardReader`).
        """
        r = self._pool.reader(s)
        src = r.source
        if isinstance(src, RemoteSource) and not src.checked and src.fetches:
            src.check_now()  # opened without a request: its open-time checks, now
        return r

    _keyidx: KeyTable | None = None

    def _key_index(self) -> KeyTable:
        """Every shard's key table in one: hashes ascending, global indices (made once)."""
        ki = self._keyidx
        if ki is None:
            ki = self._keyidx = keylookup.joined_table(self.reader, self._starts_list)
        return ki

    def indices_of(self, key: str) -> list[int]:
        """Return the global index of every sample whose key is ``key``, ascending.

        Keys are unique within a shard (FORMAT.md §4), not across shards. One shard: its
        key table (:meth:`ShardReader.find_key`). Several: on first call the shards' key
        tables are joined into one (each shard opened once; 12 bytes per sample, per
        process, not pickled), then each lookup is a binary search, O(log n), and each
        candidate's key bytes are compared.

        Raises:
            TypeError: If ``key`` is not a ``str`` (an index is read with :meth:`sample`).
            FormatError, StaleIndexError: As :meth:`reader`.
        """
        kb = lookup_key(key)
        if not kb:
            return []
        if self.n_shards == 1:
            j = self.reader(0).find_normalized(kb)
            return [] if j is None else [j]
        return keylookup.find_all(self.reader, self._key_index(), self._starts_list, self._per, kb)

    def index_of(self, key: str) -> int:
        """Return the global index of the sample whose key is ``key``.

        See :meth:`indices_of` for the cost.

        Raises:
            KeyNotFoundError: (a ``KeyError``) If no sample has this key.
            AmbiguousKeyError: (a ``LookupError``) If several shards hold the key; the message
                names each place; :meth:`indices_of` returns them all.
            FormatError, StaleIndexError: As :meth:`reader`.
        """
        hits = self.indices_of(key)
        if len(hits) == 1:
            return hits[0]
        if not hits:
            raise KeyNotFoundError(
                f"no sample with key {key!r} in {self.n_shards} shard(s) ({self.paths[0]}"
                f"{', ...' if self.n_shards > 1 else ''})"
            )
        where = []
        for i in hits[:5]:
            s, j = self.locate(i)
            where.append(f"{i} ({self.paths[s]}, sample {j})")
        raise AmbiguousKeyError(
            f"key {key!r} is in {len(hits)} samples: {', '.join(where)}"
            f"{', ...' if len(hits) > 5 else ''}; keys are unique only within a shard: use "
            f"indices_of(key) for every one, or a source of fewer shards"
        )

    def index_of_many(self, keys: Sequence[str]) -> NDArray[np.int64]:
        """Return the global index of each key's sample, ``-1`` for a key no sample has.

        The batch form of :meth:`index_of`, for joins with metadata: the keys are hashed
        together (vectorised, FORMAT.md §8), looked up with one ``searchsorted`` in the key
        table, and the candidates' key bytes compared shard by shard (their chunks of the
        tables pass the guards first).

        Args:
            keys: The keys (FORMAT.md §4 normalisation, as :meth:`index_of`).

        Returns:
            ``int64 (len(keys),)``.

        Raises:
            AmbiguousKeyError: If a key is held by samples of several shards (the first such
                key, with every place); :meth:`indices_of` returns them all.
            FormatError, StaleIndexError: As :meth:`reader`.
        """
        kt = self._key_index() if self.n_shards > 1 else self.reader(0).key_table()
        out, dup = keylookup.find_many(self.reader, kt, self.starts, self._per, keys)
        if dup.any():
            self.index_of(keys[int(np.argmax(dup))])  # raises, naming every place
        return out

    def get(self, key: str, fields: Fields = None) -> Sample:
        """Return the sample whose key is ``key``: ``sample(index_of(key), fields)``.

        ``get`` is a key lookup everywhere in tarindex (here, on a view, on
        :class:`tarindex.TarDataset`); a global index is read with :meth:`sample`.

        Raises:
            TypeError: If ``key`` is not a ``str``.
            KeyNotFoundError, AmbiguousKeyError: As :meth:`index_of`.
            FormatError, StaleIndexError: As :meth:`sample`.
        """
        return self.sample(self.index_of(key), fields)

    def sample(self, i: int, fields: Fields = None) -> Sample:
        """Return global sample ``i`` with ``__key__``, ``__shard__``, ``__index__`` and raw bytes.

        Args:
            i: Global sample index (negative counts from the end).
            fields: Extensions to return, see :meth:`ShardReader.sample`. Defaults to all.

        Raises:
            SampleIndexError: If ``i`` is out of range.
            StaleIndexError: As :meth:`reader`.
            FormatError: As :meth:`ShardReader.sample`.
        """
        # the per-sample hot path: the kernel's loop for the members of a mapped shard in one
        # call; a hand-back (shard not open, chunk unchecked) settled by the pool and the loop
        # run again, else (not mapped, anything it does not decide) the reader's own path
        i = i if type(i) is int else check_index(i, self._starts_list[-1])  # bool, np, 1.5
        fields = field_set(fields)  # "bin" is one field
        got = kernel.kernel.sample(  # fields: None or a frozenset (others are handed back)
            i, self._starts_bytes, self._per, self._readers, self.paths, fields
        )
        if isinstance(got, HandBack):
            return self._settled(i, fields, got)
        if self._pool.evicts:  # the LRU order is the pool's (kernel reads only look up)
            self._pool.touch((self.locate(i)[0],))
        return got

    def _settled(self, i: int, fields: frozenset[str] | None, hb: HandBack) -> Sample:
        """:meth:`sample` after a hand-back: settled and the loop run again, else the Python path.

        An open, then a check (``ReaderPool.settle``); any other hand-back, or a third one, and
        the reader's own path reads the sample or raises its error.
        """
        pool = self._pool
        for _ in range(2):
            if not pool.settle(hb):
                break
            got = kernel.kernel.sample(
                i, self._starts_bytes, self._per, self._readers, self.paths, fields
            )
            if not isinstance(got, HandBack):
                if pool.evicts:
                    pool.touch((self.locate(i)[0],))
                return got
            hb = got
        starts = self._starts_list
        s, j = locate(starts, self._per, i)
        out = self.reader(s).sample(j, fields)
        out["__shard__"] = self.paths[s]
        out["__index__"] = starts[s] + j
        return out

    def read_block(
        self,
        s: int,
        j0: int,
        j1: int,
        fields: Fields = None,
        *,
        data: bool = True,
        prefetch: bool = False,
    ) -> Block:
        """:meth:`ShardReader.read_block` on shard ``s``, with global indices in the block.

        Raises:
            SampleIndexError, FormatError, StaleIndexError, TruncatedError: As
                :meth:`ShardReader.read_block` and :meth:`reader`.
        """
        b = self.reader(s).read_block(j0, j1, fields, data=data, prefetch=prefetch)
        b.paths = [self.paths[s]]
        b.index = b.samples + self._starts_list[s]
        return b

    def gather(
        self, indices: Sequence[int] | NDArray[np.integer[Any]], fields: Fields = None
    ) -> Block:
        """Read global samples ``indices`` (a batch, any order, repeats allowed) as one block.

        One pass over the batch with scalar reads of each shard's tables (the per-sample cost
        of ``ds[i]``, without its dict): every sample's chunk of the tables passes the guards
        first, as in :meth:`ShardReader.read_block`. With mmap the block's buffers are the
        mappings; with ``pread`` each shard's selected members are read in runs. When the
        batch spans more shards than may stay open (``pool.open_bound``) the members' bytes
        are copied out at once, so descriptors stay within the bound.

        Args:
            indices: Global sample indices; negative ones count from the end.
            fields: Extensions to read (others are not read). Defaults to ``None`` (all).

        Returns:
            A :class:`Block` of ``len(indices)`` samples in the order of ``indices``.

        Raises:
            SampleIndexError: If an index is out of range.
            TypeError: If an index is not an integer.
            FormatError, StaleIndexError: As :meth:`ShardReader.read_block` and :meth:`reader`.
        """
        return batch.gather(self._pool, self.starts, self._per, indices, fields)

    def takes(self) -> SetTakes:
        """The reads the streaming executors need (:class:`~tarindex.read.takes.Takes`).

        Not for users: a window's blocks made ready and copied out as they are yielded,
        blocks as dicts, remote read-ahead, a batch read and packed in one pass
        (docs/ARCHITECTURE.md, "One streaming window"). Cheap; one per iteration, not pickled.
        """
        return SetTakes(self, self._pool, self._per, self._starts_list, self._starts_bytes)

    def close(self) -> None:
        """Close every open reader of this process (any thread, any time).

        A read another thread has in flight finishes with the right bytes (its reader closes
        when it ends); a later read opens its shard again.
        """
        self._pool.close()

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_pool"] = self._pool.fresh()  # handles are reopened lazily, never pickled
        state["_policy"] = self._policy.copy_for(state["_pool"])
        del state["_readers"]
        state.pop("_keyidx", None)  # per process, made again on first lookup
        del state["_starts_list"], state["_starts_bytes"]  # copies of starts, made again
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._starts_list = self.starts.tolist()
        self._starts_bytes = self.starts.tobytes()
        self._readers = self._pool.readers
