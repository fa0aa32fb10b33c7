"""Where a shard's and an index's bytes come from: mmap, pread, remote (fsspec), cache."""
