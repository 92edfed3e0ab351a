"""What a Scheduler tells the outside world about its decisions, as it makes them: which
requests it admitted or rejected, scheduled, preempted, gave tokens, expired or finished.
Tracing (request_trace.py), metrics (scheduler_metrics.py) and the counters
(scheduler_stats.py) are built from these events, never inside the scheduling decisions, as
prefix indexes are built from BlockPool's cache events (cache_events.py)."""

from __future__ import annotations

from collections.abc import Sequence

from services.scheduler.request import Request
from services.scheduler.step import ScheduledStep


class SchedulerObserver:
    """Called synchronously from the scheduler's step loop: implementations must not block.
    Every event does nothing unless overridden."""

    def admitted(self, request: Request) -> None:
        """Queued at this worker (a submit; a preempted request is not admitted again)."""

    def rejected(self, request: Request) -> None:
        """Refused at submit: the queue was full (it never queued)."""

    def scheduled(self, step: ScheduledStep, now: float) -> None:
        """A step was scheduled (never an empty one): the requests in step.new have started
        (or resumed), each with num_computed_tokens counting the step's tokens. `now`: the
        scheduler's clock."""

    def preempted(self, request: Request) -> None:
        """Its blocks went to others; it waits to be recomputed."""

    def first_token(self, request: Request) -> None:
        """Its first token came back from the worker (its prefill is done)."""

    def sampled(self, request: Request, num_tokens: int) -> None:
        """A step's result appended num_tokens tokens to its output (more than one with
        accepted proposals)."""

    def speculated(self, request: Request, num_drafts: int, num_accepted: int) -> None:
        """A step computed num_drafts proposed tokens for it, and the worker accepted the first
        num_accepted of them (speculative decoding; request's counters already include them)."""

    def expired(self, request: Request) -> None:
        """It waited too long to start: it ends next (finished, with a DeadlineExceeded)."""

    def finished(self, request: Request) -> None:
        """Ended: finish_reason says how (and request.error why, for ERROR)."""


class Observers(SchedulerObserver):
    """Tells every observer in `observers`, in order."""

    def __init__(self, observers: Sequence[SchedulerObserver] = ()) -> None:
        self.observers = list(observers)

    def admitted(self, request: Request) -> None:
        for observer in self.observers:
            observer.admitted(request)

    def rejected(self, request: Request) -> None:
        for observer in self.observers:
            observer.rejected(request)

    def scheduled(self, step: ScheduledStep, now: float) -> None:
        for observer in self.observers:
            observer.scheduled(step, now)

    def preempted(self, request: Request) -> None:
        for observer in self.observers:
            observer.preempted(request)

    def first_token(self, request: Request) -> None:
        for observer in self.observers:
            observer.first_token(request)

    def sampled(self, request: Request, num_tokens: int) -> None:
        for observer in self.observers:
            observer.sampled(request, num_tokens)

    def speculated(self, request: Request, num_drafts: int, num_accepted: int) -> None:
        for observer in self.observers:
            observer.speculated(request, num_drafts, num_accepted)

    def expired(self, request: Request) -> None:
        for observer in self.observers:
            observer.expired(request)

    def finished(self, request: Request) -> None:
        for observer in self.observers:
            observer.finished(request)
