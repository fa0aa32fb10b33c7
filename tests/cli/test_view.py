"""``tarindex view`` over real shards and a real loopback HTTP server (issue 23)."""

from __future__ import annotations

import io
import os
import re
import shutil
import signal
import struct
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
import zlib
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

import tarindex
from tarindex.cli.main import main
from tarindex.view import View, ViewServer, make_server
from tarindex.view.model import THUMB_PX
from tarindex.view.pages import CSP

XSS = "<script>alert(1)</script>"


def png(w: int, h: int, c: int) -> bytes:
    b = io.BytesIO()
    Image.new("RGB", (w, h), (c, 255 - c, 90)).save(b, "PNG")
    return b.getvalue()


def huge_png() -> bytes:
    """A PNG header declaring 100000 x 100000 pixels (no pixel data): over the pixel bound."""
    ihdr = struct.pack(">IIBBBBB", 100000, 100000, 8, 2, 0, 0, 0)
    chunk = struct.pack(">I", 13) + b"IHDR" + ihdr
    chunk += struct.pack(">I", zlib.crc32(b"IHDR" + ihdr))
    return b"\x89PNG\r\n\x1a\n" + chunk + struct.pack(">I", 0) + b"IEND" + b"\xaeB`\x82"


def write_shards(d: Path, n: int = 60) -> str:
    with tarindex.ShardWriter(str(d / "s-%03d.tar"), maxcount=25) as w:
        for i in range(n):
            w.write(
                {
                    "__key__": f"{i:04d}",
                    "png": png(200, 100, (i * 7) % 256),
                    "cls": str(i % 10).encode(),
                    "txt": f"caption of {i}\nsecond line".encode(),
                    "json": b'{"html": "<img src=x onerror=alert(3)>", "n": %d}' % i,
                }
            )
        w.write({"__key__": XSS, "txt": XSS.encode(), "json": b'{"a": "<b>bold</b>"}'})
        arr = io.BytesIO()
        np.save(arr, np.arange(6, dtype=np.float32).reshape(2, 3) / 2)
        w.write({"__key__": "hostile", "png": huge_png(), "txt": b"big", "npy": arr.getvalue()})
    return str(d / "s-*.tar")


class Live:
    """A ViewServer serving on loopback in a thread."""

    def __init__(self, source: object) -> None:
        self.view = View(source)
        self.srv: ViewServer = make_server(self.view)
        self.base = f"http://127.0.0.1:{self.srv.server_address[1]}"
        self.t = threading.Thread(target=self.srv.serve_forever, daemon=True)
        self.t.start()

    def get(self, path: str) -> tuple[int, dict[str, str], bytes]:
        try:
            with urllib.request.urlopen(self.base + path, timeout=30) as r:
                return r.status, dict(r.headers), r.read()
        except urllib.error.HTTPError as e:
            return e.code, dict(e.headers), e.read()

    def close(self) -> None:
        self.srv.shutdown()
        self.srv.server_close()
        self.view.close()


@pytest.fixture(scope="module")
def shards(tmp_path_factory: pytest.TempPathFactory) -> str:
    return write_shards(tmp_path_factory.mktemp("view"))


@pytest.fixture
def live(shards: str) -> Iterator[Live]:
    lv = Live(shards)
    yield lv
    lv.close()


def test_summary_counts_extensions_and_histograms(live: Live) -> None:
    st, hd, body = live.get("/")
    page = body.decode()
    assert st == 200 and hd["Content-Security-Policy"] == CSP
    assert "script-src" not in CSP and "default-src 'none'" in CSP
    assert '<td class=n id="n-samples">62</td>' in page
    assert '<td class=n id="n-shards">3</td>' in page
    ss = tarindex.ShardSet(live.view.ss.paths)
    members = sum(len(ss.reader(s).index.size) for s in range(ss.n_shards))
    assert f'<td class=n id="n-members">{members}</td>' in page
    assert "<td>png</td><td class=n>61</td>" in page  # 60 images and the hostile one
    assert page.count("<svg") >= 5  # one size histogram per extension (4), one of cls
    assert "samples by cls" in page and "member crc32 in 3 of 3 shards" in page


