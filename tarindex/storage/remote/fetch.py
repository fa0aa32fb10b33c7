"""Where bytes cross the network: ranged reads with retries, sizes, whole files, downloads.

Each function retries transient failures (timeouts, the deadline passed, dropped
connections, short replies, 5xx, 429) :attr:`RemoteOptions.retries` times with exponential
backoff from :attr:`RemoteOptions.backoff` (doubling, at most 2 s), then raises
:class:`~tarindex.errors.RemoteError` naming the URL and the byte range. What a retry cannot
fix is raised at once: a missing object (``FileNotFoundError``), 4xx (``RemoteError``), a
reply for the wrong range (``RemoteError``), an object changed since it was opened
(:class:`~tarindex.errors.StaleIndexError`).
"""

from __future__ import annotations

import os
import time
import urllib.parse
from bisect import bisect_right
from collections.abc import Callable, Sequence

from ...errors import RangeNotSupportedError, RemoteError, StaleIndexError
from ..bytesource import COALESCE_GAP
from .options import DEFAULT, STATS, RemoteOptions, protocol_of
from .transport import (
    Pin,
    Sink,
    describe,
    filesystem,
    fs_path,
    get_ranges,
    get_wholes,
    head,
    is_permanent,
    no_range,
)

__all__ = [
    "DOWNLOAD_CHUNK",
    "agreed",
    "coalesce",
    "coalesce_need",
    "download",
    "expect_version",
    "fetch",
    "file_size",
    "read_whole",
    "read_wholes",
    "slices",
    "stat",
]

DOWNLOAD_CHUNK = 8 << 20
"""Bytes per ranged read when a remote tar is streamed to a local file."""

_range_ok: set[tuple[int, str]] = set()
"""(pid, scheme://host) whose server answered a ranged read with a range, in this process."""


def origin(url: str) -> str:
    """``scheme://host:port`` of ``url``."""
    u = urllib.parse.urlsplit(url)
    return f"{u.scheme}://{u.netloc}"


def range_checked(url: str) -> bool:
    """Whether ``url``'s server answered a ranged read with a range in this process."""
    return (os.getpid(), origin(url)) in _range_ok


def forget_range_checks() -> None:
    """Forget which servers answered ranged reads with ranges (the next open probes again)."""
    _range_ok.clear()


class _Backoff:
    def __init__(self, opts: RemoteOptions) -> None:
        self.delay = opts.backoff

    def wait(self, n: int) -> None:
        STATS.retries += n
        time.sleep(self.delay)
        self.delay = min(self.delay * 2, 2.0)


