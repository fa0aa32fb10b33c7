"""The viewer's local HTTP server (standard library ``ThreadingHTTPServer``) and verify jobs.

Requests name sample indices and member positions, never file paths, so nothing outside
the source can be served. Every response carries :data:`tarindex.view.pages.CSP` (no script
runs), ``nosniff`` and ``no-referrer``; raw downloads are ``application/octet-stream``
attachments.
"""

from __future__ import annotations

import random
import re
import threading
import time
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, quote, urlsplit

from ..format.url import is_url
from ..index.build import local_tar
from ..read import verify as verify_mod
from .model import View
from .pages import (
    CSP,
    MAX_PER_PAGE,
    PER_PAGE,
    live_site,
    page_sample,
    page_samples,
    page_search,
    page_shards,
    page_summary,
)

__all__ = ["Verifier", "ViewServer", "make_server"]

_SAMPLE = re.compile(r"^/sample/(\d{1,12})$")
_MEMBER = re.compile(r"^/(thumb|raw)/(\d{1,12})/(\d{1,6})$")
_VERIFY = re.compile(r"^/verify/(\d{1,9}|all)$")
_PLACEHOLDER = (  # a 1x1 grey PNG, for an image that gave no thumbnail
    b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR\x00\x00\x00\x01\x00\x00\x00\x01\x08\x00\x00\x00"
    b"\x00:~\x9bU\x00\x00\x00\nIDATx\x9cc\xe8\x00\x00\x00\x82\x00\x81\xfb\xb1\x9a\xa8\x00"
    b"\x00\x00\x00IEND\xaeB`\x82"
)


class Verifier:
    """Runs :func:`tarindex.verify` on shards in one background thread, one shard at a time."""

    def __init__(self, view: View) -> None:
        self.view = view
        self.jobs: dict[int, tuple[str, str]] = {}
        self._todo: list[int] = []
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self.total = 0
        self.done = 0

    def start(self, shards: list[int]) -> None:
        """Queue ``shards`` (those not already queued or running)."""
        with self._lock:
            for s in shards:
                if self.jobs.get(s, ("",))[0] not in ("queued", "running"):
                    self.jobs[s] = ("queued", "")
                    self._todo.append(s)
                    self.total += 1
            if self._todo and (self._thread is None or not self._thread.is_alive()):
                self._thread = threading.Thread(target=self._run, daemon=True, name="verify")
                self._thread.start()

    def progress(self) -> str:
        """``"verified 3 of 10 shards"``, or empty if nothing was asked."""
        with self._lock:
            return f" verified {self.done} of {self.total} shard(s)" if self.total else ""

    def _run(self) -> None:
        ss = self.view.ss
        while True:
            with self._lock:
                if not self._todo:
                    return
                s = self._todo.pop(0)
                self.jobs[s] = ("running", "")
            t0 = time.monotonic()
            path, ip = ss.paths[s], ss.index_paths[s]
            try:
                with local_tar(path) as tmp:
                    rep = verify_mod.verify(tmp, ip if (ss.options.index_dir or is_url(path)) else None)
                state = ("ok", f"{rep} ({time.monotonic() - t0:.1f} s)")
            except Exception as e:  # the result shows on the page, whatever it is
                state = ("failed", f"{type(e).__name__}: {e}")
            with self._lock:
                self.jobs[s] = state
                self.done += 1


class ViewServer(ThreadingHTTPServer):
    """The server: a :class:`View`, its :class:`Verifier`, a title."""

    daemon_threads = True

    def __init__(self, addr: tuple[str, int], view: View, title: str) -> None:
        super().__init__(addr, _Handler)
        self.view = view
        self.title = title
        self.verifier = Verifier(view)
        self.site = live_site()
        self.served: list[tuple[str, float]] = []
        """``(path, seconds to answer)`` of the last 10000 GET requests."""


def make_server(view: View, host: str = "127.0.0.1", port: int = 0, title: str = "") -> ViewServer:
    """A :class:`ViewServer` bound to ``(host, port)`` (port 0: a free one); not yet serving."""
    return ViewServer((host, port), view, title or str(view.source))


def _int(q: dict[str, list[str]], name: str, default: int) -> int:
    try:
        return int(q.get(name, [str(default)])[0])
    except ValueError:
        return default


