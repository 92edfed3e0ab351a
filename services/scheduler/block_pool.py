"""The KV blocks of one worker, by id. The scheduler owns this accounting; the worker only
stores what it is told to store where it is told.

A block is in one of three places:
- held: one or more requests reference it (ref count > 0);
- free: unreferenced and holding nothing worth keeping;
- evictable: unreferenced but cached (its hash is known, so a later request with the same
  prefix can take it back as is), in least-recently-freed order.

Allocation takes plain free blocks first and evicts cached ones, oldest first, only when no
plain block is left, so the cache keeps everything it can until memory is actually needed.

A worker with several KV cache groups (kv_cache_manager.py) draws every group's blocks from this
one pool. The same tokens have a different block in each group, so the cache is keyed by
(group, hash). Only group 0's blocks are reported to the listener: the cluster's prefix index
needs one entry per prefix, not one per group.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Iterable

from services.common.block_hash import BlockHash
from services.scheduler.cache_events import CacheEventListener

CacheKey = tuple[int, BlockHash]  # (KV cache group, block hash)


class BlockPool:
    def __init__(self, num_blocks: int, listener: CacheEventListener | None = None) -> None:
        if num_blocks <= 0:
            raise ValueError(f"a worker needs at least one KV block, got {num_blocks}")
        self.num_blocks = num_blocks
        self.listener = listener
        self._free: deque[int] = deque(range(num_blocks))
        self._refs = [0] * num_blocks
        self._block_of: dict[CacheKey, int] = {}
        self._key_of: dict[int, CacheKey] = {}
        self._evictable: OrderedDict[int, None] = OrderedDict()  # least recently freed first

    @property
    def num_free(self) -> int:
        """Blocks an allocation can get: free ones and cached ones nobody references."""
        return len(self._free) + len(self._evictable)

    @property
    def num_cached(self) -> int:
        return len(self._block_of)

    def ref_count(self, block_id: int) -> int:
        return self._refs[block_id]

    def can_allocate(self, count: int) -> bool:
        return count <= self.num_free

    def allocate(self, count: int) -> list[int]:
        """Fresh blocks, each referenced once. Evicts cached blocks only when needed."""
        if not self.can_allocate(count):
            raise RuntimeError(f"asked for {count} blocks with {self.num_free} free")
        blocks, evicted = [], []
        for _ in range(count):
            if self._free:
                block = self._free.popleft()
            else:
                block, _ = self._evictable.popitem(last=False)
                evicted.append(self._uncache(block))
            self._refs[block] = 1
            blocks.append(block)
        self._report_removed(evicted)
        return blocks

    def free(self, block_ids: Iterable[int]) -> None:
        """Drops one reference from each block, in the order given: unreferenced cached blocks
        join the eviction order at its most-recent end, others the free list."""
        for block in block_ids:
            self._refs[block] -= 1
            assert self._refs[block] >= 0, f"block {block} was freed twice"
            if self._refs[block] > 0:
                continue
            if block in self._key_of:
                self._evictable[block] = None
            else:
                self._free.append(block)

    # -- the cache -------------------------------------------------------------------------

    def cached_block(self, block_hash: BlockHash, group: int = 0) -> int | None:
        return self._block_of.get((group, block_hash))

    def touch(self, block_ids: Iterable[int]) -> None:
        """Takes a reference on cached blocks a request reuses; they can no longer be evicted."""
        for block in block_ids:
            if self._refs[block] == 0:
                del self._evictable[block]
            self._refs[block] += 1

    def cache(self, block_ids: list[int], hashes: list[BlockHash], group: int = 0) -> None:
        """Makes held, fully computed blocks of a KV cache group reusable under their hashes.
        A hash already cached in another block (two requests computed the same prefix at once)
        keeps that block; this one stays private and returns to the free list when released."""
        stored = []
        for block, block_hash in zip(block_ids, hashes, strict=True):
            assert self._refs[block] > 0, f"caching block {block} that nobody holds"
            key = (group, block_hash)
            if key in self._block_of or block in self._key_of:
                continue
            self._block_of[key] = block
            self._key_of[block] = key
            stored.append(block_hash)
        if stored and group == 0 and self.listener is not None:
            self.listener.blocks_stored(stored)

    def cached_hashes(self) -> list[BlockHash]:
        """Every group-0 hash the pool can serve now (for a listener that lost track and
        resyncs)."""
        return [block_hash for group, block_hash in self._block_of if group == 0]

    def drop_cache(self) -> None:
        """Forgets every cached block (the worker's KV cache is gone): evictable blocks become
        plain free blocks, held ones will be when released."""
        dropped = list(self._block_of)
        self._block_of.clear()
        self._key_of.clear()
        self._free.extend(self._evictable)
        self._evictable.clear()
        self._report_removed(dropped)

    def _uncache(self, block: int) -> CacheKey:
        key = self._key_of.pop(block)
        del self._block_of[key]
        return key

    def _report_removed(self, keys: list[CacheKey]) -> None:
        hashes = [block_hash for group, block_hash in keys if group == 0]
        if hashes and self.listener is not None:
            self.listener.blocks_removed(hashes)
