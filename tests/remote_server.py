"""A real HTTP file server on 127.0.0.1 that honours Range, for tests and benchmarks.

The standard library's ``SimpleHTTPRequestHandler`` ignores ``Range``; this handler serves
single byte ranges (``bytes=a-b``, ``bytes=a-``, ``bytes=-n``) with ``206`` and counts what it
sends. Knobs (set on the server, changeable while it runs): ``latency`` (seconds added before
every reply), ``ignore_range`` (answer ranged GETs with the whole file, like a naive server),
``drop`` (the next ``drop`` replies with a body close the connection after half of it).

Every reply names the file's version (``ETag`` from inode, mtime and size, as nginx does;
``Last-Modified``) and ``If-Match`` is honoured (``412``). Hostile knobs, for the checks of
docs/REMOTE.md: ``shift`` (a ranged reply holds the bytes ``shift`` further on, and its
``Content-Range`` says so), ``ignore_if_match`` (serve whatever the file is now),
``fail_head`` (the next ``fail_head`` HEADs answer ``503``), ``no_head`` (HEAD is ``405``),
``weak_etag`` (ETags are weak, ``W/"..."``: as RFC 9110 says, never equal for ``If-Match``),
``trickle`` (seconds between the bytes of each body), ``pause`` (seconds a GET waits between
its headers and its body, as a loaded server's thread can; a reply is counted before its
headers go out), ``on_body`` (``None`` or a function called as ``on_body(path, range, offset)``
before each MiB of a GET's body is read from the file: a test changes the file mid-reply),
``endless`` (GETs of paths ending in it send the file and then zeros, with no
length, until the client hangs up or 256 MiB went out), ``page`` (``None`` or ``(body,
at_least, length)``: a ranged GET of ``at_least`` bytes or more is answered ``200`` with
``body``, ``text/html`` and no version, as a proxy's or CDN's error page; its
``Content-Length`` says ``length``, ``None`` for the body's own).
"""

from __future__ import annotations

import email.utils
import json
import os
import re
import socket
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

_RANGE = re.compile(r"bytes=(\d*)-(\d*)$")