def fetch(
    reqs: Sequence[tuple[str, int, int]],
    opts: RemoteOptions = DEFAULT,
    pins: Sequence[Pin | None] | None = None,
    seen: list[Pin | None] | None = None,
    sinks: Sequence[Sink | None] | None = None,
) -> list[bytes]:
    """Read byte ranges ``[start, end)`` of remote files, concurrently; return their bytes.

    At most :attr:`RemoteOptions.concurrency` requests in flight per protocol and attempt.
    Every reply must hold exactly ``end - start`` bytes: a longer one means the server
    ignored ``Range``; a shorter one (connection dropped mid-body) is retried. Over HTTP and
    S3 a reply must also say (``Content-Range``) that it holds the range asked for, and, with
    a pin, be of the object version pinned (module docs of :mod:`.transport`).

    Args:
        reqs: ``(url, start, end)`` per range, ``0 <= start < end``.
        opts: Transport options. Defaults to :data:`DEFAULT`.
        pins: Per range, the version of the object it must come from (``None``: any).
            Defaults to no pins.
        seen: A list of ``len(reqs)`` entries (HTTP, S3): each set to the version the
            range's reply said it holds (size from ``Content-Range``, ETag, ...), to pin an
            object from the replies themselves. Defaults to ``None``.
        sinks: Per range, ``None`` or a :data:`~.transport.Sink` that receives its body as
            it arrives, after the same checks (a whole-shard download writes it straight
            into the cache: no copy in memory); such a range's result is ``b""``. A retried
            range is handed again from its start. Defaults to none.

    Returns:
        The bytes of each range, in the order of ``reqs``.

    Raises:
        RangeNotSupportedError: A reply held more bytes than asked for (names the URL).
        FileNotFoundError: A URL does not exist (names it).
        StaleIndexError: The object is not the pinned version any more (names the URL).
        RemoteError: A reply for another range than asked; a range still failing after the
            retries, or a permanent error (403, 400, ...): names the URL, the byte range and
            the last cause.
    """
    out: list[bytes | None] = [None] * len(reqs)
    pin_of = list(pins) if pins is not None else [None] * len(reqs)
    sink_of = list(sinks) if sinks is not None else [None] * len(reqs)
    todo = [i for i, (_, a, b) in enumerate(reqs) if b > a]
    for i, (_, a, b) in enumerate(reqs):
        if b <= a:
            out[i] = b""
    backoff = _Backoff(opts)
    last: dict[int, BaseException | str] = {}
    for attempt in range(opts.retries + 1):
        if not todo:
            break
        if attempt:
            backoff.wait(len(todo))
        groups: dict[int, list[int]] = {}
        for i in todo:
            groups.setdefault(id(filesystem(reqs[i][0], opts)), []).append(i)
        failed: list[int] = []
        for idx in groups.values():
            STATS.requests += len(idx)
            heard: list[list[Pin]] = [[] for _ in idx]
            got = get_ranges(
                [reqs[i] for i in idx], [pin_of[i] for i in idx], opts, heard,
                [sink_of[i] for i in idx],
            )
            for i, g, h in zip(idx, got, heard, strict=True):
                if seen is not None and h:
                    seen[i] = h[-1]
                url, a, b = reqs[i]
                if isinstance(g, BaseException):
                    if isinstance(g, (StaleIndexError, RemoteError)):
                        raise g
                    if isinstance(g, FileNotFoundError):
                        raise FileNotFoundError(
                            f"{url}: not found (bytes {a}..{b}): check the URL"
                        ) from g
                    if is_permanent(g):
                        raise RemoteError(
                            f"{url}: bytes {a}..{b}: {describe(g)} (not retried); check the "
                            f"URL and the credentials in RemoteOptions.storage_options"
                        ) from g
                    last[i] = g
                    failed.append(i)
                    continue
                n = g if isinstance(g, int) else len(g)
                STATS.bytes += n
                if n == b - a:
                    out[i] = b"" if isinstance(g, int) else g
                    if protocol_of(url) in ("http", "https"):
                        _range_ok.add((os.getpid(), origin(url)))
                elif n > b - a:
                    raise no_range(url, a, b, f"more ({n} bytes or more)")
                else:
                    last[i] = f"short reply: {n} of {b - a} bytes"
                    failed.append(i)
        todo = failed
    if todo:
        i = todo[0]
        url, a, b = reqs[i]
        cause = last.get(i, "unknown error")
        err = RemoteError(
            f"{url}: bytes {a}..{b}: still failing after {opts.retries} retries "
            f"({len(todo)} range(s)); last error: "
            f"{cause if isinstance(cause, str) else describe(cause)}; check the server, or "
            f"raise RemoteOptions(retries=, timeout=, deadline=)"
        )
        if isinstance(cause, BaseException):
            raise err from cause
        raise err
    return out  # type: ignore[return-value]


def _retried(
    url: str, what: str, opts: RemoteOptions, attempt_once: Callable[[], object]
) -> object:
    backoff = _Backoff(opts)
    for attempt in range(opts.retries + 1):
        if attempt:
            backoff.wait(1)
        STATS.requests += 1
        try:
            return attempt_once()
        except (FileNotFoundError, StaleIndexError, RemoteError):
            raise
        except Exception as e:
            err = _give_up(url, what, e, attempt, opts)
            if err is not None:
                raise err from e
    raise AssertionError("unreachable")


