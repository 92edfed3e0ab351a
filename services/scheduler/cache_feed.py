"""Connects the workers' prefix caches to routing.

Every cache event of a worker goes at once into an in-process PrefixIndex and, when Redis is
configured, into the publisher's buffer. The router reads the Redis-fed index (the one other
scheduler replicas share) while its reader is in sync with Redis, and the in-process one
otherwise: Redis missing or down costs routing nothing but that shared view.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from services.common.block_hash import BlockHash
from services.scheduler.cache_publisher import CachePublisher, FullState
from services.scheduler.cache_reader import PrefixIndexReader
from services.scheduler.prefix_index import PrefixIndex, WorkerKey, worker_key
from services.scheduler.prefix_store import PrefixStore

if TYPE_CHECKING:
    from services.scheduler.engine import Engine

log = logging.getLogger(__name__)

# Redis is never awaited on the request path, but these bound how long the background tasks
# stay stuck on a Redis that stopped answering before they fall back and retry.
SOCKET_TIMEOUT_S = 2.0
CONNECT_TIMEOUT_S = 1.0


class EngineCacheEvents:
    """The CacheEventListener of one worker's engine: its key is read when an event arrives,
    since the model is only known once the worker has described itself."""

    def __init__(self, feed: CacheFeed, engine: Engine) -> None:
        self._feed = feed
        self._engine = engine

    def blocks_stored(self, hashes: list[BlockHash]) -> None:
        key = self._key()
        self._feed.local.add(key, hashes)
        if self._feed.publisher is not None:
            self._feed.publisher.log_for(key).blocks_stored(hashes)

    def blocks_removed(self, hashes: list[BlockHash]) -> None:
        key = self._key()
        self._feed.local.remove(key, hashes)
        if self._feed.publisher is not None:
            self._feed.publisher.log_for(key).blocks_removed(hashes)

    def _key(self) -> WorkerKey:
        info = self._engine.info
        assert info is not None, "cache events before the worker described itself"
        return worker_key(info.model, self._engine.address)


class CacheFeed:
    def __init__(
        self,
        engines: Callable[[], Iterable[Engine]],
        redis_url: str = "",
        ttl_s: float = 10.0,
        namespace: str = "layerserve:prefix",
    ) -> None:
        self._engines = engines  # every worker's engine, including ones added later
        self.local = PrefixIndex()
        self.publisher: CachePublisher | None = None
        self.reader: PrefixIndexReader | None = None
        self._client: aioredis.Redis | None = None
        self._tasks: list[asyncio.Task[None]] = []
        if redis_url:
            self._client = aioredis.Redis.from_url(
                redis_url,
                socket_timeout=SOCKET_TIMEOUT_S,
                socket_connect_timeout=CONNECT_TIMEOUT_S,
                retry=Retry(NoBackoff(), 1),
            )
            store = PrefixStore(self._client, ttl_s, namespace)
            self.publisher = CachePublisher(store, self.ready_caches, heartbeat_s=ttl_s / 3)
            check_s = min(1.0, ttl_s / 4)
            self.reader = PrefixIndexReader(store, lambda: list(self.ready_caches()), check_s)

    def listener(self, engine: Engine) -> EngineCacheEvents:
        return EngineCacheEvents(self, engine)

    def ready_caches(self) -> dict[WorkerKey, FullState]:
        """The ready workers, each with a way to read its whole cache."""
        ready: dict[WorkerKey, FullState] = {}
        for engine in self._engines():
            if engine.ready and engine.info is not None and engine.scheduler is not None:
                key = worker_key(engine.info.model, engine.address)
                ready[key] = engine.scheduler.kv.cached_hashes
        return ready

    def view(self) -> PrefixIndex:
        """The index to route with now. Never waits."""
        if self.reader is not None and self.reader.healthy:
            return self.reader.index
        return self.local

    def start(self) -> None:
        if self.publisher is None or self.reader is None:
            log.info(
                "no --redis-url: prefix-aware routing uses this process's own record of its "
                "workers' caches; other scheduler replicas cannot see it, and a restarted "
                "scheduler starts without it"
            )
            return
        loop = asyncio.get_running_loop()
        self._tasks = [loop.create_task(self.publisher.run()), loop.create_task(self.reader.run())]

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks = []
        if self._client is not None:
            await self._client.aclose()
