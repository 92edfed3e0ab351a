"""Driving a Scheduler by hand in tests: requests from explicit tokens, steps whose every
caught-up request samples a token, a clock that moves only when told, a cache-event recorder."""

from __future__ import annotations

from dataclasses import dataclass, field

from services.common.block_hash import BlockHash
from services.common.sampling import SamplingOptions
from services.scheduler.block_pool import BlockPool
from services.scheduler.kv_cache_manager import KVCacheManager
from services.scheduler.request import Request
from services.scheduler.scheduler import Sample, ScheduledStep, Scheduler, SchedulerLimits
from services.scheduler.spec_decode import Proposer

EOS = 2


@dataclass(slots=True)
class FakeClock:
    now: float = 0.0

    def __call__(self) -> float:
        return self.now


@dataclass(slots=True)
class RecordingListener:
    """A CacheEventListener that keeps every event, in order."""

    events: list[tuple[str, list[BlockHash]]] = field(default_factory=list)

    def blocks_stored(self, hashes: list[BlockHash]) -> None:
        self.events.append(("stored", list(hashes)))

    def blocks_removed(self, hashes: list[BlockHash]) -> None:
        self.events.append(("removed", list(hashes)))


def make_scheduler(
    num_blocks: int = 8,
    block_size: int = 4,
    *,
    budget: int = 64,
    max_seqs: int = 8,
    fingerprint: str = "model-a",
    listener: RecordingListener | None = None,
    clock: FakeClock | None = None,
    windows: tuple[int | None, ...] = (None,),
    proposer: Proposer | None = None,
    adaptive_speculation: bool = True,
    max_model_len: int = 256,
    **limits,
) -> Scheduler:
    """windows: the worker's KV cache groups (kv_cache_manager.py); one full group by default.
    proposer: speculative decoding's (spec_decode.py); None: off."""
    kv = KVCacheManager(BlockPool(num_blocks, listener), block_size, fingerprint, windows)
    return Scheduler(
        SchedulerLimits(budget, max_seqs, **limits),
        kv,
        max_model_len=max_model_len,
        eos_token_ids=frozenset({EOS}),
        clock=clock or FakeClock(),
        proposer=proposer,
        adaptive_speculation=adaptive_speculation,
    )


def make_request(
    rid: str, tokens: list[int], max_tokens: int = 4, *, tenant: str = "", priority: int = 0
) -> Request:
    return Request(
        rid,
        list(tokens),
        max_tokens,
        SamplingOptions(),
        frozenset({EOS}),
        priority=priority,
        tenant=tenant,
    )


def finish_step(sched: Scheduler, step: ScheduledStep, token: int = 7) -> list:
    """What the worker answers: `token` for every scheduled request that caught up."""
    requests = [part.request for part in step.requests]
    return sched.update(
        [Sample(r.request_id, token) for r in requests if r.num_output_placeholders]
    )


def drafts(step: ScheduledStep) -> dict[str, list[int]]:
    """The step's proposals, by request id (requests without any left out)."""
    return {
        r.request.request_id: list(r.draft_token_ids) for r in step.running if r.draft_token_ids
    }


def run_step(sched: Scheduler, token: int = 7) -> ScheduledStep:
    step = sched.schedule()
    finish_step(sched, step, token)
    return step


def run_until_idle(sched: Scheduler, max_steps: int = 1000) -> None:
    for _ in range(max_steps):
        if not sched.has_work():
            return
        run_step(sched)
    raise AssertionError("the scheduler did not drain")
