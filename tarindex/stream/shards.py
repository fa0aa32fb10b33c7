"""The shards a dataset reads: a source opened as a ShardSet, or a ready one as it is."""

from __future__ import annotations

from ..read import ShardSet
from ..read.options import OpenOptions
from ..read.sources import Source
from ..read.subset import ShardSubset
from ..storage.remote import RemoteOptions

__all__ = ["open_shards"]


def open_shards(
    source: Source | ShardSet | ShardSubset,
    options: OpenOptions | None = None,
    remote: RemoteOptions | None = None,
) -> ShardSet | ShardSubset:
    """Open ``source`` as a :class:`~tarindex.ShardSet`, or take a ready one as it is.

    A ready ``ShardSet`` (or ``ShardSubset``) is used itself, not copied: the dataset reads
    through it (and pickles it to DataLoader workers, which reopen its shards lazily). Its
    options are its own, so passing any here with it is refused rather than ignored.

    Args:
        source: Shards (see :class:`tarindex.ShardSet`), or a ready ``ShardSet``.
        options: As for :class:`tarindex.ShardSet` (:class:`tarindex.OpenOptions`).
            Defaults to ``None`` (``OpenOptions()``).
        remote: As for :class:`tarindex.ShardSet`. Defaults to ``None``.

    Returns:
        The shards.

    Raises:
        ValueError: A ready ``ShardSet`` together with ``options`` or ``remote`` (the message
            names them).
        FileNotFoundError, IndexMissingError, FormatError: As :class:`tarindex.ShardSet`.
    """
    if isinstance(source, (ShardSet, ShardSubset)):
        named = [k for k, v in (("options", options), ("remote", remote)) if v is not None]
        if named:
            raise ValueError(
                f"{' and '.join(named)} given with a ready {type(source).__name__}: its shards "
                "are already open with their own options; pass them to the ShardSet instead, "
                "or pass the source (paths) here"
            )
        return source
    return ShardSet(source, options=options, remote=remote)
