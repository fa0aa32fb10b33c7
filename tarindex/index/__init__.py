"""Indexing existing tars: the header walk (scan) and the index build."""