def _give_up(
    url: str, what: str, e: BaseException, attempt: int, opts: RemoteOptions
) -> RemoteError | None:
    """The error that ends one request's retries after ``e`` on ``attempt``, or ``None``.

    A permanent error ends them at once, any other once :attr:`RemoteOptions.retries` ran out.
    """
    if is_permanent(e):
        return RemoteError(f"{url}: cannot {what}: {describe(e)} (not retried)")
    if attempt == opts.retries:
        return RemoteError(
            f"{url}: cannot {what}: still failing after {opts.retries} retries; last "
            f"error: {describe(e)}; check the server, or raise RemoteOptions(retries=, "
            f"deadline=)"
        )
    return None


def stat(url: str, opts: RemoteOptions = DEFAULT) -> Pin:
    """The size and version of the remote object ``url`` (HTTP ``HEAD``, S3 ``HeadObject``).

    Retried as :func:`fetch` (a 503 is transient, not a missing file).

    Raises:
        FileNotFoundError: No such file (404, 410, ``NoSuchKey``).
        RemoteError: The size cannot be learnt (after the retries, or a 4xx).
    """
    return _retried(url, "get its size", opts, lambda: head(url, opts))  # type: ignore[return-value]


def expect_version(url: str, pin: Pin, opts: RemoteOptions, what: str) -> None:
    """Check (one size query) that ``url`` is still the version ``pin`` after ``what``.

    For bytes a plain GET brought whole (a server that ignores Range): its reply cannot be
    pinned as a ranged read is (``If-Match``), and the object may be replaced while the body
    is on its way, so the copy is trusted only if the version after it is the one before it.

    Raises:
        StaleIndexError: Another size or version now (names the URL, both versions and the
            fix); the caller discards what it downloaded.
        RemoteError: As :func:`stat`.
    """
    now = stat(url, opts)
    if now.size != pin.size or now.tag() != pin.tag():
        raise StaleIndexError(
            f"{url}: the remote object changed while {what} ({pin.size} bytes, version "
            f"{pin.tag() or '?'} before; {now.size} bytes, version {now.tag() or '?'} after): "
            f"the downloaded bytes are not trusted and were discarded; open the dataset again "
            f"once the object stops changing (and rebuild the index if the tar was rewritten: "
            f"tarindex index URL)"
        )


def file_size(url: str, opts: RemoteOptions = DEFAULT) -> int:
    """Size in bytes of the remote file ``url``; :func:`stat`'s size, raising as it does."""
    return stat(url, opts).size


def read_whole(url: str, opts: RemoteOptions, bound: Callable[[bytes], int] | int) -> bytes:
    """The whole remote file ``url`` in one request (retried), never read past its bound.

    Args:
        url: The file.
        opts: Transport options.
        bound: The most bytes it may have, or a function of its first 80 bytes returning
            that (an index: what its header describes).

    Raises:
        FileNotFoundError: No such file.
        RemoteError: The body is longer than the bound (not retried), or the retries ran out.
        FormatError: ``bound`` refused the first bytes.
    """
    return read_wholes([url], opts, [bound])[0]


def read_wholes(
    urls: Sequence[str], opts: RemoteOptions, bounds: Sequence[Callable[[bytes], int] | int]
) -> list[bytes]:
    """:func:`read_whole` of each URL, all at once (HTTP, S3: one batch on the event loop).

    Each failing read is retried as :func:`read_whole` retries; the first error that ends
    one (in the order of ``urls``) is raised.

    Raises:
        As :func:`read_whole`.
    """
    limits = [b if callable(b) else (lambda _head, n=int(b): n) for b in bounds]
    out: list[bytes | None] = [None] * len(urls)
    todo = list(range(len(urls)))
    backoff = _Backoff(opts)
    for attempt in range(opts.retries + 1):
        if attempt:
            backoff.wait(len(todo))
        STATS.requests += len(todo)
        got = get_wholes([urls[i] for i in todo], opts, [limits[i] for i in todo])
        failed = []
        for i, g in zip(todo, got, strict=True):
            url = urls[i]
            if isinstance(g, (FileNotFoundError, StaleIndexError, RemoteError)):
                raise g
            if isinstance(g, BaseException):
                err = _give_up(url, "read it", g, attempt, opts)
                if err is not None:
                    raise err from g
                failed.append(i)
                continue
            STATS.bytes += len(g)
            out[i] = g
        todo = failed
        if not todo:
            break
    return out  # type: ignore[return-value]


