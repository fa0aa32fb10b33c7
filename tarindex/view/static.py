"""``tarindex view --html OUT_DIR``: the viewer's pages as a static, self-contained report.

Writes ``index.html`` (summary), ``samples-<start>.html`` for the first ``pages`` pages of the
grid, ``sample-<i>.html`` for each sample on them, and ``shards.html``; thumbnails are inlined
as ``data:`` URIs, so the folder opens anywhere without a server. Search, random pages, raw
downloads and verify need the server and are left out.
"""

from __future__ import annotations

import os

from .model import View
from .pages import PER_PAGE, Site, data_uri, page_sample, page_samples, page_shards, page_summary

__all__ = ["write_report"]


def write_report(view: View, out_dir: str, title: str = "", pages: int = 3) -> list[str]:
    """Write the report into ``out_dir`` (created); return the files written.

    Args:
        view: The dataset.
        out_dir: The report's folder; existing files of the same names are replaced.
        title: The summary's title. Defaults to the source.
        pages: Grid pages written (of :data:`~tarindex.view.pages.PER_PAGE` samples).

    Raises:
        OSError: ``out_dir`` cannot be written.
    """
    os.makedirs(out_dir, exist_ok=True)
    n = len(view)
    last = min(n, pages * PER_PAGE)
    starts = set(range(0, last, PER_PAGE)) or {0}

    def thumb(i: int, pos: int) -> str | None:
        png = view.thumbnail(i, pos)
        return None if png is None else data_uri(png)

    site = Site(
        True,
        lambda i: f"sample-{i}.html" if i < last else None,
        lambda start, k: f"samples-{start}.html" if start in starts else None,
        thumb,
        lambda i, m: None,
        summary="index.html",
        shards="shards.html",
    )
    out: dict[str, str] = {
        "index.html": page_summary(title or str(view.source), view.summary(), site),
        "shards.html": page_shards(view, site, {}),
    }
    for s in sorted(starts):
        out[f"samples-{s}.html"] = page_samples(view, site, s, PER_PAGE)
    for i in range(last):
        out[f"sample-{i}.html"] = page_sample(view, site, i)
    written = []
    for name, page in out.items():
        path = os.path.join(out_dir, name)
        with open(path, "w", encoding="utf-8", errors="backslashreplace") as f:
            f.write(page)
        written.append(path)
    return written
