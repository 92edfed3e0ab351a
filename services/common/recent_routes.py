"""Blocks a replica is about to cache because the router just sent it a request holding them.

Cache events arrive only once a block is computed, so without this a burst of requests sharing
a new system prompt would see it cached nowhere and spread over every replica, each computing
it. Remembering for a short while where each prefix was sent keeps the burst together; the
entries expire on their own (the real cache events take over, or the blocks were never kept).
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable

from services.common.block_hash import BlockHash

WorkerKey = str  # whatever a caller routes to: a worker (model@host:port), a scheduler replica

Clock = Callable[[], float]


class RecentRoutes:
    def __init__(
        self, horizon_s: float = 10.0, max_blocks: int = 1 << 16, clock: Clock = time.monotonic
    ) -> None:
        self.horizon_s = horizon_s
        self.max_blocks = max_blocks  # per worker: bounds memory under a flood of new prompts
        self._clock = clock
        self._expiry: dict[WorkerKey, OrderedDict[BlockHash, float]] = {}

    def record(self, worker: WorkerKey, hashes: list[BlockHash]) -> None:
        entries = self._expiry.setdefault(worker, OrderedDict())
        deadline = self._clock() + self.horizon_s
        for h in hashes:
            entries[h] = deadline
            entries.move_to_end(h)
        while len(entries) > self.max_blocks:
            entries.popitem(last=False)

    def prefix_blocks(self, worker: WorkerKey, hashes: list[BlockHash]) -> int:
        """How many leading blocks of `hashes` were routed to the worker within the horizon."""
        entries = self._expiry.get(worker)
        if not entries:
            return 0
        now = self._clock()
        for i, h in enumerate(hashes):
            deadline = entries.get(h)
            if deadline is None or deadline <= now:
                return i
        return len(hashes)

    def forget(self, worker: WorkerKey) -> None:
        """The replica lost its cache (disconnected): nothing sent to it is cached anymore."""
        self._expiry.pop(worker, None)

    def expire(self) -> None:
        """Drops entries past their deadline (oldest first: they are kept in record order)."""
        now = self._clock()
        for entries in self._expiry.values():
            while entries:
                block, deadline = next(iter(entries.items()))
                if deadline > now:
                    break
                del entries[block]
