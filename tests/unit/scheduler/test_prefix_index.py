"""The prefix-cache index: in memory, and shared through a real Redis (writer -> reader)."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import uuid
from collections.abc import AsyncIterator

import pytest
import redis.asyncio as aioredis

from services.scheduler.block_pool import BlockPool
from services.scheduler.cache_publisher import CachePublisher
from services.scheduler.cache_reader import PrefixIndexReader
from services.scheduler.prefix_index import PrefixIndex
from services.scheduler.prefix_store import Batch, PrefixStore
from tests.unit.scheduler.replicas import wait_until

WORKER = "m@127.0.0.1:1"


def h(i: int) -> bytes:
    return hashlib.blake2b(str(i).encode(), digest_size=16).digest()


def test_prefix_blocks_counts_each_workers_leading_run():
    index = PrefixIndex()
    index.add("a", [h(0), h(1), h(2)])
    index.add("b", [h(0), h(2), h(3)])  # lost h(1): h(2) is of no use to a request
    assert index.prefix_blocks([h(0), h(1), h(2), h(3)]) == {"a": 3, "b": 1}
    index.remove("a", [h(1)])
    assert index.prefix_blocks([h(0), h(1), h(2)]) == {"a": 1, "b": 1}
    index.drop("b")
    assert index.prefix_blocks([h(0)]) == {"a": 1} and len(index) == 2


@pytest.fixture
async def store(redis_url: str) -> AsyncIterator[PrefixStore]:
    client = aioredis.Redis.from_url(redis_url)
    yield PrefixStore(client, ttl_s=5.0, namespace=f"test:{uuid.uuid4().hex}")
    await client.aclose()


@contextlib.asynccontextmanager
async def running(*coroutines) -> AsyncIterator[list[asyncio.Task]]:
    tasks = [asyncio.ensure_future(c) for c in coroutines]
    try:
        yield tasks
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def cache_blocks(pool: BlockPool, first: int, count: int) -> None:
    """What the scheduler does when a step computed `count` full blocks of a request."""
    blocks = pool.allocate(count)
    pool.cache(blocks, [h(i) for i in range(first, first + count)])
    pool.free(blocks)


async def test_events_are_batched_and_read_back(store: PrefixStore):
    pool = BlockPool(64)
    publisher = CachePublisher(store, lambda: {WORKER: pool.cached_hashes}, heartbeat_s=1.0)
    reader = PrefixIndexReader(store, lambda: [WORKER], check_s=0.1)
    pool.listener = publisher.log_for(WORKER)
    cache_blocks(pool, 0, 40)
    async with running(publisher.run(), reader.run()):
        await wait_until(lambda: reader.index.blocks_of(WORKER) == {h(i) for i in range(40)})
        for step in range(5):  # one engine step's events, several calls: one write
            cache_blocks(pool, 40 + 4 * step, 4)
        await wait_until(lambda: len(reader.index.blocks_of(WORKER)) == 60)
        cache_blocks(pool, 100, 10)  # 4 plain free blocks left: evicts 6 cached ones
        expected = set(pool.cached_hashes())
        await wait_until(lambda: reader.index.blocks_of(WORKER) == expected)
        assert len(expected) == 64 and h(0) not in expected
    # The full state, then one batch per burst: not one round trip per block.
    assert await store.client.xlen(store.key(WORKER, "events")) == 3
    assert set(await store.client.smembers(store.key(WORKER, "blocks"))) == expected


async def test_a_gap_in_sequence_numbers_makes_the_reader_resync(store: PrefixStore):
    await store.write([Batch(WORKER, "e1", 1, [h(0), h(1)], full=True)])
    reader = PrefixIndexReader(store, lambda: [WORKER], check_s=60)
    async with running(reader.run()):
        await wait_until(lambda: reader.index.blocks_of(WORKER) == {h(0), h(1)})
        resyncs = reader.num_resyncs
        # Batch 2 never reaches the stream (as if trimmed away) but is in the set; batch 3 is.
        await store.client.sadd(store.key(WORKER, "blocks"), h(2))
        await store.client.srem(store.key(WORKER, "blocks"), h(0))
        await store.write([Batch(WORKER, "e1", 3, [h(3)])])
        await wait_until(lambda: reader.index.blocks_of(WORKER) == {h(1), h(2), h(3)})
        assert reader.num_resyncs == resyncs + 1
        await store.write([Batch(WORKER, "e1", 4, removed=[h(1)])])  # back in step
        await wait_until(lambda: reader.index.blocks_of(WORKER) == {h(2), h(3)})
        assert reader.num_resyncs == resyncs + 1


async def test_entries_vanish_after_the_ttl_once_the_heartbeat_stops(redis_url: str):
    client = aioredis.Redis.from_url(redis_url)
    store = PrefixStore(client, ttl_s=0.6, namespace=f"test:{uuid.uuid4().hex}")
    pool = BlockPool(16)
    publisher = CachePublisher(store, lambda: {WORKER: pool.cached_hashes}, heartbeat_s=0.2)
    pool.listener = publisher.log_for(WORKER)
    cache_blocks(pool, 0, 8)
    reader = PrefixIndexReader(store, lambda: [WORKER], check_s=0.05)
    async with running(reader.run()):
        async with running(publisher.run()):
            await wait_until(lambda: len(reader.index.blocks_of(WORKER)) == 8)
            await asyncio.sleep(1.5)  # well past the TTL: the heartbeat keeps them
            assert len(reader.index.blocks_of(WORKER)) == 8
        await wait_until(lambda: not reader.index.blocks_of(WORKER), timeout_s=3.0)
    assert await client.exists(store.key(WORKER, "blocks"), store.key(WORKER, "meta")) == 0
    await client.aclose()


async def test_a_reader_with_no_worker_to_follow_leaves_the_event_loop_free(store: PrefixStore):
    reader = PrefixIndexReader(store, lambda: [], check_s=0.01, block_ms=50)
    async with running(reader.run()):
        await wait_until(lambda: reader.healthy)
        started = asyncio.get_running_loop().time()
        await asyncio.sleep(0.01)
        assert asyncio.get_running_loop().time() - started < 0.2
