"""``fields=``: which members a read returns, one rule for every entry point.

Every public ``fields=`` (``ShardReader``, ``ShardSet``, ``ShardSubset``, the datasets'
``fields=`` and ``int_fields=``, the engines' readers) goes through :func:`check_fields`
(ordered, for arguments kept as given) or :func:`field_set` (a ``frozenset``, what the read
loops look members up in). The rule: ``None`` is every member; a bare ``str`` is one field
(``fields="bin"`` is ``("bin",)``, not the letters ``b``, ``i``, ``n``); any other
collection is taken entry by entry, each a ``str``. Anything else is a
:class:`~tarindex.errors.FieldsError` (both a ``TypeError`` and a ``ValueError``).
"""

from __future__ import annotations

from collections.abc import Collection
from typing import overload

from ..errors import FieldsError

__all__ = ["Fields", "check_fields", "field_set"]

Fields = Collection[str] | None
"""Extensions to read (others are not read at all), or ``None`` for every member."""

_CHECKED: set[frozenset[str]] = set()
"""Exact frozensets :func:`field_set` made or checked (taken again without a walk: ``ds[i]``)."""
_CHECKED_MAX = 4096


@overload
def check_fields(fields: None, name: str = ...) -> None: ...
@overload
def check_fields(fields: str | Collection[str], name: str = ...) -> tuple[str, ...]: ...


def check_fields(fields: str | Collection[str] | None, name: str = "fields") -> tuple[str, ...] | None:
    """Return the extensions ``fields`` names, in order, duplicates dropped (the module's rule).

    Args:
        fields: ``None`` (all members), one extension, or a collection of them.
        name: The argument's name, for messages (``"int_fields"``). Defaults to ``"fields"``.

    Returns:
        ``None`` for ``None``, else a tuple of ``str``.

    Raises:
        FieldsError: (a ``TypeError`` and a ``ValueError``) An entry that is not a ``str``
            (e.g. ``b"bin"``), or ``fields`` neither a ``str`` nor a collection (the message
            names the argument and the fix).
    """
    if fields is None:
        return None
    if isinstance(fields, str):
        return (fields,)
    if isinstance(fields, (bytes, bytearray, memoryview)) or not isinstance(fields, Collection):
        raise FieldsError(
            f"{name}={fields!r}: expected an extension (str) or a collection of them"
        )
    got = list(fields)
    for f in got:
        if not isinstance(f, str):
            raise FieldsError(
                f"{name}={fields!r}: {f!r} ({type(f).__name__}) is not an extension name "
                f"(str); pass e.g. {name}=('jpg', 'cls')"
            )
    return tuple(dict.fromkeys(got))


def field_set(fields: str | Collection[str] | None) -> frozenset[str] | None:
    """:func:`check_fields` as a ``frozenset`` (``None`` stays ``None``), as the read loops take it.

    A ``frozenset`` (or subclass) whose entries pass comes back as it is; an exact one this
    function made or checked before, without a walk (one hash lookup: the per-sample path of
    ``ds[i]`` with ``fields=``).

    Raises:
        FieldsError: As :func:`check_fields`.
    """
    if fields is None:
        return None
    exact = type(fields) is frozenset
    if exact and fields in _CHECKED:
        return fields  # checked: every entry a str
    if isinstance(fields, frozenset):
        check_fields(fields)  # the entries (no hash: a subclass's own runs where it is used)
        out: frozenset[str] = fields
    else:
        out = frozenset(check_fields(fields))
    if type(out) is frozenset and len(_CHECKED) < _CHECKED_MAX:  # never a subclass: its hash
        _CHECKED.add(out)
    return out
