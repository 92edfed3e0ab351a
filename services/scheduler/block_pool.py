"""The KV blocks of one worker, by id. The scheduler owns this accounting; the worker only
stores what it is told to store where it is told."""

from __future__ import annotations

from collections import deque


class BlockPool:
    def __init__(self, num_blocks: int) -> None:
        if num_blocks <= 0:
            raise ValueError(f"a worker needs at least one KV block, got {num_blocks}")
        self.num_blocks = num_blocks
        self._free: deque[int] = deque(range(num_blocks))

    @property
    def num_free(self) -> int:
        return len(self._free)

    def can_allocate(self, count: int) -> bool:
        return count <= len(self._free)

    def allocate(self, count: int) -> list[int]:
        if not self.can_allocate(count):
            raise RuntimeError(f"asked for {count} blocks with {len(self._free)} free")
        return [self._free.popleft() for _ in range(count)]

    def free(self, block_ids: list[int]) -> None:
        self._free.extend(block_ids)
        assert len(self._free) <= self.num_blocks, "a block was freed twice"
