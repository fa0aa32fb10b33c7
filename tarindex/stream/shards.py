"""The shards a dataset reads (a source opened as a ShardSet, or a ready one), and which members."""

from __future__ import annotations

from collections.abc import Collection
from typing import overload

from ..read import ShardSet
from ..read.options import OpenOptions
from ..read.sources import Source
from ..read.subset import ShardSubset
from ..storage.remote import RemoteOptions

__all__ = ["open_shards", "check_fields"]


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


@overload
def check_fields(fields: None, name: str = ...) -> None: ...
@overload
def check_fields(fields: str | Collection[str], name: str = ...) -> tuple[str, ...]: ...


def check_fields(fields: str | Collection[str] | None, name: str = "fields") -> tuple[str, ...] | None:
    """Return the extensions a dataset's ``fields=`` (or ``int_fields=``) names, as a tuple.

    The one rule of the datasets (``TarDataset``, ``TarIterableDataset``, the sources of a
    ``MixedDataset``): a bare string is one field (``fields="bin"`` is ``("bin",)``, not the
    letters ``b``, ``i``, ``n``); any other collection is taken entry by entry, each a ``str``.

    Args:
        fields: ``None`` (all members), one extension, or a collection of them.
        name: The argument's name, for messages. Defaults to ``"fields"``.

    Returns:
        ``None`` for ``None``, else the extensions in order, duplicates dropped.

    Raises:
        ValueError: An entry that is not a ``str`` (e.g. ``b"bin"``), or ``fields`` not a
            collection (the message names the argument).
    """
    if fields is None:
        return None
    if isinstance(fields, str):
        return (fields,)
    if isinstance(fields, (bytes, bytearray, memoryview)) or not isinstance(fields, Collection):
        raise ValueError(f"{name}={fields!r}: expected an extension (str) or a collection of them")
    got = list(fields)
    bad = [f for f in got if not isinstance(f, str)]
    if bad:
        raise ValueError(
            f"{name}={fields!r}: {bad[0]!r} is not an extension name (str); pass e.g. "
            f"{name}=('jpg', 'cls')"
        )
    return tuple(dict.fromkeys(got))
