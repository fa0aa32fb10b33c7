"""Every exception tarindex raises.

Built-in exception types are mixed in so code that already catches ``ValueError``
or ``IndexError`` keeps working. Every message names the file, the byte offset
where the problem applies (when there is one), what was expected, and the fix.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "TarIndexError",
    "FormatError",
    "BadMagicError",
    "UnsupportedVersionError",
    "ChecksumError",
    "TruncatedError",
    "TarHeaderError",
    "NotATarError",
    "CompressedTarError",
    "TrailingGarbageError",
    "IndexMissingError",
    "StaleIndexError",
    "StaleManifestError",
    "KeyNotFoundError",
    "AmbiguousKeyError",
    "SampleIndexError",
    "WriterError",
    "PackError",
    "DecodeError",
    "RemoteError",
    "RangeNotSupportedError",
    "MissingFieldError",
    "FieldsError",
    "ClosedError",
]


class TarIndexError(Exception):
    """Base class for all tarindex errors."""


class FormatError(TarIndexError, ValueError):
    """Bytes on disk violate the tar specs or docs/FORMAT.md."""


class BadMagicError(FormatError):
    """An index file does not start (or end) with the tarindex magic (FORMAT.md §2.1, §2.7)."""


class UnsupportedVersionError(FormatError):
    """An index file has a major version this reader does not know (FORMAT.md §2.1)."""


class ChecksumError(FormatError):
    """A checksum does not match: the index footer crc32, or a tar header checksum."""


class TruncatedError(FormatError):
    """A file ends before the structure it holds does (a cut copy, an interrupted write)."""


class TarHeaderError(FormatError):
    """A tar header block is malformed (bad numeric field, bad pax record, ...)."""


class NotATarError(TarHeaderError):
    """The file does not start with a tar header at all."""


class CompressedTarError(FormatError):
    """The file is a compressed stream (gzip, bzip2, xz, zstd, lz4), not a plain tar."""

    compression: str | None = None
    """The stream's format by its magic bytes (``"gzip"``, ``"zstd"``, ...), when known."""


class TrailingGarbageError(FormatError):
    """Non-zero bytes that are not a tar header follow the end-of-archive marker."""


class IndexMissingError(TarIndexError, FileNotFoundError):
    """A shard has no sidecar index; the message gives the command that builds it."""


class StaleIndexError(TarIndexError):
    """The index does not describe this tar: the tar changed after it was indexed."""


class StaleManifestError(StaleIndexError):
    """A shard listed in a dataset manifest is missing or changed since the manifest was made.

    The message names the shard, the manifest, what differs and the fix (FORMAT.md §9).
    """


class KeyNotFoundError(TarIndexError, KeyError):
    """No sample has this key (``index_of``, ``get``, ``tarindex cat``)."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else ""


class AmbiguousKeyError(TarIndexError, LookupError):
    """A key asked for is in more than one shard (keys are unique only within a shard).

    The message names every place it is in; ``indices_of`` returns them all.
    """


class SampleIndexError(TarIndexError, IndexError):
    """A sample index is out of range."""


class WriterError(TarIndexError, ValueError):
    """A sample cannot be written (bad key, repeated key, unencodable value)."""


class ParallelWriteError(WriterError):
    """A worker of :func:`tarindex.write_shards` raised or died: some shards were not written.

    ``result`` (a :class:`tarindex.parallel.WriteResult`) lists the shards written completely
    (kept, each with its index) and, in ``result.failed``, each shard not written and why. The
    shard a failed worker was writing is removed; the dataset is incomplete.
    """

    def __init__(self, message: str, result: Any) -> None:
        super().__init__(message)
        self.result = result

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (str(self), self.result))


class PackError(TarIndexError, ValueError):
    """A folder cannot be packed as asked (not a folder, nothing to pack, a bad layout or output).

    Raised by :mod:`tarindex.pack` before any shard is written; the message names the path
    and the fix. ``tarindex pack`` reports it as a usage error (exit code 2).
    """


class DecodeError(TarIndexError, ValueError):
    """A member's bytes cannot be decoded as its extension names, or exceed a decode bound.

    Raised by :mod:`tarindex.codecs` (and so by datasets with ``decode=``). The message names
    the shard, the sample key and the extension; the decoder's own exception, if any, is
    chained as ``__cause__``.
    """


class RemoteError(TarIndexError, OSError):
    """A remote read failed: after bounded retries, or for good (404, 403, bad reply).

    The message names the URL, the byte range and the cause; the fsspec / aiohttp / botocore
    exception, if any, is chained as ``__cause__``.
    """


class RangeNotSupportedError(RemoteError):
    """A server answered a ranged read with the whole file: it ignores HTTP ``Range``.

    Refused by default (reading a sample would download the whole shard); the message names
    the URL and the opt-in (``RemoteOptions(download_whole=True, cache_dir=...)``).
    """


class FieldsError(TarIndexError, TypeError, ValueError):
    """A ``fields=`` (or ``int_fields=``) that is not an extension or a collection of them.

    One rule for every entry point (:mod:`tarindex.read.fields`). Both a ``TypeError`` (a
    wrong type, the Python convention the read paths followed) and a ``ValueError`` (as the
    datasets check their other arguments), so code catching either keeps working. The message
    names the argument, the bad entry and the fix.
    """


class MissingFieldError(TarIndexError, KeyError, ValueError):
    """A sample has none of the alternatives of a field that a selection asks for.

    Raised by :class:`tarindex.codecs.select.ToTuple` (the datasets' ``select=``) and the
    renames of :mod:`tarindex.codecs.select`; the message names the shard, the sample key,
    the field and the extensions the sample has. A ``ValueError`` as webdataset's
    ``to_tuple``/``rename`` raise (so ``except ValueError`` keeps working), and a
    ``KeyError`` as it was before.
    """

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


class ClosedError(TarIndexError, ValueError):
    """A read through a :class:`~tarindex.read.ShardReader` or byte source after its ``close()``.

    As reading a closed file is a ``ValueError``. Only a reader closed by its own caller raises
    it: the datasets (:class:`~tarindex.read.ShardSet` and what is built on it) never close a
    reader another thread is reading, and reopen shards after their ``close()``
    (docs/READING.md, "Threads"). The message names the tar.
    """
