"""``python -m tarindex``: the ``tarindex`` command (see :mod:`tarindex.cli`)."""

import sys

from .cli.main import main

if __name__ == "__main__":
    sys.exit(main())
