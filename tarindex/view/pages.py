"""The viewer's HTML: summary, samples grid, one sample, shards; no JavaScript at all.

Every string from a tar (keys, extensions, member text, json, paths) goes through
:func:`esc` (``html.escape`` with quotes), so ``<script>`` in a key renders as text. The pages
are the same for the server and the static report; a :class:`Site` says how links, thumbnails
and raw downloads are addressed.
"""

from __future__ import annotations

import base64
import html
from collections.abc import Callable
from dataclasses import dataclass

from .model import Row, Summary, View

__all__ = [
    "CSP",
    "MAX_PER_PAGE",
    "PER_PAGE",
    "Site",
    "data_uri",
    "esc",
    "live_site",
    "page_sample",
    "page_samples",
    "page_search",
    "page_shards",
    "page_summary",
    "svg_bars",
]

CSP = (
    "default-src 'none'; img-src 'self' data:; style-src 'unsafe-inline'; "
    "form-action 'self'; base-uri 'none'; frame-ancestors 'none'"
)
"""The Content-Security-Policy of every page: no script runs, inline or not."""

PER_PAGE = 48
MAX_PER_PAGE = 200


def esc(x: object) -> str:
    """``html.escape(str(x), quote=True)``: the one way text from a tar enters a page."""
    return html.escape(str(x), quote=True)


@dataclass
class Site:
    """How pages address each other: the live server, or the static report's files."""

    static: bool
    sample: Callable[[int], str | None]
    samples: Callable[[int, int], str | None]
    thumb: Callable[[int, int], str | None]
    raw: Callable[[int, int], str | None]
    summary: str = "/"
    shards: str = "/shards"


def live_site() -> Site:
    """The server's addresses (``/sample/I``, ``/samples?start=S&n=N``, ``/thumb/I/M``, ...)."""
    return Site(
        False,
        lambda i: f"/sample/{i}",
        lambda start, n: f"/samples?start={start}&n={n}",
        lambda i, m: f"/thumb/{i}/{m}",
        lambda i, m: f"/raw/{i}/{m}",
    )


def data_uri(png: bytes) -> str:
    """A ``data:image/png;base64`` URI."""
    return "data:image/png;base64," + base64.b64encode(png).decode("ascii")


_STYLE = """
body{font:14px/1.4 system-ui,sans-serif;margin:0 1.5em 2em;color:#222}
nav{padding:.6em 0;border-bottom:1px solid #ccc;margin-bottom:1em}
nav a{margin-right:1.2em}
table{border-collapse:collapse}td,th{border:1px solid #ddd;padding:2px 8px;text-align:left}
td.n{text-align:right;font-variant-numeric:tabular-nums}
.grid{display:flex;flex-wrap:wrap;gap:10px}
.card{border:1px solid #ccc;border-radius:4px;padding:6px;width:180px;overflow:hidden}
.card img{display:block;width:128px;height:auto;image-rendering:pixelated;background:#eee}
.mem img{width:256px;height:auto;image-rendering:pixelated}
.card pre,.mem pre{white-space:pre-wrap;word-break:break-all;font-size:12px;margin:4px 0}
.key{font-family:monospace;font-weight:bold;word-break:break-all}
.noimg{display:inline-block;width:64px;height:64px;background:#eee;color:#888;font-size:11px}
form{display:inline-block;margin-right:1.5em}
.ok{color:#080}.fail{color:#b00}
"""


def _doc(title: str, body: str, site: Site, refresh: int = 0) -> str:
    meta = f'<meta http-equiv="refresh" content="{refresh}">' if refresh else ""
    csp = f'<meta http-equiv="Content-Security-Policy" content="{esc(CSP)}">' if site.static else ""
    nav = (
        f'<nav><a href="{esc(site.summary)}">summary</a>'
        f'<a href="{esc(site.samples(0, PER_PAGE) or "")}">samples</a>'
        f'<a href="{esc(site.shards)}">shards</a></nav>'
    )
    return (
        f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">{csp}{meta}'
        f"<title>{esc(title)} - tarindex view</title><style>{_STYLE}</style></head>"
        f"<body>{nav}<h1>{esc(title)}</h1>{body}</body></html>"
    )


