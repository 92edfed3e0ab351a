"""Stored Responses API responses: shared by gateway replicas through Redis, with its TTL; kept
bounded in memory without it; each visible only to the key that made it."""

from __future__ import annotations

import asyncio
import uuid

import pytest
from redis.asyncio import Redis

from services.common.errors import NotFound, Unavailable
from services.gateway.responses_store import ResponseStore, StoredResponse
from tests.redis_server import free_port


def stored(tenant: str = "t1") -> StoredResponse:
    response_id = f"resp_{uuid.uuid4().hex}"  # the session's Redis is shared: fresh ids
    turn = {"role": "assistant", "content": "hi"}
    return StoredResponse(tenant, {"id": response_id, "object": "response"}, [turn])


def redis_store(url: str, ttl_seconds: int = 60) -> ResponseStore:
    redis = Redis.from_url(url, socket_timeout=0.5, socket_connect_timeout=0.5)
    return ResponseStore(redis, ttl_seconds=ttl_seconds)


async def test_one_replica_reads_what_another_stored_until_the_ttl(redis_url) -> None:
    first, second = redis_store(redis_url, ttl_seconds=1), redis_store(redis_url)
    kept = stored()
    await first.put(kept)
    assert await second.get(kept.response["id"], "t1") == kept
    with pytest.raises(NotFound):
        await second.get(kept.response["id"], "t2")  # another key's
    await asyncio.sleep(1.2)
    with pytest.raises(NotFound):
        await second.get(kept.response["id"], "t1")


async def test_delete_removes_it_for_every_replica(redis_url) -> None:
    first, second = redis_store(redis_url), redis_store(redis_url)
    kept = stored()
    await first.put(kept)
    with pytest.raises(NotFound):
        await second.delete(kept.response["id"], "t2")  # not another key's to delete
    await second.delete(kept.response["id"], "t1")
    with pytest.raises(NotFound):
        await first.get(kept.response["id"], "t1")


async def test_without_redis_the_newest_are_kept() -> None:
    store = ResponseStore(max_local=2)
    responses = [stored() for _ in range(3)]
    for response in responses:
        await store.put(response)
    with pytest.raises(NotFound):
        await store.get(responses[0].response["id"], "t1")
    for response in responses[1:]:
        assert await store.get(response.response["id"], "t1") == response


async def test_unreachable_redis_fails_reads_not_writes() -> None:
    store = redis_store(f"redis://127.0.0.1:{free_port()}/0")
    kept = stored()
    await store.put(kept)  # logged: the client already has its answer
    with pytest.raises(Unavailable):
        await store.get(kept.response["id"], "t1")
