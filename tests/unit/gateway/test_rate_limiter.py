"""Token buckets: in Redis (shared by replicas, one Lua script) and in-process (same rules)."""

from __future__ import annotations

import logging
import uuid

import pytest
from redis.asyncio import Redis

from services.common.errors import ResourceExhausted, Unavailable
from services.gateway.api_keys import ApiKey, KeyLimits, hash_key
from services.gateway.rate_limiter import LocalBuckets, RateLimiter, RedisBuckets
from tests.redis_server import free_port


def new_key(rpm: int = 0, tpm: int = 0) -> ApiKey:
    name = uuid.uuid4().hex  # a fresh tenant per test: the session's Redis is shared
    return ApiKey(name, hash_key(name), KeyLimits(rpm, tpm, 0))


def redis_limiter(url: str, *, fail_open: bool = True) -> RateLimiter:
    redis = Redis.from_url(url, socket_timeout=0.5, socket_connect_timeout=0.5)
    return RateLimiter(RedisBuckets(redis), fail_open=fail_open)


async def admitted(limiter: RateLimiter, key: ApiKey, attempts: int) -> int:
    count = 0
    for _ in range(attempts):
        try:
            await limiter.admit(key)
            count += 1
        except ResourceExhausted:
            pass
    return count


async def test_two_gateway_replicas_share_one_requests_per_minute_limit(redis_url):
    key = new_key(rpm=5)
    first, second = redis_limiter(redis_url), redis_limiter(redis_url)
    assert await admitted(first, key, 3) + await admitted(second, key, 3) == 5
    with pytest.raises(ResourceExhausted, match="5 requests per minute") as refused:
        await second.admit(key)
    # One request comes back every 60/5 = 12 s; a client told to wait 12 s gets in.
    assert 1 <= refused.value.retry_after <= 12


async def test_tokens_spent_beyond_the_budget_hold_the_key_back(redis_url):
    key = new_key(tpm=600)
    limiter = redis_limiter(redis_url)
    await limiter.admit(key)
    await limiter.settle(key, 0, 599)
    await limiter.admit(key)  # one token left: not in debt yet
    await limiter.settle(key, 0, 300)
    with pytest.raises(ResourceExhausted, match="600 tokens per minute") as refused:
        await limiter.admit(key)
    # 300 tokens in debt refill at 10/s: back in about 30 s.
    assert 25 <= refused.value.retry_after <= 32
    await limiter.admit(new_key(tpm=600))  # another key is untouched


async def test_local_buckets_refill_over_time():
    now = [1000.0]
    limiter = RateLimiter(LocalBuckets(clock=lambda: now[0]), fail_open=True)
    key = new_key(rpm=2, tpm=60)
    assert await admitted(limiter, key, 5) == 2
    now[0] += 30  # half a minute: one request back
    assert await admitted(limiter, key, 5) == 1
    await limiter.settle(key, 0, 120)  # 60 tokens in debt
    now[0] += 60
    with pytest.raises(ResourceExhausted):
        await limiter.admit(key)  # exactly back at zero, still not admitted
    now[0] += 1
    await limiter.admit(key)


async def test_unlimited_keys_never_touch_the_buckets():
    limiter = redis_limiter(f"redis://127.0.0.1:{free_port()}/0", fail_open=False)
    await limiter.admit(new_key())  # would be 503 if it asked the (absent) Redis


async def test_redis_down_fails_open_or_closed_as_configured(caplog):
    url = f"redis://127.0.0.1:{free_port()}/0"  # nothing listens there
    key = new_key(rpm=1)
    caplog.set_level(logging.ERROR, logger="services.gateway.rate_limiter")
    open_limiter = redis_limiter(url, fail_open=True)
    for _ in range(3):
        await open_limiter.admit(key)  # admitted, unlimited, while Redis is away
    assert len(caplog.records) == 1 and "letting requests through" in caplog.text
    with pytest.raises(Unavailable, match="rate limiting is unavailable"):
        await redis_limiter(url, fail_open=False).admit(key)


async def test_a_redis_restart_ends_the_outage(redis_server, caplog):
    key = new_key(rpm=2)
    limiter = redis_limiter(redis_server.url, fail_open=False)
    await limiter.admit(key)
    redis_server.stop()
    with pytest.raises(Unavailable):
        await limiter.admit(key)
    redis_server.start()
    caplog.set_level(logging.WARNING, logger="services.gateway.rate_limiter")
    await limiter.admit(key)  # a fresh Redis: a full bucket
    assert "reaches Redis again" in caplog.text
