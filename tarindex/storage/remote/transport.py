"""One request to a remote object: fsspec filesystems, and the checks on every reply.

For ``http(s)://`` the requests go through the aiohttp session of fsspec's HTTP
filesystem, and for ``s3://`` through the S3 client of s3fs, so that every reply's headers
are seen (docs/REMOTE.md, "What a reply must say"):

- a ranged reply must say (``Content-Range``) it holds exactly the bytes asked for, else
  :class:`~tarindex.errors.RemoteError` naming the URL and both ranges;
- the object must still be the one that was opened (:class:`Pin`: size, ETag,
  ``Last-Modified``, S3 version id): sent with each read as ``If-Match`` (HTTP, S3) or
  ``VersionId`` (S3) and compared with each reply's headers, else
  :class:`~tarindex.errors.StaleIndexError` naming the URL;
- a reply's headers say what its body is before any of it is read (a whole-shard download
  writes and flags it as it arrives: :func:`_check_whole`): a ``200`` to a pinned ranged
  read is the whole pinned object (its size, its version), not a proxy's error page, else
  :class:`~tarindex.errors.RemoteError` naming the URL, the bytes and the reply;
- a body is never read past the bytes expected (plus one, to see that it was longer);
- each request ends within :attr:`RemoteOptions.deadline` seconds.

Other protocols use fsspec's ``cat_ranges`` and ``open`` (lengths checked, no headers).
Functions here make one attempt; :mod:`.fetch` retries. A failure comes back as an
exception: :class:`~tarindex.errors.StaleIndexError`, :class:`~tarindex.errors.RemoteError`
and ``FileNotFoundError`` are final, :func:`is_permanent` tells the rest apart.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from ...errors import RangeNotSupportedError, RemoteError, StaleIndexError
from ...format.spec import HEADER
from .options import DEFAULT, RemoteOptions, protocol_of

__all__ = [
    "HTTPStatusError",
    "Pin",
    "Sink",
    "describe",
    "filesystem",
    "fs_path",
    "get_ranges",
    "get_whole",
    "head",
    "is_permanent",
    "learns_versions",
    "no_range",
]

_filesystems: dict[tuple[int, str, str], Any] = {}
_fs_lock = threading.Lock()


def _after_fork_in_child() -> None:
    # a lock held by another thread at fork time would stay held forever in the child
    global _fs_lock
    _fs_lock = threading.Lock()


os.register_at_fork(after_in_child=_after_fork_in_child)


@dataclass(frozen=True)
class Pin:
    """What identifies the version of a remote object that was opened.

    Attributes:
        size: Its size in bytes.
        etag: Its ``ETag`` (HTTP, S3), or ``None`` if the server sends none.
        last_modified: Its ``Last-Modified`` (HTTP date), or ``None``.
        version_id: Its S3 version id (versioned buckets), or ``None``.
    """

    size: int
    etag: str | None = None
    last_modified: str | None = None
    version_id: str | None = None

    def tag(self) -> str:
        """A string that changes with the object's version (empty if nothing identifies it)."""
        return "|".join(x or "" for x in (self.etag, self.last_modified, self.version_id)).strip(
            "|"
        )


class HTTPStatusError(OSError):
    """A reply with an error status; ``status`` says which (for :func:`is_permanent`)."""

    def __init__(self, url: str, status: int, what: str = "") -> None:
        super().__init__(f"{url}: HTTP {status}{(' ' + what) if what else ''}")
        self.status = status


class DeadlineError(TimeoutError):
    """A request that did not end within :attr:`RemoteOptions.deadline` (retried)."""


def _import_fsspec() -> Any:
    try:
        import fsspec  # type: ignore[import-untyped,unused-ignore]
    except ImportError:
        raise ImportError(
            "remote shards need fsspec: pip install 'tarindex[remote]' (plus s3fs for s3://, "
            "gcsfs for gs://, ...)"
        ) from None
    return fsspec


