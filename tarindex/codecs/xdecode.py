"""webdataset's ``xdecode``: decoders chosen by glob, called with a file object.

``xdecode(("*.cls", lambda s: int(s.read())), jpg=f)`` is what webdataset 1.0's
``.xdecode(...)`` does, as a sample function for the datasets' ``decode=``: each member's
extension is matched against the patterns (lower-cased, ``fnmatch``, the last pattern given
first; ``"*.cls"`` matches extension ``cls``), and the decoder gets an ``io.BytesIO`` of its
bytes. webdataset's defaults come first (lowest priority): ``*.bin`` -> bytes, ``*.txt`` ->
``str``, ``*.pyd`` -> unpickled, the last only with ``allow_pickle=True`` (else an error
naming the member, as for every pickle: docs/DECODING.md).
"""

from __future__ import annotations

import io
import pickle
import re
from collections.abc import Callable
from fnmatch import fnmatchcase
from typing import IO, Any

from ..errors import DecodeError

__all__ = ["XDecode", "xdecode"]

FileDecoder = Callable[[IO[bytes]], Any]


def _bin(stream: IO[bytes]) -> bytes:
    return stream.read()


def _text(stream: IO[bytes]) -> str:
    return stream.read().decode("utf-8")


def _pickle(stream: IO[bytes]) -> Any:  # only reached with allow_pickle=True
    return pickle.load(stream)


_DEFAULTS: tuple[tuple[str, FileDecoder], ...] = (
    ("*.bin", _bin),
    ("*.txt", _text),
    ("*.pyd", _pickle),
)


class XDecode:
    """Picklable sample decoder: webdataset's ``xdecode`` (see the module docstring).

    Args:
        *pairs: ``(pattern, f)``: ``f(stream)`` decodes members whose extension matches.
        must_decode: A member no pattern matches raises :class:`tarindex.DecodeError`;
            ``False`` keeps its bytes. Defaults to ``True`` (webdataset's default).
        allow_pickle: Let the default ``*.pyd`` decoder unpickle. Defaults to ``False``.
        **decoders: ``ext=f``, the same as ``("*.ext", f)``.

    Raises:
        ValueError: A pair that is not ``(str, callable)``, or a decoder not callable.
    """

    def __init__(
        self,
        *pairs: tuple[str, FileDecoder],
        must_decode: bool = True,
        allow_pickle: bool = False,
        **decoders: FileDecoder,
    ) -> None:
        rows = [*_DEFAULTS, *pairs, *(("*." + k, f) for k, f in decoders.items())]
        for row in rows:
            if not (isinstance(row, tuple) and len(row) == 2 and isinstance(row[0], str)):
                raise ValueError(f"xdecode: {row!r} is not a (pattern, decoder) pair")
            if not callable(row[1]):
                raise ValueError(f"xdecode: the decoder of {row[0]!r} is not callable")
        self.rows = tuple(rows)
        self.must_decode = bool(must_decode)
        self.allow_pickle = bool(allow_pickle)

    def _find(self, ext: str) -> FileDecoder | None:
        name = ext.lower()
        for pattern, f in reversed(self.rows):
            if fnmatchcase(name, pattern) or fnmatchcase("." + name, pattern):
                return f
        return None

    def __call__(self, sample: dict[str, Any]) -> dict[str, Any]:
        """Decode every member of ``sample``; ``__`` entries pass. Returns a new dict.

        Raises:
            DecodeError: No decoder for a member (``must_decode``), a ``*.pyd`` member
                without ``allow_pickle``, or a decoder that raised (chained); the message
                names the shard, key and extension.
        """
        out: dict[str, Any] = {}
        for ext, data in sample.items():
            if ext.startswith("__"):
                out[ext] = data
                continue
            f = self._find(re.sub(r".*/", "", ext))
            where = f"{sample.get('__shard__')}: sample {sample.get('__key__')!r}, extension {ext!r}"
            if f is None:
                if self.must_decode:
                    raise DecodeError(
                        f"{where}: no decoder matches it (xdecode must_decode=True); add a "
                        f"pattern, or xdecode(..., must_decode=False) keeps its bytes"
                    )
                out[ext] = data
                continue
            if f is _pickle and not self.allow_pickle:
                raise DecodeError(
                    f"{where}: a pickle, and unpickling runs code from the file; pass "
                    f"xdecode(..., allow_pickle=True) if you trust this shard"
                )
            try:
                out[ext] = f(io.BytesIO(data))
            except MemoryError:
                raise
            except Exception as e:
                raise DecodeError(f"{where}: decoder {f!r} failed: {type(e).__name__}: {e}") from e
        return out

    def __repr__(self) -> str:
        rows = ", ".join(f"({p!r}, {f!r})" for p, f in self.rows[len(_DEFAULTS) :])
        return f"xdecode({rows}, must_decode={self.must_decode})"


def xdecode(
    *pairs: tuple[str, FileDecoder],
    must_decode: bool = True,
    allow_pickle: bool = False,
    **decoders: FileDecoder,
) -> XDecode:
    """Decode as webdataset's ``.xdecode(...)``, for the datasets' ``decode=``: see :class:`XDecode`.

    ``TarDataset(src, decode=xdecode(cls=lambda s: int(s.read())))``.
    """
    return XDecode(*pairs, must_decode=must_decode, allow_pickle=allow_pickle, **decoders)
