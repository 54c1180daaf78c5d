"""txns: atomic multi-shard transactions over persist (see txns/README in design.md)."""
