"""Worker links whose worker has just described itself, for routing tests: the real Router,
Scheduler, BlockPool and cache feed, with the steps run by hand instead of over gRPC."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from layerserve.scheduler.v1 import scheduler_pb2
from layerserve.worker.v1 import worker_pb2
from services.scheduler.block_pool import BlockPool
from services.scheduler.cache_feed import CacheFeed
from services.scheduler.kv_cache_manager import KVCacheManager
from services.scheduler.router import Router
from services.scheduler.routing import ReplicaPicker, RoutingMode
from services.scheduler.scheduler import Scheduler, SchedulerLimits
from services.scheduler.worker_link import WorkerLink
from tests.unit.scheduler.drive import make_request, run_until_idle

MODEL = "m"
BLOCK_SIZE = 4
FINGERPRINT = "fp"


def connected_link(address: str, feed: CacheFeed, num_blocks: int = 256) -> WorkerLink:
    """A link as WorkerLink._connect leaves it with its worker SERVING, its cache events going
    to `feed`."""
    link = WorkerLink(address, SchedulerLimits(), emit=lambda outputs: None)
    link.cache_events = feed.listener(link)
    link.info = worker_pb2.WorkerInfo(
        model=MODEL,
        block_size=BLOCK_SIZE,
        num_blocks=num_blocks,
        max_model_len=4096,
        vocab_size=50_000,
        model_fingerprint=FINGERPRINT,
    )
    pool = BlockPool(num_blocks, listener=link.cache_events)
    kv = KVCacheManager(pool, BLOCK_SIZE, FINGERPRINT)
    link.scheduler = Scheduler(SchedulerLimits(), kv, 4096, frozenset())
    link.health.serving = True  # the worker's health stream said SERVING
    return link


def routed_cluster(
    addresses: list[str], mode: RoutingMode = RoutingMode.PREFIX, redis_url: str = "", **feed_args
) -> tuple[Router, CacheFeed]:
    links: list[WorkerLink] = []
    feed = CacheFeed(lambda: links, redis_url, **feed_args)
    links.extend(connected_link(address, feed) for address in addresses)
    router = Router(links)
    router.picker = ReplicaPicker(mode, feed.view)
    return router, feed


def submit(router: Router, request_id: str, tokens: list[int]) -> WorkerLink:
    """Routes a request; returns the link that got it."""
    router.submit(
        scheduler_pb2.Submit(
            request_id=request_id, model=MODEL, prompt_token_ids=tokens, max_tokens=2
        )
    )
    return router._owner[request_id]


def serve(link: WorkerLink, request_id: str, tokens: list[int]) -> None:
    """Runs a request to the end on that replica alone (its blocks stay cached)."""
    assert link.scheduler is not None
    link.scheduler.add(make_request(request_id, tokens, max_tokens=2))
    run_until_idle(link.scheduler)


def drain(link: WorkerLink) -> None:
    assert link.scheduler is not None
    run_until_idle(link.scheduler)


async def wait_until(condition: Callable[[], bool], timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"not true within {timeout_s}s")
        await asyncio.sleep(0.02)
