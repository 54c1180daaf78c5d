"""persist's inside: nothing here is public API.

codec (framing, CRC-32C), state (a shard's metadata and its named
transitions), machine (the compare-and-set loop over consensus), retry (the
one backoff rule), parts (Parquet parts and runs), merge (compaction's merge
and its compare-and-set). Code outside ``persist`` uses the names exported
from ``persist`` itself (and the public modules ``persist.location``,
``persist.url``, ``persist.testing``), never this package.
"""
