"""Which scheduler replica gets a request: the one owning the worker where its prefill would
finish soonest, by the same rule each scheduler applies among its own workers
(services/scheduler/routing.py cost): the prompt tokens that worker must still compute (the
prefix its KV cache holds, read from the shared Redis index, is free) plus the work queued
there. So a shared system prompt finds the replica caching it whichever scheduler owns it,
until that replica is a prompt's worth busier than another. Pure: plain numbers in, an index
out."""

from __future__ import annotations

from dataclasses import dataclass

# What one running or queued request costs its worker, in prompt tokens (as routing.py).
REQUEST_TOKENS = 16


@dataclass(frozen=True, slots=True)
class WorkerCandidate:
    running: int  # requests running or queued there at the scheduler's last report
    free_blocks: int
    block_size: int  # 0: unknown (its cache is not counted)
    cached_blocks: int  # leading blocks of the prompt its cache holds (index, or just routed)


@dataclass(frozen=True, slots=True)
class SchedulerCandidate:
    workers: tuple[WorkerCandidate, ...]  # its ready workers of the request's model
    # This tokenizer's requests sent there since that report: the report does not count them.
    sent_since_report: int
    recent_blocks: int  # leading blocks of the prompt sent there moments ago
    recent_block_size: int  # the block size recent_blocks counts in


def worker_cost(
    worker: WorkerCandidate, num_prompt_tokens: int, recent_tokens: int, extra_requests: float
) -> float:
    """Tokens of work before this worker finishes the request's prefill. recent_tokens: a
    prefix its scheduler was sent moments ago (one of its workers computes it now, and the
    scheduler routes after it: counted as cached on each)."""
    cached = max(worker.cached_blocks * worker.block_size, recent_tokens)
    uncached = num_prompt_tokens - min(cached, num_prompt_tokens)
    kv_short = 0
    if worker.block_size and -(-uncached // worker.block_size) > worker.free_blocks:
        kv_short = num_prompt_tokens  # it would have to evict or wait: pays the prompt again
    return uncached + kv_short + REQUEST_TOKENS * (worker.running + extra_requests)


def scheduler_cost(candidate: SchedulerCandidate, num_prompt_tokens: int) -> float:
    """Its cheapest worker's cost; this tokenizer's requests sent since the last report are
    spread over its workers."""
    if not candidate.workers:
        return float("inf")
    extra = candidate.sent_since_report / len(candidate.workers)
    recent = candidate.recent_blocks * candidate.recent_block_size
    return min(worker_cost(w, num_prompt_tokens, recent, extra) for w in candidate.workers)


def pick_scheduler(candidates: list[SchedulerCandidate], num_prompt_tokens: int, turn: int) -> int:
    """Index of the cheapest candidate; `turn` rotates among equals, so idle replicas share
    new prefixes."""
    assert candidates, "pick among no schedulers"
    n = len(candidates)

    def rank(i: int) -> tuple[float, int]:
        return (scheduler_cost(candidates[i], num_prompt_tokens), (i - turn) % n)

    return min(range(n), key=rank)
