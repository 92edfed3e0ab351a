"""BlockPool: reference counts, the hash -> block map and the eviction order, by exact ids."""

from __future__ import annotations

from services.scheduler.block_pool import BlockPool
from tests.unit.scheduler.drive import RecordingListener

H = [bytes([i]) * 16 for i in range(8)]  # stand-in block hashes


def test_plain_free_blocks_go_first_then_cached_ones_least_recently_freed_first():
    events = RecordingListener()
    pool = BlockPool(4, events)
    assert pool.allocate(4) == [0, 1, 2, 3]
    pool.cache([0, 1, 2], H[:3])
    pool.free([3, 2, 1, 0])  # a request's blocks, last first
    assert pool.num_free == 4 and pool.num_cached == 3
    assert pool.allocate(1) == [3]  # the uncached block: nothing evicted
    assert events.events == [("stored", H[:3])]
    assert pool.allocate(2) == [2, 1]  # the request's tail goes before its head
    assert events.events[-1] == ("removed", [H[2], H[1]])
    assert pool.cached_block(H[0]) == 0
    assert pool.cached_block(H[1]) is None and pool.cached_block(H[2]) is None
    assert pool.cached_hashes() == [H[0]]


def test_a_reused_cached_block_cannot_be_evicted_until_its_last_holder_frees_it():
    pool = BlockPool(2)
    pool.allocate(2)
    pool.cache([0], H[:1])
    pool.free([1, 0])
    pool.touch([0])  # two requests share block 0
    pool.touch([0])
    assert pool.ref_count(0) == 2 and pool.num_free == 1
    assert pool.allocate(1) == [1]
    assert not pool.can_allocate(1)
    pool.free([0])
    assert not pool.can_allocate(1)  # still held once
    pool.free([0])
    assert pool.num_free == 1 and pool.cached_block(H[0]) == 0


def test_a_hash_cached_twice_keeps_the_first_block_and_the_other_is_plain_free():
    events = RecordingListener()
    pool = BlockPool(3, events)
    pool.allocate(2)  # two requests computed the same block at once
    pool.cache([0], H[:1])
    pool.cache([1], H[:1])
    assert pool.cached_block(H[0]) == 0
    assert events.events == [("stored", H[:1])]
    pool.free([1])
    pool.free([0])
    assert pool.allocate(2) == [2, 1]  # block 1 was never cached: reused before evicting 0
    assert pool.cached_block(H[0]) == 0


def test_dropping_the_cache_reports_every_hash_and_frees_the_evictable_blocks():
    events = RecordingListener()
    pool = BlockPool(3, events)
    pool.allocate(3)
    pool.cache([0, 1], H[:2])
    pool.free([0])
    pool.drop_cache()
    assert events.events[-1] == ("removed", H[:2])
    assert pool.cached_hashes() == [] and pool.num_free == 1
    pool.free([2, 1])
    assert pool.num_free == 3
    assert pool.allocate(3) == [0, 2, 1]  # no eviction events: nothing was cached any more
    assert len(events.events) == 2
