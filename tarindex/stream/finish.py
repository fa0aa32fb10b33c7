"""What happens to a raw sample after the read: decode, select, transform, and ``on_error``.

A sample that goes through any of them also gets webdataset's ``__url__`` (its shard's path or
URL, the same as ``__shard__``) and, for a local shard, ``__local_path__`` (that path), so
webdataset code reading those keys keeps working; raw samples (none of the three) stay as the
kernel made them, with no per-sample work added (README, "Coming from webdataset").

One place for the rule both datasets follow: ``select`` (webdataset's ``to_tuple``) picks and
decodes only its fields, else the decoder runs on the whole sample, then ``transform``; the
streaming datasets wrap it in their ``on_error`` policy (:meth:`Finisher.guarded`).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

from ..codecs import Decoder, ExtDecoder, compression_layers
from ..codecs.select import Selection
from ..format.url import is_url
from ..read import Sample
from ..read.sample_source import SampleSource
from ..read.subset import shard_of_index

__all__ = ["SKIP", "Finisher", "decode_sample", "check_on_error"]


class _Skip:
    """The type of :data:`SKIP`."""

    def __repr__(self) -> str:
        return "SKIP"


SKIP = _Skip()
"""Returned by :meth:`Finisher.guarded` for a sample skipped under ``on_error="skip"``."""


def check_on_error(on_error: str) -> str:
    """Return ``on_error`` if it is a policy.

    Raises:
        ValueError: Unless ``on_error`` is ``"raise"`` or ``"skip"``.
    """
    if on_error not in ("raise", "skip"):
        raise ValueError(f"on_error={on_error!r}: expected 'raise' or 'skip'")
    return on_error


def decode_sample(shards: SampleSource, decoder: Decoder, sample: Sample) -> Any:
    """Run ``decoder`` on a raw sample of ``shards``, as both datasets do.

    tarindex's own decoder (:class:`~tarindex.codecs.ExtDecoder`, what ``decode=`` makes)
    also gets the zstd dictionary of the sample's shard (:meth:`ShardReader.zstd_dict`,
    FORMAT.md §7) when a member has a ``.zst`` layer (``json.zst``, ``npy.zst.gz``; ``.gz``
    needs no dictionary); a sample function gets the sample only (raw ``EXT.zst`` and
    ``EXT.gz`` bytes stay as stored).
    """
    if isinstance(decoder, ExtDecoder):
        for k in sample:
            if ".zst" in k and ".zst" in compression_layers(k):
                s = shard_of_index(shards, sample["__index__"])
                return decoder(sample, shards.reader(s).zstd_dict())
    return decoder(sample)


class Finisher:
    """Decode, select and transform one raw sample of ``shards``.

    Args:
        shards: The shards the samples come from (for zstd dictionaries).
        decoder: What ``make_decoder`` made, or ``None`` (bytes).
        select: What ``select_fields`` made, or ``None`` (sample dicts).
        transform: Called on each (decoded, selected) sample, or ``None``.
    """

    def __init__(
        self,
        shards: SampleSource,
        decoder: Decoder | None,
        select: Selection | None,
        transform: Callable[[Any], Any] | None,
    ) -> None:
        self.shards = shards
        self.decoder = decoder
        self.select = select
        self.transform = transform

    @property
    def plain(self) -> bool:
        """Whether a sample passes unchanged (no decode, select or transform)."""
        return self.decoder is None and self.select is None and self.transform is None

    def decode(self, sample: Sample) -> Any:
        """The decoder's result for ``sample`` (``decode_sample``)."""
        return decode_sample(self.shards, self.decoder, sample)  # type: ignore[arg-type]

    def __call__(self, sample: Sample) -> Any:
        """Decode, select, transform one raw sample; errors propagate.

        ``__url__`` (and ``__local_path__`` for a local shard) are added first.
        """
        path = sample.get("__shard__")
        if path is not None:
            sample["__url__"] = path
            if not is_url(path):
                sample["__local_path__"] = path
        out: Any = sample
        if self.select is not None:
            out = self.select(sample, None if self.decoder is None else self.decode)
        elif self.decoder is not None:
            out = decode_sample(self.shards, self.decoder, sample)
        if self.transform is not None:
            return self.transform(out)
        return out

    def guarded(self, sample: Sample, on_error: str) -> Any:
        """:meth:`__call__` under the ``on_error`` policy: :data:`SKIP` for a skipped sample.

        ``"raise"`` adds a note naming the shard and key to the error; ``"skip"`` warns
        (``RuntimeWarning`` naming them and the error) and returns :data:`SKIP`.
        """
        try:
            return self(sample)
        except Exception as e:
            where = f"{sample.get('__shard__')}: sample {sample.get('__key__')!r}"
            if on_error != "skip":
                if hasattr(e, "add_note"):
                    e.add_note(f"while decoding/transforming {where}")
                raise
            warnings.warn(
                f"{where}: skipped (on_error='skip'): {e!r}", RuntimeWarning, stacklevel=2
            )
            return SKIP
