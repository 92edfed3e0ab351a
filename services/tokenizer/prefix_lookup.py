"""How much of a prompt each worker's KV cache holds, read from the shared prefix index in
Redis that the schedulers keep (services/scheduler/prefix_store.py: per worker a SET of the
block hashes it holds, `{namespace}:{model@host:port}:blocks`). One round trip per request
for every candidate worker. Redis away: nothing is known cached (routing falls back to load
and to where prefixes were sent moments ago)."""

from __future__ import annotations

import logging

import redis.asyncio as aioredis
from redis.exceptions import RedisError

from services.common.block_hash import BlockHash

log = logging.getLogger(__name__)

NAMESPACE = "layerserve:prefix"  # the schedulers' PrefixStore namespace
TIMEOUT_S = 0.25  # routing never waits longer for the index


class PrefixLookup:
    def __init__(self, url: str, namespace: str = NAMESPACE) -> None:
        self._client = aioredis.Redis.from_url(
            url, socket_timeout=TIMEOUT_S, socket_connect_timeout=TIMEOUT_S
        )
        self._namespace = namespace
        self._failing = False

    async def cached_blocks(self, workers: list[str], hashes: list[BlockHash]) -> dict[str, int]:
        """Per worker key, how many leading blocks of `hashes` its cache holds."""
        if not workers or not hashes:
            return {}
        pipe = self._client.pipeline(transaction=False)
        for worker in workers:
            pipe.smismember(f"{self._namespace}:{worker}:blocks", hashes)
        try:
            replies = await pipe.execute()
        except (RedisError, OSError) as err:
            if not self._failing:
                log.warning("prefix index unreadable (%s); routing by load alone", err)
            self._failing = True
            return {}
        self._failing = False
        return {w: _leading(reply) for w, reply in zip(workers, replies, strict=True)}

    async def close(self) -> None:
        await self._client.aclose()


def _leading(flags: list) -> int:
    for i, flag in enumerate(flags):
        if not flag:
            return i
    return len(flags)
