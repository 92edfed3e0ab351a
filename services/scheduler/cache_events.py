"""What a worker's prefix cache tells the outside world: which block hashes it now holds and
which it dropped. A cluster-wide prefix index (Redis) listens, so that a router can send a
request to the worker that already holds most of its prefix."""

from __future__ import annotations

from typing import Protocol

from services.common.block_hash import BlockHash


class CacheEventListener(Protocol):
    """Called synchronously from the scheduler's step loop: implementations must not block
    (queue the events and publish them elsewhere)."""

    def blocks_stored(self, hashes: list[BlockHash]) -> None:
        """These blocks were computed and can now be reused by any request of this worker."""

    def blocks_removed(self, hashes: list[BlockHash]) -> None:
        """These blocks were evicted (their ids reused for other tokens) or lost with the
        worker; no request can reuse them any more."""