class RangeServer(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 256  # the default (5) drops SYNs of a burst of concurrent requests
    allow_reuse_address = True

    def __init__(self, root: str) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.root = root
        self.latency = 0.0
        self.ignore_range = False
        self.drop = 0
        self.shift = 0
        self.ignore_if_match = False
        self.fail_head = 0
        self.no_head = False
        self.weak_etag = False
        self.trickle = 0.0
        self.pause = 0.0
        self.on_body: Callable[[str, str, int], None] | None = None
        self.endless: str | None = None
        self.page: tuple[bytes, int, int | None] | None = None
        self.lock = threading.Lock()
        self.requests = 0
        self.bytes_sent = 0
        self.log: list[tuple[str, str, int, int]] = []  # (method, path, start, end)
        self.spans: list[tuple[str, int, float, float]] = []  # GET (path, start, arrived, done)
        self.conns: set[socket.socket] = set()

    def close_connections(self) -> None:
        """Close kept-alive connections: their handler threads outlive ``shutdown()``."""
        with self.lock:
            conns, self.conns = set(self.conns), set()
        for c in conns:
            try:
                c.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    def reset(self) -> None:
        with self.lock:
            self.requests = 0
            self.bytes_sent = 0
            self.log.clear()
            self.spans.clear()

    def bytes_for(self, suffix: str) -> int:
        """Body bytes sent for paths ending in ``suffix``."""
        with self.lock:
            return sum(e - s for m, p, s, e in self.log if p.endswith(suffix) and m == "GET")


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: RangeServer
    # TCP_NODELAY, as nginx (tcp_nodelay on) and object stores: the headers and the body go
    # in two writes, and with Nagle the body's waits for the client's delayed ACK (~40 ms)
    disable_nagle_algorithm = True

    def log_message(self, format: str, *args: object) -> None:
        pass

    def setup(self) -> None:
        super().setup()
        with self.server.lock:
            self.server.conns.add(self.connection)

    def finish(self) -> None:
        with self.server.lock:
            self.server.conns.discard(self.connection)
        try:
            super().finish()
        except OSError:
            pass

    def _file(self) -> str | None:
        rel = urllib.parse.unquote(urllib.parse.urlsplit(self.path).path).lstrip("/")
        p = os.path.normpath(os.path.join(self.server.root, rel))
        if not p.startswith(os.path.abspath(self.server.root)) or not os.path.isfile(p):
            return None
        return p

    def _version(self, p: str) -> dict[str, str]:
        st = os.stat(p)
        weak = "W/" if self.server.weak_etag else ""
        return {
            "ETag": f'{weak}"{st.st_ino:x}-{st.st_mtime_ns:x}-{st.st_size:x}"',
            "Last-Modified": email.utils.formatdate(st.st_mtime, usegmt=True),
        }

    def _missing(self) -> None:
        self.send_response(404)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def do_HEAD(self) -> None:
        srv = self.server
        if srv.latency:
            time.sleep(srv.latency)
        with srv.lock:
            srv.requests += 1
            srv.log.append(("HEAD", self.path, 0, 0))
        p = self._file()
        if p is None:
            return self._missing()
        with srv.lock:
            fail = srv.fail_head > 0
            if fail:
                srv.fail_head -= 1
        if fail or srv.no_head:
            self.send_response(405 if srv.no_head and not fail else 503)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        self.send_response(200)
        for k, v in self._version(p).items():
            self.send_header(k, v)
        self.send_header("Content-Length", str(os.path.getsize(p)))
        self.send_header("Accept-Ranges", "none" if srv.ignore_range else "bytes")
        self.end_headers()

    def _control(self) -> bool:
        """Control URLs for a server in another process (benchmarks).

        ``/__stats`` (JSON counters), ``/__reset`` (the counters, then reset them),
        ``/__set?latency=S&ignore_range=0|1``.
        """
        u = urllib.parse.urlsplit(self.path)
        if not u.path.startswith("/__"):
            return False
        srv = self.server
        if u.path == "/__set":
            q = urllib.parse.parse_qs(u.query)
            if "latency" in q:
                srv.latency = float(q["latency"][0])
            if "ignore_range" in q:
                srv.ignore_range = q["ignore_range"][0] == "1"
        with srv.lock:
            body = json.dumps({"requests": srv.requests, "bytes_sent": srv.bytes_sent}).encode()
        if u.path == "/__reset":  # the counters before the reset
            srv.reset()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
        return True

    def do_GET(self) -> None:
        arrived = time.monotonic()
        self._serve_get()
        with self.server.lock:
            rng = _RANGE.match((self.headers.get("Range") or "").strip())
            start = int(rng.group(1)) if rng and rng.group(1) else 0
            self.server.spans.append((self.path, start, arrived, time.monotonic()))

    def _serve_get(self) -> None:
        srv = self.server
        if self._control():
            return
        if srv.latency:
            time.sleep(srv.latency)
        p = self._file()
        if p is None:
            with srv.lock:
                srv.requests += 1
            return self._missing()
        size = os.path.getsize(p)
        version = self._version(p)
        want = self.headers.get("If-Match")
        strong = want and not want.startswith("W/") and want == version["ETag"]
        if want and not strong and not srv.ignore_if_match:
            with srv.lock:
                srv.requests += 1
            self.send_response(412)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        if srv.endless and self.path.endswith(srv.endless):
            return self._endless(p)
        if srv.page is not None and self._page(srv.page, size):
            return
        start, end, status = 0, size, 200
        rng = self.headers.get("Range")
        if rng and not srv.ignore_range:
            m = _RANGE.match(rng.strip())
            if m is None or (not m.group(1) and not m.group(2)):
                self.send_response(416)
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            if m.group(1):
                start = int(m.group(1))
                end = min(size, int(m.group(2)) + 1) if m.group(2) else size
            else:
                start, end = max(0, size - int(m.group(2))), size
            if start >= size or end <= start:
                self.send_response(416)
                self.send_header("Content-Range", f"bytes */{size}")
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            status = 206
            if srv.shift and end + srv.shift <= size:
                start, end = start + srv.shift, end + srv.shift
        n = end - start
        with srv.lock:
            srv.requests += 1
            drop = srv.drop > 0
            if drop:
                srv.drop -= 1
            # counted before the headers go out: a client may act on them (refuse a whole
            # reply to a ranged GET, hang up) before this thread runs again, and a count made
            # after them raced a test's reset of the counters (issue 24's note)
            sent = (max(1, n // 2) if n > 1 else 0) if drop else n
            srv.bytes_sent += sent
            srv.log.append(("GET", self.path, start, start + sent))
        self.send_response(status)
        for k, v in version.items():
            self.send_header(k, v)
        self.send_header("Content-Length", str(end - start))
        if status == 206:
            self.send_header("Content-Range", f"bytes {start}-{end - 1}/{size}")
        self.end_headers()
        if srv.pause:
            time.sleep(srv.pause)
        with open(p, "rb") as f:
            f.seek(start)
            if drop:  # half the body, then the connection goes away
                data = f.read(sent)
                self.wfile.write(data)
                self.wfile.flush()
                self.close_connection = True
                try:
                    self.connection.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                return
            out = 0
            while out < n:
                if srv.trickle:
                    time.sleep(srv.trickle)
                    chunk = f.read(1)
                    try:
                        self.wfile.write(chunk)
                        self.wfile.flush()
                    except OSError:
                        return
                    out += 1
                    continue
                if srv.on_body is not None:
                    srv.on_body(self.path, self.headers.get("Range") or "", start + out)
                chunk = f.read(min(1 << 20, n - out))
                if not chunk:
                    break
                self.wfile.write(chunk)
                out += len(chunk)


    def _page(self, page: tuple[bytes, int, int | None], size: int) -> bool:
        """Answer a ranged GET of ``page[1]`` bytes or more with a ``200`` page; else ``False``."""
        body, at_least, length = page
        m = _RANGE.match((self.headers.get("Range") or "").strip())
        if m is None or not m.group(1):
            return False
        start = int(m.group(1))
        end = min(size, int(m.group(2)) + 1) if m.group(2) else size
        if end - start < at_least:
            return False
        srv = self.server
        with srv.lock:
            srv.requests += 1
            srv.bytes_sent += len(body)
            srv.log.append(("GET", self.path, 0, len(body)))
        self.send_response(200)
        self.send_header("Content-Type", "text/html")
        self.send_header("Content-Length", str(len(body) if length is None else length))
        self.end_headers()
        try:
            self.wfile.write(body)
            self.wfile.flush()
        except OSError:
            pass
        self.close_connection = True
        return True

    def _endless(self, p: str) -> None:
        """The file, then zeros with no length (until the client hangs up, 256 MiB at most)."""
        srv = self.server
        self.send_response(200)
        self.send_header("Connection", "close")
        self.end_headers()
        self.close_connection = True
        with open(p, "rb") as f:
            data = f.read()
        zeros = bytes(64 << 10)
        try:
            self.wfile.write(data)
            with srv.lock:
                srv.bytes_sent += len(data)
            for _ in range((256 << 20) // len(zeros)):
                self.wfile.write(zeros)
                with srv.lock:
                    srv.bytes_sent += len(zeros)
        except OSError:
            pass


@contextmanager
def serve(root: str) -> Iterator[RangeServer]:
    """Serve ``root`` on 127.0.0.1 (a free port) for the duration of the block."""
    srv = RangeServer(root)
    t = threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    t.start()
    try:
        yield srv
    finally:
        srv.shutdown()
        srv.close_connections()
        srv.server_close()
        t.join(5)


def main() -> None:
    """``python -m tests.remote_server ROOT [LATENCY]``: serve until killed; prints the URL."""
    import sys

    srv = RangeServer(sys.argv[1])
    srv.latency = float(sys.argv[2]) if len(sys.argv) > 2 else 0.0
    print(srv.url, flush=True)
    srv.serve_forever(poll_interval=0.05)


if __name__ == "__main__":
    main()
