r"""Selection: webdataset's ``to_tuple``, ``extract_keys``, ``rename``, ``rename_keys`` for both datasets.

A :class:`ToTuple` names the fields a sample becomes a tuple of, each with alternatives
(``"jpg;png"``: the first one present wins; ``"*.png"``: a glob). The datasets read only the
members it names (their extensions are the kernel's ``fields=`` projection; a glob reads
every member), decode only the members it picks, and return the tuple. :class:`Rename` and
:class:`RenameKeys` give a renamed sample dict instead. All are :class:`Selection`\ s, what
the datasets' ``select=`` takes; see docs/DECODING.md, "Selection".
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable
from fnmatch import fnmatchcase
from typing import Any

from ..errors import MissingFieldError
from .compress import strip_compression
from .exts import COMPRESSION_SUFFIXES

__all__ = [
    "Rename",
    "RenameKeys",
    "Selection",
    "ToTuple",
    "make_select",
    "rename",
    "rename_keys",
    "select_fields",
    "to_tuple",
]

_META = ("__key__", "__shard__", "__index__")
_GLOB = frozenset("*?[")

Decode = Callable[[dict[str, Any]], dict[str, Any]]


def _is_glob(name: str) -> bool:
    return not _GLOB.isdisjoint(name)


def _glob_match(ext: str, pattern: str) -> bool:
    """Webdataset's ``extract_keys`` match: ``"*.png"`` matches ``png`` (as ``".png"``)."""
    return fnmatchcase("." + ext, pattern) or fnmatchcase(ext, pattern)


def _read_set(names: Iterable[str]) -> frozenset[str] | None:
    """The members to read for these names: each plus its compressed forms; None for a glob."""
    exts = [a for a in names if not a.startswith("__")]
    if any(_is_glob(a) for a in exts):
        return None
    packed = [a + s for a in exts if strip_compression(a) == a for s in COMPRESSION_SUFFIXES]
    return frozenset(exts + packed)


def _where(sample: dict[str, Any]) -> str:
    return f"{sample.get('__shard__')}: sample {sample.get('__key__')!r}"


class Selection:
    """What the datasets' ``select=`` takes: picks (and decodes) part of a raw sample.

    Subclasses: :class:`ToTuple`, :class:`Rename`, :class:`RenameKeys`.
    """

    @property
    def fields(self) -> frozenset[str] | None:
        """The member extensions to read, or ``None`` for every member."""
        raise NotImplementedError

    def __call__(self, sample: dict[str, Any], decode: Decode | None = None) -> Any:
        """Select from ``sample`` (``decode``: the datasets' sample decoder, or ``None``)."""
        raise NotImplementedError