def filesystem(url: str, opts: RemoteOptions = DEFAULT) -> Any:
    """This process's fsspec filesystem for ``url``'s protocol and ``opts`` (made on first use).

    Raises:
        ImportError: fsspec, or the protocol's package, is not installed (the message says
            what to install).
    """
    proto = protocol_of(url)
    key = (os.getpid(), proto, repr(sorted(opts.options_for(proto).items())))
    fs = _filesystems.get(key)
    if fs is not None:
        return fs
    fsspec = _import_fsspec()
    kw = opts.options_for(proto)
    if proto in ("http", "https") and "client_kwargs" not in kw:
        import aiohttp

        kw["client_kwargs"] = {
            "timeout": aiohttp.ClientTimeout(
                total=None, sock_connect=opts.timeout, sock_read=opts.timeout
            )
        }
    try:
        with _fs_lock:
            fs = _filesystems.get(key)
            if fs is None:
                fs = _filesystems[key] = fsspec.filesystem(proto, skip_instance_cache=True, **kw)
    except ImportError as e:
        raise ImportError(f"{url}: protocol {proto!r} needs a package fsspec names: {e}") from e
    return fs


def filesystem_pids() -> list[int]:
    """The process id of each filesystem this process holds (see :func:`filesystem`)."""
    return [k[0] for k in _filesystems]


def fs_path(url: str) -> str:
    """The path fsspec's filesystem for ``url`` takes (the URL itself for HTTP)."""
    if protocol_of(url) in ("http", "https"):
        return url
    return str(_import_fsspec().core.strip_protocol(url))


def is_permanent(e: BaseException) -> bool:
    """Errors a retry cannot fix: missing, forbidden, bad request (not 408/429/5xx)."""
    if isinstance(e, (FileNotFoundError, PermissionError, IsADirectoryError)):
        return True
    status = getattr(e, "status", None) or getattr(e, "code", None)
    if isinstance(status, int) and 400 <= status < 500 and status not in (408, 425, 429):
        return True
    return False


def describe(e: BaseException) -> str:
    """``"TypeName: message"``, on one line, at most 300 characters of message."""
    s = str(e).strip().replace("\n", " ")
    return f"{type(e).__name__}: {s[:300]}" if s else type(e).__name__


def no_range(url: str, a: int, b: int, got: int | str) -> RangeNotSupportedError:
    """The error of a server that answered a ranged read with the whole file."""
    return RangeNotSupportedError(
        f"{url}: asked for bytes {a}..{b} ({b - a} bytes), the server sent {got}: it ignores "
        f"HTTP Range requests, so every read would download the whole shard. Serve the shards "
        f"from a server that honours Range (nginx, S3, ...), or opt in to whole-shard "
        f"downloads into a cache: RemoteOptions(download_whole=True, cache_dir=DIR)"
    )


def _stale(url: str, why: str) -> StaleIndexError:
    return StaleIndexError(
        f"{url}: the remote object changed after it was opened ({why}); its index no longer "
        f"describes it: open the dataset again (and rebuild the index if the tar was "
        f"rewritten: tarindex index URL)"
    )


def _check_range(url: str, a: int, b: int, cr: str | None, pin: Pin | None) -> None:
    """Refuse a 206 whose ``Content-Range`` is not ``bytes a-(b-1)/size``."""
    if not cr:
        raise RemoteError(
            f"{url}: bytes {a}..{b}: a partial reply (206) without Content-Range; the server "
            f"does not say which bytes it sent: serve the shards from a server that does"
        )
    unit, _, rest = cr.strip().partition(" ")
    span, _, total = rest.partition("/")
    lo, _, hi = span.partition("-")
    try:
        s, e = int(lo), int(hi) + 1
    except ValueError:
        raise RemoteError(f"{url}: bytes {a}..{b}: unreadable Content-Range {cr!r}") from None
    if unit != "bytes" or s != a or e != b:
        raise RemoteError(
            f"{url}: asked for bytes {a}..{b}, the reply says it holds bytes {s}..{e} "
            f"(Content-Range {cr!r}); refused: the server or a proxy returns wrong ranges"
        )
    if pin is not None and total.strip() not in ("*", str(pin.size)):
        raise _stale(url, f"its size is now {total.strip()}, it was {pin.size} bytes")


