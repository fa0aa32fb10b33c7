"""Pure bytes <-> objects: tar headers, the sidecar index layout, sample keys. No file IO, no torch."""