class ToTuple(Selection):
    """Picklable selection of a sample's fields as a tuple (webdataset's ``to_tuple``).

    Args:
        *fields: One string per tuple entry, each a ``;``-separated list of alternatives
            (``"jpg;png"``: the first extension the sample has wins; ``"json"`` also matches
            a compressed ``json.zst`` or ``json.gz`` member; see
            :data:`tarindex.codecs.COMPRESSION_SUFFIXES`). An alternative with ``*``, ``?`` or
            ``[`` is a glob matched as webdataset's ``extract_keys`` matches (``"*.png"``
            matches ``png`` and ``seg.png``); a selection with a glob reads every member of
            the sample. A single string with spaces is split into fields, as webdataset does
            (``"jpg;png json"``). Names starting with ``__`` (``"__key__"``, ``"__index__"``,
            ``"__shard__"``, ``"__url__"``) are the sample's own entries, not members.
        missing_is_error: A sample with none of a field's alternatives raises
            :class:`tarindex.errors.MissingFieldError`; ``False`` gives ``None`` for that entry
            (webdataset gives ``None`` too). Defaults to ``True``.
        none_is_error: A field whose value is ``None`` after decoding (a JSON ``null``, or a
            missing field with ``missing_is_error=False``) raises
            :class:`tarindex.errors.MissingFieldError`, as webdataset's ``to_tuple`` does.
            Defaults to ``None``: the value of ``missing_is_error``.
        duplicate_is_error: A glob matching several members of one sample raises
            :class:`tarindex.errors.MissingFieldError` (webdataset's ``extract_keys``);
            ``False`` takes the first in the sample's order. Defaults to ``True``.

    Raises:
        ValueError: No fields, or an empty name or alternative.
    """

    def __init__(
        self,
        *fields: str,
        missing_is_error: bool = True,
        none_is_error: bool | None = None,
        duplicate_is_error: bool = True,
    ) -> None:
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
        self.none_is_error = (
            self.missing_is_error if none_is_error is None else bool(none_is_error)
        )
        """Whether a field whose value is ``None`` raises."""
        self.duplicate_is_error = bool(duplicate_is_error)
        """Whether a glob matching several members raises."""

    @property
    def fields(self) -> frozenset[str] | None:
        """The member extensions to read: every alternative not starting with ``__``.

        Each also with every compression suffix (``EXT.zst``, ``EXT.gz``: a compressed
        member, FORMAT.md §7), unless it names one itself. ``None`` (every member) when an
        alternative is a glob.
        """
        return _read_set(a for alt in self.alternatives for a in alt)

    def _glob(self, sample: dict[str, Any], pattern: str) -> str | None:
        hits = [k for k in sample if not k.startswith("__") and _glob_match(k, pattern)]
        if len(hits) > 1 and self.duplicate_is_error:
            raise MissingFieldError(
                f"{_where(sample)}: {pattern!r} matches {', '.join(map(repr, hits))}; name one "
                f"(or to_tuple(..., duplicate_is_error=False) takes the first)"
            )
        return hits[0] if hits else None

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
        picked: dict[str, Any] = {k: v for k, v in sample.items() if k.startswith("__")}
        names: list[tuple[str, str] | None] = []  # (name asked, member picked)
        for alt in self.alternatives:
            for a in alt:
                if a in sample:
                    raw: str | None = a
                elif _is_glob(a):
                    raw = self._glob(sample, a)
                else:
                    raw = _packed(sample, a)  # EXT.zst/EXT.gz hold EXT
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
        # decoded: a .zst entry is named without its suffix; raw (or a sample function): as
        # stored
        out = tuple(None if n is None else _entry(picked, *n) for n in names)
        k = next((k for k, v in enumerate(out) if v is None), -1) if self.none_is_error else -1
        if k >= 0:
            raise MissingFieldError(
                f"{_where(sample)}: field {';'.join(self.alternatives[k])!r} is None "
                f"(none_is_error, as webdataset's to_tuple); to_tuple(..., none_is_error=False) "
                f"keeps it"
            )
        return out

    def _missing(self, sample: dict[str, Any], alt: tuple[str, ...]) -> str:
        shard = sample.get("__shard__")
        have = sorted(k for k in sample if not k.startswith("__"))
        fields = self.fields
        if fields is not None and all(h in fields for h in have):  # read projected
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
        if self.none_is_error != self.missing_is_error:
            extra += f", none_is_error={self.none_is_error}"
        if not self.duplicate_is_error:
            extra += ", duplicate_is_error=False"
        return f"to_tuple({args}{extra})"


def _packed(sample: dict[str, Any], ext: str) -> str | None:
    """The member of ``sample`` holding ``ext`` compressed (``EXT.zst``, ``EXT.gz``), or None."""
    for s in COMPRESSION_SUFFIXES:
        if ext + s in sample:
            return ext + s
    return None


def _entry(picked: dict[str, Any], asked: str, raw: str) -> Any:
    """The value of the picked member ``raw`` (asked for as ``asked``) after decoding."""
    if raw in picked:
        return picked[raw]
    for name in (asked, strip_compression(raw)):  # raw EXT.zst, decoded as EXT
        if name in picked:
            return picked[name]
    return picked[raw]


def to_tuple(
    *fields: str,
    missing_is_error: bool = True,
    none_is_error: bool | None = None,
    duplicate_is_error: bool = True,
) -> ToTuple:
    """Select fields as a tuple, webdataset's ``.to_tuple(...)``: see :class:`ToTuple`.

    ``TarDataset(src, decode="rgb", select=to_tuple("jpg;png", "json"))`` yields
    ``(image, obj)`` per sample and reads only ``jpg``, ``png`` and ``json`` members.
    webdataset's ``.extract_keys("*.png;*.jpg", "*.cls")`` is ``to_tuple("*.png;*.jpg",
    "*.cls")``.

    Raises:
        ValueError: As :class:`ToTuple`.
    """
    return ToTuple(
        *fields,
        missing_is_error=missing_is_error,
        none_is_error=none_is_error,
        duplicate_is_error=duplicate_is_error,
    )