def _check_whole(url: str, a: int, b: int, pin: Pin, headers: Any) -> None:
    """Refuse a ``200`` to a pinned ranged read that is not the pinned object (read none of it).

    Its ``Content-Length`` must be the pinned size and it must name a version where the pin
    has one (``ETag``; ``Last-Modified`` or an ETag): an error page of a proxy or a CDN has
    neither. Its body would go into a whole-shard download's copy as it arrives, its grains
    flagged before its short length was seen, and be handed out as the shard's bytes.
    """
    n = headers.get("Content-Length")
    etag, modified = headers.get("ETag"), headers.get("Last-Modified")
    named = bool(etag) if pin.etag else bool(etag or modified) if pin.last_modified else True
    if n is not None and n.strip() == str(pin.size) and named:
        return
    raise RemoteError(
        f"{url}: asked for bytes {a}..{b}, the server answered 200 with {n or 'no'} bytes "
        f"({headers.get('Content-Type') or 'no Content-Type'}, ETag {etag or 'none'}), not "
        f"the object of {pin.size} bytes (ETag {pin.etag or 'none'}) opened: an error page "
        f"of a proxy or a CDN, or another version; none of it was used. Check the URL and "
        f"what answers it (curl -i -r {a}-{b - 1} URL)"
    )


def _check_pin(url: str, pin: Pin | None, etag: str | None, modified: str | None) -> None:
    if pin is None:
        return
    if pin.etag and etag and etag != pin.etag:
        raise _stale(url, f"ETag {etag}, it was {pin.etag}")
    if pin.last_modified and modified and modified != pin.last_modified:
        raise _stale(url, f"Last-Modified {modified}, it was {pin.last_modified}")


Sink = Callable[[int, bytes], None]
"""Where a ranged reply's body goes instead of memory: ``sink(at, chunk)``, ``at`` the chunk's
offset from the range's start, in order (called on the event loop's thread)."""


async def _body(read: Callable[[int], Any], n: int, sink: Sink | None) -> bytes | int:
    """Up to ``n + 1`` bytes of a ranged reply's body, returned or handed to ``sink``.

    With a sink, the first ``n`` bytes go to it and the count of bytes seen is returned
    (``n + 1`` if the body was longer).
    """
    if sink is None:
        return await _read_at_most(read, n + 1)
    got = 0
    while got < n:
        chunk = await read(min(n - got, 1 << 20))
        if not chunk:
            return got
        sink(got, chunk)
        got += len(chunk)
    return got + len(await read(1))


async def _read_at_most(read: Callable[[int], Any], n: int) -> bytes:
    """Up to ``n`` bytes of a body (fewer if it ends first); ``read(k)`` returns <= k bytes."""
    parts: list[bytes] = []
    got = 0
    while got < n:
        chunk = await read(min(n - got, 1 << 20))
        if not chunk:
            break
        parts.append(chunk)
        got += len(chunk)
    return parts[0] if len(parts) == 1 else b"".join(parts)


def _run(fs: Any, coros: list[Any], opts: RemoteOptions) -> list[Any]:
    """Run ``coros`` on ``fs``'s event loop, each bounded by the deadline; errors as values."""
    import asyncio  # here, not at import: ``import tarindex`` stays free of asyncio

    from fsspec.asyn import sync  # type: ignore[import-untyped,unused-ignore]

    async def bounded(sem: asyncio.Semaphore, c: Any) -> Any:
        async with sem:
            try:
                return await asyncio.wait_for(c, opts.deadline)
            except asyncio.TimeoutError:
                return DeadlineError(f"did not end within the deadline of {opts.deadline} s")
            except Exception as e:
                return e

    async def main() -> list[Any]:
        await fs.set_session()  # once, before the requests race to make it
        sem = asyncio.Semaphore(max(1, opts.concurrency))
        return list(await asyncio.gather(*(bounded(sem, c) for c in coros)))

    return list(sync(fs.loop, main))


# -- HTTP -----------------------------------------------------------------------------------
def _http_kw(fs: Any, headers: dict[str, str]) -> dict[str, Any]:
    kw = dict(fs.kwargs)
    h = dict(kw.pop("headers", None) or {})
    h.update(headers)
    kw["headers"] = h
    return kw


def _http_status(url: str, status: int, pin: Pin | None, what: str) -> None:
    if status == 412:
        raise _stale(url, "the server refused If-Match: 412 Precondition Failed")
    if status == 416 and pin is not None:
        raise _stale(url, f"{what} is past its end now (416); it was {pin.size} bytes")
    if status in (404, 410):
        raise FileNotFoundError(f"{url}: not found ({status})")
    if status >= 400:
        raise HTTPStatusError(url, status, what)


def _seen_pin(total: str | None, etag: str | None, modified: str | None,
              version: str | None = None) -> Pin:
    """The version a reply says it holds (its ``Content-Range`` total, ETag, ...)."""
    t = (total or "").strip()
    return Pin(int(t) if t.isdigit() else -1, etag, modified, version)


