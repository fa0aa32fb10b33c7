"""``tarindex view``: serve a dataset's pages on a local port, or write them as a static report."""

from __future__ import annotations

import argparse
import ipaddress
import sys
import threading
import webbrowser

from ..read.sources import is_manifest
from ..view import View, make_server, write_report
from .common import EXIT_OK, expand

__all__ = ["command"]


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def command(args: argparse.Namespace) -> int:
    """Serve until Ctrl-C (exit 0), or with ``--html`` write the report and return."""
    paths = expand([args.source])
    view = View(args.source if is_manifest(args.source) else paths, index_dir=args.index_dir)
    try:
        if args.html:
            files = write_report(view, args.html, title=args.source, pages=args.pages)
            print(f"wrote {len(files)} files to {args.html} (open {files[0]})")
            return EXIT_OK
        if not _loopback(args.host):
            print(
                f"tarindex view: warning: serving on {args.host}, not only this machine: anyone "
                "who can reach it can read the dataset",
                file=sys.stderr,
            )
        srv = make_server(view, args.host, args.port, title=args.source)
        host, port = str(srv.server_address[0]), int(srv.server_address[1])
        url = f"http://{host if ':' not in host else f'[{host}]'}:{port}/"
        try:  # Ctrl-C from the first line on stops cleanly
            print(
                f"serving {len(view)} samples of {args.source} at {url} (Ctrl-C stops)", flush=True
            )
            if args.open:
                threading.Thread(target=webbrowser.open, args=(url,), daemon=True).start()
            srv.serve_forever(poll_interval=0.2)
        except KeyboardInterrupt:
            print("tarindex view: stopped", file=sys.stderr)
        finally:
            srv.server_close()
        return EXIT_OK
    finally:
        view.close()
