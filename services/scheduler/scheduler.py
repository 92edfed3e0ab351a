"""Continuous batching for one worker: which requests compute how many tokens in the next
step, under a token budget, a cap on running requests and the worker's KV blocks.

Each request has num_computed_tokens; every step assigns it tokens so that it catches up with
its known tokens: a prompt (in chunks when the budget is short), then one token per step.
Running requests are served first; when blocks run out, the lowest-priority, most recent
running request is preempted (its blocks freed, recomputed later) so the others go on.

With prefix caching, a request starts with num_computed_tokens = the tokens of its longest
cached prefix (blocks computed by earlier requests, or by itself before a preemption). Blocks
join the cache only once the step that computed them has returned (update()), so no request
ever reads a block whose KV is still being written.

On a worker with sliding-window layers, a request's blocks that fall wholly out of the window
go back to the pool as it advances (kv_cache_manager.py), so long sequences hold fewer blocks.

Waiting requests start in WaitingQueue order (priority, then fairness across tenants), each
only when the free blocks can hold all of its known tokens (its whole prefill): started on its
first chunk's blocks alone, a long prompt would be preempted, losing its progress, as soon as
the requests already running need those blocks. The queue is bounded (add() raises
ResourceExhausted beyond max_waiting) and so is the wait of a request that never started
(expire() ends it after max_queue_wait_s).

Asynchronous scheduling: the engine may schedule the next step before the last one's result is
back. A request that samples in a step in flight then has a placeholder for its token
(request.num_output_placeholders): it is scheduled to compute it, and its blocks allocated for
it, exactly as if it were known; the worker feeds in the token it sampled. Results apply in step
order (update() takes the oldest step in flight), and a result whose request finished, was
aborted or was preempted after its step was sent is dropped: a request that finished in step n
has been sent in step n + 1 too, and the token the worker samples for it there never leaves
this class. A request whose max_tokens or context length is reached by its placeholders is not
scheduled again.

Speculative decoding (a proposer; spec_decode.py's Speculator): a decoding request may also
compute proposed tokens, budgeted like any token but never the cause of a preemption; the
worker's accepted ones are appended with stop checks like sampled tokens, the rest rolled back.
"""

from __future__ import annotations

import logging
import time
from collections import Counter, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from services.common.errors import DeadlineExceeded, LayerserveError, ResourceExhausted, Unavailable
from services.scheduler.kv_cache_manager import KVCacheManager
from services.scheduler.request import FinishReason, Request, Status
from services.scheduler.scheduler_events import Observers, SchedulerObserver
from services.scheduler.spec_decode import Proposer, Speculator
from services.scheduler.step import Sample, Scheduled, ScheduledStep
from services.scheduler.waiting_queue import WaitingQueue
from services.scheduler.worker_load import WorkerLoad