async def _http_range(
    fs: Any,
    url: str,
    a: int,
    b: int,
    pin: Pin | None,
    seen: list[Pin] | None = None,
    sink: Sink | None = None,
) -> bytes | int:
    session = await fs.set_session()
    hd = {"Range": f"bytes={a}-{b - 1}", "Accept-Encoding": "identity"}
    if pin is not None and pin.etag and not pin.etag.startswith("W/"):
        hd["If-Match"] = pin.etag  # a weak ETag never matches If-Match (RFC 9110 §13.1.1)
    elif pin is not None and pin.last_modified:
        hd["If-Unmodified-Since"] = pin.last_modified
    async with session.get(fs.encode_url(url), **_http_kw(fs, hd)) as r:
        _http_status(url, r.status, pin, f"bytes {a}..{b}")
        _check_pin(url, pin, r.headers.get("ETag"), r.headers.get("Last-Modified"))
        cr = r.headers.get("Content-Range")
        if r.status == 206:
            _check_range(url, a, b, cr, pin)
        elif pin is not None:  # 200: the whole object, and it must be the one pinned
            _check_whole(url, a, b, pin, r.headers)
        if r.status != 206 and a != 0:  # 200: the body starts at byte 0, not at a
            raise no_range(url, a, b, f"the whole file ({r.headers.get('Content-Length')} bytes)")
        if seen is not None:
            seen.append(_seen_pin((cr or "/").rpartition("/")[2] if r.status == 206 else
                                  r.headers.get("Content-Length"), r.headers.get("ETag"),
                                  r.headers.get("Last-Modified")))
        return await _body(r.content.read, b - a, sink)


async def _http_head(fs: Any, url: str) -> Pin:
    session = await fs.set_session()
    kw = _http_kw(fs, {"Accept-Encoding": "identity"})
    kw.setdefault("allow_redirects", True)
    async with session.head(fs.encode_url(url), **kw) as r:
        if r.status not in (405, 501):
            _http_status(url, r.status, None, "HEAD")
            n = r.headers.get("Content-Length")
            enc = r.headers.get("Content-Encoding", "identity")
            if n is None or enc not in ("identity", ""):
                raise RemoteError(f"{url}: the server does not report the file's size (HEAD)")
            return Pin(int(n), r.headers.get("ETag"), r.headers.get("Last-Modified"))
    kw["headers"]["Range"] = "bytes=0-0"  # no HEAD: one byte's reply says the size
    async with session.get(fs.encode_url(url), **kw) as r:
        _http_status(url, r.status, None, "GET bytes 0..1")
        total = (r.headers.get("Content-Range") or "/").rpartition("/")[2]
        if not total.isdigit():
            raise RemoteError(f"{url}: the server does not report the file's size")
        return Pin(int(total), r.headers.get("ETag"), r.headers.get("Last-Modified"))


async def _http_whole(fs: Any, url: str, bound: Callable[[bytes], int]) -> bytes:
    session = await fs.set_session()
    async with session.get(fs.encode_url(url), **_http_kw(fs, {})) as r:
        _http_status(url, r.status, None, "GET")
        return await _bounded_body(url, r.content.read, bound)


async def _bounded_body(
    url: str, read: Callable[[int], Any], bound: Callable[[bytes], int]
) -> bytes:
    head = await _read_at_most(read, HEADER.size)
    limit = bound(head)
    rest = await _read_at_most(read, limit - len(head) + 1) if len(head) == HEADER.size else b""
    if len(head) + len(rest) > limit:
        raise RemoteError(
            f"{url}: the reply is longer than the {limit} bytes this file can hold; refused "
            f"after reading {limit + 1} bytes (an endless or wrong body)"
        )
    return head + rest


# -- S3 -------------------------------------------------------------------------------------
def _s3_error(url: str, e: Exception, pin: Pin | None, what: str) -> Exception:
    resp = getattr(e, "response", None)
    if not isinstance(resp, dict):
        return e
    code = str(resp.get("Error", {}).get("Code", ""))
    status = int(resp.get("ResponseMetadata", {}).get("HTTPStatusCode", 0) or 0)
    if status == 412 or code == "PreconditionFailed":
        return _stale(url, "S3 refused IfMatch: PreconditionFailed")
    if code in ("NoSuchKey", "NoSuchVersion", "NotFound", "404") or status == 404:
        return FileNotFoundError(f"{url}: not found ({code or status})")
    if (status == 416 or code == "InvalidRange") and pin is not None:
        return _stale(url, f"{what} is past its end now; it was {pin.size} bytes")
    if status:
        return HTTPStatusError(url, status, f"{code} {what}")
    return e


