"""What one Scheduler has done since it started, counted from its events (scheduler_events.py)
rather than inside its decisions (as vLLM's SchedulerStats): the counters that GetStats, the
Admin API, the router (WorkerLoad) and the metrics (scheduler_metrics.py) read. They restart
from 0 with a fresh Scheduler (a worker that reconnects)."""

from __future__ import annotations

from services.scheduler.request import Request
from services.scheduler.scheduler_events import SchedulerObserver
from services.scheduler.step import ScheduledStep


class SchedulerStats(SchedulerObserver):
    def __init__(self, enable_prefix_caching: bool) -> None:
        self.enable_prefix_caching = enable_prefix_caching
        self.num_steps = 0  # steps sent to the worker
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
        # Speculative decoding: request-steps that carried proposals, the tokens proposed, and
        # those the worker accepted (acceptance rate = accepted / draft tokens).
        self.num_spec_steps = 0
        self.num_draft_tokens = 0
        self.num_accepted_tokens = 0

    def rejected(self, request: Request) -> None:
        self.num_rejected += 1

    def scheduled(self, step: ScheduledStep, now: float) -> None:
        self.num_steps += 1
        if self.enable_prefix_caching:
            for new in step.new:
                self.num_prefix_query_tokens += new.request.num_tokens
                self.num_prefix_hit_tokens += new.num_cached

    def preempted(self, request: Request) -> None:
        self.num_preemptions += 1

    def first_token(self, request: Request) -> None:
        self.num_prompt_tokens += request.num_prompt_tokens

    def sampled(self, request: Request, num_tokens: int) -> None:
        self.num_generation_tokens += num_tokens

    def speculated(self, request: Request, num_drafts: int, num_accepted: int) -> None:
        self.num_spec_steps += 1
        self.num_draft_tokens += num_drafts
        self.num_accepted_tokens += num_accepted

    def expired(self, request: Request) -> None:
        self.num_expired += 1
