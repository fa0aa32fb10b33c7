"""Selection: webdataset's ``to_tuple("jpg;png", "json")`` for both datasets.

A :class:`ToTuple` names the fields a sample becomes a tuple of, each with alternatives
(``"jpg;png"``: the first one present wins). The datasets read only the members it names
(their extensions are the kernel's ``fields=`` projection), decode only the members it picks,
and return the tuple; see docs/DECODING.md, "Selection".
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable
from typing import Any

from ..errors import MissingFieldError
from .compress import strip_compression
from .exts import COMPRESSION_SUFFIXES

__all__ = ["ToTuple", "to_tuple", "make_select", "select_fields"]

_META = ("__key__", "__shard__", "__index__")


class ToTuple:
    """Picklable selection of a sample's fields as a tuple (webdataset's ``to_tuple``).

    Args:
        *fields: One string per tuple entry, each a ``;``-separated list of alternatives
            (``"jpg;png"``: the first extension the sample has wins; ``"json"`` also matches
            a compressed ``json.zst`` or ``json.gz`` member, decoded as ``json``; see
            :data:`tarindex.codecs.COMPRESSION_SUFFIXES`). A single string with
            spaces is split into fields, as webdataset does (``"jpg;png json"``). Names
            starting with ``__`` (``"__key__"``, ``"__index__"``, ``"__shard__"``) are the
            sample's own entries, not members.
        missing_is_error: A sample with none of a field's alternatives raises
            :class:`tarindex.errors.MissingFieldError`; ``False`` gives ``None`` for that entry.
            Defaults to ``True``.

    Raises:
        ValueError: No fields, or an empty name or alternative.
    """

    def __init__(self, *fields: str, missing_is_error: bool = True) -> None:
        if len(fields) == 1 and isinstance(fields[0], str) and " " in fields[0].strip():
            fields = tuple(fields[0].split())
        if not fields:
            raise ValueError("to_tuple(): name at least one field, e.g. to_tuple('jpg;png', 'cls')")
        alts: list[tuple[str, ...]] = []
        for f in fields:
            if not isinstance(f, str):
                raise ValueError(f"to_tuple field {f!r}: expected a string such as 'jpg;png'")
            names = tuple(a.strip() for a in f.split(";"))
            if not all(names):
                raise ValueError(f"to_tuple field {f!r}: an empty alternative")
            alts.append(names)
        self.alternatives: tuple[tuple[str, ...], ...] = tuple(alts)
        """Per tuple entry, its alternatives in order."""
        self.missing_is_error = bool(missing_is_error)
        """Whether a field absent from a sample raises (else ``None``)."""

    @property
    def fields(self) -> frozenset[str]:
        """The member extensions to read: every alternative not starting with ``__``.

        Each also with every compression suffix (``EXT.zst``, ``EXT.gz``: a compressed
        member, FORMAT.md §7, decodes to ``EXT``), unless it names one itself.
        """
        exts = [a for alt in self.alternatives for a in alt if not a.startswith("__")]
        packed = [a + s for a in exts if strip_compression(a) == a for s in COMPRESSION_SUFFIXES]
        return frozenset(exts + packed)

    def __call__(
        self,
        sample: dict[str, Any],
        decode: Callable[[dict[str, Any]], dict[str, Any]] | None = None,
    ) -> tuple[Any, ...]:
        """Pick the fields of ``sample``, decode only the picked members, return the tuple.

        Args:
            sample: A sample dict (``__key__``, ``__shard__``, ``__index__``, ``ext: bytes``).
            decode: A sample decoder (the datasets' ``decode=``, made by
                :func:`tarindex.codecs.make_decoder`), called on a dict of the sample's
                ``__`` entries and the picked members only. Defaults to ``None`` (values as
                they are).

        Returns:
            One value per field, in order; ``None`` for a missing field when
            ``missing_is_error`` is ``False``.

        Raises:
            MissingFieldError: A field none of whose alternatives the sample has (the message
                names the shard, the key, the field and the extensions the sample has).
        """
        picked: dict[str, Any] = {k: sample[k] for k in _META if k in sample}
        names: list[tuple[str, str] | None] = []  # (name asked, member picked)
        for alt in self.alternatives:
            for a in alt:
                raw = a if a in sample else _packed(sample, a)  # EXT.zst/EXT.gz decode to EXT
                if raw is not None:
                    picked[raw] = sample[raw]
                    names.append((a, raw))
                    break
            else:
                if self.missing_is_error:
                    raise MissingFieldError(self._missing(sample, alt))
                names.append(None)
        if decode is not None:
            picked = decode(picked)
        # decoded: the entry is named without compression suffixes; raw (or a sample
        # function): as stored
        return tuple(None if n is None else _entry(picked, *n) for n in names)

    def _missing(self, sample: dict[str, Any], alt: tuple[str, ...]) -> str:
        shard = sample.get("__shard__")
        have = sorted(k for k in sample if not k.startswith("__"))
        fields = self.fields
        if all(h in fields for h in have):  # read projected (the datasets read only these)
            what = (
                f"of the selected members it has {', '.join(have) or 'none'}; "
                f"`tarindex ls {shard}` lists every member"
            )
        else:
            what = f"it has {', '.join(have)}"
        return (
            f"{shard}: sample {sample.get('__key__')!r} has no "
            f"{' or '.join(repr(a) for a in alt)} ({what}); "
            f"to_tuple(..., missing_is_error=False) gives None instead"
        )

    def __repr__(self) -> str:
        args = ", ".join(repr(";".join(a)) for a in self.alternatives)
        extra = "" if self.missing_is_error else ", missing_is_error=False"
        return f"to_tuple({args}{extra})"


def _packed(sample: dict[str, Any], ext: str) -> str | None:
    """The member of ``sample`` holding ``ext`` compressed (``EXT.zst``, ``EXT.gz``), or None."""
    for s in COMPRESSION_SUFFIXES:
        if ext + s in sample:
            return ext + s
    return None


def _entry(picked: dict[str, Any], asked: str, raw: str) -> Any:
    """The value of the picked member ``raw`` (asked for as ``asked``) after decoding."""
    for name in (asked, strip_compression(raw)):
        if name in picked:
            return picked[name]
    return picked[raw]


def to_tuple(*fields: str, missing_is_error: bool = True) -> ToTuple:
    """Select fields as a tuple, webdataset's ``.to_tuple(...)``: see :class:`ToTuple`.

    ``TarDataset(src, decode="rgb", select=to_tuple("jpg;png", "json"))`` yields
    ``(image, obj)`` per sample and reads only ``jpg``, ``png`` and ``json`` members.

    Raises:
        ValueError: As :class:`ToTuple`.
    """
    return ToTuple(*fields, missing_is_error=missing_is_error)


def make_select(select: ToTuple | str | Iterable[str] | None) -> ToTuple | None:
    """The datasets' ``select=``: a :class:`ToTuple`, a field string or a sequence of them.

    Raises:
        ValueError: A value that is none of these (or an invalid field, see :class:`ToTuple`).
    """
    if select is None or isinstance(select, ToTuple):
        return select
    if isinstance(select, str):
        return ToTuple(select)
    if isinstance(select, Iterable):
        return ToTuple(*select)
    raise ValueError(
        f"select={select!r}: expected tarindex.to_tuple(...), a field string like 'jpg;png' "
        f"or a sequence of them"
    )


def select_fields(
    select: ToTuple | str | Iterable[str] | None, fields: Collection[str] | None
) -> tuple[ToTuple | None, Collection[str] | None]:
    """The datasets' ``select=`` with their ``fields=``: the selection and the members to read.

    A selection reads the fields it names (:attr:`ToTuple.fields`), so it takes the place of
    ``fields=``; without one, ``fields`` as given.

    Raises:
        ValueError: Both ``select`` and ``fields`` given, or as :func:`make_select`.
    """
    sel = make_select(select)
    if sel is None:
        return None, fields
    if fields is not None:
        raise ValueError(f"select={sel!r} reads the fields it names: drop fields={fields!r}")
    return sel, sel.fields