def _s3_where(fs: Any, url: str) -> tuple[str, str]:
    bucket, key, _ = fs.split_path(fs_path(url))
    return str(bucket), str(key)


async def _s3_range(
    fs: Any,
    url: str,
    a: int,
    b: int,
    pin: Pin | None,
    seen: list[Pin] | None = None,
    sink: Sink | None = None,
) -> bytes | int:
    client = await fs.set_session()
    bucket, key = _s3_where(fs, url)
    kw: dict[str, Any] = {"Bucket": bucket, "Key": key, "Range": f"bytes={a}-{b - 1}"}
    if pin is not None and pin.etag:
        kw["IfMatch"] = pin.etag
    if pin is not None and pin.version_id:
        kw["VersionId"] = pin.version_id
    try:
        resp = await client.get_object(**kw)
    except Exception as e:
        raise _s3_error(url, e, pin, f"bytes {a}..{b}") from e
    body = resp["Body"]
    try:
        _check_pin(url, pin, resp.get("ETag"), None)
        _check_range(url, a, b, resp.get("ContentRange"), pin)
        if seen is not None:
            lm = resp.get("LastModified")
            seen.append(_seen_pin((resp.get("ContentRange") or "/").rpartition("/")[2],
                                  resp.get("ETag"), str(lm) if lm else None,
                                  resp.get("VersionId")))
        return await _body(body.read, b - a, sink)
    finally:
        body.close()


async def _s3_head(fs: Any, url: str) -> Pin:
    client = await fs.set_session()
    bucket, key = _s3_where(fs, url)
    try:
        resp = await client.head_object(Bucket=bucket, Key=key)
    except Exception as e:
        raise _s3_error(url, e, None, "HeadObject") from e
    lm = resp.get("LastModified")
    return Pin(
        int(resp["ContentLength"]), resp.get("ETag"), str(lm) if lm else None, resp.get("VersionId")
    )


async def _s3_whole(fs: Any, url: str, bound: Callable[[bytes], int]) -> bytes:
    client = await fs.set_session()
    bucket, key = _s3_where(fs, url)
    try:
        resp = await client.get_object(Bucket=bucket, Key=key)
    except Exception as e:
        raise _s3_error(url, e, None, "GetObject") from e
    body = resp["Body"]
    try:
        return await _bounded_body(url, body.read, bound)
    finally:
        body.close()


# -- one attempt ----------------------------------------------------------------------------
def _kind(url: str) -> str:
    p = protocol_of(url)
    return "http" if p in ("http", "https") else "s3" if p in ("s3", "s3a") else "other"


def learns_versions(url: str) -> bool:
    """Whether a ranged reply of ``url``'s protocol says its object's version (HTTP, S3)."""
    return _kind(url) in ("http", "s3")


def get_ranges(
    reqs: Sequence[tuple[str, int, int]],
    pins: Sequence[Pin | None],
    opts: RemoteOptions,
    seen: Sequence[list[Pin]] | None = None,
    sinks: Sequence[Sink | None] | None = None,
) -> list[bytes | int | BaseException]:
    """One attempt at each range ``(url, start, end)`` of one protocol, concurrently.

    ``seen`` (HTTP, S3): per range a list the version its reply holds is appended to.
    ``sinks``: per range, ``None`` or a :data:`Sink` its body is handed to as it arrives
    (after the reply's checks; a retry hands it again from the range's start).

    Returns:
        Per range its body (at most ``end - start + 1`` bytes: one more means the server
        sent more than asked), or for a range with a sink the count of body bytes seen
        (likewise), or the exception that ended it.
    """
    if not reqs:
        return []
    fs = filesystem(reqs[0][0], opts)
    kind = _kind(reqs[0][0])
    sn: Sequence[list[Pin] | None] = seen if seen is not None else [None] * len(reqs)
    sk: Sequence[Sink | None] = sinks if sinks is not None else [None] * len(reqs)
    if kind in ("http", "s3"):
        one = _http_range if kind == "http" else _s3_range
        return _run(
            fs,
            [
                one(fs, u, a, b, p, w, k)
                for (u, a, b), p, w, k in zip(reqs, pins, sn, sk, strict=True)
            ],
            opts,
        )
    try:
        got: list[Any] = fs.cat_ranges(
            [fs_path(u) for u, _, _ in reqs],
            [a for _, a, _ in reqs],
            [b for _, _, b in reqs],
            on_error="return",
            batch_size=opts.concurrency,
        )
    except Exception as e:  # a whole batch failing (e.g. loop errors)
        return [e] * len(reqs)
    out: list[bytes | int | BaseException] = []
    for (_, a, b), g, k in zip(reqs, got, sk, strict=True):
        if isinstance(g, BaseException) or k is None:
            out.append(g if isinstance(g, BaseException) else bytes(g))
        else:
            k(0, bytes(g[: b - a]))  # never past the range; the count says if it was longer
            out.append(len(g))
    return out