def test_grid_page_thumbnails_text_cls_and_paging(live: Live) -> None:
    st, _, body = live.get("/samples?start=25&n=10")
    page = body.decode()
    assert st == 200
    assert page.count('class="card"') == 10 and 'id="s25"' in page and 'id="s34"' in page
    assert page.count('src="/thumb/') == 10
    assert "caption of 27" in page and '<b class="cls">7</b>' in page
    assert 'href="/samples?start=35&amp;n=10"' in page  # next
    m = re.search(r'src="(/thumb/27/\d+)"', page)  # the image member's position in the sample
    assert m is not None
    st, hd, thumb = live.get(m.group(1))
    assert st == 200 and hd["Content-Type"] == "image/png"
    im = Image.open(io.BytesIO(thumb))
    assert im.size == (THUMB_PX, THUMB_PX // 2)  # 200x100 downscaled, aspect kept
    a = live.get("/samples?seed=5")[2]
    assert a == live.get("/samples?seed=5")[2] and b"(random, seed 5)" in a
    big = live.get("/samples?n=100000000&seed=2")[2]  # n is capped (200): one page, all 62
    assert big.count(b'class="card"') == 62 and b"(random, seed 2)" in big
    st, _, body = live.get("/samples?start=61&n=48")  # jump to an index: the page from it
    assert st == 200 and b'id="s61"' in body and b'id="s60"' not in body


def test_sample_page_members_offsets_crc_and_download(live: Live) -> None:
    r = tarindex.ShardSet(live.view.ss.paths).reader(1)
    lo, hi = r.member_slice(3)  # global sample 28
    page = live.get("/sample/28")[2].decode()
    for m in range(lo, hi):
        assert f"<td>{int(r.index.offset[m])}</td>" in page
        crc = r.index.member_crc
        assert crc is not None and f"<td>{int(crc[m]):08x}</td>" in page
    assert "0028.png" in page and "0028.json" in page
    assert "&quot;n&quot;: 28" in page  # json pretty-printed (and escaped)
    exts = [r.exts[int(e)] for e in r.index.ext_id[lo:hi]]
    pos = exts.index("txt")
    st, hd, raw = live.get(f"/raw/28/{pos}")
    assert st == 200 and raw == b"caption of 28\nsecond line"
    assert hd["Content-Type"] == "application/octet-stream"
    assert hd["Content-Disposition"].startswith('attachment; filename="0028.txt"')
    assert hd["X-Content-Type-Options"] == "nosniff"


def test_xss_key_member_and_json_render_as_text(live: Live) -> None:
    i = live.view.find(XSS)
    assert i == [60]
    for path in ("/sample/60", "/samples?start=48&n=48", "/search?key=%3Cscript%3E"):
        body = live.get(path)[2].decode()
        assert "<script" not in body.lower()
        assert "<img src=x" not in body and "<b>bold</b>" not in body
    body = live.get("/sample/60")[2].decode()
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in body
    assert "&lt;b&gt;bold&lt;/b&gt;" in body
    st, _, raw = live.get("/search?key=" + urllib.parse.quote(XSS))  # one hit: its page
    assert st == 200 and b"#60" in raw
    st, hd, raw = live.get("/raw/60/1")  # members sorted: json, txt
    assert raw == XSS.encode() and hd["Content-Type"] == "application/octet-stream"
    assert hd["Content-Disposition"].startswith('attachment; filename="_script_alert_1__')
    assert "<" not in hd["Content-Disposition"]


def test_view_never_imports_torch() -> None:
    code = "import sys, tarindex.view, tarindex.cli.view; print('torch' in sys.modules)"
    env = {**os.environ, "PYTHONPATH": str(Path(tarindex.__file__).parent.parent)}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert out.returncode == 0 and out.stdout.strip() == "False", out.stderr


def test_no_path_outside_the_source_and_bad_requests(live: Live) -> None:
    for path in (
        "/../../../../etc/passwd",
        "/raw/../../etc/passwd",
        "/sample/..%2f..%2fetc%2fpasswd",
        "/sample/-1",
        "/sample/99999",
        "/raw/3/99",
        "/thumb/99999/0",
        "/s-000.tar",
        "/favicon.ico",
    ):
        st, hd, body = live.get(path)
        assert st == 404, path
        assert b"root:" not in body and len(body) < 4096
        assert hd["Content-Security-Policy"] == CSP
    st, _, _ = live.get("/search?key=nope")
    assert st == 404


def test_hostile_image_gets_a_placeholder_fast(live: Live) -> None:
    [i] = live.view.find("hostile")
    t0 = time.monotonic()
    st, hd, body = live.get(f"/thumb/{i}/1")  # members sorted: npy, png, txt
    assert st == 200 and hd["Content-Type"] == "image/png"
    assert Image.open(io.BytesIO(body)).size == (1, 1)  # the placeholder, not a decode
    assert time.monotonic() - t0 < 2
    st, _, body = live.get(f"/sample/{i}")
    assert st == 200 and b"shape (2, 3), dtype float32\n[0.0, 0.5, 1.0, 1.5, 2.0, 2.5]" in body


def test_verify_action_runs_in_background(live: Live) -> None:
    req = urllib.request.Request(live.base + "/verify/all", data=b"", method="POST")
    with urllib.request.urlopen(req, timeout=30) as r:
        assert r.status == 200 and r.url.endswith("/shards")  # 303 followed
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        page = live.get("/shards")[2].decode()
        if page.count('class="ok state"') == 3:
            break
        assert "failed" not in page
        time.sleep(0.2)
    assert "verified 3 of 3 shard(s)" in page and "a fresh scan all match" in page
    st, _, _ = live.get("/shards")
    assert st == 200


def test_verify_reports_a_damaged_shard(tmp_path: Path) -> None:
    write_shards(tmp_path, 30)
    p = tmp_path / "s-000.tar"
    data = bytearray(p.read_bytes())
    at = 2048 + 100  # inside the first sample's first header's name field
    data[at] ^= 0xFF
    p.write_bytes(bytes(data))
    lv = Live(str(tmp_path / "s-*.tar"))
    try:
        lv.srv.verifier.start([0])
        deadline = time.monotonic() + 30
        while lv.srv.verifier.jobs[0][0] in ("queued", "running"):
            assert time.monotonic() < deadline
            time.sleep(0.1)
        state, msg = lv.srv.verifier.jobs[0]
        assert state == "failed" and "s-000.tar" in msg
        assert 'class="fail state"' in lv.get("/shards")[2].decode()
    finally:
        lv.close()


@pytest.mark.skipif(shutil.which("tar") is None, reason="GNU tar is not installed")
def test_gnu_tar_made_tar(tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    for i in range(5):
        (src / f"img{i}.png").write_bytes(png(30, 30, i * 40))
        (src / f"img{i}.txt").write_text(f"gnu caption {i}")
    tar = tmp_path / "gnu.tar"
    names = sorted(os.listdir(src))
    subprocess.run(["tar", "--format=gnu", "-cf", str(tar), "-C", str(src), *names], check=True)
    tarindex.build_index(str(tar))
    lv = Live(str(tar))
    try:
        assert b'id="n-samples">5<' in lv.get("/")[2]
        st, _, body = lv.get("/search?key=img3")
        assert st == 200 and b"gnu caption 3" in body and b"img3.png" in body
        st, _, thumb = lv.get("/thumb/3/0")
        assert Image.open(io.BytesIO(thumb)).size == (30, 30)
    finally:
        lv.close()


def test_html_report_is_static_and_escaped(shards: str, tmp_path: Path) -> None:
    out = tmp_path / "report"
    assert main(["view", shards, "--html", str(out), "--pages", "2"]) == 0
    files = sorted(os.listdir(out))
    assert {"index.html", "shards.html", "samples-0.html", "samples-48.html"} <= set(files)
    assert "sample-60.html" in files and "sample-95.html" not in files
    grid = (out / "samples-0.html").read_text()
    assert grid.count('src="data:image/png;base64,') == 48
    assert 'http-equiv="Content-Security-Policy"' in grid
    for f in files:
        text = (out / f).read_text()
        assert "<script" not in text.lower() and 'href="/' not in text, f


def _start(args: list[str]) -> tuple[subprocess.Popen[str], str]:
    env = {**os.environ, "PYTHONPATH": str(Path(tarindex.__file__).parent.parent)}
    p = subprocess.Popen(
        [sys.executable, "-m", "tarindex", "view", *args, "--port", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    assert p.stdout is not None
    line = p.stdout.readline()
    assert "serving" in line, (line, p.stderr.read() if p.stderr and p.poll() is not None else "")
    return p, line.split(" at ")[1].split()[0]


def test_command_serves_loopback_and_stops_on_ctrl_c(shards: str) -> None:
    p, url = _start([shards])
    try:
        assert url.startswith("http://127.0.0.1:")
        with urllib.request.urlopen(url + "samples", timeout=30) as r:
            assert r.status == 200
        p.send_signal(signal.SIGINT)
        assert p.wait(10) == 0
        assert p.stderr is not None and "stopped" in p.stderr.read()
    finally:
        p.kill()
        p.wait()


def test_other_interface_only_when_asked_with_a_warning(shards: str) -> None:
    p, url = _start([shards, "--host", "0.0.0.0"])
    try:
        assert url.startswith("http://0.0.0.0:")
        p.send_signal(signal.SIGINT)
        assert p.wait(10) == 0
        assert p.stderr is not None and "warning: serving on 0.0.0.0" in p.stderr.read()
    finally:
        p.kill()
        p.wait()
