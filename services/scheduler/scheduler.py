"""Continuous batching for one worker: which requests compute how many tokens in the next
step, under a token budget, a cap on running requests and the worker's KV blocks.

Each request has num_computed_tokens; every step assigns it tokens so that it catches up with
its known tokens: a prompt (in chunks when the budget is short), then one token per step.
Running requests are served first; when blocks run out, the lowest-priority, most recent
running request is preempted (its blocks freed, recomputed later) so the others go on.

With prefix caching, a request starts with num_computed_tokens = the tokens of its longest
cached prefix (blocks computed by earlier requests, or by itself before a preemption). Blocks
join the cache only once the step that computed them has returned (update()).

Waiting requests start in WaitingQueue order (priority, then fairness across tenants), each
only when the free blocks can hold all of its known tokens (its whole prefill): started on its
first chunk's blocks alone, a long prompt would be preempted, losing its progress, as soon as
the requests already running need those blocks. The queue is bounded (add() raises
ResourceExhausted beyond max_waiting) and so is the wait of a request that never started
(expire() ends it after max_queue_wait_s).

Asynchronous scheduling: the engine may schedule the next step before the last one's result is
back. A token sampled in a step in flight is then a placeholder (result_applier.py), scheduled
and given blocks exactly as if it were known; the worker feeds in what it sampled.

Results are applied by the ResultApplier, counters kept by SchedulerStats (from the events),
proposals made by the speculator (spec_decode.py; a NoSpeculator when off): budgeted like any
token, never the cause of a preemption.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from services.common.errors import DeadlineExceeded, LayerserveError, ResourceExhausted, Unavailable
from services.scheduler.kv_cache_manager import KVCacheManager
from services.scheduler.request import FinishReason, Request, Status
from services.scheduler.result_applier import RequestUpdate, ResultApplier
from services.scheduler.scheduler_events import Observers, SchedulerObserver
from services.scheduler.scheduler_stats import SchedulerStats
from services.scheduler.spec_decode import Proposer, speculator_for
from services.scheduler.step import NewRequest, RunningRequest, Sample, ScheduledStep
from services.scheduler.waiting_queue import WaitingQueue
from services.scheduler.worker_load import WorkerLoad

__all__ = ["RequestUpdate", "Sample", "ScheduledStep", "Scheduler", "SchedulerLimits"]

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class SchedulerLimits:
    max_num_batched_tokens: int = 1024  # tokens computed in one step, all requests together
    max_num_seqs: int = 64  # requests running at once
    max_waiting: int = 1024  # requests queued to start; beyond, submits are rejected
    max_queue_wait_s: float = 600.0  # a request not started after this long ends with an error
    enable_prefix_caching: bool = True


class Scheduler:
    def __init__(
        self,
        limits: SchedulerLimits,
        kv: KVCacheManager,
        max_model_len: int,
        eos_token_ids: frozenset[int],
        clock: Callable[[], float] = time.monotonic,
        observers: Sequence[SchedulerObserver] = (),
        proposer: Proposer | None = None,
        adaptive_speculation: bool = True,
    ) -> None:
        """proposer: speculative decoding's (None: off); its proposals follow every request's
        last token, so schedule only after the last step's update. adaptive_speculation:
        propose only what pays (spec_policy.py); False: all the proposer finds, up to its k."""
        self.limits = limits
        self.kv = kv
        self.max_model_len = max_model_len
        self.eos_token_ids = eos_token_ids
        self.clock = clock
        caching = limits.enable_prefix_caching
        # Told what the scheduler decides (scheduler_events.py): its counters, tracing, metrics.
        self.stats = SchedulerStats(caching)
        self.events = Observers([self.stats, *observers])
        self.waiting = WaitingQueue()
        self.running: list[Request] = []
        self.requests: dict[str, Request] = {}
        self._forget_on_worker: list[str] = []
        self.speculator = speculator_for(proposer, kv, max_model_len, adaptive_speculation)
        self.results = ResultApplier(  # the results of the steps sent, as they come back
            kv, self.speculator, self.events, max_model_len, caching, self._finish
        )
        self._pending_tokens: int | None = None  # summed once per step (load())

    # -- requests in and out -------------------------------------------------------------

    def can_add(self) -> bool:
        return len(self.waiting) < self.limits.max_waiting

    def add(self, request: Request) -> None:
        """Queues a request. Raises ResourceExhausted when max_waiting requests already wait."""
        if not self.can_add():
            self.events.rejected(request)
            raise ResourceExhausted(
                f"the queue is full ({self.limits.max_waiting} requests waiting for this "
                "model's worker); retry after a short delay"
            )
        request.arrival = self.clock()
        self.requests[request.request_id] = request
        self.waiting.add(request)
        if self._pending_tokens is not None:
            self._pending_tokens += request.num_tokens_expected_to_compute
        self.events.admitted(request)

    def abort(self, request_id: str) -> Request | None:
        request = self.requests.get(request_id)
        if request is not None:
            self._finish(request, FinishReason.ABORT)
        return request

    def expire(self) -> list[Request]:
        """Ends the requests that have waited max_queue_wait_s or longer without starting.
        Returns them (finish_reason ERROR, their error a DeadlineExceeded) for the caller to
        report."""
        expired = self.waiting.never_started(arrived_by=self.clock() - self.limits.max_queue_wait_s)
        error = DeadlineExceeded(
            f"the request waited {self.limits.max_queue_wait_s:g}s in the queue without "
            "starting: the server is overloaded; retry later"
        )
        for request in expired:
            log.warning("%s waited too long to start; ending it", request.request_id)
            self.events.expired(request)
            self._finish(request, FinishReason.ERROR, error)
        return expired

    def has_work(self) -> bool:
        return bool(self.waiting or self.running or self._forget_on_worker)

    @property
    def num_waiting(self) -> int:
        return len(self.waiting)

    def load(self) -> WorkerLoad:
        """How busy this worker is now."""
        return WorkerLoad.of(self)

    @property
    def pending_tokens(self) -> int:
        """The tokens its requests still have to compute, summed once per step; requests added
        since count as they arrive (those aborted meanwhile until the next step)."""
        if self._pending_tokens is None:
            requests = self.requests.values()
            self._pending_tokens = sum(r.num_tokens_expected_to_compute for r in requests)
        return self._pending_tokens

    # -- one step --------------------------------------------------------------------------

    def schedule(self) -> ScheduledStep:
        step = ScheduledStep(finished_ids=self._forget_on_worker)
        self._forget_on_worker = []
        budget = self.limits.max_num_batched_tokens
        if not self.results.num_in_flight:  # every last token known: proposals can follow
            self.speculator.plan(self.running, budget)
        budget = self._schedule_running(step, budget)
        self._schedule_waiting(step, budget)
        step.finished_ids.extend(self._forget_on_worker)  # preempted in this very step
        self._forget_on_worker = []
        for part in step.requests:
            part.request.num_computed_tokens += part.num_new
        if not step.is_empty:
            self.results.sent(step)
            self._pending_tokens = None
            now = self.clock()
            self.speculator.sent(step, now)
            self.events.scheduled(step, now)
        return step

    def _schedule_running(self, step: ScheduledStep, budget: int) -> int:
        scheduled: set[str] = set()
        for request in list(self.running):
            if budget <= 0:
                break
            if request.status is not Status.RUNNING:
                continue  # preempted earlier in this loop
            if request.last_token_in_flight(self.max_model_len) or request.spec_token_ids:
                continue  # (proposals in flight: the step that verifies them decides what follows)
            new_blocks = None
            if not self.results.num_in_flight:  # its last token known
                new_blocks = self.speculator.propose(request, budget)
            num_new = min(request.num_tokens_to_compute, budget)
            if new_blocks is None:
                new_blocks = self._allocate_or_preempt(request, num_new, scheduled)
            if new_blocks is None:
                continue  # the request itself was preempted
            drafts = tuple(request.spec_token_ids)
            step.running.append(RunningRequest(request, num_new, new_blocks, drafts))
            scheduled.add(request.request_id)
            budget -= num_new
        return budget

    def _allocate_or_preempt(
        self, request: Request, num_new: int, scheduled: set[str]
    ) -> list[list[int]] | None:
        """Victims are running requests not yet given tokens in this step (the request itself
        included): the lowest priority, then the most recent (ties: the last started)."""
        while (new_blocks := self.kv.allocate_slots(request, num_new)) is None:
            victim = max(
                (r for r in reversed(self.running) if r.request_id not in scheduled),
                key=lambda r: (-r.priority, r.arrival),
            )
            self._preempt(victim)
            if victim is request:
                return None
        return new_blocks

    def _schedule_waiting(self, step: ScheduledStep, budget: int) -> None:
        running_per_tenant = Counter(r.tenant for r in self.running)
        while self.waiting and budget > 0 and len(self.running) < self.limits.max_num_seqs:
            request = self.waiting.peek(running_per_tenant)
            assert request is not None
            cached = self._cached_prefix(request)
            num_cached = len(cached[0]) * self.kv.block_size
            num_new = min(request.num_tokens - num_cached, budget)
            chunk = self.limits.max_num_batched_tokens
            if not self.kv.can_start(request, cached, chunk):
                break  # the next request waits for blocks, keeping the queue order fair
            if self.kv.allocate_slots(request, num_new, cached) is None:
                break
            self.waiting.remove(request)
            self._start(request, num_cached)
            running_per_tenant[request.tenant] += 1
            step.new.append(NewRequest(request, num_new, num_cached))
            budget -= num_new

    def _cached_prefix(self, request: Request) -> list[list[int]]:
        """Per KV cache group, the cached blocks the request starts from."""
        if not self.limits.enable_prefix_caching or request.reads_every_prompt_position:
            return self.kv.empty_tables()
        return self.kv.find_cached_prefix(request)

    def _start(self, request: Request, num_cached: int) -> None:
        request.status = Status.RUNNING
        request.num_computed_tokens = num_cached
        self.running.append(request)
        request.on_worker = True  # (a waiting request never is: preemption made it forget)
        if not request.started:
            request.started = True
            request.num_cached_tokens = num_cached

    def _preempt(self, request: Request) -> None:
        num_blocks = self.kv.num_held_blocks(request)
        log.info("preempting %s to free %d blocks", request.request_id, num_blocks)
        self.running.remove(request)
        self.kv.free(request)
        request.preempted()
        if request.on_worker:
            request.on_worker = False
            self._forget_on_worker.append(request.request_id)
        self.waiting.add(request)
        self.events.preempted(request)

    # -- results -----------------------------------------------------------------------------

    def update(self, samples: list[Sample]) -> list[RequestUpdate]:
        """Applies the results of the oldest step in flight (result_applier.py). Returns the
        requests that got tokens (finished ones carry their finish_reason) or failed."""
        return self.results.apply(samples, self.clock())

    def fail_all(self, error: LayerserveError | None = None) -> list[Request]:
        """Ends every request with `error` (the worker failed, and its KV cache with it).
        Returns them for error reporting."""
        error = error or Unavailable("the worker became unavailable")
        failed = list(self.requests.values())
        for request in failed:
            self._finish(request, FinishReason.ERROR, error)
        self._forget_on_worker = []
        self.results.drop_in_flight()
        self.kv.drop_cache()
        return failed

    def release_all(self) -> list[Request]:
        """Gives up every request unfinished, for another worker to run (this one failed, and
        its KV cache with it): each is reset to start again (Request.moved), none is finished."""
        released = list(self.requests.values())
        for request in released:
            if request.status is Status.WAITING:
                self.waiting.remove(request)
            elif request.status is Status.RUNNING:
                self.running.remove(request)
            request.moved()
        self.requests.clear()
        self._forget_on_worker = []
        self.results.drop_in_flight()
        self.kv.drop_cache()
        return released

    def _finish(
        self, request: Request, reason: FinishReason, error: LayerserveError | None = None
    ) -> None:
        if request.status is Status.WAITING:
            self.waiting.remove(request)
        elif request.status is Status.RUNNING:
            self.running.remove(request)
        else:
            return
        self.kv.free(request)
        request.status = Status.FINISHED
        request.finish_reason = reason
        request.error = error
        if request.on_worker:
            self._forget_on_worker.append(request.request_id)
            request.on_worker = False
        del self.requests[request.request_id]
        self.events.finished(request)
