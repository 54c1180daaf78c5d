"""The storage conformance suite (:mod:`persist.testing`) on every backend and wrapper.

``TestBackends`` runs it on mem, file, s3 (moto) and SeaweedFS (a real S3
server), opened by URL (``location_url``: each test once per backend). The wrapper classes run it
through :mod:`persist.unreliable` (with no fault set) on each backend again:
a wrapper must keep the contract and declare the capabilities of what it
wraps (the suite skips by those flags, so a wrapper that lost S3's would
fail there).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from persist.location import Blob, Consensus
from persist.testing import BlobConformance, ConsensusConformance, location_clients
from persist.unreliable import (
    CountingBlob,
    CountingConsensus,
    Faults,
    UnreliableBlob,
    UnreliableConsensus,
)
from tests.seaweedfs import STORE_KINDS


@pytest.mark.parametrize("location_url", STORE_KINDS, indirect=True)
class TestBackends(BlobConformance, ConsensusConformance):
    @pytest.fixture
    def blob_factory(self, location_url: str) -> Iterator[Callable[[], Blob]]:
        with location_clients(location_url) as new:
            yield lambda: new().blob

    @pytest.fixture
    def consensus_factory(self, location_url: str) -> Iterator[Callable[[], Consensus]]:
        with location_clients(location_url) as new:
            yield lambda: new().consensus


class TestUnreliableWrappers(BlobConformance, ConsensusConformance):
    @pytest.fixture
    def blob_factory(self, location_url: str) -> Iterator[Callable[[], Blob]]:
        faults = Faults(seed=1)  # no rates set: nothing fails
        with location_clients(location_url) as new:
            yield lambda: UnreliableBlob(new().blob, faults)

    @pytest.fixture
    def consensus_factory(self, location_url: str) -> Iterator[Callable[[], Consensus]]:
        faults = Faults(seed=1)
        with location_clients(location_url) as new:
            yield lambda: UnreliableConsensus(new().consensus, faults)


class TestCountingWrappers(BlobConformance, ConsensusConformance):
    @pytest.fixture
    def blob_factory(self, location_url: str) -> Iterator[Callable[[], Blob]]:
        with location_clients(location_url) as new:
            yield lambda: CountingBlob(new().blob)

    @pytest.fixture
    def consensus_factory(self, location_url: str) -> Iterator[Callable[[], Consensus]]:
        with location_clients(location_url) as new:
            yield lambda: CountingConsensus(new().consensus)
