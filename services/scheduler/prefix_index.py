"""Which worker holds which cached KV block, by block hash: the router's in-memory view.

A block hash is chained over every token before it (block_hash.py), so a worker's cached
prefix of a request is the run of the request's block hashes, from the first, that the worker
holds. Looking that up costs one dict probe per block and never leaves the process: the index
is filled from cache events (in-process, or from Redis by a background reader).
"""

from __future__ import annotations

from collections.abc import Iterable

from services.common.block_hash import BlockHash

WorkerKey = str  # "model@host:port": one replica of one model


def worker_key(model: str, address: str) -> WorkerKey:
    return f"{model}@{address}"


class PrefixIndex:
    def __init__(self) -> None:
        self._holders: dict[BlockHash, set[WorkerKey]] = {}
        self._blocks: dict[WorkerKey, set[BlockHash]] = {}

    def __len__(self) -> int:
        """Number of distinct block hashes held by any worker."""
        return len(self._holders)

    def blocks_of(self, worker: WorkerKey) -> set[BlockHash]:
        return set(self._blocks.get(worker, ()))

    def add(self, worker: WorkerKey, hashes: Iterable[BlockHash]) -> None:
        mine = self._blocks.setdefault(worker, set())
        for h in hashes:
            mine.add(h)
            self._holders.setdefault(h, set()).add(worker)

    def remove(self, worker: WorkerKey, hashes: Iterable[BlockHash]) -> None:
        mine = self._blocks.get(worker)
        if mine is None:
            return
        for h in hashes:
            mine.discard(h)
            holders = self._holders.get(h)
            if holders is not None:
                holders.discard(worker)
                if not holders:
                    del self._holders[h]

    def replace(self, worker: WorkerKey, hashes: Iterable[BlockHash]) -> None:
        """The worker's full state (after a resync): exactly these blocks."""
        self.drop(worker)
        self.add(worker, hashes)

    def drop(self, worker: WorkerKey) -> None:
        """Forgets a worker (dead, restarted, or its entries expired)."""
        self.remove(worker, list(self._blocks.get(worker, ())))
        self._blocks.pop(worker, None)

    def clear(self) -> None:
        self._holders.clear()
        self._blocks.clear()

    def prefix_blocks(self, hashes: list[BlockHash]) -> dict[WorkerKey, int]:
        """For each worker holding the first block, how many leading blocks of `hashes` it
        holds. Workers holding none are absent. Cost: one probe per block of the longest
        match."""
        matched: dict[WorkerKey, int] = {}
        alive: set[WorkerKey] = set()
        for i, h in enumerate(hashes):
            holders = self._holders.get(h, set())
            if i == 0:
                alive = set(holders)
            else:
                for worker in alive - holders:
                    matched[worker] = i
                alive &= holders
            if not alive:
                break
        for worker in alive:
            matched[worker] = len(hashes)
        return matched
