"""Blocks per request: how many a request needs to hold its tokens, getting or returning them,
and the prefix cache seen from a request (which of its blocks are already computed somewhere,
and which of its own blocks to offer to later requests). Running out is a return value (None),
never an exception."""

from __future__ import annotations

from services.scheduler.block_hash import BlockHash, block_hashes
from services.scheduler.block_pool import BlockPool
from services.scheduler.request import Request


class KVCacheManager:
    def __init__(self, pool: BlockPool, block_size: int, model_fingerprint: str = "") -> None:
        self.pool = pool
        self.block_size = block_size
        self.model_fingerprint = model_fingerprint  # part of every hash: models never share

    def blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def find_cached_prefix(self, request: Request) -> list[int]:
        """The cached blocks holding the longest prefix of the request's known tokens, for a
        request that holds no blocks. Takes no reference (allocate_slots does).

        At least one token is always left to compute (the step must sample from it), so when
        every full block is cached the last one is not reused: it is recomputed into a fresh
        block rather than written into a block other requests read."""
        hashes = self._hashes(request)
        usable = (request.num_tokens - 1) // self.block_size
        blocks = []
        for block_hash in hashes[:usable]:
            block = self.pool.cached_block(block_hash)
            if block is None:
                break
            blocks.append(block)
        return blocks

    def allocate_slots(
        self, request: Request, num_new_tokens: int, cached_blocks: list[int] | None = None
    ) -> list[int] | None:
        """Makes room for num_new_tokens more computed tokens. Returns the fresh blocks appended
        to the request's table (possibly none), or None if the pool cannot supply them.

        cached_blocks (from find_cached_prefix) start the table of a request that holds none;
        their tokens are computed already, and the caller advances num_computed_tokens."""
        cached = cached_blocks or []
        num_computed = request.num_computed_tokens + len(cached) * self.block_size
        missing = self.blocks_for(num_computed + num_new_tokens) - len(request.block_ids)
        missing -= len(cached)
        # Reused blocks nobody holds leave the evictable set, so they count against the pool.
        revived = sum(1 for block in cached if self.pool.ref_count(block) == 0)
        if not self.pool.can_allocate(max(missing, 0) + revived):
            return None
        if cached:
            self.pool.touch(cached)
            request.block_ids.extend(cached)
            request.num_cached_blocks = len(cached)
        if missing <= 0:
            return []
        new_blocks = self.pool.allocate(missing)
        request.block_ids.extend(new_blocks)
        return new_blocks

    def cache_computed(self, request: Request) -> None:
        """Offers the request's full, computed blocks to later requests. Call only after the
        step that computed them has returned: a cached block may be read at once."""
        num_full = request.num_computed_tokens // self.block_size
        first = request.num_cached_blocks
        if num_full <= first:
            return
        hashes = self._hashes(request)
        self.pool.cache(request.block_ids[first:num_full], hashes[first:num_full])
        request.num_cached_blocks = num_full

    def free(self, request: Request) -> None:
        # Last block first: among the request's cached blocks its tail is then evicted before
        # its head, which every longer prefix sharing it needs.
        self.pool.free(reversed(request.block_ids))
        request.block_ids = []
        request.num_cached_blocks = 0

    def cached_hashes(self) -> list[BlockHash]:
        return self.pool.cached_hashes()

    def drop_cache(self) -> None:
        self.pool.drop_cache()

    def _hashes(self, request: Request) -> list[BlockHash]:
        """request.block_hashes, extended to every full block of its known tokens (computed
        once per block: a router may have filled them already)."""
        hashes = request.block_hashes
        num_full = request.num_tokens // self.block_size
        if len(hashes) < num_full:
            parent = hashes[-1] if hashes else None
            tokens = request.all_token_ids[: num_full * self.block_size]
            hashes += block_hashes(
                tokens, self.block_size, self.model_fingerprint, start=len(hashes), parent=parent
            )
        return hashes
