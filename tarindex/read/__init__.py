"""The read path: ShardReader, ShardSet, Block, the read kernel, sources, manifests."""
