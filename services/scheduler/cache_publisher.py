"""Writes the workers' prefix-cache events to Redis, off the request path.

The step loop only records changes in memory (WorkerCacheLog, a CacheEventListener); one
background task writes everything that piled up since its previous write (one engine step's
events or more) in a single pipelined transaction, and renews the entries' expiry on a
heartbeat while the worker is ready. When Redis fails, the changes are dropped and each
worker's full state is republished (new epoch) once it answers again, so readers rebuild.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from collections.abc import Callable

from redis.exceptions import RedisError

from services.common.block_hash import BlockHash
from services.scheduler.prefix_index import WorkerKey
from services.scheduler.prefix_store import Batch, PrefixStore

log = logging.getLogger(__name__)

FullState = Callable[[], list[BlockHash]]
ReadyWorkers = Callable[[], dict[WorkerKey, FullState]]
REDIS_FAILURES = (RedisError, OSError, TimeoutError)


def raise_if_cancelled() -> None:
    """Call after catching a Redis error and at each turn of a background loop: redis-py can
    turn a cancellation that lands in the middle of a read into ConnectionError (or swallow
    it), and a background task must still stop when cancelled."""
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        raise asyncio.CancelledError


class WorkerCacheLog:
    """One worker's cache changes since the last write: hash -> stored (True) or removed."""

    def __init__(self, worker: WorkerKey, wake: Callable[[], None]) -> None:
        self.worker = worker
        self.epoch = ""
        self.seq = 0
        self.needs_full = True  # the next write republishes the whole state
        self._wake = wake
        self._changes: dict[BlockHash, bool] = {}

    def blocks_stored(self, hashes: list[BlockHash]) -> None:
        self._note(hashes, True)

    def blocks_removed(self, hashes: list[BlockHash]) -> None:
        self._note(hashes, False)

    def _note(self, hashes: list[BlockHash], stored: bool) -> None:
        if self.needs_full:
            return  # the republish carries the whole state, changes included
        for h in hashes:
            self._changes[h] = stored  # the last change wins: a batch is a net difference
        self._wake()

    def lose_track(self) -> None:
        self.needs_full = True
        self._changes.clear()

    def take_batch(self, full_state: FullState | None) -> Batch | None:
        """The next write for this worker, or None. A republish needs `full_state`."""
        if self.needs_full:
            if full_state is None:
                return None
            self.epoch, self.seq, self.needs_full = secrets.token_hex(8), 1, False
            self._changes.clear()
            return Batch(self.worker, self.epoch, self.seq, full_state(), full=True)
        if not self._changes:
            return None
        self.seq += 1
        batch = Batch(self.worker, self.epoch, self.seq)
        for h, stored in self._changes.items():
            (batch.stored if stored else batch.removed).append(h)
        self._changes = {}
        return batch


class CachePublisher:
    def __init__(
        self,
        store: PrefixStore,
        ready: ReadyWorkers,
        heartbeat_s: float,
        op_timeout_s: float = 2.0,
        retry_s: float = 1.0,
    ) -> None:
        self.store = store
        self._ready = ready  # the workers alive now, each with its cache's full state
        self.heartbeat_s = heartbeat_s
        self.op_timeout_s = op_timeout_s
        self.retry_s = retry_s
        self.healthy: bool | None = None  # None until the first write was tried
        self._logs: dict[WorkerKey, WorkerCacheLog] = {}
        self._wake = asyncio.Event()

    def log_for(self, worker: WorkerKey) -> WorkerCacheLog:
        """The worker's change log; a new one first publishes the worker's whole cache."""
        cache_log = self._logs.get(worker)
        if cache_log is None:
            cache_log = self._logs[worker] = WorkerCacheLog(worker, self._wake.set)
            self._wake.set()
        return cache_log

    async def run(self) -> None:
        next_beat = 0.0
        while True:
            raise_if_cancelled()
            try:
                async with asyncio.timeout(max(0.0, next_beat - time.monotonic())):
                    await self._wake.wait()
            except TimeoutError:
                pass
            self._wake.clear()
            try:
                async with asyncio.timeout(self.op_timeout_s):
                    await self._write()
                    if time.monotonic() >= next_beat:
                        await self._heartbeat()
                        next_beat = time.monotonic() + self.heartbeat_s
                self._set_healthy(True, None)
            except REDIS_FAILURES as err:
                raise_if_cancelled()
                self._set_healthy(False, err)
                for cache_log in self._logs.values():
                    cache_log.lose_track()
                await asyncio.sleep(self.retry_s)

    async def _write(self) -> None:
        ready = self._ready()
        batches = []
        for worker, cache_log in self._logs.items():
            batch = cache_log.take_batch(ready.get(worker))
            if batch is not None:
                batches.append(batch)
        if batches:
            await self.store.write(batches)

    async def _heartbeat(self) -> None:
        ready = self._ready()
        live = [w for w, log_ in self._logs.items() if w in ready and not log_.needs_full]
        if not live:
            return
        for worker in await self.store.refresh(live):
            log.info("prefix cache entries of %s were gone from Redis; republishing", worker)
            self._logs[worker].lose_track()
            self._wake.set()

    def _set_healthy(self, healthy: bool, err: BaseException | None) -> None:
        if healthy and not self.healthy:
            log.info("publishing prefix-cache events to Redis")
        elif not healthy and self.healthy is not False:
            log.warning(
                "Redis failed (%s); prefix-cache events are not published until it is back",
                err or "timeout",
            )
        self.healthy = healthy
