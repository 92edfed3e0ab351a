"""Blocks per request: how many a request needs to hold its tokens, getting or returning them,
and the prefix cache seen from a request (which of its blocks are already computed somewhere,
and which of its own blocks to offer to later requests). Running out is a return value (None),
never an exception.

KV cache groups: a worker's layers come in G >= 1 groups (WorkerInfo.kv_cache_groups), each
with its own block table per request, every table drawing from the one BlockPool. A group
attends either to every earlier token (window None) or to a sliding window of W tokens: a query
at position p reads keys p-W+1..p only. Once a request has computed c tokens, its blocks wholly
before c-W+1 are never read again, so a sliding group drops them (-1 in its table) and returns
them to the pool, where a cached one stays reusable by the prefix cache. The tables grow in
lockstep: each has one entry per block of the request's tokens, dropped entries included.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable

from services.common.block_hash import BlockHash, block_hashes
from services.scheduler.block_pool import BlockPool
from services.scheduler.request import Request

DROPPED = -1  # a block table entry a sliding-window group no longer holds (the wire's -1)

Windows = tuple[int | None, ...]  # per KV cache group: the sliding window, None = every token


def group_windows(sliding_windows: Iterable[int]) -> Windows:
    """The windows of a worker's KV cache groups, from their KVCacheGroup.sliding_window
    values (0: the group attends to every earlier token). No groups: one group, no window."""
    return tuple(window or None for window in sliding_windows) or (None,)


def token_capacity(num_blocks: int, block_size: int, windows: Windows, max_chunk: int) -> int:
    """The longest sequence (prompt and completion) one request can hold alone in a pool of
    num_blocks blocks. It holds every block of its tokens in a full-attention group, but in a
    sliding-window group at most the blocks of one window plus one step's chunk (max_chunk
    tokens, the scheduler's max_num_batched_tokens), and one more where the window starts
    mid-block."""
    caps = [_window_cap(w, block_size, max_chunk) for w in windows]

    def blocks_held(blocks_per_table: int) -> int:
        return sum(blocks_per_table if cap is None else min(blocks_per_table, cap) for cap in caps)

    if None not in caps and blocks_held(max(caps)) <= num_blocks:
        return sys.maxsize  # every group is windowed: any length fits, max_model_len bounds it
    # The longest table that fits, by bisection. With a full-attention group a table never
    # exceeds the pool; with none, past the largest cap no table grows any more.
    lo, hi = 0, num_blocks if None in caps else max(caps)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if blocks_held(mid) <= num_blocks:
            lo = mid
        else:
            hi = mid - 1
    return lo * block_size


class KVCacheManager:
    def __init__(
        self,
        pool: BlockPool,
        block_size: int,
        model_fingerprint: str = "",
        windows: Windows = (None,),
    ) -> None:
        self.pool = pool
        self.block_size = block_size
        self.model_fingerprint = model_fingerprint  # part of every hash: models never share
        self.windows = tuple(windows)  # one per KV cache group, group 0 first

    def blocks_for(self, num_tokens: int) -> int:
        return _ceil_div(num_tokens, self.block_size)

    def empty_tables(self) -> list[list[int]]:
        """One empty block table per group: no cached prefix."""
        return [[] for _ in self.windows]

    def num_held_blocks(self, request: Request) -> int:
        """Blocks the request references, every group together (dropped entries excluded)."""
        return sum(block != DROPPED for table in request.block_tables for block in table)

    def can_start(self, request: Request, cached: list[list[int]], max_chunk: int) -> bool:
        """Whether the free blocks can hold every known token of a waiting request (its whole
        prefill, in chunks of up to max_chunk tokens), cached blocks counted as held.

        Starting a request on its first chunk's blocks alone lets several long prompts start
        at once and then preempt one another chunk after chunk, each losing its progress."""
        size = self.blocks_for(request.num_tokens)
        num_cached = len(cached[0]) * self.block_size
        need = 0
        for window in self.windows:
            blocks = size - self._first_needed(num_cached, window)  # none behind the window
            cap = _window_cap(window, self.block_size, max_chunk)
            need += blocks if cap is None else min(blocks, cap)
        # Cached blocks others hold take nothing from the pool; evictable ones are in num_free.
        shared = sum(1 for t in cached for b in t if b != DROPPED and self.pool.ref_count(b) > 0)
        return self.pool.num_free >= need - shared

    def find_cached_prefix(self, request: Request) -> list[list[int]]:
        """The block tables (one per group, each with one entry per block) of the longest
        cached prefix of the request's known tokens, for a request that holds no blocks. Takes
        no reference (allocate_slots does).

        At least one token is always left to compute (the step must sample from it), so when
        every full block is cached the last one is not reused: it is recomputed into a fresh
        block rather than written into a block other requests read.

        A prefix of k blocks needs all k in a full-attention group, but in a sliding-window
        group only those the window of its first recomputed token reaches; the entries before
        are -1. The longest prefix every group can serve may be shorter than group 0's."""
        usable = (request.num_tokens - 1) // self.block_size
        hashes = self._hashes(request)[:usable]
        found = [
            [self.pool.cached_block(block_hash, group) for block_hash in hashes]
            for group in range(len(self.windows))
        ]
        servable = [
            self._servable(blocks, w) for blocks, w in zip(found, self.windows, strict=True)
        ]
        k = max(k for k in range(len(hashes) + 1) if all(s[k] for s in servable))
        tables = []
        for blocks, window in zip(found, self.windows, strict=True):
            first = self._first_needed(k * self.block_size, window)
            tables.append([DROPPED] * first + blocks[first:k])
        return tables

    def allocate_slots(
        self, request: Request, num_new_tokens: int, cached_blocks: list[list[int]] | None = None
    ) -> list[list[int]] | None:
        """Makes room for num_new_tokens more computed tokens: first returns to the pool the
        blocks sliding-window groups no longer read, then appends fresh blocks to every table.
        Returns the fresh blocks per group (possibly none), or None if the pool cannot supply
        them.

        cached_blocks (from find_cached_prefix) start the tables of a request that holds none;
        their tokens are computed already, and the caller advances num_computed_tokens."""
        self._drop_unread(request)
        prefix = cached_blocks or self.empty_tables()
        tables = request.block_tables or prefix
        num_computed = request.num_computed_tokens + len(prefix[0]) * self.block_size
        num_blocks = self.blocks_for(num_computed + num_new_tokens)
        missing = [max(num_blocks - len(table), 0) for table in tables]
        # Reused blocks nobody holds leave the evictable set, so they count against the pool.
        reused = [block for table in prefix for block in table if block != DROPPED]
        revived = sum(1 for block in reused if self.pool.ref_count(block) == 0)
        if not self.pool.can_allocate(sum(missing) + revived):
            return None
        if not request.block_tables:
            self.pool.touch(reused)
            request.block_tables = [list(table) for table in prefix]
            request.num_cached_blocks = len(prefix[0])
        new_blocks = [self.pool.allocate(count) for count in missing]
        for table, blocks in zip(request.block_tables, new_blocks, strict=True):
            table.extend(blocks)
        return new_blocks

    def cache_computed(self, request: Request, num_computed: int | None = None) -> None:
        """Offers the request's full, computed blocks to later requests, in every group (a
        dropped entry has nothing to offer). Call only after the step that computed them has
        returned: a cached block may be read at once. num_computed: the tokens computed once
        that step ran (default: request.num_computed_tokens, when no later step is in flight)."""
        if num_computed is None:
            num_computed = request.num_computed_tokens
        num_full = num_computed // self.block_size
        first = request.num_cached_blocks
        if num_full <= first:
            return
        hashes = self._hashes(request)[first:num_full]
        for group, table in enumerate(request.block_tables):
            kept = [
                (b, h) for b, h in zip(table[first:num_full], hashes, strict=True) if b != DROPPED
            ]
            self.pool.cache([b for b, _ in kept], [h for _, h in kept], group)
        request.num_cached_blocks = num_full

    def trim(self, request: Request) -> None:
        """Returns to the pool, last first, the blocks wholly beyond the request's computed
        tokens: those allocated for proposed tokens the worker rejected (speculative decoding).
        None of them is cached: only verified tokens' blocks are."""
        keep = self.blocks_for(request.num_computed_tokens)
        assert request.num_cached_blocks <= keep, "trimming a cached block"
        for table in request.block_tables:
            self.pool.free(block for block in reversed(table[keep:]) if block != DROPPED)
            del table[keep:]

    def free(self, request: Request) -> None:
        # Last block first, every group's block at a position together: among the request's
        # cached blocks its tail is then evicted before its head, which every longer prefix
        # sharing it needs.
        positions = reversed(list(zip(*request.block_tables, strict=True)))
        self.pool.free(block for row in positions for block in row if block != DROPPED)
        request.block_tables = []
        request.num_cached_blocks = 0

    def cached_hashes(self) -> list[BlockHash]:
        """Group 0's cached hashes: one per cached prefix block."""
        return self.pool.cached_hashes()

    def drop_cache(self) -> None:
        self.pool.drop_cache()

    def _first_needed(self, num_computed: int, window: int | None) -> int:
        """The first block a query at position num_computed reads in a group with `window`."""
        if window is None:
            return 0
        return max(0, (num_computed - window + 1) // self.block_size)

    def _servable(self, blocks: list[int | None], window: int | None) -> list[bool]:
        """For each prefix of k = 0..len(blocks) blocks: whether a group with `window` has every
        block a request restarting after it reads (blocks: the group's cached block for each
        hash, None where it has none)."""
        servable = [True]
        run = 0  # cached blocks in a row, ending with block k - 1
        for k, block in enumerate(blocks, start=1):
            run = run + 1 if block is not None else 0
            servable.append(run >= k - self._first_needed(k * self.block_size, window))
        return servable

    def _drop_unread(self, request: Request) -> None:
        """Returns to the pool the blocks of sliding-window groups wholly before the window of
        the request's next query (at num_computed_tokens): no query reads them again."""
        if not request.block_tables:
            return
        for table, window in zip(request.block_tables, self.windows, strict=True):
            end = self._first_needed(request.num_computed_tokens, window)
            start = end
            while start > 0 and table[start - 1] != DROPPED:  # dropped entries are a prefix
                start -= 1
            self.pool.free(reversed(table[start:end]))
            table[start:end] = [DROPPED] * (end - start)

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


def _window_cap(window: int | None, block_size: int, max_chunk: int) -> int | None:
    """The most blocks a sliding-window group holds for one request: one window and one step's
    chunk, plus one where the window starts mid-block. None: a full group holds every block."""
    if window is None:
        return None
    return _ceil_div(window - 1 + max_chunk, block_size) + 1


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)
