"""``tarindex view`` in a real headless Chromium (Debian's ``chromium``; issue 23).

Each test starts the viewer on loopback over real shards (scikit-learn's digits written with
ShardWriter, and the same digits as a GNU-tar-made tar), loads pages with ``--dump-dom`` and
checks the DOM the browser built; one screenshot per page is kept under the test's tmp dir.
Skipped only if ``/usr/bin/chromium`` is missing (``.ci/run`` installs it).
"""

from __future__ import annotations

import io
import os
import re
import shutil
import subprocess
import tarfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image

import tarindex
from tarindex.cli.main import main
from tests.cli.test_view import XSS, Live

CHROMIUM = "/usr/bin/chromium"
pytestmark = pytest.mark.skipif(
    not os.path.exists(CHROMIUM), reason=f"{CHROMIUM} is missing (apt-get install chromium)"
)


def chromium(tmp: Path, url: str, *args: str) -> str:
    """Run headless Chromium on ``url`` with ``args``; return its stdout."""
    profile = tmp / f"profile-{time.monotonic_ns()}"
    cmd = [
        CHROMIUM,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--no-first-run",
        f"--user-data-dir={profile}",
        *args,
        url,
    ]
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=True)
    finally:
        shutil.rmtree(profile, ignore_errors=True)
    return out.stdout


def dom(tmp: Path, url: str) -> str:
    return chromium(tmp, url, "--dump-dom")


def screenshot(tmp: Path, url: str, name: str) -> Path:
    shot = tmp / name
    chromium(tmp, url, f"--screenshot={shot}", "--window-size=1200,900")
    assert Image.open(shot).size == (1200, 900)
    return shot


def _png(img: np.ndarray[Any, Any]) -> bytes:
    b = io.BytesIO()
    Image.fromarray(img, mode="L").save(b, "PNG")
    return b.getvalue()


@pytest.fixture(scope="module")
def digits(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str]:
    """The demo's data: digits as ShardWriter shards, and as a GNU-tar-made tar (indexed)."""
    datasets = pytest.importorskip("sklearn.datasets")
    d = tmp_path_factory.mktemp("digits")
    x = datasets.load_digits()
    imgs = (x.images[:300] * (255 / 16)).astype(np.uint8)
    labels = x.target[:300]
    with tarindex.ShardWriter(str(d / "digits-%03d.tar"), maxcount=100) as w:
        for i, (im, c) in enumerate(zip(imgs, labels, strict=True)):
            w.write({"__key__": f"{i:04d}", "png": _png(im), "cls": int(c)})
        w.write({"__key__": XSS, "txt": XSS.encode(), "json": b'{"t": "<img src=x>"}'})
    files = d / "files"
    files.mkdir()
    names = []
    for i, (im, c) in enumerate(zip(imgs[:50], labels[:50], strict=True)):
        (files / f"{i:04d}.png").write_bytes(_png(im))
        (files / f"{i:04d}.cls").write_text(str(int(c)))
        names += [f"{i:04d}.cls", f"{i:04d}.png"]
    tar = d / "gnu.tar"
    subprocess.run(["tar", "--format=gnu", "-cf", str(tar), "-C", str(files), *names], check=True)
    tarindex.build_index(str(tar))
    return str(d / "digits-*.tar"), str(tar)


@pytest.fixture
def live(digits: tuple[str, str]) -> Iterator[Live]:
    lv = Live(digits[0])
    yield lv
    lv.close()


def test_summary_and_grid_in_chromium(live: Live, tmp_path: Path) -> None:
    page = dom(tmp_path, live.base + "/")
    assert '<td class="n" id="n-samples">301</td>' in page
    assert "samples by cls" in page
    page = dom(tmp_path, live.base + "/samples")
    assert '<span id="total">301</span>' in page
    thumbs = re.findall(r'<img class="thumb" src="(/thumb/\d+/\d+)"', page)
    assert len(thumbs) == 48
    fetched = {p for p, _ in live.srv.served if p.startswith("/thumb/")}
    assert set(thumbs) <= fetched  # the browser loaded every thumbnail
    shot = screenshot(tmp_path, live.base + "/samples", "samples.png")
    assert shot.stat().st_size > 10_000
    screenshot(tmp_path, live.base + "/", "summary.png")


def test_a_page_holds_at_most_200_samples(live: Live) -> None:
    body = live.get("/samples?n=100000000")[2]
    assert body.count(b'class="card"') == 200 and b'href="/samples?start=200&amp;n=200"' in body
    assert len(body) < 1 << 20


