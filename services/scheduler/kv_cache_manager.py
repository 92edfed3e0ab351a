"""Blocks per request: how many a request needs to hold its tokens, and getting or
returning them. Running out is a return value (None), never an exception."""

from __future__ import annotations

from services.scheduler.block_pool import BlockPool
from services.scheduler.request import Request


class KVCacheManager:
    def __init__(self, pool: BlockPool, block_size: int) -> None:
        self.pool = pool
        self.block_size = block_size

    def blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def allocate_slots(self, request: Request, num_new_tokens: int) -> list[int] | None:
        """Makes room for num_new_tokens more computed tokens. Returns the blocks appended to
        the request's table (possibly none), or None if the pool cannot supply them."""
        needed = self.blocks_for(request.num_computed_tokens + num_new_tokens)
        missing = needed - len(request.block_ids)
        if missing <= 0:
            return []
        if not self.pool.can_allocate(missing):
            return None
        new_blocks = self.pool.allocate(missing)
        request.block_ids.extend(new_blocks)
        return new_blocks

    def free(self, request: Request) -> None:
        self.pool.free(request.block_ids)
        request.block_ids = []
