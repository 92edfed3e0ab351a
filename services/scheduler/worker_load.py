"""How busy one worker is at this instant: what the router weighs, the Admin API lists and
GetStats reports. A snapshot: plain numbers, read from the worker's Scheduler on demand."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from services.scheduler.kv_cache_manager import KVCacheManager
from services.scheduler.request import Request
from services.scheduler.scheduler_stats import SchedulerStats


class LoadSource(Protocol):
    """What a WorkerLoad is read from: a worker's Scheduler."""

    kv: KVCacheManager
    stats: SchedulerStats
    running: list[Request]
    requests: dict[str, Request]

    @property
    def num_waiting(self) -> int: ...

    @property
    def pending_tokens(self) -> int: ...


@dataclass(frozen=True, slots=True)
class WorkerLoad:
    num_blocks: int
    free_blocks: int  # cached blocks nobody uses count as free
    num_running: int
    num_waiting: int
    num_requests: int  # running and waiting
    # Tokens its requests still have to compute (queued prompts, chunks, decodes); a request
    # not started yet counts as the tokens the router expected it to compute.
    pending_tokens: int
    num_steps: int
    num_preemptions: int
    prefix_query_tokens: int
    prefix_hit_tokens: int
    num_rejected: int
    num_expired: int

    @classmethod
    def of(cls, scheduler: LoadSource) -> WorkerLoad:
        pool, stats = scheduler.kv.pool, scheduler.stats
        return cls(
            num_blocks=pool.num_blocks,
            free_blocks=pool.num_free,
            num_running=len(scheduler.running),
            num_waiting=scheduler.num_waiting,
            num_requests=len(scheduler.requests),
            pending_tokens=scheduler.pending_tokens,
            num_steps=stats.num_steps,
            num_preemptions=stats.num_preemptions,
            prefix_query_tokens=stats.num_prefix_query_tokens,
            prefix_hit_tokens=stats.num_prefix_hit_tokens,
            num_rejected=stats.num_rejected,
            num_expired=stats.num_expired,
        )