def _split(v: str | Iterable[str], what: str) -> tuple[str, ...]:
    names = tuple(v.split(";")) if isinstance(v, str) else tuple(v)
    if not names or not all(isinstance(n, str) and n for n in names):
        raise ValueError(f"{what}={v!r}: expected names such as 'jpg;png'")
    return names


class Rename(Selection):
    """webdataset's ``.rename(new="old;alt", ..., keep=True)``: a sample with renamed entries.

    Each keyword names a new entry and the old names it comes from (``"jpg;png"``: the first
    one the sample has, also as ``EXT.zst``/``EXT.gz``); the old entries are dropped. The
    sample is decoded first (by its stored extensions, so images decode as images), then
    renamed: webdataset's ``.decode(...).rename(...)``.

    Args:
        keep: Keep the entries not renamed (webdataset's default); ``False`` gives only the
            new ones, and the datasets then read only the members they come from. Defaults to
            ``True``.
        **names: ``new_name="old;alternatives"``.

    Raises:
        ValueError: No names, or an empty one. Calls raise
            :class:`tarindex.errors.MissingFieldError` (a ``ValueError``, as webdataset's)
            for a sample with none of a name's alternatives.
    """

    def __init__(self, keep: bool = True, **names: str | Iterable[str]) -> None:
        if not names:
            raise ValueError("rename(): name at least one entry, e.g. rename(image='jpg;png')")
        self.names = {new: _split(old, new) for new, old in names.items()}
        """New name -> the old names it comes from, in order."""
        self.keep = bool(keep)
        """Whether entries not renamed stay."""

    @property
    def fields(self) -> frozenset[str] | None:
        """Every member with ``keep=True`` (``None``); else the old names (and compressed forms)."""
        if self.keep:
            return None
        return _read_set(a for alt in self.names.values() for a in alt)

    def __call__(self, sample: dict[str, Any], decode: Decode | None = None) -> dict[str, Any]:
        """Decode ``sample`` (with ``decode``), then rename its entries.

        Raises:
            MissingFieldError: A sample with none of a name's alternatives.
        """
        s = decode(sample) if decode is not None else dict(sample)
        got: dict[str, Any] = {}
        used: set[str] = set()
        for new, alt in self.names.items():
            for a in alt:
                name = a if a in s else next((a + z for z in COMPRESSION_SUFFIXES if a + z in s), None)
                if name is not None:
                    got[new] = s[name]
                    used.add(name)
                    break
            else:
                raise MissingFieldError(
                    f"{_where(sample)}: rename {new}={';'.join(alt)!r}: the sample has none of "
                    f"them (it has {', '.join(k for k in s if not k.startswith('__'))})"
                )
        if self.keep:
            drop = used | {a for alt in self.names.values() for a in alt}
            out = {k: v for k, v in s.items() if k not in drop}
        else:
            out = {k: v for k, v in s.items() if k.startswith("__")}
        out.update(got)
        return out

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={';'.join(v)!r}" for k, v in self.names.items())
        return f"rename({args}{'' if self.keep else ', keep=False'})"


def rename(keep: bool = True, **names: str | Iterable[str]) -> Rename:
    """Webdataset's ``.rename(image="jpg;png", keep=True)`` as a ``select=``: see :class:`Rename`."""
    return Rename(keep, **names)