def _human(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def svg_bars(labels: list[str], counts: list[int], title: str) -> str:
    """A horizontal bar chart as inline SVG (labels escaped), readable without scripts."""
    if not counts:
        return ""
    w, bar, lw = 520, 16, 130
    top = max(counts) or 1
    h = bar * len(counts) + 24
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" role="img" '
        f'aria-label="{esc(title)}"><text x="0" y="12" font-size="12">{esc(title)}</text>'
    ]
    for k, (lab, c) in enumerate(zip(labels, counts, strict=True)):
        y = 20 + k * bar
        bw = int((w - lw - 70) * c / top)
        out.append(
            f'<text x="{lw - 4}" y="{y + 11}" font-size="11" text-anchor="end">{esc(lab)}</text>'
            f'<rect x="{lw}" y="{y + 2}" width="{max(bw, 1)}" height="{bar - 4}" fill="#4a7fb5"/>'
            f'<text x="{lw + bw + 4}" y="{y + 11}" font-size="11">{c}</text>'
        )
    out.append("</svg>")
    return "".join(out)


def page_summary(title: str, sm: Summary, site: Site) -> str:
    """The summary page: totals, extensions, format versions, histograms."""
    vers = ", ".join(f"{esc(v)} ({n} shards)" for v, n in sorted(sm.versions.items()))
    rows = "".join(
        f"<tr><td>{esc(e)}</td><td class=n>{c}</td><td class=n>{b}</td><td>{_human(b)}</td></tr>"
        for e, (c, b) in sm.exts.items()
    )
    body = [
        "<table>",
        f'<tr><th>shards</th><td class=n id="n-shards">{sm.shards}</td></tr>',
        f'<tr><th>samples</th><td class=n id="n-samples">{sm.samples}</td></tr>',
        f'<tr><th>members</th><td class=n id="n-members">{sm.members}</td></tr>',
        f"<tr><th>data bytes</th><td class=n>{sm.data_bytes} ({_human(sm.data_bytes)})</td></tr>",
        f"<tr><th>tar bytes</th><td class=n>{sm.tar_bytes} ({_human(sm.tar_bytes)})</td></tr>",
        f"<tr><th>index format</th><td>{vers}</td></tr>",
        f"<tr><th>checksums</th><td>member crc32 in {sm.with_crc} of {sm.shards} shards</td></tr>",
        "</table><h2>Extensions</h2><table><tr><th>extension</th><th>members</th>"
        f"<th>bytes</th><th></th></tr>{rows}</table><h2>Member sizes</h2>",
    ]
    for e, hist in sm.size_hist.items():
        b0 = next((b for b, c in enumerate(hist) if c), 0)  # from the first non-empty bin
        labels = [f"{_human(2**b if b else 0)}-{_human(2 ** (b + 1))}" for b in range(len(hist))]
        body.append(svg_bars(labels[b0:], hist[b0:], f"{e}: members by size"))
    if sm.cls_hist:
        body.append(f"<h2>cls</h2><p>from {sm.cls_read} samples, evenly spaced</p>")
        body.append(svg_bars(list(sm.cls_hist), list(sm.cls_hist.values()), "samples by cls"))
    return _doc(str(title), "".join(body), site)


def _thumb_tag(site: Site, view: View, i: int, pos: int, alt: str) -> str:
    src = site.thumb(i, pos)
    if src is None:
        return f'<span class="noimg">{esc(alt)}</span>'
    return f'<img class="thumb" src="{esc(src)}" alt="{esc(alt)}" loading="lazy">'


def _card(site: Site, view: View, row: Row) -> str:
    link = site.sample(row.index)
    head = f'<span class="key">{esc(row.key)}</span>'
    if link is not None:
        head = f'<a href="{esc(link)}">{head}</a>'
    parts = [f'<div class="card" id="s{row.index}"><div>#{row.index} {head}</div>']
    for mb in row.members:
        if view.is_image(mb.ext):
            parts.append(_thumb_tag(site, view, row.index, mb.pos, mb.ext))
    if row.cls is not None:
        parts.append(f'<div>cls <b class="cls">{esc(row.cls)}</b></div>')
    for pos, text in row.lines.items():
        parts.append(f"<pre>{esc(row.members[pos].ext)}: {esc(text)}</pre>")
    exts = " ".join(esc(mb.ext) for mb in row.members)
    parts.append(f'<div class="exts">{exts}</div></div>')
    return "".join(parts)