def head(url: str, opts: RemoteOptions) -> Pin:
    """One attempt at learning the size and version of ``url`` (HTTP ``HEAD``, S3 ``HeadObject``).

    Raises:
        FileNotFoundError: No such object.
        RemoteError: The server does not report a size.
        Exception: Whatever ended the attempt (:func:`is_permanent` tells if a retry helps).
    """
    fs = filesystem(url, opts)
    kind = _kind(url)
    if kind in ("http", "s3"):
        (r,) = _run(fs, [_http_head(fs, url) if kind == "http" else _s3_head(fs, url)], opts)
        if isinstance(r, BaseException):
            raise r
        return r  # type: ignore[no-any-return]
    size = fs.size(fs_path(url))
    if size is None:
        raise RemoteError(f"{url}: the server does not report the file's size")
    return Pin(int(size))


def get_wholes(
    urls: Sequence[str], opts: RemoteOptions, bounds: Sequence[Callable[[bytes], int]]
) -> list[bytes | BaseException]:
    """One attempt at reading each whole object of ``urls``, all at once (:func:`get_whole`).

    HTTP and S3: one batch of requests on the filesystem's event loop (no thread per
    object); other protocols: a thread per object.

    Returns:
        Per URL its bytes, or the exception that ended its attempt.
    """
    out: list[bytes | BaseException | None] = [None] * len(urls)
    groups: dict[int, list[int]] = {}
    for i, u in enumerate(urls):
        groups.setdefault(id(filesystem(u, opts)), []).append(i)
    for idx in groups.values():
        kind = _kind(urls[idx[0]])
        if kind in ("http", "s3"):
            fs = filesystem(urls[idx[0]], opts)
            one = _http_whole if kind == "http" else _s3_whole
            got = _run(fs, [one(fs, urls[i], bounds[i]) for i in idx], opts)
        else:
            from concurrent.futures import ThreadPoolExecutor

            def attempt(i: int) -> bytes | BaseException:
                try:
                    return get_whole(urls[i], opts, bounds[i])
                except Exception as e:
                    return e

            with ThreadPoolExecutor(min(len(idx), max(1, opts.concurrency), 32)) as ex:
                got = list(ex.map(attempt, idx))
        for i, g in zip(idx, got, strict=True):
            out[i] = g
    return out  # type: ignore[return-value]


def get_whole(url: str, opts: RemoteOptions, bound: Callable[[bytes], int]) -> bytes:
    """One attempt at reading the whole object ``url``, never more than it may hold.

    Args:
        url: The object.
        opts: Transport options.
        bound: Given the first 80 bytes (fewer if the body is shorter), the most bytes the
            whole object may have.

    Raises:
        RemoteError: The body is longer than ``bound`` allows.
        FileNotFoundError: No such object.
        Exception: Whatever ended the attempt (:func:`is_permanent` tells if a retry helps).
    """
    fs = filesystem(url, opts)
    kind = _kind(url)
    if kind in ("http", "s3"):
        c = _http_whole(fs, url, bound) if kind == "http" else _s3_whole(fs, url, bound)
        (r,) = _run(fs, [c], opts)
        if isinstance(r, BaseException):
            raise r
        return r  # type: ignore[no-any-return]
    import asyncio

    with fs.open(fs_path(url), "rb") as f:

        async def read(n: int) -> bytes:
            return bytes(f.read(n))

        return asyncio.run(_bounded_body(url, read, bound))
