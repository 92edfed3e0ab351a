"""The router's side of the Redis prefix-cache metadata: a background task that keeps an
in-memory PrefixIndex in step with the workers' entries, so routing never waits on Redis.

It follows each worker's event stream and applies a batch only when it carries the epoch and
the next sequence number it expects; otherwise (a lost batch, a trimmed stream, a writer that
republished after a restart) it reads the worker's full state again. A periodic check drops
workers whose entries expired (their heartbeat stopped). While Redis is unreachable the index
is marked unhealthy and emptied; it is rebuilt from snapshots once Redis answers again.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from services.scheduler.cache_publisher import REDIS_FAILURES, raise_if_cancelled
from services.scheduler.prefix_index import PrefixIndex, WorkerKey
from services.scheduler.prefix_store import Event, PrefixStore

log = logging.getLogger(__name__)


class PrefixIndexReader:
    def __init__(
        self,
        store: PrefixStore,
        workers: Callable[[], list[WorkerKey]],
        check_s: float = 1.0,
        block_ms: int = 250,
        op_timeout_s: float = 2.0,
        retry_s: float = 1.0,
    ) -> None:
        self.store = store
        self._workers = workers  # the workers this router routes to now
        self.check_s = check_s
        self.block_ms = block_ms
        self.op_timeout_s = op_timeout_s
        self.retry_s = retry_s
        self.index = PrefixIndex()
        self.healthy = False  # the index reflects Redis as of at most one read ago
        self.num_resyncs = 0
        self._epoch: dict[WorkerKey, str | None] = {}
        self._seq: dict[WorkerKey, int] = {}
        self._cursor: dict[WorkerKey, str] = {}
        self._was_up: bool | None = None

    async def run(self) -> None:
        while True:
            try:
                await self._follow()
            except REDIS_FAILURES as err:
                raise_if_cancelled()
                if self._was_up is not False:
                    log.warning("Redis failed (%s); routing without its prefix index", err)
                self._was_up = False
                self._lose_track()
                await asyncio.sleep(self.retry_s)

    async def _follow(self) -> None:
        next_check = 0.0
        while True:
            raise_if_cancelled()
            async with asyncio.timeout(self.op_timeout_s + self.block_ms / 1000):
                await self._track(self._workers())
                if time.monotonic() >= next_check:
                    await self._check()
                    next_check = time.monotonic() + self.check_s
                if not self._cursor:  # no worker ready yet: nothing to block on in Redis
                    await asyncio.sleep(self.block_ms / 1000)
                for event in await self.store.read(self._cursor, self.block_ms):
                    await self._apply(event)
            if not self.healthy:
                log.info("prefix index synchronised from Redis (%d workers)", len(self._cursor))
            self.healthy = True
            self._was_up = True

    def _lose_track(self) -> None:
        self.healthy = False
        self.index.clear()
        self._epoch.clear()
        self._seq.clear()
        self._cursor.clear()

    async def _track(self, workers: list[WorkerKey]) -> None:
        for worker in list(self._cursor):
            if worker not in workers:
                self.index.drop(worker)
                del self._epoch[worker], self._seq[worker], self._cursor[worker]
        for worker in workers:
            if worker not in self._cursor:
                await self._resync(worker)

    async def _check(self) -> None:
        """Catches what the streams cannot tell: expired entries, a Redis that restarted."""
        epochs = await self.store.epochs(list(self._cursor))
        for worker, epoch in epochs.items():
            if epoch != self._epoch.get(worker):
                await self._resync(worker)

    async def _resync(self, worker: WorkerKey) -> None:
        snapshot = await self.store.snapshot(worker)
        self.index.replace(worker, snapshot.hashes)
        if not snapshot.hashes:
            self.index.drop(worker)
        self._epoch[worker] = snapshot.epoch
        self._seq[worker] = snapshot.seq
        self._cursor[worker] = snapshot.stream_id
        self.num_resyncs += 1

    async def _apply(self, event: Event) -> None:
        worker = event.worker
        if worker not in self._cursor:
            return  # no longer routed to
        same_epoch = event.epoch == self._epoch[worker]
        if same_epoch and event.seq <= self._seq[worker]:
            return  # already part of the snapshot
        if not same_epoch or event.seq != self._seq[worker] + 1:
            await self._resync(worker)
            return
        self.index.remove(worker, event.removed)
        self.index.add(worker, event.stored)
        self._seq[worker] = event.seq
        self._cursor[worker] = event.stream_id