__all__ = ["Sample", "ScheduledStep", "Scheduler", "SchedulerLimits"]

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
        """proposer: speculative decoding's (None: off). Its proposals need every request's
        last token known when it is scheduled: schedule only after the last step's update.
        adaptive_speculation: propose only what pays (spec_policy.py); False: all the proposer
        finds, up to its k, every step."""
        self.limits = limits
        self.kv = kv
        self.max_model_len = max_model_len
        self.eos_token_ids = eos_token_ids
        self.clock = clock
        # Told what the scheduler decides (scheduler_events.py): tracing and metrics.
        self.events = Observers(observers)
        self.waiting = WaitingQueue()
        self.running: list[Request] = []
        self.requests: dict[str, Request] = {}
        self._never_started: dict[str, Request] = {}  # in arrival order, for expire()
        self._in_flight: deque[list[Scheduled]] = deque()  # steps sent, not yet updated
        self._forget_on_worker: list[str] = []
        self.num_steps = 0
        self.num_preemptions = 0
        self.num_rejected = 0  # submits refused because the queue was full
        self.num_expired = 0  # requests ended after waiting too long to start
        # Prefix cache use: known tokens of the requests started (or resumed) with caching on,
        # and how many of those had their KV in the cache (hit rate = hits / queries).
        self.num_prefix_query_tokens = 0
        self.num_prefix_hit_tokens = 0
        # Tokens served: the prompt of each request once its prefill is done (its first token
        # sampled), and every sampled token.
        self.num_prompt_tokens = 0
        self.num_generation_tokens = 0
        self.speculator = (
            Speculator(proposer, kv, max_model_len, adaptive_speculation) if proposer else None
        )
        self._pending_tokens: int | None = None  # summed once per step (load())

    # -- requests in and out -------------------------------------------------------------

    def can_add(self) -> bool:
        return len(self.waiting) < self.limits.max_waiting

    def add(self, request: Request) -> None:
        """Queues a request. Raises ResourceExhausted when max_waiting requests already wait."""
        if not self.can_add():
            self.num_rejected += 1
            raise ResourceExhausted(
                f"the queue is full ({self.limits.max_waiting} requests waiting for this "
                "model's worker); retry after a short delay"
            )
        request.arrival = self.clock()
        self.requests[request.request_id] = request
        self._never_started[request.request_id] = request
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
        deadline = self.clock() - self.limits.max_queue_wait_s
        expired = []
        for request in self._never_started.values():
            if request.arrival > deadline:
                break  # arrival order: the rest are younger
            expired.append(request)
        error = DeadlineExceeded(
            f"the request waited {self.limits.max_queue_wait_s:g}s in the queue without "
            "starting: the server is overloaded; retry later"
        )
        for request in expired:
            log.warning("%s waited too long to start; ending it", request.request_id)
            self._finish(request, FinishReason.ERROR, error)
        self.num_expired += len(expired)
        return expired

    def has_work(self) -> bool:
        return bool(self.waiting or self.running or self._forget_on_worker)

    @property
    def num_waiting(self) -> int:
        return len(self.waiting)

    def load(self) -> WorkerLoad:
        """How busy this worker is now. The pending tokens are summed once per step; requests
        added since count as they arrive (those aborted meanwhile until the next step)."""
        if self._pending_tokens is None:
            requests = self.requests.values()
            self._pending_tokens = sum(r.num_tokens_expected_to_compute for r in requests)
        pool = self.kv.pool
        return WorkerLoad(
            num_blocks=pool.num_blocks,
            free_blocks=pool.num_free,
            num_running=len(self.running),
            num_waiting=len(self.waiting),
            num_requests=len(self.requests),
            pending_tokens=self._pending_tokens,
            num_steps=self.num_steps,
            num_preemptions=self.num_preemptions,
            prefix_query_tokens=self.num_prefix_query_tokens,
            prefix_hit_tokens=self.num_prefix_hit_tokens,
            num_rejected=self.num_rejected,
            num_expired=self.num_expired,
        )

    # -- one step --------------------------------------------------------------------------

    def schedule(self) -> ScheduledStep:
        step = ScheduledStep(finished_ids=self._forget_on_worker)
        self._forget_on_worker = []
        budget = self.limits.max_num_batched_tokens
        if self.speculator is not None and not self._in_flight:  # every last token known
            self.speculator.plan(self.running, budget)
        budget = self._schedule_running(step, budget)
        self._schedule_waiting(step, budget)
        step.finished_ids.extend(self._forget_on_worker)  # preempted in this very step
        self._forget_on_worker = []
        for request, num_new in step.requests:
            request.num_computed_tokens += num_new
        if not step.is_empty:
            self._in_flight.append([self._sent(request) for request, _ in step.requests])
            self.num_steps += 1
            self._pending_tokens = None
            now = self.clock()
            if self.speculator is not None:
                self.speculator.sent(step, now)
            self.events.scheduled(step, now)
        return step

    def _sent(self, request: Request) -> Scheduled:
        """The request as the step leaves: a step that reaches its last token samples one, a
        placeholder until the result brings it."""
        num_drafts = len(request.spec_token_ids)
        known = request.num_tokens + request.num_output_placeholders
        samples = request.num_computed_tokens == known + num_drafts
        if samples:
            request.num_output_placeholders += 1
        return Scheduled(
            request, request.num_computed_tokens, request.num_preemptions, samples, num_drafts
        )

    def _schedule_running(self, step: ScheduledStep, budget: int) -> int:
        scheduled: set[str] = set()
        for request in list(self.running):
            if budget <= 0:
                break
            if request.status is not Status.RUNNING:
                continue  # preempted earlier in this loop
            if self._last_token_coming(request) or request.spec_token_ids:
                continue  # (proposals in flight: the step that verifies them decides what follows)
            new_blocks = None
            if self.speculator is not None and not self._in_flight:  # its last token known
                new_blocks = self.speculator.propose(request, budget)
            num_new = min(request.num_tokens_to_compute, budget)
            if new_blocks is None:
                new_blocks = self._allocate_or_preempt(request, num_new, scheduled)
            if new_blocks is None:
                continue  # the request itself was preempted
            step.running.append((request, num_new, new_blocks))
            if request.spec_token_ids:
                step.drafts[request.request_id] = list(request.spec_token_ids)
            scheduled.add(request.request_id)
            budget -= num_new
        return budget

    def _last_token_coming(self, request: Request) -> bool:
        """A step in flight samples the request's last token (max_tokens or the context length
        reached): it needs no other step."""
        if not request.num_output_placeholders:
            return False
        if request.num_outputs_coming >= request.max_tokens:
            return True
        return request.num_tokens + request.num_output_placeholders >= self.max_model_len

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
            if request.on_worker:  # cannot happen for waiting requests; kept explicit
                step.running.append((request, num_new, [list(t) for t in request.block_tables]))
            else:
                request.on_worker = True
                step.new.append((request, num_new))
            budget -= num_new

    def _cached_prefix(self, request: Request) -> list[list[int]]:
        """Per KV cache group, the cached blocks the request starts from."""
        if not self.limits.enable_prefix_caching:
            return self.kv.empty_tables()
        return self.kv.find_cached_prefix(request)

    def _start(self, request: Request, num_cached: int) -> None:
        request.status = Status.RUNNING
        request.num_computed_tokens = num_cached
        self.running.append(request)
        if self.limits.enable_prefix_caching:
            self.num_prefix_query_tokens += request.num_tokens
            self.num_prefix_hit_tokens += num_cached
        if not request.started:
            request.started = True
            request.num_cached_tokens = num_cached
            del self._never_started[request.request_id]

    def _preempt(self, request: Request) -> None:
        num_blocks = self.kv.num_held_blocks(request)
        log.info("preempting %s to free %d blocks", request.request_id, num_blocks)
        self.running.remove(request)
        self.kv.free(request)
        request.num_computed_tokens = 0
        request.num_output_placeholders = 0  # tokens in flight for it are dropped on arrival
        request.spec_token_ids = []
        request.status = Status.WAITING
        request.num_preemptions += 1
        self.num_preemptions += 1
        if request.on_worker:
            request.on_worker = False
            self._forget_on_worker.append(request.request_id)
        self.waiting.add(request)
        self.events.preempted(request)

    # -- results -----------------------------------------------------------------------------

    def update(self, samples: list[Sample]) -> list[tuple[Request, Sample]]:
        """Applies the results of the oldest step in flight: its computed blocks join the prefix
        cache, then its sampled tokens are appended. Returns the requests that got a token
        (finished ones carry their finish_reason) or failed (sample.error); tokens of requests
        finished, aborted or preempted since the step was sent are dropped."""
        sent = self._in_flight.popleft() if self._in_flight else []
        if self.speculator is not None:
            self.speculator.done(self.clock())
        current = {s.request.request_id: s for s in sent if s.is_current}
        if self.limits.enable_prefix_caching:
            for scheduled in current.values():  # proposals' KV only once verified
                self.kv.cache_computed(
                    scheduled.request, scheduled.num_computed - scheduled.num_drafts
                )
        updated = []
        for request_samples in _by_request(samples):
            scheduled = current.get(request_samples[0].request_id)
            if scheduled is None or not scheduled.samples:
                continue
            scheduled.request.num_output_placeholders -= 1
            updated.extend(self._apply_samples(scheduled, request_samples))
        return updated

    def _apply_samples(
        self, scheduled: Scheduled, samples: list[Sample]
    ) -> list[tuple[Request, Sample]]:
        """Appends a request's tokens of one step (several when proposals were accepted), each
        checked for a stop; the tokens after a stop are dropped. Returns those applied."""
        request = scheduled.request
        if samples[0].error is not None:
            self._finish(request, FinishReason.ERROR, samples[0].error)
            return [(request, samples[0])]
        applied, reason = [], None
        for sample in samples:
            request.output_token_ids.append(sample.token_id)
            applied.append((request, sample))
            self.num_generation_tokens += 1
            if len(request.output_token_ids) == 1:
                self.num_prompt_tokens += request.num_prompt_tokens
                self.events.first_token(request)
            if (reason := self._stop_reason(request, sample.token_id)) is not None:
                break
        if scheduled.num_drafts and self.speculator is not None:
            num_drafts, num_accepted = scheduled.num_drafts, len(samples) - 1
            self.speculator.settle(request, num_drafts, num_accepted, len(applied))
            if self.limits.enable_prefix_caching:
                self.kv.cache_computed(request)  # the accepted proposals' full blocks
            self.events.speculated(request, num_drafts, num_accepted)
        if reason is not None:
            self._finish(request, reason)
        return applied

    def fail_all(self, error: LayerserveError | None = None) -> list[Request]:
        """Ends every request with `error` (the worker failed, and its KV cache with it).
        Returns them for error reporting."""
        error = error or Unavailable("the worker became unavailable")
        failed = list(self.requests.values())
        for request in failed:
            self._finish(request, FinishReason.ERROR, error)
        self._forget_on_worker = []
        self._in_flight.clear()
        self.kv.drop_cache()
        return failed

    def _stop_reason(self, request: Request, token_id: int) -> FinishReason | None:
        if token_id in request.stop_token_ids:
            return FinishReason.STOP
        if len(request.output_token_ids) >= request.max_tokens:
            return FinishReason.LENGTH
        if request.num_tokens >= self.max_model_len:
            return FinishReason.LENGTH
        return None

    def _finish(
        self, request: Request, reason: FinishReason, error: LayerserveError | None = None
    ) -> None:
        if request.status is Status.WAITING:
            self.waiting.remove(request)
            self._never_started.pop(request.request_id, None)
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


def _by_request(samples: list[Sample]) -> list[list[Sample]]:
    """Consecutive samples of one request together (a step's accepted proposals and its own
    token come in a run)."""
    runs: list[list[Sample]] = []
    for sample in samples:
        if runs and runs[-1][0].request_id == sample.request_id:
            runs[-1].append(sample)
        else:
            runs.append([sample])
    return runs
