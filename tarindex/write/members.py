"""A sample dict -> the members a shard stores: key and extension checks, encoder, compression.

:class:`SampleEncoder` is the part of :class:`tarindex.ShardWriter` that knows values and
extensions; it writes nothing. Which members are zstd-compressed (FORMAT.md §7) is decided
here, the compression itself is done by the writer with the shard's compressor (and its
dictionary).
"""

from __future__ import annotations

import pickle
from collections.abc import Callable, Collection
from typing import Any

from ..codecs import encode_value
from ..errors import WriterError
from ..format.keys import check_ext, check_key

__all__ = ["Member", "SampleEncoder", "int_option"]

Member = tuple[str, bytes, bool]
"""``(stored extension, encoded bytes, compress them?)``: one member of an encoded sample."""

# what an encoder raises for a value it cannot encode (json nested too deep: RecursionError;
# pickle of a lambda: PicklingError; of a local object: AttributeError; pth/msgpack/cbor
# without their package: ImportError)
_MAX_PLANS = 4096  # extensions whose storage plan a writer remembers

_ENCODE_ERRORS = (
    TypeError,
    ValueError,
    RecursionError,
    ImportError,
    AttributeError,
    pickle.PicklingError,
)


class SampleEncoder:
    """Check and encode samples for a writer (see :class:`tarindex.ShardWriter` for the rules).

    Args:
        encoder: ``(ext, value) -> bytes``, ``True`` (:func:`tarindex.codecs.encode.
            encode_value`) or ``False``: every value stored as it is (bytes as they are,
            ``str`` as UTF-8), an ``EXT.zst`` or ``EXT.gz`` value too (it is the frame, not
            the payload: it is not compressed again).
        compress: ``True``, ``False`` or the extensions to store as ``EXT.zst``.
        keep_meta: Write entries whose name starts with one ``_`` (``"_meta"``) as members;
            ``False`` skips them as webdataset's writer does (``keep_meta=False``). Entries
            starting with ``__`` are never written. Defaults to ``False``.

    Raises:
        WriterError: If ``compress`` is not ``True``, ``False`` or extensions without dots,
            or asks for compression with ``encoder=False`` (which changes no byte).
    """

    def __init__(
        self,
        encoder: Callable[[str, Any], bytes] | bool,
        compress: bool | str | Collection[str],
        keep_meta: bool = False,
    ) -> None:
        self.keep_meta = bool(keep_meta)
        self.encoder: Callable[[str, Any], bytes] = (
            encode_value if encoder is True else _bytes_only if encoder is False else encoder
        )
        self.compress_all, self.compress = _compress_set(compress)
        self.raw = encoder is False
        """``encoder=False``: no member is encoded or compressed, whatever its extension."""
        self._plans: dict[str, tuple[str, str, bool | None]] = {}
        if self.raw and (self.compress_all or self.compress):
            raise WriterError(
                f"compress={compress!r} with encoder=False: encoder=False stores every value as "
                f"it is, compress= would compress them; drop one of the two (a value already "
                f"compressed goes in as it is under an extension ending in .zst)"
            )

    def _plan(self, key: str, ext: str) -> tuple[str, str, bool | None]:
        """How member ``ext`` is stored, checked once per extension: ``(inner, stored, z)``.

        ``inner`` is what the encoder gets, ``stored`` the stored extension, ``z`` whether the
        writer compresses it (``None``: an ``encoder=False`` ``.zst`` value, stored as it is).

        Raises:
            WriterError: If the stored extension is not one a writer may store (FORMAT.md §4).
        """
        inner, stored = ext, ext
        z: bool | None = True
        if self.raw:  # as it is: a .zst value is the frame
            z = None if ext.endswith(".zst") else False
        elif ext.endswith(".zst") and len(ext) > 4:
            inner = ext[:-4]
        elif self.compress_all or ext.rsplit(".", 1)[-1].lower() in self.compress:
            stored = ext + ".zst"
        else:
            z = False
        try:
            check_ext(stored)
        except ValueError as e:
            raise WriterError(f"sample {key!r}: {type(e).__name__}: {e}") from e
        plan = (inner, stored, z)
        if len(self._plans) < _MAX_PLANS:
            self._plans[ext] = plan
        return plan

    def encode(self, sample: dict[str, Any]) -> tuple[str, list[Member]]:
        """Check and encode one sample: ``(key, [(stored ext, bytes, compress?), ...])``.

        The members come sorted by stored extension, as webdataset's writer sorts them, so
        the same sample gives the same bytes whatever its dict order.

        Raises:
            WriterError: Not a dict, no valid ``__key__`` (FORMAT.md §4), a bad extension,
                a value that cannot be encoded (its exception chained), an encoder that
                returns no bytes, one stored extension twice, or no member at all.
        """
        if not isinstance(sample, dict):
            raise WriterError(
                f"a sample is a dict {{'__key__': str, ext: value}}, not a {type(sample).__name__}"
            )
        key = sample.get("__key__")
        if not isinstance(key, str):
            raise WriterError(f"sample has no str '__key__' (got {key!r})")
        try:
            check_key(key)
        except ValueError as e:
            raise WriterError(str(e)) from None
        members: list[tuple[str, bytes, bool]] = []
        plans = self._plans
        for ext, value in sample.items():
            plan = plans.get(ext)
            if plan is None:
                if not isinstance(ext, str):
                    raise WriterError(
                        f"sample {key!r}: extension {ext!r} is a {type(ext).__name__}, not a str"
                    )
                if ext.startswith("_") and (ext.startswith("__") or not self.keep_meta):
                    continue
                plan = self._plan(key, ext)
            inner, stored, z = plan
            try:
                data = self.encoder(inner, value)
            except _ENCODE_ERRORS as e:
                raise WriterError(f"sample {key!r}: {type(e).__name__}: {e}") from e
            if type(data) is not bytes:
                if not isinstance(data, (bytearray, memoryview)):
                    raise WriterError(
                        f"sample {key!r}: encoder returned a {type(data).__name__} for {ext!r}, "
                        f"not bytes"
                    )
                data = bytes(data)
            if self.raw and z is None:  # a .zst value stored as it is
                _refuse_dict_frame(key, stored, data)
            for m in members:
                if m[0] == stored:
                    raise WriterError(
                        f"sample {key!r}: extension {stored!r} twice (from {ext!r} and "
                        f"compress=); give one of them another extension"
                    )
            members.append((stored, data, bool(z)))
        if not members:
            raise WriterError(
                f"sample {key!r} has no members (only '__' entries, or '_' entries without "
                f"keep_meta=True)"
            )
        members.sort()  # by stored extension (unique: the bytes are never compared)
        return key, members


