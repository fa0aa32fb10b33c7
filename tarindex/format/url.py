"""The one rule for "is this source a URL": text only, no IO (RFC 3986 §3.1 scheme syntax).

A source is a URL when it starts with ``scheme://``: a letter, then letters, digits, ``+``,
``-`` or ``.``. ``file://`` URLs have a scheme but name local files, so :func:`is_url` (remote,
read through fsspec) is false for them; the manifest's path arithmetic (:mod:`.manifest`) works
on any ``scheme://`` string (:func:`url_scheme`).
"""

from __future__ import annotations

import re

__all__ = ["url_scheme", "is_url"]

_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.\-]*)://")


def url_scheme(path: str) -> str | None:
    """Return the scheme of ``path``, lower case, or ``None`` if it is not ``scheme://...``.

    ``"S3://b/x.tar"`` -> ``"s3"``, ``"file:///x"`` -> ``"file"``, ``"data/x.tar"`` -> ``None``.
    """
    m = _SCHEME.match(path)
    return m.group(1).lower() if m else None


def is_url(path: str) -> bool:
    """True if ``path`` is a remote URL (``scheme://...``, any scheme but ``file``)."""
    scheme = url_scheme(path)
    return scheme is not None and scheme != "file"