class RenameKeys(Selection):
    """webdataset's ``.rename_keys(("new", "pattern"), ..., new="pattern")``: renamed by globs.

    Each member's extension is matched (lower-cased, ``fnmatch``) against the patterns, the
    last given first (as webdataset); a match is renamed to its new name. ``__`` entries
    stay. The sample is decoded first, by its stored extensions.

    Args:
        *pairs: ``(new_name, pattern)`` pairs.
        keep_unselected: Keep members no pattern matches. Defaults to ``False``.
        must_match: Every pattern must match a member, else
            :class:`tarindex.errors.MissingFieldError`. Defaults to ``True``.
        duplicate_is_error: Two members renamed to one name raise
            :class:`tarindex.errors.MissingFieldError`; ``False`` keeps the first. Defaults to
            ``True``.
        **names: ``new_name="pattern"``.

    Raises:
        ValueError: No patterns, or a pair that is not two strings.
    """

    def __init__(
        self,
        *pairs: tuple[str, str],
        keep_unselected: bool = False,
        must_match: bool = True,
        duplicate_is_error: bool = True,
        **names: str,
    ) -> None:
        rows = [*pairs, *names.items()]
        if not rows or not all(
            isinstance(p, tuple) and len(p) == 2 and all(isinstance(x, str) and x for x in p)
            for p in rows
        ):
            raise ValueError(
                f"rename_keys{tuple(pairs)!r}: expected (new_name, pattern) pairs or "
                f"new_name='pattern' keywords"
            )
        self.rows: tuple[tuple[str, str], ...] = tuple((p, n) for n, p in rows)
        """``(pattern, new_name)`` in the order given (matched last first)."""
        self.keep_unselected = bool(keep_unselected)
        self.must_match = bool(must_match)
        self.duplicate_is_error = bool(duplicate_is_error)

    @property
    def fields(self) -> frozenset[str] | None:
        """Every member (``None``): patterns match whatever the sample holds."""
        return None

    def __call__(self, sample: dict[str, Any], decode: Decode | None = None) -> dict[str, Any]:
        """Decode ``sample`` (with ``decode``), then rename its members by pattern.

        Raises:
            MissingFieldError: A pattern matching nothing (``must_match``), or two members
                renamed to one name (``duplicate_is_error``).
        """
        s = decode(sample) if decode is not None else dict(sample)
        out: dict[str, Any] = {}
        matched = {p: False for p, _ in self.rows}
        for path, value in s.items():
            if path.startswith("__"):
                out[path] = value
                continue
            fname = path.rsplit("/", 1)[-1].lower()
            new = None
            for pattern, name in reversed(self.rows):
                if fnmatchcase(fname, pattern):
                    matched[pattern], new = True, name
                    break
            if new is None:
                if self.keep_unselected:
                    out[path] = value
                continue
            if new in out:
                if self.duplicate_is_error:
                    raise MissingFieldError(
                        f"{_where(sample)}: rename_keys: two members become {new!r}; "
                        f"rename_keys(..., duplicate_is_error=False) keeps the first"
                    )
                continue
            out[new] = value
        if self.must_match and not all(matched.values()):
            missing = [p for p, ok in matched.items() if not ok]
            raise MissingFieldError(
                f"{_where(sample)}: rename_keys: {', '.join(map(repr, missing))} matched no "
                f"member (it has {', '.join(k for k in s if not k.startswith('__'))}); "
                f"rename_keys(..., must_match=False) allows that"
            )
        return out

    def __repr__(self) -> str:
        return f"rename_keys({', '.join(f'({n!r}, {p!r})' for p, n in self.rows)})"


def rename_keys(
    *pairs: tuple[str, str],
    keep_unselected: bool = False,
    must_match: bool = True,
    duplicate_is_error: bool = True,
    **names: str,
) -> RenameKeys:
    """Webdataset's ``.rename_keys(...)`` as a ``select=``: see :class:`RenameKeys`."""
    return RenameKeys(
        *pairs,
        keep_unselected=keep_unselected,
        must_match=must_match,
        duplicate_is_error=duplicate_is_error,
        **names,
    )


def make_select(select: Selection | str | Iterable[str] | None) -> Selection | None:
    """The datasets' ``select=``: a :class:`Selection`, a field string or a sequence of them.

    Raises:
        ValueError: A value that is none of these (or an invalid field, see :class:`ToTuple`).
    """
    if select is None or isinstance(select, Selection):
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
    select: Selection | str | Iterable[str] | None, fields: Collection[str] | None
) -> tuple[Selection | None, Collection[str] | None]:
    """The datasets' ``select=`` with their ``fields=``: the selection and the members to read.

    A selection reads the fields it names (:attr:`Selection.fields`; ``None``: every
    member), so it takes the place of ``fields=``; without one, ``fields`` as given.

    Raises:
        ValueError: Both ``select`` and ``fields`` given, or as :func:`make_select`.
    """
    sel = make_select(select)
    if sel is None:
        return None, fields
    if fields is not None:
        raise ValueError(f"select={sel!r} reads the fields it names: drop fields={fields!r}")
    return sel, sel.fields
