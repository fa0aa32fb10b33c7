"""The ``tarindex`` command line."""
