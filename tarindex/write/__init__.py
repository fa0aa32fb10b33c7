"""Writing shards and their indexes: TarWriter, ShardWriter, parallel writes, pack."""