def coalesce_need(
    starts: Sequence[int], ends: Sequence[int], gap: int = COALESCE_GAP
) -> list[tuple[int, int, int]]:
    """:func:`coalesce`, with the bytes of the given ranges (their union) in each merged range."""
    out: list[list[int]] = []
    for a, b in sorted(zip(starts, ends, strict=True)):
        if b <= a:
            continue
        if out and a - out[-1][1] <= gap:
            last = out[-1]
            if b > last[1]:
                last[2] += b - max(a, last[1])
                last[1] = b
        else:
            out.append([a, b, b - a])
    return [(a, b, n) for a, b, n in out]


def coalesce(
    starts: Sequence[int], ends: Sequence[int], gap: int = COALESCE_GAP
) -> list[tuple[int, int]]:
    """Merge ranges closer than ``gap`` bytes (overlaps too); sorted half-open ``(start, end)``."""
    out: list[tuple[int, int]] = []
    for a, b in sorted(zip(starts, ends, strict=True)):
        if b <= a:
            continue
        if out and a - out[-1][1] <= gap:
            if b > out[-1][1]:
                out[-1] = (out[-1][0], b)
        else:
            out.append((a, b))
    return out


def download(url: str, dest: str, opts: RemoteOptions = DEFAULT) -> int:
    """Stream the remote file ``url`` once into the local file ``dest``; return its size.

    Sequential ranged reads of :data:`DOWNLOAD_CHUNK` bytes (each retried as in
    :func:`fetch`, each pinned to the version first seen), so memory stays bounded; a server
    that ignores Range is read with one plain GET instead.

    Raises:
        FileNotFoundError: No such file.
        StaleIndexError: The file changed during the download.
        RemoteError: As :func:`fetch`; ``dest`` is then incomplete (the caller removes it).
    """
    pin = stat(url, opts)
    size = pin.size
    with open(dest, "wb") as f:
        pos = 0
        while pos < size:
            end = min(pos + DOWNLOAD_CHUNK, size)
            try:
                (data,) = fetch([(url, pos, end)], opts, [pin])
            except RangeNotSupportedError:
                if pos:
                    raise
                f.seek(0)
                f.truncate()
                fs = filesystem(url, opts)
                with fs.open(fs_path(url), "rb", block_size=0) as r:
                    while chunk := r.read(DOWNLOAD_CHUNK):
                        f.write(chunk)
                expect_version(url, pin, opts, "it was downloaded")
                break
            f.write(data)
            pos = end
    n = os.path.getsize(dest)
    if n != size:
        raise RemoteError(f"{url}: streamed {n} bytes, the server said {size}; try again")
    return n


def agreed(url: str, seen: Sequence[Pin | None], size: int) -> Pin:
    """The one version every reply of a round named (else the object changed meanwhile)."""
    got = {p for p in seen if p is not None}
    if not got:
        return Pin(size)
    tags = {(p.etag, p.last_modified, p.version_id) for p in got}
    sizes = {p.size for p in got if p.size >= 0}
    if len(tags) > 1 or len(sizes) > 1:
        raise StaleIndexError(
            f"{url}: the remote object changed while it was opened (its replies name "
            f"{len(tags)} versions); open the dataset again"
        )
    p = next(iter(got))
    return Pin(next(iter(sizes)) if sizes else size, p.etag, p.last_modified, p.version_id)


def slices(
    merged: list[tuple[int, int]], got: list[bytes], ranges: list[tuple[int, int]]
) -> list[bytes]:
    """The bytes of each of ``ranges`` out of ``got``, the bytes of their coalesced runs."""
    starts = [m[0] for m in merged]
    out = []
    for a, b in ranges:
        k = bisect_right(starts, a) - 1
        m0, d = merged[k][0], got[k]
        out.append(d if (a == m0 and b - a == len(d)) else d[a - m0 : b - m0])
    return out
