"""Engines whose worker has just described itself, for routing tests: the real Router,
Scheduler, BlockPool and cache feed, with the steps run by hand instead of over gRPC."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from services.common.max_tokens import MaxTokens
from services.scheduler.block_pool import BlockPool
from services.scheduler.cache_feed import CacheFeed
from services.scheduler.engine import Engine
from services.scheduler.kv_cache_manager import KVCacheManager
from services.scheduler.request_trace import RequestTraces
from services.scheduler.router import Router
from services.scheduler.routing import ReplicaPicker, RoutingMode
from services.scheduler.scheduler import Scheduler, SchedulerLimits
from services.scheduler.submission import Submission
from services.scheduler.worker_info import WorkerInfo
from tests.unit.scheduler.drive import make_request, run_until_idle

MODEL = "m"
BLOCK_SIZE = 4
FINGERPRINT = "fp"


def connected_engine(
    address: str, feed: CacheFeed, num_blocks: int = 256, traces: RequestTraces | None = None
) -> Engine:
    """An engine as Engine._connect leaves it with its worker SERVING, its cache events going
    to `feed`, its Scheduler observed by metrics (and tracing, given `traces`)."""
    engine = Engine(address, SchedulerLimits(), emit=lambda outputs: None, traces=traces)
    engine.cache_events = feed.listener(engine)
    engine.info = WorkerInfo(
        model=MODEL,
        block_size=BLOCK_SIZE,
        num_blocks=num_blocks,
        max_model_len=4096,
        vocab_size=50_000,
        model_fingerprint=FINGERPRINT,
    )
    pool = BlockPool(num_blocks, listener=engine.cache_events)
    kv = KVCacheManager(pool, BLOCK_SIZE, FINGERPRINT)
    engine.scheduler = Scheduler(
        SchedulerLimits(), kv, 4096, frozenset(), observers=engine._observers()
    )
    engine.link.health.serving = True  # the worker's health stream said SERVING
    return engine


def routed_cluster(
    addresses: list[str],
    mode: RoutingMode = RoutingMode.PREFIX,
    redis_url: str = "",
    traces: RequestTraces | None = None,
    **feed_args,
) -> tuple[Router, CacheFeed]:
    engines: list[Engine] = []
    feed = CacheFeed(lambda: engines, redis_url, **feed_args)
    engines.extend(connected_engine(address, feed, traces=traces) for address in addresses)
    router = Router(engines)
    router.picker = ReplicaPicker(mode, feed.view)
    return router, feed


def submit(router: Router, request_id: str, tokens: list[int]) -> Engine:
    """Routes a request; returns the engine that got it."""
    router.submit(Submission(request_id, MODEL, list(tokens), max_tokens=MaxTokens(2)))
    return router._owner[request_id]


def serve(engine: Engine, request_id: str, tokens: list[int]) -> None:
    """Runs a request to the end on that replica alone (its blocks stay cached)."""
    assert engine.scheduler is not None
    engine.scheduler.add(make_request(request_id, tokens, max_tokens=2))
    run_until_idle(engine.scheduler)


def drain(engine: Engine) -> None:
    assert engine.scheduler is not None
    run_until_idle(engine.scheduler)


async def wait_until(condition: Callable[[], bool], timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"not true within {timeout_s}s")
        await asyncio.sleep(0.02)
