"""A step's result applied to its requests: the one place where what the worker sampled changes
them (as vLLM's update_from_output and check_stop).

The ResultApplier keeps the steps in flight, each request as it stood when its step was sent
(Scheduled): a step that reaches a request's last known token samples one, a placeholder
(request.num_output_placeholders) until the result brings it. Results apply in step order
(apply() takes the oldest step in flight). First the step's computed blocks join the prefix
cache: their KV is written only now, so no request ever reads a block still being computed.
Then each request's tokens are appended, each checked for a stop (the tokens after a stop are
dropped); a request whose step carried proposals keeps the accepted ones and rolls back the
rest (spec_decode.py).

A result whose request finished, was aborted or was preempted after its step was sent is
dropped (Scheduled.is_current): with asynchronous scheduling a request that finished in step n
has been sent in step n + 1 too, and the token the worker samples for it there goes no further.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from services.common.errors import LayerserveError
from services.scheduler.kv_cache_manager import KVCacheManager
from services.scheduler.request import FinishReason, Request
from services.scheduler.scheduler_events import SchedulerObserver
from services.scheduler.spec_decode import NoSpeculator, Speculator
from services.scheduler.step import Sample, Scheduled, ScheduledStep

# Ends a request (the Scheduler's one way out: its blocks freed, the worker told to forget it).
Finish = Callable[[Request, FinishReason, LayerserveError | None], None]


@dataclass(slots=True)
class RequestUpdate:
    """What one step's result did to a request: the tokens appended to its output (several
    when proposals were accepted; request.finish_reason is set if one of them ended it), its
    failure (error), or for an embedding the one sample that ended it, which appended none."""

    request: Request
    samples: list[Sample]

    @property
    def error(self) -> LayerserveError | None:
        """The worker could not sample the request, and it ended with this error."""
        return self.samples[0].error


def check_stop(request: Request, token_id: int, max_model_len: int) -> FinishReason | None:
    """Why the request ends with token_id, just appended (None: it goes on)."""
    if token_id in request.stop_token_ids:
        return FinishReason.STOP
    if len(request.output_token_ids) >= request.max_tokens:
        return FinishReason.LENGTH
    if request.num_tokens >= max_model_len:
        return FinishReason.LENGTH
    return None


class ResultApplier:
    def __init__(
        self,
        kv: KVCacheManager,
        speculator: Speculator | NoSpeculator,
        events: SchedulerObserver,
        max_model_len: int,
        enable_prefix_caching: bool,
        finish: Finish,
    ) -> None:
        self.kv = kv
        self.speculator = speculator
        self.events = events
        self.max_model_len = max_model_len
        self.enable_prefix_caching = enable_prefix_caching
        self.finish = finish
        self._in_flight: deque[list[Scheduled]] = deque()  # steps sent, oldest first

    @property
    def num_in_flight(self) -> int:
        return len(self._in_flight)

    def sent(self, step: ScheduledStep) -> None:
        """A step leaves (its tokens already counted in num_computed_tokens): each request that
        it samples gets a placeholder for its token."""
        self._in_flight.append([_scheduled(part.request) for part in step.requests])

    def drop_in_flight(self) -> None:
        """The worker failed: no step in flight will come back."""
        self._in_flight.clear()

    def apply(self, samples: list[Sample], now: float) -> list[RequestUpdate]:
        """Applies the result (`samples`) of the oldest step in flight, back at `now`. Returns
        the requests that got tokens or failed, in the order of their samples."""
        sent = self._in_flight.popleft() if self._in_flight else []
        self.speculator.done(now)
        current = {s.request.request_id: s for s in sent if s.is_current}
        if self.enable_prefix_caching:
            for scheduled in current.values():  # proposals' KV only once verified
                self.kv.cache_computed(
                    scheduled.request, scheduled.num_computed - scheduled.num_drafts
                )
        updates = []
        for run in _by_request(samples):
            scheduled = current.get(run[0].request_id)
            if scheduled is None or not scheduled.samples:
                continue
            scheduled.request.num_output_placeholders -= 1
            updates.append(self._apply(scheduled, run))
        return updates

    def _apply(self, scheduled: Scheduled, samples: list[Sample]) -> RequestUpdate:
        """Appends a request's tokens of one step (several when proposals were accepted)."""
        request = scheduled.request
        if samples[0].error is not None:
            self.finish(request, FinishReason.ERROR, samples[0].error)
            return RequestUpdate(request, samples[:1])
        if request.sampling.pooling is not None:
            return self._pooled(request, samples[0])
        kept: list[Sample] = []
        reason = None
        for sample in samples:
            request.output_token_ids.append(sample.token_id)
            kept.append(sample)
            if len(request.output_token_ids) == 1:
                self.events.first_token(request)
            if (reason := check_stop(request, sample.token_id, self.max_model_len)) is not None:
                break
        self.events.sampled(request, len(kept))
        if scheduled.num_drafts:
            num_drafts, num_accepted = scheduled.num_drafts, len(samples) - 1
            self.speculator.settle(request, num_drafts, num_accepted, len(kept))
            if self.enable_prefix_caching:
                self.kv.cache_computed(request)  # the accepted proposals' full blocks
            self.events.speculated(request, num_drafts, num_accepted)
        if reason is not None:
            self.finish(request, reason, None)
        return RequestUpdate(request, kept)

    def _pooled(self, request: Request, sample: Sample) -> RequestUpdate:
        """An embedding ends once its prompt is computed, as vLLM's pooling requests do: the
        sample brings its vector and no token (its token_id means nothing), so nothing is
        generated, counted or charged but the prompt."""
        self.events.first_token(request)  # the prompt's pass is back: its tokens count
        self.finish(request, FinishReason.STOP, None)
        return RequestUpdate(request, [sample])


def _scheduled(request: Request) -> Scheduled:
    """The request as its step leaves: a step that reaches its last known token (or
    placeholder) and its proposals samples one more, a placeholder until the result."""
    num_drafts = len(request.spec_token_ids)
    known = request.num_tokens + request.num_output_placeholders
    samples = request.num_computed_tokens == known + num_drafts
    if samples:
        request.num_output_placeholders += 1
    return Scheduled(
        request, request.num_computed_tokens, request.num_preemptions, samples, num_drafts
    )


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
