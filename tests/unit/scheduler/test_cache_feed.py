"""Routing through the Redis-fed index while Redis dies and comes back."""

from __future__ import annotations

import time

import redis.asyncio as aioredis

from services.scheduler.engine import Engine
from services.scheduler.prefix_index import worker_key
from tests.redis_server import RedisServer
from tests.unit.scheduler.replicas import MODEL, routed_cluster, serve, submit, wait_until

SYSTEM_A = list(range(100, 164))
SYSTEM_B = list(range(1000, 1064))


def cached(engine: Engine) -> set[bytes]:
    assert engine.scheduler is not None
    return set(engine.scheduler.kv.cached_hashes())


async def test_routing_outlives_redis_and_the_index_is_rebuilt_when_it_returns(
    redis_server: RedisServer,
):
    router, feed = routed_cluster(["a:1", "b:1"], redis_url=redis_server.url, ttl_s=2.0)
    a, b = router.engines
    key_a, key_b = worker_key(MODEL, "a:1"), worker_key(MODEL, "b:1")
    assert feed.reader is not None
    reader = feed.reader
    feed.start()
    try:
        serve(b, "warm-b", SYSTEM_B + [1])
        await wait_until(lambda: reader.healthy and reader.index.blocks_of(key_b) == cached(b))
        assert feed.view() is reader.index

        redis_server.stop()
        started = time.monotonic()
        assert submit(router, "r1", SYSTEM_B + [2]) is b  # nothing on the request path waits
        assert time.monotonic() - started < 0.05
        serve(a, "warm-a", SYSTEM_A + [1])  # cache events while Redis is down
        await wait_until(lambda: not reader.healthy)
        assert feed.view() is feed.local  # the in-process view takes over
        assert submit(router, "r2", SYSTEM_A + [3]) is a
        assert submit(router, "r3", SYSTEM_B + [3]) is b

        redis_server.start()  # empty: the writer republishes, the reader resyncs
        await wait_until(
            lambda: (
                reader.healthy
                and reader.index.blocks_of(key_a) == cached(a)
                and reader.index.blocks_of(key_b) == cached(b)
            ),
            timeout_s=15,
        )
        assert feed.view() is reader.index
        client = aioredis.Redis.from_url(redis_server.url)
        stored = await client.smembers(f"layerserve:prefix:{key_a}:blocks")
        await client.aclose()
        assert set(stored) == cached(a)
        assert submit(router, "r4", SYSTEM_A + [4]) is a
    finally:
        await feed.stop()