def page_samples(
    view: View, site: Site, start: int, n: int, note: str = "", seed: int | None = None
) -> str:
    """A page of the grid: samples ``start <= i < start + n`` (only those are read)."""
    total = len(view)
    n = max(1, min(n, MAX_PER_PAGE))
    start = max(0, min(start, max(total - 1, 0)))
    end = min(total, start + n)
    rows = [view.row(i) for i in range(start, end)]
    nav = []
    for label, s in (("first", 0), ("prev", start - n), ("next", start + n)):
        if 0 <= s < total and s != start:
            href = site.samples(s, n)
            if href is not None:
                nav.append(f'<a href="{esc(href)}" rel="{label}">{label}</a>')
    last = max(0, (total - 1) // n * n)
    if last != start and site.samples(last, n) is not None:
        nav.append(f'<a href="{esc(site.samples(last, n) or "")}">last</a>')
    forms = ""
    if not site.static:
        nxt = 0 if seed is None else seed + 1
        forms = (
            f'<form action="/samples" method="get"><label>jump to index <input name="start" '
            f'type="number" min="0" max="{max(total - 1, 0)}" value="{start}"></label>'
            f'<input type="hidden" name="n" value="{n}"><button>go</button></form>'
            '<form action="/search" method="get"><label>key <input name="key" id="key" '
            'size="24"></label><button>search</button></form>'
            f'<a href="/samples?seed={nxt}&amp;n={n}" id="random">random page (seed {nxt})</a>'
        )
    head = (
        f'<p><span id="total">{total}</span> samples; showing {start}..{max(end - 1, start)}'
        f"{esc(note)}</p><div>{forms}</div><p>{' '.join(nav)}</p>"
    )
    grid = '<div class="grid">' + "".join(_card(site, view, r) for r in rows) + "</div>"
    return _doc("samples", head + grid, site)


def page_sample(view: View, site: Site, i: int) -> str:
    """One sample: every member with name, size, offset, crc32, a preview and a download link."""
    row = view.row(i, lines=False)
    parts = [
        f'<p>sample <b>#{row.index}</b>, key <span class="key" id="key">{esc(row.key)}</span>, '
        f"shard {row.shard} ({esc(view.ss.paths[row.shard])}), sample {row.j} of it</p>"
    ]
    for mb in row.members:
        crc = "-" if mb.crc32 is None else f"{mb.crc32:08x}"
        raw = site.raw(i, mb.pos)
        dl = f' <a href="{esc(raw)}" download>download</a>' if raw is not None else ""
        parts.append(
            f'<div class="mem"><h3>{esc(mb.name)}</h3><table><tr><th>extension</th>'
            f"<td>{esc(mb.ext)}</td></tr><tr><th>size</th><td>{mb.size} bytes</td></tr>"
            f"<tr><th>data offset</th><td>{mb.offset}</td></tr><tr><th>crc32</th>"
            f"<td>{crc}</td></tr></table>{dl}"
        )
        kind, text = view.preview(i, mb.pos)
        if kind == "image":
            parts.append(_thumb_tag(site, view, i, mb.pos, mb.ext))
        else:
            parts.append(f'<pre class="{kind}">{esc(text)}</pre>')
        parts.append("</div>")
    return _doc(f"sample {row.index}", "".join(parts), site)


def page_search(view: View, site: Site, key: str, hits: list[int]) -> str:
    """Search results: the samples whose key is ``key``."""
    items = "".join(
        f'<li><a href="{esc(site.sample(i) or "")}">#{i}</a> {esc(view.row(i, False).key)}</li>'
        for i in hits[:100]
    )
    body = f"<p>{len(hits)} samples with key <b>{esc(key)}</b></p><ul>{items}</ul>"
    return _doc("search", body, site)


def page_shards(
    view: View, site: Site, jobs: dict[int, tuple[str, str]], progress: str = ""
) -> str:
    """Shards with counts and sizes; in the server, a verify button and each job's state."""
    running = any(st in ("queued", "running") for st, _ in jobs.values())
    rows = []
    for s, (path, n, m, data, tar, err) in enumerate(view.shard_rows()):
        st, msg = jobs.get(s, ("failed", err) if err else ("", ""))
        cls = "ok" if st == "ok" else "fail" if st == "failed" else ""
        action = (
            ""
            if site.static
            else f'<form method="post" action="/verify/{s}"><button>verify</button></form>'
        )
        rows.append(
            f'<tr id="shard{s}"><td class=n>{s}</td><td>{esc(path)}</td><td class=n>{n}</td>'
            f"<td class=n>{m}</td><td class=n>{data}</td><td class=n>{tar}</td>"
            f'<td>{action}<span class="{cls} state">{esc(st)}</span> {esc(msg)}</td></tr>'
        )
    all_btn = (
        ""
        if site.static
        else '<form method="post" action="/verify/all"><button>verify all</button></form>'
    )
    body = (
        f"<div>{all_btn}{esc(progress)}</div><table><tr><th>#</th><th>tar</th><th>samples</th>"
        f"<th>members</th><th>data bytes</th><th>tar bytes</th><th>verify</th></tr>"
        f"{''.join(rows)}</table>"
    )
    return _doc("shards", body, site, refresh=2 if running and not site.static else 0)
