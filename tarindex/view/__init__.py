"""``tarindex view``: a local, read-only web viewer of a dataset (issue 23), and its static report.

Layers: :mod:`.model` reads (public ShardSet/ShardReader API, the codecs' bounds),
:mod:`.pages` renders HTML (everything from a tar escaped; no JavaScript), :mod:`.server`
serves it (standard library ``ThreadingHTTPServer``, loopback by default), :mod:`.static`
writes the same pages as files. torch is never imported.
"""

from __future__ import annotations

from .model import View
from .server import ViewServer, make_server
from .static import write_report

__all__ = ["View", "ViewServer", "make_server", "write_report"]