def _refuse_dict_frame(key: str, ext: str, data: bytes) -> None:
    """Refuse a ``.zst`` value whose frame needs a zstd dictionary.

    A shard written with ``encoder=False`` holds no dictionary (FORMAT.md §7), so such a
    member could never be decoded. Only the first frame's header is read (bytes that are no
    zstd frame are stored as given).

    Raises:
        WriterError: The frame names a dictionary.
    """
    if data[:4] != _ZSTD_MAGIC:
        return
    import zstandard  # only for .zst members stored as they are

    try:
        dict_id = zstandard.get_frame_parameters(data).dict_id
    except zstandard.ZstdError:
        return
    if dict_id:
        raise WriterError(
            f"sample {key!r}: {ext!r} is a zstd frame compressed with dictionary {dict_id}; "
            f"written as it is (encoder=False) into a shard that holds no dictionary, it "
            f"could never be decoded (FORMAT.md §7): write its decoded value instead "
            f"(tarindex.codecs.decode.ExtDecoder), with compress= and zstd_dict=True"
        )


_ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"  # RFC 8878 §3.1.1, little-endian 0xFD2FB528


def _bytes_only(ext: str, value: Any) -> bytes:
    """``encoder=False``: bytes as they are, str as UTF-8, nothing else."""
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value)
    if isinstance(value, str):
        return value.encode("utf-8")
    raise TypeError(
        f"extension {ext!r}: encoder=False takes bytes or str, got a {type(value).__name__} "
        f"(drop encoder=False to encode it by extension)"
    )


def int_option(name: str, value: object, low: int, high: int) -> int:
    """``value`` if it is an integer (not a bool) in ``[low, high]``, else ``WriterError``."""
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise WriterError(f"{name}={value!r}: expected an integer in [{low}, {high}]")
    return value


def _compress_set(compress: bool | str | Collection[str]) -> tuple[bool, frozenset[str]]:
    if compress is True or compress is False or compress is None:
        return bool(compress), frozenset()
    items = [compress] if isinstance(compress, str) else compress
    if not isinstance(items, Collection) or not all(
        isinstance(e, str) and e and "." not in e for e in items
    ):
        raise WriterError(
            f"compress={compress!r}: expected True, False or extensions without dots, e.g. "
            f"('json', 'txt') (matched on a member's last extension component)"
        )
    return False, frozenset(e.lower() for e in items)