def test_key_search_and_sample_page_in_chromium(live: Live, tmp_path: Path) -> None:
    page = dom(tmp_path, live.base + "/search?key=0123")  # 303 to the sample's page
    assert '<span class="key" id="key">0123</span>' in page
    assert "<h1>sample 123</h1>" in page and "0123.png" in page
    assert re.search(r'<img class="thumb" src="/thumb/123/\d"', page)
    screenshot(tmp_path, live.base + "/sample/123", "sample.png")


def test_xss_member_renders_as_text_in_chromium(live: Live, tmp_path: Path) -> None:
    [i] = live.view.find(XSS)
    for path in (f"/sample/{i}", "/samples?start=288"):
        page = dom(tmp_path, live.base + path)
        assert "<script" not in page.lower()  # no element injected: only escaped text
        assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page
        assert "<img src=" not in page.lower()


def test_static_report_in_chromium(digits: tuple[str, str], tmp_path: Path) -> None:
    out = tmp_path / "report"
    assert main(["view", digits[0], "--html", str(out), "--pages", "1"]) == 0
    page = dom(tmp_path, (out / "samples-0.html").as_uri())
    assert '<span id="total">301</span>' in page
    assert page.count('<img class="thumb" src="data:image/png;base64,') == 48
    assert 'href="sample-7.html"' in page and "/thumb/" not in page
    page = dom(tmp_path, (out / "index.html").as_uri())
    assert '<td class="n" id="n-samples">301</td>' in page
    screenshot(tmp_path, (out / "samples-0.html").as_uri(), "report.png")


def test_shards_page_and_gnu_tar_in_chromium(digits: tuple[str, str], tmp_path: Path) -> None:
    lv = Live(digits[1])
    try:
        page = dom(tmp_path, lv.base + "/shards")
        assert 'action="/verify/0"' in page and "gnu.tar" in page
        page = dom(tmp_path, lv.base + "/samples")
        assert '<span id="total">50</span>' in page
        assert page.count('<img class="thumb"') == 48
        page = dom(tmp_path, lv.base + "/search?key=0007")
        assert '<span class="key" id="key">0007</span>' in page
    finally:
        lv.close()


def _big_tar(path: Path, n: int) -> None:
    """A ustar tar of ``n`` one-byte ``cls`` members, headers made with numpy (GNU tar reads it)."""
    ti = tarfile.TarInfo("0000000.cls")
    ti.size, ti.mtime, ti.mode = 1, 0, 0o644
    tmpl = np.frombuffer(ti.tobuf(format=tarfile.USTAR_FORMAT), np.uint8)
    with open(path, "wb") as f:
        for a in range(0, n, 50_000):
            idx = np.arange(a, min(n, a + 50_000))
            blk = np.zeros((len(idx), 1024), np.uint8)
            blk[:, :512] = tmpl
            for d in range(7):
                blk[:, 6 - d] = 48 + (idx // 10**d) % 10
            blk[:, 148:156] = 32
            s = blk[:, :512].sum(1, dtype=np.int64)
            for d in range(6):
                blk[:, 153 - d] = 48 + ((s >> (3 * d)) & 7)
            blk[:, 154] = 0
            blk[:, 512] = 48 + idx % 10
            f.write(blk.tobytes())
        f.write(bytes(10240))


@pytest.mark.timeout(600)  # writing and indexing the 1 GB tar: ~25 s idle, more under load
def test_first_grid_page_of_1m_samples_under_a_second(tmp_path: Path) -> None:
    n = 1_000_000
    tar = tmp_path / "big.tar"
    _big_tar(tar, n)
    with tarfile.open(tar) as tf:  # the stdlib reads it: a real tar
        first = tf.next()
        assert first is not None and first.name == "0000000.cls"
    tarindex.build_index(str(tar))
    lv = Live(str(tar))
    try:
        t0 = time.monotonic()
        page = dom(tmp_path, lv.base + "/samples")
        wall = time.monotonic() - t0
        assert '<span id="total">1000000</span>' in page
        assert page.count('class="card"') == 48 and '<b class="cls">7</b>' in page
        [(path, secs)] = [(p, s) for p, s in lv.srv.served if p == "/samples"]
        assert secs < 1.0, f"first grid page of {n} samples took {secs:.3f} s to serve"
        print(f"1M samples: first grid page served in {secs * 1000:.1f} ms; chromium {wall:.2f} s")
        page = dom(tmp_path, lv.base + "/search?key=0999999")
        assert "<h1>sample 999999</h1>" in page
    finally:
        lv.close()
        tar.unlink()
        Path(str(tar) + ".tidx").unlink()