class _Handler(BaseHTTPRequestHandler):
    server: ViewServer
    server_version = "tarindex-view"
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 (the base's name)
        pass  # quiet: the command prints its one line; errors go to the page

    def _send(
        self,
        status: int,
        body: bytes,
        ctype: str = "text/html; charset=utf-8",
        extra: dict[str, str] | None = None,
    ) -> None:
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Content-Security-Policy", CSP)
        self.send_header("X-Content-Type-Options", "nosniff")
        self.send_header("Referrer-Policy", "no-referrer")
        self.send_header("Cache-Control", "no-store")
        for k, v in (extra or {}).items():
            self.send_header(k, v)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _html(self, page: str, status: int = 200) -> None:
        self._send(status, page.encode("utf-8", "backslashreplace"))

    def _redirect(self, where: str) -> None:
        self._send(HTTPStatus.SEE_OTHER, b"", "text/plain", {"Location": where})

    def _error(self, status: int, msg: str) -> None:
        self._send(status, msg.encode("utf-8", "backslashreplace"), "text/plain; charset=utf-8")

    def do_GET(self) -> None:
        url = urlsplit(self.path)
        srv = self.server
        t0 = time.monotonic()
        try:
            self._route(url.path, parse_qs(url.query))
        except (IndexError, KeyError) as e:  # SampleIndexError is an IndexError
            self._error(HTTPStatus.NOT_FOUND, str(e))
        except (BrokenPipeError, ConnectionResetError):
            pass
        except Exception as e:  # a bad shard: the message, not a dead connection
            self._error(HTTPStatus.INTERNAL_SERVER_ERROR, f"{type(e).__name__}: {e}")
        srv.served.append((url.path, time.monotonic() - t0))
        del srv.served[:-10000]

    do_HEAD = do_GET

    def _route(self, path: str, q: dict[str, list[str]]) -> None:
        srv, view, site = self.server, self.server.view, self.server.site
        if path == "/":
            return self._html(page_summary(srv.title, view.summary(), site))
        if path == "/samples":
            n = max(1, min(_int(q, "n", PER_PAGE), MAX_PER_PAGE))  # a bounded page
            if "seed" in q:
                seed = _int(q, "seed", 0)
                pages = max(1, -(-len(view) // n))
                start = random.Random(seed).randrange(pages) * n
                return self._html(
                    page_samples(view, site, start, n, f" (random, seed {seed})", seed)
                )
            return self._html(page_samples(view, site, _int(q, "start", 0), n))
        if path == "/search":
            key = q.get("key", [""])[0]
            hits = view.find(key) if key else []
            if len(hits) == 1:
                return self._redirect(f"/sample/{hits[0]}")
            return self._html(page_search(view, site, key, hits), 200 if hits else 404)
        if path == "/shards":
            v = srv.verifier
            return self._html(page_shards(view, site, dict(v.jobs), v.progress()))
        m = _SAMPLE.match(path)
        if m:
            return self._html(page_sample(view, site, int(m.group(1))))
        m = _MEMBER.match(path)
        if m:
            i, pos = int(m.group(2)), int(m.group(3))
            if m.group(1) == "thumb":
                png = view.thumbnail(i, pos)
                return self._send(200, png or _PLACEHOLDER, "image/png")
            return self._raw(i, pos)
        self._error(HTTPStatus.NOT_FOUND, "no such page")

    def _raw(self, i: int, pos: int) -> None:
        mb, chunks = self.server.view.member_chunks(i, pos)
        fname = mb.name.replace("/", "_")
        ascii_name = re.sub(r"[^A-Za-z0-9._-]", "_", fname)[:200] or "member"
        self.send_response(200)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Content-Length", str(mb.size))
        self.send_header(
            "Content-Disposition",
            f"attachment; filename=\"{ascii_name}\"; filename*=UTF-8''"
            f"{quote(fname.encode('utf-8', 'surrogateescape'), safe='')}",
        )
        self.send_header("Content-Security-Policy", CSP)
        self.send_header("X-Content-Type-Options", "nosniff")
        self.end_headers()
        if self.command != "HEAD":
            for c in chunks:
                self.wfile.write(c)

    def do_POST(self) -> None:
        n = int(self.headers.get("Content-Length") or 0)
        if n:
            self.rfile.read(min(n, 1 << 16))
        m = _VERIFY.match(urlsplit(self.path).path)
        if not m:
            return self._error(HTTPStatus.NOT_FOUND, "no such action")
        ns = self.server.view.ss.n_shards
        which = list(range(ns)) if m.group(1) == "all" else [int(m.group(1))]
        if any(not 0 <= s < ns for s in which):
            return self._error(HTTPStatus.NOT_FOUND, f"no shard {m.group(1)} (there are {ns})")
        self.server.verifier.start(which)
        self._redirect("/shards")
