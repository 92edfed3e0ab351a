"""Continuous batching for one worker: which requests compute how many tokens in the next
step, under a token budget, a cap on running requests and the worker's KV blocks.

Each request has num_computed_tokens; every step assigns it tokens so that it catches up with
its known tokens: a prompt (in chunks when the budget is short), then one token per step.
Running requests are served first; when blocks run out, the lowest-priority, most recent
running request is preempted (its blocks freed, recomputed later) so the others go on.
"""

from __future__ import annotations

import bisect
import logging
from dataclasses import dataclass, field

from services.scheduler.kv_cache_manager import KVCacheManager
from services.scheduler.request import FinishReason, Request, Status

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class SchedulerLimits:
    max_num_batched_tokens: int = 1024  # tokens computed in one step, all requests together
    max_num_seqs: int = 64  # requests running at once


@dataclass(slots=True)
class ScheduledStep:
    new: list[tuple[Request, int]] = field(default_factory=list)  # sent in full
    running: list[tuple[Request, int, list[int]]] = field(default_factory=list)  # as diffs
    finished_ids: list[str] = field(default_factory=list)

    @property
    def is_empty(self) -> bool:
        return not (self.new or self.running or self.finished_ids)

    @property
    def num_tokens(self) -> int:
        return sum(n for _, n in self.new) + sum(n for _, n, _ in self.running)


@dataclass(slots=True)
class Sample:
    request_id: str
    token_id: int
    logprob: object | None = None  # common.v1.TokenLogprob, passed through untouched


class Scheduler:
    def __init__(
        self,
        limits: SchedulerLimits,
        kv: KVCacheManager,
        max_model_len: int,
        eos_token_ids: frozenset[int],
    ) -> None:
        self.limits = limits
        self.kv = kv
        self.max_model_len = max_model_len
        self.eos_token_ids = eos_token_ids
        self.waiting: list[Request] = []  # kept in Request.sort_key order
        self.running: list[Request] = []
        self.requests: dict[str, Request] = {}
        self._forget_on_worker: list[str] = []
        self.num_steps = 0
        self.num_preemptions = 0

    # -- requests in and out -------------------------------------------------------------

    def add(self, request: Request) -> None:
        self.requests[request.request_id] = request
        bisect.insort(self.waiting, request, key=Request.sort_key)

    def abort(self, request_id: str) -> Request | None:
        request = self.requests.get(request_id)
        if request is not None:
            self._finish(request, FinishReason.ABORT)
        return request

    def has_work(self) -> bool:
        return bool(self.waiting or self.running or self._forget_on_worker)

    @property
    def num_waiting(self) -> int:
        return len(self.waiting)

    # -- one step --------------------------------------------------------------------------

    def schedule(self) -> ScheduledStep:
        step = ScheduledStep(finished_ids=self._forget_on_worker)
        self._forget_on_worker = []
        budget = self.limits.max_num_batched_tokens
        budget = self._schedule_running(step, budget)
        self._schedule_waiting(step, budget)
        step.finished_ids.extend(self._forget_on_worker)  # preempted in this very step
        self._forget_on_worker = []
        for request, num_new in step.new:
            request.num_computed_tokens += num_new
        for request, num_new, _ in step.running:
            request.num_computed_tokens += num_new
        if not step.is_empty:
            self.num_steps += 1
        return step

    def _schedule_running(self, step: ScheduledStep, budget: int) -> int:
        scheduled: set[str] = set()
        for request in list(self.running):
            if budget <= 0:
                break
            if request.status is not Status.RUNNING:
                continue  # preempted earlier in this loop
            num_new = min(request.num_tokens_to_compute, budget)
            new_blocks = self._allocate_or_preempt(request, num_new, scheduled)
            if new_blocks is None:
                continue  # the request itself was preempted
            step.running.append((request, num_new, new_blocks))
            scheduled.add(request.request_id)
            budget -= num_new
        return budget

    def _allocate_or_preempt(
        self, request: Request, num_new: int, scheduled: set[str]
    ) -> list[int] | None:
        """Victims are running requests not yet given tokens in this step (the request itself
        included): the lowest priority, then the most recent."""
        while (new_blocks := self.kv.allocate_slots(request, num_new)) is None:
            victim = max(
                (r for r in self.running if r.request_id not in scheduled),
                key=lambda r: (-r.priority, r.arrival),
            )
            self._preempt(victim)
            if victim is request:
                return None
        return new_blocks

    def _schedule_waiting(self, step: ScheduledStep, budget: int) -> None:
        while self.waiting and budget > 0 and len(self.running) < self.limits.max_num_seqs:
            request = self.waiting[0]
            num_new = min(request.num_tokens_to_compute, budget)
            if self.kv.allocate_slots(request, num_new) is None:
                break  # head-of-line waits for blocks, keeping the queue order fair
            self.waiting.pop(0)
            request.status = Status.RUNNING
            self.running.append(request)
            if request.on_worker:  # cannot happen for waiting requests; kept explicit
                step.running.append((request, num_new, list(request.block_ids)))
            else:
                request.on_worker = True
                step.new.append((request, num_new))
            budget -= num_new

    def _preempt(self, request: Request) -> None:
        log.info("preempting %s to free %d blocks", request.request_id, len(request.block_ids))
        self.running.remove(request)
        self.kv.free(request)
        request.num_computed_tokens = 0
        request.status = Status.WAITING
        request.num_preemptions += 1
        self.num_preemptions += 1
        if request.on_worker:
            request.on_worker = False
            self._forget_on_worker.append(request.request_id)
        bisect.insort(self.waiting, request, key=Request.sort_key)

    # -- results -----------------------------------------------------------------------------

    def update(self, samples: list[Sample]) -> list[tuple[Request, Sample]]:
        """Applies a step's sampled tokens. Returns the requests that got a token (finished ones
        carry their finish_reason); tokens of requests aborted meanwhile are dropped."""
        updated = []
        for sample in samples:
            request = self.requests.get(sample.request_id)
            if request is None or request.status is not Status.RUNNING:
                continue
            request.output_token_ids.append(sample.token_id)
            reason = self._stop_reason(request, sample.token_id)
            if reason is not None:
                self._finish(request, reason)
            updated.append((request, sample))
        return updated

    def fail_all(self) -> list[Request]:
        """Ends every request (the worker failed). Returns them for error reporting."""
        failed = list(self.requests.values())
        for request in failed:
            self._finish(request, FinishReason.ERROR)
        self._forget_on_worker = []
        return failed

    def _stop_reason(self, request: Request, token_id: int) -> FinishReason | None:
        if token_id in request.stop_token_ids:
            return FinishReason.STOP
        if len(request.output_token_ids) >= request.max_tokens:
            return FinishReason.LENGTH
        if request.num_tokens >= self.max_model_len:
            return FinishReason.LENGTH
        return None

    def _finish(self, request: Request, reason: FinishReason) -> None:
        if request.status is Status.WAITING:
            self.waiting.remove(request)
        elif request.status is Status.RUNNING:
            self.running.remove(request)
        else:
            return
        self.kv.free(request)
        request.status = Status.FINISHED
        request.finish_reason = reason
        if request.on_worker:
            self._forget_on_worker.append(request.request_id)
            request.on_worker = False
        del self.requests[request.request_id]
